"""``riftco info``: version, kernel threads, SIMD level, devices and the optional plotting.

Devices: ``cpu`` always; ``metal`` is probed (this build answers why it is not available)."""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import sys
from typing import Any

import riftco

__all__ = ["add_arguments", "collect", "run"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The flags of ``riftco info``."""
    p.add_argument("--json", action="store_true", help="one JSON object instead of text")


def _device_status(device: str) -> dict[str, Any]:
    """Whether this build can hold a model on ``device``: a one-layer model of 8 dimensions is
    moved there (``DecoderOnlyTransformer.to``), which raises ``DeviceUnavailableError`` (with
    the reason) for a device the build has no backend for."""
    if device == "cpu":
        return {"device": device, "available": True}
    config = riftco.TransformerConfig(
        vocab_size=256, d_model=8, n_heads=1, n_layers=1, d_ff=8, max_seq_len=2, seed=0
    )
    try:
        riftco.DecoderOnlyTransformer(config).to(device)
    except riftco.RiftcoError as e:
        return {"device": device, "available": False, "reason": " ".join(str(e).split())}
    return {"device": device, "available": True}


def collect() -> dict[str, Any]:
    """The facts ``riftco info`` prints, as a JSON-ready dict."""
    threads_env = os.environ.get("RIFTCO_NUM_THREADS")
    matplotlib = importlib.util.find_spec("matplotlib")
    return {
        "riftco_version": riftco.__version__,
        "python": f"{platform.python_implementation()} {platform.python_version()}",
        "executable": sys.executable,
        "machine": platform.machine(),
        "kernel_threads": riftco.num_threads(),
        "kernel_threads_from": (
            f"RIFTCO_NUM_THREADS={threads_env}" if threads_env else "physical cores"
        ),
        "simd_level": riftco.simd_level(),
        "devices": [_device_status(d) for d in ("cpu", "metal")],
        "matplotlib": matplotlib is not None,
    }


def run(args: argparse.Namespace, prog: str = "riftco info") -> None:
    """Prints :func:`collect` as text or JSON."""
    facts = collect()
    if args.json:
        print(json.dumps(facts, indent=2))
        return
    print(f"riftco {facts['riftco_version']} on {facts['python']} ({facts['executable']})")
    print(f"kernel threads: {facts['kernel_threads']} ({facts['kernel_threads_from']})")
    print(
        f"SIMD level: {facts['simd_level']} (losses are bitwise reproducible on one SIMD level, "
        "not across levels)"
    )
    for d in facts["devices"]:
        state = "available" if d["available"] else f"not available: {d['reason']}"
        print(f"device {d['device']}: {state}")
    plots = "installed" if facts["matplotlib"] else "not installed (pip install 'riftco[plot]')"
    print(f"plots (matplotlib): {plots}")
