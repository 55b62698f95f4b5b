//! The GPU backend uploads a RoPE table once and then reuses its device copy (keyed by
//! `RopeTable::id`, at most `ROPE_CACHE_ENTRIES` tables): counted by the context's buffer
//! requests (pool allocations + reuses), which a cached call makes two fewer of (the `cos` and
//! `sin` buffers). One test in its own binary, so no other test's buffers are counted.

mod common;

use common::{assert_close, backend_or_skip, values};
use riftco_gpu::{GpuKind, ROPE_CACHE_ENTRIES};
use riftco_tensor::backend::{self, cpu::CpuBackend, Backend, RopeTable};
use riftco_tensor::{Device, MemoryCategory as C, Tensor};

#[test]
fn a_rope_table_is_uploaded_once_and_evicted_past_the_bound() {
    let Some(dev) = backend_or_skip("a_rope_table_is_uploaded_once_and_evicted_past_the_bound")
    else {
        return;
    };
    let kind = if dev == Device::Metal {
        GpuKind::Metal
    } else {
        GpuKind::Vulkan
    };
    let (_, ctx) = riftco_gpu::install(kind).unwrap();
    let g = backend::for_device(dev).unwrap();
    let x_host = Tensor::from_vec(
        values(2 * 3 * 8, 5, -1.0, 1.0),
        vec![1, 2, 3, 8],
        C::Workspace,
    )
    .unwrap();
    let mut x = x_host.deep_clone(C::Workspace);
    x.transfer_to(dev).unwrap();
    // Buffer requests of one RoPE call with `table` (its output is checked against the CPU).
    let requests = |table: &RopeTable| {
        let before = ctx.memory();
        let y = g
            .rope("t", &x, table, 2, 3, 1, false, C::Workspace)
            .unwrap();
        let after = ctx.memory();
        let want = CpuBackend
            .rope("t", &x_host, table, 2, 3, 1, false, C::Workspace)
            .unwrap();
        assert_close("rope", &y.to_vec(), &want.to_vec(), 1e-5, 1.0);
        (after.allocations + after.reuses) - (before.allocations + before.reuses)
    };
    let table = RopeTable::new(8, 8, 10_000.0);
    let first = requests(&table);
    let cached = requests(&table);
    assert_eq!(first, cached + 2, "the second call uploads no table");
    assert_eq!(requests(&table.clone()), cached, "a clone shares the id");
    // Another table with the same values is another id: uploaded once, then cached.
    let other = RopeTable::new(8, 8, 10_000.0);
    assert_ne!(other.id(), table.id());
    assert_eq!(requests(&other), first);
    assert_eq!(requests(&other), cached);
    // Past the bound the least recently used table (`table`) is evicted.
    let fresh: Vec<RopeTable> = (0..ROPE_CACHE_ENTRIES - 1)
        .map(|i| RopeTable::new(8, 8, 100.0 + i as f64))
        .collect();
    for t in &fresh {
        assert_eq!(requests(t), first);
    }
    assert_eq!(requests(&other), cached, "still cached");
    assert_eq!(requests(&table), first, "evicted, uploaded again");
}
