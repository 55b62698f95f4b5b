//! The WGSL sources (the top-level `shaders/` folder, one file per kernel family, compiled into
//! the crate with `include_str!`) and the per-context cache of compute pipelines: each
//! shader module and each pipeline is compiled once per [`crate::GpuContext`], on first use.
//!
//! WGSL has no `#include`: code shared by several families lives in a [`Library`] file (no
//! bindings, no entry points) that [`Family::source`] prepends to the family's own file.

use std::collections::HashMap;
use std::sync::Mutex;

/// A WGSL file of `shaders/`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Family {
    /// `shaders/elementwise.wgsl`: add, mul, scale.
    Elementwise,
    /// `shaders/unary.wgsl`: the maps of `UnaryOp`.
    Unary,
    /// `shaders/reduce.wgsl`: deterministic row sums.
    Reduce,
    /// `shaders/softmax.wgsl`: row softmax.
    Softmax,
    /// `shaders/matmul.wgsl`: tiled (batched, transposable) matmul.
    Matmul,
    /// `shaders/activation.wgsl`: SiLU, SwiGLU and their VJPs.
    Activation,
    /// `shaders/rms_norm.wgsl`: RMSNorm and its VJP.
    RmsNorm,
    /// `shaders/rope.wgsl`: rotary position embedding.
    Rope,
    /// `shaders/masked_softmax.wgsl`: causal softmax and the softmax VJP.
    MaskedSoftmax,
    /// `shaders/embedding.wgsl`: embedding gather and its deterministic VJP.
    Embedding,
    /// `shaders/loss.wgsl`: softmax cross-entropy and its VJP.
    Loss,
    /// `shaders/adam.wgsl`: Adam/AdamW updates.
    Adam,
    /// `shaders/flash_attention.wgsl`: FlashAttention-2 forward and backward (GQA).
    FlashAttention,
    /// `shaders/dropout.wgsl`: Philox4x32-10 and dropout masks.
    Dropout,
    /// `shaders/strided.wgsl`: fill, add_assign/axpy, broadcasting binary, keepdims reduce,
    /// strided gather/scatter (the GPU backend's index-mapping kernels).
    Strided,
    /// `shaders/dequantize.wgsl`: dequantization of quantized frozen weights (the GGML block
    /// formats and NF4) and their fused mat-vec product.
    Dequantize,
}

impl Family {
    /// Every family, in file order.
    pub const ALL: [Family; 16] = [
        Family::Elementwise,
        Family::Unary,
        Family::Reduce,
        Family::Softmax,
        Family::Matmul,
        Family::Activation,
        Family::RmsNorm,
        Family::Rope,
        Family::MaskedSoftmax,
        Family::Embedding,
        Family::Loss,
        Family::Adam,
        Family::FlashAttention,
        Family::Dropout,
        Family::Strided,
        Family::Dequantize,
    ];

