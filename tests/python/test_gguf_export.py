"""GGUF out (``riftco export``, :mod:`riftco.data.gguf_export`), read back with the ``gguf``
package (llama.cpp's own reader): the LoRA adapter's metadata, names, shapes and values (``A``
as is, ``B`` with llama.cpp's Q/K row order), the merged model's metadata, tokenizer keys and
tensors (F32 bitwise riftco's merged weights once the Q/K rows are put back; quantized types
bitwise ``gguf.quants.quantize`` of them; the base file's own types), bad input refused with
nothing written, and, where they are present, the real SmolLM2-135M-Instruct GGUF and
llama.cpp (``llama-cpp-python``) running the exported files.

The tiny base GGUF files here are written with ``gguf.GGUFWriter`` directly, their Q and K rows
permuted by the index formula of llama.cpp's converter written out below, independently of the
code under test.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

import riftco
from real_models import SMOLLM2, SMOLLM2_MISSING

try:
    import gguf
    from gguf import GGMLQuantizationType as Q
except ImportError:  # pragma: no cover - depends on the environment
    pytest.skip(
        "the gguf package is not installed (pip install 'riftco[gguf]'): GGUF export writes "
        "with it and the tests read back with it",
        allow_module_level=True,
    )

from riftco.data.gguf_export import (
    GGUF_EXPORT_TYPES,
    export_lora_adapter,
    export_merged_model,
)

ROOT = Path(__file__).resolve().parents[2]
EPS32 = float(np.finfo(np.float32).eps)

PROJ = {
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}

# The tiny model: GQA (4 heads, 2 K/V heads of 16), two layers, d_ff a multiple of 256 so a
# K-quant fits its rows.
D_MODEL, N_HEADS, N_KV, N_LAYERS, D_FF = 64, 4, 2, 2, 256
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def byte_alphabet() -> list[str]:
    """GPT-2's 256 byte spellings (``bytes_to_unicode``), in byte order."""
    keep = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
    out, k = {}, 0
    for b in range(256):
        if b in keep:
            out[b] = chr(b)
        else:
            out[b] = chr(256 + k)
            k += 1
    return [out[b] for b in range(256)]


TOKENS = [*SPECIAL, *byte_alphabet(), "Ġt", "he"]
VOCAB = len(TOKENS)
TOKENIZER_KV: dict[str, Any] = {
    "tokenizer.ggml.model": "gpt2",
    "tokenizer.ggml.pre": "gpt-2",
    "tokenizer.ggml.tokens": TOKENS,
    "tokenizer.ggml.token_type": (
        [3] * len(SPECIAL) + [1] * (VOCAB - len(SPECIAL)),
        gguf.GGUFValueType.ARRAY,
        gguf.GGUFValueType.INT32,
    ),
    "tokenizer.ggml.merges": ["Ġ t", "h e"],
    "tokenizer.ggml.bos_token_id": 1,
    "tokenizer.ggml.eos_token_id": 2,
    "tokenizer.chat_template": "{% for m in messages %}<|im_start|>{{ m['content'] }}<|im_end|>{% endfor %}",
}

# The base file's type of each tensor (short name); the norms are F32.
BASE_TYPES = {
    "token_embd": Q.Q8_0,
    "attn_q": Q.Q4_1,
    "attn_k": Q.Q5_0,
    "attn_v": Q.Q8_0,
    "attn_output": Q.F16,
    "ffn_gate": Q.Q4_0,
    "ffn_up": Q.Q5_1,
    "ffn_down": Q.F32,
    "output": Q.Q8_0,
}


