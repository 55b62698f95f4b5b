"""Byte-level text generation on a model's K/V-cache decode session.

A prompt is one of:

- ``str``: its UTF-8 bytes (a string that cannot be encoded, e.g. with a lone surrogate, is a
  :class:`riftco.TokenError`);
- a bytes-like object: ``bytes``, ``bytearray``, or a ``memoryview`` with 1-byte items;
- a sequence of byte values: a ``list``/``tuple``/``range`` of ints, or a 1-D integer NumPy
  array, each value in ``[0, 256)`` (a value outside is a :class:`riftco.TokenError` naming it
  and its index).

Anything else — an ``int`` (``generate(model, 5, ...)``), a float, ``None``, a sequence holding
non-integers or bools, a float array — is a ``TypeError``. An empty prompt is a
:class:`riftco.TokenError`.
"""

from __future__ import annotations

import math
import numbers
import operator
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from riftco._native import DecodeError, DecoderOnlyTransformer, ShapeError, TokenError
from riftco.data.text import VOCAB_SIZE

__all__ = ["Prompt", "check_generation_args", "generate", "sample_token"]

Prompt = str | bytes | bytearray | memoryview | Sequence[int] | npt.NDArray[np.integer[Any]]
"""What :func:`generate` accepts as a prompt (see the module docstring)."""


def _prompt_bytes(prompt: object) -> bytes:
    if isinstance(prompt, str):
        try:
            return prompt.encode("utf-8")
        except UnicodeEncodeError as e:
            raise TokenError(f"the prompt string is not encodable as UTF-8: {e}") from None
    if isinstance(prompt, (bytes, bytearray)):
        return bytes(prompt)
    if isinstance(prompt, memoryview):
        if prompt.itemsize != 1:
            raise TypeError(
                f"a memoryview prompt must have 1-byte items; got format {prompt.format!r} "
                f"with {prompt.itemsize}-byte items"
            )
        return prompt.tobytes()
    if isinstance(prompt, np.ndarray):
        if prompt.dtype.kind not in "iu":
            raise TypeError(f"a NumPy prompt must have an integer dtype; got {prompt.dtype}")
        if prompt.ndim != 1:
            raise TokenError(f"a NumPy prompt must be 1-D; got shape {prompt.shape}")
        bad = np.flatnonzero((prompt < 0) | (prompt >= VOCAB_SIZE))
        if bad.size:
            i = int(bad[0])
            raise TokenError(
                f"prompt token {int(prompt[i])} at index {i} is outside the byte range [0, "
                f"{VOCAB_SIZE})"
            )
        return prompt.astype(np.uint8).tobytes()
    if isinstance(prompt, Sequence):
        out = bytearray()
        for i, value in enumerate(prompt):
            if isinstance(value, bool) or not isinstance(value, (numbers.Integral, np.integer)):
                raise TypeError(
                    f"prompt elements must be ints in [0, {VOCAB_SIZE}); got {value!r} at "
                    f"index {i}"
                )
            v = operator.index(value)
            if not 0 <= v < VOCAB_SIZE:
                raise TokenError(
                    f"prompt token {v} at index {i} is outside the byte range [0, {VOCAB_SIZE})"
                )
            out.append(v)
        return bytes(out)
    raise TypeError(
        "prompt must be a str, bytes, bytearray, memoryview, or a sequence of ints in "
        f"[0, {VOCAB_SIZE}); got {type(prompt).__name__} {prompt!r}"
    )


def _check_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, (numbers.Integral, np.integer)):
        raise TypeError(f"{name} must be an int; got {type(value).__name__} {value!r}")
    return operator.index(value)


def _check_temperature(temperature: object) -> float:
    if isinstance(temperature, bool) or not isinstance(temperature, numbers.Real):
        raise TypeError(
            f"temperature must be a real number; got {type(temperature).__name__} "
            f"{temperature!r}"
        )
    t = float(temperature)
    if not math.isfinite(t) or t < 0.0:
        raise TokenError(f"temperature must be finite and >= 0; got {temperature!r}")
    return t


def _check_top_k(top_k: object) -> int | None:
    if top_k is None:
        return None
    if isinstance(top_k, bool) or not isinstance(top_k, (numbers.Integral, np.integer)):
        raise TypeError(f"top_k must be None or an int >= 1; got {type(top_k).__name__} {top_k!r}")
    k = operator.index(top_k)
    if k < 1:
        raise TokenError(f"top_k must be None or >= 1; got {top_k!r}")
    return k


def _finite_logits(
    logits: npt.ArrayLike, where: str, allow_masked: bool
) -> npt.NDArray[np.float64]:
    """``logits`` as float64 ``[vocab]``; ``-inf`` entries pass when ``allow_masked`` and at
    least one logit is finite."""
    z = np.asarray(logits, dtype=np.float64)
    if z.ndim != 1 or z.shape[0] == 0:
        raise ShapeError(f"logits must be 1-D [vocab] with vocab >= 1; got shape {z.shape}")
    finite = np.isfinite(z)
    if finite.all():
        return z
    n_nan = int(np.count_nonzero(np.isnan(z)))
    n_pos = int(np.count_nonzero(z == np.inf))
    n_neg = int(np.count_nonzero(z == -np.inf))
    if allow_masked and n_nan == 0 and n_pos == 0 and finite.any():
        return z
    raise DecodeError(
        f"{where} are not finite ({n_nan} NaN, {n_pos} +inf, {n_neg} -inf of {z.shape[0]}); "
        "cannot sample (are the model's weights finite?)"
    )


