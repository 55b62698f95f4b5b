//! Quantized frozen weights on the GPU (`shaders/dequantize.wgsl`) against
//! `riftco_kernels::quant`: for every format, random blocks with finite scales (subnormal
//! f16 scales included; NF4 with more than one group of 256 blocks), several ranges of whole
//! blocks (storage not a multiple of 4 bytes, blocks starting anywhere in a word), the GPU's
//! values bitwise the CPU's `dequantize_range`; every finite f16 scale widened exactly; the
//! fused mat-vec product within the summation bound of the CPU's; gathered rows and blocks of
//! columns bitwise the CPU's values; bad input as errors.

mod common;

use common::checks::assert_shape_error;
use common::{gpu_or_skip, values};
use riftco_gpu::kernels::{self, GpuQuantized};
use riftco_gpu::pipelines::Family;
use riftco_gpu::GpuContext;
use riftco_kernels::quant::{dequantize_range, matvec, QuantFormat};

/// xorshift64 bytes (deterministic, no external crate).
fn random_bytes(n: usize, seed: u64) -> Vec<u8> {
    let mut s = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 24) as u8
        })
        .collect()
}

/// Byte offsets of the f16 scales in one block of a GGML format, and the block's bytes.
fn f16_fields(format: QuantFormat) -> (&'static [usize], usize) {
    match format {
        QuantFormat::Q4_0 => (&[0], 18),
        QuantFormat::Q4_1 => (&[0, 2], 20),
        QuantFormat::Q5_0 => (&[0], 22),
        QuantFormat::Q5_1 => (&[0, 2], 24),
        QuantFormat::Q8_0 => (&[0], 34),
        QuantFormat::Q2_K => (&[80, 82], 84),
        QuantFormat::Q3_K => (&[108], 110),
        QuantFormat::Q4_K => (&[0, 2], 144),
        QuantFormat::Q5_K => (&[0, 2], 176),
        QuantFormat::Q6_K => (&[208], 210),
        QuantFormat::Nf4 => unreachable!("NF4 has no f16 fields"),
    }
}

