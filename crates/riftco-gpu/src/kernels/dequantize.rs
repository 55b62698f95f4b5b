//! Quantized frozen weights on the GPU (`shaders/dequantize.wgsl`): a tensor kept in one of
//! the block formats of [`QuantFormat`] (the GGML formats Q4_0 ... Q6_K, laid out as in GGUF
//! files, and QLoRA's NF4 with double-quantized absmax, Dettmers et al. 2023), uploaded as its
//! storage bytes ([`GpuQuantized`]), dequantized a range of whole blocks at a time into an f32
//! buffer ([`dequantize`], [`dequantize_into`]) or multiplied by a vector without a dequantized
//! copy ([`quantized_matvec`], the mat-vec product of decoding).
//!
//! [`dequantize`] is bitwise `riftco_kernels::quant::dequantize_range` of the same bytes
//! (itself bitwise `gguf.quants.dequantize` and bitsandbytes' `dequantize_4bit`) for every block
//! whose f16 / f32 scales are finite, on an adapter that rounds f32 addition and multiplication
//! to nearest-even (Vulkan and Metal devices; tested on Mesa's llvmpipe). The WGSL
//! specification allows subnormal flushing, either rounding of an inexact result and
//! contraction into fused multiply-adds; the shader is written so that neither flushing nor
//! contraction can change a value (f16 widened with integer operations, every GGML product
//! exact, NF4's one inexact product kept from contraction), and a GGML value has one inexact
//! operation, its final addition, as on the CPU. A block with a non-finite scale, which no quantizer writes, gives
//! values WGSL leaves unspecified.
//!
//! A `[rows, cols]` weight is stored row-major with `cols` a whole number of blocks, so rows
//! `r0 .. r1` are elements `r0 · cols .. r1 · cols`: `dequantize(ctx, w, r0 * cols, (r1 - r0) *
//! cols)` is that block of rows as a `[r1 - r0, cols]` f32 buffer.

use riftco_kernels::quant::nf4::{dynamic_map, NF4};
use riftco_kernels::quant::QuantFormat;

use super::shape::{grid_rows, id_bits, ids_below, positive, product, within_loop_limit};
use super::{dispatch_at, expect_len, grid_1d, to_u32, words};
use crate::error::{GpuError, Result};
use crate::pipelines::{Family, Kernel};
use crate::pool::GpuBuffer;
use crate::GpuContext;

/// Threads of one row of [`quantized_matvec`] (`WG_ROW` of the shader).
const MATVEC_THREADS: usize = 64;

/// The shader's entry points of `format`: `(dequantize, gather, matvec)`.
fn entries(format: QuantFormat) -> (&'static str, &'static str, &'static str) {
    match format {
        QuantFormat::Q4_0 => ("dequantize_q4_0", "gather_q4_0", "matvec_q4_0"),
        QuantFormat::Q4_1 => ("dequantize_q4_1", "gather_q4_1", "matvec_q4_1"),
        QuantFormat::Q5_0 => ("dequantize_q5_0", "gather_q5_0", "matvec_q5_0"),
        QuantFormat::Q5_1 => ("dequantize_q5_1", "gather_q5_1", "matvec_q5_1"),
        QuantFormat::Q8_0 => ("dequantize_q8_0", "gather_q8_0", "matvec_q8_0"),
        QuantFormat::Q2_K => ("dequantize_q2_k", "gather_q2_k", "matvec_q2_k"),
        QuantFormat::Q3_K => ("dequantize_q3_k", "gather_q3_k", "matvec_q3_k"),
        QuantFormat::Q4_K => ("dequantize_q4_k", "gather_q4_k", "matvec_q4_k"),
        QuantFormat::Q5_K => ("dequantize_q5_k", "gather_q5_k", "matvec_q5_k"),
        QuantFormat::Q6_K => ("dequantize_q6_k", "gather_q6_k", "matvec_q6_k"),
        QuantFormat::Nf4 => ("dequantize_nf4", "gather_nf4", "matvec_nf4"),
    }
}

