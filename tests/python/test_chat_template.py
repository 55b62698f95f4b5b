"""Chat templates: loading from a model folder, rendering as transformers does (sandbox,
trim_blocks/lstrip_blocks, loopcontrols, raise_exception, tojson), the default byte template."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from riftco.chat_template import (
    DEFAULT_CHAT_TEMPLATE,
    ChatTemplate,
    ChatTemplateError,
    default_chat_template,
    load_chat_template,
)

pytest.importorskip("jinja2", reason="Jinja2 is not installed (pip install 'riftco[chat]')")

# ChatML as Qwen2 writes it (a default system message when the conversation has none).
CHATML = (
    "{% for message in messages %}"
    "{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}"
    "{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

# Meta Llama 3 Instruct's template.
LLAMA3 = (
    "{% set loop_messages = messages %}"
    "{% for message in loop_messages %}"
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
    {"role": "assistant", "content": "Hello!"},
    {"role": "user", "content": "2+2?"},
    {"role": "assistant", "content": "4"},
]


def test_default_template_text() -> None:
    t = default_chat_template()
    assert t.render(CONV[1:3]) == "<|user|>\nHi<|end|>\n<|assistant|>\nHello!<|end|>\n"
    assert t.render(CONV[1:2], add_generation_prompt=True) == "<|user|>\nHi<|end|>\n<|assistant|>\n"
    assert t.render([], add_generation_prompt=True) == "<|assistant|>\n"


@pytest.mark.parametrize("n", range(len(CONV) + 1))
@pytest.mark.parametrize("gen", [False, True])
def test_default_template_builtin_renderer_matches_its_jinja_source(n: int, gen: bool) -> None:
    builtin = default_chat_template()
    jinja = ChatTemplate(DEFAULT_CHAT_TEMPLATE, name="the same source through Jinja2")
    assert builtin.render(CONV[:n], gen) == jinja.render(CONV[:n], gen)


def test_chatml_render() -> None:
    t = ChatTemplate(CHATML)
    assert t.render(CONV[1:2], add_generation_prompt=True) == (
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    )
    assert t.render(CONV[:3]) == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
        "<|im_start|>assistant\nHello!<|im_end|>\n"
    )


def test_llama3_render_uses_bos_token() -> None:
    t = ChatTemplate(LLAMA3, bos_token="<|begin_of_text|>", eos_token="<|eot_id|>")
    assert t.render(CONV[1:3], add_generation_prompt=False) == (
        "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\nHello!<|eot_id|>"
    )
    assert t.render(CONV[1:2], add_generation_prompt=True).endswith(
        "<|start_header_id|>assistant<|end_header_id|>\n\n"
    )


def test_undefined_special_tokens_stay_undefined() -> None:
    t = ChatTemplate("{% if bos_token is defined %}B{% else %}none{% endif %}")
    assert t.render([]) == "none"
    assert ChatTemplate(t.source, bos_token="<s>").render([]) == "B"


def test_trim_blocks_and_lstrip_blocks() -> None:
    source = "{% for m in messages %}\n    {% if m.role == 'user' %}\n[{{ m.content }}]\n    {% endif %}\n{% endfor %}\n"
    assert ChatTemplate(source).render(CONV) == "[Hi]\n[2+2?]\n"


def test_raise_exception_is_a_chat_template_error() -> None:
    source = (
        "{% if messages[0]['role'] != 'user' %}"
        "{{ raise_exception('Conversations must start with a user message') }}{% endif %}ok"
    )
    t = ChatTemplate(source, name="strict template")
    assert t.render(CONV[1:]) == "ok"
    with pytest.raises(ChatTemplateError, match="strict template.*Conversations must start with a user"):
        t.render(CONV)


def test_loopcontrols() -> None:
    source = (
        "{% for m in messages %}{% if m.role == 'system' %}{% continue %}{% endif %}"
        "{{ m.content }};{% if m.role == 'assistant' %}{% break %}{% endif %}{% endfor %}"
    )
    assert ChatTemplate(source).render(CONV) == "Hi;Hello!;"


def test_tojson_does_not_escape_html() -> None:
    t = ChatTemplate("{{ messages[0] | tojson }}")
    out = t.render([{"role": "user", "content": "<b>&'é"}])
    assert json.loads(out) == {"role": "user", "content": "<b>&'é"}
    assert "<b>&'é" in out
    assert ChatTemplate("{{ messages[0] | tojson(indent=2) }}").render(CONV).count("\n") == 3


def test_sandbox_refuses_mutation_and_private_attributes() -> None:
    with pytest.raises(ChatTemplateError, match="raised an error"):
        ChatTemplate("{% set x = messages.append(1) %}").render([])
    with pytest.raises(ChatTemplateError):
        ChatTemplate("{{ ''.__class__.__mro__[1].__subclasses__() }}").render([])


def test_syntax_error_names_template_and_line() -> None:
    with pytest.raises(ChatTemplateError, match=r"bad\.jinja: Jinja2 syntax error at template line 2"):
        ChatTemplate("ok\n{% for m in messages %}", name="bad.jinja").render([])


def test_empty_template_is_refused() -> None:
    with pytest.raises(ChatTemplateError, match="non-empty string"):
        ChatTemplate("")


def test_missing_jinja2_says_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "jinja2", None)
    monkeypatch.setitem(sys.modules, "jinja2.sandbox", None)
    with pytest.raises(ImportError, match=r"pip install 'riftco\[chat\]'"):
        ChatTemplate(CHATML).render(CONV)
    # The default template needs no Jinja2.
    assert default_chat_template().render(CONV[1:2]) == "<|user|>\nHi<|end|>\n"


def write_config(folder: Path, config: dict[str, Any]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")


def test_load_string_template_and_special_tokens(tmp_path: Path) -> None:
    write_config(
        tmp_path,
        {
            "chat_template": LLAMA3,
            "bos_token": {"__type": "AddedToken", "content": "<|begin_of_text|>", "lstrip": False},
            "eos_token": "<|eot_id|>",
        },
    )
    t = load_chat_template(tmp_path)
    assert t is not None
    assert (t.source, t.bos_token, t.eos_token) == (LLAMA3, "<|begin_of_text|>", "<|eot_id|>")
    assert t.render(CONV[1:2]).startswith("<|begin_of_text|><|start_header_id|>user")
    # A file in the folder names the folder.
    assert load_chat_template(tmp_path / "tokenizer_config.json") is not None


def test_load_named_templates_picks_default(tmp_path: Path) -> None:
    write_config(
        tmp_path,
        {"chat_template": [{"name": "tool_use", "template": "T"}, {"name": "default", "template": CHATML}]},
    )
    t = load_chat_template(tmp_path)
    assert t is not None and t.source == CHATML and t.bos_token is None


def test_load_named_templates_without_default_is_an_error(tmp_path: Path) -> None:
    write_config(tmp_path, {"chat_template": [{"name": "tool_use", "template": "T"}]})
    with pytest.raises(ChatTemplateError, match=r"\['tool_use'\] but none named 'default'"):
        load_chat_template(tmp_path)


def test_no_template_is_none(tmp_path: Path) -> None:
    assert load_chat_template(tmp_path) is None
    write_config(tmp_path, {"eos_token": "</s>"})
    assert load_chat_template(tmp_path) is None


def test_chat_template_jinja_wins(tmp_path: Path) -> None:
    write_config(tmp_path, {"chat_template": "old", "eos_token": "</s>"})
    (tmp_path / "chat_template.jinja").write_text(CHATML, encoding="utf-8")
    t = load_chat_template(tmp_path)
    assert t is not None and t.source == CHATML and t.eos_token == "</s>"


@pytest.mark.parametrize(
    ("config_text", "pattern"),
    [
        ('{\n "chat_template": "x",\n oops}', r"tokenizer_config\.json:3:2: invalid JSON"),
        ("[1]", "expected a JSON object, got list"),
        ('{"chat_template": 3}', "chat_template must be a string or a list"),
        ('{"chat_template": [{"name": "default"}]}', "string 'name' and 'template'"),
        ('{"chat_template": "x", "bos_token": 5}', "bos_token must be a string"),
    ],
)
def test_bad_config_errors(tmp_path: Path, config_text: str, pattern: str) -> None:
    (tmp_path / "tokenizer_config.json").write_text(config_text, encoding="utf-8")
    with pytest.raises(ChatTemplateError, match=pattern):
        load_chat_template(tmp_path)


def test_missing_folder_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ChatTemplateError, match="does not exist"):
        load_chat_template(tmp_path / "nope")


@pytest.mark.parametrize("source", [CHATML, LLAMA3, DEFAULT_CHAT_TEMPLATE])
@pytest.mark.parametrize("gen", [False, True])
def test_matches_transformers_apply_chat_template(tmp_path: Path, source: str, gen: bool) -> None:
    transformers = pytest.importorskip(
        "transformers", reason="transformers is not installed: the comparison with apply_chat_template is skipped"
    )
    tokenizers = pytest.importorskip("tokenizers", reason="tokenizers is not installed")
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel({"[UNK]": 0}, unk_token="[UNK]"))
    hf = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<|begin_of_text|>", eos_token="<|eot_id|>"
    )
    hf.chat_template = source
    ours = ChatTemplate(source, bos_token="<|begin_of_text|>", eos_token="<|eot_id|>")
    for n in (2, 3, 5):
        expected = hf.apply_chat_template(CONV[:n], tokenize=False, add_generation_prompt=gen)
        assert ours.render(CONV[:n], add_generation_prompt=gen) == expected


def test_generation_blocks_render_their_content() -> None:
    # Templates that mark assistant text for transformers' assistant masks (and TRL's
    # assistant_only_loss) render as without the markers.
    marked = ChatTemplate(
        "{% for m in messages %}<|{{ m.role }}|>{% if m.role == 'assistant' %}"
        "{% generation %}{{ m.content }}<|end|>{% endgeneration %}"
        "{% else %}{{ m.content }}<|end|>{% endif %}{% endfor %}"
    )
    msgs = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]
    assert marked.render(msgs) == "<|user|>Hi<|end|><|assistant|>Hello<|end|>"
