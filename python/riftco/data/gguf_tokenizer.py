"""GGUF tokenizers: a ``tokenizers`` tokenizer rebuilt from a GGUF file's ``tokenizer.ggml.*``
metadata (:func:`build_gguf_vocabulary`), for :meth:`riftco.Tokenizer.from_gguf_metadata`.

``tokenizer.ggml.model``:

- ``"gpt2"``: byte-level BPE (GPT-2, Llama 3, SmolLM, Qwen2, ...): the vocabulary and ranked
  merges of the metadata; the text is first cut into chunks by the regular expressions that
  ``tokenizer.ggml.pre`` names (:data:`GGUF_PRE_TOKENIZERS`: those of llama.cpp's
  ``src/llama-vocab.cpp``; merges only apply within a chunk), then each chunk's UTF-8 bytes are
  spelled in GPT-2's byte alphabet (``bytes_to_unicode``). A file without ``tokenizer.ggml.pre``
  gets the ``"default"`` expressions with a warning, and a name riftco does not know is a
  :class:`riftco.ModelStateError`, as in llama.cpp.
- ``"llama"``: SentencePiece BPE (Llama 1/2, TinyLlama, Mistral v0.1): spaces written ``▁``
  (U+2581), a ``▁`` prepended to each stretch of text between special tokens
  (``tokenizer.ggml.add_space_prefix``, default true), pieces merged by their scores
  (``tokenizer.ggml.scores``: the highest-scoring adjacent pair that forms a vocabulary piece
  first, written as a ranked merge list), characters outside the vocabulary written as their
  ``<0xNN>`` byte tokens (byte fallback). This is SentencePiece's and llama.cpp's handling of
  spaces; transformers' GGUF loader (``legacy=False``) differs from both on text that starts with
  a space or follows a special token.

Control tokens (``tokenizer.ggml.token_type`` 3), unknown tokens (2) and the BOS/EOS/UNK/PAD ids
are special: their text in the input is matched whole, never split, and
``decode(..., skip_special_tokens=True)`` drops them. User-defined tokens (type 4) are matched
whole too, as llama.cpp does. ``add_bos_token`` defaults as in llama.cpp: true for ``"llama"`` and
for the Llama 3 pre-tokenizers, false otherwise.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from riftco._native import ModelStateError

__all__ = [
    "GGUF_PRE_TOKENIZERS",
    "GgufPreTokenizer",
    "GgufVocabulary",
    "build_gguf_vocabulary",
    "BYTE_LEVEL_ALPHABET",
    "import_tokenizers",
]

# GGUF token types (llama.cpp's llama_token_type).
_TOKEN_NORMAL, _TOKEN_UNKNOWN, _TOKEN_CONTROL, _TOKEN_USER_DEFINED = 1, 2, 3, 4

# Pre-tokenizer expressions, as the original tokenizers write them (llama.cpp rewrites some of
# them for its own regex engine, e.g. ``(?i:'s)`` as ``'[sS]``; the ``tokenizers`` package's
# Oniguruma engine takes the originals).
_GPT2_SPLIT = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_PUNCTUATION_RUN = r"[\p{P}\$\+<=>\^~\|]+"


@dataclass(frozen=True)
class GgufPreTokenizer:
    """How a ``"gpt2"`` GGUF vocabulary cuts text before BPE (llama.cpp's pre-tokenizer types).

    Attributes:
        splits: regular expressions applied in turn, each cutting every chunk of the previous
            one into its matches and the text between them.
        ignore_merges: a chunk that is a vocabulary token whole is that token (Llama 3).
        add_bos: the default of ``tokenizer.ggml.add_bos_token``.
    """

    splits: tuple[str, ...]
    ignore_merges: bool = False
    add_bos: bool = False


def _names(names: str, pre: GgufPreTokenizer) -> dict[str, GgufPreTokenizer]:
    return {name: pre for name in names.split()}


GGUF_PRE_TOKENIZERS: dict[str, GgufPreTokenizer] = {
    "default": GgufPreTokenizer(
        (_PUNCTUATION_RUN, _GPT2_SPLIT, r"\p{N}+", r"[0-9][0-9][0-9]")
    ),
    **_names("gpt-2 phi-2 mpt olmo jais exaone4", GgufPreTokenizer((_GPT2_SPLIT,))),
    **_names(
        "llama3 llama-v3 llama-bpe falcon3 falcon-h1 pixtral",
        GgufPreTokenizer((_LLAMA3_SPLIT,), ignore_merges=True, add_bos=True),
    ),
    **_names("dbrx smaug-bpe", GgufPreTokenizer((_LLAMA3_SPLIT,))),
    **_names(
        "smollm starcoder refact command-r codeshell exaone minerva-7b",
        GgufPreTokenizer((r"\p{N}", _GPT2_SPLIT)),
    ),
    **_names("qwen2 deepseek-r1-qwen stablelm2 megrez", GgufPreTokenizer((_QWEN2_SPLIT,))),
    "falcon": GgufPreTokenizer((_PUNCTUATION_RUN, _GPT2_SPLIT, r"[0-9][0-9][0-9]")),
}
"""``tokenizer.ggml.pre`` names riftco builds, with llama.cpp's expressions and flags for each
(``src/llama-vocab.cpp``, ``llm_tokenizer_bpe`` and ``llama_vocab::impl::load``)."""


def import_tokenizers() -> Any:
    try:
        import tokenizers  # type: ignore[import-not-found, unused-ignore]
    except ImportError:
        raise ImportError(
            "this tokenizer needs the tokenizers package: pip install tokenizers"
        ) from None
    return tokenizers


def _byte_level_alphabet() -> dict[int, str]:
    """GPT-2's spelling of bytes as printable characters (``bytes_to_unicode`` of its
    ``encoder.py``): printable Latin-1 bytes stand for themselves, the other 68 bytes for
    ``chr(256 + k)`` in byte order (space is ``Ġ``, newline ``Ċ``)."""
    keep = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
    spelling = {b: chr(b) for b in keep}
    k = 0
    for b in range(256):
        if b not in spelling:
            spelling[b] = chr(256 + k)
            k += 1
    return spelling


_BYTE_SPELLING = _byte_level_alphabet()
BYTE_LEVEL_ALPHABET = frozenset(_BYTE_SPELLING.values())
"""The 256 characters of GPT-2's byte-level spelling."""


