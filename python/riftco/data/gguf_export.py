"""GGUF out: a model's LoRA adapter as a llama.cpp GGUF LoRA adapter, and a model (its adapters
merged) as a ``llama`` GGUF model file, written with the ``gguf`` package's ``GGUFWriter``
(``pip install 'riftco[gguf]'``).

**Adapter** (:func:`export_lora_adapter`): the metadata llama.cpp's ``convert_lora_to_gguf.py``
writes and ``src/llama-adapter.cpp`` checks (``general.type = "adapter"``,
``general.architecture = "llama"``, ``adapter.type = "lora"``, ``adapter.lora.alpha`` as
float32) and, per adapted projection, ``blk.N.<proj>.weight.lora_a`` (PEFT's ``A``, NumPy shape
``[rank, in]``, GGML ``ne = [in, rank]``) and ``.lora_b`` (PEFT's ``B``, ``[out, rank]``), in
float32. llama.cpp computes ``W x + (alpha / rank) · B (A x)``, PEFT's and riftco's LoRA.

**Model** (:func:`export_merged_model`): every weight under llama.cpp's name with the ``llama``
hyperparameters (``llama.block_count``, ``context_length``, ``embedding_length``,
``feed_forward_length``, ``attention.head_count`` / ``head_count_kv``,
``attention.layer_norm_rms_epsilon``, ``rope.freq_base``, ``rope.dimension_count``,
``vocab_size``, RoPE scaling) and the tokenizer's ``tokenizer.*`` keys, copied from the base GGUF
file or, for a Hugging Face base, the ``tokenizer.json`` written as llama.cpp's converter writes
it (:func:`hf_tokenizer_metadata`). Weights are stored as ``tensor_type``: one of
:data:`GGUF_EXPORT_TYPES` for every matrix (the norms stay F32, as llama.cpp's converter keeps
them), or ``"base"``: each tensor in the type it has in the base GGUF file. Quantized bytes are
riftco's quantizers' (:data:`QUANTIZED_TYPES`; ``riftco.quantize``: bytes equal to
``gguf.quants.quantize`` for the 32-element types, to llama.cpp's ``quantize_row_*_ref`` for the
K-quants); any other type is an error listing what can be written.

**Q and K rows.** llama.cpp's converter (``convert_hf_to_gguf.py``, ``LlamaModel.permute``)
reorders the rows of ``q_proj`` (in ``n_heads`` heads) and ``k_proj`` (in ``n_kv_heads``)
within each head so that its RoPE rotates adjacent pairs: file row ``h·d + 2i + j`` is Hugging
Face row ``h·d + j·d/2 + i`` (``d = d_head``): the order riftco's GGUF reader undoes.
The export applies it to the merged ``attn_q`` / ``attn_k`` weights and to the rows of the
adapters' ``lora_b`` of those projections (``B`` maps into the permuted rows; ``A`` is
unchanged), as ``convert_lora_to_gguf.py`` does.

Both writers stream one tensor at a time into a temporary file beside ``path`` that is renamed
onto it when complete, so a failure leaves no partial file; every check runs before anything is
written. An existing ``path`` is refused unless ``overwrite``.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from riftco._native import (
    ConfigError,
    DecoderOnlyTransformer,
    LoraError,
    ModelStateError,
    TransformerConfig,
)

if TYPE_CHECKING:
    import gguf

__all__ = [
    "GGUF_EXPORT_TYPES",
    "QUANTIZED_TYPES",
    "BASE_TYPES",
    "GgufExport",
    "export_lora_adapter",
    "export_merged_model",
    "gguf_name",
    "hf_tokenizer_metadata",
    "permute_qk_rows",
]

QUANTIZED_TYPES: tuple[str, ...] = (
    "Q8_0", "Q6_K", "Q5_1", "Q5_0", "Q5_K", "Q4_1", "Q4_0", "Q4_K", "Q3_K", "Q2_K"
)
"""The block types :func:`export_merged_model` quantizes (``riftco.quantize``)."""

GGUF_EXPORT_TYPES: tuple[str, ...] = ("F32", "F16", "BF16", *QUANTIZED_TYPES)
"""The tensor types a merged model can be written in (every matrix in that type)."""

BASE_TYPES = "base"
"""``tensor_type`` that writes each tensor in the type it has in the base GGUF file."""

_ARCH = "llama"
_ROPE_FREQS = "rope_freqs.weight"

# Hugging Face projection -> llama.cpp tensor (blk.N.<name>.weight).
_PROJECTIONS = {
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}
_LAYER_NORMS = {"input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm"}
_MODEL_TENSORS = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
}

# llama_ftype (llama.h) of a file whose matrices are all of one type.
_FILE_TYPES = {"F32": 0, "F16": 1, "Q4_0": 2, "Q4_1": 3, "Q8_0": 7, "Q5_0": 8, "Q5_1": 9,
               "BF16": 32}
# Metadata of the base GGUF file not copied into a merged model: the header fields the
# reader shows as keys, and what the export writes itself.
_OWN_KEYS = ("general.architecture", "general.type", "general.file_type",
             "general.quantization_version", "general.alignment")


def _import_gguf() -> Any:
    try:
        import gguf
    except ImportError:
        raise ImportError(
            "writing GGUF files needs the gguf package (llama.cpp's own): "
            "pip install 'riftco[gguf]'"
        ) from None
    return gguf


@dataclass(frozen=True)
class GgufExport:
    """What an export wrote: the file, its tensor count, bytes, and tensor name -> GGML type."""

    path: Path
    n_tensors: int
    n_bytes: int
    tensor_types: dict[str, str]


def gguf_name(hf_name: str) -> str:
    """llama.cpp's tensor name of a Hugging Face Llama parameter name
    (``model.layers.3.self_attn.q_proj.weight`` -> ``blk.3.attn_q.weight``).

    Raises:
        ModelStateError: a name that is not a Llama parameter (named).
    """
    if hf_name in _MODEL_TENSORS:
        return _MODEL_TENSORS[hf_name]
    parts = hf_name.split(".")
    if len(parts) >= 5 and parts[:2] == ["model", "layers"] and parts[-1] == "weight":
        layer, inner = parts[2], ".".join(parts[3:-1])
        short = _PROJECTIONS.get(inner) or _LAYER_NORMS.get(inner)
        if layer.isdigit() and short is not None:
            return f"blk.{layer}.{short}.weight"
    raise ModelStateError(f"parameter {hf_name!r} has no llama.cpp tensor name")


def permute_qk_rows(values: npt.NDArray[np.float32], n_head: int) -> npt.NDArray[np.float32]:
    """The rows of a ``q_proj`` / ``k_proj`` weight (or of its LoRA ``B``), ``[rows, cols]`` in
    ``n_head`` heads, in llama.cpp's order: row ``h·d + 2i + j`` of the result is row
    ``h·d + j·d/2 + i`` of ``values`` (``d = rows / n_head``; ``LlamaModel.permute`` of
    ``convert_hf_to_gguf.py``). A copy; ``values`` is unchanged."""
    rows = values.shape[0]
    if n_head <= 0 or rows % n_head or (rows // n_head) % 2:
        raise ModelStateError(
            f"cannot permute {rows} rows into {n_head} heads of an even size for llama.cpp's RoPE"
        )
    d = rows // n_head
    return np.ascontiguousarray(
        values.reshape(n_head, 2, d // 2, *values.shape[1:]).swapaxes(1, 2).reshape(values.shape)
    )


def _heads_of(hf_name: str, config: TransformerConfig) -> int | None:
    if hf_name.endswith("self_attn.q_proj.weight"):
        return int(config.n_heads)
    if hf_name.endswith("self_attn.k_proj.weight"):
        return int(config.n_kv_heads)
    return None


# -- writing ---------------------------------------------------------------------------------


@dataclass
class _Tensor:
    name: str
    ggml_type: str
    shape: tuple[int, ...]  # NumPy order
    produce: Callable[[], npt.NDArray[Any]]  # the stored array (float or uint8 bytes)
    n_bytes: int = 0


def _stored_bytes(gguf: Any, ggml_type: str, shape: tuple[int, ...]) -> int:
    block, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[ggml_type]]
    n = math.prod(shape)
    return int(n // block * size)


def _check_path(path: Path, overwrite: bool) -> None:
    if path.is_dir():
        raise IsADirectoryError(f"the output {str(path)!r} is a folder: pass a file path (.gguf)")
    if path.exists() and not overwrite:
        raise FileExistsError(
            f"the output {str(path)!r} exists: pass overwrite=True (riftco export: --overwrite) "
            "to replace it, or another path"
        )
    if not path.parent.is_dir():
        raise FileNotFoundError(f"the folder of the output {str(path)!r} does not exist")


def _write(
    path: Path,
    overwrite: bool,
    keys: Callable[[Any], None],
    tensors: list[_Tensor],
) -> GgufExport:
    """Writes a GGUF file with ``GGUFWriter``: ``keys(writer)`` adds the metadata, then each
    tensor is produced and written in turn, into a temporary file renamed onto ``path``."""
    gguf = _import_gguf()
    _check_path(path, overwrite)
    fd, tmp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp's 0600 -> what open() would create
        writer = gguf.GGUFWriter(tmp, _ARCH)
        keys(writer)
        for t in tensors:
            qtype = gguf.GGMLQuantizationType[t.ggml_type]
            t.n_bytes = _stored_bytes(gguf, t.ggml_type, t.shape)
            if t.ggml_type in ("F32", "F16"):
                dtype = np.dtype(np.float32 if t.ggml_type == "F32" else np.float16)
                writer.add_tensor_info(t.name, t.shape, dtype, t.n_bytes)
            else:
                block, size = gguf.GGML_QUANT_SIZES[qtype]
                byte_shape = (*t.shape[:-1], t.shape[-1] // block * size)
                writer.add_tensor_info(t.name, byte_shape, np.dtype(np.uint8), t.n_bytes, qtype)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        for t in tensors:
            data = t.produce()
            if data.nbytes != t.n_bytes:  # a bug, not bad input
                raise AssertionError(f"{t.name}: {data.nbytes} bytes, expected {t.n_bytes}")
            writer.write_tensor_data(data)
        writer.flush()
        assert writer.fout is not None
        for f in writer.fout:
            os.fsync(f.fileno())
        writer.close()
        _rename(tmp, path, overwrite)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return GgufExport(
        path=path,
        n_tensors=len(tensors),
        n_bytes=path.stat().st_size,
        tensor_types={t.name: t.ggml_type for t in tensors},
    )


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _rename(tmp: Path, path: Path, overwrite: bool) -> None:
    if overwrite:
        os.replace(tmp, path)
    else:
        try:
            os.link(tmp, path)  # fails if path appeared meanwhile: never replaces a file
        except FileExistsError:
            raise FileExistsError(
                f"the output {str(path)!r} appeared while it was written; nothing replaced"
            ) from None
        except OSError:  # a file system without hard links
            if path.exists():
                raise FileExistsError(f"the output {str(path)!r} exists") from None
            os.replace(tmp, path)
        tmp.unlink(missing_ok=True)
    try:
        dir_fd = os.open(path.parent, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(dir_fd)
    except OSError:
        pass
    finally:
        os.close(dir_fd)


# -- the adapter -----------------------------------------------------------------------------


def _lora_alpha(model: DecoderOnlyTransformer) -> float:
    """The adapters' alpha, as ``save_lora`` records it in ``adapter_config.json``."""
    with tempfile.TemporaryDirectory(prefix="riftco-lora-") as tmp:
        model.save_lora(os.path.join(tmp, "adapter"))
        config = json.loads(Path(tmp, "adapter", "adapter_config.json").read_text())
    if config.get("use_rslora"):
        raise LoraError("rank-stabilized LoRA (alpha / sqrt(rank)) has no llama.cpp adapter form")
    return float(config["lora_alpha"])


