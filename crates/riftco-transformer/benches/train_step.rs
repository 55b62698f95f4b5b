//! Training-step benchmark at the reference configuration (vocab 256, d_model 256, n_heads 8,
//! n_layers 8, d_ff 688, seq 256, batch 8): for each attention kind and checkpointing policy,
//! step time (forward + backward + Adam), tokens/s, peak activation bytes from memory
//! accounting, and the recompute overhead ratio block/disabled.
//!
//! Environment: `RIFTCO_BENCH_STEPS` (default 5 timed steps after 1 warm-up),
//! `RIFTCO_BENCH_SMALL=1` for a quick smoke run at a tiny size, `RIFTCO_BENCH_ATTENTION=flash|materialized`
//! and `RIFTCO_BENCH_POLICY=disabled|block` to run one configuration, `RIFTCO_BENCH_PHASES=1` to
//! print forward and backward times of every step.
//! Reference from the issue (not measured here): PyTorch 2.13 CPU on a 2-core machine of this
//! kind took about 0.9 s/step with SDPA attention, about 1.15x that with per-block checkpointing.
//! `benches/train_step.py` measures PyTorch in the same run when it is installed.

use riftco_tensor::{memory_stats, reset_peak_memory_stats, MemoryCategory};
use riftco_transformer::{
    ActivationCheckpointingKind as Ck, Adam, DecoderOnlyTransformer,
    FullSequenceAttentionKind as Attn, TransformerConfig,
};
use std::time::Instant;

/// User + system CPU seconds of this process from `/proc/self/stat` (Linux; 0 elsewhere). On a
/// shared machine, CPU time per step is steadier than wall time: it is what a quiet machine with
/// enough cores would need, summed over threads.
fn process_cpu_s() -> f64 {
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else {
        return 0.0;
    };
    // Fields after the parenthesised command name; utime and stime are fields 14 and 15.
    let rest = stat.rsplit(')').next().unwrap_or("");
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    (ticks(11) + ticks(12)) / 100.0
}

struct Row {
    attn: Attn,
    ck: Ck,
    /// Step times in run order (paired step by step with the other policy's).
    times: Vec<f64>,
    step_s: f64,
    min_step_s: f64,
    cpu_s: f64,
    tokens_per_s: f64,
    peak_activation_bytes: usize,
    retained_activation_bytes: usize,
}

/// One model and optimizer; `step()` runs forward + backward + Adam and records its times.
struct Runner {
    attn: Attn,
    ck: Ck,
    model: DecoderOnlyTransformer,
    opt: Adam,
    times: Vec<f64>,
    cpu: Vec<f64>,
    peak: usize,
    retained: usize,
}

impl Runner {
    fn new(config: &TransformerConfig, attn: Attn, ck: Ck) -> Self {
        let model = DecoderOnlyTransformer::new(config.clone(), attn, ck).unwrap();
        let opt = Adam::new(model.trainable_parameters(), 1e-3).unwrap();
        Self {
            attn,
            ck,
            model,
            opt,
            times: Vec::new(),
            cpu: Vec::new(),
            peak: 0,
            retained: 0,
        }
    }

    fn step(&mut self, tokens: &[u32], batch: usize, seq: usize, timed: bool, phases: bool) {
        let base = memory_stats().get(MemoryCategory::Activation).current_bytes;
        reset_peak_memory_stats();
        let t0 = Instant::now();
        let c0 = process_cpu_s();
        let loss = self.model.loss(tokens, batch, seq + 1).unwrap();
        let after_forward = memory_stats().get(MemoryCategory::Activation).current_bytes;
        let (fwd_dt, fwd_cpu) = (t0.elapsed().as_secs_f64(), process_cpu_s() - c0);
        loss.backward().unwrap();
        let (bwd_dt, bwd_cpu) = (
            t0.elapsed().as_secs_f64() - fwd_dt,
            process_cpu_s() - c0 - fwd_cpu,
        );
        self.opt.step().unwrap();
        drop(loss);
        let dt = t0.elapsed().as_secs_f64();
        self.peak = memory_stats().get(MemoryCategory::Activation).peak_bytes - base;
        self.retained = after_forward - base;
        if timed {
            self.times.push(dt);
            self.cpu.push(process_cpu_s() - c0);
            if phases {
                println!(
                    "  {} {} step {}: forward {fwd_dt:.3} s ({fwd_cpu:.2} cpu s), backward {bwd_dt:.3} s ({bwd_cpu:.2} cpu s)",
                    self.attn.name(),
                    self.ck.name(),
                    self.times.len()
                );
            }
        }
    }