/// The compute entry points of the quantized kernels, `[dequantize, gather, matvec]` per
/// format of [`QuantFormat::ALL`], in that order (for tests that check the shader defines
/// them).
pub fn quantized_entry_points() -> Vec<(QuantFormat, [&'static str; 3])> {
    QuantFormat::ALL
        .into_iter()
        .map(|f| {
            let (d, g, m) = entries(f);
            (f, [d, g, m])
        })
        .collect()
}

/// A quantized tensor of `numel` elements on the device: its storage bytes, as
/// `riftco_kernels::quant` keeps them ([`QuantFormat::storage_bytes`] long), padded with zero
/// bytes to whole 4-byte words; for NF4 the 16 code values and the 256 values of the absmax's
/// dynamic map follow as f32 (taken from `riftco_kernels::quant::nf4`, so the GPU reads the
/// CPU's tables). Dropping it returns the buffer to its context's pool.
pub struct GpuQuantized {
    format: QuantFormat,
    numel: usize,
    storage_bytes: usize,
    /// The word where NF4's tables start (the words of the storage bytes; unused otherwise).
    tables_word: u32,
    words: GpuBuffer,
}

impl GpuQuantized {
    /// Uploads `data`, the storage of a `format` tensor of `numel` elements (for a `[rows,
    /// cols]` weight, `numel = rows · cols`, row-major, `cols` whole blocks). The copy is
    /// recorded in the pending command stream; nothing waits for the GPU.
    ///
    /// # Errors
    /// [`GpuError::Shape`] when `numel` is not a whole number of blocks, `data.len()` is not
    /// `format.storage_bytes(numel)` (both named), or the storage exceeds the shaders' 32-bit
    /// byte offsets (4 GiB); [`GpuError::BufferTooLarge`] / out of memory from the allocation.
    pub fn upload(
        ctx: &GpuContext,
        format: QuantFormat,
        data: &[u8],
        numel: usize,
    ) -> Result<Self> {
        let op = "upload_quantized";
        let block = format.block_elements();
        let Some(expected) = format.storage_bytes(numel) else {
            return Err(GpuError::Shape {
                op,
                message: format!(
                    "numel = {numel} is not a whole number of {format} blocks of {block} elements"
                ),
            });
        };
        if data.len() != expected {
            return Err(GpuError::Shape {
                op,
                message: format!(
                    "{} bytes for {numel} elements of {format}, expected {expected} bytes",
                    data.len()
                ),
            });
        }
        // The shader addresses bytes (and reads up to 3 past a field) with u32 offsets.
        to_u32(op, "numel", numel)?;
        to_u32(op, "storage bytes + 4", expected.saturating_add(4))?;
        let data_words = expected.div_ceil(4);
        let mut bytes = Vec::with_capacity(4 * data_words + 4 * 272);
        bytes.extend_from_slice(data);
        bytes.resize(4 * data_words, 0);
        if format == QuantFormat::Nf4 {
            for v in NF4.iter().chain(dynamic_map().iter()) {
                bytes.extend_from_slice(&v.to_le_bytes());
            }
        }
        // Long-lived: allocated at its own size, not a power-of-two size class.
        let words = ctx.alloc_exact(bytes.len() / 4)?;
        ctx.write_bytes(&words, &bytes)?;
        Ok(Self {
            format,
            numel,
            storage_bytes: expected,
            tables_word: to_u32(op, "storage words", data_words)?,
            words,
        })
    }

    /// The format.
    pub fn format(&self) -> QuantFormat {
        self.format
    }

    /// Elements of the tensor.
    pub fn numel(&self) -> usize {
        self.numel
    }

    /// Bytes of the quantized storage (`format.storage_bytes(numel)`).
    pub fn storage_bytes(&self) -> usize {
        self.storage_bytes
    }

    /// Bytes allocated on the device: the storage, its zero padding to whole 4-byte words and
    /// NF4's tables (1088 bytes), at least 16 ([`GpuContext::alloc_exact`]: no size-class
    /// rounding).
    pub fn allocated_bytes(&self) -> u64 {
        self.words.allocated_bytes()
    }

    /// The storage bytes read back from the device, bit for bit those uploaded
    /// (`storage_bytes()` of them; submits the pending work and waits for it).
    ///
    /// # Errors
    /// [`GpuError::ForeignBuffer`] when `self` belongs to another context; read-back errors.
    pub fn download(&self, ctx: &GpuContext) -> Result<Vec<u8>> {
        let mut bytes = ctx.download_bytes(&self.words)?;
        // Without the padding and NF4's tables, and holding no more (a host quantized buffer
        // is accounted by its capacity).
        bytes.truncate(self.storage_bytes);
        bytes.shrink_to_fit();
        Ok(bytes)
    }

    /// The shader parameters (`Params` of `shaders/dequantize.wgsl`).
    fn params(&self, count: u32, first: u32, cols: u32, width: u32) -> Vec<u8> {
        // `numel` was checked to fit in u32 at upload.
        words(&[
            count,
            first,
            self.numel as u32,
            cols,
            self.tables_word,
            0,
            width,
            0,
        ])
    }
}

impl std::fmt::Debug for GpuQuantized {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuQuantized")
            .field("format", &self.format)
            .field("numel", &self.numel)
            .field("storage_bytes", &self.storage_bytes)
            .finish()
    }
}

