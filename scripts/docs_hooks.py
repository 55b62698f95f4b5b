"""MkDocs hook: the benchmark pictures live in ``benches/results/`` beside the data they are drawn
from (the benches write them there); the site serves them as ``results/<name>.png`` instead of
keeping a second copy under ``docs/``. The pages link them as ``../benches/results/<name>.png``,
which resolves when the Markdown is read in the repository (e.g. on GitHub); the hook rewrites
that prefix to ``results/`` for the site."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

RESULTS = Path(__file__).resolve().parent.parent / "benches" / "results"


def on_files(files: Files, config: Any) -> Files:
    for picture in sorted(RESULTS.glob("*.png")):
        files.append(
            File.generated(config, f"results/{picture.name}", abs_src_path=str(picture))
        )
    return files


REPOSITORY_PREFIX = "](../benches/results/"


def on_page_markdown(markdown: str, page: Any, config: Any, files: Files) -> str:
    return markdown.replace(REPOSITORY_PREFIX, "](results/")
