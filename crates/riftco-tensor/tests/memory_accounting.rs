//! Exactness of memory accounting. Runs in its own test binary so no other test allocates
//! tensors concurrently (the counters are process-wide).

use riftco_tensor::{
    memory_at_total_peak_for, memory_stats, reset_peak_memory_stats, Device, MemoryCategory, Tensor,
};

#[test]
fn allocation_moves_counter_by_exactly_four_bytes_per_element_and_back() {
    for (i, cat) in MemoryCategory::ALL.into_iter().enumerate() {
        let n = 1000 + 37 * i;
        let before = memory_stats().get(cat).current_bytes;
        let t = Tensor::zeros([n], cat);
        assert_eq!(memory_stats().get(cat).current_bytes, before + 4 * n);
        // Reshapes and clones share storage: no new bytes.
        let r = t.reshape([1, n]).unwrap();
        let c = t.clone();
        assert_eq!(memory_stats().get(cat).current_bytes, before + 4 * n);
        drop(t);
        assert_eq!(memory_stats().get(cat).current_bytes, before + 4 * n);
        drop(r);
        drop(c);
        assert_eq!(memory_stats().get(cat).current_bytes, before);
        // from_vec with spare capacity accounts the exact length after shrinking.
        let mut v = Vec::with_capacity(4 * n);
        v.resize(n, 1.0f32);
        let t = Tensor::from_vec(v, [n], cat).unwrap();
        assert_eq!(memory_stats().get(cat).current_bytes, before + 4 * n);
        drop(t);
        assert_eq!(memory_stats().get(cat).current_bytes, before);
    }
}

#[test]
fn peak_tracks_highest_and_resets_to_current() {
    let cat = MemoryCategory::Workspace;
    reset_peak_memory_stats();
    let base = memory_stats().get(cat);
    assert_eq!(base.peak_bytes, base.current_bytes);
    let a = Tensor::zeros([4096], cat);
    let b = Tensor::zeros([1024], cat);
    drop(a);
    let s = memory_stats().get(cat);
    assert_eq!(s.current_bytes, base.current_bytes + 4 * 1024);
    assert_eq!(s.peak_bytes, base.current_bytes + 4 * (4096 + 1024));
    reset_peak_memory_stats();
    assert_eq!(memory_stats().get(cat).peak_bytes, s.current_bytes);
    drop(b);
    let total = memory_stats().total;
    assert!(total.peak_bytes >= total.current_bytes);
}

#[test]
fn total_peak_composition_is_what_was_alive_together() {
    use MemoryCategory::{Activation, Parameter, Workspace};
    let at = |c: MemoryCategory| {
        let i = MemoryCategory::ALL.iter().position(|&x| x == c).unwrap();
        memory_at_total_peak_for(Device::Cpu)[i]
    };
    reset_peak_memory_stats();
    let now = memory_stats();
    for c in MemoryCategory::ALL {
        assert_eq!(at(c), now.get(c).current_bytes, "{c} after a reset");
    }
    let (p0, a0, w0) = (at(Parameter), at(Activation), at(Workspace));
    let p = Tensor::zeros([1000], Parameter);
    let a = Tensor::zeros([3000], Activation);
    drop(a);
    // 1000 + 2000 elements stay below the 1000 + 3000 reached before: the peak keeps its parts,
    // though the workspace's own peak is now higher than at that moment.
    let w = Tensor::zeros([2000], Workspace);
    assert_eq!(
        (at(Parameter) - p0, at(Activation) - a0, at(Workspace) - w0),
        (4000, 12000, 0)
    );
    let w2 = Tensor::zeros([1500], Workspace);
    assert_eq!(
        (at(Parameter) - p0, at(Activation) - a0, at(Workspace) - w0),
        (4000, 0, 14000)
    );
    let sum: usize = MemoryCategory::ALL.into_iter().map(at).sum();
    assert_eq!(sum, memory_stats().total.peak_bytes);
    drop((p, w, w2));
}
