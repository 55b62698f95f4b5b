//! `DecoderOnlyTransformer::to_device` reaching the GPU backend: the parameters move (bytes
//! counted on the GPU device, none left on the CPU for them), come back bitwise, `"gpu"`
//! resolves to the adapter's device, bad names and a live graph behave as on the CPU ↔ mirror
//! path, and a forward on the GPU fails with a clear `Unsupported` naming the first op without
//! a GPU kernel yet (the transformer kernels are another slice's work).

mod common;

use common::backend_or_skip;
use riftco_autograd::AutogradError;
use riftco_tensor::{memory_stats_for, Device, ErrorKind, MemoryCategory, Tensor};
use riftco_transformer::device::resolve_device;
use riftco_transformer::{
    ActivationCheckpointingKind as Ck, DecoderOnlyTransformer, FullSequenceAttentionKind as Attn,
    TransformerConfig,
};

fn model() -> DecoderOnlyTransformer {
    let mut c = TransformerConfig::new(64, 32, 4, 2, 48, 16);
    c.seed = 5;
    DecoderOnlyTransformer::new(c, Attn::Flash, Ck::Disabled).unwrap()
}

fn bits(t: &Tensor) -> Vec<u32> {
    t.to_host().unwrap().iter().map(|v| v.to_bits()).collect()
}

fn tokens() -> Vec<u32> {
    (0..10u32).map(|i| (i * 7 + 3) % 64).collect()
}

#[test]
fn a_model_moves_to_the_gpu_and_back_bitwise() {
    let Some(dev) = backend_or_skip("a_model_moves_to_the_gpu_and_back_bitwise") else {
        return;
    };
    let mut m = model();
    let params = m.weights().named_base_parameters();
    let before: Vec<Vec<u32>> = params.iter().map(|(_, p)| bits(p.value())).collect();
    let n_bytes: i64 = params
        .iter()
        .map(|(_, p)| 4 * p.value().numel() as i64)
        .sum();
    let on_gpu = || {
        memory_stats_for(dev)
            .get(MemoryCategory::Parameter)
            .current_bytes as i64
    };
    let gpu0 = on_gpu();
    m.to_device(dev).unwrap();
    assert_eq!(m.device(), dev);
    for (name, p) in &params {
        assert_eq!(p.value().device(), dev, "{name}");
    }
    assert_eq!(on_gpu() - gpu0, n_bytes, "parameter bytes counted on {dev}");
    m.to_device(Device::Cpu).unwrap();
    assert_eq!(on_gpu(), gpu0);
    for ((name, p), want) in params.iter().zip(&before) {
        assert_eq!(&bits(p.value()), want, "{name} after the round trip");
    }
}

#[test]
fn device_names_resolve_and_bad_ones_are_clear_errors() {
    let Some(dev) = backend_or_skip("device_names_resolve_and_bad_ones_are_clear_errors") else {
        return;
    };
    assert_eq!(resolve_device("gpu").unwrap(), dev);
    assert_eq!(resolve_device("Vulkan").unwrap(), Device::Vulkan);
    assert_eq!(resolve_device("cpu").unwrap(), Device::Cpu);
    let e = resolve_device("tpu").unwrap_err().to_string();
    assert!(e.contains("\"tpu\"") && e.contains("\"vulkan\""), "{e}");
    if !cfg!(target_os = "macos") {
        let mut m = model();
        let e = m.to_device(Device::Metal).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::DeviceUnavailable, "{e}");
        let msg = e.to_string();
        assert!(msg.contains("metal") && msg.contains("found"), "{msg}");
        assert_eq!(
            m.device(),
            Device::Cpu,
            "a failed move leaves the model where it was"
        );
    }
}

#[test]
fn a_graph_recorded_before_the_move_is_stale() {
    let Some(dev) = backend_or_skip("a_graph_recorded_before_the_move_is_stale") else {
        return;
    };
    let mut m = model();
    let loss = m.loss(&tokens(), 1, 10).unwrap();
    m.to_device(dev).unwrap();
    let e = loss.backward().unwrap_err();
    assert!(matches!(e, AutogradError::StaleGraph { .. }), "{e}");
}

#[test]
fn a_forward_on_the_gpu_names_the_first_op_without_a_kernel() {
    let Some(dev) = backend_or_skip("a_forward_on_the_gpu_names_the_first_op_without_a_kernel")
    else {
        return;
    };
    let mut m = model();
    m.to_device(dev).unwrap();
    let e = m.loss(&tokens(), 1, 10).unwrap_err();
    let msg = e.to_string();
    assert!(
        msg.contains(&format!("not implemented on device {dev}")),
        "{msg}"
    );
}
