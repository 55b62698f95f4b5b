"""The Python API of riftco._native: the seed's snippet, parity of checkpointed and plain
training, checkpoint() with Python callables, NumPy round trips, memory accounting, graph
lifetime, every error class, persistence, decoding and threads (the functional ops against NumPy
and PyTorch: test_bindings_functional.py)."""

from __future__ import annotations

import gc
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import riftco
from riftco import functional as F

F32 = npt.NDArray[np.float32]

TINY = dict(vocab_size=64, d_model=32, n_heads=4, n_layers=2, d_ff=48, max_seq_len=16)


def tiny_config(**overrides: Any) -> riftco.TransformerConfig:
    kwargs: dict[str, Any] = {**TINY, **overrides}
    return riftco.TransformerConfig(**kwargs)


def token_block(batch: int, seq_plus_one: int, vocab: int = 64, seed: int = 0) -> npt.NDArray[np.int64]:
    return np.random.default_rng(seed).integers(0, vocab, size=(batch, seq_plus_one))


def assert_rel_close(got: F32, want: F32, rel: float) -> None:
    """Every element within `rel` of the largest magnitude of `want`."""
    scale = max(float(np.max(np.abs(want))), 1e-30)
    np.testing.assert_array_less(np.abs(got.astype(np.float64) - want), rel * scale + 1e-30)


# ---------------------------------------------------------------------------------------------
# The seed's Python snippet
# ---------------------------------------------------------------------------------------------


def test_seed_snippet() -> None:
    config = riftco.TransformerConfig(
        vocab_size=256, d_model=32, n_heads=4, n_layers=2, d_ff=64, max_seq_len=16
    )
    model = riftco.DecoderOnlyTransformer(
        config, attention="flash", activation_checkpointing="block"
    ).to("cpu")
    assert isinstance(model, riftco.DecoderOnlyTransformer)
    assert model.activation_checkpointing == "block"
    assert model.attention == "flash"
    assert model.device == "cpu"
    model.set_activation_checkpointing("disabled")
    assert model.activation_checkpointing == "disabled"
    model.set_attention("materialized")
    assert model.attention == "materialized"
    assert model.config == config
    # `.to("metal")`, as in the seed, is a clear error on this platform: a RuntimeError.
    with pytest.raises(riftco.DeviceUnavailableError, match="metal") as info:
        riftco.DecoderOnlyTransformer(config, attention="flash").to("metal")
    assert isinstance(info.value, RuntimeError)
    assert isinstance(info.value, riftco.RiftcoError)


def test_to_returns_the_same_model() -> None:
    model = riftco.DecoderOnlyTransformer(tiny_config())
    assert model.to("cpu") is model
    assert model.to("CPU") is model
    with pytest.raises(riftco.ConfigError, match=r'"tpu".*"cpu".*"metal"'):
        model.to("tpu")


def test_config_attributes_dict_eq_repr() -> None:
    c = tiny_config(seed=3)
    assert (c.vocab_size, c.d_model, c.n_heads, c.n_layers, c.d_ff, c.max_seq_len) == (
        64, 32, 4, 2, 48, 16,
    )
    assert c.rms_norm_eps == 1e-5
    assert c.rope_theta == 10000.0
    assert c.seed == 3
    assert c.d_head == 8
    d = c.to_dict()
    assert d["rms_norm_eps"] == 1e-5 and d["seed"] == 3
    assert riftco.TransformerConfig(**d) == c
    assert riftco.TransformerConfig.from_dict(d) == c
    assert c != tiny_config(seed=4)
    assert "d_model=32" in repr(c)
    import pickle

    assert pickle.loads(pickle.dumps(c)) == c
    with pytest.raises(AttributeError):
        c.d_model = 3  # type: ignore[misc]


# ---------------------------------------------------------------------------------------------
# Checkpointed and plain training agree
# ---------------------------------------------------------------------------------------------


