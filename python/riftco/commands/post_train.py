"""``riftco post-train``: fine-tune a model saved by ``riftco pretrain`` on other text.

By default it LoRA-fine-tunes ``runs/pretrain`` on the Python language reference that ships
with every CPython install (``pydoc_data/topics.py``, English prose the pretraining corpus
excludes), writes the adapter (PEFT layout) to ``runs/post_train/adapter`` with
``training_metadata.json`` (and ``loss.png``, ``memory.png`` when matplotlib is installed), and
prints a sample before and after. ``--fine-tuning-method full`` trains every weight and writes
``model.safetensors`` instead.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from collections.abc import Callable
from typing import Any, Literal

from riftco._native import ATTENTION_KINDS, DecoderOnlyTransformer, ModelStateError, TokenError
from riftco.commands._runs import (
    check_corpus,
    check_examples,
    check_run_folder,
    corpus_line,
    examples_line,
    log,
    log_later,
    print_later,
    stage_log,
)
from riftco.commands.arguments import (
    DEFAULT_SAMPLE_BYTES,
    ArgumentParser,
    add_checkpointing_arguments,
    add_data_parallel_arguments,
    add_device_argument,
    add_dropout_arguments,
    add_resume_argument,
    check_sample_args,
    fail,
    int_range,
    non_negative_float,
    output_folder,
    start_data_parallel,
)
from riftco.data.chat_template import ChatTemplate, ChatTemplateError
from riftco.data.examples import ExampleCorpus
from riftco.data.hf_tokenizer import generate_ids, load_folder_tokenizer, tokenize_corpus
from riftco.data.instruct import DatasetError, OverlongExampleError
from riftco.data.instruct_corpus import (
    RowObjects,
    answer_samples,
    is_example_data,
    load_example_corpus,
)
from riftco.data.stdlib_instructions import stdlib_instructions
from riftco.data.text import Corpus, decode_bytes, default_post_training_corpus, load_corpus
from riftco.data.tokenizer import is_gguf
from riftco.generation import generate
from riftco.training import distributed
from riftco.training.configs import (
    FINE_TUNING_METHODS,
    FROZEN_WEIGHTS_DTYPES,
    HALF_DTYPES,
    PostTrainingConfig,
)
from riftco.training.run_folder import ADAPTER_CONFIG, ADAPTER_DIR
from riftco.training.tokenizers import load_tokenizer, save_tokenizer
from riftco.training.stages import (
    METADATA_FILE,
    MODEL_STATE_FILE,
    load_model,
    resolve_model_state,
    run_post_training,
)

__all__ = ["DEFAULT_MODEL", "DEFAULT_OUT", "add_arguments", "parse_args", "run"]

DEFAULT_MODEL = "runs/pretrain"
DEFAULT_OUT = "runs/post_train"
DEFAULT_MAX_SEQ_LEN = 512
"""The default ``--seq-len`` cap: a real model's whole context (8192 for SmolLM2) would make
every step's rows that long on a CPU."""
SAMPLES_FILE = "samples.jsonl"
"""Where a run on instruction/chat data saves its answers to held-out prompts, before and after."""

