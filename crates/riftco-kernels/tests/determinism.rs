//! Bitwise determinism across thread counts.
//!
//! The kernel pool's size is fixed per process (`RIFTCO_NUM_THREADS`), so the test re-runs this
//! test binary as a child with 1 and with 2 threads, each child printing a hash of every kernel's
//! output bits on sizes big enough to take the parallel paths, and requires identical hashes.

mod common;

use common::{hash, vec_from_seed};
use riftco_kernels::{adam, elementwise as ew, loss, matmul, norm, softmax};

const CHILD_ENV: &str = "RIFTCO_DETERMINISM_CHILD";

/// Runs the kernels and prints `name hash` lines (only when launched as the child).
#[test]
fn determinism_child() {
    if std::env::var_os(CHILD_ENV).is_none() {
        return;
    }
    let (rows, cols) = (300, 1000);
    let n = rows * cols;
    let x = vec_from_seed(n, 1, 6.0);
    let y = vec_from_seed(n, 2, 1.0);
    let w = vec_from_seed(cols, 3, 1.0);
    let mut out = vec![0.0; n];
    let mut out2 = vec![0.0; n];
    let mut lines = Vec::new();
    softmax::softmax_rows(&x, cols, &mut out);
    lines.push(("softmax_rows", hash(&out)));
    softmax::softmax_rows_backward(&out.clone(), &y, cols, &mut out2);
    lines.push(("softmax_rows_backward", hash(&out2)));
    let mut lse = vec![0.0; rows];
    softmax::logsumexp_rows(&x, cols, &mut lse);
    lines.push(("logsumexp_rows", hash(&lse)));
    let mut rstd = vec![0.0; rows];
    norm::rms_norm(&x, &w, 1e-5, &mut out, &mut rstd);
    lines.push(("rms_norm", hash(&out) ^ hash(&rstd)));
    let mut dw = vec![0.0; cols];
    norm::rms_norm_backward(&x, &w, &rstd, &y, &mut out, Some(&mut dw));
    lines.push(("rms_norm_backward", hash(&out) ^ hash(&dw).rotate_left(1)));
    ew::swiglu(&x, &y, &mut out);
    lines.push(("swiglu", hash(&out)));
    ew::swiglu_backward(&x, &w.repeat(rows), &y, &mut out, &mut out2);
    lines.push(("swiglu_backward", hash(&out) ^ hash(&out2).rotate_left(1)));
    let targets: Vec<u32> = (0..rows as u32).map(|r| r * 7 % cols as u32).collect();
    let l = loss::cross_entropy(&x, &targets, cols, &mut lse);
    loss::cross_entropy_backward(&x, &targets, &lse, 1.0, &mut out);
    lines.push(("cross_entropy", hash(&out) ^ l.to_bits() as u64));
    let (mut p, mut m, mut v) = (x.clone(), vec![0.0; n], vec![0.0; n]);
    adam::adam_update(&mut p, &y, &mut m, &mut v, 1, adam::AdamHyper::default());
    lines.push(("adam_update", hash(&p)));
    let d = 256;
    let spec = matmul::MatmulSpec::new(d, d, d);
    let mut c = vec![0.0; d * d];
    matmul::matmul(spec, &x[..d * d], &y[..d * d], &mut c);
    lines.push(("matmul", hash(&c)));
    let q = vec_from_seed(2 * 4 * 100 * 32, 5, 1.0);
    let dims = riftco_kernels::attention::AttentionDims {
        batch: 2,
        n_heads: 4,
        n_kv_heads: 4,
        seq_q: 100,
        seq_k: 100,
        d_head: 32,
    };
    let (mut o, mut olse) = (vec![0.0; q.len()], vec![0.0; 800]);
    riftco_kernels::attention::flash_attention_forward(
        &q,
        &y[..q.len()],
        &x[..q.len()],
        dims,
        0.2,
        true,
        &mut o,
        &mut olse,
    );
    let (mut dq, mut dk, mut dv) = (vec![0.0; q.len()], vec![0.0; q.len()], vec![0.0; q.len()]);
    riftco_kernels::attention::flash_attention_backward(
        &q,
        &y[..q.len()],
        &x[..q.len()],
        &o,
        &olse,
        &w[..1].repeat(q.len()),
        dims,
        0.2,
        true,
        &mut dq,
        &mut dk,
        &mut dv,
    );
    lines.push((
        "flash_attention",
        hash(&o) ^ hash(&dq) ^ hash(&dk).rotate_left(3) ^ hash(&dv).rotate_left(7),
    ));
    // The general maps, broadcasting binary ops (row-split walk) and axis reductions.
    use riftco_kernels::{broadcast, map, reduce, BinaryOp, ReduceOp, UnaryOp};
    map::unary(UnaryOp::Gelu, &x, &mut out);
    map::unary_backward(UnaryOp::Gelu, &x, &out.clone(), &y, &mut out2);
    lines.push(("unary_gelu", hash(&out) ^ hash(&out2).rotate_left(1)));
    map::unary(UnaryOp::Sigmoid, &x, &mut out);
    lines.push(("unary_sigmoid", hash(&out)));
    broadcast::binary(
        BinaryOp::Div,
        &x,
        &[rows, cols],
        &w,
        &[cols],
        &[rows, cols],
        &mut out,
    );
    lines.push(("binary_broadcast", hash(&out)));
    let mut col = vec![0.0; cols];
    reduce::reduce(ReduceOp::Sum, &x, &[rows, cols], &[1, cols], &mut col);
    reduce::reduce(ReduceOp::Max, &x, &[rows, cols], &[rows, 1], &mut lse);
    lines.push(("reduce", hash(&col) ^ hash(&lse).rotate_left(1)));
    for (name, h) in lines {
        println!("HASH {name} {h:016x}");
    }
}

fn child_hashes(threads: usize) -> Vec<String> {
    let lines = common::child_hashes("determinism_child", CHILD_ENV, threads);
    assert!(lines.len() >= 10, "child printed too few hashes: {lines:?}");
    lines
}

#[test]
fn bitwise_identical_with_one_and_two_threads() {
    let one = child_hashes(1);
    let two = child_hashes(2);
    let three = child_hashes(3);
    assert_eq!(one, two, "1 vs 2 threads");
    assert_eq!(one, three, "1 vs 3 threads");
}
