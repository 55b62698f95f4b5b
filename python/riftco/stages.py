"""Stage pipelines: :func:`run_pretraining` and :func:`run_post_training`.

Each stage trains with Adam (AdamW when ``weight_decay > 0``) on byte-level batches sampled from
a corpus, and writes into ``out_dir``:

- ``model.safetensors`` + ``config.json`` (the model state, Hugging Face Llama layout) — for
  pretraining and full fine-tuning; ``adapter/`` (PEFT layout) for LoRA post-training;
- ``training_metadata.json``: stage, configs, activation-checkpointing policy (its canonical
  spelling, ``activation_checkpointing``), the device trained on (``device``, the resolved name:
  ``"cpu"``, ``"vulkan"``, ``"metal"``) and the per-block plan it resolved to for the training
  batch shape (``activation_checkpointing_plan``: the dict of
  ``DecoderOnlyTransformer.activation_checkpointing_plan``, computed once before the first step,
  with the planner's measurements for ``auto`` and budgets), attention kind, optimizer, corpus
  summary, the dropout probabilities and dropout step (``dropout``; the step is the position in
  the mask stream, not model state, updated at every save), per-step losses, learning rates and
  step times, tokens/s, peak
  memory by category (``riftco.memory_stats()``; the peak is reset at the start of every step and
  the maximum over steps is recorded), validation loss before and after, wall time;
- per step (:mod:`riftco.run_records`): ``memory_per_step`` (each category's peak bytes in that
  step and the buffer pool's cached bytes after it) and ``validation_losses`` (step 0, every
  ``eval_every`` steps, the last step);
- ``loss.png`` and ``memory.png`` (:func:`riftco.plotting.write_plots`) at the end of a complete
  run when ``plots`` is true and matplotlib is installed (``pip install 'riftco[plot]'``);
  without matplotlib the ``log`` callback gets one line saying so and the run still succeeds.

Saves happen every ``save_every`` steps, at the end and on Ctrl-C: each writes a training-state
checkpoint ``checkpoints/step-NNNNNNNN/`` (see :mod:`riftco.training_state`; the newest
``keep_checkpoints`` are kept), then the model files and the metadata at the folder's top level,
each file written atomically (temporary file, fsync, rename). ``resume=True`` continues a run from
its newest checkpoint exactly (bitwise, on the same machine and thread count). Ctrl-C takes
effect once the step in progress (its validation pass and save included) is done: the stage
writes a checkpoint of that step and raises :class:`TrainingInterrupted` (a
``KeyboardInterrupt``) carrying its step.

SIGINT: for the whole run (main thread) the stage installs its own handler, whatever the
process inherited — also when SIGINT was ignored, as in a job a shell started in the background
— and restores the previous handler when the run ends. The first SIGINT interrupts (at once, or
after the save in progress); any further one while that interruption is handled is ignored.
``training_metadata.json`` is written with mode ``0644``, like the model files.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import json
import math
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType
from typing import Any

import numpy as np

from riftco._native import (
    ACTIVATION_CHECKPOINTING_POLICIES,
    ATTENTION_KINDS,
    Adam,
    AdamW,
    ConfigError,
    DecoderOnlyTransformer,
    ModelStateError,
    RiftcoError,
    TransformerConfig,
    __version__,
    get_rng_state,
    num_threads,
    reset_peak_memory_stats,
    set_rng_state,
    simd_level,
    write_file_atomic,
)
from riftco import distributed
from riftco.configs import PostTrainingConfig, PretrainingConfig, _LoopConfig
from riftco.data import VOCAB_SIZE, BatchSampler, Corpus, CorpusError, check_corpus_fits
from riftco.examples_data import ExampleBatchSampler, ExampleCorpus
from riftco.grad_mode import no_grad
from riftco.run_records import CACHED_KEY, MEMORY_CATEGORIES, StepRecords
from riftco.training_state import (
    CHECKPOINTS_DIR,
    HARMLESS_TRAINING_KEYS,
    CheckpointWriteError,
    OPTIMIZER_STATE_FILE,
    TRAINER_STATE_FILE,
    TRAINER_STATE_FORMAT,
    Checkpoint,
    check_same_math,
    find_checkpoints,
    math_hash,
    read_checkpoint,
    remove_stale_temporaries,
    write_checkpoint,
)

MODEL_STATE_FILE = "model.safetensors"
SHARD_INDEX_FILE = "model.safetensors.index.json"
"""The index of a sharded Hugging Face checkpoint (``weight_map``: tensor name to shard file)."""
METADATA_FILE = "training_metadata.json"
METADATA_FILE_MODE = 0o644
"""Permissions of ``training_metadata.json`` (``rw-r--r--``), the same as the model files (all are
written by :func:`riftco._native.write_file_atomic`)."""
ADAPTER_DIR = "adapter"
UNIFORM_BASELINE_LOSS = math.log(VOCAB_SIZE)

__all__ = [
    "ADAPTER_DIR",
    "CheckpointWriteError",
    "METADATA_FILE",
    "MODEL_STATE_FILE",
    "OutputDirError",
    "TrainingInterrupted",
    "UNIFORM_BASELINE_LOSS",
    "load_model",
    "prepare_out_dir",
    "resolve_model_state",
    "run_post_training",
    "run_pretraining",
]

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
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".write-probe-"):
            pass
    except OSError as e:
        reason = e.strerror or str(e)
        raise OutputDirError(f"cannot write to output folder {str(path)!r}: {reason}") from None
    return path


def _write_json_atomic(path: Path, payload: dict[str, Any]) -> None:
    """Writes ``payload`` as JSON to ``path`` with the one atomic writer of the package (the
    model files' protocol: temporary in the same folder, fsync, rename, fsync of the folder,
    mode ``0644``; see :func:`riftco._native.write_file_atomic`)."""
    data = json.dumps(payload, indent=2, sort_keys=True).encode() + b"\n"
    write_file_atomic(path, data)


class _SigintGuard:
    """A SIGINT handler that interrupts once: the first SIGINT raises ``KeyboardInterrupt`` (or,
    inside :meth:`deferred`, once the block is done); every later one is counted and ignored, so
    a second Ctrl-C cannot interrupt the handling of the first (the cleanup, the exit message).
    """

    def __init__(self) -> None:
        self.received = 0
        self.fired = False
        self._deferring = False

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        self.received += 1
        if self.fired or self._deferring:
            return
        self.fired = True
        raise KeyboardInterrupt

    @contextlib.contextmanager
    def deferred(self) -> Iterator[None]:
        """Holds SIGINT until the block finishes, then raises ``KeyboardInterrupt`` if one came
        (and none was raised before)."""
        self._deferring = True
        try:
            yield
        finally:
            self._deferring = False
        if self.received and not self.fired:
            self.fired = True
            raise KeyboardInterrupt


@contextlib.contextmanager
def _sigint_guard() -> Iterator[_SigintGuard]:
    """Installs a :class:`_SigintGuard` as the SIGINT handler for the block, whatever the
    inherited disposition (a process started in the background by a shell inherits SIGINT
    ignored), and restores the previous handler afterwards. Off the main thread, where handlers
    cannot be installed, the guard is returned but not installed (its deferral is a no-op)."""
    guard = _SigintGuard()
    if threading.current_thread() is not threading.main_thread():
        yield guard
        return
    previous = signal.signal(signal.SIGINT, guard)
    try:
        yield guard
    finally:
        if guard.fired and isinstance(previous, _SigintGuard):
            previous.fired = True  # an enclosing guard (run_cli's) must not interrupt again
        signal.signal(signal.SIGINT, signal.SIG_DFL if previous is None else previous)


def _make_optimizer(params: list[Any], cfg: _LoopConfig) -> tuple[Adam | AdamW, str]:
    if cfg.weight_decay > 0.0:
        return AdamW(params, lr=cfg.lr_at(0), weight_decay=cfg.weight_decay), "AdamW"
    return Adam(params, lr=cfg.lr_at(0)), "Adam"


Batch = Any
"""A token block ``int64 [batch, seq + 1]``, or ``(tokens, labels)`` of an
:class:`~riftco.examples_data.ExampleCorpus`."""


def _loss(model: DecoderOnlyTransformer, batch: Batch) -> Any:
    """The model's loss of a block, or of ``(tokens, labels)`` over the labelled targets."""
    if isinstance(batch, tuple):
        # (tokens, labels), or (tokens, labels, position_ids) of a packing sampler.
        positions = batch[2] if len(batch) == 3 else None
        return model.loss(batch[0], labels=batch[1], position_ids=positions)
    return model.loss(batch)


