"""Memory and time of LoRA training steps on published model shapes, riftco beside PyTorch + PEFT.

Architectures (random weights, seeded; nothing is downloaded):
- ``smollm2-135m``: SmolLM2-135M's published shape: vocab 49152, d_model 576, d_ff 1536, 30 layers,
  9 heads / 3 KV heads, tied embeddings, RoPE theta 1e5.
- ``llama-3.2-1b``: Llama-3.2-1B's: vocab 128256, d_model 2048, d_ff 8192, 16 layers, 32 heads / 8
  KV heads, tied, RoPE theta 5e5 (riftco's llama3 scaling is not applied here: it changes no
  memory or time).

Each row trains LoRA r=8 (alpha 16) on all seven projections (with ``--full``: every weight, and
PyTorch without PEFT) with Adam (lr 1e-4) under one
activation-checkpointing policy and one loss head: ``chunked`` (riftco's default: the LM head and
cross-entropy a chunk of tokens at a time, ``loss_chunk_bytes`` 64 MiB) or ``unfused`` (whole
logits); ``chunked bf16`` also stores the frozen base in bfloat16
(``set_frozen_weights_dtype``). riftco's peak is ``riftco.memory_stats()`` after ``reset_peak_memory_stats()``, by
category (parameter, gradient, optimizer state, activation, workspace) and the total (the peak of
the sum), and what the total peak was made of (``riftco.peak_memory_breakdown()``: each category
at that moment; ``at_total_peak_bytes`` in the ``--out`` file). Step time is the median of ``--steps`` steps after one warm-up; the rows are
interleaved step by step (round robin), so a busy period of the host slows every row alike.

PyTorch + PEFT (when ``torch``, ``transformers`` and ``peft`` import; otherwise skipped with the
reason): ``LlamaForCausalLM`` from the same config in float32, PEFT LoRA with the same rank,
alpha and targets, Hugging Face gradient checkpointing (non-reentrant) on for riftco's ``block``
rows and off for ``disabled``; its peak is read from the PyTorch profiler
(``profile_memory=True``) during its second step: the highest running sum of the profiler's
``[memory]`` records (one per CPU allocation, its bytes, and per free, minus its bytes) in the
order of their own timestamps — the bytes the step allocated above what was alive before it —
plus the parameters and the Adam state alive before it (that step is not timed; the others run
without the profiler). This is what PyTorch's memory timeline (``export_memory_timeline``) sums,
to within a few KiB. Until 2026-12-06 the bench summed each op's *self* memory
(``self_cpu_memory_usage``: its allocations minus its frees, its children's excluded) at the
op's start time, which counts a parent op's frees of its children's allocations before those
allocations (the parent starts first): ``cross_entropy`` freeing its ``log_softmax`` output and
``LogSoftmaxBackward0`` freeing the logits-sized gradients of its children cancelled a
logits-sized buffer alive at the peak (192 MiB at SmolLM2's shape, 4 x 256 tokens), so
PyTorch + PEFT + GC read 995 MiB where its step peaks at 1187 MiB (1379 MiB when the caller
keeps a reference to the logits through the backward; this bench drops it first, as Hugging
Face's ``Trainer`` does; see ``benches/qlora_real_models.py``). Until 2026-12-05 the warm-up step was profiled, before
PyTorch's Adam had allocated its moments, so those peaks could lack the Adam state (19 MiB of
LoRA moments at SmolLM2's shape). Same process, same thread count.

    python benches/memory_real_models.py                       # smollm2-135m, 4 x 256 tokens
    python benches/memory_real_models.py --model llama-3.2-1b --batch 1 --seq 1024 --steps 2 \
        --policies block --heads "chunked bf16" --sequential   # rows one at a time (24 GiB host)
    python benches/memory_real_models.py --model reference --full --batch 8 --seq 256 \
        --heads chunked                        # benches/policies.py's model, every weight trained
    python benches/memory_real_models.py --quick               # a tiny shape (CI smoke)
    python benches/memory_real_models.py --plot benches/results/memory_real_models_smollm2.json
                                 # stacked bars by category from a --out file (needs matplotlib)
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import platform
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np

import riftco

MIB = 2**20
SHAPES: dict[str, dict[str, Any]] = {
    "smollm2-135m": dict(
        vocab_size=49152, d_model=576, n_heads=9, n_kv_heads=3, n_layers=30, d_ff=1536,
        max_seq_len=2048, rope_theta=1e5, tie_word_embeddings=True,
    ),
    "llama-3.2-1b": dict(
        vocab_size=128256, d_model=2048, n_heads=32, n_kv_heads=8, n_layers=16, d_ff=8192,
        max_seq_len=2048, rope_theta=5e5, tie_word_embeddings=True,
    ),
    "reference": dict(  # benches/policies.py's reference model
        vocab_size=256, d_model=256, n_heads=8, n_kv_heads=8, n_layers=8, d_ff=688,
        max_seq_len=256, rope_theta=1e4, tie_word_embeddings=False,
    ),
    "quick": dict(
        vocab_size=4096, d_model=64, n_heads=4, n_kv_heads=2, n_layers=2, d_ff=128,
        max_seq_len=64, rope_theta=1e4, tie_word_embeddings=True,
    ),
}
CATEGORIES = ("parameter", "gradient", "optimizer_state", "activation", "workspace")
LORA_RANK, LORA_ALPHA = 8, 16.0


def tokens(batch: int, seq: int, vocab: int) -> np.ndarray[Any, Any]:
    return np.random.default_rng(0).integers(0, vocab, size=(batch, seq + 1), dtype=np.int64)


def _current() -> dict[str, int]:
    stats = riftco.memory_stats()
    return {c: stats[c]["current_bytes"] for c in (*CATEGORIES, "total")}


def llama_config(shape: dict[str, Any], **extra: Any) -> Any:
    """transformers' ``LlamaConfig`` of a :data:`SHAPES` entry (``extra``: more fields)."""
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=shape["vocab_size"], hidden_size=shape["d_model"],
        intermediate_size=shape["d_ff"], num_hidden_layers=shape["n_layers"],
        num_attention_heads=shape["n_heads"], num_key_value_heads=shape["n_kv_heads"],
        max_position_embeddings=shape["max_seq_len"], rope_theta=shape["rope_theta"],
        tie_word_embeddings=shape["tie_word_embeddings"], **extra,
    )


