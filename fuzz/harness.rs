//! One fuzz case of the model-file loaders, shared by the `cargo fuzz` target
//! (`fuzz/fuzz_targets/load_model.rs`) and the deterministic mutation test that CI runs
//! (`crates/riftco-transformer/tests/state_mutations.rs`).
//!
//! An input is a folder of two files in one byte string ([`encode`] / [`decode`]):
//! byte 0 selects the folder (modulo 3: 0, a model folder, `model.safetensors` + `config.json`;
//! 1, an adapter folder, `adapter_model.safetensors` + `adapter_config.json`; 2, a GGUF file
//! `model.gguf`, the second file unused), bytes 1..5 are the first file's length `n` (u32,
//! little endian; clamped to what remains), then come the first file's `n` bytes and, in the
//! rest, the second file. An empty second file means "absent".
//!
//! [`run_case`] writes the folder and runs every loader on it; each must return `Ok` or a
//! `State`, `Io`, `Config`, `Lora` or out-of-memory error with a message, never panic, abort or report an
//! internal error. A successful load must give a model that computes finite-shaped logits; a
//! GGUF file's header is read and every tensor of it dequantized. [`gguf`] builds GGUF files
//! (for the corpus and the reader's tests).
#![allow(dead_code)]

use riftco_transformer::state::GgufFile;
use riftco_transformer::{
    load_lora_adapter, load_model, load_weights_into, ActivationCheckpointingKind as Ck,
    DecoderOnlyTransformer, FullSequenceAttentionKind as Attn, TransformerConfig, TransformerError,
};
use std::fs;
use std::path::Path;

/// The base model every adapter of the corpus belongs to (and every model file of the corpus
/// describes): vocab 16, d_model 8, 2 heads, 1 layer, d_ff 12, max_seq_len 8, seed 1.
pub fn base_config() -> TransformerConfig {
    let mut c = TransformerConfig::new(16, 8, 2, 1, 12, 8);
    c.seed = 1;
    c
}

pub fn base_model() -> DecoderOnlyTransformer {
    DecoderOnlyTransformer::new(base_config(), Attn::Flash, Ck::Disabled)
        .expect("the base config is valid")
}

/// Model folder, adapter folder or GGUF file (the selector modulo 3).
pub const MODEL: u8 = 0;
pub const ADAPTER: u8 = 1;
pub const GGUF: u8 = 2;

pub fn encode(kind: u8, first: &[u8], second: &[u8]) -> Vec<u8> {
    let mut out = vec![kind];
    out.extend((first.len() as u32).to_le_bytes());
    out.extend(first);
    out.extend(second);
    out
}

pub fn decode(input: &[u8]) -> Option<(u8, &[u8], &[u8])> {
    let (&kind, rest) = input.split_first()?;
    let len = rest.get(..4)?;
    let n = u32::from_le_bytes([len[0], len[1], len[2], len[3]]) as usize;
    let rest = &rest[4..];
    let n = n.min(rest.len());
    Some((kind % 3, &rest[..n], &rest[n..]))
}

/// What the loaders said, for the caller to check (the corpus must load).
#[derive(Debug, Default)]
pub struct Outcome {
    pub loaded: usize,
    pub errors: Vec<String>,
}

fn check<T>(what: &str, r: Result<T, TransformerError>, out: &mut Outcome) -> Option<T> {
    match r {
        Ok(v) => {
            out.loaded += 1;
            Some(v)
        }
        Err(e) => {
            // A file declaring a model larger than memory (a max_seq_len of 2^40: its RoPE
            // table) fails its fallible allocation with an out-of-memory error naming the op and
            // the bytes: clear too.
            let clear = matches!(
                e,
                TransformerError::State { .. }
                    | TransformerError::Io { .. }
                    | TransformerError::Config { .. }
                    | TransformerError::Lora { .. }
            ) || e.kind().name() == "out_of_memory";
            let text = e.to_string();
            assert!(clear, "{what}: unexpected error kind {e:?}");
            assert!(!text.is_empty(), "{what}: empty message");
            assert!(!text.contains("internal"), "{what}: internal error: {text}");
            out.errors.push(format!("{what}: {text}"));
            None
        }
    }
}

