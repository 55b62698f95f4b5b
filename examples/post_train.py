"""Post-train (fine-tune) a model saved by ``examples/pretrain.py`` on other text.

By default it LoRA-fine-tunes ``runs/pretrain`` on the Python language reference that ships with
every CPython install (``pydoc_data/topics.py``, English prose the pretraining corpus excludes),
writes the adapter (PEFT layout) to ``runs/post_train/adapter`` with
``training_metadata.json``, and prints a sample before and after. ``--fine-tuning-method full``
trains every weight and writes ``model.safetensors`` instead.

    python examples/post_train.py
    python examples/post_train.py --fine-tuning-method full --out runs/post_train-full
    python examples/post_train.py --activation-checkpointing selective:dots --out runs/pt-dots
    python examples/post_train.py --activation-memory-budget 8MiB --out runs/pt-budget
    python examples/post_train.py --device gpu --out runs/pt-gpu      # on the best GPU adapter
    python examples/post_train.py --model runs/pretrain --data my_notes/ --lora-rank 16 --out runs/pt-notes

The flags and the code are those of ``python -m riftco post-train`` (``riftco.commands.post_train``).

Exit codes: 0 done, 2 bad input (one ``error:`` line on stderr), 130 interrupted with Ctrl-C
(the last periodic save is left intact).
"""

from __future__ import annotations

import argparse
import sys

try:
    from riftco.commands.runner import run_cli
    from riftco.commands import post_train
except ModuleNotFoundError as e:  # run by an interpreter without the package (the system python3)
    print(
        f"post_train.py: error: {e} in {sys.executable}: riftco is installed in the "
        "repository's .venv; run `bash scripts/setup.sh` once, then "
        "`.venv/bin/python examples/post_train.py`",
        file=sys.stderr,
    )
    sys.exit(2)

PROG = "post_train.py"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    return post_train.parse_args(argv, prog=PROG)


def main() -> None:
    post_train.run(parse_args(), PROG)


if __name__ == "__main__":
    run_cli(main, PROG)
