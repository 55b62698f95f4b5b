//! GGUF files of the `llama` architecture built here (`fuzz/harness.rs`'s `gguf` builder, as
//! llama.cpp's converter writes them: Q and K rows permuted): round trips (every weight and the
//! logits bit for bit, in place too), 16-bit storage, the config keys (vocabulary, token ids,
//! RoPE scaling keys and Llama 3.1's `rope_freqs`), and each file that does not fit riftco's
//! model refused naming the key, the tensor, the type or the architecture.

mod gguf_files;
#[path = "../../../fuzz/harness.rs"]
mod harness;

use gguf_files::{state_error, write};
use harness::gguf::{self, as_f32, llama_file, llama_metadata, Builder};
use riftco_transformer::state::GgufFile;
use riftco_transformer::{
    load_model, load_model_as, load_weights_into, ActivationCheckpointingKind as Ck,
    DecoderOnlyTransformer, FullSequenceAttentionKind as Attn, RopeScaling, TransformerConfig,
    WeightDtype,
};
use std::path::{Path, PathBuf};

/// A random model: vocab 40, d_model 16, 4 heads of 4 over 2 K/V heads, 2 blocks, d_ff 24.
fn model(tied: bool) -> DecoderOnlyTransformer {
    let mut c = TransformerConfig::new(40, 16, 4, 2, 24, 32);
    c.n_kv_heads = 2;
    c.tie_word_embeddings = tied;
    c.rms_norm_eps = 1e-6;
    c.rope_theta = 5e4;
    c.seed = 7;
    DecoderOnlyTransformer::new(c, Attn::Flash, Ck::Disabled).unwrap()
}

fn weights(m: &DecoderOnlyTransformer) -> Vec<(String, Vec<f32>)> {
    m.weights()
        .named_base_parameters()
        .into_iter()
        .map(|(n, p)| (n, p.value().to_vec()))
        .collect()
}

#[test]
fn a_converted_model_loads_back_bit_for_bit() {
    for tied in [true, false] {
        let m = model(tied);
        let path = write(&format!("roundtrip-{tied}"), &llama_file(&m, as_f32));
        let loaded = load_model(&path, Attn::Flash, Ck::Disabled).unwrap();
        let mut want = m.config().clone();
        want.seed = 0;
        assert_eq!(loaded.config(), &want, "tied {tied}");
        let (a, b) = (weights(&m), weights(&loaded));
        assert_eq!(a.len(), b.len());
        for ((na, va), (nb, vb)) in a.iter().zip(&b) {
            assert_eq!(na, nb);
            let same = va.iter().zip(vb).all(|(x, y)| x.to_bits() == y.to_bits());
            assert!(same, "{na} differs after the GGUF round trip (tied {tied})");
        }
        let tokens = [1u32, 5, 9, 39, 0, 2];
        let la = m.logits(&tokens, 1, 6).unwrap().value().to_vec();
        let lb = loaded.logits(&tokens, 1, 6).unwrap().value().to_vec();
        assert!(la.iter().zip(&lb).all(|(x, y)| x.to_bits() == y.to_bits()));
        // In place, into a model of the same architecture.
        let other = model(tied);
        for (_, p) in other.weights().named_base_parameters() {
            p.value()
                .copy_from_slice(&vec![0.5; p.value().numel()])
                .unwrap();
        }
        load_weights_into(&other, &path).unwrap();
        assert_eq!(weights(&other), a);
    }
}

#[test]
fn weights_load_into_16_bit_storage() {
    let m = model(true);
    let f32_file = write("half-f32", &llama_file(&m, as_f32));
    let bf16 = |_: &str, _: &[u64], v: &[f32]| {
        let bytes = v
            .iter()
            .flat_map(|&x| half::bf16::from_f32(x).to_bits().to_le_bytes())
            .collect();
        (gguf::BF16, bytes)
    };
    let bf16_file = write("half-bf16", &llama_file(&m, bf16));
    let a = load_model_as(&f32_file, Attn::Flash, Ck::Disabled, WeightDtype::BFloat16).unwrap();
    let b = load_model_as(&bf16_file, Attn::Flash, Ck::Disabled, WeightDtype::BFloat16).unwrap();
    let c = load_model(&bf16_file, Attn::Flash, Ck::Disabled).unwrap();
    assert_eq!(a.frozen_weights_dtype(), WeightDtype::BFloat16);
    for (((name, wa), (_, wb)), (_, wm)) in weights(&a).iter().zip(weights(&b)).zip(weights(&m)) {
        let rounded: Vec<f32> = wm
            .iter()
            .map(|&x| half::bf16::from_f32(x).to_f32())
            .collect();
        assert_eq!(wa, &rounded, "{name}");
        assert_eq!(&wb, &rounded, "{name}");
    }
    // A BF16 file read as float32 holds the bf16 values exactly.
    for ((name, wc), (_, wb)) in weights(&c).iter().zip(weights(&b)) {
        assert_eq!(wc, &wb, "{name}");
    }
    // float16 storage of a file holding a weight beyond its range is refused, naming it.
    let mut big = model(true);
    let (name, p) = big.weights().named_base_parameters().remove(0);
    let mut v = p.value().to_vec();
    v[3] = 1e6;
    p.value().copy_from_slice(&v).unwrap();
    big.set_determinism_check(Default::default());
    let path = write("half-overflow", &llama_file(&big, as_f32));
    let text = state_error(
        load_model_as(&path, Attn::Flash, Ck::Disabled, WeightDtype::Float16),
        &path,
    );
    assert!(
        text.contains("token_embd.weight element 3"),
        "{name}: {text}"
    );
}

