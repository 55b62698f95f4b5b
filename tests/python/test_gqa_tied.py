"""Grouped-query attention and tied embeddings from Python: riftco's logits against a NumPy
float64 reference forward written here from the papers (token embedding, RMSNorm — Zhang &
Sennrich 2019 —, RoPE with the rotate-half pairing — Su et al. 2021 —, causal attention with
K/V heads repeated per query group as Hugging Face's ``repeat_kv`` — Ainslie et al. 2023 —,
SwiGLU — Shazeer 2020 — and an LM head that reads the embedding matrix — Press & Wolf 2017),
a save → load round trip, the K/V-cache decode against the full forward, and bad values of
``n_kv_heads`` / ``tie_word_embeddings``."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

import riftco

F64 = npt.NDArray[np.float64]


def config(n_kv_heads: int | None = 2, tied: bool = True) -> riftco.TransformerConfig:
    return riftco.TransformerConfig(
        vocab_size=64,
        d_model=32,
        n_heads=4,
        n_layers=2,
        d_ff=48,
        max_seq_len=24,
        seed=5,
        n_kv_heads=n_kv_heads,
        tie_word_embeddings=tied,
    )


def rms_norm(x: F64, w: F64, eps: float) -> F64:
    out: F64 = x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w
    return out


def rope(x: F64, theta: float) -> F64:
    """``x [seq, heads, d_head]`` rotated by position (dimension i paired with i + d_head/2)."""
    seq, _, d = x.shape
    inv_freq = theta ** (-np.arange(0, d, 2, dtype=np.float64) / d)
    angles = np.arange(seq, dtype=np.float64)[:, None] * inv_freq[None, :]
    cos = np.concatenate([np.cos(angles)] * 2, axis=-1)[:, None, :]
    sin = np.concatenate([np.sin(angles)] * 2, axis=-1)[:, None, :]
    half = d // 2
    rotated = np.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    out: F64 = x * cos + rotated * sin
    return out


def reference_logits(c: riftco.TransformerConfig, w: dict[str, F64], tokens: list[int]) -> F64:
    """The float64 forward of one sequence: logits ``[seq, vocab_size]``."""
    h, kv, dh = c.n_heads, c.n_kv_heads, c.d_head
    seq = len(tokens)
    x = w["model.embed_tokens.weight"][tokens]
    mask = np.tril(np.ones((seq, seq), dtype=bool))
    for i in range(c.n_layers):
        p = f"model.layers.{i}."
        n1 = rms_norm(x, w[p + "input_layernorm.weight"], c.rms_norm_eps)
        q = (n1 @ w[p + "self_attn.q_proj.weight"].T).reshape(seq, h, dh)
        k = (n1 @ w[p + "self_attn.k_proj.weight"].T).reshape(seq, kv, dh)
        v = (n1 @ w[p + "self_attn.v_proj.weight"].T).reshape(seq, kv, dh)
        q, k = rope(q, c.rope_theta), rope(k, c.rope_theta)
        # repeat_kv: query head j reads key/value head j // (h // kv).
        k, v = np.repeat(k, h // kv, axis=1), np.repeat(v, h // kv, axis=1)
        scores = np.einsum("qhd,khd->hqk", q, k) / np.sqrt(dh)
        scores = np.where(mask[None], scores, -np.inf)
        probs = np.exp(scores - scores.max(axis=-1, keepdims=True))
        probs /= probs.sum(axis=-1, keepdims=True)
        attn = np.einsum("hqk,khd->qhd", probs, v).reshape(seq, h * dh)
        x = x + attn @ w[p + "self_attn.o_proj.weight"].T
        n2 = rms_norm(x, w[p + "post_attention_layernorm.weight"], c.rms_norm_eps)
        gate = n2 @ w[p + "mlp.gate_proj.weight"].T
        up = n2 @ w[p + "mlp.up_proj.weight"].T
        x = x + (gate / (1.0 + np.exp(-gate)) * up) @ w[p + "mlp.down_proj.weight"].T
    x = rms_norm(x, w["model.norm.weight"], c.rms_norm_eps)
    head = w["model.embed_tokens.weight"] if c.tie_word_embeddings else w["lm_head.weight"]
    logits: F64 = x @ head.T
    return logits


def weights(model: riftco.DecoderOnlyTransformer) -> dict[str, F64]:
    return {n: p.numpy().astype(np.float64) for n, p in model.named_parameters()}


TOKENS = [3, 17, 42, 8, 63, 0, 25, 9, 11, 30, 5]  # 11: odd, not a tile multiple


@pytest.mark.parametrize(("n_kv_heads", "tied"), [(2, True), (1, True), (2, False), (4, True)])
@pytest.mark.parametrize("attention", ["flash", "materialized"])
def test_logits_match_a_numpy_float64_reference(
    n_kv_heads: int, tied: bool, attention: str
) -> None:
    c = config(n_kv_heads, tied)
    model = riftco.DecoderOnlyTransformer(c, attention=attention)
    names = [n for n, _ in model.named_parameters()]
    assert ("lm_head.weight" in names) == (not tied)
    shapes = {n: tuple(p.numpy().shape) for n, p in model.named_parameters()}
    assert shapes["model.layers.0.self_attn.k_proj.weight"] == (n_kv_heads * 8, 32)
    assert shapes["model.layers.1.self_attn.v_proj.weight"] == (n_kv_heads * 8, 32)
    got = model.logits(np.array([TOKENS], dtype=np.int64)).numpy()
    want = reference_logits(c, weights(model), TOKENS)
    assert got.shape == want.shape
    err = float(np.max(np.abs(got - want)))
    assert err < 1e-5, f"max |riftco - numpy float64| = {err}"


def safetensors_names(path: Path) -> dict[str, Any]:
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header: dict[str, Any] = json.loads(raw[8 : 8 + n])
    header.pop("__metadata__", None)
    return header


def test_save_load_round_trip_of_a_gqa_tied_model(tmp_path: Path) -> None:
    c = config(2, True)
    model = riftco.DecoderOnlyTransformer(c)
    path = tmp_path / "model.safetensors"
    model.save(path)
    header = safetensors_names(path)
    assert "lm_head.weight" not in header
    assert header["model.layers.0.self_attn.k_proj.weight"]["shape"] == [16, 32]
    hf = json.loads((tmp_path / "config.json").read_text())
    assert hf["num_key_value_heads"] == 2
    assert hf["num_attention_heads"] == 4
    assert hf["tie_word_embeddings"] is True
    back = riftco.DecoderOnlyTransformer.load(path)
    assert back.config == c
    assert back.config.n_kv_heads == 2 and back.config.tie_word_embeddings
    tokens = np.array([TOKENS], dtype=np.int64)
    np.testing.assert_array_equal(back.logits(tokens).numpy(), model.logits(tokens).numpy())
    # The config survives to_dict / from_dict and pickling.
    assert riftco.TransformerConfig.from_dict(c.to_dict()) == c
    assert "n_kv_heads=2" in repr(c) and "tie_word_embeddings=True" in repr(c)


def test_decode_matches_the_full_forward_for_gqa() -> None:
    model = riftco.DecoderOnlyTransformer(config(1, True))
    full = model.logits(np.array([TOKENS], dtype=np.int64)).numpy()
    session = model.decode_session()
    for pos, t in enumerate(TOKENS):
        np.testing.assert_allclose(session.decode_token(t), full[pos], atol=1e-5, rtol=0)


def test_one_tied_parameter_gets_the_summed_gradient() -> None:
    model = riftco.DecoderOnlyTransformer(config(2, True))
    params = model.parameters()
    assert len(params) == len(model.named_parameters())
    loss = model.loss(np.array([TOKENS + [1]], dtype=np.int64))
    loss.backward()
    embed = dict(model.named_parameters())["model.embed_tokens.weight"]
    g = embed.grad
    assert g is not None
    # Tokens that never occur as inputs still get the LM head's gradient through the tie.
    unused = sorted(set(range(64)) - set(TOKENS))
    assert np.all(np.abs(g[unused]).sum(axis=1) > 0)


@pytest.mark.parametrize(
    ("value", "shown"),
    [(3, "n_kv_heads = 3"), (0, "n_kv_heads = 0"), (True, "n_kv_heads = True"), (2.0, "2.0")],
)
def test_bad_n_kv_heads_is_a_config_error_naming_the_value(value: Any, shown: str) -> None:
    with pytest.raises(riftco.ConfigError, match=shown):
        riftco.TransformerConfig(64, 32, 4, 2, 48, 24, n_kv_heads=value)


@pytest.mark.parametrize("value", [1, "yes", 0.0])
def test_bad_tie_word_embeddings_is_a_config_error_naming_the_value(value: Any) -> None:
    with pytest.raises(riftco.ConfigError, match="tie_word_embeddings = "):
        riftco.TransformerConfig(64, 32, 4, 2, 48, 24, tie_word_embeddings=value)


def test_pretrain_example_takes_n_kv_heads_and_tie_word_embeddings(tmp_path: Path) -> None:
    import subprocess
    import sys

    script = Path(__file__).resolve().parents[2] / "examples" / "pretrain.py"
    common = ["--steps", "2", "--batch-size", "2", "--seq-len", "16", "--max-seq-len", "16",
              "--d-model", "32", "--n-heads", "4", "--n-layers", "2", "--d-ff", "48",
              "--no-progress", "--save-every", "2", "--sample-tokens", "0"]
    out = tmp_path / "run"
    done = subprocess.run(
        [sys.executable, str(script), "--out", str(out), "--n-kv-heads", "2",
         "--tie-word-embeddings", *common],
        capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stderr
    hf = json.loads((out / "config.json").read_text())
    assert hf["num_key_value_heads"] == 2 and hf["tie_word_embeddings"] is True
    bad = subprocess.run(
        [sys.executable, str(script), "--out", str(tmp_path / "bad"), "--n-kv-heads", "3",
         *common],
        capture_output=True, text=True, timeout=300,
    )
    assert bad.returncode == 2
    assert "n_kv_heads = 3" in bad.stderr and "n_heads 4" in bad.stderr