EPILOG = """examples:
  riftco post-train                                           # LoRA on runs/pretrain
  riftco post-train --fine-tuning-method full --out runs/post_train-full
  riftco post-train --activation-checkpointing selective:dots
  riftco post-train --model runs/pretrain --data my_notes/ --lora-rank 16
  riftco post-train --model path/to/hf-llama-folder --data my_notes/
  riftco post-train --model SmolLM2-135M-Instruct.Q4_1.gguf --data-format chat
  riftco post-train --data train.jsonl --train-on answers      # chat / instruction rows
  riftco post-train --data-format chat                        # built-in stdlib Q&A rows

--model is a pretraining output folder, a plain Hugging Face Llama folder (config.json with
model.safetensors or shards, float32/bfloat16/float16) or a llama GGUF file (llama.cpp's types,
dequantized). A folder with a tokenizer.json is tokenized with it (pip install tokenizers), a
GGUF with its own tokenizer and chat template; a folder without one is byte-level.

exit codes: 0 done, 2 bad input (one "error:" line on stderr), 130 interrupted with Ctrl-C
(the last periodic save is left intact)."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The flags of ``riftco post-train`` (and ``examples/post_train.py``)."""
    p.add_argument(
        "--model",
        default=DEFAULT_MODEL,
        metavar="PATH",
        help="pretraining output folder, Hugging Face Llama folder, model.safetensors or a "
        "llama .gguf file",
    )
    p.add_argument(
        "--data",
        nargs="+",
        metavar="PATH",
        help="text files or folders, read byte for byte (default: the stdlib's "
        "pydoc_data/topics.py); or instruction/chat data: .jsonl/.json files of "
        '{"text"}, {"prompt", "completion"} or {"messages"} rows, tokenized with the '
        "model's chat template, the loss on the answers",
    )
    p.add_argument(
        "--data-format",
        choices=("text", "chat"),
        default="text",
        help="without --data: the built-in data, the Python language reference as text "
        "(default) or chat: questions about standard-library functions answered by their "
        "docstrings (riftco.stdlib_instructions, made from this Python); with --data the "
        "files' suffixes decide, and chat needs .jsonl/.json files",
    )
    p.add_argument(
        "--train-on",
        choices=("answers", "all"),
        default="answers",
        help="with .jsonl/.json data: the loss on the completions and assistant turns "
        "(default), or on every token",
    )
    p.add_argument(
        "--overlong",
        choices=("error", "truncate", "skip"),
        default=None,
        help="with .jsonl/.json data: an example longer than --seq-len + 1 tokens is an "
        "error (default for --data files), cut, or left out (default for the built-in chat "
        "data; counted in the log)",
    )
    p.add_argument("--out", default=DEFAULT_OUT, metavar="DIR", help="output folder")
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="replace a run of another configuration in --out (without it that is refused)",
    )
    add_resume_argument(p)
    p.add_argument("--no-plots", action="store_true", help="do not write loss.png and memory.png")
    p.add_argument(
        "--fine-tuning-method",
        choices=FINE_TUNING_METHODS,
        default="lora",
        help="train LoRA adapters only, or every weight",
    )
    add_checkpointing_arguments(p)
    add_device_argument(p)
    add_data_parallel_arguments(p)
    p.add_argument(
        "--attention", choices=ATTENTION_KINDS, default="flash", help="attention kind"
    )
    p.add_argument("--lora-rank", type=int_range(1), default=8, help="adapter rank r")
    p.add_argument(
        "--lora-alpha", type=float, default=16.0, help="adapter scale: alpha / r"
    )
    p.add_argument("--lora-mlp", action="store_true", help="also adapt the MLP projections")
    p.add_argument(
        "--packing",
        action="store_true",
        help="with instruction/chat examples: pack several whole examples into each training "
        "row (each computed as if alone) instead of padding one example per row",
    )
    p.add_argument(
        "--frozen-weights-dtype",
        type=str.lower,
        choices=FROZEN_WEIGHTS_DTYPES,
        default=None,
        help="store the frozen base weights in this format (lora only) while every op computes "
        "in float32: bfloat16/float16 halve their bytes; nf4 (QLoRA), q8_0, q4_0, q4_k, ... "
        "quantize every base matrix (about 4.1 to 8.5 bits per weight). Default: as the model "
        "is stored (a GGUF file's quantized blocks stay quantized under lora, on the CPU and on a "
        "GPU; anything else, and full fine-tuning, float32). bfloat16/float16 live on the CPU "
        "only",
    )
    add_dropout_arguments(p, lora=True, keep_model=True)
    p.add_argument("--steps", type=int_range(1), default=200, help="optimizer steps")
    p.add_argument("--batch-size", type=int_range(1), default=8, help="sequences per step")
    p.add_argument(
        "--seq-len",
        type=int_range(1),
        default=None,
        help=f"tokens per training row (default: the model's max_seq_len, at most "
        f"{DEFAULT_MAX_SEQ_LEN}; a real model's context, e.g. 8192, would make every step "
        "that long)",
    )
    p.add_argument(
        "--lr",
        type=float,
        default=None,
        help="peak learning rate (default: 3e-3 for lora, 5e-4 for full)",
    )
    p.add_argument("--warmup-steps", type=int_range(0), default=10, help="linear warm-up steps")
    p.add_argument("--seed", type=int_range(0), default=0, help="seeds batches and adapters")
    p.add_argument(
        "--save-every", type=int_range(1), default=50, metavar="STEPS", help="steps between saves"
    )
    p.add_argument(
        "--keep-checkpoints",
        type=int_range(1),
        default=3,
        metavar="N",
        help="how many of the newest training checkpoints to keep in --out/checkpoints",
    )
    p.add_argument(
        "--eval-every",
        type=int_range(1),
        default=25,
        metavar="STEPS",
        help="steps between validation losses (recorded in training_metadata.json)",
    )
    p.add_argument(
        "--log-every",
        type=int_range(1),
        default=10,
        metavar="STEPS",
        help="steps between log lines with --no-progress",
    )
    p.add_argument("--no-progress", action="store_true", help="log lines instead of a progress bar")
    p.add_argument("--prompt", default="The ", help="prompt of the printed samples")
    p.add_argument(
        "--max-new-tokens",
        "--sample-tokens",
        dest="sample_tokens",
        type=int_range(0),
        default=None,
        help=f"tokens (bytes for a byte-level model) each sample generates (default: "
        f"{DEFAULT_SAMPLE_BYTES}, fewer when the model's max_seq_len leaves fewer positions "
        "after the prompt); --sample-tokens is an alias",
    )
    p.add_argument("--temperature", type=non_negative_float, default=0.8, help="0 is greedy")
    p.add_argument("--top-k", type=int_range(1), default=40, help="sample among the k likeliest")


