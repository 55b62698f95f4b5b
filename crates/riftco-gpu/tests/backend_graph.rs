//! The GPU backend under autograd: a small graph (matmul → broadcast add → unary → sum) and its
//! backward on the GPU device vs the CPU (loss and every gradient within 1e-4 of
//! `max(|want|, 1)`: matmul and sum orders differ), the transformer ops under autograd (SiLU
//! → softmax → sum), activation bytes counted on the GPU device
//! and released after backward, and the error contracts: unknown device names, `"gpu"`, a
//! Metal request on a machine without one, mixing devices in one op, and a transfer of a tensor whose graph is live (the graph becomes stale, as on
//! the CPU ↔ mirror path). The memory test reads process-wide counters: run it in its own
//! process (`cargo nextest`, as CI does).

mod common;

use common::{assert_close, backend_or_skip, values};
use riftco_autograd::{ops, AutogradError, Variable};
use riftco_tensor::backend;
use riftco_tensor::memory::memory_stats_for;
use riftco_tensor::{Device, MemoryCategory as C, Tensor, TensorError};

fn leaf(dims: &[usize], seed: u32, device: Device) -> Variable {
    let n = dims.iter().product();
    let mut t = Tensor::from_vec(values(n, seed, -1.0, 1.0), dims.to_vec(), C::Parameter).unwrap();
    t.transfer_to(device).unwrap();
    Variable::leaf(t, true)
}

/// loss = Σ 1.5·tanh(x·w + b), with the leaves; the graph keeps what its VJPs read.
fn graph(device: Device) -> (Variable, [Variable; 3]) {
    let (x, w, b) = (
        leaf(&[5, 7], 1, device),
        leaf(&[7, 3], 2, device),
        leaf(&[3], 3, device),
    );
    let h = ops::matmul(&x, &w).unwrap();
    let h = ops::broadcast_add(&h, &b).unwrap();
    let h = ops::tanh(&h).unwrap();
    let h = ops::mul_scalar(&h, 1.5).unwrap();
    let loss = ops::sum_axes(&h, None, false).unwrap();
    (loss, [x, w, b])
}

#[test]
fn autograd_on_the_gpu_matches_the_cpu_within_1e_4() {
    let Some(dev) = backend_or_skip("autograd_on_the_gpu_matches_the_cpu_within_1e_4") else {
        return;
    };
    let (lc, leaves_c) = graph(Device::Cpu);
    let (lg, leaves_g) = graph(dev);
    assert_eq!(lg.value().device(), dev);
    assert_close(
        "loss",
        &lg.value().to_vec(),
        &lc.value().to_vec(),
        1e-4,
        1.0,
    );
    lc.backward().unwrap();
    lg.backward().unwrap();
    for (i, (c, g)) in leaves_c.iter().zip(&leaves_g).enumerate() {
        let (gc, gg) = (c.grad().unwrap(), g.grad().unwrap());
        assert_eq!(gg.device(), dev, "gradient {i} stays on the GPU");
        assert_close(&format!("grad {i}"), &gg.to_vec(), &gc.to_vec(), 1e-4, 1.0);
    }
}

#[test]
fn activations_are_counted_on_the_gpu_device_and_released_after_backward() {
    let Some(dev) = backend_or_skip("activations_are_counted_on_the_gpu_device") else {
        return;
    };
    let act = || memory_stats_for(dev).get(C::Activation).current_bytes;
    let before = act();
    let (loss, leaves) = graph(dev);
    let live = act() - before;
    // Exactly what the VJPs read: tanh's output [5, 3] (its VJP reads y), and the scalar loss;
    // the product, the sum with the bias and the scaled values go (no VJP reads them).
    assert_eq!(live, 15 * 4 + 4, "live activation bytes on {dev}");
    loss.backward().unwrap();
    drop(loss);
    assert_eq!(act(), before, "activations released after backward");
    let grads = memory_stats_for(dev).get(C::Gradient).current_bytes;
    assert!(
        grads >= 4 * (35 + 21 + 3),
        "leaf gradients on {dev}: {grads}"
    );
    drop(leaves);
}

