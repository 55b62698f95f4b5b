"""One error classification: every Rust error kind maps to one exception class (the table in
crates/riftco-python/src/errors.rs), and errors raised by the Rust core reach Python with the
class of their kind — token ids outside the vocabulary in loss, logits, decode and generate are
``TokenError``, a checkpoint contract violation is ``CheckpointError``, and so on."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

import riftco
from riftco import _native
from riftco import functional as F

TINY: dict[str, Any] = dict(vocab_size=64, d_model=32, n_heads=4, n_layers=2, d_ff=48, max_seq_len=16)

# The classification the Python layer promises, one row per Rust ErrorKind.
EXPECTED: dict[str, type[BaseException]] = {
    "shape": riftco.ShapeError,
    "index_out_of_range": riftco.ShapeError,
    "invalid_argument": riftco.ConfigError,
    "config": riftco.ConfigError,
    "unknown_option": riftco.ConfigError,
    "tokens": riftco.TokenError,
    "out_of_memory": riftco.OutOfMemoryError,
    "device_unavailable": riftco.DeviceUnavailableError,
    "device_mismatch": riftco.DeviceMismatchError,
    "stale_graph": riftco.StaleGraphError,
    "checkpoint": riftco.CheckpointError,
    "backward": riftco.RiftcoError,
    "lora": riftco.LoraError,
    "decode": riftco.DecodeError,
    "state": riftco.ModelStateError,
    "io": OSError,
    "panic": riftco.RiftcoError,
    "external": riftco.RiftcoError,
}


def model(**overrides: Any) -> riftco.DecoderOnlyTransformer:
    return riftco.DecoderOnlyTransformer(riftco.TransformerConfig(**{**TINY, **overrides}))


def test_every_error_kind_maps_to_its_class() -> None:
    table = _native._error_kind_classes()
    assert table == EXPECTED
    for name, cls in table.items():
        assert issubclass(cls, riftco.RiftcoError) or cls is OSError, name


def test_device_mismatch_error_is_a_runtime_riftco_error() -> None:
    cls = riftco.DeviceMismatchError
    assert issubclass(cls, riftco.RiftcoError) and issubclass(cls, RuntimeError)
    assert not issubclass(cls, ValueError)
    assert not issubclass(cls, riftco.DeviceUnavailableError)
    assert cls.__module__ == "riftco._native" and cls.__doc__
    assert "DeviceMismatchError" in riftco.__all__


def test_out_of_vocabulary_ids_are_token_errors_everywhere() -> None:
    m = model()
    block = np.ones((1, 9), dtype=np.int64)
    block[0, 4] = 64
    with pytest.raises(riftco.TokenError, match="token id 64"):
        m.loss(block)
    with pytest.raises(riftco.TokenError, match="token id 64"):
        m.logits(block[:, :8])
    # Checked by the Rust decode session, not by the binding: classified by kind.
    session = m.decode_session()
    with pytest.raises(riftco.TokenError, match=r"token id 64 is outside the vocabulary \(vocab_size 64\)") as info:
        session.decode_token(64)
    assert isinstance(info.value, ValueError)
    # A byte prompt (valid for generate's 256-value check) outside this model's 64-token vocabulary.
    with pytest.raises(riftco.TokenError, match="token id 100 is outside the vocabulary"):
        riftco.generate(m, [1, 100], 2)
    logits = riftco.Variable(np.zeros((2, 4)), requires_grad=True)
    with pytest.raises(riftco.TokenError, match="4"):
        F.cross_entropy(logits, [0, 4])


def test_a_sequence_longer_than_max_seq_len_is_a_token_error() -> None:
    with pytest.raises(riftco.TokenError, match="sequence length 17 exceeds max_seq_len 16"):
        model().logits(np.ones((1, 17), dtype=np.int64))


def test_a_checkpoint_violation_is_a_checkpoint_error() -> None:
    rng = np.random.default_rng(0)
    x = riftco.Variable(rng.standard_normal((3, 5)), requires_grad=True, name="x")
    w1 = riftco.Variable(rng.standard_normal((7, 5)), requires_grad=True, name="w1")
    w2 = riftco.Variable(rng.standard_normal((5, 7)), requires_grad=True, name="w2")
    with pytest.raises(riftco.CheckpointError, match="w2") as info:
        riftco.checkpoint(lambda h: F.linear(F.silu(F.linear(h, w1)), w2), x, [w1])
    assert isinstance(info.value, RuntimeError)
    with pytest.raises(riftco.CheckpointError, match="does not depend on declared dependency"):
        riftco.checkpoint(lambda h: F.silu(h), x, [w1])


def test_each_reachable_kind_raises_its_class(tmp_path: Path) -> None:
    m = model()
    with pytest.raises(riftco.DecodeError, match="cache is full"):
        s = m.decode_session()
        for t in range(17):
            s.decode_token(t)
    with pytest.raises(riftco.LoraError, match="no adapters"):
        m.merge_lora()
    with pytest.raises(riftco.ConfigError, match="d_model"):
        riftco.TransformerConfig(**{**TINY, "d_model": 0})
    with pytest.raises(riftco.ConfigError, match="fast"):
        m.set_attention("fast")
    with pytest.raises(riftco.ConfigError, match="eps"):
        F.rms_norm(riftco.Variable(np.ones((2, 2))), riftco.Variable(np.ones(2)), eps=float("nan"))
    with pytest.raises(riftco.DeviceUnavailableError):
        m.to("metal")
    with pytest.raises(riftco.ShapeError):
        F.add(riftco.Variable(np.ones((2, 3))), riftco.Variable(np.ones((3, 2))))
    loss = m.loss(np.ones((1, 9), dtype=np.int64))
    loss.backward()
    riftco.Adam(m.parameters(), lr=1e-3).step()
    with pytest.raises(riftco.StaleGraphError):
        loss.backward()
    with pytest.raises(FileNotFoundError):
        riftco.DecoderOnlyTransformer.load(tmp_path / "missing.safetensors")
    (tmp_path / "bad.safetensors").write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{}")
    with pytest.raises(riftco.ModelStateError):
        riftco.DecoderOnlyTransformer.load(tmp_path / "bad.safetensors")
    # backward() of a graph no trainable leaf reaches: the root class itself.
    frozen = F.sum(riftco.Variable(np.ones(3)))
    with pytest.raises(riftco.RiftcoError, match="does not require grad") as info:
        frozen.backward()
    assert type(info.value) is riftco.RiftcoError


def test_any_int_given_to_decode_token_is_checked_as_a_token_id() -> None:
    session = model().decode_session()
    for bad in [-1, 2**32, 2**63, -(2**70)]:
        with pytest.raises(riftco.TokenError, match=rf"token id {bad} is outside the vocabulary \(vocab_size 64\)"):
            session.decode_token(bad)
    with pytest.raises(riftco.TokenError, match="must be an int"):
        session.decode_token(1.5)  # type: ignore[arg-type]
    assert session.position == 0, "nothing was decoded"
