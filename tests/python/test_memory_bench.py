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


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="VmHWM is Linux only")
def test_resident_bench_runs_riftco_in_a_child(tmp_path: Path) -> None:
    """benches/resident_real_models.py on a tiny shape, riftco only: the child loads the folder
    as bfloat16, trains a LoRA step and reports its own peak above an import-only child."""
    out = tmp_path / "resident.json"
    r = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benches" / "resident_real_models.py"),
            "--model", "quick", "--batch", "2", "--seq", "32", "--no-torch", "--out", str(out),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
    )
    assert r.returncode == 0, r.stderr
    (row,) = json.loads(out.read_text())["rows"]
    assert row["side"] == "riftco"
    assert row["peak_resident_mib"] > row["import_only_mib"] > 0
    assert abs(row["loss"] - 8.318) < 0.5  # ln(4096): random weights, random tokens
