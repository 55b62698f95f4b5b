"""Text generation on a model's K/V-cache decode session: riftco's byte tokens by default, or
the token ids of a :class:`riftco.Tokenizer` (``tokenizer=``).

Without a tokenizer (a byte-level model) a prompt is one of:

- ``str``: its UTF-8 bytes (a string that cannot be encoded, e.g. with a lone surrogate, is a
  :class:`riftco.TokenError`);
- a bytes-like object: ``bytes``, ``bytearray``, or a ``memoryview`` with 1-byte items;
- a sequence of byte values: a ``list``/``tuple``/``range`` of ints, or a 1-D integer NumPy
  array, each value in ``[0, 256)`` (a value outside is a :class:`riftco.TokenError` naming it
  and its index).

Anything else — an ``int`` (``generate(model, 5, ...)``), a float, ``None``, a sequence holding
non-integers or bools, a float array — is a ``TypeError``. An empty prompt is a
:class:`riftco.TokenError`.

With ``tokenizer=`` (:func:`riftco.load_tokenizer` of the model's folder or GGUF file) a ``str``
prompt is encoded by it and gives a ``str`` continuation; a sequence of token ids (or a 1-D
integer array) gives the list of new ids. Either way generation stops before EOS or the chat
template's end-of-turn id (:attr:`riftco.Tokenizer.stop_token_ids`) or any id in
``model.eos_token_ids``. :func:`generate_tokens` yields the new ids one at a time (for
streaming, with :class:`riftco.StreamingDetokenizer`).
"""

from __future__ import annotations

import math
import numbers
import operator
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, overload

import numpy as np
import numpy.typing as npt

from riftco._native import DecodeError, DecoderOnlyTransformer, ShapeError, TokenError
from riftco.data.text import VOCAB_SIZE
from riftco.data.tokenizer import Tokenizer

__all__ = ["Prompt", "check_generation_args", "generate", "generate_tokens", "sample_token"]

Prompt = str | bytes | bytearray | memoryview | Sequence[int] | npt.NDArray[np.integer[Any]]
"""What :func:`generate` accepts as a prompt (see the module docstring)."""


def _prompt_values(prompt: object, limit: int, where: str) -> list[int] | None:
    """The values of an integer-sequence prompt (a 1-D integer array, or a sequence of ints),
    each checked to be in ``[0, limit)`` (``where`` names that range in the message); ``None``
    for any other type."""
    if isinstance(prompt, np.ndarray):
        if prompt.dtype.kind not in "iu":
            raise TypeError(f"a NumPy prompt must have an integer dtype; got {prompt.dtype}")
        if prompt.ndim != 1:
            raise TokenError(f"a NumPy prompt must be 1-D; got shape {prompt.shape}")
        bad = np.flatnonzero((prompt < 0) | (prompt >= limit))
        if bad.size:
            i = int(bad[0])
            raise TokenError(
                f"prompt token {int(prompt[i])} at index {i} is outside {where} [0, {limit})"
            )
        return [int(v) for v in prompt.tolist()]
    if isinstance(prompt, Sequence) and not isinstance(prompt, (str, bytes, bytearray)):
        out = []
        for i, value in enumerate(prompt):
            if isinstance(value, bool) or not isinstance(value, (numbers.Integral, np.integer)):
                raise TypeError(
                    f"prompt elements must be ints in [0, {limit}); got {value!r} at index {i}"
                )
            v = operator.index(value)
            if not 0 <= v < limit:
                raise TokenError(f"prompt token {v} at index {i} is outside {where} [0, {limit})")
            out.append(v)
        return out
    return None


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
    values = _prompt_values(prompt, VOCAB_SIZE, "the byte range")
    if values is not None:
        return bytes(values)
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


def _sample_loop(
    model: DecoderOnlyTransformer,
    prompt: Sequence[int],
    n_new: int,
    temperature: float,
    top_k: int | None,
    seed: int,
    stop: frozenset[int],
    n_sampled: int,
) -> Iterator[int]:
    """Feeds ``prompt`` to a fresh decode session, then yields up to ``n_new`` ids sampled from
    the first ``n_sampled`` logits, stopping before an id in ``stop``."""
    if n_new == 0:
        return
    session = model.decode_session()
    # The prompt as one sequence (about one forward of its length, not one step per token).
    logits = session.decode_tokens(list(prompt))
    rng = np.random.default_rng(operator.index(seed))
    for i in range(n_new):
        z = _finite_logits(
            logits[:n_sampled],
            f"the model's logits at position {len(prompt) + i - 1} (for new token {i})",
            allow_masked=False,
        )
        token = sample_token(z, temperature, top_k, rng)
        if token in stop:
            return
        yield token
        if i + 1 < n_new:
            logits = session.decode_token(token)


