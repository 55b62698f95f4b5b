"""The training loop of the stages (:func:`riftco.training.stages.run_pretraining` and
:func:`~riftco.training.stages.run_post_training`), as the phases of a :class:`_Trainer`:

- :meth:`~_Trainer.setup`: the data (training batches, validation blocks), the optimizer and
  the metadata; then the state of the checkpoint it resumes from, or the validation pass before
  training; then the activation-checkpointing plan;
- :meth:`~_Trainer.step`: one optimizer step, recorded;
- :meth:`~_Trainer.evaluate`: the validation pass, when one is due;
- :meth:`~_Trainer.checkpoint`: a training-state checkpoint and the run folder's files;
- :meth:`~_Trainer.finish`: the closing log line, the plots, the end of a data-parallel run.

:meth:`~_Trainer.train` runs them (:meth:`~_Trainer.run_steps`: step, evaluate and checkpoint
for each step still to run) with Ctrl-C taking effect between steps. One process and one rank
of a data-parallel group run the same phases; what differs (the optimizer, the step's exchange,
the validation split, the optimizer state files, ending the job) is asked of their
:class:`~riftco.training.replicas._Replicas`. The behaviour is documented on
:mod:`riftco.training.stages`.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from riftco._native import (
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
from riftco.autograd.grad_mode import no_grad
from riftco.data.examples import ExampleBatchSampler, ExampleCorpus
from riftco.data.text import VOCAB_SIZE, BatchSampler, Corpus
from riftco.training import distributed
from riftco.training.configs import _LoopConfig
from riftco.training.interrupts import _SigintGuard, _sigint_guard
from riftco.training.progress import _Progress
from riftco.training.replicas import Batch, Optimizer, _batch_loss, _replicas
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


@dataclass
class _TrainingData:
    """What a run trains and validates on: the training batches, ``validation()`` (the same
    validation blocks on every call, one at a time) and the corpus's entry of the metadata."""

    sampler: BatchSampler | ExampleBatchSampler
    validation: Callable[[], Iterator[Batch]]
    description: dict[str, Any]


def _training_data(corpus: Corpus | ExampleCorpus, cfg: _LoopConfig) -> _TrainingData:
    """The corpus split into training and validation parts (``validation_fraction``), the
    training sampler seeded with ``seed`` and the validation one with ``seed + 1``."""
    if isinstance(corpus, ExampleCorpus):
        train_examples, val_examples = corpus.split(cfg.validation_fraction)
        packing = bool(getattr(cfg, "packing", False))
        sampler = ExampleBatchSampler(
            train_examples, cfg.batch_size, cfg.seq_len, cfg.seed, packing=packing
        )
        ExampleBatchSampler(val_examples, cfg.batch_size, cfg.seq_len, cfg.seed + 1)  # checks

        def val_examples_batches() -> Iterator[Batch]:
            val = ExampleBatchSampler(
                val_examples, cfg.batch_size, cfg.seq_len, cfg.seed + 1, packing=packing
            )
            return (val.next_batch() for _ in range(cfg.eval_batches))

        return _TrainingData(
            sampler,
            val_examples_batches,
            dict(
                corpus.to_dict(),
                train_examples=len(train_examples),
                validation_examples=len(val_examples),
            ),
        )
    train_tokens, val_tokens = corpus.split(cfg.validation_fraction)
    val_seq = min(cfg.seq_len, val_tokens.shape[0] - 1)

    def val_text_batches() -> Iterator[Batch]:
        val = BatchSampler(val_tokens, cfg.batch_size, val_seq, cfg.seed + 1)
        return (val.next_batch() for _ in range(cfg.eval_batches))

    return _TrainingData(
        BatchSampler(train_tokens, cfg.batch_size, cfg.seq_len, cfg.seed),
        val_text_batches,
        dict(
            corpus.to_dict(),
            train_bytes=int(train_tokens.shape[0]),
            validation_bytes=int(val_tokens.shape[0]),
        ),
    )


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


