"""Instruction and chat files as a post-training corpus: JSON Lines / JSON rows
(:func:`riftco.data.instruct.load_rows`), tokenized with a model folder's tokenizer and chat
template (:func:`riftco.data.instruct.build_examples`) into an :class:`riftco.ExampleCorpus` that
:func:`riftco.run_post_training` trains on with the loss on the answers.

This is what ``riftco post-train --data train.jsonl`` does; the same from Python::

    examples, built = riftco.load_example_corpus(["train.jsonl"], "runs/pretrain", seq_len=256)
    riftco.run_post_training(model, config, examples, "runs/chat")
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from riftco.data.chat_template import ChatTemplate, default_chat_template, load_chat_template
from riftco.data.text import decode_bytes
from riftco.data.examples import ExampleCorpus
from riftco.data.instruct import (
    IGNORE_INDEX,
    DatasetError,
    ExampleSet,
    MessagesRow,
    PromptCompletionRow,
    Row,
    TextRow,
    _rows_of,
    build_examples,
    load_rows,
)

__all__ = [
    "EXAMPLE_SUFFIXES",
    "RowObjects",
    "answer_samples",
    "is_example_data",
    "load_example_corpus",
    "rows_from_objects",
]

EXAMPLE_SUFFIXES = (".jsonl", ".json")
"""File suffixes read as instruction/chat rows rather than as text."""

DEFAULT_BYTE_EOS = "<|end|>\n"
"""The end of a prompt/completion row for a model without an ``eos_token``: the default chat
template's end of turn, so both row shapes teach the model one way to stop."""


def _json_files_in(folder: Path) -> tuple[bool, bool]:
    """Whether ``folder`` holds (recursively) files with and files without a JSON suffix."""
    has_json = has_other = False
    for root, dirs, files in os.walk(folder):
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        for name in files:
            if name.startswith("."):
                continue
            if Path(name).suffix in EXAMPLE_SUFFIXES:
                has_json = True
            else:
                has_other = True
            if has_json and has_other:
                return True, True
    return has_json, has_other


def is_example_data(paths: Sequence[str | os.PathLike[str]]) -> bool:
    """Whether ``paths`` are instruction/chat data (``.jsonl``/``.json`` files, or folders of
    them) rather than text read byte for byte.

    Raises:
        DatasetError: JSON files mixed with text files (given, or inside a folder), naming the
            first of each: a JSON file trained as text would learn braces and quotes, and text
            cannot be read as rows.
    """
    json_paths: list[str] = []
    text_paths: list[str] = []
    for p in paths:
        path = Path(p)
        if path.is_dir():
            has_json, has_other = _json_files_in(path)
            if has_json and has_other:
                raise DatasetError(
                    f"{str(path)!r} holds both .jsonl/.json files and other files: give the "
                    "instruction/chat files (or a folder of only them) or the text, not both"
                )
            (json_paths if has_json else text_paths).append(str(path))
        else:
            (json_paths if path.suffix in EXAMPLE_SUFFIXES else text_paths).append(str(path))
    if json_paths and text_paths:
        raise DatasetError(
            f"--data mixes instruction/chat files ({json_paths[0]!r}) with text "
            f"({text_paths[0]!r}): train on one kind per run"
        )
    return bool(json_paths)


def _shapes(rows: Sequence[Any]) -> str:
    kinds = {TextRow: "text", PromptCompletionRow: "prompt/completion", MessagesRow: "messages"}
    seen = [name for cls, name in kinds.items() if any(isinstance(r, cls) for r in rows)]
    return ", ".join(seen)


@dataclass(frozen=True)
class RowObjects:
    """Rows held in memory (dicts shaped as the rows of a ``.jsonl`` file), named ``name`` in
    errors (``name[index]``) and in the corpus description."""

    rows: Sequence[Any]
    name: str


def rows_from_objects(objects: Sequence[Any], name: str) -> list[Row]:
    """Rows from dicts shaped as JSON rows, checked as :func:`riftco.data.instruct.load_rows` checks
    a file's (errors name ``name[index]``).

    Raises:
        DatasetError: as :func:`riftco.data.instruct.load_rows`, and for no rows.
    """
    rows = _rows_of(objects, name)
    if not rows:
        raise DatasetError(f"{name}: no rows (expected at least one)")
    return rows


