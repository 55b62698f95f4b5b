"""ZeRO-3 (riftco.training.sharded) in one process: the parameter owner's contract without MPI.

With one rank every unit's part is the whole unit, so a sharded model must train bitwise like
the same model under plain Adam (the same kernels on the same values: the gathers restore the
stored bytes, Adam is element-wise). The multi-rank runs are in test_distributed.py.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import riftco
from riftco.training import distributed
from riftco.training.sharded import ShardedParameters, unit_of

LAYERS = 3


class _OneRank:
    """The communicator of a one-process group (no MPI needed)."""

    def Get_rank(self) -> int:
        return 0

    def Get_size(self) -> int:
        return 1

    def allgather(self, value: Any) -> list[Any]:
        return [value]


def _group() -> distributed.ProcessGroup:
    return distributed.ProcessGroup(None, _OneRank(), 60.0)


def _model(policy: str, lora: bool = False, tied: bool = False, dtype: str | None = None) -> Any:
    cfg = riftco.TransformerConfig(
        vocab_size=64, d_model=64, n_heads=4, n_kv_heads=2, n_layers=LAYERS, d_ff=128,
        max_seq_len=32, seed=5, tie_word_embeddings=tied,
    )
    m = riftco.DecoderOnlyTransformer(cfg)
    m.set_activation_checkpointing(policy)
    if lora:
        m.enable_lora(rank=4, alpha=8.0, mlp=True)
        for _, p in m.named_lora_parameters():
            rng = np.random.default_rng(len(p.name or ""))
            p.copy_(rng.normal(0, 0.02, p.shape).astype(np.float32))
        if dtype is not None:
            m.set_frozen_weights_dtype(dtype)
    return m


def _optimizer(m: Any, zero: int = 3, **kwargs: Any) -> distributed.DistributedOptimizer:
    """Adam at lr 1e-2 over ``m``'s trainable parameters, on a one-rank group (``zero=3``
    shards ``m``)."""
    return distributed.DistributedOptimizer(
        _group(), m.parameters(), lambda ps: riftco.Adam(ps, lr=1e-2), zero=zero,
        model=m if zero == 3 else None, **kwargs,
    )


def _batches() -> list[np.ndarray]:
    rng = np.random.default_rng(3)
    return [rng.integers(0, 64, (2, 13)) for _ in range(3)]


def _train(m: Any, zero: int) -> tuple[list[float], dict[str, np.ndarray]]:
    return _steps(m, zero, [lambda batch=batch: m.loss(batch) for batch in _batches()])


def _steps(m: Any, zero: int, losses_of: list[Any]) -> tuple[list[float], dict[str, np.ndarray]]:
    """One optimizer step per callable of ``losses_of`` (each returns a loss), then the model
    made whole again: the losses and every parameter by name."""
    opt = _optimizer(m, zero)
    losses = []
    for loss_of in losses_of:
        loss = loss_of()
        opt.backward(loss)
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    if opt.sharded is not None:
        opt.sharded.detach()
    params = [*m.named_parameters(), *m.named_lora_parameters()]
    return losses, {n: p.numpy() for n, p in params}


@pytest.mark.parametrize(
    "policy", ["disabled", "block", "segments:2", "selective", "block,disabled,selective:dots"]
)
@pytest.mark.parametrize("lora", [False, True])
@pytest.mark.parametrize("tied", [False, True])
def test_a_sharded_model_trains_bitwise_like_a_whole_one(policy: str, lora: bool, tied: bool) -> None:
    want_losses, want = _train(_model(policy, lora, tied), 0)
    got_losses, got = _train(_model(policy, lora, tied), 3)
    assert got_losses == want_losses
    assert got.keys() == want.keys()
    for name, value in want.items():
        np.testing.assert_array_equal(got[name], value, err_msg=name)


@pytest.mark.parametrize("dtype", ["bfloat16", "q8_0", "nf4"])
def test_a_frozen_base_is_sharded_in_its_own_storage(dtype: str) -> None:
    want_losses, want = _train(_model("block", True, False, dtype), 0)
    m = _model("block", True, False, dtype)
    encodings = {p.storage_encoding for _, p in m.named_parameters()}
    assert dtype in encodings
    got_losses, got = _train(m, 3)
    assert got_losses == want_losses
    for name, value in want.items():
        np.testing.assert_array_equal(got[name], value, err_msg=name)
    # Gathered back in the format it had: not widened to float32.
    assert {p.storage_encoding for _, p in m.named_parameters()} == encodings


def test_units_are_released_between_uses_and_gathered_for_each_replay() -> None:
    m = _model("block")
    opt = _optimizer(m)
    sharded = opt.sharded
    assert sharded is not None and m.has_parameter_residency
    assert all(p.is_released for _, p in m.named_parameters())
    # This rank's parts are the native bytes: the whole model once (one rank) as parameter.
    total = sum(p.size * 4 for p in (v.numpy() for v in sharded.shards))
    assert total == 4 * sum(int(np.prod(p.shape)) for p in m.parameters())
    sharded.trace = []
    loss = m.loss(_batches()[0])
    kept = {n for n, p in m.named_parameters() if not p.is_released}
    assert kept == {"model.norm.weight", "lm_head.weight"}
    opt.backward(loss)
    assert all(p.is_released for _, p in m.named_parameters())
    # Forward: the embedding, every block, the norm and the head; backward: every block again.
    assert sharded.gathers == (LAYERS + 3) + LAYERS
    events = [(e, u) for _, e, u, _ in sharded.trace]
    replays = [u for e, u in events[events.index(("ready", "lm_head")) + 1 :] if e == "ready"]
    assert replays == [f"model.layers.{i}" for i in reversed(range(LAYERS))]
    # Never more than two units gathered or in flight besides those kept for the backward.
    assert sharded.gathered_peak <= 2 + 2
    opt.step()
    # The step updated the shards: the tensors' versions moved, so an old graph is stale.
    stale = m.loss(_batches()[1])
    opt.step()
    with pytest.raises(riftco.StaleGraphError):
        opt.backward(stale)


def test_prefetch_keeps_at_most_max_gathered_units() -> None:
    for limit in (1, 2, 3):
        m = _model("block")
        opt = _optimizer(m, max_gathered=limit)
        assert opt.sharded is not None
        opt.backward(m.loss(_batches()[0]))
        # The norm and the head stay gathered for the backward pass (2 units) on top.
        assert opt.sharded.gathered_peak <= limit + 2, (limit, opt.sharded.gathered_peak)


def test_whole_model_gathers_and_reshards_loaded_values() -> None:
    m = _model("block")
    opt = _optimizer(m)
    assert opt.sharded is not None
    new = {n: np.full(p.shape, 0.5, np.float32) for n, p in m.named_parameters()}
    with opt.sharded.whole_model(reshard=True):
        assert not any(p.is_released for _, p in m.named_parameters())
        for n, p in m.named_parameters():
            p.copy_(new[n])
    assert all(p.is_released for _, p in m.named_parameters())
    opt.sharded.detach()
    for n, p in m.named_parameters():
        np.testing.assert_array_equal(p.numpy(), new[n], err_msg=n)


def test_bad_input_is_one_clear_error() -> None:
    m = _model("block")
    make = lambda ps: riftco.Adam(ps, lr=1e-2)  # noqa: E731
    with pytest.raises(riftco.ConfigError, match="pass model="):
        distributed.DistributedOptimizer(_group(), m.parameters(), make, zero=3)
    with pytest.raises(riftco.ConfigError, match="model.parameters"):
        distributed.DistributedOptimizer(_group(), m.parameters()[:2], make, zero=3, model=m)
    with pytest.raises(riftco.ConfigError, match="max_gathered"):
        ShardedParameters(_group(), m, max_gathered=0)
    with pytest.raises(riftco.ConfigError, match="zero must be one of 0, 1, 2, 3"):
        distributed.DistributedOptimizer(_group(), m.parameters(), make, zero=4)
    for policy in ("auto", "budget:64MiB"):
        with pytest.raises(riftco.ConfigError, match="zero=3 with activation_(checkpointing|memory_budget)"):
            riftco.PretrainingConfig(data_parallel=True, zero=3, activation_checkpointing=policy)
    with pytest.raises(riftco.ConfigError, match="needs data_parallel=True"):
        riftco.PretrainingConfig(zero=3)
    # The model itself refuses a measured policy while it has an owner.
    _optimizer(m)
    m.set_activation_checkpointing("auto")
    with pytest.raises(riftco.ConfigError, match="sharded parameters"):
        m.loss(_batches()[0])
    # An owner without the two methods.
    with pytest.raises(TypeError, match="acquire"):
        m.set_parameter_residency(object())


def test_an_owner_exception_reaches_the_caller_unchanged() -> None:
    class Failing:
        def acquire(self, unit: str, reason: str, next: str | None) -> None:
            if unit == "model.layers.1":
                raise KeyError(f"no shard of {unit}")

        def release(self, unit: str) -> None:
            pass

    m = _model("block")
    m.set_parameter_residency(Failing())
    with pytest.raises(KeyError, match="no shard of model.layers.1"):
        m.loss(_batches()[0])
    m.set_parameter_residency(None)
    assert not m.has_parameter_residency
    assert np.isfinite(m.loss(_batches()[0]).item())


def test_variable_storage_round_trip_is_bitwise() -> None:
    bits = np.array([0x7FC00123, 0x80000000, 0x00000001, 0x3F800000], np.uint32)
    v = riftco.Variable(bits.view(np.float32))
    data = v.encoded_bytes()
    assert data.dtype == np.uint8 and data.size == 16 and v.storage_encoding == "float32"
    assert v.encoded_nbytes == 16
    # A byte range is that slice of the whole (clipped as a slice is), across element borders.
    for start, stop in [(0, 16), (3, 9), (5, 5), (14, 40), (16, 20)]:
        np.testing.assert_array_equal(v.encoded_bytes(start, stop), data[start:stop])
    np.testing.assert_array_equal(v.encoded_bytes(6), data[6:])
    with pytest.raises(OverflowError):
        v.encoded_bytes(-1)
    v.release_storage()
    assert v.is_released and v.storage_encoding is None
    with pytest.raises(riftco.RiftcoError):
        v.numpy()
    with pytest.raises(riftco.RiftcoError, match="15 bytes for 4 elements"):
        v.restore_storage("float32", data[:15])
    with pytest.raises(ValueError, match='unknown storage encoding "int8"'):
        v.restore_storage("int8", data)
    v.restore_storage("float32", data.tobytes())
    np.testing.assert_array_equal(v.numpy().view(np.uint32), bits)
    with pytest.raises(riftco.RiftcoError, match="only a released one"):
        v.restore_storage("float32", data)


def test_unit_names() -> None:
    assert unit_of("model.embed_tokens.weight") == "model.embed_tokens"
    assert unit_of("model.layers.7.mlp.up_proj.weight") == "model.layers.7"
    assert unit_of("base_model.model.model.layers.2.self_attn.q_proj.lora_A.weight") == (
        "model.layers.2"
    )
    assert unit_of("model.norm.weight") == "model.norm"
    assert unit_of("lm_head.weight") == "lm_head"
    assert unit_of("zero_shard") is None


def test_shard_files_round_trip_and_refuse_another_runs(tmp_path: Any) -> None:
    pytest.importorskip("safetensors", reason="the mpi extra's safetensors writes the shards")
    m = _model("block", lora=True)
    opt = _optimizer(m)
    assert opt.sharded is not None
    opt.backward(m.loss(_batches()[0]))
    opt.step()
    path = tmp_path / "shard.safetensors"
    opt.sharded.save_shard(path)
    saved = [s.numpy() for s in opt.sharded.shards]
    for s in opt.sharded.shards:
        s.copy_(np.zeros(s.shape, np.float32))
    opt.sharded.load_shard(path)
    for s, want in zip(opt.sharded.shards, saved):
        np.testing.assert_array_equal(s.numpy(), want)
    # Another model (adapters of another rank): named, nothing changed.
    other = _model("block", lora=False)
    other_opt = _optimizer(other)
    assert other_opt.sharded is not None
    before = [s.numpy() for s in other_opt.sharded.shards]
    with pytest.raises(riftco.ModelStateError, match="another checkpoint, run or rank: units"):
        other_opt.sharded.load_shard(path)
    for s, want in zip(other_opt.sharded.shards, before):
        np.testing.assert_array_equal(s.numpy(), want)
    # Another checkpoint of the same run (another step), or a flipped bit: refused.
    with pytest.raises(riftco.ModelStateError, match="identity.step: 3 against 2"):
        opt.sharded.save_shard(path, {"step": 3, "run": "abc"})
        opt.sharded.load_shard(path, {"step": 2, "run": "abc"})
    data = bytearray(path.read_bytes())
    data[-1] ^= 0x01
    path.write_bytes(bytes(data))
    with pytest.raises(riftco.ModelStateError, match="does not match its SHA-256"):
        opt.sharded.load_shard(path, {"step": 3, "run": "abc"})
    garbage = tmp_path / "garbage.safetensors"
    garbage.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json}      ")
    with pytest.raises(riftco.ModelStateError, match="not a ZeRO-3 parameter shard"):
        opt.sharded.load_shard(garbage)
    with pytest.raises(OSError):
        opt.sharded.load_shard(tmp_path / "missing.safetensors")


def _micro_batch_steps(m: Any, zero: int) -> dict[str, np.ndarray]:
    """Two optimizer steps of two accumulated micro-batches each."""
    opt = _optimizer(m, zero)
    batches = _batches()
    for step in range(2):
        for micro in range(2):
            opt.backward(m.loss(batches[(step + micro) % 3]), accumulate=micro > 0)
        opt.step()
        opt.zero_grad()
    if opt.sharded is not None:
        opt.sharded.detach()
    return {n: p.numpy() for n, p in m.named_parameters()}


@pytest.mark.parametrize("zero", [2, 3])
def test_gradient_accumulation_adds_the_micro_batches(zero: int) -> None:
    want = _micro_batch_steps(_model("block"), 0)
    got = _micro_batch_steps(_model("block"), zero)
    for name, value in want.items():
        np.testing.assert_array_equal(got[name], value, err_msg=name)


def test_dropout_and_packing_replay_alike_when_sharded() -> None:
    """Dropout masks come from the model's dropout step, not from the gathers: a sharded
    model drops the same elements in the forward run and in each replay; a packed batch
    (position ids restarting inside a row) trains alike too."""
    def run(zero: int) -> tuple[list[float], dict[str, np.ndarray]]:
        cfg = riftco.TransformerConfig(
            vocab_size=64, d_model=64, n_heads=4, n_kv_heads=2, n_layers=LAYERS, d_ff=128,
            max_seq_len=32, seed=5, attention_dropout=0.1, residual_dropout=0.1,
        )
        m = riftco.DecoderOnlyTransformer(cfg)
        m.set_activation_checkpointing("block")
        tokens = _batches()[0]
        labels = tokens.copy()
        labels[:, :3] = riftco.IGNORE_INDEX
        positions = np.concatenate([np.arange(6), np.arange(7)])[None, :].repeat(2, 0)

        def loss() -> Any:
            return m.loss(tokens, labels=labels, position_ids=positions)

        return _steps(m, zero, [loss, loss])

    want_losses, want = run(0)
    got_losses, got = run(3)
    assert got_losses == want_losses
    for name, value in want.items():
        np.testing.assert_array_equal(got[name], value, err_msg=name)


def test_two_forward_passes_before_their_backward_passes() -> None:
    """Micro-batches whose forward passes all run first: each graph holds the units it reads
    (the norm, the head) until its own backward pass, so the second backward pass still finds
    them; the result is that of the unsharded model."""
    def run(zero: int) -> dict[str, np.ndarray]:
        m = _model("block")
        opt = _optimizer(m, zero)
        batches = _batches()
        first, second = m.loss(batches[0]), m.loss(batches[1])
        opt.backward(first)
        opt.backward(second, accumulate=True)
        opt.step()
        if opt.sharded is not None:
            assert all(p.is_released for _, p in m.named_parameters())
            opt.sharded.detach()
        return {n: p.numpy() for n, p in m.named_parameters()}

    want, got = run(0), run(3)
    for name, value in want.items():
        np.testing.assert_array_equal(got[name], value, err_msg=name)


def test_a_dropped_graph_or_an_evaluation_gives_every_unit_back() -> None:
    m = _model("disabled", tied=True)
    opt = _optimizer(m)
    logits = m.logits(_batches()[0][:, :-1])
    assert not all(p.is_released for _, p in m.named_parameters())
    del logits
    assert all(p.is_released for _, p in m.named_parameters())
    with riftco.no_grad():
        m.loss(_batches()[0])
    assert all(p.is_released for _, p in m.named_parameters())
    assert opt.sharded is not None


def test_a_detached_owner_refuses_to_step_and_a_sharded_model_to_change() -> None:
    m = _model("block", lora=True)
    opt = _optimizer(m)
    assert opt.sharded is not None
    with pytest.raises(riftco.ConfigError, match="already have an owner"):
        _optimizer(m)
    for change in (m.merge_lora, lambda: m.set_frozen_weights_dtype("bfloat16")):
        with pytest.raises(riftco.ConfigError, match="ZeRO-3"):
            change()
    opt.sharded.detach()
    opt.sharded.detach()  # nothing more to do
    assert not m.has_parameter_residency
    with pytest.raises(riftco.ConfigError, match="detached"):
        opt.backward(m.loss(_batches()[0]))
    with pytest.raises(riftco.ConfigError, match="detached"):
        opt.step()
    m.merge_lora()  # whole again: the model can change


def test_a_graph_kept_across_a_step_sees_the_new_values_after_it() -> None:
    """A loss kept (not differentiated) holds the norm and the head across optimizer steps:
    the step gathers them again, so later forward passes read the updated values, as the
    unsharded model does; the kept graph itself is stale."""
    def run(zero: int) -> tuple[list[float], dict[str, np.ndarray]]:
        m = _model("block")
        opt = _optimizer(m, zero)
        batches = _batches()
        kept = m.loss(batches[2])
        losses = []
        for batch in batches[:2]:
            loss = m.loss(batch)
            opt.backward(loss)
            opt.step()
            opt.zero_grad()
            losses.append(loss.item())
        with riftco.no_grad():
            losses.append(m.loss(batches[2]).item())
        if opt.sharded is not None:
            assert set(opt.sharded._holds) == {"model.norm", "lm_head"}
            with pytest.raises(riftco.StaleGraphError):
                opt.backward(kept)
            del kept
            assert not opt.sharded._holds
            opt.sharded.detach()
        return losses, {n: p.numpy() for n, p in m.named_parameters()}

    want_losses, want = run(0)
    got_losses, got = run(3)
    assert got_losses == want_losses
    for name, value in want.items():
        np.testing.assert_array_equal(got[name], value, err_msg=name)


def test_decoding_a_sharded_model_is_refused_and_works_inside_whole_model() -> None:
    m = _model("block")
    prompt = [1, 2, 3]
    want = riftco.DecoderOnlyTransformer(m.config).decode_session().decode_tokens(prompt)
    opt = _optimizer(m)
    assert opt.sharded is not None
    with pytest.raises(riftco.DecodeError, match="ZeRO-3"):
        m.decode_session()
    with opt.sharded.whole_model():
        got = m.decode_session().decode_tokens(prompt)
    np.testing.assert_array_equal(got, want)
    with pytest.raises(riftco.ConfigError, match="holds no elements"):
        m.set_parameter_residency(None)


def test_an_optimizer_state_of_another_step_is_refused(tmp_path: Any) -> None:
    pytest.importorskip("safetensors", reason="the mpi extra's safetensors writes the shards")
    m = _model("block")
    opt = _optimizer(m)
    opt.backward(m.loss(_batches()[0]))
    opt.step()
    opt.identity = {"step": 1, "run": "abc"}
    opt.save(tmp_path)
    opt.load(tmp_path)
    opt.identity = {"step": 2, "run": "abc"}
    with pytest.raises(distributed.CheckpointShardError, match="rank 0 of 1: .*identity.step"):
        opt.load(tmp_path)


def test_a_gather_budget_bounds_the_prefetch_and_refuses_a_larger_unit() -> None:
    m = _model("block")
    sizes = {n: 4 * int(np.prod(p.shape)) for n, p in m.named_parameters()}
    block = sum(v for n, v in sizes.items() if n.startswith("model.layers.0."))
    embedding = sizes["model.embed_tokens.weight"]
    assert block > embedding
    too_small = r"unit model.layers.0 gathers .* above the gather budget"
    with pytest.raises(riftco.ConfigError, match=too_small):
        _optimizer(m, max_gathered_bytes=embedding)
    assert not m.has_parameter_residency
    assert not any(p.is_released for _, p in m.named_parameters())
    # A budget of the largest unit: nothing is gathered ahead, and training is unchanged.
    want_losses, want = _train(_model("block"), 0)
    m = _model("block")
    budget = max(embedding, block)
    opt = _optimizer(m, max_gathered_bytes=budget)
    assert opt.sharded is not None
    opt.backward(m.loss(_batches()[0]))
    assert opt.sharded.gathered_peak <= 1 + 2  # the unit in use, the norm and the head
    opt.sharded.detach()
    got_losses, got = _train(_model("block"), 3)
    assert got_losses == want_losses
    with pytest.raises(riftco.ConfigError, match="zero3_gather_budget.*needs zero=3"):
        riftco.PretrainingConfig(data_parallel=True, zero=2, zero3_gather_budget="1GiB")
    cfg = riftco.PretrainingConfig(data_parallel=True, zero=3, zero3_gather_budget="256MiB")
    assert cfg.zero3_gather_budget == 256 * 2**20


def _wide_lora_model(tied: bool) -> Any:
    """LoRA over a bfloat16 base whose tables (2048 x 64: 256 KiB each) are larger than a
    block (about 80 KiB with its adapters)."""
    cfg = riftco.TransformerConfig(
        vocab_size=2048, d_model=64, n_heads=4, n_kv_heads=2, n_layers=LAYERS, d_ff=128,
        max_seq_len=32, seed=5, tie_word_embeddings=tied,
    )
    m = riftco.DecoderOnlyTransformer(cfg)
    m.set_activation_checkpointing("block")
    m.enable_lora(rank=4, alpha=8.0, mlp=True)
    for _, p in m.named_lora_parameters():
        rng = np.random.default_rng(len(p.name or ""))
        p.copy_(rng.normal(0, 0.02, p.shape).astype(np.float32))
    m.set_frozen_weights_dtype("bfloat16")
    return m


@pytest.mark.parametrize("tied", [True, False])
def test_a_frozen_table_above_the_budget_is_given_by_slices(tied: bool) -> None:
    budget = 100_000  # slices of 195 rows of 128 bytes (a quarter of it): 2048 rows in 11
    rng = np.random.default_rng(3)
    batches = [rng.integers(0, 2048, (2, 13)) for _ in range(3)]
    m = _wide_lora_model(tied)
    opt = _optimizer(m, max_gathered_bytes=budget)
    assert opt.sharded is not None
    tables = ["model.embed_tokens"] if tied else ["model.embed_tokens", "lm_head"]
    assert opt.sharded.sliced == dict.fromkeys(tables, 195)
    opt.sharded.trace = []
    losses = []
    for batch in batches:
        loss = m.loss(batch)
        losses.append(loss.item())
        opt.backward(loss)
        opt.step()
        opt.zero_grad()
    events = opt.sharded.trace
    # The tables were never gathered whole; each pass fetched every slice in order.
    assert not any(e[2] in tables for e in events), sorted({e[2] for e in events})
    slices = [f"[{s}:{min(s + 195, 2048)}]" for s in range(0, 2048, 195)]
    fetched = [e[2] for e in events if e[1] == "ready" and "[" in e[2]]
    per_step = [f"model.embed_tokens{s}" for s in slices]
    per_step += [f"{'model.embed_tokens' if tied else 'lm_head'}{s}" for s in slices]
    assert fetched == per_step * len(batches)
    opt.sharded.detach()
    # One process against plain Adam: the lookup is bitwise, the loss's logsumexp combined per
    # slice: within a few float32 roundings of logits of order 1 (d_model = 64 products,
    # γ_64 ≈ 4e-6, Higham 2002 §3.1), the steps' losses alike.
    want = _wide_lora_model(tied)
    plain = riftco.Adam(want.parameters(), lr=1e-2)
    for step, (batch, got) in enumerate(zip(batches, losses)):
        loss = want.loss(batch)
        # Later steps start from weights Adam moved by g / sqrt(v): where a gradient is near 0
        # its rounding can flip that move (at most 2 lr per element), on any SIMD level.
        rel = 64 * 2**-23 if step == 0 else 1e-3
        assert got == pytest.approx(loss.item(), rel=rel), (step, got, loss.item())
        loss.backward()
        plain.step()
        plain.zero_grad()


def test_a_table_that_cannot_be_sliced_within_the_budget_is_refused() -> None:
    m = _wide_lora_model(True)
    # Four rows of 128 bytes must fit: below 512 bytes no slice does (and the blocks do not fit
    # either: the first unit named is the table).
    with pytest.raises(riftco.ConfigError, match="unit model.embed_tokens gathers .* four of its"):
        _optimizer(m, max_gathered_bytes=511)
    assert not m.has_parameter_residency
    # An NF4 table keeps its block maxima after all the codes: no range of rows is a range of
    # its bytes, so it is refused rather than sliced.
    nf4 = _wide_lora_model(True)
    nf4.set_frozen_weights_dtype("nf4")
    with pytest.raises(riftco.ConfigError, match="model.embed_tokens .* NF4 table is not stored"):
        _optimizer(nf4, max_gathered_bytes=40_000)
    assert not nf4.has_parameter_residency
    # A trainable table (full training) is gathered whole: a budget below it is refused.
    full = riftco.DecoderOnlyTransformer(
        riftco.TransformerConfig(
            vocab_size=2048, d_model=64, n_heads=4, n_kv_heads=2, n_layers=1, d_ff=128,
            max_seq_len=32, seed=5,
        )
    )
    with pytest.raises(riftco.ConfigError, match="model.embed_tokens .*this table is trainable"):
        _optimizer(full, max_gathered_bytes=150_000)
    # Without a budget the table is gathered whole and rows are refused.
    opt = _optimizer(m)
    assert opt.sharded is not None and opt.sharded.sliced == {}
    assert opt.sharded.row_slice("model.embed_tokens") is None
    with pytest.raises(riftco.ConfigError, match="not sliced"):
        opt.sharded.fetch_rows("model.embed_tokens", 0, 1, None)
    opt.sharded.detach()


def test_a_bad_gather_budget_on_the_command_line_names_the_text_not_another_setting() -> None:
    import argparse

    from riftco.commands.arguments import byte_size_arg

    with pytest.raises(argparse.ArgumentTypeError, match='"abc" is not a byte size: no number') as e:
        byte_size_arg("abc")
    assert "activation_memory_budget" not in str(e.value)
    assert byte_size_arg("64KiB") == 64 * 1024


@pytest.mark.parametrize("bad", [-3, 0, "abc", 10**30])
def test_an_owner_whose_row_slice_is_not_a_row_count_stops_the_pass(bad: Any) -> None:
    class Owner:
        def acquire(self, unit: str, reason: str, next: str | None) -> None:
            pass

        def release(self, unit: str) -> None:
            pass

        def row_slice(self, unit: str) -> Any:
            return bad

    m = _wide_lora_model(True)
    m.set_parameter_residency(Owner())
    with pytest.raises(TypeError, match=r"row_slice\(model.embed_tokens\) must return None or"):
        m.loss(_batches()[0])
    m.set_parameter_residency(None)


def test_a_gathered_unit_frees_its_frozen_part_and_takes_the_same_bytes_back() -> None:
    m = _model("block", lora=True, dtype="bfloat16")
    opt = _optimizer(m)
    assert opt.sharded is not None
    unit = opt.sharded.units["model.layers.1"]
    assert unit.frozen_shard is not None
    before = unit.frozen_shard.numpy().view(np.uint8).copy()
    opt.sharded.acquire("model.layers.1", "forward", None)
    # The model's tensors hold the bytes: the part is redundant while gathered.
    assert unit.frozen_shard.is_released
    assert not any(p.is_released for p in unit.parameters())
    opt.sharded.release("model.layers.1")
    assert not unit.frozen_shard.is_released
    assert all(p.is_released for p in unit.parameters())
    np.testing.assert_array_equal(unit.frozen_shard.numpy().view(np.uint8), before)
    opt.sharded.detach()
