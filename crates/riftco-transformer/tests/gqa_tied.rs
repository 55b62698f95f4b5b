//! Grouped-query attention (`n_kv_heads`) and tied embeddings (`tie_word_embeddings`) in the
//! model: GQA equals multi-head attention with each key/value head's weights repeated for its
//! query heads (Hugging Face's `repeat_kv`), in both attention kinds, forward and gradients;
//! flash against materialized; decoding against the full forward at every position with the
//! smaller K/V cache; checkpointing policies bitwise against `disabled`; the tied matrix's
//! gradient is the sum of both uses; LoRA on the narrower k_proj/v_proj; save and load.

mod measure;
use measure::lock;
use riftco_tensor::{memory_stats, MemoryCategory};
use riftco_transformer::state::expected_base_shapes;
use riftco_transformer::{
    load_model, save_model, ActivationCheckpointing as Policy, Adam, DecoderOnlyTransformer,
    FullSequenceAttentionKind as Attn, LoraConfig, LoraTargets, TransformerConfig,
    TransformerError,
};

const BATCH: usize = 2;
const SEQ: usize = 11; // odd, not a tile multiple

fn config(n_kv_heads: usize, tied: bool) -> TransformerConfig {
    let mut c = TransformerConfig::new(64, 32, 4, 3, 48, 24)
        .with_n_kv_heads(n_kv_heads)
        .with_tie_word_embeddings(tied);
    c.seed = 11;
    c
}

fn tokens() -> Vec<u32> {
    (0..BATCH * (SEQ + 1))
        .map(|i| ((i as u32).wrapping_mul(2654435761) >> 7) % 64)
        .collect()
}

fn close(a: &[f32], b: &[f32], rel: f32, what: &str) {
    assert_eq!(a.len(), b.len(), "{what}: lengths");
    let scale = a.iter().fold(0.0f32, |m, x| m.max(x.abs())).max(1e-30);
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        assert!(
            (x - y).abs() <= rel * scale,
            "{what}[{i}]: {x} vs {y} (tolerance {rel} × {scale})"
        );
    }
}

fn grad(m: &DecoderOnlyTransformer, name: &str) -> Vec<f32> {
    m.named_parameters()
        .into_iter()
        .find(|(n, _)| n == name)
        .unwrap_or_else(|| panic!("no parameter {name}"))
        .1
        .grad()
        .unwrap_or_else(|| panic!("no gradient for {name}"))
        .to_vec()
}

fn param(m: &DecoderOnlyTransformer, name: &str) -> riftco_autograd::Variable {
    m.named_parameters()
        .into_iter()
        .find(|(n, _)| n == name)
        .unwrap_or_else(|| panic!("no parameter {name}"))
        .1
}

/// The rows of a `[n_kv_heads·d_head, d_model]` projection repeated for the query heads of each
/// group: `[n_heads·d_head, d_model]`, query head `h` taking key/value head `h / group`.
fn repeat_kv_rows(
    w: &[f32],
    n_heads: usize,
    n_kv: usize,
    d_head: usize,
    d_model: usize,
) -> Vec<f32> {
    let g = n_heads / n_kv;
    let row = d_head * d_model;
    (0..n_heads)
        .flat_map(|h| w[(h / g) * row..(h / g + 1) * row].to_vec())
        .collect()
}

/// The gradient of the repeated rows summed back per key/value head (query heads of a group in
/// order), the chain rule through `repeat_kv`.
fn sum_groups(
    g_mha: &[f32],
    n_heads: usize,
    n_kv: usize,
    d_head: usize,
    d_model: usize,
) -> Vec<f32> {
    let g = n_heads / n_kv;
    let row = d_head * d_model;
    let mut out = vec![0.0f32; n_kv * row];
    for h in 0..n_heads {
        for (o, x) in out[(h / g) * row..(h / g + 1) * row]
            .iter_mut()
            .zip(&g_mha[h * row..(h + 1) * row])
        {
            *o += x;
        }
    }
    out
}