/// A `llama` file of [`model`] with its builder edited by `edit`.
fn llama_with(edit: impl Fn(Builder) -> Builder, name: &str) -> PathBuf {
    llama_of(&model(true), edit, name)
}

/// A `llama` file of `m` with its builder edited by `edit`.
fn llama_of(m: &DecoderOnlyTransformer, edit: impl Fn(Builder) -> Builder, name: &str) -> PathBuf {
    let mut b = llama_metadata(m);
    let file = GgufFile::open(&write("base", &llama_file(m, as_f32))).unwrap();
    for t in file.tensors() {
        let (_, v) = file.read_tensor_f32(&t.name).unwrap();
        b = b.f32_tensor(&t.name, &t.dims, &v);
    }
    write(name, &edit(b).build())
}

fn without_key(mut b: Builder, key: &str) -> Builder {
    b.kv.retain(|(k, _, _)| k != key);
    b
}

fn without_tensor(mut b: Builder, name: &str) -> Builder {
    b.tensors.retain(|(n, _, _, _)| n != name);
    b
}

#[test]
fn llama_files_that_do_not_fit_are_named() {
    let load = |p: &Path| state_error(load_model(p, Attn::Flash, Ck::Disabled), p);
    let set_arch =
        |b: Builder| without_key(b, "general.architecture").str("general.architecture", "qwen2");
    let text = load(&llama_with(set_arch, "arch"));
    assert!(
        text.contains("architecture \"qwen2\" (general.architecture) is not supported"),
        "{text}"
    );
    let text = load(&llama_with(|b| without_key(b, "llama.block_count"), "key"));
    assert!(text.contains("\"llama.block_count\" is missing"), "{text}");
    let text = load(&llama_with(
        |b| without_key(b, "llama.embedding_length").str("llama.embedding_length", "16"),
        "key-type",
    ));
    assert!(
        text.contains(
            "\"llama.embedding_length\" is \"16\" (STRING); expected a non-negative integer"
        ),
        "{text}"
    );
    let text = load(&llama_with(
        |b| without_tensor(b, "blk.1.ffn_up.weight"),
        "missing",
    ));
    assert!(
        text.contains("missing: [\"blk.1.ffn_up.weight\"]"),
        "{text}"
    );
    let text = load(&llama_with(
        |b| b.f32_tensor("blk.0.extra.weight", &[2], &[0.0; 2]),
        "unknown",
    ));
    assert!(
        text.contains("has no place for: [\"blk.0.extra.weight\"]"),
        "{text}"
    );
    let text = load(&llama_with(
        |b| {
            without_tensor(b, "output_norm.weight").f32_tensor(
                "output_norm.weight",
                &[8],
                &[1.0; 8],
            )
        },
        "shape",
    ));
    assert!(
        text.contains("tensor output_norm.weight has dimensions (ne) [8]"),
        "{text}"
    );
    let text = load(&llama_with(
        |b| b.u32("llama.rope.dimension_count", 2),
        "rope-dim",
    ));
    assert!(
        text.contains("llama.rope.dimension_count = 2 differs"),
        "{text}"
    );
    let text = load(&llama_with(
        |b| {
            b.str("llama.rope.scaling.type", "yarn")
                .f32("llama.rope.scaling.factor", 4.0)
        },
        "yarn",
    ));
    assert!(
        text.contains("llama.rope.scaling.type = \"yarn\" is not supported"),
        "{text}"
    );
    let text = load(&llama_with(|b| b.u32("llama.expert_count", 8), "moe"));
    assert!(text.contains("mixture-of-experts"), "{text}");
    // A type riftco does not dequantize: the tensor and the type are named (IQ2_XXS, 66-byte
    // blocks of 256).
    let iq = |b: Builder| {
        without_tensor(b, "token_embd.weight").tensor(
            "token_embd.weight",
            &[16, 40],
            16,
            vec![0; 0],
        )
    };
    let iq_path = write("iq-short", &iq(llama_metadata(&model(true))).build());
    let text = state_error(GgufFile::open(&iq_path), &iq_path);
    assert!(
        text.contains("not a multiple of the 256-element blocks of its type IQ2_XXS"),
        "{text}"
    );
    let mut c = TransformerConfig::new(40, 256, 4, 1, 24, 32);
    c.tie_word_embeddings = true;
    let m = DecoderOnlyTransformer::new(c, Attn::Flash, Ck::Disabled).unwrap();
    let bytes = llama_file(&m, |name, ne, v| {
        if name == "blk.0.attn_v.weight" {
            (16, vec![0u8; (ne[0] * ne[1] / 256 * 66) as usize])
        } else {
            as_f32(name, ne, v)
        }
    });
    let path = write("iq", &bytes);
    let text = load(&path);
    assert!(text.contains("tensor \"blk.0.attn_v.weight\" has type IQ2_XXS (id 16), which riftco does not dequantize"), "{text}");
    let text = state_error(
        GgufFile::open(&path)
            .unwrap()
            .read_tensor_f32("blk.0.attn_v.weight"),
        &path,
    );
    assert!(text.contains("IQ2_XXS"), "{text}");
}