def generate_tokens(
    model: DecoderOnlyTransformer,
    prompt_ids: Sequence[int] | npt.NDArray[np.integer[Any]],
    max_new_tokens: int,
    temperature: float = 1.0,
    top_k: int | None = None,
    seed: int = 0,
    *,
    stop_token_ids: Iterable[int] = (),
    vocab_size: int | None = None,
) -> Iterator[int]:
    """Continues the token ids ``prompt_ids``: yields each new id as it is sampled (from the
    first ``vocab_size`` logits, default all of the model's; :func:`sample_token` with
    ``numpy.random.default_rng(seed)``; greedy at ``temperature == 0``), at most
    ``max_new_tokens``, stopping before the first id in ``stop_token_ids`` or
    ``model.eos_token_ids``. The arguments are checked when it is called, before the first id.

    Raises:
        TypeError: arguments of the wrong type (as :func:`check_generation_args`).
        TokenError: an empty prompt, a prompt id outside the model's vocabulary, bad sampling
            settings, or a prompt plus continuation longer than ``max_seq_len`` (naming both).
        DecodeError: (while iterating) a NaN or infinite logit, naming the position.
    """
    n_vocab = int(model.config.vocab_size)
    ids = _prompt_values(prompt_ids, n_vocab, "the model's vocabulary")
    if ids is None:
        raise TypeError(
            f"prompt_ids must be a sequence of ints or a 1-D integer array; got "
            f"{type(prompt_ids).__name__}"
        )
    if not ids:
        raise TokenError("prompt must contain at least one token")
    n_new = _check_int("max_new_tokens", max_new_tokens)
    if n_new < 0:
        raise TokenError(f"max_new_tokens must be a non-negative integer; got {max_new_tokens!r}")
    _check_temperature(temperature)
    _check_top_k(top_k)
    if _check_int("seed", seed) < 0:
        raise TokenError(f"seed must be a non-negative integer; got {seed!r}")
    n_sampled = n_vocab if vocab_size is None else _check_int("vocab_size", vocab_size)
    if not 1 <= n_sampled <= n_vocab:
        raise TokenError(f"vocab_size must be in [1, {n_vocab}] (the model's); got {vocab_size!r}")
    max_seq_len = int(model.config.max_seq_len)
    positions = len(ids) + max(n_new - 1, 0)
    if positions > max_seq_len:
        raise TokenError(
            f"prompt ({len(ids)} tokens) plus {n_new} new tokens needs {positions} positions; "
            f"the model's max_seq_len is {max_seq_len}"
        )
    stop = frozenset(int(i) for i in (*model.eos_token_ids, *stop_token_ids))
    return _sample_loop(model, ids, n_new, temperature, top_k, seed, stop, n_sampled)


@overload
def generate(
    model: DecoderOnlyTransformer,
    prompt: str,
    max_new_tokens: int,
    temperature: float = ...,
    top_k: int | None = ...,
    seed: int = ...,
    *,
    tokenizer: Tokenizer,
) -> str: ...


@overload
def generate(  # type: ignore[overload-overlap]
    model: DecoderOnlyTransformer,
    prompt: bytes | bytearray | memoryview,
    max_new_tokens: int,
    temperature: float = ...,
    top_k: int | None = ...,
    seed: int = ...,
    *,
    tokenizer: Tokenizer,
) -> bytes: ...


@overload
def generate(
    model: DecoderOnlyTransformer,
    prompt: Sequence[int] | npt.NDArray[np.integer[Any]],
    max_new_tokens: int,
    temperature: float = ...,
    top_k: int | None = ...,
    seed: int = ...,
    *,
    tokenizer: Tokenizer,
) -> list[int]: ...


@overload
def generate(
    model: DecoderOnlyTransformer,
    prompt: str | bytes | bytearray | memoryview,
    max_new_tokens: int,
    temperature: float = ...,
    top_k: int | None = ...,
    seed: int = ...,
    *,
    tokenizer: None = ...,
) -> bytes: ...


@overload
def generate(
    model: DecoderOnlyTransformer,
    prompt: Sequence[int] | npt.NDArray[np.integer[Any]],
    max_new_tokens: int,
    temperature: float = ...,
    top_k: int | None = ...,
    seed: int = ...,
    *,
    tokenizer: None = ...,
) -> bytes | list[int]: ...


