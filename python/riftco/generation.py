"""Byte-level text generation on a model's K/V-cache decode session."""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt

from riftco._native import DecoderOnlyTransformer, TokenError
from riftco.data import VOCAB_SIZE

__all__ = ["generate", "sample_token"]


def sample_token(
    logits: npt.NDArray[np.float32],
    temperature: float,
    top_k: int | None,
    rng: np.random.Generator,
) -> int:
    """One token id from ``logits [vocab]``.

    ``temperature == 0`` is greedy (argmax; the lowest id wins ties). Otherwise the logits are
    divided by ``temperature``, all but the ``top_k`` largest are dropped (when given), and a
    token is drawn from the softmax with one ``rng.random()`` draw (inverse CDF in float64), so a
    seeded generator gives the same token on every machine.
    """
    z = np.asarray(logits, dtype=np.float64)
    if temperature == 0.0:
        return int(np.argmax(z))
    z = z / temperature
    if top_k is not None and top_k < z.shape[0]:
        kth = np.partition(z, z.shape[0] - top_k)[z.shape[0] - top_k]
        z = np.where(z >= kth, z, -np.inf)
    z = z - np.max(z)
    p = np.exp(z)
    cdf = np.cumsum(p)
    u = rng.random() * cdf[-1]
    return int(min(np.searchsorted(cdf, u, side="right"), z.shape[0] - 1))


def generate(
    model: DecoderOnlyTransformer,
    prompt: bytes | str,
    max_new_tokens: int,
    temperature: float = 1.0,
    top_k: int | None = None,
    seed: int = 0,
) -> bytes:
    """Continue ``prompt`` (UTF-8 when a ``str``) by ``max_new_tokens`` bytes.

    Runs a fresh ``model.decode_session()``: the prompt is fed one token at a time, then each
    sampled token (see :func:`sample_token`, with ``numpy.random.default_rng(seed)``). Only the
    first 256 logits (the byte vocabulary) are sampled from. Returns the new bytes only.

    Raises:
        TokenError: empty prompt, negative ``max_new_tokens``, negative or non-finite
            ``temperature``, ``top_k < 1``, or a prompt plus continuation longer than the
            model's ``max_seq_len`` positions.
    """
    data = prompt.encode("utf-8") if isinstance(prompt, str) else bytes(prompt)
    if not data:
        raise TokenError("prompt must contain at least one byte")
    if (
        isinstance(max_new_tokens, bool)
        or not isinstance(max_new_tokens, int)
        or max_new_tokens < 0
    ):
        raise TokenError(f"max_new_tokens must be a non-negative integer; got {max_new_tokens!r}")
    if not math.isfinite(temperature) or temperature < 0.0:
        raise TokenError(f"temperature must be finite and >= 0; got {temperature!r}")
    if top_k is not None and top_k < 1:
        raise TokenError(f"top_k must be None or >= 1; got {top_k!r}")
    max_seq_len = int(model.config.max_seq_len)
    positions = len(data) + max(max_new_tokens - 1, 0)
    if positions > max_seq_len:
        raise TokenError(
            f"prompt ({len(data)} bytes) plus {max_new_tokens} new tokens needs {positions} "
            f"positions; the model's max_seq_len is {max_seq_len}"
        )
    if max_new_tokens == 0:
        return b""
    session = model.decode_session()
    logits: npt.NDArray[np.float32] = np.zeros(0, dtype=np.float32)
    for token in data:
        logits = session.decode_token(token)
    rng = np.random.default_rng(seed)
    out = bytearray()
    for i in range(max_new_tokens):
        token = sample_token(logits[:VOCAB_SIZE], temperature, top_k, rng)
        out.append(token)
        if i + 1 < max_new_tokens:
            logits = session.decode_token(token)
    return bytes(out)
