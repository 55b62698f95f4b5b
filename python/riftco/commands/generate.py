"""``riftco generate``: continue a prompt with a saved model, or a base model plus a LoRA adapter.

``--model`` is a pretraining (or full post-training) output folder or a ``model.safetensors``
file, a LoRA post-training output folder (its ``adapter/`` is loaded on the base model its
``training_metadata.json`` names) or an ``adapter/`` folder itself (the base model is then
``--base-model``, or the one recorded in the metadata of the folder above it).

The prompt is the PROMPT argument, or the bytes on stdin when PROMPT is ``-`` or absent and
stdin is not a terminal (one trailing newline, as ``echo`` adds, is dropped). The output is the
prompt and its continuation, as UTF-8 text (invalid bytes become U+FFFD), on stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import riftco
from riftco.commands.arguments import (
    DEFAULT_SAMPLE_BYTES,
    add_device_argument,
    check_sample_args,
    fail,
    int_range,
    non_negative_float,
)
from riftco.training.run_folder import ADAPTER_CONFIG
from riftco.training.stages import ADAPTER_DIR, METADATA_FILE

__all__ = ["add_arguments", "load_for_generation", "read_prompt", "run"]


EPILOG = """examples:
  riftco generate "def "                                      # runs/pretrain
  riftco generate --model runs/post_train "The "              # base model + LoRA adapter
  echo "class " | riftco generate --model runs/pretrain --sample-tokens 100 --temperature 0
  riftco generate --model runs/chat --chat "What does len() do?"  # answer through the template"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The flags of ``riftco generate``."""
    p.add_argument(
        "prompt",
        nargs="?",
        default=None,
        metavar="PROMPT",
        help="text to continue; '-' or absent: read stdin (when it is not a terminal)",
    )
    p.add_argument(
        "--model",
        default="runs/pretrain",
        metavar="PATH",
        help="model folder or model.safetensors, a LoRA post-training folder, or an adapter "
        "folder",
    )
    p.add_argument(
        "--base-model",
        default=None,
        metavar="PATH",
        help="the base model of an adapter (default: the one its run's metadata names)",
    )
    p.add_argument(
        "--attention", choices=riftco.ATTENTION_KINDS, default="flash", help="attention kind"
    )
    add_device_argument(p)
    p.add_argument(
        "--sample-tokens",
        "--max-new-tokens",
        dest="sample_tokens",
        type=int_range(0),
        default=None,
        help=f"bytes to generate (default: {DEFAULT_SAMPLE_BYTES}, fewer when the model's "
        "max_seq_len leaves fewer positions after the prompt)",
    )
    p.add_argument("--temperature", type=non_negative_float, default=0.8, help="0 is greedy")
    p.add_argument("--top-k", type=int_range(1), default=40, help="sample among the k likeliest")
    p.add_argument("--seed", type=int_range(0), default=0, help="seeds the sampling")
    p.add_argument(
        "--chat",
        action="store_true",
        help="PROMPT is a user message: render it with the model folder's chat template (or "
        "riftco's default byte template) and the assistant's turn, and print only the answer, "
        "up to its end of turn",
    )
    p.add_argument(
        "--system",
        default=None,
        metavar="TEXT",
        help="with --chat: a system message before the user's",
    )


def read_prompt(arg: str | None, limit: int) -> bytes:
    """The prompt's bytes: ``os.fsencode(arg)``, or stdin (at most ``limit + 1`` bytes read)
    for ``-`` or ``None`` when stdin is not a terminal, without one trailing newline.

    Raises:
        UsageError: no prompt argument and stdin is a terminal.
    """
    if arg is not None and arg != "-":
        return os.fsencode(arg)
    if arg is None and sys.stdin.isatty():
        fail(
            "no prompt: give it as an argument (riftco generate 'def ') or on stdin "
            "(echo 'def ' | riftco generate -)"
        )
    data = sys.stdin.buffer.read(limit + 1)
    return data[:-1] if data.endswith(b"\n") else data