def _validation_loss(
    model: DecoderOnlyTransformer, batches: Callable[[], Iterator[Batch]]
) -> float:
    """Mean loss over the blocks ``batches()`` yields (the same blocks on every call), holding one
    block at a time, so ``eval_batches`` bounds the time but not the memory. Computed in
    evaluation mode (no dropout, no dropout step) and without recording a graph (``no_grad``:
    the chunked loss computes no gradients); the model's mode is restored afterwards."""
    count = 0

    def losses() -> Iterator[float]:
        nonlocal count
        for block in batches():
            count += 1
            yield _loss(model, block).item()

    training = model.training
    model.eval()
    try:
        with no_grad():
            total = math.fsum(losses())
    finally:
        model.train(training)
    return total / count


def _dropout_metadata(model: DecoderOnlyTransformer) -> dict[str, Any]:
    """The dropout probabilities and the dropout step (the position in the mask stream, which is
    not model state: a resumed run restores it with ``model.dropout_step = ...``)."""
    return {
        "attention_dropout": model.config.attention_dropout,
        "residual_dropout": model.config.residual_dropout,
        "lora_dropout": model.lora_dropout,
        "dropout_step": model.dropout_step,
    }


class _Progress:
    """A tqdm bar (when ``enabled`` and tqdm is installed) or log lines every ``log_every``."""

    def __init__(
        self, total: int, desc: str, enabled: bool, log: Log | None, log_every: int, initial: int
    ):
        self._bar: Any = None
        self._log = log
        self._log_every = log_every
        if enabled:
            try:
                tqdm = importlib.import_module("tqdm").tqdm
            except ImportError:
                tqdm = None
            if tqdm is not None:
                self._bar = tqdm(
                    total=total,
                    initial=initial,
                    desc=desc,
                    unit="step",
                    dynamic_ncols=True,
                    mininterval=0.5,
                )

    def note(self, line: str) -> None:
        """A line above the bar (or a log line)."""
        if self._bar is not None:
            self._bar.write(line, file=sys.stderr)
        elif self._log is not None:
            self._log(line)

    def update(
        self, step: int, total: int, loss: float, tokens_per_s: float, act_bytes: int
    ) -> None:
        mib = act_bytes / 2**20
        if self._bar is not None:
            self._bar.set_postfix_str(
                f"loss={loss:.3f} tok/s={tokens_per_s:,.0f} act_peak={mib:.1f}MiB", refresh=False
            )
            self._bar.update(1)
        elif self._log is not None and (step % self._log_every == 0 or step == total):
            self._log(
                f"step {step}/{total} loss {loss:.4f} tokens/s {tokens_per_s:,.0f} "
                f"activation peak {mib:.1f} MiB"
            )

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()


class _RunState:
    """How a stage saves and restores what it trains: ``save_model(folder)`` writes the model
    (or adapters) of a checkpoint, ``load_model(folder)`` reads them back, ``publish()`` writes
    the model files at the run folder's top level; ``math`` holds every setting that changes
    what the run computes (compared on resume); ``resume_from`` is the checkpoint to continue
    from, if any."""

    def __init__(
        self,
        *,
        save_model: Callable[[Path], None],
        load_model: Callable[[Path], None],
        publish: Callable[[], None],
        math: dict[str, Any],
        resume_from: Checkpoint | None,
    ) -> None:
        self.save_model = save_model
        self.load_model = load_model
        self.publish = publish
        self.math = math
        self.resume_from = resume_from


