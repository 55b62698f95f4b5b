//! GGUF files of the `llama` architecture (Llama 2 and 3.x, SmolLM, TinyLlama, Mistral-layout
//! files) as riftco models.
//!
//! The config comes from the metadata keys llama.cpp writes (`llama.context_length`,
//! `llama.embedding_length`, `llama.block_count`, `llama.feed_forward_length`,
//! `llama.attention.head_count`, `llama.attention.head_count_kv`, `llama.rope.freq_base`,
//! `llama.rope.scaling.*`, `llama.attention.layer_norm_rms_epsilon`, `llama.vocab_size` or the
//! length of `tokenizer.ggml.tokens`, `tokenizer.ggml.{bos,eos,eot}_token_id`); the LM head is
//! tied to the embedding when the file has no `output.weight`. Tensors are named as in
//! llama.cpp (`token_embd`, `blk.N.attn_q`, ..., `output_norm`, `output`), each with GGML's
//! dimension order (`ne[0]` the innermost), which is the row-major `[out, in]` of Hugging Face
//! read backwards.
//!
//! llama.cpp's converter (`convert_hf_to_gguf.py`, `LlamaModel.permute`) reorders the rows of
//! `q_proj` and `k_proj` within each head so that its RoPE rotates adjacent pairs `(2i, 2i+1)`;
//! riftco, as Hugging Face, rotates the pairs `(i, i + d_head/2)` (rotate-half). The permuted
//! row `h·d_head + 2i + j` is Hugging Face row `h·d_head + j·d_head/2 + i`; loading puts every
//! row back, so the weights are exactly those of the Hugging Face checkpoint the file was
//! converted from.

use super::{GgufFile, GgufTensorInfo, GgufValue};
use crate::checkpointing::ActivationCheckpointing;
use crate::config::TransformerConfig;
use crate::error::Result;
use crate::layout::{self, LayerParam, ModelParam, Place};
use crate::model::DecoderOnlyTransformer;
use crate::policy::FullSequenceAttentionKind;
use crate::rope_scaling::RopeScaling;
use crate::state::model_file::config_summary;
use crate::state::state_err;
use crate::state::values::ParamValues;
use riftco_kernels::quant::{dequantize, GgmlType, QuantFormat};
use riftco_tensor::HalfDtype;
use std::collections::BTreeSet;
use std::path::Path;

/// The architecture riftco loads.
const ARCH: &str = "llama";
/// The tensor of per-frequency RoPE factors llama.cpp's converter writes for Llama 3.1+.
const ROPE_FREQS: &str = "rope_freqs.weight";

/// The llama.cpp name of the parameter at `place`.
pub(crate) fn gguf_name(place: Place) -> String {
    match place {
        Place::Model(ModelParam::Embedding) => "token_embd.weight".into(),
        Place::Model(ModelParam::FinalNorm) => "output_norm.weight".into(),
        Place::Model(ModelParam::LmHead) => "output.weight".into(),
        Place::Layer(i, p) => {
            let name = match p {
                LayerParam::AttnNorm => "attn_norm",
                LayerParam::Q => "attn_q",
                LayerParam::K => "attn_k",
                LayerParam::V => "attn_v",
                LayerParam::O => "attn_output",
                LayerParam::MlpNorm => "ffn_norm",
                LayerParam::Gate => "ffn_gate",
                LayerParam::Up => "ffn_up",
                LayerParam::Down => "ffn_down",
            };
            format!("blk.{i}.{name}.weight")
        }
    }
}

/// Metadata lookups with errors that name the file and the key.
struct Keys<'a>(&'a GgufFile);

