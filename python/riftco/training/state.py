"""Training-state checkpoints of a stage's run folder, and resuming from them.

A checkpoint is a folder ``<run>/checkpoints/step-NNNNNNNN/`` (the step zero-padded to 8 digits)
holding everything a run needs to continue exactly where it was:

==========================  ==================================================================
file                        content
==========================  ==================================================================
``model.safetensors``,      the model (pretraining, full fine-tuning), Hugging Face Llama
``config.json``             layout, as ``DecoderOnlyTransformer.save`` writes it
``adapter/``                the LoRA adapters (LoRA post-training), PEFT layout
``optimizer.safetensors``   the Adam/AdamW moments and step counts, named by parameter
                            (``Adam.save``)
``trainer_state.json``      the step, the data sampler's generator state, the dropout step,
                            the thread generator's state, the run's metadata so far (losses,
                            learning rates, step times, memory and validation records) and
                            ``math``: every setting that changes what the run computes, with
                            its hash ``math_hash``
==========================  ==================================================================

The folder is written in full under a temporary name (``.step-NNNNNNNN.tmp.<pid>``), each file
fsynced, and then renamed into place: a folder named ``step-*`` is complete, whatever moment a
kill came. The newest ``keep_checkpoints`` are kept; older ones are removed after a new one is in
place, and temporaries of processes no longer running are removed at the next save or resume.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from riftco._native import ConfigError, ModelStateError, RiftcoError, write_file_atomic

CHECKPOINTS_DIR = "checkpoints"
"""The subfolder of a run folder holding its training-state checkpoints."""
TRAINER_STATE_FILE = "trainer_state.json"
OPTIMIZER_STATE_FILE = "optimizer.safetensors"
TRAINER_STATE_FORMAT = 1

HARMLESS_TRAINING_KEYS = frozenset(
    {
        "log_every",
        "save_every",
        "eval_every",
        "keep_checkpoints",
        "activation_checkpointing",
        "activation_memory_budget",
        "data_parallel",
        "zero",
        "data_parallel_timeout_s",
        "data_parallel_bucket_bytes",
    }
)
"""Training settings a resumed run may change: how often it reports, validates and saves, how
many checkpoints it keeps, and the activation-checkpointing policy (every policy computes
bitwise the losses and gradients of ``"disabled"``). The data-parallel settings are here too:
a run's math records its ranks and ZeRO stage in its own ``data_parallel`` entry, present only
for a data-parallel run, so that runs from before that setting existed still resume."""

_STEP_DIR = re.compile(r"^step-(\d{8,})$")
_TEMPORARY_DIR = re.compile(r"^\.step-\d+\.(?:[a-z]+\.)?tmp\.(\d+)$")
# A model or adapter save into a checkpoint's temporary folder builds its own sibling
# ``.<that folder's name>.tmp.<pid>.<n>`` (see the folder exchange of ``model.save``).
_SAVE_TEMPORARY_DIR = re.compile(r"^\.\.step-\d+\.tmp\.(\d+)\.tmp\.(\d+)\.\d+$")

__all__ = [
    "CHECKPOINTS_DIR",
    "Checkpoint",
    "CheckpointWriteError",
    "HARMLESS_TRAINING_KEYS",
    "OPTIMIZER_STATE_FILE",
    "TRAINER_STATE_FILE",
    "check_same_math",
    "find_checkpoints",
    "math_hash",
    "read_checkpoint",
]


def step_dir_name(step: int) -> str:
    return f"step-{step:08d}"


def math_hash(math: dict[str, Any]) -> str:
    """SHA-256 of ``math`` as canonical JSON (sorted keys)."""
    text = json.dumps(math, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def _pid_running(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_stale_temporaries(checkpoints: Path) -> None:
    """Removes checkpoint temporaries left by processes that are no longer running."""
    try:
        entries = list(checkpoints.iterdir())
    except OSError:
        return
    for entry in entries:
        m = _TEMPORARY_DIR.match(entry.name) or _SAVE_TEMPORARY_DIR.match(entry.name)
        if m and not any(_pid_running(int(pid)) for pid in m.groups()):
            shutil.rmtree(entry, ignore_errors=True)


def checkpoint_step(folder: Path) -> int | None:
    """The step a checkpoint folder's name holds (``step-00000508``: 508), ``None`` for another
    name."""
    m = _STEP_DIR.match(folder.name)
    return int(m.group(1)) if m else None


def find_checkpoints(run_dir: Path) -> list[Path]:
    """The complete checkpoint folders of ``run_dir``, oldest first."""
    root = run_dir / CHECKPOINTS_DIR
    try:
        entries = list(root.iterdir())
    except (FileNotFoundError, NotADirectoryError):
        return []
    steps = []
    for entry in entries:
        step = checkpoint_step(entry)
        if step is not None and entry.is_dir():
            steps.append((step, entry))
    return [p for _, p in sorted(steps)]


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class CheckpointWriteError(RiftcoError, OSError):
    """A checkpoint could not be written (disk full, read-only folder, quota): the message names
    the path and, for a full disk, the bytes the checkpoint needs."""


def write_checkpoint(
    run_dir: Path,
    step: int,
    write_files: Any,
    trainer_state: dict[str, Any],
    keep: int,
    expected_bytes: int,
) -> Path:
    """Writes checkpoint ``step`` of ``run_dir``: ``write_files(folder)`` writes the model (or
    adapters) and the optimizer state into the temporary folder, then ``trainer_state.json`` is
    written and the folder renamed into place; the oldest checkpoints beyond ``keep`` are
    removed afterwards. On failure the temporary is removed and the earlier checkpoints stay.
    ``expected_bytes`` (about the size of the folder) is named when the disk is full.

    Raises:
        CheckpointWriteError: naming the path (and the bytes needed when the disk is full).
    """
    root = run_dir / CHECKPOINTS_DIR
    final = root / step_dir_name(step)
    tmp = root / f".{step_dir_name(step)}.tmp.{os.getpid()}"
    try:
        root.mkdir(exist_ok=True)
        remove_stale_temporaries(root)
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir()
        write_files(tmp)
        payload = json.dumps(trainer_state, indent=1, sort_keys=True).encode() + b"\n"
        write_file_atomic(tmp / TRAINER_STATE_FILE, payload)
        _fsync_dir(tmp)
        if final.exists():
            # The same step saved again (a run resumed from its last checkpoint): a resumed run
            # computes exactly what it had, so the complete folder already there is kept.
            shutil.rmtree(tmp)
        else:
            os.rename(tmp, final)
        _fsync_dir(root)
    except (OSError, ModelStateError) as e:
        shutil.rmtree(tmp, ignore_errors=True)
        full = isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT)
        if not full and ("No space left" in str(e) or "quota" in str(e).lower()):
            full = True
        if full:
            free = None
            with contextlib.suppress(OSError):
                free = shutil.disk_usage(root).free
            detail = f"the disk is full: the checkpoint needs about {expected_bytes:,} bytes" + (
                "" if free is None else f", {free:,} are free"
            )
        else:
            detail = str(e)
        raise CheckpointWriteError(
            f"cannot write the checkpoint of step {step} into {str(final)!r}: {detail}; the "
            f"previous checkpoints in {str(root)!r} are intact"
        ) from None
    for old_dir in find_checkpoints(run_dir)[:-keep]:
        # Renamed first, so that a kill during the removal leaves no partial step-* folder.
        doomed = root / f".{old_dir.name}.removed.tmp.{os.getpid()}"
        with contextlib.suppress(OSError):
            os.rename(old_dir, doomed)
            shutil.rmtree(doomed, ignore_errors=True)
    return final


@dataclass(frozen=True)
class Checkpoint:
    """A checkpoint read back: its folder and ``trainer_state.json``'s content."""

    path: Path
    state: dict[str, Any]

    @property
    def step(self) -> int:
        return int(self.state["step"])


