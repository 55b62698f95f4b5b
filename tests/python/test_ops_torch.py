"""Every op of the PyTorch-style layer against PyTorch (an optional test dependency: skipped
with the reason when ``import torch`` fails): values and gradients of each op on
hypothesis-drawn shapes (broadcasting, size-1 axes, rank 0), both in float32.

Tolerances: values 1e-5 relative (an element-wise op computes the same formula in the same
precision; transcendental functions may differ in the last ulps, and reductions differ in
order: riftco sums in float64, PyTorch in float32 with its own blocking), gradients 1e-4
relative with 1e-6 absolute (the VJPs of reductions and broadcasts are sums in different
orders).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import riftco
import riftco.functional as F

torch: Any = pytest.importorskip(
    "torch", reason="PyTorch is optional and not installed: the comparison with it is skipped"
)
tn = torch.nn.functional
SETTINGS = settings(max_examples=25, deadline=None)
pairs = hnp.mutually_broadcastable_shapes(num_shapes=2, min_dims=0, max_dims=3, max_side=4)
shapes = hnp.array_shapes(min_dims=0, max_dims=3, min_side=1, max_side=4)


def draw(shape: tuple[int, ...], seed: int, positive: bool = False) -> np.ndarray:
    x = np.random.default_rng(seed).uniform(-2.0, 2.0, size=shape).astype(np.float32)
    return np.abs(x) + np.float32(0.25) if positive else x


def compare(
    ours: Callable[..., riftco.Variable],
    theirs: Callable[..., Any],
    *arrays: np.ndarray,
) -> None:
    """``sum(w * op(*xs))`` for a random ``w``: the op's value, and the gradient of every
    input, in riftco and in PyTorch."""
    vs = [riftco.Variable(a, requires_grad=True) for a in arrays]
    ts = [torch.tensor(a, requires_grad=True) for a in arrays]
    y, ty = ours(*vs), theirs(*ts)
    assert y.shape == tuple(ty.shape)
    np.testing.assert_allclose(y.numpy(), ty.detach().numpy(), rtol=1e-5, atol=1e-6)
    w = np.random.default_rng(99).uniform(-1, 1, size=y.shape).astype(np.float32)
    F.sum(y * riftco.Variable(w)).backward()
    (ty * torch.tensor(w)).sum().backward()
    for v, t in zip(vs, ts):
        assert v.grad is not None and t.grad is not None
        np.testing.assert_allclose(v.grad, t.grad.numpy(), rtol=1e-4, atol=1e-6)


BINARY: dict[str, tuple[Callable[..., Any], bool]] = {
    "add": (lambda a, b: a + b, False),
    "sub": (lambda a, b: a - b, False),
    "mul": (lambda a, b: a * b, False),
    "div": (lambda a, b: a / b, True),
    "rsub_scalar": (lambda a, b: 1.5 - a * b, False),
    "rdiv_scalar": (lambda a, b: 2.0 / (a * a + b * b + 0.5), False),
}


@pytest.mark.parametrize("name", sorted(BINARY))
@SETTINGS
@given(shapes=pairs, seed=st.integers(0, 2**16))
def test_binary_ops_broadcast_like_pytorch(name: str, shapes: Any, seed: int) -> None:
    f, positive_b = BINARY[name]
    (sa, sb), _ = shapes
    compare(f, f, draw(sa, seed), draw(sb, seed + 1, positive=positive_b))


UNARY: dict[str, tuple[Callable[..., Any], Callable[..., Any], bool]] = {
    "neg": (lambda x: -x, lambda x: -x, False),
    "exp": (lambda x: x.exp(), lambda x: x.exp(), False),
    "log": (lambda x: x.log(), lambda x: x.log(), True),
    "tanh": (lambda x: x.tanh(), lambda x: x.tanh(), False),
    "sigmoid": (lambda x: x.sigmoid(), lambda x: x.sigmoid(), False),
    "relu": (lambda x: x.relu(), lambda x: x.relu(), False),
    "gelu": (F.gelu, tn.gelu, False),
    "gelu_tanh": (
        lambda x: F.gelu(x, approximate="tanh"),
        lambda x: tn.gelu(x, approximate="tanh"),
        False,
    ),
    "pow_3": (lambda x: x**3, lambda x: x**3, False),
    "pow_half": (lambda x: x**0.5, lambda x: x**0.5, True),
    "pow_neg": (lambda x: x**-1.5, lambda x: x**-1.5, True),
    "scalar_affine": (lambda x: (x + 2.0) * 0.5 - 1.0, lambda x: (x + 2.0) * 0.5 - 1.0, False),
}


@pytest.mark.parametrize("name", sorted(UNARY))
@SETTINGS
@given(shape=shapes, seed=st.integers(0, 2**16))
def test_unary_ops_like_pytorch(name: str, shape: tuple[int, ...], seed: int) -> None:
    ours, theirs, positive = UNARY[name]
    x = draw(shape, seed, positive=positive)
    if name == "relu":  # away from the kink, where the two derivatives' conventions may differ
        x = np.where(np.abs(x) < 1e-3, np.float32(0.5), x)
    compare(ours, theirs, x)


@SETTINGS
@given(shape=shapes, seed=st.integers(0, 2**16), data=st.data())
def test_reductions_and_log_softmax_like_pytorch(
    shape: tuple[int, ...], seed: int, data: st.DataObject
) -> None:
    x = draw(shape, seed)
    rank = len(shape)
    keep = data.draw(st.booleans())
    if rank:
        distinct = st.lists(
            st.integers(-rank, rank - 1), min_size=1, max_size=rank, unique_by=lambda a: a % rank
        )
        axes = tuple(data.draw(distinct))
        compare(
            lambda v: v.sum(axis=axes, keepdims=keep),
            lambda t: t.sum(dim=axes, keepdim=keep),
            x,
        )
        compare(
            lambda v: v.mean(axis=axes, keepdims=keep),
            lambda t: t.mean(dim=axes, keepdim=keep),
            x,
        )
        axis = data.draw(st.integers(-rank, rank - 1))
        compare(lambda v: F.log_softmax(v, axis=axis), lambda t: tn.log_softmax(t, dim=axis), x)
    compare(lambda v: v.sum(), lambda t: t.sum(), x)
    compare(lambda v: v.mean(), lambda t: t.mean(), x)


@SETTINGS
@given(
    m=st.integers(1, 5),
    k=st.integers(1, 5),
    n=st.integers(1, 5),
    batch=st.sampled_from([(), (1,), (3,)]),
    seed=st.integers(0, 2**16),
)
def test_matmul_like_pytorch(
    m: int, k: int, n: int, batch: tuple[int, ...], seed: int
) -> None:
    a, b = draw((*batch, m, k), seed), draw((k, n), seed + 1)
    compare(lambda x, y: x @ y, lambda x, y: x @ y, a, b)
    if batch:
        bb = draw((*batch, k, n), seed + 2)
        compare(lambda x, y: x @ y, lambda x, y: x @ y, a, bb)


@SETTINGS
@given(
    shape=hnp.array_shapes(min_dims=1, max_dims=3, min_side=1, max_side=4),
    seed=st.integers(0, 2**16),
)
def test_layout_ops_and_indexing_like_pytorch(shape: tuple[int, ...], seed: int) -> None:
    x = draw(shape, seed)
    r = len(shape)
    last = min(1, shape[-1] - 1)
    compare(lambda v: v[..., last], lambda t: t[..., last], x)
    # PyTorch has no negative slice steps: riftco's v[::-1] is checked against NumPy elsewhere.
    compare(lambda v: v[1:, ...], lambda t: t[1:, ...], x)
    compare(lambda v: v[-1], lambda t: t[-1], x)
    compare(lambda v: v[None, ..., 0:3:2], lambda t: t[None, ..., 0:3:2], x)
    compare(lambda v: v.transpose(0, -1), lambda t: t.transpose(0, -1), x)
    compare(lambda v: v.permute(*reversed(range(r))), lambda t: t.permute(*reversed(range(r))), x)
    compare(lambda v: v.reshape(-1), lambda t: t.reshape(-1), x)
    y = draw(shape, seed + 3)
    compare(lambda v, w: F.concat([v, w * 2.0], axis=0), lambda v, w: torch.cat([v, w * 2.0]), x, y)
    compare(lambda v, w: F.stack([v, w], axis=-1), lambda v, w: torch.stack([v, w], dim=-1), x, y)


def test_nn_layers_like_pytorch() -> None:
    """Linear (with the same weights), Embedding, RMSNorm and a small MLP loss: values and
    gradients of every parameter."""
    from riftco import nn

    riftco.manual_seed(0)
    lin = nn.Linear(6, 5)
    tlin = torch.nn.Linear(6, 5)
    with torch.no_grad():
        tlin.weight.copy_(torch.tensor(lin.weight.numpy()))
        assert lin.bias is not None
        tlin.bias.copy_(torch.tensor(lin.bias.numpy()))
    x = draw((4, 6), 1)
    y = F.log_softmax(F.relu(lin(riftco.Variable(x))), axis=-1)[:, 2].mean()
    ty = tn.log_softmax(tn.relu(tlin(torch.tensor(x))), dim=-1)[:, 2].mean()
    y.backward()
    ty.backward()
    np.testing.assert_allclose(y.item(), ty.item(), rtol=1e-5)
    assert lin.bias is not None
    assert lin.weight.grad is not None and lin.bias.grad is not None
    np.testing.assert_allclose(lin.weight.grad, tlin.weight.grad.numpy(), rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(lin.bias.grad, tlin.bias.grad.numpy(), rtol=1e-4, atol=1e-6)

    norm = nn.RMSNorm(6, eps=1e-6)
    tnorm = torch.nn.RMSNorm(6, eps=1e-6)
    compare(lambda v: norm(v), lambda t: tnorm(t), x)
    assert norm.weight.grad is not None
    np.testing.assert_allclose(norm.weight.grad, tnorm.weight.grad.numpy(), rtol=1e-4, atol=1e-6)

    emb = nn.Embedding(10, 3)
    temb = torch.nn.Embedding(10, 3)
    with torch.no_grad():
        temb.weight.copy_(torch.tensor(emb.weight.numpy()))
    ids = np.array([[1, 4, 4], [9, 0, 1]])
    e = emb(ids)
    te = temb(torch.tensor(ids))
    np.testing.assert_array_equal(e.numpy(), te.detach().numpy())
    F.sum(e * e).backward()
    (te * te).sum().backward()
    assert emb.weight.grad is not None
    np.testing.assert_allclose(emb.weight.grad, temb.weight.grad.numpy(), rtol=1e-5, atol=1e-6)
