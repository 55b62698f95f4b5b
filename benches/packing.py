"""Training tokens/s and the fraction of real (non-pad) tokens, padded vs packed batches.

Trains a small model on an examples corpus of varied lengths (generated prompt/answer pairs,
or a JSONL dataset given with --data) with the padding sampler (one example per row) and the
packing sampler (first fit, position_ids restarting per example), interleaving the two so
that machine load affects both alike. Reports, per mode: the fraction of real tokens in the
batches, real (non-pad) tokens per second of optimizer step, and all tokens per second.

Usage: python benches/packing.py [--steps N] [--rounds R] [--seq-len S] [--batch-size B]
                                 [--data FILE.jsonl]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

import riftco


def generated_corpus(n: int, seq_len: int, seed: int = 0) -> riftco.ExampleCorpus:
    """Prompt/answer pairs whose lengths spread from 8 tokens to ``seq_len + 1`` (skewed short,
    as instruction data is)."""
    rng = np.random.default_rng(seed)
    pairs = []
    for _ in range(n):
        length = int(min(seq_len + 1, 8 + rng.exponential(seq_len / 4)))
        n_prompt = int(rng.integers(2, max(3, length // 2)))
        ids = rng.integers(0, 256, length)
        labels = ids.copy()
        labels[:n_prompt] = -100
        pairs.append((ids, labels))
    return riftco.examples_from_pairs(pairs, f"{n} generated pairs")


def run(model, sampler, steps: int) -> tuple[float, int, int]:
    """Seconds, real tokens and all tokens of ``steps`` optimizer steps."""
    opt = riftco.Adam(model.parameters(), lr=1e-3)
    real = total = 0
    seconds = 0.0
    for _ in range(steps):
        batch = sampler.next_batch()
        tokens, labels = batch[0], batch[1]
        positions = batch[2] if len(batch) == 3 else None
        t0 = time.perf_counter()
        loss = model.loss(tokens, labels=labels, position_ids=positions)
        loss.backward(retain_graph=False)
        opt.step()
        opt.zero_grad()
        float(loss.item())
        seconds += time.perf_counter() - t0
        total += tokens.size
        if positions is None:
            # One example per row, then padding (labels -100): the example ends at its last
            # target.
            real += sum(int(np.flatnonzero(r != -100)[-1]) + 1 for r in labels)
        else:
            real += real_tokens_packed(positions, labels)
    return seconds, real, total


def real_tokens_packed(positions, labels) -> int:
    """Tokens of the examples in packed rows: every span but a trailing padding span (the
    last span of a row whose labels are all -100)."""
    n = 0
    for p, lab in zip(positions, labels, strict=True):
        starts = list(np.flatnonzero(p == 0)) + [p.shape[0]]
        for a, b in zip(starts[:-1], starts[1:], strict=True):
            if b == p.shape[0] and np.all(lab[a:b] == -100):
                continue
            n += b - a
    return n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--data", default=None, help="a JSONL dataset (riftco.data loader)")
    args = ap.parse_args()
    config = riftco.TransformerConfig(vocab_size=256, d_model=128, n_heads=4, n_layers=4,
                                      d_ff=344, max_seq_len=args.seq_len)
    if args.data is None:
        corpus = generated_corpus(2000, args.seq_len)
    else:
        from riftco.data import instruct

        examples = instruct.build_examples(
            instruct.load_rows(args.data), max_len=args.seq_len + 1, overlong="skip"
        )
        corpus = riftco.examples_from_pairs(
            [(e.input_ids, e.labels) for e in examples], str(args.data)
        )
    model = riftco.DecoderOnlyTransformer(config, attention="flash",
                                          activation_checkpointing="block")
    totals = {False: [0.0, 0, 0], True: [0.0, 0, 0]}
    samplers = {
        p: riftco.ExampleBatchSampler(corpus, args.batch_size, args.seq_len, seed=0, packing=p)
        for p in (False, True)
    }
    run(model, samplers[False], 1)  # warm-up (plans, pools)
    run(model, samplers[True], 1)
    for _ in range(args.rounds):
        for packing in (False, True):
            s, real, total = run(model, samplers[packing], args.steps)
            acc = totals[packing]
            acc[0] += s
            acc[1] += real
            acc[2] += total
    print(f"corpus: {corpus.description}, {len(corpus)} examples, {corpus.n_tokens} tokens; "
          f"batch {args.batch_size} x seq {args.seq_len}; {args.rounds} rounds x {args.steps} "
          "steps each, interleaved")
    for packing in (False, True):
        s, real, total = totals[packing]
        print(f"{'packed ' if packing else 'padded '}: real-token fraction {real / total:.3f}, "
              f"{real / s:,.0f} real tokens/s, {total / s:,.0f} tokens/s")


if __name__ == "__main__":
    main()
