"""Chat templates: turning a conversation (a list of ``{"role": ..., "content": ...}`` messages)
into the text a chat model was trained on, as Hugging Face transformers'
``tokenizer.apply_chat_template(..., tokenize=False)`` does.

A model folder's template is the Jinja2 source in ``chat_template.jinja`` when that file exists,
else the ``chat_template`` entry of ``tokenizer_config.json`` (a string, or a list of
``{"name": ..., "template": ...}`` from which the one named ``"default"`` is taken), with the
folder's ``bos_token``/``eos_token`` (strings, or ``{"content": ...}`` objects) from
``tokenizer_config.json`` (:func:`load_chat_template`).

Rendering (:meth:`ChatTemplate.render`) follows transformers: a
``jinja2.sandbox.ImmutableSandboxedEnvironment`` with ``trim_blocks=True``,
``lstrip_blocks=True`` and the ``jinja2.ext.loopcontrols`` extension (``{% break %}``,
``{% continue %}``); a ``tojson`` filter that does not escape HTML characters (``json.dumps``
with ``ensure_ascii=False``); a ``raise_exception(message)`` global that stops rendering with a
:class:`ChatTemplateError`; ``{% generation %}...{% endgeneration %}`` blocks (which mark
assistant text for transformers' assistant masks) rendered as their content; and the variables
``messages``, ``add_generation_prompt`` and, when the template has them, ``bos_token`` and
``eos_token`` (left undefined otherwise, as transformers does for a tokenizer without them).
Unlike transformers there is no ``strftime_now`` global: training text must not depend on the
day it was rendered (templates such as Llama 3.1's then use their fixed fallback date). Jinja2
is an optional dependency: ``pip install 'riftco[chat]'``.

The default template (:func:`default_chat_template`, for byte-token models: riftco's
pretraining outputs have no ``tokenizer_config.json``) renders each message as
``"<|" + role + "|>\\n" + content + "<|end|>\\n"`` (``<|user|>``, ``<|assistant|>`` or
``<|system|>``, a newline, the content, ``<|end|>``, a newline) and, with ``add_generation_prompt=True``, ends with
``<|assistant|>\\n``. For example ``[user "Hi", assistant "Hello"]`` renders as
``"<|user|>\\nHi<|end|>\\n<|assistant|>\\nHello<|end|>\\n"``. The markers are plain text (bytes
for a byte-token model); it needs no Jinja2 (a built-in renderer gives the same text as its
Jinja source :data:`DEFAULT_CHAT_TEMPLATE`).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from riftco._native import RiftcoError

__all__ = [
    "DEFAULT_CHAT_TEMPLATE",
    "DEFAULT_END_OF_TURN",
    "ChatTemplate",
    "ChatTemplateError",
    "default_chat_template",
    "load_chat_template",
    "read_tokenizer_config",
    "special_token_text",
]

TOKENIZER_CONFIG_FILE = "tokenizer_config.json"
CHAT_TEMPLATE_FILE = "chat_template.jinja"

DEFAULT_END_OF_TURN = "<|end|>"
"""The end-of-turn marker of the default template (part of each trained assistant span)."""

DEFAULT_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>\\n' + message['content'] + '<|end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}"
)
"""Jinja2 source of the default byte-token template (see the module docstring)."""

_DEFAULT_NAME = "riftco's default chat template"
_MAX_CONFIG_BYTES = 64 * 1024 * 1024


class ChatTemplateError(RiftcoError, ValueError):
    """A chat template cannot be read or rendered: a bad ``tokenizer_config.json``, a Jinja2
    syntax error, ``raise_exception`` called by the template, or a template that is not
    incremental (see :func:`riftco.instruct.build_examples`)."""


def special_token_text(value: Any, key: str, where: str) -> str | None:
    """The text of a special token entry of ``tokenizer_config.json`` (``key`` in the file
    ``where``): a string, or an ``{"content": ...}`` object; ``None`` when absent.

    Raises:
        ChatTemplateError: any other value, naming the key and the file.
    """
    if value is None:
        return None
    if isinstance(value, str):
        return value
    if isinstance(value, Mapping) and isinstance(value.get("content"), str):
        return str(value["content"])
    raise ChatTemplateError(
        f"{where}: {key} must be a string or an object with a string 'content', "
        f"got {type(value).__name__} {value!r:.80}"
    )


class ChatTemplate:
    """A Jinja2 chat template with the special tokens it may use.

    Args:
        source: the Jinja2 source (as in ``tokenizer_config.json``'s ``chat_template``).
        bos_token: the ``bos_token`` variable, or ``None`` to leave it undefined.
        eos_token: the ``eos_token`` variable, or ``None`` to leave it undefined.
        name: where the template came from, used in error messages.
    """

    def __init__(
        self,
        source: str,
        *,
        bos_token: str | None = None,
        eos_token: str | None = None,
        name: str = "chat template",
    ) -> None:
        if not isinstance(source, str) or not source:
            raise ChatTemplateError(f"{name}: the template must be a non-empty string, got {source!r:.80}")
        self.source = source
        self.bos_token = bos_token
        self.eos_token = eos_token
        self.name = name
        self._compiled: Any = None

    def __repr__(self) -> str:
        return (
            f"ChatTemplate(name={self.name!r}, bos_token={self.bos_token!r}, "
            f"eos_token={self.eos_token!r}, source={len(self.source)} chars)"
        )

    def _builtin(self) -> bool:
        return self.source == DEFAULT_CHAT_TEMPLATE and self.name == _DEFAULT_NAME

    def _compile(self) -> Any:
        if self._compiled is None:
            jinja2, sandbox = _import_jinja2()

            def raise_exception(message: object) -> None:
                raise jinja2.exceptions.TemplateError(str(message))

            def tojson(
                x: Any,
                ensure_ascii: bool = False,
                indent: int | None = None,
                separators: tuple[str, str] | None = None,
                sort_keys: bool = False,
            ) -> str:
                # Jinja's own tojson escapes <, >, & and ' for HTML; chat templates need the
                # plain JSON text (transformers overrides it the same way).
                return json.dumps(
                    x,
                    ensure_ascii=ensure_ascii,
                    indent=indent,
                    separators=separators,
                    sort_keys=sort_keys,
                )

            env = sandbox.ImmutableSandboxedEnvironment(
                trim_blocks=True,
                lstrip_blocks=True,
                extensions=["jinja2.ext.loopcontrols", _generation_extension(jinja2)],
            )
            env.filters["tojson"] = tojson
            env.globals["raise_exception"] = raise_exception
            try:
                self._compiled = env.from_string(self.source)
            except jinja2.exceptions.TemplateSyntaxError as e:
                raise ChatTemplateError(
                    f"{self.name}: Jinja2 syntax error at template line {e.lineno}: {e.message}"
                ) from None
        return self._compiled

    def render(
        self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = False
    ) -> str:
        """The text of ``messages`` (each a mapping with at least ``role`` and ``content``),
        ending with the template's generation prompt (the start of an assistant turn) when
        ``add_generation_prompt`` is true — what ``apply_chat_template(messages,
        tokenize=False, add_generation_prompt=...)`` of transformers returns.

        Raises:
            ChatTemplateError: a syntax or rendering error of the template, or the template's
                ``raise_exception(message)`` (the message is kept), naming the template.
            ImportError: Jinja2 is not installed (``pip install 'riftco[chat]'``); the default
                template renders without it.
        """
        msgs = [dict(m) for m in messages]
        if self._builtin():
            return _render_default(msgs, add_generation_prompt, self.name)
        return self._render_jinja(msgs, add_generation_prompt)

    def _render_jinja(self, msgs: list[dict[str, Any]], add_generation_prompt: bool) -> str:
        compiled = self._compile()
        import jinja2

        variables: dict[str, Any] = {
            "messages": msgs,
            "add_generation_prompt": bool(add_generation_prompt),
        }
        if self.bos_token is not None:
            variables["bos_token"] = self.bos_token
        if self.eos_token is not None:
            variables["eos_token"] = self.eos_token
        try:
            return str(compiled.render(**variables))
        except jinja2.exceptions.TemplateError as e:
            raise ChatTemplateError(f"{self.name} raised an error while rendering: {e}") from None


def _render_default(msgs: list[dict[str, Any]], add_generation_prompt: bool, name: str) -> str:
    parts: list[str] = []
    for i, m in enumerate(msgs):
        role, content = m.get("role"), m.get("content")
        if not isinstance(role, str) or not isinstance(content, str):
            raise ChatTemplateError(
                f"{name}: message {i} needs a string 'role' and a string 'content', got "
                f"{role!r:.40} and {content!r:.40}"
            )
        parts.append(f"<|{role}|>\n{content}{DEFAULT_END_OF_TURN}\n")
    if add_generation_prompt:
        parts.append("<|assistant|>\n")
    return "".join(parts)


def _generation_extension(jinja2: Any) -> Any:
    """A Jinja2 extension for the ``{% generation %}...{% endgeneration %}`` blocks with which
    templates mark assistant text (transformers' ``AssistantTracker``, used for its assistant
    masks): the body renders as if the markers were not there. riftco finds answer spans by
    incremental rendering instead (:func:`riftco.instruct.build_examples`)."""
    from jinja2 import nodes
    from jinja2.ext import Extension

    class GenerationBlocks(Extension):
        tags = {"generation"}

        def parse(self, parser: Any) -> Any:
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return nodes.CallBlock(self.call_method("_render", []), [], [], body).set_lineno(
                lineno
            )

        def _render(self, caller: Any) -> str:
            return str(caller())

    return GenerationBlocks


def _import_jinja2() -> tuple[Any, Any]:
    try:
        import jinja2
        import jinja2.sandbox
    except ImportError:
        raise ImportError(
            "rendering a chat template needs Jinja2: pip install 'riftco[chat]'"
        ) from None
    return jinja2, jinja2.sandbox


def default_chat_template() -> ChatTemplate:
    """The default template for byte-token models (see the module docstring), no BOS/EOS."""
    return ChatTemplate(DEFAULT_CHAT_TEMPLATE, name=_DEFAULT_NAME)


def _read_json_object(path: Path) -> dict[str, Any]:
    try:
        size = path.stat().st_size
        if size > _MAX_CONFIG_BYTES:
            raise ChatTemplateError(
                f"{path}: {size:,} bytes, above the {_MAX_CONFIG_BYTES:,} bytes a tokenizer "
                f"config may have"
            )
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise ChatTemplateError(f"cannot read {path}: {e.strerror or e}") from None
    except UnicodeDecodeError as e:
        raise ChatTemplateError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise ChatTemplateError(
            f"{path}:{e.lineno}:{e.colno}: invalid JSON: {e.msg}"
        ) from None
    if not isinstance(data, dict):
        raise ChatTemplateError(f"{path}: expected a JSON object, got {type(data).__name__}")
    return data


def _pick_template(value: Any, where: str) -> str | None:
    if value is None:
        return None
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        names: list[str] = []
        for entry in value:
            if not (
                isinstance(entry, Mapping)
                and isinstance(entry.get("name"), str)
                and isinstance(entry.get("template"), str)
            ):
                raise ChatTemplateError(
                    f"{where}: each entry of a chat_template list must be an object with string "
                    f"'name' and 'template', got {entry!r:.80}"
                )
            if entry["name"] == "default":
                return str(entry["template"])
            names.append(str(entry["name"]))
        raise ChatTemplateError(
            f"{where}: chat_template lists the templates {names} but none named 'default'"
        )
    raise ChatTemplateError(
        f"{where}: chat_template must be a string or a list of named templates, got "
        f"{type(value).__name__}"
    )


def read_tokenizer_config(model_folder: str | os.PathLike[str]) -> dict[str, Any]:
    """The JSON object of a model folder's ``tokenizer_config.json`` (``{}`` when it has none).

    Raises:
        ChatTemplateError: unreadable, over 64 MiB, or not a JSON object (naming the file, line
            and column).
    """
    path = Path(model_folder) / TOKENIZER_CONFIG_FILE
    return _read_json_object(path) if path.is_file() else {}


def load_chat_template(model_folder: str | os.PathLike[str]) -> ChatTemplate | None:
    """The chat template of a Hugging Face model folder (or of the folder of a file in it), or
    ``None`` when it has none (no ``chat_template.jinja`` and no ``chat_template`` in
    ``tokenizer_config.json``: a base model, or a riftco pretraining output — see
    :func:`default_chat_template`).

    ``chat_template.jinja`` wins over ``tokenizer_config.json`` (as in transformers); a list of
    named templates gives the one named ``"default"``. ``bos_token``/``eos_token`` come from
    ``tokenizer_config.json`` (a string or ``{"content": ...}``; absent or ``null``: undefined).

    Raises:
        ChatTemplateError: unreadable or invalid JSON (naming file, line and column), a
            ``chat_template`` of the wrong type, a list without ``"default"``, a special token
            of the wrong type, or an empty template.
    """
    folder = Path(model_folder)
    if not folder.is_dir():
        if not folder.exists():
            raise ChatTemplateError(f"model folder {str(folder)!r} does not exist")
        folder = folder.parent
    config_path = folder / TOKENIZER_CONFIG_FILE
    config = read_tokenizer_config(folder)
    jinja_path = folder / CHAT_TEMPLATE_FILE
    if jinja_path.is_file():
        try:
            source: str | None = jinja_path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise ChatTemplateError(f"cannot read {jinja_path} as UTF-8 text: {e}") from None
        name = str(jinja_path)
    else:
        source = _pick_template(config.get("chat_template"), str(config_path))
        name = f"the chat_template of {config_path}"
    if source is None:
        return None
    return ChatTemplate(
        source,
        bos_token=special_token_text(config.get("bos_token"), "bos_token", str(config_path)),
        eos_token=special_token_text(config.get("eos_token"), "eos_token", str(config_path)),
        name=name,
    )
