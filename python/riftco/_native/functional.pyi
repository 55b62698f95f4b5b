"""Differentiable ops on riftco Variables (thin wrappers over ``riftco_autograd::ops``). Every
function releases the GIL while computing; shape problems raise ``riftco.ShapeError``."""

from collections.abc import Callable, Sequence
from typing import SupportsIndex

import numpy.typing as npt

from . import Variable

__all__ = [
    "add",
    "sub",
    "mul",
    "div",
    "neg",
    "pow",
    "exp",
    "log",
    "tanh",
    "sigmoid",
    "relu",
    "gelu",
    "log_softmax",
    "mean",
    "lt",
    "le",
    "gt",
    "ge",
    "eq",
    "ne",
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
    "embedding",
    "named",
]

def add(a: Variable | float, b: Variable | float) -> Variable:
    """``a + b`` with NumPy broadcasting (``ShapeError`` naming both shapes when they do not
    broadcast; ``TypeError`` for another operand type or two numbers)."""

def sub(a: Variable | float, b: Variable | float) -> Variable:
    """``a - b`` with broadcasting."""

def mul(a: Variable | float, b: Variable | float) -> Variable:
    """``a * b`` elementwise with broadcasting."""

def div(a: Variable | float, b: Variable | float) -> Variable:
    """``a / b`` (true division) with broadcasting."""

def neg(x: Variable) -> Variable:
    """``-x``."""

def pow(x: Variable, exponent: float) -> Variable:
    """``x ** exponent`` for a finite Python number (``TypeError`` for a Variable exponent,
    ``ValueError`` for NaN or infinity)."""

def exp(x: Variable) -> Variable:
    """``exp(x)``."""

def log(x: Variable) -> Variable:
    """Natural logarithm."""

def tanh(x: Variable) -> Variable:
    """``tanh(x)``."""

def sigmoid(x: Variable) -> Variable:
    """``1 / (1 + exp(-x))``."""

def relu(x: Variable) -> Variable:
    """``max(x, 0)``."""

def gelu(x: Variable, approximate: str = "none") -> Variable:
    """GELU: ``"none"`` (exact, erf) or ``"tanh"`` (``ValueError`` for another string)."""

def log_softmax(x: Variable, axis: int = -1) -> Variable:
    """Numerically stable log-softmax along ``axis`` (``ShapeError`` for a bad axis)."""

def mean(
    x: Variable,
    axis: SupportsIndex | Sequence[SupportsIndex] | None = None,
    keepdims: bool = False,
) -> Variable:
    """Mean over ``axis`` (``None``: all axes)."""

def lt(a: Variable | float, b: Variable | float) -> Variable:
    """``a < b`` as 1.0/0.0 (broadcasting; never requires grad)."""

def le(a: Variable | float, b: Variable | float) -> Variable:
    """``a <= b`` as 1.0/0.0."""

def gt(a: Variable | float, b: Variable | float) -> Variable:
    """``a > b`` as 1.0/0.0."""

def ge(a: Variable | float, b: Variable | float) -> Variable:
    """``a >= b`` as 1.0/0.0."""

def eq(a: Variable | float, b: Variable | float) -> Variable:
    """``a == b`` as 1.0/0.0."""

def ne(a: Variable | float, b: Variable | float) -> Variable:
    """``a != b`` as 1.0/0.0."""

def scale(x: Variable, alpha: float) -> Variable:
    """``alpha * x``."""

def matmul(a: Variable, b: Variable) -> Variable:
    """``[m, k] @ [k, n] -> [m, n]``."""

def linear(x: Variable, w: Variable, bias: Variable | None = None) -> Variable:
    """``x [..., in] @ w.T (+ bias [out])`` with ``w [out, in]`` -> ``[..., out]`` (with a
    bias, one graph node: bitwise ``add(linear(x, w), bias)``)."""

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

def sum(
    x: Variable,
    axis: SupportsIndex | Sequence[SupportsIndex] | None = None,
    keepdims: bool = False,
) -> Variable:
    """Sum over ``axis`` (``None``: all axes, a shape-``()`` result; negative axes count from
    the end; ``ShapeError`` for an out-of-range or repeated axis)."""

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

def embedding(table: Variable, ids: npt.ArrayLike) -> Variable:
    """Rows of ``table [num_embeddings, dim]`` selected by integer ``ids`` of any shape ``S``:
    ``S + (dim,)`` (``ShapeError`` for a non-2-D table, ``TokenError`` for an id outside
    ``[0, num_embeddings)`` or a non-integer dtype)."""

def named(name: str, fn: Callable[..., Variable], *inputs: Variable) -> Variable:
    """``fn(*inputs)`` as the value ``name`` (``riftco.named``): kept by a ``checkpoint`` whose
    ``save`` lists ``name`` and not recomputed at its replay."""
