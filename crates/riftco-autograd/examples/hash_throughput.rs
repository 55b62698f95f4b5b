//! Throughput of [`riftco_autograd::value_hash`], the hash `determinism_check = "values"`
//! computes of every checkpoint output at forward and at replay.
//!
//! `cargo run --release -p riftco-autograd --example hash_throughput [MIB]` hashes a buffer of
//! `MIB` MiB (default 2: one block output `[8, 256, 256]` f32 of the reference configuration)
//! repeatedly and prints GB/s (10^9 bytes per second), the median of 15 timed rounds.

use riftco_autograd::value_hash;
use std::hint::black_box;
use std::time::Instant;

fn main() {
    let mib: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(2);
    let n = mib * 1024 * 1024 / 4;
    let values: Vec<f32> = (0..n).map(|i| (i as f32 * 0.618).sin()).collect();
    let reps = (256 / mib.max(1)).max(1);
    let mut rates = Vec::new();
    let mut h = 0u64;
    for _ in 0..15 {
        let t = Instant::now();
        for _ in 0..reps {
            h = h.wrapping_add(value_hash(black_box(&values)));
        }
        let s = t.elapsed().as_secs_f64();
        rates.push((reps * n * 4) as f64 / s / 1e9);
    }
    rates.sort_by(f64::total_cmp);
    println!(
        "value_hash over {mib} MiB: median {:.2} GB/s (min {:.2}, max {:.2}); hash {h:#018x}",
        rates[7], rates[0], rates[14]
    );
}
