"""ZeRO-3 / fully sharded data parallelism: each rank stores ``1/N`` of every unit's parameters
and gathers a unit only while the model computes with it.

Rajbhandari et al. 2020, "ZeRO: Memory Optimizations Toward Training Trillion Parameter Models"
(stage 3, partitioned parameters); Zhao et al. 2023, "PyTorch FSDP: Experiences on Scaling Fully
Sharded Data Parallel" (per-module flat shards, all-gather before use, release after, gather
again for the backward pass, prefetch of the next unit).

A *unit* is the token embedding, one transformer block (its base weights and LoRA adapters),
the final norm or an untied LM head. Each unit's parameters form two flat vectors:

- the **frozen** ones (a LoRA base, in whatever storage it has: float32, bfloat16/float16 bit
  patterns, quantized blocks), concatenated as stored bytes;
- the **trainable** ones, concatenated as float32.

Each vector is cut into ``N`` equal parts (the last padded with zeros) and rank ``r`` keeps part
``r``: the frozen part as a native Variable holding the bytes (so ``memory_stats()`` counts
it as ``parameter``), the trainable part as a float32 Variable that Adam updates (the
optimizer's shard, ``zero3.<unit>``). The model's own parameter tensors are released
(:meth:`riftco.Variable.release_storage`): their shapes and versions stay, their elements go.
While a unit is gathered its frozen part is redundant (the model's tensors hold those bytes):
it is freed, and taken back from the tensors when the unit is released (frozen values never
change), so a gathered unit costs a rank the unit less its own frozen part.

:class:`ShardedParameters` is the model's owner of its parameters between uses
(:meth:`riftco.DecoderOnlyTransformer.set_parameter_residency`): the model asks it to acquire a
unit before reading it, which all-gathers every rank's parts (an ``MPI_Iallgather`` of the
frozen part's bytes and one of the trainable part's, each received as the flat vector itself) and
restores the unit's tensors from them, and releases the unit when done. Asked for
unit ``u`` with a ``next`` unit, it starts ``next``'s gather (non-blocking) before returning,
so the gather runs while ``u`` computes (at most ``max_gathered`` units gathered or in flight
at once, counting the units the model releases itself; default 2). A checkpointed block is
gathered again for its replay in the backward pass and released after the replay's VJP; a
block outside any checkpoint is released after its forward and gathered again when the
backward pass reaches it (its graph's handles share the refilled storage); the final norm and
the head stay gathered from their forward until their VJP. :meth:`ShardedParameters.release_all`
releases whatever a pass left (a graph dropped without a backward pass).

Under a gather budget (``max_gathered_bytes``) a frozen token embedding or LM head larger than
the budget (the tied embedding of a LoRA run: 128256 x 2048 bfloat16 rows are 501 MiB; float32,
16-bit or GGML-quantized, not NF4, whose bytes are not row by row) is not gathered whole for
the lookup and the chunked training loss (the default; an unfused loss gathers it whole): the owner gives it to the model by slices
of vocabulary rows (:meth:`ShardedParameters.row_slice`, :meth:`ShardedParameters.fetch_rows`),
each an ``MPI_Iallgatherv`` of the ranks' bytes of those rows, the next slice in flight while the
model computes with the current one (slices of at most a quarter of the budget: one in use, one
in flight, one being copied into the model). The loss then runs in one
pass with an online logsumexp (within float32 rounding of the whole-table loss, not bitwise;
the lookup is bitwise) and holds nothing for the backward pass. Reads that need the whole table
(full logits) still gather it whole.

Every rank must run the same forward and backward passes (each acquire is a collective).
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import json
import math
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from riftco._native import (
    ConfigError,
    DecoderOnlyTransformer,
    ModelStateError,
    RiftcoError,
    Variable,
    memory_stats,
)
from riftco.training.differences import first_difference

__all__ = ["DEFAULT_MAX_GATHERED", "ShardedParameters", "unit_of"]

DEFAULT_MAX_GATHERED = 2
"""How many units may be gathered (or in flight) at once, counting those the model releases
itself (PyTorch FSDP's ``limit_all_gathers`` keeps two)."""


def _safetensors() -> Any:
    """The ``safetensors.numpy`` module (the ``mpi`` extra installs it)."""
    try:
        return importlib.import_module("safetensors.numpy")
    except ImportError:
        raise RiftcoError(
            "a ZeRO-3 checkpoint writes each rank's parameter shard with the safetensors "
            "package: pip install 'riftco[mpi]' (or pip install safetensors)"
        ) from None


def unit_of(name: str) -> str | None:
    """The unit of the parameter named ``name`` (a Hugging Face name, or a PEFT adapter name
    ``base_model.model.<module>.lora_A.weight``): ``model.embed_tokens``,
    ``model.layers.{i}``, ``model.norm`` or ``lm_head``; ``None`` outside the model's layout."""
    name = name.removeprefix("base_model.model.")
    for unit in ("model.embed_tokens", "model.norm", "lm_head"):
        if name.startswith(unit + "."):
            return unit
    if name.startswith("model.layers."):
        index = name[len("model.layers.") :].split(".", 1)[0]
        if index.isdigit():
            return f"model.layers.{int(index)}"
    return None


class _Unit:
    """One unit's parameters and this rank's parts of them."""

    def __init__(self, name: str, params: list[tuple[str, Variable]], world_size: int, rank: int):
        self.name = name
        self.rank = rank
        self.frozen = [(n, p) for n, p in params if not p.requires_grad]
        self.trainable = [(n, p) for n, p in params if p.requires_grad]
        self.encodings: list[str] = []
        self.frozen_sizes: list[int] = []
        for pname, p in self.frozen:
            encoding = p.storage_encoding
            if encoding is None:
                raise ConfigError(
                    f"{pname} is already released: shard a model whose values are all present"
                )
            self.encodings.append(encoding)
            self.frozen_sizes.append(int(p.encoded_nbytes))
        self.frozen_total = sum(self.frozen_sizes)
        # Parts of whole float32 words, so that a part is a float32 Variable.
        self.frozen_part = 4 * -(-self.frozen_total // (4 * world_size))
        own = self.frozen_part_of(rank)
        # A leaf that "requires grad" so that memory_stats() counts it as parameter; nothing
        # reads it in a graph and no optimizer holds it.
        self.frozen_shard = (
            Variable(own.view(np.float32), requires_grad=True, name=f"zero3.{name}.frozen")
            if own.size
            else None
        )
        self.trainable_sizes = [math.prod(p.shape) for _, p in self.trainable]
        self.trainable_total = sum(self.trainable_sizes)
        self.trainable_part = -(-self.trainable_total // world_size)
        self.shard = (
            Variable(self.trainable_part_of(rank), requires_grad=True, name=f"zero3.{name}")
            if self.trainable_part
            else None
        )

    def frozen_part_of(self, rank: int) -> np.ndarray:
        """Rank ``rank``'s part of the frozen flat vector, copied out of the (present)
        parameters: only the bytes of the part are read, never a whole unit."""
        own = np.zeros(self.frozen_part, np.uint8)
        lo, hi = rank * self.frozen_part, (rank + 1) * self.frozen_part
        offset = 0
        for (_, p), n in zip(self.frozen, self.frozen_sizes):
            a, b = max(lo, offset), min(hi, offset + n)
            if a < b:
                own[a - lo : b - lo] = p.encoded_bytes(a - offset, b - offset)
            offset += n
        return own

    def trainable_part_of(self, rank: int) -> np.ndarray:
        """Rank ``rank``'s part of the trainable flat vector (float32), as
        :meth:`frozen_part_of`."""
        values = np.zeros(self.trainable_part, np.float32)
        lo, hi = rank * self.trainable_part, (rank + 1) * self.trainable_part
        offset = 0
        for (_, p), size in zip(self.trainable, self.trainable_sizes):
            a, b = max(lo, offset), min(hi, offset + size)
            if a < b:  # trainable values are float32: 4 bytes each
                part = p.encoded_bytes(4 * (a - offset), 4 * (b - offset))
                values[a - lo : b - lo] = part.view(np.float32)
            offset += size
        return values

    @property
    def gathered_bytes(self) -> int:
        """The bytes the unit's tensors take when gathered."""
        return self.frozen_total + 4 * self.trainable_total

    @property
    def message_bytes(self) -> int:
        """The bytes this rank sends per gather of the unit (its frozen and trainable parts)."""
        return self.frozen_part + 4 * self.trainable_part

    def own_parts(self) -> list[np.ndarray]:
        """This rank's parts as byte arrays: the frozen part and the trainable part (those the
        unit has), each gathered by its own all-gather so that the received bytes are the flat
        vector itself (every rank's part in rank order)."""
        parts = []
        if self.frozen_shard is not None:
            parts.append(self.frozen_shard.numpy().view(np.uint8))
        if self.shard is not None:
            parts.append(self.shard.numpy().view(np.uint8))
        return parts

    def restore(self, gathered: list[np.ndarray]) -> None:
        """Restores the unit's tensors from the gathered flat vectors (:meth:`own_parts`'
        order), whatever they held (an interrupted restore is done again). While the unit is
        gathered the frozen part is redundant (the model's tensors hold its bytes): it is freed,
        and :meth:`release` takes it back from the tensors (the frozen values never change)."""
        self.release()
        flats = iter(gathered)
        if self.frozen_shard is not None:
            frozen = next(flats)
            offset = 0
            for (_, p), encoding, n in zip(self.frozen, self.encodings, self.frozen_sizes):
                p.restore_storage(encoding, frozen[offset : offset + n])
                offset += n
        if self.shard is not None:
            trainable = next(flats)
            offset = 0
            for (_, p), n in zip(self.trainable, self.trainable_sizes):
                p.restore_storage("float32", trainable[offset : offset + 4 * n])
                offset += 4 * n
        if self.frozen_shard is not None:
            self.frozen_shard.release_storage()

    def release(self) -> None:
        """Frees the unit's tensors, taking the frozen part back from them first when it was
        freed while the unit was gathered."""
        if self.frozen_shard is not None and self.frozen_shard.is_released:
            part = self.frozen_part_of(self.rank)
            self.frozen_shard.restore_storage("float32", part)
        for _, p in self.frozen + self.trainable:
            p.release_storage()

    def parameters(self) -> list[Variable]:
        return [p for _, p in self.frozen + self.trainable]


class ShardedParameters:
    """The owner of a model's parameters under ZeRO-3 (see the module documentation).

    Building it shards every unit of ``model`` over ``group`` and releases the model's
    parameter tensors; :meth:`attach` sets it as the model's owner.

    Attributes:
        shards: this rank's trainable parts, one float32 Variable per unit with trainable
            parameters (what the optimizer updates), in unit order.
        exposed_s: seconds spent waiting for gathers that had not finished (communication
            not hidden behind computation), since the last :meth:`reset_counters`.
        gathers: all-gathers started since the last :meth:`reset_counters`.
        gathered_peak: the most units gathered or in flight at once over the owner's life.
        trace: ``None`` (default), or a list to which every event is appended as
            ``(seconds, event, unit, bytes)``: ``seconds`` from ``time.perf_counter()``,
            ``event`` one of ``"gather"`` (started), ``"ready"`` (restored into the model),
            ``"release"``, ``bytes`` the process's native bytes in use after the event
            (``memory_stats()["total"]["current_bytes"]``): the per-rank memory over a step.

    ``max_gathered_bytes`` (``None``: no limit) bounds the bytes of the units gathered or in
    flight at once besides those the model holds anyway: a prefetch waits while it would go
    above, a frozen embedding or head larger than the budget is given by slices of at most a
    quarter of the budget (see the module documentation), and any other unit larger than the budget is
    refused before anything is sharded (a unit is gathered whole).

    Raises:
        ConfigError: ``max_gathered`` below 1, ``max_gathered_bytes`` below 1 or below one
            unit's gathered bytes (the unit and both sizes named) where the unit is not a
            frozen table given by slices (or four of its rows do not fit); a parameter outside
            the model's units; a model on a GPU (shards live in host memory); a model that already
            has an owner. Nothing is sharded then.
    """

    def __init__(
        self,
        group: Any,
        model: DecoderOnlyTransformer,
        max_gathered: int = DEFAULT_MAX_GATHERED,
        max_gathered_bytes: int | None = None,
    ) -> None:
        if isinstance(max_gathered, bool) or not isinstance(max_gathered, int) or max_gathered < 1:
            raise ConfigError(f"max_gathered must be an int of at least 1; got {max_gathered!r}")
        if max_gathered_bytes is not None and (
            isinstance(max_gathered_bytes, bool)
            or not isinstance(max_gathered_bytes, int)
            or max_gathered_bytes < 1
        ):
            raise ConfigError(
                f"max_gathered_bytes must be None or an int of at least 1; got "
                f"{max_gathered_bytes!r}"
            )
        if model.has_parameter_residency:
            raise ConfigError(
                "the model's parameters already have an owner (a ZeRO-3 optimizer built on it "
                "before): detach it first (optimizer.sharded.detach()) or keep using it"
            )
        if model.device != "cpu":
            raise ConfigError(
                f"zero=3 keeps the parameter shards in host memory; the model is on "
                f"{model.device}: train it on the cpu"
            )
        self.group = group
        self.model = model
        self.max_gathered = max_gathered
        self.max_gathered_bytes = max_gathered_bytes
        by_unit: dict[str, list[tuple[str, Variable]]] = {}
        for pname, p in [*model.named_parameters(), *model.named_lora_parameters()]:
            owner = unit_of(pname)
            if owner is None:
                raise ConfigError(f"parameter {pname!r} belongs to no unit of the model")
            by_unit.setdefault(owner, []).append((pname, p))
        # Frozen tables given by slices of rows: unit -> (rows per slice, rows, bytes per row).
        self._slices: dict[str, tuple[int, int, int]] = {}
        if max_gathered_bytes is not None:
            for name, params in by_unit.items():
                size = sum(
                    4 * math.prod(p.shape) if p.requires_grad else int(p.encoded_nbytes)
                    for _, p in params
                )
                if size <= max_gathered_bytes:
                    continue
                table = params[0][1] if len(params) == 1 else None
                why = "only a frozen embedding or LM head is given by slices of rows"
                if table is not None and name in ("model.embed_tokens", "lm_head"):
                    if table.requires_grad:
                        why = "this table is trainable; only a frozen one is given by slices"
                    elif table.storage_encoding == "nf4":
                        # NF4 keeps its block maxima and group scales after all the codes: a
                        # range of rows is not a range of its bytes.
                        why = (
                            "an NF4 table is not stored row by row, so it cannot be given by "
                            "slices (a bfloat16, float16 or GGML-quantized one can)"
                        )
                if (
                    name in ("model.embed_tokens", "lm_head")
                    and table is not None
                    and not table.requires_grad
                    and table.storage_encoding != "nf4"
                    and len(table.shape) == 2
                ):
                    rows = table.shape[0]
                    row_bytes = size // rows
                    # One slice in use, one in flight, one on its way into the model (the
                    # received bytes are copied into the model's tensor).
                    per_slice = (max_gathered_bytes // 4) // row_bytes
                    if per_slice >= 1:
                        self._slices[name] = (min(per_slice, rows), rows, row_bytes)
                        continue
                    why = (
                        f"this table is given by slices of rows, but four of its rows "
                        f"({4 * row_bytes} bytes) must fit"
                    )
                raise ConfigError(
                    f"unit {name} gathers {size / 2**20:.1f} MiB ({size} bytes), above the "
                    f"gather budget of {max_gathered_bytes / 2**20:.1f} MiB "
                    f"({max_gathered_bytes} bytes): a unit is gathered whole ({why}); "
                    "raise the budget (max_gathered_bytes, --zero3-gather-budget)"
                )
        order = ["model.embed_tokens"]
        order += [f"model.layers.{i}" for i in range(model.config.n_layers)]
        order += ["model.norm", "lm_head"]
        # Each unit is released as soon as its parts are taken, so the model shrinks while the
        # parts grow; the smallest units go first, so that the largest part (a tied embedding's)
        # is taken once the model has shrunk: the process's high-water mark stays near the
        # whole model's plus one block's part.
        def unit_bytes(name: str) -> int:
            return sum(int(p.encoded_nbytes) for _, p in by_unit[name])

        made: dict[str, _Unit] = {}
        for name in sorted((n for n in order if n in by_unit), key=unit_bytes):
            made[name] = _Unit(name, by_unit[name], group.world_size, group.rank)
            made[name].release()
        self.units: dict[str, _Unit] = {name: made[name] for name in order if name in made}
        self.shards = [u.shard for u in self.units.values() if u.shard is not None]
        self._holds: dict[str, int] = {}  # gathered unit -> holds the model has on it
        self._kept: set[str] = set()  # gathered units acquired to be kept for the backward
        self._inflight: dict[str, tuple[list[Any], list[np.ndarray]]] = {}
        # The slice of a table in flight: ((unit, start, stop), (requests, received)).
        self._slice_inflight: tuple[tuple[str, int, int], tuple[list[Any], np.ndarray]] | None = (
            None
        )
        # Bytes of the slice the model holds while the next unit's gather may start.
        self._slice_held = 0
        self.exposed_s = 0.0
        self.gathers = 0
        self.gathered_peak = 0
        self.trace: list[tuple[float, str, str, int]] | None = None
        self._attached = False

    # -- the model's owner --------------------------------------------------------------------

    def attach(self) -> None:
        """Sets this owner on the model (:meth:`DecoderOnlyTransformer.set_parameter_residency`)."""
        self.model.set_parameter_residency(self)
        self._attached = True

    @property
    def attached(self) -> bool:
        """Whether this owner holds the model's parameters (until :meth:`detach`)."""
        return self._attached

    def check_attached(self, what: str) -> None:
        """Raises ``ConfigError`` naming ``what`` when the owner was detached."""
        if not self._attached:
            raise ConfigError(
                f"{what}: this ZeRO-3 owner was detached (the model is whole again and no longer "
                "reads the shards): build a new DistributedOptimizer(zero=3) to go on training"
            )

    def detach(self) -> None:
        """Gathers every unit back into the model for good and removes the owner: the model is
        whole again on every rank (collective). The shards are then no longer the model's: an
        optimizer built on them refuses to step. A second call does nothing."""
        if not self._attached:
            return
        for unit in self.units:
            if unit not in self._holds:
                self._gather(unit)
        self._holds.clear()
        self._kept.clear()
        self.model.set_parameter_residency(None)
        self._attached = False

    def acquire(self, unit: str, reason: str, next: str | None) -> None:
        """Called by the model: takes a hold of ``unit``, gathering it (or waiting for its
        prefetch) when no hold had it, and starts ``next``'s gather when the limit allows
        (collective: every rank makes the same calls)."""
        self.check_attached(f"acquiring {unit}")
        if unit not in self.units:
            raise ConfigError(f"the model asked for unit {unit!r}, which this owner does not shard")
        if unit not in self._holds:
            self._gather(unit)
        self._holds[unit] = self._holds.get(unit, 0) + 1
        if reason == "kept_for_backward":
            self._kept.add(unit)
        if next is not None and next in self.units and next not in self._holds:
            if (
                next not in self._inflight
                and self._transient() < self.max_gathered
                and self._fits(next)
            ):
                self._inflight[next] = self._start(next)
        self.gathered_peak = max(self.gathered_peak, len(self._holds) + len(self._inflight))

    @property
    def sliced(self) -> dict[str, int]:
        """The frozen tables given to the model by slices of rows: unit name -> rows per slice
        (empty without a gather budget, or when every table fits it)."""
        return {unit: per_slice for unit, (per_slice, _, _) in self._slices.items()}

    def row_slice(self, unit: str) -> int | None:
        """Called by the model: the rows per slice in which ``unit``'s table is given
        (:meth:`fetch_rows`), or ``None`` when it is acquired whole."""
        got = self._slices.get(unit)
        return None if got is None else got[0]

    def fetch_rows(self, unit: str, start: int, stop: int, next: str | None) -> tuple[str, Any]:
        """Called by the model for every slice of a table it reads by slices, in order, on
        every rank alike (collective): rows ``start:stop`` of ``unit``'s table as stored, as
        ``(encoding, bytes)``. Starts the next slice's gather (or, after the last slice,
        ``next``'s) before returning."""
        self.check_attached(f"fetching rows {start}:{stop} of {unit}")
        if unit not in self._slices:
            raise ConfigError(f"the model asked for rows of unit {unit!r}, which is not sliced")
        per_slice, rows, row_bytes = self._slices[unit]
        if not 0 <= start < stop <= rows:
            raise ConfigError(f"rows {start}:{stop} of {unit} are outside its {rows} rows")
        key = (unit, start, stop)
        started = None
        if self._slice_inflight is not None:
            held_key, held = self._slice_inflight
            self._slice_inflight = None
            if held_key == key:
                started = held
            else:  # an earlier pass stopped between slices: its gather is finished and dropped
                self._wait(f"{held_key[0]}[{held_key[1]}:{held_key[2]}]", held[0])
        if started is None:
            started = self._slice_start(unit, start, stop)
        requests, received = started
        name = f"{unit}[{start}:{stop}]"
        self._wait(name, requests)
        self._record("ready", name)
        if stop < rows:
            after = (unit, stop, min(stop + per_slice, rows))
            self._slice_inflight = (after, self._slice_start(*after))
        elif next is not None and next in self.units and next not in self._holds:
            # The slice in use and the received bytes it was copied from.
            self._slice_held = 2 * (stop - start) * row_bytes
            try:
                if (
                    next not in self._inflight
                    and self._transient() < self.max_gathered
                    and self._fits(next)
                ):
                    self._inflight[next] = self._start(next)
            finally:
                self._slice_held = 0
        encoding = self.units[unit].encodings[0]
        return encoding, received

    def _slice_start(self, unit: str, start: int, stop: int) -> tuple[list[Any], np.ndarray]:
        """Starts the all-gather of rows ``start:stop`` of ``unit``'s table: each rank sends
        the bytes of those rows its frozen part holds (an ``MPI_Iallgatherv``)."""
        _, _, row_bytes = self._slices[unit]
        u = self.units[unit]
        lo, hi = start * row_bytes, stop * row_bytes
        n, part = self.group.world_size, u.frozen_part
        counts = [max(0, min(hi, (r + 1) * part) - max(lo, r * part)) for r in range(n)]
        displs = [sum(counts[:r]) for r in range(n)]
        own = u.own_parts()[0]
        mine = own[max(lo - self.group.rank * part, 0) :][: counts[self.group.rank]]
        self.gathers += 1
        self._record("gather", f"{unit}[{start}:{stop}]")
        received = np.empty(hi - lo, np.uint8)
        if n == 1:
            received[:] = mine
            return [], received
        mpi = self.group.mpi
        request = self.group.comm.Iallgatherv(
            [mine, mpi.BYTE], [received, (counts, displs), mpi.BYTE]
        )
        return [(request, mine)], received

    def _gather(self, unit: str) -> None:
        request = self._inflight.pop(unit, None)
        if request is None:
            request = self._start(unit)
        self._finish(unit, request)

    def release(self, unit: str) -> None:
        """Called by the model: gives a hold of ``unit`` back; with the last one its tensors are
        freed (this rank keeps its parts)."""
        holds = self._holds.get(unit, 0)
        if holds > 1:
            self._holds[unit] = holds - 1
        elif holds == 1:
            del self._holds[unit]
            self._kept.discard(unit)
            self.units[unit].release()
            self._record("release", unit)

    def _record(self, event: str, unit: str) -> None:
        if self.trace is not None:
            total = memory_stats()["total"]["current_bytes"]
            self.trace.append((time.perf_counter(), event, unit, int(total)))

    def release_all(self) -> None:
        """Frees every gathered unit whatever holds it (graphs that still hold a unit then fail
        to run their backward pass) and waits for gathers still in flight."""
        for unit in list(self._holds):
            self._holds[unit] = 1
            self.release(unit)
        for unit, (requests, _) in list(self._inflight.items()):
            self._wait(unit, requests)
        self._inflight.clear()
        if self._slice_inflight is not None:
            (unit, start, stop), (requests, _) = self._slice_inflight
            self._slice_inflight = None
            self._wait(f"{unit}[{start}:{stop}]", requests)

    def _fits(self, unit: str) -> bool:
        """Whether gathering ``unit`` ahead keeps the transient units within the byte budget."""
        if self.max_gathered_bytes is None:
            return True
        transient = (set(self._holds) - self._kept) | set(self._inflight) | {unit}
        held = sum(self.units[u].gathered_bytes for u in transient) + self._slice_held
        return held <= self.max_gathered_bytes

    def _transient(self) -> int:
        """Units gathered that the model releases soon (not the final norm and the head, kept
        from their forward to their VJP), and gathers in flight."""
        return len(set(self._holds) - self._kept) + len(self._inflight)

    def _start(self, unit: str) -> tuple[list[Any], list[np.ndarray]]:
        """Starts the all-gathers of ``unit``'s parts; returns the requests (with their send
        buffers, which must live until the gathers are done) and the receive buffers."""
        n = self.group.world_size
        self.gathers += 1
        self._record("gather", unit)
        requests: list[Any] = []
        received: list[np.ndarray] = []
        for send in self.units[unit].own_parts():
            recv = np.empty(send.size * n, np.uint8)
            if n == 1:
                recv[:] = send
            else:
                mpi = self.group.mpi
                request = self.group.comm.Iallgather([send, mpi.BYTE], [recv, mpi.BYTE])
                requests.append((request, send))
            received.append(recv)
        return requests, received

    def _wait(self, unit: str, requests: list[Any]) -> None:
        for req, _send in requests:
            if req.Test():
                continue
            t0 = self.group.communication_s
            self.group._collective(f"an all-gather of {unit}", req.Wait)
            self.exposed_s += self.group.communication_s - t0

    def _finish(self, unit: str, started: tuple[list[Any], list[np.ndarray]]) -> None:
        requests, received = started
        self._wait(unit, requests)
        self.units[unit].restore(received)
        self._record("ready", unit)

    # -- updates ------------------------------------------------------------------------------

    def shards_changed(self) -> None:
        """After the optimizer updated the shards (collective): gathers the units still held
        (by graphs kept across the step) again, so that later reads see the new values, drops
        gathers in flight (started before the update), and bumps the versions of the trainable
        tensors, so a graph recorded before the update refuses to run its backward pass."""
        for unit, (requests, _) in list(self._inflight.items()):
            self._wait(unit, requests)
        self._inflight.clear()
        for name in list(self._holds):
            u = self.units[name]
            if u.shard is not None:
                u.release()
                self._finish(name, self._start(name))
        for held in self.units.values():
            for _, p in held.trainable:
                p.bump_version()

    @contextlib.contextmanager
    def whole_model(self, reshard: bool = False) -> Iterator[None]:
        """Every unit gathered for the duration (collective), for reading or changing the whole
        model; with ``reshard`` the values present at the end (loaded weights) become the new
        shards. Each unit is released again afterwards (as far as nothing else holds it)."""
        self.check_attached("whole_model")
        for unit in self.units:
            self.acquire(unit, "kept_for_backward", None)
        try:
            yield
            if reshard:
                self._reshard()
        finally:
            for unit in self.units:
                self.release(unit)

    def _reshard(self) -> None:
        r = self.group.rank
        for u in self.units.values():
            # A gathered unit's frozen part is taken from its (new) values when it is released.
            if u.frozen_shard is not None and not u.frozen_shard.is_released:
                u.frozen_shard.copy_(u.frozen_part_of(r).view(np.float32))
            if u.shard is not None:
                u.shard.copy_(u.trainable_part_of(r))
            for p in u.parameters():
                p.bump_version()

    def mirror_save(self) -> None:
        """The gathers of a save of the whole model on rank 0 (``model.save`` or
        ``model.save_lora`` with this owner set: the native writer acquires each unit in
        state-dict order, writes its tensors and releases it), on a rank that writes nothing:
        every rank takes part in each unit's gather (collective)."""
        self.check_attached("mirror_save")
        lora = bool(self.model.named_lora_parameters())
        for name, unit in self.units.items():
            if lora and not any(".lora_" in n for n, _ in unit.trainable):
                continue
            self.acquire(name, "forward", None)
            self.release(name)

    # -- checkpoint files ---------------------------------------------------------------------

    def _manifest(self) -> dict[str, Any]:
        """What a shard file must agree on to be loaded into this owner."""
        return {
            "world_size": self.group.world_size,
            "units": {
                name: {
                    "frozen": [[n, list(p.shape), e] for (n, p), e in zip(u.frozen, u.encodings)],
                    "trainable": [[n, list(p.shape)] for n, p in u.trainable],
                    "frozen_part_bytes": u.frozen_part,
                    "trainable_part": u.trainable_part,
                }
                for name, u in self.units.items()
            },
        }

    def save_shard(self, path: Path, identity: dict[str, Any] | None = None) -> None:
        """Writes this rank's trainable parts into the safetensors file ``path``:
        ``<unit>.trainable`` (float32) per unit with trainable parameters, and in the header's
        ``riftco_zero3`` metadata the rank and what the parts are of (the frozen parameters'
        names, shapes and storage included), ``identity`` (the checkpoint's step and run, which
        :meth:`load_shard` compares) and a SHA-256 of each tensor's bytes. The frozen parts are
        not written: they never change, and a resumed run shards them again from the model it
        starts from.

        Raises:
            MPIUnavailableError: the ``safetensors`` package is missing.
        """
        save_file = _safetensors().save_file
        tensors: dict[str, np.ndarray] = {}
        for name, u in self.units.items():
            if u.shard is not None:
                tensors[f"{name}.trainable"] = u.shard.numpy()
        manifest = dict(self._manifest(), rank=self.group.rank, identity=identity)
        manifest["sha256"] = {k: hashlib.sha256(v.tobytes()).hexdigest() for k, v in tensors.items()}
        save_file(tensors, str(path), metadata={"riftco_zero3": json.dumps(manifest)})

    def load_shard(self, path: Path, identity: dict[str, Any] | None = None) -> None:
        """Loads this rank's parts from a file written by :meth:`save_shard` (a checkpoint of
        the same model, ranks and storage, and, when given, ``identity``: the same step and
        run); the model's tensors are marked changed.

        Raises:
            ModelStateError: a file that is not such a shard, one written for another rank,
                number of ranks, model, storage, step or run (the first difference named), or
                whose data does not match its checksum; nothing changes.
            OSError: the file cannot be read.
        """
        safe_open = _safetensors().safe_open
        try:
            with safe_open(str(path), framework="numpy") as f:
                metadata = f.metadata() or {}
                tensors = {k: f.get_tensor(k) for k in f.keys()}
        except (OSError, FileNotFoundError):
            raise
        except Exception as e:  # the package's own error types for a malformed file
            raise ModelStateError(f"{str(path)!r} is not a ZeRO-3 parameter shard: {e}") from None
        if "riftco_zero3" not in metadata:
            raise ModelStateError(
                f"{str(path)!r} is not a ZeRO-3 parameter shard (no riftco_zero3 metadata)"
            )
        try:
            manifest = json.loads(metadata["riftco_zero3"])
            checksums = manifest.pop("sha256")
            if not isinstance(checksums, dict):
                raise TypeError("sha256 is not an object")
            if identity is None:
                manifest.pop("identity", None)
        except (ValueError, KeyError, AttributeError, TypeError):
            raise ModelStateError(
                f"{str(path)!r} is not a ZeRO-3 parameter shard (its riftco_zero3 metadata is "
                "not what save_shard writes)"
            ) from None
        want = dict(self._manifest(), rank=self.group.rank)
        if identity is not None:
            want["identity"] = identity
        if manifest != want:
            difference = first_difference(manifest, want)
            raise ModelStateError(
                f"{str(path)!r} holds the parameter shard of another checkpoint, run or rank: "
                f"{difference} (the file against this checkpoint); resume with the ranks, model "
                "and storage the checkpoint was written with, from its own files"
            )
        for key, value in tensors.items():
            if hashlib.sha256(value.tobytes()).hexdigest() != checksums.get(key):
                raise ModelStateError(
                    f"{str(path)!r}: the data of {key} does not match its SHA-256 (the file is "
                    "corrupted)"
                )
        for name, u in self.units.items():
            key = f"{name}.trainable"
            value = tensors.get(key)
            if u.shard is not None and (
                value is None or value.dtype != np.float32 or value.shape != (u.trainable_part,)
            ):
                raise ModelStateError(
                    f"{str(path)!r}: tensor {key} is missing or not {u.trainable_part} float32"
                )
        for name, u in self.units.items():
            if u.shard is not None:
                u.shard.copy_(tensors[f"{name}.trainable"])
                for _, p in u.trainable:
                    p.bump_version()

    def reset_counters(self) -> None:
        self.exposed_s = 0.0
        self.gathers = 0
