"""benches/qlora_real_models.py in small configurations: the quantized rows are measured and
written with their categories, hold fewer parameter bytes than the bfloat16 row, and their
breakdown at the total peak sums to that peak; the real SmolLM2 GGUF row where it is cached; the
PyTorch peers where torch, transformers and peft are installed."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from real_models import SMOLLM2, SMOLLM2_MISSING

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "benches" / "qlora_real_models.py"
CATEGORIES = ("parameter", "gradient", "optimizer_state", "activation", "workspace")


def run_bench(tmp_path: Path, *args: str) -> dict[str, Any]:
    out = tmp_path / "qlora.json"
    r = subprocess.run(
        [sys.executable, str(BENCH), *args, "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
    )
    assert r.returncode == 0, r.stderr
    data: dict[str, Any] = json.loads(out.read_text())
    return data


def check_riftco_row(row: dict[str, Any]) -> None:
    peak, at = row["peak_bytes"], row["at_total_peak_bytes"]
    # The categories at the moment of the total peak make up that peak exactly.
    assert sum(at[c] for c in CATEGORIES) == peak["total"], row["row"]
    assert all(peak[c] <= peak["total"] for c in CATEGORIES), row["row"]
    assert len(row["step_times_s"]) == 2 and row["step_s"] > 0


def test_quick_qlora_bench_measures_the_quantized_and_bf16_rows(tmp_path: Path) -> None:
    data = run_bench(tmp_path, "--quick", "--no-torch", "--quant", "nf4")
    assert data["skipped"] == {}
    rows = {row["row"]: row for row in data["rows"]}
    assert sorted(rows) == ["riftco bf16", "riftco nf4"]
    nf4, bf16 = rows["riftco nf4"], rows["riftco bf16"]
    assert nf4["frozen_weights_dtype"] == "nf4" and bf16["frozen_weights_dtype"] == "bfloat16"
    for row in (nf4, bf16):
        check_riftco_row(row)
    # NF4 holds 4.13 bits per weight (4-bit codes, an 8-bit absmax per 64 weights, an f32 per
    # 256 absmax) against 16; the float32 LoRA adapters (9 % of the bf16 row's bytes at this
    # shape) are the same in both rows.
    assert nf4["peak_bytes"]["parameter"] < 0.45 * bf16["peak_bytes"]["parameter"]
    assert nf4["peak_bytes"]["total"] < bf16["peak_bytes"]["total"]
    # Random weights and tokens: both losses near ln(4096) = 8.318; NF4's rounding moves it a little.
    assert abs(nf4["loss"] - bf16["loss"]) < 0.05
    assert abs(bf16["loss"] - 8.318) < 0.1


@pytest.mark.skipif(not SMOLLM2.is_file(), reason=SMOLLM2_MISSING)
def test_gguf_row_keeps_the_real_model_quantized(tmp_path: Path) -> None:
    data = run_bench(
        tmp_path, "--model", "smollm2", "--gguf", str(SMOLLM2), "--batch", "1", "--seq", "16",
        "--steps", "2", "--no-torch", "--quant", "",
    )
    assert data["tokens"].startswith("docs/*.md")
    rows = {row["row"]: row for row in data["rows"]}
    assert sorted(rows) == ["riftco bf16", "riftco gguf"]
    gguf, bf16 = rows["riftco gguf"], rows["riftco bf16"]
    assert gguf["frozen_weights_dtype"] == "q4_1"  # the format holding the most weights
    for row in (gguf, bf16):
        check_riftco_row(row)
    # Q4_1 / Q8_0 blocks as stored (92 MiB) against 134.5 M weights in bfloat16 (257 MiB).
    assert gguf["peak_bytes"]["parameter"] < 0.4 * bf16["peak_bytes"]["parameter"]
    # Real text under the trained model: far below the uniform ln(49152) = 10.8.
    assert gguf["loss"] < 6.0 and bf16["loss"] < 6.0


@pytest.mark.skipif(
    any(importlib.util.find_spec(m) is None for m in ("torch", "transformers", "peft")),
    reason="torch, transformers or peft not installed: the PyTorch peers are not run",
)
def test_quick_qlora_bench_measures_the_pytorch_peers(tmp_path: Path) -> None:
    data = run_bench(tmp_path, "--quick", "--quant", "", "--no-bf16", "--peer-steps", "1")
    rows = {row["row"]: row for row in data["rows"]}
    f32 = rows["PyTorch + PEFT + GC"]
    for row in rows.values():
        peak = row["peak_bytes"]
        assert peak["total"] == peak["parameter"] + peak["optimizer_state"] + peak["step_above_alive"]
        # The step's logits (2 x 32 x 4096 float32, 1 MiB) and their gradient are alive together.
        assert peak["step_above_alive"] >= 2 * 2**20
    if "PyTorch + PEFT + bnb NF4 + GC" in rows:
        bnb = rows["PyTorch + PEFT + bnb NF4 + GC"]
        assert bnb["peak_bytes"]["parameter"] < f32["peak_bytes"]["parameter"]
