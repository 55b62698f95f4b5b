"""Helpers shared by the command-line examples: clean exits instead of tracebacks.

:func:`run_cli` runs a ``main`` function and maps the expected failures onto exit codes:

- a bad input (:class:`riftco.RiftcoError`, an ``OSError`` such as an unwritable output folder,
  or :class:`UsageError`) prints one ``error: ...`` line on stderr and exits with code 2;
- Ctrl-C (``KeyboardInterrupt``, including :class:`riftco.TrainingInterrupted`) prints one line
  saying which saved state is intact and exits with code 130 (128 + SIGINT).

Anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import NoReturn

from riftco._native import RiftcoError
from riftco.stages import TrainingInterrupted

EXIT_USAGE = 2
EXIT_INTERRUPTED = 130

__all__ = ["EXIT_INTERRUPTED", "EXIT_USAGE", "UsageError", "fail", "run_cli"]


class UsageError(Exception):
    """A bad command-line input found by an example itself."""


def fail(message: str) -> NoReturn:
    """Raises :class:`UsageError` (``run_cli`` prints it and exits 2)."""
    raise UsageError(message)


def _one_line(e: BaseException) -> str:
    text = " ".join(str(e).split())
    return text or type(e).__name__


def run_cli(main: Callable[[], None], prog: str) -> NoReturn:
    """Runs ``main`` and exits with 0, 2 (bad input) or 130 (interrupted)."""
    try:
        main()
    except TrainingInterrupted as e:
        if e.saved_step is None:
            where = "nothing was saved yet"
        else:
            where = f"the state saved at step {e.saved_step} in {e.out_dir} is intact"
        print(f"{prog}: interrupted; {where}", file=sys.stderr)
        sys.exit(EXIT_INTERRUPTED)
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        sys.exit(EXIT_INTERRUPTED)
    except (UsageError, RiftcoError, OSError) as e:
        print(f"{prog}: error: {_one_line(e)}", file=sys.stderr)
        sys.exit(EXIT_USAGE)
    sys.exit(0)
