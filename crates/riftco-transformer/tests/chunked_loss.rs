//! The training loss's LM head + cross-entropy computed in chunks of tokens
//! ([`LossChunking::Chunked`]) against the unfused path (whole logits, then the cross-entropy):
//! the loss and every gradient, for chunk budgets from one token per chunk to the whole batch,
//! untied and tied embeddings, LoRA, checkpointing policies, dropout and gradient accumulation
//! (an upstream gradient other than 1); the memory the chunked loss never allocates; and the
//! budget's validation.
//!
//! Every test holds the measurement lock: under `cargo test` the tests of this binary share one
//! process and its memory counters.

mod measure;
use measure::{lock, tokens};
use riftco_autograd::ops;
use riftco_tensor::{memory_stats, reset_peak_memory_stats, MemoryCategory};
use riftco_transformer::{
    ActivationCheckpointing as Policy, DecoderOnlyTransformer, FullSequenceAttentionKind as Attn,
    LoraConfig, LoraTargets, LossChunking, TransformerConfig, TransformerError,
};

const BATCH: usize = 3;
const SEQ: usize = 13;
const VOCAB: usize = 96;

fn config(tied: bool) -> TransformerConfig {
    let mut c = TransformerConfig::new(VOCAB, 32, 4, 3, 48, 24).with_tie_word_embeddings(tied);
    c.seed = 5;
    c
}

/// Every gradient after one `backward()` of the loss scaled by `upstream`, by parameter name
/// (trainable parameters only), and the loss.
fn step(
    model: &DecoderOnlyTransformer,
    chunking: LossChunking,
    upstream: f32,
) -> (f32, Vec<(String, Vec<f32>)>) {
    let mut m = model_with(model, chunking);
    m.set_training(true);
    let block = tokens(BATCH, SEQ + 1, VOCAB as u32);
    let loss = m.loss(&block, BATCH, SEQ + 1).unwrap();
    let value = loss.value().to_vec()[0];
    if upstream == 1.0 {
        loss.backward().unwrap();
    } else {
        ops::scale(&loss, upstream).unwrap().backward().unwrap();
    }
    let mut grads = Vec::new();
    for (name, p) in m
        .named_parameters()
        .into_iter()
        .chain(m.weights().named_lora_parameters())
    {
        if p.requires_grad() {
            let g = p.grad().unwrap_or_else(|| panic!("no gradient for {name}"));
            grads.push((name, g.to_vec()));
        }
    }
    (value, grads)
}

/// A model sharing `model`'s weights and settings, with the given loss head.
fn model_with(model: &DecoderOnlyTransformer, chunking: LossChunking) -> DecoderOnlyTransformer {
    let mut m = DecoderOnlyTransformer::from_weights(
        (**model.weights()).clone(),
        model.attention_kind(),
        model.activation_checkpointing().clone(),
    );
    m.set_loss_chunking(chunking).unwrap();
    m
}

/// The largest `|a − b|` over every gradient, relative to the largest `|b|` of that gradient.
fn max_relative_gradient_difference(a: &[(String, Vec<f32>)], b: &[(String, Vec<f32>)]) -> f32 {
    assert_eq!(a.len(), b.len(), "gradient count");
    let mut worst = 0.0f32;
    for ((na, ga), (nb, gb)) in a.iter().zip(b) {
        assert_eq!(na, nb);
        assert_eq!(ga.len(), gb.len(), "{na}: length");
        let scale = gb.iter().fold(0.0f32, |m, x| m.max(x.abs())).max(1e-30);
        for (x, y) in ga.iter().zip(gb) {
            assert!(x.is_finite(), "{na}: {x}");
            worst = worst.max((x - y).abs() / scale);
        }
    }
    worst
}

/// Budgets of 1 token per chunk, 5 tokens (chunks that do not divide the 39 tokens), and the
/// default (every token at once at this vocabulary).
fn budgets() -> [LossChunking; 3] {
    let per_token = 4 * (VOCAB as u64 + 1);
    [
        LossChunking::chunked(1).unwrap(),
        LossChunking::chunked(5 * per_token).unwrap(),
        LossChunking::default(),
    ]
}

/// f32 unit roundoff.
const U: f64 = 1.0 / (1u64 << 24) as f64;

/// Higham's `γ_n = n·u / (1 − n·u)`: any order of a sum of `n` products, with or without fused
/// multiply-adds, is within `γ_n·Σ|terms|` of the exact sum (Higham 2002, §3.1, eq. 3.5).
fn gamma(n: usize) -> f64 {
    n as f64 * U / (1.0 - n as f64 * U)
}

