"""Broadcasting arithmetic, comparisons, element-wise maps, reductions over axes and
log-softmax, through ``riftco.functional`` and ``Variable``'s operators.

Values are checked against NumPy; gradients against NumPy float64 central finite differences
of a random linear functional ``L = sum(w * f(x))`` of the output (the reference function is
evaluated in float64, so the finite difference is accurate to about 1e-8), and against PyTorch
where ``import torch`` works.
"""

from __future__ import annotations

from typing import Any

import math
from collections.abc import Callable, Sequence

import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import riftco
from riftco._native import functional as F

Arr = npt.NDArray[np.float64]
SETTINGS = settings(max_examples=40, deadline=None)

broadcast_pairs = hnp.mutually_broadcastable_shapes(
    num_shapes=2, min_dims=0, max_dims=3, min_side=1, max_side=3
)


def data(shape: Sequence[int], seed: int, away: float = 0.0, positive: bool = False) -> Arr:
    """Random float32-representable values in [-2, 2], moved to ``|x| >= away`` (and > 0)."""
    x = np.random.default_rng(seed).uniform(-2.0, 2.0, size=tuple(shape))
    if positive:
        x = np.abs(x) + away
    elif away:
        x = np.where(x >= 0, x + away, x - away)
    return np.asarray(x.astype(np.float32), dtype=np.float64)


def var(x: Arr, requires_grad: bool = True) -> riftco.Variable:
    return riftco.Variable(x.astype(np.float32), requires_grad=requires_grad)


def numeric_grads(f: Callable[..., Arr], xs: Sequence[Arr], w: Arr, h: float = 1e-6) -> list[Arr]:
    """Central finite differences of ``sum(w * f(*xs))`` in float64."""
    grads = []
    for i, x in enumerate(xs):
        g = np.zeros_like(x)
        for idx in np.ndindex(x.shape):
            args_p = [a.copy() for a in xs]
            args_m = [a.copy() for a in xs]
            args_p[i][idx] += h
            args_m[i][idx] -= h
            g[idx] = (np.sum(w * f(*args_p)) - np.sum(w * f(*args_m))) / (2 * h)
        grads.append(g)
    return grads


def check_grads(
    op: Callable[..., riftco.Variable],
    ref: Callable[..., Arr],
    xs: Sequence[Arr],
    rtol: float = 2e-4,
    atol: float = 2e-5,
) -> None:
    """Value of ``op`` vs ``ref`` and its gradients vs finite differences of ``ref``."""
    vs = [var(x) for x in xs]
    y = op(*vs)
    want = ref(*xs)
    assert y.shape == np.shape(want), (y.shape, np.shape(want))
    np.testing.assert_allclose(y.numpy(), want, rtol=rtol, atol=atol)
    w = data(y.shape, 12345)
    loss = F.sum(F.mul(y, riftco.Variable(w.astype(np.float32))))
    loss.backward()
    for v, g in zip(vs, numeric_grads(ref, xs, w)):
        assert v.grad is not None
        assert v.grad.shape == g.shape
        np.testing.assert_allclose(v.grad, g, rtol=rtol, atol=atol)


# ---- broadcasting arithmetic -----------------------------------------------------------------

ARITH: list[tuple[str, Callable[..., riftco.Variable], Callable[[Arr, Arr], Arr]]] = [
    ("add", F.add, np.add),
    ("sub", F.sub, np.subtract),
    ("mul", F.mul, np.multiply),
    ("div", F.div, np.divide),
    ("+", lambda a, b: a + b, np.add),
    ("-", lambda a, b: a - b, np.subtract),
    ("*", lambda a, b: a * b, np.multiply),
    ("/", lambda a, b: a / b, np.divide),
]


@SETTINGS
@given(shapes=broadcast_pairs, seed=st.integers(0, 2**16), which=st.sampled_from(range(8)))
def test_broadcast_arithmetic_values_and_grads(
    shapes: hnp.BroadcastableShapes, seed: int, which: int
) -> None:
    (sa, sb), _ = shapes.input_shapes, shapes.result_shape
    _, op, ref = ARITH[which]
    a, b = data(sa, seed), data(sb, seed + 1, away=0.3)
    check_grads(op, ref, [a, b])


