"""Autograd and optimizer contracts from Python: what a checkpoint callable may not do during its
replay (backward(), changing a value the graph read), Adam's parameter list and step counts, and
decode sessions after a structural change of their model. Each test reproduces a failure of the
earlier code (a segfault, a silent wrong result, a broken "nothing committed" contract)."""

from __future__ import annotations

import resource
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

import riftco
from riftco import functional as F

F32 = npt.NDArray[np.float32]

TINY = dict(vocab_size=64, d_model=32, n_heads=4, n_layers=2, d_ff=48, max_seq_len=16)


def tiny_config(**overrides: Any) -> riftco.TransformerConfig:
    kwargs: dict[str, Any] = {**TINY, **overrides}
    return riftco.TransformerConfig(**kwargs)


def rand(shape: tuple[int, ...], seed: int) -> F32:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def grad_of(v: riftco.Variable) -> F32:
    g = v.grad
    assert g is not None
    return g


# ---------------------------------------------------------------------------------------------
# Checkpoint replays
# ---------------------------------------------------------------------------------------------

_RECURSION_CHILD = textwrap.dedent(
    """
    import sys
    import numpy as np
    import riftco
    from riftco import functional as F

    sys.setrecursionlimit(100_000)  # the earlier crash needed ~2,400 nested replays
    w = riftco.Variable(np.full((4, 4), 0.1, np.float32), requires_grad=True)
    x = riftco.Variable(np.ones((2, 4), np.float32))
    holder = []
    replays = [0]

    def fn(h):
        if holder:
            replays[0] += 1
            holder[0].backward()
        return F.silu(F.linear(h, w))

    loss = F.sum(riftco.checkpoint(fn, x, [w]))
    holder.append(loss)
    try:
        loss.backward()
        print("no error")
    except riftco.CheckpointError as e:
        print("CheckpointError", replays[0], w.grad is None, e)
    """
)


def _limit_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (4_000_000_000, 4_000_000_000))


def test_backward_of_the_enclosing_loss_inside_a_replay_is_a_checkpoint_error() -> None:
    # Before: each replay started a backward over the same graph, which replayed again, until
    # the C stack overflowed (SIGSEGV). Run in a child: a regression would crash the process.
    r = subprocess.run(
        [sys.executable, "-c", _RECURSION_CHILD],
        capture_output=True,
        text=True,
        timeout=120,
        preexec_fn=_limit_memory,
    )
    assert r.returncode == 0, f"child died with {r.returncode}: {r.stderr[-2000:]}"
    out = r.stdout.strip()
    assert out.startswith("CheckpointError 1 True "), out
    assert "backward() was called inside its replay" in out, out


def test_backward_inside_a_replay_then_raise_leaves_public_gradients_unchanged() -> None:
    # Before: the nested backward committed its gradients, then the callable raised: public
    # gradients changed although the outer pass failed.
    w = riftco.Variable(rand((4, 4), 0), requires_grad=True, name="w")
    x = riftco.Variable(rand((2, 4), 1))
    F.sum(F.linear(x, w)).backward()
    before = grad_of(w).copy()
    replay = [False]
    nested: list[BaseException] = []

    def fn(h: riftco.Variable) -> riftco.Variable:
        out = F.silu(F.linear(h, w))
        if replay[0]:
            scale = riftco.Variable(np.full((2, 4), 20.0, np.float32))
            try:
                F.sum(F.mul(F.linear(x, w), scale)).backward()
            except riftco.CheckpointError as e:
                nested.append(e)
            raise KeyError("replay failed")
        return out

    y = riftco.checkpoint(fn, x, [w])
    replay[0] = True
    with pytest.raises(KeyError, match="replay failed"):
        F.sum(y).backward()
    np.testing.assert_array_equal(grad_of(w), before)
    assert len(nested) == 1 and "inside its replay" in str(nested[0])


def test_optimizer_step_inside_a_replay_is_a_stale_graph_and_commits_nothing() -> None:
    # Before: no error, and the gradients mixed old and new weights.
    w = riftco.Variable(rand((4, 4), 0), requires_grad=True, name="w")
    v = riftco.Variable(rand((4, 4), 1), requires_grad=True, name="v")
    x = riftco.Variable(rand((2, 4), 2))
    opt = riftco.Adam([w, v], lr=0.5)
    F.sum(F.linear(F.linear(x, w), v)).backward()
    before = (grad_of(w).copy(), grad_of(v).copy())
    in_replay = [False]

    def fn(h: riftco.Variable) -> riftco.Variable:
        if in_replay[0]:
            opt.step()
        return F.silu(F.linear(h, w))

    loss = F.sum(F.linear(riftco.checkpoint(fn, x, [w]), v))
    in_replay[0] = True
    with pytest.raises(riftco.StaleGraphError, match='"w"|"v"'):
        loss.backward()
    np.testing.assert_array_equal(grad_of(w), before[0])
    np.testing.assert_array_equal(grad_of(v), before[1])


