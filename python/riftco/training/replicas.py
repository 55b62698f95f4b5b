"""Who trains: one process (:class:`_SingleProcess`), or this rank of a data-parallel MPI
group (:class:`_DataParallelRank`, over :mod:`riftco.training.distributed`).

The training loop (:mod:`riftco.training.loop`) runs the same phases either way and asks its
:class:`_Replicas` for what differs: the optimizer, the forward and backward of a step, which
validation blocks this process computes, how the optimizer state is saved and loaded, and how
the job ends when something fails.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Union

from riftco._native import Adam, AdamW, ConfigError, DecoderOnlyTransformer
from riftco.training import distributed
from riftco.training.configs import _LoopConfig
from riftco.training.run_folder import Log
from riftco.training.state import OPTIMIZER_STATE_FILE

Batch = Any
"""A token block ``int64 [batch, seq + 1]``, or ``(tokens, labels)`` (``(tokens, labels,
position_ids)`` when packed) of an :class:`~riftco.data.examples.ExampleCorpus`."""

Optimizer = Union[Adam, AdamW, distributed.DistributedOptimizer]


def _batch_loss(model: DecoderOnlyTransformer, batch: Batch) -> Any:
    """The model's loss of a block, or of ``(tokens, labels)`` over the labelled targets."""
    if isinstance(batch, tuple):
        # (tokens, labels), or (tokens, labels, position_ids) of a packing sampler.
        positions = batch[2] if len(batch) == 3 else None
        return model.loss(batch[0], labels=batch[1], position_ids=positions)
    return model.loss(batch)


def _make_optimizer(params: list[Any], cfg: _LoopConfig) -> tuple[Adam | AdamW, str]:
    """Adam, or AdamW when ``weight_decay > 0``, at the schedule's first learning rate."""
    if cfg.weight_decay > 0.0:
        return AdamW(params, lr=cfg.lr_at(0), weight_decay=cfg.weight_decay), "AdamW"
    return Adam(params, lr=cfg.lr_at(0)), "Adam"


class _Replicas:
    """The processes that train one model together. ``world_size`` and ``rank`` split the
    validation blocks; ``writes_files`` says whether this process writes the run folder (and
    prints); ``saves_on_interrupt`` whether a Ctrl-C between saves writes a checkpoint of the
    steps done."""

    world_size = 1
    rank = 0
    writes_files = True
    saves_on_interrupt = True

    def make_optimizer(
        self,
        params: list[Any],
        cfg: _LoopConfig,
        math_settings: dict[str, Any],
        log: Log | None,
        model: DecoderOnlyTransformer,
    ) -> tuple[Optimizer, str]:
        """The optimizer of ``params`` (``model``'s trainable parameters) and its name for the
        metadata."""
        raise NotImplementedError

    def loads_model_from_checkpoint(self, optimizer: Optimizer) -> bool:
        """Whether a resume reads the checkpoint's model (or adapter) files into the model;
        ``False`` under ZeRO-3, whose optimizer loads each rank's parameter parts instead."""
        return True

    def mirror_save(self, optimizer: Optimizer) -> None:
        """On a process that writes no files: takes part in the model save that the writing
        process runs (under ZeRO-3 each unit's gather is a collective)."""

    def set_checkpoint_identity(self, optimizer: Optimizer, step: int, run: str) -> None:
        """What the optimizer's checkpoint files record and are checked against on loading
        (under ZeRO-3 the parameter shards: the step and the hash of the run's settings)."""

    def lockstep_forwards(self, optimizer: Optimizer) -> bool:
        """Whether every process must run the same forward passes (ZeRO-3: each unit's gather
        is a collective)."""
        return False

    def end(self, optimizer: Optimizer) -> None:
        """After the last step and save: the model is left whole on every process."""

    def describe(self, metadata: dict[str, Any], cfg: _LoopConfig) -> None:
        """Adds what the metadata records about the replicas."""

    def step(
        self, step: int, model: DecoderOnlyTransformer, optimizer: Optimizer, batch: Batch
    ) -> float:
        """Forward, backward and the optimizer step of the 0-based ``step`` on ``batch`` (the
        global batch); returns its mean loss."""
        raise NotImplementedError

    def after_step(self, optimizer: Optimizer, metadata: dict[str, Any]) -> None:
        """Records what the step measured besides the loss and the memory."""

    def gather(self, values: list[float]) -> list[float]:
        """Every process's ``values`` in rank order (this process's own when it is alone)."""
        return values

    def optimizer_files(self, optimizer: Optimizer) -> dict[str, Any]:
        """Entries of the trainer state that name the optimizer state files."""
        return {}

    def save_optimizer(self, optimizer: Optimizer, folder: Path | None) -> None:
        """Writes the optimizer state into the checkpoint ``folder`` (``None`` on a process
        that writes no files)."""
        raise NotImplementedError

    def load_optimizer(self, optimizer: Optimizer, folder: Path) -> None:
        """Reads the optimizer state of the checkpoint ``folder`` back."""
        raise NotImplementedError

    def abort(self, message: str) -> None:
        """Ends the other processes, which would wait for this one (nothing when alone)."""

    def barrier(self) -> None:
        """Waits for every process (nothing when alone)."""