/// `start .. start + len` must be whole blocks of `q` inside it.
fn check_range(op: &'static str, q: &GpuQuantized, start: usize, len: usize) -> Result<()> {
    let block = q.format.block_elements();
    let inside = start.checked_add(len).is_some_and(|end| end <= q.numel);
    if !inside || start % block != 0 || len % block != 0 {
        return Err(GpuError::Shape {
            op,
            message: format!(
                "elements {start}..{} of a {} tensor of {} elements: expected a range of whole \
                 blocks of {block} elements inside the tensor",
                start.saturating_add(len),
                q.format,
                q.numel
            ),
        });
    }
    Ok(())
}

/// Elements `start .. start + len` of `q` dequantized into a new f32 buffer of `len` values:
/// bitwise `riftco_kernels::quant::dequantize_range(format, data, numel, start, out)` for
/// finite block scales.
///
/// # Errors
/// [`GpuError::Shape`] when `start` or `len` is not a whole number of blocks or the range
/// ends past `q.numel()` (the values named); [`GpuError::ForeignBuffer`] when `q` belongs to
/// another context; device errors.
pub fn dequantize(
    ctx: &GpuContext,
    q: &GpuQuantized,
    start: usize,
    len: usize,
) -> Result<GpuBuffer> {
    check_range("dequantize", q, start, len)?;
    let out = ctx.alloc(len)?;
    dequantize_into(ctx, q, start, &out)?;
    Ok(out)
}

/// As [`dequantize`], into `out` (its `out.len()` values are elements `start .. start +
/// out.len()`): reuses a workspace across the row blocks of a weight.
///
/// # Errors
/// As [`dequantize`], with `len = out.len()`.
pub fn dequantize_into(
    ctx: &GpuContext,
    q: &GpuQuantized,
    start: usize,
    out: &GpuBuffer,
) -> Result<()> {
    let op = "dequantize";
    let len = out.len();
    check_range(op, q, start, len)?;
    ctx.check_owner(op, "the quantized tensor", &q.words)?;
    if len == 0 {
        return Ok(());
    }
    // Inside a tensor of at most u32::MAX elements (checked at upload).
    let params = q.params(len as u32, start as u32, 0, 0);
    let kernel = Kernel::new(Family::Dequantize, entries(q.format).0);
    dispatch_at(
        ctx,
        kernel,
        &[(0, &q.words), (2, out)],
        3,
        &params,
        grid_1d(op, len)?,
    )
}

