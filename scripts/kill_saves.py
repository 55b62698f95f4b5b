"""kill -9 during back-to-back saves into one folder: is the folder always one save, whole?

A child process saves, as fast as it can, into one folder: ``model.save`` alternating a
2-layer and a 3-layer model, or ``save_lora`` alternating LoRA rank 4 and rank 8. The parent
kills it with SIGKILL at a random moment (seeded), then checks the folder as three readers see
it:

- riftco: the folder loads, and its weights equal exactly one of the two originals;
- any reader: ``config.json`` (``adapter_config.json``) describes the weights file beside it
  (``num_hidden_layers`` against the layers in the safetensors header; ``r`` against the
  ``lora_A`` shapes);
- Hugging Face transformers and PEFT, when a Python with them is given (``--hf-python``, or this
  Python when it has them): each killed folder is copied aside and loaded with
  ``LlamaForCausalLM.from_pretrained`` / ``PeftModel.from_pretrained`` at the end, and a weight
  compared with the originals.

It also checks that ``tokenizer.json`` and ``README.md``, put in the folder beforehand, are
still there and unchanged, and that after one more normal save no temporary of ours
(``.<name>.tmp.<pid>.<n>``) remains beside or inside the folder.

Usage: ``.venv/bin/python scripts/kill_saves.py [--kills 60] [--seed 5] [--hf-python PY]``
[--fallback] (half the kills in model saves, half in LoRA saves). Prints the counts; exits 1 when a folder
was mismatched or a temporary was left.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import random
import resource
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import textwrap
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

import riftco

MEMORY_LIMIT_BYTES = 4_000_000_000
CHILD_TIMEOUT_S = 60
SIZES: dict[str, Any] = dict(vocab_size=256, d_model=128, n_heads=4, d_ff=256, max_seq_len=32)
LAYERS = (2, 3)
RANKS = (4, 8)
TOKENIZER = b'{"version": "1.0", "model": {"type": "BPE"}}\n'
README = b"# A model card other programs keep here\n"

SAVE_LOOP = """
    import sys, riftco
    what, target, first = sys.argv[1], sys.argv[2], int(sys.argv[3])
    sizes = dict(vocab_size=256, d_model=128, n_heads=4, d_ff=256, max_seq_len=32)
    def base(n_layers):
        return riftco.DecoderOnlyTransformer(
            riftco.TransformerConfig(n_layers=n_layers, seed=n_layers, **sizes))
    if what == "model":
        models = [base(2), base(3)]
        save = lambda m: m.save(target + "/model.safetensors")
    else:
        models = []
        for rank in (4, 8):
            m = base(2)
            m.enable_lora(rank=rank, alpha=2.0 * rank, seed=rank)
            models.append(m)
        save = lambda m: m.save_lora(target)
    print("ready", flush=True)
    i = first
    while True:
        save(models[i % 2])
        i += 1
"""


def base(n_layers: int) -> riftco.DecoderOnlyTransformer:
    return riftco.DecoderOnlyTransformer(
        riftco.TransformerConfig(n_layers=n_layers, seed=n_layers, **SIZES)
    )


def adapter(rank: int) -> riftco.DecoderOnlyTransformer:
    m = base(2)
    m.enable_lora(rank=rank, alpha=2.0 * rank, seed=rank)
    return m


def weights(pairs: list[tuple[str, Any]]) -> dict[str, np.ndarray[Any, Any]]:
    return {n: p.numpy().copy() for n, p in pairs}


def same(a: dict[str, np.ndarray[Any, Any]], b: dict[str, np.ndarray[Any, Any]]) -> bool:
    return a.keys() == b.keys() and all(
        a[k].shape == b[k].shape and np.array_equal(a[k], b[k]) for k in a
    )


def header(path: Path) -> dict[str, Any]:
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        parsed: dict[str, Any] = json.loads(f.read(n))
        return parsed


def our_temporaries(folder: Path) -> list[str]:
    """Entries of our temporary naming beside ``folder`` (its own) and inside it (its files')."""
    beside = [p.name for p in folder.parent.iterdir() if p.name.startswith(f".{folder.name}.tmp.")]
    inside = [p.name for p in folder.iterdir() if ".tmp." in p.name] if folder.is_dir() else []
    return sorted(beside + inside)


def _limit_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT_BYTES, MEMORY_LIMIT_BYTES))


def kill_during(
    what: str, folder: Path, first: int, rng: random.Random, fallback: bool = False
) -> None:
    """Starts the save loop (saving the model ``first`` first), kills it at a random moment.
    With ``fallback`` the child runs inside the folder, where the exchange is not used (it would
    move the child's working folder away) and the per-file protocol applies."""
    child = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(SAVE_LOOP), what, str(folder), str(first)],
        cwd=folder if fallback else None,
        stdout=subprocess.PIPE,
        text=True,
        preexec_fn=_limit_memory,
    )
    try:
        assert child.stdout is not None
        if child.stdout.readline().strip() != "ready":
            raise RuntimeError("the save loop did not start")
        time.sleep(rng.uniform(0.0, 0.06))
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=CHILD_TIMEOUT_S)