def _train(
    *,
    stage: str,
    model: DecoderOnlyTransformer,
    params: list[Any],
    cfg: _LoopConfig,
    corpus: Corpus | ExampleCorpus,
    out_dir: Path,
    run: _RunState,
    metadata: dict[str, Any],
    progress: bool,
    log: Log | None,
    plots: bool,
) -> dict[str, Any]:
    """Runs the stage with SIGINT handled by a :class:`_SigintGuard` from start to end (whatever
    SIGINT disposition the process inherited): Ctrl-C anywhere in the run raises
    :class:`TrainingInterrupted` once the step in progress (its validation and save included)
    is complete and a checkpoint of it is written; a second one while that is handled is
    ignored.

    The steps run in training mode (dropout active) whatever mode the caller left the model in;
    the validation passes switch to evaluation and back. The caller's mode is restored when the
    stage returns or raises."""
    caller_training = model.training
    model.train()
    group = _group(cfg)
    ranks = 1 if group is None else group.world_size
    if group is not None and not group.is_main:
        progress, log, plots = False, None, False
    try:
        with _sigint_guard() as guard:
            try:
                _train_guarded(
                    stage=stage,
                    model=model,
                    params=params,
                    cfg=cfg,
                    corpus=corpus,
                    out_dir=out_dir,
                    run=run,
                    metadata=metadata,
                    progress=progress,
                    log=log,
                    guard=guard,
                    group=group,
                )
                if plots:
                    _write_plots(out_dir, metadata, log)
                if group is not None and ranks > 1:
                    group.barrier()  # every rank returns once rank 0's files are complete
                return metadata
            except KeyboardInterrupt:
                if group is not None and ranks > 1:
                    # The ranks cannot agree on a last step to save: the job ends at once and
                    # resumes from its last checkpoint.
                    group.abort(
                        f"interrupted; resume from the last checkpoint in {str(out_dir)!r} "
                        f"(step {metadata.get('saved_step')})"
                    )
                raise TrainingInterrupted(out_dir, metadata.get("saved_step")) from None
            except distributed.RankMismatchError:
                raise  # raised on every rank alike: each exits with it
            except Exception as e:
                if group is not None and ranks > 1:
                    # The other ranks would wait for this one in their next collective.
                    group.abort(f"rank {group.rank}: {type(e).__name__}: {e}")
                raise
    finally:
        model.train(caller_training)


# Metadata entries a resumed run takes from its checkpoint (the records so far); the configs
# and the descriptions are those of the resumed run.
_RESUMED_ENTRIES = (
    "validation_loss_before",
    "validation_loss_after",
    "final_loss",
    "tokens_per_s",
    "train_time_s",
    "wall_time_s",
    "steps_completed",
    "saved_step",
    "complete",
)


def _restore(
    ck: Checkpoint,
    model: DecoderOnlyTransformer,
    optimizer: Adam | AdamW | distributed.DistributedOptimizer,
    sampler: BatchSampler | ExampleBatchSampler,
    run: _RunState,
    metadata: dict[str, Any],
    records: StepRecords,
) -> float:
    """Puts the checkpoint's model, optimizer, sampler, dropout step, thread generator and
    records back; returns the wall time the run had taken so far (seconds).

    Raises:
        ModelStateError: a missing, truncated or mismatched file of the checkpoint, named.
    """
    saved = ck.state["metadata"]
    state_path = ck.path / TRAINER_STATE_FILE
    try:
        run.load_model(ck.path)
    except ConfigError as e:
        raise ModelStateError(f"the model state of {str(ck.path)!r} does not fit: {e}") from None
    optimizer_path = ck.path / OPTIMIZER_STATE_FILE
    try:
        if isinstance(optimizer, distributed.DistributedOptimizer):
            optimizer.load(ck.path)
        else:
            optimizer.load(optimizer_path)
    except (ConfigError, ModelStateError, OSError) as e:
        raise ModelStateError(f"{str(optimizer_path)!r}: {e}") from None
    try:
        sampler.set_state(ck.state["sampler"])
        model.dropout_step = ck.state["dropout_step"]
        set_rng_state(tuple(ck.state["rng_state"]))
        losses, lrs, times = (list(saved[k]) for k in ("losses", "lrs", "step_times_s"))
        memory = saved["memory_per_step"]
        validation = list(saved["validation_losses"])
        if not len(losses) == len(lrs) == len(times) == ck.step:
            raise ValueError(f"{len(losses)} recorded losses for step {ck.step}")
        for key in _RESUMED_ENTRIES:
            metadata[key] = saved[key]
        metadata["losses"].extend(losses)
        metadata["lrs"].extend(lrs)
        metadata["step_times_s"].extend(times)
        if "communication_s" in metadata:
            metadata["communication_s"].extend(saved["communication_s"])
        metadata["peak_memory_bytes"].update(saved["peak_memory_bytes"])
        for key in (*MEMORY_CATEGORIES, CACHED_KEY):
            records.memory[key].extend(memory[key])
        records.validation.extend(validation)
        metadata["resumes"] = [*saved.get("resumes", []), {"step": ck.step, "from": str(ck.path)}]
        return float(saved["wall_time_s"])
    except (KeyError, TypeError, ValueError, RiftcoError) as e:
        raise ModelStateError(
            f"{str(state_path)!r} is not a usable trainer state: {type(e).__name__}: {e}"
        ) from None


