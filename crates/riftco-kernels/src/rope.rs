//! Rotary position embedding (Su et al. 2021, "RoFormer", eq. 34) with the rotate-half pairing
//! used by LLaMA and Hugging Face: dimension `i` pairs with `i + d_head/2`, and frequency
//! `θ_i = theta^(−2i/d_head)`.
//!
//! `out[i]       = x[i]·cos(p·θ_i) − x[i+h]·sin(p·θ_i)`
//! `out[i+h]     = x[i+h]·cos(p·θ_i) + x[i]·sin(p·θ_i)`, `h = d_head/2`, `p` the position.

/// Precomputed `cos`/`sin` of `p·θ_i` for positions `0..max_positions`, `[max_positions, d_head/2]`.
///
/// The values never change after construction; [`RopeTable::id`] names them (device backends
/// cache their copy of the table under it).
#[derive(Clone, Debug)]
pub struct RopeTable {
    /// Head dimension (even).
    pub d_head: usize,
    /// Number of positions covered.
    pub max_positions: usize,
    cos: Vec<f32>,
    sin: Vec<f32>,
    id: u64,
}

/// The id of the next table built (process-wide; ids are never reused).
static NEXT_TABLE_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

impl RopeTable {
    /// Builds the table; angles are computed in f64 and rounded once to f32.
    ///
    /// # Panics
    /// When `d_head` is odd or zero (the model config validates this first), or where
    /// [`RopeTable::try_new`] returns an error.
    pub fn new(max_positions: usize, d_head: usize, theta: f64) -> Self {
        Self::try_new(max_positions, d_head, theta)
            .unwrap_or_else(|e| panic!("RopeTable of {max_positions} positions: {e}"))
    }

    /// [`RopeTable::new`] with both tables (`max_positions · d_head/2` elements each) allocated
    /// fallibly and in full before any angle is computed.
    ///
    /// # Errors
    /// When `max_positions · d_head/2` overflows (`CapacityOverflow`) or the allocator refuses
    /// the tables.
    ///
    /// # Panics
    /// When `d_head` is odd or zero.
    pub fn try_new(
        max_positions: usize,
        d_head: usize,
        theta: f64,
    ) -> Result<Self, std::collections::TryReserveError> {
        assert!(
            d_head > 0 && d_head % 2 == 0,
            "RopeTable: d_head must be even"
        );
        let inv_freq: Vec<f64> = (0..d_head / 2)
            .map(|i| 1.0 / theta.powf((2 * i) as f64 / d_head as f64))
            .collect();
        Self::try_from_inverse_frequencies(max_positions, &inv_freq)
    }

    /// The table of the given inverse frequencies (radians per position, one per rotated pair,
    /// `d_head = 2 · inv_freq.len()`), e.g. scaled ones (linear or Llama 3 RoPE scaling): entry
    /// `(p, i)` is `cos`/`sin` of `p · inv_freq[i]`, computed in f64 and rounded once to f32.
    /// Both tables are allocated fallibly and in full before any angle is computed.
    ///
    /// # Errors
    /// As [`RopeTable::try_new`].
    ///
    /// # Panics
    /// When `inv_freq` is empty.
    pub fn try_from_inverse_frequencies(
        max_positions: usize,
        inv_freq: &[f64],
    ) -> Result<Self, std::collections::TryReserveError> {
        assert!(!inv_freq.is_empty(), "RopeTable: d_head must be even");
        let half = inv_freq.len();
        // An overflowing count asks for usize::MAX elements, which try_reserve_exact refuses.
        let len = max_positions.saturating_mul(half);
        let (mut cos, mut sin) = (Vec::new(), Vec::new());
        cos.try_reserve_exact(len)?;
        sin.try_reserve_exact(len)?;
        for p in 0..max_positions {
            for &f in inv_freq {
                // HF computes inv_freq in f32 then multiplies; we keep f64 for the angle.
                let angle = p as f64 * f;
                cos.push(angle.cos() as f32);
                sin.push(angle.sin() as f32);
            }
        }
        Ok(Self {
            d_head: 2 * half,
            max_positions,
            cos,
            sin,
            id: NEXT_TABLE_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
        })
    }

    /// A process-unique id of this table's values: every construction gets a new one, a clone
    /// keeps it (the values are immutable, so equal ids mean equal values). A GPU backend keys
    /// its device copy of the table on it instead of uploading the table on every call.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// `cos(p·θ_i)` for `i in 0..d_head/2`.
    pub fn cos_row(&self, p: usize) -> &[f32] {
        let h = self.d_head / 2;
        &self.cos[p * h..(p + 1) * h]
    }

