//! Buffers: upload/download round trips, the pool's reuse by size bucket, byte accounting and
//! the errors of bad sizes (never a panic).

mod common;

use common::gpu_or_skip;
use riftco_gpu::{bucket_bytes, kernels, GpuError};
use riftco_kernels::matmul::MatmulSpec;

#[test]
fn buckets_are_powers_of_two_of_at_least_256_bytes() {
    assert_eq!(bucket_bytes(0), 256);
    assert_eq!(bucket_bytes(1), 256);
    assert_eq!(bucket_bytes(64), 256);
    assert_eq!(bucket_bytes(65), 512);
    assert_eq!(bucket_bytes(1000), 4096);
}

#[test]
fn upload_download_round_trips_every_size() {
    let Some(ctx) = gpu_or_skip("upload_download_round_trips_every_size") else {
        return;
    };
    for n in [0usize, 1, 7, 63, 65, 257, 100_000] {
        let data: Vec<f32> = (0..n).map(|i| (i as f32).sin() * 1e3).collect();
        let buf = ctx.upload(&data).unwrap();
        assert_eq!(buf.len(), n);
        assert_eq!(ctx.download(&buf).unwrap(), data, "n={n}");
    }
    let special = [f32::NAN, f32::INFINITY, -0.0, f32::MIN_POSITIVE / 2.0];
    let got = ctx.download(&ctx.upload(&special).unwrap()).unwrap();
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&got), bits(&special));
}

#[test]
fn freed_buffers_are_reused_by_bucket_and_counted() {
    let Some(ctx) = gpu_or_skip("freed_buffers_are_reused_by_bucket_and_counted") else {
        return;
    };
    let m0 = ctx.memory();
    assert_eq!((m0.live_bytes, m0.cached_bytes, m0.allocations), (0, 0, 0));
    let a = ctx.alloc(100).unwrap(); // 400 bytes → the 512-byte bucket
    assert_eq!(a.allocated_bytes(), 512);
    assert_eq!(ctx.memory().live_bytes, 512);
    drop(a);
    let m1 = ctx.memory();
    assert_eq!((m1.live_bytes, m1.cached_bytes), (0, 512));
    let b = ctx.alloc(90).unwrap(); // same bucket: reused
    let m2 = ctx.memory();
    assert_eq!(
        (m2.allocations, m2.reuses, m2.cached_bytes, m2.live_bytes),
        (1, 1, 0, 512)
    );
    let c = ctx.alloc(1000).unwrap(); // another bucket: allocated
    assert_eq!(ctx.memory().allocations, 2);
    assert_eq!(ctx.memory().peak_live_bytes, 512 + 4096);
    drop((b, c));
    assert_eq!(ctx.memory().cached_bytes, 512 + 4096);
    assert_eq!(ctx.trim_pool(), 512 + 4096);
    assert_eq!(ctx.memory().cached_bytes, 0);
}

#[test]
fn a_reused_buffer_does_not_leak_old_values_into_results() {
    let Some(ctx) = gpu_or_skip("a_reused_buffer_does_not_leak_old_values_into_results") else {
        return;
    };
    let x = ctx.upload(&[1.0; 50]).unwrap();
    let old = kernels::scale(&ctx, &x, 7.0).unwrap();
    drop(old); // back to the pool while its kernel is still pending
    let y = kernels::scale(&ctx, &x, 3.0).unwrap(); // reuses old's buffer
    assert!(ctx.memory().reuses >= 1);
    assert_eq!(ctx.download(&y).unwrap(), vec![3.0; 50]);
}

#[test]
fn bad_sizes_are_errors_naming_the_values() {
    let Some(ctx) = gpu_or_skip("bad_sizes_are_errors_naming_the_values") else {
        return;
    };
    let a = ctx.upload(&[1.0; 7]).unwrap();
    let b = ctx.upload(&[1.0; 8]).unwrap();
    let e = kernels::add(&ctx, &a, &b).unwrap_err();
    assert!(matches!(e, GpuError::Shape { .. }), "{e}");
    assert!(
        e.to_string().contains('8') && e.to_string().contains('7'),
        "{e}"
    );

    let e = ctx.write(&a, &[0.0; 3]).unwrap_err();
    assert!(e.to_string().contains("3 values for a buffer of 7"), "{e}");

    let e = kernels::matmul(&ctx, MatmulSpec::new(2, 3, 4), &a, &b).unwrap_err();
    assert!(e.to_string().contains("a has 7 values, expected 6"), "{e}");

    let e = kernels::sum_rows(&ctx, &a, 2, 3).unwrap_err();
    assert!(e.to_string().contains("expected 6"), "{e}");

    let e = kernels::softmax_rows(&ctx, &a, usize::MAX, 2).unwrap_err();
    assert!(e.to_string().contains("overflows"), "{e}");

    let c = ctx.upload(&[0.0; 4]).unwrap();
    let e = kernels::matmul_into(&ctx, 1, MatmulSpec::new(2, 2, 2), &c, &b, &c);
    assert!(e.is_err());

    // The context still works after the errors.
    assert_eq!(ctx.download(&a).unwrap(), vec![1.0; 7]);
}

