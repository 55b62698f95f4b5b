//! The loaders against mutated model and adapter folders and GGUF files: a fixed budget of
//! deterministic mutations (seeded; bit flips, truncations, byte edits, header-length and
//! header-JSON edits, config field edits, splices; for GGUF, counts, lengths, types, dimensions
//! and offsets overwritten with extreme values) of the fuzz corpus in
//! `fuzz/corpus/load_model/`, each through
//! every loader ([`harness::run_case`]: `Ok` or a clear error, never a panic or an abort), in a
//! child process under a memory limit and a timeout (`limited`). The same harness runs under
//! `cargo +nightly fuzz run load_model` (see `fuzz/README.md`).
//!
//! `RIFTCO_BLESS_CORPUS=1 cargo test -p riftco-transformer --test state_mutations corpus`
//! rewrites the corpus from the current writers.

#[path = "../../../fuzz/harness.rs"]
mod harness;
mod limited;

use harness::gguf::{self, as_f32, llama_file};
use harness::{base_config, base_model, encode, run_case, ADAPTER, GGUF, MODEL};
use limited::limited;
use riftco_transformer::{
    save_lora_adapter, save_model, ActivationCheckpointingKind as Ck, DecoderOnlyTransformer,
    FullSequenceAttentionKind as Attn, LoraConfig, LoraTargets, TransformerConfig,
};
use std::fs;
use std::path::{Path, PathBuf};

/// Mutated cases per run (CI runs them all; about 10 s in a debug build on 2 cores).
const CASES: usize = 2000;

fn corpus_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/corpus/load_model")
}

fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("riftco-mutations-{}-{name}", std::process::id()));
    let _ = fs::remove_dir_all(&d);
    fs::create_dir_all(&d).unwrap();
    d
}

/// A safetensors file with its `__metadata__` key `key` removed.
fn without_metadata_key(bytes: &[u8], key: &str) -> Vec<u8> {
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let mut header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    header["__metadata__"].as_object_mut().unwrap().remove(key);
    let mut h = serde_json::to_vec(&header).unwrap();
    h.resize(h.len().next_multiple_of(8), b' ');
    let mut out = (h.len() as u64).to_le_bytes().to_vec();
    out.extend(h);
    out.extend(&bytes[8 + n..]);
    out
}

/// The corpus, built from the writers: (file name, encoded case).
fn build_corpus() -> Vec<(&'static str, Vec<u8>)> {
    let dir = scratch("corpus");
    let model = base_model();
    save_model(&model, &dir.join("model.safetensors")).unwrap();
    let state = fs::read(dir.join("model.safetensors")).unwrap();
    let config = fs::read(dir.join("config.json")).unwrap();
    let mut hf: serde_json::Value = serde_json::from_slice(&config).unwrap();
    hf.as_object_mut().unwrap().remove("riftco");
    let plain_state = without_metadata_key(&state, "riftco_config");

    let adapter = |rank: usize, mlp: bool, name: &str| {
        let mut m = base_model();
        m.enable_lora(&LoraConfig {
            rank,
            alpha: 2.0 * rank as f32,
            targets: LoraTargets {
                attention: true,
                mlp,
            },
            seed: rank as u64,
            dropout: 0.0,
        })
        .unwrap();
        let d = dir.join(name);
        save_lora_adapter(&m, &d).unwrap();
        (
            fs::read(d.join("adapter_model.safetensors")).unwrap(),
            fs::read(d.join("adapter_config.json")).unwrap(),
        )
    };
    let (a2, c2) = adapter(2, false, "a2");
    let (a4, c4) = adapter(4, true, "a4");
    // The base model as llama.cpp's converter writes it, and a d_model-32 model with a tensor
    // of each block type small enough (Q8_0, Q4_0, BF16, F16, F32).
    let gguf_f32 = llama_file(&base_model(), as_f32);
    let mut c = TransformerConfig::new(16, 32, 2, 1, 32, 8);
    c.n_kv_heads = 1;
    c.tie_word_embeddings = true;
    let quantized = llama_file(
        &DecoderOnlyTransformer::new(c, Attn::Flash, Ck::Disabled).unwrap(),
        |name, ne, v| match name {
            "token_embd.weight" | "blk.0.attn_k.weight" | "blk.0.attn_output.weight" => {
                (gguf::Q8_0, quantize_q8_0(v))
            }
            "blk.0.attn_v.weight" | "blk.0.ffn_norm.weight" => (gguf::BF16, bf16_bytes(v)),
            "blk.0.attn_norm.weight" => (gguf::F16, f16_bytes(v)),
            "output_norm.weight" => as_f32(name, ne, v),
            _ => (gguf::Q4_0, quantize_q4_0(v)),
        },
    );
    vec![
        ("model_riftco", encode(MODEL, &state, &config)),
        (
            "model_hf_config",
            encode(MODEL, &plain_state, hf.to_string().as_bytes()),
        ),
        ("adapter_attention_r2", encode(ADAPTER, &a2, &c2)),
        (
            "adapter_peft_r4",
            encode(
                ADAPTER,
                &without_metadata_key(&a4, "riftco_adapter_config"),
                &c4,
            ),
        ),
        ("gguf_llama_f32", encode(GGUF, &gguf_f32, &[])),
        ("gguf_llama_quantized", encode(GGUF, &quantized, &[])),
    ]
}