def generate(
    model: DecoderOnlyTransformer,
    prompt: Prompt,
    max_new_tokens: int,
    temperature: float = 1.0,
    top_k: int | None = None,
    seed: int = 0,
    *,
    tokenizer: Tokenizer | None = None,
) -> bytes | str | list[int]:
    """Continue ``prompt`` by at most ``max_new_tokens`` tokens.

    Without ``tokenizer`` the model's tokens are bytes: ``prompt`` is a ``str`` (UTF-8),
    bytes-like, or a sequence of byte values (see the module docstring); only the first 256
    logits (the byte vocabulary) are sampled from, and the new bytes are returned. A model of
    more than 256 tokens is not a byte model: without its ``tokenizer`` a ``str`` or bytes
    prompt is a ``TokenError``, and token ids give the new ids (sampled from every logit).

    With ``tokenizer`` (the model's, :func:`riftco.load_tokenizer`): a ``str`` prompt is
    ``tokenizer.encode(prompt)`` (BOS added where the tokenizer adds it) and the continuation
    comes back as ``str`` (decoded after the prompt, so a leading space is kept); a sequence
    of ids gives the list of new ids; bytes are accepted only by a byte tokenizer (and give
    bytes). Sampled from the first ``min(model vocab_size, tokenizer.vocab_size)`` logits;
    stops before an id of ``tokenizer.stop_token_ids`` (EOS, end of turn).

    Runs a fresh ``model.decode_session()``: the prompt is fed one token at a time, then each
    sampled token (see :func:`sample_token`, with ``numpy.random.default_rng(seed)``).
    ``temperature == 0`` is greedy; any positive finite temperature is numerically safe (a tiny
    one approaches greedy). Generation stops early, without returning it, at the first sampled
    token in ``model.eos_token_ids`` (Hugging Face ``eos_token_id``; none by default).

    Raises:
        TypeError, TokenError: bad arguments, as :func:`check_generation_args` lists (token
            ids: as :func:`generate_tokens`); a ``tokenizer`` that is not a
            :class:`riftco.Tokenizer`; bytes with a tokenizer that is not bytes; a prompt the
            tokenizer cannot encode, or whose ids the model does not have.
        DecodeError: the model produced a NaN or infinite logit (non-finite weights), naming the
            position.
    """
    if tokenizer is not None:
        if not isinstance(tokenizer, Tokenizer):
            raise TypeError(
                f"tokenizer must be a riftco.Tokenizer; got {type(tokenizer).__name__}"
            )
        if not (tokenizer.is_bytes and isinstance(prompt, (bytes, bytearray, memoryview))):
            return _generate_with(
                tokenizer, model, prompt, max_new_tokens, temperature, top_k, seed
            )
    n_vocab = int(model.config.vocab_size)
    if tokenizer is None and n_vocab > VOCAB_SIZE:
        # Text or bytes read as byte tokens by a model with a real vocabulary is noise, never
        # an answer: say what to pass instead of returning it. Token ids are ids.
        if isinstance(prompt, (str, bytes, bytearray, memoryview)):
            raise TokenError(
                f"this model has {n_vocab:,} tokens, not riftco's {VOCAB_SIZE} byte tokens: pass "
                "its tokenizer, generate(model, text, n, tokenizer=riftco.load_tokenizer(<the "
                "model's folder or GGUF file>)), or token ids"
            )
        return list(
            generate_tokens(model, prompt, max_new_tokens, temperature, top_k, seed)
        )
    max_seq_len = int(model.config.max_seq_len)
    data = check_generation_args(
        prompt, max_new_tokens, temperature, top_k, seed, max_seq_len=max_seq_len
    )
    n_new = operator.index(max_new_tokens)
    if n_new == 0:
        return b""
    eos = frozenset(int(i) for i in model.eos_token_ids)
    return bytes(_sample_loop(model, data, n_new, temperature, top_k, seed, eos, VOCAB_SIZE))


def _generate_with(
    tokenizer: Tokenizer,
    model: DecoderOnlyTransformer,
    prompt: Prompt,
    max_new_tokens: int,
    temperature: float,
    top_k: int | None,
    seed: int,
) -> str | list[int]:
    n_vocab = int(model.config.vocab_size)
    if isinstance(prompt, str):
        ids = tokenizer.encode(prompt)
        bad = [i for i in ids if i >= n_vocab]
        if bad:
            raise TokenError(
                f"{tokenizer.name} gave token id {bad[0]}, outside the model's vocabulary "
                f"(vocab_size {n_vocab}): the tokenizer does not belong to the model"
            )
    elif isinstance(prompt, (bytes, bytearray, memoryview)):
        raise TypeError(
            f"a bytes prompt is for byte-level models; {tokenizer.name} encodes text: pass a "
            "str (or token ids)"
        )
    else:
        values = _prompt_values(prompt, min(n_vocab, tokenizer.vocab_size), "the vocabulary")
        if values is None:
            raise TypeError(
                "prompt must be a str or a sequence of token ids; got "
                f"{type(prompt).__name__} {prompt!r:.80}"
            )
        ids = values
    new = list(
        generate_tokens(
            model,
            ids,
            max_new_tokens,
            temperature,
            top_k,
            seed,
            stop_token_ids=tokenizer.stop_token_ids,
            vocab_size=min(n_vocab, tokenizer.vocab_size),
        )
    )
    if not isinstance(prompt, str):
        return new
    stream = tokenizer.stream(context=ids)
    return "".join(stream.add_token(i) for i in new) + stream.finalize()
