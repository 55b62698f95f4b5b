"""Post-train (fine-tune) a model saved by ``examples/pretrain.py`` on other text.

By default it LoRA-fine-tunes ``runs/pretrain`` on the Python language reference that ships with
every CPython install (``pydoc_data/topics.py``, English prose the pretraining corpus excludes),
writes the adapter (PEFT layout) to ``runs/post_train/adapter`` with
``training_metadata.json``, and prints a sample before and after. ``--fine-tuning-method full``
trains every weight and writes ``model.safetensors`` instead.

    python examples/post_train.py
    python examples/post_train.py --fine-tuning-method full --activation-checkpointing block
    python examples/post_train.py --activation-checkpointing selective:dots
    python examples/post_train.py --activation-memory-budget 8MiB
    python examples/post_train.py --model runs/pretrain --data my_notes/ --lora-rank 16
    python examples/post_train.py --model path/to/hf-llama-folder --data my_notes/

``--model`` is a pretraining output folder or a plain Hugging Face Llama folder (``config.json``
with ``model.safetensors`` or shards, float32/bfloat16/float16). A folder with a
``tokenizer.json`` is tokenized with it (``pip install tokenizers``); one without is byte-level.

Exit codes: 0 done, 2 bad input (one ``error:`` line on stderr), 130 interrupted with Ctrl-C
(the last periodic save is left intact).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import riftco
from riftco.hf_tokenizer import generate_ids, load_folder_tokenizer, tokenize_corpus
from riftco.cli import (
    ArgumentParser,
    add_checkpointing_arguments,
    add_dropout_arguments,
    check_sample_args,
    fail,
    int_range,
    non_negative_float,
    output_folder,
    run_cli,
)

PROG = "post_train.py"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = ArgumentParser(
        prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--model",
        default="runs/pretrain",
        metavar="DIR",
        help="pretraining output folder or model.safetensors (default: %(default)s)",
    )
    p.add_argument(
        "--data",
        nargs="+",
        metavar="PATH",
        help="text files or folders (default: the stdlib's pydoc_data/topics.py)",
    )
    p.add_argument(
        "--out",
        default="runs/post_train",
        metavar="DIR",
        help="output folder (default: %(default)s)",
    )
    p.add_argument("--fine-tuning-method", choices=riftco.FINE_TUNING_METHODS, default="lora")
    add_checkpointing_arguments(p)
    p.add_argument("--attention", choices=riftco.ATTENTION_KINDS, default="flash")
    p.add_argument("--lora-rank", type=int_range(1), default=8)
    p.add_argument("--lora-alpha", type=float, default=16.0)
    p.add_argument("--lora-mlp", action="store_true", help="also adapt the MLP projections")
    add_dropout_arguments(p, lora=True, keep_model=True)
    p.add_argument("--steps", type=int_range(1), default=200)
    p.add_argument("--batch-size", type=int_range(1), default=8)
    p.add_argument(
        "--seq-len", type=int_range(1), default=None, help="default: the model's max_seq_len"
    )
    p.add_argument(
        "--lr",
        type=float,
        default=None,
        help="peak learning rate (default: 3e-3 for lora, 5e-4 for full)",
    )
    p.add_argument("--warmup-steps", type=int_range(0), default=10)
    p.add_argument("--seed", type=int_range(0), default=0)
    p.add_argument("--save-every", type=int_range(1), default=50, metavar="STEPS")
    p.add_argument("--log-every", type=int_range(1), default=10, metavar="STEPS")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--prompt", default="The ", help="prompt of the printed samples")
    p.add_argument("--sample-tokens", type=int_range(0), default=None)
    p.add_argument("--temperature", type=non_negative_float, default=0.8)
    p.add_argument("--top-k", type=int_range(1), default=40)
    return p.parse_args(argv)


def log(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def main() -> None:
    args = parse_args()
    model = riftco.load_model(
        args.model,
        attention=args.attention,
        activation_checkpointing=args.activation_checkpointing,
        activation_memory_budget=args.activation_memory_budget,
    )
    max_seq_len = int(model.config.max_seq_len)
    seq_len = max_seq_len if args.seq_len is None else args.seq_len
    if seq_len > max_seq_len:
        fail(f"--seq-len {seq_len} exceeds the model's max_seq_len {max_seq_len}")
    prompt, n_new = check_sample_args(
        args.prompt, args.sample_tokens, args.temperature, args.top_k, args.seed, max_seq_len
    )
    lr = args.lr if args.lr is not None else (3e-3 if args.fine_tuning_method == "lora" else 5e-4)
    config = riftco.PostTrainingConfig(
        fine_tuning_method=args.fine_tuning_method,
        activation_checkpointing=args.activation_checkpointing,
        activation_memory_budget=args.activation_memory_budget,
        attention=args.attention,
        lora_rank=args.lora_rank,
        lora_alpha=args.lora_alpha,
        lora_mlp=args.lora_mlp,
        attention_dropout=args.attention_dropout,
        residual_dropout=args.residual_dropout,
        lora_dropout=args.lora_dropout,
        steps=args.steps,
        batch_size=args.batch_size,
        seq_len=seq_len,
        lr=lr,
        warmup_steps=args.warmup_steps,
        seed=args.seed,
        save_every=args.save_every,
        log_every=args.log_every,
    )
    corpus = riftco.load_corpus(args.data) if args.data else riftco.default_post_training_corpus()
    try:
        tokenizer = load_folder_tokenizer(args.model)
    except (ImportError, riftco.TokenError) as e:
        fail(str(e))
    if tokenizer is not None:
        corpus = tokenize_corpus(corpus, tokenizer, int(model.config.vocab_size))
    # A budget below the smallest achievable peak fails here, before the sample and before any
    # folder exists (run_post_training plans again with the adapters).
    model.activation_checkpointing_plan(config.batch_size, config.seq_len)
    with output_folder(args.out) as out:
        train(args, model, config, corpus, out, prompt, n_new, tokenizer)


def train(
    args: argparse.Namespace,
    model: riftco.DecoderOnlyTransformer,
    config: riftco.PostTrainingConfig,
    corpus: riftco.Corpus,
    out: Path,
    prompt: bytes,
    n_new: int,
    tokenizer: Any | None = None,
) -> None:
    unit = "bytes" if tokenizer is None else "tokens"
    log(f"corpus: {len(corpus):,} {unit} in {len(corpus.files)} parts ({corpus.description})")

    def sample(when: str) -> None:
        print(f"--- sample {when} post-training ---")
        if tokenizer is not None:
            ids = tokenizer.encode(riftco.decode_bytes(prompt)).ids
            room = int(model.config.max_seq_len) - len(ids) + 1
            new = generate_ids(
                model, ids, max(0, min(n_new, room)), temperature=args.temperature,
                top_k=args.top_k, seed=args.seed,
            )
            print(tokenizer.decode(ids + new))
            return
        text = riftco.generate(
            model, prompt, n_new, temperature=args.temperature, top_k=args.top_k, seed=args.seed
        )
        print(riftco.decode_bytes(prompt + text))

    sample("before")
    metadata = riftco.run_post_training(
        model,
        config,
        corpus,
        out,
        progress=not args.no_progress,
        log=log,
        base_model=riftco.stages.resolve_model_state(args.model),
    )
    print(
        f"{args.fine_tuning_method} post-training: final loss {metadata['final_loss']:.4f}; "
        f"validation loss {metadata['validation_loss_before']:.4f} -> "
        f"{metadata['validation_loss_after']:.4f}; {metadata['tokens_per_s']:,.0f} tokens/s; "
        f"{metadata['wall_time_s']:.1f} s"
    )
    saved = out / (
        riftco.ADAPTER_DIR if args.fine_tuning_method == "lora" else riftco.MODEL_STATE_FILE
    )
    print(f"saved {saved} and {out / riftco.METADATA_FILE}")
    sample("after")


if __name__ == "__main__":
    run_cli(main, PROG)