def train(
    attention: str, policy: str, steps: int
) -> tuple[list[float], list[F32], list[F32]]:
    model = riftco.DecoderOnlyTransformer(
        tiny_config(n_layers=3), attention=attention, activation_checkpointing=policy
    )
    params = model.parameters()
    opt = riftco.Adam(params, lr=1e-2)
    losses: list[float] = []
    first_grads: list[F32] = []
    for step in range(steps):
        loss = model.loss(token_block(2, 13, seed=step))
        loss.backward()
        losses.append(loss.item())
        if step == 0:
            first_grads = [g for p in params if (g := p.grad) is not None]
        opt.step()
    return losses, first_grads, [p.numpy() for p in params]


@pytest.mark.parametrize("attention", ["flash", "materialized"])
def test_checkpointed_and_plain_training_agree(attention: str) -> None:
    plain = train(attention, "disabled", 3)
    ckpt = train(attention, "block", 3)
    np.testing.assert_allclose(ckpt[0], plain[0], rtol=1e-6)
    assert len(plain[1]) == len(ckpt[1]) > 0
    for got, want in zip(ckpt[1], plain[1]):
        assert_rel_close(got, want, 1e-6)
    for got, want in zip(ckpt[2], plain[2]):
        assert_rel_close(got, want, 1e-6)
    assert plain[0][-1] < plain[0][0]


def test_block_policy_replays_each_block_once() -> None:
    model = riftco.DecoderOnlyTransformer(tiny_config(), activation_checkpointing="block")
    loss = model.loss(token_block(1, 9))
    assert model.block_forward_count == 2
    loss.backward()
    assert model.block_forward_count == 4
    model.set_activation_checkpointing("disabled")
    model.loss(token_block(1, 9)).backward()
    assert model.block_forward_count == 6


# ---------------------------------------------------------------------------------------------
# checkpoint() with Python callables
# ---------------------------------------------------------------------------------------------


def mlp_leaves(seed: int = 0) -> tuple[riftco.Variable, riftco.Variable, riftco.Variable]:
    rng = np.random.default_rng(seed)
    x = riftco.Variable(rng.standard_normal((3, 5)), requires_grad=True, name="x")
    w1 = riftco.Variable(rng.standard_normal((7, 5)) * 0.5, requires_grad=True, name="w1")
    w2 = riftco.Variable(rng.standard_normal((5, 7)) * 0.5, requires_grad=True, name="w2")
    return x, w1, w2


def block_fn(w1: riftco.Variable, w2: riftco.Variable) -> Callable[[riftco.Variable], riftco.Variable]:
    return lambda h: F.linear(F.silu(F.linear(h, w1)), w2)


def test_checkpoint_python_callable_matches_plain_and_runs_twice() -> None:
    x, w1, w2 = mlp_leaves()
    F.sum(F.mul(block_fn(w1, w2)(x), block_fn(w1, w2)(x))).backward()
    want = [v.grad for v in (x, w1, w2)]

    calls = 0

    def fn(h: riftco.Variable) -> riftco.Variable:
        nonlocal calls
        calls += 1
        return block_fn(w1, w2)(h)

    for v in (x, w1, w2):
        v.zero_grad()
    y = riftco.checkpoint(fn, x, [w1, w2])
    assert calls == 1
    assert y.shape == (3, 5)
    F.sum(F.mul(y, y)).backward()
    assert calls == 2
    for v, w in zip((x, w1, w2), want):
        assert v.grad is not None and w is not None
        np.testing.assert_array_equal(v.grad, w)


def test_checkpoint_default_dependencies_and_keywords() -> None:
    x = riftco.Variable(np.ones((2, 2)), requires_grad=True)
    y = riftco.checkpoint(F.silu, x)
    F.sum(y).backward()
    assert x.grad is not None


class ReplayBoom(Exception):
    pass


def test_exception_in_replay_propagates_unchanged_and_keeps_gradients() -> None:
    x, w1, w2 = mlp_leaves(1)
    ok = riftco.checkpoint(block_fn(w1, w2), x, [w1, w2])
    F.sum(ok).backward()
    before = [v.grad for v in (x, w1, w2)]
    assert all(g is not None for g in before)

    boom = ReplayBoom("replay failed on purpose")
    calls = 0

    def fn(h: riftco.Variable) -> riftco.Variable:
        nonlocal calls
        calls += 1
        if calls == 2:
            raise boom
        return block_fn(w1, w2)(h)

    y = riftco.checkpoint(fn, x, [w1, w2])
    with pytest.raises(ReplayBoom) as info:
        F.sum(y).backward()
    assert info.value is boom
    assert calls == 2
    for v, b in zip((x, w1, w2), before):
        assert b is not None
        np.testing.assert_array_equal(v.grad, b)  # bit-identical: nothing committed