@SETTINGS
@given(
    shape=hnp.array_shapes(min_dims=0, max_dims=3, min_side=1, max_side=3),
    seed=st.integers(0, 2**16),
    c=st.sampled_from([2.0, -0.5, 3]),
)
def test_scalar_operands_on_either_side(shape: tuple[int, ...], seed: int, c: float) -> None:
    x = data(shape, seed, away=0.3)
    cases: list[tuple[Callable[[riftco.Variable], riftco.Variable], Callable[[Arr], Arr]]] = [
        (lambda v: v + c, lambda a: a + c),
        (lambda v: c + v, lambda a: c + a),
        (lambda v: v - c, lambda a: a - c),
        (lambda v: c - v, lambda a: c - a),
        (lambda v: v * c, lambda a: a * c),
        (lambda v: c * v, lambda a: c * a),
        (lambda v: v / c, lambda a: a / c),
        (lambda v: c / v, lambda a: c / a),
        (lambda v: F.add(c, v), lambda a: c + a),
        (lambda v: F.div(v, c), lambda a: a / c),
        (lambda v: -v, lambda a: -a),
    ]
    for op, ref in cases:
        check_grads(op, ref, [x])


def test_numpy_scalars_are_scalar_operands() -> None:
    x = riftco.Variable(np.array([1.0, 2.0], np.float32), requires_grad=True)
    for y, want in (
        (x * np.float32(3.0), [3.0, 6.0]),
        (np.float32(3.0) * x, [3.0, 6.0]),
        (np.int64(1) - x, [0.0, -1.0]),
        (x / np.float64(2.0), [0.5, 1.0]),
        (x > np.float32(1.5), [0.0, 1.0]),
    ):
        assert isinstance(y, riftco.Variable)
        np.testing.assert_array_equal(y.numpy(), want)
    F.sum(np.float32(2.0) * x).backward()
    assert x.grad is not None
    np.testing.assert_array_equal(x.grad, [2.0, 2.0])


def test_broadcast_shapes_and_rank0() -> None:
    a = riftco.Variable(np.arange(3, dtype=np.float32).reshape(3, 1))
    b = riftco.Variable(np.array([10.0, 20.0], dtype=np.float32))
    assert (a + b).shape == (3, 2)
    np.testing.assert_array_equal((a + b).numpy(), np.arange(3).reshape(3, 1) + [10.0, 20.0])
    s = riftco.Variable(np.float32(2.0))
    assert s.shape == ()
    assert (s * s).shape == ()
    assert (s * b).shape == (2,)
    assert (s + 1).shape == ()


def test_mismatched_broadcast_names_both_shapes() -> None:
    a = riftco.Variable(np.zeros((2, 3), np.float32))
    b = riftco.Variable(np.zeros((4, 3), np.float32))
    for f in (F.add, F.sub, F.mul, F.div, F.lt, F.eq):
        with pytest.raises(riftco.ShapeError, match=r"\[2, 3\] and \[4, 3\]"):
            f(a, b)
    with pytest.raises(riftco.ShapeError, match=r"\[2, 3\] and \[4, 3\]"):
        a + b  # noqa: B018


def test_bad_operand_types() -> None:
    x = riftco.Variable(np.ones(3, np.float32))
    with pytest.raises(TypeError):
        x + "a"  # type: ignore[operator]  # noqa: B018
    with pytest.raises(TypeError):
        [1.0] * x  # type: ignore[operator]  # noqa: B018
    # A numeric ndarray operand becomes a constant (test_variable_parity.py); others refuse.
    with pytest.raises(TypeError, match="dtype object"):
        np.array([None, 1, 2]) + x  # noqa: B018
    with pytest.raises(TypeError, match="dtype object"):
        x * np.array([None, 1, 2])  # noqa: B018
    with pytest.raises(TypeError, match="at least one operand must be a Variable"):
        F.add(1.0, 2.0)
    with pytest.raises(TypeError, match="str"):
        F.mul(x, "a")  # type: ignore[arg-type]


