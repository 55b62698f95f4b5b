//! Retained activation bytes under checkpointing. In its own test binary: memory counters are
//! process-wide, so no other test may allocate concurrently.

mod common;
use common::{params, rand, run_chain};
use riftco_autograd::Variable;
use riftco_tensor::{memory_stats, MemoryCategory as C};

#[test]
fn graph_statistics_and_activation_bytes_drop_with_checkpointing() {
    let x = Variable::leaf(rand(&[16, 32], 1), true);
    let layers: Vec<_> = (0..6).map(|i| params(10 * i + 2, 32, true)).collect();
    let base = memory_stats().get(C::Activation).current_bytes;
    let plain = run_chain(&x, &layers, false);
    let plain_bytes = memory_stats().get(C::Activation).current_bytes - base;
    let s_plain = plain.graph_statistics();
    drop(plain);
    let base = memory_stats().get(C::Activation).current_bytes;
    let ck = run_chain(&x, &layers, true);
    let ck_bytes = memory_stats().get(C::Activation).current_bytes - base;
    let s_ck = ck.graph_statistics();
    assert!(
        s_ck.node_count < s_plain.node_count,
        "{s_ck:?} vs {s_plain:?}"
    );
    assert!(
        s_ck.element_count < s_plain.element_count,
        "{s_ck:?} vs {s_plain:?}"
    );
    // Plain retains per block: rstd(16) + norm(512) + linear(1536) + silu(1536) + linear(512) +
    // add(512) floats; checkpointed only the block output (512).
    assert!(
        ck_bytes * 4 < plain_bytes,
        "checkpointed {ck_bytes} B vs plain {plain_bytes} B"
    );
    ck.backward().unwrap();
}
