//! The fused quantized mat-vec product (`quant::matvec`) against the f32 mat-vec product applied
//! to the dequantized weight: bitwise equal, for every format, at every SIMD level this machine
//! has, for row counts that exercise the four-row and one-row paths and for products large
//! enough to split over the kernel pool.

use std::sync::Mutex;

use riftco_kernels::quant::{dequantize_range, matvec, GgmlType, QuantError, QuantFormat};
use riftco_kernels::{matmul, simd, MatmulSpec};

/// The SIMD level is process-wide: tests that set it run one at a time.
static LEVEL: Mutex<()> = Mutex::new(());

/// xorshift64 bytes.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next() as u8).collect()
    }
    /// Uniform in [-1, 1).
    fn unit(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }
}

/// Offsets of the f16 scales (and minimums) in a block of each GGML format.
fn f16_fields(t: GgmlType) -> &'static [usize] {
    match t {
        GgmlType::Q4_0 | GgmlType::Q5_0 | GgmlType::Q8_0 => &[0],
        GgmlType::Q4_1 | GgmlType::Q5_1 | GgmlType::Q4_K | GgmlType::Q5_K => &[0, 2],
        GgmlType::Q2_K => &[80, 82],
        GgmlType::Q3_K => &[108],
        GgmlType::Q6_K => &[208],
        other => panic!("no fields for {other}"),
    }
}

/// Random storage of a `[rows, cols]` weight: random codes, finite scales of either sign
/// (some subnormal f16), so every value is finite.
fn weight(format: QuantFormat, rows: usize, cols: usize, rng: &mut Rng) -> Vec<u8> {
    let numel = rows * cols;
    let bytes = format.storage_bytes(numel).unwrap();
    let mut data = rng.bytes(bytes);
    match format.ggml_type() {
        Some(t) => {
            let (_, block_bytes) = t.block_layout();
            for (i, block) in data.chunks_exact_mut(block_bytes).enumerate() {
                for &at in f16_fields(t) {
                    let v = if i % 7 == 3 {
                        // A subnormal f16 (2^-24 .. 2^-14).
                        half::f16::from_bits(1 + (rng.next() % 0x3FF) as u16).to_f32()
                    } else {
                        rng.unit() * 0.05
                    };
                    block[at..at + 2].copy_from_slice(&half::f16::from_f32(v).to_le_bytes());
                }
            }
        }
        None => {
            // NF4: codes and quantized absmax are any bytes; the group scales and the offset
            // are f32.
            let blocks = numel / QuantFormat::NF4_BLOCK;
            let groups = blocks.div_ceil(QuantFormat::NF4_GROUP);
            let at = numel / 2 + blocks;
            for g in 0..groups {
                let scale = 0.5 + rng.unit().abs();
                data[at + 4 * g..at + 4 * g + 4].copy_from_slice(&scale.to_le_bytes());
            }
            let offset = 0.01 + 0.1 * rng.unit().abs();
            data[at + 4 * groups..].copy_from_slice(&offset.to_le_bytes());
        }
    }
    data
}