def _train_guarded(
    *,
    stage: str,
    model: DecoderOnlyTransformer,
    params: list[Any],
    cfg: _LoopConfig,
    corpus: Corpus | ExampleCorpus,
    out_dir: Path,
    run: _RunState,
    metadata: dict[str, Any],
    progress: bool,
    log: Log | None,
    guard: _SigintGuard,
    group: distributed.ProcessGroup | None,
) -> dict[str, Any]:
    started = time.perf_counter()
    records = StepRecords(metadata, model.device)
    sampler: BatchSampler | ExampleBatchSampler
    if isinstance(corpus, ExampleCorpus):
        train_examples, val_examples = corpus.split(cfg.validation_fraction)
        packing = bool(getattr(cfg, "packing", False))
        sampler = ExampleBatchSampler(
            train_examples, cfg.batch_size, cfg.seq_len, cfg.seed, packing=packing
        )
        ExampleBatchSampler(val_examples, cfg.batch_size, cfg.seq_len, cfg.seed + 1)  # checks
        corpus_metadata = dict(
            corpus.to_dict(),
            train_examples=len(train_examples),
            validation_examples=len(val_examples),
        )

        def val_batches() -> Iterator[Batch]:
            val = ExampleBatchSampler(
                val_examples, cfg.batch_size, cfg.seq_len, cfg.seed + 1, packing=packing
            )
            return (val.next_batch() for _ in range(cfg.eval_batches))

    else:
        train_tokens, val_tokens = corpus.split(cfg.validation_fraction)
        sampler = BatchSampler(train_tokens, cfg.batch_size, cfg.seq_len, cfg.seed)
        val_seq = min(cfg.seq_len, val_tokens.shape[0] - 1)
        corpus_metadata = dict(
            corpus.to_dict(),
            train_bytes=int(train_tokens.shape[0]),
            validation_bytes=int(val_tokens.shape[0]),
        )

        def val_batches() -> Iterator[Batch]:
            val = BatchSampler(val_tokens, cfg.batch_size, val_seq, cfg.seed + 1)
            return (val.next_batch() for _ in range(cfg.eval_batches))

    optimizer: Adam | AdamW | distributed.DistributedOptimizer
    optimizer, optimizer_name = _make_optimizer(params, cfg)
    if group is not None:
        # Every rank must run the same math on the same data: checked before the first step.
        group.check_same("their settings, data or riftco version", run.math)
        del optimizer
        optimizer = distributed.DistributedOptimizer(
            group,
            params,
            lambda ps: _make_optimizer(ps, cfg)[0],
            zero=cfg.zero,
            bucket_bytes=cfg.data_parallel_bucket_bytes,
        )
        if log is not None:
            if group.world_size == 1 and not distributed.launched_by_mpi():
                log("data parallel: not started by an MPI launcher (mpiexec/mpirun/srun): 1 rank")
            log(
                f"data parallel: {group.world_size} rank{'s' if group.world_size > 1 else ''}, "
                f"{cfg.batch_size // group.world_size} rows each, ZeRO stage {cfg.zero}"
            )

    losses: list[float] = []
    lrs: list[float] = []
    step_times_s: list[float] = []
    peaks: dict[str, int] = {}
    metadata.update(
        stage=stage,
        riftco_version=__version__,
        activation_checkpointing=model.activation_checkpointing,
        attention=cfg.attention,
        device=model.device,
        optimizer=optimizer_name,
        lr_schedule=cfg.lr_schedule,
        training_config=cfg.to_dict(),
        corpus=corpus_metadata,
        num_threads=num_threads(),
        uniform_baseline_loss=UNIFORM_BASELINE_LOSS,
        validation_loss_before=None,
        validation_loss_after=None,
        dropout=_dropout_metadata(model),
        losses=losses,
        lrs=lrs,
        step_times_s=step_times_s,
        peak_memory_bytes=peaks,
        steps_completed=0,
        saved_step=None,
        complete=False,
        checkpoints=CHECKPOINTS_DIR,
    )
    if group is not None:
        metadata["data_parallel"] = {
            "world_size": group.world_size,
            "zero": cfg.zero,
            "bucket_bytes": cfg.data_parallel_bucket_bytes,
        }
        metadata["communication_s"] = []
    first_step = 0
    ck = run.resume_from
    if ck is not None:
        started -= _restore(ck, model, optimizer, sampler, run, metadata, records)
        first_step = ck.step
        if log is not None:
            log(f"resuming {stage} at step {first_step}/{cfg.steps} from {ck.path}")
    else:
        metadata["validation_loss_before"] = _validation_loss(model, val_batches)
        records.record_validation(0, metadata["validation_loss_before"])
        if log is not None:
            log(f"validation loss before {stage}: {metadata['validation_loss_before']:.4f}")
    # Planned after the validation passes (another shape would replace the model's cached plan):
    # the training steps of this shape run exactly the recorded plan. A budget below the smallest
    # achievable peak raises ConfigError here, before any step.
    plan = model.activation_checkpointing_plan(cfg.batch_size, cfg.seq_len)
    metadata["activation_checkpointing_plan"] = plan
    if log is not None:
        log(f"activation checkpointing plan: {plan['summary']}")

    def publish() -> None:
        """The model files and the metadata at the run folder's top level."""
        run.publish()
        _write_json_atomic(out_dir / METADATA_FILE, metadata)

    def save(step: int) -> None:
        train_time_s = sum(step_times_s)
        metadata.update(
            steps_completed=step,
            saved_step=step,
            final_loss=losses[-1] if losses else None,
            tokens_per_s=(
                (step * cfg.batch_size * cfg.seq_len / train_time_s) if train_time_s else None
            ),
            train_time_s=train_time_s,
            wall_time_s=time.perf_counter() - started,
            dropout=_dropout_metadata(model),
        )
        trainer_state: dict[str, Any] = {
            "format": TRAINER_STATE_FORMAT,
            "step": step,
            "math": run.math,
            "math_hash": math_hash(run.math),
            "sampler": sampler.get_state(),
            "dropout_step": model.dropout_step,
            "rng_state": list(get_rng_state()),
            "metadata": metadata,
        }

        if isinstance(optimizer, distributed.DistributedOptimizer):
            trainer_state["optimizer_files"] = optimizer.state_files()
            if group is not None and not group.is_main:
                optimizer.save(None)  # sends this rank's shard to rank 0 (ZeRO)
                return

        def write_files(folder: Path) -> None:
            run.save_model(folder)
            if isinstance(optimizer, distributed.DistributedOptimizer):
                optimizer.save(folder)
            else:
                optimizer.save(folder / OPTIMIZER_STATE_FILE)

        # The weights (or adapters) and Adam's two moments of the trained parameters.
        expected = 12 * sum(math.prod(p.shape) for p in params if p.requires_grad)
        with guard.deferred():
            write_checkpoint(
                out_dir, step, write_files, trainer_state, cfg.keep_checkpoints, expected
            )
            publish()

    bar = _Progress(cfg.steps, stage, progress, log, cfg.log_every, first_step)
    tokens_per_step = cfg.batch_size * cfg.seq_len
    try:
        if first_step == cfg.steps and (group is None or group.is_main):
            # The run had finished; its top-level files may predate the last checkpoint.
            with guard.deferred():
                publish()
        for step in range(first_step, cfg.steps):
            try:
                # A step, its validation and its save run whole: Ctrl-C takes effect after it,
                # so the checkpoint written then is exactly the state after this step.
                with guard.deferred():
                    _one_step(
                        step, model, optimizer, sampler, cfg, records, peaks, losses, lrs,
                        step_times_s, bar, tokens_per_step, group, metadata,
                    )
                    last = step + 1 == cfg.steps
                    if last or (cfg.eval_every is not None and (step + 1) % cfg.eval_every == 0):
                        val_loss = _validation_loss(model, val_batches)
                        records.record_validation(step + 1, val_loss)
                        if not last:
                            bar.note(f"step {step + 1}/{cfg.steps} validation loss {val_loss:.4f}")
                    if last:
                        metadata["validation_loss_after"] = val_loss
                        metadata["complete"] = True
                    if isinstance(optimizer, distributed.DistributedOptimizer):
                        # Gradient buckets held outside the native counters (ZeRO-2).
                        metadata["data_parallel"]["staging_peak_bytes"] = (
                            optimizer.staging_peak_bytes
                        )
                    if last or (step + 1) % cfg.save_every == 0:
                        save(step + 1)
            except KeyboardInterrupt:
                done = len(losses)
                if group is None and done > (metadata.get("saved_step") or 0):
                    save(done)
                raise
    finally:
        bar.close()
    if log is not None:
        log(
            f"{stage} done: final loss {metadata['final_loss']:.4f}, validation loss "
            f"{metadata['validation_loss_before']:.4f} -> {metadata['validation_loss_after']:.4f}, "
            f"{metadata['tokens_per_s']:,.0f} tokens/s, {metadata['wall_time_s']:.1f} s"
        )
    return metadata