#[test]
fn gqa_equals_mha_with_repeated_kv_weights_in_both_kinds() {
    let _g = lock();
    for attn in [Attn::Flash, Attn::Materialized] {
        for n_kv in [2, 1] {
            let gqa =
                DecoderOnlyTransformer::new(config(n_kv, false), attn, Policy::Disabled).unwrap();
            let mha =
                DecoderOnlyTransformer::new(config(4, false), attn, Policy::Disabled).unwrap();
            let (dh, d) = (8, 32);
            for (name, p) in gqa.named_parameters() {
                let v = p.value().to_vec();
                let v = if name.contains("k_proj") || name.contains("v_proj") {
                    assert_eq!(p.dims(), [n_kv * dh, d], "{name}");
                    repeat_kv_rows(&v, 4, n_kv, dh, d)
                } else {
                    v
                };
                param(&mha, &name).value().copy_from_slice(&v).unwrap();
            }
            let what = format!("{attn:?} n_kv_heads {n_kv}");
            let (lg, lm) = (
                gqa.loss(&tokens(), BATCH, SEQ + 1).unwrap(),
                mha.loss(&tokens(), BATCH, SEQ + 1).unwrap(),
            );
            close(&lg.value().to_vec(), &lm.value().to_vec(), 1e-6, &what);
            lg.backward().unwrap();
            lm.backward().unwrap();
            for (name, _) in gqa.named_parameters() {
                let (a, b) = (grad(&gqa, &name), grad(&mha, &name));
                let b = if name.contains("k_proj") || name.contains("v_proj") {
                    sum_groups(&b, 4, n_kv, dh, d)
                } else {
                    b
                };
                close(&a, &b, 2e-5, &format!("{what} grad {name}"));
            }
        }
    }
}

#[test]
fn gqa_flash_matches_materialized() {
    let _g = lock();
    for n_kv in [2, 1] {
        let run = |attn| {
            let m =
                DecoderOnlyTransformer::new(config(n_kv, true), attn, Policy::Disabled).unwrap();
            let loss = m.loss(&tokens(), BATCH, SEQ + 1).unwrap();
            loss.backward().unwrap();
            let grads: Vec<Vec<f32>> = m
                .named_parameters()
                .iter()
                .map(|(n, _)| grad(&m, n))
                .collect();
            (loss.value().item().unwrap(), grads)
        };
        let (lf, gf) = run(Attn::Flash);
        let (lm, gm) = run(Attn::Materialized);
        assert!((lf - lm).abs() <= 1e-5 * lf.abs(), "loss {lf} vs {lm}");
        for (i, (a, b)) in gf.iter().zip(&gm).enumerate() {
            close(a, b, 2e-5, &format!("n_kv_heads {n_kv} grad {i}"));
        }
    }
}

