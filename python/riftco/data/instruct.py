"""Instruction and chat post-training data: rows read from JSON Lines / JSON files, tokenized
into ``input_ids`` and ``labels`` with the loss on the answers only.

Row shapes (those of Hugging Face ``datasets`` and TRL), detected per file from its first row;
every row of a file has its first row's shape (other keys of a row are ignored):

- ``{"text": str}`` — language modelling: every token is trained (:class:`TextRow`);
- ``{"prompt": str, "completion": str}`` — the text is ``prompt + completion`` (no chat
  template, as TRL does for non-conversational data); the completion is trained
  (:class:`PromptCompletionRow`);
- ``{"messages": [{"role": "system"|"user"|"assistant", "content": str}, ...]}`` — a
  conversation rendered with a chat template (:mod:`riftco.data.chat_template`); the assistant turns
  are trained (:class:`MessagesRow`).

Labels follow the Hugging Face convention: ``labels`` has the length of ``input_ids``, is not
shifted, and holds ``-100`` (:data:`IGNORE_INDEX`, PyTorch's ``ignore_index``) where no loss is
taken. The loss shifts: the logits at position ``i`` (which see tokens ``0..i``) are scored
against ``labels[i + 1]``, so ``labels[0]`` is never a target.
"""

from __future__ import annotations

import json
import operator
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol, Union, runtime_checkable

import numpy as np
import numpy.typing as npt

from riftco._native import RiftcoError, TokenError
from riftco.data.chat_template import ChatTemplate, ChatTemplateError, default_chat_template
from riftco.data.text import LOAD_CORPUS_MAX_BYTES

__all__ = [
    "IGNORE_INDEX",
    "ROLES",
    "ByteTokenizer",
    "DatasetError",
    "OverlongExampleError",
    "Example",
    "ExampleSet",
    "HFTokenizer",
    "MessagesRow",
    "PromptCompletionRow",
    "Row",
    "TextEncoder",
    "TextRow",
    "as_text_encoder",
    "build_examples",
    "collate",
    "load_rows",
]

IGNORE_INDEX = -100
"""The label of a position that takes no loss (PyTorch's ``cross_entropy`` ``ignore_index``)."""

ROLES = ("system", "user", "assistant")
"""The message roles a ``messages`` row may use."""

_SHAPE_KEYS = ("text", "prompt", "completion", "messages")
_SUFFIXES = (".jsonl", ".json")


class DatasetError(RiftcoError, ValueError):
    """An instruction dataset cannot be read or tokenized; the message names the row
    (``file:line`` for JSON Lines, ``file[index]`` for a JSON array) and what was expected."""


class OverlongExampleError(DatasetError):
    """A row longer than ``max_len`` tokens with ``overlong="error"``: ``source`` (``file:line``),
    ``tokens`` and ``max_len`` name it, so a caller can say it in its own terms (the command
    line says ``--seq-len`` and ``--overlong``)."""

    def __init__(self, source: str, tokens: int, max_len: int) -> None:
        self.source = source
        self.tokens = tokens
        self.max_len = max_len
        super().__init__(
            f"{source}: {tokens:,} tokens, more than max_len {max_len:,} (pass "
            "overlong='truncate' or 'skip', or a larger max_len)"
        )


@dataclass(frozen=True)
class TextRow:
    """A ``{"text": ...}`` row; ``source`` is ``file:line`` or ``file[index]``."""

    text: str
    source: str


@dataclass(frozen=True)
class PromptCompletionRow:
    """A ``{"prompt": ..., "completion": ...}`` row; ``source`` is ``file:line`` or
    ``file[index]``."""

    prompt: str
    completion: str
    source: str


@dataclass(frozen=True)
class MessagesRow:
    """A ``{"messages": [...]}`` row: ``messages`` are ``{"role": ..., "content": ...}`` dicts
    (other keys of a message are kept for the template); ``source`` is ``file:line`` or
    ``file[index]``."""

    messages: tuple[dict[str, Any], ...]
    source: str


