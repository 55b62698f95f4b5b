"""The thread's generator state (``manual_seed``, ``get_rng_state``, ``set_rng_state``) across
checkpoint replays (``preserve_rng_state``), and ``determinism_check`` ("off", "metadata",
"values") on ``checkpoint`` and on the model's policies.

A Python callable "draws" generator blocks here by advancing the state with ``set_rng_state``
(what a random op does through ``reserve``), so these tests need no random op.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

import riftco
from riftco import functional as F

SMALL: dict[str, Any] = dict(vocab_size=64, d_model=32, n_heads=4, n_layers=3, d_ff=48, max_seq_len=16)
BATCH, SEQ = 2, 12


def leaves() -> tuple[riftco.Variable, riftco.Variable]:
    rng = np.random.default_rng(0)
    x = riftco.Variable(rng.standard_normal((4, 6)).astype(np.float32), requires_grad=True)
    w = riftco.Variable(rng.standard_normal((6, 6)).astype(np.float32), requires_grad=True)
    return x, w


def grad(v: riftco.Variable) -> npt.NDArray[np.float32]:
    g = v.grad
    assert g is not None, "expected a gradient"
    return g


def draw(blocks: int) -> tuple[int, int]:
    """Advances the thread's generator by ``blocks`` blocks; returns the state before."""
    seed, offset = riftco.get_rng_state()
    riftco.set_rng_state((seed, offset + blocks))
    return seed, offset


def counting_block(w: riftco.Variable) -> tuple[Any, list[int]]:
    """A callable adding the number of its earlier calls to element 7 of its output."""
    calls: list[int] = []

    def noisy_block(h: riftco.Variable) -> riftco.Variable:
        bump = np.zeros((4, 6), dtype=np.float32)
        bump.flat[7] = float(len(calls))
        calls.append(1)
        return F.add(F.silu(F.linear(h, w)), riftco.Variable(bump))

    return noisy_block, calls


def test_values_catches_a_callable_reading_a_counter_naming_it_and_commits_nothing() -> None:
    x, w = leaves()
    F.sum(F.linear(x, w)).backward()
    before = (grad(x).copy(), grad(w).copy())
    fn, calls = counting_block(w)
    y = riftco.checkpoint(fn, x, [w], determinism_check="values")
    forward = y.numpy().flat[7]
    with pytest.raises(riftco.CheckpointError) as e:
        F.sum(F.mul(y, y)).backward()
    assert len(calls) == 2
    msg = str(e.value)
    assert "noisy_block" in msg, msg
    assert "flat index 7" in msg, msg
    m = re.search(r"forward (\S+) \(bits .*\), replay (\S+) \(bits", msg)
    assert m, msg
    assert float(m.group(1)) == pytest.approx(forward, rel=1e-6)
    assert float(m.group(2)) == pytest.approx(forward + 1.0, rel=1e-6)
    # The failed pass committed nothing: the earlier gradients are unchanged.
    assert np.array_equal(grad(x), before[0]) and np.array_equal(grad(w), before[1])


@pytest.mark.parametrize("check", ["metadata", "off"])
def test_metadata_and_off_do_not_catch_a_changed_value_of_the_same_shape(check: str) -> None:
    # PyTorch's level: shape and device only; the backward pass succeeds silently.
    x, w = leaves()
    fn, calls = counting_block(w)
    y = riftco.checkpoint(fn, x, [w], determinism_check=check)
    F.sum(F.mul(y, y)).backward()
    assert len(calls) == 2 and w.grad is not None


def test_values_catches_a_replay_drawing_another_number_of_blocks() -> None:
    riftco.manual_seed(9)
    x, w = leaves()
    calls: list[int] = []

    def greedy(h: riftco.Variable) -> riftco.Variable:
        calls.append(1)
        draw(len(calls))  # one block at the forward run, two at the replay
        return F.silu(F.linear(h, w))

    y = riftco.checkpoint(greedy, x, [w], determinism_check="values", name="greedy block")
    assert riftco.get_rng_state() == (9, 1)
    with pytest.raises(riftco.CheckpointError) as e:
        F.sum(y).backward()
    msg = str(e.value)
    assert '"greedy block"' in msg and "random numbers" in msg, msg
    assert "to (seed 9, offset 1)" in msg and "to (seed 9, offset 2)" in msg, msg
    assert w.grad is None and x.grad is None
    assert riftco.get_rng_state() == (9, 1), "the replay's draws did not leak"


def drawing(w: riftco.Variable, seen: list[tuple[int, int]]) -> Any:
    def fn(h: riftco.Variable) -> riftco.Variable:
        state = draw(4)
        seen.append(state)
        return F.scale(F.silu(F.linear(h, w)), 1.0 + state[1] / 100.0)

    return fn


@pytest.mark.parametrize("check", ["off", "metadata", "values"])
def test_preserve_rng_state_replays_the_forward_state_and_restores_the_thread(check: str) -> None:
    x, w = leaves()
    riftco.manual_seed(10)
    state = draw(4)
    F.sum(F.scale(F.silu(F.linear(x, w)), 1.0 + state[1] / 100.0)).backward()
    reference = grad(w).copy()

    riftco.manual_seed(10)
    seen: list[tuple[int, int]] = []
    y = riftco.checkpoint(drawing(w, seen), x, [w], determinism_check=check)
    assert riftco.get_rng_state() == (10, 4)
    draw(100)  # other draws between forward and backward
    F.sum(y).backward()
    assert seen == [(10, 0), (10, 0)]
    assert riftco.get_rng_state() == (10, 104)
    assert np.array_equal(grad(w), reference)


