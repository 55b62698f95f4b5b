"""The argument helpers the ``riftco`` commands share.

:class:`ArgumentParser` reports a malformed flag as one ``error:`` line and exit code 2
(instead of argparse's usage block) and shows every default; :func:`int_range`,
:func:`non_negative_float`, :func:`positive_float` and :func:`probability` are argument types
that reject out-of-range numbers while the command line is parsed, before any work starts.
:func:`add_checkpointing_arguments` adds the shared ``--activation-checkpointing``,
``--activation-memory-budget`` and ``--loss-chunk-bytes`` flags, checked by the native parser
the same way; :func:`add_device_argument`, :func:`add_dropout_arguments`,
:func:`add_resume_argument` and :func:`add_data_parallel_arguments` the others shared by
``pretrain`` and ``post-train``. :func:`fail` raises :class:`UsageError`, which
:func:`riftco.commands.runner.run_cli` prints as one ``error:`` line (exit code 2).
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import re
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NoReturn

from riftco._native import (
    BLOCK_VALUE_NAMES,
    DEFAULT_LOSS_CHUNK_BYTES,
    DEVICES,
    SELECTIVE_POLICIES,
    ConfigError,
    TokenError,
    parse_activation_checkpointing,
    parse_byte_size,
)
from riftco.training.configs import check_loss_chunk_bytes, check_probability
from riftco.generation import check_generation_args
from riftco.training.run_folder import prepare_out_dir

EXIT_USAGE = 2

DEFAULT_SAMPLE_BYTES = 256
"""Bytes sampled when ``--sample-tokens`` is not given (fewer when the prompt leaves fewer of
the model's ``max_seq_len`` positions), whatever ``max_seq_len`` is."""

U64_MAX = 2**64 - 1

__all__ = [
    "EXIT_USAGE",
    "ArgumentParser",
    "DEFAULT_SAMPLE_BYTES",
    "HelpFormatter",
    "U64_MAX",
    "UsageError",
    "activation_checkpointing_arg",
    "add_checkpointing_arguments",
    "add_data_parallel_arguments",
    "add_device_argument",
    "byte_size_arg",
    "check_sample_args",
    "fail",
    "int_range",
    "non_negative_float",
    "output_folder",
    "positive_float",
    "start_data_parallel",
]


class UsageError(Exception):
    """A bad command-line input found by an example itself."""


def fail(message: str) -> NoReturn:
    """Raises :class:`UsageError` (``run_cli`` prints it and exits 2)."""
    raise UsageError(message)


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Shows descriptions and epilogs (the commands' docstrings, reStructuredText for the API
    docs) as plain text: markup removed (:func:`plain_text`), each prose paragraph re-wrapped to
    the terminal's width, and paragraphs with indented lines (examples) kept line for line.
    Appends ``(default: X)`` to every flag's help that does not show its default already
    (``%(default)s`` or its own ``(default: ...)``; none
    for flags whose default is ``None`` or ``False``: their help says what happens without
    them)."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        paragraphs = re.split(r"\n[ \t]*\n", plain_text(text).strip("\n"))
        filled = []
        for paragraph in paragraphs:
            lines = paragraph.splitlines()
            if any(line[:1].isspace() for line in lines):
                filled.append("\n".join(indent + line for line in lines))
            else:
                filled.append(
                    textwrap.fill(
                        " ".join(paragraph.split()),
                        width,
                        initial_indent=indent,
                        subsequent_indent=indent,
                        break_on_hyphens=False,
                        break_long_words=False,
                    )
                )
        return "\n\n".join(filled) + "\n"

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = plain_text(action.help or "")
        default = action.default
        if (
            "%(default)" in text
            or "(default:" in text
            or default is None
            or default is False
            or default is argparse.SUPPRESS
            or not action.option_strings
        ):
            return text
        return f"{text} (default: %(default)s)" if text else "default: %(default)s"


class ArgumentParser(argparse.ArgumentParser):
    """``argparse.ArgumentParser`` whose errors are one ``prog: error: ...`` line on stderr and
    exit code 2 (``--help`` still prints the usage). Help shows every default
    (:class:`HelpFormatter`) unless another ``formatter_class`` is given."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {' '.join(message.split())}\n")

    def format_help(self) -> str:
        # HelpFormatter removes the markup before wrapping; this catches what another
        # formatter_class would show: ``x`` and :role:`x` become x.
        return plain_text(super().format_help())


_RST_ROLE = re.compile(r":[a-z]+:`~?([^`]+)`")
_RST_LITERAL = re.compile(r"``([^`]+)``")


def plain_text(text: str) -> str:
    """``text`` with reStructuredText's inline literals (````x````) and roles (``:func:`x```)
    replaced by their content, for a terminal."""
    return _RST_LITERAL.sub(r"\1", _RST_ROLE.sub(r"\1", text))


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


def positive_float(text: str) -> float:
    """An argparse ``type``: a finite float ``> 0``."""
    value = non_negative_float(text)
    if value == 0.0:
        raise argparse.ArgumentTypeError(f"must be > 0; got {text}")
    return value


def probability(text: str) -> float:
    """An argparse ``type``: a dropout probability, a number in ``[0, 1)`` by the rule of the
    configs (:func:`riftco.training.configs.check_probability`: finite, below 1 also as a
    32-bit float, so ``0.99999999`` is refused here, before anything runs)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number in [0, 1); got {text!r}") from None
    try:
        return check_probability("probability", value)
    except ConfigError:
        if math.isfinite(value) and 0.0 <= value < 1.0:
            raise argparse.ArgumentTypeError(
                f"rounds to 1 as a 32-bit float; must be in [0, 1); got {text}"
            ) from None
        raise argparse.ArgumentTypeError(f"must be in [0, 1); got {text}") from None


def add_dropout_arguments(
    group: argparse._ActionsContainer, *, lora: bool, keep_model: bool = False
) -> None:
    """``--attention-dropout``, ``--residual-dropout`` and, with ``lora``, ``--lora-dropout``
    (each a probability in ``[0, 1)``, active in training steps only). The defaults are 0, or
    with ``keep_model`` ``None`` for the first two (keep the loaded model's own values)."""
    default = None if keep_model else 0.0
    default_text = "the model's" if keep_model else "%(default)s"
    group.add_argument(
        "--attention-dropout",
        type=probability,
        default=default,
        metavar="P",
        help=f"dropout on the attention probabilities (default: {default_text})",
    )
    group.add_argument(
        "--residual-dropout",
        type=probability,
        default=default,
        metavar="P",
        help="dropout on the attention and MLP outputs before the residual adds "
        f"(default: {default_text})",
    )
    if lora:
        group.add_argument(
            "--lora-dropout",
            type=probability,
            default=0.0,
            metavar="P",
            help="dropout on the LoRA adapters' inputs, PEFT's lora_dropout "
            "(default: %(default)s)",
        )


def activation_checkpointing_arg(text: str) -> str:
    """An argparse ``type``: an activation-checkpointing policy spelling, checked with
    :func:`riftco.parse_activation_checkpointing` (what does not depend on the model: the layer
    count is checked when the model is built). Returns ``text`` as given."""
    try:
        parse_activation_checkpointing(text)
    except ConfigError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return text


activation_checkpointing_arg.__name__ = "policy"


def byte_size_arg(text: str) -> int:
    """An argparse ``type``: a byte size (``"64MiB"``, ``"1.5GB"``, ``"1000000"``) parsed by
    :func:`riftco.parse_byte_size`, in bytes."""
    try:
        return parse_byte_size(text)
    except ConfigError as e:
        # The parser's message names the setting it was written for; argparse names the option.
        why = str(e).split(f"= {text!r}: ".replace("'", '"'), 1)[-1]
        raise argparse.ArgumentTypeError(f'"{text}" is not a byte size: {why}') from None


byte_size_arg.__name__ = "size"


def loss_chunk_bytes_arg(text: str) -> int | None:
    """argparse type of ``--loss-chunk-bytes``: a positive byte size, or ``none`` for whole
    logits."""
    if text.strip().lower() == "none":
        return None
    try:
        return check_loss_chunk_bytes(text)
    except ConfigError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


loss_chunk_bytes_arg.__name__ = "size"


def add_checkpointing_arguments(group: argparse._ActionsContainer) -> None:
    """Adds ``--activation-checkpointing POLICY`` (default ``disabled``) and
    ``--activation-memory-budget SIZE`` (default none) and ``--loss-chunk-bytes SIZE|none``
    (default 64 MiB) to a parser or argument group, with help
    listing every form and the named selective policies (the default first)."""
    names = list(SELECTIVE_POLICIES)
    selective = ", ".join(
        f"{n} (saves {'+'.join(SELECTIVE_POLICIES[n])}{'; the default' if i == 0 else ''})"
        for i, n in enumerate(names)
    )
    group.add_argument(
        "--activation-checkpointing",
        type=activation_checkpointing_arg,
        default="disabled",
        metavar="POLICY",
        help=(
            "which activations the training forward keeps: disabled (all) | block (each block "
            "recomputed during backward) | segments:K (K consecutive blocks per checkpoint, "
            "1 <= K <= n_layers) | auto (K from measured bytes, sqrt(n_layers * M_ckpt / "
            "M_layer)) | selective[:NAME] (each block keeps some values and recomputes the "
            f"rest; NAME is {selective}, or block values joined by '+': "
            f"{', '.join(BLOCK_VALUE_NAMES)}) | a comma-separated per-block list of "
            "disabled/block/selective[:NAME], one per layer | budget:SIZE (the planner picks "
            "per-block policies whose predicted peak activation bytes fit SIZE, as "
            "--activation-memory-budget) (default: %(default)s)"
        ),
    )
    group.add_argument(
        "--activation-memory-budget",
        type=byte_size_arg,
        default=None,
        metavar="SIZE",
        help=(
            "plan per-block policies whose predicted peak activation bytes fit SIZE (e.g. "
            "64MiB, 1.5GB, 1000000) with the least recompute time; only with "
            "--activation-checkpointing disabled"
        ),
    )
    group.add_argument(
        "--loss-chunk-bytes",
        type=loss_chunk_bytes_arg,
        default=DEFAULT_LOSS_CHUNK_BYTES,
        metavar="SIZE",
        help=(
            "workspace of the chunked LM head + cross-entropy: the training loss computes the "
            "logits and their gradient a chunk of tokens at a time within SIZE bytes (e.g. "
            "16MiB), never the whole [tokens, vocab] logits; 'none' computes whole logits "
            "(same loss and gradients within f32 rounding) (default: 64MiB)"
        ),
    )


def add_device_argument(group: argparse._ActionsContainer) -> None:
    """Adds ``--device NAME`` (one of ``riftco.DEVICES``, default ``cpu``) to a parser or
    argument group."""
    group.add_argument(
        "--device",
        type=str.lower,  # case-insensitive, like model.to
        choices=DEVICES,
        default="cpu",
        help="where the model runs: cpu, vulkan (wgpu's Vulkan backend), metal (wgpu's Metal "
        "backend, macOS) or gpu (the best adapter of either); 'riftco info' lists what this "
        "machine has (default: %(default)s)",
    )


def add_resume_argument(group: Any) -> None:
    """``--resume``, shared by ``pretrain`` and ``post-train``."""
    group.add_argument(
        "--resume",
        action="store_true",
        help="continue the run in --out from its newest checkpoint (checkpoints/step-N/), "
        "exactly as if it had not stopped; settings that change what it computes must be the "
        "checkpoint's (a difference is refused, naming both values); starts at step 0 when "
        "--out holds no run",
    )


def add_data_parallel_arguments(group: argparse._ActionsContainer) -> None:
    """``--data-parallel``, ``--zero`` and ``--data-parallel-timeout``, shared by ``pretrain``
    and ``post-train``."""
    group.add_argument(
        "--data-parallel",
        action="store_true",
        help="train one replica per MPI process (start the command with mpiexec -n N, mpirun or "
        "srun): each rank takes --batch-size/N rows of every batch and the gradients are "
        "averaged; rank 0 prints and saves (needs pip install 'riftco[mpi]')",
    )
    group.add_argument(
        "--zero",
        type=int,
        choices=(0, 1, 2, 3),
        default=0,
        help="ZeRO stage with --data-parallel: 1 shards Adam's moments over the ranks, 2 the "
        "gradient sums too, 3 the parameters too (each rank keeps 1/N of every block and "
        "gathers a block only while it computes; cpu only) (default: %(default)s)",
    )
    group.add_argument(
        "--zero3-gather-budget",
        type=byte_size_arg,
        default=None,
        metavar="SIZE",
        help="with --zero 3: the most bytes of units gathered ahead at once (256MiB, 1GB); a "
        "frozen embedding or LM head larger than it is gathered by slices of rows (a quarter of "
        "it each), any other unit larger than it is refused (default: no limit)",
    )
    group.add_argument(
        "--data-parallel-timeout",
        type=positive_float,
        default=600.0,
        metavar="SECONDS",
        help="how long a rank waits for the others in one exchange before it ends the job "
        "(default: %(default)s)",
    )


def start_data_parallel(args: argparse.Namespace) -> int:
    """This process's rank for ``--data-parallel`` (0 without it), the MPI process group
    started. The ranks other than 0 print nothing (their stdout and stderr go to
    ``os.devnull``; an abort's message still reaches the process's own stderr).

    Raises:
        UsageError: ``--zero`` above 0 without ``--data-parallel``.
        MPIUnavailableError: ``--data-parallel`` without mpi4py (the message says what to
            install).
    """
    if args.zero and not args.data_parallel:
        fail(f"--zero {args.zero} shards over data-parallel ranks: it needs --data-parallel")
    if not args.data_parallel:
        return 0
    from riftco.training import distributed

    group = distributed.init(args.data_parallel_timeout)
    if group.rank:
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - for the rest of the process
        sys.stderr = sys.stdout
    return group.rank


@contextlib.contextmanager
def output_folder(out_dir: str | os.PathLike[str]) -> Iterator[Path]:
    """Creates ``out_dir`` with :func:`riftco.prepare_out_dir` (``OutputDirError`` when it cannot
    be written) for the ``with`` block; when the block raises, the folders this call created
    are removed again while they are empty, so bad input found inside the block (a budget below
    the smallest achievable peak, a corpus too small) leaves no empty output folder behind.
    Folders that existed before, or that hold anything, are kept."""
    created: list[Path] = []
    p = Path(out_dir).absolute()
    while not p.exists() and p != p.parent:
        created.append(p)
        p = p.parent
    out = prepare_out_dir(out_dir)
    try:
        yield out
    except BaseException:
        for folder in created:  # the deepest first
            try:
                folder.rmdir()
            except OSError:
                break
        raise


def check_sample_args(
    prompt: str,
    sample_tokens: int | None,
    temperature: float,
    top_k: int | None,
    seed: int,
    max_seq_len: int,
    prompt_flag: str = "--prompt",
) -> tuple[bytes, int]:
    """The prompt bytes and the number of bytes to sample for the printed sample, checked with
    :func:`riftco.generation.check_generation_args` so that a bad setting fails before training.

    ``prompt`` is a command-line string; its bytes are ``os.fsencode(prompt)`` (the bytes given
    on the command line, even when they are not valid UTF-8). ``sample_tokens=None`` samples
    :data:`DEFAULT_SAMPLE_BYTES` bytes, or fewer when the prompt leaves fewer of the model's
    ``max_seq_len`` positions. ``prompt_flag`` is how the command takes the prompt, for the
    messages (``"--prompt"``, or ``"PROMPT"``, the positional argument of ``riftco generate``).

    Raises:
        UsageError: an empty prompt, or a prompt plus sample longer than ``max_seq_len``, naming
            the flags and the values.
    """
    data = os.fsencode(prompt)
    fill = max(max_seq_len - len(data) + 1, 0)
    n_new = min(DEFAULT_SAMPLE_BYTES, fill) if sample_tokens is None else sample_tokens
    try:
        check_generation_args(data, n_new, temperature, top_k, seed, max_seq_len=max_seq_len)
    except TokenError as e:
        hint = ""
        if data and n_new > fill:
            hint = f"; pass --sample-tokens {fill} or less, or a shorter {prompt_flag}"
        fail(
            f"sample settings ({prompt_flag}, --sample-tokens, --temperature, --top-k): {e}{hint}"
        )
    return data, n_new
