//! Embedding gather and its VJP on the GPU vs `riftco_kernels::embedding` — bitwise: the
//! gather copies, and the VJP adds each vocabulary row's gradients in increasing token index,
//! the CPU's order, with no float atomics — on edge sizes (one id, repeated ids, ids that never
//! occur, `d` 1 and past the workgroup), two runs bitwise equal, and bad input. The VJP of a
//! gather is a sum, so the bitwise match with the CPU's scatter-add (a plain loop anyone can
//! read) is its exact check; no finite differences are needed.

mod common;

use common::checks::assert_shape_error;
use common::{gpu_or_skip, values};
use riftco_gpu::kernels;
use riftco_kernels::embedding as cpu;

fn ids(n: usize, vocab: usize, seed: u32) -> Vec<u32> {
    values(n, seed, 0.0, vocab as f32)
        .into_iter()
        .map(|v| (v as u32).min(vocab as u32 - 1))
        .collect()
}

#[test]
fn embedding_and_its_vjp_match_the_cpu_bitwise() {
    let Some(ctx) = gpu_or_skip("embedding_and_its_vjp_match_the_cpu_bitwise") else {
        return;
    };
    for (vocab, d, n) in [
        (1, 1, 1),
        (5, 7, 1),
        (3, 4, 40),
        (11, 257, 9),
        (64, 3, 0),
        (70, 5, 300),
    ] {
        let table = values(vocab * d, 91, -1.0, 1.0);
        let tokens = ids(n, vocab, 92 + n as u32);
        let gt = ctx.upload(&table).unwrap();
        let mut want = vec![0.0; n * d];
        cpu::embedding(&table, d, &tokens, &mut want);
        let got = ctx
            .download(&kernels::embedding(&ctx, &gt, d, &tokens).unwrap())
            .unwrap();
        assert_eq!(got, want, "embedding vocab={vocab} d={d} n={n}");

        let dy = values(n * d, 93, -1.0, 1.0);
        let mut dtable = vec![0.0; vocab * d];
        cpu::embedding_backward(&tokens, &dy, d, &mut dtable);
        let gd = ctx.upload(&dy).unwrap();
        let first = kernels::embedding_backward(&ctx, &tokens, &gd, d, vocab).unwrap();
        let second = kernels::embedding_backward(&ctx, &tokens, &gd, d, vocab).unwrap();
        let (first, second) = (
            ctx.download(&first).unwrap(),
            ctx.download(&second).unwrap(),
        );
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(
            bits(&first),
            bits(&dtable),
            "embedding_backward vs cpu vocab={vocab} d={d} n={n}"
        );
        assert_eq!(bits(&first), bits(&second), "embedding_backward run to run");
    }
}

#[test]
fn bad_input_is_a_shape_error() {
    let Some(ctx) = gpu_or_skip("bad_input_is_a_shape_error") else {
        return;
    };
    let table = ctx.upload(&[0.0; 12]).unwrap();
    assert_shape_error("d 0", kernels::embedding(&ctx, &table, 0, &[0]), &["d = 0"]);
    assert_shape_error(
        "12 % 5",
        kernels::embedding(&ctx, &table, 5, &[0]),
        &["12", "10"],
    );
    assert_shape_error(
        "id out of range",
        kernels::embedding(&ctx, &table, 4, &[0, 2, 3]),
        &["ids[2] = 3", "< 3"],
    );
    let dy = ctx.upload(&[0.0; 8]).unwrap();
    assert_shape_error(
        "dy length",
        kernels::embedding_backward(&ctx, &[0, 1, 2], &dy, 4, 3),
        &["dy", "8", "12"],
    );
    assert_shape_error(
        "backward id out of range",
        kernels::embedding_backward(&ctx, &[0, 7], &dy, 4, 3),
        &["ids[1] = 7", "< 3"],
    );
    assert_shape_error(
        "vocab 0",
        kernels::embedding_backward(&ctx, &[], &ctx.alloc(0).unwrap(), 4, 0),
        &["vocab = 0"],
    );
    assert_shape_error(
        "overflowing vocab · d",
        kernels::embedding_backward(&ctx, &[], &ctx.alloc(0).unwrap(), 1 << 40, 1 << 40),
        &["overflows"],
    );
}