fn f16_bytes(v: &[f32]) -> Vec<u8> {
    v.iter()
        .flat_map(|&x| half::f16::from_f32(x).to_bits().to_le_bytes())
        .collect()
}

fn bf16_bytes(v: &[f32]) -> Vec<u8> {
    v.iter()
        .flat_map(|&x| half::bf16::from_f32(x).to_bits().to_le_bytes())
        .collect()
}

/// Q8_0 blocks of 32: an f16 scale `max|x| / 127` and the values over it, rounded.
fn quantize_q8_0(v: &[f32]) -> Vec<u8> {
    let mut out = Vec::new();
    for block in v.chunks_exact(32) {
        let d = block.iter().fold(0f32, |m, x| m.max(x.abs())) / 127.0;
        out.extend(half::f16::from_f32(d).to_bits().to_le_bytes());
        let id = if d == 0.0 { 0.0 } else { 1.0 / d };
        out.extend(
            block
                .iter()
                .map(|x| (x * id).round().clamp(-127.0, 127.0) as i8 as u8),
        );
    }
    out
}

/// Q4_0 blocks of 32: an f16 scale `m / -8` (`m` the value of largest magnitude) and nibbles
/// `x / d + 8`, element `j` low and `j + 16` high.
fn quantize_q4_0(v: &[f32]) -> Vec<u8> {
    let mut out = Vec::new();
    for block in v.chunks_exact(32) {
        let m = block
            .iter()
            .fold(0f32, |m, &x| if x.abs() > m.abs() { x } else { m });
        let d = m / -8.0;
        out.extend(half::f16::from_f32(d).to_bits().to_le_bytes());
        let id = if d == 0.0 { 0.0 } else { 1.0 / d };
        let q = |x: f32| ((x * id + 8.5) as i32).clamp(0, 15) as u8;
        out.extend((0..16).map(|j| q(block[j]) | (q(block[j + 16]) << 4)));
    }
    out
}

fn read_corpus() -> Vec<Vec<u8>> {
    let mut files: Vec<PathBuf> = fs::read_dir(corpus_dir())
        .expect("the fuzz corpus folder")
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    files.iter().map(|p| fs::read(p).unwrap()).collect()
}

#[test]
fn corpus_is_valid_and_loads() {
    if std::env::var("RIFTCO_BLESS_CORPUS").as_deref() == Ok("1") {
        let dir = corpus_dir();
        fs::create_dir_all(&dir).unwrap();
        for (name, bytes) in build_corpus() {
            fs::write(dir.join(name), bytes).unwrap();
        }
    }
    let corpus = read_corpus();
    assert_eq!(
        corpus.len(),
        6,
        "the corpus has the four folders and two GGUF files of build_corpus"
    );
    let dir = scratch("valid");
    for (i, case) in corpus.iter().enumerate() {
        let out = run_case(&dir, case);
        assert!(out.errors.is_empty(), "corpus case {i}: {:?}", out.errors);
        assert!(out.loaded > 0, "corpus case {i} loaded nothing");
        assert!(case.len() < 8 * 1024, "corpus case {i} stays small");
    }
    assert_eq!(base_config(), base_model().config().clone());
}

