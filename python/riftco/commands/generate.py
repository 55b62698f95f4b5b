"""``riftco generate``: continue a prompt with a saved model, or a base model plus a LoRA adapter.

``--model`` is a pretraining (or full post-training) output folder or a ``model.safetensors``
file, a Hugging Face model folder, a GGUF file, a LoRA post-training output folder (its
``adapter/`` is loaded on the base model its ``training_metadata.json`` names) or an
``adapter/`` folder itself (the base model is then ``--base-model``, or the one recorded in the
metadata of the folder above it).

The text goes through the model's own tokenizer (:func:`riftco.load_tokenizer`: the folder's
``tokenizer.json``, the GGUF file's vocabulary, the base model's for a LoRA run, or riftco's
byte tokens for a byte-level model). The prompt is the PROMPT argument, or stdin when PROMPT is
``-`` or absent and stdin is not a terminal (one trailing newline, as ``echo`` adds, is
dropped). The output, on stdout, is the prompt and its continuation, printed token by token as
each is decoded (a character split over several tokens is printed once complete); with
``--chat``, only the answer. Generation stops at the model's end of sequence or end of turn,
or after ``--max-new-tokens``. Counts on stderr are in the model's tokens (bytes for a
byte-level model).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import warnings
from pathlib import Path

import riftco
from riftco.commands.arguments import (
    DEFAULT_SAMPLE_BYTES,
    add_device_argument,
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
  echo "class " | riftco generate --model runs/pretrain --max-new-tokens 100 --temperature 0
  riftco generate --model runs/chat --chat "What does len() do?"  # answer through the template
  riftco generate --model SmolLM2-135M-Instruct.Q4_1.gguf --chat "What is the capital of France?" \\
      --temperature 0                                         # a GGUF file, its tokenizer"""


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
        help="model folder or model.safetensors, a GGUF file, a LoRA post-training folder, or an "
        "adapter folder",
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
        "--max-new-tokens",
        "--sample-tokens",
        dest="sample_tokens",
        type=int_range(0),
        default=None,
        help=f"most tokens to generate (default: {DEFAULT_SAMPLE_BYTES}, fewer when the model's "
        "max_seq_len leaves fewer positions after the prompt); --sample-tokens is an alias",
    )
    p.add_argument("--temperature", type=non_negative_float, default=0.8, help="0 is greedy")
    p.add_argument("--top-k", type=int_range(1), default=40, help="sample among the k likeliest")
    p.add_argument("--seed", type=int_range(0), default=0, help="seeds the sampling")
    p.add_argument(
        "--chat",
        action="store_true",
        help="PROMPT is a user message: render it with the model's chat template (or riftco's "
        "default template) and the assistant's turn, and print only the answer, up to its end "
        "of turn",
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


def _trained_frozen_dtype(adapter: Path) -> str | None:
    """The ``frozen_weights_dtype`` the adapter's run asked for (``training_config`` of its
    ``training_metadata.json``): the base storage it was trained against, ``None`` for the
    default (the base as stored) or when not recorded. A QLoRA adapter (``nf4``, ``q4_0`` ...)
    only reproduces its training on the base quantized the same way."""
    meta_path = adapter.parent / METADATA_FILE
    try:
        config = json.loads(meta_path.read_bytes()).get("training_config", {})
        dtype = config.get("frozen_weights_dtype") if isinstance(config, dict) else None
    except (OSError, ValueError, AttributeError):
        return None
    return dtype if isinstance(dtype, str) else None


def _adapter(path: Path) -> Path | None:
    """The LoRA adapter folder ``path`` is or holds (a LoRA run), or ``None``."""
    if (path / ADAPTER_CONFIG).is_file():
        return path
    if (path / ADAPTER_DIR / ADAPTER_CONFIG).is_file() and not (path / "model.safetensors").is_file():
        return path / ADAPTER_DIR
    return None


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
    adapter = _adapter(path)
    if adapter is None:
        try:
            state = riftco.stages.resolve_model_state(path)
        except riftco.ModelStateError as e:
            fail(f"{e}; or a LoRA post-training folder (runs/post_train)")
        return riftco.load_model(state, attention=attention).to(device), str(state)
    base = _adapter_base(adapter, base_model)
    # The base stored as the run trained on it (a QLoRA run's NF4, ...), else as stored.
    model = riftco.load_model(base, attention=attention, dtype=_trained_frozen_dtype(adapter))
    model.load_lora(str(adapter))
    return model.to(device), f"{base} + LoRA adapter {adapter}"


_MAX_PROMPT_BYTES_PER_TOKEN = 1024
"""stdin is read up to ``max_seq_len`` times this many bytes for a text tokenizer: a longer
prompt cannot fit the model's positions (tokens are far shorter)."""


def _tokenizer(args: argparse.Namespace) -> riftco.Tokenizer:
    """The model's tokenizer: ``--model``'s (a LoRA run's is its recorded base model's), or
    ``--base-model``'s for an adapter given one."""
    adapter = _adapter(Path(args.model))
    use_base = adapter is not None and args.base_model is not None
    source = args.base_model if use_base else args.model
    try:
        with warnings.catch_warnings(record=True):
            warnings.simplefilter("always")
            tokenizer = riftco.load_tokenizer(source)
    except ImportError as e:
        fail(str(e))
    for note in tokenizer.warnings:
        print(f"riftco: warning: {note}", file=sys.stderr)
    return tokenizer


def _prompt_ids(
    args: argparse.Namespace, tokenizer: riftco.Tokenizer, data: bytes
) -> tuple[list[int], str | None]:
    """The prompt's token ids, and the text to print before the continuation (``None`` with
    ``--chat``, which prints the answer only, and for bytes, whose prompt is printed through
    the detokenizer as before)."""
    if tokenizer.is_bytes:
        text = riftco.decode_bytes(data)
    else:
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as e:
            fail(
                f"the prompt is not UTF-8 text ({e.reason} at byte {e.start}); "
                f"{tokenizer.name} encodes text"
            )
    try:
        if args.chat:
            messages = [{"role": "user", "content": text}]
            if args.system is not None:
                messages.insert(0, {"role": "system", "content": args.system})
            rendered = tokenizer.apply_chat_template(messages, add_generation_prompt=True)
            return tokenizer.encode(rendered, add_special_tokens=False), None
        if tokenizer.is_bytes:
            return list(data), None
        return tokenizer.encode(text), text
    except ImportError as e:
        fail(str(e))


class _StopText:
    """Holds back text that may be the start of a stop text (``<|end|>``), so that the printed
    answer is exactly the decoded text up to the first stop text."""

    def __init__(self, stops: list[str]) -> None:
        self.stops = [t for t in dict.fromkeys(stops) if t]
        self.held = ""
        self.stopped = False

    def feed(self, text: str) -> str:
        self.held += text
        found = [i for i in (self.held.find(t) for t in self.stops) if i >= 0]
        if found:
            out, self.held, self.stopped = self.held[: min(found)], "", True
            return out
        keep = max(
            (k for t in self.stops for k in range(1, len(t)) if self.held.endswith(t[:k])),
            default=0,
        )
        out = self.held[: len(self.held) - keep]
        self.held = self.held[len(self.held) - keep :]
        return out

    def finish(self) -> str:
        out, self.held = self.held, ""
        return out


def run(args: argparse.Namespace, prog: str = "riftco generate") -> None:
    """Loads the model and its tokenizer, checks the prompt and settings, and prints the prompt
    and its continuation as the tokens come (the answer only, with ``--chat``)."""
    if args.system is not None and not args.chat:
        fail("--system needs --chat")
    model, what = load_for_generation(args.model, args.base_model, args.attention, args.device)
    tokenizer = _tokenizer(args)
    vocab_size = int(model.config.vocab_size)
    if tokenizer.is_bytes and vocab_size > 256:
        # Bytes are a byte-level model's tokens; a larger vocabulary needs its own tokenizer.
        fail(
            f"{what} has no tokenizer (no tokenizer.json beside it) and a vocabulary of "
            f"{vocab_size} tokens: only a byte-level model (vocab_size <= 256) reads bytes; put "
            "the model's tokenizer.json (and tokenizer_config.json) in its folder"
        )
    max_seq_len = int(model.config.max_seq_len)
    unit = "bytes" if tokenizer.is_bytes else "tokens"
    limit = max_seq_len * (1 if tokenizer.is_bytes else _MAX_PROMPT_BYTES_PER_TOKEN)
    data = read_prompt(args.prompt, limit)
    if len(data) > limit:
        fail(f"the prompt on stdin is over {limit:,} bytes: more than the model's "
             f"max_seq_len of {max_seq_len} {unit} can hold")
    try:
        ids, shown = _prompt_ids(args, tokenizer, data)
    except riftco.TokenError as e:
        fail(f"{tokenizer.name} cannot encode the prompt: {e}")
    fill = max(max_seq_len - len(ids) + 1, 0)
    n_new = min(DEFAULT_SAMPLE_BYTES, fill) if args.sample_tokens is None else args.sample_tokens
    if not ids:
        fail("the prompt is empty: give at least one character")
    if len(ids) > max_seq_len:
        fail(
            f"the prompt is {len(ids)} {unit}, more than the model's max_seq_len of "
            f"{max_seq_len}: pass a shorter PROMPT"
        )
    if n_new > fill:
        fail(
            f"the prompt ({len(ids)} {unit}) plus {n_new} new {unit} needs "
            f"{len(ids) + n_new - 1} positions; the model's max_seq_len is {max_seq_len}: "
            f"pass --max-new-tokens {fill} or less, or a shorter PROMPT"
        )
    n_vocab = int(model.config.vocab_size)
    try:
        tokens = riftco.generate_tokens(
            model,
            ids,
            n_new,
            temperature=args.temperature,
            top_k=args.top_k,
            seed=args.seed,
            stop_token_ids=tokenizer.stop_token_ids,
            vocab_size=min(n_vocab, tokenizer.vocab_size),
        )
    except riftco.TokenError as e:  # a prompt id the model lacks: another model's tokenizer
        fail(f"{tokenizer.name} does not fit the model ({what}): {e}")
    source = "" if tokenizer.name == what else f" with {tokenizer.name}"
    print(
        f"{prog}: {what}{source}; {len(ids)} prompt {unit}, up to {n_new} {unit} to generate",
        file=sys.stderr,
    )
    stream = tokenizer.stream(context=[] if shown is None else ids)
    stops = _StopText(
        [tokenizer.stop_text or "", tokenizer.chat_template.eos_token or ""] if args.chat else []
    )

    def show(text: str) -> None:
        if text:
            sys.stdout.write(text)
            sys.stdout.flush()

    if shown is not None:
        show(shown)
    elif not args.chat:  # bytes: the prompt's bytes through the same decoder as the answer's
        for t in ids:
            show(stream.add_token(t))
    n_out = 0
    for t in tokens:
        n_out += 1
        show(stops.feed(stream.add_token(t)))
        if stops.stopped:
            break
    if not stops.stopped:
        show(stops.feed(stream.finalize()))
    show(stops.finish() if not stops.stopped else "")
    sys.stdout.write("\n")
    ended = " (stopped at the end of turn or sequence)" if stops.stopped or n_out < n_new else ""
    print(f"{prog}: {n_out} {unit} generated{ended}", file=sys.stderr)