Row = Union[TextRow, PromptCompletionRow, MessagesRow]
"""One row of an instruction dataset."""


# ---------------------------------------------------------------------------------------------
# Reading rows


def _shape_of(obj: dict[str, Any], where: str) -> str:
    keys = [k for k in _SHAPE_KEYS if k in obj]
    if keys == ["messages"]:
        return "messages"
    if keys == ["prompt", "completion"]:
        return "prompt/completion"
    if keys == ["text"]:
        return "text"
    raise DatasetError(
        f"{where}: expected a row with exactly one of the shapes {{'text'}}, "
        f"{{'prompt', 'completion'}} or {{'messages'}}; got the keys {sorted(obj)}"
    )


def _string(obj: dict[str, Any], key: str, where: str) -> str:
    value = obj[key]
    if not isinstance(value, str):
        hint = (
            " (conversational prompt/completion rows are not supported: use a 'messages' row)"
            if isinstance(value, list) and key in ("prompt", "completion")
            else ""
        )
        raise DatasetError(
            f"{where}: {key!r} must be a string, got {type(value).__name__} {value!r:.60}{hint}"
        )
    if not value:
        raise DatasetError(f"{where}: {key!r} is empty (expected non-empty text)")
    return value


def _messages(obj: dict[str, Any], where: str) -> tuple[dict[str, Any], ...]:
    value = obj["messages"]
    if not isinstance(value, list):
        raise DatasetError(
            f"{where}: 'messages' must be a list of message objects, got {type(value).__name__}"
        )
    out: list[dict[str, Any]] = []
    for j, m in enumerate(value):
        at = f"{where}: messages[{j}]"
        if not isinstance(m, dict):
            raise DatasetError(f"{at} must be an object with 'role' and 'content', got {m!r:.60}")
        for key in ("role", "content"):
            if key not in m:
                raise DatasetError(f"{at} has no {key!r} (expected 'role' and 'content')")
        role = m["role"]
        if role not in ROLES:
            raise DatasetError(f"{at}: unknown role {role!r} (expected one of {list(ROLES)})")
        content = m["content"]
        if not isinstance(content, str):
            raise DatasetError(
                f"{at}: 'content' must be a string, got {type(content).__name__} {content!r:.60}"
            )
        if not content:
            raise DatasetError(f"{at} ({role}): 'content' is empty (expected non-empty text)")
        out.append(dict(m))
    if not any(m["role"] == "assistant" for m in out):
        raise DatasetError(
            f"{where}: the messages have no assistant turn (nothing to train on); expected at "
            f"least one message with role 'assistant'"
        )
    return tuple(out)


def _row(obj: Any, where: str, shape: str | None, first: str | None) -> tuple[Row, str]:
    if not isinstance(obj, dict):
        raise DatasetError(f"{where}: expected a JSON object, got {type(obj).__name__} {obj!r:.60}")
    this = _shape_of(obj, where)
    if shape is not None and this != shape:
        raise DatasetError(
            f"{where}: a {this!r} row in a file of {shape!r} rows (the shape of its first row, "
            f"{first}); a file holds one shape"
        )
    row: Row
    if this == "text":
        row = TextRow(_string(obj, "text", where), where)
    elif this == "prompt/completion":
        row = PromptCompletionRow(
            _string(obj, "prompt", where), _string(obj, "completion", where), where
        )
    else:
        row = MessagesRow(_messages(obj, where), where)
    return row, this


def _decode(data: bytes, path: str, lineno: int | None) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = lineno if lineno is not None else data[: e.start].count(b"\n") + 1
        raise DatasetError(
            f"{path}:{line}: not UTF-8 text (byte 0x{data[e.start]:02x} at offset {e.start} "
            f"of the {'line' if lineno is not None else 'file'}: {e.reason})"
        ) from None


