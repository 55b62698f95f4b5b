"""ZeRO-3 against ZeRO-2 over MPI, measured: per-rank memory peak, step time, exposed
communication, and a picture of the per-rank memory over one ZeRO-3 step.

The issue's targets (Llama-3.2-1B's shape, N = 2 ranks x 1 kernel thread, LoRA r=8 on all seven
projections, bfloat16 frozen base, ``block`` checkpointing, 1 x 1024 tokens per rank): per-rank
total peak of ZeRO-3 <= 0.6x ZeRO-2's, step <= 1.15x ZeRO-2's on the same run.

Each case is one job ``mpiexec -n 2 python benches/zero3.py --worker SPEC`` (the venv's
``mpiexec``, ``RIFTCO_NUM_THREADS=1`` per rank). What a rank runs (its own loop, not
``run_post_training``, so that the phases can be timed):

- the model: ``riftco.load_model(folder, dtype="bfloat16", activation_checkpointing="block")``
  of a bfloat16 Hugging Face folder of Llama-3.2-1B's shape (``--folder``; written first from
  riftco's seeded random weights when it holds no ``model.safetensors``), or for ``--quick`` a
  tiny random shape built in memory with ``set_frozen_weights_dtype("bfloat16")``; then
  ``enable_lora(rank=8, alpha=16, mlp=True)``;
- the optimizer: ``DistributedOptimizer(group, model.parameters(), Adam(lr=1e-4), zero=Z,
  model=model if Z == 3)``;
- the data: synthetic token ids (``numpy.random.default_rng(0)``, uniform over the vocabulary;
  no tokenizer, no model hub), a global block ``[2, seq + 1]``, one row per rank
  (``ProcessGroup.rows``);
- a step, as the training loop's data-parallel rank runs it: ``loss = model.loss(rows)``;
  ``optimizer.backward(loss)`` (ZeRO-2 reduce-scatters each gradient bucket during the pass,
  ZeRO-3 each unit); the global mean loss (``group.sum``); ``optimizer.step()``;
  ``optimizer.zero_grad()``.

Measured per step and rank: wall seconds (``time.perf_counter``; the job's step is the largest
over the ranks, they meet in the collectives), the end of the forward pass and of the backward
pass, ``riftco.memory_stats()`` peaks after ``reset_peak_memory_stats()`` at the step's start
(so a peak is the highest bytes in use during the step, the resident weights included; the
total is the peak of the sum of the categories), seconds in collectives
(``ProcessGroup.communication_s``: blocking reduce-scatters and sums, and the waits on
all-gathers), and for ZeRO-3 the exposed communication (``ShardedParameters.exposed_s``: waits
on all-gathers not finished when the model asked for the unit), the all-gathers started and the
owner's ``trace`` (memory in use after every gather start, gather ready and release). NumPy
buffers (the all-gather receive buffers, ZeRO-2's gradient staging) are not in the native
counters. The first ``--warmup`` steps are dropped; per job the median of the rest is kept.

Repeats are interleaved: every repeat runs both stages, ZeRO-2 first in even repeats and ZeRO-3
first in odd ones. The table gives the median over repeats of the job's step and the largest
peak over ranks and repeats; the step ratio is the median over repeats of ZeRO-3's step over
ZeRO-2's of the same repeat.

    python benches/zero3.py --folder /path/to/llama-bf16     # Llama-3.2-1B shape (~30 min, 2 cores)
    python benches/zero3.py --quick --out /tmp/z3           # tiny shape (seconds; the test)

ZeRO-3 runs under a gather budget (``--gather-budget``; 256 MiB for the Llama shape: two blocks
fit, the tied embedding is given to the model by slices of 64 MiB). Writes ``--out``/zero3.json,
zero3.md and zero3_memory.png (``--stem`` names them; ``zero3_quick.*`` for ``--quick``;
the picture needs matplotlib, skipped with the reason otherwise). Skips, with the reason
printed, when mpi4py or ``mpiexec`` is missing (``pip install 'riftco[mpi]'``).
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

# ZeRO-3's gather budget for the Llama shape: two blocks (122 MiB each in bfloat16) fit, the
# tied embedding (501 MiB) does not and is given by slices of 64 MiB.
DEFAULT_GATHER_BUDGET = 256 * 2**20

LLAMA = dict(
    vocab_size=128256, d_model=2048, n_heads=32, n_kv_heads=8, n_layers=16, d_ff=8192,
    max_seq_len=2048, rope_theta=5e5, tie_word_embeddings=True,
)
# Blocks outweigh the embedding (as in Llama-3.2-1B, where they are 79 % of the weights), and
# 8 of them: with 2 ranks ZeRO-3 keeps 1/2 of the weights plus at most 2 gathered units.
QUICK = dict(
    vocab_size=256, d_model=64, n_heads=4, n_kv_heads=2, n_layers=8, d_ff=256,
    max_seq_len=64, rope_theta=1e4, tie_word_embeddings=True,
)
CATEGORIES = ("parameter", "gradient", "optimizer_state", "activation", "workspace", "total")
STATE = ("parameter", "gradient", "optimizer_state")
LORA_RANK, LORA_ALPHA = 8, 16.0
PEAK_TARGET, STEP_TARGET = 0.6, 1.15
MIB = 1024.0 * 1024.0


# -- the worker: one rank of one job ---------------------------------------------------------


def process_memory() -> dict[str, int]:
    """The process's resident bytes now (``VmRSS``) and at most so far (``VmHWM``), from
    ``/proc/self/status`` (Linux; empty elsewhere)."""
    out: dict[str, int] = {}
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                out[key] = int(value.split()[0]) * 1024
    except OSError:
        pass
    return out


def build_model(spec: dict[str, Any]) -> Any:
    import riftco

    if spec["folder"]:
        model = riftco.load_model(
            Path(spec["folder"]), dtype="bfloat16", activation_checkpointing="block"
        )
    else:
        model = riftco.DecoderOnlyTransformer(
            riftco.TransformerConfig(**spec["model"], seed=0), activation_checkpointing="block"
        )
        model.enable_lora(rank=LORA_RANK, alpha=LORA_ALPHA, mlp=True)
        model.set_frozen_weights_dtype("bfloat16")
        return model
    model.enable_lora(rank=LORA_RANK, alpha=LORA_ALPHA, mlp=True)
    return model


def worker(spec: dict[str, Any]) -> None:
    import riftco
    from riftco.training import distributed

    group = distributed.init(timeout_s=spec["timeout_s"])
    zero = spec["zero"]
    riftco.reset_peak_memory_stats()
    t0 = time.perf_counter()
    model = build_model(spec)
    built = riftco.memory_stats()
    opt = distributed.DistributedOptimizer(
        group, model.parameters(), lambda ps: riftco.Adam(ps, lr=1e-4), zero=zero,
        model=model if zero == 3 else None,
        max_gathered_bytes=spec["gather_budget"] if zero == 3 else None,
    )
    setup_s = time.perf_counter() - t0
    sharded = opt.sharded
    # The frozen parts a ZeRO-3 rank keeps (counted as parameter).
    frozen_shard_bytes = 0 if sharded is None else sum(
        4 * int(np.prod(u.frozen_shard.shape))
        for u in sharded.units.values()
        if u.frozen_shard is not None
    )
    load_peak = int(built["total"]["peak_bytes"])
    vocab = model.config.vocab_size
    block = np.random.default_rng(0).integers(
        0, vocab, size=(group.world_size, spec["seq_len"] + 1), dtype=np.int64
    )
    rows = group.rows(block)
    steps: list[dict[str, Any]] = []
    trace: list[tuple[float, str, str, int]] = []
    for s in range(spec["warmup"] + spec["steps"]):
        last = s == spec["warmup"] + spec["steps"] - 1
        if sharded is not None:
            sharded.reset_counters()
            trace.clear()
            sharded.trace = trace if last else None
        group.barrier()  # both ranks start the step together
        comm0 = group.communication_s
        riftco.reset_peak_memory_stats()
        at_start = riftco.memory_stats()
        resident = int(at_start["total"]["current_bytes"])
        start = time.perf_counter()
        loss = model.loss(rows)
        forward_end = time.perf_counter()
        mem_forward_end = int(riftco.memory_stats()["total"]["current_bytes"])
        opt.backward(loss)
        backward_end = time.perf_counter()
        mem_backward_end = int(riftco.memory_stats()["total"]["current_bytes"])
        local = float(loss.item())
        del loss
        (global_sum,) = group.sum([local])
        opt.step()
        opt.zero_grad()
        end = time.perf_counter()
        stats = riftco.memory_stats()
        breakdown = riftco.peak_memory_breakdown()
        record: dict[str, Any] = {
            "step_s": end - start,
            "forward_s": forward_end - start,
            "backward_s": backward_end - forward_end,
            "loss": global_sum / group.world_size,
            "communication_s": group.communication_s - comm0,
            "peak_bytes": {c: int(stats[c]["peak_bytes"]) for c in CATEGORIES},
            "at_total_peak_bytes": {c: int(breakdown[c]) for c in CATEGORIES if c != "total"},
            "resident_bytes": resident,
            "resident_by_category": {c: int(at_start[c]["current_bytes"]) for c in CATEGORIES},
            "forward_end_bytes": mem_forward_end,
            "backward_end_bytes": mem_backward_end,
            "end_bytes": int(stats["total"]["current_bytes"]),
            # Outside the counters: freed buffers the pool keeps, the process's resident set.
            "pool_cached_bytes": int(riftco.cached_bytes()),
            "process": process_memory(),
        }
        if sharded is not None:
            record["exposed_s"] = sharded.exposed_s
            record["gathers"] = sharded.gathers
        if last:
            record["phases"] = {"start": 0.0, "forward_end": forward_end - start,
                                "backward_end": backward_end - start, "end": end - start}
            if sharded is not None:
                record["trace"] = [(t - start, e, u, b) for t, e, u, b in trace]
        steps.append(record)
        print(f"rank {group.rank} zero {zero} step {s}: {record['step_s']:.2f} s, "
              f"loss {record['loss']:.5f}", file=sys.stderr, flush=True)
    out = {
        "rank": group.rank, "world_size": group.world_size, "zero": zero,
        "num_threads": riftco.num_threads(), "simd": riftco.simd_level(),
        "frozen_weights_dtype": model.frozen_weights_dtype,
        "activation_checkpointing": model.activation_checkpointing,
        "setup_s": setup_s, "load_peak_bytes": load_peak,
        "frozen_shard_bytes": frozen_shard_bytes,
        "trainable_elements": sum(int(np.prod(p.shape)) for p in model.parameters()),
        "gathered_peak_units": sharded.gathered_peak if sharded is not None else 0,
        "units": len(sharded.units) if sharded is not None else 0,
        "steps": steps,
    }
    if sharded is not None:
        out["unit_message_bytes"] = {u: x.message_bytes for u, x in sharded.units.items()}
        out["sliced_tables"] = sharded.sliced
    Path(spec["out"], f"rank{group.rank}.json").write_text(json.dumps(out))


# -- the driver ------------------------------------------------------------------------------


def find_mpiexec() -> str | None:
    local = Path(sys.executable).parent / "mpiexec"
    return str(local) if local.exists() else shutil.which("mpiexec")


def run_case(mpiexec: str, spec: dict[str, Any], ranks: int, timeout_s: float) -> list[dict[str, Any]]:
    with tempfile.TemporaryDirectory(prefix="riftco-zero3-") as tmp:
        spec = dict(spec, out=tmp)
        env = dict(os.environ, RIFTCO_NUM_THREADS="1", OMP_NUM_THREADS="1")
        cmd = [mpiexec, "-n", str(ranks), sys.executable, __file__, "--worker", json.dumps(spec)]
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout_s)
        sys.stderr.write(done.stderr)
        if done.returncode != 0:
            raise RuntimeError(
                f"{' '.join(cmd[:4])} ... (zero={spec['zero']}) failed ({done.returncode}):\n"
                f"{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
            )
        return [json.loads((Path(tmp) / f"rank{r}.json").read_text()) for r in range(ranks)]


def summarise(ranks: list[dict[str, Any]], warmup: int) -> dict[str, Any]:
    """One job: the median over its timed steps of the job's step (largest over ranks), the
    largest peaks over ranks and timed steps."""
    timed = [list(step) for step in zip(*(r["steps"] for r in ranks))][warmup:]
    job = [max(s["step_s"] for s in per_rank) for per_rank in timed]
    out: dict[str, Any] = {
        "step_s": statistics.median(job),
        "step_s_all": job,
        "forward_s": statistics.median(max(s["forward_s"] for s in p) for p in timed),
        "backward_s": statistics.median(max(s["backward_s"] for s in p) for p in timed),
        "communication_s": statistics.median(max(s["communication_s"] for s in p) for p in timed),
        "peak_bytes": {c: max(s["peak_bytes"][c] for p in timed for s in p) for c in CATEGORIES},
        "resident_bytes": max(s["resident_bytes"] for p in timed for s in p),
        "pool_cached_bytes": max(s.get("pool_cached_bytes", 0) for p in timed for s in p),
        "vm_rss_bytes": max(s.get("process", {}).get("VmRSS", 0) for p in timed for s in p),
        "vm_hwm_bytes": max(s.get("process", {}).get("VmHWM", 0) for p in timed for s in p),
        "load_peak_bytes": max(r["load_peak_bytes"] for r in ranks),
        "setup_s": max(r["setup_s"] for r in ranks),
        "losses": [s["loss"] for s in ranks[0]["steps"]],
    }
    # parameter + gradient + optimizer_state: the sum of each category's own peak in a step
    # (ZeRO-3's frozen parts are counted as parameter).
    out["frozen_shard_bytes"] = max(r["frozen_shard_bytes"] for r in ranks)
    out["parameter_peak_bytes"] = max(s["peak_bytes"]["parameter"] for p in timed for s in p)
    out["state_peak_bytes"] = max(
        sum(s["peak_bytes"][c] for c in STATE) for p in timed for s in p
    )
    out["at_total_peak_bytes"] = max(
        (s["at_total_peak_bytes"] for p in timed for s in p), key=lambda a: sum(a.values())
    )
    if "exposed_s" in timed[0][0]:
        shares = [max(s["exposed_s"] for s in p) / max(s["step_s"] for s in p) for p in timed]
        out["exposed_s"] = statistics.median(max(s["exposed_s"] for s in p) for p in timed)
        out["exposed_share"] = statistics.median(shares)
        out["gathers_per_step"] = timed[0][0]["gathers"]
        out["gathered_peak_units"] = max(r["gathered_peak_units"] for r in ranks)
        out["units"] = ranks[0]["units"]
    out["communication_share"] = out["communication_s"] / out["step_s"]
    return out


def host() -> dict[str, Any]:
    """``data_parallel.host()`` (CPU, SIMD, cores, date, Python) and the load at the end."""
    from data_parallel import host as machine

    try:
        load = os.getloadavg()[0]
    except OSError:
        load = -1.0
    return {**machine(), "load_1min_at_end": load}


def budget_text(budget: int | None) -> str:
    return "none" if budget is None else f"{budget / MIB:.0f} MiB"


def markdown(result: dict[str, Any]) -> str:
    h = result["host"]
    rows = result["rows"]
    lines = [
        f"{result['shape_name']}, {result['ranks']} ranks x 1 kernel thread (riftco SIMD "
        f"{result['riftco_simd']}), {h['cpu']}, {h['cores']} cores ({h['simd']}), shared host; "
        f"{h['date']}. LoRA r={LORA_RANK} on all seven projections, bfloat16 frozen base, "
        f"`block` checkpointing, 1 x {result['seq_len']} synthetic tokens per rank; "
        f"{result['warmup']} warm-up step dropped, {result['steps']} timed steps per job, "
        f"{result['repeats']} interleaved repeats. Memory in MiB per rank (largest over ranks, "
        "steps and repeats); step = slowest rank, median.",
        "",
        "| ZeRO | step (s) | forward (s) | backward (s) | in collectives (s) | exposed gathers (s) "
        "| total peak | parameter | gradient | optimizer_state | param+grad+opt | activation "
        "| resident at step start |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        p = row["peak_bytes"]
        exposed = f"{row['exposed_s']:.2f} ({100 * row['exposed_share']:.1f} %)" \
            if "exposed_s" in row else "-"
        lines.append(
            f"| {row['zero']} | {row['step_s']:.2f} | {row['forward_s']:.2f} | "
            f"{row['backward_s']:.2f} | {row['communication_s']:.2f} "
            f"({100 * row['communication_share']:.1f} %) | {exposed} | "
            f"{p['total'] / MIB:.1f} | {row['parameter_peak_bytes'] / MIB:.1f} | "
            f"{p['gradient'] / MIB:.1f} | "
            f"{p['optimizer_state'] / MIB:.1f} | {row['state_peak_bytes'] / MIB:.1f} | "
            f"{p['activation'] / MIB:.1f} | {row['resident_bytes'] / MIB:.1f} |"
        )
    lines.append("")
    for t in result["targets"]:
        lines.append(f"- {t['what']}: {t['value']:.3f} (target <= {t['bound']}: "
                     f"{'met' if t['met'] else 'NOT met'})")
    z3 = next(r for r in rows if r["zero"] == 3)
    lines += [
        f"- parameter: ZeRO-3's frozen parts ({z3['frozen_shard_bytes'] / MIB:.1f} MiB per rank, "
        "kept between uses, a unit's freed while it is gathered) are counted there.",
        "- Outside the counters (largest over ranks): "
        + "; ".join(
            f"ZeRO-{r['zero']} process resident set {r['vm_rss_bytes'] / MIB:.0f} MiB at a "
            f"step's end (high-water mark {r['vm_hwm_bytes'] / MIB:.0f} MiB, the load "
            f"included), buffer pool {r['pool_cached_bytes'] / MIB:.0f} MiB; counters' peak "
            f"while loading {r['load_peak_bytes'] / MIB:.0f} MiB"
            for r in rows
        )
        + ".",
        f"- ZeRO-3: {z3['gathers_per_step']} all-gathers per step over {z3['units']} units, "
        f"at most {z3['gathered_peak_units']} units gathered or in flight at once.",
        f"- ZeRO-3 gather budget: {budget_text(result['gather_budget_bytes'])}; tables given "
        f"by slices of rows: {z3['sliced_tables'] or 'none'}.",
        f"- Losses bitwise equal between the stages in every repeat: {result['losses_equal']}; "
        f"largest relative difference {result['loss_max_relative_difference']:.2e} (a table "
        "given by slices combines the loss's logsumexp slice by slice).",
        "",
    ]
    return "\n".join(lines)


def last_steps(ranks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each rank's last step (the one with phases, and for ZeRO-3 the owner's trace), without
    the per-category records the table already has."""
    keep = ("phases", "trace", "resident_bytes", "forward_end_bytes", "backward_end_bytes",
            "end_bytes", "peak_bytes", "step_s")
    return [{k: r["steps"][-1][k] for k in keep if k in r["steps"][-1]} for r in ranks]


