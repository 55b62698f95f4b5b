"""Tokenized examples (``riftco.ExampleCorpus``) and their padded batches: whole examples,
right-padded with label -100, each epoch in a seeded order; a padded example's loss is its loss
alone; post-training on examples trains only the labelled targets and resumes exactly."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import riftco

RNG = np.random.default_rng(0)


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


def test_batches_hold_whole_examples_padded_with_ignored_labels() -> None:
    corpus = riftco.examples_from_pairs(_pairs(5), "five")
    sampler = riftco.ExampleBatchSampler(corpus, batch_size=2, seq_len=15, seed=3, pad_id=7)
    seen = []
    for _ in range(5):  # two epochs: every example once per epoch
        tokens, labels = sampler.next_batch()
        assert tokens.shape == labels.shape == (2, 16)
        for row in range(2):
            matches = [
                i for i, (ids, lab) in enumerate(zip(corpus.input_ids, corpus.labels, strict=True))
                if np.array_equal(tokens[row, : ids.shape[0]], ids)
                and np.array_equal(labels[row, : ids.shape[0]], lab)
                and (tokens[row, ids.shape[0]:] == 7).all()
                and (labels[row, ids.shape[0]:] == -100).all()
            ]
            assert matches, (tokens[row], labels[row])
            seen.append(matches[0])
    assert sorted(seen[:5]) == [0, 1, 2, 3, 4] and sorted(seen[5:10]) == [0, 1, 2, 3, 4]


def test_the_sampler_state_continues_with_the_same_batches() -> None:
    corpus = riftco.examples_from_pairs(_pairs(7), "seven")
    a = riftco.ExampleBatchSampler(corpus, 3, 15, seed=1)
    for _ in range(4):
        a.next_batch()
    state = a.get_state()
    expected = [a.next_batch() for _ in range(5)]
    b = riftco.ExampleBatchSampler(corpus, 3, 15, seed=1)
    b.set_state(state)
    for want in expected:
        got = b.next_batch()
        assert np.array_equal(got[0], want[0]) and np.array_equal(got[1], want[1])


def test_a_padded_example_has_the_loss_it_has_alone() -> None:
    model = riftco.DecoderOnlyTransformer(riftco.TransformerConfig(
        vocab_size=64, d_model=32, n_heads=2, n_layers=2, d_ff=48, max_seq_len=32, seed=2))
    ids, labels = _pairs(1, seed=4)[0]
    alone = model.loss(ids[None, :], labels=labels[None, :]).item()
    corpus = riftco.examples_from_pairs([(ids, labels)] * 2, "one")
    tokens, padded = riftco.ExampleBatchSampler(corpus, 1, 20, seed=0).next_batch()
    assert tokens.shape[1] > ids.shape[0]  # really padded
    assert model.loss(tokens, labels=padded).item() == pytest.approx(alone, rel=1e-6)


@pytest.mark.parametrize(
    ("pairs", "message"),
    [
        ([], "no examples"),
        ([([1], [1])], "at least 2"),
        ([([1, 2, 3], [-100, -100, -100])], "no target token"),
        ([([1, 2, 3], [1, 2])], "of one length"),
    ],
)
def test_bad_examples_are_corpus_errors(pairs: Any, message: str) -> None:
    with pytest.raises(riftco.CorpusError, match=message):
        riftco.examples_from_pairs(pairs, "bad")


def test_an_example_longer_than_the_sequence_is_named() -> None:
    corpus = riftco.examples_from_pairs(_pairs(3) + [(np.arange(40), np.arange(40))], "long")
    with pytest.raises(riftco.CorpusError, match=r"example 3: 40; the longest: 40"):
        riftco.ExampleBatchSampler(corpus, 2, 15, seed=0)


@pytest.mark.parametrize("packing", [False, True])
def test_post_training_on_examples_trains_the_targets_and_resumes_exactly(
    tmp_path: Path, packing: bool
) -> None:
    base = tmp_path / "base"
    riftco.run_pretraining(
        riftco.TransformerConfig(vocab_size=256, d_model=32, n_heads=2, n_layers=2, d_ff=64,
                                 max_seq_len=32),
        riftco.PretrainingConfig(steps=2, batch_size=2, seq_len=16),
        riftco.default_corpus(max_bytes=1 << 16), base, progress=False, plots=False)
    corpus = riftco.examples_from_pairs(_pairs(30), "thirty")
    cfg = riftco.PostTrainingConfig(steps=8, batch_size=4, seq_len=16, save_every=4,
                                    eval_every=4, keep_checkpoints=5, packing=packing)
    first = riftco.run_post_training(base, cfg, corpus, tmp_path / "run", progress=False,
                                     plots=False)
    assert first["corpus"]["examples"] == 30 and first["corpus"]["validation_examples"] >= 1
    assert first["corpus"]["target_tokens"] == corpus.n_target_tokens
    shutil.rmtree(tmp_path / "run" / "checkpoints" / "step-00000008")
    again = riftco.run_post_training(base, cfg, corpus, tmp_path / "run", progress=False,
                                     plots=False, resume=True)
    assert again["losses"] == first["losses"]
    assert again["validation_losses"] == first["validation_losses"]
    assert all(np.isfinite(first["losses"]))
