//! NF4 with double-quantized absmax (QLoRA; bitsandbytes' `quantize_4bit(quant_type="nf4",
//! blocksize=64, compress_statistics=True)`): the byte layout is in [`super::format`].

use super::format::QuantFormat;

/// The 16 NF4 values, as f32 bit patterns: bitsandbytes' `get_4bit_type("nf4")` (the
/// quantiles of N(0, 1) scaled to [-1, 1] with an exact zero; QLoRA, Dettmers et al. 2023,
/// appendix E). They define the format, so they are kept as the exact bits bitsandbytes 0.50.2
/// stores (`_get_4bit_code("nf4")`, equal to `nf4_lut` of its `csrc/cpu_ops.cpp`).
const NF4_BITS: [u32; 16] = [
    0xbf80_0000,
    0xbf32_39b1,
    0xbf06_6b30,
    0xbeca_32a0,
    0xbe91_a24d,
    0xbe3d_353f,
    0xbdba_7871,
    0x0000_0000,
    0x3da2_faff,
    0x3e24_cae3,
    0x3e7c_04dd,
    0x3ead_033a,
    0x3ee1_a4b8,
    0x3f10_07ab,
    0x3f39_13b3,
    0x3f80_0000,
];

/// The 16 NF4 values (bitsandbytes' `get_4bit_type("nf4")`), ascending.
pub const NF4: [f32; 16] = {
    let mut out = [0.0f32; 16];
    let mut i = 0;
    while i < 16 {
        out[i] = f32::from_bits(NF4_BITS[i]);
        i += 1;
    }
    out
};