/// How far two computations of the loss of the same hidden states may differ when their head
/// products sum each logit in another order (a product's row blocking, hence a row's order,
/// may depend on its number of rows: `gemm`'s one-row, small-product and k-blocked paths).
/// A logit `Σ_k h_k·W_vk` is within `γ_d·S` of exact in either path, where
/// `S = max|g|·√d·max_v‖W_v‖₂ >= Σ_k|h_k·W_vk|` for the final RMSNorm's output `h` (norm weight
/// `g`, `‖h‖₂ <= max|g|·√d`; Cauchy–Schwarz); a row's loss `logsumexp(z) − z_t` moves by at
/// most twice the logits' difference, plus the roundings of both logsumexps (exp to `2u` and
/// its argument to `2S·u`, a sum of `V` terms to `γ_V`, the log and the additions to `u` of
/// their magnitudes, `|lse| <= S + ln V`), of the subtraction, and of the mean's f32 result.
fn loss_bound(model: &DecoderOnlyTransformer, loss: f32) -> f64 {
    let named = model.named_parameters();
    let get = |name: &str| -> Vec<f32> {
        named
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, p)| p.value().to_vec())
            .unwrap()
    };
    let head_name = if named.iter().any(|(n, _)| n == "lm_head.weight") {
        "lm_head.weight"
    } else {
        "model.embed_tokens.weight"
    };
    let w = get(head_name);
    let g = get("model.norm.weight");
    let d = g.len();
    let v = w.len() / d;
    let g_max = g.iter().fold(0.0f64, |m, x| m.max(x.abs() as f64));
    let w_row = w
        .chunks(d)
        .map(|r| {
            r.iter()
                .map(|&x| (x as f64) * (x as f64))
                .sum::<f64>()
                .sqrt()
        })
        .fold(0.0f64, f64::max);
    // 1e-3: the norm's own rounding of ‖h‖₂ (d·u = 2e-6 here), with room to spare.
    let s = g_max * (d as f64).sqrt() * w_row * (1.0 + 1e-3);
    let lse_max = s + (v as f64).ln();
    let lse_rounding = gamma(v) + 2.0 * U + 2.0 * s * U + U * (v as f64).ln() + U * lse_max;
    4.0 * gamma(d) * s + 2.0 * lse_rounding + 2.0 * U * (lse_max + s) + 2.0 * U * loss.abs() as f64
}

/// A normwise bound, relative to a gradient's largest element, on the two paths' gradients:
/// each is a chain of sums (the head's `V` terms per hidden-state element, per block the
/// projections' `d_model` and `d_ff` terms and attention's positions, forward and backward,
/// then the weight gradients' sums over the tokens), each contributing `γ_n` of its terms'
/// magnitudes, taken at the gradient's scale; the two paths' errors add.
fn gradient_tolerance(model: &DecoderOnlyTransformer) -> f64 {
    let c = &model.weights().config;
    let per_block = 2.0 * (gamma(c.d_model) + gamma(c.d_ff) + gamma(SEQ)) * 2.0;
    2.0 * (gamma(c.vocab_size) + c.n_layers as f64 * per_block + gamma(BATCH * SEQ))
}

/// Chunked and unfused agree: the loss within [`loss_bound`] (bitwise for the default budget,
/// one chunk of all 39 tokens: the unfused path's products), every gradient within
/// [`gradient_tolerance`] of its largest element (`dW` of the head also sums its rows chunk by
/// chunk).
fn assert_agree(model: &DecoderOnlyTransformer, what: &str) {
    let (loss_ref, grads_ref) = step(model, LossChunking::Unfused, 1.0);
    assert!(loss_ref.is_finite());
    let bound = loss_bound(model, loss_ref);
    let tolerance = gradient_tolerance(model);
    assert!(
        bound < 1e-4 * loss_ref.abs() as f64,
        "{what}: the bound must be able to fail"
    );
    for chunking in budgets() {
        let (loss, grads) = step(model, chunking, 1.0);
        if chunking == LossChunking::default() {
            assert_eq!(
                loss.to_bits(),
                loss_ref.to_bits(),
                "{what}, {chunking:?}: loss {loss} vs unfused {loss_ref}"
            );
        }
        assert!(
            ((loss - loss_ref).abs() as f64) <= bound,
            "{what}, {chunking:?}: loss {loss} vs unfused {loss_ref}, bound {bound}"
        );
        let diff = max_relative_gradient_difference(&grads, &grads_ref) as f64;
        assert!(
            diff <= tolerance,
            "{what}, {chunking:?}: gradients differ by {diff} (tolerance {tolerance})"
        );
    }
}

