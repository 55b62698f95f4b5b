"""The documentation is tested like code.

- Every ```python block of README.md and docs/**/*.md runs, in page order, the blocks of one page
  sharing one namespace (a later block may use what an earlier one defined), in a fresh working
  folder so that what a block writes (``runs/...``) lands there, not in the repository.
- A block preceded by ``<!-- docs-test: skip REASON -->`` is skipped with that reason (a long run,
  a GPU), and one preceded by ``<!-- docs-test: needs MODULE -->`` is skipped when MODULE is not
  installed: nothing is left untested silently, the skip and its reason show in pytest's summary.
- The site builds with ``mkdocs build --strict`` (broken links, anchors, API references and nav
  entries fail it) when the ``docs`` extra is installed; the test command installs it.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]

FENCE = re.compile(r"^(?P<indent> *)```(?P<info>[^\n`]*)$")
DIRECTIVE = re.compile(r"^\s*<!--\s*docs-test:\s*(?P<verb>skip|needs)\s+(?P<arg>.*?)\s*-->\s*$")


@dataclass(frozen=True)
class Block:
    page: Path
    line: int  # 1-based line of the opening fence
    code: str
    skip: str | None
    needs: str | None

    @property
    def name(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def blocks_of(page: Path) -> list[Block]:
    """The fenced blocks of a Markdown page whose info string is ``python`` (``py``), with the
    docs-test directive of the line before each (blank lines between are allowed)."""
    lines = page.read_text(encoding="utf-8").split("\n")
    found: list[Block] = []
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, info = len(m["indent"]), m["info"].strip()
        end = i + 1
        while end < len(lines) and lines[end].strip() != "```":
            end += 1
        if end == len(lines):
            raise AssertionError(f"{page.relative_to(ROOT)}:{i + 1}: a code fence is never closed")
        language = info.split()[0].lower() if info else ""
        if language in ("python", "py"):
            skip = needs = None
            j = i - 1
            while j >= 0 and not lines[j].strip():
                j -= 1
            directive = DIRECTIVE.match(lines[j]) if j >= 0 else None
            if directive:
                if directive["verb"] == "skip":
                    skip = directive["arg"]
                else:
                    needs = directive["arg"]
            code = "\n".join(line[indent:] for line in lines[i + 1 : end])
            found.append(Block(page, i + 1, code, skip, needs))
        i = end + 1
    return found


BLOCKS = [block for page in PAGES for block in blocks_of(page)]
NAMESPACES: dict[Path, dict[str, Any]] = {}


def test_the_pages_have_python_blocks() -> None:
    # The collector would pass vacuously if it found nothing (a changed fence style, a moved
    # folder): the README's first example and the PyTorch page's must be among the blocks.
    names = {block.page.name for block in BLOCKS}
    assert {"README.md", "pytorch.md"} <= names, names


@pytest.mark.parametrize("block", BLOCKS, ids=[block.name for block in BLOCKS])
def test_code_block(block: Block, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if block.skip is not None:
        pytest.skip(block.skip)
    if block.needs is not None and importlib.util.find_spec(block.needs) is None:
        pytest.skip(f"needs the optional package {block.needs!r}, which is not installed")
    namespace = NAMESPACES.setdefault(block.page, {"__name__": f"docs:{block.page.name}"})
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("RIFTCO_NUM_THREADS", os.environ.get("RIFTCO_NUM_THREADS", "2"))
    exec(compile(block.code, block.name, "exec"), namespace)  # noqa: S102 (the docs' own code)


def test_site_builds_strict(tmp_path: Path) -> None:
    mkdocs = shutil.which("mkdocs", path=str(Path(sys.executable).parent))
    if mkdocs is None or importlib.util.find_spec("mkdocstrings_handlers") is None:
        reason = "the docs extra (mkdocs, mkdocs-material, mkdocstrings) is not installed"
        if os.environ.get("CI") == "true":
            pytest.fail(f"{reason}, and CI=true: scripts/setup.sh installs it")
        pytest.skip(reason)
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    result = subprocess.run(
        [mkdocs, "build", "--strict", "--quiet", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    home = (tmp_path / "site" / "index.html").read_text(encoding="utf-8")
    assert "riftco" in home
    api = (tmp_path / "site" / "api" / "model" / "index.html").read_text(encoding="utf-8")
    # The API reference is generated: the model class and a documented method are there.
    assert "DecoderOnlyTransformer" in api and "activation_checkpointing_plan" in api


LINK = re.compile(r"\]\((?P<target>[^)\s]+)\)")


def slug(heading: str) -> str:
    """Python-Markdown's ``toc`` anchor of a heading (its default ``slugify``)."""
    text = re.sub(r"[^\w\s-]", "", heading.replace("`", "")).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def test_readme_links_resolve() -> None:
    # mkdocs --strict checks the site's own links; the README is not part of the site, so its
    # links into docs/ (files and #anchors) and to repository files are checked here.
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    checked = 0
    for match in LINK.finditer(readme):
        target = match["target"]
        if re.match(r"[a-z]+:", target):
            continue  # http(s), mailto
        path, _, anchor = target.partition("#")
        file = ROOT / path
        assert file.exists(), f"README.md links to {target!r}: no such file"
        if anchor:
            headings = re.findall(r"^#+ (.+)$", file.read_text(encoding="utf-8"), re.MULTILINE)
            assert anchor in {slug(h) for h in headings}, f"README.md: no heading #{anchor} in {path}"
        checked += 1
    assert checked >= 10, checked


def test_getting_started_names_the_extras_the_setup_installs() -> None:
    setup = (ROOT / "scripts" / "setup.sh").read_text(encoding="utf-8")
    extras = re.search(r"^EXTRAS=(\S+)$", setup, re.M)
    assert extras is not None, "scripts/setup.sh: no EXTRAS= line"
    page = (ROOT / "docs" / "getting-started.md").read_text(encoding="utf-8")
    assert f"--extras {extras.group(1)}`" in page, extras.group(1)
