"""Cross-language checks of the native module against NumPy."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import riftco


REPO_ROOT = Path(__file__).resolve().parents[2]

# Tolerance of the float32 GEMM against numpy.matmul (also float32): both accumulate k products in
# float32 in different orders, so the difference grows like k * eps * sum_j |a_ij| |b_jk|. Inputs
# are in [-1, 1), so that bound is at most k * eps * k; we allow 4x headroom on it, per element.
EPS_F32 = float(np.finfo(np.float32).eps)


def workspace_version() -> str:
    text = (REPO_ROOT / "Cargo.toml").read_text(encoding="utf-8")
    if sys.version_info >= (3, 11):
        import tomllib

        version = tomllib.loads(text)["workspace"]["package"]["version"]
        assert isinstance(version, str)
        return version
    # Python 3.10 has no tomllib: read the one key we need.
    section = text.split("[workspace.package]", 1)[1].split("\n[", 1)[0]
    match = re.search(r'^version\s*=\s*"([^"]+)"', section, re.MULTILINE)
    assert match is not None, "no version in [workspace.package] of Cargo.toml"
    return match.group(1)


def test_version_matches_cargo_workspace() -> None:
    assert riftco.__version__ == workspace_version()


def test_num_threads_is_positive() -> None:
    n = riftco.num_threads()
    assert isinstance(n, int)
    assert n >= 1


def check_matmul(a: npt.NDArray[np.float32], b: npt.NDArray[np.float32]) -> None:
    got = riftco.matmul(a, b)
    want = np.matmul(a, b)
    assert got.dtype == np.float32
    assert got.shape == want.shape
    k = a.shape[1]
    bound = np.abs(a).astype(np.float64) @ np.abs(b).astype(np.float64)
    atol = 4.0 * max(k, 1) * EPS_F32 * bound
    np.testing.assert_array_less(np.abs(got.astype(np.float64) - want), atol + 1e-30)


@settings(max_examples=60, deadline=None)
@given(
    m=st.integers(0, 70),
    k=st.integers(0, 70),
    n=st.integers(0, 70),
    seed=st.integers(0, 2**32 - 1),
)
def test_matmul_matches_numpy(m: int, k: int, n: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    a = rng.uniform(-1.0, 1.0, size=(m, k)).astype(np.float32)
    b = rng.uniform(-1.0, 1.0, size=(k, n)).astype(np.float32)
    check_matmul(a, b)


@pytest.mark.parametrize("shape", [(97, 130, 65), (256, 64, 128)])
def test_matmul_large_enough_to_run_threaded(shape: tuple[int, int, int]) -> None:
    m, k, n = shape
    rng = np.random.default_rng(0)
    a = rng.standard_normal((m, k), dtype=np.float32)
    b = rng.standard_normal((k, n), dtype=np.float32)
    check_matmul(a, b)


def test_matmul_non_contiguous_inputs() -> None:
    rng = np.random.default_rng(1)
    a_t = rng.standard_normal((9, 7), dtype=np.float32).T  # Fortran-contiguous [7, 9]
    b_strided = rng.standard_normal((9, 10), dtype=np.float32)[:, ::2]  # strided [9, 5]
    check_matmul(a_t, b_strided)
    check_matmul(np.ascontiguousarray(a_t), b_strided.copy())


def test_matmul_shape_mismatch_names_both_shapes() -> None:
    a = np.zeros((2, 3), dtype=np.float32)
    b = np.zeros((4, 5), dtype=np.float32)
    with pytest.raises(ValueError, match=r"\[2, 3\].*\[4, 5\]"):
        riftco.matmul(a, b)


def test_matmul_rejects_wrong_dtype_and_rank() -> None:
    with pytest.raises(TypeError):
        riftco.matmul(np.zeros((2, 2), dtype=np.float64), np.zeros((2, 2), dtype=np.float32))
    with pytest.raises(TypeError):
        riftco.matmul(np.zeros(4, dtype=np.float32), np.zeros((4, 1), dtype=np.float32))