/// bitsandbytes' signed dynamic map (`create_dynamic_map(signed=True)`, Dettmers et al. 2022,
/// "8-bit Optimizers via Block-wise Quantization"), the 8-bit code of the double-quantized
/// absmax, as the f32 bit patterns bitsandbytes 0.50.2 computes (`create_dynamic_map().float()`,
/// dumped; 256 distinct values ascending from -0.9929 to 1.0, with an exact zero at 127).
const DYNAMIC_BITS: [u32; 256] = [
    0xbf7e3333, 0xbf7a999a, 0xbf770000, 0xbf736666, 0xbf6fcccd, 0xbf6c3333, 0xbf68999a, 0xbf650000,
    0xbf616666, 0xbf5dcccd, 0xbf5a3333, 0xbf56999a, 0xbf530000, 0xbf4f6666, 0xbf4bcccd, 0xbf483333,
    0xbf44999a, 0xbf410000, 0xbf3d6666, 0xbf39cccd, 0xbf363334, 0xbf32999a, 0xbf2f0000, 0xbf2b6666,
    0xbf27cccd, 0xbf243334, 0xbf20999a, 0xbf1d0000, 0xbf196666, 0xbf15cccd, 0xbf123334, 0xbf0e999a,
    0xbf0b0000, 0xbf076666, 0xbf03cccc, 0xbf003333, 0xbef93332, 0xbef20000, 0xbeeacccc, 0xbee3999a,
    0xbedc6666, 0xbed53333, 0xbece0000, 0xbec6cccc, 0xbebf999a, 0xbeb86666, 0xbeb13333, 0xbeaa0000,
    0xbea2cccc, 0xbe9b999a, 0xbe946666, 0xbe8d3334, 0xbe860000, 0xbe7d9999, 0xbe6f3333, 0xbe60cccd,
    0xbe526666, 0xbe440000, 0xbe35999a, 0xbe273333, 0xbe18cccd, 0xbe0a6666, 0xbdf80000, 0xbddb3334,
    0xbdc9eb85, 0xbdc428f7, 0xbdbe6667, 0xbdb8a3d7, 0xbdb2e148, 0xbdad1eb8, 0xbda75c2a, 0xbda1999a,
    0xbd9bd70a, 0xbd96147b, 0xbd9051eb, 0xbd8a8f5d, 0xbd84cccd, 0xbd7e147b, 0xbd728f5d, 0xbd670a3d,
    0xbd5b851f, 0xbd500000, 0xbd447ae1, 0xbd38f5c3, 0xbd2d70a3, 0xbd21eb85, 0xbd166667, 0xbd0ae148,
    0xbcfeb852, 0xbce7ae15, 0xbcd0a3d7, 0xbcb9999a, 0xbca28f5d, 0xbc8b851f, 0xbc68f5c3, 0xbc3ae148,
    0xbc1f3b64, 0xbc160418, 0xbc0ccccd, 0xbc039581, 0xbbf4bc6a, 0xbbe24dd3, 0xbbcfdf3b, 0xbbbd70a4,
    0xbbab020d, 0xbb989374, 0xbb8624dd, 0xbb676c8a, 0xbb428f5c, 0xbb1db22d, 0xbaf1a9fc, 0xbaa7ef9d,
    0xba7765ff, 0xba59e83e, 0xba3c6a80, 0xba1eecc1, 0xba016f01, 0xb9c7e283, 0xb98ce705, 0xb923d70b,
    0xb8ba1f4b, 0xb88aefb3, 0xb8378034, 0xb7b24206, 0xb70205ff, 0xb65a1a94, 0xb513a3b7, 0x00000000,
    0x3513a3b7, 0x365a1a94, 0x370205ff, 0x37b24206, 0x38378034, 0x388aefb3, 0x38ba1f4b, 0x3923d70b,
    0x398ce705, 0x39c7e283, 0x3a016f01, 0x3a1eecc1, 0x3a3c6a80, 0x3a59e83e, 0x3a7765ff, 0x3aa7ef9d,
    0x3af1a9fc, 0x3b1db22d, 0x3b428f5c, 0x3b676c8a, 0x3b8624dd, 0x3b989374, 0x3bab020d, 0x3bbd70a4,
    0x3bcfdf3b, 0x3be24dd3, 0x3bf4bc6a, 0x3c039581, 0x3c0ccccd, 0x3c160418, 0x3c1f3b64, 0x3c3ae148,
    0x3c68f5c3, 0x3c8b851f, 0x3ca28f5d, 0x3cb9999a, 0x3cd0a3d7, 0x3ce7ae15, 0x3cfeb852, 0x3d0ae148,
    0x3d166667, 0x3d21eb85, 0x3d2d70a3, 0x3d38f5c3, 0x3d447ae1, 0x3d500000, 0x3d5b851f, 0x3d670a3d,
    0x3d728f5d, 0x3d7e147b, 0x3d84cccd, 0x3d8a8f5d, 0x3d9051eb, 0x3d96147b, 0x3d9bd70a, 0x3da1999a,
    0x3da75c2a, 0x3dad1eb8, 0x3db2e148, 0x3db8a3d7, 0x3dbe6667, 0x3dc428f7, 0x3dc9eb85, 0x3ddb3334,
    0x3df80000, 0x3e0a6666, 0x3e18cccd, 0x3e273333, 0x3e35999a, 0x3e440000, 0x3e526666, 0x3e60cccd,
    0x3e6f3333, 0x3e7d9999, 0x3e860000, 0x3e8d3334, 0x3e946666, 0x3e9b999a, 0x3ea2cccc, 0x3eaa0000,
    0x3eb13333, 0x3eb86666, 0x3ebf999a, 0x3ec6cccc, 0x3ece0000, 0x3ed53333, 0x3edc6666, 0x3ee3999a,
    0x3eeacccc, 0x3ef20000, 0x3ef93332, 0x3f003333, 0x3f03cccc, 0x3f076666, 0x3f0b0000, 0x3f0e999a,
    0x3f123334, 0x3f15cccd, 0x3f196666, 0x3f1d0000, 0x3f20999a, 0x3f243334, 0x3f27cccd, 0x3f2b6666,
    0x3f2f0000, 0x3f32999a, 0x3f363334, 0x3f39cccd, 0x3f3d6666, 0x3f410000, 0x3f44999a, 0x3f483333,
    0x3f4bcccd, 0x3f4f6666, 0x3f530000, 0x3f56999a, 0x3f5a3333, 0x3f5dcccd, 0x3f616666, 0x3f650000,
    0x3f68999a, 0x3f6c3333, 0x3f6fcccd, 0x3f736666, 0x3f770000, 0x3f7a999a, 0x3f7e3333, 0x3f800000,
];

