//! NF4 with double-quantized absmax (QLoRA; bitsandbytes' `quantize_4bit(quant_type="nf4",
//! blocksize=64, compress_statistics=True)`): the byte layout is in [`super::format`].

use super::format::QuantFormat;

/// The 16 NF4 values (bitsandbytes' `get_4bit_type("nf4")`, the quantiles of N(0, 1) scaled
/// to [-1, 1] with an exact zero).
pub const NF4: [f32; 16] = [
    -1.0,
    -0.696_192_8,
    -0.525_073_05,
    -0.394_917_5,
    -0.284_441_38,
    -0.184_773_43,
    -0.091_050_036,
    0.0,
    0.079_580_3,
    0.160_930_2,
    0.246_112_3,
    0.337_915_24,
    0.440_709_83,
    0.562_617,
    0.722_956_84,
    1.0,
];

/// bitsandbytes' signed dynamic map (`create_dynamic_map(signed=True)`), the 8-bit code of the
/// double-quantized absmax. Provisional: computed here in f64; to be replaced by the exact
/// float32 table of bitsandbytes.
pub fn dynamic_map() -> [f32; 256] {
    let mut data: Vec<f64> = Vec::with_capacity(256);
    for i in 0..7i32 {
        let items = (1usize << i) + 1;
        let b: Vec<f32> = (0..items)
            .map(|j| {
                if items == 1 {
                    0.1
                } else {
                    0.1 + (1.0 - 0.1) * j as f32 / (items - 1) as f32
                }
            })
            .collect();
        let scale = 10f64.powi(-6 + i);
        for w in b.windows(2) {
            let mean = f64::from((w[0] + w[1]) / 2.0);
            data.push(scale * mean);
            data.push(-scale * mean);
        }
    }
    data.push(0.0);
    data.push(1.0);
    while data.len() < 256 {
        data.push(0.0);
    }
    data.sort_by(f64::total_cmp);
    let mut out = [0.0f32; 256];
    for (o, d) in out.iter_mut().zip(data) {
        *o = d as f32;
    }
    out
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
