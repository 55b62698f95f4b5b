"""QLoRA: LoRA steps on a quantized frozen base, riftco beside PyTorch + PEFT (+ bitsandbytes NF4).

Models:
- ``smollm2`` (default): the real SmolLM2-135M-Instruct as llama.cpp's Q4_1 GGUF (``--gguf``;
  ``scripts/fetch_smollm2.sh`` fetches it), and a bfloat16 Hugging Face folder of the same
  weights written by riftco (the GGUF dequantized to float32, saved as bfloat16 with its
  ``config.json``; no tokenizer). Tokens: the repository's ``docs/*.md`` (sorted by name,
  concatenated) encoded with the GGUF's own tokenizer (``riftco.load_tokenizer``), the first
  ``batch * (seq + 1)`` ids.
- ``llama-3.2-1b``: Llama-3.2-1B's shape with riftco's seeded random weights, written as a
  bfloat16 folder; random token ids (seed 0).
- ``quick``: a tiny random shape (``--quick``; the smoke test).

Rows (LoRA r=8, alpha 16, all seven projections, Adam lr 1e-4, ``block`` checkpointing /
Hugging Face gradient checkpointing, riftco's chunked loss head at ``DEFAULT_LOSS_CHUNK_BYTES``):
- ``riftco gguf``: the GGUF's quantized blocks as stored (``riftco.load_model(gguf)``);
- ``riftco nf4`` (each ``--quant``): the bfloat16 folder quantized on load
  (``load_model(folder, dtype="nf4")``: QLoRA's NF4, block 64, double-quantized absmax);
- ``riftco bf16``: the folder's weights kept in bfloat16 (``dtype="bfloat16"``), the step-time
  reference of the quantized rows;
- ``PyTorch + PEFT + bnb NF4 + GC``: ``LlamaForCausalLM.from_pretrained(folder,
  quantization_config=BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
  bnb_4bit_use_double_quant=True, bnb_4bit_compute_dtype=torch.float32), dtype=torch.float32)``
  on the CPU: every ``nn.Linear`` of the blocks in NF4, the (tied) embedding and the norms in
  float32 (bitsandbytes does not quantize embeddings); PEFT LoRA with the same rank, alpha and
  targets; non-reentrant gradient checkpointing; ``--peer-steps`` timed steps, ``--no-bnb``
  skips it;
- ``PyTorch + PEFT + GC``: the same folder loaded in float32.

How the peak is counted, for every row the same thing: the highest sum of the bytes alive at
one moment of a step — parameters (frozen and trained), gradients, optimizer state,
activations, logits, temporaries.
- riftco: ``riftco.memory_stats()``'s total peak over the step (the peak of the sum of its
  categories), by category, and what that peak was made of (``riftco.peak_memory_breakdown()``).
- PyTorch: the bytes alive before the step (the distinct storages of the parameters and
  buffers, bitsandbytes' quantization state — absmax, nested absmax, codebooks — and the Adam
  moments) plus the peak, over the step, of the running sum of every CPU allocation and free
  the profiler records (``profile_memory=True``: one ``[memory]`` record per allocation, with
  its size, and per free, with minus its size), taken in the order of the records' own
  timestamps. PyTorch's CPU allocator has no cache: an allocation is live bytes until its free.
  That is what PyTorch's own memory timeline (``torch.profiler``'s ``_memory_profile()``,
  ``export_memory_timeline``) sums; it agrees with it to within a few KiB and needs no stacks
  or shapes recorded.

Why ``benches/memory_real_models.py`` read 995 MiB for PyTorch + PEFT + GC on SmolLM2's shape
(4 x 256 tokens, float32) where PyTorch's memory timeline read 1379 MiB: two things, 192 MiB
each (a logits-sized float32 buffer, 4 x 256 x 49152 x 4 bytes), both measured on that row
(random weights, one profiled step after the warm-up; parameters and Adam state 541.1 MiB):
- the old count summed each op's *self* memory (``self_cpu_memory_usage``: the op's own
  allocations minus its own frees, its children's excluded) at the op's *start* time. A parent
  that frees what its children allocated carries a negative self memory, counted before the
  children's allocations because the parent starts first: ``LogSoftmaxBackward0``'s node frees
  384 MiB its children (``nll_loss_backward``, ``_log_softmax_backward_data``) allocated, so a
  logits-sized buffer that was alive at the peak was cancelled before it was added. Counting
  each allocation and free at its own time: 1187.1 MiB, what the memory timeline gives for the
  same step (1187.1; the old count 995.1);
- the 1379 MiB kept the logits alive through the backward (a reference to ``out.logits`` held
  by the caller): the same step with the logits held gives 1379.1 MiB by the allocation records
  (1187.1 by the old count). Both are real programs; the bench drops its references to the
  logits before ``backward()``, as Hugging Face's ``Trainer`` does (its ``compute_loss``
  returns the loss alone), the peer at its leanest. The same holds for the bitsandbytes peer:
  the issue's 1027 MiB is this bench's 835 MiB plus the held logits.

The profiled step is the second (after a warm-up that creates the Adam moments) and is not
timed; riftco's counters cost nothing and every riftco step is measured. Step time: the
median of ``--steps`` steps after one warm-up (``--peer-steps`` for the PyTorch rows; with
``--peer-steps 0`` the profiled step's time stands in, marked ``timed_under_profiler``). Rows
are interleaved step by step in one process on the same thread count (``--sequential``: one
row at a time, for shapes whose rows do not fit in memory together).

    python benches/qlora_real_models.py --peer-steps 1 --out benches/results/qlora_smollm2.json
    python benches/qlora_real_models.py --model llama-3.2-1b --batch 1 --seq 1024 --steps 2 \
        --no-bnb --sequential --out benches/results/qlora_llama.json
    python benches/qlora_real_models.py --quick --no-torch   # a tiny shape (CI smoke)

Needs riftco; the peers need torch, transformers, peft (and bitsandbytes for the NF4 peer):
without them those rows are skipped with the reason.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from memory_real_models import (  # noqa: E402
    CATEGORIES,
    LORA_ALPHA,
    LORA_RANK,
    MIB,
    SHAPES,
    RiftcoRow,
    _current,
    peak_of_allocations,
)

import riftco  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_GGUF = Path(
    os.environ.get("RIFTCO_SMOLLM2_GGUF")
    or Path(os.environ.get("RIFTCO_MODEL_CACHE") or Path.home() / ".cache/riftco/models")
    / "SmolLM2-135M-Instruct.Q4_1.gguf"
)
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
POLICY = "block"
# The targets: (numerator row kind, denominator row kind, what, bound).
PEAK_VS_BNB, STEP_VS_BF16, STEP_VS_BNB, PEAK_VS_TORCH = 0.25, 1.15, 0.1, 0.30


def write_bf16_folder(folder: Path, gguf: Path | None, shape: dict[str, Any]) -> None:
    """A bfloat16 Hugging Face folder (``model.safetensors`` + ``config.json``): the GGUF's
    weights dequantized to float32, else riftco's seeded random weights of ``shape``."""
    if gguf is not None:
        model = riftco.load_model(gguf, dtype="float32")
    else:
        model = riftco.DecoderOnlyTransformer(riftco.TransformerConfig(**shape, seed=0))
    folder.mkdir(parents=True, exist_ok=True)
    model.save(folder / "model.safetensors", dtype="bfloat16")
    del model


