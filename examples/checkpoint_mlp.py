"""The classic activation-checkpointing example, written as a PyTorch user would: a deep MLP of
Linear -> ReLU -> Linear blocks whose forward calls ``riftco.checkpoint(block, x)`` (the
dependencies, each block's parameters, are found automatically), then the depth table: a plain
chain against ``riftco.checkpoint_sequential`` with about sqrt(N) segments.

Every number is measured: the peak ACTIVATION bytes of ``riftco.memory_stats()`` over one
forward and backward (``reset_peak_memory_stats()`` before each run; parameters and gradients
are other categories and not counted). The gradients of each checkpointed run are compared
with the plain run's bit for bit. ``--out PATH`` also writes the tables as markdown.

With PyTorch installed, ``--torch`` adds PyTorch's numbers for the same chains: CPU PyTorch has
no allocator statistics, so they are the bytes of the tensors saved for backward at the end of
the forward (``torch.autograd.graph.saved_tensors_hooks``, storages counted once, parameters
left out), which is the activation memory the backward of a plain chain needs, not a measured
peak; for ``checkpoint_sequential`` it counts what is saved outside the checkpointed segments
(the last, plain segment), not the segment boundaries nor a replay's transient bytes.

Run: ``python examples/checkpoint_mlp.py`` (defaults: d=128, batch 32, 24 blocks; depth table
for 24 and 100 blocks).
"""

from __future__ import annotations

import argparse
import importlib
import math
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

import riftco
import riftco.functional as F
from riftco import nn

MIB = 1024 * 1024


