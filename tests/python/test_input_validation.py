"""Bad arguments to ``F.rms_norm``, ``generate``, ``sample_token`` and ``BatchSampler`` are clear
errors naming the value, and sampling stays finite for every valid temperature."""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import riftco
from riftco import functional as F
from riftco.data import BatchSampler, CorpusError
from riftco.generation import check_generation_args, generate, sample_token

TINY: dict[str, Any] = dict(vocab_size=256, d_model=16, n_heads=2, n_layers=1, d_ff=32, max_seq_len=32, seed=1)


@pytest.fixture(scope="module")
def model() -> riftco.DecoderOnlyTransformer:
    return riftco.DecoderOnlyTransformer(riftco.TransformerConfig(**TINY))


# ----------------------------------------------------------------------------- rms_norm


@pytest.mark.parametrize("eps", [math.nan, -1.0, 0.0, math.inf, -math.inf, 1e300, 1e-50])
def test_rms_norm_rejects_eps_that_is_not_finite_and_positive(eps: float) -> None:
    x = riftco.Variable(np.ones((2, 4), np.float32))
    w = riftco.Variable(np.ones(4, np.float32))
    # 1e300 is inf and 1e-50 is 0 as a float32: the op sees and names those.
    with pytest.raises(riftco.ConfigError, match=r"rms_norm: eps must be finite and > 0; got"):
        F.rms_norm(x, w, eps=eps)


def test_rms_norm_small_positive_eps_is_finite() -> None:
    x = riftco.Variable(np.zeros((2, 4), np.float32))
    w = riftco.Variable(np.ones(4, np.float32))
    y = F.rms_norm(x, w, eps=1e-30).numpy()
    assert np.all(np.isfinite(y)) and np.all(y == 0.0)


# ----------------------------------------------------------------------------- sampling


def test_tiny_temperature_is_finite_and_matches_greedy(
    model: riftco.DecoderOnlyTransformer,
) -> None:
    greedy = generate(model, "ab", 6, temperature=0.0)
    for t in (1e-320, 5e-324, 1e-300, 1e-30):
        with np.errstate(divide="raise", invalid="raise"):  # no x/0 and no NaN on the way
            assert generate(model, "ab", 6, temperature=t, seed=3) == greedy, t


def test_sample_token_weights_stay_finite_for_extreme_temperatures() -> None:
    logits = np.array([3.0e38, -3.0e38, 0.0, 1.0], dtype=np.float32)
    rng = np.random.default_rng(0)
    with np.errstate(divide="raise", invalid="raise"):
        assert {sample_token(logits, 1e-320, None, rng) for _ in range(20)} == {0}
        assert {sample_token(logits, 1.0, None, rng) for _ in range(20)} == {0}
        draws = {sample_token(logits, 1e308, None, rng) for _ in range(400)}
    assert draws == {0, 1, 2, 3}  # a huge temperature is uniform


def test_sample_token_masked_logits() -> None:
    logits = np.array([-np.inf, 2.0, -np.inf, 1.0])
    rng = np.random.default_rng(0)
    assert {sample_token(logits, 1.0, None, rng) for _ in range(200)} == {1, 3}
    with pytest.raises(riftco.DecodeError, match="4 -inf of 4"):
        sample_token(np.full(4, -np.inf), 1.0, None, rng)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_sample_token_non_finite_logits(temperature: float, bad: float) -> None:
    logits = np.zeros(8, np.float32)
    logits[5] = bad
    with pytest.raises(riftco.DecodeError, match="not finite"):
        sample_token(logits, temperature, None, np.random.default_rng(0))


def test_sample_token_bad_logits_shape() -> None:
    with pytest.raises(riftco.ShapeError, match=r"\(0,\)"):
        sample_token(np.zeros(0, np.float32), 1.0, None, np.random.default_rng(0))
    with pytest.raises(riftco.ShapeError, match=r"\(2, 2\)"):
        sample_token(np.zeros((2, 2), np.float32), 1.0, None, np.random.default_rng(0))


