#!/usr/bin/env python3
"""Checks riftco's K-quant quantizers against llama.cpp's C reference and writes the fixture the
Rust tests compare with.

`gguf.quants` (gguf-py) has no quantizer for Q2_K ... Q6_K, so the reference is the C of
`quantize_row_q2_K_ref` ... `quantize_row_q6_K_ref` in ggml's `ggml-quants.c` (the quantizer of
`llama-quantize` without an importance matrix). This dev-time harness takes that file from a
llama.cpp or ggml checkout, cuts out those functions and the helpers they call (`nearest_int`,
`make_qx_quants`, `make_q3_quants`, `make_qkx2_quants`, `get_scale_min_k4`), compiles them with
a small shim (the block structs of `ggml-common.h` and IEEE float <-> half conversion) using
`gcc -O2 -ffp-contract=off -DNDEBUG` (no fused multiply-add, as a portable build computes), and
runs them on deterministic inputs:

    python scripts/kquant_fixtures.py --ggml-quants ~/src/ggml/src/ggml-quants.c --check
        compares `riftco.quantize` with the C on many random and adversarial super-blocks;
    python scripts/kquant_fixtures.py --ggml-quants ... --write
        (re)writes crates/riftco-kernels/tests/fixtures/kquants_ref.bin: the inputs of
        `fixture_inputs()` (FIXTURE_BLOCKS super-blocks of 256 float32, little endian) followed
        by the C's bytes for Q2_K, Q3_K, Q4_K, Q5_K and Q6_K in that order. The Rust test
        `kquant_fixture` (crates/riftco-kernels/tests/kquant_fixture.rs) compares with it.

Needs numpy and gcc; `--check` needs riftco importable.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

FORMATS = {"q2_k": 84, "q3_k": 110, "q4_k": 144, "q5_k": 176, "q6_k": 210}
QK_K = 256
FIXTURE_BLOCKS = 8
FIXTURE = Path(__file__).resolve().parent.parent / "crates/riftco-kernels/tests/fixtures/kquants_ref.bin"

FUNCTIONS = [
    "nearest_int",
    "make_qx_quants",
    "make_q3_quants",
    "make_qkx2_quants",
    "get_scale_min_k4",
    "quantize_row_q2_K_ref",
    "quantize_row_q3_K_ref",
    "quantize_row_q4_K_ref",
    "quantize_row_q5_K_ref",
    "quantize_row_q6_K_ref",
]

SHIM = r"""
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <assert.h>
#include <float.h>
#define GGML_RESTRICT restrict
#define QK_K 256
#define GROUP_MAX_EPS 1e-15f
#define MIN(a, b) ((a) < (b) ? (a) : (b))
#define MAX(a, b) ((a) > (b) ? (a) : (b))
typedef uint16_t ggml_half;
static inline ggml_half fp32_to_fp16(float f) { _Float16 h = (_Float16)f; ggml_half u; memcpy(&u, &h, 2); return u; }
static inline float fp16_to_fp32(ggml_half u) { _Float16 h; memcpy(&h, &u, 2); return (float)h; }
#define GGML_FP32_TO_FP16(x) fp32_to_fp16(x)
#define GGML_FP16_TO_FP32(x) fp16_to_fp32(x)
typedef struct { uint8_t scales[QK_K/16]; uint8_t qs[QK_K/4]; ggml_half d; ggml_half dmin; } block_q2_K;
typedef struct { uint8_t hmask[QK_K/8]; uint8_t qs[QK_K/4]; uint8_t scales[12]; ggml_half d; } block_q3_K;
typedef struct { ggml_half d; ggml_half dmin; uint8_t scales[12]; uint8_t qs[QK_K/2]; } block_q4_K;
typedef struct { ggml_half d; ggml_half dmin; uint8_t scales[12]; uint8_t qh[QK_K/8]; uint8_t qs[QK_K/2]; } block_q5_K;
typedef struct { uint8_t ql[QK_K/2]; uint8_t qh[QK_K/4]; int8_t scales[QK_K/16]; ggml_half d; } block_q6_K;
_Static_assert(sizeof(block_q2_K) == 84, "q2_K"); _Static_assert(sizeof(block_q3_K) == 110, "q3_K");
_Static_assert(sizeof(block_q4_K) == 144, "q4_K"); _Static_assert(sizeof(block_q5_K) == 176, "q5_K");
_Static_assert(sizeof(block_q6_K) == 210, "q6_K");
"""

MAIN = r"""
int main(void) {
    size_t cap = 1 << 20, n = 0;
    float *x = malloc(cap * sizeof(float));
    size_t got;
    while ((got = fread(x + n, sizeof(float), cap - n, stdin)) > 0) {
        n += got;
        if (n == cap) { cap *= 2; x = realloc(x, cap * sizeof(float)); }
    }
    if (n % QK_K) { fprintf(stderr, "input is not whole super-blocks\n"); return 2; }
    size_t nb = n / QK_K;
    block_q2_K *q2 = calloc(nb, sizeof *q2); quantize_row_q2_K_ref(x, q2, n); fwrite(q2, sizeof *q2, nb, stdout);
    block_q3_K *q3 = calloc(nb, sizeof *q3); quantize_row_q3_K_ref(x, q3, n); fwrite(q3, sizeof *q3, nb, stdout);
    block_q4_K *q4 = calloc(nb, sizeof *q4); quantize_row_q4_K_ref(x, q4, n); fwrite(q4, sizeof *q4, nb, stdout);
    block_q5_K *q5 = calloc(nb, sizeof *q5); quantize_row_q5_K_ref(x, q5, n); fwrite(q5, sizeof *q5, nb, stdout);
    block_q6_K *q6 = calloc(nb, sizeof *q6); quantize_row_q6_K_ref(x, q6, n); fwrite(q6, sizeof *q6, nb, stdout);
    return 0;
}
"""


def extract(source: str, name: str) -> str:
    """The definition of function `name` in `source`: from its signature line to its closing
    brace (braces counted; the functions have no braces in strings or comments that matter)."""
    match = re.search(rf"^[^\n;]*\b{re.escape(name)}\s*\([^;{{]*\)\s*\{{", source, re.MULTILINE)
    if match is None:
        raise SystemExit(f"function {name} not found in the ggml-quants.c given")
    depth = 0
    for i in range(match.end() - 1, len(source)):
        if source[i] == "{":
            depth += 1
        elif source[i] == "}":
            depth -= 1
            if depth == 0:
                return source[match.start() : i + 1]
    raise SystemExit(f"function {name}: unbalanced braces")


def build(ggml_quants: Path, workdir: Path) -> Path:
    """Compiles the reference functions with the shim; returns the executable."""
    source = ggml_quants.read_text()
    # Keep the #else branch of the Apple-linker workaround (a brace in each branch would unbalance
    # the brace count); the build here does not define HAVE_BUGGY_APPLE_LINKER either.
    source = re.sub(r"#ifdef HAVE_BUGGY_APPLE_LINKER\n.*?\n#else\n(.*?)\n#endif", r"\1", source, flags=re.DOTALL)
    body = "\n\n".join(extract(source, f) for f in FUNCTIONS)
    body = re.sub(r"^void (quantize_row_q\d_K_ref)", r"static void \1", body, flags=re.MULTILINE)
    c_file = workdir / "kquant_ref.c"
    c_file.write_text(SHIM + body + MAIN)
    exe = workdir / "kquant_ref"
    cmd = ["gcc", "-O2", "-ffp-contract=off", "-DNDEBUG", "-std=gnu11", "-o", str(exe), str(c_file), "-lm"]
    subprocess.run(cmd, check=True)
    return exe


def reference(exe: Path, x: np.ndarray) -> dict[str, bytes]:
    """The C's bytes of each format for `x` (whole super-blocks)."""
    out = subprocess.run([str(exe)], input=x.astype("<f4").tobytes(), capture_output=True, check=True).stdout
    nb = x.size // QK_K
    result, at = {}, 0
    for name, size in FORMATS.items():
        result[name] = out[at : at + nb * size]
        at += nb * size
    assert at == len(out)
    return result


