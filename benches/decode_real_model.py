"""Greedy decoding speed on a real GGUF model: riftco on the file's quantized blocks as stored,
riftco on the same weights dequantized to float32, llama.cpp on the same file, and transformers.

- ``riftco q``: ``riftco.load_model(gguf)`` keeps the file's blocks (Q4_1, Q8_0, ...); every
  one-token product reads them directly (the fused quantized mat-vec).
- ``riftco f32``: ``riftco.load_model(gguf, dtype="float32")``.
- ``llama.cpp``: llama-cpp-python (built from its source distribution) on the same file, with
  the same thread count, weights in plain CPU buffers (``use_extra_bufts = False``, llama-cli's
  ``--no-repack``: the 0.3.36 build crashes on this host's AMX repacking); skipped with the
  reason when it does not import.
- ``transformers``: ``from_pretrained(..., gguf_file=...)`` in float32 (``--no-torch``: off).

Every side takes the same prompt token ids (the chat template of the file, rendered by riftco's
tokenizer) and decodes greedily with no end-of-sequence stop. What is timed is decoding, not
the prompt: riftco's ``--tokens`` steps after the prompt is in its K/V cache; llama.cpp's
``--tokens`` tokens after its first one (the prompt's evaluation); transformers' ``generate`` of
``--tokens + 1`` new tokens minus its ``generate`` of 1. Rounds alternate the sides in one
process, each on the same number of threads. The continuations are compared token by token.

Decoding one token reads every weight once, so the bound is memory bandwidth: the script
measures this machine's read bandwidth (NumPy threads summing float32 arrays, as many as riftco's
kernel threads) and prints how close each riftco row runs to it (the quantized row reads the
file's bytes, the f32 row four bytes per weight).

    python benches/decode_real_model.py                       # the cached SmolLM2 GGUF
    python benches/decode_real_model.py --gguf model.gguf --tokens 64 --rounds 5

Needs riftco; for the peers llama-cpp-python, and torch, transformers, accelerate and gguf. The
SmolLM2-135M-Instruct GGUF is fetched by ``scripts/fetch_smollm2.sh``.
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


def llama_cpp_model(path: Path, threads: int) -> Any:
    """llama-cpp-python's model on ``path`` with weights in plain CPU buffers, or the reason it
    is not available."""
    try:
        import llama_cpp
        import llama_cpp.llama_cpp as lib
    except ImportError as e:
        return f"llama-cpp-python does not import ({e})"
    default_params = lib.llama_model_default_params

    def no_repack() -> Any:
        params = default_params()
        params.use_extra_bufts = False
        return params

    lib.llama_model_default_params = no_repack
    return llama_cpp.Llama(
        model_path=str(path), n_ctx=512, n_threads=threads, n_threads_batch=threads,
        verbose=False, seed=0,
    )


def llama_cpp_decode(llm: Any, prompt: list[int], n: int) -> tuple[float, list[int]]:
    llm.reset()
    out: list[int] = []
    t0 = 0.0
    for token in llm.generate(prompt, top_k=1, top_p=1.0, min_p=0.0, temp=0.0, repeat_penalty=1.0):
        if not out:
            t0 = time.perf_counter()  # the prompt is evaluated: time the next n tokens
        out.append(int(token))
        if len(out) == n + 1:
            break
    return time.perf_counter() - t0, out[:n]


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
    logits = session.decode_tokens(prompt)
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
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--no-torch", action="store_true", help="no transformers row")
    parser.add_argument("--no-llama-cpp", action="store_true", help="no llama.cpp row")
    parser.add_argument("--json", type=Path, help="write the figures here")
    args = parser.parse_args()
    if not args.gguf.is_file():
        sys.exit(f"no GGUF at {args.gguf}: run scripts/fetch_smollm2.sh or pass --gguf")

    threads = riftco.num_threads()
    t0 = time.perf_counter()
    quantized = riftco.load_model(args.gguf)
    riftco_load = time.perf_counter() - t0
    model = riftco.load_model(args.gguf, dtype="float32")
    tokenizer = riftco.load_tokenizer(args.gguf)
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": PROMPT}], add_generation_prompt=True
    )
    prompt = tokenizer.encode(text)
    # Bytes read per token: every weight once (the embedding lookup reads one row, a tied head
    # the whole table, so the table counts once either way): four bytes per weight in f32, the
    # file's own bytes for the quantized model.
    weight_bytes = 4 * sum(int(np.prod(p.shape)) for _, p in model.named_parameters())
    file_bytes = sum(int(i["n_bytes"]) for i in riftco.gguf_tensor_infos(args.gguf))

    llm = None if args.no_llama_cpp else llama_cpp_model(args.gguf, threads)
    if isinstance(llm, str):
        print(f"llama.cpp skipped: {llm}", file=sys.stderr)
        llm = None
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

    rates: dict[str, list[float]] = {
        "riftco q": [], "riftco f32": [], "llama.cpp": [], "transformers": []
    }
    tokens: dict[str, list[int]] = {}
    for r in range(args.rounds):
        runs: list[tuple[str, Any]] = [
            ("riftco q", lambda: riftco_decode(quantized, prompt, args.tokens)),
            ("riftco f32", lambda: riftco_decode(model, prompt, args.tokens)),
        ]
        if llm is not None:
            runs.append(("llama.cpp", lambda: llama_cpp_decode(llm, prompt, args.tokens)))
        if peer is not None:
            runs.append(("transformers", lambda: torch_decode(peer, prompt, args.tokens)))
        for name, run in runs:
            dt, tokens[name] = run()
            rates[name].append(args.tokens / dt)
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
        "quantized_mb_per_token": file_bytes / 1e6,
        "read_bandwidth_gbs": bandwidth,
        "riftco_load_s": riftco_load,
    }
    print(
        f"{args.gguf.name}: {len(prompt)} prompt tokens, {args.tokens} decoded greedily, "
        f"{threads} threads, SIMD {riftco.simd_level()}; {weight_bytes / 1e6:.0f} MB of f32 "
        f"weights per token, {file_bytes / 1e6:.0f} MB as stored; {threads} threads read "
        f"{bandwidth:.1f} GB/s (bound {bandwidth * 1e9 / weight_bytes:.1f} tokens/s in f32, "
        f"{bandwidth * 1e9 / file_bytes:.1f} as stored)"
    )
    medians: dict[str, float] = {}
    for name, values in rates.items():
        if not values:
            continue
        median = statistics.median(values)
        medians[name] = median
        result[name] = {"tokens_per_s": values, "median": median}
        bytes_read = {"riftco q": file_bytes, "riftco f32": weight_bytes}.get(name)
        read = f", {median * bytes_read / 1e9:.1f} GB/s of weights" if bytes_read else ""
        print(
            f"  {name:>12}: median {median:.1f} tokens/s "
            f"({', '.join(f'{v:.1f}' for v in values)}){read}"
        )
    ratios: dict[str, float] = {"riftco q / riftco f32": medians["riftco q"] / medians["riftco f32"]}
    for peer_name in ("llama.cpp", "transformers"):
        if peer_name in medians:
            ratios[f"riftco q / {peer_name}"] = medians["riftco q"] / medians[peer_name]
            ratios[f"riftco f32 / {peer_name}"] = medians["riftco f32"] / medians[peer_name]
    result["ratios"] = ratios
    same_prefix: dict[str, int] = {}
    for name in tokens:
        same = 0
        for a, b in zip(tokens["riftco q"], tokens[name]):
            if a != b:
                break
            same += 1
        same_prefix[name] = same
    result["identical_prefix_tokens_with_riftco_q"] = same_prefix
    for k, v in ratios.items():
        print(f"  {k}: {v:.2f}x")
    print(
        "  continuations equal to riftco q's for: "
        + ", ".join(f"{k} {v} of {args.tokens}" for k, v in same_prefix.items() if k != "riftco q")
    )
    print(f"  riftco q: {tokenizer.decode(tokens['riftco q'])!r}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
