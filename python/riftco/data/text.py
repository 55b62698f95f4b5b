"""Byte-level text data: corpora, held-out split and deterministic batch sampling.

Tokens are the bytes of UTF-8 text (vocabulary 256; token ``i`` is byte ``i``).

The default pretraining corpus (:func:`default_corpus`) is the source of the running
interpreter's standard library — real text present on every CPython install: the ``*.py`` files
under ``sysconfig.get_paths()["stdlib"]`` in sorted relative-path order (POSIX separators),
skipping ``site-packages``, ``test``, ``tests``, ``idlelib``, ``lib2to3``, ``pydoc_data``,
``__pycache__`` and hidden directories, each preceded by a ``# ==== <relative path> ====`` line,
and capped at :data:`DEFAULT_CORPUS_MAX_BYTES` (8 MiB; the last file is cut at the cap).

The default post-training corpus (:func:`default_post_training_corpus`) is different text from
the same install: the Python language reference as plain English text (the ``topics`` of
``pydoc_data/topics.py``, about 0.45 MiB), which the pretraining corpus excludes.
"""

from __future__ import annotations

import ast
import math
import os
import sysconfig
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import numpy.typing as npt

from riftco._native import RiftcoError

DEFAULT_CORPUS_MAX_BYTES = 8 * 1024 * 1024
"""Size cap of :func:`default_corpus` in bytes (8 MiB)."""

LOAD_CORPUS_MAX_BYTES = 256 * 1024 * 1024
"""Size cap of :func:`load_corpus` in bytes (256 MiB): more is refused, not truncated."""

VOCAB_SIZE = 256
"""Byte-level vocabulary size."""

SKIPPED_STDLIB_DIRS = frozenset(
    {"site-packages", "test", "tests", "idlelib", "lib2to3", "pydoc_data", "__pycache__"}
)

__all__ = [
    "Corpus",
    "CorpusError",
    "DEFAULT_CORPUS_MAX_BYTES",
    "BatchSampler",
    "check_corpus_fits",
    "decode_bytes",
    "default_corpus",
    "default_post_training_corpus",
    "load_corpus",
    "stdlib_dir",
]


class CorpusError(RiftcoError, ValueError):
    """A corpus cannot be built: a missing path, an unreadable file, no text, or too little
    text for the requested sequence length."""


@dataclass(frozen=True, eq=False)
class Corpus:
    """Byte tokens of a text corpus.

    Attributes:
        tokens: ``uint8 [n_bytes]``, the concatenated text.
        description: where the text came from (recorded in training metadata).
        files: relative or given paths of the files read, in order.
    """

    tokens: npt.NDArray[np.uint8]
    description: str
    files: tuple[str, ...] = field(default=())

    def __len__(self) -> int:
        return int(self.tokens.shape[0])

    def split(
        self, validation_fraction: float
    ) -> tuple[npt.NDArray[np.uint8], npt.NDArray[np.uint8]]:
        """``(train, validation)``: the validation part is the last ``validation_fraction`` of the
        bytes (a contiguous tail, so no window straddles both parts)."""
        if not 0.0 < validation_fraction < 1.0:
            raise CorpusError(f"validation_fraction must be in (0, 1); got {validation_fraction!r}")
        n = len(self)
        n_val = max(1, int(round(n * validation_fraction)))
        return self.tokens[: n - n_val], self.tokens[n - n_val :]

    def to_dict(self) -> dict[str, object]:
        """A JSON-ready summary (bytes, file count, description)."""
        return {"description": self.description, "n_bytes": len(self), "n_files": len(self.files)}


def stdlib_dir() -> Path:
    """The running interpreter's standard-library directory."""
    return Path(sysconfig.get_paths()["stdlib"])


def _stdlib_python_files(root: Path) -> list[str]:
    found: list[str] = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [
            d for d in dirnames if d not in SKIPPED_STDLIB_DIRS and not d.startswith(".")
        ]
        for name in filenames:
            if name.endswith(".py"):
                found.append(Path(dirpath, name).relative_to(root).as_posix())
    return sorted(found)