class Block(nn.Module):
    """Linear(d, d) -> ReLU -> Linear(d, d)."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(d, d)
        self.act = nn.ReLU()
        self.fc2 = nn.Linear(d, d)

    def forward(self, x: riftco.Variable) -> riftco.Variable:
        return self.fc2(self.act(self.fc1(x)))


class DeepMLP(nn.Module):
    """``n_blocks`` blocks; with ``use_checkpoint`` each one is a checkpoint."""

    def __init__(self, d: int, n_blocks: int, use_checkpoint: bool) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([Block(d) for _ in range(n_blocks)])
        self.use_checkpoint = use_checkpoint

    def forward(self, x: riftco.Variable) -> riftco.Variable:
        for b in self.blocks:
            x = riftco.checkpoint(b, x) if self.use_checkpoint else b(x)
        return x


def measure(
    forward: Callable[[riftco.Variable], riftco.Variable],
    x: npt.NDArray[np.float32],
    params: Sequence[riftco.Variable],
) -> tuple[int, tuple[int, ...], list[npt.NDArray[np.float32]]]:
    """Peak activation bytes of one forward and backward of ``sum(forward(x))``, the output
    shape, and the gradients of ``params``."""
    for p in params:
        p.zero_grad()
    before = riftco.memory_stats()["activation"]["current_bytes"]
    riftco.reset_peak_memory_stats()
    inp = riftco.Variable(x, requires_grad=True)
    out = forward(inp)
    shape = out.shape
    # As PyTorch's default: each node's saved values go as soon as its VJP ran.
    F.sum(out).backward(retain_graph=False)
    del out
    peak = riftco.memory_stats()["activation"]["peak_bytes"] - before
    grads = []
    for p in params:
        g = p.grad
        assert g is not None
        grads.append(g)
    return peak, shape, grads


def same_bits(a: list[npt.NDArray[np.float32]], b: list[npt.NDArray[np.float32]]) -> bool:
    return len(a) == len(b) and all(np.array_equal(x, y) for x, y in zip(a, b))


def torch_saved_mib(d: int, batch: int, n_blocks: int, segments: int | None) -> float | None:
    """MiB of the tensors PyTorch saves for backward (storages once), or None without torch."""
    try:
        torch: Any = importlib.import_module("torch")
        torch_checkpoint: Any = importlib.import_module("torch.utils.checkpoint")
    except ImportError:
        return None
    torch.manual_seed(0)
    layers: list[Any] = []
    for _ in range(n_blocks):
        layers += [torch.nn.Linear(d, d), torch.nn.ReLU(), torch.nn.Linear(d, d)]
    seq = torch.nn.Sequential(*layers)
    x = torch.randn(batch, d, requires_grad=True)
    seen: dict[int, int] = {}
    params = {p.untyped_storage().data_ptr() for p in seq.parameters()}

    def pack(t: Any) -> Any:
        s = t.untyped_storage()
        if s.data_ptr() not in params:  # weights saved by the Linear VJPs are not activations
            seen[s.data_ptr()] = s.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        if segments is None:
            out = seq(x)
        else:
            out = torch_checkpoint.checkpoint_sequential(seq, segments, x, use_reentrant=False)
    out.sum().backward()
    return float(sum(seen.values())) / MIB


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--d", type=int, default=128, help="width of every Linear (default 128)")
    ap.add_argument("--batch", type=int, default=32, help="rows of the input (default 32)")
    ap.add_argument("--blocks", type=int, default=24, help="blocks of the classic MLP (24)")
    ap.add_argument(
        "--depths", type=str, default="24,100", help="comma-separated depths of the table"
    )
    ap.add_argument("--torch", action="store_true", help="add PyTorch's saved-tensor bytes")
    ap.add_argument("--out", type=Path, default=None, help="also write the markdown here")
    args = ap.parse_args(argv)
    depths = [int(s) for s in args.depths.split(",") if s.strip()]
    if args.d <= 0 or args.batch <= 0 or args.blocks <= 0 or not depths or min(depths) <= 0:
        ap.error("--d, --batch, --blocks and every depth must be positive")

    x = np.random.default_rng(0).standard_normal((args.batch, args.d)).astype(np.float32)
    lines: list[str] = []

    # 1. The classic: checkpoint(b, x) in the forward of a Module.
    riftco.manual_seed(0)
    model = DeepMLP(args.d, args.blocks, use_checkpoint=False)
    params = list(model.parameters())
    plain_peak, shape, plain_grads = measure(model, x, params)
    model.use_checkpoint = True
    ckpt_peak, _, ckpt_grads = measure(model, x, params)
    print(f"output shape: {shape}")
    print(
        f"peak activation memory without checkpointing: {plain_peak / MIB:.3f} MiB "
        f"({plain_peak} bytes)"
    )
    print(
        f"peak activation memory with checkpoint(block, x): {ckpt_peak / MIB:.3f} MiB "
        f"({ckpt_peak} bytes)"
    )
    print(f"ratio: {plain_peak / max(ckpt_peak, 1):.2f}x less")
    print(f"gradients bitwise equal to the plain run: {same_bits(plain_grads, ckpt_grads)}")
    lines += [
        f"Classic MLP: {args.blocks} blocks of Linear({args.d}, {args.d}) -> ReLU -> "
        f"Linear({args.d}, {args.d}), batch {args.batch}, float32, one forward + backward; "
        "peak activation bytes from `riftco.memory_stats()`.",
        "",
        "| run | peak activation MiB | gradients |",
        "|---|---:|---|",
        f"| plain | {plain_peak / MIB:.3f} | reference |",
        f"| `checkpoint(block, x)` per block | {ckpt_peak / MIB:.3f} | "
        f"{'bitwise equal' if same_bits(plain_grads, ckpt_grads) else 'DIFFERENT'} |",
        "",
        f"Ratio: {plain_peak / max(ckpt_peak, 1):.2f}x less activation memory.",
        "",
    ]

    # 2. Depth table: plain chain against checkpoint_sequential with ~sqrt(N) segments.
    want_torch = args.torch
    if want_torch and torch_saved_mib(2, 1, 1, None) is None:
        print("torch is not installed: the PyTorch columns are skipped")
        want_torch = False
    header = "| blocks | segments | plain MiB | checkpoint_sequential MiB | ratio | gradients |"
    rule = "|---:|---:|---:|---:|---:|---|"
    if want_torch:
        header += " torch plain saved MiB | torch ckpt_seq saved MiB |"
        rule += "---:|---:|"
    lines += [
        "Depth table (same blocks as a flat `nn.Sequential` of Linear, ReLU, Linear; "
        "`checkpoint_sequential(seq, round(sqrt(N)), x)` over its 3N functions, the last "
        "segment not checkpointed, as in PyTorch):",
        "",
        header,
        rule,
    ]
    print()
    print(header)
    print(rule)
    for n in depths:
        riftco.manual_seed(0)
        layers: list[nn.Module] = []
        for _ in range(n):
            layers += [nn.Linear(args.d, args.d), nn.ReLU(), nn.Linear(args.d, args.d)]
        seq = nn.Sequential(*layers)
        segments = max(1, round(math.sqrt(n)))
        params = list(seq.parameters())
        plain, _, g_plain = measure(seq, x, params)
        seg, _, g_seg = measure(
            lambda h: riftco.checkpoint_sequential(seq, segments, h), x, params
        )
        row = (
            f"| {n} | {segments} | {plain / MIB:.3f} | {seg / MIB:.3f} | "
            f"{plain / max(seg, 1):.2f}x | "
            f"{'bitwise equal' if same_bits(g_plain, g_seg) else 'DIFFERENT'} |"
        )
        if want_torch:
            tp = torch_saved_mib(args.d, args.batch, n, None)
            ts = torch_saved_mib(args.d, args.batch, n, segments)
            row += f" {tp:.2f} | {ts:.2f} |"
        print(row)
        lines.append(row)
    if want_torch:
        lines += [
            "",
            "PyTorch columns: bytes of the activations saved for backward at the end of the "
            "forward (saved_tensors_hooks, storages once, parameters left out; CPU PyTorch has "
            "no allocator statistics), not a peak; for checkpoint_sequential only what its "
            "plain last segment saves.",
        ]
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text("\n".join(lines) + "\n")
        print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
