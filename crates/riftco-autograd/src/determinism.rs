//! How a checkpoint verifies that its replay reproduced its forward run
//! ([`DeterminismCheck`]), and the 64-bit value hash the `values` level uses.

use crate::error::{AutogradError, CheckpointError, Result};
use crate::rng::RngState;
use riftco_tensor::Tensor;
use std::fmt;
use std::str::FromStr;

/// What a checkpoint compares between its forward run and its replay.
///
/// - `Off`: only the output shape is compared (for safety: a replay of another shape would
///   send a wrong-shaped gradient to the outer pass, so it stays an error, never a panic or a
///   silent wrong result); the device is not compared.
/// - `Metadata` (the default): the output's shape and device, and the graph the replay
///   records (the number of nodes inside the boundary and a hash of their op names and shapes:
///   a replay that takes another path, such as a module switched between `train()` and
///   `eval()` between forward and backward, is [`CheckpointError::ReplayGraphChanged`]); the
///   level of PyTorch's `torch.utils.checkpoint(determinism_check="default")`, which compares
///   the saved tensors' count and metadata. A callable whose replay computes other *values*
///   through the same ops (one that reads a counter, or draws other random numbers) is not
///   caught.
/// - `Values`: besides shape and device, a 64-bit hash of the output's f32 bit patterns
///   ([`value_hash`]) and the generator state after the run ([`crate::rng`]). A mismatch is
///   [`CheckpointError::ReplayValuesChanged`] (naming the first differing element and both
///   values) or [`CheckpointError::ReplayRngChanged`]; nothing is committed. Because it compares
///   the replay's output values, a `Values` replay runs its callable as
///   [`crate::CheckpointPass::Forward`] (a graph-only tail would leave them unevaluated).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum DeterminismCheck {
    /// Output shape only.
    Off,
    /// Output shape and device, and the replay's graph (op names and shapes).
    #[default]
    Metadata,
    /// Shape, device, a hash of the output values and the generator state.
    Values,
}

impl DeterminismCheck {
    /// Every level with its spelling.
    pub const ALL: [DeterminismCheck; 3] = [
        DeterminismCheck::Off,
        DeterminismCheck::Metadata,
        DeterminismCheck::Values,
    ];

    /// The spelling: `"off"`, `"metadata"` or `"values"`.
    pub fn as_str(self) -> &'static str {
        match self {
            DeterminismCheck::Off => "off",
            DeterminismCheck::Metadata => "metadata",
            DeterminismCheck::Values => "values",
        }
    }
}

impl fmt::Display for DeterminismCheck {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for DeterminismCheck {
    type Err = AutogradError;

    /// Parses `"off"`, `"metadata"` or `"values"` (surrounding whitespace ignored).
    ///
    /// # Errors
    /// [`AutogradError::UnknownOption`] naming the value and the three spellings.
    fn from_str(s: &str) -> Result<Self> {
        let t = s.trim();
        DeterminismCheck::ALL
            .into_iter()
            .find(|c| c.as_str() == t)
            .ok_or_else(|| AutogradError::UnknownOption {
                option: "determinism_check",
                value: s.to_string(),
                expected: r#""off", "metadata", "values""#,
            })
    }
}

// The 64-bit primes of xxHash (Yann Collet, XXH64 specification, `xxhash_spec.md`).
const P1: u64 = 0x9E37_79B1_85EB_CA87;
const P2: u64 = 0xC2B2_AE3D_27D4_EB4F;
const P3: u64 = 0x1656_67B1_9E37_79F9;
const P4: u64 = 0x85EB_CA77_C2B2_AE63;
const P5: u64 = 0x27D4_EB2F_1656_67C5;
const LANES: usize = 8;

/// XXH64's round: `acc = rotl(acc + input · P2, 31) · P1`.
#[inline(always)]
fn round(acc: u64, input: u64) -> u64 {
    acc.wrapping_add(input.wrapping_mul(P2))
        .rotate_left(31)
        .wrapping_mul(P1)
}

/// A 64-bit hash of `values`' f32 bit patterns and their count: deterministic, the same on every
/// platform and thread count (one sequential pass of integer arithmetic; `-0.0` and `0.0`, and
/// NaNs of different payloads, hash differently).
///
/// The construction is XXH64's (Yann Collet, xxHash specification) widened to eight lanes as in
/// XXH3: each pair of consecutive f32 words forms a 64-bit input, 64-byte stripes feed eight
/// independent accumulators with XXH64's round (so the loop has no serial dependency across
/// lanes and runs at memory speed), the lanes are merged with XXH64's merge round, a tail of
/// fewer than 16 elements goes through XXH64's 4-byte step, and XXH64's avalanche finishes. It
/// is not bit-compatible with XXH64 itself (the lane count differs); it is not a cryptographic
/// hash, which a determinism check does not need.
pub fn value_hash(values: &[f32]) -> u64 {
    let mut acc = [0u64; LANES];
    for (i, a) in acc.iter_mut().enumerate() {
        *a = P1.wrapping_mul(i as u64 + 1) ^ P5;
    }
    let mut stripes = values.chunks_exact(2 * LANES);
    for stripe in &mut stripes {
        for (lane, a) in acc.iter_mut().enumerate() {
            let w = u64::from(stripe[2 * lane].to_bits())
                | (u64::from(stripe[2 * lane + 1].to_bits()) << 32);
            *a = round(*a, w);
        }
    }
    let mut h = (values.len() as u64).wrapping_mul(P5);
    for a in acc {
        h ^= round(0, a);
        h = h.wrapping_mul(P1).wrapping_add(P4);
    }
    for v in stripes.remainder() {
        h ^= u64::from(v.to_bits()).wrapping_mul(P1);
        h = h.rotate_left(23).wrapping_mul(P2).wrapping_add(P3);
    }
    h ^= h >> 33;
    h = h.wrapping_mul(P2);
    h ^= h >> 29;
    h = h.wrapping_mul(P3);
    h ^ (h >> 32)
}

/// What a `Values` check records of one run: the output hash and the generator states before
/// and after the run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct RunRecord {
    pub(crate) hash: u64,
    pub(crate) rng_before: RngState,
    pub(crate) rng_after: RngState,
}