def _parse_jsonl(data: bytes, path: str) -> list[Row]:
    rows: list[Row] = []
    shape: str | None = None
    first: str | None = None
    for lineno, raw in enumerate(data.split(b"\n"), start=1):
        if lineno == 1 and raw.startswith(b"\xef\xbb\xbf"):
            raw = raw[3:]  # a UTF-8 byte order mark
        text = _decode(raw, path, lineno)
        if not text.strip():
            continue
        where = f"{path}:{lineno}"
        try:
            obj = json.loads(text)
        except json.JSONDecodeError as e:
            raise DatasetError(f"{where}: invalid JSON at column {e.colno}: {e.msg}") from None
        row, this = _row(obj, where, shape, first)
        if shape is None:
            shape, first = this, where
        rows.append(row)
    return rows


def _parse_json(data: bytes, path: str) -> list[Row]:
    if data.startswith(b"\xef\xbb\xbf"):
        data = data[3:]
    text = _decode(data, path, None)
    if not text.strip():
        return []
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        raise DatasetError(f"{path}:{e.lineno}: invalid JSON at column {e.colno}: {e.msg}") from None
    if not isinstance(doc, list):
        raise DatasetError(
            f"{path}: a .json dataset must be a JSON array of row objects, got "
            f"{type(doc).__name__} (JSON Lines files end in .jsonl)"
        )
    return _rows_of(doc, path)


def _rows_of(objects: Sequence[Any], name: str) -> list[Row]:
    """Rows from JSON objects, all of the first one's shape; errors name ``name[index]``."""
    rows: list[Row] = []
    shape: str | None = None
    first: str | None = None
    for i, obj in enumerate(objects):
        where = f"{name}[{i}]"
        row, this = _row(obj, where, shape, first)
        if shape is None:
            shape, first = this, where
        rows.append(row)
    return rows


def _expand(path: Path) -> list[Path]:
    if path.is_dir():
        found = sorted(
            (p for p in path.rglob("*") if p.is_file() and p.suffix in _SUFFIXES),
            key=lambda p: p.relative_to(path).as_posix(),
        )
        if not found:
            raise DatasetError(f"{str(path)!r} holds no .jsonl or .json file")
        return found
    if not path.exists():
        raise DatasetError(f"data path {str(path)!r} does not exist")
    if path.suffix not in _SUFFIXES:
        raise DatasetError(
            f"{str(path)!r}: expected a .jsonl (JSON Lines) or .json (JSON array) file"
        )
    return [path]


def load_rows(
    paths: Sequence[str | os.PathLike[str]] | str | os.PathLike[str],
    max_bytes: int = LOAD_CORPUS_MAX_BYTES,
) -> list[Row]:
    """The rows of ``.jsonl`` files (one JSON object per line; blank lines skipped) and
    ``.json`` files (one JSON array of objects), in the order given; a directory gives its
    ``.jsonl``/``.json`` files, recursively, sorted by relative path. A single path may be given
    instead of a sequence. Each file's shape is that of its first row (see the module
    docstring); files may differ. No more than ``max_bytes`` bytes are read in all (default
    :data:`riftco.data.text.LOAD_CORPUS_MAX_BYTES`, 256 MiB).

    Returns:
        One :class:`TextRow`, :class:`PromptCompletionRow` or :class:`MessagesRow` per row.

    Raises:
        DatasetError: naming ``file:line`` (JSON Lines) or ``file[index]`` (a JSON array) and
            what was expected — no paths, a missing path or another suffix, invalid JSON, a row
            that is not an object, a row of none or several shapes or of another shape than the
            file's first row, a key of the wrong type, an empty string, an unknown role, a
            conversation without an assistant turn, bytes that are not UTF-8, a file with no
            rows, or files above ``max_bytes`` in all.
    """
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    cap = operator.index(max_bytes)
    if not paths:
        raise DatasetError("no data paths given")
    files = [f for p in paths for f in _expand(Path(p))]
    rows: list[Row] = []
    total = 0
    for f in files:
        name = str(f)
        try:
            size = f.stat().st_size
            if total + size > cap:
                raise DatasetError(
                    f"{name}: {size:,} bytes would bring the dataset to {total + size:,} bytes, "
                    f"above the cap of {cap:,} bytes (max_bytes); split the data or raise the cap"
                )
            with open(f, "rb") as fh:
                data = fh.read(cap - total + 1)  # a file that grew is still bounded
        except OSError as e:
            raise DatasetError(f"cannot read {name!r}: {e.strerror or e}") from None
        if total + len(data) > cap:
            raise DatasetError(f"{name}: grew past the cap of {cap:,} bytes while being read")
        total += len(data)
        got = _parse_jsonl(data, name) if f.suffix == ".jsonl" else _parse_json(data, name)
        if not got:
            if not data:
                what = "an empty file"
            elif not data.strip():
                what = "only blank lines" if b"\n" in data else "only white space"
            else:
                what = "no row in it"
            raise DatasetError(f"{name}: no rows ({what}; expected at least one row)")
        rows.extend(got)
    return rows


