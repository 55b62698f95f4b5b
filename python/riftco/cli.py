"""Helpers shared by the command-line examples: clean exits instead of tracebacks.

:func:`run_cli` runs a ``main`` function and maps the expected failures onto exit codes:

- a bad input (:class:`riftco.RiftcoError`, an ``OSError`` such as an unwritable output folder,
  or :class:`UsageError`) prints one ``error: ...`` line on stderr and exits with code 2;
- Ctrl-C (``KeyboardInterrupt``, including :class:`riftco.TrainingInterrupted`) prints one line
  saying which saved state is intact and exits with code 130 (128 + SIGINT).

Anything else is a bug and keeps its traceback.

:class:`ArgumentParser` reports a malformed flag the same way (one ``error:`` line, exit 2,
instead of argparse's usage block), and :func:`int_range` / :func:`non_negative_float` are
argument types that reject out-of-range numbers while the command line is parsed, before any
work starts.
"""

from __future__ import annotations

import argparse
import math
import os
import signal
import sys
import threading
from collections.abc import Callable
from typing import NoReturn

from riftco._native import RiftcoError, TokenError
from riftco.generation import check_generation_args
from riftco.stages import TrainingInterrupted, _SigintGuard

EXIT_USAGE = 2
EXIT_INTERRUPTED = 130

U64_MAX = 2**64 - 1

__all__ = [
    "EXIT_INTERRUPTED",
    "EXIT_USAGE",
    "ArgumentParser",
    "U64_MAX",
    "UsageError",
    "check_sample_args",
    "fail",
    "int_range",
    "non_negative_float",
    "run_cli",
]


class UsageError(Exception):
    """A bad command-line input found by an example itself."""


def fail(message: str) -> NoReturn:
    """Raises :class:`UsageError` (``run_cli`` prints it and exits 2)."""
    raise UsageError(message)


class ArgumentParser(argparse.ArgumentParser):
    """``argparse.ArgumentParser`` whose errors are one ``prog: error: ...`` line on stderr and
    exit code 2 (``--help`` still prints the usage)."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {' '.join(message.split())}\n")


def int_range(low: int, high: int = U64_MAX) -> Callable[[str], int]:
    """An argparse ``type``: a decimal integer in ``[low, high]`` (the default ``high`` is the
    largest unsigned 64-bit value, what the native configs store)."""

    def parse(text: str) -> int:
        try:
            value = int(text, 10)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer; got {text!r}") from None
        if not low <= value <= high:
            bound = f">= {low}" if value < low else f"at most {high}"
            raise argparse.ArgumentTypeError(f"must be {bound}; got {value}")
        return value

    parse.__name__ = "int"
    return parse


def non_negative_float(text: str) -> float:
    """An argparse ``type``: a finite float ``>= 0``."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number; got {text!r}") from None
    if not (math.isfinite(value) and value >= 0.0):
        raise argparse.ArgumentTypeError(f"must be finite and >= 0; got {text}")
    return value


def check_sample_args(
    prompt: str,
    sample_tokens: int | None,
    temperature: float,
    top_k: int | None,
    seed: int,
    max_seq_len: int,
) -> tuple[bytes, int]:
    """The prompt bytes and the number of bytes to sample for the printed sample, checked with
    :func:`riftco.generation.check_generation_args` so that a bad setting fails before training.

    ``prompt`` is a command-line string; its bytes are ``os.fsencode(prompt)`` (the bytes given
    on the command line, even when they are not valid UTF-8). ``sample_tokens=None`` fills the
    model's ``max_seq_len`` positions.

    Raises:
        UsageError: an empty prompt, or a prompt plus sample longer than ``max_seq_len``, naming
            the flags and the values.
    """
    data = os.fsencode(prompt)
    n_new = max(max_seq_len - len(data) + 1, 0) if sample_tokens is None else sample_tokens
    try:
        check_generation_args(data, n_new, temperature, top_k, seed, max_seq_len=max_seq_len)
    except TokenError as e:
        fail(f"sample settings (--prompt, --sample-tokens, --temperature, --top-k): {e}")
    return data, n_new


def _one_line(e: BaseException) -> str:
    text = " ".join(str(e).split())
    return text or type(e).__name__


def run_cli(main: Callable[[], None], prog: str) -> NoReturn:
    """Runs ``main`` and exits with 0, 2 (bad input) or 130 (interrupted).

    SIGINT is handled the same whichever way the process inherited it (a shell starts a
    background job with SIGINT ignored): the first one interrupts ``main`` (exit 130); later
    ones, and any once ``main`` has ended, are ignored, so a second Ctrl-C can neither cut the
    exit short nor kill the process by signal.
    """
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
            where = f"the state saved at step {e.saved_step} in {e.out_dir} is intact"
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
