"""The progress of a run: a tqdm bar when it is wanted and installed, else log lines."""

from __future__ import annotations

import importlib
import sys
from typing import Any

from riftco.training.run_folder import Log


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
