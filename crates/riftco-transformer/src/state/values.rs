//! Loaded parameter values and the model built around them without initialising weights first
//! (loading holds the model's bytes once).

use crate::checkpointing::ActivationCheckpointing;
use crate::config::TransformerConfig;
use crate::error::Result;
use crate::model::{rope_table, DecoderOnlyTransformer, Weights};
use crate::policy::FullSequenceAttentionKind;
use riftco_autograd::Variable;
use riftco_tensor::{MemoryCategory, Tensor};

/// The elements of one loaded parameter: f32, or 16-bit bits of a frozen weight.
#[derive(Debug)]
pub(crate) enum ParamValues {
    F32(Vec<f32>),
    Half(riftco_tensor::HalfDtype, Vec<u16>),
    /// A frozen matrix kept in a block-quantized format (`numel` elements in `bytes`).
    Quantized(riftco_tensor::QuantFormat, Vec<u8>, usize),
}

impl ParamValues {
    pub(crate) fn len(&self) -> usize {
        match self {
            ParamValues::F32(v) => v.len(),
            ParamValues::Half(_, v) => v.len(),
            ParamValues::Quantized(_, _, n) => *n,
        }
    }

    /// The bits of element `i` (f32 bits, or the 16 bits widened), for comparisons.
    pub(crate) fn bits_at(&self, i: usize) -> Option<u32> {
        match self {
            ParamValues::F32(v) => v.get(i).map(|x| x.to_bits()),
            ParamValues::Half(_, v) => v.get(i).map(|&b| u32::from(b)),
            ParamValues::Quantized(..) => None,
        }
    }

    /// Element `i` as f32, for messages.
    pub(crate) fn value_at(&self, i: usize) -> f32 {
        match self {
            ParamValues::F32(v) => v.get(i).copied().unwrap_or(f32::NAN),
            ParamValues::Half(d, v) => v.get(i).map_or(f32::NAN, |&b| d.to_f32(b)),
            ParamValues::Quantized(..) => f32::NAN,
        }
    }
}

/// `values` of tensor `name` (row-major `shape`) quantized to `format` when it is a matrix (the
/// RMSNorm gains stay float32), so a quantized load holds one tensor in f32 at a time.
///
/// # Errors
/// [`crate::TransformerError::Config`] (field `dtype`) naming the tensor when its rows are not
/// whole blocks of the format; [`crate::TransformerError::State`] for a value that is not
/// finite.
pub(crate) fn quantize_param(
    path: &std::path::Path,
    name: &str,
    shape: &[usize],
    format: riftco_tensor::QuantFormat,
    values: ParamValues,
) -> crate::error::Result<ParamValues> {
    let ParamValues::F32(v) = values else {
        return Ok(values);
    };
    if shape.len() != 2 {
        return Ok(ParamValues::F32(v));
    }
    if let Some(reason) = crate::frozen_dtype::not_whole_blocks(name, shape, format) {
        return Err(crate::TransformerError::Config {
            field: "dtype",
            value: format!("{:?}", format.name()),
            reason,
        });
    }
    let bytes = riftco_kernels::quant::quantize(format, &v)
        .map_err(|e| super::state_err(path, format!("tensor {name}: {e}")))?;
    Ok(ParamValues::Quantized(format, bytes, v.len()))
}

/// Weights of a validated `config` whose tensors take ownership of `values` (Hugging Face name
/// → elements, one per base parameter of [`layout::entries_for`]): nothing is initialised or
/// copied, so loading holds the model's bytes once. 16-bit values become frozen leaves
/// (`requires_grad = false`: trainable weights are f32).
///
/// # Errors
/// `TensorError::LengthMismatch` for a missing name or a length that is not the entry's shape
/// (callers validate both against the file's header first); `TensorError::OutOfMemory` for the
/// RoPE table.
pub(crate) fn weights_from_values(
    config: &TransformerConfig,
    values: Vec<(String, ParamValues)>,
) -> Result<Weights> {
    // A base holding any compressed (16-bit or quantized) weight is frozen whole.
    let compressed = values
        .iter()
        .any(|(_, v)| !matches!(v, ParamValues::F32(_)));
    let mut by_name: std::collections::HashMap<String, ParamValues> = values.into_iter().collect();
    Weights::try_from_entries(config, rope_table(config)?, |e| {
        let name = e.hf_name();
        let shape = e.shape(config);
        let (tensor, trainable) = match by_name.remove(&name) {
            Some(ParamValues::Half(dtype, bits)) => (
                Tensor::from_half_bits(dtype, bits, shape, MemoryCategory::Parameter)?,
                false,
            ),
            Some(ParamValues::Quantized(format, bytes, _)) => (
                Tensor::from_quantized_bytes(format, bytes, shape, MemoryCategory::Parameter)?,
                false,
            ),
            Some(ParamValues::F32(data)) => (
                Tensor::from_vec(data, shape, MemoryCategory::Parameter)?,
                !compressed,
            ),
            None => (
                Tensor::from_vec(Vec::new(), shape, MemoryCategory::Parameter)?,
                true,
            ),
        };
        Ok(Variable::named_leaf(tensor, trainable, name))
    })
}

impl DecoderOnlyTransformer {
    /// A model whose parameters take ownership of `values` (see [`weights_from_values`]):
    /// [`DecoderOnlyTransformer::new`] without initialising weights that loading would
    /// overwrite.
    ///
    /// # Errors
    /// As [`DecoderOnlyTransformer::new`]; a missing value or one of the wrong length.
    pub(crate) fn from_parameter_values(
        config: TransformerConfig,
        attention: FullSequenceAttentionKind,
        checkpointing: impl Into<ActivationCheckpointing>,
        values: Vec<(String, ParamValues)>,
    ) -> Result<Self> {
        config.validate()?;
        let checkpointing = checkpointing.into();
        checkpointing.validate(config.n_layers)?;
        Ok(Self::from_weights(
            weights_from_values(&config, values)?,
            attention,
            checkpointing,
        ))
    }
}