def test_exception_in_forward_propagates_unchanged() -> None:
    err = KeyError("forward")

    def fn(h: riftco.Variable) -> riftco.Variable:
        raise err

    with pytest.raises(KeyError) as info:
        riftco.checkpoint(fn, riftco.Variable(np.ones(3), requires_grad=True))
    assert info.value is err


def test_riftco_error_inside_callable_keeps_its_class() -> None:
    x = riftco.Variable(np.ones((2, 3)), requires_grad=True)
    bad = riftco.Variable(np.ones((4, 4)), requires_grad=True)
    with pytest.raises(riftco.ShapeError):
        riftco.checkpoint(lambda h: F.matmul(h, bad), x, [bad])


def test_checkpoint_contract_violations_raise_checkpoint_error() -> None:
    x, w1, w2 = mlp_leaves()
    with pytest.raises(riftco.CheckpointError, match="w2") as info:
        riftco.checkpoint(block_fn(w1, w2), x, [w1])  # w2 read but not declared
    assert isinstance(info.value, RuntimeError)
    with pytest.raises(riftco.CheckpointError, match="more than once"):
        riftco.checkpoint(block_fn(w1, w2), x, [w1, w1, w2])
    with pytest.raises(TypeError, match="Variable"):
        riftco.checkpoint(lambda h: 3, x)  # type: ignore[arg-type, return-value]


# ---------------------------------------------------------------------------------------------
# Variable and NumPy
# ---------------------------------------------------------------------------------------------


@settings(max_examples=30, deadline=None)
@given(
    shape=st.lists(st.integers(1, 5), min_size=0, max_size=4),
    dtype=st.sampled_from([np.float32, np.float64, np.float16, np.int32]),
    seed=st.integers(0, 2**31),
)
def test_variable_numpy_round_trip(shape: list[int], dtype: Any, seed: int) -> None:
    arr = (np.random.default_rng(seed).standard_normal(shape) * 10).astype(dtype)
    v = riftco.Variable(arr)
    out = v.numpy()
    assert out.dtype == np.float32
    assert v.shape == tuple(shape) == out.shape
    np.testing.assert_array_equal(out, arr.astype(np.float32))
    np.testing.assert_array_equal(np.asarray(v), out)
    assert v.is_leaf and not v.requires_grad and v.grad is None and v.name is None


def test_variable_from_lists_views_and_variables() -> None:
    base = np.arange(24, dtype=np.float32).reshape(4, 6)
    view = base[:, ::2].T  # non-contiguous
    np.testing.assert_array_equal(riftco.Variable(view).numpy(), view)
    np.testing.assert_array_equal(riftco.tensor([[1, 2], [3, 4]]).numpy(), [[1, 2], [3, 4]])
    v = riftco.Variable(3.5)
    assert v.shape == () and v.item() == 3.5
    copy = riftco.Variable(riftco.Variable(base), requires_grad=True, name="w")
    assert copy.requires_grad and copy.name == "w"
    np.testing.assert_array_equal(copy.numpy(), base)
    out = riftco.Variable(base).numpy()
    out[0, 0] = 99.0  # numpy() is a copy
    assert riftco.Variable(base).numpy()[0, 0] == 0.0
    with pytest.raises(TypeError):
        riftco.Variable("not a number")
    with pytest.raises(TypeError):
        riftco.Variable({"a": 1})  # type: ignore[arg-type]
    assert "shape=[4, 6]" in repr(riftco.Variable(base, name="b"))


