"""``riftco.quantize`` / ``riftco.dequantize`` bitwise against the reference implementations.

- Q4_0, Q4_1, Q5_0, Q5_1, Q8_0: ``gguf.quants.quantize`` and ``gguf.quants.dequantize`` (gguf-py);
- Q2_K ... Q6_K: ``gguf.quants.dequantize`` of riftco's bytes (gguf-py has no K-quant quantizer;
  the quantizers are checked against llama.cpp's C by the Rust test ``kquant_fixture`` and
  ``scripts/kquant_fixtures.py``);
- NF4: bitsandbytes' ``quantize_4bit(blocksize=64, quant_type="nf4", compress_statistics=True)``
  (codes, quantized absmax, group scales, offset) and ``dequantize_4bit`` on the CPU.

The reference packages are optional: each test skips, saying which package is missing, when it
is absent (run them with a Python that has gguf, torch and bitsandbytes, e.g.
``PYTHONPATH=python /opt/refvenv/bin/python -m pytest tests/python/test_quantize.py``).
"""

from __future__ import annotations

from collections.abc import Iterator
from types import ModuleType
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

import riftco

LEGACY = ["q4_0", "q4_1", "q5_0", "q5_1", "q8_0"]
K_QUANTS = ["q2_k", "q3_k", "q4_k", "q5_k", "q6_k"]
BLOCK = {**{f: 32 for f in LEGACY}, **{f: 256 for f in K_QUANTS}, "nf4": 64}


def _gguf() -> ModuleType:
    module: ModuleType = pytest.importorskip("gguf", reason="the gguf package is not installed: pip install gguf")
    return module


def _bnb() -> tuple[Any, Any]:
    torch = pytest.importorskip("torch", reason="torch is not installed: the bitsandbytes checks are skipped")
    functional = pytest.importorskip(
        "bitsandbytes.functional",
        reason="bitsandbytes is not installed: the NF4 checks against it are skipped",
    )
    return torch, functional


def _cases(block: int) -> Iterator[tuple[str, npt.NDArray[np.float32]]]:
    """Random and adversarial tensors of rows of 4 blocks: all-zero blocks and signed zeros, a
    block with one huge value, negative-only and positive-only blocks, subnormals, values below
    f32's normal range, ties on a binary grid, magnitudes near f32's largest, and large scales."""
    rng = np.random.default_rng(block)
    yield "normal", rng.standard_normal((6, 4 * block)).astype(np.float32)
    adv = rng.standard_normal((5, 4 * block)).astype(np.float32)
    adv[0] = 0.0
    adv[1, :block] = -0.0
    adv[1, block : 2 * block] = np.where(np.arange(block) % 3 == 0, -0.0, 0.0)
    adv[2, 7] = 6.5e4  # one value dominating its block (within float16 scales)
    adv[3] = -np.abs(adv[3])
    adv[4] = np.abs(adv[4])
    yield "adversarial", adv
    yield "subnormal", (rng.standard_normal((2, 4 * block)) * 1e-40).astype(np.float32)
    yield "tiny", (rng.standard_normal((2, 4 * block)) * 1e-37).astype(np.float32)
    yield "ties", (rng.integers(-16, 16, (3, 4 * block)) * 0.125).astype(np.float32)
    yield "constant", np.full((1, 4 * block), -0.75, np.float32)
    yield "huge", rng.uniform(-3.4e38, 3.4e38, (2, 4 * block)).astype(np.float32)
    yield "scaled", (rng.standard_normal((3, 4 * block)) * np.array([[1e-4], [1e2], [1.5e4]])).astype(np.float32)


F16_MAX = 65504.0


def _beyond_f16_scales(dtype: str, x: npt.NDArray[np.float32]) -> bool:
    """Whether ``x`` holds a value beyond float16's range, which a GGML format (float16 block
    scales) refuses, naming the first one (the references write infinities or NaNs there)."""
    beyond = np.abs(x) > F16_MAX
    if not beyond.any():
        return False
    first = int(np.argmax(beyond.reshape(-1)))
    with pytest.raises(ValueError, match=rf"value {first} is .*float16.*65504"):
        riftco.quantize(x, dtype)
    return True


def _bits(a: npt.NDArray[np.float32]) -> npt.NDArray[np.uint32]:
    return np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)


def _first_difference(got: bytes, want: bytes) -> str:
    a, b = np.frombuffer(got, np.uint8), np.frombuffer(want, np.uint8)
    if a.size != b.size:
        return f"{a.size} bytes, expected {b.size}"
    i = int(np.argmax(a != b))
    return f"{int(np.sum(a != b))} bytes differ, first at {i}: {a[i]} instead of {b[i]}"


@pytest.mark.parametrize("dtype", LEGACY)
def test_legacy_formats_are_bitwise_gguf(dtype: str) -> None:
    gguf = _gguf()
    qtype = getattr(gguf.GGMLQuantizationType, dtype.upper())
    with np.errstate(all="ignore"):  # gguf's quantizers divide by zero and overflow on purpose
        for name, x in _cases(32):
            if _beyond_f16_scales(dtype, x):
                continue
            want = gguf.quants.quantize(x, qtype)
            got = riftco.quantize(x, dtype)
            assert got == want.tobytes(), f"{dtype} {name}: {_first_difference(got, want.tobytes())}"
            ref = gguf.quants.dequantize(want, qtype)
            values = riftco.dequantize(got, dtype, x.shape)
            assert values.shape == x.shape and values.dtype == np.float32
            assert np.array_equal(_bits(values), _bits(ref)), f"{dtype} {name}: dequantized values differ"