def test_without_preserve_rng_state_the_replay_draws_from_the_current_state() -> None:
    x, w = leaves()
    riftco.manual_seed(10)
    seen: list[tuple[int, int]] = []
    y = riftco.checkpoint(drawing(w, seen), x, [w])
    F.sum(y).backward()
    reference = grad(w).copy()

    riftco.manual_seed(10)
    seen = []
    y = riftco.checkpoint(drawing(w, seen), x, [w], preserve_rng_state=False)
    F.sum(y).backward()
    assert seen == [(10, 0), (10, 4)]
    assert riftco.get_rng_state() == (10, 8)
    assert not np.array_equal(grad(w), reference), "the replay drew other numbers"


def test_the_rng_state_is_per_thread() -> None:
    import threading

    riftco.manual_seed(123)
    draw(5)
    other: list[tuple[int, int]] = []
    t = threading.Thread(target=lambda: other.append(riftco.get_rng_state()))
    t.start()
    t.join()
    assert other == [(0, 0)]
    assert riftco.get_rng_state() == (123, 5)


@pytest.mark.parametrize(
    "policy",
    [
        "disabled",
        "block",
        "segments:2",
        "auto",
        "selective",
        "selective:dots",
        ["block", "selective:dots", "disabled"],
    ],
)
def test_values_passes_silently_on_every_policy_with_the_metadata_gradients(policy: Any) -> None:
    tokens = np.random.default_rng(1).integers(0, 64, size=(BATCH, SEQ + 1))
    results = []
    for check in ["metadata", "values"]:
        model = riftco.DecoderOnlyTransformer(
            riftco.TransformerConfig(**SMALL),
            activation_checkpointing=policy,
            determinism_check=check,
        )
        assert model.determinism_check == check
        loss = model.loss(tokens)
        loss.backward()
        results.append((loss.numpy(), [grad(p) for p in model.parameters()]))
    (loss_m, grads_m), (loss_v, grads_v) = results
    assert np.array_equal(loss_m, loss_v)
    assert all(np.array_equal(a, b) for a, b in zip(grads_m, grads_v, strict=True))


def test_the_model_setting_property_setter_and_bad_spellings() -> None:
    model = riftco.DecoderOnlyTransformer(riftco.TransformerConfig(**SMALL))
    assert model.determinism_check == "metadata"
    model.determinism_check = " values "
    assert model.determinism_check == "values"
    with pytest.raises(riftco.ConfigError, match=r"'Values!'|\"Values!\""):
        model.determinism_check = "Values!"
    assert model.determinism_check == "values", "unchanged after a bad spelling"
    with pytest.raises(riftco.ConfigError, match='"off", "metadata", "values"'):
        riftco.DecoderOnlyTransformer(riftco.TransformerConfig(**SMALL), determinism_check="hash")


@pytest.mark.parametrize("bad", ["", "value", "METADATA", "none"])
def test_bad_determinism_check_spellings_on_checkpoint_are_config_errors(bad: str) -> None:
    x, w = leaves()
    with pytest.raises(riftco.ConfigError) as e:
        riftco.checkpoint(lambda h: F.linear(h, w), x, [w], determinism_check=bad)
    assert repr(bad).replace("'", '"') in str(e.value), str(e.value)
    assert '"off", "metadata", "values"' in str(e.value)


@pytest.mark.parametrize("bad", [True, -1, 2**64, 1.5, "3", None])
def test_bad_seeds_and_states_are_config_errors_naming_the_value(bad: Any) -> None:
    with pytest.raises(riftco.ConfigError, match=re.escape(repr(bad))):
        riftco.manual_seed(bad)
    with pytest.raises(riftco.ConfigError, match=re.escape(repr(bad))):
        riftco.set_rng_state((0, bad))
    with pytest.raises(riftco.ConfigError):
        riftco.set_rng_state(bad)


def test_manual_seed_and_state_round_trip() -> None:
    riftco.manual_seed(2**64 - 1)
    assert riftco.get_rng_state() == (2**64 - 1, 0)
    riftco.set_rng_state((7, 2**64 - 1))
    assert riftco.get_rng_state() == (7, 2**64 - 1)
    riftco.manual_seed(0)
    assert riftco.get_rng_state() == (0, 0)


def test_a_module_switched_to_eval_before_backward_fails_the_metadata_check() -> None:
    """The breaker's case: ``m.eval()`` between the forward and ``backward()`` of a checkpointed
    module with dropout made the replay skip the dropout and silently return other gradients.
    The default check compares the replay's graph (op names and shapes) and raises, committing
    nothing (PyTorch raises too: another number of saved tensors)."""
    from riftco import nn

    riftco.manual_seed(0)
    m = nn.Sequential(nn.Linear(3, 3), nn.Dropout(0.5))
    x = riftco.Variable(np.ones((4, 3)), requires_grad=True)
    y = riftco.checkpoint(m, x)
    m.eval()
    with pytest.raises(riftco.CheckpointError, match=r"another graph.*train\(\) and eval\(\)"):
        riftco.functional.sum(y).backward()
    assert x.grad is None
    m.train()
    riftco.functional.sum(y).backward()  # the mode of the forward again: the replay matches
    assert x.grad is not None