class _GgufKeys:
    """Typed access to GGUF metadata values, each error naming the file and the key."""

    def __init__(self, metadata: Mapping[str, Any], name: str) -> None:
        if not isinstance(metadata, Mapping):
            raise TypeError(f"GGUF metadata must be a mapping; got {type(metadata).__name__}")
        self.metadata = metadata
        self.name = name

    _REQUIRED = object()

    def _get(self, key: str, default: Any) -> Any:
        if key in self.metadata:
            value = self.metadata[key]
            return value.tolist() if isinstance(value, np.ndarray) else value
        if default is self._REQUIRED:
            raise ModelStateError(f"{self.name}: the GGUF metadata has no {key}")
        return default

    def _bad(self, key: str, expected: str, value: Any) -> ModelStateError:
        return ModelStateError(
            f"{self.name}: {key} must be {expected}; got {type(value).__name__} {value!r:.80}"
        )

    def string(self, key: str, default: Any = _REQUIRED) -> Any:
        value = self._get(key, default)
        if value is default and default is not self._REQUIRED:
            return value
        if not isinstance(value, str):
            raise self._bad(key, "a string", value)
        return value

    def boolean(self, key: str, default: bool) -> bool:
        value = self._get(key, default)
        if not isinstance(value, (bool, np.bool_)):
            raise self._bad(key, "a boolean", value)
        return bool(value)

    def strings(self, key: str, default: Any = _REQUIRED) -> Any:
        value = self._get(key, default)
        if value is default and default is not self._REQUIRED:
            return value
        if not isinstance(value, (list, tuple)):
            raise self._bad(key, "an array of strings", value)
        for k, item in enumerate(value):
            if not isinstance(item, str):
                raise ModelStateError(
                    f"{self.name}: {key}[{k}] must be a string; got {type(item).__name__}"
                )
        return list(value)

    def _numbers(self, key: str, length: int, default: Any, kinds: tuple[type, ...], what: str) -> Any:
        value = self._get(key, default)
        if value is default and default is not self._REQUIRED:
            return value
        if not isinstance(value, (list, tuple)):
            raise self._bad(key, f"an array of {what}", value)
        if len(value) != length:
            raise ModelStateError(
                f"{self.name}: {key} has {len(value)} entries for {length} tokens"
            )
        for k, item in enumerate(value):
            if isinstance(item, bool) or not isinstance(item, kinds):
                raise ModelStateError(
                    f"{self.name}: {key}[{k}] must be {what[:-1]}; got {type(item).__name__}"
                )
        return list(value)

    def ints(self, key: str, length: int, default: Any = _REQUIRED) -> Any:
        return self._numbers(key, length, default, (int, np.integer), "integers")

    def floats(self, key: str, length: int, default: Any = _REQUIRED) -> Any:
        values = self._numbers(key, length, default, (int, float, np.integer, np.floating), "numbers")
        if values is not None and values is not default:
            for k, v in enumerate(values):
                if not math.isfinite(float(v)):
                    raise ModelStateError(f"{self.name}: {key}[{k}] is {v}, not a finite number")
        return values

    def token_id(self, key: str, n_tokens: int) -> int | None:
        value = self._get(key, None)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
            raise self._bad(key, "an integer token id", value)
        if not 0 <= int(value) < n_tokens:
            raise ModelStateError(
                f"{self.name}: {key} {int(value)} is outside the vocabulary [0, {n_tokens})"
            )
        return int(value)


