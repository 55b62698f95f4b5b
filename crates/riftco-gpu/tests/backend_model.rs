//! `DecoderOnlyTransformer::to_device` reaching the GPU backend: the parameters move (bytes
//! counted on the GPU device, none left on the CPU for them), come back bitwise, `"gpu"`
//! resolves to the adapter's device, bad names and a live graph behave as on the CPU ↔ mirror
//! path. Training on the GPU: a tiny model (vocab 64, d_model 32, 2 heads, 2 layers, d_ff 48,
//! batch 2, seq 8) gives the CPU's loss, every gradient and the parameters after one Adam step
//! within 1e-4 of each tensor's largest magnitude (the kernels' reduction orders differ), for
//! flash and materialized attention × checkpointing disabled / per block × with and without
//! LoRA; on the GPU every checkpointing policy (block, segments, selective, per-block lists) is
//! bitwise the plain run; KV-cache decoding gives the
//! CPU's logits at every position within the same tolerance.

mod common;

use common::backend_or_skip;
use riftco_autograd::AutogradError;
use riftco_autograd::Variable;
use riftco_tensor::{memory_stats_for, Device, ErrorKind, MemoryCategory, Tensor};
use riftco_transformer::device::resolve_device;
use riftco_transformer::{
    ActivationCheckpointingKind as Ck, Adam, DecoderOnlyTransformer,
    FullSequenceAttentionKind as Attn, LoraConfig, LoraTargets, TransformerConfig,
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

/// The tiny model of the training tests, with rank-4 LoRA adapters (B filled with small
/// non-zero values so the adapter gradients are not trivially related) when `lora`.
fn tiny(attn: Attn, ck: Ck, lora: bool) -> DecoderOnlyTransformer {
    let mut c = TransformerConfig::new(64, 32, 2, 2, 48, 16);
    c.seed = 11;
    let mut m = DecoderOnlyTransformer::new(c, attn, ck).unwrap();
    if lora {
        let l = LoraConfig {
            rank: 4,
            alpha: 8.0,
            targets: LoraTargets {
                attention: true,
                mlp: true,
            },
            seed: 3,
            dropout: 0.0,
        };
        m.enable_lora(&l).unwrap();
        for (_, p) in m.weights().named_lora_parameters() {
            let n = p.value().numel();
            let vals: Vec<f32> = (0..n)
                .map(|i| ((i * 37 % 17) as f32 - 8.0) * 0.01)
                .collect();
            p.value().copy_from_slice(&vals).unwrap();
        }
    }
    m
}

fn params(m: &DecoderOnlyTransformer) -> Vec<(String, Variable)> {
    let mut v = m.weights().named_base_parameters();
    v.extend(m.weights().named_lora_parameters());
    v
}

/// A deterministic `[batch, seq + 1]` token block over the vocabulary.
fn block(batch: usize, seq_plus_one: usize, vocab: u32) -> Vec<u32> {
    (0..batch * seq_plus_one)
        .map(|i| ((i as u32).wrapping_mul(2_654_435_761) >> 7) % vocab)
        .collect()
}

/// `|got − want| ≤ 1e-4 · max |want|` element-wise (one scale per tensor).
fn close(what: &str, got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let scale = want.iter().fold(0.0f32, |m, x| m.max(x.abs())).max(1e-30);
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= 1e-4 * scale,
            "{what}[{i}]: gpu {g} vs cpu {w} (tolerance 1e-4 × max |cpu| {scale})"
        );
    }
}

/// One training step's loss, gradients (by parameter name) and parameters after one Adam step.
type Step = (Vec<f32>, Vec<(String, Option<Vec<f32>>)>, Vec<Vec<f32>>);