def load_example_corpus(
    paths: Sequence[str | os.PathLike[str]] | RowObjects,
    model_folder: str | os.PathLike[str] | None,
    *,
    seq_len: int,
    tokenizer: Any = None,
    vocab_size: int | None = None,
    chat_template: ChatTemplate | None = None,
    train_on: Literal["answers", "all"] = "answers",
    overlong: Literal["error", "truncate", "skip"] = "error",
) -> tuple[ExampleCorpus, ExampleSet]:
    """Rows of ``paths`` tokenized into an :class:`~riftco.ExampleCorpus` of examples of at
    most ``seq_len + 1`` tokens (a training row of ``seq_len`` inputs and its shifted targets).

    Args:
        paths: ``.jsonl``/``.json`` files or folders of them (see
            :func:`riftco.data.instruct.load_rows`), or :class:`RowObjects` (e.g.
            ``RowObjects(riftco.data.stdlib_instructions.stdlib_instructions(), "stdlib")``).
        model_folder: the model's folder; its chat template (``chat_template.jinja`` or
            ``tokenizer_config.json``) renders ``messages`` rows, and its ``bos_token`` /
            ``eos_token`` frame prompt/completion and text rows. ``None``, or a folder without a
            template: :func:`riftco.data.chat_template.default_chat_template`, and rows end with
            :data:`DEFAULT_BYTE_EOS`.
        seq_len: the training sequence length.
        tokenizer: ``None`` for byte tokens, else the folder's tokenizer (see
            :func:`riftco.data.instruct.build_examples`).
        vocab_size: the model's vocabulary size; every id must be below it.
        chat_template: overrides the folder's template.
        train_on: ``"answers"`` (completions and assistant turns, end of turn included) or
            ``"all"``.
        overlong: an example longer than ``seq_len + 1`` tokens is an ``"error"``, or is
            ``"truncate"``-d or ``"skip"``-ped (counted in the returned set).

    Returns:
        The corpus and the :class:`~riftco.data.instruct.ExampleSet` it came from (its
        ``n_truncated`` and ``n_skipped`` counts, for the log).

    Raises:
        DatasetError: bad rows (naming ``file:line``), an over-long example with
            ``overlong="error"``, a bad ``seq_len``.
        ChatTemplateError, TokenError, ImportError: as :func:`riftco.data.instruct.build_examples`.
    """
    if isinstance(seq_len, bool) or not isinstance(seq_len, int) or seq_len < 1:
        raise DatasetError(f"seq_len must be a positive integer, got {seq_len!r}")
    if isinstance(paths, RowObjects):
        rows = rows_from_objects(paths.rows, paths.name)
        where = paths.name
    else:
        rows = load_rows(list(paths))
        where = ", ".join(str(p) for p in paths)
    template = chat_template
    if template is None and model_folder is not None:
        template = load_chat_template(model_folder)
    bos: str | None
    eos: str | None
    if template is None:
        template = default_chat_template()
        bos, eos = None, DEFAULT_BYTE_EOS
    else:
        bos, eos = template.bos_token, template.eos_token
    built = build_examples(
        rows,
        tokenizer,
        max_len=seq_len + 1,
        chat_template=template,
        bos_token=bos,
        eos_token=eos,
        train_on=train_on,
        overlong=overlong,
        vocab_size=vocab_size,
    )
    files = tuple(dict.fromkeys(e.source.rsplit(":", 1)[0].split("[", 1)[0] for e in built.examples))
    description = (
        f"{_shapes(rows)} rows of {where}; {template.name}; loss on {train_on}"
    )
    corpus = ExampleCorpus(
        tuple(e.input_ids for e in built.examples),
        tuple(e.labels for e in built.examples),
        description,
        files,
    )
    return corpus, built


def answer_samples(
    model: Any,
    examples: ExampleCorpus,
    *,
    count: int = 3,
    max_new_tokens: int = 64,
    tokenizer: Any = None,
    stop: str | None = "<|end|>",
    temperature: float = 1.0,
    top_k: int | None = None,
    seed: int = 0,
) -> list[dict[str, str]]:
    """Answers the model generates to the first ``count`` examples' prompts: each example's
    tokens before its first target (the rendered conversation up to the assistant's turn, the
    template's generation prompt included), continued by
    :func:`riftco.data.hf_tokenizer.generate_ids` and cut at ``stop`` (the default byte
    template's end of turn; a tokenizer's EOS id already stops generation). The reference answer (the example's targets) is cut the same way, before
    its first id in ``model.eos_token_ids`` and at ``stop``.

    Returns:
        ``{"prompt", "reference", "generated"}`` per example, decoded text (bytes decoded as
        UTF-8 with replacement for a byte-token model).
    """
    from riftco.data.hf_tokenizer import generate_ids

    def decode(ids: Sequence[int]) -> str:
        if tokenizer is None:
            return decode_bytes(bytes(int(i) for i in ids))
        return str(tokenizer.decode([int(i) for i in ids]))

    def answer(ids: Sequence[int]) -> str:
        text = decode(ids)
        return text.split(stop, 1)[0] if stop else text

    def until_eos(ids: Sequence[int]) -> list[int]:
        # Generation stops before an end-of-sequence id: the reference is cut there too.
        eos = frozenset(int(i) for i in model.eos_token_ids)
        ids = [int(i) for i in ids]
        return next((ids[:k] for k, i in enumerate(ids) if i in eos), ids)

    out = []
    max_seq_len = int(model.config.max_seq_len)
    for ids, labels in list(zip(examples.input_ids, examples.labels, strict=True))[:count]:
        targets = np.flatnonzero(np.asarray(labels)[1:] != IGNORE_INDEX) + 1
        prompt = [int(t) for t in ids[: targets[0]]]
        room = max(0, min(max_new_tokens, max_seq_len - len(prompt) + 1))
        new = generate_ids(model, prompt, room, temperature=temperature, top_k=top_k, seed=seed)
        text = answer(new)
        reference = answer(until_eos(np.asarray(ids)[targets].tolist()))
        out.append({"prompt": decode(prompt), "reference": reference, "generated": text})
    return out
