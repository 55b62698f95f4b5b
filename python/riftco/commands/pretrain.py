"""``riftco pretrain``: pretrain a small LLaMA-style byte-level language model on real text.

With no arguments it trains the main job (d_model 128, 4 heads, 4 layers, 600 Adam steps of
16 x 128 bytes) on the source of the running interpreter's standard library
(``riftco.default_corpus()``), writes ``runs/pretrain/{model.safetensors, config.json,
training_metadata.json}`` (and ``loss.png``, ``memory.png`` when matplotlib is installed), then
prints a generated sample. ``--data PATH...`` trains on given text files or folders instead.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

from riftco._native import (
    ATTENTION_KINDS,
    ModelStateError,
    TokenError,
    TransformerConfig,
    Variable,
    num_threads,
    parse_activation_checkpointing,
    simd_level,
)
from riftco.commands._runs import (
    activation_peak,
    check_corpus,
    check_run_folder,
    corpus_line,
    log_later,
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
from riftco.data.chat_template import ChatTemplateError
from riftco.data.hf_tokenizer import tokenize_corpus
from riftco.data.text import VOCAB_SIZE, Corpus, decode_bytes, default_corpus, load_corpus
from riftco.data.tokenizer import Tokenizer
from riftco.generation import generate
from riftco.training.configs import LR_SCHEDULES, PretrainingConfig
from riftco.training.tokenizers import load_tokenizer, save_tokenizer
from riftco.training.stages import (
    METADATA_FILE,
    MODEL_STATE_FILE,
    UNIFORM_BASELINE_LOSS,
    load_model,
    run_pretraining,
)

__all__ = ["DEFAULT_OUT", "add_arguments", "parse_args", "run"]

DEFAULT_OUT = "runs/pretrain"

EPILOG = """examples:
  riftco pretrain                                             # the main job
  riftco pretrain --activation-checkpointing block --out runs/pretrain-block
  riftco pretrain --device gpu --out runs/pretrain-gpu        # on the best GPU adapter
  riftco pretrain --activation-memory-budget 64MiB --out runs/pretrain-budget
  riftco pretrain --data notes/ book.txt --out runs/mine
  riftco pretrain --tokenizer SmolLM2-135M-Instruct.Q4_1.gguf --out runs/bpe   # its vocabulary

exit codes: 0 done, 2 bad input (one "error:" line on stderr), 130 interrupted with Ctrl-C
(the last periodic save is left intact)."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The flags of ``riftco pretrain`` (and ``examples/pretrain.py``)."""
    data = p.add_argument_group("data and output")
    data.add_argument(
        "--data",
        nargs="+",
        metavar="PATH",
        help="text files or folders, read byte for byte (default: the embedded stdlib-source "
        "corpus)",
    )
    data.add_argument(
        "--tokenizer",
        metavar="PATH",
        help="tokenize the corpus with this model's tokenizer (a Hugging Face folder with "
        "tokenizer.json, or a GGUF file): the new model gets its vocabulary and BOS/EOS ids, and "
        "the run folder its tokenizer.json and tokenizer_config.json (default: byte tokens)",
    )
    data.add_argument("--out", default=DEFAULT_OUT, metavar="DIR", help="output folder")
    data.add_argument(
        "--overwrite",
        action="store_true",
        help="replace a run of another configuration in --out (without it that is refused)",
    )
    add_resume_argument(data)
    data.add_argument(
        "--no-plots", action="store_true", help="do not write loss.png and memory.png"
    )
    train = p.add_argument_group("training")
    add_device_argument(train)
    add_data_parallel_arguments(train)
    add_checkpointing_arguments(train)
    train.add_argument(
        "--attention",
        choices=ATTENTION_KINDS,
        default="flash",
        help="full-sequence attention kind",
    )
    train.add_argument("--steps", type=int_range(1), default=600, help="optimizer steps")
    train.add_argument(
        "--batch-size", type=int_range(1), default=16, help="sequences per step"
    )
    train.add_argument(
        "--seq-len", type=int_range(1), default=128, help="tokens (bytes without --tokenizer) per sequence (<= --max-seq-len)"
    )
    train.add_argument("--lr", type=float, default=3e-3, help="peak learning rate")
    train.add_argument(
        "--warmup-steps", type=int_range(0), default=50, help="linear warm-up steps"
    )
    train.add_argument(
        "--lr-schedule",
        choices=LR_SCHEDULES,
        default="cosine",
        help="after the warm-up: cosine decay to lr/10, or constant",
    )
    train.add_argument("--weight-decay", type=float, default=0.0, help="> 0 selects AdamW")
    train.add_argument(
        "--seed", type=int_range(0), default=0, help="seeds weights and batch sampling"
    )
    train.add_argument(
        "--save-every", type=int_range(1), default=100, metavar="STEPS", help="steps between saves"
    )
    train.add_argument(
        "--keep-checkpoints",
        type=int_range(1),
        default=3,
        metavar="N",
        help="how many of the newest training checkpoints to keep in --out/checkpoints",
    )
    train.add_argument(
        "--eval-every",
        type=int_range(1),
        default=50,
        metavar="STEPS",
        help="steps between validation losses (recorded in training_metadata.json)",
    )
    train.add_argument(
        "--log-every",
        type=int_range(1),
        default=10,
        metavar="STEPS",
        help="steps between log lines with --no-progress",
    )
    train.add_argument(
        "--no-progress", action="store_true", help="log lines instead of a progress bar"
    )
    model = p.add_argument_group("model size")
    model.add_argument("--d-model", type=int_range(1), default=128, help="embedding width")
    model.add_argument("--n-heads", type=int_range(1), default=4, help="attention heads")
    model.add_argument(
        "--n-kv-heads",
        type=int_range(1),
        default=None,
        help="key/value heads of grouped-query attention, dividing --n-heads "
        "(default: --n-heads, multi-head attention)",
    )
    model.add_argument(
        "--tie-word-embeddings",
        action="store_true",
        help="the LM head reads the token embedding matrix (one parameter)",
    )
    model.add_argument("--n-layers", type=int_range(1), default=4, help="transformer blocks")
    model.add_argument("--d-ff", type=int_range(1), default=344, help="SwiGLU hidden width")
    model.add_argument(
        "--max-seq-len", type=int_range(1), default=128, help="positions the model supports"
    )
    add_dropout_arguments(model, lora=False)
    sample = p.add_argument_group("sample")
    sample.add_argument("--prompt", default="def ", help="prompt of the printed sample")
    sample.add_argument(
        "--max-new-tokens",
        "--sample-tokens",
        dest="sample_tokens",
        type=int_range(0),
        default=None,
        help=f"bytes to generate (default: {DEFAULT_SAMPLE_BYTES}, fewer when "
        "--max-seq-len leaves fewer positions after the prompt); --sample-tokens is an alias",
    )
    sample.add_argument(
        "--temperature", type=non_negative_float, default=0.8, help="0 is greedy"
    )
    sample.add_argument("--top-k", type=int_range(1), default=40, help="sample among the k likeliest")


