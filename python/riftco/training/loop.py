"""The training loop of the stages (:func:`riftco.stages.run_pretraining` and
:func:`riftco.stages.run_post_training`): SIGINT handling, progress, the steps (one process or
one data-parallel rank of :mod:`riftco.distributed`), validation, checkpoints and resume. The
behaviour is documented on :mod:`riftco.stages`."""

from __future__ import annotations

import contextlib
import importlib
import math
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType
from typing import Any

from riftco.training import distributed
from riftco._native import (
    Adam,
    AdamW,
    ConfigError,
    DecoderOnlyTransformer,
    ModelStateError,
    RiftcoError,
    __version__,
    get_rng_state,
    num_threads,
    reset_peak_memory_stats,
    set_rng_state,
)
from riftco.training.configs import _LoopConfig
from riftco.data.text import VOCAB_SIZE, BatchSampler, Corpus
from riftco.data.examples import ExampleBatchSampler, ExampleCorpus
from riftco.autograd.grad_mode import no_grad
from riftco.training.run_folder import METADATA_FILE, Log, TrainingInterrupted, write_json_atomic
from riftco.training.run_records import CACHED_KEY, MEMORY_CATEGORIES, StepRecords, stage_title
from riftco.training.state import (
    CHECKPOINTS_DIR,
    OPTIMIZER_STATE_FILE,
    TRAINER_STATE_FILE,
    TRAINER_STATE_FORMAT,
    Checkpoint,
    math_hash,
    write_checkpoint,
)

UNIFORM_BASELINE_LOSS = math.log(VOCAB_SIZE)

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
    model: DecoderOnlyTransformer,
    batches: Callable[[], Iterator[Batch]],
    group: distributed.ProcessGroup | None = None,
) -> float:
    """Mean loss over the blocks ``batches()`` yields (the same blocks on every call), holding one
    block at a time, so ``eval_batches`` bounds the time but not the memory. Computed in
    evaluation mode (no dropout, no dropout step) and without recording a graph (``no_grad``:
    the chunked loss computes no gradients); the model's mode is restored afterwards.

    With a data-parallel ``group`` rank ``r`` of ``N`` computes blocks ``r, r + N, ...`` and the
    ranks exchange their losses: every rank gets the exact sum (``math.fsum``) of the same
    per-block losses one process computes, so the result is bitwise the same."""
    ranks, rank = (1, 0) if group is None else (group.world_size, group.rank)
    training = model.training
    model.eval()
    try:
        with no_grad():
            mine = [
                _loss(model, block).item()
                for i, block in enumerate(batches())
                if i % ranks == rank
            ]
    finally:
        model.train(training)
    losses = mine if group is None else [x for part in group.all_gather(mine) for x in part]
    return math.fsum(losses) / len(losses)


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
        self._act_peak = 0
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
        """Shows ``step``'s loss and throughput, and the activation peak of the steps this
        process ran (``act_bytes``: this step's), not of a resumed run's earlier steps, which
        may have run under another checkpointing policy."""
        self._act_peak = max(self._act_peak, act_bytes)
        mib = self._act_peak / 2**20
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
        # The native reader words it as a model-state file with its path; this is the
        # checkpoint's optimizer state, named once.
        reason = str(e)
        for named in (f"model state {optimizer_path}: ", f"model state {ck.path}: "):
            reason = reason.removeprefix(named)
        if isinstance(e, ConfigError):
            # Read, but its values do not fit this run (names, shapes, non-finite moments).
            reason = reason.removeprefix("invalid config: ").removeprefix("optimizer state = ")
            raise ModelStateError(
                f"the optimizer state {str(optimizer_path)!r} does not fit this run: {reason}"
            ) from None
        raise ModelStateError(
            f"the optimizer state {str(optimizer_path)!r} cannot be read: {reason}"
        ) from None
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
            log(f"resuming {stage_title(stage)} at step {first_step}/{cfg.steps} from {ck.path}")
    else:
        metadata["validation_loss_before"] = _validation_loss(model, val_batches, group)
        records.record_validation(0, metadata["validation_loss_before"])
        if log is not None:
            log(f"validation loss before {stage_title(stage)}: {metadata['validation_loss_before']:.4f}")
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
        write_json_atomic(out_dir / METADATA_FILE, metadata)

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

    bar = _Progress(cfg.steps, stage_title(stage), progress, log, cfg.log_every, first_step)
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
                        val_loss = _validation_loss(model, val_batches, group)
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
            f"{stage_title(stage)} done: final loss {metadata['final_loss']:.4f}, validation loss "
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
    step_peaks = records.record_step()
    for k, v in step_peaks.items():
        peaks[k] = max(peaks.get(k, 0), v)
    losses.append(value)
    lrs.append(lr)
    step_times_s.append(dt)
    bar.update(step + 1, cfg.steps, value, tokens_per_step / dt, step_peaks.get("activation", 0))
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
    from riftco.training import plotting  # which imports matplotlib only when it draws

    try:
        written = plotting.write_plots(metadata, out_dir)
    except (plotting.PlottingUnavailableError, plotting.RunMetadataError, OSError) as e:
        # The run is saved and complete: a picture that cannot be drawn or written is reported.
        if log is not None:
            log(f"plots not written: {e}")
        return
    if log is not None:
        log("wrote " + " and ".join(str(p) for p in written))


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