def test_gradients_are_numpy_arrays() -> None:
    w = riftco.Variable(np.full((2, 3), 2.0), requires_grad=True)
    y = F.sum(F.mul(w, w))
    assert not y.is_leaf and y.requires_grad and y.op == "sum"
    y.backward()
    assert isinstance(w.grad, np.ndarray) and w.grad.dtype == np.float32
    np.testing.assert_array_equal(w.grad, np.full((2, 3), 4.0))
    y.backward()  # a fresh pass replaces
    np.testing.assert_array_equal(w.grad, np.full((2, 3), 4.0))
    y.backward_accumulate()  # accumulation adds
    np.testing.assert_array_equal(w.grad, np.full((2, 3), 8.0))
    w.zero_grad()
    assert w.grad is None
    with pytest.raises(riftco.ShapeError, match=r"\[2, 3\]"):
        F.mul(w, w).backward()
    with pytest.raises(riftco.ShapeError):
        w.item()


# ---------------------------------------------------------------------------------------------
# Memory accounting, graph statistics, graph lifetime
# ---------------------------------------------------------------------------------------------


def test_memory_stats_keys() -> None:
    stats = riftco.memory_stats()
    assert set(stats) == {"parameter", "gradient", "optimizer_state", "activation", "workspace", "total"}
    for entry in stats.values():
        assert set(entry) == {"current_bytes", "peak_bytes"}
        assert entry["peak_bytes"] >= entry["current_bytes"] >= 0
    riftco.reset_peak_memory_stats()
    after = riftco.memory_stats()
    assert after["total"]["peak_bytes"] == after["total"]["current_bytes"] or after["total"]["peak_bytes"] >= 0


def test_peak_memory_breakdown_is_what_was_alive_at_the_total_peak() -> None:
    model = riftco.DecoderOnlyTransformer(tiny_config(n_layers=2, max_seq_len=64))
    riftco.reset_peak_memory_stats()
    now = riftco.memory_stats()
    parts = riftco.peak_memory_breakdown()
    assert set(parts) == {"parameter", "gradient", "optimizer_state", "activation", "workspace"}
    assert parts == {c: now[c]["current_bytes"] for c in parts}
    loss = model.loss(token_block(8, 65))
    loss.backward()
    del loss
    stats = riftco.memory_stats()
    parts = riftco.peak_memory_breakdown()
    assert sum(parts.values()) == stats["total"]["peak_bytes"]
    for c, bytes_at_peak in parts.items():
        assert 0 <= bytes_at_peak <= stats[c]["peak_bytes"]
    assert parts["activation"] > now["activation"]["current_bytes"]
    with pytest.raises(riftco.ConfigError):
        riftco.peak_memory_breakdown("no-such-device")


def test_buffer_pool_caches_freed_activations_outside_every_category() -> None:
    riftco.empty_cache()
    assert riftco.cached_bytes() == 0
    model = riftco.DecoderOnlyTransformer(tiny_config(n_layers=2, max_seq_len=64))
    before = riftco.memory_stats()["activation"]["current_bytes"]
    loss = model.loss(token_block(8, 65))
    del loss
    gc.collect()
    # The graph's buffers are freed: no activation bytes remain, the large ones are cached.
    assert riftco.memory_stats()["activation"]["current_bytes"] == before
    cached = riftco.cached_bytes()
    assert cached > 0
    assert riftco.empty_cache() == cached
    assert riftco.cached_bytes() == 0


def retained_activation_bytes(policy: str) -> tuple[int, int, int]:
    model = riftco.DecoderOnlyTransformer(
        tiny_config(n_layers=4, max_seq_len=32), activation_checkpointing=policy
    )
    tokens = token_block(4, 33)
    gc.collect()
    before = riftco.memory_stats()["activation"]["current_bytes"]
    loss = model.loss(tokens)
    retained = riftco.memory_stats()["activation"]["current_bytes"] - before
    nodes = loss.graph_statistics()
    return retained, nodes["node_count"], nodes["element_count"]


def test_block_checkpointing_retains_less() -> None:
    plain = retained_activation_bytes("disabled")
    block = retained_activation_bytes("block")
    assert block[0] < plain[0], (block, plain)
    assert block[1] < plain[1], (block, plain)
    assert block[2] < plain[2], (block, plain)


def test_backward_after_deleting_the_model() -> None:
    model = riftco.DecoderOnlyTransformer(tiny_config(), activation_checkpointing="block")
    params = model.parameters()
    loss = model.loss(token_block(2, 9))
    del model
    gc.collect()
    loss.backward()
    assert all(p.grad is not None for p in params)


