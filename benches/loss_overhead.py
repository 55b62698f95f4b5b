"""What the chunked LM head + cross-entropy costs against whole logits: one LoRA training step
(loss, backward with ``retain_graph=False``, Adam, zero_grad) of the same model with
``loss_chunk_bytes = None`` (unfused) and with the default budget (chunked), the two interleaved
step by step in one process, as wall and CPU seconds (medians), and their ratio.

    python benches/loss_overhead.py                    # SmolLM2-135M's shape, 1 layer: the head dominates
    python benches/loss_overhead.py --layers 30 --policy block --steps 3   # the whole model

The shape is ``benches/step_phases.py``'s (vocab 49152, d_model 576, tied; LoRA r=8 on all seven
projections, 4 x 256 tokens); ``--layers`` sets the depth. Issue 27's target: the chunked loss
adds at most 3 % to a step (or saves time). Compare CPU seconds on a shared host.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

import riftco

from step_phases import SHAPE


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=1)
    parser.add_argument("--policy", default="block")
    parser.add_argument("--steps", type=int, default=7, help="timed steps per head after one warm-up")
    parser.add_argument("--heads", default="unfused,chunked", help="comma-separated: unfused, chunked, chunked bf16")
    args = parser.parse_args()
    batch, seq = 4, 256
    block = np.random.default_rng(0).integers(0, SHAPE["vocab_size"], size=(batch, seq + 1), dtype=np.int64)
    rows = []
    for head in args.heads.split(","):
        m = riftco.DecoderOnlyTransformer(riftco.TransformerConfig(**{**SHAPE, "n_layers": args.layers}, seed=0),
                                          activation_checkpointing=args.policy)
        m.enable_lora(rank=8, alpha=16.0, mlp=True)
        m.loss_chunk_bytes = None if head == "unfused" else riftco.DEFAULT_LOSS_CHUNK_BYTES
        if head.endswith("bf16"):
            m.set_frozen_weights_dtype("bfloat16")
        rows.append((head, m, riftco.Adam(m.parameters(), lr=1e-4), [], []))
    for i in range(args.steps + 1):
        for _, m, opt, walls, cpus in rows:  # interleaved step by step
            w0, c0 = time.perf_counter(), time.process_time()
            loss = m.loss(block)
            loss.backward(retain_graph=False)
            opt.step()
            opt.zero_grad()
            del loss
            if i > 0:
                walls.append(time.perf_counter() - w0)
                cpus.append(time.process_time() - c0)
    print(f"{riftco.num_threads()} threads, SIMD {riftco.simd_level()}; {args.layers} layer(s), {args.policy}; "
          f"medians of {args.steps} interleaved steps")
    base = statistics.median(rows[0][4])
    for head, _, _, walls, cpus in rows:
        c = statistics.median(cpus)
        print(f"{head}: step {statistics.median(walls):.3f} s ({c:.3f} CPU s, min {min(cpus):.3f}); "
              f"CPU time vs {rows[0][0]}: {c / base:.3f}x")


if __name__ == "__main__":
    main()