# ---------------------------------------------------------------------------------------------
# Tokenizers


@runtime_checkable
class TextEncoder(Protocol):
    """What :func:`build_examples` needs of a tokenizer: ``encode(text)`` gives the token ids
    of ``text`` with no special tokens added (a BOS or EOS comes from the template or the
    ``bos_token``/``eos_token`` arguments, as text)."""

    def encode(self, text: str) -> list[int]: ...


class ByteTokenizer:
    """riftco's byte tokens: token ``i`` is byte ``i`` of the UTF-8 text (vocabulary 256)."""

    vocab_size = 256

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: Sequence[int]) -> str:
        """The text of ``ids`` (an invalid UTF-8 sequence becomes U+FFFD)."""
        return bytes(int(i) for i in ids).decode("utf-8", errors="replace")


class HFTokenizer:
    """A ``tokenizers.Tokenizer`` (from a model folder's ``tokenizer.json``,
    :func:`riftco.data.hf_tokenizer.load_folder_tokenizer`) as a :class:`TextEncoder`: ids of
    ``encode(text, add_special_tokens=False)`` — special tokens written in the text (a
    template's ``<|im_end|>``) still map to their ids, none is added around it (as
    transformers' ``apply_chat_template(tokenize=True)`` does)."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False).ids)

    def decode(self, ids: Sequence[int]) -> str:
        return str(self.tokenizer.decode([int(i) for i in ids], skip_special_tokens=False))


class _NoSpecialTokens:
    """A transformers tokenizer's ``encode(text, add_special_tokens=False)``."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))


def as_text_encoder(tokenizer: Any) -> TextEncoder:
    """``tokenizer`` as a :class:`TextEncoder`: ``None`` gives a :class:`ByteTokenizer`, a
    ``tokenizers.Tokenizer`` is wrapped in :class:`HFTokenizer`, a transformers tokenizer is
    called with ``add_special_tokens=False``, anything else with ``encode(str) -> list[int]`` is
    used as is.

    Raises:
        TypeError: ``tokenizer`` has no ``encode`` method.
    """
    if tokenizer is None:
        return ByteTokenizer()
    package = type(tokenizer).__module__.split(".")[0]
    if package == "tokenizers":
        return HFTokenizer(tokenizer)
    if package == "transformers":
        # Its encode adds the BOS/EOS of the model by default: once per piece would be wrong.
        return _NoSpecialTokens(tokenizer)
    if isinstance(tokenizer, TextEncoder):
        return tokenizer
    raise TypeError(
        f"tokenizer must have an encode(str) -> list[int] method (or be a tokenizers.Tokenizer),"
        f" got {type(tokenizer).__name__}"
    )


# ---------------------------------------------------------------------------------------------
# Examples


