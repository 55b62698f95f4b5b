"""Packed batches: ``loss(tokens, labels=..., position_ids=...)`` equals the examples run alone
(loss and gradients, the mean weighted by targets per example), bad ``position_ids`` are
``TokenError``s naming the value, and the packing sampler fills rows first fit, deterministically
and resumably."""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

import riftco

CONFIG: dict[str, Any] = dict(vocab_size=64, d_model=32, n_heads=4, n_kv_heads=2, n_layers=2, d_ff=48,
              max_seq_len=32, seed=5)


def _pairs(n: int, seed: int = 0) -> list[tuple[Any, Any]]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        n_prompt, n_answer = int(rng.integers(2, 8)), int(rng.integers(2, 6))
        ids = rng.integers(0, 64, n_prompt + n_answer)
        labels = ids.copy()
        labels[:n_prompt] = -100
        out.append((ids, labels))
    return out


def _grads(model: riftco.DecoderOnlyTransformer) -> list[npt.NDArray[np.float64]]:
    return [np.array(p.grad, np.float64) for p in model.parameters()]


@pytest.mark.parametrize("attention", ["flash", "materialized"])
@pytest.mark.parametrize("policy", ["disabled", "block", "selective"])
def test_a_packed_batch_equals_its_examples_alone(attention: str, policy: str) -> None:
    model = riftco.DecoderOnlyTransformer(
        riftco.TransformerConfig(**CONFIG), attention=attention, activation_checkpointing=policy
    )
    corpus = riftco.examples_from_pairs(_pairs(9), "nine")
    sampler = riftco.ExampleBatchSampler(corpus, 2, 24, seed=1, packing=True)
    tokens, labels, positions = sampler.next_packed_batch()
    loss = model.loss(tokens, labels=labels, position_ids=positions)
    loss.backward()
    got_loss, got = float(loss.item()), _grads(model)
    # Each example alone, weighted by its share of the batch's targets.
    examples = []
    for row in range(tokens.shape[0]):
        starts = list(np.flatnonzero(positions[row] == 0)) + [tokens.shape[1]]
        for a, b in zip(starts[:-1], starts[1:], strict=True):
            n_targets = int(np.sum(labels[row, a + 1 : b] != -100))
            if n_targets:
                examples.append((tokens[row, a:b], labels[row, a:b], n_targets))
    assert len(examples) > tokens.shape[0]  # packed: more examples than rows
    total = sum(n for *_, n in examples)
    want_loss, want = 0.0, [np.zeros_like(g) for g in got]
    for ids, lab, n in examples:
        alone = model.loss(ids[None, :], labels=lab[None, :])
        alone.backward()
        want_loss += n / total * float(alone.item())
        for w, g in zip(want, _grads(model), strict=True):
            w += n / total * g
    assert abs(got_loss - want_loss) <= 2e-6 * abs(want_loss)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=0, atol=2e-5 * np.abs(w).max())


def test_packed_logits_of_an_example_ignore_its_row_neighbour() -> None:
    model = riftco.DecoderOnlyTransformer(riftco.TransformerConfig(**CONFIG))
    tokens = np.random.default_rng(0).integers(0, 64, (1, 12))
    positions = np.array([[0, 1, 2, 3, 4, 0, 1, 2, 3, 4, 5, 6]])
    before = np.array(model.logits(tokens, position_ids=positions))
    tokens[0, :5] = (tokens[0, :5] + 9) % 64
    after = np.array(model.logits(tokens, position_ids=positions))
    assert not np.array_equal(before[:5], after[:5])
    np.testing.assert_array_equal(before[5:], after[5:])
    alone = np.array(model.logits(tokens[:, 5:]))
    np.testing.assert_allclose(after[5:], alone, rtol=0, atol=1e-5 * np.abs(alone).max())


@pytest.mark.parametrize(
    ("positions", "message"),
    [
        (np.array([[0, 1, 2, 4]]), "position_ids[0, 3] is 4"),
        (np.array([[1, 2, 3, 4]]), "position_ids[0, 0] is 1"),
        (np.array([[0, 1, -1, 0]]), "position_ids[0, 2] is -1"),
        (np.array([[0, 1, 2]]), "position_ids must have the shape of tokens"),
        (np.array([[0.0, 1.0, 2.0, 3.0]]), "position_ids must hold integer positions"),
    ],
)
def test_bad_position_ids_are_token_errors(positions: Any, message: str) -> None:
    model = riftco.DecoderOnlyTransformer(riftco.TransformerConfig(**CONFIG))
    tokens = np.array([[1, 2, 3, 4]])
    pattern = message.replace("[", r"\[")
    with pytest.raises(riftco.TokenError, match=pattern):
        model.loss(tokens, position_ids=positions)
    with pytest.raises(riftco.TokenError, match=pattern):
        model.logits(tokens, position_ids=positions)


def test_the_packing_sampler_fills_rows_first_fit_and_resumes() -> None:
    corpus = riftco.examples_from_pairs(_pairs(20, seed=2), "twenty")
    a = riftco.ExampleBatchSampler(corpus, 3, 23, seed=4, pad_id=7, packing=True)
    seen = []
    for _ in range(2):
        tokens, labels, positions = a.next_packed_batch()
        assert tokens.shape == labels.shape == positions.shape == (3, 24)
        for row in range(3):
            starts = list(np.flatnonzero(positions[row] == 0)) + [24]
            for s, e in zip(starts[:-1], starts[1:], strict=True):
                np.testing.assert_array_equal(positions[row, s:e], np.arange(e - s))
                span = tokens[row, s:e]
                match = [i for i, x in enumerate(corpus.input_ids) if np.array_equal(x, span)]
                if match:
                    seen.append(match[0])
                    np.testing.assert_array_equal(labels[row, s:e], corpus.labels[match[0]])
                else:  # the padding at the end of a row
                    assert e == 24 and np.all(span == 7) and np.all(labels[row, s:e] == -100)
    # The first epoch's examples, each once, in far fewer rows than examples.
    assert len(seen) == len(set(seen)) and len(seen) > 6
    state = a.get_state()
    b = riftco.ExampleBatchSampler(corpus, 3, 23, seed=4, pad_id=7, packing=True)
    b.set_state(state)
    for x, y in zip(a.next_batch(), b.next_batch(), strict=True):
        np.testing.assert_array_equal(x, y)


def test_post_training_config_checks_packing() -> None:
    with pytest.raises(riftco.ConfigError, match="packing must be a bool"):
        riftco.PostTrainingConfig(packing="yes")  # type: ignore[arg-type]
    assert riftco.PostTrainingConfig(packing=True).packing is True


def test_packing_a_text_corpus_is_a_config_error(tmp_path: Any) -> None:
    with pytest.raises(riftco.ConfigError, match="packing = True needs a riftco.ExampleCorpus"):
        riftco.run_post_training(
            riftco.DecoderOnlyTransformer(riftco.TransformerConfig(
                vocab_size=256, d_model=32, n_heads=2, n_layers=1, d_ff=48, max_seq_len=16)),
            riftco.PostTrainingConfig(steps=1, batch_size=2, seq_len=8, packing=True),
            riftco.default_corpus(max_bytes=1 << 14), tmp_path / "run", progress=False,
            plots=False,
        )
