"""The classic MLP's activation bytes (examples/checkpoint_mlp.py), exactly: riftco keeps three
``[batch, d]`` values per block in the plain graph (the first Linear's output with its bias, the
ReLU output, the block output), and under ``checkpoint(block, x)`` one per block plus one
block's replay. With PyTorch installed (optional), the same chain's saved activations are
compared: PyTorch saves two per block (each Linear's input; ReLU's output is the second
Linear's input), so riftco's plain graph is 1.5x PyTorch's saved bytes — the number the README
reports."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

import riftco

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


def test_riftco_keeps_three_values_per_block_plain_and_one_checkpointed() -> None:
    p_plain, p_ckpt = peaks()
    # Retained: 3 per block; the backward adds at most a few [batch, d] transients.
    assert 3 * BLOCKS * ROW <= p_plain <= (3 * BLOCKS + 2) * ROW, p_plain / ROW
    # Kept block outputs (one per block) plus one block's replay (3) and transients.
    assert BLOCKS * ROW <= p_ckpt <= (BLOCKS + 3 + 2) * ROW, p_ckpt / ROW
    assert p_ckpt < p_plain


def test_pytorch_saves_two_values_per_block_where_installed() -> None:
    pytest.importorskip(
        "torch", reason="PyTorch is optional and not installed: its saved bytes are not compared"
    )
    ex = example()
    saved = ex.torch_saved_mib(D, BATCH, BLOCKS, None) * ex.MIB
    assert saved == 2 * BLOCKS * ROW
    p_plain, _ = peaks()
    assert 1.5 <= p_plain / saved <= 1.5 + 2 / (2 * BLOCKS), p_plain / saved