def _one_step(
    step: int,
    model: DecoderOnlyTransformer,
    optimizer: Adam | AdamW | distributed.DistributedOptimizer,
    sampler: BatchSampler | ExampleBatchSampler,
    cfg: _LoopConfig,
    records: StepRecords,
    peaks: dict[str, int],
    losses: list[float],
    lrs: list[float],
    step_times_s: list[float],
    bar: _Progress,
    tokens_per_step: int,
    group: distributed.ProcessGroup | None = None,
    metadata: dict[str, Any] | None = None,
) -> None:
    """One optimizer step (0-based ``step``), recorded. In a data-parallel run this rank takes
    its rows of the global batch, its loss is weighted by its share of the global target count
    (:func:`riftco.distributed.loss_weight`), training forward ``step`` of rank ``r`` of ``N``
    draws the dropout masks of dropout step ``step * N + r``, and the loss recorded is the
    global batch's mean."""
    batch = sampler.next_batch()
    lr = cfg.lr_at(step)
    optimizer.lr = lr
    reset_peak_memory_stats()
    t0 = time.perf_counter()
    if group is None:
        loss = _loss(model, batch)
        # Each node's saved values go as soon as its VJP ran: the step peaks lower.
        loss.backward(retain_graph=False)
        optimizer.step()
        optimizer.zero_grad()
        # Read before the clock: on a GPU the step's kernels are only recorded until a value is
        # read back (item() waits for them and for the optimizer step queued before it).
        value = float(loss.item())
        del loss
    else:
        assert isinstance(optimizer, distributed.DistributedOptimizer)
        communication_s = group.communication_s
        value = _data_parallel_step(step, model, optimizer, batch, group)
        if metadata is not None:
            metadata["communication_s"].append(group.communication_s - communication_s)
    dt = time.perf_counter() - t0
    for k, v in records.record_step().items():
        peaks[k] = max(peaks.get(k, 0), v)
    losses.append(value)
    lrs.append(lr)
    step_times_s.append(dt)
    bar.update(step + 1, cfg.steps, value, tokens_per_step / dt, peaks.get("activation", 0))
    if not math.isfinite(value):
        raise RiftcoError(f"the loss became {value} at step {step + 1}; try a smaller lr")


def _data_parallel_step(
    step: int,
    model: DecoderOnlyTransformer,
    optimizer: distributed.DistributedOptimizer,
    batch: Batch,
    group: distributed.ProcessGroup,
) -> float:
    """One step of this rank on its rows of the global ``batch`` (see :func:`_one_step`);
    returns the global batch's mean loss."""
    n = group.world_size
    rows = group.rows(batch)
    local = distributed.target_count(rows)
    counts = group.all_gather(local)
    total = int(sum(counts))
    dropout = _dropout_metadata(model)
    keys = ("attention_dropout", "residual_dropout", "lora_dropout")
    if model.training and any((dropout[k] or 0.0) > 0.0 for k in keys):
        model.dropout_step = step * n + group.rank
    loss_sum = 0.0
    if local:
        loss = _loss(model, rows)
        weight = distributed.loss_weight(local, int(total), n)
        scaled = loss if weight == 1.0 else loss * weight
        # ZeRO-2 reduces during the pass only when every rank runs one.
        optimizer.backward(scaled, hooked=min(counts) > 0)
        loss_sum = float(loss.item()) * local
        del loss, scaled
    (global_sum,) = group.sum([loss_sum])
    optimizer.step()
    optimizer.zero_grad()
    return global_sum / total


def _write_plots(out_dir: Path, metadata: dict[str, Any], log: Log | None) -> None:
    """``loss.png`` and ``memory.png`` of a finished run, or one log line why not."""
    from riftco import plotting  # which imports matplotlib only when it draws

    try:
        written = plotting.write_plots(metadata, out_dir)
    except (plotting.PlottingUnavailableError, plotting.RunMetadataError, OSError) as e:
        # The run is saved and complete: a picture that cannot be drawn or written is reported.
        if log is not None:
            log(f"plots not written: {e}")
        return
    if log is not None:
        log("wrote " + " and ".join(str(p) for p in written))


def _check_data(corpus: Corpus | ExampleCorpus, cfg: _LoopConfig) -> None:
    """A text corpus fits ``seq_len`` and the split; examples split and fit ``seq_len + 1``.

    Raises:
        CorpusError: naming what does not fit.
        ConfigError: ``packing`` with a text corpus.
    """
    if isinstance(corpus, ExampleCorpus):
        for part in corpus.split(cfg.validation_fraction):
            ExampleBatchSampler(part, cfg.batch_size, cfg.seq_len, 0)
        return
    if getattr(cfg, "packing", False):
        raise ConfigError(
            "packing = True needs a riftco.ExampleCorpus (instruction/chat examples); a text "
            "corpus is already cut into full rows without padding"
        )
    if not isinstance(corpus, Corpus):
        raise CorpusError(
            f"corpus must be a riftco.Corpus or riftco.ExampleCorpus; got {type(corpus).__name__}"
        )
    check_corpus_fits(corpus, cfg.seq_len, cfg.validation_fraction)


def _check_fits(
    model_config: TransformerConfig, cfg: _LoopConfig, byte_tokens: bool = True
) -> None:
    """Byte tokens need ``vocab_size >= 256``; a corpus of another tokenizer's ids (not
    ``uint8``) is checked id by id by the model's loss."""
    if byte_tokens and model_config.vocab_size < VOCAB_SIZE:
        raise ConfigError(
            f"vocab_size must be >= {VOCAB_SIZE} for byte-level tokens; "
            f"got {model_config.vocab_size}"
        )
    if cfg.seq_len > model_config.max_seq_len:
        raise ConfigError(
            f"seq_len {cfg.seq_len} exceeds the model's max_seq_len {model_config.max_seq_len}"
        )


