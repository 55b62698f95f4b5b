"""``riftco.no_grad``, ``enable_grad``, ``set_grad_enabled`` and ``is_grad_enabled``: nothing is
recorded inside ``no_grad`` (the results are constants and ``backward()`` refuses them), the
values are those computed with recording on, and every form restores the previous setting,
also on exceptions, per thread."""

from __future__ import annotations

import threading
from collections.abc import Callable

import numpy as np
import pytest

import riftco
from riftco import functional as F


def leaves() -> tuple[riftco.Variable, riftco.Variable]:
    rng = np.random.default_rng(3)
    x = riftco.Variable(rng.standard_normal((4, 5)), requires_grad=True)
    w = riftco.Variable(rng.standard_normal((6, 5)), requires_grad=True)
    return x, w


def test_nothing_is_recorded_inside_no_grad_and_the_values_are_equal() -> None:
    x, w = leaves()
    want = F.silu(F.linear(x, w))
    assert want.requires_grad
    with riftco.no_grad():
        assert not riftco.is_grad_enabled()
        got = F.silu(F.linear(x, w))
    assert riftco.is_grad_enabled()
    assert not got.requires_grad
    assert got.graph_statistics()["node_count"] == 1  # no graph behind it: a constant
    np.testing.assert_array_equal(got.numpy(), want.numpy())
    with pytest.raises(riftco.RiftcoError):
        F.sum(got).backward()
    assert w.grad is None


def test_no_grad_as_a_decorator_restores_the_setting_also_on_exceptions() -> None:
    x, w = leaves()

    @riftco.no_grad()
    def forward(h: riftco.Variable) -> riftco.Variable:
        assert not riftco.is_grad_enabled()
        return F.linear(h, w)

    @riftco.no_grad()
    def fails() -> None:
        raise KeyError("inside")

    assert forward.__name__ == "forward"  # functools.wraps
    y = forward(x)
    assert not y.requires_grad
    assert riftco.is_grad_enabled()
    with pytest.raises(KeyError):
        fails()
    assert riftco.is_grad_enabled()


def test_bare_decorators_without_parentheses() -> None:
    """``@riftco.no_grad`` and ``@riftco.enable_grad`` work without parentheses (PyTorch 2)."""
    x, w = leaves()

    @riftco.no_grad
    def forward(h: riftco.Variable) -> riftco.Variable:
        assert not riftco.is_grad_enabled()
        return F.linear(h, w)

    @riftco.enable_grad
    def recorded(h: riftco.Variable) -> riftco.Variable:
        assert riftco.is_grad_enabled()
        return F.linear(h, w)

    assert forward.__name__ == "forward"
    assert not forward(x).requires_grad
    assert riftco.is_grad_enabled()
    with riftco.no_grad():
        assert recorded(x).requires_grad
        assert not riftco.is_grad_enabled()
    with pytest.raises(TypeError, match="takes no arguments"):
        riftco.no_grad(3)  # type: ignore[call-overload]


def test_enable_grad_inside_no_grad_and_nesting() -> None:
    x, w = leaves()
    with riftco.no_grad():
        with riftco.enable_grad():
            assert riftco.is_grad_enabled()
            y = F.linear(x, w)
        assert not riftco.is_grad_enabled()
        with riftco.no_grad():
            assert not riftco.is_grad_enabled()
        assert not riftco.is_grad_enabled()
    assert riftco.is_grad_enabled()
    F.sum(y).backward()
    assert w.grad is not None


def test_one_no_grad_instance_can_be_entered_again_and_nested() -> None:
    ctx = riftco.no_grad()
    with ctx:
        with riftco.enable_grad():
            with ctx:
                assert not riftco.is_grad_enabled()
            assert riftco.is_grad_enabled()
    assert riftco.is_grad_enabled()


def test_set_grad_enabled_as_function_context_manager_and_decorator() -> None:
    try:
        riftco.set_grad_enabled(False)  # the function form takes effect at once
        assert not riftco.is_grad_enabled()
    finally:
        riftco.set_grad_enabled(True)
    assert riftco.is_grad_enabled()
    with riftco.set_grad_enabled(False):
        assert not riftco.is_grad_enabled()
    assert riftco.is_grad_enabled()

    @riftco.set_grad_enabled(False)
    def off() -> bool:
        return riftco.is_grad_enabled()

    assert riftco.is_grad_enabled()  # decorating changes nothing
    assert off() is False
    assert riftco.is_grad_enabled()
    with pytest.raises(TypeError, match="bool"):
        riftco.set_grad_enabled(1)  # type: ignore[arg-type]


def test_the_setting_is_per_thread() -> None:
    seen: list[bool] = []
    with riftco.no_grad():
        t = threading.Thread(target=lambda: seen.append(riftco.is_grad_enabled()))
        t.start()
        t.join()
    assert seen == [True]


def test_a_checkpoint_backward_inside_no_grad_still_replays_with_recording() -> None:
    x, w = leaves()
    loss = F.sum(riftco.checkpoint(lambda h: F.silu(F.linear(h, w)), x, [w]))
    with riftco.no_grad():
        loss.backward()  # the replay records its own graph whatever the caller's setting
    got = w.grad
    w.zero_grad()
    F.sum(F.silu(F.linear(x, w))).backward()
    np.testing.assert_array_equal(got, w.grad)


@pytest.mark.parametrize(
    ("decorator", "inside", "outside"),
    [
        (lambda: riftco.no_grad(), False, True),
        (lambda: riftco.no_grad, False, True),
        (lambda: riftco.enable_grad(), True, False),
        (lambda: riftco.set_grad_enabled(False), False, True),
        (lambda: riftco.set_grad_enabled(True), True, False),
    ],
)
def test_a_decorated_generator_runs_every_step_with_the_mode(
    decorator: Callable[[], object], inside: bool, outside: bool
) -> None:
    """As PyTorch: each ``next()``/``send()``/``throw()``/``close()`` of a decorated generator
    runs its body with the decorator's mode; between steps the caller's mode is in force."""
    x, w = leaves()
    seen: list[bool] = []

    def steps(n: int):  # type: ignore[no-untyped-def]
        try:
            for _ in range(n):
                seen.append(riftco.is_grad_enabled())
                sent = yield F.linear(x, w)
                seen.append(riftco.is_grad_enabled())
                if sent == "stop":
                    return "stopped"
        except KeyError:
            seen.append(riftco.is_grad_enabled())
            yield None
        finally:
            seen.append(riftco.is_grad_enabled())

    gen_fn = decorator()(steps)  # type: ignore[operator]
    assert gen_fn.__name__ == "steps"
    with riftco.set_grad_enabled(outside):
        gen = gen_fn(3)
        for _ in range(2):
            y = next(gen)
            assert y.requires_grad is inside
            assert riftco.is_grad_enabled() is outside
        with pytest.raises(StopIteration) as stop:
            gen.send("stop")
        assert stop.value.value == "stopped"
        assert riftco.is_grad_enabled() is outside
        # throw() and close() also run inside the mode.
        gen = gen_fn(3)
        next(gen)
        assert gen.throw(KeyError("k")) is None
        assert riftco.is_grad_enabled() is outside
        gen.close()
        assert riftco.is_grad_enabled() is outside
    assert seen and all(s is inside for s in seen), seen
