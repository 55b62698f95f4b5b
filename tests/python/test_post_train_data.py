"""``riftco post-train --data FILE.jsonl`` (and ``riftco.load_example_corpus``): instruction and
chat rows are tokenized with the model's template, the loss on the answers — never trained on
as raw JSON text — and bad files are one clear error naming ``file:line``."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from test_cli import TINY_MODEL, TINY_TRAIN, one_error_line, riftco_cmd

import riftco
from riftco.instruct_corpus import answer_samples

CHAT: list[dict[str, Any]] = [
    {"messages": [{"role": "user", "content": "What does len do?"},
                  {"role": "assistant", "content": "It counts items."}]},
    {"messages": [{"role": "system", "content": "Be brief."},
                  {"role": "user", "content": "What is abs?"},
                  {"role": "assistant", "content": "The absolute value."}]},
    {"messages": [{"role": "user", "content": "A list method?"},
                  {"role": "assistant", "content": "append"}]},
    {"messages": [{"role": "user", "content": "sorted returns?"},
                  {"role": "assistant", "content": "A new list."}]},
]


def write_jsonl(path: Path, rows: Sequence[Mapping[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("base") / "pretrain"
    r = riftco_cmd(
        "pretrain", *TINY_MODEL, *TINY_TRAIN, "--seq-len", "128", "--steps", "3",
        "--no-plots", "--out", out,
    )
    assert r.returncode == 0, r.stderr
    return out


def trained_text(ids: np.ndarray, labels: np.ndarray) -> str:
    return bytes(int(t) for t, lab in zip(ids, labels, strict=True) if lab != -100).decode()


def test_chat_rows_train_on_the_assistant_turns_only(tmp_path: Path, base: Path) -> None:
    data = write_jsonl(tmp_path / "chat.jsonl", CHAT)
    examples, built = riftco.load_example_corpus([data], base, seq_len=128)
    assert len(examples) == 4 and built.n_truncated == built.n_skipped == 0
    for ids, labels, row in zip(examples.input_ids, examples.labels, CHAT, strict=True):
        answer = row["messages"][-1]["content"]
        # the default byte template: the answer and its end of turn, nothing of the prompt
        assert trained_text(ids, labels) == f"{answer}<|end|>\n"
        text = bytes(int(t) for t in ids).decode()
        assert text.endswith(f"<|assistant|>\n{answer}<|end|>\n"), text
    every = riftco.load_example_corpus([data], base, seq_len=128, train_on="all")[0]
    assert all((lab == ids).all() for ids, lab in zip(every.input_ids, every.labels, strict=True))


def test_prompt_completion_rows_end_with_the_end_of_turn(tmp_path: Path, base: Path) -> None:
    data = write_jsonl(
        tmp_path / "pc.jsonl",
        [{"prompt": "abs(-3) is ", "completion": "3"}, {"prompt": "2+2=", "completion": "4"}],
    )
    examples, _ = riftco.load_example_corpus([data], base, seq_len=128)
    assert [trained_text(i, lab) for i, lab in zip(examples.input_ids, examples.labels,
                                                   strict=True)] == ["3<|end|>\n", "4<|end|>\n"]


def test_post_train_trains_on_the_examples_exactly_as_python_does(
    tmp_path: Path, base: Path
) -> None:
    data = write_jsonl(tmp_path / "chat.jsonl", CHAT)
    out = tmp_path / "cli"
    r = riftco_cmd(
        "post-train", "--model", base, "--data", data, "--steps", "3", "--batch-size", "2",
        "--seq-len", "128", "--no-progress", "--no-plots", "--out", out,
    )
    assert r.returncode == 0, r.stderr
    assert "examples: 4 (messages rows of" in r.stderr, r.stderr
    meta = json.loads((out / riftco.METADATA_FILE).read_text())
    corpus = meta["corpus"]
    assert corpus["examples"] == 4 and corpus["target_tokens"] < corpus["tokens"], corpus
    # The same run from Python on riftco.load_example_corpus gives the same losses, bit for bit.
    examples, _ = riftco.load_example_corpus([data], base, seq_len=128)
    model = riftco.load_model(base)
    config = riftco.PostTrainingConfig(**meta["training_config"])
    again = riftco.run_post_training(
        model, config, examples, tmp_path / "py", progress=False, plots=False
    )
    assert again["losses"] == meta["losses"]


def test_jsonl_errors_name_file_and_line(tmp_path: Path, base: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(CHAT[0]) + "\n" + '{"messages": [{"role": "bot", "content": "x"}]}\n')
    one_error_line(
        riftco_cmd("post-train", "--model", base, "--data", bad, "--out", tmp_path / "o1"),
        f"{bad}:2", "unknown role 'bot'",
    )
    text = tmp_path / "notes.txt"
    text.write_text("plain text\n")
    one_error_line(
        riftco_cmd("post-train", "--model", base, "--data", bad, text, "--out", tmp_path / "o2"),
        "mixes instruction/chat files",
    )
    good = write_jsonl(tmp_path / "chat.jsonl", CHAT)
    one_error_line(
        riftco_cmd(
            "post-train", "--model", base, "--data", good, "--seq-len", "30", "--out",
            tmp_path / "o3",
        ),
        f"{good}:1", "more than --seq-len 30 + 1", "--overlong truncate or skip",
    )
    for o in ("o1", "o2", "o3"):
        assert not (tmp_path / o).exists()


def test_overlong_truncate_and_skip_are_counted(tmp_path: Path, base: Path) -> None:
    good = write_jsonl(tmp_path / "chat.jsonl", CHAT)
    r = riftco_cmd(
        "post-train", "--model", base, "--data", good, "--seq-len", "70", "--overlong", "skip",
        "--steps", "1", "--batch-size", "1", "--no-progress", "--no-plots",
        "--out", tmp_path / "skip",
    )
    assert r.returncode == 0, r.stderr
    assert "--overlong skip: 0 examples cut to 71 tokens, 2 left out" in r.stderr, r.stderr


def test_a_folder_mixing_json_and_text_is_refused(tmp_path: Path) -> None:
    folder = tmp_path / "data"
    folder.mkdir()
    write_jsonl(folder / "a.jsonl", CHAT)
    (folder / "b.txt").write_text("text")
    with pytest.raises(riftco.instruct.DatasetError, match="both .jsonl/.json files and other"):
        riftco.instruct_corpus.is_example_data([folder])
    (folder / "b.txt").unlink()
    assert riftco.instruct_corpus.is_example_data([folder])
    assert not riftco.instruct_corpus.is_example_data([tmp_path / "x.txt"])


def test_the_builtin_chat_data_is_questions_answered_by_docstrings() -> None:
    import inspect

    from riftco.stdlib_instructions import stdlib_instructions

    rows = stdlib_instructions()
    assert len(rows) >= 300, len(rows)
    assert rows == stdlib_instructions()  # deterministic
    by_question = {r["messages"][0]["content"]: r["messages"][1]["content"] for r in rows}
    # A known answer, checked against the interpreter's own docstring.
    from riftco.data.stdlib_instructions import _QUESTIONS

    question = next(q for q in (t.format(name="len()") for t in _QUESTIONS) if q in by_question)
    doc = inspect.getdoc(len)
    assert doc is not None
    assert by_question[question] == " ".join(doc.split("\n\n")[0].split())
    assert all(a and len(a) <= 300 for a in by_question.values())
    assert len(by_question) == len(rows)  # no question twice


def test_post_train_data_format_chat_saves_answers_to_held_out_prompts(
    tmp_path: Path, base: Path
) -> None:
    out = tmp_path / "chat"
    r = riftco_cmd(
        "post-train", "--model", base, "--data-format", "chat", *TINY_TRAIN[:2], "--seq-len",
        "128", "--steps", "2", "--sample-tokens", "8", "--no-plots", "--out", out,
    )
    assert r.returncode == 0, r.stderr
    assert "messages rows of riftco.stdlib_instructions" in r.stderr, r.stderr
    assert "left out" in r.stderr  # rows longer than 129 tokens are skipped, counted
    samples = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert [s["when"] for s in samples] == ["before"] * 3 + ["after"] * 3
    for s in samples:
        assert s["prompt"].startswith("<|user|>\n") and s["prompt"].endswith("<|assistant|>\n")
        assert s["reference"] and "<|end|>" not in s["reference"]
    text = tmp_path / "notes.txt"
    text.write_text("plain text\n")
    one_error_line(
        riftco_cmd("post-train", "--model", base, "--data-format", "chat", "--data", text,
                   "--out", tmp_path / "o"),
        "--data-format chat needs .jsonl/.json files",
    )


def test_generate_chat_renders_the_template_and_prints_the_answer(base: Path) -> None:
    r = riftco_cmd("generate", "--model", base, "--chat", "--system", "Be brief.",
                   "--temperature", "0", "--sample-tokens", "40", "What does len() do?")
    assert r.returncode == 0, r.stderr
    # The reference: the default byte template rendered by hand, greedy bytes, cut at <|end|>.
    prompt = b"<|system|>\nBe brief.<|end|>\n<|user|>\nWhat does len() do?<|end|>\n<|assistant|>\n"
    text = riftco.generate(riftco.load_model(base), prompt, 40, temperature=0.0).decode(
        "utf-8", errors="replace"
    )
    assert r.stdout == text.split("<|end|>")[0] + "\n"
    one_error_line(riftco_cmd("generate", "--model", base, "--system", "x", "a"),
                   "--system needs --chat")


def test_reference_answers_stop_before_the_end_of_turn_id_as_generation_does() -> None:
    # Targets: answer ids 7 8, then the end-of-turn id 5 and a newline id 9 (ChatML's
    # "<|im_end|>\n"): the reference is the answer alone, as a generated answer stops before 5.
    cfg = riftco.TransformerConfig(vocab_size=16, d_model=16, n_heads=2, n_layers=1, d_ff=32,
                                   max_seq_len=32, seed=0, eos_token_ids=[5])
    model = riftco.DecoderOnlyTransformer(cfg)
    ids = np.array([1, 2, 3, 7, 8, 5, 9], dtype=np.int64)
    labels = np.array([-100, -100, -100, 7, 8, 5, 9], dtype=np.int64)
    examples = riftco.ExampleCorpus((ids,), (labels,), "one example")

    class Digits:
        def decode(self, ids: list[int]) -> str:
            return " ".join(str(i) for i in ids)

    [sample] = answer_samples(model, examples, count=1, max_new_tokens=4, tokenizer=Digits(),
                              stop=None, temperature=0.0)
    assert sample["prompt"] == "1 2 3"
    assert sample["reference"] == "7 8"
    assert "5" not in sample["generated"].split()