def parse_args(
    argv: list[str] | None = None, prog: str = "riftco post-train"
) -> argparse.Namespace:
    """Parses the flags (``sys.argv[1:]`` when ``argv`` is ``None``)."""
    p = ArgumentParser(prog=prog, description=__doc__, epilog=EPILOG)
    add_arguments(p)
    return p.parse_args(argv)


def _resolve_model(path: str) -> Path:
    """The model state file, or a ``UsageError`` with the next step."""
    try:
        return resolve_model_state(path)
    except ModelStateError:
        if path == DEFAULT_MODEL:
            fail(
                f"no model state at the default --model {DEFAULT_MODEL!r} (no "
                f"{MODEL_STATE_FILE} there): run `riftco pretrain` (or "
                "examples/pretrain.py) first, or pass --model FOLDER"
            )
        folder = Path(path)
        if any((d / ADAPTER_CONFIG).is_file() for d in (folder, folder / ADAPTER_DIR)):
            fail(
                f"--model {path!r} holds LoRA adapters only, not a model: pass the base model it "
                "was trained from (its training_metadata.json names it as base_model)"
            )
        raise


def run(args: argparse.Namespace, prog: str = "riftco post-train") -> None:
    """Checks every flag, then samples, fine-tunes, saves, plots and samples again (see the
    module docstring). Bad input raises before any folder exists."""
    rank = start_data_parallel(args)
    # Absolute: the run records it as its base model, read again from any folder.
    state = _resolve_model(args.model).absolute()
    if args.frozen_weights_dtype not in (None, "float32") and args.fine_tuning_method != "lora":
        fail(
            f"--frozen-weights-dtype {args.frozen_weights_dtype} needs --fine-tuning-method lora "
            "(trainable weights stay float32)"
        )
    if args.frozen_weights_dtype in HALF_DTYPES and args.device != "cpu":
        fail(
            f"--frozen-weights-dtype {args.frozen_weights_dtype} stores the base on the CPU "
            f"only (16-bit storage has no GPU path); got --device {args.device} (use float32 or "
            "a quantized format such as nf4 or q8_0 there)"
        )
    model = load_model(
        state,
        attention=args.attention,
        activation_checkpointing=args.activation_checkpointing,
        activation_memory_budget=args.activation_memory_budget,
        # Read straight into the storage asked for; by default a GGUF's quantized blocks stay
        # as stored under LoRA (on the CPU and on a GPU), and anything else reads float32.
        dtype=args.frozen_weights_dtype
        or (None if args.fine_tuning_method == "lora" else "float32"),
    )
    if (
        args.device != "cpu"
        and args.frozen_weights_dtype is None
        and model.frozen_weights_dtype in HALF_DTYPES
    ):
        # A GGUF's F16 / BF16 matrices: 16-bit storage lives on the CPU only.
        model.set_frozen_weights_dtype("float32")
    model.to(args.device)
    max_seq_len = int(model.config.max_seq_len)
    seq_len = min(max_seq_len, DEFAULT_MAX_SEQ_LEN) if args.seq_len is None else args.seq_len
    if seq_len > max_seq_len:
        fail(
            f"--seq-len {seq_len} exceeds the model's max_seq_len {max_seq_len}; pass a "
            f"--seq-len of at most {max_seq_len}"
        )
    d_model = int(model.config.d_model)
    if args.fine_tuning_method == "lora" and args.lora_rank > d_model:
        fail(
            f"--lora-rank {args.lora_rank} exceeds the model's d_model {d_model}; pass a "
            f"--lora-rank of at most {d_model}"
        )
    prompt, n_new = check_sample_args(
        args.prompt, args.sample_tokens, args.temperature, args.top_k, args.seed, max_seq_len
    )
    lr = args.lr if args.lr is not None else (3e-3 if args.fine_tuning_method == "lora" else 5e-4)
    config = PostTrainingConfig(
        fine_tuning_method=args.fine_tuning_method,
        activation_checkpointing=args.activation_checkpointing,
        activation_memory_budget=args.activation_memory_budget,
        loss_chunk_bytes=args.loss_chunk_bytes,
        attention=args.attention,
        lora_rank=args.lora_rank,
        lora_alpha=args.lora_alpha,
        lora_mlp=args.lora_mlp,
        attention_dropout=args.attention_dropout,
        residual_dropout=args.residual_dropout,
        lora_dropout=args.lora_dropout,
        frozen_weights_dtype=args.frozen_weights_dtype,
        packing=args.packing,
        steps=args.steps,
        batch_size=args.batch_size,
        seq_len=seq_len,
        lr=lr,
        warmup_steps=args.warmup_steps,
        seed=args.seed,
        save_every=args.save_every,
        keep_checkpoints=args.keep_checkpoints,
        eval_every=args.eval_every,
        log_every=args.log_every,
        device=args.device,
        data_parallel=args.data_parallel,
        zero=args.zero,
        zero3_gather_budget=args.zero3_gather_budget,
        data_parallel_timeout_s=args.data_parallel_timeout,
    )
    try:
        tokenizer, chat_template = _model_tokenizer(state)
    except (ImportError, TokenError, ModelStateError) as e:
        fail(str(e))
    vocab_size = int(model.config.vocab_size)
    if tokenizer is None and vocab_size > 256:
        # Bytes (0..255) are a byte-level model's tokens; a larger vocabulary needs its
        # tokenizer, or the data would train as bytes on a model that reads them as other tokens.
        fail(
            f"{str(state)!r} has no tokenizer (no tokenizer.json beside it) and a vocabulary of "
            f"{vocab_size} tokens: only a byte-level model (vocab_size <= 256) trains on bytes; "
            "put the model's tokenizer.json (and tokenizer_config.json) in its folder"
        )
    corpus: Corpus | ExampleCorpus
    example_data = is_example_data(args.data) if args.data else args.data_format == "chat"
    if args.data and args.data_format == "chat" and not example_data:
        fail(
            f"--data-format chat needs .jsonl/.json files; --data {args.data[0]!r} is text "
            "(drop --data-format chat to train on it as text)"
        )
    if example_data:
        corpus = _examples(
            args, state, seq_len, tokenizer, int(model.config.vocab_size), chat_template
        )
        check_examples(corpus, config.validation_fraction)
    else:
        corpus = load_corpus(args.data) if args.data else default_post_training_corpus()
        if tokenizer is not None:
            corpus = tokenize_corpus(corpus, tokenizer, int(model.config.vocab_size))
        check_corpus(corpus, seq_len, config.validation_fraction)
    # A budget below the smallest achievable peak fails here, before the sample and before any
    # folder exists (run_post_training plans again with the adapters).
    model.activation_checkpointing_plan(config.batch_size, config.seq_len)
    if args.resume and args.overwrite:
        fail("--resume and --overwrite exclude each other: pass one of them")
    check_run_folder(
        args.out,
        {
            "stage": f"post_training_{args.fine_tuning_method}",
            "base_model": str(state),
            "training_config": config.to_dict(),
            "corpus": corpus.description,
        },
        args.overwrite or args.resume,
    )
    with output_folder(args.out) as out:
        if args.fine_tuning_method == "full" and not rank:
            # The run is a whole model: it carries its tokenizer, as the base did.
            try:
                save_tokenizer(load_tokenizer(state), out)
            except (ImportError, TokenError, ModelStateError, ChatTemplateError) as e:
                fail(str(e))
        _train(args, model, config, corpus, out, prompt, n_new, state, tokenizer)