#[test]
fn llama_config_keys() {
    let cfg = |p: PathBuf| {
        load_model(&p, Attn::Flash, Ck::Disabled)
            .unwrap()
            .config()
            .clone()
    };
    // The vocabulary from the token list when llama.vocab_size is absent.
    let tokens: Vec<String> = (0..40).map(|i| format!("t{i}")).collect();
    let refs: Vec<&str> = tokens.iter().map(String::as_str).collect();
    let c = cfg(llama_with(
        |b| without_key(b, "llama.vocab_size").strings("tokenizer.ggml.tokens", &refs),
        "vocab",
    ));
    assert_eq!(c.vocab_size, 40);
    // Token ids; eos and eot both end generation.
    let c = cfg(llama_with(
        |b| {
            b.u32("tokenizer.ggml.bos_token_id", 1)
                .u32("tokenizer.ggml.eos_token_id", 2)
                .u32("tokenizer.ggml.eot_token_id", 7)
        },
        "ids",
    ));
    assert_eq!(
        (c.bos_token_id, c.eos_token_ids.clone()),
        (Some(1), vec![2, 7])
    );
    // Linear RoPE scaling, and llama.cpp's default type (linear) with a factor of 1.
    let c = cfg(llama_with(
        |b| {
            b.str("llama.rope.scaling.type", "linear")
                .f32("llama.rope.scaling.factor", 4.0)
        },
        "linear",
    ));
    assert_eq!(c.rope_scaling, RopeScaling::Linear { factor: 4.0 });
    let c = cfg(llama_with(
        |b| b.f32("llama.rope.scaling.factor", 1.0),
        "factor-1",
    ));
    assert_eq!(c.rope_scaling, RopeScaling::Default);
    assert_eq!((c.rope_theta, c.rms_norm_eps), (5e4, 1e-6));
    // Llama 3.1's scaling from the rope_freqs tensor the converter writes (factors computed in
    // f32 as convert_hf_to_gguf.py does), on heads of 64 (wavelengths from 2π to 2π·5e4^(62/64),
    // four of them between 8192 / 4 and 8192).
    let mut c64 = TransformerConfig::new(40, 64, 1, 1, 24, 32);
    c64.rope_theta = 5e4;
    let m = DecoderOnlyTransformer::new(c64, Attn::Flash, Ck::Disabled).unwrap();
    let d_head = m.config().d_head();
    let llama3 = |factor: f32| -> Vec<f32> {
        (0..d_head / 2)
            .map(|i| {
                let freq = 1.0 / 5e4f32.powf((2 * i) as f32 / d_head as f32);
                let wavelen = 2.0 * std::f32::consts::PI / freq;
                let (lo, hi) = (8192.0 / 1.0, 8192.0 / 4.0);
                if wavelen < hi {
                    1.0
                } else if wavelen > lo {
                    factor
                } else {
                    let smooth = (8192.0 / wavelen - 1.0) / (4.0 - 1.0);
                    1.0 / ((1.0 - smooth) / factor + smooth)
                }
            })
            .collect()
    };
    let freqs = llama3(8.0);
    assert!(
        freqs.iter().any(|&f| f != 1.0 && f != 8.0),
        "{freqs:?} has a smooth part"
    );
    let c = cfg(llama_of(
        &m,
        |b| b.f32_tensor("rope_freqs.weight", &[d_head as u64 / 2], &freqs),
        "llama3",
    ));
    assert_eq!(
        c.rope_scaling,
        RopeScaling::Llama3 {
            factor: 8.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_max_position_embeddings: 8192
        }
    );
    let mut odd = freqs.clone();
    odd[0] = 2.0;
    let p = llama_of(
        &m,
        |b| b.f32_tensor("rope_freqs.weight", &[d_head as u64 / 2], &odd),
        "llama3-odd",
    );
    let text = state_error(load_model(&p, Attn::Flash, Ck::Disabled), &p);
    assert!(text.contains("factor 0 is 2"), "{text}");
}