# ---- comparisons -----------------------------------------------------------------------------

Comparison = tuple[
    Callable[..., riftco.Variable],
    Callable[..., object],
    Callable[[Arr, Arr], npt.NDArray[np.bool_]],
]
COMPARISONS: list[Comparison] = [
    (F.lt, lambda a, b: a < b, np.less),
    (F.le, lambda a, b: a <= b, np.less_equal),
    (F.gt, lambda a, b: a > b, np.greater),
    (F.ge, lambda a, b: a >= b, np.greater_equal),
    (F.eq, lambda a, b: a == b, np.equal),
    (F.ne, lambda a, b: a != b, np.not_equal),
]


@SETTINGS
@given(shapes=broadcast_pairs, seed=st.integers(0, 2**16))
def test_comparisons_match_numpy(shapes: hnp.BroadcastableShapes, seed: int) -> None:
    sa, sb = shapes.input_shapes
    # Small integers so that equality happens.
    rng = np.random.default_rng(seed)
    a = rng.integers(-1, 2, size=sa).astype(np.float64)
    b = rng.integers(-1, 2, size=sb).astype(np.float64)
    va, vb = var(a), var(b)
    for f, op, ref in COMPARISONS:
        want = ref(a, b).astype(np.float32)
        for y in (f(va, vb), op(va, vb), f(va, 0.0), op(va, 0)):
            assert isinstance(y, riftco.Variable)
            assert not y.requires_grad
        np.testing.assert_array_equal(f(va, vb).numpy(), want)
        got = op(va, vb)
        assert isinstance(got, riftco.Variable)
        np.testing.assert_array_equal(got.numpy(), want)
        want0 = ref(a, np.zeros(())).astype(np.float32)
        np.testing.assert_array_equal(f(va, 0.0).numpy(), want0)


def test_scalar_on_the_left_of_a_comparison_reflects() -> None:
    x = riftco.Variable(np.array([0.0, 1.0, 2.0], np.float32))
    y = 1 < x  # Python calls x.__gt__(1)
    assert isinstance(y, riftco.Variable)
    np.testing.assert_array_equal(y.numpy(), [0.0, 0.0, 1.0])


def test_hash_stays_identity_based() -> None:
    a = riftco.Variable(np.ones(2, np.float32))
    b = riftco.Variable(np.ones(2, np.float32))
    assert hash(a) == hash(a) and hash(a) != hash(b)
    s = {a, b}
    assert len(s) == 2 and a in s and b in s
    d = {a: "a", b: "b"}
    assert d[a] == "a" and d[b] == "b"
    eq = a == b
    assert isinstance(eq, riftco.Variable)
    np.testing.assert_array_equal(eq.numpy(), [1.0, 1.0])
    # Comparison with a non-number falls back to identity (NotImplemented).
    assert (a == "a") is False  # type: ignore[comparison-overlap]
    assert (a != None) is True  # noqa: E711


def test_bool_of_variables() -> None:
    assert bool(riftco.Variable(np.float32(2.0)))
    assert not bool(riftco.Variable(np.zeros(1, np.float32)))
    with pytest.raises(ValueError, match="ambiguous"):
        bool(riftco.Variable(np.ones(3, np.float32)))


# ---- element-wise maps -----------------------------------------------------------------------

_erf = np.vectorize(math.erf)


def _gelu(x: Arr) -> Arr:
    return np.asarray(0.5 * x * (1.0 + _erf(x / math.sqrt(2.0))), dtype=np.float64)


def _gelu_tanh(x: Arr) -> Arr:
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))


