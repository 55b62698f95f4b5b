//! `ThreadMemoryScope` counts this thread's allocations of one device and category, exactly,
//! whatever other threads allocate meanwhile.

use riftco_tensor::{Device, MemoryCategory, Tensor, ThreadMemoryScope};
use std::sync::{Arc, Barrier};

#[test]
fn a_scope_counts_only_its_threads_allocations_of_its_category() {
    let cat = MemoryCategory::Activation;
    let other_thread_allocated = Arc::new(Barrier::new(2));
    let scope_done = Arc::new(Barrier::new(2));
    let (a, b) = (other_thread_allocated.clone(), scope_done.clone());
    let noisy = std::thread::spawn(move || {
        // Allocates and frees while the scope below is open on the main thread.
        let big = Tensor::zeros([1 << 20], MemoryCategory::Activation);
        a.wait();
        b.wait();
        drop(big);
    });
    let scope = ThreadMemoryScope::new(Device::Cpu, cat);
    other_thread_allocated.wait();
    assert_eq!(scope.current_bytes(), 0);
    let x = Tensor::zeros([1000], cat);
    let _w = Tensor::zeros([5000], MemoryCategory::Workspace); // another category: not counted
    assert_eq!(scope.current_bytes(), 4000);
    let y = Tensor::zeros([250], cat);
    assert_eq!(scope.current_bytes(), 5000);
    drop(x);
    assert_eq!(scope.current_bytes(), 1000);
    assert_eq!(scope.peak_bytes(), 5000);
    scope.reset_peak();
    assert_eq!(scope.peak_bytes(), 1000);
    // Reshapes share storage: nothing new.
    let r = y.reshape([10, 25]).unwrap();
    drop(y);
    assert_eq!(scope.current_bytes(), 1000);
    drop(r);
    assert_eq!(scope.current_bytes(), 0);
    scope_done.wait();
    noisy.join().unwrap();
    assert_eq!(
        scope.current_bytes(),
        0,
        "the other thread's free is not counted here"
    );
}

#[test]
fn nested_scopes_each_count_from_their_own_start_and_frees_of_older_storage_go_negative() {
    let cat = MemoryCategory::Gradient;
    let old = Tensor::zeros([100], cat);
    let outer = ThreadMemoryScope::new(Device::Cpu, cat);
    let a = Tensor::zeros([10], cat);
    let inner = ThreadMemoryScope::new(Device::Cpu, cat);
    let b = Tensor::zeros([20], cat);
    assert_eq!((outer.current_bytes(), inner.current_bytes()), (120, 80));
    drop(inner);
    drop(old);
    assert_eq!(outer.current_bytes(), 120 - 400);
    assert_eq!(outer.peak_bytes(), 120);
    drop((a, b));
}