/// The hash of a tensor's values, read back from its device when needed.
pub(crate) fn tensor_hash(t: &Tensor) -> Result<u64> {
    match t.read() {
        Ok(host) => Ok(value_hash(&host)),
        Err(_) => Ok(value_hash(&t.to_host()?)),
    }
}

/// Compares a replay's record with the forward's; on a hash mismatch locates the first element
/// of `replay_out` that differs (bitwise) from the forward output `forward_out`.
pub(crate) fn compare_values(
    name: &str,
    preserve_rng_state: bool,
    forward: &RunRecord,
    replay: &RunRecord,
    forward_out: &Tensor,
    replay_out: &Tensor,
) -> Result<()> {
    if forward.hash != replay.hash {
        let (f, r) = (forward_out.to_host(), replay_out.to_host());
        let located = match (&f, &r) {
            (Ok(f), Ok(r)) => f
                .iter()
                .zip(r.iter())
                .position(|(a, b)| a.to_bits() != b.to_bits())
                .map(|i| (i, f[i], r[i])),
            _ => None,
        };
        return Err(match located {
            Some((index, forward_value, replay_value)) => CheckpointError::ReplayValuesChanged {
                name: name.to_string(),
                index,
                forward: forward_value,
                replay: replay_value,
            },
            None => CheckpointError::ReplayHashChanged {
                name: name.to_string(),
                forward_hash: forward.hash,
                replay_hash: replay.hash,
                reason: match (f, r) {
                    (Err(e), _) | (_, Err(e)) => format!("the values could not be read: {e}"),
                    _ => "no element differs from the checkpoint's output value, which was \
                          therefore changed after the forward run"
                        .to_string(),
                },
            },
        }
        .into());
    }
    let drawn = |r: &RunRecord| {
        (
            r.rng_after.seed,
            r.rng_after.offset.wrapping_sub(r.rng_before.offset),
        )
    };
    let same = if preserve_rng_state {
        forward.rng_after == replay.rng_after
    } else {
        drawn(forward) == drawn(replay)
    };
    if !same {
        return Err(CheckpointError::ReplayRngChanged {
            name: name.to_string(),
            forward_before: forward.rng_before,
            forward_after: forward.rng_after,
            replay_before: replay.rng_before,
            replay_after: replay.rng_after,
        }
        .into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spellings_round_trip_and_bad_ones_name_the_value() {
        for c in DeterminismCheck::ALL {
            assert_eq!(c.to_string().parse::<DeterminismCheck>().unwrap(), c);
        }
        assert_eq!(
            " values\n".parse::<DeterminismCheck>().unwrap(),
            DeterminismCheck::Values
        );
        let e = "Values!"
            .parse::<DeterminismCheck>()
            .unwrap_err()
            .to_string();
        assert!(e.contains("Values!") && e.contains("\"metadata\""), "{e}");
        assert_eq!(DeterminismCheck::default(), DeterminismCheck::Metadata);
    }

    #[test]
    fn the_hash_sees_every_bit_every_position_and_the_length() {
        let base: Vec<f32> = (0..1000).map(|i| i as f32 * 0.37 - 11.0).collect();
        let h = value_hash(&base);
        assert_eq!(h, value_hash(&base.clone()));
        for i in [0, 1, 15, 16, 17, 500, 991, 999] {
            for bit in [0, 13, 31] {
                let mut v = base.clone();
                v[i] = f32::from_bits(v[i].to_bits() ^ (1 << bit));
                assert_ne!(value_hash(&v), h, "element {i} bit {bit}");
            }
        }
        let mut swapped = base.clone();
        swapped.swap(3, 4);
        assert_ne!(value_hash(&swapped), h);
        swapped = base.clone();
        swapped.swap(3, 19);
        assert_ne!(value_hash(&swapped), h);
        // Elements of the same lane, 64 stripes (1024 elements) apart.
        let long: Vec<f32> = (0..3000).map(|i| i as f32).collect();
        let mut far = long.clone();
        far.swap(5, 5 + 1024);
        assert_ne!(value_hash(&far), value_hash(&long));
        assert_ne!(value_hash(&base[..999]), h);
        assert_ne!(value_hash(&[0.0]), value_hash(&[-0.0]));
        assert_ne!(value_hash(&[]), value_hash(&[0.0]));
    }
}
