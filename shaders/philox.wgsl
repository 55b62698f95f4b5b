// Philox4x32-10 (Salmon, Moraes, Dror, Shaw 2011, "Parallel Random Numbers: As Easy as 1, 2, 3",
// section 4.3): ten rounds of the 4x32 bijection with the Weyl key schedule, bit for bit
// riftco-kernels' philox::philox4x32_10.
// WGSL has 32-bit integers only: the 32 x 32 -> 64-bit products of the rounds are formed from
// 16-bit halves (mulhi); the low word is the wrapping u32 product.
//
// A library file: no bindings and no entry points. It is prepended to the shaders that use it
// (dropout.wgsl, flash_attention.wgsl) when their pipelines are built
// (riftco_gpu::pipelines::Family::source), so its names (M0, M1, W0, W1, mulhi, philox_round,
// philox4x32_10) must not be declared again there.

const M0: u32 = 0xD2511F53u;
const M1: u32 = 0xCD9E8D57u;
const W0: u32 = 0x9E3779B9u;
const W1: u32 = 0xBB67AE85u;

// High 32 bits of the 64-bit product a * b, from 16-bit halves.
fn mulhi(a: u32, b: u32) -> u32 {
    let a_lo = a & 0xffffu;
    let a_hi = a >> 16u;
    let b_lo = b & 0xffffu;
    let b_hi = b >> 16u;
    let ll = a_lo * b_lo;
    let lh = a_lo * b_hi;
    let hl = a_hi * b_lo;
    let hh = a_hi * b_hi;
    // (ll >> 16) + low halves of the cross terms: below 3 * 2^16, no overflow.
    let mid = (ll >> 16u) + (lh & 0xffffu) + (hl & 0xffffu);
    return hh + (lh >> 16u) + (hl >> 16u) + (mid >> 16u);
}

fn philox_round(c: vec4<u32>, k: vec2<u32>) -> vec4<u32> {
    return vec4<u32>(
        mulhi(M1, c.z) ^ c.y ^ k.x,
        M1 * c.z,
        mulhi(M0, c.x) ^ c.w ^ k.y,
        M0 * c.x,
    );
}

fn philox4x32_10(counter: vec4<u32>, key: vec2<u32>) -> vec4<u32> {
    var c = philox_round(counter, key);
    var k = key;
    for (var r = 1u; r < 10u; r = r + 1u) {
        k = k + vec2<u32>(W0, W1);
        c = philox_round(c, k);
    }
    return c;
}
