"""Pictures of a training run from its ``training_metadata.json``: ``loss.png`` and ``memory.png``.

- ``loss.png``: the training loss of every step and the validation loss (``validation_losses``:
  before training, every ``eval_every`` steps, at the end) against the step, with the uniform
  baseline ``ln 256`` dashed; below it the learning rate of every step.
- ``memory.png``: the peak bytes of each step by category (``memory_per_step``: parameter,
  optimizer state, gradient, activation, workspace), stacked, in MiB, with the peak of their
  sum (``total``) as a line (below the stack's top when the categories peak at different
  moments of the step); below it the buffer pool's cached bytes after each step.

Both are :data:`PLOT_SIZE_PX` pixels, drawn with matplotlib's Agg canvas on a ``Figure`` of
their own (``matplotlib.pyplot`` and its global state are not used; the process's backend is
not changed) and written atomically. matplotlib is an optional dependency, the extra
``riftco[plot]``; without it :func:`write_plots` raises :class:`PlottingUnavailableError`.
"""

from __future__ import annotations

import importlib
import io
import json
import math
import os
from pathlib import Path
from typing import Any

from riftco._native import RiftcoError, write_file_atomic
from riftco.training.run_records import CACHED_KEY, stage_title

__all__ = [
    "LOSS_PLOT",
    "MEMORY_PLOT",
    "PLOT_SIZE_PX",
    "PlottingUnavailableError",
    "RunMetadataError",
    "load_metadata",
    "write_plots",
]

LOSS_PLOT = "loss.png"
MEMORY_PLOT = "memory.png"
PLOT_SIZE_PX = (960, 600)
"""Width and height of each picture in pixels."""
_DPI = 100
_STACKED = (
    ("parameter", "parameters"),
    ("optimizer_state", "optimizer state"),
    ("gradient", "gradients"),
    ("activation", "activations"),
    ("workspace", "workspace"),
)


class PlottingUnavailableError(RiftcoError, RuntimeError):
    """matplotlib is not installed (the message says how to install it)."""


class RunMetadataError(RiftcoError, ValueError):
    """A run folder has no readable ``training_metadata.json``, or it lacks what a plot needs."""


def _figure_class() -> Any:
    try:
        figure = importlib.import_module("matplotlib.figure")
    except ImportError as e:
        raise PlottingUnavailableError(
            f"matplotlib is not installed ({e}); install it with `pip install 'riftco[plot]'` "
            "(or `pip install matplotlib`)"
        ) from None
    return figure.Figure


def load_metadata(run_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """The ``training_metadata.json`` of a run folder (or that file itself) as a dict.

    Raises:
        RunMetadataError: no such file, or it is not a JSON object, naming the path.
    """
    path = Path(run_dir)
    if path.is_dir():
        path = path / "training_metadata.json"
    if not path.is_file():
        raise RunMetadataError(
            f"no training_metadata.json at {str(path)!r}: pass the output folder of a "
            "pretraining or post-training run (e.g. runs/pretrain)"
        )
    try:
        data = json.loads(path.read_bytes()[: 64 * 2**20])
    except (OSError, ValueError) as e:
        raise RunMetadataError(f"cannot read {str(path)!r}: {e}") from None
    if not isinstance(data, dict):
        raise RunMetadataError(f"{str(path)!r} is not a JSON object")
    return data


def _new_figure(rows: int) -> tuple[Any, list[Any]]:
    figure_class = _figure_class()
    w, h = PLOT_SIZE_PX
    fig = figure_class(figsize=(w / _DPI, h / _DPI), dpi=_DPI, layout="constrained")
    if rows == 1:
        return fig, [fig.add_subplot(1, 1, 1)]
    axes = fig.subplots(rows, 1, sharex=True, height_ratios=[3] + [1] * (rows - 1))
    return fig, list(axes)


def _integer_steps(ax: Any) -> None:
    ticker = importlib.import_module("matplotlib.ticker")
    ax.xaxis.set_major_locator(ticker.MaxNLocator(integer=True))


def _save(fig: Any, path: Path) -> Path:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=_DPI)
    write_file_atomic(path, buf.getvalue())
    return path


def _title(meta: dict[str, Any]) -> str:
    cfg = meta.get("model_config") or {}
    parts = [stage_title(meta.get("stage", "run"))]
    if cfg:
        parts.append(
            f"d_model {cfg.get('d_model')}, {cfg.get('n_layers')} layers, "
            f"{cfg.get('n_heads')} heads"
        )
    tc = meta.get("training_config") or {}
    if tc:
        parts.append(f"batch {tc.get('batch_size')} × seq {tc.get('seq_len')}")
    parts.append(f"checkpointing {meta.get('activation_checkpointing', '?')}")
    dp = meta.get("data_parallel")
    if isinstance(dp, dict):
        # The memory recorded is rank 0's.
        parts.append(f"rank 0 of {dp.get('world_size')}, ZeRO {dp.get('zero')}")
    return "; ".join(parts)