def parse_args(argv: list[str] | None = None, prog: str = "riftco pretrain") -> argparse.Namespace:
    """Parses the flags (``sys.argv[1:]`` when ``argv`` is ``None``)."""
    p = ArgumentParser(prog=prog, description=__doc__, epilog=EPILOG)
    add_arguments(p)
    return p.parse_args(argv)


def run(args: argparse.Namespace, prog: str = "riftco pretrain") -> None:
    """Checks every flag, then trains, saves, plots and prints a sample (see the module
    docstring). Bad input raises ``UsageError`` or a ``RiftcoError`` before any folder exists."""
    rank = start_data_parallel(args)
    tokenizer = _tokenizer(args.tokenizer)
    model_config = TransformerConfig(
        vocab_size=VOCAB_SIZE if tokenizer is None else tokenizer.vocab_size,
        bos_token_id=None if tokenizer is None else tokenizer.bos_token_id,
        eos_token_ids=None if tokenizer is None else sorted(tokenizer.stop_token_ids),
        d_model=args.d_model,
        n_heads=args.n_heads,
        n_kv_heads=args.n_kv_heads,
        tie_word_embeddings=args.tie_word_embeddings,
        n_layers=args.n_layers,
        d_ff=args.d_ff,
        max_seq_len=args.max_seq_len,
        seed=args.seed,
        attention_dropout=args.attention_dropout,
        residual_dropout=args.residual_dropout,
    )
    config = PretrainingConfig(
        attention=args.attention,
        activation_checkpointing=args.activation_checkpointing,
        activation_memory_budget=args.activation_memory_budget,
        loss_chunk_bytes=args.loss_chunk_bytes,
        steps=args.steps,
        batch_size=args.batch_size,
        seq_len=args.seq_len,
        lr=args.lr,
        warmup_steps=args.warmup_steps,
        lr_schedule=args.lr_schedule,
        weight_decay=args.weight_decay,
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
    if args.seq_len > args.max_seq_len:
        fail(
            f"--seq-len {args.seq_len} exceeds --max-seq-len {args.max_seq_len}; pass a "
            f"--seq-len of at most {args.max_seq_len} or a larger --max-seq-len"
        )
    prompt, n_new = check_sample_args(
        args.prompt, args.sample_tokens, args.temperature, args.top_k, args.seed, args.max_seq_len
    )
    # The policy against the model's depth before anything is created (exit 2, no folder).
    parse_activation_checkpointing(
        args.activation_checkpointing, args.activation_memory_budget, n_layers=args.n_layers
    )
    # The device is opened before the corpus is read or anything logged: a GPU without adapter
    # is one error line (DeviceUnavailableError names what was looked for and what was found).
    device = str(Variable(0.0).to(args.device).device)
    corpus = load_corpus(args.data) if args.data else default_corpus()
    if tokenizer is not None:
        try:
            corpus = tokenize_corpus(corpus, tokenizer.backend, tokenizer.vocab_size)
        except TokenError as e:
            fail(str(e))
    check_corpus(corpus, args.seq_len, config.validation_fraction)
    if args.resume and args.overwrite:
        fail("--resume and --overwrite exclude each other: pass one of them")
    check_run_folder(
        args.out,
        {
            "stage": "pretraining",
            "model_config": model_config.to_dict(),
            "training_config": config.to_dict(),
            "corpus": corpus.description,
        },
        args.overwrite or args.resume,
    )
    with output_folder(args.out) as out:
        # The device opened, for the log ("gpu" is vulkan or metal).
        device_line = device if device == args.device else f"{device} (--device {args.device})"
        if tokenizer is not None and not rank:
            save_tokenizer(tokenizer, out)
        _train(
            args, model_config, config, corpus, out, prompt, n_new, device_line, rank, tokenizer
        )


def _tokenizer(path: str | None) -> Tokenizer | None:
    """The tokenizer of ``--tokenizer`` (``None`` without it: byte tokens); one error line when
    it cannot be loaded or is byte tokens itself."""
    if path is None:
        return None
    try:
        tokenizer = load_tokenizer(path)
    except (ImportError, TokenError, ModelStateError, ChatTemplateError) as e:
        fail(f"--tokenizer {path}: {e}")
    if tokenizer.backend is None:
        fail(
            f"--tokenizer {path} has no tokenizer of its own (no tokenizer.json, not a GGUF): "
            "leave --tokenizer out for byte tokens"
        )
    return tokenizer


def _train(
    args: argparse.Namespace,
    model_config: TransformerConfig,
    config: PretrainingConfig,
    corpus: Corpus,
    out: Path,
    prompt: bytes,
    n_new: int,
    device_line: str,
    rank: int = 0,
    tokenizer: Tokenizer | None = None,
) -> None:
    unit = "bytes" if tokenizer is None else "tokens"
    log_later(corpus_line(corpus, config.validation_fraction, unit))
    log_later(
        f"model: d_model {args.d_model}, {args.n_heads} heads, {args.n_layers} layers, d_ff "
        f"{args.d_ff}; attention {args.attention}, activation checkpointing "
        f"{args.activation_checkpointing}"
        + (
            ""
            if args.activation_memory_budget is None
            else f", activation memory budget {args.activation_memory_budget:,} bytes"
        )
        + f"; device {device_line}; {num_threads()} kernel "
        f"thread{'' if num_threads() == 1 else 's'}, SIMD "
        f"{simd_level()}"
    )
    metadata = run_pretraining(
        model_config,
        config,
        corpus,
        out,
        progress=not args.no_progress,
        log=stage_log,
        resume=args.resume,
        overwrite=not args.resume,
        plots=not args.no_plots,
    )
    if rank:
        return  # rank 0 reports and samples
    vocab = model_config.vocab_size
    baseline = UNIFORM_BASELINE_LOSS if tokenizer is None else math.log(vocab)
    print(
        f"final loss {metadata['final_loss']:.4f} (uniform baseline ln {vocab} = "
        f"{baseline:.4f}); validation loss "
        f"{metadata['validation_loss_before']:.4f} -> {metadata['validation_loss_after']:.4f}; "
        f"{metadata['tokens_per_s']:,.0f} tokens/s; {activation_peak(metadata)}; "
        f"{metadata['wall_time_s']:.1f} s"
    )
    print(
        f"saved {out / MODEL_STATE_FILE}, {out / 'config.json'} and "
        f"{out / METADATA_FILE}"
    )
    model = load_model(out, attention=args.attention).to(args.device)
    if tokenizer is None:
        text = generate(
            model, prompt, n_new, temperature=args.temperature, top_k=args.top_k, seed=args.seed
        )
        print(f"--- sample (temperature {args.temperature}, top-k {args.top_k}, {n_new} bytes) ---")
        print(decode_bytes(prompt + text))
        return
    prompt_text = decode_bytes(prompt)
    continuation = generate(
        model, prompt_text, n_new, temperature=args.temperature, top_k=args.top_k,
        seed=args.seed, tokenizer=tokenizer,
    )
    print(f"--- sample (temperature {args.temperature}, top-k {args.top_k}, {n_new} tokens) ---")
    print(f"{prompt_text}{continuation}")
