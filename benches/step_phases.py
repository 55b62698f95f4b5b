"""Where a LoRA training step's time goes: the loss (forward, LM head and cross-entropy with its
gradient), the backward pass (replays included), Adam's step and zero_grad, each as wall time and
as CPU time of the process (on a host shared with other work the CPU seconds move less than the
wall seconds), plus the step's matrix-product work and the rate it ran at.

    python benches/step_phases.py                     # SmolLM2-135M's shape, block, bf16 base
    python benches/step_phases.py --heads unfused,chunked --policy disabled --steps 2

The shapes and rows are those of ``benches/memory_real_models.py`` (LoRA r=8 on all seven
projections, 4 x 256 tokens). The product work counts every matrix product a step runs:
forward, the checkpointed blocks' replays, the backward's input gradients (no weight gradient
of the frozen base) and the head's two products (attention's products counted whole, though a
causal kernel skips up to half of them; LoRA's rank-8 products left out); the rate is that work over the step's CPU
seconds, to compare with ``riftco.matmul``'s own rate on one thread (``--gemm``).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np

import riftco

SHAPE: dict[str, Any] = dict(vocab_size=49152, d_model=576, n_heads=9, n_kv_heads=3, n_layers=30, d_ff=1536,
             max_seq_len=2048, rope_theta=1e5, tie_word_embeddings=True)


def product_flops(batch: int, seq: int, policy: str) -> float:
    """Floating-point operations of a step's matrix products (2 per multiply-add)."""
    s = SHAPE
    d, f, v, layers = s["d_model"], s["d_ff"], s["vocab_size"], s["n_layers"]
    d_kv = d // s["n_heads"] * s["n_kv_heads"]
    t = batch * seq
    weights = d * d * 2 + d * d_kv * 2 + 3 * d * f  # q, o; k, v; gate, up, down
    layer = 2 * t * weights
    attention = 2 * 2 * batch * s["n_heads"] * seq * seq * (d // s["n_heads"])
    forward = layers * (layer + attention)
    backward = layers * (layer + 2 * attention)  # input gradients only
    replay = forward if policy != "disabled" else 0
    head = 2 * (2 * t * d * v)  # logits and the hidden states' gradient
    return float(forward + replay + backward + head)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--heads", default="chunked bf16", help="comma-separated: unfused, chunked, chunked bf16")
    parser.add_argument("--policy", default="block")
    parser.add_argument("--steps", type=int, default=3, help="timed steps after one warm-up")
    parser.add_argument("--gemm", action="store_true", help="also time riftco.matmul at the layers' sizes")
    args = parser.parse_args()
    batch, seq = 4, 256
    block = np.random.default_rng(0).integers(0, SHAPE["vocab_size"], size=(batch, seq + 1), dtype=np.int64)
    rows: list[tuple[str, Any, Any, list[list[tuple[float, float]]]]] = []
    for head in args.heads.split(","):
        m = riftco.DecoderOnlyTransformer(riftco.TransformerConfig(**SHAPE, seed=0),
                                          activation_checkpointing=args.policy)
        m.enable_lora(rank=8, alpha=16.0, mlp=True)
        m.loss_chunk_bytes = None if head == "unfused" else riftco.DEFAULT_LOSS_CHUNK_BYTES
        if head.endswith("bf16"):
            m.set_frozen_weights_dtype("bfloat16")
        rows.append((head, m, riftco.Adam(m.parameters(), lr=1e-4), []))
    phases = ("loss", "backward", "adam", "zero_grad", "step")
    for i in range(args.steps + 1):
        for head, m, opt, times in rows:  # rows interleaved step by step
            marks = [(time.perf_counter(), time.process_time())]
            loss = m.loss(block)
            marks.append((time.perf_counter(), time.process_time()))
            loss.backward(retain_graph=False)
            marks.append((time.perf_counter(), time.process_time()))
            opt.step()
            marks.append((time.perf_counter(), time.process_time()))
            opt.zero_grad()
            marks.append((time.perf_counter(), time.process_time()))
            del loss
            if i > 0:
                spans = [(b[0] - a[0], b[1] - a[1]) for a, b in zip(marks, marks[1:])]
                spans.append((marks[-1][0] - marks[0][0], marks[-1][1] - marks[0][1]))
                times.append(spans)
    flops = product_flops(batch, seq, args.policy)
    print(f"{riftco.num_threads()} threads, SIMD {riftco.simd_level()}; medians of {args.steps} steps; "
          f"product work {flops / 1e9:.0f} GFLOP per step")
    for head, _, _, times in rows:
        med = [(statistics.median(t[j][0] for t in times), statistics.median(t[j][1] for t in times))
               for j in range(len(phases))]
        cells = ", ".join(f"{p} {w:.2f} s ({c:.2f} CPU s)" for p, (w, c) in zip(phases, med))
        print(f"{args.policy} {head}: {cells}; {flops / med[-1][1] / 1e9:.0f} GFLOP per CPU second")
    if args.gemm:
        rng = np.random.default_rng(0)
        for m_, k_, n_ in [(1024, 576, 1536), (1024, 1536, 576), (256, 576, 3640)]:
            a = rng.standard_normal((m_, k_), dtype=np.float32)
            b = rng.standard_normal((k_, n_), dtype=np.float32)
            riftco.matmul(a, b)
            best = min(_cpu(lambda: riftco.matmul(a, b)) for _ in range(5))
            print(f"matmul {m_}x{k_}x{n_}: {2 * m_ * k_ * n_ / best / 1e9:.0f} GFLOP per CPU second")


def _cpu(f: Callable[[], object]) -> float:
    c0 = time.process_time()
    f()
    return time.process_time() - c0


if __name__ == "__main__":
    main()
