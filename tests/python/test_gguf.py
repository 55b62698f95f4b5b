"""GGUF files in, against the ``gguf`` package (llama.cpp's own Python reader and writer): every
tensor type riftco reads dequantized bitwise as ``gguf.quants.dequantize``; the metadata and
tensor infos as ``gguf.GGUFReader`` gives them; a tiny ``llama`` model written as llama.cpp's
converter writes it (Q and K rows permuted) computing bitwise the logits of the same weights in
a Hugging Face safetensors folder; crafted files refused with ``ModelStateError`` naming the
field; and, where it is on disk, the real SmolLM2-135M-Instruct GGUF answering a question.

Skipped, with the reason, when the ``gguf`` package is absent (``pip install 'riftco[gguf]'``;
``scripts/setup.sh`` installs it)."""

from __future__ import annotations

import json
import os
import struct
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
        "the gguf package is not installed (pip install 'riftco[gguf]'): the GGUF tests compare "
        "against its reader, writer and dequantization",
        allow_module_level=True,
    )

# Every type riftco dequantizes.
TYPES = [Q.F32, Q.F16, Q.BF16, Q.Q8_0, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q2_K, Q.Q3_K, Q.Q4_K, Q.Q5_K, Q.Q6_K]
# The types the gguf package quantizes (it only dequantizes the K-quants).
QUANTIZABLE = {Q.F32, Q.F16, Q.BF16, Q.Q8_0, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1}
# Byte offsets of the f16 scales in each block, and a magnitude for them that keeps the values
# of random quants near 0.05 (the largest quant times the largest sub-scale, times this, ~0.05).
F16_FIELDS: dict[Q, tuple[tuple[int, ...], float]] = {
    Q.Q8_0: ((0,), 4e-4),
    Q.Q4_0: ((0,), 6e-3),
    Q.Q4_1: ((0, 2), 3e-3),
    Q.Q5_0: ((0,), 3e-3),
    Q.Q5_1: ((0, 2), 1.5e-3),
    Q.Q2_K: ((80, 82), 1e-3),
    Q.Q3_K: ((108,), 4e-4),
    Q.Q4_K: ((0, 2), 5e-5),
    Q.Q5_K: ((0, 2), 2.5e-5),
    Q.Q6_K: ((208,), 1e-5),
}


def bits(a: npt.NDArray[Any]) -> npt.NDArray[np.uint32]:
    """The f32 bit patterns (NaN-safe bitwise comparison)."""
    return np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)


