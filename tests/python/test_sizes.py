"""Sizes from input never crash the process: element counts that wrap are ``ShapeError``, configs
too large for addressable memory are ``ConfigError`` naming the field and the bytes, and an
allocation that passes every check but that the allocator refuses is ``OutOfMemoryError``.

Each reproduction runs in a child interpreter under a 4 GB address-space limit
(``RLIMIT_AS``, set in ``preexec_fn``), so a regression can neither crash pytest nor take the
machine's memory; the test asserts that the child exited normally (not by a signal) and printed
the expected exception type.
"""

from __future__ import annotations

import resource
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import riftco

ROOT = Path(__file__).resolve().parents[2]
LIMIT_BYTES = 4_000_000_000

PRELUDE = """
import numpy as np
import riftco
from riftco import DecoderOnlyTransformer, TransformerConfig, Variable
from riftco import functional as F

def cfg(**kw):
    base = dict(vocab_size=256, d_model=64, n_heads=4, n_layers=2, d_ff=128, max_seq_len=64)
    base.update(kw)
    return TransformerConfig(**base)

def report(f):
    try:
        f()
    except riftco.RiftcoError as e:
        print(f"RAISED {type(e).__name__}: {e}")
    else:
        print("NO ERROR")
"""


def _limit_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (LIMIT_BYTES, LIMIT_BYTES))


def run_limited(body: str, timeout: float = 120.0) -> str:
    """Runs ``body`` after PRELUDE in a memory-limited child; returns its stdout once it exited
    with status 0 (a negative status is a signal: SIGSEGV, SIGABRT)."""
    code = PRELUDE + textwrap.dedent(body)
    r = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=timeout,
        preexec_fn=_limit_memory,
        cwd=ROOT,
    )
    assert r.returncode == 0, f"child ended with status {r.returncode}\n{r.stdout}\n{r.stderr}"
    return r.stdout


def expect_raised(out: str, kind: str, *needles: str) -> None:
    assert f"RAISED {kind}: " in out, out
    for needle in needles:
        assert needle in out, out


def test_reshape_to_a_wrapping_shape_is_a_shape_error() -> None:
    out = run_limited(
        """
        x = Variable(np.zeros(0, np.float32))
        report(lambda: F.linear(F.reshape(x, [2**63, 2]), x))
        """
    )
    expect_raised(out, "ShapeError", "[9223372036854775808, 2]", "too many elements")


def test_linear_with_a_wrapping_output_is_a_shape_error() -> None:
    out = run_limited(
        """
        x = Variable(np.zeros((2**32, 0)))
        report(lambda: F.linear(F.linear(x, x), F.linear(x, x)))
        """
    )
    expect_raised(out, "ShapeError", "linear", "[4294967296, 4294967296]")


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ("d_model=2**40, n_heads=1", "d_model"),
        ("d_model=2**62, n_heads=1", "d_model"),
        ("d_ff=2**40", "d_ff"),
        ("n_layers=2**40", "n_layers"),
        ("max_seq_len=2**40", "max_seq_len"),
        ("max_seq_len=2**62", "max_seq_len"),
    ],
)
def test_oversized_config_is_a_config_error_naming_the_field(kwargs: str, field: str) -> None:
    out = run_limited(f"report(lambda: DecoderOnlyTransformer(cfg({kwargs})))")
    expect_raised(out, "ConfigError", f"invalid config: {field} = ", "bytes", "2^47")


def test_oversized_config_is_rejected_in_process_too() -> None:
    # Validation allocates nothing, so this is safe in the test process itself.
    with pytest.raises(riftco.ConfigError, match="d_model = 4611686018427387904"):
        riftco.TransformerConfig(
            vocab_size=256, d_model=2**62, n_heads=1, n_layers=2, d_ff=128, max_seq_len=64
        )


def test_weights_that_do_not_fit_are_out_of_memory() -> None:
    # vocab_size 2**31 passes validation (4 TiB with gradients and Adam state) but its 512 GiB
    # embedding cannot be allocated.
    out = run_limited(
        """
        report(lambda: DecoderOnlyTransformer(cfg(vocab_size=2**31)))
        e = None
        try:
            DecoderOnlyTransformer(cfg(vocab_size=2**31))
        except MemoryError as caught:
            e = caught
        print("memory error:", isinstance(e, riftco.OutOfMemoryError))
        """
    )
    expect_raised(out, "OutOfMemoryError", "549755813888 bytes")
    assert "memory error: True" in out, out


def test_matmul_whose_output_does_not_fit_is_out_of_memory() -> None:
    out = run_limited(
        """
        a, b = np.zeros((2**20, 0), np.float32), np.zeros((0, 2**20), np.float32)
        report(lambda: riftco.matmul(a, b))
        a, b = np.zeros((2**32, 0), np.float32), np.zeros((0, 2**32), np.float32)
        report(lambda: riftco.matmul(a, b))
        """
    )
    lines = out.splitlines()
    expect_raised(lines[0], "OutOfMemoryError", "matmul", "4398046511104 bytes")
    expect_raised(lines[1], "ShapeError", "[4294967296, 4294967296]")


def test_decode_cache_that_does_not_fit_is_out_of_memory() -> None:
    # The weights fit in 4 GB; each layer's 4 GiB K/V cache does not.
    out = run_limited(
        """
        m = DecoderOnlyTransformer(cfg(n_heads=32, max_seq_len=2**24))
        report(m.decode_session)
        """
    )
    expect_raised(out, "OutOfMemoryError", "decode K/V cache")


def test_out_of_memory_error_is_a_riftco_error_and_a_memory_error() -> None:
    assert issubclass(riftco.OutOfMemoryError, riftco.RiftcoError)
    assert issubclass(riftco.OutOfMemoryError, MemoryError)
    assert riftco.OutOfMemoryError.__module__ == "riftco._native"


def test_cli_reports_an_oversized_model_as_a_one_line_error(tmp_path: Path) -> None:
    script = ROOT / "examples" / "pretrain.py"
    r = subprocess.run(
        [sys.executable, str(script), "--d-model", "1099511627776", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        preexec_fn=_limit_memory,
        cwd=ROOT,
    )
    assert r.returncode == 2, f"status {r.returncode}\n{r.stdout}\n{r.stderr}"
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "error: invalid config: d_model = 1099511627776" in lines[0], r.stderr


def test_many_tiny_layers_are_a_config_error_not_an_abort() -> None:
    # 10^7 blocks of d_model 2 pass the byte bound; building them aborted in millions of small
    # allocations (SIGABRT "memory allocation of 16 bytes failed").
    out = run_limited(
        """
        report(lambda: DecoderOnlyTransformer(TransformerConfig(
            vocab_size=1, d_model=2, n_heads=1, n_layers=10**7, d_ff=1, max_seq_len=1)))
        """
    )
    expect_raised(out, "ConfigError", "n_layers = 10000000", "16384")


def test_matmul_of_a_broadcast_view_is_out_of_memory_not_an_abort() -> None:
    # A stride-0 view of one element describes 2^31 of them: its row-major copy (8 GiB) used to
    # abort in the allocator.
    out = run_limited(
        """
        a = np.broadcast_to(np.float32(0), (2**16, 2**15))
        report(lambda: riftco.matmul(a, np.zeros((2**15, 1), np.float32)))
        """
    )
    expect_raised(out, "OutOfMemoryError", "8589934592 bytes")