#[test]
fn an_allocation_past_the_device_limit_is_an_error_not_a_panic() {
    let Some(ctx) = gpu_or_skip("an_allocation_past_the_device_limit_is_an_error_not_a_panic")
    else {
        return;
    };
    let e = ctx.alloc(usize::MAX / 8).unwrap_err();
    assert!(matches!(e, GpuError::BufferTooLarge { .. }), "{e}");
    assert!(
        e.to_string()
            .contains("exceeds the device's per-buffer limit"),
        "{e}"
    );
    let e = ctx.alloc(1 << 40).unwrap_err();
    assert!(matches!(e, GpuError::BufferTooLarge { .. }), "{e}");
}

#[test]
fn operations_on_a_destroyed_device_are_errors_not_panics() {
    let Some(ctx) = gpu_or_skip("operations_on_a_destroyed_device_are_errors_not_panics") else {
        return;
    };
    let x = ctx.upload(&[1.0, 2.0]).unwrap();
    let y = kernels::scale(&ctx, &x, 2.0).unwrap();
    assert_eq!(ctx.download(&y).unwrap(), vec![2.0, 4.0]);
    ctx.destroy();
    let e = ctx.download(&y).unwrap_err();
    assert!(matches!(e, GpuError::DeviceLost { .. }), "{e}");
    assert!(e.to_string().contains("Destroyed"), "{e}");
    let e = kernels::scale(&ctx, &x, 2.0).unwrap_err();
    assert!(matches!(e, GpuError::DeviceLost { .. }), "{e}");
    let e = ctx.upload(&[1.0, 2.0, 3.0]).unwrap_err();
    assert!(matches!(e, GpuError::DeviceLost { .. }), "{e}");
}

#[test]
fn a_buffer_of_another_context_is_an_error_not_a_panic() {
    let Some(ctx) = gpu_or_skip("a_buffer_of_another_context_is_an_error_not_a_panic") else {
        return;
    };
    let Some(other) = gpu_or_skip("a_buffer_of_another_context_is_an_error_not_a_panic") else {
        return;
    };
    let a = ctx.upload(&[1.0, 2.0]).unwrap();
    let b = other.upload(&[3.0, 4.0]).unwrap();
    // wgpu itself read a wrong buffer here ([2, 4] instead of an error) before the check.
    let e = kernels::add(&ctx, &a, &b).unwrap_err();
    assert!(matches!(e, GpuError::ForeignBuffer { .. }), "{e}");
    assert!(
        e.to_string()
            .contains("add: the buffer at binding 1 belongs to another"),
        "{e}"
    );
    let e = ctx.download(&b).unwrap_err();
    assert!(matches!(e, GpuError::ForeignBuffer { .. }), "{e}");
    assert!(ctx.write(&b, &[0.0, 0.0]).is_err());
    // Both contexts still work.
    assert_eq!(ctx.download(&a).unwrap(), vec![1.0, 2.0]);
    assert_eq!(other.download(&b).unwrap(), vec![3.0, 4.0]);
}

#[test]
fn a_buffer_past_the_per_buffer_limit_names_both_sizes() {
    let Some(ctx) = gpu_or_skip("a_buffer_past_the_per_buffer_limit_names_both_sizes") else {
        return;
    };
    let limit = ctx.max_buffer_bytes();
    eprintln!("per-buffer limit of {}: {limit} bytes", ctx.adapter());
    // Refused on the host before any allocation, so the size costs nothing here.
    let len = usize::try_from(limit / 4 + 1).unwrap();
    let e = ctx.alloc(len).unwrap_err();
    let bytes = len as u64 * 4;
    assert!(
        matches!(e, riftco_gpu::GpuError::BufferTooLarge { bytes: b, limit: l, .. } if b == bytes && l == limit),
        "{e:?}"
    );
    let msg = riftco_gpu::backend::to_tensor_error("upload", riftco_tensor::Device::Vulkan, e)
        .to_string();
    for part in [
        bytes.to_string(),
        limit.to_string(),
        "per-buffer limit".into(),
        "not its free memory".into(),
    ] {
        assert!(msg.contains(&part), "{msg} lacks {part}");
    }
}
