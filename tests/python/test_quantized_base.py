"""A block-quantized frozen base (QLoRA's setting, llama.cpp's formats): a GGUF file's quantized
tensors loaded as stored compute bitwise as the float32 model holding the dequantized weights
(the same file loaded with ``dtype="float32"``), for the logits, the LoRA loss, gradients and
Adam steps, under every checkpointing policy, and while decoding with the K/V cache; the
parameter bytes are the quantized ones; what would write a quantized weight is refused with
what to do instead.

The small files are written with the ``gguf`` package (llama.cpp's own writer and quantizers);
skipped, with the reason, when it is absent."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import riftco

pytest.importorskip(
    "gguf",
    reason="the gguf package is not installed (pip install 'riftco[gguf]'): these tests write "
    "their quantized models with it",
)

from gguf import GGMLQuantizationType as Q  # noqa: E402

from test_gguf import TINY, bits, tiny_llama  # noqa: E402

PROJECTIONS = ["attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"]
# Every block type riftco keeps quantized, spread over the projections and the embedding.
QUANTIZED = [Q.Q8_0, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q2_K, Q.Q3_K, Q.Q4_K, Q.Q5_K, Q.Q6_K]
TOKENS = (np.arange(2 * 13).reshape(2, 13) * 7 % TINY["vocab_size"]).astype(np.int64)
POLICIES: list[Any] = ["disabled", "block", "selective", "selective:q+k+v", ["block", "disabled"], "auto"]


def mixed_file(tmp_path: Path, tied: bool = True) -> Path:
    names = [f"blk.{i}.{p}.weight" for i in range(TINY["n_layers"]) for p in PROJECTIONS]
    types = {name: QUANTIZED[k % len(QUANTIZED)] for k, name in enumerate(names)}
    types["token_embd.weight"] = Q.Q8_0
    if not tied:
        types["output.weight"] = Q.Q6_K
    path, _ = tiny_llama(tmp_path, types, tied=tied)
    return path


def lora(model: riftco.DecoderOnlyTransformer) -> riftco.DecoderOnlyTransformer:
    model.enable_lora(rank=4, alpha=8.0, mlp=True, seed=1)
    return model


def step_outputs(model: riftco.DecoderOnlyTransformer, steps: int = 2) -> tuple[Any, ...]:
    """Logits, then the losses, LoRA gradients and LoRA weights over ``steps`` Adam steps."""
    with riftco.no_grad():
        logits = model.logits(TOKENS[:, :-1]).numpy()
    opt = riftco.optim.Adam([p for _, p in model.named_lora_parameters()], lr=1e-2)
    losses, grads = [], []
    for _ in range(steps):
        opt.zero_grad()
        loss = model.loss(TOKENS)
        loss.backward()
        losses.append(loss.item())
        grad = [p.grad for _, p in model.named_lora_parameters()]
        assert all(g is not None for g in grad)
        grads.append([bits(np.asarray(g)) for g in grad])
        opt.step()
    weights = [bits(p.numpy()) for _, p in model.named_lora_parameters()]
    return logits, losses, grads, weights


def assert_same(a: tuple[Any, ...], b: tuple[Any, ...]) -> None:
    (la, sa, ga, wa), (lb, sb, gb, wb) = a, b
    assert np.array_equal(bits(la), bits(lb))
    assert sa == sb
    for x, y in zip(ga, gb):
        for u, v in zip(x, y):
            assert np.array_equal(u, v)
    for u, v in zip(wa, wb):
        assert np.array_equal(u, v)


@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
def test_a_gguf_loads_as_stored_and_computes_as_its_dequantized_float32_model(
    tmp_path: Path, tied: bool
) -> None:
    path = mixed_file(tmp_path, tied)
    quantized = riftco.load_model(path)
    assert quantized.frozen_weights_dtype in {t.name.lower() for t in QUANTIZED}
    assert not any(p.requires_grad for _, p in quantized.named_parameters())
    reference = riftco.load_model(path, dtype="float32")
    assert reference.frozen_weights_dtype == "float32"
    assert all(p.requires_grad for _, p in reference.named_parameters())
    # The parameters read back (dequantized) are the float32 model's, bit for bit.
    for (name, a), (_, b) in zip(quantized.named_parameters(), reference.named_parameters()):
        assert np.array_equal(bits(a.numpy()), bits(b.numpy())), name
    assert_same(step_outputs(lora(quantized)), step_outputs(lora(reference)))


def test_every_policy_is_bitwise_equal_to_disabled_on_a_quantized_base(tmp_path: Path) -> None:
    path = mixed_file(tmp_path)
    runs = []
    for policy in POLICIES:
        model = riftco.load_model(path, activation_checkpointing=policy)
        runs.append(step_outputs(lora(model)))
    for run in runs[1:]:
        assert_same(run, runs[0])


def test_the_parameter_bytes_are_the_quantized_bytes(tmp_path: Path) -> None:
    path = mixed_file(tmp_path)
    infos = riftco.gguf_tensor_infos(path)
    stored = sum(int(i["n_bytes"]) for i in infos)
    before = riftco.memory_stats()["parameter"]["current_bytes"]
    model = riftco.load_model(path)
    held = riftco.memory_stats()["parameter"]["current_bytes"] - before
    assert held == stored
    f32 = sum(p.numpy().nbytes for _, p in model.named_parameters())
    assert held < f32 / 3


def test_decoding_a_quantized_base_follows_the_float32_model(tmp_path: Path) -> None:
    path = mixed_file(tmp_path)
    quantized, reference = riftco.load_model(path), riftco.load_model(path, dtype="float32")
    prompt = [1, 5, 63, 0, 17]
    sq, sr = quantized.decode_session(), reference.decode_session()
    lq, lr = sq.decode_tokens(prompt), sr.decode_tokens(prompt)
    # A prompt is one sequence through the same products: bitwise.
    assert np.array_equal(bits(lq), bits(lr))
    for _ in range(8):
        token = int(np.argmax(lr))
        lq, lr = sq.decode_token(token), sr.decode_token(token)
        # One token: the quantized mat-vec against the f32 one on the same values. Both sum
        # the d_model (or d_ff) products of one row in f32; the bound is that of two f32 dot
        # products of n terms: 2 * n * eps * sum |w x|, far above what is seen.
        assert np.allclose(lq, lr, rtol=0, atol=1e-4 * float(np.abs(lr).max()))
        assert int(np.argmax(lq)) == int(np.argmax(lr))


def test_a_quantized_base_trains_on_the_gpu_as_its_dequantized_float32_model(tmp_path: Path) -> None:
    """On a GPU the quantized bytes move as they are (the parameter bytes there are the
    quantized ones) and the products dequantize the same values the CPU does: the logits, LoRA
    losses, gradients and Adam steps are bitwise those of the float32 model on the same GPU (the
    same kernels on the same values)."""
    entry = next(d for d in riftco.devices() if d["device"] == "gpu")
    if not entry["available"]:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI=true and no GPU adapter: {entry['reason']}")
        pytest.skip(f"no GPU ({entry['reason']}); set CI=true to make this a failure")
    device = str(entry["resolved"])
    path = mixed_file(tmp_path, tied=False)
    stored = sum(int(i["n_bytes"]) for i in riftco.gguf_tensor_infos(path))
    quantized = riftco.load_model(path)
    before = riftco.memory_stats(device)["parameter"]["current_bytes"]
    quantized.to(device)
    assert quantized.device == device
    assert riftco.memory_stats(device)["parameter"]["current_bytes"] - before == stored
    reference = riftco.load_model(path, dtype="float32").to(device)
    assert_same(step_outputs(lora(quantized)), step_outputs(lora(reference)))
    del reference
    # Back on the CPU (base and adapters): the same bytes as a model that never moved.
    quantized.to("cpu")
    assert riftco.memory_stats(device)["parameter"]["current_bytes"] == before
    again = riftco.load_model(path)
    for (name, a), (_, b) in zip(quantized.named_parameters(), again.named_parameters()):
        assert np.array_equal(bits(a.numpy()), bits(b.numpy())), name


def test_post_train_refuses_a_16_bit_base_on_a_gpu_and_says_what_works(tmp_path: Path) -> None:
    # Checked before any device is opened or folder written: no GPU needed.
    path = mixed_file(tmp_path)
    out = tmp_path / "run"
    r = subprocess.run(
        [sys.executable, "-m", "riftco", "post-train", "--model", str(path), "--device", "gpu",
         "--frozen-weights-dtype", "bfloat16", "--steps", "1", "--out", str(out)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert "CPU only" in r.stderr and "quantized" in r.stderr and "Traceback" not in r.stderr
    assert not out.exists()


def test_writes_to_a_quantized_base_are_refused_with_what_to_do(tmp_path: Path) -> None:
    path = mixed_file(tmp_path)
    model = lora(riftco.load_model(path))
    with pytest.raises(riftco.LoraError, match="(?i)quantized .*dequantize"):
        model.merge_lora()
    assert model.has_lora
    with pytest.raises(riftco.ModelStateError, match="read-only"):
        model.load_weights(path)
    # Dequantized, it merges: the model then equals the float32 load with the same merge.
    model.set_frozen_weights_dtype("float32")
    assert model.frozen_weights_dtype == "float32"
    model.merge_lora()
    reference = lora(riftco.load_model(path, dtype="float32"))
    reference.merge_lora()
    for (name, a), (_, b) in zip(model.named_parameters(), reference.named_parameters()):
        assert np.array_equal(bits(a.numpy()), bits(b.numpy())), name


def test_an_unknown_dtype_lists_the_accepted_ones(tmp_path: Path) -> None:
    path = mixed_file(tmp_path)
    with pytest.raises(riftco.ConfigError, match="int4.*nf4.*q4_k"):
        riftco.load_model(path, dtype="int4")
    with pytest.raises(riftco.ConfigError, match="frozen_weights_dtype"):
        riftco.PostTrainingConfig(frozen_weights_dtype="q4_9")


@pytest.mark.parametrize("dtype", ["nf4", "q4_k", "q8_0", "q4_0"])
def test_quantized_on_load_computes_as_the_float32_model_of_its_values(
    tmp_path: Path, dtype: str
) -> None:
    """A Hugging Face folder loaded with ``dtype=`` holds each matrix as ``riftco.quantize`` makes
    it (the RMSNorm gains float32) and computes bitwise as a float32 model holding the
    dequantized values (that model saved and loaded back as float32)."""
    _, folder = tiny_llama(tmp_path, {}, tied=True)
    original = dict(riftco.load_model(folder).named_parameters())
    quantized = riftco.load_model(folder, dtype=dtype)
    assert quantized.frozen_weights_dtype == dtype
    for name, p in quantized.named_parameters():
        w = original[name].numpy()
        expected = w if w.ndim == 1 else riftco.dequantize(riftco.quantize(w, dtype), dtype, w.shape)
        assert np.array_equal(bits(p.numpy()), bits(expected)), name
    quantized.save(str(tmp_path / "dequantized.safetensors"))
    reference = riftco.load_model(tmp_path / "dequantized.safetensors")
    assert_same(step_outputs(lora(quantized)), step_outputs(lora(reference)))


def test_a_matrix_that_is_not_whole_blocks_is_named(tmp_path: Path) -> None:
    config = riftco.TransformerConfig(
        vocab_size=64, d_model=96, n_heads=4, n_layers=1, d_ff=192, max_seq_len=16
    )
    model = lora(riftco.DecoderOnlyTransformer(config))
    with pytest.raises(riftco.ConfigError, match=r"embed_tokens.*\[64, 96\].*256"):
        model.set_frozen_weights_dtype("q4_k")
    assert model.frozen_weights_dtype == "float32"  # unchanged
    model.set_frozen_weights_dtype("q8_0")  # 96 = 3 blocks of 32
    assert model.frozen_weights_dtype == "q8_0"


def test_a_quantized_load_holds_one_tensor_in_float32_at_a_time(tmp_path: Path) -> None:
    """``dtype="nf4"`` quantizes each tensor as it is read: the load's peak is the quantized
    model plus about one float32 tensor, never the float32 model (nor a pool holding it)."""
    _, folder = tiny_llama(tmp_path, {}, tied=True)
    f32 = sum(p.numpy().nbytes for _, p in riftco.load_model(folder).named_parameters())
    riftco.empty_cache()
    riftco.reset_peak_memory_stats()
    before = riftco.memory_stats()
    model = riftco.load_model(folder, dtype="nf4")
    stats = riftco.memory_stats()
    held = stats["parameter"]["current_bytes"] - before["parameter"]["current_bytes"]
    assert 0 < held < f32 / 4
    assert stats["total"]["peak_bytes"] - before["total"]["current_bytes"] <= held + f32 // 2
    assert riftco.cached_bytes() < f32 // 2
    assert model.frozen_weights_dtype == "nf4"


def test_a_qlora_run_is_generated_and_exported_on_the_base_it_trained_on(tmp_path: Path) -> None:
    """A run trained on an NF4 base (``frozen_weights_dtype="nf4"``) samples and exports its
    adapter on that same NF4 base, not on the file's own storage (found by a fresh-clone review:
    the learned behaviour vanished on the other base)."""
    from riftco.commands.generate import load_for_generation

    _, folder = tiny_llama(tmp_path, {}, tied=True)
    cfg = riftco.PostTrainingConfig(
        steps=2, batch_size=2, seq_len=16, warmup_steps=1, eval_batches=1, save_every=2,
        lora_rank=4, frozen_weights_dtype="nf4",
    )
    rng = np.random.default_rng(0)
    # Token ids of the 64-token model (the corpus takes any unsigned ids below vocab_size).
    tokens: Any = rng.integers(0, TINY["vocab_size"], 4000).astype(np.uint32)
    corpus = riftco.Corpus(tokens=tokens, description="random ids", files=())
    run = tmp_path / "run"
    riftco.run_post_training(str(folder), cfg, corpus, run, progress=False, plots=False)
    model, _ = load_for_generation(str(run), None, "flash")
    assert model.frozen_weights_dtype == "nf4" and model.has_lora
    trained = riftco.load_model(folder, dtype="nf4")
    trained.load_lora(str(run / "adapter"))
    ids = np.array([[1, 5, 63, 0, 17]], dtype=np.int64)
    assert np.array_equal(bits(model.logits(ids).numpy()), bits(trained.logits(ids).numpy()))
