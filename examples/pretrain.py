"""Pretrain a small LLaMA-style byte-level language model on real text — riftco's main job.

With no arguments it trains on the source of the running interpreter's standard library
(``riftco.default_corpus()``: ``*.py`` files in sorted order, 8 MiB cap) and writes
``runs/pretrain/{model.safetensors, config.json, training_metadata.json}`` (and ``loss.png``,
``memory.png`` with matplotlib), then prints a generated sample. ``--data PATH...`` trains on
given text files or folders instead.

    python examples/pretrain.py                                  # the README's main job
    python examples/pretrain.py --activation-checkpointing block --steps 100 --out runs/block
    python examples/pretrain.py --activation-checkpointing segments:2 --out runs/segments
    python examples/pretrain.py --activation-memory-budget 64MiB --out runs/budget
    python examples/pretrain.py --data notes/ book.txt --out runs/mine
    python examples/pretrain.py --device gpu --out runs/gpu     # on the best GPU adapter

Each run goes to its own ``--out`` folder: a folder holding another configuration's run is
refused without ``--overwrite``.

The flags and the code are those of ``python -m riftco pretrain`` (``riftco.commands.pretrain``).

Exit codes: 0 done, 2 bad input (one ``error:`` line on stderr), 130 interrupted with Ctrl-C
(the last periodic save is left intact).
"""

from __future__ import annotations

import argparse
import sys

try:
    from riftco.commands.runner import run_cli
    from riftco.commands import pretrain
except ModuleNotFoundError as e:  # run by an interpreter without the package (the system python3)
    print(
        f"pretrain.py: error: {e} in {sys.executable}: riftco is installed in the "
        "repository's .venv; run `bash scripts/setup.sh` once, then "
        "`.venv/bin/python examples/pretrain.py` (or `bash scripts/main.sh`)",
        file=sys.stderr,
    )
    sys.exit(2)

PROG = "pretrain.py"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    return pretrain.parse_args(argv, prog=PROG)


def main() -> None:
    pretrain.run(parse_args(), PROG)


if __name__ == "__main__":
    run_cli(main, PROG)
