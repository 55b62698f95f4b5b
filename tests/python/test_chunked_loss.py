"""The chunked LM head + cross-entropy from Python (``model.loss_chunk_bytes``): the loss
against a NumPy float64 cross-entropy of the model's whole logits, chunked against unfused
(within a bound derived from the products' rounding; bitwise for one chunk of all rows) for tied and untied heads and LoRA, the
setting's validation on the model, the stage configs and the CLI flag."""

from __future__ import annotations

import argparse
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

import riftco
from riftco.cli import add_checkpointing_arguments

VOCAB = 300


def model(tied: bool = False) -> riftco.DecoderOnlyTransformer:
    config = riftco.TransformerConfig(
        vocab_size=VOCAB,
        d_model=32,
        n_heads=4,
        n_layers=2,
        d_ff=48,
        max_seq_len=32,
        seed=3,
        tie_word_embeddings=tied,
    )
    return riftco.DecoderOnlyTransformer(config, activation_checkpointing="block")


def block(batch: int = 3, seq_plus_one: int = 12) -> npt.NDArray[np.int64]:
    return (np.arange(batch * seq_plus_one, dtype=np.int64).reshape(batch, seq_plus_one) * 37) % VOCAB


def test_the_default_is_chunked_with_64_mib() -> None:
    assert riftco.DEFAULT_LOSS_CHUNK_BYTES == 64 * 2**20
    assert model().loss_chunk_bytes == riftco.DEFAULT_LOSS_CHUNK_BYTES


@pytest.mark.parametrize("tied", [False, True])
def test_the_chunked_loss_equals_a_numpy_cross_entropy_of_the_logits(tied: bool) -> None:
    m = model(tied)
    m.loss_chunk_bytes = 4 * (VOCAB + 1) * 5  # 5 tokens a chunk: 33 tokens in 7 chunks
    tokens = block()
    with riftco.no_grad():
        logits = m.logits(tokens[:, :-1]).numpy().astype(np.float64)
    targets = tokens[:, 1:].reshape(-1)
    shifted = logits - logits.max(axis=1, keepdims=True)
    lse = np.log(np.exp(shifted).sum(axis=1)) + logits.max(axis=1)
    want = float(np.mean(lse - logits[np.arange(len(targets)), targets]))
    got = m.loss(tokens).item()
    assert got == pytest.approx(want, rel=1e-6)


def gradients(m: riftco.DecoderOnlyTransformer, chunk: int | str | None) -> tuple[float, dict[str, Any]]:
    m.loss_chunk_bytes = chunk
    loss = m.loss(block())
    loss.backward()
    named = m.named_parameters() + (m.named_lora_parameters() if m.has_lora else [])
    grads = {n: p.grad for n, p in named if p.requires_grad}
    return loss.item(), grads


U = 2.0**-24
"""The f32 unit roundoff."""


def gamma(n: int) -> float:
    """Higham's γ_n = n·u / (1 − n·u): any summation order of n products, with or without fused
    multiply-adds, lies within γ_n·Σ|terms| of the exact sum (Higham 2002, "Accuracy and
    Stability of Numerical Algorithms", §3.1, eq. 3.5)."""
    return n * U / (1 - n * U)


def loss_bound(m: riftco.DecoderOnlyTransformer, tied: bool, loss: float) -> float:
    """How far two computations of the mean cross-entropy of the same hidden states may differ
    when their head products sum each logit in another order (the row blocking of a matrix
    product depends on its number of rows: ``gemm``'s one-row, small-product and k-blocked
    paths).

    A logit ``z = Σ_k h_k·W_vk`` of a row ``h`` (the final RMSNorm's output, ``‖h‖₂ <= max|g|·√d``
    for norm weight ``g``) is within ``γ_d·S`` of exact in either path, ``S = max|g|·√d·max_v‖W_v‖₂``
    bounding ``Σ_k |h_k·W_vk|`` (Cauchy–Schwarz), so the two differ by at most ``2γ_d·S``. A row's
    loss ``logsumexp(z) − z_t`` moves by at most twice that (logsumexp is 1-Lipschitz in the
    max norm), plus the roundings of the two logsumexps (``exp`` to 2u and its argument
    ``z − max z`` to ``2S·u``, a sum of ``V`` terms to ``γ_V``, ``log`` and the final additions
    to ``u`` of their magnitudes, ``|lse| <= S + ln V``), the subtraction, and the mean's
    final rounding to f32. Every term is a worst case."""
    named = dict(m.named_parameters())
    w = named["model.embed_tokens.weight" if tied else "lm_head.weight"].numpy().astype(np.float64)
    g = named["model.norm.weight"].numpy().astype(np.float64)
    v, d = w.shape
    # 1e-3: the norm's own f32 rounding of ‖h‖₂ (d·u = 2e-6 here), with room to spare.
    s = float(np.abs(g).max() * np.sqrt(d) * np.linalg.norm(w, axis=1).max()) * (1 + 1e-3)
    lse_max = s + np.log(v)
    lse_rounding = gamma(v) + 2 * U + 2 * s * U + U * np.log(v) + U * lse_max
    row = 4 * gamma(d) * s + 2 * lse_rounding + 2 * U * (lse_max + s)
    return float(row + 2 * U * abs(loss))