def _run_files(out: Path) -> list[str]:
    """The entries of ``out`` that belong to a stage's run (empty for a fresh folder)."""
    names = (METADATA_FILE, MODEL_STATE_FILE, ADAPTER_DIR, CHECKPOINTS_DIR)
    return [n for n in names if (out / n).exists()]


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


def _clear_checkpoints(out: Path, overwrite: bool) -> None:
    """With ``overwrite``, removes the replaced run's checkpoints: they must never be resumed
    into the new run. Otherwise removes the checkpoint temporaries of killed processes."""
    if overwrite and (out / CHECKPOINTS_DIR).exists():
        shutil.rmtree(out / CHECKPOINTS_DIR)
    else:
        remove_stale_temporaries(out / CHECKPOINTS_DIR)


def _corpus_identity(corpus: Corpus | ExampleCorpus) -> dict[str, Any]:
    if isinstance(corpus, ExampleCorpus):
        return {"examples": len(corpus), "sha256": corpus.fingerprint()}
    return {
        "bytes": int(corpus.tokens.nbytes),
        "dtype": str(corpus.tokens.dtype),
        "sha256": hashlib.sha256(np.ascontiguousarray(corpus.tokens).tobytes()).hexdigest(),
    }


def _file_identity(path: str | None) -> dict[str, Any] | None:
    """A model file's path, size and modification time (a changed base model is detected
    without reading it)."""
    if path is None:
        return None
    try:
        st = os.stat(path)
    except OSError:
        return {"path": path}
    return {"path": path, "bytes": st.st_size, "mtime_ns": st.st_mtime_ns}


def _math_settings(
    stage: str,
    model: DecoderOnlyTransformer,
    cfg: _LoopConfig,
    corpus: Corpus | ExampleCorpus,
    base_model: str | None = None,
) -> dict[str, Any]:
    """Every setting that changes what a run computes: a resume must match all of them."""
    training = {k: v for k, v in cfg.to_dict().items() if k not in HARMLESS_TRAINING_KEYS}
    training["device"] = model.device
    settings: dict[str, Any] = {
        "stage": stage,
        "riftco_version": __version__,
        "model_config": model.config.to_dict(),
        "training_config": training,
        "corpus": _corpus_identity(corpus),
        "base_model": _file_identity(base_model),
        "num_threads": num_threads(),
        "simd_level": simd_level(),
    }
    group = _group(cfg)
    if group is not None:
        # The ranks and the stage change the sums and the dropout masks: a resume needs both.
        settings["data_parallel"] = {
            "world_size": group.world_size,
            "zero": cfg.zero,
            "bucket_bytes": cfg.data_parallel_bucket_bytes,
        }
    return settings


def _group(cfg: _LoopConfig) -> distributed.ProcessGroup | None:
    """The MPI process group of a data-parallel run (``None`` otherwise).

    Raises:
        MPIUnavailableError: ``data_parallel`` without mpi4py.
        ConfigError: ``batch_size`` is not a multiple of the number of ranks.
    """
    if not cfg.data_parallel:
        return None
    group = distributed.init(cfg.data_parallel_timeout_s)
    group.check_batch_size(cfg.batch_size)
    return group


def _writes_files(cfg: _LoopConfig) -> bool:
    """Whether this process writes the run folder: always, except on the ranks other than 0
    of a data-parallel run."""
    group = _group(cfg)
    return group is None or group.is_main


def run_pretraining(
    model_config: TransformerConfig,
    pretraining_config: PretrainingConfig,
    corpus: Corpus,
    out_dir: str | os.PathLike[str],
    progress: bool = True,
    log: Log | None = None,
    plots: bool = True,
    *,
    resume: bool | str | os.PathLike[str] = False,
    overwrite: bool = False,
) -> dict[str, Any]:
    """Trains a fresh ``DecoderOnlyTransformer(model_config, ...)`` on ``corpus``.

    Writes ``model.safetensors``, ``config.json`` and ``training_metadata.json`` into
    ``out_dir`` (see the module docstring) and returns the metadata dict. ``progress`` shows a
    tqdm bar; otherwise ``log`` (when given) receives a line every ``log_every`` steps. ``plots``
    writes ``loss.png`` and ``memory.png`` at the end when matplotlib is installed.

    Every ``save_every`` steps, at the end and on Ctrl-C the run writes a training-state
    checkpoint into ``out_dir/checkpoints/`` (see :mod:`riftco.training_state`). ``resume=True``
    continues from the newest complete one (or starts at step 0 when ``out_dir`` holds no run
    yet); a path resumes from that checkpoint folder or run folder. A resumed run computes
    exactly what the uninterrupted run would have (bitwise, on the same machine with the same
    thread count): settings that would change that are refused. A folder that already holds a
    run is refused unless ``resume`` or ``overwrite`` (which replaces it) is given.

    Raises:
        ConfigError: ``seq_len`` above ``max_seq_len``, ``vocab_size < 256``, a checkpointing
            policy that does not fit the model (``segments:K`` with K above ``n_layers``, a
            per-block list of another length), or a budget below the smallest achievable peak
            (the message names it); all raised before ``out_dir`` is created.
        OutputDirError: ``out_dir`` cannot be written.
        CorpusError: the corpus is too small for ``seq_len`` (the message names the sizes and
            what fits), raised before ``out_dir`` is created.
        DeviceUnavailableError: the config's GPU has no adapter (before ``out_dir`` exists).
        OutputDirError: also when ``out_dir`` holds a run and neither ``resume`` nor
            ``overwrite`` is given.
        ConfigError: on resume, a setting that changes the math differs from the checkpoint's
            (every difference named with both values).
        ModelStateError: on resume, a missing, truncated or mismatched checkpoint file (named).
        CheckpointWriteError: a checkpoint cannot be written (disk full, read-only folder): the
            previous checkpoint stays loadable.
        TrainingInterrupted: on Ctrl-C, after the step in progress and its checkpoint.
    """
    cfg = pretraining_config
    _check_fits(model_config, cfg)
    check_corpus_fits(corpus, cfg.seq_len, cfg.validation_fraction)
    # The model and its plan before the output folder: a policy that does not fit the model or
    # a budget below the smallest achievable peak fails with nothing created.
    model = DecoderOnlyTransformer(
        model_config,
        attention=cfg.attention,
        activation_checkpointing=cfg.activation_checkpointing,
        activation_memory_budget=cfg.activation_memory_budget,
    )
    if cfg.device is not None:
        model.to(cfg.device)
    model.loss_chunk_bytes = cfg.loss_chunk_bytes
    model.activation_checkpointing_plan(cfg.batch_size, cfg.seq_len)
    checkpoint = _resume_checkpoint(Path(out_dir), resume, overwrite, log)
    math_settings = _math_settings("pretraining", model, cfg, corpus)
    if checkpoint is not None:
        check_same_math(checkpoint.state["math"], math_settings, checkpoint.path)
    out = prepare_out_dir(out_dir)
    if _writes_files(cfg):
        _clear_checkpoints(out, overwrite)
    metadata: dict[str, Any] = {
        "model_config": model_config.to_dict(),
        "files": [MODEL_STATE_FILE, "config.json", METADATA_FILE, CHECKPOINTS_DIR],
    }
    return _train(
        stage="pretraining",
        model=model,
        params=list(model.parameters()),
        cfg=cfg,
        corpus=corpus,
        out_dir=out,
        run=_RunState(
            save_model=lambda folder: model.save(str(folder / MODEL_STATE_FILE)),
            load_model=lambda folder: model.load_weights(str(folder / MODEL_STATE_FILE)),
            publish=lambda: model.save(str(out / MODEL_STATE_FILE)),
            math=math_settings,
            resume_from=checkpoint,
        ),
        metadata=metadata,
        progress=progress,
        log=log,
        plots=plots,
    )