def _nan_model(tmp_path: Path) -> riftco.DecoderOnlyTransformer:
    """A model whose final norm weight is NaN (edited into a saved safetensors file)."""
    m = riftco.DecoderOnlyTransformer(riftco.TransformerConfig(**TINY))
    path = tmp_path / "model.safetensors"
    m.save(str(path))
    raw = bytearray(path.read_bytes())
    (n,) = struct.unpack("<Q", raw[:8])
    begin, end = json.loads(raw[8 : 8 + n])["model.norm.weight"]["data_offsets"]
    raw[8 + n + begin : 8 + n + end] = np.full((end - begin) // 4, np.nan, np.float32).tobytes()
    path.write_bytes(bytes(raw))
    m.load_weights(str(path))
    return m


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_nan_logits_are_a_decode_error(tmp_path: Path, temperature: float) -> None:
    m = _nan_model(tmp_path)
    with pytest.raises(riftco.DecodeError, match=r"logits at position 1 .*256 NaN"):
        generate(m, "ab", 5, temperature=temperature)


# ----------------------------------------------------------------------------- arguments


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(top_k=math.nan), "top_k must be None or an int >= 1; got float nan"),
        (dict(top_k=1.5), "top_k must be None or an int >= 1; got float 1.5"),
        (dict(top_k=True), "top_k"),
        (dict(top_k="3"), "top_k"),
        (dict(temperature="hot"), "temperature must be a real number; got str 'hot'"),
        (dict(temperature=None), "temperature"),
        (dict(seed=1.0), "seed must be an int; got float 1.0"),
        (dict(max_new_tokens=2.0), "max_new_tokens must be an int; got float 2.0"),
    ],
)
def test_generate_argument_types(
    model: riftco.DecoderOnlyTransformer, kwargs: dict[str, Any], match: str
) -> None:
    call: dict[str, Any] = dict(max_new_tokens=3)
    call.update(kwargs)
    with pytest.raises(TypeError, match=match):
        generate(model, "ab", **call)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(top_k=0), "top_k must be None or >= 1; got 0"),
        (dict(temperature=math.nan), "temperature must be finite and >= 0; got nan"),
        (dict(temperature=-1e-300), "temperature"),
        (dict(seed=-1), "seed must be a non-negative integer; got -1"),
        (dict(max_new_tokens=-1), "max_new_tokens"),
    ],
)
def test_generate_argument_values(
    model: riftco.DecoderOnlyTransformer, kwargs: dict[str, Any], match: str
) -> None:
    call: dict[str, Any] = dict(max_new_tokens=3)
    call.update(kwargs)
    with pytest.raises(riftco.TokenError, match=match):
        generate(model, "ab", **call)


def test_numpy_scalars_are_accepted(model: riftco.DecoderOnlyTransformer) -> None:
    a = generate(model, "ab", np.int64(4), temperature=np.float32(0.7), top_k=np.int32(5), seed=2)
    assert a == generate(model, "ab", 4, temperature=0.7, top_k=5, seed=2)
    assert a == generate(model, "ab", 4, temperature=0.7, top_k=5, seed=np.uint8(2))


@pytest.mark.parametrize("prompt", [5, 0, 5.0, None, True, {1: 2}, object()])
def test_prompt_of_wrong_type_is_a_type_error(
    model: riftco.DecoderOnlyTransformer, prompt: Any
) -> None:
    with pytest.raises(TypeError, match="prompt must be a str, bytes"):
        generate(model, prompt, 3)


def test_prompt_forms_are_equivalent(model: riftco.DecoderOnlyTransformer) -> None:
    want = generate(model, "héllo", 4, seed=5)
    data = "héllo".encode()
    for prompt in (
        data,
        bytearray(data),
        memoryview(data),
        list(data),
        tuple(data),
        np.frombuffer(data, np.uint8),
        np.frombuffer(data, np.uint8).astype(np.int64),
        [np.int16(b) for b in data],
    ):
        assert generate(model, prompt, 4, seed=5) == want, type(prompt)
    assert generate(model, range(97, 100), 4, seed=5) == generate(model, "abc", 4, seed=5)


