"""``riftco.functional.dropout`` and dropout inside checkpoints and models, from Python.

- Statistics: over 10**6 elements the kept fraction is ``1 - p`` within 4 standard errors; kept
  values are exactly ``x * float32(1 / (1 - p))``, dropped ones exactly 0.
- The VJP matches central finite differences (NumPy, f64) with the mask held fixed (a seed).
- The same seed gives the same mask; without a seed the mask comes from the thread's generator
  (``riftco.manual_seed``), which advances.
- ``riftco.checkpoint`` with ``preserve_rng_state=True`` (the default) replays the forward's
  mask, so its gradients equal the plain graph's; with ``False`` the replay draws another mask
  and the gradients are those of a different forward (why the default matters).
- A model with attention, residual and LoRA dropout trains bitwise alike under ``disabled`` and
  ``block``; evaluation (``no_grad``, ``eval()``) never drops.
- Bad ``p`` and ``seed`` are ``ConfigError`` naming them.
"""

from __future__ import annotations

import math
import re
from typing import Any, Callable

import numpy as np
import pytest

import riftco
from riftco import functional as F


def var(a: np.ndarray[Any, Any], grad: bool = True) -> riftco.Variable:
    return riftco.Variable(np.ascontiguousarray(a, dtype=np.float32), requires_grad=grad)


@pytest.mark.parametrize("p", [0.1, 0.5])
def test_kept_fraction_and_scaling(p: float) -> None:
    n = 1_000_000
    x = np.random.default_rng(0).uniform(0.5, 1.5, n).astype(np.float32)
    y = F.dropout(var(x, grad=False), p, seed=1234).numpy()
    kept = y != 0
    frac = kept.mean()
    se = math.sqrt(p * (1 - p) / n)
    assert abs(frac - (1 - p)) <= 4 * se, f"kept {frac} vs {1 - p} (4 SE = {4 * se})"
    scale = np.float32(1.0) / (np.float32(1.0) - np.float32(p))
    np.testing.assert_array_equal(y[kept], x[kept] * scale)
    assert np.all(y[~kept] == 0.0) and not np.signbit(y[~kept]).any()


def test_p_zero_and_eval_are_the_identity() -> None:
    x = var(np.arange(10.0))
    assert F.dropout(x, 0.0, seed=3) is not None
    np.testing.assert_array_equal(F.dropout(x, 0.0, seed=3).numpy(), x.numpy())
    np.testing.assert_array_equal(F.dropout(x, 0.9, training=False).numpy(), x.numpy())


def test_gradient_matches_finite_differences_with_the_mask_fixed() -> None:
    rng = np.random.default_rng(1)
    x0 = rng.normal(size=(7, 13))
    w = rng.normal(size=(7, 13))

    def loss(x: np.ndarray[Any, Any]) -> float:
        y = F.dropout(var(x, grad=False), 0.3, seed=99).numpy().astype(np.float64)
        return float((y * w).sum())

    xv = var(x0)
    out = F.sum(F.mul(F.dropout(xv, 0.3, seed=99), var(w, grad=False)))
    out.backward()
    g = xv.grad
    assert g is not None
    h = 1e-2  # the map is linear in x: the central difference is exact up to f32 rounding
    fd = np.zeros_like(x0)
    for i in np.ndindex(*x0.shape):
        e = np.zeros_like(x0)
        e[i] = h
        fd[i] = (loss(x0 + e) - loss(x0 - e)) / (2 * h)
    np.testing.assert_allclose(g, fd, rtol=1e-3, atol=1e-4)
    # The gradient is the mask scaled: zero exactly where the forward dropped.
    y = F.dropout(var(x0, grad=False), 0.3, seed=99).numpy()
    assert np.all((g == 0) == (y == 0))