def _vocabulary(tokens: Sequence[str], name: str, respell_bytes: bool) -> dict[str, int]:
    """Token text -> id. ``respell_bytes``: a token with characters outside GPT-2's byte
    alphabet (a control token llama.cpp wrote raw) is keyed by its UTF-8 bytes spelled in that
    alphabet, the way the merges spell it."""
    vocab: dict[str, int] = {}
    for i, token in enumerate(tokens):
        if not token:
            token = f"[EMPTY_{i}]"  # llama.cpp's name for an empty token
        elif respell_bytes and not set(token) <= BYTE_LEVEL_ALPHABET:
            token = "".join(_BYTE_SPELLING[b] for b in token.encode("utf-8"))
        previous = vocab.setdefault(token, i)
        if previous != i:
            raise ModelStateError(
                f"{name}: duplicate token in tokenizer.ggml.tokens: {token!r} has ids "
                f"{previous} and {i}"
            )
    return vocab


def _merges(meta: _GgufKeys, vocab: Mapping[str, int]) -> list[tuple[str, str]]:
    """``tokenizer.ggml.merges`` as pairs: each entry is two tokens joined by the first space
    after its first character (llama.cpp's reading); both, and the token they form, must be in
    the vocabulary."""
    merges = []
    for k, entry in enumerate(meta.strings("tokenizer.ggml.merges")):
        cut = entry.find(" ", 1)
        left, right = (entry[:cut], entry[cut + 1 :]) if cut > 0 else ("", "")
        if not left or not right:
            raise ModelStateError(
                f"{meta.name}: tokenizer.ggml.merges[{k}] {entry!r:.80} is not two tokens "
                "separated by a space"
            )
        missing = next((t for t in (left, right, left + right) if t not in vocab), None)
        if missing is not None:
            raise ModelStateError(
                f"{meta.name}: tokenizer.ggml.merges[{k}] {entry!r:.80} needs the token "
                f"{missing!r:.80}, which tokenizer.ggml.tokens lacks"
            )
        merges.append((left, right))
    return merges


