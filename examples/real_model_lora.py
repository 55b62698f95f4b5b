"""Teach a real trained model a new habit with LoRA, from Python, and show it before and after.

SmolLM2-135M-Instruct (Apache-2.0) as the llama.cpp GGUF file people download
(``bash scripts/fetch_smollm2.sh`` puts it in ``~/.cache/riftco/models``): riftco loads the file,
rebuilds its tokenizer and chat template from the file's metadata, renders 40 chat rows
("Say the code word N." -> "The code word is riftco-N.") with that template, holds 2 out, trains
LoRA adapters (rank 8 on the attention projections) with the loss on the answers only, and prints
the held-out answers and the answer-token validation loss before and after, plus the answer to a
number it never saw and to an unrelated question (is the rest of the model still there?).

    .venv/bin/python examples/real_model_lora.py                     # 20 steps, about 25 s
    .venv/bin/python examples/real_model_lora.py --steps 40 --lr 5e-4 --out runs/codeword

The command line does the same with ``riftco post-train --model <file.gguf> --data rows.jsonl``
(docs/real-models.md).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

try:
    import riftco
    from riftco.data.instruct_corpus import RowObjects, load_example_corpus
except ModuleNotFoundError as e:  # run by an interpreter without the package (the system python3)
    print(
        f"real_model_lora.py: error: {e} in {sys.executable}: riftco is installed in the "
        "repository's .venv; run `bash scripts/setup.sh` once, then "
        "`.venv/bin/python examples/real_model_lora.py`",
        file=sys.stderr,
    )
    sys.exit(2)

DEFAULT_GGUF = Path(
    os.environ.get("RIFTCO_SMOLLM2_GGUF")
    or Path.home() / ".cache/riftco/models/SmolLM2-135M-Instruct.Q4_1.gguf"
)


def codeword_rows(n: int) -> list[dict[str, object]]:
    return [
        {
            "messages": [
                {"role": "user", "content": f"Say the code word {i}."},
                {"role": "assistant", "content": f"The code word is riftco-{i}."},
            ]
        }
        for i in range(1, n + 1)
    ]


def answer(model: riftco.DecoderOnlyTransformer, tok: riftco.Tokenizer, question: str) -> str:
    prompt = tok.apply_chat_template(
        [{"role": "user", "content": question}], add_generation_prompt=True
    )
    text = riftco.generate(model, prompt, 24, temperature=0.0, tokenizer=tok)
    assert isinstance(text, str)
    return text.strip()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gguf", type=Path, default=DEFAULT_GGUF)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--out", default="runs/smollm2-codeword")
    args = parser.parse_args()
    if not args.gguf.is_file():
        sys.exit(
            f"real_model_lora.py: error: no GGUF at {args.gguf}: run "
            "`bash scripts/fetch_smollm2.sh` (or pass --gguf)"
        )

    model = riftco.load_model(args.gguf)
    tok = riftco.load_tokenizer(args.gguf)
    corpus, _ = load_example_corpus(
        RowObjects(codeword_rows(40), "code-word rows"),
        None,
        seq_len=64,
        tokenizer=tok.backend,
        vocab_size=model.config.vocab_size,
        chat_template=tok.chat_template,
    )
    held_out = ["Say the code word 39.", "Say the code word 40."]
    probes = ["Say the code word 123.", "What is the capital of France?"]
    before = {q: answer(model, tok, q) for q in held_out + probes}

    config = riftco.PostTrainingConfig(
        fine_tuning_method="lora", steps=args.steps, batch_size=4, seq_len=64, lr=args.lr,
        warmup_steps=2, validation_fraction=0.05, eval_every=args.steps,
    )
    meta = riftco.run_post_training(
        model, config, corpus, args.out, progress=False, plots=False, base_model=args.gguf,
        overwrite=True,
    )
    print(
        f"LoRA post-training of {args.gguf.name}, {args.steps} steps: answer-token validation "
        f"loss {meta['validation_loss_before']:.4f} -> {meta['validation_loss_after']:.4f} "
        f"({meta['train_time_s']:.1f} s)"
    )
    for q in held_out + probes:
        print(f"{q}\n  before: {before[q]}\n  after:  {answer(model, tok, q)}")


if __name__ == "__main__":
    main()