/// SplitMix64: a small, seeded, portable generator (the cases are the same on every machine).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }
}

/// Values a crafted file would put in a number field.
const NUMBERS: [&str; 14] = [
    "0",
    "1",
    "-1",
    "2",
    "3",
    "7",
    "65536",
    "1099511627776",
    "4611686018427387904",
    "18446744073709551615",
    "18446744073709551616",
    "1e308",
    "0.5",
    "null",
];

/// Replaces the `k`-th JSON number in `text` (a header or config) by `value`.
fn replace_number(text: &str, k: usize, value: &str) -> Option<String> {
    let bytes = text.as_bytes();
    let mut spans = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        let starts = bytes[i].is_ascii_digit()
            && (i == 0 || !(bytes[i - 1].is_ascii_alphanumeric() || bytes[i - 1] == b'_'));
        if starts {
            let s = i;
            while i < bytes.len() && (bytes[i].is_ascii_digit() || b".eE+-".contains(&bytes[i])) {
                i += 1;
            }
            spans.push((s, i));
        } else {
            i += 1;
        }
    }
    let &(s, e) = spans.get(k % spans.len().max(1))?;
    Some(format!("{}{value}{}", &text[..s], &text[e..]))
}

/// The header length prefix and header text of a safetensors file, if it has them.
fn header_of(file: &[u8]) -> Option<(usize, &str)> {
    let n = u64::from_le_bytes(file.get(..8)?.try_into().ok()?) as usize;
    let text = std::str::from_utf8(file.get(8..8usize.checked_add(n)?)?).ok()?;
    Some((n, text))
}

fn with_header(file: &[u8], old_len: usize, text: &str) -> Vec<u8> {
    let mut out = (text.len() as u64).to_le_bytes().to_vec();
    out.extend(text.as_bytes());
    out.extend(&file[8 + old_len..]);
    out
}

/// Values a crafted GGUF file would put in a count, length, type, dimension or offset.
const GGUF_NUMBERS: [u64; 12] = [
    0,
    1,
    3,
    13,
    31,
    33,
    99,
    1 << 31,
    1 << 32,
    1 << 40,
    1 << 63,
    u64::MAX,
];

/// A GGUF-specific mutation of `file`: a little-endian `u32` or `u64` at a 4-aligned offset of
/// the header part (counts, string lengths, value types, dimensions, tensor types, offsets)
/// overwritten with one of [`GGUF_NUMBERS`].
fn mutate_gguf(rng: &mut Rng, file: &mut [u8]) -> &'static str {
    let header = file.len().min(2048);
    if header < 8 {
        return "gguf number (too short)";
    }
    let at = rng.below(header / 4) * 4;
    let v = *rng.pick(&GGUF_NUMBERS);
    if rng.below(2) == 0 && at + 8 <= file.len() {
        file[at..at + 8].copy_from_slice(&v.to_le_bytes());
    } else if at + 4 <= file.len() {
        file[at..at + 4].copy_from_slice(&(v as u32).to_le_bytes());
    }
    "gguf number"
}

