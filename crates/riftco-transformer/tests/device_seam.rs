//! The device seam: every op of a training step, of an Adam step and of decoding reaches its
//! kernels through the `Backend` trait. The mirror backend (`riftco_tensor::backend::mirror`,
//! device `privateuseone`) keeps its buffers as `u32` bit patterns that no CPU kernel can read,
//! and host access to its tensors is an error, so an op that bypassed the trait would fail here;
//! going through it, a step must give bitwise the CPU's loss, gradients and updated weights.

mod common;
use common::{block, model};
use riftco_autograd::{ops, AutogradError, Variable};
use riftco_tensor::backend::mirror;
use riftco_tensor::{memory_stats_for, Device, MemoryCategory, Tensor, TensorError};
use riftco_transformer::{
    ActivationCheckpointingKind as Ck, Adam, DecoderOnlyTransformer,
    FullSequenceAttentionKind as Attn, TransformerError,
};

const DEV: Device = Device::PrivateUse1;

fn bits(t: &Tensor) -> Vec<u32> {
    t.to_host().unwrap().iter().map(|v| v.to_bits()).collect()
}

fn params(m: &DecoderOnlyTransformer) -> Vec<(String, Variable)> {
    let mut v = m.weights().named_base_parameters();
    v.extend(m.weights().named_lora_parameters());
    v
}

#[test]
fn a_training_step_on_the_mirror_backend_is_bitwise_the_cpu_step() {
    mirror::install();
    let tokens = block(2, 9, 64);
    for attn in [Attn::Flash, Attn::Materialized] {
        for ck in [Ck::Disabled, Ck::TransformerBlock] {
            for lora in [false, true] {
                let case = format!("{attn} / {ck} / lora {lora}");
                let cpu = model(attn, ck, lora);
                let mut dev = model(attn, ck, lora);
                dev.to_device(DEV).unwrap();
                assert_eq!(dev.device(), DEV, "{case}");
                for (name, p) in params(&dev) {
                    assert_eq!(p.value().device(), DEV, "{case}: {name}");
                    assert!(p.value().read().is_err(), "{case}: host access to {name}");
                }
                let mut opt_cpu = Adam::new(cpu.trainable_parameters(), 1e-2).unwrap();
                let mut opt_dev = Adam::new(dev.trainable_parameters(), 1e-2).unwrap();
                for step in 0..2 {
                    let calls = mirror::kernel_calls();
                    let (lc, ld) = (
                        cpu.loss(&tokens, 2, 9).unwrap(),
                        dev.loss(&tokens, 2, 9).unwrap(),
                    );
                    assert_eq!(ld.value().device(), DEV, "{case}");
                    assert_eq!(
                        bits(lc.value()),
                        bits(ld.value()),
                        "{case} step {step}: loss"
                    );
                    lc.backward().unwrap();
                    ld.backward().unwrap();
                    for ((name, pc), (_, pd)) in params(&cpu).iter().zip(params(&dev)) {
                        match (pc.grad(), pd.grad()) {
                            (Some(gc), Some(gd)) => {
                                assert_eq!(gd.device(), DEV, "{case}: grad of {name}");
                                assert_eq!(
                                    bits(&gc),
                                    bits(&gd),
                                    "{case} step {step}: grad of {name}"
                                );
                            }
                            (None, None) => assert!(!pc.requires_grad(), "{case}: {name}"),
                            _ => panic!("{case}: {name} has a gradient on one device only"),
                        }
                    }
                    opt_cpu.step().unwrap();
                    opt_dev.step().unwrap();
                    for ((name, pc), (_, pd)) in params(&cpu).iter().zip(params(&dev)) {
                        assert_eq!(
                            bits(pc.value()),
                            bits(pd.value()),
                            "{case} step {step}: {name} after Adam"
                        );
                    }
                    assert!(
                        mirror::kernel_calls() > calls,
                        "{case}: no kernel ran on the mirror"
                    );
                }
                // Decoding runs the block code on the device too.
                let (mut sc, mut sd) =
                    (cpu.decode_session().unwrap(), dev.decode_session().unwrap());
                for &t in &tokens[..6] {
                    let (a, b) = (sc.decode_token(t).unwrap(), sd.decode_token(t).unwrap());
                    let (a, b): (Vec<u32>, Vec<u32>) = (
                        a.iter().map(|v| v.to_bits()).collect(),
                        b.iter().map(|v| v.to_bits()).collect(),
                    );
                    assert_eq!(a, b, "{case}: decode logits");
                }
            }
        }
    }
}