/// `x · Wᵀ` by the f32 mat-vec product on the dequantized weight.
fn reference(format: QuantFormat, data: &[u8], x: &[f32], rows: usize) -> Vec<f32> {
    let cols = x.len();
    let mut w = vec![0.0f32; rows * cols];
    dequantize_range(format, data, rows * cols, 0, &mut w).unwrap();
    let mut y = vec![0.0f32; rows];
    matmul(MatmulSpec::new(1, cols, rows).trans_b(true), x, &w, &mut y);
    y
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// Column counts: one block to several (a multiple of 32 always).
fn col_counts(format: QuantFormat) -> Vec<usize> {
    let b = format.block_elements();
    vec![b, 2 * b, 3 * b, 5 * b]
}

#[test]
fn fused_products_equal_the_f32_product_of_the_dequantized_weight_at_every_level() {
    let _guard = LEVEL.lock().unwrap_or_else(|e| e.into_inner());
    let mut rng = Rng(0x2545_f491_4f6c_dd1d);
    for level in simd::available_levels() {
        simd::set_simd_level(Some(level));
        simd::set_force_scalar(level == simd::SimdLevel::Scalar);
        assert_eq!(simd::current_level(), level);
        for format in QuantFormat::ALL {
            for cols in col_counts(format) {
                for rows in [1, 3, 4, 5, 9, 33] {
                    let data = weight(format, rows, cols, &mut rng);
                    let x: Vec<f32> = (0..cols).map(|_| rng.unit()).collect();
                    let mut y = vec![f32::NAN; rows];
                    matvec(format, &data, &x, &mut y).unwrap();
                    let want = reference(format, &data, &x, rows);
                    assert!(want.iter().all(|v| v.is_finite()));
                    assert_eq!(
                        bits(&y),
                        bits(&want),
                        "{format} rows {rows} cols {cols} at {level:?}: {y:?} vs {want:?}"
                    );
                }
            }
        }
    }
    simd::set_force_scalar(false);
    simd::set_simd_level(None);
}

#[test]
fn split_products_equal_their_rows_computed_alone() {
    // Large enough (>= 64 Ki elements) to be split over the kernel pool; each row of a GGML
    // weight is its own contiguous storage, so a one-row product on it must give the same bits.
    let _guard = LEVEL.lock().unwrap_or_else(|e| e.into_inner());
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    for level in simd::available_levels() {
        simd::set_simd_level(Some(level));
        simd::set_force_scalar(level == simd::SimdLevel::Scalar);
        for format in QuantFormat::ALL {
            let (rows, cols) = (301, 512);
            let data = weight(format, rows, cols, &mut rng);
            let x: Vec<f32> = (0..cols).map(|_| rng.unit()).collect();
            let mut y = vec![0.0f32; rows];
            matvec(format, &data, &x, &mut y).unwrap();
            assert_eq!(
                bits(&y),
                bits(&reference(format, &data, &x, rows)),
                "{format} at {level:?}"
            );
            let Some(t) = format.ggml_type() else {
                continue;
            };
            let row_bytes = cols / t.block_layout().0 * t.block_layout().1;
            for r in [0, 1, 150, 299, 300] {
                let mut one = [0.0f32];
                let row = &data[r * row_bytes..(r + 1) * row_bytes];
                matvec(format, row, &x, &mut one).unwrap();
                assert_eq!(
                    one[0].to_bits(),
                    y[r].to_bits(),
                    "{format} row {r} at {level:?}"
                );
            }
        }
    }
    simd::set_force_scalar(false);
    simd::set_simd_level(None);
}

#[test]
fn products_are_within_the_dot_product_bound_of_an_f64_sum() {
    // Independent of the f32 path: |ŷ − y| <= γ_k · Σ|w·x| (Higham 2002, eq. 3.5) for the
    // exact sum y of the dequantized weights (which are exact f32 values) times x.
    let mut rng = Rng(0x1234_5678_9abc_def1);
    let u = f64::from(f32::EPSILON) / 2.0;
    for format in QuantFormat::ALL {
        let (rows, cols) = (7, 2 * format.block_elements().max(256));
        let data = weight(format, rows, cols, &mut rng);
        let x: Vec<f32> = (0..cols).map(|_| rng.unit()).collect();
        let mut y = vec![0.0f32; rows];
        matvec(format, &data, &x, &mut y).unwrap();
        let mut w = vec![0.0f32; rows * cols];
        dequantize_range(format, &data, rows * cols, 0, &mut w).unwrap();
        let gamma = cols as f64 * u / (1.0 - cols as f64 * u);
        for (r, &got) in y.iter().enumerate() {
            let row = &w[r * cols..(r + 1) * cols];
            let exact: f64 = row.iter().zip(&x).map(|(&a, &b)| a as f64 * b as f64).sum();
            let abs: f64 = row
                .iter()
                .zip(&x)
                .map(|(&a, &b)| (a as f64 * b as f64).abs())
                .sum();
            assert!(
                (got as f64 - exact).abs() <= gamma * abs,
                "{format} row {r}: {got} vs {exact}"
            );
        }
    }
}

#[test]
fn partial_blocks_and_wrong_lengths_are_refused() {
    for format in QuantFormat::ALL {
        let b = format.block_elements();
        let bytes = format.storage_bytes(3 * b).unwrap();
        let data = vec![0u8; bytes];
        // Columns that are not whole blocks.
        let mut y = vec![0.0f32; 3];
        let err = matvec(format, &data, &vec![1.0; b + 1], &mut y).unwrap_err();
        assert!(matches!(err, QuantError::Range { .. }), "{format}: {err}");
        assert!(
            err.to_string().contains(&format!("blocks of {b} elements")),
            "{err}"
        );
        // Storage one byte short or long.
        let x = vec![1.0f32; b];
        for len in [bytes - 1, bytes + 1] {
            let err = matvec(format, &vec![0u8; len], &x, &mut y).unwrap_err();
            assert!(
                matches!(err, QuantError::Range { bytes, .. } if bytes == len),
                "{format}: {err}"
            );
            assert!(err.to_string().contains(&format!("{len} bytes")), "{err}");
        }
        // Zero rows, zero columns.
        let empty = format.storage_bytes(0).unwrap();
        matvec(format, &vec![0u8; empty], &x, &mut []).unwrap();
        let mut y = vec![f32::NAN; 2];
        matvec(format, &vec![0u8; empty], &[], &mut y).unwrap();
        assert_eq!(y, [0.0, 0.0]);
    }
}

#[test]
fn any_bytes_multiply_without_panicking_and_as_the_f32_product() {
    // Every byte pattern is valid storage (NaN and infinite scales included): the product never
    // panics, and agrees with the f32 product of the dequantized weight (NaN where it is NaN).
    let _guard = LEVEL.lock().unwrap_or_else(|e| e.into_inner());
    simd::set_force_scalar(false);
    simd::set_simd_level(None);
    let mut rng = Rng(0xdead_beef_cafe_f00d);
    for format in QuantFormat::ALL {
        let (rows, cols) = (6, 2 * format.block_elements());
        let data = rng.bytes(format.storage_bytes(rows * cols).unwrap());
        let x: Vec<f32> = (0..cols).map(|_| rng.unit()).collect();
        let mut y = vec![0.0f32; rows];
        matvec(format, &data, &x, &mut y).unwrap();
        let want = reference(format, &data, &x, rows);
        for (r, (&got, &want)) in y.iter().zip(&want).enumerate() {
            assert!(
                got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan()),
                "{format} row {r}: {got} vs {want}"
            );
        }
    }
}