def adversarial(rng: np.random.Generator) -> np.ndarray:
    """Super-blocks that reach the quantizers' special cases: all zeros, one huge value,
    negative only, positive only, subnormals, ties on a grid, a constant, and mixed scales."""
    b = []
    b.append(np.zeros(QK_K))
    z = rng.standard_normal(QK_K)
    z[17] = 1e4
    b.append(z)
    b.append(-np.abs(rng.standard_normal(QK_K)))
    b.append(np.abs(rng.standard_normal(QK_K)) + 0.5)
    b.append(rng.standard_normal(QK_K) * 1e-41)
    b.append(rng.integers(-8, 8, QK_K) * 0.25)
    b.append(np.full(QK_K, 0.75))
    g = rng.standard_normal(QK_K)
    g[:32] = 0.0
    g[32:64] *= 1e-6
    b.append(g)
    return np.concatenate(b).astype(np.float32)


def fixture_inputs() -> np.ndarray:
    """The inputs of the committed fixture: FIXTURE_BLOCKS super-blocks (seed 42)."""
    rng = np.random.default_rng(42)
    x = adversarial(rng)
    assert x.size == FIXTURE_BLOCKS * QK_K
    return x


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ggml-quants", type=Path, required=True, help="ggml/src/ggml-quants.c of a llama.cpp or ggml checkout")
    ap.add_argument("--check", action="store_true", help="compare riftco.quantize with the C")
    ap.add_argument("--write", action="store_true", help=f"write {FIXTURE}")
    ap.add_argument("--blocks", type=int, default=2000, help="random super-blocks for --check")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        exe = build(args.ggml_quants, Path(tmp))
        if args.write:
            x = fixture_inputs()
            ref = reference(exe, x)
            FIXTURE.parent.mkdir(parents=True, exist_ok=True)
            FIXTURE.write_bytes(x.astype("<f4").tobytes() + b"".join(ref[f] for f in FORMATS))
            print(f"wrote {FIXTURE} ({FIXTURE.stat().st_size} bytes)")
        if args.check:
            import riftco

            rng = np.random.default_rng(0)
            scales = rng.choice([1e-3, 1.0, 30.0, 1e4], size=(args.blocks, 1))
            huge = rng.uniform(-3.4e38, 3.4e38, 4 * QK_K)  # overflows inside the search: NaN scales
            x = np.concatenate([adversarial(rng), huge, (rng.standard_normal((args.blocks, QK_K)) * scales).ravel()])
            x = x.astype(np.float32)
            ref = reference(exe, x)
            failed = 0
            for name, size in FORMATS.items():
                got = riftco.quantize(x, name)
                a = np.frombuffer(ref[name], np.uint8).reshape(-1, size)
                b = np.frombuffer(got, np.uint8).reshape(-1, size)
                bad = np.nonzero((a != b).any(axis=1))[0]
                print(f"{name}: {len(a) - len(bad)} of {len(a)} super-blocks bitwise equal to the C")
                failed += len(bad)
            return 1 if failed else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
