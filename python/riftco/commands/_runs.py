"""What the training subcommands share: the corpus line, the corpus check with the flags'
names, and the guard that keeps a run from silently replacing another configuration's run."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, NoReturn

from riftco.commands.arguments import fail
from riftco.data.examples import ExampleCorpus
from riftco.data.text import Corpus, CorpusError, check_corpus_fits
from riftco.training.run_folder import unfinished_step
from riftco.training.run_records import stage_title
from riftco.training.stages import ADAPTER_DIR, METADATA_FILE, MODEL_STATE_FILE

__all__ = [
    "check_corpus",
    "check_examples",
    "activation_peak",
    "check_run_folder",
    "log_later",
    "print_later",
    "corpus_line",
    "examples_line",
    "log",
    "stage_log",
]

# Settings that change how often a run reports or saves, not what it computes.
_REPORTING_KEYS = frozenset({"log_every", "save_every", "eval_every"})


# Lines held back by log_later / print_later: (True for stdout, the line).
_pending: list[tuple[bool, str]] = []


def log(line: str) -> None:
    """A progress line on stderr (after the lines :func:`log_later` and :func:`print_later`
    hold back)."""
    for to_stdout, held in _pending:
        print(held, file=sys.stdout if to_stdout else sys.stderr, flush=True)
    _pending.clear()
    print(line, file=sys.stderr, flush=True)


def log_later(line: str) -> None:
    """A progress line that describes the run (its data, its model), printed before the stage's
    first line: a run refused by the stage's own checks (a folder or a resume that does not
    fit) then reports one error line, with nothing before it."""
    _pending.append((False, line))


def print_later(line: str) -> None:
    """Like :func:`log_later`, for a line of the command's output on stdout (a sample taken
    before training)."""
    _pending.append((True, line))


def activation_peak(metadata: dict[str, Any]) -> str:
    """``peak activation X MiB`` of the steps this command ran: after a resume, the steps since
    it (the earlier ones may have run under another checkpointing policy), said so."""
    resumes = metadata.get("resumes") or []
    per_step = (metadata.get("memory_per_step") or {}).get("activation") or []
    if resumes and len(per_step) > int(resumes[-1]["step"]):
        since = int(resumes[-1]["step"])
        peak_mib = max(per_step[since:]) / 2**20
        return f"peak activation {peak_mib:.1f} MiB (steps after the resume at {since})"
    return f"peak activation {metadata['peak_memory_bytes'].get('activation', 0) / 2**20:.1f} MiB"


def stage_log(line: str) -> None:
    """``log`` for a stage run by a command: the stage's closing summary (``... done: final
    loss ...``) is left out, since the command prints its own, fuller one on stdout."""
    if " done: final loss " not in line:
        log(line)


def corpus_line(corpus: Corpus, validation_fraction: float, unit: str = "bytes") -> str:
    """``corpus: N UNIT in K parts (...): T for training, V held out for validation``, with
    ``unit`` ``"bytes"`` for byte-level text or ``"tokens"`` for a tokenizer's ids."""
    train, val = corpus.split(validation_fraction)
    files = len(corpus.files)
    return (
        f"corpus: {len(corpus):,} {unit} in {files} {'part' if files == 1 else 'parts'} "
        f"({corpus.description}): {train.shape[0]:,} for training, {val.shape[0]:,} held out "
        "for validation"
    )


def check_corpus(corpus: Corpus, seq_len: int, validation_fraction: float) -> None:
    """:func:`riftco.data.text.check_corpus_fits` naming ``--seq-len`` and ``--data``."""
    try:
        check_corpus_fits(
            corpus, seq_len, validation_fraction, seq_len_name="--seq-len", data_name="--data"
        )
    except CorpusError as e:
        fail(str(e))