/// The products against a quantized weight dequantize blocks of rows (and of columns) with the
/// fused kernel's in-register dequantization: bitwise the scalar `dequantize_range` at every
/// level, for every format, whole and in ranges.
#[test]
fn blocked_dequantization_equals_the_scalar_one_at_every_level() {
    use riftco_kernels::quant::blocked::QuantMatrix;
    let _guard = LEVEL.lock().unwrap_or_else(|e| e.into_inner());
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    for level in simd::available_levels() {
        simd::set_simd_level(Some(level));
        simd::set_force_scalar(level == simd::SimdLevel::Scalar);
        for format in QuantFormat::ALL {
            let block = format.block_elements();
            for cols in col_counts(format) {
                let rows = 7;
                let data = weight(format, rows, cols, &mut rng);
                let mut want = vec![0.0f32; rows * cols];
                dequantize_range(format, &data, rows * cols, 0, &mut want).unwrap();
                let w = QuantMatrix {
                    format,
                    bytes: &data,
                    rows,
                    cols,
                };
                let mut got = vec![f32::NAN; 3 * cols];
                w.dequantize_rows(2, &mut got).unwrap();
                assert_eq!(
                    bits(&got),
                    bits(&want[2 * cols..5 * cols]),
                    "{format} rows at {level:?}"
                );
                let (c0, width) = (block * (cols / block / 2), block);
                let mut got = vec![f32::NAN; rows * width];
                w.dequantize_columns(c0, width, &mut got).unwrap();
                let expect: Vec<f32> = (0..rows)
                    .flat_map(|r| want[r * cols + c0..r * cols + c0 + width].to_vec())
                    .collect();
                assert_eq!(bits(&got), bits(&expect), "{format} columns at {level:?}");
                // Ranges outside the matrix or not whole blocks are errors, not panics.
                let mut one = vec![0.0f32; cols];
                assert!(w.dequantize_rows(rows, &mut one).is_err());
                let mut odd = vec![0.0f32; rows * (block + 1)];
                assert!(w.dequantize_columns(0, block + 1, &mut odd).is_err());
            }
        }
    }
    simd::set_force_scalar(false);
    simd::set_simd_level(None);
}