def _lora_pairs(
    model: DecoderOnlyTransformer,
) -> Iterator[tuple[str, str, Any, Any]]:
    """``(hf weight name, gguf weight name, A, B)`` for every adapted projection."""
    params = dict(model.named_lora_parameters())
    prefix = "base_model.model."
    for name in params:
        if not name.endswith(".lora_A.weight"):
            continue
        module = name[len(prefix):-len(".lora_A.weight")] if name.startswith(prefix) else None
        b_name = name[: -len(".lora_A.weight")] + ".lora_B.weight"
        if module is None or b_name not in params:
            raise LoraError(f"LoRA parameter {name!r} has no PEFT pair name")
        hf = module + ".weight"
        yield hf, gguf_name(hf), params[name], params[b_name]


def export_lora_adapter(
    model: DecoderOnlyTransformer,
    path: str | os.PathLike[str],
    *,
    overwrite: bool = False,
    name: str | None = None,
) -> GgufExport:
    """Writes ``model``'s LoRA adapters as a GGUF LoRA adapter for llama.cpp
    (``llama-cli -m base.gguf --lora path``, ``Llama(model_path=..., lora_path=path)``), for the
    base model ``model`` holds converted to GGUF by llama.cpp (or the GGUF it was loaded from).

    Tensors: ``blk.N.<proj>.weight.lora_a`` = PEFT ``A`` (float32 ``[rank, in]``) and
    ``.lora_b`` = PEFT ``B`` (float32 ``[out, rank]``; for ``attn_q`` / ``attn_k`` its rows in
    llama.cpp's order, :func:`permute_qk_rows`). ``name`` goes to ``general.name``.

    Raises:
        LoraError: ``model`` has no adapters.
        FileExistsError: ``path`` exists and not ``overwrite``; ``OSError`` when it cannot be
            written (nothing is left behind).
        ImportError: the ``gguf`` package is not installed.
    """
    if not model.has_lora:
        raise LoraError("the model has no LoRA adapters to export: enable or load them first")
    out = Path(path)
    config = model.config
    alpha = _lora_alpha(model)
    tensors: list[_Tensor] = []
    ranks: set[int] = set()
    for hf, base, a, b in _lora_pairs(model):
        heads = _heads_of(hf, config)
        ranks.add(int(a.shape[0]))

        def lora_a(a: Any = a) -> npt.NDArray[np.float32]:
            return np.ascontiguousarray(a.numpy(), dtype=np.float32)

        def lora_b(b: Any = b, heads: int | None = heads) -> npt.NDArray[np.float32]:
            values = np.ascontiguousarray(b.numpy(), dtype=np.float32)
            return values if heads is None else permute_qk_rows(values, heads)

        tensors.append(_Tensor(base + ".lora_a", "F32", tuple(a.shape), lora_a))
        tensors.append(_Tensor(base + ".lora_b", "F32", tuple(b.shape), lora_b))

    def keys(w: Any) -> None:
        w.add_type("adapter")
        if name:
            w.add_name(name)
        w.add_string("adapter.type", "lora")
        w.add_float32("adapter.lora.alpha", alpha)
        w.add_file_type(_FILE_TYPES["F32"])

    return _write(out, overwrite, keys, tensors)


