"""Per-step records of a training stage, kept in ``training_metadata.json``.

- ``memory_per_step``: for each memory category of :func:`riftco.memory_stats` (``parameter``,
  ``gradient``, ``optimizer_state``, ``activation``, ``workspace``, ``total``) a list with one
  entry per completed step, the peak bytes of that category during that step (the peaks are
  reset at the start of every step, so entry ``i`` is step ``i + 1``'s own peak; ``total`` is
  the peak of the sum, not the sum of the peaks), and ``cached``: the bytes the buffer pool
  holds for reuse after the step (:func:`riftco.cached_bytes`), not counted in any category.
- ``validation_losses``: ``[{"step": s, "loss": v}, ...]``, the held-out loss before training
  (step 0), after every ``eval_every`` steps and after the last step (the same values as
  ``validation_loss_before`` and ``validation_loss_after``).

All values are JSON numbers: bytes are ints, losses floats.
"""

from __future__ import annotations

from typing import Any

from riftco._native import cached_bytes, memory_stats

__all__ = ["CACHED_KEY", "MEMORY_CATEGORIES", "StepRecords"]

MEMORY_CATEGORIES: tuple[str, ...] = (
    "parameter",
    "gradient",
    "optimizer_state",
    "activation",
    "workspace",
    "total",
)
"""The categories of :func:`riftco.memory_stats`, in the order the memory plot stacks them."""

CACHED_KEY = "cached"
"""The key of the buffer pool's cached bytes in ``memory_per_step``."""

_STAGE_TITLES = {
    "pretraining": "pretraining",
    "post_training_lora": "LoRA post-training",
    "post_training_full": "full post-training",
}


def stage_title(stage: object) -> str:
    """How logs, progress lines, plot titles and errors name a run's ``stage`` (the identifier
    kept in ``training_metadata.json`` and checkpoints, such as ``post_training_lora``):
    ``"LoRA post-training"``; an unknown identifier as it is."""
    return _STAGE_TITLES.get(str(stage), str(stage))


class StepRecords:
    """Collects the per-step records into the lists of a metadata dict (so that every save of
    the dict carries the records so far)."""

    def __init__(self, metadata: dict[str, Any], device: str) -> None:
        self._device = device
        self.memory: dict[str, list[int]] = {k: [] for k in (*MEMORY_CATEGORIES, CACHED_KEY)}
        self.validation: list[dict[str, float | int]] = []
        metadata["memory_per_step"] = self.memory
        metadata["validation_losses"] = self.validation

    def record_step(self) -> dict[str, int]:
        """Appends this step's peak bytes per category and the cached bytes; returns the peaks
        (every category ``memory_stats`` reports, also any not in :data:`MEMORY_CATEGORIES`)."""
        peaks = {k: int(v["peak_bytes"]) for k, v in memory_stats(device=self._device).items()}
        for k in MEMORY_CATEGORIES:
            self.memory[k].append(peaks.get(k, 0))
        self.memory[CACHED_KEY].append(int(cached_bytes()))
        return peaks

    def record_validation(self, step: int, loss: float) -> None:
        """Appends the validation loss after ``step`` completed steps (0: before training)."""
        self.validation.append({"step": int(step), "loss": float(loss)})