def test_load_weights_inside_a_replay_is_a_stale_graph(tmp_path: Path) -> None:
    model = riftco.DecoderOnlyTransformer(tiny_config())
    other = riftco.DecoderOnlyTransformer(tiny_config(seed=7))
    path = tmp_path / "other.safetensors"
    other.save(path)
    lm_head = dict(model.named_parameters())["lm_head.weight"]
    x = riftco.Variable(rand((2, 32), 3))
    in_replay = [False]

    def fn(h: riftco.Variable) -> riftco.Variable:
        if in_replay[0]:
            model.load_weights(path)
        return F.linear(h, lm_head)

    loss = F.sum(F.silu(riftco.checkpoint(fn, x, [lm_head])))
    in_replay[0] = True
    with pytest.raises(riftco.StaleGraphError, match="lm_head.weight"):
        loss.backward()
    assert all(p.grad is None for p in model.parameters())


# ---------------------------------------------------------------------------------------------
# Adam / AdamW
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("cls", [riftco.Adam, riftco.AdamW])
def test_adam_rejects_duplicate_empty_non_leaf_and_all_frozen_lists(cls: Any) -> None:
    p = riftco.Variable(np.zeros(3, np.float32), requires_grad=True, name="p")
    with pytest.raises(riftco.ConfigError, match='"p".*parameters 0 and 1 are the same'):
        cls([p, p], lr=0.1)
    with pytest.raises(riftco.ConfigError, match="empty") as info:
        cls([], lr=0.1)
    assert isinstance(info.value, ValueError)
    with pytest.raises(riftco.ConfigError, match="parameter 1 is not a leaf.*op mul"):
        cls([p, F.mul(p, p)], lr=0.1)
    frozen = riftco.Variable(np.zeros(3, np.float32))
    with pytest.raises(riftco.ConfigError, match="no parameter requires grad"):
        cls([frozen], lr=0.1)


def test_adam_over_a_duplicate_would_have_moved_twice() -> None:
    # The quoted failure: Adam([p, p]) moved p by 2 * lr per step. The list is now rejected;
    # the one-entry list moves it by lr (the first Adam step is lr * sign(g)).
    p = riftco.Variable(np.zeros(3, np.float32), requires_grad=True)
    opt = riftco.Adam([p], lr=0.1)
    F.sum(p).backward()
    opt.step()
    np.testing.assert_allclose(p.numpy(), -0.1, rtol=1e-6)


def test_frozen_parameters_are_never_updated() -> None:
    p = riftco.Variable(np.ones(2, np.float32), requires_grad=True)
    frozen = riftco.Variable(np.full(2, 3.0, np.float32))
    opt = riftco.AdamW([p, frozen], lr=0.1, weight_decay=0.5)
    for _ in range(3):
        F.sum(F.mul(p, frozen)).backward()
        opt.step()
    assert opt.steps == 3
    np.testing.assert_array_equal(frozen.numpy(), [3.0, 3.0])


def test_step_without_gradients_is_not_counted_and_changes_nothing() -> None:
    # Before: steps went to 1 and the first real update used step 2's bias correction.
    p = riftco.Variable(np.array([0.5, -2.0], np.float32), requires_grad=True)
    ref = riftco.Variable(np.array([0.5, -2.0], np.float32), requires_grad=True)
    opt, fresh = riftco.Adam([p], lr=0.1), riftco.Adam([ref], lr=0.1)
    opt.step()
    assert opt.steps == 0
    np.testing.assert_array_equal(p.numpy(), [0.5, -2.0])
    for v in (p, ref):
        F.sum(F.mul(v, v)).backward()
    opt.step()
    fresh.step()
    assert opt.steps == 1
    np.testing.assert_array_equal(p.numpy(), ref.numpy())


# ---------------------------------------------------------------------------------------------
# Decode sessions
# ---------------------------------------------------------------------------------------------


def _trained_lora_model() -> riftco.DecoderOnlyTransformer:
    model = riftco.DecoderOnlyTransformer(tiny_config())
    model.enable_lora(rank=4, alpha=8.0, seed=1)
    opt = riftco.Adam(model.parameters(), lr=1e-2)
    tokens = np.arange(18).reshape(2, 9) % 64
    for _ in range(3):
        model.loss(tokens).backward()
        opt.step()
    return model


@pytest.mark.parametrize("change", ["merge_lora", "set_lora_active", "enable_lora", "load_lora"])
def test_decode_session_refuses_to_decode_after_a_structural_change(
    change: str, tmp_path: Path
) -> None:
    # Before: the old session kept decoding with the old weight set (logits off by 0.10 after
    # merge_lora, 0.23 after set_lora_active(False) against a fresh session).
    if change in ("enable_lora", "load_lora"):
        model = riftco.DecoderOnlyTransformer(tiny_config())
        _trained_lora_model().save_lora(tmp_path / "adapter")
    else:
        model = _trained_lora_model()
    session = model.decode_session()
    session.decode_token(1)
    session.decode_token(2)
    if change == "merge_lora":
        model.merge_lora()
    elif change == "set_lora_active":
        model.set_lora_active(False)
    elif change == "enable_lora":
        model.enable_lora(rank=4)
    else:
        model.load_lora(tmp_path / "adapter")
    with pytest.raises(riftco.DecodeError, match="open a new session"):
        session.decode_token(3)
    fresh = model.decode_session()
    tokens = np.array([[1, 2, 3]])
    full = model.logits(tokens).numpy()
    for pos, t in enumerate(tokens[0]):
        np.testing.assert_allclose(fresh.decode_token(int(t)), full[pos], atol=1e-5)