def test_seeds_and_the_thread_generator() -> None:
    x = var(np.ones(4096), grad=False)
    a = F.dropout(x, 0.5, seed=7).numpy()
    np.testing.assert_array_equal(a, F.dropout(x, 0.5, seed=7).numpy())
    assert not np.array_equal(a, F.dropout(x, 0.5, seed=8).numpy())
    riftco.manual_seed(5)
    first = F.dropout(x, 0.5).numpy()
    second = F.dropout(x, 0.5).numpy()
    assert not np.array_equal(first, second), "the generator did not advance"
    assert riftco.get_rng_state() == (5, 2 * 4096 // 4)
    riftco.manual_seed(5)
    np.testing.assert_array_equal(F.dropout(x, 0.5).numpy(), first)


def grads_of(
    preserve: bool | None, fn_seed: int = 11
) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """Gradients of ``sum(dropout(tanh-ish(x @ w)) * c)`` w.r.t. x and w, with the dropout drawn
    from the generator; ``preserve=None`` is the plain graph (no checkpoint)."""
    rng = np.random.default_rng(2)
    x = var(rng.normal(size=(6, 8)))
    w = var(rng.normal(size=(8, 8)))
    c = var(rng.normal(size=(6, 8)), grad=False)

    def block(h: riftco.Variable) -> riftco.Variable:
        return F.dropout(F.silu(F.matmul(h, w)), 0.5)

    riftco.manual_seed(fn_seed)
    if preserve is None:
        y = block(x)
    else:
        y = riftco.checkpoint(block, x, [w], preserve_rng_state=preserve)
    # Something else draws between the forward and the backward (as a training loop would).
    F.dropout(var(np.ones(64), grad=False), 0.5)
    F.sum(F.mul(y, c)).backward()
    assert x.grad is not None and w.grad is not None
    return x.grad, w.grad


def test_preserve_rng_state_makes_checkpoint_gradients_equal_the_plain_graph() -> None:
    plain = grads_of(None)
    preserved = grads_of(True)
    for a, b in zip(plain, preserved):
        np.testing.assert_array_equal(a, b)
    # The default is True.
    rng = np.random.default_rng(2)
    x = var(rng.normal(size=(5,)))
    riftco.manual_seed(1)
    y = riftco.checkpoint(lambda h: F.dropout(h, 0.5), x, [])
    F.dropout(var(np.ones(8), grad=False), 0.5)
    F.sum(y).backward()
    assert x.grad is not None
    np.testing.assert_array_equal(x.grad != 0, y.numpy() != 0)


def test_without_preserve_rng_state_the_replay_draws_another_mask() -> None:
    plain = grads_of(None)
    broken = grads_of(False)
    # The replay drew a different mask: the gradients belong to another forward.
    assert not np.array_equal(plain[0], broken[0])
    assert not np.array_equal(plain[1], broken[1])
    # "values" catches it (the output differs from the forward's), naming the checkpoint.
    rng = np.random.default_rng(2)
    x = var(rng.normal(size=(6, 8)))

    def noisy(h: riftco.Variable) -> riftco.Variable:
        return F.dropout(h, 0.5)

    riftco.manual_seed(0)
    y = riftco.checkpoint(noisy, x, [], preserve_rng_state=False, determinism_check="values")
    F.dropout(var(np.ones(64), grad=False), 0.5)
    with pytest.raises(riftco.CheckpointError, match="noisy") as info:
        F.sum(y).backward()
    assert "first difference at flat index" in str(info.value)
    assert x.grad is None, "a failed backward committed a gradient"


def tiny_model(
    p: float, policy: str, lora: bool, attention: str = "flash"
) -> riftco.DecoderOnlyTransformer:
    cfg = riftco.TransformerConfig(
        vocab_size=64,
        d_model=16,
        n_heads=2,
        n_layers=3,
        d_ff=32,
        max_seq_len=16,
        seed=3,
        attention_dropout=p,
        residual_dropout=p,
    )
    m = riftco.DecoderOnlyTransformer(cfg, attention, activation_checkpointing=policy)
    if lora:
        m.enable_lora(rank=2, alpha=4.0, dropout=p)
    return m


def train_losses(m: riftco.DecoderOnlyTransformer, steps: int) -> list[float]:
    params = m.parameters()
    opt = riftco.Adam(params, lr=1e-2)
    tokens = (np.arange(2 * 9, dtype=np.int64).reshape(2, 9) * 7) % 64
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = m.loss(tokens)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


@pytest.mark.parametrize("lora", [False, True])
@pytest.mark.parametrize("attention", ["flash", "materialized"])
def test_models_with_dropout_train_bitwise_alike_under_every_policy(
    attention: str, lora: bool
) -> None:
    runs = {}
    for policy in ["disabled", "block", "segments:2", "selective:dots"]:
        m = tiny_model(0.1, policy, lora, attention)
        runs[policy] = train_losses(m, 12)
    for policy, losses in runs.items():
        assert losses == runs["disabled"], policy
    assert runs["disabled"] != train_losses(tiny_model(0.0, "disabled", lora, attention), 12)


def test_only_the_training_loss_drops() -> None:
    tokens = (np.arange(2 * 9, dtype=np.int64).reshape(2, 9) * 7) % 64
    dropped, plain = tiny_model(0.3, "block", True), tiny_model(0.0, "block", True)
    b = plain.loss(tokens).item()
    assert dropped.loss(tokens).item() != b
    assert dropped.dropout_step == 1
    # logits() is the deterministic model's, in training mode too, and takes no dropout step.
    np.testing.assert_array_equal(
        dropped.logits(tokens[:, :-1]).numpy(), plain.logits(tokens[:, :-1]).numpy()
    )
    assert dropped.dropout_step == 1
    assert dropped.eval() is dropped
    assert dropped.loss(tokens).item() == b


BAD_P: list[Any] = [-0.1, 1.0, 1.5, float("nan"), float("inf"), "0.1", True]


@pytest.mark.parametrize("p", BAD_P)
def test_bad_p_is_a_config_error_naming_p(p: Any) -> None:
    with pytest.raises(riftco.ConfigError, match=r"\bp\b"):
        F.dropout(var(np.ones(3)), p)


@pytest.mark.parametrize("seed", [-1, 2**64, True, 1.5, "3"])
def test_bad_seed_is_a_config_error(seed: Any) -> None:
    with pytest.raises(riftco.ConfigError, match="seed"):
        F.dropout(var(np.ones(3)), 0.5, seed=seed)


class Counting:
    """A callable object whose output changes with every call (a nondeterministic callable)."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, h: riftco.Variable) -> riftco.Variable:
        self.calls += 1
        return F.scale(h, float(self.calls))


def counting_fn(h: riftco.Variable, factor: float, state: list[int]) -> riftco.Variable:
    state[0] += 1
    return F.scale(h, factor * state[0])


def test_values_errors_name_callable_objects_and_partials() -> None:
    import functools

    cases: list[tuple[Callable[[riftco.Variable], riftco.Variable], str]] = [
        (Counting(), "Counting"),
        (functools.partial(counting_fn, factor=2.0, state=[0]), "partial(counting_fn)"),
    ]
    for fn, expected in cases:
        x = var(np.ones(4))
        y = riftco.checkpoint(fn, x, [], determinism_check="values")
        with pytest.raises(riftco.CheckpointError, match=rf'checkpoint "{re.escape(expected)}"'):
            F.sum(y).backward()


def test_a_saved_named_value_that_drew_a_mask_keeps_the_later_masks() -> None:
    rng = np.random.default_rng(3)
    x0, w0 = rng.normal(size=(6, 8)), rng.normal(size=(8, 8))

    def run(save: list[str] | None) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
        x, w = var(x0), var(w0)

        def f(h: riftco.Variable) -> riftco.Variable:
            a = riftco.named("drop_in", lambda t: F.dropout(t, 0.3), h)
            return F.dropout(F.linear(a, w), 0.5)

        riftco.manual_seed(2)
        y = f(x) if save is None else riftco.checkpoint(f, x, [w], save=save)
        F.sum(y).backward()
        assert x.grad is not None and w.grad is not None
        return x.grad, w.grad

    plain = run(None)
    for got, want in zip(run(["drop_in"]), plain):
        np.testing.assert_array_equal(got, want)