/// bitsandbytes' signed dynamic map (`create_dynamic_map(signed=True)`, Dettmers et al. 2022),
/// ascending: the exact f32 values bitsandbytes 0.50.2 computes, kept as bit patterns here.
pub fn dynamic_map() -> [f32; 256] {
    DYNAMIC_BITS.map(f32::from_bits)
}

/// Dequantizes elements `start .. start + out.len()` (whole 64-element blocks, checked by the
/// caller) of an NF4 tensor of `numel` elements stored in `data`.
pub(crate) fn dequantize_range(data: &[u8], numel: usize, start: usize, out: &mut [f32]) {
    let block = QuantFormat::NF4_BLOCK;
    let blocks = numel / block;
    let codes = &data[..numel / 2];
    let qabsmax = &data[numel / 2..numel / 2 + blocks];
    let groups = blocks.div_ceil(QuantFormat::NF4_GROUP);
    let scales = &data[numel / 2 + blocks..numel / 2 + blocks + 4 * groups];
    let o = numel / 2 + blocks + 4 * groups;
    let offset = f32::from_le_bytes([data[o], data[o + 1], data[o + 2], data[o + 3]]);
    let dynamic = dynamic_map();
    for (k, values) in out.chunks_exact_mut(block).enumerate() {
        let b = start / block + k;
        let g = b / QuantFormat::NF4_GROUP;
        let scale = f32::from_le_bytes([
            scales[4 * g],
            scales[4 * g + 1],
            scales[4 * g + 2],
            scales[4 * g + 3],
        ]);
        let absmax = dynamic[usize::from(qabsmax[b])] * scale + offset;
        let bytes = &codes[b * block / 2..(b + 1) * block / 2];
        for (pair, &byte) in values.chunks_exact_mut(2).zip(bytes) {
            pair[0] = NF4[usize::from(byte >> 4)] * absmax;
            pair[1] = NF4[usize::from(byte & 0x0F)] * absmax;
        }
    }
}

/// The absmax of each 64-element block, as `x.abs().max(dim=-1)`.
fn block_absmax(values: &[f32]) -> Vec<f32> {
    values
        .chunks_exact(QuantFormat::NF4_BLOCK)
        .map(|b| b.iter().fold(0.0f32, |m, v| m.max(v.abs())))
        .collect()
}

/// The NF4 code of `x` in a block of absmax `absmax`, as bitsandbytes' `quantize_4bit` computes
/// it (its `default` kernel, the one its CPU backend runs): `scaled = clamp(x * (1 /
/// max(absmax, 1e-38)), -1, 1)` in f32, then `torch.bucketize(scaled, midpoints)`, the number of
/// midpoints of consecutive NF4 values (`(a + b) / 2` in f32) strictly below `scaled`, so a value
/// on a midpoint takes the lower code.
#[inline]
fn nf4_code(x: f32, inverse: f32, midpoints: &[f32; 15]) -> u8 {
    let scaled = (x * inverse).clamp(-1.0, 1.0);
    midpoints.iter().filter(|&&m| m < scaled).count() as u8
}

