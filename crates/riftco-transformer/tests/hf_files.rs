//! Hugging Face checkpoint files written here with the `safetensors` crate: bf16/f16 tensors
//! (exact conversion, checked on bit patterns against the formats' definitions), sharded
//! folders (`model.safetensors.index.json`), bf16 saves, `torch_dtype`, token ids and RoPE
//! scaling in `config.json`, and every bad input named.

use riftco_transformer::state::{
    config_json_pairing, hf_config_json, save_model_as, ConfigJsonPairing, StateDtype,
    SHARD_INDEX_FILE,
};
use riftco_transformer::{
    load_model, load_weights_into, save_model, ActivationCheckpointingKind as Ck,
    DecoderOnlyTransformer, FullSequenceAttentionKind as Attn, RopeScaling, TransformerConfig,
    TransformerError,
};
use safetensors::tensor::TensorView;
use safetensors::Dtype;
use serde_json::json;
use std::fs;
use std::path::{Path, PathBuf};

fn config() -> TransformerConfig {
    let mut c = TransformerConfig::new(64, 32, 4, 2, 48, 16);
    c.seed = 5;
    c
}

fn model(c: TransformerConfig) -> DecoderOnlyTransformer {
    DecoderOnlyTransformer::new(c, Attn::Flash, Ck::Disabled).unwrap()
}

fn tmp_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("riftco-hf-{}-{name}", std::process::id()));
    let _ = fs::remove_dir_all(&d);
    fs::create_dir_all(&d).unwrap();
    d
}

fn load(path: &Path) -> Result<DecoderOnlyTransformer, TransformerError> {
    load_model(path, Attn::Flash, Ck::Disabled)
}

fn state_reason<T>(r: Result<T, TransformerError>) -> String {
    match r {
        Err(TransformerError::State { reason, .. }) => reason,
        Err(e) => panic!("expected a State error, got {e:?}"),
        Ok(_) => panic!("expected a State error, got Ok"),
    }
}