def _concatenate(
    parts: Iterable[tuple[str, bytes]], max_bytes: int, truncate: bool, headers: bool = True
) -> tuple[bytes, tuple[str, ...]]:
    """Joins the parts. With ``headers`` each is preceded by a ``# ==== <name> ====`` line and
    ends with a newline; without, the texts are kept byte for byte, a newline inserted only
    between a part that does not end with one and the next (a user's files: the corpus is their
    bytes, so a 12-byte file is a 12-byte corpus)."""
    out = bytearray()
    names: list[str] = []
    for name, text in parts:
        if not text.strip():
            continue  # an empty or whitespace-only file adds nothing, not even its header
        if headers:
            chunk = f"# ==== {name} ====\n".encode() + text
            if not chunk.endswith(b"\n"):
                chunk += b"\n"
        else:
            chunk = (b"\n" if out and not out.endswith(b"\n") else b"") + text
        if len(out) + len(chunk) > max_bytes:
            if not truncate:
                raise CorpusError(
                    f"corpus exceeds {max_bytes} bytes at {name}; pass fewer or smaller files"
                )
            out += chunk[: max_bytes - len(out)]
            names.append(name)
            break
        out += chunk
        names.append(name)
    return bytes(out), tuple(names)


def _to_corpus(data: bytes, description: str, files: tuple[str, ...]) -> Corpus:
    if not files:
        raise CorpusError(f"the corpus is empty: no text in {description}")
    tokens = np.frombuffer(data, dtype=np.uint8).copy()
    return Corpus(tokens=tokens, description=description, files=files)


def default_corpus(max_bytes: int = DEFAULT_CORPUS_MAX_BYTES) -> Corpus:
    """The standard-library source corpus described in the module docstring (deterministic for
    a given interpreter install)."""
    root = stdlib_dir()
    if not root.is_dir():
        raise CorpusError(f"the standard library directory {root} does not exist")
    files = _stdlib_python_files(root)

    def parts() -> Iterable[tuple[str, bytes]]:
        for rel in files:
            yield rel, (root / rel).read_bytes()

    data, used = _concatenate(parts(), max_bytes, truncate=True)
    return _to_corpus(
        data, f"Python {sysconfig.get_python_version()} stdlib *.py under {root}", used
    )


def default_post_training_corpus() -> Corpus:
    """The Python language reference as plain English text: the ``topics`` dict of the running
    interpreter's ``pydoc_data/topics.py`` (read with ``ast.literal_eval``, never imported),
    one ``# ==== <topic> ====`` section per topic in sorted order."""
    path = stdlib_dir() / "pydoc_data" / "topics.py"
    if not path.is_file():
        raise CorpusError(f"{path} does not exist on this install; pass text files with --data")
    topics: dict[str, str] = {}
    try:
        for node in ast.parse(path.read_bytes()).body:
            if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "topics" for t in node.targets
            ):
                topics = ast.literal_eval(node.value)
    except (OSError, SyntaxError, ValueError) as e:
        raise CorpusError(f"cannot read the topics of {path}: {e}") from e
    parts = ((name, topics[name].encode("utf-8")) for name in sorted(topics))
    data, used = _concatenate(parts, LOAD_CORPUS_MAX_BYTES, truncate=False)
    return _to_corpus(data, f"Python language reference (topics of {path})", used)


def _expand(path: Path) -> list[Path]:
    if path.is_file():
        return [path]
    if path.is_dir():
        out: list[Path] = []
        for dirpath, dirnames, filenames in os.walk(path):
            dirnames[:] = [d for d in dirnames if not d.startswith(".") and d != "__pycache__"]
            # Only regular files (after symlinks): a FIFO would block, a device such as
            # /dev/zero never ends.
            out.extend(
                Path(dirpath, f)
                for f in filenames
                if not f.startswith(".") and Path(dirpath, f).is_file()
            )
        return sorted(out, key=lambda p: p.relative_to(path).as_posix())
    if not path.exists():
        raise CorpusError(f"data path {str(path)!r} does not exist")
    raise CorpusError(f"data path {str(path)!r} is neither a file nor a directory")


