"""benches/memory_real_models.py in its quick configuration (riftco rows only): every row is
measured and written, the chunked loss gives the unfused loss and a smaller peak, and the
picture is drawn from the results file."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "benches" / "memory_real_models.py"


def test_quick_memory_bench_measures_every_row(tmp_path: Path) -> None:
    out = tmp_path / "quick.json"
    r = subprocess.run(
        [sys.executable, str(BENCH), "--quick", "--no-torch", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
    )
    assert r.returncode == 0, r.stderr
    rows = {row["row"]: row for row in json.loads(out.read_text())["rows"]}
    assert sorted(rows) == sorted(
        f"riftco {p} {h}"
        for p in ("disabled", "block")
        for h in ("unfused", "chunked", "chunked bf16")
    )
    for policy in ("disabled", "block"):
        chunked, unfused = rows[f"riftco {policy} chunked"], rows[f"riftco {policy} unfused"]
        assert chunked["loss"] == unfused["loss"]
        assert chunked["peak_bytes"]["total"] < unfused["peak_bytes"]["total"], policy
        assert chunked["peak_bytes"]["parameter"] == unfused["peak_bytes"]["parameter"]
        bf16 = rows[f"riftco {policy} chunked bf16"]
        assert bf16["peak_bytes"]["parameter"] < chunked["peak_bytes"]["parameter"]
        assert abs(bf16["loss"] - chunked["loss"]) < 1e-2  # the rounded base
    if importlib.util.find_spec("matplotlib") is None:
        pytest.skip("matplotlib not installed: the picture is not drawn")
    r = subprocess.run(
        [sys.executable, str(BENCH), "--plot", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert r.returncode == 0, r.stderr
    assert out.with_suffix(".png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_quick_full_training_rows_run_one_at_a_time(tmp_path: Path) -> None:
    out = tmp_path / "full.json"
    r = subprocess.run(
        [sys.executable, str(BENCH), "--quick", "--no-torch", "--full", "--sequential",
         "--heads", "chunked,chunked bf16", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
    )
    assert r.returncode == 0, r.stderr
    data = json.loads(out.read_text())
    assert data["full"] is True and data["sequential"] is True
    # A 16-bit base is frozen: full training has no bf16 rows.
    assert sorted(row["row"] for row in data["rows"]) == ["riftco block chunked", "riftco disabled chunked"]
    for row in data["rows"]:
        # Every weight trains: gradients and Adam moments of the whole model.
        assert row["peak_bytes"]["optimizer_state"] >= row["peak_bytes"]["parameter"]