impl Keys<'_> {
    fn err(&self, reason: impl std::fmt::Display) -> crate::TransformerError {
        state_err(self.0.path(), format!("GGUF: {reason}"))
    }

    fn opt_usize(&self, key: &str) -> Result<Option<usize>> {
        match self.0.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_u64()
                .and_then(|x| usize::try_from(x).ok())
                .map(Some)
                .ok_or_else(|| {
                    self.err(format!(
                        "metadata key {key:?} is {v} ({}); expected a non-negative integer",
                        v.type_name()
                    ))
                }),
        }
    }

    fn usize(&self, key: &str) -> Result<usize> {
        self.opt_usize(key)?.ok_or_else(|| self.missing(key))
    }

    fn opt_f64(&self, key: &str) -> Result<Option<f64>> {
        match self.0.get(key) {
            None => Ok(None),
            Some(v) => v.as_f64().map(Some).ok_or_else(|| {
                self.err(format!(
                    "metadata key {key:?} is {v} ({}); expected a FLOAT32 or FLOAT64 number",
                    v.type_name()
                ))
            }),
        }
    }

    fn opt_str(&self, key: &str) -> Result<Option<&str>> {
        match self.0.get(key) {
            None => Ok(None),
            Some(GgufValue::String(s)) => Ok(Some(s)),
            Some(v) => Err(self.err(format!(
                "metadata key {key:?} is {v} ({}); expected a STRING",
                v.type_name()
            ))),
        }
    }

    fn missing(&self, key: &str) -> crate::TransformerError {
        self.err(format!(
            "metadata key {key:?} is missing: a {ARCH} model file declares it"
        ))
    }
}

/// The config a GGUF file of the `llama` architecture declares (see the module docs),
/// validated.
///
/// # Errors
/// [`crate::TransformerError::State`] naming the file and the key: no `general.architecture`
/// or another one (named), a mixture of experts, a missing or mistyped key, a RoPE scaling
/// riftco does not implement (named), a head size that disagrees with
/// `llama.rope.dimension_count` or `llama.attention.key_length`, or a config that does not
/// validate.
pub(crate) fn config_from_gguf(file: &GgufFile) -> Result<TransformerConfig> {
    let k = Keys(file);
    match k.opt_str("general.architecture")? {
        Some(ARCH) => {}
        Some(other) => {
            return Err(k.err(format!(
                "architecture {other:?} (general.architecture) is not supported: riftco loads \
                 the {ARCH:?} architecture (Llama 2 and 3.x, SmolLM, TinyLlama and other \
                 Llama-layout files)"
            )))
        }
        None => return Err(k.missing("general.architecture")),
    }
    let key = |name: &str| format!("{ARCH}.{name}");
    if let Some(n) = k.opt_usize(&key("expert_count"))?.filter(|&n| n > 0) {
        return Err(k.err(format!(
            "{} = {n}: a mixture-of-experts model, which riftco does not implement",
            key("expert_count")
        )));
    }
    let vocab_size = match k.opt_usize(&key("vocab_size"))? {
        Some(n) => n,
        None => match file
            .get("tokenizer.ggml.tokens")
            .and_then(GgufValue::as_array)
        {
            Some(tokens) => tokens.len(),
            None => {
                return Err(k.err(format!(
                    "the vocabulary size is unknown: neither {} nor tokenizer.ggml.tokens is in \
                     the metadata",
                    key("vocab_size")
                )))
            }
        },
    };
    let n_heads = k.usize(&key("attention.head_count"))?;
    let mut config = TransformerConfig::new(
        vocab_size,
        k.usize(&key("embedding_length"))?,
        n_heads,
        k.usize(&key("block_count"))?,
        k.usize(&key("feed_forward_length"))?,
        k.usize(&key("context_length"))?,
    );
    config.n_kv_heads = k
        .opt_usize(&key("attention.head_count_kv"))?
        .unwrap_or(n_heads);
    let eps_key = key("attention.layer_norm_rms_epsilon");
    config.rms_norm_eps = k.opt_f64(&eps_key)?.ok_or_else(|| k.missing(&eps_key))? as f32;
    config.rope_theta = k.opt_f64(&key("rope.freq_base"))?.unwrap_or(10000.0);
    config.rope_scaling = rope_scaling(&k)?;
    config.tie_word_embeddings = file
        .tensor(&gguf_name(Place::Model(ModelParam::LmHead)))
        .is_none();
    let token_id = |id_key: &str| -> Result<Option<u32>> {
        k.opt_usize(id_key)?
            .map(|id| {
                u32::try_from(id).map_err(|_| {
                    k.err(format!(
                        "metadata key {id_key:?} = {id} is not a 32-bit token id"
                    ))
                })
            })
            .transpose()
    };
    config.bos_token_id = token_id("tokenizer.ggml.bos_token_id")?;
    for id_key in ["tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id"] {
        if let Some(id) = token_id(id_key)? {
            if !config.eos_token_ids.contains(&id) {
                config.eos_token_ids.push(id);
            }
        }
    }
    config.validate().map_err(|e| {
        k.err(format!(
            "the config its metadata declares is invalid: {e} ({})",
            config_summary(&config)
        ))
    })?;
    let d_head = config.d_head();
    for name in [
        "rope.dimension_count",
        "attention.key_length",
        "attention.value_length",
    ] {
        if let Some(n) = k.opt_usize(&key(name))?.filter(|&n| n != d_head) {
            return Err(k.err(format!(
                "{} = {n} differs from embedding_length / head_count = {d_head}: riftco's heads \
                 are d_model / n_heads wide and RoPE rotates the whole head",
                key(name)
            )));
        }
    }
    if let Some(scaling) = llama3_from_rope_freqs(file, &config)? {
        config.rope_scaling = scaling;
        config.validate().map_err(|e| k.err(e))?;
    }
    Ok(config)
}

