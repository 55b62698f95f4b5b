"""The native checkpoint of several inputs: ``riftco._native.checkpoint(fn, (a, b), deps)`` calls
``fn(a, b)``; gradients equal the plain graph's bit for bit, and bad inputs are rejected."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

import riftco
from riftco import _native
from riftco import functional as F


def leaves() -> tuple[riftco.Variable, riftco.Variable, riftco.Variable]:
    rng = np.random.default_rng(7)
    a = riftco.Variable(rng.standard_normal((3, 4)).astype(np.float32), requires_grad=True)
    b = riftco.Variable(rng.standard_normal((3, 5)).astype(np.float32), requires_grad=True)
    w = riftco.Variable(rng.standard_normal((5, 4)).astype(np.float32), requires_grad=True)
    return a, b, w


def block(w: riftco.Variable) -> Callable[[riftco.Variable, riftco.Variable], riftco.Variable]:
    def fn(a: riftco.Variable, b: riftco.Variable) -> riftco.Variable:
        return F.mul(F.silu(F.linear(a, w)), b)

    return fn


@pytest.mark.parametrize("container", [tuple, list])
def test_two_input_checkpoint_gradients_equal_the_plain_graph_bitwise(container: type) -> None:
    a, b, w = leaves()
    F.sum(block(w)(a, b)).backward()
    want = [v.grad for v in (a, b, w)]
    for v in (a, b, w):
        v.zero_grad()
    calls = []

    def fn(x: riftco.Variable, y: riftco.Variable) -> riftco.Variable:
        calls.append((x.shape, y.shape))
        return block(w)(x, y)

    out = _native.checkpoint(fn, container([a, b]), [w])
    assert out.shape == (3, 5)
    F.sum(out).backward()
    # Called with the inputs as positional arguments, in order, once now and once at backward.
    assert calls == [((3, 4), (3, 5))] * 2
    for v, g in zip((a, b, w), want):
        assert v.grad is not None and g is not None
        np.testing.assert_array_equal(v.grad, g)


def test_a_single_variable_input_still_works() -> None:
    a, _, _ = leaves()
    out = _native.checkpoint(F.silu, a)
    F.sum(out).backward()
    assert a.grad is not None and a.grad.shape == (3, 4)


def test_bad_input_containers_are_type_errors_naming_them() -> None:
    a, b, w = leaves()
    with pytest.raises(TypeError, match="got int"):
        _native.checkpoint(F.silu, 3)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="input 1 of x .* got ndarray"):
        _native.checkpoint(F.add, (a, np.ones((3, 4))))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="got dict"):
        _native.checkpoint(F.silu, {"a": a})  # type: ignore[arg-type]


def test_input_contract_violations_are_checkpoint_errors() -> None:
    a, b, w = leaves()
    with pytest.raises(riftco.CheckpointError, match="no input"):
        _native.checkpoint(lambda: a, ())
    with pytest.raises(riftco.CheckpointError, match="positions 0 and 1"):
        _native.checkpoint(F.add, (a, a))
    with pytest.raises(riftco.CheckpointError, match="also a declared dependency"):
        _native.checkpoint(lambda x, v: F.linear(x, v), (a, w), [w])
    with pytest.raises(riftco.CheckpointError, match="input 1 \\(of 2 inputs\\)"):
        _native.checkpoint(lambda x, y: F.silu(x), (a, b))
