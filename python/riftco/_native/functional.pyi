"""Differentiable ops on riftco Variables (thin wrappers over ``riftco_autograd::ops``). Every
function releases the GIL while computing; shape problems raise ``riftco.ShapeError``."""

from collections.abc import Callable, Sequence

import numpy.typing as npt

from . import Variable

__all__ = [
    "add",
    "mul",
    "scale",
    "matmul",
    "linear",
    "silu",
    "swiglu",
    "softmax",
    "rms_norm",
    "sum",
    "reshape",
    "transpose",
    "permute",
    "concat",
    "cat",
    "stack",
    "cross_entropy",
    "dropout",
    "named",
]

def add(a: Variable, b: Variable) -> Variable:
    """``a + b`` (same shapes)."""

def mul(a: Variable, b: Variable) -> Variable:
    """``a * b`` elementwise (same shapes)."""

def scale(x: Variable, alpha: float) -> Variable:
    """``alpha * x``."""

def matmul(a: Variable, b: Variable) -> Variable:
    """``[m, k] @ [k, n] -> [m, n]``."""

def linear(x: Variable, w: Variable) -> Variable:
    """``x [..., in] @ w.T`` with ``w [out, in]`` -> ``[..., out]``."""

def silu(x: Variable) -> Variable:
    """``x * sigmoid(x)``."""

def swiglu(gate: Variable, up: Variable) -> Variable:
    """``silu(gate) * up`` (same shapes)."""

def softmax(x: Variable) -> Variable:
    """Softmax over the last axis."""

def rms_norm(x: Variable, weight: Variable, eps: float = 1e-5) -> Variable:
    """``x / sqrt(mean(x**2, -1) + eps) * weight`` with ``x [..., d]``, ``weight [d]``.

    Raises ``ConfigError`` unless ``eps`` (as a float32) is finite and > 0.
    """

def sum(x: Variable) -> Variable:
    """Sum of all elements, a one-element scalar."""

def reshape(x: Variable, shape: Sequence[int]) -> Variable:
    """The same elements with another shape of equal element count; one dimension may be ``-1``
    (inferred). ``ConfigError`` for several ``-1`` or one that cannot be inferred."""

def transpose(x: Variable, dim0: int, dim1: int) -> Variable:
    """Swaps axes ``dim0`` and ``dim1`` (negative count from the end), a differentiable copy.
    ``ShapeError`` for an axis out of range (naming it and the rank)."""

def permute(x: Variable, axes: Sequence[int]) -> Variable:
    """Output axis ``i`` is input axis ``axes[i]`` (NumPy's ``transpose(x, axes)``). ``ShapeError``
    for an axis out of range; ``ConfigError`` for a wrong count or a repeated axis."""

def concat(xs: Sequence[Variable], axis: int = 0) -> Variable:
    """Joins ``xs`` along ``axis`` (NumPy's ``concatenate``). ``ShapeError`` naming both shapes
    and the axis when they disagree off ``axis``; ``ConfigError`` for an empty sequence."""

cat = concat

def stack(xs: Sequence[Variable], axis: int = 0) -> Variable:
    """Stacks ``xs`` (one shape) along a new axis ``axis``. ``ShapeError`` naming both shapes
    when they differ; ``ConfigError`` for an empty sequence."""

def cross_entropy(logits: Variable, targets: npt.ArrayLike) -> Variable:
    """Mean softmax cross-entropy of ``logits [rows, vocab]`` and integer ``targets [rows]``
    (``TokenError`` for a target outside ``[0, vocab)``)."""

def dropout(
    x: Variable, p: float | None = None, seed: int | None = None, training: bool = True
) -> Variable:
    """Dropout with inverted scaling (kept elements scaled by ``1/(1-p)``), mask from
    Philox4x32-10: from ``seed`` alone, or drawn from this thread's generator
    (``riftco.manual_seed``); ``p`` defaults to 0.5, ``training=False`` returns ``x``
    (``ConfigError`` for ``p`` outside ``[0, 1)``)."""

def named(name: str, fn: Callable[..., Variable], *inputs: Variable) -> Variable:
    """``fn(*inputs)`` as the value ``name`` (``riftco.named``): kept by a ``checkpoint`` whose
    ``save`` lists ``name`` and not recomputed at its replay."""
