"""``RIFTCO_SIMD``: a level this CPU has is used for the whole process (``simd_level()``,
``riftco info``); a level it lacks or an unknown name is refused at import (``ConfigError``
naming the value and the CPU's levels), and by the ``riftco`` command as one error line with
exit code 2."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RIFTCO = Path(sys.executable).parent / "riftco"


def _env(**values: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("RIFTCO_SIMD", "RIFTCO_FORCE_SCALAR")}
    env.update(values)
    return env


def _python(code: str, **values: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=_env(**values), timeout=120)


def _levels() -> list[str]:
    """The levels this CPU has: those ``import riftco`` accepts."""
    return [level for level in ("scalar", "avx2", "avx512", "neon")
            if _python("import riftco", RIFTCO_SIMD=level).returncode == 0]


def test_every_level_the_cpu_has_is_used_and_shown() -> None:
    levels = _levels()
    assert "scalar" in levels
    for level in levels:
        for spelled in (level, f" {level.upper()} "):
            r = _python("import riftco; print(riftco.simd_level())", RIFTCO_SIMD=spelled)
            assert r.returncode == 0 and r.stdout.strip() == level, (spelled, r.stderr)
        info = subprocess.run([sys.executable, "-m", "riftco", "info"], capture_output=True,
                              text=True, env=_env(RIFTCO_SIMD=level), timeout=120)
        assert f"SIMD level: {level} (forced by RIFTCO_SIMD={level};" in info.stdout
    r = _python("import riftco; print(riftco.simd_level())", RIFTCO_FORCE_SCALAR="1")
    assert r.stdout.strip() == "scalar"
    best = _python("import riftco; print(riftco.simd_level())", RIFTCO_SIMD="auto")
    assert best.stdout.strip() == levels[-1]


@pytest.mark.parametrize("value", ["bogus", "sse2", "avx-512"])
def test_an_unknown_name_is_refused_at_import(value: str) -> None:
    r = _python("import riftco", RIFTCO_SIMD=value)
    assert r.returncode != 0
    last = r.stderr.strip().splitlines()[-1]
    assert "ConfigError" in last and repr(value).replace("'", '"') in last, last
    assert "is not a SIMD level" in last and "this CPU supports scalar" in last, last


def test_a_level_the_cpu_lacks_is_refused_and_the_command_says_it_in_one_line() -> None:
    missing = [level for level in ("avx2", "avx512", "neon") if level not in _levels()]
    if not missing:
        pytest.skip("this CPU has every level riftco knows")
    value = missing[0]
    r = _python("import riftco", RIFTCO_SIMD=value)
    assert r.returncode != 0 and f"this CPU does not support {value}" in r.stderr
    for command in ([str(RIFTCO), "info"], [sys.executable, "-m", "riftco", "info"]):
        c = subprocess.run(command, capture_output=True, text=True, env=_env(RIFTCO_SIMD=value),
                           timeout=120)
        assert c.returncode == 2, (command, c.stderr)
        lines = c.stderr.strip().splitlines()
        assert lines == [lines[0]] and lines[0].startswith("riftco: error: RIFTCO_SIMD="), lines


def test_contradicting_settings_are_refused() -> None:
    if "avx2" not in _levels():
        pytest.skip("this CPU has no avx2")
    r = _python("import riftco", RIFTCO_SIMD="avx2", RIFTCO_FORCE_SCALAR="yes")
    assert r.returncode != 0 and 'contradicts RIFTCO_FORCE_SCALAR="yes"' in r.stderr, r.stderr