def gradient_tolerance(m: riftco.DecoderOnlyTransformer) -> float:
    """A normwise bound, relative to a gradient's largest element, on how far the two paths'
    gradients may differ: each gradient is a chain of sums, the longest the head's (``V`` terms
    per hidden-state element), then per block the attention and MLP products (``d_model``,
    ``d_ff``, sequence length terms, forward and backward), then the weight gradients' sums
    over the tokens; each sum contributes γ_n of its terms' magnitudes, taken here at the
    gradient's scale (so cancellations inside a sum are assumed no worse than the sum of those
    magnitudes); the two paths' errors add."""
    c = m.config
    tokens = 3 * 11
    per_block = 2 * (gamma(c.d_model) + gamma(c.d_ff) + gamma(11)) * 2
    return 2 * (gamma(c.vocab_size) + c.n_layers * per_block + gamma(tokens))


@pytest.mark.parametrize("tied", [False, True])
@pytest.mark.parametrize("lora", [False, True])
def test_chunked_and_unfused_agree(tied: bool, lora: bool) -> None:
    """Chunks of 1 and 5 rows run the head's products with other row counts than the unfused
    path (whose product has all 33 rows): the loss is within :func:`loss_bound` and every
    gradient within :func:`gradient_tolerance`. One chunk of all the rows runs the same
    products as the unfused path: bitwise the same loss."""
    m = model(tied)
    if lora:
        m.enable_lora(rank=4, alpha=8.0)
    loss_ref, ref = gradients(m, None)
    bound = loss_bound(m, tied, loss_ref)
    tolerance = gradient_tolerance(m)
    assert bound < 1e-4 * abs(loss_ref), "the bound must still be able to fail"
    for chunk in (1, 4 * (VOCAB + 1) * 5, "64MiB"):
        loss, got = gradients(m, chunk)
        if chunk == "64MiB":
            assert loss == loss_ref, "one chunk of all rows: the unfused path's products"
        assert abs(loss - loss_ref) <= bound, f"chunk {chunk!r}: {loss} vs {loss_ref}, bound {bound}"
        assert got.keys() == ref.keys()
        for name, g in got.items():
            r = ref[name]
            assert g is not None and r is not None, name
            scale = float(np.abs(r).max())
            np.testing.assert_allclose(
                g, r, rtol=0, atol=tolerance * scale, err_msg=f"{name}, {chunk!r}"
            )


@pytest.mark.parametrize(
    "value", [0, -1, 1.5, 64.0, True, "1.5B", "0", "-3MiB", "lots", 2**64, [1]]
)
def test_bad_budgets_are_config_errors_naming_the_setting(value: Any) -> None:
    m = model()
    m.loss_chunk_bytes = "16MiB"
    with pytest.raises(riftco.ConfigError, match="loss_chunk_bytes"):
        m.loss_chunk_bytes = value
    assert m.loss_chunk_bytes == 16 * 2**20
    with pytest.raises(riftco.ConfigError, match="loss_chunk_bytes"):
        riftco.PretrainingConfig(loss_chunk_bytes=value)


def test_stage_configs_keep_plain_ints_and_none() -> None:
    assert riftco.PretrainingConfig().loss_chunk_bytes == riftco.DEFAULT_LOSS_CHUNK_BYTES
    assert riftco.PostTrainingConfig(loss_chunk_bytes="1KiB").loss_chunk_bytes == 1024
    assert riftco.PostTrainingConfig(loss_chunk_bytes=np.int64(7)).to_dict()["loss_chunk_bytes"] == 7
    assert riftco.PretrainingConfig(loss_chunk_bytes=None).loss_chunk_bytes is None


def test_the_cli_flag() -> None:
    parser = argparse.ArgumentParser()
    add_checkpointing_arguments(parser)
    assert parser.parse_args([]).loss_chunk_bytes == riftco.DEFAULT_LOSS_CHUNK_BYTES
    assert parser.parse_args(["--loss-chunk-bytes", "none"]).loss_chunk_bytes is None
    assert parser.parse_args(["--loss-chunk-bytes", "2MiB"]).loss_chunk_bytes == 2 * 2**20
    with pytest.raises(SystemExit):
        parser.parse_args(["--loss-chunk-bytes", "0"])
