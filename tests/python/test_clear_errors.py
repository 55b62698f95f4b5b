"""Defects found by trying riftco as a careless user would, each now a clear error or a correct
result: merging inactive adapters, thread counts above the core count, messages that
contradicted themselves, a validation fraction so small that the corpus check never ended."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

import riftco
from riftco import functional as F

TINY = riftco.TransformerConfig(
    vocab_size=64, d_model=16, n_heads=2, n_layers=1, d_ff=32, max_seq_len=16
)


def test_merge_lora_while_inactive_is_refused_and_keeps_the_adapters() -> None:
    model = riftco.DecoderOnlyTransformer(TINY)
    tokens = np.arange(9, dtype=np.int64).reshape(1, 9) % 64
    base = model.loss(tokens).item()
    model.enable_lora(rank=2, seed=1)
    opt = riftco.Adam(model.parameters(), lr=0.05)
    for _ in range(3):  # B leaves zero: the adapters now change the output
        model.loss(tokens).backward()
        opt.step()
        opt.zero_grad()
    with_adapters = model.loss(tokens).item()
    assert with_adapters != base
    model.set_lora_active(False)
    with pytest.raises(riftco.LoraError, match="inactive.*set_lora_active"):
        model.merge_lora()
    assert model.has_lora and not model.lora_active  # nothing dropped
    model.set_lora_active(True)
    model.merge_lora()
    assert not model.has_lora
    assert model.loss(tokens).item() == pytest.approx(with_adapters, rel=1e-5)


def _threads(value: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", "import riftco; print(riftco.num_threads())"],
        capture_output=True, text=True, timeout=120,
        env={**os.environ, "RIFTCO_NUM_THREADS": value},
    )


def test_a_thread_count_above_the_cores_is_honoured() -> None:
    cores = os.cpu_count() or 1
    r = _threads(str(cores + 3))
    assert r.returncode == 0 and int(r.stdout) == cores + 3, r
    assert "warning" not in r.stderr


@pytest.mark.parametrize(
    ("value", "expected"),
    [("100000", "above the limit"), ("0", "not a positive integer"),
     ("abc", "not a positive integer")],
)
def test_an_unusable_thread_count_says_what_is_used(value: str, expected: str) -> None:
    r = _threads(value)
    assert r.returncode == 0, r.stderr
    used = int(r.stdout)
    assert used >= 1
    assert f"riftco: warning: RIFTCO_NUM_THREADS={value}" in r.stderr or (
        f'RIFTCO_NUM_THREADS="{value}"' in r.stderr
    ), r.stderr
    assert expected in r.stderr and f"{used}" in r.stderr


def test_empty_rms_norm_and_cross_entropy_say_what_is_empty() -> None:
    empty = riftco.Variable(np.zeros((0,), np.float32))
    with pytest.raises(riftco.ShapeError) as e:
        F.rms_norm(riftco.Variable(np.zeros((3, 0), np.float32)), empty)
    assert "zero-sized" in str(e.value) and "expected [0], got [0]" not in str(e.value)
    with pytest.raises(riftco.ShapeError) as e:
        F.cross_entropy(riftco.Variable(np.zeros((0, 4), np.float32)), np.zeros(0, np.int64))
    assert "no rows" in str(e.value) and "expected [0, 4], got [0, 4]" not in str(e.value)


def test_a_tiny_validation_fraction_is_a_prompt_clear_error() -> None:
    corpus = riftco.Corpus(np.frombuffer(b"x" * 1000, dtype=np.uint8).copy(), "t")
    # Before: the search for the smallest corpus that fits ran ~1.5e9 iterations.
    with pytest.raises(riftco.CorpusError) as e:
        riftco.check_corpus_fits(corpus, 16, 1e-9)
    message = str(e.value)
    assert "1 held out for validation (the last 1e-09)" in message
    assert "a validation fraction of at least 0.0015" in message
