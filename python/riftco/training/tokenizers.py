"""The tokenizer of any model path riftco takes: :func:`load_tokenizer`.

A Hugging Face folder and a GGUF file carry their tokenizers (:class:`riftco.data.tokenizer.
Tokenizer`); a riftco run folder (a LoRA post-training output, its ``adapter/``, or a full
post-training output) has none of its own, so its ``training_metadata.json``'s ``base_model`` is
followed to the model it was trained from. A byte-level model gets riftco's byte tokens.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from riftco._native import ModelStateError
from riftco.data.chat_template import TOKENIZER_CONFIG_FILE, ChatTemplate, load_chat_template
from riftco.data.tokenizer import BYTE_VOCAB_SIZE, TOKENIZER_FILE, Tokenizer, folder_of, is_gguf
from riftco.training.run_folder import ADAPTER_DIR, METADATA_FILE

__all__ = ["load_tokenizer", "save_tokenizer"]

_MAX_BASE_MODEL_HOPS = 16
_MAX_METADATA_BYTES = 64 * 1024 * 1024


def _recorded_base_model(folder: Path) -> Path | None:
    """The ``base_model`` a riftco run folder (or its ``adapter/``) records, or ``None`` when it
    records none."""
    for run in (folder, folder.parent) if folder.name == ADAPTER_DIR else (folder,):
        meta = run / METADATA_FILE
        try:
            if not meta.is_file() or meta.stat().st_size > _MAX_METADATA_BYTES:
                continue
            recorded = json.loads(meta.read_bytes()).get("base_model")
        except (OSError, ValueError, AttributeError):
            continue
        if isinstance(recorded, dict):
            recorded = recorded.get("path")
        if isinstance(recorded, str) and recorded:
            return Path(recorded)
    return None


def _vocab_size(folder: Path) -> int | None:
    """The vocabulary size a model folder's ``config.json`` records, if any."""
    try:
        config = json.loads((folder / "config.json").read_bytes())
        return int(config["vocab_size"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def load_tokenizer(path: str | os.PathLike[str]) -> Tokenizer:
    """The tokenizer of the model at ``path``: a GGUF file (``.gguf``, or the ``GGUF`` magic), a
    Hugging Face model folder or a file in one (its ``tokenizer.json``), a riftco run folder or
    ``adapter/`` (the tokenizer of the ``base_model`` its ``training_metadata.json`` records),
    else riftco's byte tokens (with the folder's chat template, or the first one along the
    recorded base models, or riftco's default).

    Raises:
        ModelStateError: nothing at ``path``; a GGUF whose tokenizer metadata is missing,
            malformed or of a kind riftco does not build; no GGUF reader in this build; a run
            of a model with its own vocabulary whose recorded base model is gone.
        TokenError, ChatTemplateError, ImportError: as :meth:`Tokenizer.from_folder`.
    """
    template: ChatTemplate | None = None
    current = Path(path)
    seen: set[Path] = set()
    for _ in range(_MAX_BASE_MODEL_HOPS):
        if current.is_file() and (current.suffix.lower() == ".gguf" or is_gguf(current)):
            return Tokenizer.from_gguf(current)
        folder = folder_of(current)
        if (folder / TOKENIZER_FILE).is_file():
            return Tokenizer.from_folder(folder)
        if template is None:
            template = load_chat_template(folder)
        key = folder.resolve()
        base = _recorded_base_model(folder)
        if base is None or key in seen:
            break
        if not base.exists():
            run = folder.parent if folder.name == ADAPTER_DIR else folder
            vocab = _vocab_size(run)
            if vocab is not None and vocab <= BYTE_VOCAB_SIZE:
                break  # a byte-level run needs no base for its tokens
            raise ModelStateError(
                f"the tokenizer of {os.fspath(path)!r} is its base model's, and the base model "
                f"its {METADATA_FILE} records, {os.fspath(base)!r}, is gone: put it back, or "
                "load the tokenizer from where it is now (riftco generate: --base-model)"
            )
        seen.add(key)
        current = base
    return Tokenizer.byte_tokens(template)


def save_tokenizer(tokenizer: Tokenizer, folder: Path) -> bool:
    """Writes ``tokenizer``'s ``tokenizer.json`` and a ``tokenizer_config.json`` (BOS, EOS, the
    chat template) into ``folder``, making a model folder there carry its own tokenizer as a
    Hugging Face folder does (``load_tokenizer``, ``riftco generate`` and transformers read
    them). Byte tokens have nothing to write: returns whether anything was written.

    Raises:
        OSError: the files cannot be written.
    """
    if tokenizer.backend is None:
        return False
    tokenizer.backend.save(str(folder / TOKENIZER_FILE))
    config = {
        "bos_token": tokenizer.bos_token,
        "eos_token": tokenizer.eos_token,
        "chat_template": tokenizer.chat_template.source,
    }
    text = json.dumps(config, indent=2) + "\n"
    (folder / TOKENIZER_CONFIG_FILE).write_text(text, encoding="utf-8")
    return True
