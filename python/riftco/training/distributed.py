"""Data-parallel training over MPI, with ZeRO-sharded optimizer state (also importable as
``riftco.distributed``).

One model replica per process, launched by any MPI launcher (``mpiexec -n N``, ``mpirun``,
Slurm's ``srun``); the processes talk through ``mpi4py`` (``pip install 'riftco[mpi]'`` brings
it with the MPICH wheel; a system MPI works too, see ``docs/distributed.md``).

The data-parallel rule (Li et al. 2020, "PyTorch Distributed: Experiences on Accelerating Data
Parallel Training"): every rank draws the same global batch of ``G`` rows, keeps rows
``[rank * G / N, (rank + 1) * G / N)`` (:meth:`ProcessGroup.rows`), computes its loss and
gradients, and the gradients are averaged across ranks in buckets of parameters, in a fixed
order, so every rank holds the same sum. Where ranks hold different numbers of target tokens
(labels with ``IGNORE_INDEX``), each rank's loss is weighted by its share of the global target
count first (:func:`loss_weight`), so the update is that of the mean over the whole batch, as
one process with batch ``G`` computes it.

ZeRO (Rajbhandari et al. 2020, "ZeRO: Memory Optimizations Toward Training Trillion Parameter
Models") over the flat vector of trainable parameters: each bucket is cut into ``N`` equal parts
(the last padded with zeros) and rank ``r`` owns part ``r`` of every bucket.

- ``zero=0``: the gradients are all-reduced and every rank runs the whole optimizer.
- ``zero=1``: the gradients are all-reduced into the parameters' ``grad`` (kept, as stage 1
  does), each rank updates only its parts with Adam moments of its parts (``optimizer_state``
  bytes ``1/N``) and the updated parts are all-gathered into every replica.
- ``zero=2``: as 1, but the gradients are reduce-scattered: each rank receives only the sums of
  its parts, and the full gradients are released bucket by bucket as they are reduced.
- ``zero=3``: as 2, and the parameters are sharded too (:mod:`riftco.training.sharded`): each
  rank keeps ``1/N`` of every unit (the embedding, each block, the final norm, the head), the
  model gathers a unit only while it computes with it (again for a checkpoint's replay), the
  buckets are the units, and the updated parts stay where they are (the next forward gathers
  them).

Errors: without ``mpi4py`` :func:`init` raises :class:`MPIUnavailableError` saying what to
install. Ranks whose settings differ raise :class:`RankMismatchError` on every rank, naming the
setting and both values (:meth:`ProcessGroup.check_same`). A collective that waits longer than
``timeout_s`` (a rank died or hangs) makes the waiting rank print which one it waited in and
abort the whole job (``MPI_Abort``), so no rank waits forever.
"""

from __future__ import annotations

import array
import hashlib
import importlib
import json
import math
import os
import stat
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from riftco._native import (
    IGNORE_INDEX,
    Adam,
    AdamW,
    ConfigError,
    DecoderOnlyTransformer,
    ModelStateError,
    RiftcoError,
    Variable,
)
from riftco.training.differences import canonical, first_difference
from riftco.training.sharded import DEFAULT_MAX_GATHERED, ShardedParameters

__all__ = [
    "DEFAULT_BUCKET_BYTES",
    "DEFAULT_TIMEOUT_S",
    "DistributedError",
    "DistributedOptimizer",
    "MPIUnavailableError",
    "ProcessGroup",
    "RankMismatchError",
    "CheckpointShardError",
    "ShardingError",
    "ZERO_STAGES",
    "init",
    "launched_by_mpi",
    "loss_weight",
    "target_count",
]

DEFAULT_BUCKET_BYTES = 25 * 2**20
"""Gradient bucket size (PyTorch DDP's default ``bucket_cap_mb=25``): the communication buffer
holds one bucket, and a parameter larger than a bucket is a bucket of its own."""
DEFAULT_TIMEOUT_S = 600.0
"""How long a rank waits in one collective before it aborts the job (seconds)."""
ZERO_STAGES = (0, 1, 2, 3)