_REQUIRED_KEYS = ("format", "step", "math", "math_hash", "sampler", "dropout_step", "rng_state",
                  "metadata")


def read_checkpoint(path: Path) -> Checkpoint:
    """Reads and checks ``path/trainer_state.json`` (the model and optimizer files are checked
    when they are loaded).

    Raises:
        ModelStateError: a missing, truncated or invalid trainer state, or a missing optimizer
            state, naming the file.
    """
    state_path = path / TRAINER_STATE_FILE
    try:
        state = json.loads(state_path.read_bytes())
    except FileNotFoundError:
        raise ModelStateError(
            f"{str(state_path)!r} is missing: {str(path)!r} is not a complete training "
            "checkpoint"
        ) from None
    except (OSError, ValueError) as e:
        raise ModelStateError(
            f"{str(state_path)!r} cannot be read as a trainer state ({e})"
        ) from None
    if not isinstance(state, dict):
        raise ModelStateError(f"{str(state_path)!r} is not a trainer state (not a JSON object)")
    missing = [k for k in _REQUIRED_KEYS if k not in state]
    if missing:
        raise ModelStateError(
            f"{str(state_path)!r} is not a complete trainer state: it lacks {', '.join(missing)}"
        )
    if state["format"] != TRAINER_STATE_FORMAT:
        raise ModelStateError(
            f"{str(state_path)!r} has format {state['format']!r}; this riftco reads format "
            f"{TRAINER_STATE_FORMAT}"
        )
    if not isinstance(state["step"], int) or state["step"] < 0:
        raise ModelStateError(f"{str(state_path)!r}: step must be a non-negative int")
    if math_hash(state["math"]) != state["math_hash"]:
        raise ModelStateError(
            f"{str(state_path)!r}: math_hash does not match its math settings (edited or "
            "corrupted)"
        )
    names = state.get("optimizer_files", [OPTIMIZER_STATE_FILE])
    if not isinstance(names, list) or not all(
        isinstance(n, str) and n and "/" not in n and n not in (".", "..") for n in names
    ):
        raise ModelStateError(f"{str(state_path)!r}: optimizer_files must be a list of file names")
    for name in names:
        if not (path / name).is_file():
            raise ModelStateError(
                f"{str(path / name)!r} is missing: {str(path)!r} is not a complete training "
                "checkpoint"
            )
    return Checkpoint(path, state)