@dataclass(frozen=True, eq=False)
class Example:
    """One tokenized row.

    Attributes:
        input_ids: ``int64 [seq]``, the token ids.
        labels: ``int64 [seq]``, ``input_ids`` where the loss is taken and :data:`IGNORE_INDEX`
            (-100) elsewhere; unshifted (Hugging Face convention: the loss scores the logits at
            ``i`` against ``labels[i + 1]``).
        source: the row, ``file:line`` or ``file[index]``.
    """

    input_ids: npt.NDArray[np.int64]
    labels: npt.NDArray[np.int64]
    source: str

    @property
    def n_trained(self) -> int:
        """How many positions carry a label (not -100)."""
        return int(np.count_nonzero(self.labels != IGNORE_INDEX))


@dataclass(frozen=True, eq=False)
class ExampleSet:
    """The tokenized rows of :func:`build_examples`, in row order, with what ``overlong`` did.

    Attributes:
        examples: the kept rows.
        n_truncated: rows longer than ``max_len`` cut to their first ``max_len`` tokens.
        n_skipped: rows left out: longer than ``max_len`` with ``overlong="skip"``, or truncated
            with no trained token left (those are not counted in ``n_truncated``).
        truncated: the sources of the truncated rows.
        skipped: the sources of the skipped rows.
    """

    examples: list[Example]
    n_truncated: int = 0
    n_skipped: int = 0
    truncated: tuple[str, ...] = field(default=())
    skipped: tuple[str, ...] = field(default=())

    def __len__(self) -> int:
        return len(self.examples)

    def __iter__(self) -> Iterator[Example]:
        return iter(self.examples)

    def __getitem__(self, i: int) -> Example:
        return self.examples[i]

    @property
    def n_tokens(self) -> int:
        """Token positions in all examples."""
        return sum(int(e.input_ids.size) for e in self.examples)

    @property
    def n_trained(self) -> int:
        """Positions with a label in all examples."""
        return sum(e.n_trained for e in self.examples)


def _segments(row: Row, template: ChatTemplate, bos: str, eos: str) -> list[tuple[str, bool]]:
    """The row's text as (piece, trained) pieces that concatenate to it."""
    if isinstance(row, TextRow):
        return [(bos, False), (row.text + eos, True)]
    if isinstance(row, PromptCompletionRow):
        return [(bos + row.prompt, False), (row.completion + eos, True)]
    msgs = list(row.messages)
    where = row.source

    def render(ms: list[dict[str, Any]], gen: bool) -> str:
        try:
            return template.render(ms, add_generation_prompt=gen)
        except ChatTemplateError as e:
            raise ChatTemplateError(f"{where}: {e}") from None

    full = render(msgs, False)
    pieces: list[tuple[str, bool]] = []
    pos = 0
    for i, m in enumerate(msgs):
        if m["role"] != "assistant":
            continue
        prefix = render(msgs[:i], True)
        upto = render(msgs[: i + 1], False)
        if not upto.startswith(prefix):
            raise ChatTemplateError(
                f"{where}: {template.name} is not incremental: the messages before message {i} "
                f"with the generation prompt do not render as a prefix of the messages up to and "
                f"including assistant message {i}, so its answer span cannot be found "
                f"(the prefix ends {prefix[-40:]!r}; the longer text has "
                f"{upto[max(0, len(prefix) - 40) : len(prefix)]!r} there)"
            )
        if not full.startswith(upto):
            raise ChatTemplateError(
                f"{where}: {template.name} is not incremental: the conversation up to assistant "
                f"message {i} does not render as a prefix of the whole conversation"
            )
        start, end = len(prefix), len(upto)
        if start < pos:
            raise ChatTemplateError(
                f"{where}: {template.name} is not incremental: assistant message {i}'s span "
                f"starts at character {start}, inside the previous answer (ending at {pos})"
            )
        if end == start:
            raise ChatTemplateError(
                f"{where}: {template.name} rendered no text for assistant message {i}"
            )
        pieces.append((full[pos:start], False))
        pieces.append((full[start:end], True))
        pos = end
    pieces.append((full[pos:], False))
    return pieces


