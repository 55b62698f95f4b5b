"""``riftco export``: write a model, or its LoRA adapter, as a GGUF file for llama.cpp and Ollama.

``--model`` is what ``riftco generate`` takes: a LoRA post-training output folder (its
``adapter/`` on the base model its ``training_metadata.json`` names, or ``--base-model``), an
``adapter/`` folder, a pretraining or full post-training output folder, a Hugging Face model
folder, or a GGUF file.

Without ``--adapter`` the file is the whole model, LoRA adapters merged into the weights: the
``llama`` architecture's metadata and every tensor under llama.cpp's name, the matrices in
``--type`` (F32, F16, BF16, Q8_0, Q5_1, Q5_0, Q4_1, Q4_0; the norms stay F32), or ``--type base``
for each tensor in the type it has in the base GGUF file. The tokenizer is the base GGUF file's
(its ``tokenizer.*`` keys), or the base folder's byte-level BPE ``tokenizer.json`` written as
llama.cpp's converter writes it (GPT-2, Llama 3, SmolLM, Qwen2 tokenizers); a riftco byte-level
model has none llama.cpp knows and is refused. Run it with ``llama-cli -m OUT.gguf`` or an
Ollama ``Modelfile`` (``FROM ./OUT.gguf``).

With ``--adapter`` the file is the LoRA adapter alone, as llama.cpp's GGUF LoRA adapter
(``general.type`` ``adapter``, ``adapter.lora.alpha``, ``blk.N.attn_q.weight.lora_a`` /
``lora_b``, ...; float32): ``llama-cli -m BASE.gguf --lora OUT.gguf`` (Ollama: ``ADAPTER
./OUT.gguf``), where ``BASE.gguf`` is the base GGUF file or the Hugging Face base converted by
``convert_hf_to_gguf.py``.

Bad input (no adapter to export, an adapter whose base model does not match it, an unknown
``--type``, a base quant type riftco cannot write, an existing ``--out`` without
``--overwrite``) is one ``error:`` line and exit code 2, with nothing written: the file is
written beside ``--out`` and renamed onto it when complete.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import warnings
from pathlib import Path
from typing import Any

from riftco._native import DecoderOnlyTransformer, LoraError, ModelStateError
from riftco.commands.arguments import fail
from riftco.commands.generate import _adapter, _adapter_base, _trained_frozen_dtype
from riftco.data.gguf_export import (
    BASE_TYPES,
    GGUF_EXPORT_TYPES,
    GgufExport,
    export_lora_adapter,
    export_merged_model,
    hf_tokenizer_metadata,
)
from riftco.data.tokenizer import TOKENIZER_FILE, is_gguf
from riftco.training.run_folder import METADATA_FILE
from riftco.training.stages import load_model, resolve_model_state

__all__ = ["add_arguments", "tokenizer_source_of", "run"]

EPILOG = """examples:
  riftco export --model runs/post_train --out tuned.gguf             # merged, F32
  riftco export --model runs/post_train --out tuned-q8.gguf --type Q8_0
  riftco export --model runs/post_train --out tuned-q4.gguf --type base  # the base GGUF's types
  riftco export --model runs/post_train --adapter --out adapter.gguf  # llama-cli --lora"""