# ---------------------------------------------------------------------------------------------
# Errors
# ---------------------------------------------------------------------------------------------

VALUE_ERRORS = [riftco.ShapeError, riftco.ConfigError, riftco.TokenError, riftco.ModelStateError, riftco.LoraError]
RUNTIME_ERRORS = [riftco.DeviceUnavailableError, riftco.StaleGraphError, riftco.CheckpointError, riftco.DecodeError]


def test_exception_hierarchy() -> None:
    assert issubclass(riftco.RiftcoError, Exception)
    for cls in VALUE_ERRORS:
        assert issubclass(cls, riftco.RiftcoError) and issubclass(cls, ValueError), cls
        assert not issubclass(cls, RuntimeError)
    for cls in RUNTIME_ERRORS:
        assert issubclass(cls, riftco.RiftcoError) and issubclass(cls, RuntimeError), cls
        assert not issubclass(cls, ValueError)
    for cls in [riftco.RiftcoError, *VALUE_ERRORS, *RUNTIME_ERRORS]:
        assert cls.__module__ == "riftco._native"
        assert cls.__doc__


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(attention="fast"), r'"fast".*"flash", "materialized"'),
        (dict(activation_checkpointing="full"), r'"full".*"disabled", "block"'),
    ],
)
def test_invalid_option_strings_list_valid_values(kwargs: dict[str, str], match: str) -> None:
    with pytest.raises(riftco.ConfigError, match=match) as info:
        riftco.DecoderOnlyTransformer(tiny_config(), **kwargs)
    assert isinstance(info.value, ValueError)


def test_invalid_setters_list_valid_values_and_keep_state() -> None:
    model = riftco.DecoderOnlyTransformer(tiny_config(), activation_checkpointing="block")
    with pytest.raises(riftco.ConfigError, match=r'"Block".*"disabled", "block"'):
        model.set_activation_checkpointing("Block")
    with pytest.raises(riftco.ConfigError, match=r'"flash2".*"flash", "materialized"'):
        model.set_attention("flash2")
    assert model.activation_checkpointing == "block" and model.attention == "flash"


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        (dict(d_model=30), "n_heads"),
        (dict(d_model=12, n_heads=4), "d_head"),
        (dict(vocab_size=0), "vocab_size = 0"),
        (dict(n_layers=-1), "n_layers = -1"),
        (dict(rms_norm_eps=0.0), "rms_norm_eps"),
        (dict(rope_theta=float("nan")), "rope_theta"),
    ],
)
def test_invalid_config_names_the_field(overrides: dict[str, Any], match: str) -> None:
    with pytest.raises(riftco.ConfigError, match=match):
        tiny_config(**overrides)


def test_token_errors_name_the_value() -> None:
    model = riftco.DecoderOnlyTransformer(tiny_config())
    block = token_block(2, 9)
    block[1, 4] = 64
    with pytest.raises(riftco.TokenError, match=r"token id 64 at index \[1, 4\]") as info:
        model.loss(block)
    assert isinstance(info.value, ValueError)
    block[1, 4] = -3
    with pytest.raises(riftco.TokenError, match="-3"):
        model.loss(block)
    with pytest.raises(riftco.TokenError, match="2\\*\\*40|1099511627776"):
        model.logits(np.array([[2**40]], dtype=np.uint64))
    with pytest.raises(riftco.TokenError, match="exceeds max_seq_len 16"):
        model.loss(token_block(1, 18))
    with pytest.raises(riftco.TokenError, match="exceeds max_seq_len 16"):
        model.logits(token_block(1, 17))
    with pytest.raises(riftco.TokenError, match="2-D"):
        model.loss(np.arange(9))
    with pytest.raises(riftco.TokenError, match="integer"):
        model.loss(np.zeros((1, 9), dtype=np.float32))
    with pytest.raises(riftco.TokenError, match="seq \\+ 1 >= 2"):
        model.loss([[1], [2]])
    for dtype in (np.int8, np.uint8, np.int16, np.uint16, np.int32, np.uint32, np.int64, np.uint64):
        assert np.isfinite(model.loss(token_block(1, 5).astype(dtype)).item())
    assert np.isfinite(model.loss([[1, 2, 3], [4, 5, 6]]).item())


