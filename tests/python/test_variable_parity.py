"""NumPy/PyTorch parity of ``Variable``'s Python protocol: conversions to NumPy refuse more than
32 axes with a ``ShapeError`` (never a panic), indexing errors are ``IndexError``s, ``float``/
``int``/``format``/``dim``, NumPy integers and floats as arguments, and NumPy arrays as
operands of the operators on either side."""

from __future__ import annotations

import operator
from collections.abc import Callable

import numpy as np
import pytest

import riftco
from riftco import functional as F
from riftco import nn

# ---- conversions to NumPy: at most 32 axes ---------------------------------------------------

RANK_MESSAGE = r"rank 33.*at most 32 axes"


def test_numpy_of_more_than_32_axes_is_a_shape_error() -> None:
    v = riftco.Variable(np.zeros([1] * 33))
    assert v.ndim == 33
    with pytest.raises(riftco.ShapeError, match=RANK_MESSAGE):
        v.numpy()
    with pytest.raises(riftco.ShapeError, match=RANK_MESSAGE):
        np.asarray(v)
    with pytest.raises(riftco.ShapeError, match=r"rank 41.*at most 32 axes"):
        riftco.Variable(np.zeros(3))[(None,) * 40].numpy()
    with pytest.raises(riftco.ShapeError, match=RANK_MESSAGE):
        riftco.Variable(np.zeros(2)).reshape(*([1] * 32 + [2])).numpy()
    # 32 axes still convert.
    assert riftco.Variable(np.zeros([1] * 32)).numpy().shape == (1,) * 32


def test_grad_of_a_33_axis_leaf_is_a_shape_error() -> None:
    w = riftco.Variable(np.ones([1] * 33), requires_grad=True)
    F.sum(w * 2.0).backward()
    with pytest.raises(riftco.ShapeError, match=RANK_MESSAGE):
        _ = w.grad
    # The gradient is there: reshaped it converts.
    assert F.sum(w).item() == 1.0


# ---- indexing errors are IndexErrors ---------------------------------------------------------


def test_too_many_indices_and_two_ellipses_are_index_errors() -> None:
    a = riftco.Variable(np.zeros((3, 4)))
    with pytest.raises(riftco.IndexOutOfRangeError, match=r"too many indices.*\[3, 4\].*3"):
        a[0, 0, 0]
    with pytest.raises(IndexError, match="single ellipsis"):
        a[..., ...]
    with pytest.raises(riftco.ShapeError):
        a[0, 0, 0]
    with pytest.raises(riftco.ConfigError, match="step"):  # NumPy: ValueError as well
        a[::0]


def test_a_0d_variable_cannot_be_indexed_or_iterated() -> None:
    s = riftco.Variable(np.array(1.0))
    with pytest.raises(IndexError, match="too many indices"):
        s[0]
    with pytest.raises(TypeError, match="iteration over a 0-d"):
        list(s)
    with pytest.raises(TypeError, match="iteration over a 0-d"):
        iter(s)
    with pytest.raises(TypeError, match="len"):
        len(s)
    assert s[()].shape == () and s[None].shape == (1,)


def test_iteration_yields_the_rows_lazily() -> None:
    v = riftco.Variable(np.arange(6.0).reshape(3, 2), requires_grad=True)
    rows = list(v)
    assert [r.shape for r in rows] == [(2,)] * 3
    np.testing.assert_array_equal(np.stack([r.numpy() for r in rows]), np.arange(6.0).reshape(3, 2))
    F.sum(rows[1] * 3.0).backward()
    np.testing.assert_array_equal(v.grad, [[0, 0], [3, 3], [0, 0]])
    assert list(riftco.Variable(np.zeros((0, 2)))) == []


class BadIndex:
    def __index__(self) -> int:
        raise KeyError("from __index__")


class GoodIndex:
    def __index__(self) -> int:
        return 1


def test_an_exception_from_index_propagates() -> None:
    a = riftco.Variable(np.arange(4.0))
    with pytest.raises(KeyError, match="from __index__"):
        a[BadIndex()]
    with pytest.raises(KeyError, match="from __index__"):
        a[..., BadIndex()]
    assert a[GoodIndex()].item() == 1.0
    assert a[np.int64(2)].item() == 2.0


# ---- float, int, format, dim -----------------------------------------------------------------


def test_float_int_and_format_of_one_element_variables() -> None:
    v = riftco.Variable(np.array([[2.75]]))
    assert float(v) == 2.75 and isinstance(float(v), float)
    assert int(v) == 2 and int(riftco.Variable(np.array(-2.75))) == -2
    assert format(v, ".3f") == "2.750" and f"{v:.1e}" == "2.8e+00"
    with pytest.raises(ValueError):
        int(riftco.Variable(np.array(np.nan)))
    with pytest.raises(OverflowError):
        int(riftco.Variable(np.array(np.inf)))
    m = riftco.Variable(np.ones(3))
    with pytest.raises(riftco.ShapeError):
        float(m)
    with pytest.raises(riftco.ShapeError):
        int(m)
    with pytest.raises(TypeError, match=r"unsupported format string.*\[3\]"):
        format(m, ".3f")
    assert f"{m}" == str(m) and f"{v}" == str(v)  # an empty spec: str(), as any object


def test_dim_is_ndim() -> None:
    assert riftco.Variable(np.zeros((2, 3, 4))).dim() == 3
    assert riftco.Variable(np.array(1.0)).dim() == 0