# The config fields an adapter's base must share with the model it was trained on.
_SHAPE_FIELDS = ("vocab_size", "d_model", "n_heads", "n_kv_heads", "n_layers", "d_ff")
_MAX_HOPS = 8


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The flags of ``riftco export``."""
    p.add_argument(
        "--model",
        required=True,
        metavar="PATH",
        help="a LoRA post-training folder or adapter folder, a model folder or model.safetensors, "
        "or a GGUF file",
    )
    p.add_argument(
        "--base-model",
        default=None,
        metavar="PATH",
        help="the base model of an adapter (default: the one its run's metadata names)",
    )
    p.add_argument("--out", required=True, metavar="FILE", help="the GGUF file to write")
    p.add_argument(
        "--adapter",
        action="store_true",
        help="write the LoRA adapter alone, as a llama.cpp GGUF LoRA adapter (--lora), instead "
        "of the merged model",
    )
    p.add_argument(
        "--type",
        type=str.upper,
        default="F32",
        metavar="TYPE",
        help=f"tensor type of the merged model's matrices: {', '.join(GGUF_EXPORT_TYPES)}, or "
        "BASE (each tensor as in the base GGUF file) (default: %(default)s)",
    )
    p.add_argument("--name", default=None, help="general.name of the file (default: the base's)")
    p.add_argument(
        "--overwrite", action="store_true", help="replace --out when it exists (refused without)"
    )


def _recorded_base(folder: Path) -> str | None:
    meta = folder / METADATA_FILE
    if not meta.is_file():
        return None
    try:
        base = json.loads(meta.read_bytes()).get("base_model")
    except (OSError, ValueError, AttributeError):
        return None
    return base if isinstance(base, str) else None


def _recorded_config(adapter: Path) -> dict[str, Any] | None:
    meta = adapter.parent / METADATA_FILE
    try:
        config = json.loads(meta.read_bytes()).get("model_config")
    except (OSError, ValueError, AttributeError):
        return None
    return config if isinstance(config, dict) else None


def tokenizer_source_of(path: str | os.PathLike[str]) -> Path | None:
    """Where a model's tokenizer is: ``path`` itself when it is a GGUF file, a folder with a
    ``tokenizer.json`` (the model's, or the file's folder), else the same for the base model
    its run folders record (``base_model`` of ``training_metadata.json``, followed); ``None``
    when there is none (a riftco byte-level model)."""
    current = Path(path)
    for _ in range(_MAX_HOPS):
        if current.is_file():
            if current.suffix.lower() == ".gguf" or is_gguf(current):
                return current
            current = current.parent
        if (current / TOKENIZER_FILE).is_file():
            return current
        base = _recorded_base(current)
        if base is None and current.name == "adapter":
            base = _recorded_base(current.parent)
        if base is None:
            return None
        current = Path(base)
    return None


def _check_adapter_base(adapter: Path, base: Path, model: DecoderOnlyTransformer) -> None:
    """The base model has the shape of the model the adapter was trained on (as its run
    records it)."""
    recorded = _recorded_config(adapter)
    if recorded is None:
        return
    config = model.config.to_dict()
    for key in _SHAPE_FIELDS:
        if key in recorded and recorded[key] != config.get(key):
            fail(
                f"the base model {str(base)!r} does not match the adapter {str(adapter)!r}: its "
                f"{key} is {config.get(key)}, the adapter was trained on {recorded[key]}"
            )


def _load(args: argparse.Namespace) -> tuple[DecoderOnlyTransformer, str, Path | None]:
    """The model (adapters loaded), what it is, and where its tokenizer is (a GGUF file, a
    folder with ``tokenizer.json``, or ``None``)."""
    path = Path(args.model)
    adapter = _adapter(path)
    if adapter is None:
        if args.base_model is not None:
            fail(f"--base-model is for an adapter, and {str(path)!r} holds none")
        try:
            state = resolve_model_state(path)
        except ModelStateError as e:
            fail(f"{e}; or a LoRA post-training folder (runs/post_train)")
        # float32: merging writes the base weights (a GGUF's quantized blocks are dequantized).
        model = load_model(state, dtype="float32")
        return model, str(state), tokenizer_source_of(state)
    base = _adapter_base(adapter, args.base_model)
    # The base as the run trained on it (a QLoRA run's NF4 values, dequantized when merging),
    # else float32: merging writes the base weights.
    model = load_model(base, dtype=_trained_frozen_dtype(adapter) or "float32")
    _check_adapter_base(adapter, base, model)
    try:
        model.load_lora(str(adapter))
    except (LoraError, ModelStateError) as e:
        fail(f"the adapter {str(adapter)!r} does not fit the base model {str(base)!r}: {e}")
    return model, f"{base} + LoRA adapter {adapter}", tokenizer_source_of(base)


def _summary(result: GgufExport) -> str:
    counts: dict[str, int] = {}
    for t in result.tensor_types.values():
        counts[t] = counts.get(t, 0) + 1
    types = ", ".join(f"{n} {t}" for t, n in sorted(counts.items(), key=lambda kv: -kv[1]))
    return f"{result.n_tensors} tensors ({types}), {result.n_bytes / 1e6:.1f} MB"


def run(args: argparse.Namespace, prog: str = "riftco export") -> None:
    """Checks the flags, loads the model and writes ``--out`` (see the module docstring)."""
    out = Path(args.out)
    tensor_type = BASE_TYPES if args.type == "BASE" else args.type
    accepted = (*GGUF_EXPORT_TYPES, "BASE")
    if tensor_type not in (*GGUF_EXPORT_TYPES, BASE_TYPES):
        fail(f"--type {args.type}: expected one of {', '.join(accepted)}")
    if args.adapter and tensor_type != "F32":
        fail(f"--type {args.type} is for the merged model: an adapter is written in F32")
    if out.is_dir():
        fail(f"--out {str(out)!r} is a folder: pass a file path (.gguf)")
    if out.exists() and not args.overwrite:
        fail(f"--out {str(out)!r} exists: pass --overwrite to replace it, or another path")
    if not out.parent.is_dir():
        fail(f"the folder of --out {str(out)!r} does not exist")
    model, what, source = _load(args)
    if args.adapter:
        if not model.has_lora:
            fail(f"{what} has no LoRA adapter to export: pass a LoRA post-training folder")
        result = export_lora_adapter(model, out, overwrite=args.overwrite, name=args.name)
        kind = "LoRA adapter"
    else:
        if source is None:
            fail(
                f"{what} has no tokenizer (a riftco byte-level model): a GGUF model needs one "
                "llama.cpp knows; export a model fine-tuned from a GGUF file or a Hugging Face "
                "folder with tokenizer.json"
            )
        base_gguf = source if source.is_file() else None
        tokenizer = None
        if base_gguf is None:
            try:
                tokenizer = hf_tokenizer_metadata(source, int(model.config.vocab_size))
            except ImportError as e:
                fail(str(e))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            result = export_merged_model(
                model,
                out,
                tensor_type=tensor_type,
                base_gguf=base_gguf,
                tokenizer_metadata=tokenizer,
                overwrite=args.overwrite,
                name=args.name,
            )
        for w in caught:
            print(f"{prog}: warning: {w.message}", file=sys.stderr)
        kind = "model (adapters merged)" if "LoRA" in what else "model"
    print(f"{prog}: {what} -> {out}: {kind}, {_summary(result)}", file=sys.stderr)
