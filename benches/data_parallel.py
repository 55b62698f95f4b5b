"""Data-parallel training over MPI measured: step time, tokens/s, per-rank memory and
communication with 1 and 2 ranks, ZeRO stages 0, 1 and 2.

Each case is one job ``mpiexec -n N python benches/data_parallel.py --worker SPEC`` (the venv's
``mpiexec``, ``RIFTCO_NUM_THREADS=1`` per rank) that runs :func:`riftco.run_pretraining` on the
reference configuration of ``benches/policies.py`` (vocab 256, d_model 256, 8 heads, 8 layers,
d_ff 688) with a global batch of 8 sequences of 256 tokens, ``data_parallel=True``, and, unless
``--no-lora``, :func:`riftco.run_post_training` with LoRA r=8 on all projections (q/k/v/o and
gate/up/down, ``lora_mlp=True``) of a freshly initialised reference model. Every rank writes its
training metadata (``step_times_s``, ``communication_s``, ``peak_memory_bytes``) to a JSON file
that this driver reads.

Per case and repeat: the job's step time of step ``s`` is the largest over the ranks (they meet
in the collectives every step); the first ``--warmup`` steps are dropped and the median of the
rest kept. Repeats are interleaved (every repeat runs every case, N=1 and N=2 alternating, the
order reversed every other repeat); the table shows the median over repeats, and the ratio
against N=1 is the median over repeats of the case's step time over N=1's of the same repeat
and stage. Communication share: seconds in collectives over seconds of the timed steps (rank 0;
the seconds in a collective include waiting for the slower rank). Memory: peak bytes per rank by
category (``riftco.memory_stats()`` categories, largest over ranks and repeats); the NumPy
communication buffer (one 25 MiB bucket at most) is not counted there.

Bytes communicated per step (computed, not measured): the trainable parameters in float32,
padded per bucket to a multiple of N (``riftco.training.distributed``'s buckets), times the
bytes a rank sends in the bandwidth-optimal ring algorithms: all-reduce ``2(N-1)/N``,
reduce-scatter ``(N-1)/N``, all-gather ``(N-1)/N``. ZeRO 0: all-reduce; ZeRO 1: all-reduce + all-gather
(``3(N-1)/N``); ZeRO 2: reduce-scatter + all-gather (``2(N-1)/N``). The two scalars summed per
step (target count, loss) are left out. MPICH picks its own algorithms (on one machine the
ranks share memory), so these are the bytes of the cost model, not of the wire.

    python benches/data_parallel.py                  # reference configuration (~6 minutes)
    python benches/data_parallel.py --quick          # tiny configuration (smoke test)

Skips, with the reason printed, when mpi4py or ``mpiexec`` is missing
(``pip install 'riftco[mpi]'``). Writes ``--out``/data_parallel.json and data_parallel.md.
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
from pathlib import Path
from typing import Any

REFERENCE = dict(vocab_size=256, d_model=256, n_heads=8, n_layers=8, d_ff=688, max_seq_len=256)
QUICK = dict(vocab_size=256, d_model=32, n_heads=4, n_layers=2, d_ff=88, max_seq_len=32)
CATEGORIES = ("parameter", "gradient", "optimizer_state", "activation", "workspace", "total")
MIB = 1024.0 * 1024.0


def factors(n: int, zero: int) -> tuple[str, float]:
    """The ring-algorithm factor of the bytes one rank sends per step (see the docstring)."""
    if n == 1:
        return "none (1 rank)", 0.0
    f = (n - 1) / n
    if zero == 0:
        return "all-reduce 2(N-1)/N", 2 * f
    if zero == 1:
        return "all-reduce 2(N-1)/N + all-gather (N-1)/N", 3 * f
    return "reduce-scatter (N-1)/N + all-gather (N-1)/N", 2 * f


# -- the worker: one rank of one job ---------------------------------------------------------


def worker(spec: dict[str, Any]) -> None:
    import riftco
    from riftco.training import distributed

    config = riftco.TransformerConfig(**spec["model"], seed=0)
    common = dict(
        steps=spec["steps"],
        batch_size=spec["batch_size"],
        seq_len=spec["seq_len"],
        eval_batches=1,
        save_every=10**6,
        warmup_steps=2,
        data_parallel=True,
        zero=spec["zero"],
        data_parallel_timeout_s=300.0,
        data_parallel_bucket_bytes=spec["bucket_bytes"],
    )
    out = Path(spec["folder"])
    if spec["stage"] == "pretraining":
        corpus = riftco.default_corpus(max_bytes=1 << 20)
        meta = riftco.run_pretraining(
            config, riftco.PretrainingConfig(**common), corpus, out / "run",
            progress=False, plots=False, overwrite=True,
        )
        model = riftco.DecoderOnlyTransformer(config)
    else:
        model = riftco.DecoderOnlyTransformer(config)
        post = riftco.PostTrainingConfig(
            fine_tuning_method="lora", lora_rank=8, lora_alpha=16.0, lora_mlp=True, **common
        )
        meta = riftco.run_post_training(
            model, post, riftco.default_post_training_corpus(), out / "run",
            progress=False, plots=False, overwrite=True,
        )
    group = distributed.init()
    trainable = [p for p in model.parameters() if p.requires_grad]
    # As DistributedOptimizer forms them: reverse parameter order.
    buckets = distributed._buckets(trainable[::-1], group.world_size, spec["bucket_bytes"])
    record = {
        "rank": group.rank,
        "world_size": group.world_size,
        "step_times_s": meta["step_times_s"],
        "communication_s": meta.get("communication_s", []),
        "peak_memory_bytes": meta["peak_memory_bytes"],
        "num_threads": meta["num_threads"],
        "attention": meta["attention"],
        "activation_checkpointing": meta["activation_checkpointing"],
        "trainable_elements": sum(b.size for b in buckets),
        "padded_elements": sum(b.padded for b in buckets),
        "buckets": len(buckets),
        "staging_peak_bytes": meta["data_parallel"].get("staging_peak_bytes", 0),
    }
    (out / f"rank{group.rank}.json").write_text(json.dumps(record))


# -- the driver ------------------------------------------------------------------------------


def find_mpiexec() -> str | None:
    local = Path(sys.executable).parent / "mpiexec"
    return str(local) if local.exists() else shutil.which("mpiexec")


def run_case(mpiexec: str, case: dict[str, Any], timeout_s: float) -> list[dict[str, Any]]:
    with tempfile.TemporaryDirectory(prefix="riftco-dpbench-") as tmp:
        spec = dict(case, folder=tmp)
        env = dict(os.environ, RIFTCO_NUM_THREADS="1", OMP_NUM_THREADS="1")
        cmd = [mpiexec, "-n", str(case["n"]), sys.executable, __file__, "--worker",
               json.dumps(spec)]
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout_s)
        if done.returncode != 0:
            raise RuntimeError(
                f"{' '.join(cmd[:4])} ... failed ({done.returncode}):\n{done.stderr[-3000:]}"
            )
        return [json.loads((Path(tmp) / f"rank{r}.json").read_text()) for r in range(case["n"])]


def summarise(ranks: list[dict[str, Any]], warmup: int) -> dict[str, Any]:
    steps = list(zip(*(r["step_times_s"] for r in ranks)))[warmup:]
    job = [max(s) for s in steps]
    r0 = ranks[0]
    comm = r0["communication_s"][warmup:]
    timed = r0["step_times_s"][warmup:]
    return {
        "step_s": statistics.median(job),
        "communication_share": (sum(comm) / sum(timed)) if comm else 0.0,
        "communication_s": statistics.median(comm) if comm else 0.0,
        "peak_memory_bytes": {
            k: max(int(r["peak_memory_bytes"].get(k, 0)) for r in ranks) for k in CATEGORIES
        },
    }


def host() -> dict[str, Any]:
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        info = ""
    model = next((ln.split(":", 1)[1].strip() for ln in info.splitlines()
                  if ln.startswith("model name")), platform.processor() or "unknown")
    simd = "AVX-512" if "avx512f" in info else ("AVX2+FMA" if "avx2" in info else "no AVX2")
    return {"cpu": model, "simd": simd, "cores": os.cpu_count(),
            "date": datetime.date.today().isoformat(), "python": platform.python_version()}


def markdown(result: dict[str, Any]) -> str:
    h = result["host"]
    lines = [
        f"Host: {h['cpu']}, {h['cores']} cores ({h['simd']}), shared and noisy; "
        f"{h['date']}; 1 kernel thread per rank; MPICH (the `mpi` extra), one machine. "
        f"Global batch {result['batch_size']} x {result['seq_len']} tokens; "
        f"{result['steps']} steps, first {result['warmup']} dropped, median; "
        f"{result['repeats']} interleaved repeats (median). Gradient buckets of "
        f"{result['bucket_mib']:g} MiB; 'staged': ZeRO-2's buckets being filled during the "
        "backward pass, NumPy buffers outside the memory categories.",
        "",
        "| stage | N | ZeRO | step (s) | tokens/s (job) | vs N=1 (step) | comm share | "
        "bytes sent/rank/step (MiB) | param | grad | Adam state | activation | total "
        "(MiB per rank) | staged (MiB) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in result["rows"]:
        m = row["peak_memory_bytes"]
        lines.append(
            f"| {row['stage']} | {row['n']} | {row['zero']} | {row['step_s']:.3f} | "
            f"{row['tokens_per_s']:,.0f} | {row['ratio_vs_n1']:.2f} | "
            f"{100 * row['communication_share']:.1f} % | {row['bytes_per_step'] / MIB:.2f} | "
            + " | ".join(f"{m[k] / MIB:.1f}" for k in
                         ("parameter", "gradient", "optimizer_state", "activation", "total"))
            + f" | {row['staging_peak_bytes'] / MIB:.1f} |"
        )
    lines += [
        "",
        "Trainable elements: "
        + ", ".join(f"{s} {e:,}" for s, e in result["trainable_elements"].items())
        + ". Bytes sent per rank per step = padded trainable float32 bytes x factor "
        "(ring all-reduce 2(N-1)/N; ZeRO 1 adds an all-gather (N-1)/N; ZeRO 2 is "
        "reduce-scatter (N-1)/N + all-gather (N-1)/N); computed, not measured.",
        "'vs N=1' is the step time over N=1's (same stage, same repeat): below 1 is faster. "
        "Memory is the peak per rank by category (riftco.memory_stats()).",
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="tiny configuration (smoke test)")
    ap.add_argument("--no-lora", action="store_true", help="pretraining rows only")
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds per job")
    ap.add_argument(
        "--bucket-mib", type=float, default=25.0,
        help="gradient bucket size in MiB (data_parallel_bucket_bytes; default 25)",
    )
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = ap.parse_args(argv)
    if args.worker:
        worker(json.loads(args.worker))
        return 0
    if importlib.util.find_spec("mpi4py") is None:
        print("skipped: mpi4py is not installed (pip install 'riftco[mpi]')")
        return 0
    mpiexec = find_mpiexec()
    if mpiexec is None:
        print("skipped: no mpiexec beside this Python or on PATH (pip install 'riftco[mpi]')")
        return 0
    model = QUICK if args.quick else REFERENCE
    batch, seq = (4, 32) if args.quick else (8, 256)
    stages = ["pretraining"] + ([] if args.no_lora else ["lora"])
    cases: list[dict[str, Any]] = []
    for stage in stages:
        cases += [dict(stage=stage, n=1, zero=0)]
        cases += [dict(stage=stage, n=2, zero=z) for z in (0, 1, 2)]
    base: dict[str, Any] = dict(
        model=model, steps=args.steps, batch_size=batch, seq_len=seq,
        bucket_bytes=int(args.bucket_mib * MIB),
    )
    runs: dict[tuple[str, int, int], list[dict[str, Any]]] = {}
    ranks_seen: dict[tuple[str, int, int], list[dict[str, Any]]] = {}
    for rep in range(args.repeats):
        for stage in stages:
            mine = [c for c in cases if c["stage"] == stage]
            # N=1 between the N=2 cases, the order reversed every other repeat.
            order = [mine[1], mine[0], mine[2], mine[0], mine[3]]
            if rep % 2:
                order = order[::-1]
            for c in order:
                key = (c["stage"], c["n"], c["zero"])
                ranks = run_case(mpiexec, dict(base, **c), args.timeout)
                s = summarise(ranks, args.warmup)
                s["repeat"] = rep
                runs.setdefault(key, []).append(s)
                ranks_seen[key] = ranks
                print(f"repeat {rep} {key}: step {s['step_s']:.3f} s, "
                      f"comm {100 * s['communication_share']:.1f} %", flush=True)
    rows: list[dict[str, Any]] = []
    trainable: dict[str, int] = {}
    for c in cases:
        key = (c["stage"], c["n"], c["zero"])
        one = runs[(c["stage"], 1, 0)]
        mine = runs[key]
        r0 = ranks_seen[key][0]
        trainable[c["stage"]] = r0["trainable_elements"]
        ratios = []
        for s in mine:
            same = [o["step_s"] for o in one if o["repeat"] == s["repeat"]]
            ratios.append(s["step_s"] / statistics.median(same))
        step_s = statistics.median(s["step_s"] for s in mine)
        _, factor = factors(c["n"], c["zero"])
        rows.append({
            "stage": c["stage"], "n": c["n"], "zero": c["zero"],
            "step_s": step_s,
            "step_s_repeats": [s["step_s"] for s in mine],
            "tokens_per_s": batch * seq / step_s,
            "ratio_vs_n1": statistics.median(ratios),
            "communication_share": statistics.median(s["communication_share"] for s in mine),
            "communication_s": statistics.median(s["communication_s"] for s in mine),
            "bytes_per_step": r0["padded_elements"] * 4 * factor,
            "bytes_factor": factors(c["n"], c["zero"])[0],
            "peak_memory_bytes": {
                k: max(s["peak_memory_bytes"][k] for s in mine) for k in CATEGORIES
            },
            "attention": r0["attention"],
            "activation_checkpointing": r0["activation_checkpointing"],
            "num_threads": r0["num_threads"],
            "staging_peak_bytes": max(r["staging_peak_bytes"] for r in ranks_seen[key]),
            "buckets": r0["buckets"],
        })
    result = {
        "host": host(), "model_config": model, "batch_size": batch, "seq_len": seq,
        "steps": args.steps, "warmup": args.warmup, "repeats": args.repeats,
        "lora": "r=8, alpha 16, q/k/v/o + gate/up/down (lora_mlp=True)",
        "trainable_elements": trainable, "rows": rows, "bucket_mib": args.bucket_mib,
    }
    table = markdown(result)
    print(table)
    args.out.mkdir(parents=True, exist_ok=True)
    name = "data_parallel_quick" if args.quick else "data_parallel"
    (args.out / f"{name}.json").write_text(json.dumps(result, indent=1) + "\n")
    (args.out / f"{name}.md").write_text(table)
    print(f"wrote {args.out / name}.json and .md")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