# -- the merged model ------------------------------------------------------------------------


def _quantize(values: npt.NDArray[np.float32], ggml_type: str) -> npt.NDArray[Any]:
    gguf = _import_gguf()
    if ggml_type == "F32":
        return np.ascontiguousarray(values, dtype=np.float32)
    if ggml_type == "F16":
        return values.astype(np.float16)
    if ggml_type in QUANTIZED_TYPES:
        # Rows of whole blocks, as the gguf package lays quantized tensors out: [rows, bytes].
        from riftco._native import quantize

        rows = values.reshape(-1, values.shape[-1])
        data = np.frombuffer(quantize(np.ascontiguousarray(rows), ggml_type.lower()), np.uint8)
        return data.reshape(*values.shape[:-1], -1)
    return np.asarray(gguf.quants.quantize(values, gguf.GGMLQuantizationType[ggml_type]))


def _base_tensor_types(base_gguf: Path) -> dict[str, str]:
    gguf = _import_gguf()
    reader = gguf.GGUFReader(base_gguf)
    return {t.name: t.tensor_type.name for t in reader.tensors}


def _rope_freqs(config: TransformerConfig) -> npt.NDArray[np.float32] | None:
    """Llama 3.1's per-frequency RoPE factors as llama.cpp's converter computes them
    (``LlamaModel.generate_extra_tensors``), for a ``llama3`` rope scaling; else ``None``."""
    scaling = dict(config.rope_scaling)
    if scaling.get("rope_type") != "llama3":
        return None
    d = int(config.d_head)
    freqs = 1.0 / (float(config.rope_theta) ** (np.arange(0, d, 2, dtype=np.float32) / d))
    factor = float(scaling["factor"])
    low, high = float(scaling["low_freq_factor"]), float(scaling["high_freq_factor"])
    old = float(scaling["original_max_position_embeddings"])
    low_wavelen, high_wavelen = old / low, old / high
    out = []
    for f in freqs:
        wavelen = 2 * math.pi / float(f)
        if wavelen < high_wavelen:
            out.append(1.0)
        elif wavelen > low_wavelen:
            out.append(factor)
        else:
            smooth = (old / wavelen - low) / (high - low)
            out.append(1.0 / ((1.0 - smooth) / factor + smooth))
    return np.asarray(out, dtype=np.float32)