class RiftcoRow:
    """One riftco configuration: a LoRA model, its optimizer, and its measured steps.

    riftco's counters are process-wide and every row's model is alive at once (the rows are
    interleaved), so a row's peak is computed from what it alone allocates: the bytes it holds
    between steps (its weights and adapters from construction; its gradients and Adam moments,
    the change of the counters over its own steps) plus the peak of its step above the counters'
    value before that step.
    """

    def __init__(self, shape: dict[str, Any], policy: str, head: str, lora: bool = True) -> None:
        self.label = f"riftco {policy} {head}"
        before = _current()
        self.model = riftco.DecoderOnlyTransformer(
            riftco.TransformerConfig(**shape, seed=0), activation_checkpointing=policy
        )
        if lora:
            self.model.enable_lora(rank=LORA_RANK, alpha=LORA_ALPHA, mlp=True)
        self.model.loss_chunk_bytes = None if head == "unfused" else riftco.DEFAULT_LOSS_CHUNK_BYTES
        if head.endswith("bf16"):
            self.model.set_frozen_weights_dtype("bfloat16")
        self.opt = riftco.Adam(self.model.parameters(), lr=1e-4)
        after = _current()
        self.held = {c: after[c] - before[c] for c in after}
        self.times: list[float] = []
        self.losses: list[float] = []
        self.peak: dict[str, int] = {}
        self.at_peak: dict[str, int] = {}

    def step(self, block: np.ndarray[Any, Any]) -> None:
        before = _current()
        riftco.reset_peak_memory_stats()
        t0 = time.perf_counter()
        loss = self.model.loss(block)
        loss.backward(retain_graph=False)
        self.opt.step()
        self.opt.zero_grad()  # releases the gradients, as PyTorch's zero_grad(set_to_none=True)
        value = loss.item()
        del loss
        self.times.append(time.perf_counter() - t0)
        self.losses.append(value)
        stats = riftco.memory_stats()
        self.peak = {
            c: stats[c]["peak_bytes"] - before[c] + self.held[c] for c in (*CATEGORIES, "total")
        }
        # What the total peak was made of: the categories at that moment (their own peaks can
        # lie elsewhere in the step).
        parts = riftco.peak_memory_breakdown()
        self.at_peak = {c: parts[c] - before[c] + self.held[c] for c in CATEGORIES}
        after = _current()
        for c in after:
            self.held[c] += after[c] - before[c]