/// The sum of `x` as PyTorch's CPU `sum` of a contiguous float32 tensor computes it on one
/// thread (`cascade_sum` of `aten/src/ATen/native/cpu/SumKernel.cpp`, with the 8-lane float
/// vectors it dispatches `sum` with on x86-64): lanes of 8 summed in four interleaved rows by a
/// 4-level cascade of 16-element chunks, the leftover vectors into row 0, rows folded in order,
/// then the scalar tail and the 8 lanes in order. Rows shorter than 8 sum as 1-lane vectors.
fn torch_sum(x: &[f32]) -> f32 {
    const LANES: usize = 8;
    if x.len() >= LANES {
        let vectors = x.len() / LANES;
        let rows: Vec<[f32; LANES]> = x[..vectors * LANES]
            .chunks_exact(LANES)
            .map(|c| std::array::from_fn(|k| c[k]))
            .collect();
        let lanes = cascade_row_sum(&rows);
        let mut acc = 0.0f32;
        for &v in &x[vectors * LANES..] {
            acc += v;
        }
        for v in lanes {
            acc += v;
        }
        0.0 + acc
    } else {
        let rows: Vec<[f32; 1]> = x.iter().map(|&v| [v]).collect();
        0.0 + cascade_row_sum(&rows)[0]
    }
}

/// `row_sum` of SumKernel.cpp over `n` vectors of `L` lanes (lane-wise f32 additions): the
/// vectors viewed as rows of 4 (`ilp_factor`), summed by [`multi_row_sum`], the leftover vectors
/// added to the first partial sum, then the four partial sums folded in order.
fn cascade_row_sum<const L: usize>(elems: &[[f32; L]]) -> [f32; L] {
    const ILP: usize = 4;
    let rows = elems.len() / ILP;
    let mut partial = multi_row_sum::<L>(&elems[..rows * ILP]);
    for e in &elems[rows * ILP..] {
        add(&mut partial[0], e);
    }
    let mut out = partial[0];
    for p in &partial[1..] {
        add(&mut out, p);
    }
    out
}

/// Lane-wise `acc += v`.
#[inline]
fn add<const L: usize>(acc: &mut [f32; L], v: &[f32; L]) {
    for (a, b) in acc.iter_mut().zip(v) {
        *a += b;
    }
}

/// `multi_row_sum` of SumKernel.cpp with 4 rows: `elems` (4 vectors per row) summed in a cascade
/// of 4 levels, each level's accumulator taking the one below every `2^level_power` rows.
fn multi_row_sum<const L: usize>(elems: &[[f32; L]]) -> [[f32; L]; 4] {
    const LEVELS: usize = 4;
    let size = elems.len() / 4;
    let ceil_log2 = if size <= 2 {
        1
    } else {
        (usize::BITS - (size - 1).leading_zeros()) as usize
    };
    let level_power = (ceil_log2 / LEVELS).max(4);
    let level_step = 1usize << level_power;
    let level_mask = level_step - 1;
    let mut acc = [[[0.0f32; L]; 4]; LEVELS];
    let mut i = 0;
    while i + level_step <= size {
        for _ in 0..level_step {
            for k in 0..4 {
                add(&mut acc[0][k], &elems[4 * i + k]);
            }
            i += 1;
        }
        for j in 1..LEVELS {
            let (lower, upper) = acc.split_at_mut(j);
            for (up, low) in upper[0].iter_mut().zip(lower[j - 1].iter_mut()) {
                add(up, low);
                *low = [0.0; L];
            }
            if i & (level_mask << (j * level_power)) != 0 {
                break;
            }
        }
    }
    while i < size {
        for k in 0..4 {
            add(&mut acc[0][k], &elems[4 * i + k]);
        }
        i += 1;
    }
    let (first, rest) = acc.split_at_mut(1);
    for level in rest.iter() {
        for (a, b) in first[0].iter_mut().zip(level) {
            add(a, b);
        }
    }
    acc[0]
}

