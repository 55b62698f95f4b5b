"""Data-parallel scaling, on paper: step time and efficiency over N ranks and a network, from
the ring all-reduce cost model and a measured (or assumed) compute time per step; per-rank
memory under ZeRO 0/1/2. Prints the Markdown tables of docs/distributed.md.

Inputs:

- Measured (``benches/results/data_parallel.json``, from ``benches/data_parallel.py``): the
  reference model's step time at N=1 (pretraining and LoRA, global batch 8 x 256 tokens, one
  kernel thread) and its trainable element counts. The FLOP rate of one rank is derived from
  it (training FLOPs per step, below, over the measured seconds).
- Counted from the shapes: parameters of the reference model and of the Llama-3.2-1B shape
  (vocab 128256, d_model 2048, d_ff 8192, 16 layers, 32 heads / 8 KV heads, tied embeddings),
  full and LoRA r=8 on q/k/v/o/gate/up/down.

Assumptions (all printed again by the script):

- Weak scaling: every rank keeps the per-rank batch of the N=1 measurement (the reference:
  8 x 256 tokens; the 1B shape: 8 x 2048 tokens), so compute per rank stays ``t_compute`` and
  the global batch grows with N.
- Gradients in float32, all-reduced with the bandwidth-optimal ring:
  ``t_comm = 2 (N-1)/N * bytes / bandwidth + 2 (N-1) * buckets * latency`` with 25 MiB
  buckets and ``latency`` = 30 us per message (TCP over Ethernet; RDMA is nearer 2 us).
  Bandwidth is the link's nominal Gbit/s (no protocol overhead).
- Training FLOPs per token (Kaplan et al. 2020, eq. 2.2 tripled for backward): full training
  ``6 * P_matmul + 6 * n_layers * seq * d_model`` (attention scores and values), LoRA
  ``4 * P_matmul + 4 * n_layers * seq * d_model`` (no weight gradients of the frozen
  matrices; the adapters' FLOPs are left out). ``P_matmul`` counts every weight matrix used in
  a matmul (the output head included, the input embedding lookup not).
- Without overlap (riftco today): ``step = t_compute + t_comm``. With overlap of the all-reduce
  and the backward pass (as PyTorch DDP does): ``step = t_fwd + max(t_bwd, t_comm)``, backward
  = 2/3 of the compute (1/2 for LoRA). Efficiency = ``t_compute / step``.
- The 1B shape's compute time: at the FLOP rate measured here (one AMD EPYC core, AVX2) and at
  an assumed 100 TFLOP/s per rank (an accelerator-class rate; not a riftco measurement).

    python benches/scaling_model.py   # prints the tables and writes benches/results/scaling_model.md
"""

from __future__ import annotations

import argparse
import builtins
import json
import math
from dataclasses import dataclass
from pathlib import Path

MIB = 2**20
GB = 1e9
BUCKET_BYTES = 25 * MIB
LATENCY_S = 30e-6
NETWORKS_GBIT = (10, 25, 100)
RANKS = (2, 4, 8, 16, 32, 64)
ASSUMED_FLOPS = 100e12


@dataclass(frozen=True)
class Shape:
    name: str
    vocab: int
    d_model: int
    d_ff: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    tied: bool

    @property
    def d_kv(self) -> int:
        return self.d_model // self.n_heads * self.n_kv_heads

    def projections(self) -> list[tuple[int, int]]:
        """(in, out) of every weight matrix of one block: q, k, v, o, gate, up, down."""
        d, kv, ff = self.d_model, self.d_kv, self.d_ff
        return [(d, d), (d, kv), (d, kv), (d, d), (d, ff), (d, ff), (ff, d)]

    def parameters(self) -> int:
        """All parameters: embedding, blocks (7 matrices and 2 RMSNorm gains), final norm, and
        the output head unless tied."""
        block = sum(i * o for i, o in self.projections()) + 2 * self.d_model
        head = 0 if self.tied else self.vocab * self.d_model
        return self.vocab * self.d_model + self.n_layers * block + self.d_model + head

    def matmul_parameters(self) -> int:
        return self.n_layers * sum(i * o for i, o in self.projections()) + self.vocab * self.d_model

    def lora_parameters(self, rank: int) -> int:
        """LoRA A [r, in] and B [out, r] on every projection of every block."""
        return self.n_layers * sum(rank * (i + o) for i, o in self.projections())

    def flops_per_token(self, seq: int, lora: bool) -> float:
        k = 4 if lora else 6
        return k * self.matmul_parameters() + k * self.n_layers * seq * self.d_model