def random_blocks(qtype: Q, rows: int, row_elements: int, rng: np.random.Generator) -> npt.NDArray[np.uint8]:
    """Random stored bytes of ``rows`` rows of ``qtype`` with finite f16 scales: every quant bit
    pattern occurs."""
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    n_blocks = rows * row_elements // block
    raw = rng.integers(0, 256, size=(n_blocks, size), dtype=np.uint8)
    offsets, magnitude = F16_FIELDS[qtype]
    for at in offsets:
        scale = (rng.standard_normal(n_blocks) * magnitude).astype(np.float16)
        raw[:, at : at + 2] = scale.view(np.uint8).reshape(n_blocks, 2)
    return raw.reshape(rows, row_elements // block * size)


def stored(qtype: Q, values: npt.NDArray[np.float32]) -> npt.NDArray[Any]:
    """``values`` as the gguf package stores them in ``qtype``."""
    if qtype == Q.F32:
        return values.astype(np.float32)
    return gguf.quants.quantize(values, qtype)


def write_gguf(path: Path, tensors: dict[str, tuple[Q, npt.NDArray[Any]]], arch: str = "none", **kv: Any) -> None:
    """A GGUF file by ``gguf.GGUFWriter``: tensors as stored (F32 / F16 arrays, or uint8 bytes
    of a quantized type), then metadata ``kv`` added with ``add_<kind>``-free ``add_key_value``
    through the writer's own type inference."""
    w = gguf.GGUFWriter(str(path), arch)
    for key, value in kv.items():
        if isinstance(value, tuple):
            w.add_key_value(key, value[0], value[1])
        elif isinstance(value, bool):
            w.add_bool(key, value)
        elif isinstance(value, int):
            w.add_uint32(key, value)
        elif isinstance(value, float):
            w.add_float32(key, value)
        elif isinstance(value, str):
            w.add_string(key, value)
        else:
            w.add_array(key, value)
    for name, (qtype, data) in tensors.items():
        raw_dtype = None if data.dtype in (np.float32, np.float16) else qtype
        w.add_tensor(name, data, raw_dtype=raw_dtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def reference(path: Path) -> dict[str, npt.NDArray[np.float32]]:
    """Every tensor of ``path`` dequantized by the gguf package."""
    reader = gguf.GGUFReader(str(path))
    return {t.name: gguf.quants.dequantize(t.data, t.tensor_type) for t in reader.tensors}


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_every_type_dequantizes_bitwise(tmp_path: Path, qtype: Q) -> None:
    rng = np.random.default_rng(int(qtype))
    tensors: dict[str, tuple[Q, npt.NDArray[Any]]] = {}
    if qtype in QUANTIZABLE:
        # Real data quantized by the package: a [4, 512] matrix and a [2, 3, 256] tensor, with
        # values spread over several orders of magnitude (and a zero block).
        a = (rng.standard_normal((4, 512)) * np.exp(rng.uniform(-6, 3, (4, 1)))).astype(np.float32)
        a[1, :32] = 0.0
        tensors["matrix"] = (qtype, stored(qtype, a))
        tensors["cube"] = (qtype, stored(qtype, rng.standard_normal((2, 3, 256)).astype(np.float32)))
    if qtype in F16_FIELDS:
        # Random bytes: every quant pattern, finite f16 scales (the package cannot quantize the
        # K-quants; this covers their bits).
        tensors["random"] = (qtype, random_blocks(qtype, 6, 512, rng))
    elif qtype == Q.BF16:
        tensors["random"] = (qtype, rng.integers(0, 1 << 16, size=(6, 64), dtype=np.uint16).view(np.uint8))
    elif qtype == Q.F16:
        tensors["random"] = (qtype, rng.standard_normal((6, 64)).astype(np.float16))
    path = tmp_path / "t.gguf"
    write_gguf(path, tensors)
    want = reference(path)
    assert set(want) == set(tensors)
    infos = {i["name"]: i for i in riftco.gguf_tensor_infos(path)}
    for name, ref in want.items():
        got = riftco.read_gguf_tensor(path, name)
        assert got.dtype == np.float32 and got.shape == ref.shape, (name, got.shape, ref.shape)
        assert np.array_equal(bits(got), bits(ref)), f"{qtype.name} {name}: not bitwise equal"
        assert infos[name]["type"] == qtype.name
        assert tuple(infos[name]["shape"]) == ref.shape


def test_metadata_and_tensor_infos_match_the_gguf_reader(tmp_path: Path) -> None:
    path = tmp_path / "m.gguf"
    v = gguf.GGUFValueType
    kv: dict[str, Any] = {
        "u8": (200, v.UINT8),
        "i8": (-7, v.INT8),
        "u16": (65535, v.UINT16),
        "i16": (-300, v.INT16),
        "u32": 4_000_000_000,
        "i32": (-5, v.INT32),
        "f32": 0.1,
        "bool": True,
        "str": "héllo, 世界 🙂",
        "u64": (2**64 - 1, v.UINT64),
        "i64": (-(2**63), v.INT64),
        "f64": (0.1, v.FLOAT64),
        "tokens": ["<s>", "", "Ġthe", "🙂"],
        "scores": [0.5, -1.25, 3.0],
        "ids": [1, 2, 3],
        "flags": [True, False],
    }
    rng = np.random.default_rng(5)
    write_gguf(
        path,
        {
            "a": (Q.F32, rng.standard_normal((3, 5)).astype(np.float32)),
            "b": (Q.Q8_0, stored(Q.Q8_0, rng.standard_normal((2, 64)).astype(np.float32))),
        },
        arch="test",
        **kv,
    )
    reader = gguf.GGUFReader(str(path))
    want = {k: f.contents() for k, f in reader.fields.items() if not k.startswith("GGUF.")}
    got = riftco.read_gguf_metadata(path)
    assert list(got) == list(want)
    assert got == want
    assert got["general.architecture"] == "test"
    assert isinstance(got["bool"], bool) and isinstance(got["flags"][0], bool)
    assert isinstance(got["f32"], float) and got["f32"] == float(np.float32(0.1))
    infos = riftco.gguf_tensor_infos(path)
    assert [i["name"] for i in infos] == [t.name for t in reader.tensors]
    for info, t in zip(infos, reader.tensors):
        assert info["type"] == t.tensor_type.name
        assert tuple(info["shape"]) == tuple(int(d) for d in reversed(t.shape))
        assert info["data_offset"] == t.data_offset and info["n_bytes"] == t.n_bytes


def test_nested_arrays_read_as_nested_lists(tmp_path: Path) -> None:
    path = tmp_path / "nested.gguf"
    write_gguf(path, {}, nested=[[1, 2], [3]], words=[["a", "b"], ["c"]])
    got = riftco.read_gguf_metadata(path)
    assert got["nested"] == [[1, 2], [3]]
    assert got["words"] == [["a", "b"], ["c"]]


# The tiny llama model: heads of 64 over 2 K/V heads; every width a multiple of 256 so that
# every block type fits every projection.
TINY = dict(vocab_size=64, d_model=256, n_heads=4, n_kv_heads=2, n_layers=2, d_ff=512, max_seq_len=32)


def permute(w: npt.NDArray[Any], n_head: int) -> npt.NDArray[Any]:
    """``LlamaModel.permute`` of llama.cpp's convert_hf_to_gguf.py (rows of q_proj / k_proj)."""
    out: npt.NDArray[Any] = w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)
    return out


def unpermute(w: npt.NDArray[Any], n_head: int) -> npt.NDArray[Any]:
    """The inverse of :func:`permute` (checked against it where used)."""
    out: npt.NDArray[Any] = w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)
    return out