def _byte_level_bpe(meta: _GgufKeys, tokens: Sequence[str], notes: list[str]) -> tuple[Any, bool]:
    """A ``tokenizers`` byte-level BPE for a ``"gpt2"`` vocabulary; also the default of
    ``add_bos_token`` for its pre-tokenizer."""
    tk = import_tokenizers()
    pre_name = meta.string("tokenizer.ggml.pre", default=None)
    if not pre_name:
        notes.append(
            f"{meta.name}: no tokenizer.ggml.pre: using the 'default' pre-tokenizer, as "
            "llama.cpp does; the file's own may cut text differently (re-convert it with a "
            "current llama.cpp for exact tokens)"
        )
        pre_name = "default"
    pre = GGUF_PRE_TOKENIZERS.get(pre_name)
    if pre is None:
        raise ModelStateError(
            f"{meta.name}: tokenizer.ggml.pre {pre_name!r} is not a pre-tokenizer riftco knows; "
            f"known: {', '.join(sorted(GGUF_PRE_TOKENIZERS))}"
        )
    vocab = _vocabulary(tokens, meta.name, respell_bytes=True)
    try:
        model = tk.models.BPE(vocab, _merges(meta, vocab), ignore_merges=pre.ignore_merges)
    except Exception as e:  # tokenizers raises a plain Exception for an unknown merge token
        raise ModelStateError(f"{meta.name}: the vocabulary and merges do not fit: {e}") from None
    backend = tk.Tokenizer(model)
    backend.pre_tokenizer = tk.pre_tokenizers.Sequence(
        [tk.pre_tokenizers.Split(tk.Regex(r), behavior="isolated") for r in pre.splits]
        + [tk.pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
    )
    backend.decoder = tk.decoders.ByteLevel()
    return backend, pre.add_bos


def _sentencepiece_bpe(meta: _GgufKeys, tokens: Sequence[str], unk: int | None) -> Any:
    """A ``tokenizers`` BPE equivalent to SentencePiece's BPE over a ``"llama"`` vocabulary."""
    tk = import_tokenizers()
    vocab = _vocabulary(tokens, meta.name, respell_bytes=False)
    if "tokenizer.ggml.merges" in meta.metadata:
        merges = _merges(meta, vocab)
    else:
        scores = meta.floats("tokenizer.ggml.scores", length=len(tokens))
        merges = _merges_from_scores(vocab, [float(s) for s in scores])
    try:
        model = tk.models.BPE(
            vocab,
            merges,
            unk_token=None if unk is None else tokens[unk],
            fuse_unk=True,
            byte_fallback=True,
        )
    except Exception as e:  # a plain Exception from tokenizers for an unknown merge token
        raise ModelStateError(f"{meta.name}: the vocabulary and merges do not fit: {e}") from None
    backend = tk.Tokenizer(model)
    space_prefix = meta.boolean("tokenizer.ggml.add_space_prefix", default=True)
    # SentencePiece (and llama.cpp): every piece of text between special tokens gets a leading
    # "▁" (also when it starts with a space), and spaces become "▁".
    steps = [tk.normalizers.Replace(" ", "\u2581")]
    if space_prefix:
        steps.insert(0, tk.normalizers.Prepend("\u2581"))
    backend.normalizer = tk.normalizers.Sequence(steps)
    decoders = [
        tk.decoders.ByteFallback(),
        tk.decoders.Fuse(),
        tk.decoders.Replace("\u2581", " "),
    ]
    if space_prefix:
        decoders.append(tk.decoders.Strip(" ", 1, 0))
    backend.decoder = tk.decoders.Sequence(decoders)
    return backend


def _merges_from_scores(vocab: Mapping[str, int], scores: Sequence[float]) -> list[tuple[str, str]]:
    """SentencePiece BPE as a ranked merge list: every split of a piece into two vocabulary
    pieces is a merge, ranked by the score of the piece it forms (highest first; ties by piece
    id, then by the scores of the two halves, highest first, then by the split position). BPE
    applying the best-ranked adjacent pair first is then SentencePiece's "merge the
    highest-scoring pair" loop (llama.cpp's ``llm_tokenizer_spm``)."""
    ranked = []
    for piece, i in vocab.items():
        for cut in range(1, len(piece)):
            left, right = piece[:cut], piece[cut:]
            li, ri = vocab.get(left), vocab.get(right)
            if li is not None and ri is not None:
                ranked.append(((-scores[i], i, -scores[li], -scores[ri], cut), left, right))
    ranked.sort(key=lambda r: r[0])
    return [(left, right) for _, left, right in ranked]


def _add_gguf_special_tokens(
    backend: Any,
    tokens: Sequence[str],
    token_type: Sequence[int] | None,
    special_ids: Iterable[int],
    kind: str,
) -> None:
    """Registers the tokens matched whole in text: control and unknown tokens and the
    BOS/EOS/UNK/PAD ids as special, user-defined tokens as plain added tokens. A byte-level
    token whose text is not spelled in GPT-2's alphabet is left to the merges (its text was
    respelled in the vocabulary)."""
    tk = import_tokenizers()
    special = set(special_ids)
    user_defined = set()
    if token_type is not None:
        for i, t in enumerate(token_type):
            if t in (_TOKEN_CONTROL, _TOKEN_UNKNOWN):
                special.add(i)
            elif t == _TOKEN_USER_DEFINED:
                user_defined.add(i)

    def whole(i: int) -> bool:
        return bool(tokens[i]) and (kind != "gpt2" or set(tokens[i]) <= BYTE_LEVEL_ALPHABET)

    backend.add_special_tokens(
        [tk.AddedToken(tokens[i], normalized=False, special=True) for i in sorted(special) if whole(i)]
    )
    backend.add_tokens(
        [
            tk.AddedToken(tokens[i], normalized=False, special=False)
            for i in sorted(user_defined - special)
            if whole(i)
        ]
    )


@dataclass
class GgufVocabulary:
    """What a GGUF's metadata says about its tokenizer (see :func:`build_gguf_vocabulary`).

    Attributes:
        backend: the ``tokenizers.Tokenizer`` (no post-processor: BOS/EOS are added by
            :class:`riftco.Tokenizer` from ``add_bos_token``/``add_eos_token``).
        tokens: ``tokenizer.ggml.tokens`` (id -> text); its length is the vocabulary size.
        bos_token_id, eos_token_id: the file's, or llama.cpp's defaults for ``"llama"`` (1, 2).
        add_bos_token, add_eos_token: whether ``encode(..., add_special_tokens=True)`` adds them.
        end_ids: ``eot_token_id`` and ``eom_token_id`` when the file has them.
        chat_template: ``tokenizer.chat_template``, or ``None``.
        warnings: what was assumed (no ``tokenizer.ggml.pre``).
    """

    backend: Any
    tokens: list[str]
    bos_token_id: int | None
    eos_token_id: int | None
    add_bos_token: bool
    add_eos_token: bool
    end_ids: list[int]
    chat_template: str | None
    warnings: list[str] = field(default_factory=list)


def build_gguf_vocabulary(metadata: Mapping[str, Any], name: str) -> GgufVocabulary:
    """The tokenizer a GGUF's metadata describes (see the module docstring). ``metadata``: key
    -> value as ``gguf.GGUFReader``'s ``field.contents()`` or ``riftco._native.read_gguf_metadata``
    give them (str, int, float, bool, lists); ``name`` (the file) is used in messages.

    Raises:
        ModelStateError: a missing or malformed key (naming it), a tokenizer model or
            pre-tokenizer riftco does not build, a duplicate token, a malformed merge.
        ImportError: ``tokenizers`` is not installed.
    """
    meta = _GgufKeys(metadata, name)
    kind = meta.string("tokenizer.ggml.model")
    if kind not in ("gpt2", "llama"):
        raise ModelStateError(
            f"{name}: tokenizer.ggml.model {kind!r} is not a tokenizer riftco builds; "
            "expected 'gpt2' (byte-level BPE) or 'llama' (SentencePiece BPE)"
        )
    tokens = meta.strings("tokenizer.ggml.tokens")
    n = len(tokens)
    if n == 0:
        raise ModelStateError(f"{name}: tokenizer.ggml.tokens is empty")
    token_type = meta.ints("tokenizer.ggml.token_type", length=n, default=None)
    keys = ("bos", "eos", "eot", "eom", "unknown", "padding")
    ids = {key: meta.token_id(f"tokenizer.ggml.{key}_token_id", n) for key in keys}
    notes: list[str] = []
    if kind == "gpt2":
        backend, add_bos = _byte_level_bpe(meta, tokens, notes)
    else:
        # llama.cpp's defaults for a SentencePiece vocabulary, when the file gives none.
        for key, default in (("bos", 1), ("eos", 2), ("unknown", 0)):
            if ids[key] is None and f"tokenizer.ggml.{key}_token_id" not in metadata and default < n:
                ids[key] = default
        backend, add_bos = _sentencepiece_bpe(meta, tokens, ids["unknown"]), True
    _add_gguf_special_tokens(backend, tokens, token_type, [i for i in ids.values() if i is not None], kind)
    add_bos = meta.boolean("tokenizer.ggml.add_bos_token", default=add_bos)
    add_eos = meta.boolean("tokenizer.ggml.add_eos_token", default=False)
    for flag, key in ((add_bos, "bos"), (add_eos, "eos")):
        if flag and ids[key] is None:
            raise ModelStateError(
                f"{name}: tokenizer.ggml.add_{key}_token is true but the file has no "
                f"tokenizer.ggml.{key}_token_id"
            )
    return GgufVocabulary(
        backend=backend,
        tokens=tokens,
        bos_token_id=ids["bos"],
        eos_token_id=ids["eos"],
        add_bos_token=add_bos,
        add_eos_token=add_eos,
        end_ids=[i for i in (ids["eot"], ids["eom"]) if i is not None],
        chat_template=meta.string("tokenizer.chat_template", default=None) or None,
        warnings=notes,
    )