#[test]
fn chunked_equals_unfused_untied_and_tied() {
    let _guard = lock(); // the memory counters are process-wide
    for tied in [false, true] {
        for attn in [Attn::Flash, Attn::Materialized] {
            let m = DecoderOnlyTransformer::new(config(tied), attn, Policy::Disabled).unwrap();
            assert_agree(&m, &format!("tied {tied}, {attn:?}"));
        }
    }
}

#[test]
fn chunked_equals_unfused_under_every_policy_kind_with_lora_and_dropout() {
    let _guard = lock(); // the memory counters are process-wide
    let mut cfg = config(true);
    cfg.attention_dropout = 0.1;
    cfg.residual_dropout = 0.1;
    for policy in ["disabled", "block", "segments:2", "selective", "auto"] {
        let policy: Policy = policy.parse().unwrap();
        let mut m = DecoderOnlyTransformer::new(cfg.clone(), Attn::Flash, policy.clone()).unwrap();
        let lora = LoraConfig {
            rank: 4,
            alpha: 8.0,
            targets: LoraTargets {
                attention: true,
                mlp: true,
            },
            seed: 3,
            dropout: 0.1,
        };
        m.enable_lora(&lora).unwrap();
        assert_agree(&m, &format!("{policy:?} + LoRA + dropout"));
    }
}

#[test]
fn an_upstream_gradient_scales_the_saved_gradients() {
    let _guard = lock(); // the memory counters are process-wide
                         // Gradient accumulation scales each micro-batch's loss: the chunked node multiplies the
                         // gradients it computed in the forward pass by the upstream gradient.
    let m = DecoderOnlyTransformer::new(config(false), Attn::Flash, Policy::Block).unwrap();
    let (_, unit) = step(&m, LossChunking::default(), 1.0);
    let (_, quarter) = step(&m, LossChunking::default(), 0.25);
    let (_, unfused) = step(&m, LossChunking::Unfused, 0.25);
    for ((name, g1), (_, gq)) in unit.iter().zip(&quarter) {
        for (a, b) in g1.iter().zip(gq) {
            assert_eq!(
                (a * 0.25).to_bits(),
                b.to_bits(),
                "{name}: {a} · 0.25 vs {b}"
            );
        }
    }
    assert!(max_relative_gradient_difference(&quarter, &unfused) as f64 <= gradient_tolerance(&m));
}

#[test]
fn a_second_backward_gives_the_same_gradients() {
    let _guard = lock(); // the memory counters are process-wide
    let m = DecoderOnlyTransformer::new(config(true), Attn::Flash, Policy::Disabled).unwrap();
    let block = tokens(BATCH, SEQ + 1, VOCAB as u32);
    let loss = m.loss(&block, BATCH, SEQ + 1).unwrap();
    let embed = m.weights().embed.clone();
    loss.backward().unwrap();
    let first = embed.grad().unwrap().to_vec();
    loss.backward().unwrap();
    assert_eq!(first, embed.grad().unwrap().to_vec());
}

#[test]
fn the_chunked_loss_never_holds_whole_logits() {
    // A vocabulary large enough that the logits dwarf everything else of the step.
    let _guard = lock();
    let (vocab, batch, seq) = (4096usize, 2usize, 32usize);
    let mut cfg = TransformerConfig::new(vocab, 32, 4, 2, 48, seq);
    cfg.seed = 1;
    let logits_bytes = (batch * seq * vocab * 4) as u64;
    let block = tokens(batch, seq + 1, vocab as u32);
    let mut peaks = Vec::new();
    for chunking in [
        LossChunking::Unfused,
        LossChunking::chunked(64 << 10).unwrap(),
    ] {
        let mut m = DecoderOnlyTransformer::new(cfg.clone(), Attn::Flash, Policy::Block).unwrap();
        m.set_loss_chunking(chunking).unwrap();
        // Plan first (the planner's probes allocate), then measure one step.
        m.activation_checkpointing_plan(batch, seq).unwrap();
        reset_peak_memory_stats();
        let before = memory_stats();
        let loss = m.loss(&block, batch, seq + 1).unwrap();
        loss.backward().unwrap();
        let stats = memory_stats();
        drop(loss);
        let grow =
            |c: MemoryCategory| stats.get(c).peak_bytes as u64 - before.get(c).current_bytes as u64;
        peaks.push((
            grow(MemoryCategory::Activation),
            grow(MemoryCategory::Workspace),
            stats.total.peak_bytes as u64 - before.total.current_bytes as u64,
        ));
    }
    let (unfused, chunked) = (peaks[0], peaks[1]);
    // Unfused: the graph keeps the logits, the backward pass makes their gradient.
    assert!(
        unfused.0 >= logits_bytes,
        "unfused activation peak {unfused:?}"
    );
    // Chunked: 64 KiB of workspace is 3 tokens of 4097 floats; no activation holds logits.
    let chunk_bytes = (65536 / (4 * 4097) * 4097 * 4) as u64;
    assert_eq!(chunked.1, chunk_bytes, "workspace peak {chunked:?}");
    assert!(
        chunked.0 < logits_bytes / 4,
        "chunked activation peak {chunked:?}"
    );
    // The whole step: the unfused one holds the logits and then their gradient too; the
    // chunked one holds the head's weight gradient [vocab, 32] from its forward pass on.
    let head_gradient_bytes = (vocab * 32 * 4) as u64;
    assert!(
        unfused.2 - chunked.2 >= logits_bytes - head_gradient_bytes,
        "total peaks: unfused {unfused:?}, chunked {chunked:?}"
    );
}