/// RoPE scaling from `llama.rope.scaling.type` (default `"linear"`, as llama.cpp) and
/// `llama.rope.scaling.factor` (or the older `llama.rope.scale_linear`; absent or 0 means 1):
/// unscaled for `"none"` or a factor of 1, linear (position interpolation) otherwise.
fn rope_scaling(k: &Keys<'_>) -> Result<RopeScaling> {
    let type_key = format!("{ARCH}.rope.scaling.type");
    let kind = k.opt_str(&type_key)?.unwrap_or("linear");
    let factor_key = format!("{ARCH}.rope.scaling.factor");
    let factor = match k.opt_f64(&factor_key)? {
        Some(f) => Some((factor_key.as_str(), f)),
        None => k
            .opt_f64(&format!("{ARCH}.rope.scale_linear"))?
            .map(|f| ("llama.rope.scale_linear", f)),
    }
    .filter(|&(_, f)| f != 0.0 && f != 1.0);
    match (kind, factor) {
        ("none", _) | ("linear", None) => Ok(RopeScaling::Default),
        ("linear", Some((_, factor))) => Ok(RopeScaling::Linear { factor }),
        (other, _) => Err(k.err(format!(
            "{type_key} = {other:?} is not supported: riftco implements unscaled, linear and \
             Llama 3.1 RoPE"
        ))),
    }
}

/// Llama 3.1's RoPE scaling from the `rope_freqs.weight` tensor of per-frequency factors
/// llama.cpp's converter writes for it (each inverse frequency is divided by its factor):
/// `None` when the file has no such tensor, else the scaling with `factor` the largest factor
/// and Llama 3.1's `low_freq_factor` 1, `high_freq_factor` 4 and original context 8192, after
/// checking that it gives every stored factor to within 1e-5 relative (the converter computes
/// them in f32 from the same formula; its rounding moves a factor by a few parts in 10^7).
fn llama3_from_rope_freqs(
    file: &GgufFile,
    config: &TransformerConfig,
) -> Result<Option<RopeScaling>> {
    let Some(info) = file.tensor(ROPE_FREQS) else {
        return Ok(None);
    };
    let half = (config.d_head() / 2) as u64;
    if info.dims != [half] {
        return Err(state_err(
            file.path(),
            format!(
                "GGUF: tensor {ROPE_FREQS} has dimensions {:?}; expected [{half}] (d_head / 2)",
                info.dims
            ),
        ));
    }
    let (_, factors) = file.read_tensor_f32(ROPE_FREQS)?;
    let factor = factors.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    if factors.iter().all(|&f| f == 1.0) {
        return Ok(Some(config.rope_scaling.clone()));
    }
    let scaling = RopeScaling::Llama3 {
        factor: f64::from(factor),
        low_freq_factor: 1.0,
        high_freq_factor: 4.0,
        original_max_position_embeddings: 8192,
    };
    let unscaled = RopeScaling::Default.inverse_frequencies(config.d_head(), config.rope_theta);
    let scaled = scaling.inverse_frequencies(config.d_head(), config.rope_theta);
    for (i, (&got, (u, s))) in factors.iter().zip(unscaled.iter().zip(&scaled)).enumerate() {
        let want = u / s;
        let close = (f64::from(got) - want).abs() <= 1e-5 * want;
        if !close {
            return Err(state_err(
                file.path(),
                format!(
                    "GGUF: tensor {ROPE_FREQS} holds per-frequency RoPE factors that are not \
                     Llama 3.1's scaling (factor {factor}, low_freq_factor 1, high_freq_factor \
                     4, original context 8192): factor {i} is {got}, that scaling gives {want}; \
                     riftco does not apply other factors"
                ),
            ));
        }
    }
    Ok(Some(scaling))
}