#[test]
fn mixing_devices_in_one_op_is_a_device_mismatch_naming_both() {
    mirror::install();
    let a = Variable::leaf(Tensor::ones([2, 3], MemoryCategory::Parameter), true);
    let b = Variable::leaf(Tensor::ones([2, 3], MemoryCategory::Parameter), true);
    let mut moved = b.value().clone();
    moved.transfer_to(DEV).unwrap();
    for (what, err) in [
        ("add", ops::add(&a, &b).unwrap_err()),
        ("mul", ops::mul(&b, &a).unwrap_err()),
        ("swiglu", ops::swiglu(&a, &b).unwrap_err()),
    ] {
        let msg = err.to_string();
        assert!(
            matches!(
                err,
                AutogradError::Tensor(TensorError::DeviceMismatch { .. })
            ),
            "{what}: {msg}"
        );
        assert!(
            msg.contains("cpu") && msg.contains("privateuseone"),
            "{what}: {msg}"
        );
    }
    // A model split across devices: the first op that mixes them says so.
    let m = model(Attn::Flash, Ck::Disabled, false);
    let mut head = m.weights().lm_head.value().clone();
    head.transfer_to(DEV).unwrap();
    let err = m.loss(&block(1, 5, 64), 1, 5).unwrap_err();
    assert!(
        matches!(
            err,
            TransformerError::Autograd(AutogradError::Tensor(TensorError::DeviceMismatch {
                lhs: Device::Cpu,
                rhs: Device::PrivateUse1,
                ..
            }))
        ),
        "{err}"
    );
    // Adam refuses before updating anything.
    let m = model(Attn::Flash, Ck::Disabled, false);
    let mut opt = Adam::new(m.trainable_parameters(), 1e-2).unwrap();
    m.loss(&block(1, 5, 64), 1, 5).unwrap().backward().unwrap();
    let before: Vec<Vec<f32>> = params(&m).iter().map(|(_, p)| p.value().to_vec()).collect();
    let mut w = m.weights().final_norm.value().clone();
    w.transfer_to(DEV).unwrap();
    let err = opt.step().unwrap_err();
    let msg = err.to_string();
    assert!(
        matches!(err, TransformerError::OptimizerDevice { .. })
            && err.kind() == riftco_tensor::ErrorKind::DeviceMismatch,
        "{msg}"
    );
    assert!(
        msg.contains("model.norm.weight") && msg.contains("privateuseone") && msg.contains("cpu"),
        "the error names the parameter and both devices: {msg}"
    );
    let after: Vec<Vec<f32>> = params(&m).iter().map(|(_, p)| p.value().to_vec()).collect();
    assert_eq!(
        before, after,
        "a refused step must not update any parameter"
    );
}

#[test]
fn host_access_is_explicit_and_a_transfer_makes_graphs_stale() {
    mirror::install();
    let mut t = Tensor::from_vec(vec![1.0, -2.0, 3.5], [3], MemoryCategory::Workspace).unwrap();
    let v0 = t.version();
    t.transfer_to(DEV).unwrap();
    assert!(t.version() > v0, "a transfer bumps the version");
    assert_eq!(t.device(), DEV);
    let err = t.read().err().unwrap();
    assert!(
        matches!(err, TensorError::NotOnHost { device: DEV, .. }),
        "{err}"
    );
    assert!(err.to_string().contains("privateuseone"), "{err}");
    assert!(t.write().is_err());
    assert_eq!(t.to_host().unwrap(), vec![1.0, -2.0, 3.5]);
    t.transfer_to(Device::Cpu).unwrap();
    assert_eq!(&*t.read().unwrap(), &[1.0, -2.0, 3.5]);

    // A graph recorded before the model moved is stale.
    let mut m = model(Attn::Flash, Ck::TransformerBlock, false);
    let loss = m.loss(&block(1, 5, 64), 1, 5).unwrap();
    m.to_device(DEV).unwrap();
    let err = loss.backward().unwrap_err();
    assert!(matches!(err, AutogradError::StaleGraph { .. }), "{err}");
    // And a decode session opened before refuses to decode.
    let mut m = model(Attn::Flash, Ck::Disabled, false);
    let mut s = m.decode_session().unwrap();
    m.to_device(DEV).unwrap();
    let err = s.decode_token(1).unwrap_err();
    assert!(err.to_string().contains("to_device"), "{err}");
    // Moving back gives the same numbers as never moving.
    m.to_device(Device::Cpu).unwrap();
    let fresh = model(Attn::Flash, Ck::Disabled, false);
    let toks = block(1, 5, 64);
    assert_eq!(
        bits(m.loss(&toks, 1, 5).unwrap().value()),
        bits(fresh.loss(&toks, 1, 5).unwrap().value())
    );
}