def _copy_keys(
    writer: Any, base_gguf: Path, prefixes: tuple[str, ...], skip: tuple[str, ...] = ()
) -> set[str]:
    """Copies the base file's keys that start with one of ``prefixes`` (with their value types)
    into ``writer``, but those in ``skip``; returns the keys copied."""
    gguf = _import_gguf()
    reader = gguf.GGUFReader(base_gguf)
    copied: set[str] = set()
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key in (*_OWN_KEYS, *skip) or not key.startswith(prefixes):
            continue
        vtype = field.types[0]
        value = field.contents()
        if vtype == gguf.GGUFValueType.ARRAY:
            if len(field.types) > 2:  # arrays of arrays: none in the llama/tokenizer keys
                continue
            sub = field.types[1] if len(field.types) > 1 else gguf.GGUFValueType.INT32
            writer.add_key_value(key, value, vtype, sub_type=sub)
        else:
            writer.add_key_value(key, value, vtype)
        copied.add(key)
    return copied


def _llama_keys(writer: Any, config: TransformerConfig) -> None:
    writer.add_uint32("llama.vocab_size", int(config.vocab_size))
    writer.add_uint32("llama.context_length", int(config.max_seq_len))
    writer.add_uint32("llama.embedding_length", int(config.d_model))
    writer.add_uint32("llama.block_count", int(config.n_layers))
    writer.add_uint32("llama.feed_forward_length", int(config.d_ff))
    writer.add_uint32("llama.rope.dimension_count", int(config.d_head))
    writer.add_uint32("llama.attention.head_count", int(config.n_heads))
    writer.add_uint32("llama.attention.head_count_kv", int(config.n_kv_heads))
    writer.add_float32("llama.attention.layer_norm_rms_epsilon", float(config.rms_norm_eps))
    writer.add_float32("llama.rope.freq_base", float(config.rope_theta))
    scaling = dict(config.rope_scaling)
    if scaling.get("rope_type") == "linear":
        writer.add_string("llama.rope.scaling.type", "linear")
        writer.add_float32("llama.rope.scaling.factor", float(scaling["factor"]))


