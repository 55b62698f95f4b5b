"""The classic MLP's activation bytes (examples/checkpoint_mlp.py), exactly: riftco keeps two
``[batch, d]`` values per block in the plain graph (the ReLU output, which its VJP and the second
Linear's read, and the block output; the first Linear's output goes, as nothing at backward
reads it), and under ``checkpoint(block, x)`` one per block plus one block's replay. With
PyTorch installed (optional), the same chain's saved activations are compared: PyTorch saves
two per block too (each Linear's input; ReLU's output is the second Linear's input). A chain of
24 blocks under ``checkpoint_sequential(seq, 5, x)`` (the last 8 blocks plain, as PyTorch)
peaks at its plain tail when backward frees the graph as it goes (``retain_graph=False``),
not at the tail plus a replay."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest

import riftco
import riftco.functional as F
from riftco import nn

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "checkpoint_mlp.py"
D, BATCH, BLOCKS = 32, 8, 6
ROW = BATCH * D * 4  # bytes of one [batch, d] float32 value


def example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("checkpoint_mlp", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["checkpoint_mlp"] = module
    spec.loader.exec_module(module)
    return module


def peaks() -> tuple[int, int]:
    ex = example()
    riftco.manual_seed(0)
    x = np.random.default_rng(0).standard_normal((BATCH, D)).astype(np.float32)
    plain = ex.DeepMLP(D, BLOCKS, use_checkpoint=False)
    ckpt = ex.DeepMLP(D, BLOCKS, use_checkpoint=True)
    ckpt.blocks = plain.blocks  # the same parameters
    params = list(plain.parameters())
    p_plain, _, g_plain = ex.measure(plain, x, params)
    p_ckpt, _, g_ckpt = ex.measure(ckpt, x, params)
    assert ex.same_bits(g_plain, g_ckpt)
    return p_plain, p_ckpt


def test_riftco_keeps_two_values_per_block_plain_and_one_checkpointed() -> None:
    p_plain, p_ckpt = peaks()
    # Two per block, and in the last block the first Linear's output in flight before ReLU.
    assert p_plain == (2 * BLOCKS + 1) * ROW, p_plain / ROW
    # Kept block outputs (one per block), one block's replay (its ReLU output, the first
    # Linear's output in flight, its output) and the scalar loss.
    assert p_ckpt == (BLOCKS + 3) * ROW + 4, p_ckpt / ROW
    assert p_ckpt < p_plain


def test_checkpoint_sequential_freeing_backward_peaks_at_the_plain_tail() -> None:
    ex = example()
    n, segments = 24, 5
    riftco.manual_seed(0)
    seq = nn.Sequential(*[ex.Block(D) for _ in range(n)])
    params = list(seq.parameters())
    x = np.random.default_rng(0).standard_normal((BATCH, D)).astype(np.float32)

    def run(forward: Callable[[riftco.Variable], riftco.Variable], retain: bool) -> tuple[
        int, list[np.ndarray[Any, Any]]
    ]:
        for p in params:
            p.zero_grad()
        before = riftco.memory_stats()["activation"]["current_bytes"]
        riftco.reset_peak_memory_stats()
        out = forward(riftco.Variable(x, requires_grad=True))
        F.sum(out).backward(retain_graph=retain)
        del out
        peak = riftco.memory_stats()["activation"]["peak_bytes"] - before
        grads = [p.grad for p in params]
        assert all(g is not None for g in grads)
        return int(peak), [np.array(g) for g in grads]

    def seq_ckpt(h: riftco.Variable) -> riftco.Variable:
        return riftco.checkpoint_sequential(seq, segments, h)

    plain, g_plain = run(seq, True)
    kept, g_kept = run(seq_ckpt, True)
    freed, g_freed = run(seq_ckpt, False)
    for a, b, c in zip(g_plain, g_kept, g_freed):
        assert np.array_equal(a, b) and np.array_equal(a, c)
    tail = n - (segments - 1) * (n // segments)  # 8 plain blocks
    assert plain == (2 * n + 1) * ROW, plain / ROW
    # Retained graph: 4 segment outputs and the tail (2 per block), and a segment's replay (4
    # blocks: 2 each and one product in flight) on top; the scalar loss.
    assert kept == (segments - 1 + 2 * tail + 2 * (n // segments) + 1) * ROW + 4, kept / ROW
    # Freed as it goes: by the replays the tail is gone, so the forward's tail is the peak.
    assert freed == (segments - 1 + 2 * tail + 1) * ROW, freed / ROW
    assert freed / plain < 0.45 and freed < kept


def test_pytorch_saves_two_values_per_block_where_installed() -> None:
    pytest.importorskip(
        "torch", reason="PyTorch is optional and not installed: its saved bytes are not compared"
    )
    ex = example()
    saved = ex.torch_saved_mib(D, BATCH, BLOCKS, None) * ex.MIB
    assert saved == 2 * BLOCKS * ROW
    p_plain, _ = peaks()
    # The same two values per block, and one in flight.
    assert p_plain == saved + ROW, p_plain / saved
