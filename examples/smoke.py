"""Smoke check of an installed riftco: version, kernel threads, and one matrix product vs NumPy."""

from __future__ import annotations

import time

import numpy as np

import riftco


def main() -> None:
    print(f"riftco {riftco.__version__}")
    print(f"kernel threads: {riftco.num_threads()}")

    m, k, n = 512, 384, 256
    rng = np.random.default_rng(0)
    a = rng.standard_normal((m, k), dtype=np.float32)
    b = rng.standard_normal((k, n), dtype=np.float32)

    start = time.perf_counter()
    got = riftco.matmul(a, b)
    elapsed_s = time.perf_counter() - start
    want = a.astype(np.float64) @ b.astype(np.float64)
    max_abs_err = float(np.max(np.abs(got - want)))
    np_err = float(np.max(np.abs(np.matmul(a, b) - want)))

    print(f"matmul [{m}, {k}] x [{k}, {n}] in {elapsed_s * 1e3:.2f} ms")
    print(f"max |riftco - float64 reference| = {max_abs_err:.3e}")
    print(f"max |numpy  - float64 reference| = {np_err:.3e} (for comparison)")
    print(f"max |riftco - numpy| = {float(np.max(np.abs(got - np.matmul(a, b)))):.3e}")


if __name__ == "__main__":
    main()
