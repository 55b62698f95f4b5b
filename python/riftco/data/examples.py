"""Tokenized examples for post-training on instruction and chat data, and their batches.

An :class:`ExampleCorpus` holds one ``input_ids`` / ``labels`` pair per example (Hugging Face's
convention: ``labels`` aligned with ``input_ids``, ``-100`` on positions that are not targets —
the prompt, the user's turns — and shifted inside the loss). :class:`ExampleBatchSampler` draws
``batch_size`` examples per step, each epoch in a new order (``numpy.random.default_rng(seed)``),
and right-pads them to ``seq_len + 1`` columns with ``pad_id`` and label ``-100``: with causal
attention no real token attends to the padding after it, so a padded example computes exactly
what it would alone, and the loss is the mean over the batch's target tokens
(``DecoderOnlyTransformer.loss(tokens, labels=...)``).

With ``packing=True`` the sampler packs several whole examples into each row instead (first
fit, in the epoch's order) and gives ``position_ids`` counting ``0, 1, ..`` within each example
(Hugging Face's padding-free convention): ``loss(tokens, labels=..., position_ids=...)`` then
computes every example as if alone, with far fewer padding tokens.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from riftco._native import IGNORE_INDEX
from riftco.data.text import CorpusError

__all__ = ["ExampleBatchSampler", "ExampleCorpus", "examples_from_pairs"]

Ids = npt.NDArray[np.int64]


@dataclass(frozen=True, eq=False)
class ExampleCorpus:
    """Tokenized examples.

    Attributes:
        input_ids: one ``int64 [n_i]`` array per example.
        labels: one ``int64 [n_i]`` array per example: the id to predict at that position, or
            ``-100`` (not a target); position 0 is never a target.
        description: where the examples came from (recorded in training metadata).
        files: the files read, in order.

    Raises:
        CorpusError: no examples, arrays of other lengths or dtypes, an example with fewer than
            2 tokens or without any target after position 0 (named by index).
    """

    input_ids: tuple[Ids, ...]
    labels: tuple[Ids, ...]
    description: str
    files: tuple[str, ...] = field(default=())

    def __post_init__(self) -> None:
        if len(self.input_ids) != len(self.labels):
            raise CorpusError(
                f"{len(self.input_ids)} input_ids arrays but {len(self.labels)} labels arrays"
            )
        if not self.input_ids:
            raise CorpusError(f"no examples in {self.description}")
        ids_out, labels_out = [], []
        for i, (ids, labels) in enumerate(zip(self.input_ids, self.labels, strict=True)):
            a, b = np.asarray(ids), np.asarray(labels)
            if a.ndim != 1 or b.ndim != 1 or a.shape != b.shape:
                raise CorpusError(
                    f"example {i}: input_ids {a.shape} and labels {b.shape} must be 1-D and of "
                    "one length"
                )
            if a.dtype.kind not in "iu" or b.dtype.kind not in "iu":
                raise CorpusError(f"example {i}: input_ids and labels must hold integers")
            if a.shape[0] < 2:
                raise CorpusError(f"example {i} has {a.shape[0]} tokens; at least 2 are needed")
            if not np.any(b[1:] != IGNORE_INDEX):
                raise CorpusError(
                    f"example {i} has no target token (every label after position 0 is "
                    f"{IGNORE_INDEX}): it would train nothing"
                )
            ids_out.append(a.astype(np.int64, copy=False))
            labels_out.append(b.astype(np.int64, copy=False))
        object.__setattr__(self, "input_ids", tuple(ids_out))
        object.__setattr__(self, "labels", tuple(labels_out))

    def __len__(self) -> int:
        return len(self.input_ids)

    @property
    def n_tokens(self) -> int:
        return int(sum(a.shape[0] for a in self.input_ids))

    @property
    def n_target_tokens(self) -> int:
        return int(sum(int(np.count_nonzero(b[1:] != IGNORE_INDEX)) for b in self.labels))

    @property
    def max_length(self) -> int:
        return int(max(a.shape[0] for a in self.input_ids))

    def split(self, validation_fraction: float) -> tuple[ExampleCorpus, ExampleCorpus]:
        """``(train, validation)``: the last ``validation_fraction`` of the examples (at least
        one) are held out.

        Raises:
            CorpusError: fewer than 2 examples, or a fraction outside ``(0, 1)``.
        """
        if not 0.0 < validation_fraction < 1.0:
            raise CorpusError(f"validation_fraction must be in (0, 1); got {validation_fraction!r}")
        n = len(self)
        if n < 2:
            raise CorpusError(
                f"{self.description} has {n} example: at least 2 are needed (one to train on, "
                "one held out for validation)"
            )
        n_val = min(n - 1, max(1, int(round(n * validation_fraction))))
        cut = n - n_val
        return (
            ExampleCorpus(self.input_ids[:cut], self.labels[:cut], self.description, self.files),
            ExampleCorpus(self.input_ids[cut:], self.labels[cut:], self.description, self.files),
        )

    def fingerprint(self) -> str:
        """SHA-256 of every example's ids and labels (a resume compares it)."""
        h = hashlib.sha256()
        for a, b in zip(self.input_ids, self.labels, strict=True):
            h.update(np.int64(a.shape[0]).tobytes())
            h.update(a.tobytes())
            h.update(b.tobytes())
        return h.hexdigest()

    def to_dict(self) -> dict[str, Any]:
        """What training metadata records."""
        return {
            "description": self.description,
            "files": list(self.files),
            "examples": len(self),
            "tokens": self.n_tokens,
            "target_tokens": self.n_target_tokens,
        }