REFERENCE = Shape("reference (d_model 256, 8 layers)", 256, 256, 688, 8, 8, 8, tied=False)
LLAMA_1B = Shape("Llama-3.2-1B shape", 128256, 2048, 8192, 16, 32, 8, tied=True)


def buckets(elements: int) -> int:
    return max(1, math.ceil(elements * 4 / BUCKET_BYTES))


def comm_s(elements: int, n: int, gbit: float) -> float:
    """Ring all-reduce of ``elements`` float32 over ``n`` ranks at ``gbit`` Gbit/s."""
    nbytes = elements * 4
    bandwidth = gbit * 1e9 / 8
    return 2 * (n - 1) / n * nbytes / bandwidth + 2 * (n - 1) * buckets(elements) * LATENCY_S


def table(title: str, elements: int, t_compute: float, backward_share: float) -> str:
    """One row per N; per network: the all-reduce seconds, then step seconds and efficiency
    without and with overlap."""
    head = " | ".join(f"{g} Gbit/s: comm / no overlap / overlap" for g in NETWORKS_GBIT)
    lines = [
        f"**{title}**: {elements:,} trainable elements ({elements * 4 / MIB:,.1f} MiB of "
        f"float32 gradients, {buckets(elements)} bucket(s)), compute {t_compute:.3g} s per rank "
        "per step. Cells: seconds (efficiency).",
        "",
        f"| N | {head} |",
        "|---|" + "---|" * len(NETWORKS_GBIT),
    ]
    t_bwd = backward_share * t_compute
    t_fwd = t_compute - t_bwd
    for n in RANKS:
        cells = []
        for gbit in NETWORKS_GBIT:
            c = comm_s(elements, n, gbit)
            plain = t_compute + c
            over = t_fwd + max(t_bwd, c)
            cells.append(
                f"{c:.3g} / {plain:.3g} ({100 * t_compute / plain:.0f} %) / "
                f"{over:.3g} ({100 * t_compute / over:.0f} %)"
            )
        lines.append(f"| {n} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def memory_table(shape: Shape) -> str:
    p = shape.parameters()
    w, g, adam = 4 * p, 4 * p, 8 * p
    lines = [
        f"**Per-rank memory of the {shape.name}, float32, {p:,} parameters** (GB = 1e9 bytes; "
        "activations and workspace not included).",
        "",
        "| N | ZeRO 0 | ZeRO 1 (paper) | ZeRO 2 (paper) | ZeRO 1, riftco today | "
        "ZeRO 2, riftco today |",
        "|---|---|---|---|---|---|",
    ]
    for n in (1, 2, 4, 8, 16, 32, 64):
        z0 = w + g + adam
        z1 = w + g + adam / n
        z2 = w + g / n + adam / n
        # riftco: the shard's own values add P/N parameter bytes; ZeRO 2 reduce-scatters each
        # bucket as the backward pass completes it, so a rank holds its 1/N of the gradients
        # (plus the buckets being filled: 25 MiB each, left out here).
        r1 = w + w / n + g + adam / n
        r2 = w + w / n + g / n + adam / n
        lines.append(
            f"| {n} | {z0 / GB:.1f} | {z1 / GB:.1f} | {z2 / GB:.1f} | {r1 / GB:.1f} | "
            f"{r2 / GB:.1f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--measured", type=Path,
        default=Path(__file__).parent / "results" / "data_parallel.json",
    )
    ap.add_argument(
        "--out", type=Path, default=Path(__file__).parent / "results" / "scaling_model.md",
        help="where the Markdown is written too",
    )
    args = ap.parse_args(argv)
    lines: list[str] = []

    def print(text: str = "") -> None:  # noqa: A001 - collects the page as it prints it
        lines.append(text)
        builtins.print(text)

    measured = json.loads(args.measured.read_text())
    rows = {(r["stage"], r["n"], r["zero"]): r for r in measured["rows"]}
    tokens_ref = measured["batch_size"] * measured["seq_len"]
    seq_ref = measured["seq_len"]

    print("### Parameters, counted from the shapes\n")
    for shape in (REFERENCE, LLAMA_1B):
        print(f"- {shape.name}: {shape.parameters():,} parameters "
              f"({shape.matmul_parameters():,} in matmuls), LoRA r=8 on q/k/v/o/gate/up/down: "
              f"{shape.lora_parameters(8):,}")
    counted = {"pretraining": REFERENCE.parameters(), "lora": REFERENCE.lora_parameters(8)}
    for stage, n in measured["trainable_elements"].items():
        check = "equal to" if counted.get(stage) == n else "DIFFERENT from"
        print(f"- the benchmark's trainable elements, {stage}: {n:,} ({check} the count from "
              "the shapes)")

    print("\n### Assumptions\n")
    print(f"- latency {LATENCY_S * 1e6:g} us per ring message, {BUCKET_BYTES // MIB} MiB "
          "buckets, nominal link bandwidth; weak scaling (per-rank batch fixed)")
    print("- no overlap: step = compute + comm (riftco today); overlap: "
          "step = forward + max(backward, comm)")

    print("\n### Reference model, compute measured here\n")
    rates = {}
    for stage, lora in (("pretraining", False), ("lora", True)):
        row = rows.get((stage, 1, 0))
        if row is None:
            continue
        t1 = row["step_s"]
        flops = REFERENCE.flops_per_token(seq_ref, lora) * tokens_ref
        rates[stage] = flops / t1
        print(f"- {stage}: {t1:.3f} s per step of {tokens_ref} tokens at N=1 "
              f"({flops / 1e9:.1f} GFLOP per step by the formula, {rates[stage] / 1e9:.1f} "
              "GFLOP/s achieved on one core)")
    print()
    for stage, lora in (("pretraining", False), ("lora", True)):
        if (stage, 1, 0) not in rows:
            continue
        elements = measured["trainable_elements"][stage]
        print(table(f"Reference, {stage}", elements, rows[(stage, 1, 0)]["step_s"],
                    0.5 if lora else 2 / 3))
        print()

    print("### Llama-3.2-1B shape, 8 x 2048 tokens per rank per step\n")
    tokens_1b = 8 * 2048
    for stage, lora in (("full training", False), ("LoRA r=8", True)):
        elements = LLAMA_1B.lora_parameters(8) if lora else LLAMA_1B.parameters()
        flops = LLAMA_1B.flops_per_token(2048, lora) * tokens_1b
        cpu_rate = rates.get("lora" if lora else "pretraining")
        if cpu_rate is not None:
            t_cpu = flops / cpu_rate
            worst = comm_s(elements, RANKS[-1], NETWORKS_GBIT[0])
            print(f"- {stage} at the FLOP rate measured here (1 core): {t_cpu:,.0f} s of compute "
                  f"per step against at most {worst:.3g} s of all-reduce (N={RANKS[-1]}, "
                  f"{NETWORKS_GBIT[0]} Gbit/s): efficiency {100 * t_cpu / (t_cpu + worst):.1f} %")
        print()
        print(table(f"1B shape, {stage}, at an assumed {ASSUMED_FLOPS / 1e12:g} TFLOP/s per rank",
                    elements, flops / ASSUMED_FLOPS, 0.5 if lora else 2 / 3))
        print()

    print("### Memory per rank\n")
    print(memory_table(LLAMA_1B))
    print()
    device_bytes = 80 * GB
    n = RANKS[-1]
    per_param = {
        "ZeRO 0": 16.0,
        "ZeRO 1 (paper)": 8 + 8 / n,
        "ZeRO 2 (paper)": 4 + 12 / n,
        "ZeRO 1, riftco today": 8 + 12 / n,
        "ZeRO 2, riftco today": 4 + 16 / n,
    }
    print(f"Largest model whose float32 weights, gradients and Adam moments fit "
          f"{device_bytes / GB:.0f} GB per rank at N={n}, before activations: "
          + ", ".join(f"{k} {device_bytes / b / 1e9:.1f}B parameters ({b:.2f} bytes/parameter)"
                      for k, b in per_param.items())
          + ". Beyond that the replica itself must be cut: ZeRO-3 (parameters sharded too, "
          "gathered layer by layer) or tensor parallelism.")
    args.out.write_text("\n".join(lines).rstrip() + "\n")
    builtins.print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