    /// `sin(p·θ_i)` for `i in 0..d_head/2`.
    pub fn sin_row(&self, p: usize) -> &[f32] {
        let h = self.d_head / 2;
        &self.sin[p * h..(p + 1) * h]
    }
}

/// Applies RoPE to `x` laid out `[batch, seq_len, n_heads, d_head]` (any batch), the token at
/// sequence index `s` getting position `start_pos + s`. With `inverse`, rotates by `−p·θ_i`, which
/// is the VJP (the rotation is orthogonal).
///
/// # Panics
/// When lengths disagree or a position exceeds the table (callers validate first).
pub fn rope(
    table: &RopeTable,
    x: &[f32],
    seq_len: usize,
    n_heads: usize,
    start_pos: usize,
    inverse: bool,
    out: &mut [f32],
) {
    let d = table.d_head;
    let token = n_heads * d;
    assert!(
        seq_len > 0 && x.len() % (seq_len * token) == 0,
        "rope: layout"
    );
    assert_eq!(x.len(), out.len(), "rope: output length");
    assert!(start_pos + seq_len <= table.max_positions, "rope: position");
    let tokens = x.len() / token;
    let serial = |t0: usize, x: &[f32], out: &mut [f32]| {
        crate::simd::arch().dispatch(RopeOp {
            table,
            x,
            token,
            seq_len,
            start_pos,
            t0,
            inverse,
            out,
        })
    };
    match crate::par::rows_per_task(tokens, token) {
        None => serial(0, x, out),
        Some(r) => crate::par::install(|| {
            use rayon::prelude::*;
            x.par_chunks(r * token)
                .zip(out.par_chunks_mut(r * token))
                .enumerate()
                .for_each(|(b, (x, o))| serial(b * r, x, o));
        }),
    }
}

crate::simd::simd_op!(RopeOp<'a> {
    table: &'a RopeTable, x: &'a [f32], token: usize, seq_len: usize, start_pos: usize,
    t0: usize, inverse: bool, out: &'a mut [f32]
} -> () = |s| rope_tokens(s, table, x, token, seq_len, start_pos, t0, inverse, out));

/// RoPE on whole tokens; `t0` is the global token index of the first one.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn rope_tokens<S: pulp::Simd>(
    s: S,
    table: &RopeTable,
    x: &[f32],
    token: usize,
    seq_len: usize,
    start_pos: usize,
    t0: usize,
    inverse: bool,
    out: &mut [f32],
) {
    let d = table.d_head;
    let h = d / 2;
    let sign = if inverse { -1.0f32 } else { 1.0 };
    let lanes = S::F32_LANES;
    let full = h - h % lanes;
    for (t, (xt, ot)) in x
        .chunks_exact(token)
        .zip(out.chunks_exact_mut(token))
        .enumerate()
    {
        let p = start_pos + (t0 + t) % seq_len;
        let (c, sn) = (table.cos_row(p), table.sin_row(p));
        for (xh, oh) in xt.chunks_exact(d).zip(ot.chunks_exact_mut(d)) {
            let (x1, x2) = xh.split_at(h);
            let (o1, o2) = oh.split_at_mut(h);
            let mut i = 0;
            while i < full {
                let (ci, si) = (
                    crate::simd::load_at::<S>(c, i),
                    s.mul_f32s(s.splat_f32s(sign), crate::simd::load_at::<S>(sn, i)),
                );
                let (a, b) = (
                    crate::simd::load_at::<S>(x1, i),
                    crate::simd::load_at::<S>(x2, i),
                );
                S::as_mut_simd_f32s(&mut o1[i..i + lanes]).0[0] =
                    s.sub_f32s(s.mul_f32s(a, ci), s.mul_f32s(b, si));
                S::as_mut_simd_f32s(&mut o2[i..i + lanes]).0[0] =
                    s.add_f32s(s.mul_f32s(b, ci), s.mul_f32s(a, si));
                i += lanes;
            }
            for i in full..h {
                let (ci, si) = (c[i], sign * sn[i]);
                o1[i] = x1[i] * ci - x2[i] * si;
                o2[i] = x2[i] * ci + x1[i] * si;
            }
        }
    }
}