Map = tuple[str, Callable[[riftco.Variable], riftco.Variable], Callable[[Arr], Arr], bool]
MAPS: list[Map] = [
    ("neg", F.neg, np.negative, False),
    ("exp", F.exp, np.exp, False),
    ("log", F.log, np.log, True),
    ("tanh", F.tanh, np.tanh, False),
    ("sigmoid", F.sigmoid, lambda x: 1.0 / (1.0 + np.exp(-x)), False),
    ("relu", F.relu, lambda x: np.maximum(x, 0.0), False),
    ("gelu", F.gelu, _gelu, False),
    ("gelu_tanh", lambda v: F.gelu(v, approximate="tanh"), _gelu_tanh, False),
    ("pow2", lambda v: F.pow(v, 2), lambda x: x**2, False),
    ("pow3", lambda v: v**3, lambda x: x**3, False),
    ("pow-1", lambda v: v**-1.0, lambda x: x**-1.0, False),
    ("pow1.5", lambda v: v**1.5, lambda x: x**1.5, True),
    ("method exp", lambda v: v.exp(), np.exp, False),
    ("method log", lambda v: v.log(), np.log, True),
    ("method tanh", lambda v: v.tanh(), np.tanh, False),
    ("method sigmoid", lambda v: v.sigmoid(), lambda x: 1.0 / (1.0 + np.exp(-x)), False),
    ("method relu", lambda v: v.relu(), lambda x: np.maximum(x, 0.0), False),
]


@SETTINGS
@given(
    shape=hnp.array_shapes(min_dims=0, max_dims=3, min_side=1, max_side=3),
    seed=st.integers(0, 2**16),
    which=st.sampled_from(range(len(MAPS))),
)
def test_maps_values_and_grads(shape: tuple[int, ...], seed: int, which: int) -> None:
    _, op, ref, positive = MAPS[which]
    # Away from 0: no finite difference straddles ReLU's kink or a pole.
    x = data(shape, seed, away=0.2, positive=positive)
    check_grads(op, ref, [x])


def test_pow_rejects_variable_and_non_finite_exponents() -> None:
    x = riftco.Variable(np.ones(3, np.float32), requires_grad=True)
    with pytest.raises(TypeError, match="exponent .*Variable"):
        x ** x  # type: ignore[operator]  # noqa: B018
    with pytest.raises(TypeError, match="exponent .*Variable"):
        F.pow(x, x)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="exponent .*str"):
        F.pow(x, "2")  # type: ignore[arg-type]
    for bad in (math.nan, math.inf, -math.inf, 1e300):
        with pytest.raises(ValueError, match="finite"):
            x**bad  # noqa: B018
    with pytest.raises(ValueError, match="approximate"):
        F.gelu(x, approximate="erf")


# ---- reductions and log-softmax --------------------------------------------------------------


@st.composite
def shape_and_axes(draw: st.DrawFn) -> tuple[tuple[int, ...], int | tuple[int, ...] | None]:
    shape = draw(hnp.array_shapes(min_dims=0, max_dims=3, min_side=1, max_side=3))
    rank = len(shape)
    if rank == 0 or draw(st.booleans()):
        return shape, None
    axes = draw(
        st.lists(
            st.integers(-rank, rank - 1), min_size=1, max_size=rank, unique_by=lambda a: a % rank
        )
    )
    return shape, (axes[0] if len(axes) == 1 and draw(st.booleans()) else tuple(axes))


@SETTINGS
@given(
    sa=shape_and_axes(), keepdims=st.booleans(), seed=st.integers(0, 2**16), mean=st.booleans()
)
def test_sum_mean_over_axes(
    sa: tuple[tuple[int, ...], int | tuple[int, ...] | None], keepdims: bool, seed: int, mean: bool
) -> None:
    shape, axis = sa
    x = data(shape, seed)
    ref_fn = np.mean if mean else np.sum

    def ref(a: Arr) -> Arr:
        return np.asarray(ref_fn(a, axis=axis, keepdims=keepdims), dtype=np.float64)

    def f(v: riftco.Variable) -> riftco.Variable:
        return F.mean(v, axis, keepdims) if mean else F.sum(v, axis=axis, keepdims=keepdims)

    def method(v: riftco.Variable) -> riftco.Variable:
        return v.mean(axis, keepdims) if mean else v.sum(axis=axis, keepdims=keepdims)

    check_grads(f, ref, [x])
    check_grads(method, ref, [x])


