"""Ctrl-C during a run: the SIGINT handler of the training loop and of the ``riftco`` commands
(:func:`riftco.commands.runner.run_cli`). The first SIGINT interrupts, at once or, inside
:meth:`_SigintGuard.deferred`, once the block (a step with its validation and save) is done;
any later one is counted and ignored."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from types import FrameType


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