#[test]
fn decode_matches_full_forward_at_every_position_with_a_smaller_cache() {
    let _g = lock();
    let seq = 19;
    let toks: Vec<u32> = (0..seq as u32).map(|i| (i * 29 + 3) % 64).collect();
    let mut cache_bytes = Vec::new();
    for (n_kv, tied) in [(4, false), (2, true), (1, false)] {
        let m =
            DecoderOnlyTransformer::new(config(n_kv, tied), Attn::Flash, Policy::Disabled).unwrap();
        let full = m.logits(&toks, 1, seq).unwrap().value().to_vec();
        let before = memory_stats().get(MemoryCategory::Activation).current_bytes;
        let mut s = m.decode_session().unwrap();
        let after = memory_stats().get(MemoryCategory::Activation).current_bytes;
        cache_bytes.push(after - before);
        for (pos, &t) in toks.iter().enumerate() {
            let logits = s.decode_token(t).unwrap();
            close(
                &logits,
                &full[pos * 64..(pos + 1) * 64],
                1e-5,
                &format!("n_kv_heads {n_kv} tied {tied} position {pos}"),
            );
        }
        let footprint = m.config().memory_footprint().unwrap();
        // 2 (K and V) · n_layers · max_seq_len · n_kv_heads · d_head f32 elements.
        assert_eq!(
            footprint.kv_cache_bytes,
            (2 * 3 * 24 * n_kv * 8 * 4) as u128
        );
    }
    // The cache shrinks by n_heads / n_kv_heads (measured by the activation counter).
    assert_eq!(cache_bytes[0], 2 * 3 * 24 * 32 * 4, "{cache_bytes:?}");
    assert_eq!(cache_bytes[1] * 2, cache_bytes[0], "{cache_bytes:?}");
    assert_eq!(cache_bytes[2] * 4, cache_bytes[0], "{cache_bytes:?}");
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// Loss, every trainable gradient and the trainables after one Adam step, as bits.
fn step(c: &TransformerConfig, attn: Attn, policy: Policy, lora: bool) -> Vec<Vec<u32>> {
    let mut m = DecoderOnlyTransformer::new(c.clone(), attn, policy).unwrap();
    if lora {
        m.enable_lora(&lora_config()).unwrap();
        for (_, p) in m.weights().named_lora_parameters() {
            let n = p.value().numel();
            let vals: Vec<f32> = (0..n)
                .map(|i| ((i * 37 % 17) as f32 - 8.0) * 0.01)
                .collect();
            p.value().copy_from_slice(&vals).unwrap();
        }
    }
    let loss = m.loss(&tokens(), BATCH, SEQ + 1).unwrap();
    loss.backward().unwrap();
    let params = m.trainable_parameters();
    let mut out = vec![bits(&loss.value().to_vec())];
    out.extend(params.iter().map(|p| bits(&p.grad().unwrap().to_vec())));
    Adam::new(params.clone(), 1e-2).unwrap().step().unwrap();
    out.extend(params.iter().map(|p| bits(&p.value().to_vec())));
    out
}

fn lora_config() -> LoraConfig {
    LoraConfig {
        rank: 4,
        alpha: 8.0,
        targets: LoraTargets {
            attention: true,
            mlp: true,
        },
        seed: 3,
        dropout: 0.0,
    }
}

#[test]
fn checkpointing_policies_are_bitwise_disabled_for_gqa_and_tied_models() {
    let _g = lock();
    for (n_kv, tied) in [(2, false), (1, true), (2, true)] {
        for attn in [Attn::Flash, Attn::Materialized] {
            for lora in [false, true] {
                let c = config(n_kv, tied);
                let reference = step(&c, attn, Policy::Disabled, lora);
                for spelling in [
                    "block",
                    "segments:2",
                    "auto",
                    "selective",
                    "selective:attention",
                    "selective:q+k+v",
                    "disabled,block,selective:dots",
                    "budget:64MiB",
                ] {
                    let policy: Policy = spelling.parse().unwrap();
                    let got = step(&c, attn, policy, lora);
                    assert_eq!(
                        reference, got,
                        "{spelling} vs disabled: n_kv_heads {n_kv} tied {tied} {attn:?} lora {lora}"
                    );
                }
            }
        }
    }
}

#[test]
fn tied_gradient_is_the_sum_of_both_uses_and_one_adam_step_updates_one_matrix() {
    let _g = lock();
    for n_kv in [4, 2] {
        let tied =
            DecoderOnlyTransformer::new(config(n_kv, true), Attn::Flash, Policy::Disabled).unwrap();
        let untied =
            DecoderOnlyTransformer::new(config(n_kv, false), Attn::Flash, Policy::Disabled)
                .unwrap();
        let names: Vec<String> = tied
            .named_parameters()
            .into_iter()
            .map(|(n, _)| n)
            .collect();
        assert!(!names.iter().any(|n| n == "lm_head.weight"), "{names:?}");
        assert_eq!(names.len() + 1, untied.named_parameters().len());
        // The untied model with both matrices equal to the tied one's.
        for (name, p) in tied.named_parameters() {
            param(&untied, &name)
                .value()
                .copy_from_slice(&p.value().to_vec())
                .unwrap();
        }
        let embed = param(&tied, "model.embed_tokens.weight").value().to_vec();
        param(&untied, "lm_head.weight")
            .value()
            .copy_from_slice(&embed)
            .unwrap();
        let (lt, lu) = (
            tied.loss(&tokens(), BATCH, SEQ + 1).unwrap(),
            untied.loss(&tokens(), BATCH, SEQ + 1).unwrap(),
        );
        assert_eq!(bits(&lt.value().to_vec()), bits(&lu.value().to_vec()));
        lt.backward().unwrap();
        lu.backward().unwrap();
        let sum: Vec<f32> = grad(&untied, "model.embed_tokens.weight")
            .iter()
            .zip(grad(&untied, "lm_head.weight"))
            .map(|(a, b)| a + b)
            .collect();
        let g = grad(&tied, "model.embed_tokens.weight");
        close(
            &g,
            &sum,
            1e-6,
            "tied gradient vs embedding + LM head gradients",
        );
        // The LM head is the embedding's leaf: the same gradient, one Adam state.
        assert_eq!(
            bits(&tied.weights().lm_head.grad().unwrap().to_vec()),
            bits(&g)
        );
        let params = tied.trainable_parameters();
        assert_eq!(params.len(), names.len());
        let mut adam = Adam::new(params, 1e-2).unwrap();
        adam.step().unwrap();
        let after = param(&tied, "model.embed_tokens.weight").value().to_vec();
        assert_eq!(bits(&tied.weights().lm_head.value().to_vec()), bits(&after));
        // Adam's first step (bias-corrected): p − lr · g / (|g| + eps), eps 1e-8.
        let want: Vec<f32> = embed
            .iter()
            .zip(&g)
            .map(|(&p, &g)| p - 1e-2 * g / (g.abs() + 1e-8))
            .collect();
        close(&after, &want, 1e-6, "tied matrix after one Adam step");
    }
}

#[test]
fn lora_on_gqa_adapts_the_narrower_k_and_v_projections() {
    let _g = lock();
    let mut m =
        DecoderOnlyTransformer::new(config(2, true), Attn::Flash, Policy::Disabled).unwrap();
    m.enable_lora(&lora_config()).unwrap();
    let lora = m.weights().named_lora_parameters();
    let shape = |n: &str| {
        lora.iter()
            .find(|(k, _)| k == n)
            .unwrap_or_else(|| panic!("{n}"))
            .1
            .dims()
            .to_vec()
    };
    let p = "base_model.model.model.layers.0.self_attn";
    assert_eq!(shape(&format!("{p}.k_proj.lora_B.weight")), [16, 4]);
    assert_eq!(shape(&format!("{p}.v_proj.lora_B.weight")), [16, 4]);
    assert_eq!(shape(&format!("{p}.k_proj.lora_A.weight")), [4, 32]);
    assert_eq!(shape(&format!("{p}.q_proj.lora_B.weight")), [32, 4]);
    let loss = m.loss(&tokens(), BATCH, SEQ + 1).unwrap();
    loss.backward().unwrap();
    assert!(m.trainable_parameters().iter().all(|p| p.grad().is_some()));
    m.merge_lora().unwrap();
    assert_eq!(
        param(&m, "model.layers.0.self_attn.k_proj.weight").dims(),
        [16, 32]
    );
}

#[test]
fn save_and_load_gqa_and_tied_models() {
    let _g = lock();
    let dir = std::env::temp_dir().join(format!("riftco-gqa-tied-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for (n_kv, tied) in [(2, true), (1, false)] {
        let c = config(n_kv, tied);
        let m = DecoderOnlyTransformer::new(c.clone(), Attn::Flash, Policy::Disabled).unwrap();
        let path = dir.join(format!("m{n_kv}{tied}.safetensors"));
        save_model(&m, &path).unwrap();
        let hf: serde_json::Value =
            serde_json::from_slice(&std::fs::read(dir.join("config.json")).unwrap()).unwrap();
        assert_eq!(hf["num_key_value_heads"], n_kv);
        assert_eq!(hf["tie_word_embeddings"], tied);
        let bytes = std::fs::read(&path).unwrap();
        let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
        assert_eq!(st.tensor("lm_head.weight").is_ok(), !tied);
        assert_eq!(
            st.tensor("model.layers.2.self_attn.v_proj.weight")
                .unwrap()
                .shape(),
            [n_kv * 8, 32]
        );
        let names = st.names().len();
        assert_eq!(names, expected_base_shapes(&c).len());
        let back = load_model(&path, Attn::Flash, Policy::Disabled).unwrap();
        assert_eq!(back.config(), &c);
        let t = tokens();
        assert_eq!(
            bits(&m.logits(&t[..SEQ], 1, SEQ).unwrap().value().to_vec()),
            bits(&back.logits(&t[..SEQ], 1, SEQ).unwrap().value().to_vec())
        );
    }
    std::fs::remove_dir_all(&dir).ok();
}

/// A tied state written by another tool with `lm_head.weight` present: equal to the embedding
/// it loads, different it is refused by name.
#[test]
fn tied_file_with_an_lm_head_loads_when_equal_and_is_refused_when_different() {
    let _g = lock();
    let dir = std::env::temp_dir().join(format!("riftco-tied-head-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let c = config(2, true);
    let m = DecoderOnlyTransformer::new(c.clone(), Attn::Flash, Policy::Disabled).unwrap();
    let embed = param(&m, "model.embed_tokens.weight").value().to_vec();
    let write = |head: &[f32], name: &str| {
        let mut owned: Vec<(String, Vec<usize>, Vec<u8>)> = m
            .named_parameters()
            .iter()
            .map(|(n, p)| {
                let bytes = p
                    .value()
                    .to_vec()
                    .iter()
                    .flat_map(|x| x.to_le_bytes())
                    .collect();
                (n.clone(), p.dims().to_vec(), bytes)
            })
            .collect();
        owned.push((
            "lm_head.weight".into(),
            vec![64, 32],
            head.iter().flat_map(|x| x.to_le_bytes()).collect(),
        ));
        let views: Vec<(String, safetensors::tensor::TensorView<'_>)> = owned
            .iter()
            .map(|(n, s, b)| {
                let v = safetensors::tensor::TensorView::new(safetensors::Dtype::F32, s.clone(), b)
                    .unwrap();
                (n.clone(), v)
            })
            .collect();
        let meta = std::collections::HashMap::from([(
            "riftco_config".to_string(),
            serde_json::to_string(&c).unwrap(),
        )]);
        let path = dir.join(name);
        safetensors::serialize_to_file(views, Some(meta), &path).unwrap();
        path
    };
    let same = write(&embed, "same.safetensors");
    let back = load_model(&same, Attn::Flash, Policy::Disabled).unwrap();
    assert_eq!(bits(&back.weights().lm_head.value().to_vec()), bits(&embed));
    let mut other = embed.clone();
    other[5] += 1.0;
    let differs = write(&other, "differs.safetensors");
    let err = load_model(&differs, Attn::Flash, Policy::Disabled).unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, TransformerError::State { .. }), "{msg}");
    assert!(
        msg.contains("lm_head.weight") && msg.contains("element 5"),
        "{msg}"
    );
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn n_kv_heads_errors_name_the_value() {
    for (kv, needle) in [(3, "n_kv_heads = 3"), (0, "n_kv_heads = 0")] {
        let err = DecoderOnlyTransformer::new(config(kv, false), Attn::Flash, Policy::Disabled)
            .unwrap_err();
        let msg = err.to_string();
        assert!(matches!(err, TransformerError::Config { .. }), "{msg}");
        assert!(msg.contains(needle) && msg.contains("n_heads 4"), "{msg}");
    }
    // JSON: absent is n_heads (configs saved before GQA); a bool is refused by name.
    let mut v = serde_json::to_value(config(2, false)).unwrap();
    v.as_object_mut().unwrap().remove("n_kv_heads");
    v.as_object_mut().unwrap().remove("tie_word_embeddings");
    let old: TransformerConfig = serde_json::from_value(v.clone()).unwrap();
    assert_eq!(old.n_kv_heads, 4);
    assert!(!old.tie_word_embeddings);
    v["n_kv_heads"] = serde_json::json!(true);
    let err = serde_json::from_value::<TransformerConfig>(v)
        .unwrap_err()
        .to_string();
    assert!(err.contains("n_kv_heads = true"), "{err}");
}