#[test]
fn chunks_spread_the_tokens_evenly() {
    // The fewest chunks the budget allows, the tokens spread evenly over them.
    let per_token = 4 * (49152 + 1);
    assert_eq!(LossChunking::chunk_tokens(64 << 20, 49152), 341);
    assert_eq!(LossChunking::chunk_tokens_for(64 << 20, 49152, 1024), 256);
    assert_eq!(LossChunking::chunk_tokens_for(64 << 20, 49152, 341), 341);
    assert_eq!(LossChunking::chunk_tokens_for(64 << 20, 49152, 342), 171);
    assert_eq!(LossChunking::chunk_tokens_for(64 << 20, 49152, 100), 100);
    assert_eq!(LossChunking::chunk_tokens_for(per_token * 3, 49152, 10), 3);
    assert_eq!(LossChunking::chunk_tokens_for(1, 49152, 10), 1);
    assert_eq!(LossChunking::chunk_tokens_for(64 << 20, 49152, 0), 341);

    // 64 tokens under a budget of 40: two chunks of 32, and the workspace holds 32 tokens'
    // logits and logsumexps, not 40; the loss is the same to the bit (products of 32 and of 64
    // rows with k = d_model = 32 <= 512 take gemm's same microkernel path with one k-block).
    let _guard = lock();
    let (vocab, batch, seq) = (4096usize, 2usize, 32usize);
    let mut cfg = TransformerConfig::new(vocab, 32, 4, 2, 48, seq);
    cfg.seed = 1;
    let block = tokens(batch, seq + 1, vocab as u32);
    let mut m = DecoderOnlyTransformer::new(cfg, Attn::Flash, Policy::Block).unwrap();
    m.activation_checkpointing_plan(batch, seq).unwrap();
    let mut losses = Vec::new();
    for budget_tokens in [40u64, 64] {
        m.set_loss_chunking(LossChunking::chunked(budget_tokens * 4097 * 4).unwrap())
            .unwrap();
        reset_peak_memory_stats();
        let before = memory_stats().get(MemoryCategory::Workspace).current_bytes;
        let loss = m.loss(&block, batch, seq + 1).unwrap();
        let peak = memory_stats().get(MemoryCategory::Workspace).peak_bytes - before;
        let rows = if budget_tokens == 40 { 32 } else { 64 };
        assert_eq!(peak, rows * 4097 * 4, "budget of {budget_tokens} tokens");
        losses.push(loss.value().to_vec());
    }
    assert_eq!(losses[0], losses[1]);
}

#[test]
fn logits_stay_whole() {
    let _guard = lock(); // the memory counters are process-wide
    let m = DecoderOnlyTransformer::new(config(false), Attn::Flash, Policy::Disabled).unwrap();
    let block = tokens(1, SEQ, VOCAB as u32);
    let logits = m.logits(&block, 1, SEQ).unwrap();
    assert_eq!(logits.dims(), [SEQ, VOCAB]);
}

#[test]
fn a_zero_budget_is_a_config_error_and_changes_nothing() {
    let _guard = lock(); // the memory counters are process-wide
    let mut m = DecoderOnlyTransformer::new(config(false), Attn::Flash, Policy::Disabled).unwrap();
    let err = LossChunking::chunked(0).unwrap_err();
    assert!(
        matches!(
            err,
            TransformerError::Config {
                field: "loss_chunk_bytes",
                ..
            }
        ),
        "{err}"
    );
    let err = m
        .set_loss_chunking(LossChunking::Chunked { bytes: 0 })
        .unwrap_err();
    assert!(err.to_string().contains("loss_chunk_bytes"), "{err}");
    assert_eq!(m.loss_chunking(), LossChunking::default());
    m.set_loss_chunking(LossChunking::Unfused).unwrap();
    assert_eq!(m.loss_chunking().bytes(), None);
}
