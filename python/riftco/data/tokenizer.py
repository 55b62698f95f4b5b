"""One tokenizer object for every model riftco runs: :class:`Tokenizer`, from
:func:`riftco.load_tokenizer` (:mod:`riftco.training.tokenizers`, which also finds a riftco run's
tokenizer through the base model it records).

Three sources, one interface (``encode``, ``decode``, ``bos_token_id``, ``eos_token_id``,
``stop_token_ids``, ``apply_chat_template``, :class:`StreamingDetokenizer`):

- a Hugging Face model folder with a ``tokenizer.json``: that file through the ``tokenizers``
  package (:func:`riftco.hf_tokenizer.load_folder_tokenizer`), with the ``bos_token`` /
  ``eos_token`` of its ``tokenizer_config.json`` and its chat template
  (:func:`riftco.chat_template.load_chat_template`);
- a GGUF file (llama.cpp, Ollama, LM Studio): its ``tokenizer.ggml.*`` metadata rebuilt as a
  ``tokenizers`` tokenizer (:mod:`riftco.gguf_tokenizer`: byte-level BPE with llama.cpp's
  pre-tokenizers, or SentencePiece BPE), with the file's ``tokenizer.chat_template``;
- a riftco byte-level model (a folder without ``tokenizer.json``): token ``i`` is byte ``i`` of
  the UTF-8 text (ids ``0..255``), with the folder's chat template or riftco's default one
  (:func:`riftco.chat_template.default_chat_template`).

A riftco run folder (a LoRA post-training output, its ``adapter/``, or a full post-training
output) has no tokenizer of its own: :func:`riftco.load_tokenizer` follows the ``base_model``
its ``training_metadata.json`` records to the model it was trained from.

The end of an assistant turn (:attr:`Tokenizer.end_of_turn`) is read off the chat template
itself: the text it writes after an assistant message (``<|im_end|>`` for ChatML,
``<|eot_id|>`` for Llama 3, ``</s>`` for Llama 2, ``<|end|>`` for riftco's default template).
When that text is one token, its id is one of :attr:`Tokenizer.stop_token_ids`, with EOS.
"""

from __future__ import annotations

import json
import operator
import os
import warnings
from collections.abc import Iterable, Mapping, Sequence
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np

import riftco._native as _native
from riftco._native import ModelStateError, TokenError
from riftco.data.chat_template import (
    ChatTemplate,
    ChatTemplateError,
    default_chat_template,
    load_chat_template,
    read_tokenizer_config,
    special_token_text,
)
from riftco.data.gguf_tokenizer import BYTE_LEVEL_ALPHABET, build_gguf_vocabulary

__all__ = [
    "BYTE_VOCAB_SIZE",
    "GGUF_MAGIC",
    "TOKENIZER_FILE",
    "StreamingDetokenizer",
    "Tokenizer",
    "folder_of",
    "is_gguf",
]

BYTE_VOCAB_SIZE = 256
"""Vocabulary of riftco's byte tokens: token ``i`` is byte ``i``."""

GGUF_MAGIC = b"GGUF"
TOKENIZER_FILE = "tokenizer.json"


