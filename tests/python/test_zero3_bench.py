"""benches/zero3.py in its quick configuration (ZeRO-2 and ZeRO-3 jobs of 2 ranks under the
venv's mpiexec): the JSON's structure, ZeRO-3's parameter peak below ZeRO-2's, the gathers a
step makes, and the same losses in both stages."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "benches" / "zero3.py"
CATEGORIES = ("parameter", "gradient", "optimizer_state", "activation", "workspace", "total")


def test_quick_zero3_bench(tmp_path: Path) -> None:
    if importlib.util.find_spec("mpi4py") is None:
        pytest.skip("mpi4py is not installed (pip install 'riftco[mpi]'): no MPI job to run")
    r = subprocess.run(
        [sys.executable, str(BENCH), "--quick", "--steps", "2", "--warmup", "1",
         "--repeats", "2", "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=600, cwd=ROOT,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    if r.stdout.startswith("skipped:"):
        pytest.skip(r.stdout.strip())
    result = json.loads((tmp_path / "zero3_quick.json").read_text())
    assert result["ranks"] == 2 and result["num_threads"] == 1
    assert result["frozen_weights_dtype"] == "bfloat16"
    assert result["activation_checkpointing"] == "block"
    z2, z3 = result["rows"]
    assert (z2["zero"], z3["zero"]) == (2, 3)
    for row in (z2, z3):
        assert set(row["peak_bytes"]) == set(CATEGORIES)
        assert len(row["step_s_repeats"]) == 2 and all(s > 0 for s in row["step_s_repeats"])
        assert row["peak_bytes"]["total"] >= row["resident_bytes"] > 0
        # Every repeat ran warm-up + timed steps, and its losses are finite.
        assert all(len(losses) == 3 for losses in row["losses_repeats"])
    # The shards do not change the arithmetic: each unit's gradient is the same two-rank sum,
    # reduce-scattered, and Adam runs elementwise on the same parts.
    assert result["losses_equal"], (z2["losses_repeats"], z3["losses_repeats"])
    # ZeRO-3's parameter bytes (its frozen parts included) peak below ZeRO-2's: 1/2 of the
    # weights stay plus the units gathered at once, against all of them.
    assert z3["frozen_shard_bytes"] > 0 and z2["frozen_shard_bytes"] == 0
    assert z3["parameter_peak_bytes"] < z2["parameter_peak_bytes"]
    assert z2["parameter_peak_bytes"] == z2["peak_bytes"]["parameter"]
    assert result["parameter_peak_ratio"] == pytest.approx(
        z3["parameter_peak_bytes"] / z2["parameter_peak_bytes"]
    )
    assert z3["resident_bytes"] < z2["resident_bytes"]
    # Each unit is gathered once in the forward pass (the tied embedding twice: for the
    # lookup and for the head), and each checkpointed block once more for its replay in the
    # backward pass.
    layers = result["model_config"]["n_layers"]
    assert z3["units"] == layers + 2  # embedding (tied head), the blocks, the final norm
    assert z3["gathers_per_step"] == z3["units"] + 1 + layers
    assert 0.0 <= z3["exposed_share"] <= 1.0
    assert 0.0 <= z3["exposed_s"] <= z3["communication_s"] + 1e-9
    assert [t["bound"] for t in result["targets"]] == [0.6, 1.15]
    # The picture's data: both ranks' last ZeRO-3 step, its trace in time order, every
    # unit gathered before it is ready and released after.
    traces = result["memory_over_step"]["zero3"]
    assert len(traces) == 2 and len(result["memory_over_step"]["zero2"]) == 2
    for step in traces:
        events = step["trace"]
        assert [t for t, *_ in events] == sorted(t for t, *_ in events)
        assert sum(e == "gather" for _, e, _, _ in events) == z3["gathers_per_step"]
        seen: dict[str, str] = {}
        for t, e, unit, used in events:
            assert used > 0 and 0 <= t <= step["phases"]["end"]
            assert e != "ready" or seen.get(unit) == "gather", (unit, e)
            seen[unit] = e
        assert all(e == "release" for e in seen.values()), seen
    md = (tmp_path / "zero3_quick.md").read_text()
    assert md.count("\n| 2 |") == 1 and md.count("\n| 3 |") == 1
    if importlib.util.find_spec("matplotlib") is not None:
        assert (tmp_path / "zero3_quick_memory.png").stat().st_size > 0
