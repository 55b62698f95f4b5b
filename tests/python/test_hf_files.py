"""Hugging Face checkpoint files written here with NumPy (no ``safetensors`` or ``transformers``
package): bf16/f16 tensors loaded exactly (bit patterns), sharded folders, bf16 saves, the bad
inputs named, and the logits of default/linear/llama3-RoPE models against a NumPy float64
reference forward (the RoPE frequencies by the formulas of Su et al. 2021, Chen et al. 2023 and
Llama 3.1)."""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

import riftco

SMALL: dict[str, Any] = dict(vocab_size=64, d_model=32, n_heads=2, n_layers=2, d_ff=48, max_seq_len=32, seed=3)


def write_safetensors(path: Path, tensors: dict[str, tuple[str, npt.NDArray[Any]]]) -> None:
    """A safetensors file: 8-byte little-endian header length, JSON header, then the data."""
    header: dict[str, Any] = {}
    blobs = []
    offset = 0
    for name, (dtype, array) in tensors.items():
        data = np.ascontiguousarray(array).astype(array.dtype.newbyteorder("<")).tobytes()
        header[name] = {
            "dtype": dtype,
            "shape": list(array.shape),
            "data_offsets": [offset, offset + len(data)],
        }
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    path.write_bytes(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def plain_config(model: riftco.DecoderOnlyTransformer, folder: Path, **edit: Any) -> None:
    """The config.json riftco writes, without its riftco key (a plain Hugging Face config)."""
    model.save(folder / "saved.safetensors")
    hf = json.loads((folder / "config.json").read_text())
    hf.pop("riftco")
    hf.update(edit)
    (folder / "config.json").write_text(json.dumps(hf))
    (folder / "saved.safetensors").unlink()


def params(model: riftco.DecoderOnlyTransformer) -> dict[str, npt.NDArray[np.float32]]:
    return {n: p.numpy().copy() for n, p in model.named_parameters()}


def bf16_round(x: npt.NDArray[np.float32]) -> npt.NDArray[np.uint16]:
    """f32 -> bf16 bits, round to nearest, ties to even (finite values)."""
    b = x.view(np.uint32).astype(np.uint64)
    return ((b + 0x7FFF + ((b >> 16) & 1)) >> 16).astype(np.uint16)


def bf16_to_f32(bits: npt.NDArray[np.uint16]) -> npt.NDArray[np.float32]:
    return (bits.astype(np.uint32) << 16).view(np.float32)


def model(**kw: Any) -> riftco.DecoderOnlyTransformer:
    return riftco.DecoderOnlyTransformer(riftco.TransformerConfig(**{**SMALL, **kw}))


def test_bf16_and_f16_files_load_exactly(tmp_path: Path) -> None:
    m = model()
    p = params(m)
    rng = np.random.default_rng(0)
    for dtype in ("BF16", "F16"):
        folder = tmp_path / dtype
        folder.mkdir()
        plain_config(m, folder, torch_dtype="bfloat16" if dtype == "BF16" else "float16")
        tensors: dict[str, tuple[str, npt.NDArray[Any]]] = {}
        want: dict[str, npt.NDArray[np.float32]] = {}
        for i, (name, v) in enumerate(p.items()):
            if dtype == "BF16":
                bits = bf16_round(v * np.float32(rng.uniform(0.5, 2)))
                if i == 0:  # the smallest subnormal, both infinities, -0, a NaN payload
                    bits.flat[:5] = [0x0001, 0x7F80, 0xFF80, 0x8000, 0x7FA1]
                tensors[name] = ("BF16", bits)
                want[name] = bf16_to_f32(bits)
            else:
                h = v.astype(np.float16)
                if i == 0:
                    h.flat[:5] = np.array([0x0001, 0x7C00, 0xFC00, 0x8000, 0x83FF], np.uint16).view(
                        np.float16
                    )
                tensors[name] = ("F16", h)
                want[name] = h.astype(np.float32)  # IEEE binary16 -> binary32 is exact
        write_safetensors(folder / "model.safetensors", tensors)
        back = params(riftco.load_model(folder))
        for name in p:
            np.testing.assert_array_equal(
                back[name].view(np.uint32), want[name].view(np.uint32), err_msg=f"{dtype} {name}"
            )
        first = back[next(iter(p))].flat
        assert first[1] == np.inf and first[2] == -np.inf
        assert first[0] != 0 and abs(first[0]) < 1e-7


def test_bf16_save_round_trip_equals_the_rounded_values(tmp_path: Path) -> None:
    m = model()
    m.save(tmp_path / "model.safetensors", dtype="bfloat16")
    hf = json.loads((tmp_path / "config.json").read_text())
    assert hf["torch_dtype"] == "bfloat16"
    raw = (tmp_path / "model.safetensors").read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + n])
    assert {v["dtype"] for k, v in header.items() if k != "__metadata__"} == {"BF16"}
    back = params(riftco.load_model(tmp_path))
    changed = False
    for name, v in params(m).items():
        rounded = bf16_to_f32(bf16_round(v))
        changed |= not np.array_equal(rounded, v)
        np.testing.assert_array_equal(back[name].view(np.uint32), rounded.view(np.uint32))
    assert changed
    with pytest.raises(riftco.ConfigError, match="'float64'|\"float64\""):
        m.save(tmp_path / "x.safetensors", dtype="float64")


