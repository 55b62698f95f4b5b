"""Greedy decoding speed on a real GGUF model: riftco beside transformers, on the same weights.

Both sides load the same GGUF file dequantized to float32 (riftco with ``riftco.load_model``,
transformers with ``from_pretrained(..., gguf_file=...)``), take the same prompt token ids (the
chat template of the file, rendered by riftco's tokenizer) and decode greedily. Rounds alternate
riftco / transformers in one process, each side on the same number of threads.

What is timed is decoding, not the prompt: riftco's time for ``--tokens`` steps after the
prompt is in its K/V cache; transformers' ``generate`` of ``--tokens + 1`` new tokens minus its
``generate`` of 1 new token (which is the prompt's forward and the first token), both with
no end-of-sequence stop on either side. The continuations are compared token by token.

Decoding one token reads every weight once, so the bound is memory bandwidth: the script
measures this machine's read bandwidth (NumPy threads summing float32 arrays, as many as riftco's
kernel threads) and prints how close each side runs to it.

    python benches/decode_real_model.py                       # the cached SmolLM2 GGUF
    python benches/decode_real_model.py --gguf model.gguf --tokens 64 --rounds 5

Needs riftco, and for the peer torch, transformers, accelerate and gguf (``--no-torch``: riftco
only). The SmolLM2-135M-Instruct GGUF is fetched by ``scripts/fetch_smollm2.sh``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

import riftco

DEFAULT_GGUF = Path(
    os.environ.get(
        "RIFTCO_SMOLLM2_GGUF",
        Path.home() / ".cache/riftco/models/SmolLM2-135M-Instruct.Q4_1.gguf",
    )
)
PROMPT = "What is the capital of France? Answer in one sentence, then explain why."


def read_bandwidth_gbs(threads: int) -> float:
    """GB/s read by ``threads`` threads each summing its own 512 MiB float32 array with NumPy
    (which releases the GIL in the sum), best of 3: the machine's streaming-read rate."""
    import threading

    arrays = [np.ones(2**27, dtype=np.float32) for _ in range(threads)]
    best = float("inf")
    for _ in range(3):
        workers = [threading.Thread(target=a.sum) for a in arrays]
        t0 = time.perf_counter()
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        best = min(best, time.perf_counter() - t0)
    return sum(a.nbytes for a in arrays) / best / 1e9


def riftco_decode(model: Any, prompt: list[int], n: int) -> tuple[float, list[int]]:
    session = model.decode_session()
    logits = None
    for t in prompt:
        logits = session.decode_token(t)
    assert logits is not None
    out: list[int] = []
    t0 = time.perf_counter()
    for _ in range(n):
        token = int(np.argmax(logits))
        out.append(token)
        logits = session.decode_token(token)
    return time.perf_counter() - t0, out


def torch_decode(model: Any, prompt: list[int], n: int) -> tuple[float, list[int]]:
    import torch

    ids = torch.tensor([prompt])

    def run(new: int) -> tuple[float, list[int]]:
        t0 = time.perf_counter()
        with torch.no_grad():
            out = model.generate(ids, max_new_tokens=new, do_sample=False, pad_token_id=0)
        return time.perf_counter() - t0, out[0, len(prompt):].tolist()

    first, _ = run(1)
    total, tokens = run(n + 1)
    return total - first, tokens[:n]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gguf", type=Path, default=DEFAULT_GGUF)
    parser.add_argument("--tokens", type=int, default=48)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--no-torch", action="store_true")
    parser.add_argument("--json", type=Path, help="write the figures here")
    args = parser.parse_args()
    if not args.gguf.is_file():
        sys.exit(f"no GGUF at {args.gguf}: run scripts/fetch_smollm2.sh or pass --gguf")

    threads = riftco.num_threads()
    t0 = time.perf_counter()
    model = riftco.load_model(args.gguf)
    riftco_load = time.perf_counter() - t0
    tokenizer = riftco.load_tokenizer(args.gguf)
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": PROMPT}], add_generation_prompt=True
    )
    prompt = tokenizer.encode(text)
    # f32 bytes read per token: every weight once (the embedding lookup reads one row, a tied
    # head the whole table, so the table counts once either way).
    weight_bytes = 4 * sum(int(np.prod(p.shape)) for p in model.parameters())

    peer = None
    if not args.no_torch:
        import torch
        from transformers import AutoModelForCausalLM

        torch.set_num_threads(threads)
        t0 = time.perf_counter()
        peer = AutoModelForCausalLM.from_pretrained(
            str(args.gguf.parent), gguf_file=args.gguf.name, dtype=torch.float32
        ).eval()
        # Greedy to the last token on both sides: no end-of-sequence stop (riftco's loop
        # ignores it too), and no min_new_tokens, which would mask the EOS logit instead.
        peer.generation_config.eos_token_id = None
        print(f"transformers load {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    bandwidth = read_bandwidth_gbs(threads)

    rates: dict[str, list[float]] = {"riftco": [], "transformers": []}
    tokens: dict[str, list[int]] = {}
    for r in range(args.rounds):
        dt, tokens["riftco"] = riftco_decode(model, prompt, args.tokens)
        rates["riftco"].append(args.tokens / dt)
        if peer is not None:
            dt, tokens["transformers"] = torch_decode(peer, prompt, args.tokens)
            rates["transformers"].append(args.tokens / dt)
        print(
            f"round {r + 1}: "
            + ", ".join(f"{k} {v[-1]:.1f} tokens/s" for k, v in rates.items() if v),
            file=sys.stderr,
        )

    result: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d"),
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores",
        "simd": riftco.simd_level(),
        "threads": threads,
        "gguf": args.gguf.name,
        "prompt_tokens": len(prompt),
        "new_tokens": args.tokens,
        "weight_mb_per_token": weight_bytes / 1e6,
        "read_bandwidth_gbs": bandwidth,
        "riftco_load_s": riftco_load,
    }
    print(
        f"{args.gguf.name}: {len(prompt)} prompt tokens, {args.tokens} decoded greedily, "
        f"{threads} threads, SIMD {riftco.simd_level()}; {weight_bytes / 1e6:.0f} MB of f32 "
        f"weights per token; {threads} threads read {bandwidth:.1f} GB/s "
        f"(bound {bandwidth * 1e9 / weight_bytes:.1f} tokens/s)"
    )
    for name, values in rates.items():
        if not values:
            continue
        median = statistics.median(values)
        result[name] = {"tokens_per_s": values, "median": median}
        print(
            f"  {name:>12}: median {median:.1f} tokens/s "
            f"({', '.join(f'{v:.1f}' for v in values)}), "
            f"{median * weight_bytes / 1e9:.1f} GB/s of weights"
        )
    if rates["transformers"]:
        ratio = statistics.median(rates["riftco"]) / statistics.median(rates["transformers"])
        same = 0
        for a, b in zip(tokens["riftco"], tokens["transformers"]):
            if a != b:
                break
            same += 1
        result["ratio"] = ratio
        result["identical_prefix_tokens"] = same
        print(f"  riftco / transformers: {ratio:.2f}x; continuations identical for {same} of "
              f"{args.tokens} tokens")
        print(f"  riftco: {tokenizer.decode(tokens['riftco'])!r}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
