"""Frozen weights in 16-bit storage from Python (``set_frozen_weights_dtype``): a LoRA model with a
bfloat16 / float16 base gives bitwise the logits and gradients of a float32 model holding the
rounded weights (that model is the bf16 one saved and loaded back as float32), the frozen
parameter bytes are halved, errors name the value, and ``run_post_training`` stores the base as
asked and records it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import riftco

TOKENS = np.arange(2 * 13).reshape(2, 13) * 7 % 64


def lora_model() -> riftco.DecoderOnlyTransformer:
    config = riftco.TransformerConfig(
        vocab_size=64, d_model=32, n_heads=4, n_layers=2, d_ff=48, max_seq_len=16, seed=4
    )
    model = riftco.DecoderOnlyTransformer(config, activation_checkpointing="block")
    model.enable_lora(rank=4, alpha=8.0, mlp=True, seed=1)
    return model


def outputs(model: riftco.DecoderOnlyTransformer) -> tuple[Any, ...]:
    with riftco.no_grad():
        logits = model.logits(TOKENS[:, :-1]).numpy()
    loss = model.loss(TOKENS)
    loss.backward()
    grads = [p.grad for _, p in model.named_lora_parameters()]
    return logits, loss.item(), grads


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_a_16_bit_base_computes_as_float32_holding_the_rounded_values(
    dtype: str, tmp_path: Path
) -> None:
    half = lora_model()
    half.set_frozen_weights_dtype(dtype)
    assert half.frozen_weights_dtype == dtype
    half.save(tmp_path / "rounded.safetensors")
    reference = riftco.load_model(tmp_path / "rounded.safetensors")
    reference.enable_lora(rank=4, alpha=8.0, mlp=True, seed=1)
    assert reference.frozen_weights_dtype == "float32"
    (lh, sh, gh), (lr, sr, gr) = outputs(half), outputs(reference)
    np.testing.assert_array_equal(lh, lr)
    assert sh == sr
    for a, b in zip(gh, gr):
        np.testing.assert_array_equal(a, b)
    # The rounding is real: the float32 original differs.
    original = lora_model()
    assert not np.array_equal(outputs(original)[0], lh)


def test_the_frozen_parameter_bytes_are_halved() -> None:
    model = lora_model()
    frozen = sum(p.numpy().nbytes for _, p in model.named_parameters())
    before = riftco.memory_stats()["parameter"]["current_bytes"]
    model.set_frozen_weights_dtype("BFloat16")
    after = riftco.memory_stats()["parameter"]["current_bytes"]
    assert before - after == frozen // 2
    model.set_frozen_weights_dtype("float32")
    assert riftco.memory_stats()["parameter"]["current_bytes"] == before


def test_errors_name_the_value() -> None:
    model = lora_model()
    with pytest.raises(riftco.ConfigError, match="float64"):
        model.set_frozen_weights_dtype("float64")
    plain = riftco.DecoderOnlyTransformer(
        riftco.TransformerConfig(vocab_size=64, d_model=32, n_heads=4, n_layers=2, d_ff=48, max_seq_len=16)
    )
    with pytest.raises(riftco.ConfigError, match="enable LoRA first"):
        plain.set_frozen_weights_dtype("bfloat16")
    model.set_frozen_weights_dtype("bfloat16")
    with pytest.raises(riftco.LoraError, match="bfloat16"):
        model.merge_lora()
    assert model.has_lora
    with pytest.raises(riftco.ConfigError, match="needs fine_tuning_method 'lora'"):
        riftco.PostTrainingConfig(fine_tuning_method="full", frozen_weights_dtype="bfloat16")
    with pytest.raises(riftco.ConfigError, match="frozen_weights_dtype"):
        riftco.PostTrainingConfig(frozen_weights_dtype="int8")
    with pytest.raises(riftco.ConfigError, match="CPU only"):
        riftco.PostTrainingConfig(frozen_weights_dtype="bfloat16", device="gpu")
    with pytest.raises(riftco.ConfigError, match="CPU only"):
        riftco.PostTrainingConfig(frozen_weights_dtype="float16", device="vulkan")
    # A quantized base has a GPU path.
    for dtype in ("nf4", "q8_0", "q4_k", "float32"):
        assert riftco.PostTrainingConfig(frozen_weights_dtype=dtype, device="gpu").device == "gpu"
    assert riftco.PostTrainingConfig().frozen_weights_dtype is None  # keep the model's


def test_post_training_stores_the_base_as_asked(tmp_path: Path) -> None:
    model = riftco.DecoderOnlyTransformer(
        riftco.TransformerConfig(vocab_size=256, d_model=32, n_heads=4, n_layers=2, d_ff=64, max_seq_len=16)
    )
    cfg = riftco.PostTrainingConfig(
        steps=2, batch_size=2, seq_len=16, warmup_steps=1, eval_batches=1, save_every=2,
        lora_rank=2, frozen_weights_dtype="BFLOAT16",
    )
    assert cfg.frozen_weights_dtype == "bfloat16"
    full = riftco.default_corpus()
    corpus = riftco.Corpus(tokens=full.tokens[:20_000].copy(), description="head", files=())
    riftco.run_post_training(model, cfg, corpus, tmp_path, progress=False, plots=False)
    assert model.frozen_weights_dtype == "bfloat16"
    saved = json.loads((tmp_path / riftco.METADATA_FILE).read_text())
    assert saved["lora"]["frozen_weights_dtype"] == "bfloat16"
    assert saved["training_config"]["frozen_weights_dtype"] == "bfloat16"


def test_load_model_reads_straight_into_16_bit_storage(tmp_path: Path) -> None:
    model = lora_model()
    model.merge_lora()  # a plain float32 model
    model.save(tmp_path / "bf16.safetensors", dtype="bfloat16")
    rounded = riftco.load_model(tmp_path / "bf16.safetensors")
    loaded = riftco.load_model(tmp_path / "bf16.safetensors", dtype="bfloat16")
    assert loaded.frozen_weights_dtype == "bfloat16"
    assert not any(p.requires_grad for p in loaded.parameters())
    for (name, a), (_, b) in zip(loaded.named_parameters(), rounded.named_parameters()):
        np.testing.assert_array_equal(a.numpy(), b.numpy(), err_msg=name)
    loaded.enable_lora(rank=2, alpha=4.0)
    loss = loaded.loss(TOKENS)
    loss.backward()
    assert np.isfinite(loss.item())
    with pytest.raises(riftco.ConfigError, match="dtype"):
        riftco.load_model(tmp_path / "bf16.safetensors", dtype="int4")
