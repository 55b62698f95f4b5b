//! Retained activation bytes under checkpointing. In its own test binary: memory counters are
//! process-wide, so no other test may allocate concurrently.

mod common;
use common::rand;
use riftco_autograd::{checkpoint, ops, Result, Variable};
use riftco_tensor::{memory_stats, MemoryCategory as C};

fn block(x: &Variable, p: &[Variable]) -> Result<Variable> {
    let h = ops::rms_norm(x, &p[0], 1e-5)?;
    let h = ops::silu(&ops::linear(&h, &p[1])?)?;
    ops::add(x, &ops::linear(&h, &p[2])?)
}

fn params(seed: u64, d: usize, trainable: bool) -> Vec<Variable> {
    vec![
        Variable::leaf(rand(&[d], seed), trainable),
        Variable::leaf(rand(&[3 * d, d], seed + 1), trainable),
        Variable::leaf(rand(&[d, 3 * d], seed + 2), trainable),
    ]
}

fn run_chain(x: &Variable, layers: &[Vec<Variable>], ckpt: bool) -> Variable {
    let mut h = x.clone();
    for p in layers {
        h = if ckpt {
            let p2 = p.clone();
            checkpoint(&h, p, move |x| block(x, &p2)).unwrap()
        } else {
            block(&h, p).unwrap()
        };
    }
    ops::sum(&ops::mul(&h, &h).unwrap()).unwrap()
}

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
