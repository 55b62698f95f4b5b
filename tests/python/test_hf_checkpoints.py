"""Tiny random ``transformers.LlamaForCausalLM`` checkpoints written by ``save_pretrained`` load
into riftco: every combination of attention {multi-head 2 heads, grouped-query 4 heads on 2
key/value heads} x {untied, tied embeddings} x dtype {float32, bfloat16} x {one file, 2 shards} x
RoPE {default, llama3} gives logits within 1e-5 of Hugging Face's (both computed in float32), loss
and gradients within 1e-5, identical greedy generation; and riftco's saves (float32 and
bfloat16) load back into Hugging Face with the same logits.

The architecture axis is the parameter list ``ARCHITECTURES``.
Skipped, with the reason, when ``torch`` or ``transformers`` is not installed (optional test
dependencies).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

import riftco

torch = pytest.importorskip("torch", reason="torch is not installed: HF checkpoint tests skipped")
transformers = pytest.importorskip(
    "transformers", reason="transformers is not installed: HF checkpoint tests skipped"
)

# (num_attention_heads, num_key_value_heads, tie_word_embeddings)
ARCHITECTURES = [(2, 2, False), (2, 2, True), (4, 2, False), (4, 2, True)]
ROPES: dict[str, dict[str, Any]] = {
    "default": {"rope_type": "default", "rope_theta": 10000.0},
    "llama3": {
        "rope_type": "llama3",
        "rope_theta": 10000.0,
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 32,
    },
}
VOCAB, SEQ = 256, 24


def hf_model(arch: tuple[int, int, bool], rope: str, seed: int) -> Any:
    heads, kv_heads, tied = arch
    config = transformers.LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=64,
        rms_norm_eps=1e-5,
        rope_parameters=dict(ROPES[rope]),
        tie_word_embeddings=tied,
        bos_token_id=1,
        eos_token_id=2,
    )
    torch.manual_seed(seed)
    model = transformers.LlamaForCausalLM(config)
    # Larger than the default init (std 0.02), so that the logits and gradients are not tiny.
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.2)
    return model.eval()


def tokens(seed: int) -> npt.NDArray[np.int64]:
    return np.random.default_rng(seed).integers(0, VOCAB, (2, SEQ + 1)).astype(np.int64)


def hf_logits(model: Any, t: npt.NDArray[np.int64]) -> npt.NDArray[np.float32]:
    with torch.no_grad():
        out = model(torch.tensor(t)).logits
    return np.asarray(out.float().reshape(-1, VOCAB).numpy(), dtype=np.float32)


@pytest.mark.parametrize("arch", ARCHITECTURES, ids=lambda a: f"h{a[0]}kv{a[1]}{'tied' if a[2] else ''}")
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("shards", [1, 2])
@pytest.mark.parametrize("rope", list(ROPES))
def test_save_pretrained_checkpoints_load_into_riftco(
    tmp_path: Path, arch: tuple[int, int, bool], dtype: str, shards: int, rope: str
) -> None:
    theirs = hf_model(arch, rope, seed=len(rope) + shards)
    folder = tmp_path / "hf"
    saved = theirs.to(getattr(torch, dtype))
    # 2 shards: a limit below the model's size (~160 KB in float32 untied, ~128 KB tied) and
    # above its largest tensor (the 32 KB embedding).
    limit = {("float32", False): "100KB", ("float32", True): "80KB"}.get((dtype, arch[2]))
    limit = limit or ("50KB" if not arch[2] else "40KB")
    saved.save_pretrained(folder, max_shard_size=limit if shards == 2 else "1GB")
    index = folder / "model.safetensors.index.json"
    if shards == 2:
        assert len(set(json.loads(index.read_text())["weight_map"].values())) == 2
    else:
        assert not index.exists()
    # Hugging Face's reference in float32, read from the same files (bf16 -> f32 is exact). Not
    # `.to(torch.float32)` of the bf16 model: that keeps the RoPE inverse frequencies rounded to
    # bf16 by the first cast (a non-persistent buffer), which from_pretrained recomputes.
    theirs = transformers.LlamaForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()

    ours = riftco.load_model(folder)
    assert ours.config.rope_scaling == {
        k: v for k, v in ROPES[rope].items() if k != "rope_theta"
    }
    assert ours.bos_token_id == 1 and ours.eos_token_ids == [2]
    t = tokens(0)
    np.testing.assert_allclose(ours.logits(t).numpy(), hf_logits(theirs, t), rtol=0, atol=1e-5)

    # Loss and gradients: mean next-token cross-entropy over tokens[:, 1:].
    loss = ours.loss(t)
    loss.backward()
    out = theirs(torch.tensor(t), labels=torch.tensor(t))
    out.loss.backward()
    assert abs(float(loss) - out.loss.item()) < 1e-5
    grads = dict(theirs.named_parameters())
    for name, p in ours.named_parameters():
        grad = p.grad
        assert grad is not None, name
        np.testing.assert_allclose(grad, grads[name].grad.numpy(), rtol=0, atol=1e-5, err_msg=name)

    # Greedy generation: riftco.generate (bytes) against HF generate, stopping at eos (id 2).
    prompt = bytes(t[0, :5].tolist())
    ours_text = riftco.generate(ours, prompt, 12, temperature=0.0)
    with torch.no_grad():
        ids = theirs.generate(
            torch.tensor([list(prompt)]), max_new_tokens=12, do_sample=False, eos_token_id=2,
            pad_token_id=0,
        )[0, len(prompt) :].tolist()
    if 2 in ids:
        ids = ids[: ids.index(2)]
    assert list(ours_text) == ids


@pytest.mark.parametrize("arch", ARCHITECTURES, ids=lambda a: f"h{a[0]}kv{a[1]}{'tied' if a[2] else ''}")
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("rope", list(ROPES))
def test_riftco_saves_load_into_transformers(
    tmp_path: Path, arch: tuple[int, int, bool], dtype: str, rope: str
) -> None:
    source = tmp_path / "hf"
    hf_model(arch, rope, seed=7).save_pretrained(source)
    ours = riftco.load_model(source)
    out = tmp_path / "riftco"
    out.mkdir()
    ours.save(out / "model.safetensors", dtype=dtype)
    theirs = transformers.LlamaForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    assert theirs.config.rope_parameters["rope_type"] == rope
    back = riftco.load_model(out)  # the rounded values when bfloat16
    t = tokens(1)
    np.testing.assert_allclose(back.logits(t).numpy(), hf_logits(theirs, t), rtol=0, atol=1e-5)
    if dtype == "float32":
        np.testing.assert_allclose(ours.logits(t).numpy(), hf_logits(theirs, t), rtol=0, atol=1e-5)
