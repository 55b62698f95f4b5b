"""The chunked LM head + cross-entropy from Python (``model.loss_chunk_bytes``): the loss
against a NumPy float64 cross-entropy of the model's whole logits, chunked against unfused
(loss bitwise, every gradient within f32 rounding) for tied and untied heads and LoRA, the
setting's validation on the model, the stage configs and the CLI flag."""

from __future__ import annotations

import argparse
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

import riftco
from riftco.cli import add_checkpointing_arguments

VOCAB = 300


def model(tied: bool = False) -> riftco.DecoderOnlyTransformer:
    config = riftco.TransformerConfig(
        vocab_size=VOCAB,
        d_model=32,
        n_heads=4,
        n_layers=2,
        d_ff=48,
        max_seq_len=32,
        seed=3,
        tie_word_embeddings=tied,
    )
    return riftco.DecoderOnlyTransformer(config, activation_checkpointing="block")


def block(batch: int = 3, seq_plus_one: int = 12) -> npt.NDArray[np.int64]:
    return (np.arange(batch * seq_plus_one, dtype=np.int64).reshape(batch, seq_plus_one) * 37) % VOCAB


def test_the_default_is_chunked_with_64_mib() -> None:
    assert riftco.DEFAULT_LOSS_CHUNK_BYTES == 64 * 2**20
    assert model().loss_chunk_bytes == riftco.DEFAULT_LOSS_CHUNK_BYTES


@pytest.mark.parametrize("tied", [False, True])
def test_the_chunked_loss_equals_a_numpy_cross_entropy_of_the_logits(tied: bool) -> None:
    m = model(tied)
    m.loss_chunk_bytes = 4 * (VOCAB + 1) * 5  # 5 tokens a chunk: 33 tokens in 7 chunks
    tokens = block()
    with riftco.no_grad():
        logits = m.logits(tokens[:, :-1]).numpy().astype(np.float64)
    targets = tokens[:, 1:].reshape(-1)
    shifted = logits - logits.max(axis=1, keepdims=True)
    lse = np.log(np.exp(shifted).sum(axis=1)) + logits.max(axis=1)
    want = float(np.mean(lse - logits[np.arange(len(targets)), targets]))
    got = m.loss(tokens).item()
    assert got == pytest.approx(want, rel=1e-6)


def gradients(m: riftco.DecoderOnlyTransformer, chunk: int | str | None) -> tuple[float, dict[str, Any]]:
    m.loss_chunk_bytes = chunk
    loss = m.loss(block())
    loss.backward()
    named = m.named_parameters() + (m.named_lora_parameters() if m.has_lora else [])
    grads = {n: p.grad for n, p in named if p.requires_grad}
    return loss.item(), grads


@pytest.mark.parametrize("tied", [False, True])
@pytest.mark.parametrize("lora", [False, True])
def test_chunked_and_unfused_agree(tied: bool, lora: bool) -> None:
    m = model(tied)
    if lora:
        m.enable_lora(rank=4, alpha=8.0)
    loss_ref, ref = gradients(m, None)
    for chunk in (1, 4 * (VOCAB + 1) * 5, "64MiB"):
        loss, got = gradients(m, chunk)
        assert loss == loss_ref, f"chunk {chunk!r}"
        assert got.keys() == ref.keys()
        for name, g in got.items():
            r = ref[name]
            assert g is not None and r is not None, name
            scale = float(np.abs(r).max())
            np.testing.assert_allclose(g, r, rtol=0, atol=2e-6 * scale, err_msg=f"{name}, {chunk!r}")


@pytest.mark.parametrize(
    "value", [0, -1, 1.5, 64.0, True, "1.5B", "0", "-3MiB", "lots", 2**64, [1]]
)
def test_bad_budgets_are_config_errors_naming_the_setting(value: Any) -> None:
    m = model()
    m.loss_chunk_bytes = "16MiB"
    with pytest.raises(riftco.ConfigError, match="loss_chunk_bytes"):
        m.loss_chunk_bytes = value
    assert m.loss_chunk_bytes == 16 * 2**20
    with pytest.raises(riftco.ConfigError, match="loss_chunk_bytes"):
        riftco.PretrainingConfig(loss_chunk_bytes=value)


def test_stage_configs_keep_plain_ints_and_none() -> None:
    assert riftco.PretrainingConfig().loss_chunk_bytes == riftco.DEFAULT_LOSS_CHUNK_BYTES
    assert riftco.PostTrainingConfig(loss_chunk_bytes="1KiB").loss_chunk_bytes == 1024
    assert riftco.PostTrainingConfig(loss_chunk_bytes=np.int64(7)).to_dict()["loss_chunk_bytes"] == 7
    assert riftco.PretrainingConfig(loss_chunk_bytes=None).loss_chunk_bytes is None


def test_the_cli_flag() -> None:
    parser = argparse.ArgumentParser()
    add_checkpointing_arguments(parser)
    assert parser.parse_args([]).loss_chunk_bytes == riftco.DEFAULT_LOSS_CHUNK_BYTES
    assert parser.parse_args(["--loss-chunk-bytes", "none"]).loss_chunk_bytes is None
    assert parser.parse_args(["--loss-chunk-bytes", "2MiB"]).loss_chunk_bytes == 2 * 2**20
    with pytest.raises(SystemExit):
        parser.parse_args(["--loss-chunk-bytes", "0"])