    fn row(&self, batch: usize, seq: usize) -> Row {
        let mut times = self.times.clone();
        times.sort_by(|a, b| a.partial_cmp(b).unwrap());
        let median = times[times.len() / 2];
        Row {
            attn: self.attn,
            ck: self.ck,
            times: self.times.clone(),
            step_s: median,
            min_step_s: times[0],
            cpu_s: self.cpu.iter().sum::<f64>() / self.cpu.len() as f64,
            tokens_per_s: (batch * seq) as f64 / median,
            peak_activation_bytes: self.peak,
            retained_activation_bytes: self.retained,
        }
    }
}

/// Median of a non-empty list.
fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

/// Multiply-adds of one training step by op count: (forward, backward, replay of every block).
/// Linear layers cost `tokens·in·out` forward and twice that backward (input and weight
/// gradients). Attention has two products, `QKᵀ` and `PV`: flash attention computes only the
/// allowed causal pairs, `T(T+1)/2` per head, materialized attention the full `T²`; its backward
/// has 4 such products, 5 for flash attention, which recomputes `QKᵀ`. The block
/// replay redoes the block's forward except the MLP down projection (recorded graph-only).
/// Element-wise ops are left out (memory-bound, a few per cent of the FLOPs).
fn flop_model(cfg: &TransformerConfig, attn: Attn, batch: usize, seq: usize) -> (f64, f64, f64) {
    let (d, f, v, l) = (
        cfg.d_model as f64,
        cfg.d_ff as f64,
        cfg.vocab_size as f64,
        cfg.n_layers as f64,
    );
    let (n, b, t) = ((batch * seq) as f64, batch as f64, seq as f64);
    let linear = n * (4.0 * d * d + 3.0 * d * f);
    let down = n * d * f;
    let (attention, attention_bwd) = match attn {
        Attn::Flash => (b * d * t * (t + 1.0), 2.5 * b * d * t * (t + 1.0)),
        _ => (2.0 * b * d * t * t, 4.0 * b * d * t * t),
    };
    let head = n * d * v;
    let forward = l * (linear + attention) + head;
    let backward = l * (2.0 * linear + attention_bwd) + 2.0 * head;
    let replay = l * (linear - down + attention);
    (forward, backward, replay)
}