def _log_softmax(x: Arr, axis: int) -> Arr:
    m = np.max(x, axis=axis, keepdims=True)
    return np.asarray(x - m - np.log(np.sum(np.exp(x - m), axis=axis, keepdims=True)), np.float64)


@SETTINGS
@given(
    shape=hnp.array_shapes(min_dims=1, max_dims=3, min_side=1, max_side=4),
    seed=st.integers(0, 2**16),
    data_=st.data(),
)
def test_log_softmax(shape: tuple[int, ...], seed: int, data_: st.DataObject) -> None:
    axis = data_.draw(st.integers(-len(shape), len(shape) - 1))
    x = data(shape, seed) * 3
    check_grads(lambda v: F.log_softmax(v, axis), lambda a: _log_softmax(a, axis), [x])


def test_log_softmax_is_stable_for_large_inputs() -> None:
    x = np.array([[1000.0, 1001.0, 999.0], [-1000.0, -1001.0, -999.0]], np.float32)
    y = F.log_softmax(riftco.Variable(x)).numpy()
    assert np.all(np.isfinite(y))
    np.testing.assert_allclose(y, _log_softmax(x.astype(np.float64), -1), rtol=1e-6, atol=1e-5)


def test_bad_axes_name_axis_and_rank() -> None:
    x = riftco.Variable(np.ones((2, 3), np.float32))
    with pytest.raises(riftco.ShapeError, match="axis 2 is out of range for a tensor of rank 2"):
        F.sum(x, axis=2)
    with pytest.raises(riftco.ShapeError, match="axis -3 is out of range"):
        x.mean(axis=-3)
    with pytest.raises(riftco.ShapeError, match="axis -1 is repeated"):
        F.sum(x, axis=(1, -1))
    with pytest.raises(riftco.ShapeError, match="rank 0"):
        F.log_softmax(riftco.Variable(np.float32(1.0)))
    with pytest.raises(TypeError, match="axis must be"):
        F.sum(x, axis=1.0)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="axis must be"):
        F.sum(x, axis=True)


# ---- matmul ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("sa", "sb"),
    [((3, 4), (4, 2)), ((2, 3, 4), (4, 5)), ((2, 3, 4), (2, 4, 2)), ((2, 1, 2, 3), (3, 2))],
)
def test_matmul_operator(sa: tuple[int, ...], sb: tuple[int, ...]) -> None:
    check_grads(lambda a, b: a @ b, np.matmul, [data(sa, 1), data(sb, 2)])


def test_matmul_rejects_unsupported_ranks() -> None:
    a = riftco.Variable(np.ones(3, np.float32))
    b = riftco.Variable(np.ones((3, 2), np.float32))
    with pytest.raises(riftco.ShapeError, match=r"\[3\] @ \[3, 2\]"):
        a @ b  # noqa: B018
    with pytest.raises(TypeError):
        b @ 2.0  # type: ignore[operator]  # noqa: B018


def test_matmul_mismatches_name_both_shapes() -> None:
    def v(*shape: int) -> riftco.Variable:
        return riftco.Variable(np.ones(shape, np.float32))

    x, y = v(5, 3), v(4, 2)
    inner = r"\[3, 5\] @ \[4, 2\]: the inner dimensions 5 and 4"
    with pytest.raises(riftco.ShapeError, match=inner):
        x.T @ y  # noqa: B018
    with pytest.raises(riftco.ShapeError, match=r"\[2, 3, 4\] @ \[2, 5, 6\]: the inner"):
        v(2, 3, 4) @ v(2, 5, 6)  # noqa: B018
    with pytest.raises(riftco.ShapeError, match=r"\[2, 3, 4\] @ \[1, 4, 5\]: the leading"):
        v(2, 3, 4) @ v(1, 4, 5)  # noqa: B018
    with pytest.raises(riftco.ShapeError, match=r"\[2, 3, 4\] @ \[5, 6\]: the inner"):
        v(2, 3, 4) @ v(5, 6)  # noqa: B018