/// Writes the folder of `input` into `dir` (emptied first) and runs the loaders.
pub fn run_case(dir: &Path, input: &[u8]) -> Outcome {
    let mut out = Outcome::default();
    let Some((kind, first, second)) = decode(input) else {
        return out;
    };
    let _ = fs::remove_dir_all(dir);
    fs::create_dir_all(dir).expect("a scratch folder");
    let (first_name, second_name) = match kind {
        MODEL => ("model.safetensors", "config.json"),
        ADAPTER => ("adapter_model.safetensors", "adapter_config.json"),
        _ => ("model.gguf", "unused"),
    };
    fs::write(dir.join(first_name), first).expect("write the first file");
    if !second.is_empty() {
        fs::write(dir.join(second_name), second).expect("write the second file");
    }
    let tokens: Vec<u32> = (0..4).collect();
    if kind == GGUF {
        let path = dir.join(first_name);
        if let Some(file) = check("GgufFile::open", GgufFile::open(&path), &mut out) {
            for t in file.tensors() {
                if t.ggml_type.is_dequantized() {
                    let read = file.read_tensor_f32(&t.name);
                    if let Some((shape, values)) = check("read_tensor_f32", read, &mut out) {
                        assert_eq!(shape.iter().product::<usize>(), values.len());
                    }
                }
            }
        }
    }
    if kind == MODEL || kind == GGUF {
        let path = dir.join(first_name);
        let loaded = check(
            "load_model",
            load_model(&path, Attn::Flash, Ck::Disabled),
            &mut out,
        );
        if let Some(m) = &loaded {
            let seq = 4.min(m.config().max_seq_len);
            let ok = tokens.iter().all(|&t| (t as usize) < m.config().vocab_size);
            if ok {
                let logits = m
                    .logits(&tokens[..seq], 1, seq)
                    .expect("a loaded model runs");
                assert_eq!(logits.dims(), [seq, m.config().vocab_size]);
            }
        }
        // A GGUF file declares its own config: loaded in place into a model of that config when
        // it loads (into the base model, to reach the errors, when it does not).
        let base = match loaded {
            Some(m) if kind == GGUF => {
                DecoderOnlyTransformer::new(m.config().clone(), Attn::Flash, Ck::Disabled)
                    .expect("the config of a loaded model is valid")
            }
            _ => base_model(),
        };
        check(
            "load_weights_into",
            load_weights_into(&base, &path),
            &mut out,
        );
    } else {
        let mut base = base_model();
        if check(
            "load_lora_adapter",
            load_lora_adapter(&mut base, dir),
            &mut out,
        )
        .is_some()
        {
            assert!(base.has_lora());
            let logits = base.logits(&tokens, 1, 4).expect("an adapted model runs");
            assert_eq!(logits.dims(), [4, 16]);
        } else {
            assert!(!base.has_lora(), "a failed load leaves no adapters");
        }
    }
    out
}

/// GGUF files built byte by byte (the layout of llama.cpp's `docs/gguf.md`), for the corpus
/// and the reader's tests.
pub mod gguf {
    use riftco_transformer::DecoderOnlyTransformer;

    /// GGUF value type ids.
    pub const UINT32: u32 = 4;
    pub const FLOAT32: u32 = 6;
    pub const BOOL: u32 = 7;
    pub const STRING: u32 = 8;
    pub const ARRAY: u32 = 9;
    /// GGML type ids.
    pub const F32: u32 = 0;
    pub const F16: u32 = 1;
    pub const Q4_0: u32 = 2;
    pub const Q8_0: u32 = 8;
    pub const BF16: u32 = 30;

    /// A GGUF file under construction: metadata entries (key, value type, encoded value) and
    /// tensors (name, `ne`, GGML type id, stored bytes).
    #[derive(Clone, Debug)]
    pub struct Builder {
        pub version: u32,
        pub alignment: u64,
        pub kv: Vec<(String, u32, Vec<u8>)>,
        pub tensors: Vec<(String, Vec<u64>, u32, Vec<u8>)>,
    }

    pub fn string(s: &str) -> Vec<u8> {
        let mut out = (s.len() as u64).to_le_bytes().to_vec();
        out.extend(s.as_bytes());
        out
    }

    impl Default for Builder {
        fn default() -> Self {
            Self {
                version: 3,
                alignment: 32,
                kv: Vec::new(),
                tensors: Vec::new(),
            }
        }
    }

    impl Builder {
        pub fn raw(mut self, key: &str, ty: u32, value: Vec<u8>) -> Self {
            self.kv.push((key.into(), ty, value));
            self
        }
        pub fn u32(self, key: &str, v: u32) -> Self {
            self.raw(key, UINT32, v.to_le_bytes().to_vec())
        }
        pub fn f32(self, key: &str, v: f32) -> Self {
            self.raw(key, FLOAT32, v.to_le_bytes().to_vec())
        }
        pub fn str(self, key: &str, v: &str) -> Self {
            self.raw(key, STRING, string(v))
        }
        pub fn strings(self, key: &str, items: &[&str]) -> Self {
            let mut v = STRING.to_le_bytes().to_vec();
            v.extend((items.len() as u64).to_le_bytes());
            for s in items {
                v.extend(string(s));
            }
            self.raw(key, ARRAY, v)
        }
        pub fn tensor(mut self, name: &str, ne: &[u64], ty: u32, data: Vec<u8>) -> Self {
            self.tensors.push((name.into(), ne.to_vec(), ty, data));
            self
        }
        pub fn f32_tensor(self, name: &str, ne: &[u64], values: &[f32]) -> Self {
            let data = values.iter().flat_map(|v| v.to_le_bytes()).collect();
            self.tensor(name, ne, F32, data)
        }

