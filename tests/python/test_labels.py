"""``model.loss(tokens, labels=...)``: targets from labels, ``-100`` (``riftco.IGNORE_INDEX``)
positions ignored, the mean over the others (PyTorch's ``ignore_index``, Hugging Face's label
convention), checked against a reference built from the logits and against the unmasked loss."""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

import riftco
from riftco import functional as F

CONFIG = dict(vocab_size=50, d_model=32, n_heads=4, n_kv_heads=2, n_layers=2, d_ff=48,
              max_seq_len=16, seed=3)
BATCH, SEQ = 3, 10
RNG = np.random.default_rng(0)
TOKENS = RNG.integers(0, 50, size=(BATCH, SEQ + 1))
# A prompt/answer layout: the first positions of each row are ignored, as in instruction tuning.
LABELS = TOKENS.copy()
LABELS[0, :6] = -100
LABELS[1, :3] = -100
LABELS[2, :9] = -100
LABELS[1, 7] = -100  # a hole inside the answer too


def _model(**kw: Any) -> riftco.DecoderOnlyTransformer:
    settings: dict[str, Any] = dict(CONFIG)
    settings.update(kw.pop("config", {}))
    return riftco.DecoderOnlyTransformer(riftco.TransformerConfig(**settings), **kw)


def _grads(model: riftco.DecoderOnlyTransformer) -> dict[str, npt.NDArray[np.float32]]:
    out = {}
    for name, p in model.named_parameters():
        g = p.grad
        out[name] = np.zeros(p.shape, np.float32) if g is None else np.array(g)
    return out


def _reference(model: riftco.DecoderOnlyTransformer) -> riftco.Variable:
    """The loss over the targeted positions only, built from the model's logits: the logit
    rows of the targeted positions (gathered with ``F.embedding``) and their labels."""
    logits = model.logits(TOKENS[:, :-1])  # [batch * seq, vocab]
    rows, targets = [], []
    for b in range(BATCH):
        for t in range(SEQ):
            if LABELS[b, t + 1] != -100:
                rows.append(b * SEQ + t)
                targets.append(LABELS[b, t + 1])
    return F.cross_entropy(F.embedding(logits, np.array(rows)), np.array(targets))


def test_ignore_index_is_minus_100() -> None:
    assert riftco.IGNORE_INDEX == -100


@pytest.mark.parametrize("chunk", [None, 2048], ids=["whole-logits", "chunked"])
def test_masked_loss_and_gradients_equal_a_loss_over_the_targeted_positions_only(
    chunk: int | None,
) -> None:
    model = _model()
    model.loss_chunk_bytes = chunk
    loss = model.loss(TOKENS, labels=LABELS)
    loss.backward()
    got_loss, got = loss.item(), _grads(model)
    for p in model.parameters():
        p.zero_grad()
    ref = _reference(model)
    ref.backward()
    assert got_loss == pytest.approx(ref.item(), rel=1e-6)
    for name, g in _grads(model).items():
        np.testing.assert_allclose(got[name], g, rtol=2e-5, atol=2e-7, err_msg=name)


def test_masked_loss_equals_numpy_per_token_cross_entropy() -> None:
    model = _model()
    logits = model.logits(TOKENS[:, :-1]).numpy().astype(np.float64).reshape(BATCH, SEQ, -1)
    lse = np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1)) + logits.max(-1)
    targets = LABELS[:, 1:]
    keep = targets != -100
    per_token = lse - np.take_along_axis(logits, np.where(keep, targets, 0)[..., None], -1)[..., 0]
    expected = per_token[keep].mean()
    assert model.loss(TOKENS, labels=LABELS).item() == pytest.approx(expected, rel=1e-5)


def test_labels_equal_to_the_tokens_give_the_plain_loss_bitwise() -> None:
    model = _model()
    plain = model.loss(TOKENS)
    plain.backward()
    g_plain = _grads(model)
    for p in model.parameters():
        p.zero_grad()
    labelled = model.loss(TOKENS, labels=TOKENS)
    labelled.backward()
    assert labelled.item() == plain.item()
    for name, g in _grads(model).items():
        np.testing.assert_array_equal(g, g_plain[name], err_msg=name)


def test_a_row_with_every_target_ignored_contributes_nothing() -> None:
    # The batch with row 2 fully ignored against the batch of rows 0 and 1 alone: rows do not
    # attend to each other, so only the ignored row's targets could differ, and they must not
    # count (within f32 rounding: the products run over other row counts).
    labels = LABELS.copy()
    labels[2, :] = -100
    model = _model()
    a = model.loss(TOKENS, labels=labels)
    a.backward()
    ga = _grads(model)
    for p in model.parameters():
        p.zero_grad()
    b = model.loss(TOKENS[:2], labels=labels[:2])
    b.backward()
    assert a.item() == pytest.approx(b.item(), rel=1e-6)
    for name, g in _grads(model).items():
        np.testing.assert_allclose(g, ga[name], rtol=2e-5, atol=2e-7, err_msg=name)


@pytest.mark.parametrize("policy", ["block", "selective", "segments:2", "block,disabled"])
def test_every_policy_gives_the_masked_loss_of_disabled_bitwise_with_dropout_and_lora(
    policy: str,
) -> None:
    results = []
    for pol in ("disabled", policy):
        model = _model(activation_checkpointing=pol,
                       config=dict(attention_dropout=0.1, residual_dropout=0.1))
        model.enable_lora(rank=4, seed=1, dropout=0.1)
        model.train()
        loss = model.loss(TOKENS, labels=LABELS)
        loss.backward()
        results.append((loss.item(), _grads(model)))
    (la, ga), (lb, gb) = results
    assert la == lb
    for name in ga:
        np.testing.assert_array_equal(ga[name], gb[name], err_msg=name)


def test_tied_embeddings_receive_the_masked_gradient() -> None:
    model = _model(config=dict(tie_word_embeddings=True))
    loss = model.loss(TOKENS, labels=LABELS)
    loss.backward()
    got = _grads(model)
    for p in model.parameters():
        p.zero_grad()
    _reference(model).backward()
    ref = _grads(model)
    assert len(got) == len(ref)
    for name in got:
        np.testing.assert_allclose(got[name], ref[name], rtol=2e-5, atol=2e-7, err_msg=name)


@pytest.mark.parametrize(
    ("labels", "message"),
    [
        (np.full((BATCH, SEQ + 1), -100), "every target position"),
        (np.where(np.arange(SEQ + 1) == 0, TOKENS, -100), "every target position"),
        (np.where(TOKENS == TOKENS[1, 4], 50, TOKENS), "label 50 at index"),
        (np.full((BATCH, SEQ + 1), -1), "label -1 at index [0, 0]"),
        (TOKENS[:, :-1], "labels must have the shape of tokens"),
        (TOKENS.astype(np.float32), "integer"),
    ],
    ids=["all-ignored", "only-column-0", "out-of-vocab", "negative", "shape", "dtype"],
)
def test_bad_labels_are_token_errors(labels: Any, message: str) -> None:
    with pytest.raises(riftco.TokenError, match=message.replace("[", r"\[")):
        _model().loss(TOKENS, labels=labels)
