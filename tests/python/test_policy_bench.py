"""benches/policies.py in its quick configuration: every policy is measured, the tables and
the pictures are written, and the budget plans stay within their budgets."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import riftco

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "benches" / "policies.py"


def test_quick_policy_bench_measures_every_policy(tmp_path: Path) -> None:
    r = subprocess.run(
        [sys.executable, str(BENCH), "--quick", "--steps", "1", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
    )
    assert r.returncode == 0, r.stderr
    md = (tmp_path / "policies.md").read_text()
    for policy in ["disabled", "block", "segments:2", "auto"]:
        assert f"| {policy}" in md, policy
    for name in riftco.SELECTIVE_POLICIES:
        assert f"| selective:{name} |" in md, name
    assert md.count("| budget ") == 3
    # Every budget plan's measured peak is within its budget (the bench prints the check).
    checks = re.findall(r"within budget: (True|False)", r.stdout)
    assert checks == ["True"] * 3, r.stdout
    if importlib.util.find_spec("matplotlib") is None:
        assert "matplotlib not installed" in r.stdout
    else:
        for picture in ("memory_vs_depth.png", "pareto.png"):
            data = (tmp_path / picture).read_bytes()
            assert data[:8] == b"\x89PNG\r\n\x1a\n", picture