def _check_base(config: TransformerConfig, base_gguf: Path) -> None:
    """The base GGUF file is the model's own: the same ``llama`` hyperparameters."""
    from riftco._native import read_gguf_metadata

    meta = read_gguf_metadata(base_gguf)
    if meta.get("general.architecture") != _ARCH:
        raise ModelStateError(
            f"the base GGUF {str(base_gguf)!r} is of architecture "
            f"{meta.get('general.architecture')!r}, not 'llama'"
        )
    expected = {
        "llama.embedding_length": int(config.d_model),
        "llama.block_count": int(config.n_layers),
        "llama.feed_forward_length": int(config.d_ff),
        "llama.attention.head_count": int(config.n_heads),
        "llama.attention.head_count_kv": int(config.n_kv_heads),
    }
    defaults = {"llama.attention.head_count_kv": meta.get("llama.attention.head_count")}
    for key, value in expected.items():
        if meta.get(key, defaults.get(key)) != value:
            raise ModelStateError(
                f"the base GGUF {str(base_gguf)!r} does not match the model: {key} is "
                f"{meta.get(key)!r} there, {value} in the model"
            )


def export_merged_model(
    model: DecoderOnlyTransformer,
    path: str | os.PathLike[str],
    *,
    tensor_type: str = "F32",
    base_gguf: str | os.PathLike[str] | None = None,
    tokenizer_metadata: Mapping[str, Any] | None = None,
    overwrite: bool = False,
    name: str | None = None,
) -> GgufExport:
    """Writes ``model`` as a ``llama`` GGUF model file that llama.cpp and Ollama run. A model
    with LoRA adapters has them merged first, in place (``model.merge_lora()``: the weights
    written are riftco's merged weights; a 16-bit or quantized frozen base is dequantized to
    float32 first, exactly).

    ``tensor_type``: one of :data:`GGUF_EXPORT_TYPES` for every matrix (the token embedding and
    the projections; the norms and ``rope_freqs`` stay F32), or ``"base"``: every tensor in the
    type it has in ``base_gguf``. The tokenizer: ``base_gguf``'s ``tokenizer.*`` keys (and its
    ``general.*`` description), or ``tokenizer_metadata`` (GGUF key -> value, for a base that
    is not a GGUF file: :func:`hf_tokenizer_metadata`). ``name`` goes to ``general.name``.

    Raises:
        ConfigError: an unknown ``tensor_type``, ``"base"`` without ``base_gguf``, a base type
            that cannot be written (listing those that can), a matrix whose rows are not a
            multiple of the type's block (naming the tensor).
        ModelStateError: no tokenizer (neither ``base_gguf`` nor ``tokenizer_metadata``), or a
            ``base_gguf`` that is not the model's base (naming the key that differs).
        FileExistsError: ``path`` exists and not ``overwrite``; ``OSError`` when it cannot be
            written (nothing is left behind).
        ImportError: the ``gguf`` package is not installed.
    """
    gguf = _import_gguf()
    config = model.config
    base = None if base_gguf is None else Path(base_gguf)
    accepted = (*GGUF_EXPORT_TYPES, BASE_TYPES)
    if isinstance(tensor_type, str):
        # Any case, as riftco export --type and riftco.quantize take it.
        tensor_type = tensor_type.lower() if tensor_type.lower() == BASE_TYPES else tensor_type.upper()
    if tensor_type not in accepted:
        raise ConfigError(
            f"GGUF tensor type {tensor_type!r} is not one riftco writes: expected one of "
            f"{', '.join(accepted)}"
        )
    if tensor_type == BASE_TYPES and base is None:
        raise ConfigError(
            "tensor type 'base' keeps the base GGUF file's types, but the model's base is not a "
            f"GGUF file: pass one of {', '.join(GGUF_EXPORT_TYPES)}"
        )
    if base is None and tokenizer_metadata is None:
        raise ModelStateError(
            "a GGUF model needs its tokenizer: export a model whose base is a GGUF file (its "
            "tokenizer.* keys are copied), or pass tokenizer_metadata"
        )
    if base is not None:
        _check_base(config, base)
    base_types = _base_tensor_types(base) if base is not None else {}
    _check_path(Path(path), overwrite)

    params = model.named_parameters()
    plan: list[tuple[str, str, str, tuple[int, ...], int | None]] = []
    bad: list[str] = []
    for hf, var in params:
        name_ = gguf_name(hf)
        shape = tuple(int(s) for s in var.shape)
        if tensor_type == BASE_TYPES:
            if name_ not in base_types:
                raise ModelStateError(
                    f"tensor {name_!r} is not in the base GGUF {str(base)!r}: it is not the "
                    "model's base"
                )
            ggml_type = base_types[name_]
        else:
            ggml_type = "F32" if len(shape) == 1 else tensor_type
        if ggml_type not in GGUF_EXPORT_TYPES:
            bad.append(f"{name_} ({ggml_type})")
            continue
        block = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[ggml_type]][0]
        if shape[-1] % block:
            raise ConfigError(
                f"tensor {name_!r} has rows of {shape[-1]} values, not a multiple of {ggml_type}'s "
                f"block of {block}: pick another tensor type"
            )
        plan.append((hf, name_, ggml_type, shape, _heads_of(hf, config)))
    if bad:
        more = f" and {len(bad) - 3} more" if len(bad) > 3 else ""
        raise ConfigError(
            f"the base GGUF {str(base)!r} stores {', '.join(bad[:3])}{more} in a type riftco "
            f"cannot quantize; it writes {', '.join(GGUF_EXPORT_TYPES)}: pass one of them"
        )
    freqs = _rope_freqs(config)
    if base is not None and _ROPE_FREQS in base_types:
        from riftco._native import read_gguf_tensor

        freqs = np.asarray(read_gguf_tensor(base, _ROPE_FREQS), dtype=np.float32)

    # The adapted matrices, to check after quantizing that the update survived the rounding.
    adapted = {g for _, g, _, _ in _lora_pairs(model)} if model.has_lora else set()
    if model.has_lora:
        if model.frozen_weights_dtype != "float32":
            # Merging writes the base: a 16-bit or quantized one is dequantized first (exactly).
            model.set_frozen_weights_dtype("float32")
        model.merge_lora()
    variables = dict(model.named_parameters())

    tensors: list[_Tensor] = []
    if freqs is not None:
        rope_freqs: npt.NDArray[np.float32] = freqs
        tensors.append(_Tensor(_ROPE_FREQS, "F32", tuple(freqs.shape), lambda: rope_freqs))
    base_types_ = _base_tensor_types(base) if base is not None and adapted else {}
    base_path = base if base is not None else Path()
    # Over the adapted matrices: Σ <written - base, update> and Σ |update|², the share of the
    # adapters' update the written file keeps (projected on the update's direction).
    kept = [0.0, 0.0]
    for hf, name_, ggml_type, shape, heads in plan:

        def produce(hf: str = hf, name_: str = name_, ggml_type: str = ggml_type,
                    heads: int | None = heads) -> npt.NDArray[Any]:
            values = np.ascontiguousarray(variables[hf].numpy(), dtype=np.float32)
            if heads is not None:
                values = permute_qk_rows(values, heads)
            data = _quantize(values, ggml_type)
            if name_ in adapted and ggml_type in QUANTIZED_TYPES and name_ in base_types_:
                # The adapters' update (merged minus the base's values), and how much of it the
                # written, rounded values keep along its direction.
                from riftco._native import dequantize, read_gguf_tensor

                written = dequantize(np.asarray(data).tobytes(), ggml_type.lower(), values.shape)
                base_values = np.asarray(read_gguf_tensor(base_path, name_)).reshape(values.shape)
                update = (values - base_values).astype(np.float64).reshape(-1)
                change = (written - base_values).astype(np.float64).reshape(-1)
                kept[0] += float(change @ update)
                kept[1] += float(update @ update)
            return data

        tensors.append(_Tensor(name_, ggml_type, shape, produce))

    types = {t for _, _, t, s, _ in plan if len(s) > 1}
    if tensor_type == BASE_TYPES and base is not None:
        file_type = _read_file_type(base)
    else:
        file_type = _FILE_TYPES[tensor_type]

    def keys(w: Any) -> None:
        w.add_type("model")
        if base is not None:
            _copy_keys(w, base, ("general.", "tokenizer."), ("general.name",) if name else ())
        if name:
            w.add_name(name)
        _llama_keys(w, config)
        if tokenizer_metadata is not None:
            _add_metadata(w, tokenizer_metadata)
        if file_type is not None:
            w.add_file_type(file_type)
        if types - {"F32", "F16", "BF16"}:
            w.add_quantization_version(gguf.GGML_QUANT_VERSION)

    result = _write(Path(path), overwrite, keys, tensors)
    share = kept[0] / kept[1] if kept[1] > 0 else 1.0
    if share < 0.5:
        import warnings

        warnings.warn(
            f"the written matrices keep {max(share, 0.0):.0%} of the adapters' update (its "
            f"projection on the update, over the {len(adapted)} adapted matrices): rounding the "
            f"merged weights to their type loses most of the fine-tuning; write F16, BF16 or "
            f"Q8_0 (--type), or the adapter itself (--adapter), to keep it",
            RuntimeWarning,
            stacklevel=2,
        )
    return result