def text_tokens(gguf: Path, batch: int, seq: int) -> np.ndarray[Any, Any]:
    """``[batch, seq + 1]`` ids of the repository's docs (sorted ``docs/*.md``, concatenated)
    encoded with the GGUF's tokenizer."""
    tok = riftco.load_tokenizer(gguf)
    need = batch * (seq + 1)
    ids: list[int] = []
    for path in sorted((ROOT / "docs").glob("*.md")):
        ids += tok.encode(path.read_text())
        if len(ids) >= need:
            break
    if len(ids) < need:
        raise SystemExit(f"docs/*.md give {len(ids)} tokens, {need} needed")
    return np.asarray(ids[:need], dtype=np.int64).reshape(batch, seq + 1)


class RiftcoLoadedRow(RiftcoRow):
    """A riftco LoRA row on a loaded model (``riftco.load_model(path, dtype=...)``), measured as
    :class:`memory_real_models.RiftcoRow` measures (the row's own bytes between steps plus its
    step's peak above the counters before it)."""

    def __init__(self, label: str, path: Path, dtype: str | None, loss_chunk_bytes: int) -> None:
        self.label = label
        before = _current()
        self.model = riftco.load_model(path, dtype=dtype, activation_checkpointing=POLICY)
        self.frozen_dtype = self.model.frozen_weights_dtype
        self.model.enable_lora(rank=LORA_RANK, alpha=LORA_ALPHA, mlp=True)
        self.model.loss_chunk_bytes = loss_chunk_bytes
        self.opt = riftco.Adam(self.model.parameters(), lr=1e-4)
        after = _current()
        self.held = {c: after[c] - before[c] for c in after}
        self.times: list[float] = []
        self.losses: list[float] = []
        self.peak: dict[str, int] = {}
        self.at_peak: dict[str, int] = {}


