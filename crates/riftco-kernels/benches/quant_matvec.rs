//! The fused quantized mat-vec product (`quant::matvec`) against the f32 mat-vec product on the
//! same shape (`matmul` with `m = 1` and a transposed weight): time per product, GB/s of the
//! weight bytes read (quantized bytes for the quantized product, 4 bytes per weight for f32),
//! and the speed-up (f32 time / quantized time). The two run interleaved, round after round,
//! and each figure is the median over the rounds, so a load change on a shared machine hits
//! both alike. Next to wall time, the process's CPU time per product (all threads; Unix only):
//! on a machine shared with other work it shows the cost of a product when it runs, which wall
//! time mixes with the time the threads wait for a core.
//!
//! Run: `cargo bench -p riftco-kernels --bench quant_matvec` (honours `RIFTCO_NUM_THREADS` and
//! `RIFTCO_SIMD`); `-- q4_1` keeps only the formats whose name contains the argument.
//! The shapes are SmolLM2-135M's products `[rows, cols]`: attention (576×576), MLP up
//! (1536×576), MLP down (576×1536) and the tied embedding / LM head (49152×576).

use std::hint::black_box;
use std::time::Instant;

use riftco_kernels::quant::QuantFormat;
use riftco_kernels::{matmul, quant, MatmulSpec};

const SHAPES: [(usize, usize); 4] = [(576, 576), (1536, 576), (576, 1536), (49152, 576)];
const ROUNDS: usize = 9;

/// xorshift64.
fn next(state: &mut u64) -> u64 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    *state
}

/// Random storage with finite block scales (f16 0.01; NF4 group scales 1 and offset 0.01).
fn weight(format: QuantFormat, numel: usize, state: &mut u64) -> Vec<u8> {
    let mut data: Vec<u8> = (0..format.storage_bytes(numel).unwrap())
        .map(|_| next(state) as u8)
        .collect();
    let scale = half::f16::from_f32(0.01).to_le_bytes();
    match format.ggml_type() {
        Some(t) => {
            let fields: &[usize] = match format {
                QuantFormat::Q2_K => &[80, 82],
                QuantFormat::Q3_K => &[108],
                QuantFormat::Q6_K => &[208],
                _ => &[0, 2],
            };
            for block in data.chunks_exact_mut(t.block_layout().1) {
                for &at in fields {
                    block[at..at + 2].copy_from_slice(&scale);
                }
            }
        }
        None => {
            let blocks = numel / QuantFormat::NF4_BLOCK;
            let at = numel / 2 + blocks;
            let end = data.len() - 4;
            for s in data[at..end].chunks_exact_mut(4) {
                s.copy_from_slice(&1.0f32.to_le_bytes());
            }
            data[end..].copy_from_slice(&0.01f32.to_le_bytes());
        }
    }
    data
}

/// Seconds of CPU time this process has used (all threads).
#[cfg(unix)]
fn cpu_s() -> f64 {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `t` is a valid timespec to write.
    unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut t) };
    t.tv_sec as f64 + t.tv_nsec as f64 * 1e-9
}

#[cfg(not(unix))]
fn cpu_s() -> f64 {
    f64::NAN
}

/// (wall, CPU) seconds per call of `f`: `reps` calls timed together.
fn per_call2(reps: usize, f: &mut impl FnMut()) -> (f64, f64) {
    let (t, c) = (Instant::now(), cpu_s());
    for _ in 0..reps {
        f();
    }
    let n = reps as f64;
    (t.elapsed().as_secs_f64() / n, (cpu_s() - c) / n)
}

/// Wall seconds per call of `f`.
fn per_call(reps: usize, f: &mut impl FnMut()) -> f64 {
    per_call2(reps, f).0
}

/// Calls per timing so that one takes about 20 ms.
fn reps_for(f: &mut impl FnMut()) -> usize {
    let once = per_call(1, f).max(1e-7);
    ((0.02 / once) as usize).clamp(1, 100_000)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let filter = std::env::args()
        .skip(1)
        .find(|a| !a.starts_with('-'))
        .unwrap_or_default();
    println!(
        "quant_matvec bench: {} kernel threads, SIMD level {:?}; medians of {ROUNDS} interleaved \
         rounds",
        riftco_kernels::num_threads(),
        riftco_kernels::simd::current_level()
    );
    println!(
        "{:<6} {:>13} {:>10} {:>8} {:>10} {:>8} {:>8} | {:>8} {:>8} {:>8}",
        "format",
        "rows x cols",
        "quant us",
        "GB/s",
        "f32 us",
        "GB/s",
        "speedup",
        "cpu q us",
        "f32 us",
        "speedup"
    );
    let mut state = 0x2545_f491_4f6c_dd1d_u64;
    for (rows, cols) in SHAPES {
        let numel = rows * cols;
        let w: Vec<f32> = (0..numel)
            .map(|_| (next(&mut state) >> 40) as f32 / (1u64 << 24) as f32 - 0.5)
            .collect();
        let x: Vec<f32> = (0..cols).map(|i| (i as f32 * 0.37).sin()).collect();
        let mut y = vec![0.0f32; rows];
        for format in QuantFormat::ALL {
            if !format.name().contains(filter.as_str()) {
                continue;
            }
            if cols % format.block_elements() != 0 {
                println!(
                    "{:<6} {:>13}   (rows of {cols} are not whole blocks of {})",
                    format.name(),
                    format!("{rows}x{cols}"),
                    format.block_elements()
                );
                continue;
            }
            let data = weight(format, numel, &mut state);
            let mut yq = vec![0.0f32; rows];
            let mut f32_product = || {
                matmul(
                    MatmulSpec::new(1, cols, rows).trans_b(true),
                    black_box(&x),
                    black_box(&w),
                    &mut y,
                )
            };
            let mut quant_product =
                || quant::matvec(format, black_box(&data), black_box(&x), &mut yq).unwrap();
            let (rf, rq) = (reps_for(&mut f32_product), reps_for(&mut quant_product));
            let (mut tf, mut tq, mut cf, mut cq) = (vec![], vec![], vec![], vec![]);
            for _ in 0..ROUNDS {
                let (t, c) = per_call2(rf, &mut f32_product);
                tf.push(t);
                cf.push(c);
                let (t, c) = per_call2(rq, &mut quant_product);
                tq.push(t);
                cq.push(c);
            }
            let (tf, tq, cf, cq) = (median(tf), median(tq), median(cf), median(cq));
            println!(
                "{:<6} {:>13} {:>10.1} {:>8.2} {:>10.1} {:>8.2} {:>7.2}x | {:>8.1} {:>8.1} {:>7.2}x",
                format.name(),
                format!("{rows}x{cols}"),
                tq * 1e6,
                data.len() as f64 / tq / 1e9,
                tf * 1e6,
                (4 * numel) as f64 / tf / 1e9,
                tf / tq,
                cq * 1e6,
                cf * 1e6,
                cf / cq
            );
        }
    }
}