        /// The file: header, tensor infos (offsets of the data, each padded to the
        /// alignment), padding, data.
        pub fn build(&self) -> Vec<u8> {
            let align = self.alignment.max(1) as usize;
            let mut out = b"GGUF".to_vec();
            out.extend(self.version.to_le_bytes());
            out.extend((self.tensors.len() as u64).to_le_bytes());
            out.extend((self.kv.len() as u64).to_le_bytes());
            for (key, ty, value) in &self.kv {
                out.extend(string(key));
                out.extend(ty.to_le_bytes());
                out.extend(value);
            }
            let mut offset = 0usize;
            for (name, ne, ty, data) in &self.tensors {
                out.extend(string(name));
                out.extend((ne.len() as u32).to_le_bytes());
                for d in ne {
                    out.extend(d.to_le_bytes());
                }
                out.extend(ty.to_le_bytes());
                out.extend((offset as u64).to_le_bytes());
                offset += data.len().next_multiple_of(align);
            }
            out.resize(out.len().next_multiple_of(align), 0);
            for (_, _, _, data) in &self.tensors {
                out.extend(data);
                out.resize(out.len().next_multiple_of(align), 0);
            }
            out
        }
    }

    /// The rows of a Hugging Face `q_proj` / `k_proj` weight `[rows, cols]` in the order
    /// llama.cpp's converter writes them (`LlamaModel.permute`:
    /// `w.reshape(n_head, 2, d/2, cols).swapaxes(1, 2).reshape(rows, cols)`).
    pub fn permute_rows(w: &[f32], rows: usize, cols: usize, n_head: usize) -> Vec<f32> {
        let d = rows / n_head;
        let mut out = Vec::with_capacity(w.len());
        for h in 0..n_head {
            for i in 0..d / 2 {
                for j in 0..2 {
                    let src = h * d + j * (d / 2) + i;
                    out.extend_from_slice(&w[src * cols..(src + 1) * cols]);
                }
            }
        }
        out
    }

    /// The llama.cpp name of a Hugging Face Llama parameter name.
    pub fn llama_cpp_name(hf: &str) -> String {
        let map = [
            ("model.embed_tokens.weight", "token_embd.weight"),
            ("model.norm.weight", "output_norm.weight"),
            ("lm_head.weight", "output.weight"),
        ];
        if let Some((_, g)) = map.iter().find(|(h, _)| *h == hf) {
            return g.to_string();
        }
        let rest = hf.strip_prefix("model.layers.").expect("a per-block name");
        let (i, module) = rest.split_once('.').expect("layer index");
        let g = match module {
            "input_layernorm.weight" => "attn_norm",
            "self_attn.q_proj.weight" => "attn_q",
            "self_attn.k_proj.weight" => "attn_k",
            "self_attn.v_proj.weight" => "attn_v",
            "self_attn.o_proj.weight" => "attn_output",
            "post_attention_layernorm.weight" => "ffn_norm",
            "mlp.gate_proj.weight" => "ffn_gate",
            "mlp.up_proj.weight" => "ffn_up",
            "mlp.down_proj.weight" => "ffn_down",
            other => panic!("unknown module {other}"),
        };
        format!("blk.{i}.{g}.weight")
    }

    /// The `llama` metadata of `model`'s config.
    pub fn llama_metadata(model: &DecoderOnlyTransformer) -> Builder {
        let c = model.config();
        Builder::default()
            .str("general.architecture", "llama")
            .u32("llama.context_length", c.max_seq_len as u32)
            .u32("llama.embedding_length", c.d_model as u32)
            .u32("llama.block_count", c.n_layers as u32)
            .u32("llama.feed_forward_length", c.d_ff as u32)
            .u32("llama.attention.head_count", c.n_heads as u32)
            .u32("llama.attention.head_count_kv", c.n_kv_heads as u32)
            .f32("llama.rope.freq_base", c.rope_theta as f32)
            .f32("llama.attention.layer_norm_rms_epsilon", c.rms_norm_eps)
            .u32("llama.vocab_size", c.vocab_size as u32)
    }

    /// `model` as a `llama` GGUF file as llama.cpp's converter writes it (Q and K rows
    /// permuted), each tensor stored as `encode(name, ne, values)` says: (GGML type id, bytes).
    pub fn llama_file(
        model: &DecoderOnlyTransformer,
        encode: impl Fn(&str, &[u64], &[f32]) -> (u32, Vec<u8>),
    ) -> Vec<u8> {
        let c = model.config();
        let mut b = llama_metadata(model);
        for (hf, p) in model.weights().named_base_parameters() {
            let shape = p.value().dims().to_vec();
            let mut values = p.value().to_vec();
            let heads = if hf.ends_with("q_proj.weight") {
                Some(c.n_heads)
            } else if hf.ends_with("k_proj.weight") {
                Some(c.n_kv_heads)
            } else {
                None
            };
            if let Some(h) = heads {
                values = permute_rows(&values, shape[0], shape[1], h);
            }
            let ne: Vec<u64> = shape.iter().rev().map(|&d| d as u64).collect();
            let name = llama_cpp_name(&hf);
            let (ty, data) = encode(&name, &ne, &values);
            b = b.tensor(&name, &ne, ty, data);
        }
        b.build()
    }

    /// Every tensor as F32.
    pub fn as_f32(_: &str, _: &[u64], values: &[f32]) -> (u32, Vec<u8>) {
        (F32, values.iter().flat_map(|v| v.to_le_bytes()).collect())
    }
}