class TorchRow:
    """The same LoRA step in PyTorch + PEFT (``LlamaForCausalLM``, float32)."""

    def __init__(self, shape: dict[str, Any], checkpointing: bool, lora: bool = True) -> None:
        import torch
        from peft import LoraConfig, get_peft_model
        from transformers import LlamaForCausalLM

        self.torch = torch
        self.label = (
            f"PyTorch{' + PEFT' if lora else ''}, "
            f"{'HF gradient checkpointing' if checkpointing else 'no checkpointing'}"
        )
        torch.manual_seed(0)
        config = llama_config(shape, attn_implementation="sdpa")
        model = LlamaForCausalLM(config).float()
        if checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
            if lora:
                model.enable_input_require_grads()
        lora_config = LoraConfig(
            r=LORA_RANK, lora_alpha=LORA_ALPHA, lora_dropout=0.0,
            target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
        )
        self.model = get_peft_model(model, lora_config) if lora else model
        self.model.train()
        self.opt = torch.optim.Adam([p for p in self.model.parameters() if p.requires_grad], lr=1e-4)
        self.calls = 0
        self.times: list[float] = []
        self.losses: list[float] = []
        self.peak: dict[str, int] = {}

    def step(self, block: np.ndarray[Any, Any]) -> None:
        """One step; the first runs under the profiler (its memory), the others are timed."""
        torch = self.torch
        ids = torch.from_numpy(block)
        alive = sum(p.numel() * p.element_size() for p in self.model.parameters())
        alive += sum(
            t.numel() * t.element_size()
            for s in self.opt.state.values() for t in s.values() if torch.is_tensor(t)
        )
        # The second step is profiled (its time is not kept): at the first, PyTorch's Adam
        # has no state yet, so its moments would be missing from the peak.
        self.calls += 1
        profiling = self.calls == 2
        context: Any = (
            torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True)
            if profiling else contextlib.nullcontext()
        )
        with context as prof:
            t0 = time.perf_counter()
            out = self.model(input_ids=ids[:, :-1])
            logits = out.logits
            loss = torch.nn.functional.cross_entropy(
                logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1)
            )
            del out, logits
            loss.backward()
            self.opt.step()
            self.opt.zero_grad(set_to_none=True)
            value = loss.item()
            del loss
            elapsed = time.perf_counter() - t0
        if not profiling:
            self.times.append(elapsed)
        self.losses.append(value)
        if profiling:
            self.peak = {"total": alive + peak_of_allocations(prof)}


def peak_of_allocations(prof: Any) -> int:
    """The highest running sum of a finished profile's CPU ``[memory]`` records (each
    allocation's bytes, each free's minus its bytes) in the order of their own timestamps: the
    peak, over the profile, of the bytes allocated above what was alive when it started.
    PyTorch's CPU allocator keeps no cache, so allocated bytes are live bytes."""
    from torch._C._autograd import DeviceType

    records = [
        e for e in prof.profiler.kineto_results.events()
        if e.name() == "[memory]" and e.device_type() == DeviceType.CPU
    ]
    records.sort(key=lambda e: e.start_ns())
    current = peak = 0
    for e in records:
        current += e.nbytes()
        peak = max(peak, current)
    return peak


COLORS = {
    "parameter": "#4c72b0", "gradient": "#dd8452", "optimizer_state": "#55a868",
    "activation": "#c44e52", "workspace": "#8172b3", "total": "#937860",
}