GGUF_NAMES = {
    "input_layernorm": "attn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "post_attention_layernorm": "ffn_norm",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}


def gguf_name(hf: str) -> str:
    top = {
        "model.embed_tokens.weight": "token_embd.weight",
        "model.norm.weight": "output_norm.weight",
        "lm_head.weight": "output.weight",
    }
    if hf in top:
        return top[hf]
    _, _, i, rest = hf.split(".", 3)
    return f"blk.{i}.{GGUF_NAMES[rest.removesuffix('.weight')]}.weight"


def write_safetensors(path: Path, tensors: dict[str, npt.NDArray[np.float32]]) -> None:
    """A safetensors file of F32 tensors: 8-byte little-endian header length, JSON, data."""
    header: dict[str, Any] = {}
    blobs, offset = [], 0
    for name, a in tensors.items():
        data = np.ascontiguousarray(a, dtype="<f4").tobytes()
        header[name] = {"dtype": "F32", "shape": list(a.shape), "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    path.write_bytes(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def tiny_llama(tmp_path: Path, types: dict[str, Q], tied: bool) -> tuple[Path, Path]:
    """A tiny llama model written twice: as a GGUF file (the HF weights Q/K-permuted, each stored
    as ``types[gguf name]`` says, F32 when absent) and as a Hugging Face folder holding the
    weights that file dequantizes to (Q/K rows unpermuted) with its ``config.json``."""
    config = riftco.TransformerConfig(**TINY, seed=9, tie_word_embeddings=tied, rms_norm_eps=1e-5, rope_theta=5e5)
    hf = {n: p.numpy().copy() for n, p in riftco.DecoderOnlyTransformer(config).named_parameters()}
    rng = np.random.default_rng(1)
    heads = {"self_attn.q_proj": TINY["n_heads"], "self_attn.k_proj": TINY["n_kv_heads"]}
    tensors: dict[str, tuple[Q, npt.NDArray[Any]]] = {}
    folder_weights: dict[str, npt.NDArray[np.float32]] = {}
    for name, w in hf.items():
        g = gguf_name(name)
        h = next((n for k, n in heads.items() if f".{k}." in name), None)
        ggml_order = permute(w, h) if h else w
        qtype = types.get(g, Q.F32)
        if qtype in QUANTIZABLE:
            data = stored(qtype, ggml_order)
        else:
            data = random_blocks(qtype, w.shape[0], w.shape[1], rng)
        tensors[g] = (qtype, data)
        dq = gguf.quants.dequantize(data, qtype).reshape(w.shape)
        folder_weights[name] = unpermute(dq, h) if h else dq
        if h:
            assert np.array_equal(permute(folder_weights[name], h), dq)
    gguf_path = tmp_path / "tiny.gguf"
    write_gguf(
        gguf_path,
        tensors,
        arch="llama",
        **{
            "llama.context_length": TINY["max_seq_len"],
            "llama.embedding_length": TINY["d_model"],
            "llama.block_count": TINY["n_layers"],
            "llama.feed_forward_length": TINY["d_ff"],
            "llama.attention.head_count": TINY["n_heads"],
            "llama.attention.head_count_kv": TINY["n_kv_heads"],
            "llama.rope.freq_base": 5e5,
            "llama.attention.layer_norm_rms_epsilon": 1e-5,
            "llama.rope.dimension_count": TINY["d_model"] // TINY["n_heads"],
            "tokenizer.ggml.tokens": [f"t{i}" for i in range(TINY["vocab_size"])],
            "tokenizer.ggml.bos_token_id": 1,
            "tokenizer.ggml.eos_token_id": 2,
        },
    )
    folder = tmp_path / "hf"
    folder.mkdir()
    write_safetensors(folder / "model.safetensors", folder_weights)
    (folder / "config.json").write_text(
        json.dumps(
            {
                "architectures": ["LlamaForCausalLM"],
                "model_type": "llama",
                "vocab_size": TINY["vocab_size"],
                "hidden_size": TINY["d_model"],
                "intermediate_size": TINY["d_ff"],
                "num_attention_heads": TINY["n_heads"],
                "num_key_value_heads": TINY["n_kv_heads"],
                "num_hidden_layers": TINY["n_layers"],
                "max_position_embeddings": TINY["max_seq_len"],
                "rms_norm_eps": 1e-5,
                "rope_theta": 5e5,
                "tie_word_embeddings": tied,
                "bos_token_id": 1,
                "eos_token_id": 2,
                "hidden_act": "silu",
                "torch_dtype": "float32",
            }
        )
    )
    return gguf_path, folder


def assert_same_model(a: riftco.DecoderOnlyTransformer, b: riftco.DecoderOnlyTransformer) -> None:
    """Equal configs, bitwise equal weights, and bitwise equal logits (same weights, same ops)."""
    assert a.config == b.config
    pa, pb = dict(a.named_parameters()), dict(b.named_parameters())
    assert list(pa) == list(pb)
    for name in pa:
        assert np.array_equal(bits(pa[name].numpy()), bits(pb[name].numpy())), name
    tokens = np.array([[1, 5, 63, 0, 17, 2, 9, 33]], dtype=np.uint32)
    la, lb = a.logits(tokens).numpy(), b.logits(tokens).numpy()
    assert np.isfinite(la).all()
    assert np.array_equal(bits(la), bits(lb))


@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
def test_tiny_llama_f32_equals_the_hugging_face_folder(tmp_path: Path, tied: bool) -> None:
    gguf_path, folder = tiny_llama(tmp_path, {}, tied)
    from_gguf = riftco.load_model(gguf_path)
    assert from_gguf.config.tie_word_embeddings is tied
    assert from_gguf.eos_token_ids == [2] and from_gguf.config.bos_token_id == 1
    assert_same_model(from_gguf, riftco.load_model(folder))
    # Through the class too, and 16-bit frozen storage (the weights rounded as a bf16 load of the
    # folder rounds them).
    assert_same_model(riftco.DecoderOnlyTransformer.load(str(gguf_path)), from_gguf)
    half = riftco.load_model(gguf_path, dtype="bfloat16")
    assert half.frozen_weights_dtype == "bfloat16"
    assert_same_model(half, riftco.load_model(folder, dtype="bfloat16"))


def test_tiny_llama_of_every_type_equals_the_hugging_face_folder(tmp_path: Path) -> None:
    """Each projection of each block stored in another type (all 13 over the model), the
    embedding in Q8_0: the GGUF model is exactly the folder of the dequantized weights."""
    projections = ["attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"]
    names = [f"blk.{i}.{p}.weight" for i in range(TINY["n_layers"]) for p in projections]
    types = {name: TYPES[k % len(TYPES)] for k, name in enumerate(names)}
    types["token_embd.weight"] = Q.Q8_0
    types["blk.0.attn_norm.weight"] = Q.F16
    assert set(types.values()) == set(TYPES)
    gguf_path, folder = tiny_llama(tmp_path, types, tied=True)
    stored_types = {i["name"]: i["type"] for i in riftco.gguf_tensor_infos(gguf_path)}
    assert all(stored_types[n] == t.name for n, t in types.items())
    assert_same_model(riftco.load_model(gguf_path), riftco.load_model(folder))


def field_offsets(path: Path, tensor: str) -> tuple[int, int]:
    """The file offsets of the GGML type and the data offset of ``tensor``'s info."""
    reader = gguf.GGUFReader(str(path))
    t = next(t for t in reader.tensors if t.name == tensor)
    at = t.field.offset + 8 + len(tensor.encode()) + 4 + 8 * len(t.shape)
    return at, at + 4


def edited(path: Path, at: int, value: bytes, name: str) -> Path:
    data = bytearray(path.read_bytes())
    data[at : at + len(value)] = value
    out = path.with_name(name)
    out.write_bytes(bytes(data))
    return out


def test_crafted_files_are_model_state_errors_naming_the_field(tmp_path: Path) -> None:
    good, _ = tiny_llama(tmp_path, {"blk.0.attn_q.weight": Q.Q4_K}, tied=True)
    raw = good.read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(raw[: len(raw) // 2])
    header_cut = tmp_path / "header-cut.gguf"
    header_cut.write_bytes(raw[:40])
    type_at, offset_at = field_offsets(good, "blk.0.attn_q.weight")
    def at(offset: int, value: bytes, name: str) -> Path:
        return edited(good, offset, value, name)

    cases = {
        "truncated": (cut, "past the end of the file"),
        "truncated header": (header_cut, "bytes remain after offset 24 (a truncated or corrupt file)"),
        "tensor count": (at(8, struct.pack("<Q", 2**63), "tensors.gguf"), "the tensor count = 9223372036854775808"),
        "metadata count": (at(16, struct.pack("<Q", 2**40), "kv.gguf"), "the metadata count = 1099511627776"),
        "unknown type": (at(type_at, struct.pack("<I", 99), "type.gguf"), "is 99, which is not a GGML tensor type"),
        "offset past end": (at(offset_at, struct.pack("<Q", 2**40), "offset.gguf"), 'tensor "blk.0.attn_q.weight" (Q4_K'),
        "magic": (at(0, b"GGUL", "magic.gguf"), 'not the magic "GGUF"'),
    }
    for case, (path, want) in cases.items():
        for call in (riftco.load_model, riftco.read_gguf_metadata):
            with pytest.raises(riftco.ModelStateError) as e:
                call(path)
            assert str(path) in str(e.value) and want in str(e.value), (case, str(e.value))


def test_another_architecture_and_an_unsupported_type_are_named(tmp_path: Path) -> None:
    path = tmp_path / "qwen.gguf"
    write_gguf(path, {"token_embd.weight": (Q.F32, np.zeros((4, 32), np.float32))}, arch="qwen2")
    with pytest.raises(riftco.ModelStateError, match=r'architecture "qwen2" \(general.architecture\) is not supported'):
        riftco.load_model(path)
    # IQ4_NL (blocks of 32 in 18 bytes) is read by the reader but not dequantized by riftco.
    iq = tmp_path / "iq.gguf"
    write_gguf(iq, {"w": (Q.IQ4_NL, np.zeros((2, 18), np.uint8))})
    assert riftco.gguf_tensor_infos(iq)[0]["type"] == "IQ4_NL"
    unsupported = r'tensor "w" has type IQ4_NL \(id 20\), which riftco does not dequantize'
    with pytest.raises(riftco.ModelStateError, match=unsupported):
        riftco.read_gguf_tensor(iq, "w")
    with pytest.raises(riftco.ModelStateError, match=r'no tensor "x"'):
        riftco.read_gguf_tensor(iq, "x")


def smollm2_path() -> Path:
    if not SMOLLM2.is_file():
        pytest.skip(SMOLLM2_MISSING)
    return SMOLLM2


def test_smollm2_gguf_loads_and_answers(tmp_path: Path) -> None:
    path = smollm2_path()
    tokenizers = pytest.importorskip("tokenizers", reason="tokenizers is not installed: the prompt is encoded with it")
    model = riftco.load_model(path)
    c = model.config
    assert (c.d_model, c.n_layers, c.n_heads, c.n_kv_heads) == (576, 30, 9, 3)
    assert (c.rope_theta, c.tie_word_embeddings, c.vocab_size) == (1e5, True, 49152)
    # Tensors of each type in the file, bitwise as the reference dequantizes them.
    reader = gguf.GGUFReader(str(path))
    checked = ("token_embd.weight", "blk.0.attn_v.weight", "blk.0.attn_norm.weight")
    for rt in [rt for rt in reader.tensors if rt.name in checked]:
        ref = gguf.quants.dequantize(rt.data, rt.tensor_type)
        assert np.array_equal(bits(riftco.read_gguf_tensor(path, rt.name)), bits(ref)), rt.name
    # A GPT-2 byte-level BPE from the file's own token list and merges (pre-tokenizer "smollm":
    # single digits, then byte-level), special tokens being the CONTROL ones (type 3).
    meta = riftco.read_gguf_metadata(path)
    assert (meta["tokenizer.ggml.model"], meta["tokenizer.ggml.pre"]) == ("gpt2", "smollm")
    tokens: list[str] = meta["tokenizer.ggml.tokens"]
    merges = [tuple(m.split(" ", 1)) for m in meta["tokenizer.ggml.merges"]]
    tok = tokenizers.Tokenizer(tokenizers.models.BPE({t: i for i, t in enumerate(tokens)}, merges))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Sequence(
        [
            tokenizers.pre_tokenizers.Digits(individual_digits=True),
            tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False),
        ]
    )
    tok.decoder = tokenizers.decoders.ByteLevel()
    control = [t for t, kind in zip(tokens, meta["tokenizer.ggml.token_type"]) if kind == 3]
    tok.add_special_tokens([tokenizers.AddedToken(t, special=True) for t in control])
    prompt = "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"
    ids: list[int] = tok.encode(prompt).ids
    assert ids[0] == tokens.index("<|im_start|>") and ids.count(tokens.index("<|im_end|>")) == 1
    # Greedy decoding through a decode session, stopping at the end-of-turn / EOS id.
    session = model.decode_session()
    logits = np.zeros(0, np.float32)
    for t in ids:
        logits = session.decode_token(t)
    out: list[int] = []
    for _ in range(24):
        nxt = int(np.argmax(logits))
        if nxt in model.eos_token_ids:
            break
        out.append(nxt)
        logits = session.decode_token(nxt)
    answer = tok.decode(out)
    assert "Paris" in answer, answer