# ---- NumPy scalars as arguments, GELU(approximate), RMSNorm eps -------------------------------


def test_numpy_integer_axes_and_segments_are_accepted() -> None:
    x = riftco.Variable(np.arange(6.0).reshape(2, 3))
    np.testing.assert_array_equal(x.sum(axis=np.int64(1)).numpy(), [3.0, 12.0])
    np.testing.assert_array_equal(x.mean(axis=(np.int32(0),)).numpy(), [1.5, 2.5, 3.5])
    np.testing.assert_array_equal(F.sum(x, axis=np.int64(0)).numpy(), [3.0, 5.0, 7.0])
    with pytest.raises(TypeError, match="axis"):
        x.sum(axis=np.bool_(True))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="axis"):
        x.sum(axis=np.float64(1.0))
    seq = nn.Sequential(nn.Linear(3, 3), nn.SiLU(), nn.Linear(3, 3), nn.SiLU())
    h = riftco.Variable(np.ones((2, 3)), requires_grad=True)
    out = riftco.checkpoint_sequential(seq, np.int64(2), h)
    np.testing.assert_array_equal(out.numpy(), seq(h).numpy())
    with pytest.raises(riftco.ConfigError, match="segments"):
        riftco.checkpoint_sequential(seq, np.bool_(True), h)  # type: ignore[arg-type]


def test_gelu_module_takes_approximate() -> None:
    x = riftco.Variable(np.linspace(-3, 3, 7))
    np.testing.assert_array_equal(
        nn.GELU(approximate="tanh")(x).numpy(), F.gelu(x, approximate="tanh").numpy()
    )
    np.testing.assert_array_equal(nn.GELU()(x).numpy(), F.gelu(x).numpy())
    assert not np.array_equal(nn.GELU("tanh")(x).numpy(), nn.GELU()(x).numpy())
    with pytest.raises(riftco.ConfigError, match="'erf'"):
        nn.GELU(approximate="erf")


def test_rmsnorm_eps_numpy_floats_and_float32_underflow() -> None:
    x = riftco.Variable(np.arange(8.0).reshape(2, 4))
    a = nn.RMSNorm(4, eps=np.float32(1e-5))(x).numpy()
    b = nn.RMSNorm(4, eps=1e-5)(x).numpy()
    np.testing.assert_array_equal(a, b)
    with pytest.raises(riftco.ConfigError, match="1e-50"):
        nn.RMSNorm(4, eps=1e-50)
    with pytest.raises(riftco.ConfigError, match="1e"):
        nn.RMSNorm(4, eps=1e300)
    with pytest.raises(riftco.ConfigError):
        nn.RMSNorm(4, eps=np.bool_(True))  # type: ignore[arg-type]


# ---- NumPy arrays as operands ----------------------------------------------------------------

OPS: list[tuple[str, Callable[[object, object], object]]] = [
    ("+", operator.add),
    ("-", operator.sub),
    ("*", operator.mul),
    ("/", operator.truediv),
]


@pytest.mark.parametrize(("name", "op"), OPS)
def test_ndarray_operands_on_either_side(name: str, op: Callable[[object, object], object]) -> None:
    rng = np.random.default_rng(5)
    arr = rng.uniform(1.0, 2.0, (3, 1)).astype(np.float64)
    xv = rng.uniform(1.0, 2.0, (2, 3, 4)).astype(np.float32)
    const = riftco.Variable(arr)
    for array_left in (True, False):
        x = riftco.Variable(xv, requires_grad=True)
        y = op(arr, x) if array_left else op(x, arr)
        assert isinstance(y, riftco.Variable), name
        F.sum(y).backward()
        got_grad = x.grad.copy()  # type: ignore[union-attr]
        x2 = riftco.Variable(xv, requires_grad=True)
        want = op(const, x2) if array_left else op(x2, const)
        assert isinstance(want, riftco.Variable)
        F.sum(want).backward()
        np.testing.assert_array_equal(y.numpy(), want.numpy())
        np.testing.assert_array_equal(got_grad, x2.grad)
        assert y.requires_grad


def as_variable(o: object) -> riftco.Variable:
    assert isinstance(o, riftco.Variable), type(o)
    return o


def test_ndarray_comparisons_and_bad_arrays() -> None:
    x = riftco.Variable(np.array([1.0, 2.0, 3.0]))
    arr = np.array([2, 2, 2])
    np.testing.assert_array_equal(as_variable(arr < x).numpy(), [0.0, 0.0, 1.0])
    np.testing.assert_array_equal(as_variable(x <= arr).numpy(), [1.0, 1.0, 0.0])
    np.testing.assert_array_equal(as_variable(arr == x).numpy(), [0.0, 1.0, 0.0])
    mask = np.array([True, False, True])
    np.testing.assert_array_equal(as_variable(mask * x).numpy(), [1.0, 0.0, 3.0])
    with pytest.raises(TypeError, match="<U1"):
        np.array(["a", "b", "c"]) + x
    with pytest.raises(TypeError, match="<U1"):
        x * np.array(["a", "b", "c"])
    with pytest.raises(riftco.ShapeError):
        x + np.ones(4)
    # Two arrays stay NumPy's business.
    assert isinstance(np.ones(2) + np.ones(2), np.ndarray)