def _model_tokenizer(state: Path) -> tuple[Any | None, ChatTemplate | None]:
    """The ``tokenizers.Tokenizer`` the corpus is tokenized with and the chat template rows are
    rendered with: a GGUF file's own (rebuilt from its ``tokenizer.ggml.*`` metadata, and its
    ``tokenizer.chat_template``); else the model folder's ``tokenizer.json`` (``None``: byte
    tokens) and ``None`` (the folder's template is read with the rows).

    Raises:
        ModelStateError: a GGUF whose tokenizer metadata is missing or malformed.
        ImportError, TokenError: as :func:`riftco.data.hf_tokenizer.load_folder_tokenizer`.
    """
    if state.is_file() and is_gguf(state):
        tokenizer = load_tokenizer(state)
        return tokenizer.backend, tokenizer.chat_template
    return load_folder_tokenizer(state), None


def _examples(
    args: argparse.Namespace,
    state: Path,
    seq_len: int,
    tokenizer: Any | None,
    vocab_size: int,
    chat_template: ChatTemplate | None = None,
) -> ExampleCorpus:
    """The .jsonl/.json rows of ``--data`` as examples, through the model's tokenizer and chat
    template (``chat_template``, else the folder's; the default byte template for a folder
    without one)."""
    try:
        source = args.data or RowObjects(stdlib_instructions(), "riftco.stdlib_instructions")
        overlong: Literal["error", "truncate", "skip"] = args.overlong or (
            "error" if args.data else "skip"
        )
        examples, built = load_example_corpus(
            source,
            state.parent,
            seq_len=seq_len,
            tokenizer=tokenizer,
            vocab_size=vocab_size,
            chat_template=chat_template,
            train_on=args.train_on,
            overlong=overlong,
        )
    except ImportError as e:
        fail(str(e))
    except OverlongExampleError as e:
        fail(
            f"{e.source}: {e.tokens:,} tokens, more than --seq-len {seq_len:,} + 1 (pass "
            "--overlong truncate or skip, or a larger --seq-len)"
        )
    except DatasetError as e:
        fail(str(e))
    if built.n_truncated or built.n_skipped:
        log(
            f"--overlong {overlong}: {built.n_truncated:,} examples cut to {seq_len + 1:,} "
            f"tokens, {built.n_skipped:,} left out (first: "
            f"{(built.truncated or built.skipped)[0]})"
        )
    return examples


