"""OPTIONAL (needs ``torch`` and ``transformers``; skipped with the reason when either is
absent): grouped-query attention and tied embeddings against Hugging Face's
``LlamaForCausalLM`` in both directions — riftco's saves load into ``transformers`` with
logits within 1e-5, and ``save_pretrained`` of a tiny random GQA/tied Llama loads into riftco
with logits within 1e-5 (both in float32, eager attention)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

import riftco

torch: Any = pytest.importorskip("torch", reason="PyTorch is optional and not installed here")
transformers: Any = pytest.importorskip(
    "transformers", reason="transformers is optional and not installed here"
)

TOKENS = [3, 17, 42, 8, 63, 0, 25, 9, 11, 30, 5]


def hf_logits(model: Any) -> np.ndarray[Any, Any]:
    with torch.no_grad():
        out = model(torch.tensor([TOKENS], dtype=torch.long)).logits
    logits: np.ndarray[Any, Any] = out[0].to(torch.float32).numpy()
    return logits


@pytest.mark.parametrize(("n_kv_heads", "tied"), [(2, True), (1, False), (2, False), (4, True)])
def test_riftco_saves_load_into_llama_for_causal_lm(
    tmp_path: Path, n_kv_heads: int, tied: bool
) -> None:
    config = riftco.TransformerConfig(
        64, 32, 4, 2, 48, 24, seed=3, n_kv_heads=n_kv_heads, tie_word_embeddings=tied
    )
    model = riftco.DecoderOnlyTransformer(config)
    model.save(tmp_path / "model.safetensors")
    theirs = transformers.LlamaForCausalLM.from_pretrained(
        tmp_path, attn_implementation="eager", torch_dtype=torch.float32
    ).eval()
    assert theirs.config.num_key_value_heads == n_kv_heads
    assert theirs.config.tie_word_embeddings == tied
    ours = model.logits(np.array([TOKENS], dtype=np.int64)).numpy()
    err = float(np.max(np.abs(ours - hf_logits(theirs))))
    assert err < 1e-5, f"max |riftco - transformers| = {err}"


@pytest.mark.parametrize(("n_kv_heads", "tied"), [(2, True), (1, True), (2, False)])
def test_save_pretrained_of_a_gqa_tied_llama_loads_into_riftco(
    tmp_path: Path, n_kv_heads: int, tied: bool
) -> None:
    torch.manual_seed(0)
    hf_config = transformers.LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=n_kv_heads,
        max_position_embeddings=24,
        rms_norm_eps=1e-5,
        tie_word_embeddings=tied,
    )
    theirs = transformers.LlamaForCausalLM(hf_config).to(torch.float32).eval()
    theirs.config._attn_implementation = "eager"
    theirs.save_pretrained(tmp_path, safe_serialization=True)
    ours = riftco.DecoderOnlyTransformer.load(tmp_path / "model.safetensors")
    assert ours.config.n_kv_heads == n_kv_heads
    assert ours.config.tie_word_embeddings == tied
    got = ours.logits(np.array([TOKENS], dtype=np.int64)).numpy()
    err = float(np.max(np.abs(got - hf_logits(theirs))))
    assert err < 1e-5, f"max |riftco - transformers| = {err}"


def test_lora_adapters_of_a_gqa_tied_model_load_in_peft(tmp_path: Path) -> None:
    peft: Any = pytest.importorskip("peft", reason="peft is optional and not installed here")
    config = riftco.TransformerConfig(
        64, 32, 4, 2, 48, 24, seed=4, n_kv_heads=2, tie_word_embeddings=True
    )
    model = riftco.DecoderOnlyTransformer(config)
    (tmp_path / "base").mkdir()
    model.save(tmp_path / "base" / "model.safetensors")
    model.enable_lora(rank=2, alpha=4.0, mlp=True, seed=1)
    opt = riftco.Adam(model.parameters(), lr=1e-2)
    for _ in range(3):  # B starts at zero: train a few steps so the adapters matter
        model.loss(np.array([TOKENS + [1]], dtype=np.int64)).backward()
        opt.step()
    model.save_lora(tmp_path / "adapter")
    base = transformers.LlamaForCausalLM.from_pretrained(
        tmp_path / "base", attn_implementation="eager", torch_dtype=torch.float32
    )
    theirs = peft.PeftModel.from_pretrained(base, tmp_path / "adapter").eval()
    ours = model.logits(np.array([TOKENS], dtype=np.int64)).numpy()
    err = float(np.max(np.abs(ours - hf_logits(theirs))))
    assert err < 1e-5, f"max |riftco - peft| = {err}"
