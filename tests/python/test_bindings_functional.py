"""riftco.functional from Python against references nobody here wrote: NumPy (forward, under
hypothesis), finite differences in float64 (gradients), and PyTorch where it is installed."""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import riftco
from riftco import functional as F


# ---------------------------------------------------------------------------------------------
# functional ops against NumPy
# ---------------------------------------------------------------------------------------------

shapes = st.tuples(st.integers(1, 6), st.integers(1, 9))


def np_silu(x: npt.NDArray[Any]) -> npt.NDArray[Any]:
    out: npt.NDArray[Any] = x / (1.0 + np.exp(-x))
    return out


def np_softmax(x: npt.NDArray[Any]) -> npt.NDArray[Any]:
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    out: npt.NDArray[Any] = e / e.sum(axis=-1, keepdims=True)
    return out


def np_rms_norm(x: npt.NDArray[Any], w: npt.NDArray[Any], eps: float) -> npt.NDArray[Any]:
    out: npt.NDArray[Any] = x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w
    return out


@settings(max_examples=40, deadline=None)
@given(shape=shapes, k=st.integers(1, 8), seed=st.integers(0, 2**31))
def test_functional_ops_match_numpy(shape: tuple[int, int], k: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    a = rng.standard_normal(shape).astype(np.float32)
    b = rng.standard_normal(shape).astype(np.float32)
    w = rng.standard_normal((k, shape[1])).astype(np.float32)
    g = rng.standard_normal(shape[1]).astype(np.float32)
    va, vb, vw, vg = (riftco.Variable(t) for t in (a, b, w, g))
    def close(got: Any, want: Any) -> None:
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)

    close(F.add(va, vb).numpy(), a + b)
    close(F.mul(va, vb).numpy(), a * b)
    close(F.scale(va, -1.5).numpy(), -1.5 * a)
    close(F.matmul(va, riftco.Variable(w.T.copy())).numpy(), a @ w.T)
    close(F.linear(va, vw).numpy(), a @ w.T)
    close(F.silu(va).numpy(), np_silu(a))
    close(F.swiglu(va, vb).numpy(), np_silu(a) * b)
    close(F.softmax(va).numpy(), np_softmax(a))
    close(F.rms_norm(va, vg, eps=1e-5).numpy(), np_rms_norm(a, g, 1e-5))
    close(F.sum(va).item(), float(a.astype(np.float64).sum()))
    assert F.reshape(va, [shape[1], shape[0]]).shape == (shape[1], shape[0])
    np.testing.assert_array_equal(F.reshape(va, [a.size]).numpy(), a.reshape(-1))
    targets = rng.integers(0, shape[1], size=shape[0])
    logp = np.log(np_softmax(a.astype(np.float64)))
    want = -np.mean(logp[np.arange(shape[0]), targets])
    close(F.cross_entropy(va, targets).item(), want)


def test_functional_gradients_match_finite_differences_in_float64() -> None:
    rng = np.random.default_rng(7)
    x = rng.standard_normal((3, 6))
    w = rng.standard_normal((4, 6)) * 0.5
    g = rng.standard_normal(4) * 0.5 + 1.0
    t = np.array([0, 3, 1])

    def f64(x: npt.NDArray[np.float64], w: npt.NDArray[np.float64], g: npt.NDArray[np.float64]) -> float:
        h = np_rms_norm(np_silu(x @ w.T), g, 1e-5)
        logp = np.log(np_softmax(h))
        return float(-np.mean(logp[np.arange(3), t]))

    vx, vw, vg = (riftco.Variable(a, requires_grad=True) for a in (x, w, g))
    loss = F.cross_entropy(F.rms_norm(F.silu(F.linear(vx, vw)), vg), t)
    np.testing.assert_allclose(loss.item(), f64(x, w, g), rtol=1e-5)
    loss.backward()
    eps = 1e-6
    for var, arr in ((vx, x), (vw, w), (vg, g)):
        fd = np.zeros_like(arr)
        for i in np.ndindex(arr.shape):
            up, down = arr.copy(), arr.copy()
            up[i] += eps
            down[i] -= eps
            args = [up if a is arr else a for a in (x, w, g)]
            args_d = [down if a is arr else a for a in (x, w, g)]
            fd[i] = (f64(*args) - f64(*args_d)) / (2 * eps)
        assert var.grad is not None
        np.testing.assert_allclose(var.grad, fd, rtol=2e-3, atol=2e-5)


def test_functional_shape_errors() -> None:
    a = riftco.Variable(np.ones((2, 3)))
    b = riftco.Variable(np.ones((3, 2)))
    for op in (F.add, F.mul, F.swiglu):
        with pytest.raises(riftco.ShapeError, match=r"\[2, 3\]|\[3, 2\]") as info:
            op(a, b)
        assert isinstance(info.value, ValueError)
    with pytest.raises(riftco.ShapeError):
        F.matmul(a, a)
    with pytest.raises(riftco.ShapeError):
        F.linear(a, b)
    with pytest.raises(riftco.ShapeError):
        F.reshape(a, [4])
    with pytest.raises(riftco.ShapeError):
        F.rms_norm(a, riftco.Variable(np.ones(2)))
    with pytest.raises(riftco.ShapeError):
        F.cross_entropy(a, [0])
    with pytest.raises(riftco.TokenError, match="3"):
        F.cross_entropy(a, [0, 3])
    with pytest.raises(riftco.TokenError, match="-1"):
        F.cross_entropy(a, [0, -1])



# ---------------------------------------------------------------------------------------------
# PyTorch reference (optional)
# ---------------------------------------------------------------------------------------------


def test_ops_match_pytorch() -> None:
    try:
        import torch  # type: ignore[import-not-found, unused-ignore]
    except ImportError:
        pytest.skip("torch not installed: the PyTorch comparison of functional ops is skipped")
    rng = np.random.default_rng(0)
    x = rng.standard_normal((4, 6)).astype(np.float32)
    w = rng.standard_normal((5, 6)).astype(np.float32)
    g = rng.standard_normal(5).astype(np.float32)
    t = np.array([0, 4, 2, 1])
    vx, vw, vg = (riftco.Variable(a, requires_grad=True) for a in (x, w, g))
    loss = F.cross_entropy(F.rms_norm(F.silu(F.linear(vx, vw)), vg), t)
    loss.backward()
    tx, tw, tg = (torch.tensor(a, requires_grad=True) for a in (x, w, g))
    h = torch.nn.functional.silu(tx @ tw.T)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-5) * tg
    tl = torch.nn.functional.cross_entropy(h, torch.tensor(t))
    tl.backward()
    np.testing.assert_allclose(loss.item(), tl.item(), rtol=1e-5)
    for v, tv in ((vx, tx), (vw, tw), (vg, tg)):
        assert tv.grad is not None and v.grad is not None
        np.testing.assert_allclose(v.grad, tv.grad.numpy(), rtol=1e-4, atol=1e-6)