/// The Hugging Face row of row `r` of a `q_proj` / `k_proj` weight permuted by llama.cpp's
/// converter, for a weight of `rows` rows in `n_head` heads (see the module docs).
pub(crate) fn hf_row(r: usize, rows: usize, n_head: usize) -> usize {
    let d = rows / n_head;
    let (h, rem) = (r / d, r % d);
    h * d + (rem % 2) * (d / 2) + rem / 2
}

/// The values of every parameter of `config` read from `file` (Hugging Face names, state-dict
/// order), checked first: every tensor present with the config's shape and a type riftco
/// dequantizes, no other tensor (but `rope_freqs.weight`, read into the config). Streams:
/// one tensor's stored bytes at a time (in a buffer reused from tensor to tensor), dequantized
/// row by row into the parameter's place (Q and K rows unpermuted), so the memory in use is the
/// values read so far plus one tensor's bytes (and its f32 values when storing `half`).
///
/// # Errors
/// [`crate::TransformerError::State`] naming the file and the tensor: missing or unknown
/// tensors (listed), a shape that disagrees with the config (both given, in GGML `ne` order and
/// as a row-major shape), a type riftco does not dequantize (named), a value beyond float16's
/// range when storing float16.
pub(crate) fn load_llama_values(
    file: &GgufFile,
    config: &TransformerConfig,
    half: Option<HalfDtype>,
    as_stored: bool,
    quantize: Option<QuantFormat>,
) -> Result<Vec<(String, ParamValues)>> {
    let entries: Vec<_> = layout::entries_for(config).collect();
    let expected: Vec<(String, &GgufTensorInfo, Vec<usize>, Option<usize>)> = {
        let names: BTreeSet<String> = entries.iter().map(|e| gguf_name(e.place)).collect();
        let held: BTreeSet<String> = file
            .tensors()
            .iter()
            .map(|t| t.name.clone())
            .filter(|n| n != ROPE_FREQS)
            .collect();
        let summary = config_summary(config);
        let list = |v: Vec<&String>| {
            let more = v.len().saturating_sub(5);
            let shown: Vec<&String> = v.into_iter().take(5).collect();
            if more > 0 {
                format!("{shown:?} and {more} more")
            } else {
                format!("{shown:?}")
            }
        };
        let missing: Vec<&String> = names.difference(&held).collect();
        if !missing.is_empty() {
            return Err(state_err(
                file.path(),
                format!(
                    "GGUF: {} tensor(s) of the {ARCH} config ({summary}) missing: {}",
                    missing.len(),
                    list(missing)
                ),
            ));
        }
        let unknown: Vec<&String> = held.difference(&names).collect();
        if !unknown.is_empty() {
            return Err(state_err(
                file.path(),
                format!(
                    "GGUF: {} tensor(s) that riftco's {ARCH} model ({summary}) has no place \
                     for: {}",
                    unknown.len(),
                    list(unknown)
                ),
            ));
        }
        let mut out = Vec::with_capacity(entries.len());
        for e in &entries {
            let name = gguf_name(e.place);
            let info = file.tensor(&name).ok_or_else(|| {
                state_err(
                    file.path(),
                    format!("internal: tensor {name} not in the file"),
                )
            })?;
            let shape = e.shape(config);
            let dims: Vec<u64> = shape.iter().rev().map(|&d| d as u64).collect();
            if info.dims != dims {
                return Err(state_err(
                    file.path(),
                    format!(
                        "GGUF: tensor {name} has dimensions (ne) {:?}, a [{}] weight, but the \
                         config ({summary}) expects ne {dims:?}, {shape:?}",
                        info.dims,
                        info.shape()
                            .iter()
                            .map(usize::to_string)
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                ));
            }
            file.check_dequantized(info)?;
            let heads = match e.place {
                Place::Layer(_, LayerParam::Q) => Some(config.n_heads),
                Place::Layer(_, LayerParam::K) => Some(config.n_kv_heads),
                _ => None,
            };
            out.push((e.hf_name(), info, shape, heads));
        }
        out
    };
    let mut values = Vec::new();
    values
        .try_reserve_exact(expected.len())
        .map_err(|_| state_err(file.path(), "cannot allocate the tensor list"))?;
    let mut bytes = Vec::new();
    for (hf_name, info, shape, heads) in expected {
        let keep =
            as_stored || (quantize.is_some() && quantize == QuantFormat::from_ggml(info.ggml_type));
        let v = tensor_values(file, info, &shape, heads, half, keep, &mut bytes)?;
        let v = match quantize {
            Some(f) => crate::state::values::quantize_param(file.path(), &info.name, &shape, f, v)?,
            None => v,
        };
        values.push((hf_name, v));
    }
    Ok(values)
}

/// The values of one tensor of row-major `shape`: its rows dequantized (or, for F16 / BF16
/// stored as the same `half`, copied bit for bit) into their Hugging Face places (rows
/// unpermuted in `heads` heads when given), as f32 or rounded to `half`. With `as_stored`, a
/// block-quantized tensor keeps its blocks (its rows moved whole) and an F16 / BF16 one its
/// bits.
#[allow(clippy::too_many_arguments)]
fn tensor_values(
    file: &GgufFile,
    info: &GgufTensorInfo,
    shape: &[usize],
    heads: Option<usize>,
    half: Option<HalfDtype>,
    as_stored: bool,
    bytes: &mut Vec<u8>,
) -> Result<ParamValues> {
    file.read_tensor_bytes(info, bytes)?;
    let cols = shape.last().copied().unwrap_or(1);
    let rows = shape[..shape.len().saturating_sub(1)]
        .iter()
        .product::<usize>();
    let row_bytes = bytes.len().checked_div(rows).unwrap_or(0);
    let dest = |r: usize| heads.map_or(r, |h| hf_row(r, rows, h));
    let format = QuantFormat::from_ggml(info.ggml_type);
    if let (true, Some(format), true) = (as_stored, format, shape.len() == 2) {
        let mut kept: Vec<u8> = Vec::new();
        kept.try_reserve_exact(bytes.len())
            .map_err(|_| state_err(file.path(), format!("cannot allocate tensor {}", info.name)))?;
        kept.resize(bytes.len(), 0);
        for r in 0..rows {
            kept[dest(r) * row_bytes..(dest(r) + 1) * row_bytes]
                .copy_from_slice(&bytes[r * row_bytes..(r + 1) * row_bytes]);
        }
        return Ok(ParamValues::Quantized(format, kept, rows * cols));
    }
    let half = match (as_stored, info.ggml_type) {
        (true, GgmlType::F16) => Some(HalfDtype::Float16),
        (true, GgmlType::BF16) => Some(HalfDtype::BFloat16),
        _ => half,
    };
    let same_bits = matches!(
        (half, info.ggml_type),
        (Some(HalfDtype::Float16), GgmlType::F16) | (Some(HalfDtype::BFloat16), GgmlType::BF16)
    );
    if let (true, Some(h)) = (same_bits, half) {
        let mut bits: Vec<u16> = Vec::new();
        bits.try_reserve_exact(rows * cols)
            .map_err(|_| state_err(file.path(), format!("cannot allocate tensor {}", info.name)))?;
        bits.resize(rows * cols, 0);
        for r in 0..rows {
            let src = &bytes[r * row_bytes..(r + 1) * row_bytes];
            let dst = &mut bits[dest(r) * cols..(dest(r) + 1) * cols];
            for (d, b) in dst.iter_mut().zip(src.chunks_exact(2)) {
                *d = u16::from_le_bytes([b[0], b[1]]);
            }
        }
        return Ok(ParamValues::Half(h, bits));
    }
    let mut values = file.f32_buffer(info)?;
    for r in 0..rows {
        let src = &bytes[r * row_bytes..(r + 1) * row_bytes];
        let dst = &mut values[dest(r) * cols..(dest(r) + 1) * cols];
        dequantize(info.ggml_type, src, dst)
            .map_err(|e| state_err(file.path(), format!("GGUF: tensor {}: {e}", info.name)))?;
    }
    let Some(h) = half else {
        return Ok(ParamValues::F32(values));
    };
    let mut bits: Vec<u16> = Vec::new();
    bits.try_reserve_exact(values.len())
        .map_err(|_| state_err(file.path(), format!("cannot allocate tensor {}", info.name)))?;
    bits.extend(values.iter().map(|&x| h.from_f32(x)));
    if let Some(i) = riftco_tensor::tensor::first_overflow(&values, &bits, h) {
        return Err(state_err(
            file.path(),
            format!(
                "tensor {} element {i} = {} is beyond the range of {} (it would become \
                 infinite): load it as float32 or bfloat16",
                info.name,
                values[i],
                h.name()
            ),
        ));
    }
    Ok(ParamValues::Half(h, bits))
}

/// Loads the `llama` GGUF file `path` as a model whose base weights are f32 (`half` `None`) or
/// frozen 16-bit ones (see [`crate::state::load_model_as`]).
///
/// # Errors
/// As [`GgufFile::open`], [`config_from_gguf`] and [`load_llama_values`]; a policy that does not
/// fit the config.
pub(crate) fn load_llama(
    path: &Path,
    attention: FullSequenceAttentionKind,
    checkpointing: impl Into<ActivationCheckpointing>,
    half: Option<HalfDtype>,
    as_stored: bool,
    quantize: Option<QuantFormat>,
) -> Result<DecoderOnlyTransformer> {
    let file = GgufFile::open(path)?;
    let config = config_from_gguf(&file)?;
    let values = load_llama_values(&file, &config, half, as_stored, quantize)?;
    DecoderOnlyTransformer::from_parameter_values(config, attention, checkpointing, values)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `LlamaModel.permute` of llama.cpp's converter on row indices:
    /// `w.reshape(n_head, 2, d/2, ...).swapaxes(1, 2).reshape(w.shape)`.
    fn converter_permute(rows: usize, n_head: usize) -> Vec<usize> {
        let d = rows / n_head;
        let mut out = Vec::new();
        for h in 0..n_head {
            for i in 0..d / 2 {
                for j in 0..2 {
                    out.push(h * d + j * (d / 2) + i);
                }
            }
        }
        out
    }

    #[test]
    fn hf_row_undoes_the_converter_permutation() {
        for (rows, heads) in [(8, 1), (8, 2), (576, 9), (192, 3), (12, 3)] {
            let permuted = converter_permute(rows, heads);
            for (r, &hf) in permuted.iter().enumerate() {
                assert_eq!(
                    hf_row(r, rows, heads),
                    hf,
                    "rows {rows} heads {heads} row {r}"
                );
            }
        }
    }

    #[test]
    fn gguf_names_cover_every_parameter_once() {
        let names: BTreeSet<String> = layout::entries(2).map(|e| gguf_name(e.place)).collect();
        assert_eq!(names.len(), layout::entries(2).count());
        assert!(names.contains("blk.1.attn_output.weight"));
        assert!(names.contains("token_embd.weight"));
    }
}