/// `y[r] = Σ_c W[r, c] · x[c]` for the quantized weight `W = q` viewed as `[rows, cols]`
/// (`cols = x.len()`, `rows = q.numel() / cols`), reading the quantized blocks directly (no
/// dequantized copy): the mat-vec product of decoding. Returns `y`, `[rows]` f32.
///
/// Each `W[r, c]` is the value [`dequantize`] gives; the sum runs over 64 strided partials
/// added in a fixed tree, so `y` is deterministic but not bitwise the CPU's sequential
/// `riftco_kernels::quant::matvec`: both are within `γ_cols · Σ_c |W[r, c] · x[c]|` of the
/// exact sum (`γ_n = n·u / (1 − n·u)`, `u = 2⁻²⁴`; Higham, "Accuracy and Stability of
/// Numerical Algorithms", 2nd ed., §3.1), so they differ by at most twice that.
///
/// # Errors
/// [`GpuError::Shape`] when `x` is empty, `cols` is not whole blocks, `q.numel()` is not a
/// multiple of `cols`, or a row would loop past an adapter's loop limit
/// ([`GpuContext::loop_iteration_limit`]); [`GpuError::ForeignBuffer`]; device errors.
pub fn quantized_matvec(ctx: &GpuContext, q: &GpuQuantized, x: &GpuBuffer) -> Result<GpuBuffer> {
    let op = "quantized_matvec";
    let cols = x.len();
    positive(op, "cols (x length)", cols)?;
    let block = q.format.block_elements();
    if cols % block != 0 || q.numel % cols != 0 {
        return Err(GpuError::Shape {
            op,
            message: format!(
                "a {} tensor of {} elements times x of {cols} values: expected cols = {cols} \
                 to be whole blocks of {block} elements and to divide the tensor into rows",
                q.format, q.numel
            ),
        });
    }
    ctx.check_owner(op, "the quantized tensor", &q.words)?;
    let rows = q.numel / cols;
    expect_len(op, "x", x, cols)?;
    // Each thread walks cols / 64 columns, then the 6 halvings of the tree.
    within_loop_limit(ctx, op, || {
        (
            cols.div_ceil(MATVEC_THREADS) + 7,
            format!("a row of {cols} columns"),
        )
    })?;
    let y = ctx.alloc(rows)?;
    if rows == 0 {
        return Ok(y);
    }
    let params = q.params(rows as u32, 0, cols as u32, 0);
    let kernel = Kernel::new(Family::Dequantize, entries(q.format).2);
    dispatch_at(
        ctx,
        kernel,
        &[(0, &q.words), (1, x), (2, &y)],
        3,
        &params,
        grid_rows(op, rows)?,
    )?;
    Ok(y)
}

/// Columns `first .. first + width` of each row `rows[i]` of `q` viewed as `[numel / cols,
/// cols]`, in list order: a new `[rows.len(), width]` f32 buffer whose values are those
/// [`dequantize`] gives (bitwise `riftco_kernels::quant::dequantize_range`'s). With
/// `first = 0, width = cols` it is an embedding lookup of a quantized table; with the list
/// `0 .. numel / cols` it is a block of whole columns (the workspace of `dY · W`).
///
/// # Errors
/// [`GpuError::Shape`] when `cols` is 0 or not whole blocks, `q.numel()` is not a multiple of
/// `cols`, `first` or `width` is not whole blocks, `width` is 0 or `first + width > cols`, a
/// row is `>= numel / cols` (naming it and its index), or the output exceeds 32-bit indices;
/// [`GpuError::ForeignBuffer`]; device errors.
pub fn gather_rows(
    ctx: &GpuContext,
    q: &GpuQuantized,
    cols: usize,
    rows: &[u32],
    first: usize,
    width: usize,
) -> Result<GpuBuffer> {
    let op = "gather_rows";
    positive(op, "cols", cols)?;
    positive(op, "width", width)?;
    let block = q.format.block_elements();
    let bad_cols = cols % block != 0 || q.numel % cols != 0;
    let bad_range = first % block != 0 || width % block != 0 || first.saturating_add(width) > cols;
    if bad_cols || bad_range {
        return Err(GpuError::Shape {
            op,
            message: format!(
                "columns {first}..{} of rows of {cols} of a {} tensor of {} elements: expected \
                 cols to divide the tensor into rows and columns to be whole blocks of {block} \
                 elements inside a row",
                first.saturating_add(width),
                q.format,
                q.numel
            ),
        });
    }
    ids_below(op, "rows", rows, q.numel / cols)?;
    ctx.check_owner(op, "the quantized tensor", &q.words)?;
    let n = product(op, "rows · width", rows.len(), width)?;
    let count = to_u32(op, "rows · width", n)?;
    let out = ctx.alloc(n)?;
    if n == 0 {
        return Ok(out);
    }
    let list = ctx.upload(&id_bits(rows))?;
    // `first < cols <= numel` and `width <= cols` fit in u32 (checked at upload).
    let params = q.params(count, first as u32, cols as u32, width as u32);
    let kernel = Kernel::new(Family::Dequantize, entries(q.format).1);
    dispatch_at(
        ctx,
        kernel,
        &[(0, &q.words), (4, &list), (2, &out)],
        3,
        &params,
        grid_1d(op, n)?,
    )?;
    Ok(out)
}