#[test]
fn memory_is_accounted_per_device() {
    mirror::install();
    let cpu_before = memory_stats_for(Device::Cpu)
        .get(MemoryCategory::Parameter)
        .current_bytes;
    let dev_before = memory_stats_for(DEV)
        .get(MemoryCategory::Parameter)
        .current_bytes;
    let mut t = Tensor::zeros([1000], MemoryCategory::Parameter);
    let cpu_with = memory_stats_for(Device::Cpu)
        .get(MemoryCategory::Parameter)
        .current_bytes;
    assert_eq!(cpu_with - cpu_before, 4000);
    t.transfer_to(DEV).unwrap();
    let (cpu_now, dev_now) = (
        memory_stats_for(Device::Cpu)
            .get(MemoryCategory::Parameter)
            .current_bytes,
        memory_stats_for(DEV)
            .get(MemoryCategory::Parameter)
            .current_bytes,
    );
    assert_eq!(cpu_now, cpu_before, "the host bytes left with the transfer");
    assert_eq!(dev_now - dev_before, 4000, "and arrived on the device");
    // The K/V cache of a decode session is an activation on the model's device.
    let mut m = model(Attn::Flash, Ck::Disabled, false);
    m.to_device(DEV).unwrap();
    let act = || {
        memory_stats_for(DEV)
            .get(MemoryCategory::Activation)
            .current_bytes
    };
    let before = act();
    let s = m.decode_session().unwrap();
    let c = m.config();
    assert_eq!(
        act() - before,
        2 * c.n_layers * c.max_seq_len * c.d_model * 4
    );
    drop(s);
    assert_eq!(act(), before);
    drop(t);
    assert_eq!(
        memory_stats_for(DEV)
            .get(MemoryCategory::Parameter)
            .current_bytes,
        dev_before
            + m.weights()
                .named_base_parameters()
                .iter()
                .map(|(_, p)| 4 * p.value().numel())
                .sum::<usize>()
    );
}

/// Adapters added to a moved model live on its device (before: on the CPU, so the next loss
/// was a DeviceMismatch and the model was split across devices).
#[test]
fn lora_enabled_on_a_moved_model_lives_on_its_device() {
    mirror::install();
    let lora = riftco_transformer::LoraConfig {
        rank: 4,
        alpha: 8.0,
        targets: riftco_transformer::LoraTargets {
            attention: true,
            mlp: true,
        },
        seed: 3,
        dropout: 0.0,
    };
    let mut cpu = model(Attn::Flash, Ck::TransformerBlock, false);
    let mut dev = model(Attn::Flash, Ck::TransformerBlock, false);
    dev.to_device(DEV).unwrap();
    cpu.enable_lora(&lora).unwrap();
    dev.enable_lora(&lora).unwrap();
    for (name, p) in dev.weights().named_lora_parameters() {
        assert_eq!(p.value().device(), DEV, "{name}");
    }
    let toks = block(2, 9, 64);
    let (lc, ld) = (
        cpu.loss(&toks, 2, 9).unwrap(),
        dev.loss(&toks, 2, 9).unwrap(),
    );
    assert_eq!(bits(lc.value()), bits(ld.value()));
    ld.backward().unwrap();
    cpu.merge_lora().unwrap();
    dev.merge_lora().unwrap();
    for ((name, pc), (_, pd)) in params(&cpu).iter().zip(params(&dev)) {
        assert_eq!(pd.value().device(), DEV, "{name}");
        assert_eq!(bits(pc.value()), bits(pd.value()), "{name} after merge");
    }
}