def _read_file_type(base: Path) -> int | None:
    from riftco._native import read_gguf_metadata

    value = read_gguf_metadata(base).get("general.file_type")
    return int(value) if isinstance(value, int) else None


def _add_metadata(writer: Any, metadata: Mapping[str, Any]) -> None:
    """Adds ``key -> value`` pairs with the types llama.cpp's converter uses for tokenizer
    keys: str, bool, int (uint32; int32 for the token types), float (float32), lists of
    them."""
    gguf = _import_gguf()
    for key, value in metadata.items():
        if isinstance(value, bool):
            writer.add_bool(key, value)
        elif isinstance(value, int):
            writer.add_uint32(key, value)
        elif isinstance(value, float):
            writer.add_float32(key, value)
        elif isinstance(value, str):
            writer.add_string(key, value)
        elif isinstance(value, (list, tuple)):
            if key == "tokenizer.ggml.token_type":
                writer.add_key_value(key, list(value), gguf.GGUFValueType.ARRAY,
                                     sub_type=gguf.GGUFValueType.INT32)
            else:
                writer.add_array(key, list(value))
        else:
            raise ModelStateError(f"metadata {key!r}: cannot write a {type(value).__name__}")


# -- a Hugging Face tokenizer.json as GGUF tokenizer metadata --------------------------------

