"""Activation-checkpointing policies measured: memory against depth, and step time against peak
activation memory, for every policy riftco has.

1. ``memory_vs_depth.png`` (Chen et al. 2016's figure, from measurements): peak activation bytes
   of one training step (forward + backward) against ``n_layers`` for ``disabled``, ``block``,
   ``segments:K`` with ``K = round(sqrt(L))`` (the √L strategy), ``auto`` and the default
   selective policy, with the formula ``ceil(L/K) · M_ckpt + K · M_layer`` (plus the head) of
   the √L curve from the planner's measured ``M_ckpt`` and ``M_layer``.
2. ``pareto.png``: training-step time (forward + backward + Adam, as in
   ``benches/train_step.py``) relative to ``disabled`` against peak activation bytes at the
   reference configuration for every policy: ``disabled``, ``block``, ``segments:2``,
   ``segments:4``, ``auto``, each named selective policy, and activation-memory budgets at 25 %,
   50 % and 75 % of the way from ``block``'s peak to ``disabled``'s. Each policy is timed in
   pairs against one ``disabled`` model, interleaved (``--steps`` rounds after a warm-up round,
   every other round in the other order), one policy's model at a time; its ratio is the median
   over rounds of its step time over ``disabled``'s in the same round, its peak the largest
   seen. For budgets the planner's predicted peak is printed beside the measured one, and the
   step against ``block``'s (the ratio of their ratios).

3. With ``--replay-only``: what ``determinism_check="values"`` costs against ``"metadata"``
   (``block``, with and without dropout) and what attention and residual dropout 0.1 cost
   against none (``disabled`` and ``block``), each variant in interleaved pairs against its
   baseline (``replay.md``, ``replay.json``).

Reference configuration: vocab 256, d_model 256, 8 heads, 8 layers, d_ff 688, seq 256, batch 8,
flash attention. Peaks come from ``riftco.memory_stats()["activation"]`` (reset before each
step). Tables are printed as Markdown (and written to ``--out``/policies.md); pictures need
matplotlib (``pip install matplotlib``) and are skipped with a message without it.

    python benches/policies.py                     # reference configuration (a few minutes)
    python benches/policies.py --quick --steps 1   # tiny configuration (smoke test)
    python benches/policies.py --replot            # redraw from benches/results/policies.json
    python benches/policies.py --replay-only --steps 9   # determinism_check and dropout costs
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np

import riftco

REFERENCE = dict(vocab_size=256, d_model=256, n_heads=8, n_layers=8, d_ff=688, max_seq_len=256)
QUICK = dict(vocab_size=64, d_model=32, n_heads=4, n_layers=4, d_ff=88, max_seq_len=32)
MIB = 1024.0 * 1024.0


def tokens(batch: int, seq: int, vocab: int) -> np.ndarray[Any, Any]:
    return np.random.default_rng(0).integers(0, vocab, size=(batch, seq + 1), dtype=np.int64)


def make_model(cfg: dict[str, int], policy: str) -> Any:
    config = riftco.TransformerConfig(**cfg)
    if policy.startswith("budget:"):
        budget = policy.split(":", 1)[1]
        return riftco.DecoderOnlyTransformer(config, activation_memory_budget=budget)
    return riftco.DecoderOnlyTransformer(config, activation_checkpointing=policy)


def step(
    model: Any, block: np.ndarray[Any, Any], opt: Any = None
) -> tuple[float, int, int]:
    """One training step: forward + backward (+ the optimizer step when ``opt`` is given, as
    in benches/train_step.py); returns (seconds, retained bytes after forward, peak bytes)."""
    before = riftco.memory_stats()["activation"]["current_bytes"]
    riftco.reset_peak_memory_stats()
    t0 = time.perf_counter()
    loss = model.loss(block)
    retained = riftco.memory_stats()["activation"]["current_bytes"] - before
    loss.backward(retain_graph=False)
    if opt is not None:
        opt.step()
        opt.zero_grad()
    seconds = time.perf_counter() - t0
    peak = int(riftco.memory_stats()["activation"]["peak_bytes"])
    del loss
    if opt is None:
        for p in model.parameters():
            p.zero_grad()
    return seconds, int(retained), peak


def cpu_simd() -> str:
    """The widest SIMD the CPU reports (the kernels dispatch at run time)."""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return "unknown SIMD"
    if "avx512f" in flags:
        return "AVX-512"
    return "AVX2+FMA" if "avx2" in flags and "fma" in flags else "no AVX2"


def plan_of(model: Any, batch: int, seq: int) -> dict[str, Any]:
    plan: dict[str, Any] = model.activation_checkpointing_plan(batch, seq)
    return plan


def memory_vs_depth(
    cfg: dict[str, int], depths: list[int], batch: int, seq: int
) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for n_layers in depths:
        c = dict(cfg, n_layers=n_layers)
        k = max(1, round(math.sqrt(n_layers)))
        block = tokens(batch, seq, c["vocab_size"])
        auto = make_model(c, "auto")
        m = plan_of(auto, batch, seq)["measurement"]
        head = m["head_retained_bytes"] + m["head_transient_bytes"]
        for policy in ["disabled", "block", f"segments:{k}", "auto", "selective"]:
            model = auto if policy == "auto" else make_model(c, policy)
            plan = plan_of(model, batch, seq)
            _, retained, peak = step(model, block)
            k_used = plan["segment_length"]
            formula = None
            if k_used is not None:
                n_seg = math.ceil(n_layers / k_used)
                formula = n_seg * m["boundary_bytes"] + k_used * m["layer_bytes"] + head
            rows.append(
                dict(
                    n_layers=n_layers,
                    policy=policy if policy != "auto" else f"auto (K={k_used})",
                    curve="segments:√L" if policy == f"segments:{k}" else policy,
                    retained=retained,
                    peak=peak,
                    formula=formula,
                )
            )
            print(
                f"  L={n_layers:3d} {rows[-1]['policy']:22s} retained {retained / MIB:8.1f} MiB"
                f"  peak {peak / MIB:8.1f} MiB"
                + (f"  formula {formula / MIB:8.1f} MiB" if formula else ""),
                flush=True,
            )
    return rows


def pareto(
    cfg: dict[str, int], batch: int, seq: int, steps: int
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    block = tokens(batch, seq, cfg["vocab_size"])
    # The budgets sit between block's and disabled's peaks, measured first.
    _, _, peak_block = step(make_model(cfg, "block"), block)
    _, _, peak_disabled = step(make_model(cfg, "disabled"), block)
    budgets = [int(peak_block + f * (peak_disabled - peak_block)) for f in (0.25, 0.5, 0.75)]
    policies = ["disabled", "block", "segments:2", "segments:4", "auto"]
    policies += [f"selective:{name}" for name in riftco.SELECTIVE_POLICIES]
    policies += [f"budget:{b}" for b in budgets]
    if cfg["n_layers"] < 4:
        policies = [p for p in policies if p != "segments:4"]
    # Each policy is timed against disabled in pairs (disabled, policy, policy, disabled, ...):
    # one model of each at a time, so every comparison sees the same machine state.
    base = make_model(cfg, "disabled")
    base_opt = riftco.Adam(base.parameters(), lr=1e-4)
    times: dict[str, list[float]] = {}
    rows: list[dict[str, Any]] = []
    for p in policies:
        model = base if p == "disabled" else make_model(cfg, p)
        opt = base_opt if p == "disabled" else riftco.Adam(model.parameters(), lr=1e-4)
        plan = plan_of(model, batch, seq)
        mine: list[float] = []
        ref: list[float] = []
        peak = 0
        for r in range(steps + 1):
            pair = [(base, base_opt, ref), (model, opt, mine)]
            for m, o, out in pair if r % 2 == 0 else pair[::-1]:
                seconds, _, pk = step(m, block, o)
                if m is model:
                    peak = max(peak, pk)
                if r > 0:
                    out.append(seconds)
        times[p] = mine
        # The median over rounds of the policy's step over disabled's step in the same round.
        ratio = statistics.median(a / b for a, b in zip(mine, ref))
        rows.append(
            dict(
                policy=p if not p.startswith("budget:") else f"budget {int(p[7:]) / MIB:.1f} MiB",
                budget=int(p[7:]) if p.startswith("budget:") else None,
                plan=plan["summary"],
                segment_length=plan["segment_length"],
                step_s=statistics.median(mine),
                time_ratio=ratio,
                peak=peak,
                predicted=plan["predicted_peak_bytes"],
            )
        )
        print(f"  {rows[-1]['policy']:26s} step {ratio:.3f}× disabled, peak {peak / MIB:7.1f} MiB")
    block_ratio = next(r["time_ratio"] for r in rows if r["policy"] == "block")
    for row in rows:
        row["peak_ratio"] = row["peak"] / rows[0]["peak"]
        row["vs_block"] = row["time_ratio"] / block_ratio
    return rows, dict(times=times)


def make_variant(cfg: dict[str, int], policy: str, check: str, p: float) -> Any:
    config = riftco.TransformerConfig(**cfg, attention_dropout=p, residual_dropout=p)
    return riftco.DecoderOnlyTransformer(
        config, activation_checkpointing=policy, determinism_check=check
    )


# (what, baseline (policy, determinism_check, dropout), variant)
REPLAY_PAIRS = [
    (
        "determinism_check values vs metadata, block",
        ("block", "metadata", 0.0),
        ("block", "values", 0.0),
    ),
    (
        "determinism_check values vs metadata, block, dropout 0.1",
        ("block", "metadata", 0.1),
        ("block", "values", 0.1),
    ),
    ("dropout 0.1 vs 0, disabled", ("disabled", "metadata", 0.0), ("disabled", "metadata", 0.1)),
    ("dropout 0.1 vs 0, block", ("block", "metadata", 0.0), ("block", "metadata", 0.1)),
]


def replay_costs(
    cfg: dict[str, int], batch: int, seq: int, steps: int
) -> list[dict[str, Any]]:
    """What the replay check and dropout cost: each variant timed in interleaved pairs against
    its baseline (the same policy), step = forward + backward + Adam; the ratio is the median
    over rounds of variant / baseline in the same round."""
    block = tokens(batch, seq, cfg["vocab_size"])
    rows: list[dict[str, Any]] = []
    for what, base_spec, variant_spec in REPLAY_PAIRS:
        models = [make_variant(cfg, *base_spec), make_variant(cfg, *variant_spec)]
        opts = [riftco.Adam(m.parameters(), lr=1e-4) for m in models]
        times: list[list[float]] = [[], []]
        for r in range(steps + 1):
            order = [0, 1] if r % 2 == 0 else [1, 0]
            for i in order:
                seconds, _, _ = step(models[i], block, opts[i])
                if r > 0:
                    times[i].append(seconds)
        ratios = [b / a for a, b in zip(times[0], times[1])]
        rows.append(
            dict(
                what=what,
                base_s=statistics.median(times[0]),
                variant_s=statistics.median(times[1]),
                ratio=statistics.median(ratios),
                ratio_min=min(ratios),
                ratio_max=max(ratios),
            )
        )
        r = rows[-1]
        print(
            f"  {what:58s} {r['ratio']:.3f}× (rounds {r['ratio_min']:.3f}–{r['ratio_max']:.3f})"
        )
    return rows


def markdown_replay(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| variant vs baseline | baseline step s | variant step s | median ratio | range |",
        "|---|---:|---:|---:|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['what']} | {r['base_s']:.3f} | {r['variant_s']:.3f} | {r['ratio']:.3f}× "
            f"| {r['ratio_min']:.3f}–{r['ratio_max']:.3f} |"
        )
    return "\n".join(lines)


def markdown_depth(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| n_layers | policy | retained MiB | peak MiB | formula MiB |",
        "|---:|---|---:|---:|---:|",
    ]
    for r in rows:
        f = f"{r['formula'] / MIB:.1f}" if r["formula"] else "–"
        lines.append(
            f"| {r['n_layers']} | {r['policy']} | {r['retained'] / MIB:.1f} | "
            f"{r['peak'] / MIB:.1f} | {f} |"
        )
    return "\n".join(lines)


def markdown_pareto(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| policy | step vs disabled | peak activation MiB | peak vs disabled | predicted MiB |",
        "|---|---:|---:|---:|---:|",
    ]
    for r in rows:
        pred = f"{r['predicted'] / MIB:.1f}" if r["predicted"] else "–"
        lines.append(
            f"| {r['policy']} | {r['time_ratio']:.3f}× | {r['peak'] / MIB:.1f} | "
            f"{r['peak_ratio']:.3f}× | {pred} |"
        )
    return "\n".join(lines)


def plot(depth: list[dict[str, Any]], front: list[dict[str, Any]], out: Path, title: str) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: skipping the pictures (pip install matplotlib)")
        return
    fig, ax = plt.subplots(figsize=(7, 4.5))
    curves: dict[str, list[dict[str, Any]]] = {}
    for r in depth:
        curves.setdefault(r["curve"], []).append(r)
    # auto often resolves to block (K=1): drawn thinner on top, so both stay visible.
    styles: dict[str, dict[str, Any]] = {
        "disabled": dict(marker="o", lw=2),
        "block": dict(marker="s", lw=5, alpha=0.45),
        "auto": dict(marker="x", lw=1.5, ls="--", ms=9),
        "selective": dict(marker="^", lw=2),
    }
    for name, rs in curves.items():
        label = name
        if name == "auto":
            ks = ", ".join(r["policy"].split("=")[1].rstrip(")") for r in rs)
            label = f"auto (K = {ks})"
        elif name == "selective":
            label = f"selective:{next(iter(riftco.SELECTIVE_POLICIES))}"
        style = styles.get(name, dict(marker="D", lw=2))
        ax.plot(
            [r["n_layers"] for r in rs], [r["peak"] / MIB for r in rs], label=label, **style
        )
    sq = curves.get(next((c for c in curves if c.startswith("segments")), ""), [])
    if sq:
        ax.plot(
            [r["n_layers"] for r in sq],
            [r["formula"] / MIB for r in sq],
            "k--",
            lw=1,
            label="√L formula: ⌈L/K⌉·M_ckpt + K·M_layer + head",
        )
    ax.set_xlabel("n_layers (L)")
    ax.set_ylabel("peak activation memory (MiB)")
    ax.set_title(f"Activation memory against depth (measured)\n{title}", fontsize=10)
    ax.set_xscale("log", base=2)
    ax.set_xticks(sorted({r["n_layers"] for r in depth}))
    ax.get_xaxis().set_major_formatter(matplotlib.ticker.ScalarFormatter())
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "memory_vs_depth.png", dpi=120)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(7, 4.5))
    # Each label takes the first of four places around its point whose box overlaps no label
    # or point drawn so far, so that neighbours (block and auto, a budget plan landing on a
    # selective policy) stay legible.
    points = []
    for r in front:
        marker = "s" if r["budget"] else "o"
        points.append(ax.plot(r["peak"] / MIB, r["time_ratio"], marker, ms=7)[0])
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    taken = [p.get_window_extent(renderer) for p in points]
    for r in front:
        if r["policy"] == "auto":
            r = dict(r, policy=f"auto (K={r['segment_length']})")
        xy = (r["peak"] / MIB, r["time_ratio"])
        for dx, dy, ha in [(5, 4, "left"), (5, -11, "left"), (-5, 4, "right"), (-5, -11, "right")]:
            label = ax.annotate(
                r["policy"], xy, textcoords="offset points", xytext=(dx, dy), fontsize=7, ha=ha
            )
            box = label.get_window_extent(renderer)
            if not any(box.overlaps(t) for t in taken):
                break
            label.remove()
        else:
            label = ax.annotate(r["policy"], xy, textcoords="offset points", xytext=(5, 4), fontsize=7)
            box = label.get_window_extent(renderer)
        taken.append(box)
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_xlabel("peak activation memory (MiB)")
    ax.set_ylabel("step time / disabled step time")
    ax.set_title(f"Training-step time against peak activation memory (measured, each paired with disabled)\n{title}", fontsize=10)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out / "pareto.png", dpi=120)
    plt.close(fig)
    print(f"wrote {out / 'memory_vs_depth.png'} and {out / 'pareto.png'}")


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--quick", action="store_true", help="tiny configuration (smoke test)")
    p.add_argument("--steps", type=int, default=3, help="timed rounds (default: %(default)s)")
    p.add_argument("--batch-size", type=int, default=None, help="default: 8 (quick: 2)")
    p.add_argument("--seq-len", type=int, default=None, help="default: 256 (quick: 16)")
    p.add_argument(
        "--out",
        type=Path,
        default=Path("benches/results"),
        help="folder for the pictures and policies.md (default: %(default)s)",
    )
    p.add_argument(
        "--replot",
        action="store_true",
        help="redraw the pictures from --out/policies.json without measuring",
    )
    p.add_argument(
        "--replay-only",
        action="store_true",
        help="measure only the cost of determinism_check='values' and of dropout (written to "
        "--out/replay.md and replay.json)",
    )
    args = p.parse_args()
    if args.replot:
        saved = json.loads((args.out / "policies.json").read_text())
        plot(saved["depth"], saved["pareto"], args.out, saved["title"])
        return
    cfg = QUICK if args.quick else REFERENCE
    batch = args.batch_size or (2 if args.quick else 8)
    seq = args.seq_len or (16 if args.quick else 256)
    depths = [2, 4] if args.quick else [4, 8, 16, 32]
    args.out.mkdir(parents=True, exist_ok=True)
    info = cpu_simd()
    title = (
        f"d_model {cfg['d_model']}, d_ff {cfg['d_ff']}, {cfg['n_heads']} heads, "
        f"seq {seq}, batch {batch}, flash, {riftco.num_threads()} threads"
    )
    print(f"riftco {riftco.__version__}, CPU with {info}; {title}")
    if args.replay_only:
        print(f"replay check and dropout at n_layers {cfg['n_layers']} ({args.steps} rounds):")
        rows = replay_costs(cfg, batch, seq, args.steps)
        md = (
            f"## What the replay check and dropout cost\n\n{title}, n_layers "
            f"{cfg['n_layers']}, CPU with {info}\n\n{markdown_replay(rows)}\n"
        )
        print(md)
        (args.out / "replay.md").write_text(md)
        (args.out / "replay.json").write_text(json.dumps(dict(title=title, rows=rows), indent=1))
        return
    print("memory against depth:")
    depth = memory_vs_depth(cfg, depths, batch, seq)
    print(f"pareto at n_layers {cfg['n_layers']} ({args.steps} interleaved rounds):")
    front, _ = pareto(cfg, batch, seq, args.steps)
    md = (
        f"## Memory against depth\n\n{title}\n\n{markdown_depth(depth)}\n\n"
        f"## Step time against peak activation memory\n\n{title}, n_layers "
        f"{cfg['n_layers']}\n\n{markdown_pareto(front)}\n"
    )
    print(md)
    for r in front:
        if r["budget"]:
            err = r["peak"] / r["predicted"] - 1
            print(
                f"{r['policy']}: measured peak {r['peak'] / MIB:.1f} MiB, predicted "
                f"{r['predicted'] / MIB:.1f} MiB ({err:+.1%}), within budget: "
                f"{r['peak'] <= r['budget']}, step {r['vs_block']:.3f}× "
                f"block's; plan {r['plan']}"
            )
    (args.out / "policies.md").write_text(md)
    (args.out / "policies.json").write_text(
        json.dumps(dict(title=title, depth=depth, pareto=front), indent=1)
    )
    plot(depth, front, args.out, title)


if __name__ == "__main__":
    main()