def _loss_plot(meta: dict[str, Any], path: Path) -> Path:
    losses = [float(v) for v in meta.get("losses") or []]
    if not losses:
        raise RunMetadataError("the metadata records no training losses (no step completed)")
    steps = list(range(1, len(losses) + 1))
    fig, (ax, ax_lr) = _new_figure(2)
    ax.plot(steps, losses, lw=1.0, color="tab:blue", label="training loss (batch)")
    val = meta.get("validation_losses") or []
    if val:
        ax.plot(
            [int(v["step"]) for v in val],
            [float(v["loss"]) for v in val],
            "o-",
            ms=4,
            lw=1.5,
            color="tab:orange",
            label="validation loss (held out)",
        )
    baseline = meta.get("uniform_baseline_loss")
    if isinstance(baseline, (int, float)) and math.isfinite(baseline):
        ax.axhline(baseline, ls="--", lw=1.0, color="gray", label=f"uniform ln 256 = {baseline:.2f}")
    ax.set_ylabel("cross-entropy (nats / byte)")
    ax.set_title(_title(meta), fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(loc="upper right")
    lrs = [float(v) for v in meta.get("lrs") or []]
    ax_lr.plot(list(range(1, len(lrs) + 1)), lrs, lw=1.2, color="tab:green")
    ax_lr.set_ylabel("learning rate")
    ax_lr.set_xlabel("step")
    ax_lr.grid(alpha=0.3)
    ax_lr.ticklabel_format(axis="y", style="sci", scilimits=(-2, 2))
    _integer_steps(ax_lr)
    return _save(fig, path)


def _headroom(top: float, factor: float) -> float:
    """An axis' upper limit ``factor`` above the data's largest value (1 when all are zero)."""
    return top * factor if top > 0 else 1.0


def _memory_plot(meta: dict[str, Any], path: Path) -> Path:
    mem = meta.get("memory_per_step")
    if not isinstance(mem, dict) or not mem.get("total"):
        raise RunMetadataError(
            "the metadata has no per-step memory (memory_per_step; runs saved by an older "
            "riftco record only the peaks): loss.png only"
        )
    mib = 2.0**20
    n = len(mem["total"])
    steps = list(range(1, n + 1))
    cached = mem.get(CACHED_KEY) or []
    fig, axes = _new_figure(2 if cached else 1)
    ax = axes[0]
    present = [(k, label) for k, label in _STACKED if any(mem.get(k) or [])]
    ax.stackplot(
        steps,
        *[[b / mib for b in mem[k]] for k, _ in present],
        labels=[label for _, label in present],
        alpha=0.85,
    )
    ax.plot(steps, [b / mib for b in mem["total"]], color="black", lw=1.0, label="peak of the sum")
    ax.set_ylabel("peak bytes in the step (MiB)")
    ax.set_title(_title(meta), fontsize=10)
    ax.set_xlim(1, max(n, 2))
    # Headroom above the stack for the legend, which would otherwise cover its top layers.
    stack_top = max(sum(mem[k][i] for k, _ in present) for i in range(n)) / mib if present else 0
    ax.set_ylim(0, _headroom(max(stack_top, max(mem["total"]) / mib), 1.3))
    ax.grid(alpha=0.3)
    ax.legend(loc="upper center", ncol=3, fontsize=9)
    if cached:
        # Its own panel: the pool's free buffers can dwarf a small model's live bytes.
        ax_c = axes[1]
        ax_c.plot(steps, [b / mib for b in cached], color="gray", lw=1.2)
        ax_c.set_ylabel("pool cache (MiB)")
        # A steady cache is a flat line: without headroom it sits on the panel's top border.
        ax_c.set_ylim(0, _headroom(max(cached) / mib, 1.2))
        ax_c.grid(alpha=0.3)
        ax_c.set_title("free buffers the pool keeps for reuse, after the step", fontsize=9)
    axes[-1].set_xlabel("step")
    _integer_steps(axes[-1])
    return _save(fig, path)


def write_plots(
    metadata: dict[str, Any] | str | os.PathLike[str],
    out_dir: str | os.PathLike[str] | None = None,
) -> list[Path]:
    """Writes ``loss.png`` and ``memory.png`` (see the module docstring) into ``out_dir``.

    ``metadata`` is the dict a stage returned or a run folder (or its
    ``training_metadata.json``); ``out_dir`` defaults to that folder (required with a dict).

    Returns:
        The paths written: both, or only ``loss.png`` when the metadata has no per-step memory.

    Raises:
        PlottingUnavailableError: matplotlib is not installed.
        RunMetadataError: no metadata at the path, or no completed step in it.
        OSError: ``out_dir`` cannot be written.
    """
    if isinstance(metadata, dict):
        if out_dir is None:
            raise TypeError("write_plots(metadata_dict) needs out_dir")
        meta = metadata
        out = Path(out_dir)
    else:
        meta = load_metadata(metadata)
        given = Path(metadata)
        out = Path(out_dir) if out_dir is not None else (given if given.is_dir() else given.parent)
    _figure_class()  # the clear message before any work
    written = [_loss_plot(meta, out / LOSS_PLOT)]
    mem = meta.get("memory_per_step")
    if isinstance(mem, dict) and mem.get("total"):
        written.append(_memory_plot(meta, out / MEMORY_PLOT))
    return written