def load_corpus(
    paths: Sequence[str | os.PathLike[str]] | str | os.PathLike[str],
    max_bytes: int = LOAD_CORPUS_MAX_BYTES,
) -> Corpus:
    """Text files, and every non-hidden file under given directories (recursively, sorted by
    relative path), concatenated in the order given, byte for byte (no header lines; a newline is
    inserted between two files only when the first does not end with one). Files containing NUL bytes (binary) and
    anything that is not a regular file (FIFOs, devices, sockets) are skipped inside directories;
    a binary file named directly is refused. A single path may be given as a ``str`` or
    ``os.PathLike`` instead of a sequence. No file is read past ``max_bytes``.

    Raises:
        CorpusError: no paths, a missing path, an unreadable or binary file, an empty corpus,
            or more than ``max_bytes`` bytes.
    """
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    if not paths:
        raise CorpusError("no data paths given")
    resolved = [Path(p) for p in paths]
    for p in resolved:
        if not p.exists():
            raise CorpusError(f"data path {str(p)!r} does not exist")

    def parts() -> Iterable[tuple[str, bytes]]:
        for given in resolved:
            for f in _expand(given):
                try:
                    with open(f, "rb") as fh:
                        text = fh.read(max_bytes + 1)  # more would exceed the corpus anyway
                except OSError as e:
                    raise CorpusError(f"cannot read {str(f)!r}: {e.strerror or e}") from e
                if b"\0" in text:
                    if f == given:
                        raise CorpusError(f"{str(f)!r} is not a text file (it contains NUL bytes)")
                    continue
                yield str(f), text

    data, used = _concatenate(parts(), max_bytes, truncate=False, headers=False)
    shown = ", ".join(str(p) for p in resolved)
    return _to_corpus(data, shown, used)


def check_corpus_fits(
    corpus: Corpus,
    seq_len: int,
    validation_fraction: float,
    *,
    seq_len_name: str = "seq_len",
    data_name: str | None = None,
) -> None:
    """Checks that ``corpus`` split by :meth:`Corpus.split` leaves at least ``seq_len + 1`` bytes
    for training windows and 2 for a validation window (one input and one target byte).

    ``seq_len_name`` and ``data_name`` (``None``: not named) are how the message names the two
    settings (the command line passes ``"--seq-len"`` and ``"--data"``).

    Raises:
        CorpusError: naming the corpus size, its training and validation parts, what
            ``seq_len`` needs, the largest ``seq_len`` this corpus allows and the smallest
            corpus this ``seq_len`` needs.
    """
    n = len(corpus)
    train, val = corpus.split(validation_fraction)
    n_train, n_val = int(train.shape[0]), int(val.shape[0])
    if n_train >= seq_len + 1 and n_val >= 2:
        return
    # The smallest corpus whose split fits. The validation part rounds n * fraction, so 2 held-
    # out bytes need n * fraction >= 1.5: start there (a tiny fraction needs a huge corpus) and
    # step past the rounding (a few dozen iterations at most).
    need = max(seq_len + 2, math.ceil(1.5 / validation_fraction) - 1)
    while True:
        n_val_need = max(1, int(round(need * validation_fraction)))
        if need - n_val_need >= seq_len + 1 and n_val_need >= 2:
            break
        need += 1
    if n_val >= 2 and n_train >= 2:
        fits = f" or a {seq_len_name} of at most {n_train - 1}"
    elif n_val < 2 and n - 2 >= seq_len + 1:
        # The text is enough; the held-out part rounds to fewer than 2 bytes.
        fits = f" or hold out more of it: a validation fraction of at least {1.5 / n:.3g}"
    else:
        fits = f" (this corpus is too small for any {seq_len_name})"
    shown = (
        f"{validation_fraction:.0%}" if validation_fraction >= 0.01 else f"{validation_fraction:g}"
    )
    raise CorpusError(
        f"the corpus has {n:,} bytes: {n_train:,} for training and {n_val:,} held out for "
        f"validation (the last {shown}); {seq_len_name} {seq_len} needs at "
        f"least {seq_len + 1:,} training bytes and 2 validation bytes, a corpus of at least "
        f"{need:,} bytes: pass more text{'' if data_name is None else ' with ' + data_name}"
        f"{fits}"
    )