fn named_values(m: &DecoderOnlyTransformer) -> Vec<(String, Vec<usize>, Vec<f32>)> {
    m.weights()
        .named_base_parameters()
        .into_iter()
        .map(|(n, p)| (n, p.value().dims().to_vec(), p.value().to_vec()))
        .collect()
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// A plain Hugging Face config.json (no riftco key) for `c`.
fn write_plain_config(
    dir: &Path,
    c: &TransformerConfig,
    edit: impl FnOnce(&mut serde_json::Value),
) {
    let mut hf = hf_config_json(c);
    hf.as_object_mut().unwrap().remove("riftco");
    edit(&mut hf);
    fs::write(dir.join("config.json"), hf.to_string()).unwrap();
}

/// Writes `tensors` (name, dtype, shape, little-endian bytes) as a safetensors file.
fn write_file(path: &Path, tensors: &[(String, Dtype, Vec<usize>, Vec<u8>)]) {
    let views: Vec<(String, TensorView)> = tensors
        .iter()
        .map(|(n, d, s, b)| (n.clone(), TensorView::new(*d, s.clone(), b).unwrap()))
        .collect();
    safetensors::serialize_to_file(views, None, path).unwrap();
}

/// bf16 → f32 by definition: the 16 bits are the upper half of an f32.
fn bf16_bits_to_f32(b: u16) -> f32 {
    f32::from_bits(u32::from(b) << 16)
}

/// f16 → f32 by the IEEE 754 binary16 definition, computed in f64: sign, 5 exponent bits
/// (bias 15), 10 mantissa bits; exponent 0 is subnormal (`m · 2^−24`), 31 is inf/NaN.
fn f16_bits_to_f32(b: u16) -> f32 {
    let sign = if b & 0x8000 != 0 { -1.0 } else { 1.0 };
    let e = i32::from((b >> 10) & 0x1f);
    let m = f64::from(b & 0x3ff);
    let v = match e {
        0 => m * 2f64.powi(-24),
        31 if m == 0.0 => f64::INFINITY,
        31 => {
            return f32::from_bits(
                0x7fc0_0000 | (u32::from(b & 0x3ff) << 13) | (u32::from(b & 0x8000) << 16),
            )
        }
        _ => (1.0 + m / 1024.0) * 2f64.powi(e - 15),
    };
    (sign * v) as f32
}

/// f32 → bf16 rounded to nearest, ties to even (finite and infinite values).
fn f32_to_bf16_bits(x: f32) -> u16 {
    let b = x.to_bits();
    let lsb = (b >> 16) & 1;
    ((b + 0x7fff + lsb) >> 16) as u16
}

/// Half-precision bit patterns per tensor, spread over the whole range (normals, subnormals,
/// both zeros); in tensor 0 also infinities and a NaN. f16: 5 exponent bits at bit 10; bf16: 8
/// exponent bits at bit 7 (kept within 2^±27 so the model stays finite).
fn patterns(dtype: Dtype, t: usize, n: usize, special: bool) -> Vec<u16> {
    let (specials, mant_bits, exps) = match dtype {
        Dtype::F16 => (
            [0x0001, 0x83ff, 0x7c00, 0xfc00, 0x8000, 0x7e01],
            10,
            (0u16, 30u16),
        ),
        _ => (
            [0x0001, 0x807f, 0x7f80, 0xff80, 0x8000, 0x7fa1],
            7,
            (100, 55),
        ),
    };
    (0..n)
        .map(|i| {
            if special && i < specials.len() {
                specials[i]
            } else {
                let k = (i * 7919 + t * 104_729) as u16;
                let exp = (exps.0 + k % exps.1) << mant_bits;
                (k & 0x8000) | exp | (k.wrapping_mul(31) & ((1 << mant_bits) - 1))
            }
        })
        .collect()
}

#[test]
fn bf16_and_f16_files_load_exactly() {
    let c = config();
    let shapes = named_values(&model(c.clone()));
    for (dtype, convert) in [
        (Dtype::BF16, bf16_bits_to_f32 as fn(u16) -> f32),
        (Dtype::F16, f16_bits_to_f32 as fn(u16) -> f32),
    ] {
        let dir = tmp_dir(&format!("{dtype:?}"));
        write_plain_config(&dir, &c, |hf| {
            hf["torch_dtype"] = json!(if dtype == Dtype::BF16 {
                "bfloat16"
            } else {
                "float16"
            });
        });
        let mut tensors = Vec::new();
        let mut want = Vec::new();
        for (t, (name, shape, v)) in shapes.iter().enumerate() {
            let p = patterns(dtype, t, v.len(), t == 0);
            tensors.push((
                name.clone(),
                dtype,
                shape.clone(),
                p.iter().flat_map(|b| b.to_le_bytes()).collect(),
            ));
            want.push(p.iter().map(|&b| convert(b)).collect::<Vec<f32>>());
        }
        write_file(&dir.join("model.safetensors"), &tensors);
        let back = load(&dir.join("model.safetensors")).unwrap();
        for ((name, _, got), want) in named_values(&back).iter().zip(&want) {
            assert_eq!(bits(got), bits(want), "{dtype:?} {name}");
        }
        // The special values really are in the file: a subnormal, infinities, a NaN.
        let first = &named_values(&back)[0].2;
        assert_eq!(first[2], f32::INFINITY);
        assert_eq!(first[3], f32::NEG_INFINITY);
        assert!(first[5].is_nan());
    }
    // The f16 reference decoder against known values.
    assert_eq!(f16_bits_to_f32(0x0001), 2f32.powi(-24));
    assert_eq!(f16_bits_to_f32(0x3c00), 1.0);
    assert_eq!(f16_bits_to_f32(0xc000), -2.0);
    assert_eq!(f16_bits_to_f32(0x7bff), 65504.0);
}

#[test]
fn other_dtypes_are_refused_naming_tensor_and_dtype() {
    let c = config();
    let shapes = named_values(&model(c.clone()));
    for (dtype, size) in [
        (Dtype::F64, 8),
        (Dtype::I8, 1),
        (Dtype::U8, 1),
        (Dtype::I32, 4),
    ] {
        let dir = tmp_dir(&format!("bad-{dtype:?}"));
        write_plain_config(&dir, &c, |_| {});
        let tensors: Vec<_> = shapes
            .iter()
            .enumerate()
            .map(|(i, (n, s, v))| {
                let (d, w) = if i == 1 {
                    (dtype, size)
                } else {
                    (Dtype::F32, 4)
                };
                (n.clone(), d, s.clone(), vec![0u8; v.len() * w])
            })
            .collect();
        write_file(&dir.join("model.safetensors"), &tensors);
        let reason = state_reason(load(&dir.join("model.safetensors")));
        assert!(reason.contains(&shapes[1].0), "{reason}");
        assert!(reason.contains(&format!("{dtype:?}")), "{reason}");
        assert!(reason.contains("F32, BF16 and F16"), "{reason}");
    }
}

#[test]
fn unknown_torch_dtype_is_refused_by_name() {
    let c = config();
    let dir = tmp_dir("torch-dtype");
    save_model(&model(c.clone()), &dir.join("saved.safetensors")).unwrap();
    let values = named_values(&model(c.clone()));
    let tensors: Vec<_> = values
        .iter()
        .map(|(n, s, v)| {
            (
                n.clone(),
                Dtype::F32,
                s.clone(),
                v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            )
        })
        .collect();
    write_file(&dir.join("model.safetensors"), &tensors);
    for (key, value) in [
        ("torch_dtype", "float64"),
        ("dtype", "int8"),
        ("torch_dtype", "fp32"),
    ] {
        write_plain_config(&dir, &c, |hf| hf[key] = json!(value));
        let reason = state_reason(load(&dir.join("model.safetensors")));
        assert!(reason.contains(key) && reason.contains(value), "{reason}");
    }
    for value in ["float32", "bfloat16", "float16"] {
        write_plain_config(&dir, &c, |hf| hf["torch_dtype"] = json!(value));
        load(&dir.join("model.safetensors")).unwrap();
    }
}

#[test]
fn bf16_save_rounds_to_nearest_even_and_loads_back() {
    let c = config();
    let m = model(c.clone());
    let dir = tmp_dir("bf16-save");
    let path = dir.join("model.safetensors");
    save_model_as(&m, &path, StateDtype::BF16).unwrap();
    let hf: serde_json::Value =
        serde_json::from_slice(&fs::read(dir.join("config.json")).unwrap()).unwrap();
    assert_eq!(hf["torch_dtype"], "bfloat16");
    assert_eq!(hf["dtype"], "bfloat16");
    let bytes = fs::read(&path).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    for (name, _, _) in named_values(&m) {
        assert_eq!(st.tensor(&name).unwrap().dtype(), Dtype::BF16, "{name}");
    }
    let back = load(&path).unwrap();
    let mut any_rounded = false;
    for ((name, _, orig), (_, _, got)) in named_values(&m).iter().zip(named_values(&back)) {
        let want: Vec<f32> = orig
            .iter()
            .map(|&x| bf16_bits_to_f32(f32_to_bf16_bits(x)))
            .collect();
        any_rounded |= want != *orig;
        assert_eq!(bits(&got), bits(&want), "{name}");
    }
    assert!(any_rounded, "the bf16 save changed no value");
    // Ties go to even: 1 + 2^-8 lies halfway between two bf16 values.
    assert_eq!(f32_to_bf16_bits(1.0 + 2f32.powi(-8)), 0x3f80);
    assert_eq!(f32_to_bf16_bits(1.0 + 3.0 * 2f32.powi(-8)), 0x3f82);
}

/// A sharded copy of the f32 state of `m` in `dir`: tensors split over two files by position
/// (first half, second half), an index, and a plain config.json.
fn write_shards(dir: &Path, m: &DecoderOnlyTransformer) -> serde_json::Value {
    write_plain_config(dir, m.config(), |_| {});
    let values = named_values(m);
    let half = values.len() / 2;
    let mut map = serde_json::Map::new();
    for (k, part) in [&values[..half], &values[half..]].iter().enumerate() {
        let file = format!("model-0000{}-of-00002.safetensors", k + 1);
        let tensors: Vec<_> = part
            .iter()
            .map(|(n, s, v)| {
                map.insert(n.clone(), json!(file));
                (
                    n.clone(),
                    Dtype::F32,
                    s.clone(),
                    v.iter().flat_map(|x| x.to_le_bytes()).collect(),
                )
            })
            .collect();
        write_file(&dir.join(&file), &tensors);
    }
    let index = json!({"metadata": {"total_size": 0}, "weight_map": map});
    fs::write(dir.join(SHARD_INDEX_FILE), index.to_string()).unwrap();
    index
}

#[test]
fn sharded_folder_loads_equal_to_the_single_file() {
    let m = model(config());
    let dir = tmp_dir("shards");
    write_shards(&dir, &m);
    let back = load(&dir.join(SHARD_INDEX_FILE)).unwrap();
    assert_eq!(
        config_json_pairing(&dir.join(SHARD_INDEX_FILE)).unwrap(),
        ConfigJsonPairing::Unrecorded
    );
    let reason = state_reason(load_weights_into(&m, &dir.join(SHARD_INDEX_FILE)));
    assert!(reason.contains("load_model"), "{reason}");
    // A plain Hugging Face config carries no initialisation seed.
    let mut want = m.config().clone();
    want.seed = 0;
    assert_eq!(back.config(), &want);
    for ((n, _, a), (_, _, b)) in named_values(&m).iter().zip(named_values(&back)) {
        assert_eq!(bits(a), bits(&b), "{n}");
    }
}

#[test]
fn bad_shard_indexes_are_named() {
    let m = model(config());
    let values = named_values(&m);
    let (first, last) = (values[0].0.clone(), values[values.len() - 1].0.clone());
    let case = |name: &str, edit: &dyn Fn(&Path, &mut serde_json::Value) -> Option<String>| {
        let dir = tmp_dir(name);
        let mut index = write_shards(&dir, &m);
        let text = edit(&dir, &mut index).unwrap_or_else(|| index.to_string());
        fs::write(dir.join(SHARD_INDEX_FILE), text).unwrap();
        state_reason(load(&dir.join(SHARD_INDEX_FILE)))
    };
    // A shard file that is missing.
    let r = case("missing", &|dir, _| {
        fs::remove_file(dir.join("model-00002-of-00002.safetensors")).unwrap();
        None
    });
    assert!(
        r.contains("model-00002-of-00002.safetensors") && r.contains("does not exist"),
        "{r}"
    );
    // A path escaping the folder.
    for escape in ["../x.safetensors", "/etc/passwd", "a/../../b.safetensors"] {
        let r = case("escape", &|_, idx| {
            idx["weight_map"][&last] = json!(escape);
            None
        });
        assert!(
            r.contains(escape) && r.contains("inside the folder"),
            "{escape}: {r}"
        );
    }
    // A tensor mapped twice (a duplicate JSON key).
    let r = case("twice", &|_, idx| {
        let text = idx.to_string();
        Some(text.replacen(
            "\"weight_map\":{",
            &format!("\"weight_map\":{{\"{first}\":\"model-00002-of-00002.safetensors\","),
            1,
        ))
    });
    assert!(r.contains(&first) && r.contains("mapped twice"), "{r}");
    // A tensor the index maps to a shard that does not hold it.
    let r = case("not-held", &|_, idx| {
        idx["weight_map"][&first] = json!("model-00002-of-00002.safetensors");
        None
    });
    assert!(r.contains(&first) && r.contains("does not hold it"), "{r}");
    // A tensor in a shard that the index does not list.
    let r = case("unlisted", &|_, idx| {
        idx["weight_map"].as_object_mut().unwrap().remove(&last);
        None
    });
    assert!(r.contains(&last) && r.contains("not in"), "{r}");
    // A tensor in two shard files.
    let r = case("two-files", &|dir, idx| {
        let v = &values[0];
        let extra = vec![
            (
                v.0.clone(),
                Dtype::F32,
                v.1.clone(),
                vec![0u8; v.2.len() * 4],
            ),
            (
                last.clone(),
                Dtype::F32,
                values[values.len() - 1].1.clone(),
                vec![0u8; values[values.len() - 1].2.len() * 4],
            ),
        ];
        write_file(&dir.join("extra.safetensors"), &extra);
        idx["weight_map"][&last] = json!("extra.safetensors");
        None
    });
    assert!(r.contains(&first) && r.contains("two files"), "{r}");
    // Not an index at all.
    let r = case("garbage", &|_, _| Some("{\"weight_map\": [1, 2]}".into()));
    assert!(r.contains("weight_map"), "{r}");
}

/// A shard name that is the index itself, or another JSON file, is named as such: read as
/// safetensors its first bytes (`{"we`) would give a header length of 8388068008349082235.
#[test]
fn a_shard_that_is_the_index_or_a_json_file_is_named() {
    let m = model(config());
    let values = named_values(&m);
    let last = values[values.len() - 1].0.clone();
    for (case, shard, says) in [
        ("index-itself", SHARD_INDEX_FILE, "this index file itself"),
        ("json-shard", "config.json", "is a JSON file"),
    ] {
        let dir = tmp_dir(case);
        let mut index = write_shards(&dir, &m);
        index["weight_map"][&last] = json!(shard);
        fs::write(dir.join(SHARD_INDEX_FILE), index.to_string()).unwrap();
        let Err(e @ TransformerError::State { .. }) = load(&dir.join(SHARD_INDEX_FILE)) else {
            panic!("{case}: expected a State error");
        };
        // The message (path and reason) names the file and says what it is.
        let r = e.to_string();
        assert!(r.contains(shard) && r.contains(says), "{case}: {r}");
        assert!(!r.contains("header length"), "{case}: {r}");
    }
    // The index under another name (a hard link, a symlink) is still the index itself.
    for (case, link) in [("hard-link", true), ("symlink", false)] {
        let dir = tmp_dir(case);
        let mut index = write_shards(&dir, &m);
        index["weight_map"][&last] = json!("other.safetensors");
        fs::write(dir.join(SHARD_INDEX_FILE), index.to_string()).unwrap();
        let other = dir.join("other.safetensors");
        if link {
            fs::hard_link(dir.join(SHARD_INDEX_FILE), &other).unwrap();
        } else {
            #[cfg(unix)]
            std::os::unix::fs::symlink(SHARD_INDEX_FILE, &other).unwrap();
            #[cfg(not(unix))]
            continue;
        }
        let Err(e @ TransformerError::State { .. }) = load(&dir.join(SHARD_INDEX_FILE)) else {
            panic!("{case}: expected a State error");
        };
        let r = e.to_string();
        assert!(r.contains("this index file itself"), "{case}: {r}");
        assert!(!r.contains("header length"), "{case}: {r}");
    }
}

#[test]
fn token_ids_and_rope_scaling_round_trip_through_config_json() {
    let mut c = config();
    c.bos_token_id = Some(1);
    c.eos_token_ids = vec![2, 3];
    c.rope_theta = 500000.0;
    c.rope_scaling = RopeScaling::Llama3 {
        factor: 8.0,
        low_freq_factor: 1.0,
        high_freq_factor: 4.0,
        original_max_position_embeddings: 8,
    };
    let m = model(c.clone());
    let dir = tmp_dir("round-trip");
    save_model(&m, &dir.join("saved.safetensors")).unwrap();
    let hf: serde_json::Value =
        serde_json::from_slice(&fs::read(dir.join("config.json")).unwrap()).unwrap();
    assert_eq!(hf["bos_token_id"], 1);
    assert_eq!(hf["eos_token_id"], json!([2, 3]));
    assert_eq!(
        hf["rope_parameters"],
        json!({"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 8})
    );
    // The plain HF fields alone give the same config (and the same logits).
    write_shards(&dir, &m);
    let back = load(&dir.join(SHARD_INDEX_FILE)).unwrap();
    assert_eq!(
        back.config(),
        &TransformerConfig {
            seed: 0,
            ..c.clone()
        }
    );
    let tokens: Vec<u32> = (0..12).map(|i| (i * 5 % 64) as u32).collect();
    assert_eq!(
        back.logits(&tokens, 1, 12).unwrap().value().to_vec(),
        m.logits(&tokens, 1, 12).unwrap().value().to_vec()
    );
    // Older files: rope_scaling with "type", a single eos id.
    write_plain_config(&dir, &c, |hf| {
        hf["rope_parameters"] = json!(null);
        hf["rope_scaling"] = json!({"type": "linear", "factor": 2.5});
        hf["eos_token_id"] = json!(7);
    });
    let back = load(&dir.join(SHARD_INDEX_FILE)).unwrap();
    assert_eq!(
        back.config().rope_scaling,
        RopeScaling::Linear { factor: 2.5 }
    );
    assert_eq!(back.config().eos_token_ids, vec![7]);
}

#[test]
fn bad_rope_scaling_and_token_ids_are_named() {
    let c = config();
    let dir = tmp_dir("bad-rope");
    write_shards(&dir, &model(c.clone()));
    let llama3 = |f: f64, lo: f64, hi: f64, l: serde_json::Value| {
        json!({"rope_type": "llama3", "factor": f, "low_freq_factor": lo, "high_freq_factor": hi,
               "original_max_position_embeddings": l})
    };
    for (key, value, needles) in [
        (
            "rope_parameters",
            json!({"rope_type": "yarn", "factor": 4.0}),
            vec!["\"yarn\""],
        ),
        (
            "rope_scaling",
            json!({"type": "dynamic", "factor": 4.0}),
            vec!["\"dynamic\""],
        ),
        (
            "rope_parameters",
            json!({"rope_type": "longrope"}),
            vec!["\"longrope\""],
        ),
        (
            "rope_parameters",
            json!({"rope_type": "linear"}),
            vec!["factor is missing"],
        ),
        (
            "rope_parameters",
            json!({"rope_type": "linear", "factor": 0.0}),
            vec!["factor = 0"],
        ),
        (
            "rope_parameters",
            json!({"rope_type": "linear", "factor": -2.0}),
            vec!["factor = -2"],
        ),
        (
            "rope_parameters",
            llama3(8.0, 4.0, 4.0, json!(8192)),
            vec!["high_freq_factor = 4", "low_freq_factor"],
        ),
        (
            "rope_parameters",
            llama3(8.0, 1.0, 4.0, json!(0)),
            vec!["original_max_position_embeddings = 0"],
        ),
        (
            "rope_parameters",
            llama3(8.0, 1.0, 4.0, json!(-1)),
            vec!["original_max_position_embeddings = -1"],
        ),
        (
            "bos_token_id",
            json!(64),
            vec!["bos_token_id", "64", "vocab_size"],
        ),
        ("eos_token_id", json!([2, 99]), vec!["eos_token_ids", "99"]),
        ("eos_token_id", json!("x"), vec!["eos_token_id = \"x\""]),
    ] {
        write_plain_config(&dir, &c, |hf| hf[key] = value.clone());
        let reason = state_reason(load(&dir.join(SHARD_INDEX_FILE)));
        for n in needles {
            assert!(reason.contains(n), "{key} = {value}: {reason}");
        }
    }
    // rope_parameters and rope_scaling disagreeing.
    write_plain_config(&dir, &c, |hf| {
        hf["rope_parameters"] = json!({"rope_type": "linear", "factor": 2.0});
        hf["rope_scaling"] = json!({"rope_type": "linear", "factor": 4.0});
    });
    let reason = state_reason(load(&dir.join(SHARD_INDEX_FILE)));
    assert!(reason.contains("disagrees"), "{reason}");
    // The config's own validation, without any file.
    let mut bad = c.clone();
    bad.rope_scaling = RopeScaling::Linear { factor: f64::NAN };
    let err = bad.validate().unwrap_err().to_string();
    assert!(err.contains("factor = NaN"), "{err}");
}

#[test]
fn llama3_frequencies_keep_high_divide_low_and_blend_between() {
    // Llama 3.2's parameters: θ 500000, d_head 64, factor 32, low 1, high 4, L 8192.
    let s = RopeScaling::Llama3 {
        factor: 32.0,
        low_freq_factor: 1.0,
        high_freq_factor: 4.0,
        original_max_position_embeddings: 8192,
    };
    let f = s.inverse_frequencies(64, 500000.0);
    let unscaled = RopeScaling::Default.inverse_frequencies(64, 500000.0);
    assert_eq!(f.len(), 32);
    let two_pi = 2.0 * std::f64::consts::PI;
    let mut kinds = [0; 3];
    for (i, (&g, &u)) in f.iter().zip(&unscaled).enumerate() {
        let want = 500000f64.powf(-((2 * i) as f64) / 64.0);
        assert!((u - want).abs() <= 1e-15 * want, "pair {i}: {u} vs {want}");
        let wavelen = two_pi / u;
        if wavelen < 8192.0 / 4.0 {
            assert_eq!(g, u, "pair {i}: high frequency kept");
            kinds[0] += 1;
        } else if wavelen > 8192.0 {
            assert_eq!(g, u / 32.0, "pair {i}: low frequency divided");
            kinds[2] += 1;
        } else {
            assert!(g < u && g > u / 32.0, "pair {i}: blended {g} not between");
            kinds[1] += 1;
        }
    }
    assert!(kinds.iter().all(|&k| k > 0), "{kinds:?}");
    let linear = RopeScaling::Linear { factor: 4.0 }.inverse_frequencies(64, 500000.0);
    for (l, u) in linear.iter().zip(&unscaled) {
        assert_eq!(*l, u / 4.0);
    }
    // The model's logits change with the scaling, and linear factor 1 is the unscaled model.
    let tokens: Vec<u32> = (0..12).map(|i| (i * 5 % 64) as u32).collect();
    let run = |s: RopeScaling| {
        let mut c = config();
        c.rope_scaling = s;
        model(c).logits(&tokens, 1, 12).unwrap().value().to_vec()
    };
    let base = run(RopeScaling::Default);
    assert_eq!(bits(&run(RopeScaling::Linear { factor: 1.0 })), bits(&base));
    assert_ne!(bits(&run(RopeScaling::Linear { factor: 2.0 })), bits(&base));
}