# ---- a small MLP: Linear + bias (broadcast add) + ReLU, the shape Slice P builds on ------------


def test_linear_bias_relu_mlp_gradients() -> None:
    x, w, bias = data((5, 4), 1), data((3, 4), 2), data((3,), 3)
    check_grads(
        lambda xv, wv, bv: F.relu(F.linear(xv, wv) + bv),
        lambda xa, wa, ba: np.maximum(xa @ wa.T + ba, 0.0),
        [x, w, bias],
    )


# ---- PyTorch reference (optional) ------------------------------------------------------------


def test_matches_pytorch() -> None:
    try:
        import torch  # type: ignore[import-not-found, unused-ignore]
    except ImportError:
        pytest.skip("torch not installed: the PyTorch comparison of the math ops is skipped")
    rng = np.random.default_rng(0)
    a = rng.standard_normal((3, 1, 4)).astype(np.float32)
    b = rng.standard_normal((2, 4)).astype(np.float32)
    va, vb = riftco.Variable(a, requires_grad=True), riftco.Variable(b, requires_grad=True)
    ta, tb = torch.tensor(a, requires_grad=True), torch.tensor(b, requires_grad=True)

    out = F.log_softmax(F.gelu(va * vb - 1.5) / (vb.sigmoid() + 1.0), axis=1)
    loss = (out.tanh() ** 2).mean(axis=(0, 2)).sum()
    loss = loss + F.gelu(va, approximate="tanh").exp().mean()
    loss.backward()
    tn = torch.nn.functional
    tout = tn.log_softmax(tn.gelu(ta * tb - 1.5) / (tb.sigmoid() + 1.0), dim=1)
    tloss = (tout.tanh() ** 2).mean(dim=(0, 2)).sum()
    tloss = tloss + tn.gelu(ta, approximate="tanh").exp().mean()
    tloss.backward()
    np.testing.assert_allclose(loss.item(), tloss.item(), rtol=1e-5)
    for v, tv in ((va, ta), (vb, tb)):
        assert v.grad is not None and tv.grad is not None
        np.testing.assert_allclose(v.grad, tv.grad.numpy(), rtol=1e-4, atol=1e-6)


# ---- the device seam: the same math on the mirror test backend -------------------------------


def test_operators_on_the_mirror_backend_are_bitwise_the_cpu() -> None:
    """Variables on "privateuseone" (the mirror backend: CPU kernels behind the backend trait,
    buffers no CPU kernel can read) give bitwise the CPU's values and gradients, scalar
    operands (placed on the Variable's device) included."""
    riftco._native._install_mirror_backend()
    tiny: dict[str, Any] = dict(vocab_size=64, d_model=32, n_heads=4, n_layers=1, d_ff=48, max_seq_len=16)

    def run(device: str) -> list[bytes]:
        m = riftco.DecoderOnlyTransformer(riftco.TransformerConfig(**tiny)).to(device)
        params = dict(m.named_parameters())
        mats = [p for p in params.values() if p.ndim == 2]
        vecs = [p for p in params.values() if p.ndim == 1]
        w, g = mats[0], vecs[0]
        assert w.device == device and g.device == device
        h = F.gelu(F.relu(w * 3.0 - g.sum() / 7) * g)
        y = F.log_softmax((2.0 - h) ** 2, axis=-1) + (h > 0.1) * 0.5
        loss = y.mean(axis=0).sum() + F.sigmoid(g).exp().mean()
        loss.backward()
        assert w.grad is not None and g.grad is not None
        return [loss.numpy().tobytes(), y.numpy().tobytes(), w.grad.tobytes(), g.grad.tobytes()]

    assert run("cpu") == run("privateuseone")