class _SingleProcess(_Replicas):
    """One process trains alone, with Adam or AdamW; its state is one file of the checkpoint."""

    def make_optimizer(
        self,
        params: list[Any],
        cfg: _LoopConfig,
        math_settings: dict[str, Any],
        log: Log | None,
        model: DecoderOnlyTransformer,
    ) -> tuple[Optimizer, str]:
        return _make_optimizer(params, cfg)

    def step(
        self, step: int, model: DecoderOnlyTransformer, optimizer: Optimizer, batch: Batch
    ) -> float:
        loss = _batch_loss(model, batch)
        # Each node's saved values go as soon as its VJP ran: the step peaks lower.
        loss.backward(retain_graph=False)
        optimizer.step()
        optimizer.zero_grad()
        # Read before the clock: on a GPU the step's kernels are only recorded until a value is
        # read back (item() waits for them and for the optimizer step queued before it).
        return float(loss.item())

    def save_optimizer(self, optimizer: Optimizer, folder: Path | None) -> None:
        assert folder is not None
        optimizer.save(folder / OPTIMIZER_STATE_FILE)

    def load_optimizer(self, optimizer: Optimizer, folder: Path) -> None:
        optimizer.load(folder / OPTIMIZER_STATE_FILE)


class _DataParallelRank(_Replicas):
    """This rank of a data-parallel group: it takes its rows of every global batch, the
    gradients are reduced over the ranks by a :class:`~riftco.training.distributed.
    DistributedOptimizer` (ZeRO 0, 1 or 2), rank 0 writes the files, and an interrupted or failed
    rank ends the job (the ranks cannot agree on a last step to save: the run resumes from its
    last checkpoint)."""

    saves_on_interrupt = False

    def __init__(self, group: distributed.ProcessGroup) -> None:
        self.group = group
        self.world_size = group.world_size
        self.rank = group.rank
        self.writes_files = group.is_main
        self._communication_s = 0.0

    def make_optimizer(
        self,
        params: list[Any],
        cfg: _LoopConfig,
        math_settings: dict[str, Any],
        log: Log | None,
        model: DecoderOnlyTransformer,
    ) -> tuple[Optimizer, str]:
        group = self.group
        # Every rank must run the same math on the same data: checked before the first step.
        group.check_same("their settings, data or riftco version", math_settings)
        failure: str | None = None
        budget = cfg.zero3_gather_budget
        assert not isinstance(budget, str)  # a size string is parsed by the config
        optimizer: distributed.DistributedOptimizer | None = None
        try:
            optimizer = distributed.DistributedOptimizer(
                group,
                params,
                lambda ps: _make_optimizer(ps, cfg)[0],
                zero=cfg.zero,
                bucket_bytes=cfg.data_parallel_bucket_bytes,
                model=model if cfg.zero == 3 else None,
                max_gathered_bytes=budget,
            )
        except ConfigError as e:
            if cfg.zero != 3:
                raise
            failure = str(e)
        # ZeRO-3's checks of the model are the same on every rank: every rank stops alike.
        if cfg.zero == 3:
            failures = group.all_gather(failure)
            if any(failures):
                raise distributed.ShardingError(next(f for f in failures if f))
        assert optimizer is not None
        if log is not None:
            if group.world_size == 1 and not distributed.launched_by_mpi():
                log("data parallel: not started by an MPI launcher (mpiexec/mpirun/srun): 1 rank")
            log(
                f"data parallel: {group.world_size} rank{'s' if group.world_size > 1 else ''}, "
                f"{cfg.batch_size // group.world_size} rows each, ZeRO stage {cfg.zero}"
            )
        return optimizer, "AdamW" if cfg.weight_decay > 0.0 else "Adam"

    def describe(self, metadata: dict[str, Any], cfg: _LoopConfig) -> None:
        metadata["data_parallel"] = {
            "world_size": self.world_size,
            "zero": cfg.zero,
            "bucket_bytes": cfg.data_parallel_bucket_bytes,
        }
        metadata["communication_s"] = []

    def step(
        self, step: int, model: DecoderOnlyTransformer, optimizer: Optimizer, batch: Batch
    ) -> float:
        """This rank's loss is weighted by its share of the global target count
        (:func:`~riftco.training.distributed.loss_weight`), training forward ``step`` of rank
        ``r`` of ``N`` draws the dropout masks of dropout step ``step * N + r``, and the loss
        returned is the global batch's mean."""
        assert isinstance(optimizer, distributed.DistributedOptimizer)
        group, n = self.group, self.world_size
        communication_s = group.communication_s
        rows = group.rows(batch)
        local = distributed.target_count(rows)
        counts = group.all_gather(local)
        total = int(sum(counts))
        if model.training and _has_dropout(model):
            model.dropout_step = step * n + group.rank
        loss_sum = 0.0
        if not local and optimizer.sharded is not None:
            # ZeRO-3: every rank runs the same passes (each unit's gather is a collective). A
            # rank without a target runs the language-model loss of its tokens, weighted 0.
            tokens = rows[0] if isinstance(rows, tuple) else rows
            optimizer.backward(model.loss(tokens) * 0.0, hooked=min(counts) > 0)
        if local:
            loss = _batch_loss(model, rows)
            weight = distributed.loss_weight(local, int(total), n)
            scaled = loss if weight == 1.0 else loss * weight
            # ZeRO-2 reduces during the pass only when every rank runs one.
            optimizer.backward(scaled, hooked=min(counts) > 0)
            loss_sum = float(loss.item()) * local
            del loss, scaled
        (global_sum,) = group.sum([loss_sum])
        optimizer.step()
        optimizer.zero_grad()
        self._communication_s = group.communication_s - communication_s
        return global_sum / total

    def loads_model_from_checkpoint(self, optimizer: Optimizer) -> bool:
        assert isinstance(optimizer, distributed.DistributedOptimizer)
        return optimizer.sharded is None

    def mirror_save(self, optimizer: Optimizer) -> None:
        assert isinstance(optimizer, distributed.DistributedOptimizer)
        if optimizer.sharded is not None:
            optimizer.sharded.mirror_save()

    def set_checkpoint_identity(self, optimizer: Optimizer, step: int, run: str) -> None:
        assert isinstance(optimizer, distributed.DistributedOptimizer)
        optimizer.identity = {"step": step, "run": run}

    def lockstep_forwards(self, optimizer: Optimizer) -> bool:
        assert isinstance(optimizer, distributed.DistributedOptimizer)
        return optimizer.sharded is not None

    def end(self, optimizer: Optimizer) -> None:
        assert isinstance(optimizer, distributed.DistributedOptimizer)
        if optimizer.sharded is not None:
            optimizer.sharded.detach()

    def after_step(self, optimizer: Optimizer, metadata: dict[str, Any]) -> None:
        assert isinstance(optimizer, distributed.DistributedOptimizer)
        metadata["communication_s"].append(self._communication_s)
        if optimizer.sharded is not None:
            sharded = optimizer.sharded
            metadata["data_parallel"].setdefault("exposed_communication_s", []).append(
                sharded.exposed_s
            )
            metadata["data_parallel"]["gathers_per_step"] = sharded.gathers
            metadata["data_parallel"]["gathered_peak_units"] = sharded.gathered_peak
            metadata["data_parallel"]["sliced_tables"] = sharded.sliced
            sharded.reset_counters()
        # Gradient buckets held outside the native counters (ZeRO-2).
        metadata["data_parallel"]["staging_peak_bytes"] = optimizer.staging_peak_bytes

    def gather(self, values: list[float]) -> list[float]:
        return [x for part in self.group.all_gather(values) for x in part]

    def optimizer_files(self, optimizer: Optimizer) -> dict[str, Any]:
        assert isinstance(optimizer, distributed.DistributedOptimizer)
        return {"optimizer_files": optimizer.state_files()}

    def save_optimizer(self, optimizer: Optimizer, folder: Path | None) -> None:
        # On the ranks other than 0 (folder None) this sends the rank's shard to rank 0 (ZeRO).
        assert isinstance(optimizer, distributed.DistributedOptimizer)
        optimizer.save(folder)

    def load_optimizer(self, optimizer: Optimizer, folder: Path) -> None:
        assert isinstance(optimizer, distributed.DistributedOptimizer)
        optimizer.load(folder)

    def abort(self, message: str) -> None:
        if self.world_size > 1:
            self.group.abort(message)

    def barrier(self) -> None:
        if self.world_size > 1:
            self.group.barrier()  # every rank returns once rank 0's files are complete


def _has_dropout(model: DecoderOnlyTransformer) -> bool:
    """Whether a training forward of ``model`` draws dropout masks."""
    probabilities = (
        model.config.attention_dropout,
        model.config.residual_dropout,
        model.lora_dropout,
    )
    return any((p or 0.0) > 0.0 for p in probabilities)


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


def _replicas(cfg: _LoopConfig) -> _Replicas:
    """This process's replicas: a data-parallel rank with ``data_parallel``, else alone.

    Raises:
        MPIUnavailableError, ConfigError: as :func:`_group`.
    """
    group = _group(cfg)
    return _SingleProcess() if group is None else _DataParallelRank(group)


def _writes_files(cfg: _LoopConfig) -> bool:
    """Whether this process writes the run folder: always, except on the ranks other than 0
    of a data-parallel run."""
    return _replicas(cfg).writes_files