def plot(results_path: Path) -> Path:
    """Draws the rows of a ``--out`` file as stacked bars by category (PyTorch's rows, whose
    categories are not separated, as one bar of their total) next to the JSON file, as PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data = json.loads(results_path.read_text())
    rows = data["rows"]
    fig, ax = plt.subplots(figsize=(11, 5))
    for i, row in enumerate(rows):
        peak = row["peak_bytes"]
        top = peak["total"] / MIB
        if all(c in peak for c in CATEGORIES):
            # Each category's own peak, stacked; they need not coincide, so the stack can stand
            # above the total peak (the peak of the sum), drawn as a black line.
            bottom = 0.0
            for c in CATEGORIES:
                ax.bar(i, peak[c] / MIB, bottom=bottom, color=COLORS[c], label=c if i == 0 else None)
                bottom += peak[c] / MIB
            ax.hlines(top, i - 0.4, i + 0.4, colors="black", linewidth=2,
                      label="total peak" if i == 0 else None)
            top = max(top, bottom)
        else:
            seen = ax.get_legend_handles_labels()[1]
            ax.bar(i, top, color=COLORS["total"], label=None if "PyTorch total peak" in seen else "PyTorch total peak")
        ax.text(i, top, f"{peak['total'] / MIB:.0f} MiB\n{row['step_s']:.1f} s",
                ha="center", va="bottom", fontsize=8)
    def short(label: str) -> str:
        if label.startswith("riftco "):
            policy, head = label.removeprefix("riftco ").split(" ", 1)
            return f"riftco\n{policy}\n{head}"
        checkpointing = "no GC" if "no checkpointing" in label else "HF GC"
        return f"PyTorch\n+ PEFT\n{checkpointing}" if "PEFT" in label else f"PyTorch\n{checkpointing}"

    ax.set_xticks(range(len(rows)))
    ax.set_xticklabels([short(r["row"]) for r in rows], fontsize=8)
    ax.set_ylabel("peak MiB (bars: each category's peak; line: total)")
    ax.set_ylim(0, max(sum(r["peak_bytes"].get(c, 0) for c in CATEGORIES) for r in rows) / MIB * 1.2)
    ax.set_title(
        f"{data['model']}, {'every weight trained' if data.get('full') else 'LoRA r=8'}, "
        f"{data['batch']} x {data['seq']} tokens "
        f"({data['date']}, {data['host']} {data['simd']}, {data['threads']} threads)", fontsize=10
    )
    ax.legend(fontsize=8, loc="upper right")
    fig.tight_layout()
    out = results_path.with_suffix(".png")
    fig.savefig(out, dpi=110)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--plot", type=Path, default=None, help="draw a --out file and exit")
    parser.add_argument("--model", choices=[k for k in SHAPES if k != "quick"], default="smollm2-135m")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--policies", default="disabled,block")
    parser.add_argument(
        "--heads", default="unfused,chunked,chunked bf16",
        help="riftco loss heads to run (comma-separated; default all three)",
    )
    parser.add_argument(
        "--full", action="store_true",
        help="train every weight instead of LoRA adapters (no bf16 rows: a 16-bit base is frozen)",
    )
    parser.add_argument(
        "--sequential", action="store_true",
        help="build and run one row at a time (for shapes whose rows do not fit in memory "
        "together; the rows are then not interleaved)",
    )
    parser.add_argument("--quick", action="store_true", help="a tiny shape, 2 steps (smoke test)")
    parser.add_argument("--no-torch", action="store_true", help="riftco rows only")
    parser.add_argument("--out", type=Path, default=None, help="write the rows as JSON here")
    args = parser.parse_args()
    if args.plot is not None:
        print(plot(args.plot))
        return
    name = "quick" if args.quick else args.model
    shape = SHAPES[name]
    if args.quick:
        args.batch, args.seq, args.steps = 2, 32, 2  # PyTorch profiles its second step, untimed
    block = tokens(args.batch, args.seq, shape["vocab_size"])
    policies = args.policies.split(",")
    heads = [h.strip() for h in args.heads.split(",") if h.strip()]
    if args.full:
        heads = [h for h in heads if not h.endswith("bf16")]
    lora = not args.full
    makers: list[Any] = [
        (lambda p=p, h=h: RiftcoRow(shape, p, h, lora)) for p in policies for h in heads
    ]
    if not args.no_torch:
        try:
            import peft  # noqa: F401
            import torch
            import transformers  # noqa: F401

            torch.set_num_threads(riftco.num_threads())
            makers += [(lambda p=p: TorchRow(shape, p != "disabled", lora)) for p in policies]
        except ImportError as e:
            print(f"PyTorch + PEFT rows skipped: {e} (pip install torch transformers peft)")
    print(
        f"{name}: {args.batch} x {args.seq} tokens, "
        + ("every weight trained, " if args.full else f"LoRA r={LORA_RANK} on all projections, ")
        + f"{riftco.num_threads()} threads, SIMD {riftco.simd_level()}, {args.steps} timed steps"
        + (", one row at a time" if args.sequential else ", rows interleaved")
    )
    groups = [[make] for make in makers] if args.sequential else [makers]
    results = []
    for group in groups:
        rows = [make() for make in group]
        for i in range(args.steps + 1):  # round robin; step 0 is the warm-up
            for row in rows:
                row.step(block)
                if i == 0:
                    row.times.clear()
        for row in rows:
            median = statistics.median(row.times)
            entry = {"row": row.label, "step_s": median, "loss": row.losses[-1], "peak_bytes": row.peak}
            if getattr(row, "at_peak", None):
                entry["at_total_peak_bytes"] = row.at_peak
            results.append(entry)
        del rows
    ref = {r["row"]: r for r in results}
    header = f"| {'row':<52} | step s | peak MiB | " + " | ".join(CATEGORIES) + " |"
    print(header)
    print("|" + "---|" * (3 + len(CATEGORIES)))
    for r in results:
        p = r["peak_bytes"]
        cats = " | ".join(f"{p[c] / MIB:.0f}" if c in p else "" for c in CATEGORIES)
        print(f"| {r['row']:<52} | {r['step_s']:.2f} | {p['total'] / MIB:.0f} | {cats} |")
    for r in results:
        if "at_total_peak_bytes" in r:
            at = r["at_total_peak_bytes"]
            print(f"{r['row']}: at the total peak " + ", ".join(f"{c} {at[c] / MIB:.1f}" for c in CATEGORIES) + " MiB")
    for policy in policies:
        row = {h: ref.get(f"riftco {policy} {h}") for h in ("unfused", "chunked", "chunked bf16")}
        chunked, unfused, bf16 = row["chunked"], row["unfused"], row["chunked bf16"]
        if chunked is not None and bf16 is not None:
            print(
                f"{policy}: chunked bf16 / chunked peak {bf16['peak_bytes']['total'] / chunked['peak_bytes']['total']:.3f}, "
                f"step {bf16['step_s'] / chunked['step_s']:.3f}"
            )
        if chunked is not None and unfused is not None:
            print(
                f"{policy}: chunked / unfused peak {chunked['peak_bytes']['total'] / unfused['peak_bytes']['total']:.3f}, "
                f"step {chunked['step_s'] / unfused['step_s']:.3f}; losses {chunked['loss']:.6f} / {unfused['loss']:.6f}"
            )
        torch_label = (
            f"PyTorch{'' if args.full else ' + PEFT'}, "
            f"{'HF gradient checkpointing' if policy != 'disabled' else 'no checkpointing'}"
        )
        if torch_label in ref:
            t = ref[torch_label]
            for r in (chunked, bf16):
                if r is None:
                    continue
                print(
                    f"{policy}: {r['row']} / {torch_label}: peak "
                    f"{r['peak_bytes']['total'] / t['peak_bytes']['total']:.3f}, step {r['step_s'] / t['step_s']:.3f}"
                )
    if args.out is not None:
        args.out.write_text(json.dumps({
            "date": datetime.date.today().isoformat(), "host": platform.machine(),
            "simd": riftco.simd_level(), "threads": riftco.num_threads(), "model": name,
            "batch": args.batch, "seq": args.seq, "sequential": args.sequential, "full": args.full,
            "rows": results,
        }, indent=1) + "\n")


if __name__ == "__main__":
    main()
