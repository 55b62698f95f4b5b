"""A decode session's prompt as one sequence (``DecodeSession.decode_tokens``): the logits after
the prompt against the full forward's last row and against feeding the prompt one token at a
time, the cache it leaves, and its errors."""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt
import pytest

import riftco

U = 2.0**-24
"""The f32 unit roundoff."""


def gamma(n: int) -> float:
    return n * U / (1 - n * U)


@pytest.fixture(scope="module", params=[False, True], ids=["untied", "tied"])
def model(request: pytest.FixtureRequest) -> riftco.DecoderOnlyTransformer:
    config = riftco.TransformerConfig(
        vocab_size=300, d_model=64, n_heads=4, n_kv_heads=2, n_layers=3, d_ff=128,
        max_seq_len=64, seed=7, tie_word_embeddings=request.param,
    )
    return riftco.DecoderOnlyTransformer(config)


def head_bound(model: riftco.DecoderOnlyTransformer) -> npt.NDArray[np.float64]:
    """Per logit, how far two summation orders of the LM head's dot product on the same final
    hidden row can differ: each is within γ_d·Σ|h_i·w_ji| of the exact sum (Higham 2002, §3.1),
    and Σ|h_i·w_ji| ≤ ‖h‖₂‖w_j‖₂ ≤ max|g|·√d·‖w_j‖₂ (RMSNorm's output has RMS 1 before its
    gain g)."""
    params = dict(model.named_parameters())
    d = int(model.config.d_model)
    gain = np.abs(params["model.norm.weight"].numpy()).max()
    head = params.get("lm_head.weight", params["model.embed_tokens.weight"]).numpy()
    norms = np.linalg.norm(head.astype(np.float64), axis=1)
    bound: npt.NDArray[np.float64] = 2 * gamma(d) * float(gain) * math.sqrt(d) * norms
    return bound


def test_the_prompt_at_once_is_the_full_forwards_last_row(
    model: riftco.DecoderOnlyTransformer,
) -> None:
    ids = list(np.random.default_rng(0).integers(0, 300, size=40))
    at_once = model.decode_session().decode_tokens(ids)
    last = model.logits(np.array([ids])).numpy()[-1]  # [batch * seq, vocab]: the last row
    # The same blocks over the same rows: only the LM head's one-row product sums in another
    # order than the forward's matrix product.
    diff = np.abs(at_once.astype(np.float64) - last)
    assert (diff <= head_bound(model)).all(), (diff.max(), head_bound(model).min())


def test_the_prompt_at_once_agrees_with_one_token_at_a_time(
    model: riftco.DecoderOnlyTransformer,
) -> None:
    ids = list(np.random.default_rng(1).integers(0, 300, size=24))
    one_by_one = model.decode_session()
    for t in ids:
        stepwise = one_by_one.decode_token(t)
    at_once = model.decode_session()
    batched = at_once.decode_tokens(ids)
    assert at_once.position == one_by_one.position == len(ids)
    # Every product of every block sums in another order (a matrix against a one-row
    # product): not bitwise, but the same function. The last row's logits agree to a
    # normwise few·1e-6 of the largest (f32 through 3 blocks of d 64); a wrong mask, RoPE
    # position or cache row moves them by O(1).
    scale = np.abs(stepwise).max()
    assert np.abs(batched - stepwise).max() <= 1e-4 * scale
    # The cache holds the same positions: the next token's logits agree the same way.
    nxt = int(np.argmax(batched))
    a, b = at_once.decode_token(nxt), one_by_one.decode_token(nxt)
    assert np.abs(a - b).max() <= 1e-4 * np.abs(b).max()
    # Into a cache that holds positions, several tokens are fed one at a time (one-token steps,
    # on caches that differ by the rounding above).
    more = [5, 6, 7]
    for t in more:
        want = one_by_one.decode_token(t)
    got = at_once.decode_tokens(more)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-4 * np.abs(want).max())


def test_bad_tokens_feed_nothing(model: riftco.DecoderOnlyTransformer) -> None:
    session = model.decode_session()
    with pytest.raises(riftco.TokenError, match=r"token id 300 is outside the vocabulary \(vocab_size 300\), at index 2"):
        session.decode_tokens([1, 2, 300])
    with pytest.raises(riftco.TokenError, match="no tokens"):
        session.decode_tokens([])
    with pytest.raises(riftco.TokenError, match="token 1 must be an int"):
        session.decode_tokens([1, "x"])  # type: ignore[list-item]  # the bad input tested
    assert session.position == 0
    with pytest.raises(riftco.DecodeError):
        session.decode_tokens([1] * 65)  # past max_seq_len 64
    assert session.position == 0
