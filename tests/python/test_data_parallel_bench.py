"""benches/data_parallel.py in its quick configuration (N=1 and N=2 jobs under the venv's
mpiexec) and benches/scaling_model.py on its output: the table rows, the bytes per step and
the parameter counts from the shapes."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "benches" / "data_parallel.py"
SCALING = ROOT / "benches" / "scaling_model.py"


def test_quick_data_parallel_bench_and_scaling_model(tmp_path: Path) -> None:
    r = subprocess.run(
        [sys.executable, str(BENCH), "--quick", "--steps", "3", "--warmup", "1",
         "--repeats", "1", "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=600, cwd=ROOT,
    )
    assert r.returncode == 0, r.stderr
    if importlib.util.find_spec("mpi4py") is None:
        assert r.stdout.startswith("skipped: mpi4py is not installed"), r.stdout
        pytest.skip("mpi4py is not installed: the bench skips, as checked")
    if r.stdout.startswith("skipped:"):
        pytest.skip(r.stdout.strip())
    result = json.loads((tmp_path / "data_parallel_quick.json").read_text())
    keys = [(row["stage"], row["n"], row["zero"]) for row in result["rows"]]
    assert keys == [(s, n, z) for s in ("pretraining", "lora")
                    for n, z in ((1, 0), (2, 0), (2, 1), (2, 2))]
    for row in result["rows"]:
        assert row["step_s"] > 0 and row["num_threads"] == 1
        if row["n"] == 1:
            assert row["bytes_per_step"] == 0 and row["communication_share"] == 0
        else:
            padded = row["bytes_per_step"] / {0: 1.0, 1: 1.5, 2: 1.0}[row["zero"]]
            assert padded >= 4 * result["trainable_elements"][row["stage"]]
    md = (tmp_path / "data_parallel_quick.md").read_text()
    assert md.count("| pretraining |") == 4 and md.count("| lora |") == 4

    out = tmp_path / "scaling.md"
    s = subprocess.run(
        [sys.executable, str(SCALING), "--measured", str(tmp_path / "data_parallel_quick.json"),
         "--out", str(out)],
        capture_output=True, text=True, timeout=120, cwd=ROOT,
    )
    assert s.returncode == 0, s.stderr
    text = out.read_text()
    # Llama-3.2-1B: 1.236 B parameters with tied embeddings; LoRA r=8 on all 7 projections.
    assert "1,235,814,400 parameters" in text
    assert "5,636,096" in text
    assert "| 64 |" in text