#[test]
fn device_names_and_availability() {
    let Some(dev) = backend_or_skip("device_names_and_availability") else {
        return;
    };
    assert_eq!(Device::parse("VULKAN").unwrap(), Device::Vulkan);
    assert_eq!(Device::Vulkan.name(), "vulkan");
    assert_eq!(Device::parse("gpu").unwrap(), dev);
    assert!(dev.check_available().is_ok());
    let e = Device::parse("cuda").unwrap_err().to_string();
    assert!(
        e.contains("\"cuda\"") && e.contains("\"vulkan\"") && e.contains("\"gpu\""),
        "{e}"
    );
    if dev == Device::Vulkan && !cfg!(target_os = "macos") {
        let e = riftco_gpu::install(riftco_gpu::GpuKind::Metal).unwrap_err();
        let TensorError::DeviceUnavailable { device, reason } = &e else {
            panic!("{e}");
        };
        assert_eq!(*device, Device::Metal);
        // What was looked for and what was found.
        assert!(
            reason.contains("metal") && reason.contains("found"),
            "{reason}"
        );
        let e = Device::Metal.check_available().unwrap_err().to_string();
        assert!(e.contains("macOS"), "{e}");
    }
}

#[test]
fn mixing_devices_names_both() {
    let Some(dev) = backend_or_skip("mixing_devices_names_both") else {
        return;
    };
    let a = leaf(&[2, 3], 4, Device::Cpu);
    let b = leaf(&[2, 3], 5, dev);
    let e = ops::add(&a, &b).unwrap_err().to_string();
    assert!(e.contains("cpu") && e.contains(dev.name()), "{e}");
    let e = backend::backend_of("t", &[b.value(), a.value()]).unwrap_err();
    assert_eq!(
        e,
        TensorError::DeviceMismatch {
            op: "t",
            lhs: dev,
            rhs: Device::Cpu
        }
    );
}

/// The transformer ops under autograd on the GPU (SiLU → row softmax → sum, each with its VJP)
/// vs the CPU: loss and gradient within 1e-4 of `max(|want|, 1)` (softmax VJP tolerance).
#[test]
fn transformer_ops_run_under_autograd_on_the_gpu() {
    let Some(dev) = backend_or_skip("transformer_ops_run_under_autograd_on_the_gpu") else {
        return;
    };
    let run = |device: Device| {
        let x = leaf(&[2, 3], 6, device);
        let y = ops::softmax(&ops::silu(&x).unwrap()).unwrap();
        let w = leaf(&[2, 3], 7, device);
        let loss = ops::sum(&ops::mul(&y, &w).unwrap()).unwrap();
        loss.backward().unwrap();
        (loss.value().to_vec(), x.grad().unwrap())
    };
    let (lc, gc) = run(Device::Cpu);
    let (lg, gg) = run(dev);
    assert_close("loss", &lg, &lc, 1e-4, 1.0);
    assert_eq!(gg.device(), dev, "the gradient stays on the GPU");
    assert_close("dx", &gg.to_vec(), &gc.to_vec(), 1e-4, 1.0);
}

#[test]
fn transferring_a_tensor_whose_graph_is_live_makes_the_graph_stale() {
    let Some(dev) = backend_or_skip("transferring_a_tensor_whose_graph_is_live") else {
        return;
    };
    // CPU → GPU under a live graph.
    let (loss, [_, w, _]) = graph(Device::Cpu);
    w.value().clone().transfer_to(dev).unwrap();
    let e = loss.backward().unwrap_err();
    assert!(matches!(e, AutogradError::StaleGraph { .. }), "{e}");
    // GPU → CPU likewise.
    let (loss, [x, _, _]) = graph(dev);
    x.value().clone().transfer_to(Device::Cpu).unwrap();
    let e = loss.backward().unwrap_err();
    assert!(matches!(e, AutogradError::StaleGraph { .. }), "{e}");
}

#[test]
fn synchronize_submits_the_batched_kernels_and_waits_for_them() {
    let Some(dev) = backend_or_skip("synchronize_submits_the_batched_kernels_and_waits_for_them")
    else {
        return;
    };
    let ctx = riftco_gpu::install_device(dev).unwrap();
    let (loss, _) = graph(dev);
    // The kernels are recorded, not yet waited for: synchronize submits them and waits once.
    let before = ctx.batch_stats();
    backend::synchronize(dev).unwrap();
    let after = ctx.batch_stats();
    assert!(after.waits > before.waits, "{before:?} -> {after:?}");
    // Nothing is pending afterwards: a second synchronize submits nothing new.
    backend::synchronize(dev).unwrap();
    assert_eq!(ctx.batch_stats().submits, after.submits);
    // The values are those computed (reading them back needs no further kernel).
    assert_eq!(loss.value().to_host().unwrap().len(), 1);
    // The CPU computes when called: nothing to wait for.
    backend::synchronize(Device::Cpu).unwrap();
}