# Environment variables set by the launchers (MPICH/Hydra and Intel MPI: PMI_*; Open MPI:
# OMPI_*; PMIx launchers, srun included: PMIX_*; Slurm: SLURM_STEP_ID under srun).
_LAUNCHER_VARIABLES = (
    "PMI_RANK",
    "PMI_SIZE",
    "OMPI_COMM_WORLD_SIZE",
    "PMIX_RANK",
    "SLURM_STEP_ID",
)


class DistributedError(RiftcoError):
    """A data-parallel run cannot start or continue."""


class MPIUnavailableError(DistributedError, ImportError):
    """``mpi4py`` (or the MPI library it loads) is missing."""


class RankMismatchError(DistributedError):
    """The ranks of one job disagree on a setting, the data or the riftco version."""


class ShardingError(DistributedError):
    """The model cannot be sharded as asked (ZeRO-3: a unit above the gather budget, ...);
    raised alike on every rank."""


class CheckpointShardError(DistributedError):
    """A rank's files of a checkpoint do not load (missing, corrupted, or of another
    checkpoint, run or rank); raised alike on every rank, naming the rank and the file."""


def launched_by_mpi() -> bool:
    """Whether this process was started by an MPI launcher (its environment variables)."""
    return any(v in os.environ for v in _LAUNCHER_VARIABLES)


_GROUP: ProcessGroup | None = None


def init(timeout_s: float | None = None) -> ProcessGroup:
    """The process group of ``MPI.COMM_WORLD`` (made once per process; later calls return it).

    Args:
        timeout_s: seconds a rank waits in one collective before it aborts the job (positive
            and finite); ``None`` keeps the group's (:data:`DEFAULT_TIMEOUT_S` for a new one).

    Raises:
        MPIUnavailableError: ``mpi4py`` cannot be imported or finds no MPI library.
        ConfigError: a bad ``timeout_s``.
    """
    global _GROUP
    if timeout_s is not None:
        if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)):
            raise ConfigError(f"timeout_s must be a number of seconds; got {timeout_s!r}")
        if not (math.isfinite(timeout_s) and timeout_s > 0):
            raise ConfigError(f"timeout_s must be positive and finite; got {timeout_s!r}")
    if _GROUP is None:
        try:
            mpi = importlib.import_module("mpi4py.MPI")
        except (ImportError, RuntimeError, OSError) as e:
            raise MPIUnavailableError(
                f"data-parallel training needs mpi4py and an MPI library ({e}); install them "
                "with pip install 'riftco[mpi]' (mpi4py and the MPICH wheel), or install "
                "mpi4py built against your system's MPI"
            ) from None
        _GROUP = ProcessGroup(mpi, mpi.COMM_WORLD, DEFAULT_TIMEOUT_S)
    if timeout_s is not None:
        _GROUP.timeout_s = float(timeout_s)
    return _GROUP


def _wait_until_read(stream: Any, limit_s: float = 2.0) -> None:
    """Waits (at most ``limit_s``) until the reader of ``stream``'s pipe or socket has taken
    everything written to it.

    The launcher (MPICH's Hydra) forwards a rank's stderr through a pipe to its proxy, and the
    abort through another channel: under load the proxy can act on the abort first and kill
    the job with the message still in the pipe, so the one line saying why the job ended is
    lost. Waiting for the pipe to drain (``FIONREAD``: bytes not yet read; ``TIOCOUTQ``: bytes
    not yet sent on a socket) before ``MPI_Abort`` keeps it. A terminal or a file returns at
    once."""
    try:
        import fcntl
        import termios

        fd = stream.fileno()
        mode = os.fstat(fd).st_mode
    except (ImportError, AttributeError, OSError, ValueError):
        return
    if stat.S_ISFIFO(mode):
        request = termios.FIONREAD
    elif stat.S_ISSOCK(mode):
        request = termios.TIOCOUTQ
    else:
        return
    deadline = time.monotonic() + limit_s
    pending = array.array("i", [0])
    while time.monotonic() < deadline:
        try:
            fcntl.ioctl(fd, request, pending)
        except OSError:
            return
        if pending[0] == 0:
            return
        time.sleep(0.005)