class BatchSampler:
    """Deterministic ``[batch_size, seq_len + 1]`` windows of a token array.

    ``tokens`` is any 1-D integer array-like (a NumPy array of any integer dtype, ``bytes``, a
    list of ints; read with ``numpy.asarray``, not copied when already an array). Window starts
    are drawn uniformly from ``numpy.random.default_rng(seed)``; the same
    ``(tokens, batch_size, seq_len, seed)`` gives the same sequence of batches on every machine.
    Token values are not range-checked here: the model's ``loss`` rejects ids outside its
    vocabulary.

    Raises:
        TypeError: ``tokens`` is not an integer array-like (floats, bools, strings, objects), or
            ``batch_size``, ``seq_len`` or ``seed`` is not an int.
        CorpusError: ``tokens`` is not 1-D, ``batch_size`` or ``seq_len`` is below 1, ``seed`` is
            negative, or there are fewer than ``seq_len + 1`` tokens.
    """

    def __init__(
        self, tokens: npt.ArrayLike, batch_size: int, seq_len: int, seed: int
    ) -> None:
        if isinstance(tokens, (bytes, bytearray, memoryview)):
            array = np.frombuffer(tokens, dtype=np.uint8)
        else:
            try:
                array = np.asarray(tokens)
            except (TypeError, ValueError) as e:
                raise TypeError(
                    f"tokens must be a 1-D integer array-like; got {type(tokens).__name__} ({e})"
                ) from None
        if array.dtype.kind not in "iu":
            raise TypeError(
                f"tokens must be a 1-D integer array-like; got {type(tokens).__name__} with "
                f"dtype {array.dtype}"
            )
        if array.ndim != 1:
            raise CorpusError(f"tokens must be 1-D; got shape {array.shape}")
        for name, value in (("batch_size", batch_size), ("seq_len", seq_len), ("seed", seed)):
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
                raise TypeError(f"{name} must be an int; got {type(value).__name__} {value!r}")
        if batch_size < 1 or seq_len < 1:
            raise CorpusError(
                f"batch_size and seq_len must be positive; got {batch_size}, {seq_len}"
            )
        if seed < 0:
            raise CorpusError(f"seed must be a non-negative int; got {seed}")
        if array.shape[0] < seq_len + 1:
            raise CorpusError(
                f"the text has {array.shape[0]} bytes; seq_len {seq_len} needs at least "
                f"{seq_len + 1}"
            )
        self._tokens = array
        self._batch_size = int(batch_size)
        self._seq_len = int(seq_len)
        self._rng = np.random.default_rng(int(seed))
        self._offsets = np.arange(self._seq_len + 1, dtype=np.int64)

    def get_state(self) -> dict[str, object]:
        """The generator's state (NumPy's ``bit_generator.state``, a JSON-ready dict of ints and
        strings): :meth:`set_state` with it continues with exactly the batches that would
        have followed."""
        return dict(self._rng.bit_generator.state)

    def set_state(self, state: dict[str, object]) -> None:
        """Restores a :meth:`get_state` result.

        Raises:
            CorpusError: ``state`` is not a state of this sampler's generator (PCG64).
        """
        expected = self._rng.bit_generator.state["bit_generator"]
        if not isinstance(state, dict) or state.get("bit_generator") != expected:
            raise CorpusError(
                f"a sampler state must be a dict of a {expected} generator's state; got "
                f"{type(state).__name__}"
                + (f" of {state.get('bit_generator')!r}" if isinstance(state, dict) else "")
            )
        try:
            self._rng.bit_generator.state = state
        except (TypeError, ValueError, KeyError) as e:
            raise CorpusError(f"invalid sampler state: {e}") from None

    def next_batch(self) -> npt.NDArray[np.int64]:
        """The next ``int64 [batch_size, seq_len + 1]`` block."""
        high = self._tokens.shape[0] - self._seq_len  # exclusive bound of a start
        starts = self._rng.integers(0, high, size=self._batch_size, dtype=np.int64)
        block = self._tokens[starts[:, None] + self._offsets[None, :]]
        return np.asarray(block, dtype=np.int64)

    def batches(self, n: int) -> list[npt.NDArray[np.int64]]:
        """The next ``n`` blocks."""
        return [self.next_batch() for _ in range(n)]


def decode_bytes(data: bytes) -> str:
    """UTF-8 text of generated bytes (invalid sequences become U+FFFD)."""
    return data.decode("utf-8", errors="replace")