def _adapter_base(adapter: Path, base: str | None) -> Path:
    if base is not None:
        return riftco.stages.resolve_model_state(base)
    meta_path = adapter.parent / METADATA_FILE
    recorded = None
    if meta_path.is_file():
        try:
            recorded = json.loads(meta_path.read_bytes()).get("base_model")
        except (OSError, ValueError, AttributeError):
            recorded = None
    if not isinstance(recorded, str):
        fail(
            f"the base model of the adapter {str(adapter)!r} is not recorded (no base_model in "
            f"{str(meta_path)!r}); pass --base-model"
        )
    try:
        return riftco.stages.resolve_model_state(recorded)
    except riftco.ModelStateError as e:
        fail(f"the adapter's base model is gone ({e}); pass --base-model")


def load_for_generation(
    model_path: str, base_model: str | None, attention: str, device: str = "cpu"
) -> tuple[riftco.DecoderOnlyTransformer, str]:
    """The model to sample from, on ``device``, and a description of what was loaded (see the
    module docstring for the paths accepted).

    Raises:
        ModelStateError: a bad model or adapter file; ``UsageError``: nothing loadable at the
            path, or an adapter whose base model is unknown; ``DeviceUnavailableError``: no
            adapter of the GPU asked for.
    """
    path = Path(model_path)
    adapter = None
    if (path / ADAPTER_CONFIG).is_file():
        adapter = path
    elif (path / ADAPTER_DIR / ADAPTER_CONFIG).is_file() and not (path / "model.safetensors").is_file():
        adapter = path / ADAPTER_DIR
    if adapter is None:
        try:
            state = riftco.stages.resolve_model_state(path)
        except riftco.ModelStateError as e:
            fail(f"{e}; or a LoRA post-training folder (runs/post_train)")
        return riftco.load_model(state, attention=attention).to(device), str(state)
    base = _adapter_base(adapter, base_model)
    model = riftco.load_model(base, attention=attention)
    model.load_lora(str(adapter))
    return model.to(device), f"{base} + LoRA adapter {adapter}"


def run(args: argparse.Namespace, prog: str = "riftco generate") -> None:
    """Loads the model, checks the prompt and settings, prints prompt + continuation."""
    model, what = load_for_generation(args.model, args.base_model, args.attention, args.device)
    max_seq_len = int(model.config.max_seq_len)
    data = read_prompt(args.prompt, max_seq_len)
    stop: str | None = None
    if args.system is not None and not args.chat:
        fail("--system needs --chat")
    if args.chat:
        data, stop = _render_chat(args, data)
    prompt, n_new = check_sample_args(
        os.fsdecode(data),
        args.sample_tokens,
        args.temperature,
        args.top_k,
        args.seed,
        max_seq_len,
        prompt_flag="PROMPT",
    )
    print(f"{prog}: {what}; {n_new} bytes", file=sys.stderr)
    text = riftco.generate(
        model, prompt, n_new, temperature=args.temperature, top_k=args.top_k, seed=args.seed
    )
    if stop is not None:
        sys.stdout.write(riftco.decode_bytes(text).split(stop, 1)[0] + "\n")
        return
    sys.stdout.write(riftco.decode_bytes(prompt + text) + "\n")


def _render_chat(args: argparse.Namespace, message: bytes) -> tuple[bytes, str]:
    """The user message rendered as a conversation up to the assistant's turn, and the text
    that ends that turn (the template's EOS, or the default template's ``<|end|>``)."""
    folder = Path(args.model)
    if not folder.is_dir():
        folder = folder.parent
    try:
        template = riftco.chat_template.load_chat_template(folder)
    except riftco.chat_template.ChatTemplateError as e:
        fail(str(e))
    if template is None:
        template = riftco.chat_template.default_chat_template()
    stop = template.eos_token or "<|end|>"
    messages = [{"role": "user", "content": riftco.decode_bytes(message)}]
    if args.system is not None:
        messages.insert(0, {"role": "system", "content": args.system})
    try:
        text = template.render(messages, add_generation_prompt=True)
    except ImportError as e:
        fail(str(e))
    return text.encode("utf-8"), stop