class _Trainer:
    """One run of a stage, phase by phase: :meth:`train` runs :meth:`setup`, :meth:`run_steps`
    (:meth:`step`, :meth:`evaluate` and, when due, :meth:`checkpoint` for each step still to
    run), then :meth:`finish`. The records (losses, learning rates, step times, memory peaks,
    validation losses) are lists inside ``metadata``, so that every save of it carries them so
    far. On a data-parallel rank other than 0 nothing is printed, plotted or written."""

    data: _TrainingData
    optimizer: Optimizer
    guard: _SigintGuard
    bar: _Progress

    def __init__(
        self,
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
    ) -> None:
        self.stage, self.model, self.params, self.cfg = stage, model, params, cfg
        self.corpus, self.out_dir, self.run, self.metadata = corpus, out_dir, run, metadata
        self.replicas = _replicas(cfg)
        if not self.replicas.writes_files:
            progress, log, plots = False, None, False
        self.progress, self.log, self.plots = progress, log, plots
        self.records = StepRecords(metadata, model.device)
        self.losses: list[float] = []
        self.lrs: list[float] = []
        self.step_times_s: list[float] = []
        self.peaks: dict[str, int] = {}
        self.first_step = 0

    def train(self) -> dict[str, Any]:
        """Runs the phases with SIGINT handled by a :class:`_SigintGuard` from start to end
        (whatever SIGINT disposition the process inherited): Ctrl-C anywhere in the run raises
        :class:`TrainingInterrupted` once the step in progress (its validation and save
        included) is complete and a checkpoint of it is written; a second one while that is
        handled is ignored. A data-parallel rank that is interrupted or fails ends the job (the
        other ranks would wait for it). Returns the metadata.

        The steps run in training mode (dropout active) whatever mode the caller left the model
        in; the validation passes switch to evaluation and back. The caller's mode is restored
        when the stage returns or raises."""
        model, replicas, metadata = self.model, self.replicas, self.metadata
        caller_training = model.training
        model.train()
        try:
            with _sigint_guard() as self.guard:
                try:
                    self.setup()
                    self.run_steps()
                    self.finish()
                    return metadata
                except KeyboardInterrupt:
                    # The ranks cannot agree on a last step to save: the job ends at once and
                    # resumes from its last checkpoint.
                    replicas.abort(
                        f"interrupted; resume from the last checkpoint in {str(self.out_dir)!r} "
                        f"(step {metadata.get('saved_step')})"
                    )
                    raise TrainingInterrupted(self.out_dir, metadata.get("saved_step")) from None
                except (
                    distributed.RankMismatchError,
                    distributed.CheckpointShardError,
                    distributed.ShardingError,
                ):
                    raise  # raised on every rank alike: each exits with it
                except Exception as e:
                    replicas.abort(f"rank {replicas.rank}: {type(e).__name__}: {e}")
                    raise
        finally:
            model.train(caller_training)

    # -- set up -----------------------------------------------------------------------------

    def setup(self) -> None:
        """The data, the optimizer and the metadata; then the checkpoint's state when the run
        resumes, else the validation pass before training; then the activation-checkpointing
        plan of the training batch shape (after the validation passes: another shape would
        replace the model's cached plan, so the steps run exactly the recorded plan; a budget
        below the smallest achievable peak raises ``ConfigError`` here, before any step)."""
        log = self.log
        self.started = time.perf_counter()
        self.data = _training_data(self.corpus, self.cfg)
        self.optimizer, optimizer_name = self.replicas.make_optimizer(
            self.params, self.cfg, self.run.math, log, self.model
        )
        self._start_metadata(optimizer_name)
        ck = self.run.resume_from
        if ck is not None:
            self.resume(ck)
            if log is not None:
                log(
                    f"resuming {stage_title(self.stage)} at step {self.first_step}/"
                    f"{self.cfg.steps} from {ck.path}"
                )
        else:
            before = self.validation_loss()
            self.metadata["validation_loss_before"] = before
            self.records.record_validation(0, before)
            if log is not None:
                log(f"validation loss before {stage_title(self.stage)}: {before:.4f}")
        plan = self.model.activation_checkpointing_plan(self.cfg.batch_size, self.cfg.seq_len)
        self.metadata["activation_checkpointing_plan"] = plan
        if log is not None:
            log(f"activation checkpointing plan: {plan['summary']}")

    def _start_metadata(self, optimizer_name: str) -> None:
        """The run's description and its empty records."""
        model, cfg = self.model, self.cfg
        self.metadata.update(
            stage=self.stage,
            riftco_version=__version__,
            activation_checkpointing=model.activation_checkpointing,
            attention=cfg.attention,
            device=model.device,
            optimizer=optimizer_name,
            lr_schedule=cfg.lr_schedule,
            training_config=cfg.to_dict(),
            corpus=self.data.description,
            num_threads=num_threads(),
            uniform_baseline_loss=UNIFORM_BASELINE_LOSS,
            validation_loss_before=None,
            validation_loss_after=None,
            dropout=_dropout_metadata(model),
            losses=self.losses,
            lrs=self.lrs,
            step_times_s=self.step_times_s,
            peak_memory_bytes=self.peaks,
            steps_completed=0,
            saved_step=None,
            complete=False,
            checkpoints=CHECKPOINTS_DIR,
        )
        self.replicas.describe(self.metadata, cfg)

    def resume(self, ck: Checkpoint) -> None:
        """Puts the checkpoint's model, optimizer, sampler, dropout step, thread generator and
        records back; the run continues at its step, its wall time counted from the time the
        run had taken so far.

        Raises:
            ModelStateError: a missing, truncated or mismatched file of the checkpoint, named.
        """
        saved = ck.state["metadata"]
        try:
            if self.replicas.loads_model_from_checkpoint(self.optimizer):
                self.run.load_model(ck.path)
        except ConfigError as e:
            raise ModelStateError(
                f"the model state of {str(ck.path)!r} does not fit: {e}"
            ) from None
        self.replicas.set_checkpoint_identity(self.optimizer, ck.step, math_hash(self.run.math))
        self._load_optimizer(ck.path)
        metadata, records = self.metadata, self.records
        try:
            self.data.sampler.set_state(ck.state["sampler"])
            self.model.dropout_step = ck.state["dropout_step"]
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
            metadata["resumes"] = [
                *saved.get("resumes", []),
                {"step": ck.step, "from": str(ck.path)},
            ]
            wall_time_s = float(saved["wall_time_s"])
        except (KeyError, TypeError, ValueError, RiftcoError) as e:
            raise ModelStateError(
                f"{str(ck.path / TRAINER_STATE_FILE)!r} is not a usable trainer state: "
                f"{type(e).__name__}: {e}"
            ) from None
        self.started -= wall_time_s
        self.first_step = ck.step

    def _load_optimizer(self, folder: Path) -> None:
        """The optimizer state of the checkpoint ``folder``, or a ``ModelStateError`` naming
        its file once (the native reader words it as a model-state file with its path)."""
        files = self.replicas.optimizer_files(self.optimizer).get("optimizer_files")
        # One file per rank (ZeRO): the errors name their file; the checkpoint is named here.
        path = folder if files else folder / OPTIMIZER_STATE_FILE
        what = "the state of the checkpoint" if files else "the optimizer state"
        try:
            self.replicas.load_optimizer(self.optimizer, folder)
        except distributed.CheckpointShardError as e:
            # Raised alike on every rank: each exits with it (no abort needed).
            raise distributed.CheckpointShardError(
                f"{what} {str(path)!r} cannot be read: {e}"
            ) from None
        except (ConfigError, ModelStateError, OSError) as e:
            reason = str(e)
            for named in (f"model state {path}: ", f"model state {folder}: "):
                reason = reason.removeprefix(named)
            if isinstance(e, ConfigError):
                # Read, but its values do not fit this run (names, shapes, non-finite moments).
                reason = reason.removeprefix("invalid config: ").removeprefix("optimizer state = ")
                raise ModelStateError(f"{what} {str(path)!r} does not fit this run: {reason}") from None
            raise ModelStateError(f"{what} {str(path)!r} cannot be read: {reason}") from None

    # -- the steps ----------------------------------------------------------------------------

    def run_steps(self) -> None:
        """Each step still to run with its validation pass and, when due (every
        ``save_every`` steps and the last), its checkpoint. A step runs whole: Ctrl-C takes
        effect after it, so a checkpoint written then is exactly the state after the step (one
        process writes one of the steps done since the last save; the ranks of a data-parallel
        run cannot agree on one and end without)."""
        cfg = self.cfg
        title = stage_title(self.stage)
        self.bar = _Progress(
            cfg.steps, title, self.progress, self.log, cfg.log_every, self.first_step
        )
        try:
            if self.first_step == cfg.steps:
                # The run had finished; its top-level files may predate the last checkpoint.
                with self.guard.deferred():
                    if self.replicas.writes_files:
                        self.publish()
                    else:
                        self.replicas.mirror_save(self.optimizer)
            for step in range(self.first_step, cfg.steps):
                try:
                    with self.guard.deferred():
                        self.step(step)
                        self.evaluate(step + 1)
                        if step + 1 == cfg.steps or (step + 1) % cfg.save_every == 0:
                            self.checkpoint(step + 1)
                except KeyboardInterrupt:
                    done = len(self.losses)
                    saved = self.metadata.get("saved_step") or 0
                    if self.replicas.saves_on_interrupt and done > saved:
                        self.checkpoint(done)
                    raise
        finally:
            self.bar.close()

    def step(self, step: int) -> None:
        """One optimizer step (0-based ``step``) on the next batch, at the schedule's learning
        rate, recorded: its loss, learning rate, time and memory peaks (reset at its start).

        Raises:
            RiftcoError: the loss is not finite.
        """
        cfg = self.cfg
        batch = self.data.sampler.next_batch()
        lr = cfg.lr_at(step)
        self.optimizer.lr = lr
        reset_peak_memory_stats()
        t0 = time.perf_counter()
        value = self.replicas.step(step, self.model, self.optimizer, batch)
        dt = time.perf_counter() - t0
        step_peaks = self.records.record_step()
        for k, v in step_peaks.items():
            self.peaks[k] = max(self.peaks.get(k, 0), v)
        self.losses.append(value)
        self.lrs.append(lr)
        self.step_times_s.append(dt)
        self.replicas.after_step(self.optimizer, self.metadata)
        tokens_per_s = cfg.batch_size * cfg.seq_len / dt
        self.bar.update(step + 1, cfg.steps, value, tokens_per_s, step_peaks.get("activation", 0))
        if not math.isfinite(value):
            raise RiftcoError(f"the loss became {value} at step {step + 1}; try a smaller lr")

    def evaluate(self, done: int) -> None:
        """The validation pass after ``done`` steps, when one is due (every ``eval_every``
        steps and after the last); the last one completes the run's metadata."""
        cfg = self.cfg
        last = done == cfg.steps
        if not (last or (cfg.eval_every is not None and done % cfg.eval_every == 0)):
            return
        val_loss = self.validation_loss()
        self.records.record_validation(done, val_loss)
        if last:
            self.metadata["validation_loss_after"] = val_loss
            self.metadata["complete"] = True
        else:
            self.bar.note(f"step {done}/{cfg.steps} validation loss {val_loss:.4f}")

    def validation_loss(self) -> float:
        """Mean loss over the validation blocks, holding one block at a time, so
        ``eval_batches`` bounds the time but not the memory. Computed in evaluation mode (no
        dropout, no dropout step) and without recording a graph (``no_grad``: the chunked loss
        computes no gradients); the model's mode is restored afterwards.

        Of ``N`` data-parallel ranks rank ``r`` computes blocks ``r, r + N, ...`` and the ranks
        exchange their losses: every rank gets the exact sum (``math.fsum``) of the same
        per-block losses one process computes, so the result is bitwise the same."""
        model, replicas = self.model, self.replicas
        training = model.training
        model.eval()
        try:
            with no_grad():
                mine = []
                first, total = None, 0
                for i, block in enumerate(self.data.validation()):
                    first = block if first is None else first
                    total += 1
                    if i % replicas.world_size == replicas.rank:
                        mine.append(_batch_loss(model, block).item())
                if replicas.lockstep_forwards(self.optimizer) and first is not None:
                    # Under ZeRO-3 every rank runs as many forwards (each gathers the units):
                    # the ranks with a block fewer run one more, whose loss is not counted.
                    for _ in range(-(-total // replicas.world_size) - len(mine)):
                        _batch_loss(model, first)
        finally:
            model.train(training)
        losses = replicas.gather(mine)
        return math.fsum(losses) / len(losses)

    # -- checkpoint -----------------------------------------------------------------------------

    def checkpoint(self, step: int) -> None:
        """The training-state checkpoint after ``step`` steps (the model or adapters, the
        optimizer state, the trainer state with the metadata so far), then the model files and
        the metadata at the run folder's top level; Ctrl-C waits until both are written. On a
        data-parallel rank other than 0 it only hands its optimizer shard to rank 0 (under
        ZeRO-3 also its parameter parts, and it takes part in rank 0's two saves of the model,
        which gather one unit at a time)."""
        cfg, metadata = self.cfg, self.metadata
        train_time_s = sum(self.step_times_s)
        metadata.update(
            steps_completed=step,
            saved_step=step,
            final_loss=self.losses[-1] if self.losses else None,
            tokens_per_s=(
                (step * cfg.batch_size * cfg.seq_len / train_time_s) if train_time_s else None
            ),
            train_time_s=train_time_s,
            wall_time_s=time.perf_counter() - self.started,
            dropout=_dropout_metadata(self.model),
        )
        trainer_state: dict[str, Any] = {
            "format": TRAINER_STATE_FORMAT,
            "step": step,
            "math": self.run.math,
            "math_hash": math_hash(self.run.math),
            "sampler": self.data.sampler.get_state(),
            "dropout_step": self.model.dropout_step,
            "rng_state": list(get_rng_state()),
            "metadata": metadata,
        }
        trainer_state.update(self.replicas.optimizer_files(self.optimizer))
        self.replicas.set_checkpoint_identity(self.optimizer, step, trainer_state["math_hash"])
        if not self.replicas.writes_files:
            self.replicas.mirror_save(self.optimizer)  # the checkpoint's model
            self.replicas.save_optimizer(self.optimizer, None)
            self.replicas.mirror_save(self.optimizer)  # the run folder's model
            return

        def write_files(folder: Path) -> None:
            self.run.save_model(folder)
            self.replicas.save_optimizer(self.optimizer, folder)

        # The weights (or adapters) and Adam's two moments of the trained parameters.
        expected = 12 * sum(math.prod(p.shape) for p in self.params if p.requires_grad)
        with self.guard.deferred():
            write_checkpoint(
                self.out_dir, step, write_files, trainer_state, cfg.keep_checkpoints, expected
            )
            self.publish()

    def publish(self) -> None:
        """The model files and the metadata at the run folder's top level."""
        self.run.publish()
        write_json_atomic(self.out_dir / METADATA_FILE, self.metadata)

    # -- finish -------------------------------------------------------------------------------

    def finish(self) -> None:
        """The closing log line, ``loss.png`` and ``memory.png`` with ``plots``, and on a
        data-parallel run a barrier: every rank returns once rank 0's files are complete."""
        metadata, log = self.metadata, self.log
        if log is not None:
            log(
                f"{stage_title(self.stage)} done: final loss {metadata['final_loss']:.4f}, "
                f"validation loss {metadata['validation_loss_before']:.4f} -> "
                f"{metadata['validation_loss_after']:.4f}, "
                f"{metadata['tokens_per_s']:,.0f} tokens/s, {metadata['wall_time_s']:.1f} s"
            )
        if self.plots:
            _write_plots(self.out_dir, metadata, log)
        self.replicas.end(self.optimizer)
        self.replicas.barrier()


def _dropout_metadata(model: DecoderOnlyTransformer) -> dict[str, Any]:
    """The dropout probabilities and the dropout step (the position in the mask stream, which is
    not model state: a resumed run restores it with ``model.dropout_step = ...``)."""
    return {
        "attention_dropout": model.config.attention_dropout,
        "residual_dropout": model.config.residual_dropout,
        "lora_dropout": model.lora_dropout,
        "dropout_step": model.dropout_step,
    }


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
