//! The K-quant quantizers against llama.cpp's C reference (`quantize_row_q2_K_ref` ...
//! `quantize_row_q6_K_ref` of `ggml-quants.c`, compiled with `gcc -O2 -ffp-contract=off`):
//! `fixtures/kquants_ref.bin` holds 8 super-blocks of inputs (f32, little endian; zeros, an
//! outlier, negative only, positive only, subnormals, a grid with ties, a constant, mixed
//! scales) followed by the C's bytes for Q2_K, Q3_K, Q4_K, Q5_K and Q6_K, written by
//! `scripts/kquant_fixtures.py --write` (which also checks thousands of random super-blocks
//! against the C with `--check`) from `src/ggml-quants.c` of ggml-org/ggml at d99724f2
//! (August 2026; the same `_ref` functions as llama.cpp's `ggml/src/ggml-quants.c`).

use riftco_kernels::quant::{quantize, QuantFormat};

#[test]
fn k_quants_are_bitwise_the_c_reference() {
    let fixture = include_bytes!("fixtures/kquants_ref.bin");
    let n = 8 * 256;
    let x: Vec<f32> = fixture[..4 * n]
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    let mut at = 4 * n;
    for format in [
        QuantFormat::Q2_K,
        QuantFormat::Q3_K,
        QuantFormat::Q4_K,
        QuantFormat::Q5_K,
        QuantFormat::Q6_K,
    ] {
        let size = format.storage_bytes(n).unwrap();
        let want = &fixture[at..at + size];
        at += size;
        let got = quantize(format, &x).unwrap();
        for (b, (g, w)) in got.chunks(size / 8).zip(want.chunks(size / 8)).enumerate() {
            assert_eq!(g, w, "{format} super-block {b}");
        }
    }
    assert_eq!(at, fixture.len());
}
