"""Peak resident memory of a whole process — loading a Hugging Face folder and one LoRA training
step — riftco beside PyTorch + PEFT, each in its own child process.

``memory_real_models.py`` counts the bytes a step allocates (riftco's exact counters, PyTorch's
profiler). This benchmark asks the operating system instead: each side runs in a fresh child
process that imports its libraries, loads the same model folder, enables LoRA r=8 (alpha 16) on
all seven projections, and trains one step with activation checkpointing (riftco's ``block``
policy; Hugging Face gradient checkpointing, non-reentrant) on ``--batch`` x ``--seq`` random
tokens; the child then reads its own high-water mark, ``VmHWM`` in ``/proc/self/status`` (Linux
only). A child that only imports the same libraries gives the baseline; both figures are printed.
(``ru_maxrss`` would be useless here: a child inherits its parent's peak at exec.)

The folder is written once in bfloat16, the format published checkpoints come in, with
transformers (random weights, seeded) when it imports, else with riftco's own writer (float32).
riftco loads it with ``dtype="bfloat16"`` (the frozen base stays 16-bit; adapters and Adam state
float32); PyTorch loads it as float32 (``dtype=torch.float32``), as CPU training with PEFT
does — ``--torch-dtype bfloat16`` keeps PyTorch's base in bfloat16 too.

    python benches/resident_real_models.py                                # smollm2-135m, 4 x 256
    python benches/resident_real_models.py --model llama-3.2-1b --batch 1 --seq 1024
    python benches/resident_real_models.py --no-torch                     # riftco only

Run with a Python that has riftco (and, for the PyTorch row, torch, transformers and peft).
The children run one after another, never at once.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

MIB = 2**20
HERE = Path(__file__).resolve().parent
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def vm_hwm() -> int:
    """This process's peak resident bytes (``VmHWM``)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/self/status (Linux only)")


def child_riftco(folder: str, batch: int, seq: int, import_only: bool) -> dict[str, Any]:
    import numpy as np

    import riftco

    if import_only:
        return {"peak": vm_hwm()}
    t0 = time.perf_counter()
    model = riftco.load_model(folder, dtype="bfloat16")
    load_s = time.perf_counter() - t0
    model.set_activation_checkpointing("block")
    model.enable_lora(rank=8, alpha=16.0, mlp=True)
    opt = riftco.Adam(model.parameters(), lr=1e-4)
    vocab = model.config.vocab_size
    ids = np.random.default_rng(0).integers(0, vocab, size=(batch, seq + 1), dtype=np.int64)
    t0 = time.perf_counter()
    loss = model.loss(ids)
    loss.backward(retain_graph=False)
    opt.step()
    opt.zero_grad()
    value = loss.item()
    step_s = time.perf_counter() - t0
    return {"peak": vm_hwm(), "load_s": load_s, "step_s": step_s, "loss": value}


def child_torch(folder: str, batch: int, seq: int, import_only: bool, dtype: str) -> dict[str, Any]:
    import numpy as np
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaForCausalLM

    if import_only:
        return {"peak": vm_hwm()}
    t0 = time.perf_counter()
    model = LlamaForCausalLM.from_pretrained(folder, dtype=getattr(torch, dtype))
    load_s = time.perf_counter() - t0
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.enable_input_require_grads()
    config = LoraConfig(r=8, lora_alpha=16.0, lora_dropout=0.0, target_modules=TARGETS)
    peft_model = get_peft_model(model, config)
    if dtype != "float32":  # adapters in float32, as riftco's
        for p in peft_model.parameters():
            if p.requires_grad:
                p.data = p.data.float()
    peft_model.train()
    opt = torch.optim.Adam([p for p in peft_model.parameters() if p.requires_grad], lr=1e-4)
    vocab = model.config.vocab_size
    ids = torch.from_numpy(
        np.random.default_rng(0).integers(0, vocab, size=(batch, seq + 1), dtype=np.int64)
    )
    t0 = time.perf_counter()
    logits = peft_model(input_ids=ids[:, :-1]).logits
    loss = torch.nn.functional.cross_entropy(
        logits.reshape(-1, logits.shape[-1]).float(), ids[:, 1:].reshape(-1)
    )
    del logits
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    value = loss.item()
    step_s = time.perf_counter() - t0
    return {"peak": vm_hwm(), "load_s": load_s, "step_s": step_s, "loss": value}