/// bitsandbytes' `quantize_blockwise` on the CPU (`quantize_cpu_impl` of `csrc/cpu_ops.cpp`)
/// with the dynamic map and blocks of 256: per group, `absmax = max |a|`, and each `a * (1 /
/// absmax)` clamped to [-1, 1] and mapped to one of 65536 bins (`(v + 1) * 0.5 * 65535 + 0.5`,
/// truncated), whose code is the number of midpoints of consecutive dynamic-map values
/// (`0.5 * (a + b)`) strictly below the bin's value `-1 + (2 * i) / 65535`. A group of zeros is
/// all code 0 with absmax 0. (The library is built with FMA, so its `* 65535 + 0.5` may be
/// fused. Fused and unfused differ by at most one bin and only where the code changes between
/// two bins can that matter: for every f32 within 4096 ulps of each of those 248 boundaries
/// both give the same code, checked against bitsandbytes 0.50.2's map.)
fn quantize_dynamic(a: &[f32], codes: &mut [u8], absmax: &mut [f32]) {
    let map = dynamic_map();
    let midpoints: [f32; 255] = std::array::from_fn(|k| 0.5 * (map[k] + map[k + 1]));
    let bin_code = |bin: u16| {
        let value = -1.0f32 + (2.0 * f32::from(bin)) / 65535.0;
        midpoints.iter().take_while(|&&m| m < value).count() as u8
    };
    for ((group, codes), am) in a
        .chunks(QuantFormat::NF4_GROUP)
        .zip(codes.chunks_mut(QuantFormat::NF4_GROUP))
        .zip(absmax.iter_mut())
    {
        *am = group.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        if *am == 0.0 {
            codes.fill(0);
            continue;
        }
        let inverse = 1.0f32 / *am;
        for (c, &v) in codes.iter_mut().zip(group) {
            let v = (v * inverse).clamp(-1.0, 1.0);
            let bin = (v + 1.0) * 0.5 * 65535.0 + 0.5;
            *c = bin_code(bin as u16);
        }
    }
}

/// Quantizes `values` (whole 64-element blocks, finite; checked by the caller) to NF4 with
/// double-quantized absmax in the layout of [`super::format`], as bitsandbytes'
/// `quantize_4bit(A, blocksize=64, quant_type="nf4", compress_statistics=True)` on the CPU: the
/// codes and block absmaxes of its `quantize_4bit` kernel, `offset = absmax.mean()` (PyTorch's
/// CPU sum on one thread, see [`torch_sum`], divided by the block count in f32), and
/// `quantize_blockwise(absmax - offset, blocksize=256)` (see [`quantize_dynamic`]). An empty
/// tensor has offset 0.
pub(crate) fn quantize(values: &[f32]) -> Vec<u8> {
    let n = values.len();
    let blocks = n / QuantFormat::NF4_BLOCK;
    let groups = blocks.div_ceil(QuantFormat::NF4_GROUP);
    let midpoints: [f32; 15] = std::array::from_fn(|k| (NF4[k] + NF4[k + 1]) / 2.0);
    let absmax = block_absmax(values);
    let mut out = vec![0u8; n / 2 + blocks + 4 * groups + 4];
    for ((block, &am), packed) in values
        .chunks_exact(QuantFormat::NF4_BLOCK)
        .zip(&absmax)
        .zip(out.chunks_exact_mut(QuantFormat::NF4_BLOCK / 2))
    {
        let inverse = 1.0f32 / am.max(1e-38);
        for (byte, pair) in packed.iter_mut().zip(block.chunks_exact(2)) {
            let hi = nf4_code(pair[0], inverse, &midpoints);
            let lo = nf4_code(pair[1], inverse, &midpoints);
            *byte = (hi << 4) | lo;
        }
    }
    let offset = if blocks == 0 {
        0.0
    } else {
        torch_sum(&absmax) / blocks as f32
    };
    let centred: Vec<f32> = absmax.iter().map(|&a| a - offset).collect();
    let mut scales = vec![0.0f32; groups];
    let (codes, rest) = out[n / 2..].split_at_mut(blocks);
    quantize_dynamic(&centred, codes, &mut scales);
    for (dst, s) in rest.chunks_exact_mut(4).zip(&scales) {
        dst.copy_from_slice(&s.to_le_bytes());
    }
    let o = rest.len() - 4;
    rest[o..].copy_from_slice(&offset.to_le_bytes());
    out
}
