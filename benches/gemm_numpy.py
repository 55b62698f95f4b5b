"""Time numpy.matmul on square float32 matrices and print GFLOP/s.

Side-by-side reference for `cargo bench -p riftco-kernels --bench kernels` (GEMM section).
Usage: python benches/gemm_numpy.py [n ...]   (default: 256 512 1024)
Threads follow numpy's BLAS (set OMP_NUM_THREADS / OPENBLAS_NUM_THREADS to pin them).
"""

import sys
import time

import numpy as np


def best_seconds(fn, min_s=0.05, reps=5):
    fn()
    iters = 1
    while True:
        t = time.perf_counter()
        for _ in range(iters):
            fn()
        if time.perf_counter() - t >= min_s:
            break
        iters *= 2
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        for _ in range(iters):
            fn()
        best = min(best, (time.perf_counter() - t) / iters)
    return best


def main():
    sizes = [int(a) for a in sys.argv[1:]] or [256, 512, 1024]
    rng = np.random.default_rng(0)
    print(f"numpy {np.__version__}")
    for n in sizes:
        a = rng.standard_normal((n, n), dtype=np.float32)
        b = rng.standard_normal((n, n), dtype=np.float32)
        c = np.empty((n, n), dtype=np.float32)
        s = best_seconds(lambda: np.matmul(a, b, out=c))
        print(f"numpy.matmul {n:>4}: {2 * n**3 / s / 1e9:8.1f} GFLOP/s ({s * 1e3:.3f} ms)")


if __name__ == "__main__":
    main()