def _train(
    args: argparse.Namespace,
    model: DecoderOnlyTransformer,
    config: PostTrainingConfig,
    corpus: Corpus | ExampleCorpus,
    out: Path,
    prompt: bytes,
    n_new: int,
    state: Path,
    tokenizer: Any | None = None,
) -> None:
    unit = "bytes" if tokenizer is None else "tokens"
    if isinstance(corpus, ExampleCorpus):
        log_later(examples_line(corpus, config.validation_fraction))
    else:
        log_later(corpus_line(corpus, config.validation_fraction, unit))

    held_out = (
        corpus.split(config.validation_fraction)[1]
        if isinstance(corpus, ExampleCorpus)
        else None
    )
    chat_samples: list[dict[str, str]] = []
    # In a data-parallel run rank 0 alone samples and reports.
    rank = 0 if not args.data_parallel else distributed.init().rank

    def sample(when: str) -> None:
        if rank:
            return
        # The sample before training is printed once the stage has started (its checks passed).
        say: Callable[[str], None] = print_later if when == "before" else print
        if held_out is not None:
            say(f"--- answers to held-out prompts {when} post-training ---")
            got = answer_samples(
                model,
                held_out,
                count=3,
                max_new_tokens=n_new,
                tokenizer=tokenizer,
                stop=None if tokenizer is not None else "<|end|>",
                temperature=args.temperature,
                top_k=args.top_k,
                seed=args.seed,
            )
            for s in got:
                say(f"{s['prompt']}{s['generated']}\n    (reference: {s['reference']})")
                chat_samples.append({"when": when, **s})
            return
        say(f"--- sample {when} post-training ---")
        if tokenizer is not None:
            ids = tokenizer.encode(decode_bytes(prompt)).ids
            room = int(model.config.max_seq_len) - len(ids) + 1
            new = generate_ids(
                model,
                ids,
                max(0, min(n_new, room)),
                temperature=args.temperature,
                top_k=args.top_k,
                seed=args.seed,
            )
            say(tokenizer.decode(ids + new))
            return
        text = generate(
            model, prompt, n_new, temperature=args.temperature, top_k=args.top_k, seed=args.seed
        )
        say(decode_bytes(prompt + text))

    sample("before")
    metadata = run_post_training(
        model,
        config,
        corpus,
        out,
        progress=not args.no_progress,
        log=stage_log,
        resume=args.resume,
        overwrite=not args.resume,
        base_model=state,
        plots=not args.no_plots,
    )
    if rank:
        return
    print(
        f"{args.fine_tuning_method} post-training: final loss {metadata['final_loss']:.4f}; "
        f"validation loss {metadata['validation_loss_before']:.4f} -> "
        f"{metadata['validation_loss_after']:.4f}; {metadata['tokens_per_s']:,.0f} tokens/s; "
        f"{metadata['wall_time_s']:.1f} s"
    )
    if args.fine_tuning_method == "lora":
        saved = f"{out / ADAPTER_DIR} (PEFT adapter)"
    else:
        saved = f"{out / MODEL_STATE_FILE}, {out / 'config.json'}"
    print(f"saved {saved} and {out / METADATA_FILE}")
    sample("after")
    if chat_samples:
        path = out / SAMPLES_FILE
        path.write_text(
            "".join(json.dumps(s, ensure_ascii=False) + "\n" for s in chat_samples),
            encoding="utf-8",
        )
        print(f"saved the answers before and after in {path}")
