"""Running a ``riftco`` command: clean exits instead of tracebacks.

:func:`run_cli` runs a ``main`` function and maps the expected failures onto exit codes:

- a bad input (:class:`riftco.RiftcoError`, an ``OSError`` such as an unwritable output folder,
  or :class:`~riftco.commands.arguments.UsageError`) prints one ``error: ...`` line on stderr
  and exits with code 2;
- Ctrl-C (``KeyboardInterrupt``, including :class:`riftco.TrainingInterrupted`) prints one line
  saying which saved state is intact and exits with code 130 (128 + SIGINT).

Anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Callable
from typing import Any, NoReturn

from riftco._native import RiftcoError
from riftco.commands.arguments import EXIT_USAGE, UsageError
from riftco.training.interrupts import _SigintGuard
from riftco.training.run_folder import TrainingInterrupted

EXIT_INTERRUPTED = 130

__all__ = ["EXIT_INTERRUPTED", "run_cli"]


def _one_line(e: BaseException) -> str:
    text = " ".join(str(e).split())
    return text or type(e).__name__


class _PipeSafe:
    """A text stream whose reader may go away or whose file may fail: once a write or flush
    finds the pipe closed (``riftco post-train ... | head -1``) or the output unwritable (a full
    device, an I/O error), later output is dropped and the command goes on, so the terminal's
    side never ends a run that writes files. A stream that was closed before the process started
    (``>&-``: ``None`` here) drops everything from the start. Everything else is the wrapped
    stream's."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream
        self.dropped = stream is None

    def write(self, text: str) -> int:
        if not self.dropped:
            try:
                return int(self._stream.write(text))
            except OSError as e:
                self._drop(e)
        return len(text)

    def flush(self) -> None:
        if not self.dropped:
            try:
                self._stream.flush()
            except OSError as e:
                self._drop(e)

    def isatty(self) -> bool:
        return not self.dropped and bool(self._stream.isatty())

    def _drop(self, error: OSError) -> None:
        self.dropped = True
        if not isinstance(error, BrokenPipeError) and sys.stderr is not self:
            # A reader that went away is normal (``| head``); a failing file is worth a line.
            name = "standard output" if sys.stdout is self else "standard error"
            print(
                f"riftco: warning: {name} failed ({error.strerror or error}); the run goes on "
                "without printing there",
                file=sys.stderr,
            )
        # The interpreter flushes the real stream at exit: point its descriptor at /dev/null
        # so that flush cannot fail (and print "Exception ignored ... BrokenPipeError") either.
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, self._stream.fileno())
            os.close(devnull)
        except (OSError, ValueError, AttributeError):
            pass

    def __getattr__(self, name: str) -> Any:
        if self._stream is None:
            raise AttributeError(name)
        return getattr(self._stream, name)


def run_cli(main: Callable[[], None], prog: str) -> NoReturn:
    """Runs ``main`` and exits with 0, 2 (bad input) or 130 (interrupted).

    Standard output and error may be closed by their reader (a pipe into ``head``), closed from
    the start (``>&-``) or fail (a full device): the command stops printing there and runs to its
    end (exit 0 when it succeeds), files written as usual.

    SIGINT is handled the same whichever way the process inherited it (a shell starts a
    background job with SIGINT ignored): the first one interrupts ``main`` (exit 130); later
    ones, and any once ``main`` has ended, are ignored, so a second Ctrl-C can neither cut the
    exit short nor kill the process by signal.
    """
    if not isinstance(sys.stdout, _PipeSafe):
        sys.stdout = _PipeSafe(sys.stdout)
    if not isinstance(sys.stderr, _PipeSafe):
        sys.stderr = _PipeSafe(sys.stderr)
    guard = _SigintGuard()
    on_main_thread = threading.current_thread() is threading.main_thread()
    if on_main_thread:
        signal.signal(signal.SIGINT, guard)
    try:
        code = _run_main(main, prog, guard)
    except KeyboardInterrupt:  # a first Ctrl-C that landed while reporting another outcome
        code = EXIT_INTERRUPTED
    finally:
        if on_main_thread:
            # Exiting: nothing may interrupt the exit or the interpreter's shutdown.
            signal.signal(signal.SIGINT, signal.SIG_IGN)
    sys.exit(code)


def _run_main(main: Callable[[], None], prog: str, guard: _SigintGuard) -> int:
    try:
        main()
    except TrainingInterrupted as e:
        guard.fired = True
        if e.saved_step is None:
            where = "nothing was saved yet"
        else:
            where = (
                f"the checkpoint of step {e.saved_step} in {e.out_dir} is intact; the same "
                "command with --resume continues from it"
            )
        print(f"{prog}: interrupted; {where}", file=sys.stderr)
        return EXIT_INTERRUPTED
    except KeyboardInterrupt:
        guard.fired = True
        print(f"{prog}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except (UsageError, RiftcoError, OSError) as e:
        guard.fired = True
        print(f"{prog}: error: {_one_line(e)}", file=sys.stderr)
        return EXIT_USAGE
    guard.fired = True
    return 0