@dataclass
class Counts:
    kills: int = 0
    loaded_as_old: int = 0
    loaded_as_new: int = 0
    mismatched: int = 0
    temporaries_left: int = 0
    other_files_changed: int = 0
    hf_checked: int = 0
    hf_mismatched: int = 0
    problems: list[str] = field(default_factory=list)

    def line(self) -> str:
        hf = f"hf checked {self.hf_checked}, hf mismatched {self.hf_mismatched}"
        return (
            f"kills {self.kills}, loaded as old {self.loaded_as_old}, as new "
            f"{self.loaded_as_new}, mismatched {self.mismatched}, temporaries left after the "
            f"next save {self.temporaries_left}, tokenizer.json/README.md changed "
            f"{self.other_files_changed}, {hf}"
        )


def check_model_folder(folder: Path, originals: dict[int, Any]) -> int | str:
    """The number of layers of the one model the folder holds, or why it is not one model."""
    try:
        back = riftco.DecoderOnlyTransformer.load(folder / "model.safetensors")
    except Exception as e:  # noqa: BLE001 (any failure to load is the finding)
        return f"riftco cannot load it: {e}"
    got = weights(back.named_parameters())
    matches = [n for n in LAYERS if same(got, originals[n])]
    if len(matches) != 1 or back.config.n_layers != matches[0]:
        return f"riftco loads weights of neither model ({back.config.n_layers} layers)"
    config = json.loads((folder / "config.json").read_bytes())
    layers_in_file = {
        int(k.split(".")[2]) for k in header(folder / "model.safetensors") if ".layers." in k
    }
    if config["num_hidden_layers"] != matches[0] or len(layers_in_file) != matches[0]:
        return (
            f"config.json says {config['num_hidden_layers']} layers beside weights of "
            f"{len(layers_in_file)}"
        )
    return matches[0]


def check_adapter_folder(folder: Path, originals: dict[int, Any]) -> int | str:
    """The rank of the one adapter the folder holds, or why it is not one adapter."""
    m = base(2)
    try:
        m.load_lora(folder)
    except Exception as e:  # noqa: BLE001
        return f"riftco cannot load it: {e}"
    got = weights(m.named_lora_parameters())
    matches = [r for r in RANKS if same(got, originals[r])]
    if len(matches) != 1:
        return "riftco loads weights of neither adapter"
    config = json.loads((folder / "adapter_config.json").read_bytes())
    shapes = {
        v["shape"][0]
        for k, v in header(folder / "adapter_model.safetensors").items()
        if k.endswith("lora_A.weight")
    }
    if config["r"] != matches[0] or shapes != {matches[0]}:
        return f"adapter_config.json says r = {config['r']} beside lora_A of rank {shapes}"
    return matches[0]


HF_CHECK = """
    import json, sys
    import torch
    from transformers import LlamaForCausalLM
    from transformers.utils import logging
    logging.set_verbosity_error()
    out = []
    for job in json.loads(sys.stdin.read()):
        try:
            if job["what"] == "model":
                m = LlamaForCausalLM.from_pretrained(job["dir"])
                w = m.model.layers[-1].self_attn.q_proj.weight
                out.append([m.config.num_hidden_layers, w.detach().flatten()[:16].tolist()])
            else:
                from peft import PeftModel
                m = PeftModel.from_pretrained(LlamaForCausalLM.from_pretrained(job["base"]),
                                              job["dir"])
                sd = m.state_dict()
                k = [k for k in sd if "layers.0.self_attn.q_proj.lora_A" in k][0]
                r = m.peft_config["default"].r
                out.append([r, sd[k].flatten()[:16].tolist()])
        except Exception as e:
            out.append(["error", repr(e)[:300]])
    print(json.dumps(out))
"""


def hf_python_default() -> str | None:
    have = all(importlib.util.find_spec(m) for m in ("torch", "transformers", "peft"))
    return sys.executable if have else None


def hf_check(
    hf_python: str, jobs: list[dict[str, Any]], expected: list[tuple[int, np.ndarray[Any, Any]]]
) -> tuple[int, list[str]]:
    """Loads each snapshot with transformers / PEFT; returns the mismatches and their reasons."""
    run = subprocess.run(
        [hf_python, "-c", textwrap.dedent(HF_CHECK)],
        input=json.dumps(jobs),
        capture_output=True,
        text=True,
        timeout=1200,
    )
    if run.returncode != 0:
        raise RuntimeError(f"the Hugging Face check failed: {run.stderr[-2000:]}")
    results = json.loads(run.stdout.strip().splitlines()[-1])
    bad = []
    for job, (size, want), (got_size, got) in zip(jobs, expected, results):
        if got_size != size or not np.allclose(np.asarray(got, dtype=np.float32), want[:16]):
            bad.append(f"{job['dir']}: expected {size}, transformers/PEFT gave {got_size} {got}")
    return len(bad), bad