def _storages(tensors: Any) -> dict[int, int]:
    """Distinct storages (by data pointer) and their bytes of the tensors in ``tensors``."""
    import torch

    out: dict[int, int] = {}
    for t in tensors:
        if torch.is_tensor(t) and t.device.type == "cpu":
            s = t.untyped_storage()
            out[s.data_ptr()] = s.nbytes()
    return out


def _quant_state_tensors(state: Any) -> list[Any]:
    """The tensors of a bitsandbytes ``QuantState`` (absmax, codebook, offset, and the nested
    state of double quantization)."""
    import torch

    found = []
    for value in vars(state).values():
        if torch.is_tensor(value):
            found.append(value)
        elif type(value).__name__ == "QuantState":
            found += _quant_state_tensors(value)
    return found


class TorchPeerRow:
    """PyTorch + PEFT LoRA with gradient checkpointing on the bf16 folder, loaded in float32 or
    in bitsandbytes NF4."""

    def __init__(self, folder: Path, bnb: bool, timed_steps: int) -> None:
        import torch
        from peft import LoraConfig, get_peft_model
        from transformers import LlamaForCausalLM

        self.torch = torch
        self.label = "PyTorch + PEFT + bnb NF4 + GC" if bnb else "PyTorch + PEFT + GC"
        self.kind = "bnb" if bnb else "torch"
        extra: dict[str, Any] = {}
        if bnb:
            from transformers import BitsAndBytesConfig

            extra["quantization_config"] = BitsAndBytesConfig(
                load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                bnb_4bit_compute_dtype=torch.float32,
            )
            extra["device_map"] = "cpu"
        model = LlamaForCausalLM.from_pretrained(
            folder, dtype=torch.float32, attn_implementation="sdpa", **extra
        )
        model.config.use_cache = False
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.enable_input_require_grads()
        config = LoraConfig(
            r=LORA_RANK, lora_alpha=LORA_ALPHA, lora_dropout=0.0, target_modules=TARGETS
        )
        self.model = get_peft_model(model, config)
        self.model.train()
        self.opt = torch.optim.Adam([p for p in self.model.parameters() if p.requires_grad], lr=1e-4)
        self.total_steps = 2 + timed_steps  # warm-up, profiled, timed
        self.calls = 0
        self.times: list[float] = []
        self.losses: list[float] = []
        self.peak: dict[str, int] = {}
        self.profiled_step_s = 0.0

    def alive(self) -> dict[str, int]:
        """Bytes alive between steps: parameters, buffers and quantization state (``parameter``,
        LoRA's included) and the Adam moments (``optimizer_state``), each storage once."""
        torch = self.torch
        weights = list(self.model.parameters()) + list(self.model.buffers())
        for p in self.model.parameters():
            state = getattr(p, "quant_state", None)
            if state is not None:
                weights += _quant_state_tensors(state)
        params = _storages(weights)
        moments = _storages(
            t for s in self.opt.state.values() for t in s.values() if torch.is_tensor(t)
        )
        moments = {k: v for k, v in moments.items() if k not in params}
        return {"parameter": sum(params.values()), "optimizer_state": sum(moments.values())}

    def step(self, block: np.ndarray[Any, Any]) -> None:
        torch = self.torch
        ids = torch.from_numpy(block)
        self.calls += 1
        profiling = self.calls == 2
        alive = self.alive()
        prof: Any = None
        if profiling:
            prof = torch.profiler.profile(
                activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True
            )
            prof.__enter__()
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
        self.losses.append(value)
        if not profiling:
            if self.calls > 1:  # the first is the warm-up
                self.times.append(elapsed)
            return
        prof.__exit__(None, None, None)
        self.profiled_step_s = elapsed
        step_peak = peak_of_allocations(prof)
        self.peak = {**alive, "step_above_alive": step_peak, "total": sum(alive.values()) + step_peak}

    @property
    def done(self) -> bool:
        return self.calls >= self.total_steps


