"""A training run's folder: its file names, the checks before a run writes into it
(:func:`prepare_out_dir`, which checkpoint a run resumes from, what an overwrite removes), and
the exceptions a run raises about it (:class:`OutputDirError`, :class:`TrainingInterrupted`).
:mod:`riftco.training.stages` re-exports the public names."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from riftco._native import (
    ModelStateError,
    RiftcoError,
    write_file_atomic,
)
from riftco.training.state import (
    CHECKPOINTS_DIR,
    TRAINER_STATE_FILE,
    Checkpoint,
    checkpoint_step,
    find_checkpoints,
    read_checkpoint,
    remove_stale_temporaries,
)

MODEL_STATE_FILE = "model.safetensors"
SHARD_INDEX_FILE = "model.safetensors.index.json"
"""The index of a sharded Hugging Face checkpoint (``weight_map``: tensor name to shard file)."""
METADATA_FILE = "training_metadata.json"
METADATA_FILE_MODE = 0o644
"""Permissions of ``training_metadata.json`` (``rw-r--r--``), the same as the model files (all are
written by :func:`riftco._native.write_file_atomic`)."""
ADAPTER_DIR = "adapter"
ADAPTER_CONFIG = "adapter_config.json"
"""The PEFT adapter config file that marks a LoRA adapter folder."""

Log = Callable[[str], None]


class OutputDirError(RiftcoError, OSError):
    """The output folder cannot be created or written."""


class TrainingInterrupted(KeyboardInterrupt):
    """Training was interrupted (Ctrl-C). ``saved_step`` is the step of the last completed save
    in ``out_dir`` (its checkpoint, from which ``resume=True`` continues; ``None`` when nothing
    was saved yet); those files are intact."""

    def __init__(self, out_dir: Path, saved_step: int | None) -> None:
        super().__init__(f"interrupted; last save in {out_dir} at step {saved_step}")
        self.out_dir = out_dir
        self.saved_step = saved_step


def prepare_out_dir(out_dir: str | os.PathLike[str]) -> Path:
    """Creates ``out_dir`` (and parents) and checks a file can be written in it.

    Raises:
        OutputDirError: naming the folder and the reason.
    """
    path = Path(out_dir)
    if path.exists() and not path.is_dir():
        raise OutputDirError(
            f"output folder {str(path)!r} is a file, not a folder: pass a folder path (a new "
            "one is created)"
        )
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".write-probe-"):
            pass
    except OSError as e:
        reason = e.strerror or str(e)
        raise OutputDirError(f"cannot write to output folder {str(path)!r}: {reason}") from None
    return path


def write_json_atomic(path: Path, payload: dict[str, Any]) -> None:
    """Writes ``payload`` as JSON to ``path`` with the one atomic writer of the package (the
    model files' protocol: temporary in the same folder, fsync, rename, fsync of the folder,
    mode ``0644``; see :func:`riftco._native.write_file_atomic`)."""
    data = json.dumps(payload, indent=2, sort_keys=True).encode() + b"\n"
    write_file_atomic(path, data)


def _run_files(out: Path) -> list[str]:
    """The entries of ``out`` that belong to a stage's run (empty for a fresh folder)."""
    names = (METADATA_FILE, MODEL_STATE_FILE, ADAPTER_DIR, CHECKPOINTS_DIR)
    return [n for n in names if (out / n).exists()]


def unfinished_step(out: Path) -> int | None:
    """The step of the newest complete checkpoint of ``out`` when ``out`` holds an unfinished run
    (checkpoints, and no ``training_metadata.json`` marking the run complete); ``None`` for a
    finished run, a folder without checkpoints, or one that does not exist."""
    found = find_checkpoints(out)
    if not found:
        return None
    try:
        meta = json.loads((out / METADATA_FILE).read_bytes())
    except (OSError, ValueError):
        meta = None
    if isinstance(meta, dict) and meta.get("complete") is True:
        return None
    return checkpoint_step(found[-1])


def _resume_checkpoint(
    out: Path, resume: bool | str | os.PathLike[str], overwrite: bool, log: Log | None
) -> Checkpoint | None:
    """The checkpoint a run into ``out`` continues from (``None``: it starts at step 0).

    Only reads ``out`` (which may not exist yet). ``resume`` ``False``: a folder holding
    another run is refused unless ``overwrite`` (:func:`_clear_checkpoints` then removes its
    checkpoints); ``True``: the newest complete
    checkpoint of ``out``, or none when ``out`` holds no run yet; a path: that checkpoint
    folder, or the newest checkpoint of that run folder.

    Raises:
        OutputDirError: ``out`` holds a run and neither ``resume`` nor ``overwrite`` is set, or
            both are set.
        ModelStateError: no complete checkpoint where one is needed, or an invalid trainer
            state (named).
    """
    if resume is not False and resume is not None and overwrite:
        raise OutputDirError("resume and overwrite exclude each other: pass one of them")
    if resume is False or resume is None:
        existing = _run_files(out)
        step = unfinished_step(out)
        if step is not None and not overwrite:
            raise OutputDirError(
                f"{str(out)!r} holds an unfinished run (last checkpoint at step {step}); pass "
                "resume=True to continue it, or overwrite=True to start it again from step 0"
            )
        if existing and not overwrite:
            raise OutputDirError(
                f"{str(out)!r} holds a run ({', '.join(existing)}); pass resume=True to continue "
                "it from its newest checkpoint, or overwrite=True to replace it"
            )
        return None
    if resume is True:
        found = find_checkpoints(out)
        if not found:
            # A checkpoints/ folder without a complete checkpoint is a run killed before its
            # first save finished: it starts again. Files at the top level without any
            # checkpoint come from elsewhere (an older riftco, a user).
            existing = [n for n in _run_files(out) if n != CHECKPOINTS_DIR]
            if existing:
                raise ModelStateError(
                    f"cannot resume: {str(out)!r} holds a run ({', '.join(existing)}) but no "
                    f"complete checkpoint in {CHECKPOINTS_DIR}/ (killed before its first save, "
                    "or written by a riftco without training checkpoints); pass "
                    "overwrite=True to start it again"
                )
            if log is not None:
                log(f"no checkpoint in {out}: starting at step 0")
            return None
        return read_checkpoint(found[-1])
    path = Path(resume)
    if (path / TRAINER_STATE_FILE).exists():
        return read_checkpoint(path)
    found = find_checkpoints(path)
    if not found:
        raise ModelStateError(
            f"cannot resume from {str(path)!r}: neither a training checkpoint (no "
            f"{TRAINER_STATE_FILE}) nor a run folder with checkpoints in {CHECKPOINTS_DIR}/"
        )
    return read_checkpoint(found[-1])


def _clear_checkpoints(out: Path, overwrite: bool, writes_adapter: bool = False) -> None:
    """With ``overwrite``, removes the replaced run's checkpoints (they must never be resumed
    into the new run) and, when the new run writes whole weights (not ``writes_adapter``), the
    replaced run's LoRA ``adapter/`` folder, which would otherwise sit beside the new weights as
    if it belonged to them. A replaced run's weights are never removed: a LoRA run's base may be
    those very files. Without ``overwrite``, removes the checkpoint temporaries of killed
    processes."""
    if overwrite and (out / CHECKPOINTS_DIR).exists():
        shutil.rmtree(out / CHECKPOINTS_DIR)
    else:
        remove_stale_temporaries(out / CHECKPOINTS_DIR)
    adapter = out / ADAPTER_DIR
    if overwrite and not writes_adapter and (adapter / ADAPTER_CONFIG).is_file():
        shutil.rmtree(adapter)
