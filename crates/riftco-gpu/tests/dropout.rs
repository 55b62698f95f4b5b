//! Philox4x32-10 and dropout on the GPU vs `riftco_kernels::philox` — bitwise: Random123's
//! known-answer vectors (the ones `crates/riftco-kernels/tests/dropout.rs` checks on the CPU)
//! reproduced on the GPU, the GPU's words equal to the CPU's for many counters and keys (high
//! bits set, so the 16-bit-half products are exercised), and dropout's output bitwise the CPU
//! kernel's for several `p`, offsets that wrap the 64-bit block counter, and edge lengths.

mod common;

use common::checks::assert_shape_error;
use common::{gpu_or_skip, SIZES};
use riftco_gpu::kernels;
use riftco_kernels::philox::{philox4x32_10, DropoutMask};

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

#[test]
fn philox_reproduces_the_random123_known_answers() {
    let Some(ctx) = gpu_or_skip("philox_reproduces_the_random123_known_answers") else {
        return;
    };
    // Random123 `examples/kat_vectors`, philox4x32 10: CTR, KEY, EXPECTED.
    let counters = [
        [0; 4],
        [u32::MAX; 4],
        [0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344],
    ];
    let keys = [[0; 2], [u32::MAX; 2], [0xa4093822, 0x299f31d0]];
    let want: [u32; 12] = [
        0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8, 0x408f276d, 0x41c83b0e, 0xa20bc7c6,
        0x6d5451fd, 0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1,
    ];
    let got = kernels::philox4x32_10_blocks(&ctx, &counters, &keys).unwrap();
    assert_eq!(bits(&ctx.download(&got).unwrap()), want.to_vec());
}

#[test]
fn philox_words_match_the_cpu_for_many_counters_and_keys() {
    let Some(ctx) = gpu_or_skip("philox_words_match_the_cpu_for_many_counters_and_keys") else {
        return;
    };
    let mut s = 0x9e37_79b9u32;
    let mut next = || {
        s ^= s << 13;
        s ^= s >> 17;
        s ^= s << 5;
        s
    };
    let n = 1000;
    let counters: Vec<[u32; 4]> = (0..n).map(|_| [next(), next(), next(), next()]).collect();
    let keys: Vec<[u32; 2]> = (0..n).map(|_| [next(), next()]).collect();
    let want: Vec<u32> = counters
        .iter()
        .zip(&keys)
        .flat_map(|(c, k)| philox4x32_10(*c, *k))
        .collect();
    let got = kernels::philox4x32_10_blocks(&ctx, &counters, &keys).unwrap();
    assert_eq!(bits(&ctx.download(&got).unwrap()), want);
}

#[test]
fn dropout_matches_the_cpu_bitwise() {
    let Some(ctx) = gpu_or_skip("dropout_matches_the_cpu_bitwise") else {
        return;
    };
    for p in [0.0, 0.1, 0.5, 0.9] {
        for offset in [0, 7, u64::MAX - 3, (1 << 32) - 1] {
            for n in SIZES.into_iter().chain([0, 4, 1000]) {
                let mask = DropoutMask {
                    p,
                    key: [0x1234_5678, 0x9abc_def0],
                    stream: [3, 0xffff_fffe],
                    offset,
                };
                let x = common::values(n, 141, -2.0, 2.0);
                let mut want = vec![0.0; n];
                riftco_kernels::dropout::dropout(&x, &mut want, &mask);
                let got = kernels::dropout(&ctx, &ctx.upload(&x).unwrap(), &mask).unwrap();
                assert_eq!(
                    bits(&ctx.download(&got).unwrap()),
                    bits(&want),
                    "p={p} offset={offset} n={n}"
                );
            }
        }
    }
}

#[test]
fn bad_input_is_a_shape_error() {
    let Some(ctx) = gpu_or_skip("bad_input_is_a_shape_error") else {
        return;
    };
    assert_shape_error(
        "keys",
        kernels::philox4x32_10_blocks(&ctx, &[[0; 4], [1; 4]], &[[0; 2]]),
        &["1 keys", "2 counters"],
    );
    let x = ctx.upload(&[1.0; 4]).unwrap();
    for p in [1.0, -0.1, f32::NAN] {
        let mask = DropoutMask {
            p,
            key: [0, 0],
            stream: [0, 0],
            offset: 0,
        };
        assert_shape_error("p", kernels::dropout(&ctx, &x, &mask), &["p = "]);
    }
}