def ratio(rows: dict[str, dict[str, Any]], num: str, den: str, what: str) -> float | None:
    a, b = rows.get(num), rows.get(den)
    if a is None or b is None:
        return None
    if what == "peak":
        return float(a["peak_bytes"]["total"] / b["peak_bytes"]["total"])
    return float(a["step_s"] / b["step_s"])


def targets(rows: dict[str, dict[str, Any]], quantized: list[str], model: str) -> list[dict[str, Any]]:
    """The issue's targets, for every quantized riftco row present: (what, value, bound, met)."""
    checks: list[tuple[str, str, str, str, float]] = []
    for q in quantized:
        if model == "llama-3.2-1b":
            checks.append((q, "PyTorch + PEFT + GC", "peak", "<=", PEAK_VS_TORCH))
        else:
            checks += [
                (q, "PyTorch + PEFT + bnb NF4 + GC", "peak", "<=", PEAK_VS_BNB),
                (q, "riftco bf16", "step", "<=", STEP_VS_BF16),
                (q, "PyTorch + PEFT + bnb NF4 + GC", "step", "<=", STEP_VS_BNB),
            ]
            checks.append((q, "PyTorch + PEFT + GC", "peak", "", 0.0))  # reported, no target
    out = []
    for num, den, what, _, bound in checks:
        value = ratio(rows, num, den, what)
        if value is None:
            continue
        entry: dict[str, Any] = {"ratio": f"{what}: {num} / {den}", "value": value}
        if bound:
            entry |= {"bound": bound, "met": value <= bound}
        out.append(entry)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=["smollm2", "llama-3.2-1b", "quick"], default="smollm2")
    parser.add_argument("--gguf", type=Path, default=DEFAULT_GGUF, help="the SmolLM2 GGUF")
    parser.add_argument("--folder", type=Path, default=None,
                        help="the bf16 folder: reused when it holds model.safetensors, else "
                        "written there (default: a temporary folder)")
    parser.add_argument("--quant", default="nf4", help="riftco quantize-on-load dtypes (comma-separated)")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--steps", type=int, default=3, help="timed riftco steps after a warm-up")
    parser.add_argument("--peer-steps", type=int, default=None,
                        help="timed PyTorch steps after the warm-up and the profiled step "
                        "(default --steps; 0: the profiled step's time)")
    parser.add_argument("--loss-chunk-bytes", default=None,
                        help="riftco's loss chunk budget (bytes or e.g. '8MiB'; default "
                        "DEFAULT_LOSS_CHUNK_BYTES): a smaller one shows the peak outside the loss")
    parser.add_argument("--no-torch", action="store_true", help="riftco rows only")
    parser.add_argument("--no-bnb", action="store_true", help="no bitsandbytes NF4 peer")
    parser.add_argument("--no-bf16", action="store_true", help="no riftco bf16 row")
    parser.add_argument("--sequential", action="store_true",
                        help="build and run one row at a time (not interleaved)")
    parser.add_argument("--quick", action="store_true",
                        help="the tiny random shape, 2 x 32 tokens, 2 steps (smoke test)")
    parser.add_argument("--out", type=Path, default=None, help="write the rows as JSON here")
    args = parser.parse_args()
    if args.quick:
        args.model, args.batch, args.seq, args.steps = "quick", 2, 32, 2
    peer_steps = args.steps if args.peer_steps is None else args.peer_steps
    chunk = (riftco.DEFAULT_LOSS_CHUNK_BYTES if args.loss_chunk_bytes is None
             else riftco.parse_byte_size(args.loss_chunk_bytes))
    shape = {"smollm2": SHAPES["smollm2-135m"], "llama-3.2-1b": SHAPES["llama-3.2-1b"],
             "quick": SHAPES["quick"]}[args.model]
    gguf: Path | None = None
    if args.model == "smollm2":
        if not args.gguf.is_file():
            raise SystemExit(f"no GGUF at {args.gguf}: bash scripts/fetch_smollm2.sh, or --gguf")
        gguf = args.gguf
    tmp = tempfile.TemporaryDirectory(prefix="qlora-bench-")
    folder = args.folder or Path(tmp.name) / "bf16"
    if not (folder / "model.safetensors").is_file():
        t0 = time.perf_counter()
        write_bf16_folder(folder, gguf, shape)
        print(f"wrote the bf16 folder {folder} in {time.perf_counter() - t0:.1f} s")
    if gguf is not None:
        block, token_source = text_tokens(gguf, args.batch, args.seq), "docs/*.md, the GGUF's tokenizer"
        shape = dict(shape, vocab_size=riftco.load_tokenizer(gguf).vocab_size)
    else:
        block = np.random.default_rng(0).integers(
            0, shape["vocab_size"], size=(args.batch, args.seq + 1), dtype=np.int64)
        token_source = "random ids (seed 0)"

    makers: list[tuple[str, Callable[[], Any]]] = []
    quantized: list[str] = []
    if gguf is not None:
        makers.append(("riftco gguf", lambda: RiftcoLoadedRow("riftco gguf", gguf, None, chunk)))
        quantized.append("riftco gguf")
    for q in [q.strip() for q in args.quant.split(",") if q.strip()]:
        makers.append((f"riftco {q}", lambda q=q: RiftcoLoadedRow(f"riftco {q}", folder, q, chunk)))
        quantized.append(f"riftco {q}")
    if not args.no_bf16:
        makers.append(("riftco bf16", lambda: RiftcoLoadedRow("riftco bf16", folder, "bfloat16", chunk)))
    skipped: dict[str, str] = {}
    if not args.no_torch:
        try:
            import peft  # noqa: F401
            import torch
            import transformers  # noqa: F401

            torch.set_num_threads(riftco.num_threads())
            if not args.no_bnb:
                makers.append(("PyTorch + PEFT + bnb NF4 + GC",
                               lambda: TorchPeerRow(folder, True, peer_steps)))
            makers.append(("PyTorch + PEFT + GC", lambda: TorchPeerRow(folder, False, peer_steps)))
        except ImportError as e:
            skipped["PyTorch + PEFT rows"] = f"{e} (pip install torch transformers peft bitsandbytes)"
    print(
        f"{args.model}: {args.batch} x {args.seq} tokens ({token_source}), LoRA r={LORA_RANK} on "
        f"all projections, {POLICY}, loss chunks of {chunk / MIB:g} MiB, {riftco.num_threads()} threads, SIMD "
        f"{riftco.simd_level()}, {args.steps} timed riftco steps, {peer_steps} timed PyTorch steps"
        + (", one row at a time" if args.sequential else ", rows interleaved")
    )
    groups = [[m] for m in makers] if args.sequential else [makers]
    results: list[dict[str, Any]] = []
    for group in groups:
        rows: list[Any] = []
        for label, make in group:
            try:
                t0 = time.perf_counter()
                rows.append(make())
                print(f"{label}: built in {time.perf_counter() - t0:.1f} s", flush=True)
            except (ImportError, riftco.ConfigError) as e:
                skipped[label] = f"{type(e).__name__}: {e}"
                print(f"{label} skipped: {skipped[label]}")
        def finished(row: Any) -> bool:
            return row.done if isinstance(row, TorchPeerRow) else len(row.losses) > args.steps
        while not all(finished(r) for r in rows):  # round robin; riftco's step 0 is the warm-up
            for row in rows:
                if finished(row):
                    continue
                row.step(block)
                if isinstance(row, RiftcoRow) and len(row.losses) == 1:
                    row.times.clear()
                print(f"  {row.label}: step {len(row.losses)} loss {row.losses[-1]:.4f}", flush=True)
        for row in rows:
            entry: dict[str, Any] = {"row": row.label, "loss": row.losses[-1], "peak_bytes": row.peak,
                                     "step_times_s": row.times}
            if isinstance(row, TorchPeerRow):
                entry["profiled_step_s"] = row.profiled_step_s
                if not row.times:
                    entry["timed_under_profiler"] = True
                    row.times = [row.profiled_step_s]
            else:
                entry["at_total_peak_bytes"] = row.at_peak
                entry["frozen_weights_dtype"] = row.frozen_dtype
            entry["step_s"] = statistics.median(row.times)
            results.append(entry)
        del rows
    by_label = {r["row"]: r for r in results}
    print(f"| {'row':<32} | step s | peak MiB | " + " | ".join(CATEGORIES) + " |")
    print("|" + "---|" * (3 + len(CATEGORIES)))
    for r in results:
        p = r["peak_bytes"]
        cats = " | ".join(f"{p[c] / MIB:.1f}" if c in p else "" for c in CATEGORIES)
        print(f"| {r['row']:<32} | {r['step_s']:.2f} | {p['total'] / MIB:.1f} | {cats} |")
    for r in results:
        if "at_total_peak_bytes" in r:
            at = r["at_total_peak_bytes"]
            print(f"{r['row']} at its total peak: "
                  + ", ".join(f"{c} {at[c] / MIB:.1f}" for c in CATEGORIES) + " MiB")
        else:
            p = r["peak_bytes"]
            print(f"{r['row']}: alive between steps parameter {p['parameter'] / MIB:.1f}, "
                  f"optimizer_state {p['optimizer_state'] / MIB:.1f}; step peak above them "
                  f"{p['step_above_alive'] / MIB:.1f} MiB")
    checks = targets(by_label, quantized, args.model)
    for c in checks:
        bound = f" (target <= {c['bound']}: {'met' if c['met'] else 'NOT met'})" if "bound" in c else ""
        print(f"{c['ratio']}: {c['value']:.3f}{bound}")
    for label, why in skipped.items():
        print(f"{label} skipped: {why}")
    if args.out is not None:
        args.out.write_text(json.dumps({
            "date": datetime.date.today().isoformat(), "host": platform.machine(),
            "simd": riftco.simd_level(), "threads": riftco.num_threads(), "model": args.model,
            "gguf": gguf.name if gguf else None, "tokens": token_source,
            "batch": args.batch, "seq": args.seq, "policy": POLICY, "loss_chunk_bytes": chunk,
            "steps": args.steps,
            "peer_steps": peer_steps, "sequential": args.sequential, "rows": results,
            "targets": checks, "skipped": skipped,
        }, indent=1) + "\n")
    tmp.cleanup()


if __name__ == "__main__":
    main()