def write_folder(shape: dict[str, Any], folder: Path) -> str:
    """The model folder, bfloat16 through transformers when it imports, else riftco's float32."""
    if all(importlib.util.find_spec(m) for m in ("torch", "transformers")):
        import torch
        from transformers import LlamaForCausalLM

        from memory_real_models import llama_config

        torch.manual_seed(0)
        config = llama_config(shape, dtype="bfloat16")
        model = LlamaForCausalLM._from_config(config, dtype=torch.bfloat16)
        model.save_pretrained(folder)
        del model
        return "bfloat16, written by transformers"
    import riftco

    folder.mkdir()
    riftco.DecoderOnlyTransformer(riftco.TransformerConfig(**shape, seed=0)).save(str(folder / "model.safetensors"))
    return "float32, written by riftco (transformers is not installed)"


def run_child(args: list[str]) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), "--child", *args],
        capture_output=True, text=True, timeout=3600,
    )
    if out.returncode != 0:
        raise RuntimeError(f"child {args} failed:\n{out.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    sys.path.insert(0, str(HERE))
    from memory_real_models import SHAPES

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=["smollm2-135m", "llama-3.2-1b", "quick"], default="smollm2-135m")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--torch-dtype", choices=["float32", "bfloat16"], default="float32")
    parser.add_argument("--no-torch", action="store_true", help="riftco only")
    parser.add_argument("--out", type=Path, default=None, help="write the rows as JSON here")
    parser.add_argument("--child", nargs=5, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        side, folder, batch, seq, mode = args.child
        import_only = mode == "import"
        if side == "riftco":
            result = child_riftco(folder, int(batch), int(seq), import_only)
        else:
            result = child_torch(folder, int(batch), int(seq), import_only, mode if not import_only else "float32")
        print(json.dumps(result))
        return

    shape = SHAPES[args.model]
    sides = ["riftco"]
    if args.no_torch:
        print("PyTorch row skipped: --no-torch")
    elif not all(importlib.util.find_spec(m) for m in ("torch", "transformers", "peft")):
        print("PyTorch row skipped: torch, transformers and peft are needed (pip install torch transformers peft)")
    else:
        sides.append("torch")
    rows = []
    with tempfile.TemporaryDirectory(prefix="riftco-resident-") as tmp:
        folder = Path(tmp) / args.model
        t0 = time.perf_counter()
        written = write_folder(shape, folder)
        size = sum(p.stat().st_size for p in folder.iterdir())
        print(f"{args.model}: folder {size / MIB:.0f} MiB ({written}) in {time.perf_counter() - t0:.0f} s")
        for side in sides:
            mode = "run" if side == "riftco" else args.torch_dtype
            base = run_child([side, str(folder), str(args.batch), str(args.seq), "import"])
            res = run_child([side, str(folder), str(args.batch), str(args.seq), mode])
            row = {
                "side": side if side == "riftco" else f"PyTorch + PEFT + GC ({args.torch_dtype} base)",
                "peak_resident_mib": res["peak"] / MIB,
                "import_only_mib": base["peak"] / MIB,
                "above_import_mib": (res["peak"] - base["peak"]) / MIB,
                "load_s": res["load_s"], "step_s": res["step_s"], "loss": res["loss"],
            }
            rows.append(row)
            print(
                f"{row['side']:<40} peak resident {row['peak_resident_mib']:8.0f} MiB "
                f"(import only {row['import_only_mib']:.0f}, above it {row['above_import_mib']:.0f}); "
                f"load {row['load_s']:.1f} s, step {row['step_s']:.1f} s, loss {row['loss']:.4f}"
            )
    if len(rows) == 2:
        print(
            f"riftco / PyTorch: peak resident {rows[0]['peak_resident_mib'] / rows[1]['peak_resident_mib']:.3f}x, "
            f"step {rows[0]['step_s'] / rows[1]['step_s']:.3f}x"
        )
    if args.out:
        meta = {
            "date": datetime.date.today().isoformat(), "host": platform.node(),
            "model": args.model, "batch": args.batch, "seq": args.seq, "folder": written,
        }
        args.out.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