def resolve_model_state(model_path: str | os.PathLike[str]) -> Path:
    """``model_path`` itself when a file; for a folder its ``model.safetensors``, else its
    ``model.safetensors.index.json`` (a sharded Hugging Face checkpoint).

    Raises:
        ModelStateError: when none exists (naming the path and the files looked for).
    """
    path = Path(model_path)
    if path.is_dir():
        for name in (MODEL_STATE_FILE, SHARD_INDEX_FILE):
            if (path / name).is_file():
                return path / name
        raise ModelStateError(
            f"no model state at {str(path)!r}: the folder has neither {MODEL_STATE_FILE} nor "
            f"{SHARD_INDEX_FILE}; pass a pretraining output folder or a Hugging Face model folder"
        )
    if not path.is_file():
        raise ModelStateError(
            f"no model state at {str(path)!r}: pass the output folder of a pretraining run or a "
            "model.safetensors file (`python -m riftco pretrain` writes runs/pretrain)"
        )
    return path


def load_model(
    model_path: str | os.PathLike[str],
    attention: str = ATTENTION_KINDS[0],
    activation_checkpointing: str | list[str] | tuple[str, ...] = (
        ACTIVATION_CHECKPOINTING_POLICIES[0]
    ),
    activation_memory_budget: int | str | None = None,
    *,
    determinism_check: str = "metadata",
    dtype: str = "float32",
) -> DecoderOnlyTransformer:
    """Loads ``model.safetensors`` from a stage output folder, a plain Hugging Face Llama model
    folder (``config.json`` with ``model.safetensors`` or a sharded
    ``model.safetensors.index.json``; F32, BF16 or F16 tensors), or a given file.

    ``attention``, ``activation_checkpointing``, ``activation_memory_budget`` and
    ``determinism_check`` (``"off"``, ``"metadata"`` or ``"values"``) are those of
    :class:`riftco.DecoderOnlyTransformer` (the file records none of them). ``dtype``
    ``"bfloat16"`` / ``"float16"`` reads the base weights straight into frozen 16-bit storage
    (for LoRA; see ``DecoderOnlyTransformer.set_frozen_weights_dtype``), never holding an f32
    copy of the model.

    Raises:
        ModelStateError: no or invalid model state at the path.
        ConfigError: an unknown option or a policy that does not fit the saved model (named).
    """
    return DecoderOnlyTransformer.load(
        str(resolve_model_state(model_path)),
        attention=attention,
        activation_checkpointing=activation_checkpointing,
        activation_memory_budget=activation_memory_budget,
        determinism_check=determinism_check,
        dtype=dtype,
    )


def _model_settings(model: DecoderOnlyTransformer) -> Callable[[], None]:
    """A function that restores the device, attention kind, policy, loss chunking and dropout probabilities
    ``model`` has now (what :func:`run_post_training` changes before its first step)."""
    device = model.device
    attention = model.attention
    policy = model.activation_checkpointing
    loss_chunk_bytes = model.loss_chunk_bytes
    attention_dropout = model.config.attention_dropout
    residual_dropout = model.config.residual_dropout
    lora_dropout = model.lora_dropout if model.has_lora else None

    def restore() -> None:
        model.to(device)
        model.set_attention(attention)
        model.set_activation_checkpointing(policy)
        model.loss_chunk_bytes = loss_chunk_bytes
        model.set_dropout(
            attention_dropout=attention_dropout,
            residual_dropout=residual_dropout,
            lora_dropout=lora_dropout,
        )

    return restore


def _post_training_setup(
    model: DecoderOnlyTransformer,
    cfg: PostTrainingConfig,
    base_path: str | None,
    resume_from: Path | None,
) -> tuple[dict[str, Any], Callable[[Path], None], Callable[[Path], None]]:
    """Enables the adapters for ``"lora"`` (fresh, or those of the checkpoint ``resume_from``);
    returns the initial metadata and the functions that save the trained state into a folder
    and load it back from one."""
    metadata: dict[str, Any] = {
        "model_config": model.config.to_dict(),
        "base_model": base_path,
        "fine_tuning_method": cfg.fine_tuning_method,
    }
    save_state: Callable[[Path], None]
    load_state: Callable[[Path], None]
    if cfg.fine_tuning_method == "lora":
        if resume_from is None:
            model.enable_lora(
                rank=cfg.lora_rank,
                alpha=cfg.lora_alpha,
                mlp=cfg.lora_mlp,
                seed=cfg.lora_seed,
                dropout=cfg.lora_dropout,
            )
        else:
            # The checkpoint's adapters (its settings are the config's: checked before).
            adapter = resume_from / ADAPTER_DIR
            try:
                model.load_lora(str(adapter))
            except (ConfigError, OSError) as e:
                raise ModelStateError(f"{str(adapter)!r}: {e}") from None
        if cfg.frozen_weights_dtype is not None:
            model.set_frozen_weights_dtype(cfg.frozen_weights_dtype)
        metadata["lora"] = {
            "rank": cfg.lora_rank,
            "alpha": cfg.lora_alpha,
            "mlp": cfg.lora_mlp,
            "dropout": cfg.lora_dropout,
            "frozen_weights_dtype": model.frozen_weights_dtype,
        }
        metadata["files"] = [ADAPTER_DIR, METADATA_FILE, CHECKPOINTS_DIR]

        def save_state(folder: Path) -> None:
            model.save_lora(str(folder / ADAPTER_DIR))

        def load_state(folder: Path) -> None:
            pass  # the checkpoint's adapters were loaded in place of fresh ones above

    else:
        metadata["files"] = [MODEL_STATE_FILE, "config.json", METADATA_FILE, CHECKPOINTS_DIR]

        def save_state(folder: Path) -> None:
            model.save(str(folder / MODEL_STATE_FILE))

        def load_state(folder: Path) -> None:
            model.load_weights(str(folder / MODEL_STATE_FILE))

    return metadata, save_state, load_state