@pytest.mark.parametrize("dtype", K_QUANTS)
def test_k_quants_dequantize_bitwise_as_gguf(dtype: str) -> None:
    gguf = _gguf()
    qtype = getattr(gguf.GGMLQuantizationType, dtype.upper())
    with np.errstate(all="ignore"):
        for name, x in _cases(256):
            if _beyond_f16_scales(dtype, x):
                continue
            data = riftco.quantize(x, dtype)
            rows = np.frombuffer(data, np.uint8).reshape(x.shape[0], -1)
            ref = gguf.quants.dequantize(rows, qtype)
            values = riftco.dequantize(data, dtype, x.shape)
            assert np.array_equal(_bits(values), _bits(ref)), f"{dtype} {name}"
            if name == "normal":
                # A 2-bit format is coarse, but no format is noise: error well below the spread.
                assert float(np.sqrt(np.mean((values - x) ** 2))) < 0.7


def _nf4_reference(torch: Any, functional: Any, x: npt.NDArray[np.float32]) -> tuple[bytes, Any, Any]:
    """bitsandbytes' NF4 quantization of ``x`` in riftco's layout, its state and packed codes."""
    packed, state = functional.quantize_4bit(
        torch.from_numpy(x.copy()), blocksize=64, quant_type="nf4", compress_statistics=True
    )
    layout = (
        packed.numpy().tobytes()
        + state.absmax.numpy().astype(np.uint8).tobytes()
        + state.state2.absmax.numpy().astype("<f4").tobytes()
        + np.float32(state.offset.item()).astype("<f4").tobytes()
    )
    return layout, packed, state


def test_nf4_is_bitwise_bitsandbytes() -> None:
    torch, functional = _bnb()
    threads = torch.get_num_threads()
    # riftco's offset is PyTorch's mean summed on one thread (bitsandbytes' absmax.mean());
    # with more threads and 32768 blocks or more PyTorch splits the sum per thread.
    torch.set_num_threads(1)
    try:
        cases = list(_cases(64))
        cases.append(("groups", (np.random.default_rng(1).standard_normal((300, 4 * 64)) * 3).astype(np.float32)))
        for name, x in cases:
            want, packed, state = _nf4_reference(torch, functional, x)
            got = riftco.quantize(x, "nf4")
            assert got == want, f"nf4 {name}: {_first_difference(got, want)}"
            ref = functional.dequantize_4bit(packed, state).numpy()
            values = riftco.dequantize(want, "nf4", x.shape)
            assert np.array_equal(_bits(values), _bits(ref)), f"nf4 {name}: dequantized values differ"
    finally:
        torch.set_num_threads(threads)


def test_nf4_offset_sum_matches_pytorch_past_one_vector() -> None:
    """The offset for block counts around PyTorch's vector width (8) and cascade chunk (16 rows of
    4 vectors), where the summation order changes shape."""
    torch, functional = _bnb()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        rng = np.random.default_rng(7)
        for blocks in [1, 2, 7, 8, 9, 31, 32, 33, 511, 512, 513, 1100]:
            x = (rng.standard_normal((blocks, 64)) * rng.uniform(0.1, 100, (blocks, 1))).astype(np.float32)
            want, _, _ = _nf4_reference(torch, functional, x)
            got = riftco.quantize(x, "nf4")
            assert got[-4:] == want[-4:], f"{blocks} blocks: offset {np.frombuffer(got[-4:], np.float32)}"
            assert got == want, f"{blocks} blocks: {_first_difference(got, want)}"
    finally:
        torch.set_num_threads(threads)


def test_storage_sizes_follow_the_layouts() -> None:
    x = np.ones((2, 256), np.float32)
    sizes = {dtype: len(riftco.quantize(x, dtype)) for dtype in BLOCK}
    assert sizes == {
        "q4_0": 16 * 18,
        "q4_1": 16 * 20,
        "q5_0": 16 * 22,
        "q5_1": 16 * 24,
        "q8_0": 16 * 34,
        "q2_k": 2 * 84,
        "q3_k": 2 * 110,
        "q4_k": 2 * 144,
        "q5_k": 2 * 176,
        "q6_k": 2 * 210,
        "nf4": 256 + 8 + 4 + 4,
    }
    # Lists and float64 are converted to float32 first; names are case-insensitive.
    assert riftco.quantize(x.astype(np.float64).tolist(), "Q8_0") == riftco.quantize(x, "q8_0")


def test_bad_input_is_one_clear_error() -> None:
    x = np.zeros((2, 64), np.float32)
    with pytest.raises(riftco.ConfigError, match='unknown quantized dtype "q4"; expected one of nf4, q4_0, q4_1'):
        riftco.quantize(x, "q4")
    with pytest.raises(riftco.ShapeError, match=r"shape \[2, 64\] cannot be kept in q4_k.*multiple of 256"):
        riftco.quantize(x, "q4_k")
    with pytest.raises(riftco.ShapeError, match="multiple of 32"):
        riftco.quantize(np.float32(1.0), "q8_0")
    bad = x.copy()
    bad[1, 5] = np.nan
    bad[1, 9] = np.inf
    with pytest.raises(ValueError, match="value 69 is NaN: only finite values can be quantized to nf4"):
        riftco.quantize(bad, "nf4")
    data = riftco.quantize(x, "q8_0")
    with pytest.raises(riftco.ShapeError, match=r"135 bytes of q8_0 for shape \[2, 64\]: 128 elements of q8_0 take 136 bytes"):
        riftco.dequantize(data[:-1], "q8_0", (2, 64))
    with pytest.raises(riftco.ShapeError, match="multiple of 32"):
        riftco.dequantize(data, "q8_0", (128, 1))
    with pytest.raises(riftco.ConfigError, match="expected one of"):
        riftco.dequantize(data, "int4", (2, 64))
