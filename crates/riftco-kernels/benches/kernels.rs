//! Kernel throughput: GEMM GFLOP/s, and GB/s of the memory-bound row/element-wise kernels next
//! to a plain `copy_from_slice` measured in the same run (the ratio is what matters: a kernel at
//! 1.0 moves its bytes as fast as a copy). Also the FlashAttention-2 reference configuration.
//!
//! Run: `cargo bench -p riftco-kernels --bench kernels` (honours `RIFTCO_NUM_THREADS` and
//! `RIFTCO_FORCE_SCALAR`). Times are the best of several repetitions of at least 50 ms each.

use std::hint::black_box;
use std::time::{Duration, Instant};

use riftco_kernels::attention::{flash_attention_backward, flash_attention_forward, AttentionDims};
use riftco_kernels::{elementwise, matmul, norm, softmax, MatmulSpec};

/// Best seconds per call of `f` over 5 repetitions of at least 50 ms.
fn time(mut f: impl FnMut()) -> f64 {
    f();
    let mut iters = 1u32;
    loop {
        let t = Instant::now();
        for _ in 0..iters {
            f();
        }
        if t.elapsed() >= Duration::from_millis(50) {
            break;
        }
        iters *= 2;
    }
    (0..5)
        .map(|_| {
            let t = Instant::now();
            for _ in 0..iters {
                f();
            }
            t.elapsed().as_secs_f64() / iters as f64
        })
        .fold(f64::INFINITY, f64::min)
}

fn data(n: usize, seed: u32) -> Vec<f32> {
    (0..n)
        .map(|i| {
            ((i as u32).wrapping_mul(2_654_435_761).wrapping_add(seed) % 2001) as f32 / 1000.0 - 1.0
        })
        .collect()
}

fn main() {
    println!(
        "riftco-kernels bench: {} kernel threads, SIMD level {:?}",
        riftco_kernels::num_threads(),
        riftco_kernels::simd::current_level()
    );
    println!("\n== GEMM (square, C = A·B) ==");
    for n in [256usize, 512, 1024] {
        let (a, b) = (data(n * n, 1), data(n * n, 2));
        let mut c = vec![0.0f32; n * n];
        let spec = MatmulSpec::new(n, n, n);
        let s = time(|| matmul(spec, black_box(&a), black_box(&b), &mut c));
        println!(
            "gemm {n:>4}: {:>8.1} GFLOP/s ({:.3} ms)",
            2.0 * (n as f64).powi(3) / s / 1e9,
            s * 1e3
        );
    }
    println!("\n== memory-bound kernels, 512 rows (GB/s = bytes read + written / time) ==");
    let rows = 512;
    for cols in [256usize, 1024, 4096] {
        let n = rows * cols;
        let (x, y) = (data(n, 3), data(n, 4));
        let w = data(cols, 5);
        let mut out = vec![0.0f32; n];
        let mut rstd = vec![0.0f32; rows];
        let bytes2 = (2 * n * 4) as f64;
        let bytes3 = (3 * n * 4) as f64;
        let t_copy = time(|| out.copy_from_slice(black_box(&x)));
        let copy = bytes2 / t_copy / 1e9;
        let t_sm = time(|| softmax::softmax_rows(black_box(&x), cols, &mut out));
        let t_rms = time(|| norm::rms_norm(black_box(&x), &w, 1e-5, &mut out, &mut rstd));
        let t_sw = time(|| elementwise::swiglu(black_box(&x), &y, &mut out));
        println!("cols {cols:>4}: copy {copy:>6.1} GB/s");
        for (name, bytes, t) in [
            ("softmax_rows", bytes2, t_sm),
            ("rms_norm", bytes2, t_rms),
            ("swiglu", bytes3, t_sw),
        ] {
            let gbs = bytes / t / 1e9;
            println!(
                "  {name:<13} {gbs:>6.1} GB/s  ratio to copy {:.2}",
                gbs / copy
            );
        }
    }
    println!("\n== FlashAttention-2, batch 8, heads 8, seq 256, d_head 32, causal ==");
    let dims = AttentionDims {
        batch: 8,
        n_heads: 8,
        n_kv_heads: 8,
        seq_q: 256,
        seq_k: 256,
        d_head: 32,
    };
    let n = 8 * 8 * 256 * 32;
    let (q, k, v, g) = (data(n, 6), data(n, 7), data(n, 8), data(n, 9));
    let (mut o, mut lse) = (vec![0.0f32; n], vec![0.0f32; 8 * 8 * 256]);
    let (mut dq, mut dk, mut dv) = (vec![0.0f32; n], vec![0.0f32; n], vec![0.0f32; n]);
    let scale = 1.0 / 32f32.sqrt();
    let tf = time(|| flash_attention_forward(&q, &k, &v, dims, scale, true, &mut o, &mut lse));
    let tb = time(|| {
        flash_attention_backward(
            &q, &k, &v, &o, &lse, &g, dims, scale, true, &mut dq, &mut dk, &mut dv,
        )
    });
    // Causal: half of the 2 (fwd) / 5 (bwd) products of 2·seq²·d FLOPs each.
    let flops = 2.0 * 256.0 * 256.0 * 32.0 * 64.0 / 2.0;
    println!(
        "forward  {:.2} ms ({:.1} GFLOP/s)",
        tf * 1e3,
        2.0 * flops / tf / 1e9
    );
    println!(
        "backward {:.2} ms ({:.1} GFLOP/s)",
        tb * 1e3,
        5.0 * flops / tb / 1e9
    );
}