@pytest.mark.parametrize(
    ("prompt", "error", "match"),
    [
        ([97, 256], riftco.TokenError, "prompt token 256 at index 1 is outside"),
        ([-1], riftco.TokenError, "prompt token -1 at index 0"),
        (np.array([1, 300]), riftco.TokenError, "prompt token 300 at index 1"),
        (np.array([[1, 2]]), riftco.TokenError, r"1-D; got shape \(1, 2\)"),
        ([97, 1.0], TypeError, "got 1.0 at index 1"),
        ([True], TypeError, "got True at index 0"),
        (np.array([1.0, 2.0]), TypeError, "integer dtype; got float64"),
        (np.arange(3, dtype=np.int32).data, TypeError, "1-byte items"),
        ([], riftco.TokenError, "at least one byte"),
        ("", riftco.TokenError, "at least one byte"),
        ("\udcff", riftco.TokenError, "UTF-8"),
    ],
)
def test_bad_prompt_values(
    model: riftco.DecoderOnlyTransformer, prompt: Any, error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        generate(model, prompt, 3)


def test_check_generation_args_returns_prompt_bytes() -> None:
    assert check_generation_args([104, 105], 3, 0.5, 2, 0, max_seq_len=4) == b"hi"
    with pytest.raises(riftco.TokenError, match="max_seq_len is 3"):
        check_generation_args("hi", 3, max_seq_len=3)


# ----------------------------------------------------------------------------- BatchSampler


@pytest.mark.parametrize(
    "tokens",
    [
        list(range(10)),
        tuple(range(10)),
        range(10),
        bytes(range(10)),
        np.arange(10, dtype=np.int32),
        np.arange(10, dtype=np.uint16),
    ],
)
def test_batch_sampler_accepts_integer_array_likes(tokens: Any) -> None:
    want = BatchSampler(np.arange(10, dtype=np.uint8), 3, 4, 7).batches(2)
    got = BatchSampler(tokens, 3, 4, 7).batches(2)
    for w, g in zip(want, got):
        assert g.dtype == np.int64 and g.shape == (3, 5)
        np.testing.assert_array_equal(w, g)


def test_batch_sampler_quoted_reproduction() -> None:
    block = BatchSampler([1, 2, 3], 2, 2, 0).next_batch()
    np.testing.assert_array_equal(block, [[1, 2, 3], [1, 2, 3]])


@pytest.mark.parametrize(
    ("args", "error", "match"),
    [
        (([1.0, 2.0, 3.0], 1, 2, 0), TypeError, "integer array-like; got list with dtype float64"),
        ((["a", "b", "c"], 1, 2, 0), TypeError, "dtype <U1"),
        (([True, False, True], 1, 2, 0), TypeError, "dtype bool"),
        (("abc", 1, 2, 0), TypeError, "got str"),
        ((5, 1, 2, 0), CorpusError, r"1-D; got shape \(\)"),
        ((np.zeros((3, 3), np.int64), 1, 2, 0), CorpusError, r"1-D; got shape \(3, 3\)"),
        (([1, 2, 3], 1.0, 2, 0), TypeError, "batch_size must be an int; got float 1.0"),
        (([1, 2, 3], 1, 2, -1), CorpusError, "seed must be a non-negative int; got -1"),
        (([1, 2, 3], 0, 2, 0), CorpusError, "must be positive"),
        (([1, 2, 3], 1, 3, 0), CorpusError, "has 3 bytes; seq_len 3 needs at least 4"),
    ],
)
def test_batch_sampler_errors(args: tuple[Any, ...], error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        BatchSampler(*args)