# Text whose tokens tell llama.cpp's pre-tokenizers apart (digit runs, contractions in either
# case, runs of spaces, tabs and newlines, punctuation runs, letters outside ASCII), as
# llama.cpp's converter identifies a pre-tokenizer by the tokens of a check text.
_CHECK_TEXT = (
    "Hello world! I'M sure you're right, they'll see... 3 33 333 3333 12345678 1.25e-3 $42\n"
    "\n\n  two  spaces\tand\ttabs   \n    indented = {'a': [1, 2]};  // code?!\n"
    "Ünïcödé café naïve — “quotes” 日本語のテキスト 한국어 ελληνικά 🦙🦙 "
    "...!!! ?? ~~~ <|x|>"
)
_UNUSED = 5  # llama_token_type: UNUSED (a [PADn] filler)


def _looks_special(token: str) -> bool:
    """Added tokens llama.cpp's converter marks CONTROL although not ``special``
    (``does_token_look_special``)."""
    return token in ("<pad>", "<mask>", "<2mass>", "[@BOS@]") or (
        token.startswith("<|") and token.endswith("|>")
    ) or (token.startswith("<unused") and token.endswith(">"))


def _regexes(node: Any) -> set[str]:
    """Every ``{"Regex": ...}`` pattern in a ``tokenizer.json`` pre-tokenizer."""
    if isinstance(node, dict):
        found = {node["Regex"]} if isinstance(node.get("Regex"), str) else set()
        return found.union(*(_regexes(v) for v in node.values()))
    if isinstance(node, list):
        return set().union(*(_regexes(v) for v in node))
    return set()


def _pre_candidates(pre_tokenizer: Any, known: Mapping[str, Any]) -> list[str]:
    """One name per distinct pre-tokenizer of ``known``, those whose every expression the
    ``tokenizer.json`` spells first (the most expressions first), then GPT-2's and the rest in
    order, llama.cpp's ``default`` last."""
    names: list[str] = []
    for name, pre in known.items():
        if all(known[n] != pre for n in names):
            names.append(name)
    spelled = _regexes(pre_tokenizer)
    exact = sorted(
        (n for n in names if all(r in spelled for r in known[n].splits)),
        key=lambda n: -len(known[n].splits),
    )
    rest = [n for n in names if n not in exact and n != "default"]
    rest.sort(key=lambda n: n != "gpt-2")
    return [*exact, *rest, *(["default"] if "default" not in exact else [])]


