//! `loss_with_labels`: labels equal to the block give `loss` bitwise; ignored positions
//! (`IGNORE_INDEX`) leave the loss a mean over the others, checked against the per-token
//! cross-entropy of the logits in f64; bad labels are errors naming the value.
mod common;
use common::{block, model};
use riftco_transformer::{
    ActivationCheckpointingKind as Ck, FullSequenceAttentionKind as Attn, TransformerError,
    IGNORE_INDEX,
};

const BATCH: usize = 2;
const SEQ1: usize = 9;

#[test]
fn labels_equal_to_the_block_give_the_plain_loss_bitwise() {
    let m = model(Attn::Flash, Ck::TransformerBlock, true);
    let b = block(BATCH, SEQ1, 64);
    let labels: Vec<i64> = b.iter().map(|&t| i64::from(t)).collect();
    let plain = m.loss(&b, BATCH, SEQ1).unwrap().value().item().unwrap();
    let labelled = m.loss_with_labels(&b, &labels, BATCH, SEQ1).unwrap();
    assert_eq!(labelled.value().item().unwrap().to_bits(), plain.to_bits());
}

#[test]
fn ignored_positions_leave_the_mean_over_the_others() {
    let m = model(Attn::Materialized, Ck::Disabled, false);
    let b = block(BATCH, SEQ1, 64);
    let mut labels: Vec<i64> = b.iter().map(|&t| i64::from(t)).collect();
    for l in labels.iter_mut().take(5) {
        *l = IGNORE_INDEX;
    }
    labels[SEQ1 + 4] = IGNORE_INDEX;
    let got = f64::from(
        m.loss_with_labels(&b, &labels, BATCH, SEQ1)
            .unwrap()
            .value()
            .item()
            .unwrap(),
    );
    // The reference: per-token cross-entropy of the logits, in f64, over the kept positions.
    let seq = SEQ1 - 1;
    let inputs: Vec<u32> = b.chunks(SEQ1).flat_map(|r| r[..seq].to_vec()).collect();
    let logits = m.logits(&inputs, BATCH, seq).unwrap().value().to_vec();
    let vocab = 64;
    let (mut sum, mut n) = (0.0f64, 0usize);
    for bi in 0..BATCH {
        for t in 0..seq {
            let label = labels[bi * SEQ1 + t + 1];
            if label == IGNORE_INDEX {
                continue;
            }
            let row = &logits[(bi * seq + t) * vocab..(bi * seq + t + 1) * vocab];
            let max = row.iter().fold(f64::MIN, |m, &x| m.max(f64::from(x)));
            let lse = max
                + row
                    .iter()
                    .map(|&x| (f64::from(x) - max).exp())
                    .sum::<f64>()
                    .ln();
            sum += lse - f64::from(row[label as usize]);
            n += 1;
        }
    }
    assert_eq!(n, BATCH * seq - 5);
    let want = sum / n as f64;
    assert!((got - want).abs() <= 1e-5 * want.abs(), "{got} vs {want}");
}

#[test]
fn bad_labels_are_token_errors() {
    let m = model(Attn::Flash, Ck::Disabled, false);
    let b = block(BATCH, SEQ1, 64);
    let message = |labels: &[i64]| match m.loss_with_labels(&b, labels, BATCH, SEQ1) {
        Err(TransformerError::Tokens { message }) => message,
        other => panic!("expected a Tokens error, got {other:?}"),
    };
    assert!(message(&vec![IGNORE_INDEX; b.len()]).contains("every target position"));
    let mut bad: Vec<i64> = b.iter().map(|&t| i64::from(t)).collect();
    bad[3] = 64;
    assert!(message(&bad).contains("label 64 at index [0, 3]"));
    assert!(message(&bad[1..]).contains("labels hold"));
}