def picture(result: dict[str, Any], path: Path) -> str | None:
    """Per-rank memory over the last ZeRO-3 step (``result["memory_over_step"]``: the owner's
    trace), with ZeRO-2's resident level and step peak."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        return f"no picture: {e} (pip install matplotlib)"
    z3_ranks = result["memory_over_step"]["zero3"]
    z2 = result["memory_over_step"]["zero2"][0]
    fig, ax = plt.subplots(figsize=(11, 5.8))
    colors = ["tab:blue", "tab:orange", "tab:green", "tab:red"]
    ph = z3_ranks[0]["phases"]
    for r, step in enumerate(z3_ranks):
        p = step["phases"]
        pts = [(0.0, step["resident_bytes"])]
        pts += [(t, b) for t, _, _, b in step["trace"]]
        pts += [(p["forward_end"], step["forward_end_bytes"]),
                (p["backward_end"], step["backward_end_bytes"]), (p["end"], step["end_bytes"])]
        pts.sort()
        ax.step([t for t, _ in pts], [b / MIB for _, b in pts], where="post", color=colors[r],
                lw=1.4, alpha=0.9, label=f"ZeRO-3 rank {r}: in use after each gather start, "
                "unit ready (^), release (v)")
        for t, e, _, b in step["trace"]:
            if e in ("ready", "release"):
                ax.plot(t, b / MIB, "^" if e == "ready" else "v", color=colors[r], ms=3.5)
    peak3 = max(step["peak_bytes"]["total"] for step in z3_ranks)
    ax.axhline(peak3 / MIB, color="tab:red", ls=":", lw=1.2,
               label=f"ZeRO-3 step peak {peak3 / MIB:.1f} MiB (reached between the events "
               "sampled: activations)")
    ax.axhline(z2["peak_bytes"]["total"] / MIB, color="black", ls="--", lw=1.2,
               label=f"ZeRO-2 step peak {z2['peak_bytes']['total'] / MIB:.1f} MiB")
    ax.axhline(z2["resident_bytes"] / MIB, color="gray", ls="-.", lw=1.2,
               label=f"ZeRO-2 resident at step start {z2['resident_bytes'] / MIB:.1f} MiB")
    ymax = max(z2["peak_bytes"]["total"], peak3) / MIB
    # The forward's last release is the last block's (or the final norm's): what follows, up to
    # the forward's end, is the LM head and the loss on the tied embedding, gathered.
    releases = [t for t, e, _, _ in z3_ranks[0]["trace"] if e == "release" and t < ph["forward_end"]]
    sliced = result["rows"][1].get("sliced_tables")
    head = "LM head + loss\n(embedding by slices)" if sliced else "LM head + loss\n(embedding gathered)"
    spans = [("forward: blocks", "start", None), (head, None, "forward_end"),
             ("backward: each block gathered again for its replay", "forward_end", "backward_end"),
             ("loss sum,\nAdam", "backward_end", "end")]
    head_start = max(releases) if releases else ph["forward_end"]
    for i, (name, a, b) in enumerate(spans):
        x0 = ph[a] if a else head_start
        x1 = ph[b] if b else head_start
        ax.axvspan(x0, x1, alpha=(0.04, 0.1, 0.16, 0.25)[i], color="gray", lw=0)
        ax.text((x0 + x1) / 2, ymax * (1.02 + 0.08 * (i % 2)), name, ha="center", va="bottom",
                fontsize=8.5)
    ax.set_ylim(0, ymax * 1.24)
    ax.set_xlabel("seconds since the step's start (rank 0's phases shaded)")
    ax.set_ylabel("MiB in use per rank (riftco.memory_stats() total)")
    ax.set_title(f"Per-rank memory over one ZeRO-3 step: {result['shape_name']}, "
                 f"{result['ranks']} ranks x 1 thread, LoRA r=8, bf16 base, block, "
                 f"1 x {result['seq_len']} tokens per rank", fontsize=10)
    ax.legend(loc="lower center", fontsize=7.5)
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)
    return None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--folder", type=Path, default=None,
                    help="bfloat16 folder of Llama-3.2-1B's shape (written when it holds no "
                    "model.safetensors; default: a temporary folder)")
    ap.add_argument("--seq", type=int, default=1024, help="tokens per rank")
    ap.add_argument("--steps", type=int, default=2, help="timed steps per job")
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=3600.0, help="seconds per job")
    ap.add_argument("--quick", action="store_true", help="tiny shape, 32 tokens (smoke test)")
    ap.add_argument("--stem", default=None,
                    help="the output files' name (default zero3, zero3_quick for --quick)")
    ap.add_argument("--gather-budget", type=int, default=None, metavar="BYTES",
                    help="ZeRO-3's max_gathered_bytes (0: none; default 256 MiB for the "
                    "Llama shape, none for --quick)")
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    ap.add_argument("--plot", type=Path, default=None,
                    help="only draw the picture of a zero3 JSON written before (beside it)")
    args = ap.parse_args(argv)
    if args.worker:
        worker(json.loads(args.worker))
        return 0
    if args.plot is not None:
        why = picture(json.loads(args.plot.read_text()),
                      args.plot.with_name(args.plot.stem + "_memory.png"))
        print(why or f"wrote {args.plot.with_name(args.plot.stem + '_memory.png')}")
        return 0
    if importlib.util.find_spec("mpi4py") is None:
        print("skipped: mpi4py is not installed (pip install 'riftco[mpi]')")
        return 0
    mpiexec = find_mpiexec()
    if mpiexec is None:
        print("skipped: no mpiexec beside this Python or on PATH (pip install 'riftco[mpi]')")
        return 0
    import riftco

    tmp = tempfile.TemporaryDirectory(prefix="riftco-zero3-folder-")
    if args.quick:
        args.seq = 32
        folder, shape, name = None, QUICK, "tiny shape (quick)"
    else:
        folder = args.folder or Path(tmp.name) / "llama-bf16"
        shape, name = LLAMA, "Llama-3.2-1B shape"
        if not (folder / "model.safetensors").is_file():
            t0 = time.perf_counter()
            model = riftco.DecoderOnlyTransformer(riftco.TransformerConfig(**LLAMA, seed=0))
            folder.mkdir(parents=True, exist_ok=True)
            model.save(folder / "model.safetensors", dtype="bfloat16")
            del model
            print(f"wrote {folder} in {time.perf_counter() - t0:.0f} s", flush=True)
    budget = args.gather_budget
    if budget is None and not args.quick:
        budget = DEFAULT_GATHER_BUDGET
    budget = None if budget == 0 else budget
    base = dict(model=shape, folder=str(folder) if folder else None, seq_len=args.seq,
                steps=args.steps, warmup=args.warmup, timeout_s=min(args.timeout, 1800.0),
                gather_budget=budget)
    runs: dict[int, list[dict[str, Any]]] = {2: [], 3: []}
    last: dict[int, list[dict[str, Any]]] = {}
    for rep in range(args.repeats):
        for zero in ((2, 3) if rep % 2 == 0 else (3, 2)):
            t0 = time.perf_counter()
            ranks = run_case(mpiexec, dict(base, zero=zero), 2, args.timeout)
            s = summarise(ranks, args.warmup)
            s["repeat"] = rep
            runs[zero].append(s)
            last[zero] = ranks
            print(f"repeat {rep} ZeRO-{zero}: step {s['step_s']:.2f} s, total peak "
                  f"{s['peak_bytes']['total'] / MIB:.1f} MiB, job {time.perf_counter() - t0:.0f} s",
                  flush=True)
    rows: list[dict[str, Any]] = []
    for zero in (2, 3):
        mine = runs[zero]
        row: dict[str, Any] = {
            "zero": zero,
            "step_s": statistics.median(s["step_s"] for s in mine),
            "step_s_repeats": [s["step_s"] for s in mine],
            "forward_s": statistics.median(s["forward_s"] for s in mine),
            "backward_s": statistics.median(s["backward_s"] for s in mine),
            "communication_s": statistics.median(s["communication_s"] for s in mine),
            "communication_share": statistics.median(s["communication_share"] for s in mine),
            "peak_bytes": {c: max(s["peak_bytes"][c] for s in mine) for c in CATEGORIES},
            "state_peak_bytes": max(s["state_peak_bytes"] for s in mine),
            "parameter_peak_bytes": max(s["parameter_peak_bytes"] for s in mine),
            "frozen_shard_bytes": max(s["frozen_shard_bytes"] for s in mine),
            "at_total_peak_bytes": max((s["at_total_peak_bytes"] for s in mine),
                                       key=lambda a: sum(a.values())),
            "resident_bytes": max(s["resident_bytes"] for s in mine),
            "load_peak_bytes": max(s["load_peak_bytes"] for s in mine),
            "pool_cached_bytes": max(s["pool_cached_bytes"] for s in mine),
            "vm_rss_bytes": max(s["vm_rss_bytes"] for s in mine),
            "vm_hwm_bytes": max(s["vm_hwm_bytes"] for s in mine),
            "setup_s": statistics.median(s["setup_s"] for s in mine),
            "losses_repeats": [s["losses"] for s in mine],
            "trainable_elements": last[zero][0]["trainable_elements"],
        }
        if zero == 3:
            for k in ("exposed_s", "exposed_share"):
                row[k] = statistics.median(s[k] for s in mine)
            row["exposed_s_repeats"] = [s["exposed_s"] for s in mine]
            for k in ("gathers_per_step", "gathered_peak_units", "units"):
                row[k] = mine[0][k]
            row["unit_message_bytes"] = last[3][0]["unit_message_bytes"]
            row["sliced_tables"] = last[3][0]["sliced_tables"]
        rows.append(row)
    z2, z3 = rows
    step_ratios = [b["step_s"] / a["step_s"] for a, b in zip(runs[2], runs[3])]
    peak_ratio = z3["peak_bytes"]["total"] / z2["peak_bytes"]["total"]
    step_ratio = statistics.median(step_ratios)
    result: dict[str, Any] = {
        "host": host(), "shape_name": name, "model_config": shape, "ranks": 2,
        "riftco_simd": last[2][0]["simd"], "num_threads": last[2][0]["num_threads"],
        "frozen_weights_dtype": last[2][0]["frozen_weights_dtype"],
        "activation_checkpointing": last[2][0]["activation_checkpointing"],
        "seq_len": args.seq, "steps": args.steps, "warmup": args.warmup,
        "repeats": args.repeats, "tokens": "synthetic: numpy default_rng(0) ids, uniform",
        "lora": f"r={LORA_RANK}, alpha {LORA_ALPHA:g}, q/k/v/o + gate/up/down",
        "rows": rows,
        "step_ratios": step_ratios,
        "targets": [
            {"what": "per-rank total peak ZeRO-3 / ZeRO-2", "value": peak_ratio,
             "bound": PEAK_TARGET, "met": peak_ratio <= PEAK_TARGET},
            {"what": "step ZeRO-3 / ZeRO-2 (median over repeats)", "value": step_ratio,
             "bound": STEP_TARGET, "met": step_ratio <= STEP_TARGET},
        ],
        "parameter_peak_ratio": z3["parameter_peak_bytes"] / z2["parameter_peak_bytes"],
        "losses_equal": all(a["losses"] == b["losses"] for a, b in zip(runs[2], runs[3])),
        "loss_max_relative_difference": max(
            abs(y - x) / abs(x)
            for a, b in zip(runs[2], runs[3])
            for x, y in zip(a["losses"], b["losses"])
        ),
        "gather_budget_bytes": budget,
    }
    table = markdown(result)
    print(table)
    args.out.mkdir(parents=True, exist_ok=True)
    stem = args.stem or ("zero3_quick" if args.quick else "zero3")
    result["memory_over_step"] = {"zero2": last_steps(last[2]), "zero3": last_steps(last[3])}
    why = picture(result, args.out / f"{stem}_memory.png")
    if why:
        result["picture"] = why
        print(why)
    (args.out / f"{stem}.json").write_text(json.dumps(result, indent=1) + "\n")
    (args.out / f"{stem}.md").write_text(table)
    print(f"wrote {args.out / stem}.json, .md and _memory.png")
    tmp.cleanup()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