/// Storage of `numel` elements of `format`: random quants, finite scales. Every third f16
/// scale is subnormal (exponent field 0), one is ±65504 (the largest f16), the rest random
/// finite; NF4's group scales and offset are positive f32 of the size its absmaxes have.
fn random_storage(format: QuantFormat, numel: usize, seed: u64) -> Vec<u8> {
    let bytes = format.storage_bytes(numel).expect("whole blocks");
    let mut data = random_bytes(bytes, seed);
    if format == QuantFormat::Nf4 {
        let blocks = numel / QuantFormat::NF4_BLOCK;
        let groups = blocks.div_ceil(QuantFormat::NF4_GROUP);
        let scales = values(groups + 1, seed as u32, 0.001, 1.0);
        let at = numel / 2 + blocks;
        for (g, s) in scales.iter().enumerate() {
            data[at + 4 * g..at + 4 * g + 4].copy_from_slice(&s.to_le_bytes());
        }
        return data;
    }
    let (fields, block_bytes) = f16_fields(format);
    for (b, block) in data.chunks_exact_mut(block_bytes).enumerate() {
        for (k, &at) in fields.iter().enumerate() {
            let mut h = u16::from_le_bytes([block[at], block[at + 1]]);
            if (h >> 10) & 0x1f == 0x1f {
                h &= !0x4000; // an infinity or NaN exponent made finite
            }
            match (b + k) % 3 {
                0 => h &= 0x83ff, // subnormal (or zero)
                _ if b == 1 => h = 0x7bff | (h & 0x8000),
                _ => {}
            }
            block[at..at + 2].copy_from_slice(&h.to_le_bytes());
        }
    }
    data
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// The GPU's elements `start .. start + len` against the CPU's, bit for bit.
fn check_range(
    ctx: &GpuContext,
    q: &GpuQuantized,
    data: &[u8],
    start: usize,
    len: usize,
    what: &str,
) {
    let mut want = vec![0.0f32; len];
    dequantize_range(q.format(), data, q.numel(), start, &mut want).unwrap();
    let got = ctx
        .download(&kernels::dequantize(ctx, q, start, len).unwrap())
        .unwrap();
    let mismatch = bits(&got)
        .iter()
        .zip(bits(&want))
        .position(|(g, w)| *g != w);
    if let Some(i) = mismatch {
        panic!(
            "{what} elements {start}..{}: element {} gpu {} ({:#010x}) vs cpu {} ({:#010x})",
            start + len,
            start + i,
            got[i],
            got[i].to_bits(),
            want[i],
            want[i].to_bits()
        );
    }
    assert_eq!(got.len(), len, "{what}");
}

#[test]
fn every_format_dequantizes_bitwise_as_the_cpu() {
    let Some(ctx) = gpu_or_skip("every_format_dequantizes_bitwise_as_the_cpu") else {
        return;
    };
    for (seed, format) in QuantFormat::ALL.into_iter().enumerate() {
        let block = format.block_elements();
        // 5 rows of 3 blocks: 15 blocks, so most formats' storage is not whole words.
        let (rows, cols) = (5, 3 * block);
        let numel = rows * cols;
        let data = random_storage(format, numel, 17 + seed as u64);
        let live = ctx.memory().live_bytes;
        let q = GpuQuantized::upload(&ctx, format, &data, numel).unwrap();
        assert_eq!(q.storage_bytes(), data.len());
        // Allocated at its own size: the bytes padded to words, NF4's 272 words of tables.
        let tables = if format == QuantFormat::Nf4 {
            4 * 272
        } else {
            0
        };
        let want = (data.len().div_ceil(4) * 4 + tables) as u64;
        assert_eq!(q.allocated_bytes(), want, "{format}: allocated bytes");
        assert_eq!(ctx.memory().live_bytes - live, want, "{format}: live bytes");
        let what = format.name();
        for (start, len) in [
            (0, numel),
            (cols, cols),
            (0, block),
            (block, block),
            (numel - block, block),
            (3 * block, 5 * block),
            (2 * cols, 3 * cols),
            (7 * block, 0),
        ] {
            check_range(&ctx, &q, &data, start, len, what);
        }
        // A workspace reused across row blocks.
        let out = ctx.alloc(2 * cols).unwrap();
        for r0 in [0, 2] {
            kernels::dequantize_into(&ctx, &q, r0 * cols, &out).unwrap();
            let mut want = vec![0.0f32; 2 * cols];
            dequantize_range(format, &data, numel, r0 * cols, &mut want).unwrap();
            assert_eq!(
                bits(&ctx.download(&out).unwrap()),
                bits(&want),
                "{what} dequantize_into rows {r0}.."
            );
        }
    }
}

#[test]
fn gathered_rows_and_column_blocks_are_bitwise_the_cpu() {
    let Some(ctx) = gpu_or_skip("gathered_rows_and_column_blocks_are_bitwise_the_cpu") else {
        return;
    };
    for (seed, format) in QuantFormat::ALL.into_iter().enumerate() {
        let block = format.block_elements();
        let (rows, cols) = (5, 3 * block);
        let numel = rows * cols;
        let data = random_storage(format, numel, 31 + seed as u64);
        let q = GpuQuantized::upload(&ctx, format, &data, numel).unwrap();
        let mut all = vec![0.0f32; numel];
        dequantize_range(format, &data, numel, 0, &mut all).unwrap();
        // Whole rows in any order, repeats included (an embedding lookup); a block of
        // columns of every row (the workspace of dY · W); one column block of some rows.
        for (list, first, width) in [
            (vec![4u32, 0, 4, 2], 0, cols),
            ((0..rows as u32).collect(), block, 2 * block),
            (vec![3, 1], 2 * block, block),
            (vec![], 0, cols),
        ] {
            let got = kernels::gather_rows(&ctx, &q, cols, &list, first, width).unwrap();
            let want: Vec<f32> = list
                .iter()
                .flat_map(|&r| {
                    let at = r as usize * cols + first;
                    all[at..at + width].iter().copied()
                })
                .collect();
            assert_eq!(
                bits(&ctx.download(&got).unwrap()),
                bits(&want),
                "{format}: rows {list:?}, columns {first}..{}",
                first + width
            );
        }
        let bad = |list: &[u32], first: usize, width: usize| {
            kernels::gather_rows(&ctx, &q, cols, list, first, width)
        };
        assert_shape_error(
            "row out of range",
            bad(&[0, 5], 0, cols),
            &["rows[1] = 5", "< 5"],
        );
        assert_shape_error("width 0", bad(&[0], 0, 0), &["width = 0"]);
        assert_shape_error(
            "first not whole blocks",
            bad(&[0], block / 2, block),
            &["whole blocks"],
        );
        assert_shape_error(
            "past the row",
            bad(&[0], 2 * block, 2 * block),
            &["inside a row"],
        );
    }
}

#[test]
fn nf4_reads_every_group_of_its_double_quantization() {
    let Some(ctx) = gpu_or_skip("nf4_reads_every_group_of_its_double_quantization") else {
        return;
    };
    // 600 blocks of 64: three groups of 256 blocks, the last one partial.
    let (rows, cols) = (100, 384);
    let numel = rows * cols;
    let data = random_storage(QuantFormat::Nf4, numel, 5);
    let q = GpuQuantized::upload(&ctx, QuantFormat::Nf4, &data, numel).unwrap();
    for (start, len) in [(0, numel), (255 * 64, 2 * 64), (512 * 64, 88 * 64)] {
        check_range(&ctx, &q, &data, start, len, "nf4");
    }
}

#[test]
fn every_finite_f16_scale_is_widened_exactly() {
    let Some(ctx) = gpu_or_skip("every_finite_f16_scale_is_widened_exactly") else {
        return;
    };
    // One Q8_0 block per finite f16 bit pattern (subnormals and both zeros included), its
    // quants -128..=127 in turn: the values are d · q, exact in f32.
    let scales: Vec<u16> = (0..=u16::MAX)
        .filter(|h| (h >> 10) & 0x1f != 0x1f)
        .collect();
    let mut data = Vec::with_capacity(34 * scales.len());
    for (b, h) in scales.iter().enumerate() {
        data.extend_from_slice(&h.to_le_bytes());
        data.extend((0..32).map(|j| (b * 32 + j) as u8));
    }
    let numel = 32 * scales.len();
    let q = GpuQuantized::upload(&ctx, QuantFormat::Q8_0, &data, numel).unwrap();
    check_range(
        &ctx,
        &q,
        &data,
        0,
        numel,
        "q8_0 over every finite f16 scale",
    );
}

/// `2 γ_cols Σ_c |W[r, c] x[c]|`: two sums of the same products in different orders are each
/// within `γ_cols Σ |w x|` of the exact sum (`γ_n = n u / (1 − n u)`, `u = 2⁻²⁴`).
fn matvec_bounds(w: &[f32], x: &[f32]) -> Vec<f64> {
    let cols = x.len();
    let u = f64::from(f32::EPSILON) / 2.0;
    let gamma = cols as f64 * u / (1.0 - cols as f64 * u);
    w.chunks_exact(cols)
        .map(|row| {
            let abs: f64 = row
                .iter()
                .zip(x)
                .map(|(&w, &x)| (f64::from(w) * f64::from(x)).abs())
                .sum();
            2.0 * gamma * abs
        })
        .collect()
}

#[test]
fn quantized_matvec_is_within_the_summation_bound_of_the_cpu() {
    let Some(ctx) = gpu_or_skip("quantized_matvec_is_within_the_summation_bound_of_the_cpu") else {
        return;
    };
    for (seed, format) in QuantFormat::ALL.into_iter().enumerate() {
        let block = format.block_elements();
        for (rows, cols) in [(1, block), (7, 3 * block), (3, 9 * block)] {
            let numel = rows * cols;
            let data = random_storage(format, numel, 40 + seed as u64);
            let x = values(cols, 7 + seed as u32, -1.0, 1.0);
            let mut want = vec![0.0f32; rows];
            matvec(format, &data, &x, &mut want).unwrap();
            let mut w = vec![0.0f32; numel];
            dequantize_range(format, &data, numel, 0, &mut w).unwrap();
            let bounds = matvec_bounds(&w, &x);

            let q = GpuQuantized::upload(&ctx, format, &data, numel).unwrap();
            let gx = ctx.upload(&x).unwrap();
            let first = kernels::quantized_matvec(&ctx, &q, &gx).unwrap();
            let second = kernels::quantized_matvec(&ctx, &q, &gx).unwrap();
            let got = ctx.download(&first).unwrap();
            assert_eq!(
                bits(&got),
                bits(&ctx.download(&second).unwrap()),
                "{format} {rows}x{cols}: two runs differ"
            );
            for r in 0..rows {
                let diff = (f64::from(got[r]) - f64::from(want[r])).abs();
                assert!(
                    diff <= bounds[r],
                    "{format} {rows}x{cols} row {r}: gpu {} vs cpu {} (|diff| {diff} > {})",
                    got[r],
                    want[r],
                    bounds[r]
                );
            }
        }
    }
}

#[test]
fn quantized_matvec_spreads_more_than_65535_rows_over_the_grid() {
    let Some(ctx) = gpu_or_skip("quantized_matvec_spreads_more_than_65535_rows_over_the_grid")
    else {
        return;
    };
    // One workgroup per row: rows past 65535 go to the grid's second dimension.
    let (rows, cols) = (65_537, 32);
    let format = QuantFormat::Q4_0;
    let data = random_storage(format, rows * cols, 9);
    let x = values(cols, 4, -1.0, 1.0);
    let mut want = vec![0.0f32; rows];
    matvec(format, &data, &x, &mut want).unwrap();
    let mut w = vec![0.0f32; rows * cols];
    dequantize_range(format, &data, rows * cols, 0, &mut w).unwrap();
    let bounds = matvec_bounds(&w, &x);
    let q = GpuQuantized::upload(&ctx, format, &data, rows * cols).unwrap();
    let gx = ctx.upload(&x).unwrap();
    let got = ctx
        .download(&kernels::quantized_matvec(&ctx, &q, &gx).unwrap())
        .unwrap();
    for r in [0, 1, 65_534, 65_535, 65_536] {
        let diff = (f64::from(got[r]) - f64::from(want[r])).abs();
        assert!(
            diff <= bounds[r],
            "row {r}: gpu {} vs cpu {} (bound {})",
            got[r],
            want[r],
            bounds[r]
        );
    }
    let off = (0..rows).find(|&r| (f64::from(got[r]) - f64::from(want[r])).abs() > bounds[r]);
    assert_eq!(off, None, "a row outside its bound");
}

#[test]
fn bad_ranges_and_storage_are_errors_naming_the_values() {
    let Some(ctx) = gpu_or_skip("bad_ranges_and_storage_are_errors_naming_the_values") else {
        return;
    };
    let f = QuantFormat::Q4_0;
    let data = random_storage(f, 128, 3);
    assert_shape_error(
        "storage one byte short",
        GpuQuantized::upload(&ctx, f, &data[..71], 128),
        &["71 bytes", "128 elements", "q4_0", "expected 72 bytes"],
    );
    assert_shape_error(
        "numel not whole blocks",
        GpuQuantized::upload(&ctx, f, &data, 100),
        &["numel = 100", "32 elements"],
    );
    let q = GpuQuantized::upload(&ctx, f, &data, 128).unwrap();
    assert_shape_error(
        "start inside a block",
        kernels::dequantize(&ctx, &q, 16, 32),
        &["elements 16..48", "128 elements", "blocks of 32"],
    );
    assert_shape_error(
        "range past the end",
        kernels::dequantize(&ctx, &q, 96, 64),
        &["elements 96..160"],
    );
    assert_shape_error(
        "range length not whole blocks",
        kernels::dequantize(&ctx, &q, 0, 40),
        &["elements 0..40"],
    );
    let x = ctx.upload(&[0.0; 48]).unwrap();
    assert_shape_error(
        "cols not whole blocks",
        kernels::quantized_matvec(&ctx, &q, &x),
        &["cols = 48", "blocks of 32"],
    );
    let x = ctx.upload(&[0.0; 96]).unwrap();
    assert_shape_error(
        "cols not dividing the tensor",
        kernels::quantized_matvec(&ctx, &q, &x),
        &["cols = 96", "128 elements"],
    );
    let empty = ctx.upload(&[]).unwrap();
    assert_shape_error(
        "empty x",
        kernels::quantized_matvec(&ctx, &q, &empty),
        &["cols (x length) = 0"],
    );
}

#[test]
fn the_shader_defines_the_three_entry_points_of_every_format() {
    // No GPU needed: the entry points the host dispatches exist in the compiled source (which
    // tests/shaders.rs validates and translates to MSL and SPIR-V with the other families).
    let src = Family::Dequantize.source();
    let module = naga::front::wgsl::parse_str(&src).expect("dequantize.wgsl parses");
    let defined: Vec<&str> = module
        .entry_points
        .iter()
        .map(|e| e.name.as_str())
        .collect();
    let listed = kernels::quantized_entry_points();
    assert_eq!(listed.len(), QuantFormat::ALL.len());
    for (format, entries) in listed {
        for entry in entries {
            assert!(defined.contains(&entry), "{format}: {entry}");
        }
    }
    assert_eq!(defined.len(), 3 * QuantFormat::ALL.len(), "{defined:?}");
}
