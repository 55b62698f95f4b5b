//! The Rust twin of `examples/c/train.c`, written against `riftco_transformer` directly (not
//! through the C ABI): same config, seed, data blocks, policy schedule and optimizer. Prints the
//! `step`, `eval` and `decode` lines that `tests/c/run.sh` compares with the C program's.
//!
//! `cargo run -p riftco-capi --release --example reference_losses -- TEXT_FILE`

use riftco_transformer::{
    ActivationCheckpointingKind, Adam, DecoderOnlyTransformer, FullSequenceAttentionKind,
    TransformerConfig,
};

const BATCH: usize = 2;
const SEQ_PLUS_ONE: usize = 17;
const STEPS: usize = 6;
const STRIDE: usize = 37;
const PROMPT: usize = 8;
const GENERATE: usize = 8;
const LR: f32 = 1e-2;
const SEED: u64 = 1234;

fn block(data: &[u8], index: usize) -> Vec<u32> {
    let mut out = Vec::with_capacity(BATCH * SEQ_PLUS_ONE);
    for b in 0..BATCH {
        let start = ((index * BATCH + b) * STRIDE) % (data.len() - SEQ_PLUS_ONE + 1);
        out.extend(
            data[start..start + SEQ_PLUS_ONE]
                .iter()
                .map(|&x| u32::from(x)),
        );
    }
    out
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path = std::env::args()
        .nth(1)
        .ok_or("usage: reference_losses TEXT_FILE")?;
    let data = std::fs::read(&path)?;
    if data.len() < SEQ_PLUS_ONE {
        return Err(format!("{path}: {} bytes, need {SEQ_PLUS_ONE}", data.len()).into());
    }
    let mut config = TransformerConfig::reference();
    config.vocab_size = 256;
    config.d_model = 32;
    config.n_heads = 4;
    config.n_kv_heads = 4;
    config.n_layers = 2;
    config.d_ff = 64;
    config.max_seq_len = 32;
    config.seed = SEED;
    let mut model = DecoderOnlyTransformer::new(
        config,
        FullSequenceAttentionKind::Flash,
        ActivationCheckpointingKind::Disabled,
    )?;
    let mut adam = Adam::new(model.trainable_parameters(), LR)?;
    for step in 0..STEPS {
        let policy = if step == 2 || step == 3 {
            ActivationCheckpointingKind::TransformerBlock
        } else {
            ActivationCheckpointingKind::Disabled
        };
        model.set_activation_checkpointing_kind(policy);
        let loss = model.loss(&block(&data, step), BATCH, SEQ_PLUS_ONE)?;
        loss.backward()?;
        adam.step()?;
        let loss = loss.value().item()?;
        println!(
            "step {step} policy {} loss {loss:.6} bits 0x{:08x}",
            policy.name(),
            loss.to_bits()
        );
    }
    let eval = model
        .loss(&block(&data, STEPS), BATCH, SEQ_PLUS_ONE)?
        .value()
        .item()?;
    println!("eval loss {eval:.6} bits 0x{:08x}", eval.to_bits());
    let mut session = model.decode_session()?;
    let mut line = String::from("decode");
    let mut token = 0u32;
    for i in 0..PROMPT + GENERATE {
        if let Some(&byte) = data.get(i).filter(|_| i < PROMPT) {
            token = u32::from(byte);
        }
        let logits = session.decode_token(token)?;
        // First maximum, as the C program's argmax.
        let mut best = 0;
        for (j, &x) in logits.iter().enumerate() {
            if x > logits[best] {
                best = j;
            }
        }
        token = best as u32;
        if i + 1 >= PROMPT {
            line.push_str(&format!(" {token}"));
        }
    }
    println!("{line}");
    Ok(())
}