def _flatten(prefix: str, value: Any, out: dict[str, Any]) -> None:
    if isinstance(value, dict):
        for k in sorted(value):
            _flatten(f"{prefix}.{k}" if prefix else str(k), value[k], out)
    else:
        out[prefix] = value


def check_same_math(saved: dict[str, Any], now: dict[str, Any], checkpoint: Path) -> None:
    """Refuses to resume when a setting that changes the math differs.

    Raises:
        ConfigError: naming every differing setting with the checkpoint's and the new value.
    """
    a: dict[str, Any] = {}
    b: dict[str, Any] = {}
    _flatten("", json.loads(json.dumps(saved)), a)
    _flatten("", json.loads(json.dumps(now)), b)
    diffs = [
        f"{key}: {a.get(key, '(absent)')!r} in the checkpoint, {b.get(key, '(absent)')!r} now"
        for key in sorted(set(a) | set(b))
        if a.get(key, "(absent)") != b.get(key, "(absent)")
    ]
    if diffs:
        shown = "; ".join(diffs[:6]) + (f"; and {len(diffs) - 6} more" if len(diffs) > 6 else "")
        raise ConfigError(
            f"cannot resume from {str(checkpoint)!r}: settings that change what the run "
            f"computes differ ({shown}); resume with the checkpoint's settings, or start a new "
            "run in this folder (--overwrite; overwrite=True in Python) or in another"
        )