class ExampleBatchSampler:
    """``(tokens, labels)`` batches ``int64 [batch_size, seq_len + 1]`` of whole examples,
    right-padded with ``pad_id`` (labels ``-100``), each epoch in a new order drawn from
    ``numpy.random.default_rng(seed)``; the same arguments give the same batches everywhere.

    With ``packing=True`` each row holds as many whole examples as fit: the examples are taken
    in the epoch's order and each goes into the first row of the batch with room for it (first
    fit); the batch is complete at the first example that fits no row (it opens the next
    batch). The rest of a row is padding (``pad_id``, labels ``-100``), and
    :meth:`next_packed_batch` adds ``position_ids`` ``int64 [batch_size, seq_len + 1]``
    restarting at 0 at every example (and at the padding, which forms its own span).

    Raises:
        CorpusError: an example longer than ``seq_len + 1`` tokens (named, with the longest),
            ``batch_size`` or ``seq_len`` below 1, a negative ``seed`` or ``pad_id``.
    """

    def __init__(
        self,
        examples: ExampleCorpus,
        batch_size: int,
        seq_len: int,
        seed: int,
        pad_id: int = 0,
        packing: bool = False,
    ) -> None:
        if batch_size < 1 or seq_len < 1:
            raise CorpusError(
                f"batch_size and seq_len must be positive; got {batch_size}, {seq_len}"
            )
        if seed < 0 or pad_id < 0:
            raise CorpusError(f"seed and pad_id must be non-negative; got {seed}, {pad_id}")
        too_long = [i for i, a in enumerate(examples.input_ids) if a.shape[0] > seq_len + 1]
        if too_long:
            longest = max(examples.input_ids[i].shape[0] for i in too_long)
            raise CorpusError(
                f"{len(too_long)} examples of {examples.description} are longer than seq_len + "
                f"1 = {seq_len + 1} tokens (example {too_long[0]}: "
                f"{examples.input_ids[too_long[0]].shape[0]}; the longest: {longest}): raise "
                "seq_len (up to the model's max_seq_len) or truncate or skip them when loading"
            )
        self._examples = examples
        self._batch_size = int(batch_size)
        self._width = int(seq_len) + 1
        self._pad_id = int(pad_id)
        self.packing = bool(packing)
        self._rng = np.random.default_rng(int(seed))
        self._epoch_state: dict[str, Any] = {}
        self._order: npt.NDArray[np.int64] = np.zeros(0, np.int64)
        self._position = 0
        self._new_epoch()

    def _new_epoch(self) -> None:
        self._epoch_state = dict(self._rng.bit_generator.state)
        self._order = self._rng.permutation(len(self._examples)).astype(np.int64)
        self._position = 0

    def next_batch(self) -> tuple[Ids, ...]:
        """The next ``(tokens, labels)``, both ``int64 [batch_size, seq_len + 1]``; with
        ``packing=True`` the next ``(tokens, labels, position_ids)`` of
        :meth:`next_packed_batch` (``model.loss(*batch[:2], position_ids=batch[2])``)."""
        if self.packing:
            return self.next_packed_batch()
        tokens = np.full((self._batch_size, self._width), self._pad_id, np.int64)
        labels = np.full((self._batch_size, self._width), IGNORE_INDEX, np.int64)
        for row in range(self._batch_size):
            if self._position == len(self._order):
                self._new_epoch()
            i = int(self._order[self._position])
            self._position += 1
            ids, lab = self._examples.input_ids[i], self._examples.labels[i]
            tokens[row, : ids.shape[0]] = ids
            labels[row, : lab.shape[0]] = lab
        return tokens, labels

    def next_packed_batch(self) -> tuple[Ids, Ids, Ids]:
        """The next ``(tokens, labels, position_ids)``, each ``int64 [batch_size, seq_len +
        1]``, packed first fit whatever ``packing`` says."""
        shape = (self._batch_size, self._width)
        tokens = np.full(shape, self._pad_id, np.int64)
        labels = np.full(shape, IGNORE_INDEX, np.int64)
        positions = np.zeros(shape, np.int64)
        used = [0] * self._batch_size
        while True:
            if self._position == len(self._order):
                self._new_epoch()
            i = int(self._order[self._position])
            ids, lab = self._examples.input_ids[i], self._examples.labels[i]
            n = ids.shape[0]
            row = next((r for r in range(self._batch_size) if used[r] + n <= self._width), None)
            if row is None:
                break
            self._position += 1
            start = used[row]
            tokens[row, start : start + n] = ids
            labels[row, start : start + n] = lab
            positions[row, start : start + n] = np.arange(n)
            used[row] += n
        for row, start in enumerate(used):
            positions[row, start:] = np.arange(self._width - start)
        return tokens, labels, positions

    def get_state(self) -> dict[str, object]:
        """The sampler's position: the generator's state at the start of the current epoch and
        the examples drawn in it (JSON-ready)."""
        return {"epoch_start": self._epoch_state, "position": self._position}

    def set_state(self, state: dict[str, object]) -> None:
        """Restores a :meth:`get_state` result.

        Raises:
            CorpusError: not such a state.
        """
        try:
            epoch_start = state["epoch_start"]
            position = state["position"]
            if not isinstance(position, int) or not 0 <= position <= len(self._examples):
                raise ValueError(f"position {position!r} outside [0, {len(self._examples)}]")
            if not isinstance(epoch_start, dict):
                raise TypeError(f"epoch_start must be a dict; got {type(epoch_start).__name__}")
            self._rng.bit_generator.state = epoch_start
        except (KeyError, TypeError, ValueError) as e:
            raise CorpusError(f"invalid example sampler state: {e}") from None
        self._new_epoch()
        self._position = position


def examples_from_pairs(
    pairs: Sequence[tuple[npt.ArrayLike, npt.ArrayLike]], description: str
) -> ExampleCorpus:
    """An :class:`ExampleCorpus` of ``(input_ids, labels)`` pairs."""
    return ExampleCorpus(
        tuple(np.asarray(a, np.int64) for a, _ in pairs),
        tuple(np.asarray(b, np.int64) for _, b in pairs),
        description,
    )
