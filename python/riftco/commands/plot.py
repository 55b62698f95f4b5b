"""``riftco plot RUN``: write ``loss.png`` and ``memory.png`` of a run folder.

RUN is the output folder of ``riftco pretrain`` or ``riftco post-train`` (its
``training_metadata.json`` is read). The pictures go into RUN, or into ``--out``. Needs
matplotlib (``pip install 'riftco[plot]'``).
"""

from __future__ import annotations

import argparse

from riftco.commands.arguments import fail
from riftco.training import plotting
from riftco.training.run_records import stage_title

__all__ = ["add_arguments", "run"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The arguments of ``riftco plot``."""
    p.add_argument("run", metavar="RUN", help="a run folder or its training_metadata.json")
    p.add_argument(
        "--out", default=None, metavar="DIR", help="folder for the pictures (default: RUN)"
    )


def run(args: argparse.Namespace, prog: str = "riftco plot") -> None:
    """Writes the pictures and prints their paths; a missing matplotlib or metadata is a
    ``RiftcoError`` with the next step."""
    meta = plotting.load_metadata(args.run)
    if args.out is not None:
        from riftco.training.stages import prepare_out_dir

        prepare_out_dir(args.out)
    written = plotting.write_plots(args.run, args.out)
    for path in written:
        print(path)
    if len(written) == 1:
        fail(
            f"wrote {written[0]} only: {args.run!r} has no per-step memory (stage "
            f"{stage_title(meta.get('stage', '?'))}, riftco {meta.get('riftco_version', '?')}); train it "
            "again with this version for memory.png"
        )