def test_decode_session_follows_training_and_no_op_lora_calls() -> None:
    model = _trained_lora_model()
    session = model.decode_session()
    session.decode_token(1)
    model.set_lora_active(True)  # already active: not a change
    opt = riftco.Adam(model.parameters(), lr=1e-2)
    model.loss(np.arange(18).reshape(2, 9) % 64).backward()
    opt.step()
    assert session.decode_token(2).shape == (64,)


@pytest.mark.parametrize("how", ["variable", "optimizer"])
def test_zero_grad_inside_a_replay_is_a_checkpoint_error_and_changes_nothing(how: str) -> None:
    # Before: zero_grad() in the callable cleared the public gradient although the outer pass
    # then failed (a backward pass commits all or nothing).
    w = riftco.Variable(rand((4, 4), 0), requires_grad=True, name="w")
    x = riftco.Variable(rand((2, 4), 1))
    opt = riftco.Adam([w], lr=0.1)
    F.sum(F.linear(x, w)).backward()
    before = grad_of(w).copy()
    replay = [False]
    seen: list[BaseException] = []

    def fn(h: riftco.Variable) -> riftco.Variable:
        out = F.silu(F.linear(h, w))
        if replay[0]:
            try:
                if how == "variable":
                    w.zero_grad()
                else:
                    opt.zero_grad()
            except riftco.CheckpointError as e:
                seen.append(e)
            raise KeyError("replay failed")
        return out

    y = riftco.checkpoint(fn, x, [w])
    replay[0] = True
    with pytest.raises(KeyError, match="replay failed"):
        F.sum(y).backward()
    assert len(seen) == 1 and "zero_grad() was called inside its replay" in str(seen[0])
    np.testing.assert_array_equal(grad_of(w), before)
    # Outside a replay zero_grad works as before.
    w.zero_grad()
    assert w.grad is None


def test_backward_from_a_thread_the_replay_started_is_a_checkpoint_error() -> None:
    # Before: a backward() of the enclosing loss from a thread the callable started was not
    # seen as inside the replay and replayed the checkpoint again (a thread per nested replay).
    import threading

    w = riftco.Variable(rand((4, 4), 0), requires_grad=True, name="w")
    x = riftco.Variable(rand((2, 4), 1))
    replays = [0]
    seen: list[BaseException] = []
    holder: list[riftco.Variable] = []

    def fn(h: riftco.Variable) -> riftco.Variable:
        if holder:
            replays[0] += 1

            def other() -> None:
                try:
                    holder[0].backward()
                except riftco.CheckpointError as e:
                    seen.append(e)

            t = threading.Thread(target=other)
            t.start()
            t.join()
        return F.silu(F.linear(h, w))

    loss = F.sum(riftco.checkpoint(fn, x, [w]))
    holder.append(loss)
    loss.backward()
    assert replays[0] == 1
    assert len(seen) == 1 and "on another thread" in str(seen[0]), seen
    with_checkpoint = grad_of(w).copy()
    w.zero_grad()
    F.sum(F.silu(F.linear(x, w))).backward()
    np.testing.assert_array_equal(with_checkpoint, grad_of(w))


def test_an_exception_in_a_replay_is_the_same_object_with_a_note_naming_the_checkpoint() -> None:
    w = riftco.Variable(rand((4, 4), 0), requires_grad=True, name="w")
    x = riftco.Variable(rand((2, 4), 1))
    replay = [False]
    raised: list[BaseException] = []

    def block_fn(h: riftco.Variable) -> riftco.Variable:
        if replay[0]:
            e = ValueError("bad value in the replay")
            raised.append(e)
            raise e
        return F.silu(F.linear(h, w))

    named = riftco.checkpoint(block_fn, x, [w], name="block 3 (model.layers.3)")
    unnamed = riftco.checkpoint(block_fn, x, [w])
    replay[0] = True
    for y, label in ((named, '"block 3 (model.layers.3)"'), (unnamed, "block_fn")):
        with pytest.raises(ValueError, match="bad value in the replay") as info:
            F.sum(y).backward()
        assert info.value is raised[-1]  # the very same exception object
        notes = getattr(info.value, "__notes__", [])
        assert len(notes) == 1 and "replay of checkpoint" in notes[0] and label in notes[0], notes
    # The forward run's exceptions carry no note (they are raised where fn is called).
    replay[0] = True
    with pytest.raises(ValueError) as info:
        riftco.checkpoint(block_fn, x, [w])
    assert not getattr(info.value, "__notes__", [])