def test_stale_graph_error_after_optimizer_step() -> None:
    model = riftco.DecoderOnlyTransformer(tiny_config())
    opt = riftco.AdamW(model.parameters(), lr=1e-3)
    loss = model.loss(token_block(1, 9))
    loss.backward()
    opt.step()
    assert opt.steps == 1
    with pytest.raises(riftco.StaleGraphError, match="stale graph") as info:
        loss.backward()
    assert isinstance(info.value, RuntimeError)


def test_lora_decode_state_and_io_errors(tmp_path: Path) -> None:
    model = riftco.DecoderOnlyTransformer(tiny_config())
    with pytest.raises(riftco.LoraError, match="no adapters"):
        model.set_lora_active(True)
    with pytest.raises(riftco.LoraError, match="rank 0"):
        model.enable_lora(rank=0)
    session = model.decode_session()
    for t in range(16):
        session.decode_token(t)
    with pytest.raises(riftco.DecodeError) as dinfo:
        session.decode_token(1)
    assert isinstance(dinfo.value, RuntimeError)
    with pytest.raises(riftco.TokenError):
        model.decode_session().decode_token(-1)
    with pytest.raises(riftco.TokenError):
        model.decode_session().decode_token(64)
    with pytest.raises(FileNotFoundError, match="missing.safetensors"):
        riftco.DecoderOnlyTransformer.load(tmp_path / "missing.safetensors")
    path = tmp_path / "m.safetensors"
    model.save(path)
    path.write_bytes(path.read_bytes()[:100])
    with pytest.raises(riftco.ModelStateError, match="m.safetensors"):
        riftco.DecoderOnlyTransformer.load(path)
    with pytest.raises(riftco.ModelStateError):
        model.load_weights(path)
    with pytest.raises(riftco.ModelStateError, match="config.json"):
        model.save(tmp_path / "config.json")
    with pytest.raises(riftco.ConfigError):
        riftco.Adam(model.parameters(), lr=-1.0)
    with pytest.raises(riftco.ConfigError, match="beta1"):
        riftco.Adam(model.parameters(), betas=(1.5, 0.9))
    opt = riftco.Adam(model.parameters())
    with pytest.raises(riftco.ConfigError):
        opt.lr = 0.0


# ---------------------------------------------------------------------------------------------
# Persistence, LoRA, decoding, optimizers
# ---------------------------------------------------------------------------------------------


def test_save_load_round_trip(tmp_path: Path) -> None:
    model = riftco.DecoderOnlyTransformer(tiny_config(seed=5), attention="materialized")
    opt = riftco.Adam(model.parameters(), lr=1e-2)
    model.loss(token_block(2, 9)).backward()
    opt.step()
    path = tmp_path / "model.safetensors"
    model.save(str(path))
    assert (tmp_path / "config.json").exists()
    loaded = riftco.DecoderOnlyTransformer.load(path, activation_checkpointing="block")
    assert loaded.config == model.config
    assert loaded.activation_checkpointing == "block" and loaded.attention == "flash"
    tokens = token_block(2, 8, seed=9)
    model.set_attention("flash")
    np.testing.assert_array_equal(loaded.logits(tokens).numpy(), model.logits(tokens).numpy())
    fresh = riftco.DecoderOnlyTransformer(tiny_config(seed=6))
    fresh.load_weights(path)
    np.testing.assert_array_equal(fresh.logits(tokens).numpy(), model.logits(tokens).numpy())
    names = [n for n, _ in model.named_parameters()]
    assert names[0] == "model.embed_tokens.weight" and names[-1] == "lm_head.weight"
    assert "model.layers.1.mlp.down_proj.weight" in names