def run_post_training(
    model_or_path: DecoderOnlyTransformer | str | os.PathLike[str],
    post_training_config: PostTrainingConfig,
    corpus: Corpus | ExampleCorpus,
    out_dir: str | os.PathLike[str],
    progress: bool = True,
    log: Log | None = None,
    base_model: str | os.PathLike[str] | None = None,
    plots: bool = True,
    *,
    resume: bool | str | os.PathLike[str] = False,
    overwrite: bool = False,
) -> dict[str, Any]:
    """Fine-tunes a pretrained model on ``corpus``.

    ``model_or_path`` is a model (moved to the config's ``device`` when not ``None``, its
    attention kind and policy set to the config's, its dropout probabilities to the config's
    that are not ``None``, and with LoRA it gains adapters: the object is modified) or a
    pretraining output folder / ``model.safetensors`` path (loaded with the config's attention
    and policy, then moved to its device). ``base_model`` names where a given
    model object came from, for the metadata. Everything that does not need the adapters is
    checked before a given model changes, and when a later check fails (a budget that fits the
    base model but not with the adapters, an unwritable ``out_dir``) its device, attention
    kind, policy and dropout probabilities are restored; adapters already added stay (they cannot be
    removed). The steps train in training mode; the model's mode is restored afterwards.

    With ``fine_tuning_method="lora"`` adapters are enabled and only they are trained (base
    weights frozen and unchanged); ``adapter/`` is written in PEFT layout. With ``"full"`` every
    parameter is trained and ``model.safetensors`` + ``config.json`` are written. Both write
    ``training_metadata.json`` (and ``loss.png``, ``memory.png`` as :func:`run_pretraining`
    with ``plots``); returns the metadata dict.

    Checkpoints, ``resume`` and ``overwrite`` as :func:`run_pretraining`; a resumed LoRA run
    loads the base model as the interrupted one did (the base file's path, size and
    modification time must match) and the adapters from the checkpoint.

    Raises:
        ModelStateError: no or invalid model state at the path; on resume, a missing, truncated
            or mismatched checkpoint file (named).
        ConfigError, OutputDirError, CorpusError, DeviceUnavailableError,
            CheckpointWriteError, TrainingInterrupted: as :func:`run_pretraining`.
    """
    cfg = post_training_config
    base_path = None if base_model is None else str(base_model)
    _check_data(corpus, cfg)
    byte_tokens = isinstance(corpus, Corpus) and corpus.tokens.dtype == np.uint8
    if isinstance(model_or_path, DecoderOnlyTransformer):
        model = model_or_path
        # Checked before the model changes; what is set below is undone if a later check fails.
        _check_fits(model.config, cfg, byte_tokens)
        undo = _model_settings(model)
    else:
        base_path = str(resolve_model_state(model_or_path))
        model = load_model(
            base_path,
            cfg.attention,
            cfg.activation_checkpointing,
            activation_memory_budget=cfg.activation_memory_budget,
            # 16-bit frozen weights (LoRA only) load straight into 16-bit storage.
            dtype=cfg.frozen_weights_dtype or "float32",
        )
        _check_fits(model.config, cfg, byte_tokens)
        undo = None
    try:
        if cfg.device is not None:
            # First, so that the adapters are created on the device.
            model.to(cfg.device)
        model.set_attention(cfg.attention)
        model.loss_chunk_bytes = cfg.loss_chunk_bytes
        model.set_activation_checkpointing(
            cfg.activation_checkpointing, activation_memory_budget=cfg.activation_memory_budget
        )
        # None keeps the model's own probability (the one saved with a loaded model).
        model.set_dropout(
            attention_dropout=cfg.attention_dropout, residual_dropout=cfg.residual_dropout
        )
        # Read-only checks of the run folder and of a resume's settings first: nothing below
        # (the adapters, which cannot be removed again) happens when they fail.
        checkpoint = _resume_checkpoint(Path(out_dir), resume, overwrite, log)
        stage = f"post_training_{cfg.fine_tuning_method}"
        math_settings = _math_settings(stage, model, cfg, corpus, base_path)
        if checkpoint is not None:
            check_same_math(checkpoint.state["math"], math_settings, checkpoint.path)
        if cfg.fine_tuning_method == "lora" and model.activation_checkpointing.startswith(
            "budget:"
        ):
            # A budget the base model alone exceeds fails here, before the adapters (which
            # cannot be removed again) exist.
            model.activation_checkpointing_plan(cfg.batch_size, cfg.seq_len)
        metadata, save_state, load_state = _post_training_setup(
            model, cfg, base_path, None if checkpoint is None else checkpoint.path
        )
        # Planned (with the adapters, which change the plan) before the output folder exists,
        # as in run_pretraining.
        model.activation_checkpointing_plan(cfg.batch_size, cfg.seq_len)
        out = prepare_out_dir(out_dir)
        if _writes_files(cfg):
            _clear_checkpoints(out, overwrite)
    except BaseException:
        if undo is not None:
            undo()
        raise
    return _train(
        stage=stage,
        model=model,
        params=list(model.parameters()),
        cfg=cfg,
        corpus=corpus,
        out_dir=out,
        run=_RunState(
            save_model=save_state,
            load_model=load_state,
            publish=lambda: save_state(out),
            math=math_settings,
            resume_from=checkpoint,
        ),
        metadata=metadata,
        progress=progress,
        log=log,
        plots=plots,
    )