fn step(m: &DecoderOnlyTransformer, tokens: &[u32], device: Device) -> Step {
    let mut opt = Adam::new(m.trainable_parameters(), 1e-2).unwrap();
    let loss = m.loss(tokens, 2, 9).unwrap();
    assert_eq!(loss.value().device(), device);
    loss.backward().unwrap();
    let grads = params(m)
        .into_iter()
        .map(|(name, p)| {
            let g = p.grad().map(|g| {
                assert_eq!(g.device(), device, "gradient of {name}");
                g.to_host().unwrap()
            });
            (name, g)
        })
        .collect();
    opt.step().unwrap();
    let after = params(m)
        .iter()
        .map(|(_, p)| p.value().to_host().unwrap())
        .collect();
    (loss.value().to_host().unwrap(), grads, after)
}

fn bitwise(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

#[test]
fn a_training_step_on_the_gpu_matches_the_cpu_within_1e_4() {
    let Some(dev) = backend_or_skip("a_training_step_on_the_gpu_matches_the_cpu_within_1e_4")
    else {
        return;
    };
    let tokens = block(2, 9, 64);
    for attn in [Attn::Flash, Attn::Materialized] {
        for lora in [false, true] {
            let mut per_ck = Vec::new();
            for ck in [Ck::Disabled, Ck::TransformerBlock] {
                let case = format!("{attn} / {ck} / lora {lora}");
                let cpu = tiny(attn, ck, lora);
                let mut gpu = tiny(attn, ck, lora);
                gpu.to_device(dev).unwrap();
                let (lc, gc, pc) = step(&cpu, &tokens, Device::Cpu);
                let (lg, gg, pg) = step(&gpu, &tokens, dev);
                close(&format!("{case}: loss"), &lg, &lc);
                for ((name, c), (_, g)) in gc.iter().zip(&gg) {
                    match (c, g) {
                        (Some(c), Some(g)) => close(&format!("{case}: grad of {name}"), g, c),
                        (None, None) => {}
                        _ => panic!("{case}: {name} has a gradient on one device only"),
                    }
                }
                for (((name, _), c), g) in gc.iter().zip(&pc).zip(&pg) {
                    close(&format!("{case}: {name} after Adam"), g, c);
                }
                per_ck.push((lg, gg, pg));
            }
            // Checkpointing recomputes each block with the same kernels: bitwise the plain run.
            let (plain, ckpt) = (&per_ck[0], &per_ck[1]);
            let case = format!("{attn} / lora {lora}: checkpointed vs plain on {dev}");
            assert_eq!(bitwise(&plain.0), bitwise(&ckpt.0), "{case}: loss");
            for ((name, a), (_, b)) in plain.1.iter().zip(&ckpt.1) {
                assert_eq!(
                    a.as_deref().map(bitwise),
                    b.as_deref().map(bitwise),
                    "{case}: grad of {name}"
                );
            }
            for (a, b) in plain.2.iter().zip(&ckpt.2) {
                assert_eq!(bitwise(a), bitwise(b), "{case}: parameters after Adam");
            }
        }
    }
}

#[test]
fn decoding_on_the_gpu_matches_the_cpu_at_every_position() {
    let Some(dev) = backend_or_skip("decoding_on_the_gpu_matches_the_cpu_at_every_position") else {
        return;
    };
    let tokens = block(1, 12, 64);
    for lora in [false, true] {
        let cpu = tiny(Attn::Flash, Ck::Disabled, lora);
        let mut gpu = tiny(Attn::Flash, Ck::Disabled, lora);
        gpu.to_device(dev).unwrap();
        let (mut sc, mut sg) = (cpu.decode_session().unwrap(), gpu.decode_session().unwrap());
        for (pos, &t) in tokens.iter().enumerate() {
            let (a, b) = (sc.decode_token(t).unwrap(), sg.decode_token(t).unwrap());
            close(
                &format!("lora {lora}: decode logits at position {pos}"),
                &b,
                &a,
            );
        }
    }
}

/// A tiny grouped-query (4 query heads, 1 key/value head) model with tied embeddings.
fn tiny_gqa_tied(attn: Attn, ck: Ck) -> DecoderOnlyTransformer {
    let mut c = TransformerConfig::new(64, 32, 4, 2, 48, 16);
    c.n_kv_heads = 1;
    c.tie_word_embeddings = true;
    c.seed = 13;
    DecoderOnlyTransformer::new(c, attn, ck).unwrap()
}

#[test]
fn a_gqa_tied_model_trains_and_decodes_on_the_gpu_like_the_cpu() {
    let Some(dev) = backend_or_skip("a_gqa_tied_model_trains_and_decodes_on_the_gpu_like_the_cpu")
    else {
        return;
    };
    let tokens = block(2, 9, 64);
    for attn in [Attn::Flash, Attn::Materialized] {
        for ck in [Ck::Disabled, Ck::TransformerBlock] {
            let case = format!("GQA 4/1, tied: {attn} / {ck}");
            let cpu = tiny_gqa_tied(attn, ck);
            let mut gpu = tiny_gqa_tied(attn, ck);
            gpu.to_device(dev).unwrap();
            let (lc, gc, pc) = step(&cpu, &tokens, Device::Cpu);
            let (lg, gg, pg) = step(&gpu, &tokens, dev);
            close(&format!("{case}: loss"), &lg, &lc);
            assert_eq!(
                gc.len(),
                gg.len(),
                "{case}: one tied parameter on both devices"
            );
            for ((name, c), (_, g)) in gc.iter().zip(&gg) {
                match (c, g) {
                    (Some(c), Some(g)) => close(&format!("{case}: grad of {name}"), g, c),
                    (None, None) => {}
                    _ => panic!("{case}: {name} has a gradient on one device only"),
                }
            }
            for (((name, _), c), g) in gc.iter().zip(&pc).zip(&pg) {
                close(&format!("{case}: {name} after Adam"), g, c);
            }
        }
    }
    let cpu = tiny_gqa_tied(Attn::Flash, Ck::Disabled);
    let mut gpu = tiny_gqa_tied(Attn::Flash, Ck::Disabled);
    gpu.to_device(dev).unwrap();
    let (mut sc, mut sg) = (cpu.decode_session().unwrap(), gpu.decode_session().unwrap());
    for (pos, &t) in block(1, 12, 64).iter().enumerate() {
        let (a, b) = (sc.decode_token(t).unwrap(), sg.decode_token(t).unwrap());
        close(
            &format!("GQA 4/1, tied: decode logits at position {pos}"),
            &b,
            &a,
        );
    }
}

/// Every policy form above `block` sits above the backend: on the GPU, segments, the named
/// selective policies, a save list and a per-block list give the plain run's loss, gradients and
/// parameters after Adam bit for bit (each replay recomputes with the same kernels in the same
/// order; a saved value is the forward's own), with and without LoRA.
#[test]
fn every_checkpointing_policy_on_the_gpu_is_bitwise_the_plain_run() {
    let Some(dev) =
        backend_or_skip("every_checkpointing_policy_on_the_gpu_is_bitwise_the_plain_run")
    else {
        return;
    };
    let tokens = block(2, 9, 64);
    for lora in [false, true] {
        let run = |spelling: &str| {
            let mut m = tiny(Attn::Flash, Ck::Disabled, lora);
            m.set_activation_checkpointing(spelling.parse().unwrap())
                .unwrap();
            m.to_device(dev).unwrap();
            let (loss, grads, after) = step(&m, &tokens, dev);
            let grads: Vec<_> = grads
                .into_iter()
                .map(|(name, g)| (name, g.as_deref().map(bitwise)))
                .collect();
            let after: Vec<_> = after.iter().map(|p| bitwise(p)).collect();
            (bitwise(&loss), grads, after)
        };
        let plain = run("disabled");
        for spelling in [
            "segments:2",
            "selective",
            "selective:dots",
            "selective:attention",
            "selective:q+k+v",
            "block,disabled",
        ] {
            assert!(
                run(spelling) == plain,
                "{spelling} vs disabled on {dev}, lora {lora}: not bitwise equal"
            );
        }
    }
}
