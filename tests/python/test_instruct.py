"""Instruction/chat datasets: reading rows (every shape, every error with its file:line),
tokenizing them with labels masked to the answers (-100 elsewhere), truncation and skipping."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from riftco import TokenError
from riftco.chat_template import ChatTemplate, ChatTemplateError
from riftco.instruct import (
    IGNORE_INDEX,
    ByteTokenizer,
    DatasetError,
    OverlongExampleError,
    Example,
    MessagesRow,
    PromptCompletionRow,
    Row,
    TextRow,
    build_examples,
    collate,
    load_rows,
)

BYTES = ByteTokenizer()

CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
LLAMA3 = (
    "{% for message in messages %}"
    "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'"
    " + message['content'] | trim + '<|eot_id|>' %}"
    "{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}"
    "{{ content }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}"
    "{% endif %}"
)

CONV: list[dict[str, Any]] = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Hi"},
    {"role": "assistant", "content": "Hello, ça va?"},
    {"role": "user", "content": "2+2?"},
    {"role": "assistant", "content": "4"},
]


def write_jsonl(path: Path, rows: list[Any]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def trained_spans(e: Example) -> list[str]:
    """The decoded runs of positions that carry a label."""
    spans: list[str] = []
    run: list[int] = []
    for t, lab in zip(e.input_ids.tolist(), e.labels.tolist()):
        if lab == IGNORE_INDEX:
            if run:
                spans.append(BYTES.decode(run))
                run = []
        else:
            assert lab == t  # a label is the input id itself (unshifted)
            run.append(t)
    if run:
        spans.append(BYTES.decode(run))
    return spans


# --- reading ---------------------------------------------------------------------------------


def test_each_shape_from_jsonl_and_json(tmp_path: Path) -> None:
    a = tmp_path / "a.jsonl"
    a.write_text('{"text": "one"}\n\n   \n{"text": "two", "id": 7}\n', encoding="utf-8")
    b = write_jsonl(tmp_path / "b.jsonl", [{"prompt": "Q: ", "completion": "A"}])
    c = tmp_path / "c.json"
    c.write_text(json.dumps([{"messages": CONV}]), encoding="utf-8")
    rows = load_rows([a, b, c])
    assert rows == [
        TextRow("one", f"{a}:1"),
        TextRow("two", f"{a}:4"),
        PromptCompletionRow("Q: ", "A", f"{b}:1"),
        MessagesRow(tuple(CONV), f"{c}[0]"),
    ]


def test_single_path_and_directory(tmp_path: Path) -> None:
    write_jsonl(tmp_path / "b.jsonl", [{"text": "b"}])
    write_jsonl(tmp_path / "a.jsonl", [{"text": "a"}])
    (tmp_path / "notes.txt").write_text("ignored", encoding="utf-8")
    assert [r.text for r in load_rows(tmp_path) if isinstance(r, TextRow)] == ["a", "b"]
    assert len(load_rows(str(tmp_path / "a.jsonl"))) == 1


BAD_JSONL = [
    ('{"text": "ok"}\n{"text": "ok"\n', r"f\.jsonl:2: invalid JSON"),
    ('{"text": "ok"}\n[1, 2]\n', r"f\.jsonl:2: expected a JSON object, got list"),
    ('{"text": "ok"}\n"text"\n', r"f\.jsonl:2: expected a JSON object, got str"),
    ('{"txt": "ok"}\n', r"f\.jsonl:1: expected a row with exactly one of the shapes.*\['txt'\]"),
    ('{"prompt": "p"}\n', r"f\.jsonl:1: expected a row with exactly one of the shapes"),
    ('{"text": "t", "messages": []}\n', r"f\.jsonl:1: expected a row with exactly one"),
    ('{"text": 3}\n', r"f\.jsonl:1: 'text' must be a string, got int"),
    ('{"text": ""}\n', r"f\.jsonl:1: 'text' is empty"),
    ('{"prompt": "p", "completion": ""}\n', r"f\.jsonl:1: 'completion' is empty"),
    (
        '{"prompt": [{"role": "user", "content": "p"}], "completion": "c"}\n',
        r"f\.jsonl:1: 'prompt' must be a string, got list.*use a 'messages' row",
    ),
    ('{"messages": "hi"}\n', r"f\.jsonl:1: 'messages' must be a list"),
    ('{"messages": [1]}\n', r"f\.jsonl:1: messages\[0\] must be an object"),
    ('{"messages": [{"role": "user"}]}\n', r"f\.jsonl:1: messages\[0\] has no 'content'"),
    (
        '{"messages": [{"role": "bot", "content": "x"}]}\n',
        r"f\.jsonl:1: messages\[0\]: unknown role 'bot' \(expected one of \['system', 'user', 'assistant'\]\)",
    ),
    (
        '{"messages": [{"role": "user", "content": [{"type": "text"}]}]}\n',
        r"f\.jsonl:1: messages\[0\]: 'content' must be a string, got list",
    ),
    (
        '{"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": ""}]}\n',
        r"f\.jsonl:1: messages\[1\] \(assistant\): 'content' is empty",
    ),
    ('{"messages": [{"role": "user", "content": "q"}]}\n', r"f\.jsonl:1: the messages have no assistant turn"),
    (
        '{"text": "a"}\n\n{"prompt": "p", "completion": "c"}\n',
        r"f\.jsonl:3: a 'prompt/completion' row in a file of 'text' rows \(the shape of its first row, .*f\.jsonl:1\)",
    ),
    ("", r"f\.jsonl: no rows \(an empty file"),
    ("\n  \n", r"f\.jsonl: no rows \(only blank lines;"),
]


@pytest.mark.parametrize(("content", "pattern"), BAD_JSONL)
def test_jsonl_errors_name_file_and_line(tmp_path: Path, content: str, pattern: str) -> None:
    f = tmp_path / "f.jsonl"
    f.write_text(content, encoding="utf-8")
    with pytest.raises(DatasetError, match=pattern):
        load_rows([f])


def test_not_utf8_names_the_line(tmp_path: Path) -> None:
    f = tmp_path / "f.jsonl"
    f.write_bytes(b'{"text": "ok"}\n{"text": "caf\xe9"}\n')
    with pytest.raises(DatasetError, match=r"f\.jsonl:2: not UTF-8 text \(byte 0xe9"):
        load_rows([f])
    g = tmp_path / "g.json"
    g.write_bytes(b'[\n{"text": "ok"},\n{"text": "caf\xff"}]')
    with pytest.raises(DatasetError, match=r"g\.json:3: not UTF-8 text \(byte 0xff"):
        load_rows([g])


@pytest.mark.parametrize(
    ("content", "pattern"),
    [
        ('[\n{"text": "a"},\n{"text": }\n]', r"g\.json:3: invalid JSON"),
        ('{"text": "a"}', r"g\.json: a \.json dataset must be a JSON array.*got dict"),
        ("[]", r"g\.json: no rows"),
        ('[{"text": "a"}, 5]', r"g\.json\[1\]: expected a JSON object, got int"),
        ('[{"text": "a"}, {"messages": []}]', r"g\.json\[1\]: a 'messages' row in a file of 'text' rows"),
        ('[{"text": "a"}, {"text": null}]', r"g\.json\[1\]: 'text' must be a string, got NoneType"),
    ],
)
def test_json_errors_name_file_and_index(tmp_path: Path, content: str, pattern: str) -> None:
    f = tmp_path / "g.json"
    f.write_text(content, encoding="utf-8")
    with pytest.raises(DatasetError, match=pattern):
        load_rows([f])


def test_path_errors(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match="no data paths"):
        load_rows([])
    with pytest.raises(DatasetError, match="does not exist"):
        load_rows([tmp_path / "missing.jsonl"])
    (tmp_path / "x.csv").write_text("a,b\n", encoding="utf-8")
    with pytest.raises(DatasetError, match=r"x\.csv'?: expected a \.jsonl"):
        load_rows([tmp_path / "x.csv"])
    (tmp_path / "empty").mkdir()
    with pytest.raises(DatasetError, match="holds no .jsonl or .json file"):
        load_rows([tmp_path / "empty"])


def test_size_cap_is_refused_not_truncated(tmp_path: Path) -> None:
    a = write_jsonl(tmp_path / "a.jsonl", [{"text": "x" * 50}])
    b = write_jsonl(tmp_path / "b.jsonl", [{"text": "y" * 50}])
    size = a.stat().st_size
    assert len(load_rows([a, b], max_bytes=2 * size)) == 2
    with pytest.raises(DatasetError, match=rf"b\.jsonl: {size} bytes would bring the dataset to {2 * size} bytes, above the cap of {2 * size - 1}"):
        load_rows([a, b], max_bytes=2 * size - 1)


def test_default_cap_is_the_corpus_cap() -> None:
    import inspect

    from riftco.data import LOAD_CORPUS_MAX_BYTES

    assert inspect.signature(load_rows).parameters["max_bytes"].default == LOAD_CORPUS_MAX_BYTES == 256 * 2**20


# --- tokenizing ------------------------------------------------------------------------------


def test_text_rows_train_every_token_after_bos() -> None:
    rows = [TextRow("abc", "t:1")]
    (e,) = build_examples(rows, max_len=10, bos_token="^", eos_token="$")
    assert BYTES.decode(e.input_ids.tolist()) == "^abc$"
    assert e.input_ids.dtype == np.int64 and e.labels.dtype == np.int64
    assert e.labels.tolist() == [IGNORE_INDEX, *b"abc$"]
    (plain,) = build_examples(rows, BYTES, max_len=3)
    assert plain.labels.tolist() == list(b"abc")


def test_prompt_completion_masks_the_prompt() -> None:
    rows = [PromptCompletionRow("Q: 2+2? A: ", "4", "p:1")]
    (e,) = build_examples(rows, max_len=64, eos_token="<eos>")
    assert BYTES.decode(e.input_ids.tolist()) == "Q: 2+2? A: 4<eos>"
    assert trained_spans(e) == ["4<eos>"]
    assert e.n_trained == len("4<eos>")
    (no_eos,) = build_examples(rows, max_len=64)
    assert trained_spans(no_eos) == ["4"]


def test_default_template_masks_exactly_the_assistant_turns() -> None:
    (e,) = build_examples([MessagesRow(tuple(CONV), "m:1")], max_len=512)
    text = BYTES.decode(e.input_ids.tolist())
    assert text == (
        "<|system|>\nBe brief.<|end|>\n<|user|>\nHi<|end|>\n<|assistant|>\nHello, ça va?<|end|>\n"
        "<|user|>\n2+2?<|end|>\n<|assistant|>\n4<|end|>\n"
    )
    assert trained_spans(e) == ["Hello, ça va?<|end|>\n", "4<|end|>\n"]


def test_train_on_all_trains_every_position() -> None:
    rows: list[Row] = [MessagesRow(tuple(CONV), "m:1"), PromptCompletionRow("p", "c", "p:1")]
    for e in build_examples(rows, max_len=512, train_on="all"):
        assert np.array_equal(e.labels, e.input_ids)


@pytest.mark.parametrize(
    ("source", "end"),
    [(CHATML, "<|im_end|>\n"), (LLAMA3, "<|eot_id|>")],
    ids=["chatml", "llama3"],
)
def test_jinja_templates_mask_the_assistant_turns(source: str, end: str) -> None:
    pytest.importorskip("jinja2", reason="Jinja2 is not installed (pip install 'riftco[chat]')")
    t = ChatTemplate(source, bos_token="<|begin_of_text|>")
    (e,) = build_examples([MessagesRow(tuple(CONV), "m:1")], chat_template=t, max_len=1024)
    assert BYTES.decode(e.input_ids.tolist()) == t.render(CONV)
    assert trained_spans(e) == [f"Hello, ça va?{end}", f"4{end}"]


def test_template_that_is_not_incremental_is_an_error() -> None:
    pytest.importorskip("jinja2", reason="Jinja2 is not installed (pip install 'riftco[chat]')")
    # The number of messages leads the text, so a longer conversation changes its start.
    t = ChatTemplate("{{ messages | length }}{% for m in messages %}|{{ m.content }}{% endfor %}")
    with pytest.raises(ChatTemplateError, match=r"m:7: .* is not incremental"):
        build_examples([MessagesRow(tuple(CONV), "m:7")], chat_template=t, max_len=512)


def test_template_whose_turns_change_later_is_an_error() -> None:
    pytest.importorskip("jinja2", reason="Jinja2 is not installed (pip install 'riftco[chat]')")
    # A closing marker only after the last message: an earlier turn's text changes later.
    t = ChatTemplate(
        "{% for m in messages %}{{ m.content }};{% endfor %}{% if not add_generation_prompt %}END{% endif %}"
    )
    with pytest.raises(ChatTemplateError, match=r"m:2: .*assistant message 2 does not render as a prefix of the whole"):
        build_examples([MessagesRow(tuple(CONV), "m:2")], chat_template=t, max_len=512)
    # With one assistant turn, at the end, it is incremental.
    (e,) = build_examples([MessagesRow(tuple(CONV[:3]), "m:2")], chat_template=t, max_len=512)
    assert trained_spans(e) == ["Hello, ça va?;END"]


def test_template_error_names_the_row() -> None:
    pytest.importorskip("jinja2", reason="Jinja2 is not installed (pip install 'riftco[chat]')")
    t = ChatTemplate("{{ raise_exception('no system messages') }}", name="picky")
    with pytest.raises(ChatTemplateError, match=r"m:3: picky raised an error while rendering: no system messages"):
        build_examples([MessagesRow(tuple(CONV), "m:3")], chat_template=t, max_len=512)


def rows_of_lengths() -> list[Row]:
    return [
        PromptCompletionRow("pp", "cc", "r:1"),  # 4 tokens
        PromptCompletionRow("pppppp", "cccc", "r:2"),  # 10 tokens
        PromptCompletionRow("pppppppppp", "c", "r:3"),  # 11 tokens, the answer past 8
    ]


def test_overlong_error_names_the_row() -> None:
    with pytest.raises(DatasetError, match=r"r:2: 10 tokens, more than max_len 8") as e:
        build_examples(rows_of_lengths(), max_len=8)
    # The fields a caller words in its own terms (the command line's --seq-len).
    assert isinstance(e.value, OverlongExampleError)
    assert (e.value.source, e.value.tokens, e.value.max_len) == ("r:2", 10, 8)


def test_overlong_truncate_counts() -> None:
    out = build_examples(rows_of_lengths(), max_len=8, overlong="truncate")
    assert (out.n_truncated, out.n_skipped) == (1, 1)
    assert (out.truncated, out.skipped) == (("r:2",), ("r:3",))
    assert [e.source for e in out] == ["r:1", "r:2"]
    cut = out[1]
    assert BYTES.decode(cut.input_ids.tolist()) == "ppppppcc"
    assert trained_spans(cut) == ["cc"]
    assert out.n_tokens == 12 and out.n_trained == 4


def test_overlong_skip_counts() -> None:
    out = build_examples(rows_of_lengths(), max_len=8, overlong="skip")
    assert (len(out), out.n_truncated, out.n_skipped, out.skipped) == (1, 0, 2, ("r:2", "r:3"))
    assert len(build_examples(rows_of_lengths(), max_len=11)) == 3


@pytest.mark.parametrize(
    ("kwargs", "pattern"),
    [
        ({"max_len": 0}, "max_len must be a positive integer, got 0"),
        ({"max_len": 8, "train_on": "prompts"}, "train_on must be 'answers' or 'all', got 'prompts'"),
        ({"max_len": 8, "overlong": "drop"}, "overlong must be 'error', 'truncate' or 'skip'"),
    ],
)
def test_bad_arguments(kwargs: dict[str, Any], pattern: str) -> None:
    with pytest.raises(DatasetError, match=pattern):
        build_examples(rows_of_lengths(), **kwargs)


def test_vocab_size_is_checked() -> None:
    with pytest.raises(TokenError, match=r"t:1: the tokenizer produced token id 195.*vocab_size 128"):
        build_examples([TextRow("é", "t:1")], max_len=8, vocab_size=128)


def test_every_row_skipped_is_an_error() -> None:
    with pytest.raises(DatasetError, match=r"all 3 rows were skipped .*max_len 3.*the first is r:1"):
        build_examples(rows_of_lengths(), max_len=3, overlong="skip")
    assert len(build_examples([], max_len=3)) == 0


class BadTokenizer:
    def __init__(self, out: list[Any]) -> None:
        self.out = out

    def encode(self, text: str) -> list[int]:
        return self.out


@pytest.mark.parametrize(
    ("out", "pattern"),
    [
        (["a", "b"], r"t:1: the tokenizer's encode returned \['a', 'b'\], not a list of token ids"),
        ([1.5], "not a list of token ids"),
        ([[1, 2]], "not a list of token ids"),
        ([3, -1], r"t:1: the tokenizer produced token id -1 \(negative\)"),
    ],
)
def test_bad_tokenizer_output_is_a_token_error(out: list[Any], pattern: str) -> None:
    with pytest.raises(TokenError, match=pattern):
        build_examples([TextRow("a", "t:1")], BadTokenizer(out), max_len=8)


def test_a_tokenizer_without_encode_is_refused() -> None:
    with pytest.raises(TypeError, match="encode"):
        build_examples([TextRow("a", "t:1")], object(), max_len=8)


def test_collate_pads_with_ignored_labels() -> None:
    out = build_examples(rows_of_lengths()[:2], max_len=16)
    ids, labels = collate(list(out), pad_token_id=0)
    assert ids.shape == labels.shape == (2, 10) and ids.dtype == labels.dtype == np.int64
    assert ids[0, 4:].tolist() == [0] * 6 and labels[0, 4:].tolist() == [IGNORE_INDEX] * 6
    assert labels[1].tolist() == out[1].labels.tolist()


def test_end_to_end_from_files(tmp_path: Path) -> None:
    f = write_jsonl(tmp_path / "chat.jsonl", [{"messages": CONV[1:3]}, {"messages": CONV}])
    out = build_examples(load_rows([f]), max_len=256)
    assert [e.source for e in out] == [f"{f}:1", f"{f}:2"]
    assert trained_spans(out[0]) == ["Hello, ça va?<|end|>\n"]


def test_hf_tokenizer_masks_align_with_special_tokens() -> None:
    tokenizers = pytest.importorskip(
        "tokenizers", reason="tokenizers is not installed: the tokenizer.json path is skipped"
    )
    pytest.importorskip("jinja2", reason="Jinja2 is not installed (pip install 'riftco[chat]')")
    words = ["Be", "brief.", "Hi", "Hello,", "ça", "va?", "2+2?", "4", "system", "user", "assistant"]
    vocab = {"[UNK]": 0, **{w: i + 1 for i, w in enumerate(words)}}
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.WhitespaceSplit()
    tok.add_special_tokens(["<|im_start|>", "<|im_end|>"])
    end = tok.token_to_id("<|im_end|>")
    (e,) = build_examples([MessagesRow(tuple(CONV), "m:1")], tok, chat_template=ChatTemplate(CHATML), max_len=64)
    trained = [t for t, lab in zip(e.input_ids.tolist(), e.labels.tolist()) if lab != IGNORE_INDEX]
    assert trained == [vocab["Hello,"], vocab["ça"], vocab["va?"], end, vocab["4"], end]
    assert e.input_ids.tolist() == tok.encode(ChatTemplate(CHATML).render(CONV), add_special_tokens=False).ids


def test_transformers_tokenizer_adds_no_special_tokens_per_piece() -> None:
    transformers = pytest.importorskip(
        "transformers", reason="transformers is not installed: its tokenizer wrapper is skipped"
    )
    tokenizers = pytest.importorskip("tokenizers", reason="tokenizers is not installed")
    vocab = {"[UNK]": 0, "<s>": 1, "Q": 2, "A": 3}
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.WhitespaceSplit()
    tok.post_processor = tokenizers.processors.TemplateProcessing(
        single="<s> $A", special_tokens=[("<s>", 1)]
    )
    hf = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>")
    assert hf.encode("Q") == [1, 2]  # the BOS a piece must not get
    (e,) = build_examples([PromptCompletionRow("Q ", "A", "p:1")], hf, max_len=8, bos_token="<s> ")
    assert e.input_ids.tolist() == [1, 2, 3] and e.labels.tolist() == [IGNORE_INDEX, IGNORE_INDEX, 3]
