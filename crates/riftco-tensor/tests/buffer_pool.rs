//! The buffer pool: freed buffers are reused, counted apart from every memory category, bounded
//! by the limit, and released on request. Process-global state: one test function, run in
//! order.

use riftco_tensor::pool::{self, MIN_POOLED_ELEMENTS};
use riftco_tensor::{memory_stats, MemoryCategory, Tensor};

#[test]
fn freed_buffers_are_reused_counted_apart_bounded_and_released() {
    pool::set_limit_bytes(64 << 20);
    pool::release_cached_buffers();
    let n = MIN_POOLED_ELEMENTS * 2;
    let act_before = memory_stats().get(MemoryCategory::Activation).current_bytes;

    // A dropped tensor's buffer goes to the pool: not in any category, in cached_bytes.
    let t = Tensor::from_vec(vec![1.5; n], [n], MemoryCategory::Activation).unwrap();
    let ptr = t.read().unwrap().as_ptr();
    drop(t);
    let stats = memory_stats();
    assert_eq!(
        stats.get(MemoryCategory::Activation).current_bytes,
        act_before
    );
    assert_eq!(stats.cached_bytes, 4 * n);
    assert_eq!(pool::cached_bytes(), 4 * n);

    // take() of that length hands the same allocation back and empties the pool.
    let v = pool::take(n);
    assert_eq!(v.len(), n);
    assert_eq!(v.as_ptr(), ptr, "the cached buffer is reused");
    assert_eq!(pool::cached_bytes(), 0);
    if cfg!(debug_assertions) {
        assert!(
            v.iter().all(|x| x.is_nan()),
            "debug builds poison reused buffers"
        );
    }
    drop(Tensor::from_vec(v, [n], MemoryCategory::Gradient).unwrap());

    // take_zeroed() zero-fills a reused buffer.
    let z = pool::take_zeroed(n);
    assert!(z.iter().all(|&x| x == 0.0));
    assert_eq!(pool::cached_bytes(), 0);
    drop(z); // a plain Vec, not a tensor: freed, not pooled

    // Other lengths miss; small buffers are never pooled.
    drop(Tensor::zeros([n], MemoryCategory::Activation));
    assert_eq!(pool::take(n + 1).len(), n + 1);
    assert_eq!(pool::cached_bytes(), 4 * n);
    drop(Tensor::zeros(
        [MIN_POOLED_ELEMENTS - 1],
        MemoryCategory::Activation,
    ));
    assert_eq!(pool::cached_bytes(), 4 * n);

    // Over the limit, the least recently used other length makes room.
    pool::release_cached_buffers();
    pool::set_limit_bytes(2 * 4 * n + 64);
    drop(Tensor::zeros([n], MemoryCategory::Activation));
    drop(Tensor::zeros([n], MemoryCategory::Activation));
    assert_eq!(pool::cached_bytes(), 2 * 4 * n);
    drop(Tensor::zeros([n + 1], MemoryCategory::Activation));
    assert_eq!(
        pool::cached_bytes(),
        4 * n + 4 * (n + 1),
        "one buffer of the older length was evicted to make room"
    );
    // Lowering the limit frees buffers until the pool fits, least recently used first.
    pool::set_limit_bytes(4 * (n + 1));
    assert_eq!(
        pool::cached_bytes(),
        4 * (n + 1),
        "the older length went first"
    );
    assert_eq!(pool::take(n + 1).len(), n + 1);
    assert_eq!(pool::cached_bytes(), 0);
    pool::release_cached_buffers();
    pool::set_limit_bytes(64 << 20);
    drop(Tensor::zeros([n], MemoryCategory::Activation));

    // The limit bounds the pool: a buffer that cannot fit even after evicting is freed.
    pool::set_limit_bytes(4 * n + 4 * n / 2);
    drop(Tensor::zeros([n], MemoryCategory::Activation));
    assert_eq!(
        pool::cached_bytes(),
        4 * n,
        "a second buffer would exceed the limit"
    );
    assert_eq!(pool::release_cached_buffers(), 4 * n);
    assert_eq!(pool::cached_bytes(), 0);
    pool::set_limit_bytes(0);
    drop(Tensor::zeros([n], MemoryCategory::Activation));
    assert_eq!(pool::cached_bytes(), 0, "limit 0 disables pooling");
    assert_eq!(pool::limit_bytes(), 0);
}
