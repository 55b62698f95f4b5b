"""``riftco info``: version, kernel threads, SIMD level, devices and the optional plotting.

Devices: every name of ``riftco.DEVICES`` (``cpu``, ``vulkan``, ``metal``, ``gpu``), probed by
:func:`riftco.devices`: available with the GPU adapter's name, or why not (what was looked for
and what was found)."""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import sys
from typing import Any

from riftco._native import __version__, devices, num_threads, simd_level

__all__ = ["add_arguments", "collect", "run"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The flags of ``riftco info``."""
    p.add_argument("--json", action="store_true", help="one JSON object instead of text")


def _threads_from(env: str | None, used: int) -> str:
    """Where the kernel thread count came from, as the kernels read ``RIFTCO_NUM_THREADS``:
    unset or blank means the physical cores; a value that is not a positive integer is ignored
    (the physical cores); a count above the limit is capped."""
    text = (env or "").strip()
    if not text:
        return "physical cores"
    if not text.isascii() or not text.isdigit() or int(text) == 0:
        return f"physical cores; RIFTCO_NUM_THREADS={env!r} ignored"
    if int(text) != used:
        return f"RIFTCO_NUM_THREADS={text}, capped at {used}"
    return f"RIFTCO_NUM_THREADS={text}"


def collect() -> dict[str, Any]:
    """The facts ``riftco info`` prints, as a JSON-ready dict."""
    threads_env = os.environ.get("RIFTCO_NUM_THREADS")
    matplotlib = importlib.util.find_spec("matplotlib")
    return {
        "riftco_version": __version__,
        "python": f"{platform.python_implementation()} {platform.python_version()}",
        "executable": sys.executable,
        "machine": platform.machine(),
        "kernel_threads": num_threads(),
        "kernel_threads_from": _threads_from(threads_env, num_threads()),
        "simd_level": simd_level(),
        "simd_level_from": _simd_from(),
        "devices": devices(),
        "matplotlib": matplotlib is not None,
    }


def _simd_from() -> str:
    """Why the SIMD level is the one it is: forced by the environment, or the CPU's best."""
    requested = os.environ.get("RIFTCO_SIMD", "").strip()
    if requested and requested.lower() != "auto":
        return f"forced by RIFTCO_SIMD={requested}"
    if os.environ.get("RIFTCO_FORCE_SCALAR", "").strip() in ("1", "true", "TRUE", "yes"):
        return "forced by RIFTCO_FORCE_SCALAR"
    return "the CPU's best; RIFTCO_SIMD=scalar|avx2|avx512|neon forces one the CPU has"


def run(args: argparse.Namespace, prog: str = "riftco info") -> None:
    """Prints :func:`collect` as text or JSON."""
    facts = collect()
    if args.json:
        print(json.dumps(facts, indent=2))
        return
    print(f"riftco {facts['riftco_version']} on {facts['python']} ({facts['executable']})")
    print(f"kernel threads: {facts['kernel_threads']} ({facts['kernel_threads_from']})")
    print(
        f"SIMD level: {facts['simd_level']} ({facts['simd_level_from']}; losses are bitwise "
        "reproducible on one SIMD level, not across levels)"
    )
    for d in facts["devices"]:
        if not d["available"]:
            state = "not available: " + " ".join(str(d["reason"]).split())
        elif d["adapter"] is None:
            state = "available"
        else:
            resolved = "" if d["resolved"] == d["device"] else f" ({d['resolved']})"
            state = f"available{resolved}: {d['adapter']}"
        print(f"device {d['device']}: {state}")
    plots = "installed" if facts["matplotlib"] else "not installed (pip install 'riftco[plot]')"
    print(f"plots (matplotlib): {plots}")