def converter_rows(rows: int, n_head: int) -> npt.NDArray[np.intp]:
    """``order[r]``: the Hugging Face row that llama.cpp's converter stores at row ``r``
    (``LlamaModel.permute``: file row ``h·d + 2i + j`` is row ``h·d + j·d/2 + i``)."""
    d = rows // n_head
    order = np.empty(rows, dtype=np.intp)
    for h in range(n_head):
        for i in range(d // 2):
            for j in range(2):
                order[h * d + 2 * i + j] = h * d + j * (d // 2) + i
    return order


def hf_weights(rng: np.random.Generator, d_ff: int = D_FF) -> dict[str, npt.NDArray[np.float32]]:
    """Random weights of the tiny model under llama.cpp's names, in Hugging Face row order."""
    d_kv = D_MODEL // N_HEADS * N_KV

    def w(*shape: int) -> npt.NDArray[np.float32]:
        return (rng.standard_normal(shape) * 0.1).astype(np.float32)

    out = {"token_embd": w(VOCAB, D_MODEL), "output_norm": 1 + w(D_MODEL), "output": w(VOCAB, D_MODEL)}
    for n in range(N_LAYERS):
        out |= {
            f"blk.{n}.attn_norm": 1 + w(D_MODEL),
            f"blk.{n}.attn_q": w(D_MODEL, D_MODEL),
            f"blk.{n}.attn_k": w(d_kv, D_MODEL),
            f"blk.{n}.attn_v": w(d_kv, D_MODEL),
            f"blk.{n}.attn_output": w(D_MODEL, D_MODEL),
            f"blk.{n}.ffn_norm": 1 + w(D_MODEL),
            f"blk.{n}.ffn_gate": w(d_ff, D_MODEL),
            f"blk.{n}.ffn_up": w(d_ff, D_MODEL),
            f"blk.{n}.ffn_down": w(D_MODEL, d_ff),
        }
    return out


def write_base(
    path: Path, seed: int = 0, d_ff: int = D_FF, types: dict[str, Q] | None = None
) -> None:
    """A tiny ``llama`` GGUF as llama.cpp's converter writes one: Q/K rows permuted, each
    matrix stored in ``types`` (default :data:`BASE_TYPES`), the norms F32, a GPT-2 vocabulary."""
    types = BASE_TYPES if types is None else types
    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_type("model")
    w.add_name("tiny")
    w.add_file_type(3)
    w.add_uint32("llama.vocab_size", VOCAB)
    w.add_uint32("llama.context_length", 64)
    w.add_uint32("llama.embedding_length", D_MODEL)
    w.add_uint32("llama.block_count", N_LAYERS)
    w.add_uint32("llama.feed_forward_length", d_ff)
    w.add_uint32("llama.rope.dimension_count", D_MODEL // N_HEADS)
    w.add_uint32("llama.attention.head_count", N_HEADS)
    w.add_uint32("llama.attention.head_count_kv", N_KV)
    w.add_float32("llama.attention.layer_norm_rms_epsilon", 1e-5)
    w.add_float32("llama.rope.freq_base", 10000.0)
    for key, value in TOKENIZER_KV.items():
        if isinstance(value, tuple):
            w.add_key_value(key, value[0], value[1], sub_type=value[2])
        elif isinstance(value, int):
            w.add_uint32(key, value)
        elif isinstance(value, str):
            w.add_string(key, value)
        else:
            w.add_array(key, value)
    for name, values in hf_weights(rng, d_ff).items():
        short = name.split(".")[-1]
        if short in ("attn_q", "attn_k"):
            values = values[converter_rows(values.shape[0], N_HEADS if short == "attn_q" else N_KV)]
        qtype = Q.F32 if values.ndim == 1 else types[short]
        if qtype in (Q.F32, Q.F16):
            w.add_tensor(name + ".weight", values.astype(np.float32 if qtype == Q.F32 else np.float16))
        elif qtype == Q.Q4_K:  # no quantizer in gguf: random blocks with small f16 scales
            block, size = gguf.GGML_QUANT_SIZES[qtype]
            raw = rng.integers(0, 256, (values.size // block, size), dtype=np.uint8)
            raw[:, 0:4] = np.full((values.size // block, 2), 1e-3, np.float16).view(np.uint8)
            w.add_tensor(name + ".weight", raw.reshape(values.shape[0], -1), raw_dtype=qtype)
        else:
            w.add_tensor(name + ".weight", gguf.quants.quantize(values, qtype), raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def gguf_of(hf: str) -> str:
    """llama.cpp's name of a Hugging Face Llama parameter (the test's own table)."""
    fixed = {
        "model.embed_tokens.weight": "token_embd.weight",
        "model.norm.weight": "output_norm.weight",
        "lm_head.weight": "output.weight",
    }
    if hf in fixed:
        return fixed[hf]
    _, _, n, *inner, _ = hf.split(".")
    module = ".".join(inner)
    norms = {"input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm"}
    return f"blk.{n}.{PROJ.get(module) or norms[module]}.weight"


def heads_of(hf: str, config: riftco.TransformerConfig) -> int | None:
    if ".q_proj." in hf:
        return int(config.n_heads)
    if ".k_proj." in hf:
        return int(config.n_kv_heads)
    return None


def in_file_order(values: npt.NDArray[np.float32], heads: int | None) -> npt.NDArray[np.float32]:
    return values if heads is None else values[converter_rows(values.shape[0], heads)]


def bits(a: npt.NDArray[Any]) -> npt.NDArray[np.uint32]:
    return np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)


def tensors_of(path: Path) -> dict[str, Any]:
    return {t.name: t for t in gguf.GGUFReader(str(path)).tensors}


def fields_of(path: Path) -> dict[str, Any]:
    return {k: f for k, f in gguf.GGUFReader(str(path)).fields.items() if not k.startswith("GGUF.")}


def with_lora(model: riftco.DecoderOnlyTransformer, rank: int = 4, alpha: float = 8.0) -> None:
    """Adapters on every projection with random (nonzero) ``B``, as after training."""
    model.enable_lora(rank=rank, alpha=alpha, mlp=True, seed=3)
    rng = np.random.default_rng(7)
    for name, p in model.named_lora_parameters():
        if "lora_B" in name:
            p.copy_((rng.standard_normal(p.shape) * 0.05).astype(np.float32))


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("base") / "tiny.gguf"
    write_base(path)
    return path


def tuned(base: Path) -> riftco.DecoderOnlyTransformer:
    model = riftco.load_model(base)
    with_lora(model)
    return model


# -- the adapter -----------------------------------------------------------------------------


def test_adapter_metadata_names_shapes_and_values(base: Path, tmp_path: Path) -> None:
    model = tuned(base)
    lora = dict(model.named_lora_parameters())
    out = tmp_path / "adapter.gguf"
    result = export_lora_adapter(model, out)
    assert result.path == out and out.stat().st_size == result.n_bytes

    fields = fields_of(out)
    assert fields["general.architecture"].contents() == "llama"
    assert fields["general.type"].contents() == "adapter"
    assert fields["adapter.type"].contents() == "lora"
    assert fields["adapter.lora.alpha"].types == [gguf.GGUFValueType.FLOAT32]
    assert fields["adapter.lora.alpha"].contents() == 8.0

    tensors = tensors_of(out)
    expected = {
        f"blk.{n}.{short}.weight.lora_{ab}"
        for n in range(N_LAYERS)
        for short in PROJ.values()
        for ab in "ab"
    }
    assert set(tensors) == expected
    config = model.config
    base_tensors = tensors_of(base)
    for n in range(N_LAYERS):
        for module, short in PROJ.items():
            peft = f"base_model.model.model.layers.{n}.{module}"
            a = lora[f"{peft}.lora_A.weight"].numpy()
            b = lora[f"{peft}.lora_B.weight"].numpy()
            ta, tb = tensors[f"blk.{n}.{short}.weight.lora_a"], tensors[f"blk.{n}.{short}.weight.lora_b"]
            assert ta.tensor_type == Q.F32 and tb.tensor_type == Q.F32
            w = base_tensors[f"blk.{n}.{short}.weight"]
            # llama-adapter.cpp's checks: a.ne[0] == w.ne[0], b.ne[1] == w.ne[1], a.ne[1] == b.ne[0].
            assert ta.shape[0] == w.shape[0] and tb.shape[1] == w.shape[1]
            assert ta.shape[1] == tb.shape[0] == 4
            assert np.array_equal(bits(np.asarray(ta.data)), bits(a))
            heads = heads_of(f"model.layers.{n}.{module}.weight", config)
            assert np.array_equal(bits(np.asarray(tb.data)), bits(in_file_order(b, heads)))


def test_adapter_on_the_base_file_gives_the_merged_file(base: Path, tmp_path: Path) -> None:
    """What llama.cpp computes from the files (base + (alpha / rank) · lora_b @ lora_a, in its
    row order) is the merged file's weight, to the rounding of the two sums: the orientation and
    the Q/K rows of the adapter agree with the base file's."""
    model = tuned(base)
    export_lora_adapter(model, tmp_path / "adapter.gguf")
    export_merged_model(model, tmp_path / "merged.gguf", base_gguf=base)
    adapter, merged = tensors_of(tmp_path / "adapter.gguf"), tensors_of(tmp_path / "merged.gguf")
    base_tensors = tensors_of(base)
    scale = 8.0 / 4
    for name, t in base_tensors.items():
        if f"{name}.lora_a" not in adapter:
            continue
        w = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float64)
        a = np.asarray(adapter[f"{name}.lora_a"].data, dtype=np.float64)
        b = np.asarray(adapter[f"{name}.lora_b"].data, dtype=np.float64)
        got = np.asarray(merged[name].data, dtype=np.float64)
        # f32 rounding of a rank-4 dot product, the scaling and the add: a few ulps of the
        # magnitudes involved.
        bound = 8 * EPS32 * (np.abs(w) + scale * (np.abs(b) @ np.abs(a)))
        assert np.all(np.abs(got - (w + scale * (b @ a))) <= bound), name


# -- the merged model ------------------------------------------------------------------------


def test_merged_f32_is_riftco_merged_weights_with_metadata_and_tokenizer(base: Path, tmp_path: Path) -> None:
    model = tuned(base)
    # The export merges into the base dequantized: the reference merges into the float32 load.
    reference = riftco.load_model(base, dtype="float32")
    with_lora(reference)
    reference.merge_lora()
    merged = dict(reference.named_parameters())
    out = tmp_path / "merged.gguf"
    result = export_merged_model(model, out, base_gguf=base)
    assert not model.has_lora  # merged in place

    tensors = tensors_of(out)
    assert set(tensors) == {gguf_of(hf) for hf in merged}
    assert set(result.tensor_types.values()) == {"F32"}
    config = model.config
    for hf, var in merged.items():
        t = tensors[gguf_of(hf)]
        assert t.tensor_type == Q.F32
        values = np.asarray(t.data).reshape(tuple(reversed([int(s) for s in t.shape])))
        assert values.shape == tuple(var.shape), hf
        heads = heads_of(hf, config)
        assert np.array_equal(bits(values), bits(in_file_order(var.numpy(), heads))), hf

    fields = fields_of(out)
    assert fields["general.architecture"].contents() == "llama"
    assert fields["general.type"].contents() == "model"
    assert fields["general.file_type"].contents() == 0
    assert fields["general.name"].contents() == "tiny"
    llama = {
        "llama.vocab_size": VOCAB,
        "llama.context_length": 64,
        "llama.embedding_length": D_MODEL,
        "llama.block_count": N_LAYERS,
        "llama.feed_forward_length": D_FF,
        "llama.rope.dimension_count": D_MODEL // N_HEADS,
        "llama.attention.head_count": N_HEADS,
        "llama.attention.head_count_kv": N_KV,
    }
    for key, value in llama.items():
        assert fields[key].types == [gguf.GGUFValueType.UINT32] and fields[key].contents() == value, key
    assert fields["llama.attention.layer_norm_rms_epsilon"].contents() == np.float32(1e-5)
    assert fields["llama.rope.freq_base"].contents() == 10000.0
    base_fields = fields_of(base)
    for key in TOKENIZER_KV:
        assert fields[key].types == base_fields[key].types, key
        assert fields[key].contents() == base_fields[key].contents(), key

    # riftco reads it back (its reader puts the Q/K rows back) to the same weights and logits.
    back = riftco.load_model(out)
    for (n1, v1), (n2, v2) in zip(reference.named_parameters(), back.named_parameters()):
        assert n1 == n2 and np.array_equal(bits(v1.numpy()), bits(v2.numpy())), n1
    ids = np.array([[1, 70, 80, 90, 100, 5]])
    assert np.array_equal(bits(reference.logits(ids).numpy()), bits(back.logits(ids).numpy()))
    assert riftco.load_tokenizer(out).encode("the t") == riftco.load_tokenizer(base).encode("the t")


@pytest.mark.parametrize("tensor_type", ["F16", "BF16", "Q8_0", "Q5_1", "Q4_0", "base"])
def test_merged_types_are_the_gguf_quantizers_bytes(base: Path, tmp_path: Path, tensor_type: str) -> None:
    model = tuned(base)
    out = tmp_path / "merged.gguf"
    export_merged_model(model, out, base_gguf=base, tensor_type=tensor_type)
    merged = dict(model.named_parameters())
    base_tensors = tensors_of(base)
    tensors = tensors_of(out)
    config = model.config
    quantized = False
    for hf, var in merged.items():
        name = gguf_of(hf)
        if tensor_type == "base":
            qtype = base_tensors[name].tensor_type
        else:
            qtype = Q.F32 if len(var.shape) == 1 else Q[tensor_type]
        quantized |= qtype not in (Q.F32, Q.F16, Q.BF16)
        t = tensors[name]
        assert t.tensor_type == qtype, name
        values = in_file_order(var.numpy(), heads_of(hf, config))
        want = values if qtype == Q.F32 else gguf.quants.quantize(values, qtype)
        assert np.array_equal(np.asarray(t.data).view(np.uint8).ravel(), np.asarray(want).view(np.uint8).ravel()), name
    fields = fields_of(out)
    assert ("general.quantization_version" in fields) == quantized
    # llama_ftype: the base file's own for its types (3, MOSTLY_Q4_1, as written), else the
    # type's (llama.h).
    file_types = {"F16": 1, "BF16": 32, "Q8_0": 7, "Q5_1": 9, "Q4_0": 2, "base": 3}
    assert fields["general.file_type"].contents() == file_types[tensor_type]


def test_unmodified_base_reexports_the_same_tensor_bytes(base: Path, tmp_path: Path) -> None:
    """No adapter, the base file's types: every tensor's stored bytes are the base file's
    (dequantize -> Q/K rows back -> rows permuted again -> requantize is the identity on these
    types), and so are the tokenizer keys."""
    out = tmp_path / "same.gguf"
    export_merged_model(riftco.load_model(base), out, base_gguf=base, tensor_type="base")
    a, b = tensors_of(base), tensors_of(out)
    assert set(a) == set(b)
    for name in a:
        assert a[name].tensor_type == b[name].tensor_type, name
        assert np.array_equal(np.asarray(a[name].data).view(np.uint8), np.asarray(b[name].data).view(np.uint8)), name


# -- bad input: one clear error, nothing written ---------------------------------------------


def test_bad_input_is_refused_before_anything_is_written(base: Path, tmp_path: Path) -> None:
    model = tuned(base)
    out = tmp_path / "out.gguf"
    with pytest.raises(riftco.ConfigError, match=r"'IQ4_XS'.*F32, F16, BF16, Q8_0.*base"):
        export_merged_model(model, out, base_gguf=base, tensor_type="IQ4_XS")
    with pytest.raises(riftco.ConfigError, match="base GGUF"):
        export_merged_model(model, out, tokenizer_metadata={}, tensor_type="base")
    with pytest.raises(riftco.ModelStateError, match="needs its tokenizer"):
        export_merged_model(model, out)
    with pytest.raises(riftco.LoraError, match="no LoRA adapters"):
        export_lora_adapter(riftco.load_model(base), out)
    other = tmp_path / "other.gguf"
    write_base(other, d_ff=512)
    with pytest.raises(riftco.ModelStateError, match="llama.feed_forward_length is 512 there, 256"):
        export_merged_model(model, out, base_gguf=other)
    assert model.has_lora  # nothing merged either
    assert sorted(p.name for p in tmp_path.iterdir()) == ["other.gguf"]

    out.write_bytes(b"keep")
    with pytest.raises(FileExistsError, match="overwrite"):
        export_merged_model(model, out, base_gguf=base)
    with pytest.raises(FileExistsError, match="overwrite"):
        export_lora_adapter(model, out)
    assert out.read_bytes() == b"keep"
    export_lora_adapter(model, out, overwrite=True)
    assert gguf.GGUFReader(str(out)).fields["general.type"].contents() == "adapter"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["other.gguf", "out.gguf"]


def test_a_k_quant_base_keeps_its_type_with_llama_cpps_bytes(tmp_path: Path) -> None:
    """A base tensor in Q4_K is written in Q4_K under ``"base"``: the bytes of riftco's K-quant
    quantizer (llama.cpp's ``quantize_row_q4_K_ref``, checked bitwise in test_quantize.py) of
    the merged weight, which the gguf package dequantizes back within Q4_K's step."""
    kquant = tmp_path / "kquant.gguf"
    write_base(kquant, types={**BASE_TYPES, "ffn_down": Q.Q4_K})
    model = riftco.load_model(kquant, dtype="float32")
    with_lora(model)
    out = tmp_path / "out.gguf"
    export_merged_model(model, out, base_gguf=kquant, tensor_type="base")
    written = tensors_of(out)["blk.0.ffn_down.weight"]
    assert written.tensor_type == Q.Q4_K
    merged = dict(model.named_parameters())["model.layers.0.mlp.down_proj.weight"].numpy()
    expected = np.frombuffer(riftco.quantize(merged, "q4_k"), np.uint8)
    assert np.array_equal(np.asarray(written.data).reshape(-1), expected)
    back = gguf.quants.dequantize(np.asarray(written.data), Q.Q4_K).reshape(merged.shape)
    # Q4_K: 4-bit quants of 32-element groups with 6-bit scales; the error is within a step.
    assert np.abs(back - merged).max() <= np.abs(merged).max() / 7


def test_rows_not_a_multiple_of_the_block_are_named(tmp_path: Path) -> None:
    config = riftco.TransformerConfig(vocab_size=40, d_model=48, n_heads=4, n_layers=1, d_ff=64, max_seq_len=16)
    model = riftco.DecoderOnlyTransformer(config)
    kv = {k: (v[0] if isinstance(v, tuple) else v) for k, v in TOKENIZER_KV.items()}
    with pytest.raises(riftco.ConfigError, match=r"'token_embd.weight' has rows of 48 values.*Q8_0's block of 32"):
        export_merged_model(model, tmp_path / "q.gguf", tokenizer_metadata=kv, tensor_type="Q8_0")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "rope_scaling",
    [
        {"rope_type": "linear", "factor": 4.0},
        {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
         "original_max_position_embeddings": 8192},
    ],
    ids=lambda s: str(s["rope_type"]),
)
def test_rope_scaling_is_written_as_llama_cpp_reads_it(tmp_path: Path, rope_scaling: dict[str, Any]) -> None:
    """Linear scaling as ``llama.rope.scaling.*`` keys, Llama 3.1's as the ``rope_freqs.weight``
    factors (riftco's reader checks them against the config's to 1e-5): the file reads back to
    the same config and logits."""
    config = riftco.TransformerConfig(vocab_size=VOCAB, d_model=64, n_heads=4, n_layers=1, d_ff=64,
                                      max_seq_len=64, rope_theta=500000.0, rope_scaling=rope_scaling)
    model = riftco.DecoderOnlyTransformer(config)
    kv = {k: (v[0] if isinstance(v, tuple) else v) for k, v in TOKENIZER_KV.items()}
    out = tmp_path / "scaled.gguf"
    export_merged_model(model, out, tokenizer_metadata=kv)
    fields = fields_of(out)
    if rope_scaling["rope_type"] == "linear":
        assert fields["llama.rope.scaling.type"].contents() == "linear"
        assert fields["llama.rope.scaling.factor"].contents() == 4.0
        assert "rope_freqs.weight" not in tensors_of(out)
    else:
        assert "llama.rope.scaling.type" not in fields
        assert tensors_of(out)["rope_freqs.weight"].shape.tolist() == [8]
    back = riftco.load_model(out)
    assert back.config.rope_scaling == model.config.rope_scaling
    ids = np.array([[1, 5, 9, 40, 41]])
    assert np.array_equal(bits(back.logits(ids).numpy()), bits(model.logits(ids).numpy()))


# -- the command -----------------------------------------------------------------------------


def riftco_cmd(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "riftco", "export", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )


def lora_run(folder: Path, base: Path, model: riftco.DecoderOnlyTransformer) -> Path:
    """A LoRA post-training output folder as ``riftco post-train`` leaves it: ``adapter/`` and
    the ``training_metadata.json`` naming the base model and its config."""
    folder.mkdir()
    model.save_lora(str(folder / "adapter"))
    meta = {"base_model": str(base), "model_config": model.config.to_dict(), "fine_tuning_method": "lora"}
    (folder / "training_metadata.json").write_text(json.dumps(meta))
    return folder


def test_command_writes_the_merged_model_and_the_adapter(base: Path, tmp_path: Path) -> None:
    model = tuned(base)
    run = lora_run(tmp_path / "run", base, model)
    out = tmp_path / "merged.gguf"
    r = riftco_cmd("--model", run, "--out", out, "--type", "base")
    assert r.returncode == 0, r.stderr
    assert r.stdout == "" and "model (adapters merged)" in r.stderr and "Q4_1" in r.stderr
    types = {n: t.tensor_type for n, t in tensors_of(out).items()}
    assert types == {n: t.tensor_type for n, t in tensors_of(base).items()}
    model.set_frozen_weights_dtype("float32")
    model.merge_lora()
    back = riftco.load_model(out)
    ids = np.array([[1, 70, 80, 90]])
    assert np.allclose(back.logits(ids).numpy(), model.logits(ids).numpy(), atol=0.5)  # Q4 rounding

    adapter = tmp_path / "adapter.gguf"
    r = riftco_cmd("--model", run, "--adapter", "--out", adapter)
    assert r.returncode == 0, r.stderr
    assert fields_of(adapter)["general.type"].contents() == "adapter"
    assert os.stat(adapter).st_mode & 0o777 == 0o666 & ~current_umask()


def current_umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def test_command_bad_input_exits_2_with_one_line_and_writes_nothing(base: Path, tmp_path: Path) -> None:
    model = tuned(base)
    run = lora_run(tmp_path / "run", base, model)
    other = tmp_path / "other.gguf"
    write_base(other, d_ff=512)
    hf = tmp_path / "hf"
    hf.mkdir()
    riftco.load_model(base).save(str(hf / "model.safetensors"))
    exists = tmp_path / "exists.gguf"
    exists.write_bytes(b"keep")
    bare = tmp_path / "bare"  # an adapter folder alone: no run metadata to compare with
    shutil.copytree(run / "adapter", bare)
    before = sorted(p.name for p in tmp_path.rglob("*"))
    out = tmp_path / "out.gguf"
    cases: list[tuple[list[str | Path], str]] = [
        (["--model", run, "--out", out, "--type", "IQ4_XS"], "--type IQ4_XS: expected one of F32, F16"),
        (["--model", run, "--out", exists], "exists: pass --overwrite"),
        (["--model", run, "--out", out, "--base-model", other],
         "does not match the adapter .*d_ff is 512, the adapter was trained on 256"),
        (["--model", bare, "--base-model", other, "--out", out],
         "adapter .*bare' does not fit the base model .*other.gguf'.*ffn|gate_proj"),
        (["--model", hf, "--out", out], "has no tokenizer \\(a riftco byte-level model\\)"),
        (["--model", hf, "--out", out, "--type", "base"], "has no tokenizer"),
        (["--model", base, "--adapter", "--out", out], "has no LoRA adapter to export"),
        (["--model", run, "--adapter", "--type", "Q8_0", "--out", out], "an adapter is written in F32"),
        (["--model", run, "--out", tmp_path / "missing" / "x.gguf"], "does not exist"),
    ]
    for args, message in cases:
        r = riftco_cmd(*args)
        assert r.returncode == 2, (args, r.stderr)
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("riftco export: error: "), r.stderr
        assert re.search(message, lines[0]), (message, lines[0])
        assert sorted(p.name for p in tmp_path.rglob("*")) == before, args
    assert exists.read_bytes() == b"keep"


def hf_folder(folder: Path, gguf_file: Path) -> Path:
    """A Hugging Face model folder of a GGUF file: the weights (``model.save``), the tokenizer
    riftco rebuilds from the file as ``tokenizer.json``, BOS/EOS and the chat template in
    ``tokenizer_config.json``."""
    folder.mkdir()
    riftco.load_model(gguf_file).save(str(folder / "model.safetensors"))
    backend: Any = riftco.load_tokenizer(gguf_file).backend
    backend.save(str(folder / "tokenizer.json"))
    meta = riftco.read_gguf_metadata(gguf_file)
    tokens = meta["tokenizer.ggml.tokens"]
    config = {
        "bos_token": tokens[meta["tokenizer.ggml.bos_token_id"]],
        "eos_token": tokens[meta["tokenizer.ggml.eos_token_id"]],
        "chat_template": meta["tokenizer.chat_template"],
    }
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return folder


def test_a_hugging_face_base_gets_its_tokenizer_json_as_llama_cpp_keys(base: Path, tmp_path: Path) -> None:
    pytest.importorskip("tokenizers", reason="tokenizer.json is read with the tokenizers package")
    hf = hf_folder(tmp_path / "hf", base)
    model = riftco.load_model(hf)
    with_lora(model)
    run = lora_run(tmp_path / "run", hf / "model.safetensors", model)
    out = tmp_path / "merged.gguf"
    r = riftco_cmd("--model", run, "--out", out, "--type", "Q8_0")
    assert r.returncode == 0, r.stderr
    fields, base_fields = fields_of(out), fields_of(base)
    for key in TOKENIZER_KV:
        if key != "tokenizer.ggml.pre":
            assert fields[key].contents() == base_fields[key].contents(), key
    assert fields["tokenizer.ggml.token_type"].types == base_fields["tokenizer.ggml.token_type"].types
    # The pre-tokenizer picked splits as the base's (both are GPT-2's here).
    assert fields["tokenizer.ggml.pre"].contents() == "gpt-2"
    text = "the tty 123 4567 they're  here!\n"
    assert riftco.load_tokenizer(out).encode(text) == riftco.load_tokenizer(base).encode(text)
    assert tensors_of(out)["blk.1.ffn_up.weight"].tensor_type == Q.Q8_0


def test_a_tokenizer_json_llama_cpp_cannot_take_is_refused_by_kind(tmp_path: Path) -> None:
    tokenizers = pytest.importorskip("tokenizers", reason="tokenizer.json is written with tokenizers")
    from riftco.data.gguf_export import hf_tokenizer_metadata

    word = tokenizers.Tokenizer(tokenizers.models.WordLevel({"a": 0, "[UNK]": 1}, unk_token="[UNK]"))
    word.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    word.save(str(tmp_path / "tokenizer.json"))
    with pytest.raises(riftco.ModelStateError, match="byte-level BPE only.*'WordLevel'.*convert_hf_to_gguf"):
        hf_tokenizer_metadata(tmp_path, 8)
    with pytest.raises(riftco.ModelStateError, match="has no tokenizer.json"):
        hf_tokenizer_metadata(tmp_path / "missing", 8)


# -- the real model --------------------------------------------------------------------------

needs_smollm2 = pytest.mark.skipif(not SMOLLM2.is_file(), reason=SMOLLM2_MISSING)


@needs_smollm2
def test_smollm2_reexported_in_its_own_types_is_the_same_file_content(tmp_path: Path) -> None:
    out = tmp_path / "same.gguf"
    export_merged_model(riftco.load_model(SMOLLM2), out, base_gguf=SMOLLM2, tensor_type="base")
    a, b = gguf.GGUFReader(str(SMOLLM2)), gguf.GGUFReader(str(out))
    fa = {k: (f.types, f.contents()) for k, f in a.fields.items() if not k.startswith("GGUF.")}
    fb = {k: (f.types, f.contents()) for k, f in b.fields.items() if not k.startswith("GGUF.")}
    assert fa == fb
    tb = {t.name: t for t in b.tensors}
    assert len(a.tensors) == len(tb) == 272
    for t in a.tensors:
        assert tb[t.name].tensor_type == t.tensor_type
        assert np.array_equal(np.asarray(t.data).view(np.uint8), np.asarray(tb[t.name].data).view(np.uint8)), t.name


@needs_smollm2
def test_smollm2_adapter_and_merged_f32(tmp_path: Path) -> None:
    model = riftco.load_model(SMOLLM2)
    with_lora(model, rank=8, alpha=16.0)
    lora = {n: p.numpy() for n, p in model.named_lora_parameters()}
    export_lora_adapter(model, tmp_path / "adapter.gguf")
    export_merged_model(model, tmp_path / "merged.gguf", base_gguf=SMOLLM2)
    adapter = tensors_of(tmp_path / "adapter.gguf")
    assert len(adapter) == 30 * 7 * 2
    assert fields_of(tmp_path / "adapter.gguf")["adapter.lora.alpha"].contents() == 16.0
    for n in (0, 29):
        for module, short in PROJ.items():
            peft = f"base_model.model.model.layers.{n}.{module}"
            heads = 9 if short == "attn_q" else 3 if short == "attn_k" else None
            a = np.asarray(adapter[f"blk.{n}.{short}.weight.lora_a"].data)
            b = np.asarray(adapter[f"blk.{n}.{short}.weight.lora_b"].data)
            assert np.array_equal(bits(a), bits(lora[f"{peft}.lora_A.weight"]))
            assert np.array_equal(bits(b), bits(in_file_order(lora[f"{peft}.lora_B.weight"], heads)))
    merged = tensors_of(tmp_path / "merged.gguf")
    config = model.config
    for hf, var in model.named_parameters():
        t = merged[gguf_of(hf)]
        values = np.asarray(t.data).reshape(var.shape)
        assert np.array_equal(bits(values), bits(in_file_order(var.numpy(), heads_of(hf, config)))), hf


# -- llama.cpp -------------------------------------------------------------------------------


def llama_cpp_python() -> str | None:
    """A Python that imports ``llama_cpp``: this one, or ``RIFTCO_LLAMA_CPP_PYTHON`` (a
    reference environment's interpreter); ``None`` when there is none."""
    if importlib.util.find_spec("llama_cpp") is not None:
        return sys.executable
    other = os.environ.get("RIFTCO_LLAMA_CPP_PYTHON")
    if other and subprocess.run([other, "-c", "import llama_cpp"], capture_output=True).returncode == 0:
        return other
    return None


LLAMA_CPP_PYTHON = llama_cpp_python()
needs_llama_cpp = pytest.mark.skipif(
    LLAMA_CPP_PYTHON is None,
    reason="llama-cpp-python is not installed here (pip install --no-binary llama-cpp-python "
    "llama-cpp-python) and RIFTCO_LLAMA_CPP_PYTHON names no Python that has it: the check that "
    "llama.cpp runs the exported files",
)

PROMPTS = [
    "<|im_start|>user\nWrite a short story about a lighthouse keeper.<|im_end|>\n<|im_start|>assistant\n",
    "The three primary colors are",
    "def fibonacci(n):\n",
]
N_NEW = 16

# Greedy continuations by llama.cpp (llama-cpp-python's Llama.generate with top_k=1, no
# repetition penalty), in a separate process: argv = model, LoRA adapter or "", N, then a JSON
# list of prompts as token ids, then a JSON list of texts; prints a JSON object: the
# continuations, and llama.cpp's tokens of the texts (parse_special). The weights stay in the
# plain CPU buffers (use_extra_bufts = false, llama-cli's --no-repack): llama-cpp-python 0.3.36
# built from source on a CPU with AMX repacks quantized weights into its AMX buffer type and then
# crashes with a segmentation fault in llama_decode, on the downloaded SmolLM2 Q4_1 file itself.
LLAMA_CPP_SCRIPT = """
import json, sys
import llama_cpp
import llama_cpp.llama_cpp as lib
model, lora, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
prompts, texts = json.loads(sys.argv[4]), json.loads(sys.argv[5])
kwargs = {"lora_path": lora} if lora else {}
default_params = lib.llama_model_default_params
def no_repack():
    params = default_params()
    params.use_extra_bufts = False
    return params
lib.llama_model_default_params = no_repack
llm = llama_cpp.Llama(model_path=model, n_ctx=256, n_threads=2, verbose=False, seed=0, **kwargs)
out = []
for ids in prompts:
    llm.reset()
    new = []
    for token in llm.generate(ids, top_k=1, top_p=1.0, min_p=0.0, temp=0.0, repeat_penalty=1.0):
        new.append(int(token))
        if len(new) == n:
            break
    out.append(new)
tokens = [llm.tokenize(t.encode(), add_bos=False, special=True) for t in texts]
print(json.dumps({"continuations": out, "tokens": tokens}))
"""


def llama_greedy(
    model: Path, prompts: list[list[int]], lora: Path | None = None, texts: list[str] | None = None
) -> tuple[list[list[int]], list[list[int]]]:
    """llama.cpp's greedy continuations of ``prompts`` and its tokens of ``texts``."""
    assert LLAMA_CPP_PYTHON is not None
    r = subprocess.run(
        [LLAMA_CPP_PYTHON, "-c", LLAMA_CPP_SCRIPT, str(model), "" if lora is None else str(lora),
         str(N_NEW), json.dumps(prompts), json.dumps(texts or [])],
        capture_output=True, text=True, timeout=600,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    result = json.loads(r.stdout.strip().splitlines()[-1])
    return result["continuations"], result["tokens"]


@needs_llama_cpp
@needs_smollm2
def test_llama_cpp_continues_the_merged_file_as_riftco_and_the_adapter_as_the_merge(tmp_path: Path) -> None:
    model = riftco.load_model(SMOLLM2)
    with_lora(model, rank=8, alpha=16.0)
    export_lora_adapter(model, tmp_path / "adapter.gguf")
    export_merged_model(model, tmp_path / "merged.gguf", base_gguf=SMOLLM2)
    tokenizer = riftco.load_tokenizer(SMOLLM2)
    prompts = [tokenizer.encode(p, add_special_tokens=False) for p in PROMPTS]
    ours = [riftco.generate(model, ids, N_NEW, temperature=0.0, tokenizer=tokenizer) for ids in prompts]
    merged, tokens = llama_greedy(tmp_path / "merged.gguf", prompts, texts=PROMPTS)
    with_adapter, _ = llama_greedy(SMOLLM2, prompts, lora=tmp_path / "adapter.gguf")
    assert tokens == prompts  # llama.cpp reads the copied tokenizer keys as riftco does
    for prompt, mine, theirs, adapted in zip(PROMPTS, ours, merged, with_adapter):
        assert len(mine) == N_NEW, (prompt, tokenizer.decode(mine))  # no end of turn before
        assert theirs == mine, (prompt, tokenizer.decode(mine), tokenizer.decode(theirs))
        assert adapted == theirs, (prompt, tokenizer.decode(adapted), tokenizer.decode(theirs))


@needs_llama_cpp
@needs_smollm2
def test_llama_cpp_runs_a_hugging_face_base_export_with_its_tokenizer_json(tmp_path: Path) -> None:
    """SmolLM2 as a Hugging Face folder (weights and tokenizer.json) exported through the
    command: llama.cpp tokenizes the prompts with the written keys as riftco's tokenizer.json
    does, and continues them as riftco does."""
    pytest.importorskip("tokenizers", reason="tokenizer.json is read with the tokenizers package")
    hf = hf_folder(tmp_path / "hf", SMOLLM2)
    out = tmp_path / "from-hf.gguf"
    r = riftco_cmd("--model", hf, "--out", out, "--type", "F32")
    assert r.returncode == 0, r.stderr
    assert fields_of(out)["tokenizer.ggml.pre"].contents() == "smollm"
    tokenizer = riftco.load_tokenizer(hf)
    prompts = [tokenizer.encode(p, add_special_tokens=False) for p in PROMPTS]
    model = riftco.load_model(hf)
    ours = [riftco.generate(model, ids, N_NEW, temperature=0.0, tokenizer=tokenizer) for ids in prompts]
    theirs, tokens = llama_greedy(out, prompts, texts=PROMPTS)
    assert tokens == prompts
    assert theirs == ours


def test_a_merge_whose_update_the_rounding_loses_is_warned(base: Path, tmp_path: Path) -> None:
    """Writing a merged model in its base's 4-bit types keeps little of a small update (the
    merged weights round back near the base's grid): the export warns, saying how much of the
    update the file keeps; a large update, or F16, exports without the warning."""
    small = riftco.load_model(base, dtype="float32")
    small.enable_lora(rank=4, alpha=8.0, mlp=True, seed=3)
    for name, p in small.named_lora_parameters():
        if "lora_B" in name:
            p.copy_(np.full(p.shape, 1e-5, np.float32))
    with pytest.warns(RuntimeWarning, match=r"keep -?\d+% of the adapters' update"):
        export_merged_model(small, tmp_path / "small.gguf", base_gguf=base, tensor_type="base")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        export_merged_model(tuned(base), tmp_path / "large.gguf", base_gguf=base, tensor_type="base")
        export_merged_model(tuned(base), tmp_path / "f16.gguf", base_gguf=base, tensor_type="F16")


def test_types_take_any_case_and_a_gguf_adapter_is_not_read_back_as_peft(base: Path, tmp_path: Path) -> None:
    """``tensor_type`` takes any case, as ``riftco export --type`` does; loading the GGUF adapter
    into riftco (which reads PEFT folders) names what it is and what to use instead of a raw
    OS error (both found by a fresh-clone review)."""
    export_merged_model(tuned(base), tmp_path / "q8.gguf", base_gguf=base, tensor_type="q8_0")
    assert tensors_of(tmp_path / "q8.gguf")["blk.0.attn_q.weight"].tensor_type == Q.Q8_0
    adapter = tmp_path / "adapter.gguf"
    export_lora_adapter(tuned(base), adapter)
    fresh = riftco.load_model(base)
    with pytest.raises(riftco.ModelStateError, match=r"a GGUF file.*PEFT adapter folder.*llama\.cpp"):
        fresh.load_lora(str(adapter))
    assert not fresh.has_lora
