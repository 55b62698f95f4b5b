"""Every command of README.md's shell blocks (```bash) runs and exits 0, in the README's order,
as a new user would type them into a fresh clone. Slow: about 4 minutes (247 s on the 2-core
development VM, 2026-12-06, load about 2: the main job 103 s, the 600-step data-parallel run
97 s, `riftco pretrain --steps 100` 30 s, the rest 16 s).

- The commands are read from README.md at test time, so the test follows the README: each
  non-empty line of a ```bash block that is not a comment is one command (a trailing ``\\`` joins
  the next line; a trailing ``# comment`` is removed).
- ``bash scripts/test.sh`` is not run: it is the test command, which runs this test (recursion).
  The test asserts that the README still has it, so that a rename cannot silently run it.
- The working folder is a fresh temporary one that looks like a clone: a symbolic link to each
  tracked top-level entry of the repository (``scripts``, ``examples``, ``python``, ...) and to
  its ``.venv``. What the commands write (``runs/...``) lands there, not in the repository, and
  a later command reads what an earlier one wrote (``--model runs/mine``), as for the user.
  ``scripts/main.sh`` finds the repository from its own path (``cd scripts/..``, a logical
  path: the temporary folder), hence the links to ``examples`` and ``.venv``.
- ``RIFTCO_SKIP_SETUP=1``: ``scripts/main.sh`` then does not run ``scripts/setup.sh``. The
  tests run in a ``.venv`` that is set up already, and the set-up itself is tested by the test
  command (scripts/test.sh, which CI runs) running it first; a stale Rust input would otherwise
  start a release build inside the test.
- ``.venv/bin/mpiexec`` is required, not skipped when missing: the set-up installs the ``mpi``
  extra (scripts/setup.sh's EXTRAS), which brings it.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"

# The test command itself: running it here would run this test again.
TEST_COMMAND = "bash scripts/test.sh"
# Per command. The main job takes 1 to 2 minutes on 2 cores, the data-parallel line (600 steps,
# 2 processes) about as long; a loaded host can double that.
TIMEOUT_S = 900
# Shell blocks whose lines are commands (not ```console, whose lines carry prompts and output).
SHELL_INFOS = frozenset({"bash", "sh", "shell"})

FENCE = re.compile(r"^(?P<indent> *)```(?P<info>[^`]*)$")

pytestmark = pytest.mark.skipif(
    not (ROOT / ".venv" / "bin" / "python").exists(),
    reason="the README's commands run the repository's .venv, which does not exist here",
)


@dataclass(frozen=True)
class Command:
    line: int  # 1-based line of README.md where the command starts
    text: str

    def __str__(self) -> str:
        return f"README.md:{self.line}: {self.text}"


def strip_comment(line: str) -> str:
    """``line`` without a trailing shell comment: from the first ``#`` that is outside quotes and
    at the start of the line or after whitespace (``a#b``, ``"# x"``, ``'# x'`` and ``\\#`` are
    not comments)."""
    single = double = escaped = False
    for i, c in enumerate(line):
        if escaped:
            escaped = False
        elif c == "\\" and not single:
            escaped = True
        elif c == "'" and not double:
            single = not single
        elif c == '"' and not single:
            double = not double
        elif c == "#" and not single and not double and (i == 0 or line[i - 1].isspace()):
            return line[:i].rstrip()
    return line.rstrip()


def shell_commands(markdown: str) -> list[Command]:
    """The commands of the shell blocks of a Markdown text, in order."""
    lines = markdown.split("\n")
    commands: list[Command] = []
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        info = m["info"].split()
        is_shell = bool(info) and info[0] in SHELL_INFOS
        indent = len(m["indent"])
        i += 1
        pending: list[str] = []
        start = 0
        while i < len(lines) and lines[i].strip() != "```":
            if is_shell:
                body = lines[i][indent:] if lines[i][:indent].isspace() else lines[i].lstrip()
                text = strip_comment(body).strip()
                if text and not pending:
                    start = i + 1
                if text.endswith("\\"):  # continued on the next line
                    pending.append(text[:-1].rstrip())
                elif text or pending:
                    pending.append(text)
                    commands.append(Command(start, " ".join(p for p in pending if p)))
                    pending = []
            i += 1
        assert not pending, f"README.md:{start}: a command ends its block with a backslash"
        i += 1  # the closing fence
    return commands


def test_strip_comment() -> None:
    assert strip_comment("bash scripts/main.sh   # set up .venv") == "bash scripts/main.sh"
    assert strip_comment("# a comment") == ""
    assert strip_comment("echo a#b") == "echo a#b"
    assert strip_comment("echo '# x' # y") == "echo '# x'"
    assert strip_comment('echo "a # x" # y') == 'echo "a # x"'
    assert strip_comment("echo \\# x") == "echo \\# x"
    assert strip_comment("echo \"it's\" # y") == "echo \"it's\""


def test_shell_commands() -> None:
    text = "\n".join(
        [
            "```bash",
            "# a comment",
            "a 1   # first",
            "",
            "b \\",
            "  --x  # flag",
            "```",
            "```python",
            "print(1)",
            "```",
            "  ```sh",
            "  c",
            "  ```",
            "```console",
            "$ d",
            "```",
        ]
    )
    assert shell_commands(text) == [
        Command(3, "a 1"),
        Command(5, "b --x"),
        Command(12, "c"),
    ]


def clone_like_folder(dest: Path) -> None:
    """Fills ``dest`` with a symbolic link to each tracked top-level entry of the repository and
    to its ``.venv``: the layout of a clone after the set-up, without its build outputs."""
    try:
        tracked = subprocess.run(
            ["git", "-C", str(ROOT), "ls-files", "-z"],
            capture_output=True, text=True, check=True, timeout=60,
        ).stdout.split("\0")  # fmt: skip
        names = {p.split("/", 1)[0] for p in tracked if p}
    except (OSError, subprocess.SubprocessError):  # not a git checkout: all but outputs
        names = {p.name for p in ROOT.iterdir()} - {".git", "runs", "target", "out", "dist"}
    names.add(".venv")
    for name in sorted(names):
        if (ROOT / name).exists():
            (dest / name).symlink_to(ROOT / name)


def run(command: Command, cwd: Path, env: dict[str, str]) -> tuple[int, str, str, float]:
    """Runs ``command`` with ``bash -c`` in ``cwd``: its exit status, stdout, stderr and seconds.
    On a timeout the whole process group (mpiexec and its ranks) is killed and the status is
    -1."""
    t0 = time.monotonic()
    proc = subprocess.Popen(
        ["bash", "-c", command.text],
        cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    try:
        out, err = proc.communicate(timeout=TIMEOUT_S)
        rc = proc.returncode
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        err += f"\n[test] killed after the {TIMEOUT_S} s timeout"
        rc = -1
    return rc, out, err, time.monotonic() - t0


def tail(text: str, lines: int = 40) -> str:
    return "\n".join(text.rstrip().split("\n")[-lines:])


def test_readme_commands_run_in_a_fresh_clone(tmp_path: Path) -> None:
    commands = shell_commands(README.read_text(encoding="utf-8"))
    assert commands, "README.md has no ```bash block"
    skipped = [c for c in commands if c.text == TEST_COMMAND]
    assert skipped, (
        f"README.md no longer has `{TEST_COMMAND}`, which this test skips (it is the test "
        "command, which runs this test): update TEST_COMMAND"
    )
    to_run = [c for c in commands if c.text != TEST_COMMAND]

    clone = tmp_path / "clone"
    clone.mkdir()
    clone_like_folder(clone)
    # RIFTCO_SKIP_SETUP: see the module's docstring.
    env = dict(os.environ, RIFTCO_SKIP_SETUP="1")

    timings: list[str] = []
    for command in to_run:
        rc, out, err, seconds = run(command, clone, env)
        timings.append(f"{seconds:7.1f} s  {command}")
        assert rc == 0, (
            f"{command}\nexited {rc} after {seconds:.1f} s (in {clone}); "
            f"the last lines of its stderr:\n{tail(err)}\nof its stdout:\n{tail(out, 10)}"
        )
    print("\n".join(["README commands (skipped: the test command itself):", *timings]))
    check_main_job_figures(clone / "runs" / "pretrain" / "training_metadata.json")


RUNS_PAGE = ROOT / "docs" / "runs.md"


def check_main_job_figures(metadata_path: Path) -> None:
    """docs/runs.md quotes the main job's memory (exact byte counts, the same on every host and
    SIMD level): the figures must be this run's."""
    import json

    meta = json.loads(metadata_path.read_text(encoding="utf-8"))
    per_step = meta["memory_per_step"]

    def mib(n: int) -> str:
        return f"{n / 2**20:.1f}"

    page = " ".join(RUNS_PAGE.read_text(encoding="utf-8").split())
    want = {
        "every step's total peaks at the same {} MiB": mib(max(per_step["total"])),
        "{} MiB of activations": mib(max(per_step["activation"])),
        "{} MiB of gradients": mib(max(per_step["gradient"])),
        "{} MiB of Adam moments": mib(max(per_step["optimizer_state"])),
        "{} MiB of parameters": mib(max(per_step["parameter"])),
        "{} MiB of workspace": mib(max(per_step["workspace"])),
        "the buffer pool keeps {} MiB": mib(max(per_step["cached"])),
    }
    assert len(set(per_step["total"])) == 1, "the text says every step peaks at the same total"
    for template, value in want.items():
        pattern = re.escape(template).replace(r"\{\}", r"([0-9.]+)")
        found = re.search(pattern, page)
        assert found is not None, f"docs/runs.md no longer says {template!r}"
        quoted = template.format(found.group(1))
        assert found.group(1) == value, f"docs/runs.md: {quoted!r}; the main job: {value}"