def run(
    kills: int,
    seed: int,
    hf_python: str | None,
    work: Path,
    fallback: bool = False,
    kinds: tuple[str, ...] = ("model", "lora"),
) -> Counts:
    """``kills`` kills, in saves of each of ``kinds`` in turn (``"model"``, ``"lora"``)."""
    rng = random.Random(seed)
    models = {n: weights(base(n).named_parameters()) for n in LAYERS}
    adapters = {r: weights(adapter(r).named_lora_parameters()) for r in RANKS}
    folders = {"model": work / "model", "lora": work / "adapter"}
    base_dir = work / "base"
    base_dir.mkdir()
    base(2).save(base_dir / "model.safetensors")
    folders["model"].mkdir()
    base(LAYERS[0]).save(folders["model"] / "model.safetensors")
    adapter(RANKS[0]).save_lora(folders["lora"])
    for f in folders.values():
        (f / "tokenizer.json").write_bytes(TOKENIZER)
        (f / "README.md").write_bytes(README)
    snapshots = work / "snapshots"
    snapshots.mkdir()
    jobs: list[dict[str, Any]] = []
    expected: list[tuple[int, np.ndarray[Any, Any]]] = []
    counts = Counts()
    present = {"model": 0, "lora": 0}  # index of what the folder holds before each kill
    for i in range(kills):
        what = kinds[i % len(kinds)]
        folder = folders[what]
        old = present[what]
        kill_during(what, folder, 1 - old, rng, fallback)
        counts.kills += 1
        sizes = LAYERS if what == "model" else RANKS
        if what == "model":
            got = check_model_folder(folder, models)
        else:
            got = check_adapter_folder(folder, adapters)
        if isinstance(got, str):
            counts.mismatched += 1
            counts.problems.append(f"kill {i} ({what}): {got}")
        elif got == sizes[old]:
            counts.loaded_as_old += 1
        else:
            counts.loaded_as_new += 1
        if (folder / "tokenizer.json").read_bytes() != TOKENIZER or (
            folder / "README.md"
        ).read_bytes() != README:
            counts.other_files_changed += 1
            counts.problems.append(f"kill {i} ({what}): tokenizer.json or README.md changed")
        if hf_python and not isinstance(got, str):
            snap = snapshots / f"{i}-{what}"
            shutil.copytree(folder, snap, symlinks=True)
            jobs.append({"what": what, "dir": str(snap), "base": str(base_dir)})
            if what == "model":
                w = models[got][f"model.layers.{got - 1}.self_attn.q_proj.weight"]
            else:
                key = next(k for k in adapters[got] if "layers.0.self_attn.q_proj.lora_A" in k)
                w = adapters[got][key]
            expected.append((got, w.flatten()))
        # One more normal save (of the other one), then no temporary of ours may remain.
        now = old if isinstance(got, str) else sizes.index(got)
        new = 1 - now
        if what == "model":
            base(LAYERS[new]).save(folder / "model.safetensors")
        else:
            adapter(RANKS[new]).save_lora(folder)
        present[what] = new
        left = our_temporaries(folder)
        if left:
            counts.temporaries_left += len(left)
            counts.problems.append(f"kill {i} ({what}): temporaries left {left}")
    if hf_python and jobs:
        counts.hf_checked = len(jobs)
        counts.hf_mismatched, bad = hf_check(hf_python, jobs, expected)
        counts.problems.extend(bad)
    return counts


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kills", type=int, default=60)
    parser.add_argument("--seed", type=int, default=5)
    parser.add_argument(
        "--hf-python",
        default=None,
        help="a Python with torch, transformers and peft that loads each killed folder "
        "(default: this Python when it has them, else no Hugging Face check)",
    )
    parser.add_argument(
        "--fallback",
        action="store_true",
        help="run the saving child inside the folder, where the per-file protocol applies "
        "instead of the exchange (shows what the checks catch without it)",
    )
    args = parser.parse_args()
    hf_python = args.hf_python or hf_python_default()
    with tempfile.TemporaryDirectory(prefix="riftco-kill-saves-") as work:
        counts = run(args.kills, args.seed, hf_python, Path(work), args.fallback)
    for p in counts.problems:
        print(p)
    print(counts.line())
    bad = counts.mismatched + counts.temporaries_left + counts.other_files_changed
    return 1 if bad or counts.hf_mismatched else 0


if __name__ == "__main__":
    sys.exit(main())