def examples_line(examples: ExampleCorpus, validation_fraction: float) -> str:
    """``examples: N (...), T tokens of which A are trained: K for training, V held out``."""
    train, val = examples.split(validation_fraction)
    return (
        f"examples: {len(examples):,} ({examples.description}), {examples.n_tokens:,} tokens "
        f"of which {examples.n_target_tokens:,} are targets: {len(train):,} for training, "
        f"{len(val):,} held out for validation"
    )


def check_examples(examples: ExampleCorpus, validation_fraction: float) -> None:
    """At least one example to train on and one to hold out, naming ``--data``."""
    try:
        examples.split(validation_fraction)
    except CorpusError as e:
        fail(f"--data: {e}")


def _normalized(value: Any) -> Any:
    return json.loads(json.dumps(value, sort_keys=True))


def _differences(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """``key old -> new`` for the keys both dicts have (nested one level), reporting keys
    skipped; a key only one side has (a newer riftco's field) is not a difference."""
    out: list[str] = []
    for key in sorted(set(old) & set(new)):
        a, b = old[key], new[key]
        if isinstance(a, dict) and isinstance(b, dict):
            for sub in sorted(set(a) & set(b) - _REPORTING_KEYS):
                if a[sub] != b[sub]:
                    out.append(f"{sub} {a[sub]!r} -> {b[sub]!r}")
        elif a != b:
            out.append(f"{key} {a!r} -> {b!r}")
    return out


def check_run_folder(out: str | Path, configuration: dict[str, Any], overwrite: bool) -> None:
    """Refuses (``UsageError``) to write into ``out`` when it holds another configuration's run,
    unless ``overwrite``, and one holding an unfinished run (checkpoints but no completed
    ``training_metadata.json``) whatever its configuration: it would be restarted from step 0
    and its checkpoints replaced.

    ``configuration`` holds the metadata entries that define the run (``stage``,
    ``model_config``, ``training_config``, ``corpus`` description, ``base_model``). A folder
    whose ``training_metadata.json`` records the same values (reporting settings such as
    ``log_every`` aside) is the same run again and may be replaced; a folder with model files
    but no readable metadata is refused too. A missing or empty folder is always fine.
    """
    if overwrite:
        return
    path = Path(out)
    step = unfinished_step(path)
    meta_path = path / METADATA_FILE
    state = [p for p in (MODEL_STATE_FILE, ADAPTER_DIR) if (path / p).exists()]
    hint = "pass --overwrite to replace it, or --out with another folder"
    if step is not None and not meta_path.is_file():
        _refuse_unfinished(path, step)
    if not meta_path.is_file():
        if state:
            fail(f"{str(path)!r} holds {' and '.join(state)} but no {METADATA_FILE}; {hint}")
        return
    try:
        old = json.loads(meta_path.read_bytes())
    except (OSError, ValueError) as e:
        fail(f"{str(meta_path)!r} cannot be read ({e}); {hint}")
    if not isinstance(old, dict):
        fail(f"{str(meta_path)!r} is not a run's metadata; {hint}")
    new = _normalized(configuration)
    old_conf = {k: old[k] for k in new if k in old}
    if "corpus" in old_conf and isinstance(old_conf["corpus"], dict):
        old_conf["corpus"] = old_conf["corpus"].get("description")
    diffs = _differences(old_conf, new)
    title = stage_title(old.get("stage", "training"))
    if diffs:
        shown = ", ".join(diffs[:4]) + (f" and {len(diffs) - 4} more" if len(diffs) > 4 else "")
        what = f"a {title} run" if step is None else (
            f"an unfinished {title} run (last checkpoint at step {step})"
        )
        fail(f"{str(path)!r} holds {what} of another configuration ({shown}); {hint}")
    if step is not None:
        _refuse_unfinished(path, step)


def _refuse_unfinished(path: Path, step: int) -> NoReturn:
    """The one error line for a folder holding an unfinished run of the same configuration."""
    fail(
        f"{str(path)!r} holds an unfinished run (last checkpoint at step {step}); run the same "
        "command with --resume to continue it, or with --overwrite to start it again from step 0"
    )