/// One mutation of the folder `(first, second)` of kind `kind`; returns its name.
fn mutate(rng: &mut Rng, kind: u8, first: &mut Vec<u8>, second: &mut Vec<u8>) -> &'static str {
    if kind == GGUF && rng.below(2) == 0 {
        return mutate_gguf(rng, first);
    }
    let target_second = rng.below(4) == 0;
    match rng.below(9) {
        0 => {
            let f = if target_second { second } else { first };
            for _ in 0..=rng.below(8) {
                if !f.is_empty() {
                    let i = rng.below(f.len());
                    f[i] ^= 1 << rng.below(8);
                }
            }
            "bit flips"
        }
        1 => {
            let f = if target_second { second } else { first };
            let n = rng.below(f.len() + 1);
            f.truncate(n);
            "truncation"
        }
        2 => {
            let f = if target_second { second } else { first };
            let i = rng.below(f.len() + 1);
            let extra: Vec<u8> = (0..=rng.below(16)).map(|_| rng.next() as u8).collect();
            f.splice(i..i, extra);
            "insertion"
        }
        3 => {
            let len = [0u64, 1, 7, 8, 64, 1 << 20, 100_000_001, 1 << 40, u64::MAX];
            let v = *rng.pick(&len);
            if first.len() >= 8 {
                first[..8].copy_from_slice(&v.to_le_bytes());
            }
            "header length"
        }
        4 | 5 => {
            // A number of the header JSON (shapes, offsets, the metadata's config fields).
            let Some((n, text)) = header_of(first) else {
                return "header number (no header)";
            };
            let value = *rng.pick(&NUMBERS);
            let k = rng.next() as usize;
            if let Some(t) = replace_number(text, k, value) {
                *first = with_header(first, n, &t);
            }
            "header number"
        }
        6 => {
            // A string of the header: dtype, tensor name, metadata key.
            let Some((n, text)) = header_of(first) else {
                return "header string (no header)";
            };
            let swaps = [
                ("\"F32\"", "\"F16\""),
                ("\"F32\"", "\"BOOL\""),
                ("lora_A", "lora_B"),
                ("layers.0", "layers.1"),
                ("riftco_config", "riftco_cfg"),
                ("riftco_adapter_config", "x"),
                ("\\\"rank\\\"", "\\\"r\\\""),
                ("data_offsets", "offsets"),
                ("[", "[1,"),
            ];
            let (from, to) = *rng.pick(&swaps);
            let t = text.replacen(from, to, 1 + rng.below(2));
            *first = with_header(first, n, &t);
            "header string"
        }
        7 => {
            // A field of the JSON config beside the weights.
            let Ok(mut v) = serde_json::from_slice::<serde_json::Value>(second) else {
                return "config field (not JSON)";
            };
            let keys: Vec<String> = v
                .as_object()
                .map(|o| o.keys().cloned().collect())
                .unwrap_or_default();
            if keys.is_empty() {
                return "config field (no fields)";
            }
            let key = rng.pick(&keys).clone();
            let value: serde_json::Value = match rng.below(4) {
                0 => serde_json::Value::Null,
                1 => "default".into(),
                2 => serde_json::json!({"rope_type": "linear", "factor": 2.0}),
                _ => {
                    let text = *rng.pick(&NUMBERS);
                    serde_json::from_str(text).unwrap()
                }
            };
            if rng.below(5) == 0 {
                v.as_object_mut().unwrap().remove(&key);
            } else {
                v[&key] = value;
            }
            *second = serde_json::to_vec(&v).unwrap();
            "config field"
        }
        _ => {
            // A splice: the second file from the first's bytes or vice versa.
            let cut = rng.below(first.len() + 1);
            second.extend_from_slice(&first[cut..]);
            "splice"
        }
    }
}

#[test]
fn mutated_folders_load_or_fail_clearly() {
    limited("mutated_folders_load_or_fail_clearly", || {
        let corpus = read_corpus();
        let dir = scratch("mutated");
        let mut rng = Rng(0x5eed_0011);
        let (mut loaded, mut failed) = (0usize, 0usize);
        for case in 0..CASES {
            let input = rng.pick(&corpus).clone();
            let (kind, first, second) = harness::decode(&input).unwrap();
            let (mut first, mut second) = (first.to_vec(), second.to_vec());
            let mut names = Vec::new();
            for _ in 0..=rng.below(3) {
                names.push(mutate(&mut rng, kind, &mut first, &mut second));
            }
            let mutated = encode(kind, &first, &second);
            let result = std::panic::catch_unwind(|| run_case(&dir, &mutated));
            match result {
                Ok(out) => {
                    loaded += out.loaded;
                    failed += out.errors.len();
                }
                Err(_) => {
                    let keep = dir.with_extension(format!("crash-{case}"));
                    fs::write(&keep, &mutated).unwrap();
                    panic!("case {case} ({names:?}) panicked; input kept at {keep:?}");
                }
            }
        }
        eprintln!("{CASES} mutated folders: {loaded} loads succeeded, {failed} clear errors");
        assert!(failed > CASES / 2, "most mutations must be rejected");
        assert!(loaded > 0, "some mutations keep a loadable folder");
    });
}