class ProcessGroup:
    """The ranks of one job (``MPI.COMM_WORLD``), with watched collectives.

    Attributes:
        rank: this process's index, ``0 <= rank < world_size``.
        world_size: the number of processes.
        is_main: ``rank == 0`` (the rank that logs, draws and saves).
        timeout_s: seconds a rank waits in one collective before aborting the job.
        communication_s: seconds spent in collectives so far (for the step records).
    """

    def __init__(self, mpi: Any, comm: Any, timeout_s: float) -> None:
        self.mpi = mpi
        self.comm = comm
        self.rank: int = int(comm.Get_rank())
        self.world_size: int = int(comm.Get_size())
        self.is_main = self.rank == 0
        self.timeout_s = timeout_s
        self.communication_s = 0.0
        self._waiting: tuple[str, float] | None = None
        self._lock = threading.Lock()
        self._watchdog: threading.Thread | None = None

    # -- watched collectives ------------------------------------------------------------------

    def _watch(self) -> None:
        while True:
            time.sleep(min(1.0, self.timeout_s / 4))
            with self._lock:
                waiting = self._waiting
            if waiting is not None and time.monotonic() - waiting[1] > self.timeout_s:
                self.abort(
                    f"rank {self.rank} of {self.world_size} waited more than "
                    f"{self.timeout_s:g} s in {waiting[0]}: another rank died or hangs; "
                    "aborting the job"
                )

    def _collective(self, name: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        if self.world_size == 1:
            return fn(*args, **kwargs)
        if self._watchdog is None:
            self._watchdog = threading.Thread(target=self._watch, name="riftco-mpi-watchdog")
            self._watchdog.daemon = True
            self._watchdog.start()
        t0 = time.monotonic()
        with self._lock:
            self._waiting = (name, t0)
        try:
            return fn(*args, **kwargs)
        finally:
            with self._lock:
                self._waiting = None
            self.communication_s += time.monotonic() - t0

    def abort(self, message: str, code: int = 1) -> None:
        """Prints ``message`` on this rank's stderr and aborts every rank of the job
        (``MPI_Abort``; the launcher ends the others)."""
        # The process's own stderr: a command's ranks other than 0 silence sys.stderr.
        stream = sys.__stderr__ or sys.stderr
        print(f"riftco: error: {message}", file=stream, flush=True)
        _wait_until_read(stream)
        try:
            self.comm.Abort(code)
        finally:
            os._exit(code)

    def barrier(self) -> None:
        self._collective("a barrier", self.comm.Barrier)

    def broadcast(self, value: Any) -> Any:
        """Rank 0's ``value`` (any picklable object) on every rank."""
        return self._collective("a broadcast", self.comm.bcast, value, root=0)

    def all_gather(self, value: Any) -> list[Any]:
        """Every rank's ``value``, in rank order, on every rank."""
        return list(self._collective("an all-gather", self.comm.allgather, value))

    def sum(self, values: Sequence[float]) -> list[float]:
        """The element-wise sums of every rank's ``values`` (float64), in rank order."""
        gathered = self.all_gather([float(v) for v in values])
        return [math.fsum(rank_values[i] for rank_values in gathered) for i in range(len(values))]

    # -- checks and data ----------------------------------------------------------------------

    def check_same(self, what: str, value: Any) -> None:
        """Refuses to go on unless every rank has the same ``value`` (JSON-like), compared by a
        SHA-256 of its canonical JSON. Collective: every rank must call it.

        Raises:
            RankMismatchError: on every rank, naming ``what``, the first differing entry and
                the ranks (rank 0's value against the first differing rank's).
        """
        digest = hashlib.sha256(canonical(value).encode()).hexdigest()
        digests = self.all_gather(digest)
        if len(set(digests)) == 1:
            return
        other = next(r for r, d in enumerate(digests) if d != digests[0])
        values = self.all_gather(value if self.rank in (0, other) else None)
        difference = first_difference(values[0], values[other])
        raise RankMismatchError(
            f"the ranks of this job differ in {what}: rank 0 against rank {other}: {difference}; "
            "start every rank with the same riftco, command, settings and data"
        )

    def check_batch_size(self, batch_size: int) -> None:
        """Raises ``ConfigError`` unless ``batch_size`` rows split evenly over the ranks."""
        if batch_size % self.world_size:
            raise ConfigError(
                f"batch_size {batch_size} does not split over {self.world_size} data-parallel "
                f"ranks; use a multiple of {self.world_size}"
            )

    def rows(self, batch: Any) -> Any:
        """This rank's rows of a global batch: an array ``[G, ...]`` or a tuple of them (tokens,
        labels, position ids), rows ``[rank * G / N, (rank + 1) * G / N)``."""
        if isinstance(batch, tuple):
            return tuple(self.rows(part) for part in batch)
        n = batch.shape[0] // self.world_size
        return batch[self.rank * n : (self.rank + 1) * n]


def target_count(batch: Any) -> int:
    """The number of target tokens of a batch: ``batch_rows * seq`` for a token block
    ``[rows, seq + 1]``, the labels that are not ``IGNORE_INDEX`` after the first column for
    ``(tokens, labels[, position_ids])`` (Hugging Face's shifted-label convention)."""
    if isinstance(batch, tuple):
        return int(np.count_nonzero(np.asarray(batch[1])[:, 1:] != IGNORE_INDEX))
    return int(batch.shape[0] * (batch.shape[1] - 1))


def loss_weight(local_targets: int, global_targets: int, world_size: int) -> float:
    """The factor of a rank's mean loss whose gradient, averaged over ``world_size`` ranks, is the
    gradient of the mean over all ``global_targets``: ``local * world_size / global`` (1 when
    every rank holds the same count)."""
    return local_targets * world_size / global_targets


class _Bucket:
    """Parameters ``params[start:stop]``, flattened: ``size`` elements, cut into ``world_size``
    parts of ``part`` elements (the last padded)."""

    def __init__(self, params: list[Variable], world_size: int) -> None:
        self.params = params
        self.sizes = [math.prod(p.shape) for p in params]
        self.size = sum(self.sizes)
        self.part = -(-self.size // world_size)
        self.padded = self.part * world_size

    def gradients(self, out: np.ndarray) -> None:
        """Writes the parameters' gradients into ``out[:size]`` (zeros where none) and zeros into
        the padding."""
        offset = 0
        for p, n in zip(self.params, self.sizes):
            g = p.grad
            if g is None:
                out[offset : offset + n] = 0.0
            else:
                out[offset : offset + n] = g.reshape(-1)
            offset += n
        out[self.size :] = 0.0

    def values(self) -> np.ndarray:
        out = np.zeros(self.padded, np.float32)
        offset = 0
        for p, n in zip(self.params, self.sizes):
            out[offset : offset + n] = p.numpy().reshape(-1)
            offset += n
        return out

    def write(self, flat: np.ndarray, target: str) -> None:
        """Writes ``flat[:size]`` into the parameters' gradients or values."""
        offset = 0
        for p, n in zip(self.params, self.sizes):
            piece = flat[offset : offset + n].reshape(p.shape)
            if target == "grad":
                p.grad = piece
            else:
                p.copy_(piece)
            offset += n


def _buckets(params: list[Variable], world_size: int, bucket_bytes: int) -> list[_Bucket]:
    limit = max(1, bucket_bytes // 4)
    out: list[_Bucket] = []
    current: list[Variable] = []
    size = 0
    for p in params:
        n = math.prod(p.shape)
        if current and size + n > limit:
            out.append(_Bucket(current, world_size))
            current, size = [], 0
        current.append(p)
        size += n
    if current:
        out.append(_Bucket(current, world_size))
    return out


class DistributedOptimizer:
    """Adam or AdamW across the ranks of ``group``, with ZeRO stage ``zero`` (0, 1, 2 or 3).

    ``step()`` reduces the gradients every rank's ``backward()`` committed (averaged over the
    ranks), updates the parameters and leaves the same values on every rank; ``zero_grad()``,
    ``lr``, ``steps``, ``save`` and ``load`` are those of the native optimizers. ``make`` builds
    the native optimizer over a list of Variables (``lambda ps: riftco.Adam(ps, lr=1e-3)``):
    over the trainable parameters for ``zero=0``, over this rank's shard (one flat Variable
    named ``zero_shard``) otherwise.

    Memory (``riftco.memory_stats()``): with ``zero >= 1`` the ``optimizer_state`` bytes are
    those of the shard (``1/N`` of the trainable elements, rounded up per bucket), and the
    shard's own value adds as many ``parameter`` bytes. The communication buffer (one bucket,
    NumPy) is not in the native counters.

    ``zero=3`` needs ``model`` (the DecoderOnlyTransformer whose ``params`` these are): its
    parameters are sharded when the optimizer is built (:class:`~riftco.training.sharded.
    ShardedParameters`, ``self.sharded``; ``max_gathered`` units gathered at once, within
    ``max_gathered_bytes`` when given) and ``make``
    receives this rank's parts, one Variable per unit (``zero3.<unit>``). Its ``parameter``
    bytes are then ``1/N`` of the model plus the units gathered at the moment. Every rank must
    run the same forward and backward passes. ``bucket_bytes`` does not apply (the buckets are
    the units).

    Raises:
        ConfigError: ``zero`` not in (0, 1, 2, 3), a bucket size below 4 bytes, no trainable
            parameter; ``zero=3`` without ``model``, with ``params`` other than the model's
            trainable parameters, or a model on a GPU.
    """

    def __init__(
        self,
        group: ProcessGroup,
        params: Iterable[Variable],
        make: Callable[[list[Variable]], Adam | AdamW],
        zero: int = 0,
        bucket_bytes: int = DEFAULT_BUCKET_BYTES,
        model: DecoderOnlyTransformer | None = None,
        max_gathered: int = DEFAULT_MAX_GATHERED,
        max_gathered_bytes: int | None = None,
    ) -> None:
        if isinstance(zero, bool) or zero not in ZERO_STAGES:
            raise ConfigError(f"zero must be one of 0, 1, 2, 3; got {zero!r}")
        if isinstance(bucket_bytes, bool) or not isinstance(bucket_bytes, int) or bucket_bytes < 4:
            raise ConfigError(f"bucket_bytes must be an int of at least 4; got {bucket_bytes!r}")
        self.group = group
        self.zero = zero
        self.params = [p for p in params if p.requires_grad]
        if not self.params:
            raise ConfigError("DistributedOptimizer needs at least one trainable parameter")
        self.sharded: ShardedParameters | None = None
        if zero == 3:
            if model is None:
                raise ConfigError(
                    "zero=3 shards the model's parameters: pass model= (the "
                    "DecoderOnlyTransformer whose parameters params are)"
                )
            # Python handles are new objects per call: the leaves are compared by name.
            mine = [p.name for p in self.params]
            if len(set(mine)) != len(mine) or set(mine) != {p.name for p in model.parameters()}:
                raise ConfigError(
                    "zero=3 updates every trainable parameter of the model and only those: "
                    "pass model.parameters() as params"
                )
            self.sharded = ShardedParameters(group, model, max_gathered, max_gathered_bytes)
            # One bucket per unit, its parameters in the unit's order: a bucket's parts are
            # the unit's trainable parts.
            self.buckets = [
                _Bucket([p for _, p in u.trainable], group.world_size)
                for u in self.sharded.units.values()
                if u.trainable
            ]
            self.params = [p for b in self.buckets for p in b.params]
        else:
            # In reverse order, the order a backward pass completes them (the last layers
            # first), so that ZeRO-2 fills one bucket at a time.
            self.buckets = _buckets(self.params[::-1], group.world_size, bucket_bytes)
        # ZeRO-3 keeps no bucket-sized buffer: it stages a unit's gradients only while they
        # arrive.
        self._buffer = np.zeros(
            0 if zero == 3 else max(b.padded for b in self.buckets), np.float32
        )
        # ZeRO-2/3: where each parameter's gradient goes (bucket, offset), the buckets being
        # filled during a backward pass, and this rank's reduced parts of this step.
        self._where: dict[str, tuple[int, int]] = {}
        if zero >= 2:
            names = [p.name for p in self.params]
            if None in names or len(set(names)) != len(names):
                raise ConfigError(
                    f"zero={zero} reduces each gradient as the backward pass completes it and finds "
                    "its bucket by the parameter's name: the trainable parameters need distinct "
                    "names (Variable(..., name=...); a model's parameters have them)"
                )
            for i, bucket in enumerate(self.buckets):
                offset = 0
                for p, n in zip(bucket.params, bucket.sizes):
                    self._where[str(p.name)] = (i, offset)
                    offset += n
        self._filling: dict[int, tuple[np.ndarray, int]] = {}
        self._reduced: dict[int, np.ndarray] = {}
        self.identity: dict[str, Any] | None = None
        """What a checkpoint's ZeRO-3 parameter shards record and are checked against when
        loaded (the training loop sets the step and the run's settings hash); ``None``: not
        checked."""
        self.staging_peak_bytes = 0
        """ZeRO-2: the most bytes of gradient buckets held at once outside the native counters
        (NumPy buffers of buckets whose gradients are still arriving), over this optimizer's
        life."""
        self.shards: list[Variable] = []
        if zero == 0:
            self.shard: Variable | None = None
            self.inner = make(self.params)
        elif self.sharded is not None:
            self.shard = None
            self.shards = self.sharded.shards
            self.inner = make(self.shards)
            self.sharded.attach()
        else:
            r = group.rank
            parts = [b.values()[r * b.part : (r + 1) * b.part] for b in self.buckets]
            self.shard = Variable(np.concatenate(parts), requires_grad=True, name="zero_shard")
            self.inner = make([self.shard])

    @property
    def lr(self) -> float:
        return self.inner.lr

    @lr.setter
    def lr(self, value: float) -> None:
        self.inner.lr = value

    @property
    def steps(self) -> int:
        return self.inner.steps

    def zero_grad(self) -> None:
        for p in self.params:
            p.zero_grad()
        if self.shard is not None:
            self.shard.zero_grad()
        for s in self.shards:
            s.zero_grad()

    def backward(self, loss: Variable, hooked: bool = True, accumulate: bool = False) -> None:
        """``loss.backward(retain_graph=False)``; under ZeRO-2 and 3 (with ``hooked``) each
        bucket is reduce-scattered as soon as the pass has completed the gradients of all its
        parameters, and the gradients are never committed: no rank holds a whole gradient.
        Every rank must pass the same ``hooked`` (a rank without a backward pass this step makes
        all ranks pass ``False``; :meth:`step` then reduces in bucket order).

        ``accumulate`` adds this pass's gradients to those of the passes since the last
        :meth:`step` (gradient accumulation over micro-batches: ``backward_accumulate`` of the
        native Variable, or, reduced during the pass, the sum of each pass's reduced parts);
        without it a pass replaces them."""
        if self.sharded is not None:
            self.sharded.check_attached("DistributedOptimizer.backward")
        if self.zero >= 2 and hooked:
            if not accumulate:
                self._reduced.clear()
                self._filling.clear()
                for p in self.params:
                    p.zero_grad()
            loss.backward(retain_graph=False, gradient_hook=self._arrive)
        elif accumulate:
            loss.backward_accumulate(retain_graph=False)
        else:
            if self.zero >= 2:
                self._reduced.clear()
                self._filling.clear()
            loss.backward(retain_graph=False)

    def _arrive(self, leaf: Variable, grad: np.ndarray) -> None:
        """The gradient hook of ZeRO-2: stages ``grad`` in its bucket, reducing the bucket when
        it is complete."""
        i, offset = self._where[str(leaf.name)]
        bucket = self.buckets[i]
        if i not in self._filling:
            self._filling[i] = (np.zeros(bucket.padded, np.float32), len(bucket.params))
            staged = sum(buf.nbytes for buf, _ in self._filling.values())
            self.staging_peak_bytes = max(self.staging_peak_bytes, staged)
        buf, missing = self._filling[i]
        buf[offset : offset + grad.size] = grad.reshape(-1)
        if missing > 1:
            self._filling[i] = (buf, missing - 1)
            return None
        del self._filling[i]
        part = self._reduce_scatter(buf, bucket)
        # Several backward passes before a step (gradient accumulation) add up.
        if i in self._reduced:
            self._reduced[i] += part
        else:
            self._reduced[i] = part
        return None

    def _reduce_scatter(self, buf: np.ndarray, bucket: _Bucket) -> np.ndarray:
        """This rank's part of the ranks' sum of ``buf``, averaged."""
        if self.group.world_size == 1:
            return np.array(buf[: bucket.part], np.float32)
        part = np.empty(bucket.part, np.float32)
        self.group._collective(
            "a reduce-scatter", self.group.comm.Reduce_scatter_block, buf, part,
            op=self.group.mpi.SUM,
        )
        part *= np.float32(1.0 / self.group.world_size)
        return part

    def _all_reduce(self, bucket: _Bucket) -> np.ndarray:
        """The bucket's gradients averaged over the ranks (all of them)."""
        buf = self._buffer[: bucket.padded]
        bucket.gradients(buf)
        if self.group.world_size > 1:
            mpi = self.group.mpi
            self.group._collective("an all-reduce", self.group.comm.Allreduce, mpi.IN_PLACE, buf)
            buf *= np.float32(1.0 / self.group.world_size)
        return buf

    def step(self) -> None:
        """Reduces the gradients (what :meth:`backward` has not reduced yet) and updates the
        parameters on every rank (collective)."""
        if self.sharded is not None:
            self.sharded.check_attached("DistributedOptimizer.step")
        r = self.group.rank
        shard_grads: list[np.ndarray] = []
        for i, bucket in enumerate(self.buckets):
            if self.zero >= 2:
                own = self._reduced.pop(i, None)
                filling = self._filling.pop(i, (None, 0))[0]
                committed = any(p.grad is not None for p in bucket.params)
                if own is None or committed or filling is not None:
                    # Not (wholly) reduced during the pass (no hook, or a parameter the pass
                    # did not reach): from the committed gradients, zeros where none.
                    if filling is None:
                        filling = (
                            np.zeros(bucket.padded, np.float32)
                            if self.zero == 3
                            else self._buffer[: bucket.padded]
                        )
                        bucket.gradients(filling)
                    rest = self._reduce_scatter(filling, bucket)
                    own = rest if own is None else own + rest
                    for p in bucket.params:
                        p.zero_grad()
                shard_grads.append(own)
                continue
            summed = self._all_reduce(bucket)
            bucket.write(summed, "grad")
            if self.zero == 1:
                shard_grads.append(np.array(summed[r * bucket.part : (r + 1) * bucket.part]))
        if self.sharded is not None:
            for shard, grad in zip(self.shards, shard_grads):
                shard.grad = grad
            del shard_grads
            self.inner.step()
            self.sharded.shards_changed()
            return
        if self.shard is None:
            self.inner.step()
            return
        self.shard.grad = np.concatenate(shard_grads)
        del shard_grads
        self.inner.step()
        self._gather_values()

    def _gather_values(self) -> None:
        """Every rank's updated parts, all-gathered into every replica's parameters."""
        assert self.shard is not None
        values = self.shard.numpy()
        offset = 0
        for bucket in self.buckets:
            own = np.ascontiguousarray(values[offset : offset + bucket.part])
            offset += bucket.part
            full = self._buffer[: bucket.padded]
            if self.group.world_size == 1:
                full[:] = own
            else:
                self.group._collective(
                    "an all-gather", self.group.comm.Allgather, own, full
                )
            bucket.write(full, "value")

    # -- state ----------------------------------------------------------------------------------

    def state_files(self) -> list[str]:
        """The file names a checkpoint holds for this optimizer: ``optimizer.safetensors`` for
        ``zero=0`` (the same on every rank, written by rank 0), one shard file per rank
        otherwise."""
        if self.zero == 0:
            return ["optimizer.safetensors"]
        n = self.group.world_size
        names = [f"optimizer.zero-{r:05d}-of-{n:05d}.safetensors" for r in range(n)]
        if self.zero == 3:
            # Each rank's parameter parts too: a resume loads them without a whole model.
            names += [f"model.zero3-{r:05d}-of-{n:05d}.safetensors" for r in range(n)]
        return names

    def save(self, folder: Path | None) -> None:
        """Writes the state into ``folder`` (``state_files()``), collective: rank 0 writes, and
        under ZeRO receives each other rank's shard file in turn (one in flight), so the ranks
        need no shared file system; other ranks pass ``None``."""
        names = self.state_files()
        if self.zero == 0:
            if self.group.is_main:
                assert folder is not None
                self.inner.save(folder / names[0])
            return
        n = self.group.world_size
        with tempfile.TemporaryDirectory(prefix="riftco-zero-") as tmp:
            own = Path(tmp) / "shard.safetensors"
            self.inner.save(own)
            files = [(own, names[:n], "an optimizer shard", 71)]
            if self.sharded is not None:
                params = Path(tmp) / "parameters.safetensors"
                self.sharded.save_shard(params, self.identity)
                files.append((params, names[n:], "a parameter shard", 72))
            for path, targets, what, tag in files:
                if self.group.is_main:
                    assert folder is not None
                    (folder / targets[0]).write_bytes(path.read_bytes())
                    for r in range(1, n):
                        data = self.group._collective(
                            f"receiving {what}", self.group.comm.recv, source=r, tag=tag
                        )
                        (folder / targets[r]).write_bytes(data)
                else:
                    self.group._collective(
                        f"sending {what}", self.group.comm.send, path.read_bytes(), dest=0,
                        tag=tag,
                    )

    def load(self, folder: Path) -> None:
        """Loads this rank's state from a checkpoint ``folder`` written by :meth:`save` with the
        same number of ranks and ZeRO stage (every rank reads ``folder``: a file system all
        ranks see). Under ZeRO 1/2 the parameters of the shard are taken from the replica
        (loaded before), so the shard's value is the checkpoint's weights; under ZeRO-3 each
        rank reads its parameter parts from its own file (checked against ``identity``).

        Raises:
            ModelStateError, ConfigError, OSError: as the native ``load`` (``zero=0``).
            CheckpointShardError: under ZeRO, on every rank alike, naming the rank whose file
                failed and why (collective).
        """
        if self.zero == 0:
            self._load(folder)
            return
        # Each rank reads its own files: the ranks agree on the outcome, so that a bad file on
        # one rank is the same error on every rank.
        failure: tuple[str, str] | None = None
        try:
            self._load(folder)
        except (ConfigError, ModelStateError, OSError) as e:
            failure = (type(e).__name__, str(e))
        failures = self.group.all_gather(failure)
        bad = next(((r, f) for r, f in enumerate(failures) if f is not None), None)
        if bad is not None:
            r, (_, message) = bad
            raise CheckpointShardError(f"rank {r} of {self.group.world_size}: {message}")

    def _load(self, folder: Path) -> None:
        """This rank's part of :meth:`load`."""
        name = self.state_files()[0 if self.zero == 0 else self.group.rank]
        if self.sharded is not None:
            # This rank's parameter parts, from its own file.
            n, r = self.group.world_size, self.group.rank
            self.sharded.load_shard(folder / self.state_files()[n + r], self.identity)
        if self.shard is not None:
            r = self.group.rank
            self.shard.copy_(
                np.concatenate([b.values()[r * b.part : (r + 1) * b.part] for b in self.buckets])
            )
        self.inner.load(folder / name)
        if self.identity is not None and self.inner.steps != self.identity["step"]:
            raise ModelStateError(
                f"{str(folder / name)!r} holds the optimizer state after step {self.inner.steps}, "
                f"not {self.identity['step']}: a file of another checkpoint; resume from the "
                "checkpoint's own files"
            )