def sample_token(
    logits: npt.ArrayLike,
    temperature: float,
    top_k: int | None,
    rng: np.random.Generator,
) -> int:
    """One token id from ``logits [vocab]`` (any real dtype; computed in float64).

    ``temperature == 0`` is greedy (argmax; the lowest id wins ties). Otherwise all but the
    ``top_k`` largest logits are dropped (when given; ties with the k-th are kept), and a token is
    drawn from ``p ∝ exp((z - max z) / temperature)`` with one ``rng.random()`` draw (inverse CDF
    in float64), so a seeded generator gives the same token on every machine. Subtracting the
    maximum first keeps every weight in ``[0, 1]`` with the largest exactly 1, so any positive
    finite temperature is safe: one so small that the scaled gaps underflow (``1e-320``) samples
    only among the largest logits, the limit of sampling as ``temperature -> 0``.

    A ``-inf`` logit has probability 0 (a mask).

    Raises:
        ShapeError: ``logits`` is not 1-D or is empty.
        DecodeError: a logit is NaN or ``+inf``, or every logit is ``-inf``.
        TokenError: ``temperature`` is negative or not finite, or ``top_k < 1``.
        TypeError: ``temperature`` is not a real number, or ``top_k`` is neither None nor an int.
    """
    t = _check_temperature(temperature)
    k = _check_top_k(top_k)
    z = _finite_logits(logits, "the logits", allow_masked=True)
    if t == 0.0:
        return int(np.argmax(z))
    n = z.shape[0]
    if k is not None and k < n:
        kth = np.partition(z, n - k)[n - k]
        z = np.where(z >= kth, z, -np.inf)
    with np.errstate(over="ignore", under="ignore"):
        # (z - max) is in [-inf, 0] with at least one exact 0, so p[argmax] == 1 and the total
        # is in [1, n]: a gap overflowing to -inf under a tiny temperature only gives weight 0,
        # and no NaN or 0/0 can arise, whatever the temperature.
        p = np.exp((z - np.max(z)) / t)
    cdf = np.cumsum(p)
    u = rng.random() * cdf[-1]
    return int(min(np.searchsorted(cdf, u, side="right"), n - 1))


def check_generation_args(
    prompt: Prompt,
    max_new_tokens: int,
    temperature: float = 1.0,
    top_k: int | None = None,
    seed: int = 0,
    *,
    max_seq_len: int,
) -> bytes:
    """Validates the arguments of :func:`generate` for a model of ``max_seq_len`` positions
    without running it, and returns the prompt's bytes. Lets a caller (the command-line
    examples) reject bad sampling settings before a long training run.

    Raises:
        TypeError: a prompt of an unsupported type (an ``int`` for example; see the module
            docstring), or a ``max_new_tokens``, ``temperature``, ``top_k`` or ``seed`` of the
            wrong type (ints must be ints, not floats or bools).
        TokenError: an empty prompt or a prompt token outside ``[0, 256)``, negative
            ``max_new_tokens``, negative or non-finite ``temperature``, ``top_k < 1``,
            negative ``seed``, or a prompt plus continuation longer than ``max_seq_len``.
    """
    data = _prompt_bytes(prompt)
    if not data:
        raise TokenError("prompt must contain at least one byte")
    n_new = _check_int("max_new_tokens", max_new_tokens)
    if n_new < 0:
        raise TokenError(f"max_new_tokens must be a non-negative integer; got {max_new_tokens!r}")
    _check_temperature(temperature)
    _check_top_k(top_k)
    if _check_int("seed", seed) < 0:
        raise TokenError(f"seed must be a non-negative integer; got {seed!r}")
    positions = len(data) + max(n_new - 1, 0)
    if positions > max_seq_len:
        raise TokenError(
            f"prompt ({len(data)} bytes) plus {n_new} new tokens needs {positions} "
            f"positions; the model's max_seq_len is {max_seq_len}"
        )
    return data


def generate(
    model: DecoderOnlyTransformer,
    prompt: Prompt,
    max_new_tokens: int,
    temperature: float = 1.0,
    top_k: int | None = None,
    seed: int = 0,
) -> bytes:
    """Continue ``prompt`` by ``max_new_tokens`` bytes.

    ``prompt`` is a ``str`` (UTF-8), bytes-like, or a sequence of byte values (see the module
    docstring). Runs a fresh ``model.decode_session()``: the prompt is fed one token at a time,
    then each sampled token (see :func:`sample_token`, with ``numpy.random.default_rng(seed)``).
    Only the first 256 logits (the byte vocabulary) are sampled from. ``temperature == 0`` is
    greedy; any positive finite temperature is numerically safe (a tiny one approaches greedy).
    Returns the new bytes only; generation stops early, without returning it, at the first
    sampled token in ``model.eos_token_ids`` (Hugging Face ``eos_token_id``; none by default).

    Raises:
        TypeError, TokenError: bad arguments, as :func:`check_generation_args` lists.
        DecodeError: the model produced a NaN or infinite logit (non-finite weights), naming the
            position.
    """
    max_seq_len = int(model.config.max_seq_len)
    data = check_generation_args(
        prompt, max_new_tokens, temperature, top_k, seed, max_seq_len=max_seq_len
    )
    n_new = operator.index(max_new_tokens)
    if n_new == 0:
        return b""
    eos = frozenset(model.eos_token_ids)
    session = model.decode_session()
    logits: npt.NDArray[np.float32] = np.zeros(0, dtype=np.float32)
    for token in data:
        logits = session.decode_token(token)
    rng = np.random.default_rng(operator.index(seed))
    out = bytearray()
    for i in range(n_new):
        z = _finite_logits(
            logits[:VOCAB_SIZE],
            f"the model's logits at position {len(data) + i - 1} (for new token {i})",
            allow_masked=False,
        )
        token = sample_token(z, temperature, top_k, rng)
        if token in eos:
            break
        out.append(token)
        if i + 1 < n_new:
            logits = session.decode_token(token)
    return bytes(out)
