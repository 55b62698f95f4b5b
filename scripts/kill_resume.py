"""Kills training runs with SIGKILL at random moments and resumes them, then compares the result
with one uninterrupted run: the final weights and every recorded loss must be bitwise equal.

    .venv/bin/python scripts/kill_resume.py              # 30 kills per case (the README figure)
    .venv/bin/python scripts/kill_resume.py --kills 5 --cases pretrain

Cases (tiny models, so that a run takes about a second and a kill lands anywhere in it, during
steps, validation passes and saves alike):

- ``pretrain``: pretraining with attention and residual dropout 0.1;
- ``lora``: LoRA post-training (rank 4, MLP adapters, adapter and residual dropout 0.1) of a
  base model this script pretrains first;
- ``full``: full fine-tuning of that base model, without dropout.

The reference run uses the ``disabled`` policy; every resume of the killed run uses the next
policy of :data:`POLICIES` (every policy computes the losses and gradients of ``disabled``
bitwise, so a resumed run may change it; ``budget:2MiB`` plans a per-block mix for these
shapes). One SIGKILL lands per restart, at a random moment
drawn from a seeded generator; the run is restarted with ``resume=True`` until it completes.
Prints, per case, the kills, the resumes that found a checkpoint, and whether the final weights,
the training losses and the validation losses are bitwise equal to the reference.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

POLICIES = (
    "block",
    "segments:2",
    "auto",
    "selective",
    "block,disabled,selective",
    "budget:2MiB",
    "disabled",
)
CASES = ("pretrain", "lora", "full")
STEPS = 120


def _model_config() -> Any:
    import riftco

    return riftco.TransformerConfig(
        vocab_size=256,
        d_model=64,
        n_heads=4,
        n_kv_heads=2,
        n_layers=3,
        d_ff=128,
        max_seq_len=64,
        attention_dropout=0.1,
        residual_dropout=0.1,
    )


def _corpus() -> Any:
    import riftco

    return riftco.default_post_training_corpus()


def _loop_settings(policy: str, steps: int) -> dict[str, Any]:
    return dict(
        steps=steps,
        batch_size=4,
        seq_len=48,
        save_every=3,
        eval_every=5,
        eval_batches=2,
        warmup_steps=3,
        activation_checkpointing=policy,
        keep_checkpoints=2,
    )


def _base_folder(work: Path) -> Path:
    return work / "base"


def child(case: str, out: str, policy: str, work: str, steps: int) -> None:
    """One run of ``case`` into ``out`` (resumed when it holds a checkpoint)."""
    import riftco

    if case == "pretrain":
        riftco.run_pretraining(
            _model_config(),
            riftco.PretrainingConfig(**_loop_settings(policy, steps)),
            _corpus(),
            out,
            progress=False,
            plots=False,
            resume=True,
        )
        return
    method = {"lora": "lora", "full": "full"}[case]
    extra: dict[str, Any] = (
        dict(lora_rank=4, lora_mlp=True, lora_dropout=0.1, residual_dropout=0.1)
        if method == "lora"
        else dict(attention_dropout=0.0, residual_dropout=0.0)
    )
    riftco.run_post_training(
        _base_folder(Path(work)),
        riftco.PostTrainingConfig(fine_tuning_method=method, **_loop_settings(policy, steps), **extra),
        _corpus(),
        out,
        progress=False,
        plots=False,
        resume=True,
    )


def startup(case: str, work: str) -> None:
    """What a child does before its first step: imports, the corpus, the base model."""
    import riftco

    _corpus()
    if case != "pretrain":
        riftco.load_model(_base_folder(Path(work)))


def _spawn(
    case: str, out: Path, policy: str, work: Path, steps: int
) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, __file__, "--child", case, str(out), policy, str(work), "--steps",
         str(steps)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )


def _tensors(folder: Path, case: str) -> dict[str, Any]:
    """The trained tensors of a run folder, by name, as NumPy arrays."""
    import numpy as np
    import riftco

    if case == "lora":
        model = riftco.load_model(_base_folder(folder.parent))
        model.load_lora(folder / "adapter")
    else:
        model = riftco.load_model(folder)
    return {name: np.array(p.numpy(), copy=True) for name, p in model.named_parameters()}


def _records(folder: Path) -> dict[str, Any]:
    meta = json.loads((folder / "training_metadata.json").read_text())
    return {
        "losses": meta["losses"],
        "validation_losses": meta["validation_losses"],
        "complete": meta["complete"],
        "resumes": len(meta.get("resumes", [])),
    }


def _newest_step(folder: Path) -> int:
    steps = [int(p.name.split("-")[1]) for p in (folder / "checkpoints").glob("step-*")]
    return max(steps, default=0)


def _compare(reference: Path, killed: Path, case: str) -> dict[str, bool]:
    import numpy as np

    a, b = _tensors(reference, case), _tensors(killed, case)
    ra, rb = _records(reference), _records(killed)
    return {
        "weights": a.keys() == b.keys()
        and all(np.array_equal(a[k].view(np.uint32), b[k].view(np.uint32)) for k in a),
        "losses": ra["losses"] == rb["losses"] and len(ra["losses"]) == len(rb["losses"]) > 0,
        "validation_losses": ra["validation_losses"] == rb["validation_losses"],
        "complete": bool(rb["complete"]),
    }


def run_case(
    case: str, kills: int, work: Path, seed: int = 0, steps: int = STEPS
) -> dict[str, Any]:
    """Runs ``case`` once uninterrupted, then killed runs until ``kills`` SIGKILLs have landed
    (a run that completes before its next kill is compared and a new one started); returns the
    counts and whether every completed killed run equals the reference bitwise."""
    rng = random.Random(f"{seed}-{case}")
    reference = work / f"{case}-reference"
    t0 = time.perf_counter()
    ref = _spawn(case, reference, "disabled", work, steps)
    _, err = ref.communicate(timeout=600)
    if ref.returncode != 0:
        raise RuntimeError(f"the reference run of {case} failed: {err.decode()[-2000:]}")
    run_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    subprocess.run([sys.executable, __file__, "--startup", case, str(work)], check=True)
    startup_s = time.perf_counter() - t0
    train_s = max(run_s - startup_s, 0.05)
    done_kills = restarts = from_checkpoint = rounds = 0
    kill_steps: list[int] = []
    equal = {"weights": True, "losses": True, "validation_losses": True, "complete": True}
    leftovers: list[str] = []
    policy_index = 0
    while done_kills < kills:
        rounds += 1
        killed = work / f"{case}-killed-{rounds}"
        while True:
            policy = POLICIES[policy_index % len(POLICIES)]
            policy_index += 1
            step = min(_newest_step(killed), steps)
            from_checkpoint += int(step > 0)
            proc = _spawn(case, killed, policy, work, steps)
            restarts += 1
            if done_kills < kills and step < steps:
                # (A run whose last checkpoint is written completes: the next kill goes to a new
                # run.) A uniformly random moment of what is left of the process's life: its start
                # (imports, loading, the resume), its steps, validation passes and saves, or
                # just past its end.
                left = startup_s + train_s * (1.0 - step / steps)
                time.sleep(rng.uniform(0.0, 1.05 * left))
                if proc.poll() is None:
                    proc.send_signal(signal.SIGKILL)
                    proc.wait()
                    done_kills += 1
                    kill_steps.append(_newest_step(killed))
                    continue
            _, err = proc.communicate(timeout=600)
            if proc.returncode != 0:
                raise RuntimeError(
                    f"a resumed run of {case} failed (policy {policy}): {err.decode()[-2000:]}"
                )
            break
        for key, value in _compare(reference, killed, case).items():
            equal[key] &= value
        leftovers += [
            f"{killed.name}/{p.name}"
            for p in (killed / "checkpoints").iterdir()
            if p.name.startswith(".")
        ]
    return {
        "case": case,
        "startup_s": round(startup_s, 2),
        "training_s": round(train_s, 2),
        "kills": done_kills,
        "runs": rounds,
        "restarts": restarts,
        "restarts_from_a_checkpoint": from_checkpoint,
        "newest_checkpoint_at_each_kill": kill_steps,
        "weights_bitwise_equal": equal["weights"],
        "losses_bitwise_equal": equal["losses"],
        "validation_losses_equal": equal["validation_losses"],
        "complete": equal["complete"],
        "leftover_temporaries": leftovers,
    }


def prepare_base(work: Path) -> None:
    """The base model the post-training cases start from (a short pretraining)."""
    import riftco

    if (_base_folder(work) / "model.safetensors").exists():
        return
    riftco.run_pretraining(
        _model_config(),
        riftco.PretrainingConfig(steps=4, batch_size=2, seq_len=16, warmup_steps=1),
        _corpus(),
        _base_folder(work),
        progress=False,
        plots=False,
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--kills", type=int, default=30, help="SIGKILLs per case (default 30)")
    p.add_argument("--cases", nargs="+", choices=CASES, default=list(CASES))
    p.add_argument("--work", default=None, help="folder for the runs (default: a new temporary)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--steps", type=int, default=STEPS, help=f"steps per run (default {STEPS})")
    p.add_argument("--startup", nargs=2, metavar=("CASE", "WORK"), help=argparse.SUPPRESS)
    p.add_argument("--child", nargs=4, metavar=("CASE", "OUT", "POLICY", "WORK"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        child(*args.child, args.steps)
        return 0
    if args.startup:
        startup(*args.startup)
        return 0
    import tempfile

    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="riftco-kills-"))
    work.mkdir(parents=True, exist_ok=True)
    prepare_base(work)
    ok = True
    for case in args.cases:
        result = run_case(case, args.kills, work, args.seed, args.steps)
        print(json.dumps(result))
        ok &= (
            result["weights_bitwise_equal"]
            and result["losses_bitwise_equal"]
            and result["validation_losses_equal"]
            and result["complete"]
        )
    print("all bitwise equal" if ok else "MISMATCH", f"(runs in {work})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