    /// The file name under `shaders/`.
    pub fn file_name(self) -> &'static str {
        match self {
            Family::Elementwise => "elementwise.wgsl",
            Family::Unary => "unary.wgsl",
            Family::Reduce => "reduce.wgsl",
            Family::Softmax => "softmax.wgsl",
            Family::Matmul => "matmul.wgsl",
            Family::Activation => "activation.wgsl",
            Family::RmsNorm => "rms_norm.wgsl",
            Family::Rope => "rope.wgsl",
            Family::MaskedSoftmax => "masked_softmax.wgsl",
            Family::Embedding => "embedding.wgsl",
            Family::Loss => "loss.wgsl",
            Family::Adam => "adam.wgsl",
            Family::FlashAttention => "flash_attention.wgsl",
            Family::Dropout => "dropout.wgsl",
            Family::Strided => "strided.wgsl",
            Family::Dequantize => "dequantize.wgsl",
        }
    }

    /// The libraries prepended to this family's file, in order.
    pub fn libraries(self) -> &'static [Library] {
        match self {
            Family::FlashAttention | Family::Dropout => &[Library::Philox],
            _ => &[],
        }
    }

    /// The WGSL source that is compiled: the [`Family::libraries`] then the family's file
    /// ([`Family::file_source`]), each ending with a newline.
    pub fn source(self) -> String {
        let mut source = String::new();
        for text in self
            .libraries()
            .iter()
            .map(|l| l.source())
            .chain([self.file_source()])
        {
            source.push_str(text);
            if !text.ends_with('\n') {
                source.push('\n');
            }
        }
        source
    }

    /// The family's own file under `shaders/`, as on disk.
    pub fn file_source(self) -> &'static str {
        match self {
            Family::Elementwise => include_str!("../../../shaders/elementwise.wgsl"),
            Family::Unary => include_str!("../../../shaders/unary.wgsl"),
            Family::Reduce => include_str!("../../../shaders/reduce.wgsl"),
            Family::Softmax => include_str!("../../../shaders/softmax.wgsl"),
            Family::Matmul => include_str!("../../../shaders/matmul.wgsl"),
            Family::Activation => include_str!("../../../shaders/activation.wgsl"),
            Family::RmsNorm => include_str!("../../../shaders/rms_norm.wgsl"),
            Family::Rope => include_str!("../../../shaders/rope.wgsl"),
            Family::MaskedSoftmax => include_str!("../../../shaders/masked_softmax.wgsl"),
            Family::Embedding => include_str!("../../../shaders/embedding.wgsl"),
            Family::Loss => include_str!("../../../shaders/loss.wgsl"),
            Family::Adam => include_str!("../../../shaders/adam.wgsl"),
            Family::FlashAttention => include_str!("../../../shaders/flash_attention.wgsl"),
            Family::Dropout => include_str!("../../../shaders/dropout.wgsl"),
            Family::Strided => include_str!("../../../shaders/strided.wgsl"),
            Family::Dequantize => include_str!("../../../shaders/dequantize.wgsl"),
        }
    }
}

/// A WGSL file of `shaders/` that holds only functions and constants shared by several
/// families (no bindings, no entry points); see [`Family::libraries`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Library {
    /// `shaders/philox.wgsl`: the Philox4x32-10 rounds (dropout and flash attention).
    Philox,
}

impl Library {
    /// Every library.
    pub const ALL: [Library; 1] = [Library::Philox];

    /// The file name under `shaders/`.
    pub fn file_name(self) -> &'static str {
        match self {
            Library::Philox => "philox.wgsl",
        }
    }

    /// The WGSL source, as on disk.
    pub fn source(self) -> &'static str {
        match self {
            Library::Philox => include_str!("../../../shaders/philox.wgsl"),
        }
    }
}

/// One compute entry point: a family and the function name in it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Kernel {
    /// The file.
    pub family: Family,
    /// The `@compute` function.
    pub entry: &'static str,
}

impl Kernel {
    pub(crate) const fn new(family: Family, entry: &'static str) -> Self {
        Self { family, entry }
    }
}

/// Compiled modules and pipelines of one device.
#[derive(Default)]
pub(crate) struct PipelineCache {
    modules: Mutex<HashMap<Family, wgpu::ShaderModule>>,
    pipelines: Mutex<HashMap<Kernel, wgpu::ComputePipeline>>,
}

impl PipelineCache {
    pub(crate) fn len(&self) -> usize {
        self.pipelines.lock().map(|p| p.len()).unwrap_or(0)
    }

    /// The pipeline of `kernel`, compiled on first use (layout derived from the shader).
    /// Errors surface through the caller's error scope.
    pub(crate) fn get(&self, device: &wgpu::Device, kernel: Kernel) -> wgpu::ComputePipeline {
        let mut pipelines = self.pipelines.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(p) = pipelines.get(&kernel) {
            return p.clone();
        }
        let mut modules = self.modules.lock().unwrap_or_else(|e| e.into_inner());
        let module = modules
            .entry(kernel.family)
            .or_insert_with(|| {
                device.create_shader_module(wgpu::ShaderModuleDescriptor {
                    label: Some(kernel.family.file_name()),
                    source: wgpu::ShaderSource::Wgsl(kernel.family.source().into()),
                })
            })
            .clone();
        let pipeline = device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
            label: Some(kernel.entry),
            layout: None,
            module: &module,
            entry_point: Some(kernel.entry),
            compilation_options: Default::default(),
            cache: None,
        });
        pipelines.insert(kernel, pipeline.clone());
        pipeline
    }
}
