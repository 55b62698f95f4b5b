"""Data-parallel scaling, on paper: step time and efficiency over N ranks and a network, from
the ring all-reduce cost model and a measured (or assumed) compute time per step; ZeRO-3's
per-unit all-gathers with and without overlap; per-rank memory under ZeRO 0/1/2/3 and the
largest model that fits 80 GB per rank. Prints the Markdown tables of docs/distributed.md.

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

ZeRO-3 (Rajbhandari et al. 2020, section 7: parameters sharded too; 1.5x DDP's bytes: an
all-gather of the parameters for the forward, another for the backward, a reduce-scatter of the
gradients) with FSDP's per-unit gathers and prefetch (Zhao et al. 2023, "PyTorch FSDP:
Experiences on Scaling Fully Sharded Data Parallel"):

- Units: the embedding (with the final norm when the head is tied), each transformer block, and
  the final norm with the head when untied. Each collective is a ring over one unit:
  ``(N-1)/N * bytes / bandwidth + (N-1) * latency`` (one message per ring step, no buckets).
- Forward: each unit is all-gathered before it runs and released after. The head's forward and
  backward run back to back (the chunked loss) under one gather; a tied head's is the embedding
  unit's second gather. Backward: each block is all-gathered again and its gradient
  reduce-scattered as its backward ends; the embedding's backward reads no weights (a
  scatter-add), and its gradient, a tied head's included, is reduce-scattered last. So blocks
  and a tied embedding move 3 x their bytes (1.5x DDP's 2 x), an untied embedding or head 2 x.
- With ``block`` checkpointing the replay and the VJP of a block use the same backward gather:
  no traffic beyond ``disabled``'s.
- LoRA: the frozen base is gathered in bfloat16 (2 bytes per parameter), the adapters in
  float32; only the adapters' gradients are reduce-scattered. This is far more than LoRA DDP's
  all-reduce of the adapters alone.
- Compute per unit: the block's share of the FLOPs above, ``2 (P_block + seq d_model)`` per
  token forward, ``4 (...)`` backward (``2`` for LoRA); the head ``6 vocab d_model`` (``4``);
  the embedding none.
- Without overlap: ``step = compute + every collective``. With overlap (the next unit's gather
  started before the current unit computes, in the forward and the backward; at most two units
  gathered): ``step = gather_0 + sum_k max(compute_k, gather_(k+1) + reduce_(k-1)) +
  reduce_last``: the exposed communication is the first gather, the last reduce-scatter and,
  per unit, whatever of the collectives beside it its compute does not cover.

Per-rank memory, for the largest-model tables (80 GB per rank, GB = 1e9 bytes):

- States (the paper's accounting): full training 4 + 4 + 8 bytes per parameter (float32
  weights, gradients, Adam's two moments); ZeRO 1 shards the moments, ZeRO 2 the gradients too,
  ZeRO 3 everything (``16/N``). LoRA r=8: a bfloat16 base (2 bytes per parameter, sharded only
  by ZeRO 3) and the adapters' 16 bytes per parameter under the same rules.
- ZeRO 3 adds its unsharded buffers at their peak: two units' gathered parameters (the largest
  unit and a block) and the same units' unsharded gradients before the reduce-scatter.
- Activations of 1 x 2048 tokens per rank under ``block`` checkpointing, float32: the kept
  block inputs and final hidden state, one block's values during its replay, its VJP's two
  d_ff-wide gradients (``activation_bytes``: 348.1 MiB for the 1B shape at 1 x 1024 tokens,
  where riftco measured a 348.3 MiB activation peak), and the loss's 72 MiB workspace. Left
  out: DDP's and ZeRO 2's buckets in flight, fragmentation, the framework itself.
- Model family: the published Llama 3 shapes (1B, 3B, 8B, 70B, 405B), interpolated between
  them (``llama3_family``) and, past 405B, made deeper at its width.

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


    def block_matmul_parameters(self) -> int:
        return sum(i * o for i, o in self.projections())

    def block_parameters(self) -> int:
        """One block: its 7 matrices and 2 RMSNorm gains."""
        return self.block_matmul_parameters() + 2 * self.d_model

    def lora_block_parameters(self, rank: int) -> int:
        return sum(rank * (i + o) for i, o in self.projections())

    def embedding_parameters(self) -> int:
        return self.vocab * self.d_model


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


# --- ZeRO-3 -------------------------------------------------------------------------------

LORA_RANK = 8
DEVICE_BYTES = 80 * GB
MEMORY_TOKENS = 2048
LOSS_WORKSPACE_BYTES = 72 * MIB
MEMORY_RANKS = (1, 2, 4, 8, 16, 32, 64)

# The published Llama 3 shapes (their Hugging Face config.json): vocab, d_model, d_ff, layers,
# heads, KV heads, tied embeddings.
LLAMA3 = (
    Shape("Llama-3.2-1B", 128256, 2048, 8192, 16, 32, 8, tied=True),
    Shape("Llama-3.2-3B", 128256, 3072, 8192, 28, 24, 8, tied=True),
    Shape("Llama-3.1-8B", 128256, 4096, 14336, 32, 32, 8, tied=False),
    Shape("Llama-3.1-70B", 128256, 8192, 28672, 80, 64, 8, tied=False),
    Shape("Llama-3.1-405B", 128256, 16384, 53248, 126, 128, 8, tied=False),
)


def collective_s(nbytes: float, n: int, gbit: float) -> float:
    """Ring all-gather (or reduce-scatter) of one unit of ``nbytes`` over ``n`` ranks: each rank
    receives (N-1)/N of the bytes, in N-1 messages of ``LATENCY_S`` each."""
    if n == 1 or nbytes == 0:
        return 0.0
    return (n - 1) / n * nbytes / (gbit * 1e9 / 8) + (n - 1) * LATENCY_S


@dataclass(frozen=True)
class Zero3Step:
    """One piece of a ZeRO-3 training step, in execution order: its training FLOPs per token,
    the bytes all-gathered before it runs (0 where its unit is resident or it reads no
    weights) and the gradient bytes reduce-scattered when it ends."""

    name: str
    flops_per_token: float
    gather_bytes: float
    reduce_bytes: float


def zero3_steps(shape: Shape, seq: int, lora: bool) -> list[Zero3Step]:
    """The units in the order a step meets them. Units: the embedding (with the final norm when
    the head is tied), each block, and the final norm with the head when untied. Parameters are
    gathered in their storage (float32; a LoRA base in bfloat16, its adapters in float32);
    gradients (of every parameter, or of the adapters) reduce-scattered in float32.

    - forward: gather the embedding, then each block;
    - the final norm, the head and the loss run forward and backward back to back (the chunked
      loss), under one gather: the tied head's is the embedding unit's second gather;
    - backward: each block is gathered again (with ``block`` checkpointing the replay and the VJP
      use that one gather) and its gradient reduce-scattered as its backward ends;
    - the embedding's backward is a scatter-add that reads no weights: no gather; its gradient
      (with a tied head's, summed over the step) is reduce-scattered last.
    """
    d, vocab, layers = shape.d_model, shape.vocab, shape.n_layers
    k_bwd = 2 if lora else 4
    p_bytes = 2 if lora else 4
    block_flops = shape.block_matmul_parameters() + seq * d
    lora_block = shape.lora_block_parameters(LORA_RANK) if lora else 0
    block_gather = p_bytes * shape.block_parameters() + 4 * lora_block
    block_reduce = 4 * lora_block if lora else 4 * shape.block_parameters()
    embedding_unit = vocab * d + (d if shape.tied else 0)
    head_unit = 0 if shape.tied else vocab * d + d
    steps = [Zero3Step("embedding", 0, p_bytes * embedding_unit, 0)]
    steps += [Zero3Step(f"block {i} forward", 2 * block_flops, block_gather, 0)
              for i in range(layers)]
    steps.append(Zero3Step(
        "final norm, head and loss", (2 + k_bwd) * vocab * d,
        p_bytes * (embedding_unit if shape.tied else head_unit),
        0 if lora or shape.tied else 4 * head_unit,
    ))
    steps += [Zero3Step(f"block {i} backward", k_bwd * block_flops, block_gather, block_reduce)
              for i in reversed(range(layers))]
    steps.append(Zero3Step("embedding backward", 0, 0, 0 if lora else 4 * embedding_unit))
    return steps


def zero3_step_s(
    steps: list[Zero3Step], tokens: int, rate: float, n: int, gbit: float
) -> tuple[float, float, float]:
    """(communication, step without overlap, step with overlap) in seconds. Overlap: while step
    ``k`` computes, the gather of step ``k+1`` and the reduce-scatter of step ``k-1``'s gradient
    run on the network (at most two units gathered at once), so
    ``step = gather_0 + sum_k max(compute_k, gather_(k+1) + reduce_(k-1)) + reduce_last``."""
    c = [s.flops_per_token * tokens / rate for s in steps]
    g = [collective_s(s.gather_bytes, n, gbit) for s in steps] + [0.0]
    r = [0.0] + [collective_s(s.reduce_bytes, n, gbit) for s in steps]
    comm = sum(g) + sum(r)
    overlap = g[0] + sum(max(c[k], g[k + 1] + r[k]) for k in range(len(steps))) + r[-1]
    return comm, sum(c) + comm, overlap


def zero3_bytes(steps: list[Zero3Step]) -> float:
    return sum(s.gather_bytes + s.reduce_bytes for s in steps)


def zero3_table(title: str, shape: Shape, seq: int, tokens: int, lora: bool,
                rate: float) -> str:
    """One row per N; per network: ZeRO-3's communication, its step without and with overlap
    (efficiency), and the overlapped step against DDP's overlapped step on the same network."""
    steps = zero3_steps(shape, seq, lora)
    elements = shape.lora_parameters(LORA_RANK) if lora else shape.parameters()
    ddp_bytes = 4 * elements * 2
    t_compute = shape.flops_per_token(seq, lora) * tokens / rate
    t_bwd = (0.5 if lora else 2 / 3) * t_compute
    head = " | ".join(f"{g} Gbit/s: comm / no overlap / overlap (× DDP)" for g in NETWORKS_GBIT)
    gathers = sum(1 for s in steps if s.gather_bytes)
    reduces = sum(1 for s in steps if s.reduce_bytes)
    lines = [
        f"**{title}**: {gathers} all-gathers and {reduces} reduce-scatters per step, "
        f"{zero3_bytes(steps) / GB:,.2f} GB sent through the collectives per step against "
        f"DDP's all-reduce of {ddp_bytes / GB:,.3g} GB ({zero3_bytes(steps) / ddp_bytes:.3g}×), "
        f"compute {t_compute:.3g} s per rank per step. Cells: seconds (efficiency); × DDP: the "
        "overlapped step against DDP's overlapped step.",
        "",
        f"| N | {head} |",
        "|---|" + "---|" * len(NETWORKS_GBIT),
    ]
    for n in RANKS:
        cells = []
        for gbit in NETWORKS_GBIT:
            comm, plain, over = zero3_step_s(steps, tokens, rate, n, gbit)
            ddp = t_compute - t_bwd + max(t_bwd, comm_s(elements, n, gbit))
            cells.append(
                f"{comm:.3g} / {plain:.3g} ({100 * t_compute / plain:.0f} %) / "
                f"{over:.3g} ({100 * t_compute / over:.0f} %, {over / ddp:.2f}×)"
            )
        lines.append(f"| {n} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def block_values_bytes(shape: Shape, tokens: int) -> float:
    """The float32 values one block keeps for its backward (all of them while its replay runs),
    ``tokens * (6 d_model + 2 d_kv + 3 d_ff + n_heads + 2)``: its two normed inputs, q, k, v,
    the attention output and its logsumexp per head, the residual, gate, up and their SwiGLU
    product, its output, and each RMSNorm's reciprocal RMS per token."""
    d = shape.d_model
    return 4.0 * tokens * (6 * d + 2 * shape.d_kv + 3 * shape.d_ff + shape.n_heads + 2)


def activation_bytes(shape: Shape, tokens: int) -> float:
    """Peak activation bytes of one rank's ``tokens`` under ``block`` checkpointing, float32:
    the ``n_layers`` kept block inputs and the final hidden state, ``(L + 1) * tokens * d_model``;
    one block's values during its replay (``block_values_bytes``); the VJP's two d_ff-wide
    gradients, ``2 * tokens * d_ff``. The loss's workspace (``LOSS_WORKSPACE_BYTES``) comes on
    top."""
    kept = 4.0 * (shape.n_layers + 1) * tokens * shape.d_model
    return kept + block_values_bytes(shape, tokens) + 4.0 * 2 * tokens * shape.d_ff


def gathered_unit_bytes(shape: Shape, lora: bool) -> float:
    """ZeRO-3's unsharded buffers at their peak: two units' parameters (the largest unit and a
    block, in their storage) and the same two units' unsharded gradients (float32; LoRA: the
    adapters'), before the reduce-scatter."""
    p_bytes = 2 if lora else 4
    lora_block = shape.lora_block_parameters(LORA_RANK) if lora else 0
    big = max(shape.embedding_parameters() + shape.d_model, shape.block_parameters())
    params = p_bytes * (big + shape.block_parameters()) + 4 * lora_block
    grads = 4 * lora_block if lora else 4 * (big + shape.block_parameters())
    return float(params + grads)


def memory_per_rank(shape: Shape, zero: int, n: int, lora: bool,
                    tokens: int = MEMORY_TOKENS) -> float:
    """Bytes per rank: ZeRO ``zero`` over ``n`` ranks (the paper's accounting: weights, gradients
    and Adam's two moments in float32, 4 + 4 + 8 bytes per trainable parameter; a LoRA base in
    bfloat16, 2 bytes per parameter, sharded only by ZeRO-3), ZeRO-3's gathered units,
    ``activation_bytes`` and the loss's workspace."""
    if lora:
        base, trainable = 2.0 * shape.parameters(), shape.lora_parameters(LORA_RANK)
    else:
        base, trainable = 0.0, shape.parameters()
    w, g, adam = 4.0 * trainable, 4.0 * trainable, 8.0 * trainable
    states = {
        0: base + w + g + adam,
        1: base + w + g + adam / n,
        2: base + w + g / n + adam / n,
        3: (base + w + g + adam) / n,
    }[zero]
    gathered = gathered_unit_bytes(shape, lora) if zero == 3 and n > 1 else 0.0
    return states + gathered + activation_bytes(shape, tokens) + LOSS_WORKSPACE_BYTES


def llama3_family(s: float) -> Shape:
    """A Llama-3-shaped model at position ``s``: ``s = 0..4`` are the published shapes (1B, 3B,
    8B, 70B, 405B); between two of them d_model and d_ff are interpolated geometrically
    (rounded to multiples of 128 and 256), n_layers linearly, with 128-wide heads, 8 KV heads
    and tied embeddings below d_model 4096; beyond 4, 405B's width made deeper
    (``126 * (s - 3)`` layers)."""
    last = len(LLAMA3) - 1
    if s >= last:
        top = LLAMA3[-1]
        layers = round(top.n_layers * (1 + s - last))
        if layers == top.n_layers:
            return top
        return Shape(f"405B width, {layers} layers", top.vocab, top.d_model, top.d_ff, layers,
                     top.n_heads, top.n_kv_heads, top.tied)
    i = int(s)
    a, b = LLAMA3[i], LLAMA3[i + 1]
    f = s - i
    if f == 0:
        return a
    d = 128 * round(a.d_model * (b.d_model / a.d_model) ** f / 128)
    d_ff = 256 * round(a.d_ff * (b.d_ff / a.d_ff) ** f / 256)
    layers = round(a.n_layers + f * (b.n_layers - a.n_layers))
    return Shape(f"d_model {d}, {layers} layers", a.vocab, d, d_ff, layers, d // 128, 8,
                 tied=d < 4096)


FAMILY = [llama3_family(i / 100) for i in range(0, 100 * 20 + 1)]


def largest_fitting(zero: int, n: int, lora: bool) -> Shape | None:
    """The family member with the most parameters whose per-rank memory fits ``DEVICE_BYTES``
    (None: not even the 1B shape)."""
    fits = [s for s in FAMILY if memory_per_rank(s, zero, n, lora) <= DEVICE_BYTES]
    return max(fits, key=lambda s: s.parameters()) if fits else None


def largest_model_table() -> str:
    lines = [
        "| N | " + " | ".join(f"{mode}, ZeRO {z}" for mode in ("full", "LoRA") for z in range(4))
        + " |",
        "|---|" + "---|" * 8,
    ]
    for n in RANKS:
        cells = []
        for lora in (False, True):
            for zero in range(4):
                shape = largest_fitting(zero, n, lora)
                if shape is None:
                    cells.append("–")
                    continue
                beyond = " (the scan's end)" if shape is FAMILY[-1] else ""
                cells.append(f"{shape.parameters() / 1e9:.1f}B ({shape.d_model} × "
                             f"{shape.n_layers}){beyond}")
        lines.append(f"| {n} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def published_shapes_table() -> str:
    lines = [
        "| shape | parameters | " + " | ".join(
            f"{mode}, ZeRO {z}" for mode in ("full", "LoRA") for z in range(4)) + " |",
        "|---|---:|" + "---|" * 8,
    ]
    for shape in LLAMA3:
        cells = []
        for lora in (False, True):
            for zero in range(4):
                fit = [n for n in MEMORY_RANKS
                       if memory_per_rank(shape, zero, n, lora) <= DEVICE_BYTES]
                cells.append(f"{fit[0]} ({memory_per_rank(shape, zero, fit[0], lora) / GB:.1f})"
                             if fit else "–")
        lines.append(f"| {shape.name} | {shape.parameters() / 1e9:.2f}B | "
                     + " | ".join(cells) + " |")
    return "\n".join(lines)


def memory_table(shape: Shape) -> str:
    p = shape.parameters()
    w, g, adam = 4 * p, 4 * p, 8 * p
    lines = [
        f"**Per-rank memory of the {shape.name}, float32, {p:,} parameters** (GB = 1e9 bytes; "
        "activations and workspace not included).",
        "",
        "| N | ZeRO 0 | ZeRO 1 (paper) | ZeRO 2 (paper) | ZeRO 1, riftco today | "
        "ZeRO 2, riftco today | ZeRO 3 (paper) | ZeRO 3, with two gathered units |",
        "|---|---|---|---|---|---|---|---|",
    ]
    units = gathered_unit_bytes(shape, lora=False)
    for n in (1, 2, 4, 8, 16, 32, 64):
        z0 = w + g + adam
        z1 = w + g + adam / n
        z2 = w + g / n + adam / n
        # riftco: the shard's own values add P/N parameter bytes; ZeRO 2 reduce-scatters each
        # bucket as the backward pass completes it, so a rank holds its 1/N of the gradients
        # (plus the buckets being filled: 25 MiB each, left out here).
        r1 = w + w / n + g + adam / n
        r2 = w + w / n + g / n + adam / n
        z3 = (w + g + adam) / n
        z3_units = z3 + (units if n > 1 else 0)
        lines.append(
            f"| {n} | {z0 / GB:.1f} | {z1 / GB:.1f} | {z2 / GB:.1f} | {r1 / GB:.1f} | "
            f"{r2 / GB:.1f} | {z3 / GB:.1f} | {z3_units / GB:.1f} |"
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

    print("### ZeRO-3, Llama-3.2-1B shape, 8 x 2048 tokens per rank per step\n")
    print("- per unit (the embedding, each block, the untied head): a ring all-gather of its "
          "parameters before its forward and again before its backward, a ring reduce-scatter "
          "of its gradient after; (N-1)/N * bytes / bandwidth + (N-1) * latency each")
    print("- no overlap: step = compute + every collective; overlap (prefetch of the next "
          "unit, at most two gathered): step = first gather + sum over units of "
          "max(compute, next gather + previous reduce-scatter) + last reduce-scatter")
    print("- compute as in the DDP tables (no replay: under `block` the replay adds a forward "
          "to each block's backward, more time to hide the gathers behind)")
    print()
    for stage, lora in (("full training", False), ("LoRA r=8, bfloat16 base", True)):
        print(zero3_table(f"1B shape, ZeRO-3, {stage}, at an assumed "
                          f"{ASSUMED_FLOPS / 1e12:g} TFLOP/s per rank", LLAMA_1B, 2048,
                          tokens_1b, lora, ASSUMED_FLOPS))
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
        "ZeRO 3 (paper)": 16 / n,
    }
    print(f"Largest model whose float32 weights, gradients and Adam moments fit "
          f"{device_bytes / GB:.0f} GB per rank at N={n}, before activations: "
          + ", ".join(f"{k} {device_bytes / b / 1e9:.1f}B parameters ({b:.2f} bytes/parameter)"
                      for k, b in per_param.items())
          + ". ZeRO-3 adds its gathered units, and every stage the activations: below.")

    print(f"\n### Largest model per rank at {DEVICE_BYTES / GB:.0f} GB\n")
    print(f"- per rank: 1 x {MEMORY_TOKENS} tokens, `block` checkpointing, float32 "
          "activations: the kept block inputs and the final hidden state, one block's values "
          "during its replay and its VJP's two d_ff-wide gradients "
          f"({activation_bytes(LLAMA_1B, 1024) / MIB:.1f} MiB for the 1B shape at 1 x 1024 "
          "tokens), plus the loss's workspace "
          f"({LOSS_WORKSPACE_BYTES / MIB:.0f} MiB: a 64 MiB logits chunk, an 8 MiB upcast block "
          "of the head)")
    print("- full training: float32 weights, gradients and Adam's two moments (16 bytes per "
          "parameter), ZeRO 1/2 as in the paper (riftco today adds its shard's copy, 4/N); "
          "LoRA r=8 on the seven projections: a bfloat16 base (2 bytes per parameter, sharded "
          "by ZeRO-3 only) and float32 adapters with Adam")
    print("- ZeRO-3: every state / N, plus two units' gathered parameters and unsharded "
          "gradients (the largest unit and a block)")
    print("- left out: DDP's and ZeRO-2's 25 MiB buckets in flight, allocator fragmentation, "
          "the framework's own memory")
    print("- family: the published Llama 3 shapes (1B, 3B, 8B, 70B, 405B) and between two of "
          "them d_model and d_ff interpolated geometrically, n_layers linearly (128-wide heads, "
          "8 KV heads, tied below d_model 4096); past 405B, its width made deeper. Cells: the "
          "most parameters that fit (d_model × n_layers)")
    print()
    print(largest_model_table())
    print()
    print("Smallest N (of 1, 2, 4, ..., 64) at which each published shape fits, and its "
          "per-rank GB there; – where 64 ranks are not enough:")
    print()
    print(published_shapes_table())
    args.out.write_text("\n".join(lines).rstrip() + "\n")
    builtins.print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
