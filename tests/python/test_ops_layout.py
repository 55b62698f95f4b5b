"""Layout ops against NumPy: basic indexing (``Variable.__getitem__``), ``.T``/``transpose``/
``permute``, ``concat``/``stack`` and ``reshape`` with -1.

Values are compared with NumPy's own indexing/transpose/concatenate/stack, exactly (these ops
copy elements). Gradients are compared with the exact NumPy adjoint rather than finite
differences: the ops are linear, so the VJP of ``L = sum(y * g)`` is ``g`` scattered back by the
adjoint (``dx[key] = g`` for indexing, the inverse transpose, the slices of ``g`` for concat),
which NumPy computes exactly; the Rust tests check the same VJPs against f64 finite
differences (crates/riftco-autograd/tests/layout_ops.rs).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import riftco
from riftco import _native
from riftco import functional as F

FN = _native.functional

shapes = st.lists(st.integers(0, 4), min_size=0, max_size=4).map(tuple)
small = st.integers(-6, 6)


def leaf(shape: tuple[int, ...], seed: int = 0) -> tuple[np.ndarray, riftco.Variable]:
    a = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
    return a, riftco.Variable(a, requires_grad=True)


def backward_with(y: riftco.Variable, seed: int = 1) -> np.ndarray:
    """Backward of ``sum(y * g)`` for a random ``g``; returns ``g``."""
    g = np.random.default_rng(seed).standard_normal(y.shape).astype(np.float32)
    F.sum(F.mul(y, riftco.Variable(g))).backward()
    return g


@st.composite
def index_cases(draw: st.DrawFn) -> tuple[tuple[int, ...], Any]:
    shape = draw(st.lists(st.integers(1, 4), min_size=0, max_size=4).map(tuple))
    n_axes = draw(st.integers(0, len(shape)))
    items: list[Any] = []
    for ax in range(n_axes):
        kind = draw(st.sampled_from(["int", "slice", "none"]))
        if kind == "int":
            items.append(draw(st.integers(-shape[ax], shape[ax] - 1)))
        elif kind == "slice":
            step = draw(st.one_of(st.none(), st.integers(-3, 3).filter(lambda s: s != 0)))
            items.append(
                slice(draw(st.one_of(st.none(), small)), draw(st.one_of(st.none(), small)), step)
            )
        else:
            items.append(None)
            items.append(slice(None))  # still consume the axis
    if draw(st.booleans()):
        # The integers above were drawn for the leading axes: a `...` keeps them there when it
        # stands at the end, or anywhere when it expands to no axis (every axis indexed).
        at = draw(st.integers(0, len(items))) if n_axes == len(shape) else len(items)
        items.insert(at, Ellipsis)
    key: Any = tuple(items)
    if len(items) == 1 and draw(st.booleans()):
        key = items[0]  # a bare item, not a tuple
    return shape, key


@settings(max_examples=60, deadline=None)
@given(index_cases())
def test_getitem_matches_numpy_value_and_adjoint(case: tuple[tuple[int, ...], Any]) -> None:
    shape, key = case
    a, x = leaf(shape)
    y = x[key]
    want = a[key]
    assert y.shape == want.shape
    np.testing.assert_array_equal(y.numpy(), want)
    g = backward_with(y)
    dx = np.zeros_like(a)
    dx[key] = g  # the exact adjoint of basic indexing (views never alias)
    np.testing.assert_array_equal(x.grad, dx)


def test_a_leading_ellipsis_indexes_the_last_axes() -> None:
    a, x = leaf((2, 3, 4))
    for key in [(..., 1), (..., None, -1, slice(1, None, 2)), (0, ..., 3), (None, ..., None)]:
        np.testing.assert_array_equal(x[key].numpy(), a[key])
    with pytest.raises(IndexError, match="index 3 is out of range for axis 1 of size 3"):
        x[..., 3, 0]


@settings(max_examples=40, deadline=None)
@given(shapes, st.randoms(use_true_random=False))
def test_permute_transpose_and_T_match_numpy(shape: tuple[int, ...], rnd: Any) -> None:
    a, x = leaf(shape)
    axes = list(range(len(shape)))
    rnd.shuffle(axes)
    neg = [ax - len(shape) if rnd.random() < 0.5 else ax for ax in axes]
    y = FN.permute(x, neg)
    np.testing.assert_array_equal(y.numpy(), np.transpose(a, axes))
    g = backward_with(y)
    np.testing.assert_array_equal(x.grad, np.transpose(g, np.argsort(axes)))
    np.testing.assert_array_equal(x.permute(*neg).numpy(), np.transpose(a, axes))
    np.testing.assert_array_equal(x.T.numpy(), a.T)
    if len(shape) >= 2:
        np.testing.assert_array_equal(x.transpose(0, -1).numpy(), np.swapaxes(a, 0, -1))
        np.testing.assert_array_equal(FN.transpose(x, -1, 0).numpy(), np.swapaxes(a, 0, -1))


@st.composite
def concat_cases(draw: st.DrawFn) -> tuple[list[tuple[int, ...]], int]:
    base = list(draw(st.lists(st.integers(0, 3), min_size=1, max_size=3)))
    axis = draw(st.integers(-len(base), len(base) - 1))
    n = draw(st.integers(1, 3))
    out = []
    for _ in range(n):
        s = list(base)
        s[axis] = draw(st.integers(0, 3))
        out.append(tuple(s))
    return out, axis


@settings(max_examples=40, deadline=None)
@given(concat_cases())
def test_concat_matches_numpy_value_and_adjoint(case: tuple[list[tuple[int, ...]], int]) -> None:
    shapes_, axis = case
    pairs = [leaf(s, i) for i, s in enumerate(shapes_)]
    for f in (FN.concat, FN.cat):
        y = f([x for _, x in pairs], axis=axis)
        want = np.concatenate([a for a, _ in pairs], axis=axis)
        np.testing.assert_array_equal(y.numpy(), want)
    g = backward_with(y)
    cuts = np.cumsum([s[axis] for s in shapes_])[:-1]
    for (_, x), gi in zip(pairs, np.split(g, cuts, axis=axis)):
        np.testing.assert_array_equal(x.grad, gi)


@settings(max_examples=40, deadline=None)
@given(shapes, st.integers(1, 3), st.data())
def test_stack_matches_numpy_value_and_adjoint(
    shape: tuple[int, ...], n: int, data: st.DataObject
) -> None:
    axis = data.draw(st.integers(-len(shape) - 1, len(shape)))
    pairs = [leaf(shape, i) for i in range(n)]
    y = FN.stack([x for _, x in pairs], axis=axis)
    np.testing.assert_array_equal(y.numpy(), np.stack([a for a, _ in pairs], axis=axis))
    g = backward_with(y)
    for i, (_, x) in enumerate(pairs):
        np.testing.assert_array_equal(x.grad, np.take(g, i, axis=axis))


def test_reshape_infers_one_minus_one() -> None:
    a, x = leaf((2, 3, 4))
    for shape in [(-1,), (4, -1), (2, -1, 2)]:
        np.testing.assert_array_equal(x.reshape(*shape).numpy(), a.reshape(shape))
        np.testing.assert_array_equal(x.reshape(shape).numpy(), a.reshape(shape))
        np.testing.assert_array_equal(FN.reshape(x, list(shape)).numpy(), a.reshape(shape))
    with pytest.raises(ValueError, match="more than one -1"):
        x.reshape(-1, -1)
    with pytest.raises(ValueError, match="cannot be inferred"):
        x.reshape(5, -1)
    with pytest.raises(riftco.ShapeError):
        x.reshape(5, 5)
    with pytest.raises(ValueError, match="negative dimension -2"):
        FN.reshape(x, [-2, -12])
    with pytest.raises(ValueError, match="cannot be inferred"):
        x.reshape(2**63, -1)
    with pytest.raises(TypeError, match="must be ints"):
        x.reshape(2.0, -1)  # type: ignore[arg-type]


def test_len_and_iteration_follow_the_first_axis() -> None:
    a, x = leaf((3, 2))
    assert len(x) == 3
    rows = [r.numpy() for r in iter(x)]  # iteration stops at the IndexError of x[3]
    np.testing.assert_array_equal(np.stack(rows), a)
    with pytest.raises(TypeError):
        len(leaf(())[1])


def test_out_of_range_index_is_an_index_error_naming_index_axis_and_size() -> None:
    _, x = leaf((2, 3))
    with pytest.raises(IndexError, match="index 3 is out of range for axis 1 of size 3"):
        x[:, 3]
    with pytest.raises(riftco.ShapeError, match="index -3 .* axis 0 of size 2"):
        x[-3]
    assert issubclass(_native.IndexOutOfRangeError, riftco.RiftcoError)
    with pytest.raises(ValueError, match="step cannot be zero"):
        x[::0]
    with pytest.raises(IndexError, match="too many indices"):  # as NumPy (also a ShapeError)
        x[0, 0, 0]
    with pytest.raises(IndexError, match="single ellipsis"):
        x[..., ...]


@pytest.mark.parametrize(
    "key", [[0, 1], np.array([0, 1]), True, 1.5, (0, [1]), riftco.Variable(np.zeros(1))]
)
def test_advanced_indices_are_type_errors(key: Any) -> None:
    _, x = leaf((2, 3))
    with pytest.raises(TypeError, match="advanced indexing is not supported"):
        x[key]


def test_huge_ints_clamp_in_slices_and_are_out_of_range_as_indices() -> None:
    a, x = leaf((2, 5))
    for key in [
        (1, slice(None, None, 2**100)),
        (0, slice(-(2**100), 2**100, 3)),
        (0, slice(2**70, -(2**70), -(2**80))),
        (1, slice(None, None, -(2**63))),
    ]:
        np.testing.assert_array_equal(x[key].numpy(), a[key])
    with pytest.raises(IndexError, match="out of range for axis 0 of size 2"):
        x[2**100]


def test_integer_scalars_index_like_ints() -> None:
    a, x = leaf((3, 4))
    np.testing.assert_array_equal(x[np.int64(2), np.int32(-1)].numpy(), a[2, -1])


def test_join_and_axis_errors_name_shapes_and_axes() -> None:
    _, a = leaf((2, 3))
    _, b = leaf((3, 3))
    with pytest.raises(riftco.ShapeError, match=r"\[3, 3\].*\[2, 3\].*axis 1"):
        FN.concat([a, b], axis=1)
    with pytest.raises(riftco.ShapeError, match="same shape"):
        FN.stack([a, b])
    with pytest.raises(ValueError, match="empty list"):
        FN.concat([])
    with pytest.raises(riftco.ShapeError, match="axis 2 is out of range for a tensor of rank 2"):
        FN.concat([a], axis=2)
    with pytest.raises(riftco.ShapeError, match="axis -3"):
        a.transpose(-3, 0)
    with pytest.raises(ValueError, match="repeat axis"):
        a.permute(0, 0)


def test_against_pytorch_where_installed() -> None:
    torch = pytest.importorskip("torch", reason="PyTorch is optional and not installed here")
    a, x = leaf((2, 3, 4))
    t = torch.tensor(a)
    np.testing.assert_array_equal(x[1, ::2, -1].numpy(), t[1, ::2, -1].numpy())
    np.testing.assert_array_equal(x.transpose(0, 2).numpy(), t.transpose(0, 2).numpy())
    np.testing.assert_array_equal(x.permute(2, 0, 1).numpy(), t.permute(2, 0, 1).numpy())
    np.testing.assert_array_equal(
        FN.cat([x, x], axis=1).numpy(), torch.cat([t, t], dim=1).numpy()
    )
    np.testing.assert_array_equal(
        FN.stack([x, x], axis=-1).numpy(), torch.stack([t, t], dim=-1).numpy()
    )
