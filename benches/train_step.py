"""One training step (forward + backward + Adam) of the reference model through the Python API,
for each attention kind x activation-checkpointing policy, and side by side with the same
LLaMA architecture in PyTorch when ``torch`` is importable.

Reference configuration: vocab 256, d_model 256, n_heads 8, n_layers 8, d_ff 688, seq 256,
batch 8. Step time is the median of ``--steps`` timed steps after ``--warmup`` untimed ones;
tokens/s = batch * seq / median step time; peak activation bytes come from
``riftco.memory_stats()`` (reset before each step). PyTorch runs in the same process with the
same thread count (``torch.set_num_threads(riftco.num_threads())``), starting from the same
weights (copied by their Hugging Face names), so the first losses are compared too.

    python benches/train_step.py               # reference configuration
    python benches/train_step.py --quick --steps 1   # tiny configuration (CI smoke)
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
from typing import Any

import numpy as np

import riftco

TORCH_SKIP = (
    "PyTorch not installed: skipping the side-by-side comparison "
    "(pip install torch --index-url https://download.pytorch.org/whl/cpu)"
)
REFERENCE = dict(vocab_size=256, d_model=256, n_heads=8, n_layers=8, d_ff=688, max_seq_len=256)
QUICK = dict(vocab_size=256, d_model=32, n_heads=2, n_layers=2, d_ff=64, max_seq_len=16)


def batch_tokens(batch: int, seq: int, vocab: int, seed: int = 0) -> np.ndarray[Any, Any]:
    return np.random.default_rng(seed).integers(0, vocab, size=(batch, seq + 1), dtype=np.int64)


def bench_riftco(
    cfg: dict[str, int],
    attention: str,
    policy: str,
    tokens: np.ndarray[Any, Any],
    warmup: int,
    steps: int,
) -> dict[str, Any]:
    model = riftco.DecoderOnlyTransformer(
        riftco.TransformerConfig(**cfg), attention=attention, activation_checkpointing=policy
    )
    initial = {name: np.array(v.numpy(), copy=True) for name, v in model.named_parameters()}
    opt = riftco.Adam(model.parameters(), lr=1e-4)
    times: list[float] = []
    peaks: list[int] = []
    first_loss = math.nan
    for i in range(warmup + steps):
        riftco.reset_peak_memory_stats()
        t0 = time.perf_counter()
        loss = model.loss(tokens)
        loss.backward(retain_graph=False)
        opt.step()
        opt.zero_grad()
        dt = time.perf_counter() - t0
        if i == 0:
            first_loss = loss.item()
        if i >= warmup:
            times.append(dt)
            peaks.append(int(riftco.memory_stats()["activation"]["peak_bytes"]))
        # Release this step's graph before the next forward, or its activations would count
        # towards the next step's peak.
        del loss
    return {
        "step_s": statistics.median(times),
        "act_peak": max(peaks),
        "first_loss": first_loss,
        "initial_weights": initial,
    }


def torch_llama(cfg: dict[str, int], policy: str, weights: dict[str, np.ndarray[Any, Any]]) -> Any:
    import torch
    import torch.nn.functional as F
    from torch import nn
    from torch.utils.checkpoint import checkpoint

    d, h, L, ff, eps = cfg["d_model"], cfg["n_heads"], cfg["n_layers"], cfg["d_ff"], 1e-5
    dh = d // h

    class RMSNorm(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.weight = nn.Parameter(torch.ones(d))

        def forward(self, x: Any) -> Any:
            return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * self.weight

    def rope(x: Any, cos: Any, sin: Any) -> Any:  # rotate-half pairing (i, i + dh/2)
        x1, x2 = x[..., : dh // 2], x[..., dh // 2 :]
        return x * cos + torch.cat((-x2, x1), dim=-1) * sin

    class Attn(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.q_proj, self.k_proj, self.v_proj, self.o_proj = (
                nn.Linear(d, d, bias=False) for _ in range(4)
            )

        def forward(self, x: Any, cos: Any, sin: Any) -> Any:
            b, s, _ = x.shape
            q, k, v = (
                p(x).view(b, s, h, dh).transpose(1, 2)
                for p in (self.q_proj, self.k_proj, self.v_proj)
            )
            y = F.scaled_dot_product_attention(
                rope(q, cos, sin), rope(k, cos, sin), v, is_causal=True
            )
            return self.o_proj(y.transpose(1, 2).reshape(b, s, d))

    class Mlp(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.gate_proj = nn.Linear(d, ff, bias=False)
            self.up_proj = nn.Linear(d, ff, bias=False)
            self.down_proj = nn.Linear(ff, d, bias=False)

        def forward(self, x: Any) -> Any:
            return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))

    class Layer(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.input_layernorm, self.post_attention_layernorm = RMSNorm(), RMSNorm()
            self.self_attn, self.mlp = Attn(), Mlp()

        def forward(self, x: Any, cos: Any, sin: Any) -> Any:
            x = x + self.self_attn(self.input_layernorm(x), cos, sin)
            return x + self.mlp(self.post_attention_layernorm(x))

    class Inner(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed_tokens = nn.Embedding(cfg["vocab_size"], d)
            self.layers = nn.ModuleList(Layer() for _ in range(L))
            self.norm = RMSNorm()

    class Llama(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = Inner()
            self.lm_head = nn.Linear(d, cfg["vocab_size"], bias=False)

        def loss(self, tokens: Any) -> Any:
            inp, tgt = tokens[:, :-1], tokens[:, 1:]
            s = inp.shape[1]
            inv = 1.0 / (10000.0 ** (torch.arange(0, dh // 2, dtype=torch.float32) * 2 / dh))
            ang = torch.outer(torch.arange(s, dtype=torch.float32), inv)
            cos = torch.cat((ang.cos(), ang.cos()), -1)
            sin = torch.cat((ang.sin(), ang.sin()), -1)
            x = self.model.embed_tokens(inp)
            for layer in self.model.layers:
                if policy == "block":
                    x = checkpoint(layer, x, cos, sin, use_reentrant=False)
                else:
                    x = layer(x, cos, sin)
            logits = self.lm_head(self.model.norm(x))
            return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tgt.reshape(-1))

    m = Llama()
    own = dict(m.named_parameters())
    with torch.no_grad():
        for name, value in weights.items():
            own[name].copy_(torch.from_numpy(value))
    return m


def bench_torch(
    cfg: dict[str, int],
    policy: str,
    weights: dict[str, np.ndarray[Any, Any]],
    tokens: np.ndarray[Any, Any],
    warmup: int,
    steps: int,
) -> dict[str, Any]:
    import torch

    model = torch_llama(cfg, policy, weights)
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    t = torch.from_numpy(tokens)
    times: list[float] = []
    first_loss = math.nan
    for i in range(warmup + steps):
        t0 = time.perf_counter()
        loss = model.loss(t)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        dt = time.perf_counter() - t0
        if i == 0:
            first_loss = float(loss.item())
        if i >= warmup:
            times.append(dt)
    return {"step_s": statistics.median(times), "first_loss": first_loss}


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--steps", type=int, default=5, help="timed steps (default: %(default)s)")
    p.add_argument(
        "--warmup", type=int, default=1, help="untimed steps first (default: %(default)s)"
    )
    p.add_argument("--quick", action="store_true", help="tiny configuration (CI smoke)")
    p.add_argument("--batch-size", type=int, default=None)
    p.add_argument("--seq-len", type=int, default=None)
    args = p.parse_args()
    cfg = QUICK if args.quick else REFERENCE
    batch = args.batch_size or (2 if args.quick else 8)
    seq = args.seq_len or cfg["max_seq_len"]
    tokens = batch_tokens(batch, seq, cfg["vocab_size"])
    print(
        f"riftco {riftco.__version__}, {riftco.num_threads()} kernel threads; config {cfg}, "
        f"batch {batch}, seq {seq}; median of {args.steps} steps after {args.warmup} warm-up"
    )
    try:
        import torch
    except ImportError:
        torch = None
    if torch is not None:
        torch.set_num_threads(riftco.num_threads())
        print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    header = f"{'attention':<13}{'policy':<10}{'step ms':>10}{'tokens/s':>11}{'act peak MiB':>14}"
    if torch is not None:
        header += f"{'torch ms':>10}{'ours/torch':>12}{'loss diff':>11}"
    print(header)
    torch_cache: dict[str, dict[str, Any]] = {}
    for attention in ("flash", "materialized"):
        for policy in ("disabled", "block"):
            r = bench_riftco(cfg, attention, policy, tokens, args.warmup, args.steps)
            line = (
                f"{attention:<13}{policy:<10}{r['step_s'] * 1e3:>10.1f}"
                f"{batch * seq / r['step_s']:>11,.0f}{r['act_peak'] / 2**20:>14.1f}"
            )
            if torch is not None:
                if policy not in torch_cache:
                    torch_cache[policy] = bench_torch(
                        cfg, policy, r["initial_weights"], tokens, args.warmup, args.steps
                    )
                tr = torch_cache[policy]
                line += (
                    f"{tr['step_s'] * 1e3:>10.1f}{r['step_s'] / tr['step_s']:>12.2f}"
                    f"{abs(r['first_loss'] - tr['first_loss']):>11.1e}"
                )
            print(line, flush=True)
    if torch is None:
        print(TORCH_SKIP)
    else:
        print(
            "PyTorch uses SDPA (its fused CPU attention) for both of our attention kinds; "
            "ours/torch < 1 means riftco is faster."
        )


if __name__ == "__main__":
    main()