def write_shards(folder: Path, m: riftco.DecoderOnlyTransformer) -> dict[str, Any]:
    plain_config(m, folder)
    p = list(params(m).items())
    weight_map = {}
    for k, part in enumerate((p[: len(p) // 2], p[len(p) // 2 :])):
        file = f"model-0000{k + 1}-of-00002.safetensors"
        write_safetensors(folder / file, {n: ("F32", v) for n, v in part})
        weight_map.update({n: file for n, _ in part})
    index = {"metadata": {"total_size": 0}, "weight_map": weight_map}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    return index


def test_sharded_folder_loads_equal_to_the_single_file(tmp_path: Path) -> None:
    m = model()
    write_shards(tmp_path, m)
    back = riftco.load_model(tmp_path)
    for name, v in params(m).items():
        np.testing.assert_array_equal(params(back)[name].view(np.uint32), v.view(np.uint32))
    tokens = np.arange(12, dtype=np.int64).reshape(1, 12)
    np.testing.assert_array_equal(back.logits(tokens).numpy(), m.logits(tokens).numpy())


def test_a_folder_without_model_state_says_what_it_looked_for(tmp_path: Path) -> None:
    with pytest.raises(riftco.ModelStateError, match="model.safetensors.index.json"):
        riftco.load_model(tmp_path)


@pytest.mark.parametrize(
    "case, needle",
    [
        ("missing", "does not exist"),
        ("escape", "inside the folder"),
        ("twice", "mapped twice"),
        ("not-held", "does not hold it"),
        ("f64", "F64"),
        ("yarn", '"yarn"'),
        ("dtype", "float64"),
    ],
)
def test_bad_checkpoints_are_refused_by_name(tmp_path: Path, case: str, needle: str) -> None:
    m = model()
    index = write_shards(tmp_path, m)
    names = list(index["weight_map"])
    text = None
    if case == "missing":
        (tmp_path / "model-00002-of-00002.safetensors").unlink()
    elif case == "escape":
        index["weight_map"][names[-1]] = "../x.safetensors"
    elif case == "twice":
        text = json.dumps(index).replace(
            '"weight_map": {', f'"weight_map": {{"{names[0]}": "model-00002-of-00002.safetensors", ', 1
        )
    elif case == "not-held":
        index["weight_map"][names[0]] = "model-00002-of-00002.safetensors"
    elif case == "f64":
        p = list(params(m).items())[len(names) // 2 :]
        write_safetensors(
            tmp_path / "model-00002-of-00002.safetensors",
            {n: ("F64" if i == 0 else "F32", v.astype(np.float64) if i == 0 else v) for i, (n, v) in enumerate(p)},
        )
        needle = f"{p[0][0]} has dtype F64"
    elif case == "yarn":
        plain_config(m, tmp_path, rope_parameters={"rope_type": "yarn", "factor": 4.0})
    elif case == "dtype":
        plain_config(m, tmp_path, torch_dtype="float64")
    (tmp_path / "model.safetensors.index.json").write_text(text or json.dumps(index))
    with pytest.raises(riftco.ModelStateError) as e:
        riftco.load_model(tmp_path)
    assert needle in str(e.value)
    if case in ("twice", "not-held"):
        assert names[0] in str(e.value)


# --- NumPy float64 reference forward ------------------------------------------------------------


def inverse_frequencies(d_head: int, theta: float, scaling: dict[str, Any]) -> npt.NDArray[np.float64]:
    """RoPE inverse frequencies ``theta^(-2i/d)``, scaled: linear divides by ``factor``; llama3
    keeps wavelengths below ``L/high_freq_factor``, divides those above ``L/low_freq_factor`` by
    ``factor`` and blends in between with ``s = (L/wavelength - low) / (high - low)``."""
    f = theta ** (-np.arange(0, d_head, 2, dtype=np.float64) / d_head)
    kind = scaling["rope_type"]
    if kind == "linear":
        return f / float(scaling["factor"])
    if kind == "llama3":
        factor, low, high = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
        context = scaling["original_max_position_embeddings"]
        wavelen = 2 * math.pi / f
        s = (context / wavelen - low) / (high - low)
        blended = (1 - s) * f / factor + s * f
        return np.asarray(
            np.where(
                wavelen < context / high, f, np.where(wavelen > context / low, f / factor, blended)
            ),
            dtype=np.float64,
        )
    return f


def reference_logits(
    p: dict[str, npt.NDArray[np.float32]], cfg: riftco.TransformerConfig, tokens: list[int]
) -> npt.NDArray[np.float64]:
    """Llama forward in float64: RMSNorm, rotate-half RoPE, causal softmax attention, SwiGLU."""
    w = {k: v.astype(np.float64) for k, v in p.items()}
    eps, h, d = float(cfg.rms_norm_eps), cfg.n_heads, cfg.d_head
    seq = len(tokens)

    def norm(x: npt.NDArray[np.float64], g: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
        return np.asarray(x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * g, np.float64)

    angles = np.arange(seq)[:, None] * inverse_frequencies(d, cfg.rope_theta, cfg.rope_scaling)
    cos, sin = np.cos(angles)[:, None, :], np.sin(angles)[:, None, :]

    def rope(x: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
        a, b = x[..., : d // 2], x[..., d // 2 :]
        return np.concatenate([a * cos - b * sin, b * cos + a * sin], -1)

    x = w["model.embed_tokens.weight"][tokens]
    mask = np.triu(np.full((seq, seq), -np.inf), 1)
    for i in range(cfg.n_layers):
        pre = f"model.layers.{i}."
        y = norm(x, w[pre + "input_layernorm.weight"])
        q, k, v = (
            (y @ w[pre + f"self_attn.{n}_proj.weight"].T).reshape(seq, h, d) for n in "qkv"
        )
        q, k = rope(q), rope(k)
        s = np.einsum("qhd,khd->hqk", q, k) / math.sqrt(d) + mask
        a = np.exp(s - s.max(-1, keepdims=True))
        a /= a.sum(-1, keepdims=True)
        o = np.einsum("hqk,khd->qhd", a, v).reshape(seq, h * d)
        x = x + o @ w[pre + "self_attn.o_proj.weight"].T
        y = norm(x, w[pre + "post_attention_layernorm.weight"])
        g, u = y @ w[pre + "mlp.gate_proj.weight"].T, y @ w[pre + "mlp.up_proj.weight"].T
        x = x + (g / (1 + np.exp(-g)) * u) @ w[pre + "mlp.down_proj.weight"].T
    return np.asarray(norm(x, w["model.norm.weight"]) @ w["lm_head.weight"].T, dtype=np.float64)


LLAMA3 = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 32,
}


def test_llama3_parameters_here_reach_every_regime() -> None:
    # d_head 16, theta 10000: wavelengths 6.3 (kept, < 32/4), 19.9 (blended), 62.8.. (divided).
    f = inverse_frequencies(16, 10000.0, LLAMA3)
    plain = inverse_frequencies(16, 10000.0, {"rope_type": "default"})
    assert f[0] == plain[0] and plain[1] / 8 < f[1] < plain[1]
    np.testing.assert_array_equal(f[2:], plain[2:] / 8)


@pytest.mark.parametrize(
    "scaling", [{"rope_type": "default"}, {"rope_type": "linear", "factor": 4.0}, LLAMA3]
)
def test_logits_match_a_numpy_float64_forward(tmp_path: Path, scaling: dict[str, Any]) -> None:
    m = model()
    # A plain HF folder: the scaling comes from config.json's rope_parameters.
    plain_config(m, tmp_path, rope_parameters={**scaling, "rope_theta": 10000.0}, rope_scaling=None)
    write_safetensors(tmp_path / "model.safetensors", {n: ("F32", v) for n, v in params(m).items()})
    back = riftco.load_model(tmp_path)
    assert back.config.rope_scaling == scaling
    tokens = [int(t) for t in np.random.default_rng(1).integers(0, 64, 30)]
    got = back.logits(np.array([tokens], dtype=np.int64)).numpy()  # [seq, vocab]
    want = reference_logits(params(back), back.config, tokens)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)
    if scaling["rope_type"] != "default":
        # The scaling matters at these positions: the unscaled model differs.
        assert np.abs(m.logits(np.array([tokens], dtype=np.int64)).numpy() - want).max() > 1e-3
    # Saved again, the scaling survives in config.json (transformers-5 form) and loads back.
    (tmp_path / "again").mkdir()
    back.save(tmp_path / "again" / "model.safetensors")
    hf = json.loads((tmp_path / "again" / "config.json").read_text())
    assert hf["rope_parameters"] == {**scaling, "rope_theta": 10000.0}
    assert riftco.load_model(tmp_path / "again").config.rope_scaling == scaling


def test_python_config_carries_rope_scaling_and_token_ids() -> None:
    c = riftco.TransformerConfig(**SMALL, rope_scaling=LLAMA3, bos_token_id=1, eos_token_ids=[2, 3])
    assert c.rope_scaling == LLAMA3 and c.bos_token_id == 1 and c.eos_token_ids == [2, 3]
    assert riftco.TransformerConfig.from_dict(c.to_dict()) == c
    m = riftco.DecoderOnlyTransformer(c)
    assert m.bos_token_id == 1 and m.eos_token_ids == [2, 3]
    with pytest.raises(riftco.ConfigError, match="yarn"):
        riftco.TransformerConfig(**SMALL, rope_scaling={"rope_type": "yarn", "factor": 2.0})
    with pytest.raises(riftco.ConfigError, match="factor = 0"):
        riftco.TransformerConfig(**SMALL, rope_scaling={"rope_type": "linear", "factor": 0.0})
    with pytest.raises(riftco.ConfigError, match="eos_token_ids"):
        riftco.TransformerConfig(**SMALL, eos_token_ids=[64])


def test_generation_stops_at_eos(tmp_path: Path) -> None:
    m = model(vocab_size=256)
    free = riftco.generate(m, "ab", 12, temperature=0.0)
    assert len(free) == 12
    eos = free[4]
    first = free.index(eos)
    folder = tmp_path / "eos"
    folder.mkdir()
    plain_config(m, folder, eos_token_id=eos, bos_token_id=1)
    write_safetensors(folder / "model.safetensors", {n: ("F32", v) for n, v in params(m).items()})
    back = riftco.load_model(folder)
    assert back.eos_token_ids == [eos] and back.bos_token_id == 1
    assert riftco.generate(back, "ab", 12, temperature=0.0) == free[:first]