class Tokenizer:
    """A model's tokenizer: text to token ids and back, its special ids and chat template.

    Build one with :func:`load_tokenizer` (a model folder, a GGUF file, or a riftco run), or with
    :meth:`byte_tokens`, :meth:`from_folder`, :meth:`from_gguf`, :meth:`from_gguf_metadata`.

    Attributes:
        name: where the tokenizer came from (a file, or ``"riftco byte tokens"``), for messages.
        backend: the ``tokenizers.Tokenizer`` doing the work, or ``None`` for byte tokens.
        vocab_size: the number of token ids (``256`` for bytes); every id is below it.
        bos_token_id, eos_token_id: the beginning- and end-of-sequence ids, or ``None``.
        bos_token, eos_token: their text, or ``None``.
        chat_template: the template :meth:`apply_chat_template` renders (the source's own, or
            riftco's default template when it has none, as ``riftco post-train`` renders rows).
        warnings: what was assumed while building it (a GGUF without a pre-tokenizer name).
    """

    def __init__(
        self,
        backend: Any | None,
        *,
        name: str,
        vocab_size: int,
        bos_token_id: int | None = None,
        eos_token_id: int | None = None,
        add_bos_token: bool = False,
        add_eos_token: bool = False,
        chat_template: ChatTemplate | None = None,
        extra_stop_token_ids: Iterable[int] = (),
        notes: Sequence[str] = (),
    ) -> None:
        self.backend = backend
        self.name = name
        self.vocab_size = int(vocab_size)
        for what, value in (("bos_token_id", bos_token_id), ("eos_token_id", eos_token_id)):
            if value is not None and not 0 <= value < self.vocab_size:
                raise TokenError(
                    f"{name}: {what} {value} is outside the vocabulary [0, {self.vocab_size})"
                )
        self.bos_token_id = bos_token_id
        self.eos_token_id = eos_token_id
        self.bos_token = None if bos_token_id is None else self._token_text(bos_token_id)
        self.eos_token = None if eos_token_id is None else self._token_text(eos_token_id)
        # riftco adds these itself (GGUF); a tokenizer.json's post-processor adds its own.
        self._add_bos = bool(add_bos_token) and bos_token_id is not None
        self._add_eos = bool(add_eos_token) and eos_token_id is not None
        self.chat_template = chat_template if chat_template is not None else default_chat_template()
        self._extra_stop_ids = frozenset(int(i) for i in extra_stop_token_ids)
        self.warnings = tuple(notes)
        self._may_drop_text = backend is not None and _may_drop_text(backend)

    # -- construction ------------------------------------------------------------------------

    @classmethod
    def byte_tokens(cls, chat_template: ChatTemplate | None = None) -> Tokenizer:
        """riftco's byte tokens (ids ``0..255``, no special tokens) with ``chat_template``
        (default: :func:`riftco.chat_template.default_chat_template`)."""
        return cls(None, name="riftco byte tokens", vocab_size=BYTE_VOCAB_SIZE,
                   chat_template=chat_template)

    @classmethod
    def from_folder(cls, model_folder: str | os.PathLike[str]) -> Tokenizer:
        """The tokenizer of a Hugging Face model folder (or of the folder of a file in it): its
        ``tokenizer.json``, with ``bos_token``/``eos_token`` of ``tokenizer_config.json`` and its
        chat template; riftco's byte tokens (with the folder's template, if any) when it has no
        ``tokenizer.json``. No run-folder lookup (see :func:`load_tokenizer`).

        Raises:
            ModelStateError: the folder does not exist.
            TokenError: a ``tokenizer.json`` the ``tokenizers`` package cannot read, or a
                ``bos_token``/``eos_token`` that is not in its vocabulary.
            ChatTemplateError: a bad ``tokenizer_config.json`` or template.
            ImportError: ``tokenizers`` is not installed.
        """
        from riftco.data.hf_tokenizer import load_folder_tokenizer

        folder = folder_of(model_folder)
        template = load_chat_template(folder)
        backend = load_folder_tokenizer(folder)
        if backend is None:
            return cls.byte_tokens(template)
        config_path = folder / "tokenizer_config.json"
        config = read_tokenizer_config(folder)
        ids: dict[str, int | None] = {}
        for key in ("bos_token", "eos_token"):
            text = special_token_text(config.get(key), key, str(config_path))
            ids[key] = None if text is None else backend.token_to_id(text)
            if text is not None and ids[key] is None:
                raise TokenError(
                    f"{config_path}: {key} {text!r} is not a token of {folder / TOKENIZER_FILE}"
                )
        return cls(
            backend,
            name=str(folder / TOKENIZER_FILE),
            vocab_size=int(backend.get_vocab_size(with_added_tokens=True)),
            bos_token_id=ids["bos_token"],
            eos_token_id=ids["eos_token"],
            chat_template=template,
        )

    @classmethod
    def from_gguf(cls, path: str | os.PathLike[str]) -> Tokenizer:
        """The tokenizer of a GGUF file, from the metadata ``riftco._native.read_gguf_metadata``
        reads (see :meth:`from_gguf_metadata`).

        Raises:
            ModelStateError: riftco's GGUF reader is missing from this build, the file is not a
                readable GGUF, or its tokenizer metadata is missing or malformed (naming the
                file and the key).
        """
        reader = getattr(_native, "read_gguf_metadata", None)
        if reader is None:
            raise ModelStateError(
                f"{os.fspath(path)}: reading GGUF files needs riftco's GGUF reader "
                "(riftco._native.read_gguf_metadata), which this build of riftco lacks"
            )
        metadata = reader(os.fspath(path))
        return cls.from_gguf_metadata(metadata, name=os.fspath(path))

    @classmethod
    def from_gguf_metadata(cls, metadata: Mapping[str, Any], name: str = "GGUF metadata") -> Tokenizer:
        """A tokenizer rebuilt from a GGUF file's metadata (key -> value, as
        ``gguf.GGUFReader``'s fields give them): ``tokenizer.ggml.model`` (``"gpt2"`` or
        ``"llama"``, see :mod:`riftco.gguf_tokenizer`), ``tokens``, ``token_type``, ``merges``,
        ``scores``, ``pre``, ``bos_token_id``, ``eos_token_id``, ``eot_token_id``,
        ``eom_token_id``, ``unknown_token_id``, ``padding_token_id``, ``add_bos_token``,
        ``add_eos_token``, ``add_space_prefix``, and ``tokenizer.chat_template``. ``name`` (the
        file) is used in messages.

        Raises:
            ModelStateError: a missing or malformed key (naming it), a tokenizer model or
                pre-tokenizer riftco does not build, a duplicate token, a malformed merge.
            ImportError: ``tokenizers`` is not installed.
        """
        vocab = build_gguf_vocabulary(metadata, name)
        bos, eos = vocab.bos_token_id, vocab.eos_token_id
        template = None
        if vocab.chat_template is not None:
            template = ChatTemplate(
                vocab.chat_template,
                bos_token=None if bos is None else vocab.tokens[bos],
                eos_token=None if eos is None else vocab.tokens[eos],
                name=f"the tokenizer.chat_template of {name}",
            )
        for message in vocab.warnings:
            warnings.warn(message, RuntimeWarning, stacklevel=2)
        return cls(
            vocab.backend,
            name=name,
            vocab_size=len(vocab.tokens),
            bos_token_id=bos,
            eos_token_id=eos,
            add_bos_token=vocab.add_bos_token,
            add_eos_token=vocab.add_eos_token,
            chat_template=template,
            extra_stop_token_ids=vocab.end_ids,
            notes=vocab.warnings,
        )

    # -- the interface -----------------------------------------------------------------------

    @property
    def is_bytes(self) -> bool:
        """Whether these are riftco's byte tokens (id ``i`` is byte ``i``)."""
        return self.backend is None

    def __repr__(self) -> str:
        return (
            f"Tokenizer(name={self.name!r}, vocab_size={self.vocab_size}, "
            f"bos_token_id={self.bos_token_id}, eos_token_id={self.eos_token_id})"
        )

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """The token ids of ``text``. With ``add_special_tokens`` the ids the tokenizer frames
        a sequence with (BOS for Llama models; a ``tokenizer.json``'s post-processor) are
        added; a rendered chat prompt already holds them: encode it with
        ``add_special_tokens=False``. Special tokens written in ``text`` (``<|im_end|>``) are
        their ids. Byte tokens: the UTF-8 bytes.

        Raises:
            TypeError: ``text`` is not a ``str``.
            TokenError: ``text`` cannot be encoded: it is not valid Unicode (a lone surrogate),
                or holds characters the vocabulary cannot spell (naming the first one).
        """
        if not isinstance(text, str):
            raise TypeError(f"text must be a str; got {type(text).__name__} {text!r:.80}")
        if self.backend is None:
            try:
                return list(text.encode("utf-8"))
            except UnicodeEncodeError as e:
                raise TokenError(f"the text is not encodable as UTF-8: {e}") from None
        try:
            encoding = self.backend.encode(text, add_special_tokens=add_special_tokens)
        except Exception as e:  # tokenizers raises plain Exceptions (an unknown word, ...)
            try:
                text.encode("utf-8")
            except UnicodeEncodeError as bad:
                raise TokenError(f"the text is not valid Unicode: {bad}") from None
            raise TokenError(f"{self.name} cannot encode the text: {e}") from None
        if self._may_drop_text:
            _check_covered(text, encoding.offsets, self.name)
        ids = [int(i) for i in encoding.ids]
        if add_special_tokens:
            if self._add_bos and self.bos_token_id is not None:
                ids.insert(0, self.bos_token_id)
            if self._add_eos and self.eos_token_id is not None:
                ids.append(self.eos_token_id)
        return ids

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = False) -> str:
        """The text of the token ids ``ids`` (special tokens written out unless
        ``skip_special_tokens``). Byte tokens: the bytes as UTF-8, an invalid sequence replaced
        by U+FFFD (so is a byte-level token sequence cut inside a character).

        Raises:
            TypeError: an id that is not an integer.
            TokenError: an id outside ``[0, vocab_size)``, naming it and its index.
        """
        checked = self._check_ids(ids)
        if self.backend is None:
            return bytes(checked).decode("utf-8", errors="replace")
        return str(self.backend.decode(checked, skip_special_tokens=skip_special_tokens))

    def apply_chat_template(
        self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = False
    ) -> str:
        """The text of ``messages`` (``{"role": ..., "content": ...}`` each) through
        :attr:`chat_template`, ending with the assistant's turn opened when
        ``add_generation_prompt`` — transformers' ``apply_chat_template(messages,
        tokenize=False, add_generation_prompt=...)``. Encode it with
        ``add_special_tokens=False`` (the template writes its own BOS).

        Raises:
            ChatTemplateError: the template fails or rejects the conversation.
            ImportError: Jinja2 is not installed (only the default template renders without).
        """
        return self.chat_template.render(messages, add_generation_prompt=add_generation_prompt)

    def token_to_id(self, token: str) -> int | None:
        """The id of the token spelled ``token`` (as the vocabulary spells it), or ``None``."""
        if self.backend is None:
            return None
        found = self.backend.token_to_id(token)
        return None if found is None else int(found)

    @cached_property
    def special_token_ids(self) -> frozenset[int]:
        """The ids of the special tokens (matched whole in text, dropped by
        ``decode(..., skip_special_tokens=True)``)."""
        if self.backend is None:
            return frozenset()
        return frozenset(
            int(i) for i, t in self.backend.get_added_tokens_decoder().items() if t.special
        )

    @cached_property
    def end_of_turn(self) -> str | None:
        """The text :attr:`chat_template` writes right after an assistant message (its first
        whitespace-separated word: ``"<|im_end|>"``, ``"<|eot_id|>"``, ``"</s>"``,
        ``"<|end|>"``), or ``None`` when it writes none or cannot render a user/assistant
        exchange."""
        probe = "riftcoEndOfTurnProbe"
        try:
            text = self.chat_template.render(
                [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": probe}]
            )
        except (ChatTemplateError, ImportError):
            return None
        at = text.rfind(probe)
        words = text[at + len(probe) :].split() if at >= 0 else []
        return words[0] if words else None

    @cached_property
    def stop_token_ids(self) -> frozenset[int]:
        """Ids that end generation: EOS, the GGUF's end-of-turn/end-of-message ids, and the id
        of :attr:`end_of_turn` when it is one token (or starts with a special token)."""
        ids = set(self._extra_stop_ids)
        if self.eos_token_id is not None:
            ids.add(self.eos_token_id)
        marker = self.end_of_turn
        if marker is not None and self.backend is not None:
            try:
                found = self.encode(marker, add_special_tokens=False)
            except TokenError:
                found = []
            if len(found) == 1 or (found and found[0] in self.special_token_ids):
                ids.add(found[0])
        return frozenset(ids)

    @cached_property
    def stop_text(self) -> str | None:
        """:attr:`end_of_turn` when it is not one of :attr:`stop_token_ids` (riftco's default
        template's ``<|end|>`` is several tokens, or bytes): the text a chat answer is cut at."""
        marker = self.end_of_turn
        if marker is None or self.backend is None:
            return marker
        try:
            found = self.encode(marker, add_special_tokens=False)
        except TokenError:
            return marker
        return None if found and found[0] in self.stop_token_ids else marker

    def stream(self, context: Sequence[int] = (), skip_special_tokens: bool = False) -> StreamingDetokenizer:
        """A :class:`StreamingDetokenizer` over this tokenizer, after the ids ``context``."""
        return StreamingDetokenizer(self, context, skip_special_tokens=skip_special_tokens)

    # -- helpers -----------------------------------------------------------------------------

    def _token_text(self, token_id: int) -> str:
        if self.backend is None:
            return bytes([token_id]).decode("latin-1")
        text = self.backend.id_to_token(token_id)
        return "" if text is None else str(text)

    def _check_ids(self, ids: Iterable[int]) -> list[int]:
        if isinstance(ids, np.ndarray):
            if ids.dtype.kind not in "iu":
                raise TypeError(f"token ids must be integers; got a {ids.dtype} array")
            ids = ids.reshape(-1).tolist()
        out: list[int] = []
        for k, value in enumerate(ids):
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
                raise TypeError(f"token ids must be ints; got {value!r} at index {k}")
            v = operator.index(value)
            if not 0 <= v < self.vocab_size:
                raise TokenError(
                    f"token id {v} at index {k} is outside {self.name}'s vocabulary "
                    f"[0, {self.vocab_size})"
                )
            out.append(v)
        return out


class StreamingDetokenizer:
    """Text of token ids given one at a time, never cut inside a character: each
    :meth:`add_token` returns the text the new id completes — ``""`` while the decoded text
    ends in U+FFFD (an unfinished UTF-8 sequence of byte tokens) — and :meth:`finalize` what
    is left.

    The method is vLLM's incremental detokenization (as transformers' ``TextStreamer`` and
    MLX-LM's detokenizers do it): decode a short window of ids before the new ones and after,
    and print the difference; the window keeps the token before the new text, so that the
    leading space a SentencePiece decoder drops from a sequence's first token is kept. The
    pieces joined are ``decode(context + ids)`` less ``decode(context)`` (for ``context=()``,
    exactly ``decode(ids)``).

    Args:
        tokenizer: the :class:`Tokenizer`.
        context: ids already shown (the prompt), decoded for context only.
        skip_special_tokens: as in :meth:`Tokenizer.decode`.

    Attributes:
        text: everything returned so far, joined.
    """

    _CONTEXT_TOKENS = 5

    def __init__(
        self, tokenizer: Tokenizer, context: Sequence[int] = (), skip_special_tokens: bool = False
    ) -> None:
        self._tokenizer = tokenizer
        self._skip = skip_special_tokens
        self._ids = tokenizer._check_ids(context)
        self._read = len(self._ids)
        self._prefix = max(self._read - self._CONTEXT_TOKENS, 0)
        if self._decode(self._prefix, self._read).endswith("\ufffd"):
            # A context cut inside a character cannot frame the new text: start afresh.
            self._ids, self._read, self._prefix = [], 0, 0
        self.text = ""

    def _decode(self, start: int, stop: int | None = None) -> str:
        return self._tokenizer.decode(self._ids[start:stop], skip_special_tokens=self._skip)

    def add_token(self, token_id: int) -> str:
        """Adds one id; returns the text it completes (possibly ``""``).

        Raises:
            TokenError: an id outside the vocabulary.
        """
        self._ids.extend(self._tokenizer._check_ids([token_id]))
        return self._emit(final=False)

    def finalize(self) -> str:
        """The text not returned yet (an unfinished character as U+FFFD)."""
        return self._emit(final=True)

    def _emit(self, final: bool) -> str:
        if self._read == len(self._ids):
            return ""
        before = self._decode(self._prefix, self._read)
        after = self._decode(self._prefix)
        if not final and (len(after) <= len(before) or after.endswith("\ufffd")):
            return ""
        common = len(before)
        if not after.startswith(before):
            common = next(
                (k for k, (a, b) in enumerate(zip(before, after)) if a != b),
                min(len(before), len(after)),
            )
        piece = after[common:]
        self._prefix, self._read = self._read, len(self._ids)
        self.text += piece
        return piece


# -- checks --------------------------------------------------------------------------------


def _may_drop_text(backend: Any) -> bool:
    """Whether ``backend`` can silently leave characters out (a BPE with neither an unknown
    token nor byte fallback, whose vocabulary lacks some of GPT-2's 256 byte symbols)."""
    model = backend.model
    if type(model).__name__ != "BPE":
        return False
    if getattr(model, "byte_fallback", False) or getattr(model, "unk_token", None):
        return False
    vocab = backend.get_vocab(with_added_tokens=False)
    return not all(c in vocab for c in BYTE_LEVEL_ALPHABET)


def _check_covered(text: str, offsets: Sequence[tuple[int, int]], name: str) -> None:
    """Raises ``TokenError`` naming the first character of ``text`` no token covers."""
    depth = np.zeros(len(text) + 1, dtype=np.int64)
    if offsets:
        spans = np.asarray(offsets, dtype=np.int64).reshape(-1, 2)
        np.add.at(depth, spans[:, 0], 1)
        np.add.at(depth, spans[:, 1], -1)
    missing = np.flatnonzero(np.cumsum(depth)[: len(text)] == 0)
    if missing.size:
        at = int(missing[0])
        raise TokenError(
            f"{name} cannot encode {text[at]!r} (U+{ord(text[at]):04X}, at character {at}): "
            "no token or byte of its vocabulary spells it"
        )


# -- loading -------------------------------------------------------------------------------


def is_gguf(path: Path) -> bool:
    """Whether the file at ``path`` starts with the GGUF magic (False when it cannot be read)."""
    try:
        with open(path, "rb") as f:
            return f.read(len(GGUF_MAGIC)) == GGUF_MAGIC
    except OSError:
        return False


def folder_of(path: str | os.PathLike[str]) -> Path:
    """``path`` if it is a folder, else the folder of the file at ``path``.

    Raises:
        ModelStateError: nothing exists at ``path``.
    """
    p = Path(path)
    if p.is_dir():
        return p
    if p.exists():
        return p.parent
    raise ModelStateError(f"no model or tokenizer at {os.fspath(path)!r}")
