//! Tensor shapes.

use crate::{Result, TensorError};
use std::fmt;

/// The most elements a tensor may have: its `4 · numel` bytes must fit in `isize::MAX`, Rust's
/// bound on one allocation (2^61 − 1 elements on 64-bit targets).
pub const MAX_ELEMENTS: usize = isize::MAX as usize / std::mem::size_of::<f32>();

/// The dimensions of a contiguous row-major tensor, outermost first. A rank-0 shape is a scalar
/// with one element.
///
/// A shape is *valid* when the product of its non-zero dimensions is at most [`MAX_ELEMENTS`]
/// (the rule NumPy applies: `[2^62, 4, 0]` is rejected although it holds no element). Every
/// [`crate::Tensor`] has a valid shape: its constructors and `reshape` check with
/// [`Shape::checked_numel`], and ops build output shapes with [`Shape::try_new`], so no element
/// count computed from a tensor's dimensions can wrap.
#[derive(Clone, PartialEq, Eq, Hash, Default)]
pub struct Shape(Vec<usize>);

impl Shape {
    /// A shape from its dimensions, unchecked (see [`Shape::try_new`] for sizes that come from
    /// input or from another tensor's dimensions).
    pub fn new(dims: impl Into<Vec<usize>>) -> Self {
        Shape(dims.into())
    }

    /// A shape from its dimensions, checked.
    ///
    /// # Errors
    /// [`TensorError::ShapeOverflow`] naming `op` when the product of the non-zero dimensions
    /// exceeds [`MAX_ELEMENTS`].
    pub fn try_new(op: &'static str, dims: impl Into<Vec<usize>>) -> Result<Self> {
        let shape = Shape(dims.into());
        shape.check(op)?;
        Ok(shape)
    }

    /// The element count if the shape is valid (the product of the non-zero dimensions is at
    /// most [`MAX_ELEMENTS`]), else `None`.
    pub fn checked_numel(&self) -> Option<usize> {
        let mut nonzero: usize = 1;
        let mut zero = false;
        for &d in &self.0 {
            if d == 0 {
                zero = true;
            } else {
                nonzero = nonzero.checked_mul(d).filter(|&n| n <= MAX_ELEMENTS)?;
            }
        }
        Some(if zero { 0 } else { nonzero })
    }

    /// The element count of a valid shape.
    ///
    /// # Errors
    /// [`TensorError::ShapeOverflow`] naming `op` for an invalid shape.
    pub fn check(&self, op: &'static str) -> Result<usize> {
        self.checked_numel()
            .ok_or_else(|| TensorError::ShapeOverflow {
                op,
                shape: self.0.clone(),
            })
    }

    /// Bytes of an f32 tensor of this shape (`4 · numel`), `None` for an invalid shape.
    pub fn checked_bytes(&self) -> Option<usize> {
        // Cannot overflow: numel <= MAX_ELEMENTS = isize::MAX / 4.
        self.checked_numel().map(|n| n * std::mem::size_of::<f32>())
    }

    /// The scalar shape `[]`.
    pub fn scalar() -> Self {
        Shape(Vec::new())
    }

    /// The dimensions.
    pub fn dims(&self) -> &[usize] {
        &self.0
    }

    /// Number of dimensions.
    pub fn rank(&self) -> usize {
        self.0.len()
    }

    /// Number of elements (product of dimensions; 1 for a scalar). For an invalid shape (never
    /// the shape of a tensor) it is `usize::MAX`, which no buffer length can match, instead of a
    /// wrapped product.
    pub fn numel(&self) -> usize {
        self.checked_numel().unwrap_or(usize::MAX)
    }

    /// The last dimension (1 for a scalar).
    pub fn last_dim(&self) -> usize {
        self.0.last().copied().unwrap_or(1)
    }

    /// Whether any dimension is zero.
    pub fn has_zero_dim(&self) -> bool {
        self.0.contains(&0)
    }
}

impl fmt::Debug for Shape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.0)
    }
}

impl fmt::Display for Shape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.0)
    }
}

impl From<Vec<usize>> for Shape {
    fn from(v: Vec<usize>) -> Self {
        Shape(v)
    }
}

impl From<&[usize]> for Shape {
    fn from(v: &[usize]) -> Self {
        Shape(v.to_vec())
    }
}

impl<const N: usize> From<[usize; N]> for Shape {
    fn from(v: [usize; N]) -> Self {
        Shape(v.to_vec())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overflowing_shapes_are_rejected() {
        for dims in [
            vec![1usize << 63, 2],
            vec![1 << 32, 1 << 32],
            vec![1 << 62, 4, 0],
            vec![MAX_ELEMENTS, 2],
            vec![usize::MAX],
        ] {
            let shape = Shape::new(dims.clone());
            assert_eq!(shape.checked_numel(), None, "{dims:?}");
            assert_eq!(shape.numel(), usize::MAX, "{dims:?}");
            assert_eq!(
                Shape::try_new("test", dims.clone()),
                Err(TensorError::ShapeOverflow {
                    op: "test",
                    shape: dims.clone()
                })
            );
        }
    }

    #[test]
    fn valid_shapes_count_their_elements() {
        assert_eq!(Shape::scalar().checked_numel(), Some(1));
        assert_eq!(Shape::new([2, 3, 4]).checked_numel(), Some(24));
        assert_eq!(Shape::new([1 << 32, 0]).checked_numel(), Some(0));
        assert_eq!(
            Shape::new([MAX_ELEMENTS]).checked_numel(),
            Some(MAX_ELEMENTS)
        );
        assert_eq!(Shape::new([3, 5]).checked_bytes(), Some(60));
        assert_eq!(
            Shape::try_new("test", [1 << 20, 1 << 20]).unwrap().numel(),
            1 << 40
        );
    }
}