def test_lora_workflow(tmp_path: Path) -> None:
    model = riftco.DecoderOnlyTransformer(tiny_config())
    n_base = len(model.parameters())
    assert not model.has_lora and not model.lora_active
    model.enable_lora(rank=4, alpha=8.0, mlp=True, seed=1)
    assert model.has_lora and model.lora_active
    params = model.parameters()
    assert len(params) == 2 * 7 * 2 and len(params) != n_base
    assert all("lora_" in (p.name or "") for p in params)
    assert len(model.named_lora_parameters()) == len(params)
    opt = riftco.AdamW(params, lr=1e-2)
    tokens = token_block(2, 9)
    first = model.loss(tokens)
    first.backward()
    opt.step()
    for _ in range(3):
        loss = model.loss(tokens)
        loss.backward()
        opt.step()
    assert loss.item() < first.item()
    model.save_lora(tmp_path / "adapter")
    other = riftco.DecoderOnlyTransformer(tiny_config())
    other.load_lora(tmp_path / "adapter")
    probe = token_block(1, 8, seed=3)
    np.testing.assert_allclose(other.logits(probe).numpy(), model.logits(probe).numpy(), atol=1e-6)
    model.set_lora_active(False)
    assert not model.lora_active
    model.set_lora_active(True)
    merged = model.logits(probe).numpy()
    model.merge_lora()
    assert not model.has_lora and len(model.parameters()) == n_base
    np.testing.assert_allclose(model.logits(probe).numpy(), merged, atol=1e-5)


@pytest.mark.parametrize("attention", ["flash", "materialized"])
def test_decode_token_matches_logits(attention: str) -> None:
    model = riftco.DecoderOnlyTransformer(tiny_config(), attention=attention)
    tokens = token_block(1, 10, seed=4)
    full = model.logits(tokens).numpy()
    session = model.decode_session()
    assert session.position == 0
    for s in range(10):
        step = session.decode_token(int(tokens[0, s]))
        assert step.dtype == np.float32 and step.shape == (64,)
        np.testing.assert_allclose(step, full[s], atol=1e-5, rtol=1e-5)
    assert session.position == 10
    session.reset()
    assert session.position == 0
    np.testing.assert_allclose(session.decode_token(int(tokens[0, 0])), full[0], atol=1e-5)


def test_adam_matches_numpy_reference() -> None:
    rng = np.random.default_rng(0)
    p0 = rng.standard_normal(5).astype(np.float32)
    target = rng.standard_normal(5).astype(np.float32)
    for cls, wd in ((riftco.Adam, 0.1), (riftco.AdamW, 0.1)):
        p = riftco.Variable(p0, requires_grad=True)
        opt = cls([p], lr=0.1, betas=(0.8, 0.9), eps=1e-6, weight_decay=wd)
        assert opt.lr == pytest.approx(0.1)
        ref = p0.astype(np.float64)
        m = np.zeros(5)
        v = np.zeros(5)
        for t in range(1, 4):
            diff = F.add(p, riftco.Variable(-target))
            F.sum(F.mul(diff, diff)).backward()
            g = 2 * (ref - target)
            if cls is riftco.Adam:
                g = g + wd * ref
            else:
                ref = ref - 0.1 * wd * ref
            m = 0.8 * m + 0.2 * g
            v = 0.9 * v + 0.1 * g * g
            ref = ref - 0.1 * (m / (1 - 0.8**t)) / (np.sqrt(v / (1 - 0.9**t)) + 1e-6)
            opt.step()
        assert opt.steps == 3
        np.testing.assert_allclose(p.numpy(), ref, rtol=1e-4, atol=1e-5)
        opt.zero_grad()
        assert p.grad is None
        opt.lr = 0.5
        assert opt.lr == 0.5


# ---------------------------------------------------------------------------------------------
# Threads: the GIL is released during compute
# ---------------------------------------------------------------------------------------------


def test_concurrent_losses_from_two_threads() -> None:
    model = riftco.DecoderOnlyTransformer(tiny_config(), activation_checkpointing="block")
    tokens = token_block(4, 17)
    want = model.loss(tokens).item()
    results: list[float] = []
    errors: list[BaseException] = []
    barrier = threading.Barrier(2)

    def work() -> None:
        try:
            barrier.wait()
            for _ in range(3):
                loss = model.loss(tokens)
                loss.backward()
                results.append(loss.item())
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=work) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors
    assert len(results) == 6
    assert all(r == want for r in results)
