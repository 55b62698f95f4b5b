"""Loading streams: a model file of about 200 MiB loads (as float32, and as bfloat16 storage) in a child process whose peak resident
memory (``VmHWM`` of ``/proc/self/status``, read in the child itself: a child's ``ru_maxrss``
would start from the parent's peak) grows by the model's own bytes plus at most one tensor in
flight and a small allowance — never the file's bytes and the tensors at once (before, the whole
data section, the decoded values and a freshly initialised model coexisted: about twice the
model). The loaded model computes what the saved one did."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import riftco

CHILD = r"""
import json, sys
def status(key):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    raise SystemExit(f"no {key} in /proc/self/status")
import riftco
rss_before = status("VmRSS")
model = riftco.load_model(sys.argv[1], dtype=sys.argv[2])
hwm_after = status("VmHWM")
print(json.dumps({"growth": hwm_after - rss_before, "loss": model.loss([[1, 2, 3, 4, 5]]).item()}))
"""


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs Linux /proc/self/status")
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_loading_peaks_at_the_model_plus_one_tensor(tmp_path: Path, dtype: str) -> None:
    config = riftco.TransformerConfig(
        vocab_size=256, d_model=1024, n_heads=8, n_layers=4, d_ff=2816, max_seq_len=16, seed=1
    )
    model = riftco.DecoderOnlyTransformer(config)
    model_bytes = sum(p.numpy().nbytes for p in model.parameters())
    largest = max(p.numpy().nbytes for p in model.parameters())
    assert model_bytes > 190 * 2**20
    path = tmp_path / "model.safetensors"
    model.save(path)
    want = model.loss([[1, 2, 3, 4, 5]]).item()
    del model
    out = subprocess.run(
        [sys.executable, "-c", CHILD, str(path), dtype],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    result = json.loads(out.stdout.strip().splitlines()[-1])
    allowance = 32 * 2**20  # the RoPE table, allocator rounding, the loss's small graph
    if dtype == "bfloat16":
        # The f32 file read straight into 16-bit storage: half the model, plus one tensor's
        # bytes and its f32 decoding in flight.
        assert result["growth"] <= model_bytes // 2 + 2 * largest + allowance, (
            f"loading {model_bytes / 2**20:.1f} MiB as bfloat16 grew the peak by "
            f"{result['growth'] / 2**20:.1f} MiB"
        )
        assert np.isfinite(result["loss"])
        return
    assert result["growth"] <= model_bytes + largest + allowance, (
        f"loading {model_bytes / 2**20:.1f} MiB grew the peak by "
        f"{result['growth'] / 2**20:.1f} MiB (largest tensor {largest / 2**20:.1f} MiB)"
    )
    assert result["loss"] == want
    assert np.isfinite(want)