def hf_tokenizer_metadata(
    model_folder: str | os.PathLike[str], vocab_size: int
) -> dict[str, Any]:
    """The ``tokenizer.*`` GGUF keys of a Hugging Face folder's byte-level BPE ``tokenizer.json``
    (GPT-2, Llama 3, SmolLM, Qwen2, ...), for a model of ``vocab_size`` tokens, as llama.cpp's
    converter writes them (``get_vocab_base``): every token by id (``[PADn]`` for unused ids),
    its type (added special tokens, and added tokens that look special, ``<|...|>``, are control
    tokens, other added tokens user-defined), the merges, BOS/EOS from
    ``tokenizer_config.json``, whether the post-processor adds BOS, the chat template.
    ``tokenizer.ggml.pre`` is the first of riftco's rebuilds of llama.cpp's pre-tokenizers
    (:data:`riftco.data.gguf_tokenizer.GGUF_PRE_TOKENIZERS`) whose tokens of a check text equal
    the ``tokenizer.json``'s, those whose split expressions the ``tokenizer.json`` spells tried
    first (as llama.cpp's converter, which names the pre-tokenizer from the tokens of a check
    text).

    Raises:
        ModelStateError: no ``tokenizer.json`` (a riftco byte-level model), a tokenizer that is
            not byte-level BPE, more tokens than ``vocab_size``, or a pre-tokenizer none of
            llama.cpp's reproduces.
        ImportError: the ``tokenizers`` package is not installed.
    """
    import warnings

    from riftco.data.chat_template import read_tokenizer_config
    from riftco.data.gguf_tokenizer import GGUF_PRE_TOKENIZERS
    from riftco.data.tokenizer import TOKENIZER_FILE, Tokenizer

    folder = Path(model_folder)
    file = folder / TOKENIZER_FILE
    if not file.is_file():
        raise ModelStateError(
            f"{str(folder)!r} has no {TOKENIZER_FILE}: a GGUF model needs a tokenizer llama.cpp "
            "knows (riftco's byte-level models have none)"
        )
    data = json.loads(file.read_text(encoding="utf-8"))
    model = data.get("model") if isinstance(data, dict) else None
    byte_level = "ByteLevel" in json.dumps(data.get("pre_tokenizer")) or "ByteLevel" in json.dumps(
        data.get("decoder")
    )
    if not isinstance(model, dict) or model.get("type") != "BPE" or not byte_level:
        kind = model.get("type") if isinstance(model, dict) else None
        raise ModelStateError(
            f"{file}: riftco writes GGUF tokenizers for byte-level BPE only (GPT-2, Llama 3, "
            f"SmolLM, Qwen2); this one is {kind!r}{'' if byte_level else ' without ByteLevel'}: "
            "convert the model with llama.cpp's convert_hf_to_gguf.py"
        )
    tokenizer = Tokenizer.from_folder(folder)
    backend: Any = tokenizer.backend
    vocab: dict[str, int] = backend.get_vocab(with_added_tokens=True)
    reverse = {i: t for t, i in vocab.items()}
    if max(reverse) >= vocab_size:
        raise ModelStateError(
            f"{file} has token id {max(reverse)}, beyond the model's vocab_size of {vocab_size}"
        )
    added = {
        int(t["id"]): bool(t.get("special"))
        for t in data.get("added_tokens") or []
        if isinstance(t, dict) and "id" in t
    }
    tokens: list[str] = []
    types: list[int] = []
    for i in range(vocab_size):
        if i not in reverse:
            tokens.append(f"[PAD{i}]")
            types.append(_UNUSED)
        elif i in added:
            tokens.append(reverse[i])
            types.append(3 if added[i] or _looks_special(reverse[i]) else 4)
        else:
            tokens.append(reverse[i])
            types.append(1)
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges") or []]
    meta: dict[str, Any] = {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": types,
        "tokenizer.ggml.merges": merges,
    }
    bos, eos = tokenizer.bos_token_id, tokenizer.eos_token_id
    if bos is not None:
        meta["tokenizer.ggml.bos_token_id"] = int(bos)
    if eos is not None:
        meta["tokenizer.ggml.eos_token_id"] = int(eos)
    first = backend.encode("a", add_special_tokens=True).ids[:1]
    meta["tokenizer.ggml.add_bos_token"] = bos is not None and first == [bos]
    template = read_tokenizer_config(folder).get("chat_template")
    if isinstance(template, str):
        meta["tokenizer.chat_template"] = template
    want = backend.encode(_CHECK_TEXT, add_special_tokens=False).ids
    tried: list[str] = []
    for name in _pre_candidates(data.get("pre_tokenizer"), GGUF_PRE_TOKENIZERS):
        tried.append(name)
        candidate = {**meta, "tokenizer.ggml.pre": name}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            rebuilt = Tokenizer.from_gguf_metadata(candidate, name=str(file))
        if rebuilt.encode(_CHECK_TEXT, add_special_tokens=False) == want:
            return candidate
    raise ModelStateError(
        f"{file}: its pre-tokenizer splits text as none of llama.cpp's that riftco rebuilds "
        f"({', '.join(tried)}): convert the model with llama.cpp's convert_hf_to_gguf.py"
    )