fn main() {
    let small = std::env::var("RIFTCO_BENCH_SMALL").is_ok_and(|v| v == "1");
    let steps: usize = std::env::var("RIFTCO_BENCH_STEPS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(if small { 1 } else { 5 });
    let (config, batch, seq) = if small {
        (TransformerConfig::new(256, 64, 4, 2, 128, 64), 2, 64)
    } else {
        (TransformerConfig::reference(), 8, 256)
    };
    println!(
        "riftco train step: vocab {} d_model {} n_heads {} n_layers {} d_ff {} seq {seq} batch {batch}, {} kernel threads, median of {steps} steps",
        config.vocab_size, config.d_model, config.n_heads, config.n_layers, config.d_ff,
        riftco_kernels::num_threads()
    );
    println!(
        "{:<13} {:<9} {:>9} {:>9} {:>9} {:>10} {:>20} {:>22}",
        "attention",
        "policy",
        "step_s",
        "min_s",
        "cpu_s",
        "tokens/s",
        "peak_activation_MiB",
        "retained_after_fwd_MiB"
    );
    let only_attn = std::env::var("RIFTCO_BENCH_ATTENTION").ok();
    let only_policy = std::env::var("RIFTCO_BENCH_POLICY").ok();
    let phases = std::env::var("RIFTCO_BENCH_PHASES").is_ok_and(|v| v == "1");
    let tokens: Vec<u32> = (0..batch * (seq + 1))
        .map(|i| ((i as u64 * 2654435761) >> 11) as u32 % config.vocab_size as u32)
        .collect();
    let mut rows = Vec::new();
    for attn in [Attn::Materialized, Attn::Flash] {
        // The policies of one attention kind run interleaved, step by step, so a noisy
        // neighbour on a shared machine slows both alike and the overhead ratio stays fair.
        let mut runners: Vec<Runner> = [Ck::Disabled, Ck::TransformerBlock]
            .into_iter()
            .filter(|ck| {
                only_attn.as_deref().is_none_or(|a| a == attn.name())
                    && only_policy.as_deref().is_none_or(|p| p == ck.name())
            })
            .map(|ck| Runner::new(&config, attn, ck))
            .collect();
        for step in 0..=steps {
            // Alternate which policy goes first, so neither always follows the other.
            if step % 2 == 1 {
                runners.reverse();
            }
            for r in runners.iter_mut() {
                r.step(&tokens, batch, seq, step > 0, phases);
            }
        }
        runners.sort_by_key(|r| r.ck != Ck::Disabled);
        for runner in &runners {
            let r = runner.row(batch, seq);
            println!(
                "{:<13} {:<9} {:>9.3} {:>9.3} {:>9.3} {:>10.0} {:>20.1} {:>22.1}",
                r.attn.name(),
                r.ck.name(),
                r.step_s,
                r.min_step_s,
                r.cpu_s,
                r.tokens_per_s,
                r.peak_activation_bytes as f64 / (1 << 20) as f64,
                r.retained_activation_bytes as f64 / (1 << 20) as f64
            );
            rows.push(r);
        }
    }
    for attn in [Attn::Materialized, Attn::Flash] {
        let find = |ck| rows.iter().find(|r: &&Row| r.attn == attn && r.ck == ck);
        let (Some(d), Some(b)) = (find(Ck::Disabled), find(Ck::TransformerBlock)) else {
            continue;
        };
        let paired = median(b.times.iter().zip(&d.times).map(|(b, d)| b / d).collect());
        println!(
            "{}: recompute overhead block/disabled = {:.3}x median step time ({:.3}x median of step pairs, {:.3}x fastest step, {} CPU time); retained activations block/disabled = {:.3}; peak activations block/disabled = {:.3}",
            attn.name(),
            b.step_s / d.step_s,
            paired,
            b.min_step_s / d.min_step_s,
            if d.cpu_s > 0.0 {
                format!("{:.3}x", b.cpu_s / d.cpu_s)
            } else {
                "no measurable".to_string()
            },
            b.retained_activation_bytes as f64 / d.retained_activation_bytes as f64,
            b.peak_activation_bytes as f64 / d.peak_activation_bytes as f64,
        );
    }
    for attn in [Attn::Materialized, Attn::Flash] {
        if !rows.iter().any(|r| r.attn == attn) {
            continue;
        }
        let (f, b, r) = flop_model(&config, attn, batch, seq);
        println!(
            "{}: op-count model: forward {:.2} G, backward {:.2} G, block replays {:.2} G multiply-adds; block/disabled = 1 + replay/(forward + backward) = {:.3}x if all three ran at the same rate",
            attn.name(),
            f * 1e-9,
            b * 1e-9,
            r * 1e-9,
            1.0 + r / (f + b)
        );
    }
    let best = rows.iter().map(|r| r.step_s).fold(f64::INFINITY, f64::min);
    println!("fastest step {best:.3} s; issue reference for PyTorch 2.13 CPU (SDPA, same config, 2 cores): ~0.9 s (ratio {:.2})", best / 0.9);
}