def _encode(
    encoder: TextEncoder, text: str, where: str, vocab_size: int | None
) -> npt.NDArray[np.int64]:
    if not text:
        return np.zeros(0, dtype=np.int64)
    raw = encoder.encode(text)
    ids = np.asarray(raw)
    if ids.ndim != 1 or (ids.size and ids.dtype.kind not in "iu"):
        raise TokenError(
            f"{where}: the tokenizer's encode returned {str(raw)[:60]}, not a list of token ids"
        )
    ids = ids.astype(np.int64, copy=False)
    if ids.size and int(ids.min()) < 0:
        raise TokenError(f"{where}: the tokenizer produced token id {int(ids.min())} (negative)")
    if vocab_size is not None and ids.size and int(ids.max()) >= vocab_size:
        raise TokenError(
            f"{where}: the tokenizer produced token id {int(ids.max())}, outside the model's "
            f"vocabulary (vocab_size {vocab_size})"
        )
    return ids


def build_examples(
    rows: Sequence[Row],
    tokenizer: Any = None,
    *,
    max_len: int,
    chat_template: ChatTemplate | None = None,
    bos_token: str | None = None,
    eos_token: str | None = None,
    train_on: Literal["answers", "all"] = "answers",
    overlong: Literal["error", "truncate", "skip"] = "error",
    vocab_size: int | None = None,
) -> ExampleSet:
    """Tokenize ``rows`` into ``input_ids`` and ``labels`` (Hugging Face convention: same
    length, unshifted, :data:`IGNORE_INDEX` -100 where no loss is taken).

    - :class:`TextRow`: ``bos_token + text + eos_token``; every token but the BOS is trained.
    - :class:`PromptCompletionRow`: ``bos_token + prompt + completion + eos_token`` (no chat
      template, as TRL does for non-conversational data); the completion and EOS are trained.
    - :class:`MessagesRow`: rendered with ``chat_template`` (default:
      :func:`riftco.data.chat_template.default_chat_template`; ``bos_token``/``eos_token`` do not
      apply, the template has its own). Each assistant message ``i``'s span is the text that
      ``render(messages[:i + 1])`` adds to ``render(messages[:i], add_generation_prompt=True)``
      — its content and the template's end of turn (``<|end|>\\n`` for the default template,
      ``<|im_end|>\\n`` for ChatML, ``<|eot_id|>`` for Llama 3) — and is trained.

    The text is split into trained and untrained pieces at those character positions and each
    piece is encoded separately, the ids concatenated: the label mask covers exactly the
    answer text. With a BPE tokenizer the ids at a piece boundary may differ from encoding the
    whole text at once (no merge crosses a boundary), as with TRL's prompt/completion
    tokenization; the prompt side is what generation from a rendered prompt sees. With byte
    tokens the ids are the same either way.

    Args:
        rows: from :func:`load_rows`.
        tokenizer: ``None`` (byte tokens), a ``tokenizers.Tokenizer``, a transformers
            tokenizer or a :class:`TextEncoder` (see :func:`as_text_encoder`).
        max_len: the most tokens an example may have (the model's ``max_seq_len``, or less).
        chat_template: the template of ``messages`` rows.
        bos_token: text put before text and prompt/completion rows (not trained).
        eos_token: text put after text and prompt/completion rows (trained).
        train_on: ``"answers"`` (as above) or ``"all"`` (every position of every row).
        overlong: a row of more than ``max_len`` tokens is an ``"error"``, or cut to its first
            ``max_len`` tokens (``"truncate"``; a row left with no trained token is skipped), or
            left out (``"skip"``); counts and sources are in the result.
        vocab_size: when given, every id must be below it.

    Returns:
        An :class:`ExampleSet`: ``int64 [seq]`` ``input_ids`` and ``labels`` per kept row.

    Raises:
        DatasetError: an over-long row with ``overlong="error"`` (naming it and its length),
            every row skipped, a bad ``max_len``, ``train_on`` or ``overlong``.
        ChatTemplateError: a template error, or a template that is not incremental (naming the
            row).
        TokenError: the tokenizer gave something else than a list of ids, a negative id, or
            one at or above ``vocab_size``.
        ImportError: a Jinja2 template without Jinja2 installed.
    """
    if train_on not in ("answers", "all"):
        raise DatasetError(f"train_on must be 'answers' or 'all', got {train_on!r}")
    if overlong not in ("error", "truncate", "skip"):
        raise DatasetError(f"overlong must be 'error', 'truncate' or 'skip', got {overlong!r}")
    if isinstance(max_len, bool) or not isinstance(max_len, (int, np.integer)) or max_len < 1:
        raise DatasetError(f"max_len must be a positive integer, got {max_len!r}")
    limit = int(max_len)
    encoder = as_text_encoder(tokenizer)
    template = chat_template if chat_template is not None else default_chat_template()
    bos, eos = bos_token or "", eos_token or ""
    examples: list[Example] = []
    truncated: list[str] = []
    skipped: list[str] = []
    for row in rows:
        if not isinstance(row, (TextRow, PromptCompletionRow, MessagesRow)):
            raise DatasetError(f"expected rows from load_rows, got {type(row).__name__}")
        id_parts: list[npt.NDArray[np.int64]] = []
        label_parts: list[npt.NDArray[np.int64]] = []
        for piece, trained in _segments(row, template, bos, eos):
            piece_ids = _encode(encoder, piece, row.source, vocab_size)
            id_parts.append(piece_ids)
            if trained or train_on == "all":
                label_parts.append(piece_ids)
            else:
                label_parts.append(np.full(piece_ids.size, IGNORE_INDEX, dtype=np.int64))
        ids = np.concatenate(id_parts)
        labels = np.concatenate(label_parts)
        if ids.size > limit:
            if overlong == "error":
                raise OverlongExampleError(row.source, int(ids.size), limit)
            if overlong == "skip":
                skipped.append(row.source)
                continue
            ids, labels = ids[:limit].copy(), labels[:limit].copy()
            if not np.any(labels[1:] != IGNORE_INDEX):
                skipped.append(row.source)  # no answer token left to learn from
                continue
            truncated.append(row.source)
        if ids.size == 0:
            raise DatasetError(f"{row.source}: the row encodes to no tokens")
        examples.append(Example(ids, labels, row.source))
    if rows and not examples:
        raise DatasetError(
            f"all {len(rows):,} rows were skipped (longer than max_len {limit:,}, or with no "
            f"answer token within it); the first is {skipped[0]}"
        )
    return ExampleSet(
        examples,
        n_truncated=len(truncated),
        n_skipped=len(skipped),
        truncated=tuple(truncated),
        skipped=tuple(skipped),
    )


def collate(
    examples: Sequence[Example], pad_token_id: int = 0
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """Right-pad ``examples`` to their longest: ``input_ids`` and ``labels``, both
    ``int64 [batch, seq]``; padding positions have ``pad_token_id`` as input and -100 as label.

    Raises:
        DatasetError: no examples.
    """
    if not examples:
        raise DatasetError("collate needs at least one example")
    seq = max(int(e.input_ids.size) for e in examples)
    ids = np.full((len(examples), seq), operator.index(pad_token_id), dtype=np.int64)
    labels = np.full((len(examples), seq), IGNORE_INDEX, dtype=np.int64)
    for b, e in enumerate(examples):
        ids[b, : e.input_ids.size] = e.input_ids
        labels[b, : e.labels.size] = e.labels
    return ids, labels
