"""GGUF models in riftco against transformers' own GGUF loading (issue 41, part 4: parity against
references nobody here wrote). transformers reads the same file with the ``gguf`` package,
dequantizes every tensor to float32 and undoes llama.cpp's Q/K row permutation itself
(``AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)``); riftco
reads it with its own Rust reader. Checked here:

1. The real SmolLM2-135M-Instruct GGUF (Q4_1, Q8_0 embedding; 30 blocks, 9/3 heads, rope base
   1e5, tied output): every weight bitwise equal to transformers'; the logits of a chat-templated
   prompt and of plain text (full-sequence forwards, every position) within ``TOLERANCE`` of the
   largest |logit| at each position.
2. Greedy continuations of several chat prompts identical for 32 tokens (riftco's decode session
   + argmax against ``generate(do_sample=False, max_new_tokens=32)`` with no EOS), and each step's
   decode-session logits within ``TOLERANCE`` of ``generate``'s.
3. A tiny grouped-query llama written here by ``gguf.GGUFWriter`` (random weights stored as Q8_0,
   Q4_K, F16 and F32; a byte-level BPE vocabulary; tied and untied output): weights bitwise
   equal, logits within ``TOLERANCE`` -- the Q/K un-permutation (K over the K/V heads) and the
   config mapping checked on a GQA model independently of SmolLM2.

Each parity check is run also on deliberately broken riftco models (Q/K left permuted, K
un-permuted over the query heads, a wrong rope base) to show that the same comparison fails for
them by orders of magnitude.

Skipped, with the reason, when torch, transformers, accelerate (transformers needs it to load a
GGUF), gguf, tokenizers or Jinja2 is absent (optional test dependencies), and the SmolLM2 tests
when its GGUF is not on disk (``real_models.SMOLLM2``: ``RIFTCO_SMOLLM2_GGUF``, or the model
cache ``scripts/fetch_smollm2.sh`` fills).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

import riftco

torch = pytest.importorskip(
    "torch", reason="torch is not installed: the GGUF parity checks against transformers are skipped"
)
transformers = pytest.importorskip(
    "transformers",
    reason="transformers is not installed: the GGUF parity checks against it are skipped",
)
pytest.importorskip(
    "accelerate",
    reason="accelerate is not installed: transformers needs it to load a GGUF file "
    "(from_pretrained(..., gguf_file=...)); the GGUF parity checks are skipped",
)
pytest.importorskip("gguf", reason="the gguf package is not installed: pip install gguf")
pytest.importorskip("tokenizers", reason="tokenizers is not installed: pip install tokenizers")
pytest.importorskip("jinja2", reason="Jinja2 is not installed (pip install 'riftco[chat]')")

import gguf  # noqa: E402 (after the skips)
from gguf import GGMLQuantizationType as Q  # noqa: E402

import tiny_tokenizers as tt  # noqa: E402 (it imports tokenizers and gguf)
from real_models import SMOLLM2, SMOLLM2_MISSING  # noqa: E402

# -- the tolerance ---------------------------------------------------------------------------
#
# Both sides compute in float32 from bitwise the same weights (asserted below: riftco's
# dequantization equals gguf.quants.dequantize, which transformers calls, and the Q/K
# un-permutation only moves rows). What differs is the arithmetic: the order and blocking of
# every f32 sum (riftco's SIMD matmul and flash-attention kernels against PyTorch's BLAS and
# SDPA), where softmax and RMSNorm take their max/sum, and exp/rsqrt implementations ~1 ulp
# apart. With u = 2**-24 ~ 6.0e-8, a length-n dot product summed in another order differs by
# about sqrt(n) * u relative to the size of its terms (rounding errors add as a random walk;
# n * u is the worst case): n = 576 (d_model: Q/K/V/O, gate, up, LM head) gives ~1.4e-6,
# n = 1536 (d_ff: down) ~2.4e-6. SmolLM2 has 30 blocks of 7 such products feeding one residual
# stream, each block's perturbation added to it: ~sqrt(210) * 2e-6 ~ 3e-5 if nothing cancels,
# less in practice since RMSNorm and the residual keep each block's share small. The LM head
# (576-term dots against logits up to |30|) adds ~1e-6 of the largest |logit|.
#
# Measured (2-core AVX-512 host, torch 2.15 / transformers 5.25, float32; `pytest -s` prints
# them): SmolLM2 3.3e-6 at worst over the 63 positions of the chat prompt, 4.3e-6 over the 129
# of the plain text, 2.5e-6 over the 4 x 32 decode-session steps of the greedy prompts; the
# tiny GQA model 1.0e-5 (its random weights, std 2 / sqrt(fan_in) so that attention is sharp
# and the logits O(10), are worse conditioned than trained ones), the same under
# RIFTCO_SIMD=avx2 and scalar. So TOLERANCE = 1e-4 (issue 41's figure) sits 10x above the
# largest measurement and 25-40x above SmolLM2's, ~3x above the pessimistic estimate, while
# the bugs it exists to catch are O(1): on the same inputs, Q/K left as llama.cpp stores them
# misses by 1.9 (SmolLM2 and tiny), K un-permuted over the query heads instead of the K/V
# heads by 1.9 - 2.0 (tiny), a rope base of 1e4 instead of the file's by 0.37 (SmolLM2,
# 1e5) and 1.8 - 1.9 (tiny, 5e5): 3 to 4 orders of magnitude over TOLERANCE
# (test_*_a_broken_model_fails_the_same_check runs these controls).
TOLERANCE = 1e-4
BROKEN_AT_LEAST = 100 * TOLERANCE
"""What a broken model must miss by, at least, for the controls: a bug gives O(0.1 - 1)."""

NEW_TOKENS = 32

CHAT_PROMPTS: list[list[dict[str, str]]] = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "user", "content": "Write a Python function that returns the square of a number."}],
    [
        {"role": "system", "content": "You are a concise assistant."},
        {"role": "user", "content": "Name three primary colors and one fruit of each color."},
    ],
    [
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "4"},
        {"role": "user", "content": "And how do you say 'good morning' in Spanish and German?"},
    ],
]
"""Greedy-continuation prompts (rendered with add_generation_prompt=True)."""

LOGIT_CONVERSATION: list[dict[str, str]] = [
    {"role": "system", "content": "You are a helpful AI assistant named SmolLM."},
    {"role": "user", "content": "Explain in one sentence why the sky is blue."},
    {"role": "assistant", "content": "Sunlight scatters off air molecules; blue scatters most."},
    {"role": "user", "content": "And at sunset?"},
]
PLAIN_TEXT = (
    "The quick brown fox jumps over the lazy dog. In 2024 the price rose from 1,234.56 to "
    "7,890.12 (a 540% rise).\n\ndef greet(name):\n    return f'Hello, {name}!'\n\n"
    "日本語のテキストです。Ελληνικά κείμενα. Русский текст. emoji 🎉👍 — “quotes” …"
)


# -- helpers ---------------------------------------------------------------------------------


def relative_errors(ours: npt.NDArray[np.float32], theirs: npt.NDArray[np.float32]) -> npt.NDArray[np.float64]:
    """Per position (row): max |ours - theirs| / max |theirs|."""
    assert ours.shape == theirs.shape, (ours.shape, theirs.shape)
    a, b = ours.astype(np.float64), theirs.astype(np.float64)
    out: npt.NDArray[np.float64] = np.abs(a - b).max(axis=-1) / np.abs(b).max(axis=-1)
    return out


def assert_close(
    ours: npt.NDArray[np.float32], theirs: npt.NDArray[np.float32], what: str, report: bool = True
) -> float:
    """Asserts every position within TOLERANCE; returns the largest relative difference (and
    prints it when ``report``: ``pytest -s`` shows the margin)."""
    assert np.isfinite(ours).all(), f"{what}: riftco's logits are not finite"
    err = relative_errors(ours, theirs)
    worst = int(np.argmax(err))
    assert err[worst] <= TOLERANCE, (
        f"{what}: riftco's logits differ from transformers' by {err[worst]:.3e} of the largest "
        f"|logit| at position {worst} of {len(err)} (tolerance {TOLERANCE:.0e}; "
        f"{int((err > TOLERANCE).sum())} positions over it)"
    )
    if report:
        print(f"{what}: max relative difference {err.max():.2e} over {len(err)} positions")
    return float(err.max())


def riftco_logits(model: riftco.DecoderOnlyTransformer, ids: list[int]) -> npt.NDArray[np.float32]:
    """Full-sequence forward: ``[len(ids), vocab]``."""
    with riftco.no_grad():
        out = model.logits(np.array([ids], dtype=np.int64)).numpy()
    return np.asarray(out, dtype=np.float32)


def hf_logits(model: Any, ids: list[int]) -> npt.NDArray[np.float32]:
    with torch.no_grad():
        out = model(torch.tensor([ids], dtype=torch.long)).logits[0]
    return np.asarray(out.float().numpy(), dtype=np.float32)


def load_transformers(path: Path) -> tuple[Any, Any]:
    """transformers' GGUF model (float32, eval mode) and tokenizer of ``path``."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = transformers.AutoModelForCausalLM.from_pretrained(
            str(path.parent), gguf_file=path.name, dtype=torch.float32
        )
        tokenizer = transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    return model.eval(), tokenizer


def assert_same_weights(ours: riftco.DecoderOnlyTransformer, theirs: Any) -> None:
    """Every riftco parameter bitwise equal to transformers' of the same (HF Llama) name: the
    same dequantization and the same Q/K un-permutation, so that the logits below differ by
    arithmetic alone."""
    state = theirs.state_dict()
    names = [name for name, _ in ours.named_parameters()]
    assert set(names) <= set(state), sorted(set(names) - set(state))
    for name, p in ours.named_parameters():
        a = np.ascontiguousarray(p.numpy(), dtype=np.float32)
        b = np.ascontiguousarray(state[name].detach().float().numpy(), dtype=np.float32)
        assert a.shape == b.shape, (name, a.shape, b.shape)
        assert np.array_equal(a.view(np.uint32), b.view(np.uint32)), (
            f"{name}: not bitwise equal to transformers' (max |difference| "
            f"{np.abs(a - b).max():.3e})"
        )


def assert_same_config(ours: riftco.DecoderOnlyTransformer, theirs: Any) -> None:
    c, h = ours.config, theirs.config
    rope = h.rope_parameters if getattr(h, "rope_parameters", None) else {"rope_theta": h.rope_theta}
    assert (c.vocab_size, c.d_model, c.n_layers, c.d_ff) == (
        h.vocab_size,
        h.hidden_size,
        h.num_hidden_layers,
        h.intermediate_size,
    )
    assert (c.n_heads, c.n_kv_heads, c.d_head) == (h.num_attention_heads, h.num_key_value_heads, h.head_dim)
    assert c.rope_theta == pytest.approx(rope["rope_theta"], rel=1e-7)
    assert c.rms_norm_eps == pytest.approx(h.rms_norm_eps, rel=1e-6)
    assert c.tie_word_embeddings is bool(h.tie_word_embeddings)


def permute(w: npt.NDArray[np.float32], n_head: int) -> npt.NDArray[np.float32]:
    """``LlamaModel.permute`` of llama.cpp's convert_hf_to_gguf.py (rows of q_proj / k_proj):
    what a GGUF file stores."""
    out: npt.NDArray[np.float32] = (
        w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)
    )
    return out


def unpermute(w: npt.NDArray[np.float32], n_head: int) -> npt.NDArray[np.float32]:
    """The inverse of :func:`permute` (transformers' ``_reverse_permute_weights``)."""
    out: npt.NDArray[np.float32] = (
        w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)
    )
    return out


Breakage = Callable[[riftco.DecoderOnlyTransformer, Path], riftco.DecoderOnlyTransformer]


def qk_left_permuted(good: riftco.DecoderOnlyTransformer, path: Path) -> riftco.DecoderOnlyTransformer:
    """A loader that forgot to undo llama.cpp's Q/K row permutation."""
    model = riftco.load_model(path)
    c = model.config
    for name, p in model.named_parameters():
        if name.endswith("q_proj.weight"):
            p.copy_(permute(p.numpy(), c.n_heads))
        elif name.endswith("k_proj.weight"):
            p.copy_(permute(p.numpy(), c.n_kv_heads))
    return model


def k_unpermuted_over_query_heads(good: riftco.DecoderOnlyTransformer, path: Path) -> riftco.DecoderOnlyTransformer:
    """A loader that undid K's permutation over ``n_heads`` instead of ``n_kv_heads`` (the GQA
    bug; only possible where the K rows divide into ``2 * n_heads`` groups)."""
    model = riftco.load_model(path)
    c = model.config
    for name, p in model.named_parameters():
        if name.endswith("k_proj.weight"):
            p.copy_(unpermute(permute(p.numpy(), c.n_kv_heads), c.n_heads))
    return model


def rope_base_1e4(good: riftco.DecoderOnlyTransformer, path: Path) -> riftco.DecoderOnlyTransformer:
    """A loader that ignored ``llama.rope.freq_base`` (1e4, the usual default)."""
    config = riftco.TransformerConfig.from_dict({**good.config.to_dict(), "rope_theta": 1e4})
    assert good.config.rope_theta != 1e4
    model = riftco.DecoderOnlyTransformer(config)
    weights = dict(good.named_parameters())
    for name, p in model.named_parameters():
        p.copy_(weights[name].numpy())
    return model.eval()


def assert_broken_models_fail(
    good: riftco.DecoderOnlyTransformer,
    path: Path,
    ids: list[int],
    theirs: npt.NDArray[np.float32],
    breakages: list[Breakage],
) -> None:
    """The parity check's power: each broken model misses transformers' logits by at least
    ``BROKEN_AT_LEAST`` (the good one is within ``TOLERANCE``)."""
    for breakage in breakages:
        broken = breakage(good, path)
        err = float(relative_errors(riftco_logits(broken, ids), theirs).max())
        del broken
        print(f"control {breakage.__name__}: max relative difference {err:.2e}")
        assert err >= BROKEN_AT_LEAST, (
            f"{breakage.__name__}: a broken model is only {err:.2e} off transformers' logits, so "
            f"the tolerance {TOLERANCE:.0e} could not tell it from a correct one"
        )


# -- the real SmolLM2 GGUF -------------------------------------------------------------------


def smollm2_path() -> Path:
    if not SMOLLM2.is_file():
        pytest.skip(SMOLLM2_MISSING)
    return SMOLLM2


@dataclass
class Loaded:
    """One GGUF file loaded by riftco and by transformers."""

    path: Path
    model: riftco.DecoderOnlyTransformer
    tokenizer: riftco.Tokenizer
    hf_model: Any
    hf_tokenizer: Any


@pytest.fixture(scope="module")
def smollm2() -> Loaded:
    path = smollm2_path()
    hf_model, hf_tokenizer = load_transformers(path)  # ~15 s on 2 cores
    return Loaded(path, riftco.load_model(path).eval(), riftco.load_tokenizer(path), hf_model, hf_tokenizer)


def smollm2_inputs(s: Loaded) -> dict[str, list[int]]:
    """The token ids both models are given: a chat-templated conversation and plain text,
    encoded by riftco and equal to transformers' encoding (so "the same prompt" holds)."""
    chat = s.tokenizer.apply_chat_template(LOGIT_CONVERSATION, add_generation_prompt=True)
    assert chat == s.hf_tokenizer.apply_chat_template(LOGIT_CONVERSATION, add_generation_prompt=True, tokenize=False)
    out = {
        "chat prompt": s.tokenizer.encode(chat, add_special_tokens=False),
        "plain text": s.tokenizer.encode(PLAIN_TEXT, add_special_tokens=False),
    }
    for what, text in (("chat prompt", chat), ("plain text", PLAIN_TEXT)):
        assert out[what] == s.hf_tokenizer.encode(text, add_special_tokens=False), what
    return out


def test_smollm2_weights_and_config_equal_transformers(smollm2: Loaded) -> None:
    c = smollm2.model.config
    assert (c.d_model, c.n_layers, c.n_heads, c.n_kv_heads, c.d_ff) == (576, 30, 9, 3, 1536)
    assert_same_config(smollm2.model, smollm2.hf_model)
    assert_same_weights(smollm2.model, smollm2.hf_model)


def test_smollm2_logits_match_transformers(smollm2: Loaded) -> None:
    for what, ids in smollm2_inputs(smollm2).items():
        assert len(ids) > 30, what
        assert_close(
            riftco_logits(smollm2.model, ids),
            hf_logits(smollm2.hf_model, ids),
            f"SmolLM2 {what} ({len(ids)} tokens)",
        )


def test_smollm2_a_broken_model_fails_the_same_check(smollm2: Loaded) -> None:
    ids = smollm2_inputs(smollm2)["chat prompt"]
    # K un-permuted over the 9 query heads is not even a reshape of K's 192 rows: left out.
    assert_broken_models_fail(
        smollm2.model, smollm2.path, ids, hf_logits(smollm2.hf_model, ids), [qk_left_permuted, rope_base_1e4]
    )


def riftco_greedy(
    model: riftco.DecoderOnlyTransformer, ids: list[int], n: int
) -> tuple[list[int], list[npt.NDArray[np.float32]]]:
    """``n`` greedy tokens through a decode session (argmax, no stop) and the logits each was
    chosen from."""
    session = model.decode_session()
    logits = np.zeros(0, np.float32)
    for t in ids:
        logits = session.decode_token(t)
    tokens: list[int] = []
    steps: list[npt.NDArray[np.float32]] = []
    for k in range(n):
        steps.append(logits)
        tokens.append(int(np.argmax(logits)))
        if k + 1 < n:
            logits = session.decode_token(tokens[-1])
    return tokens, steps


def hf_greedy(model: Any, ids: list[int], n: int) -> tuple[list[int], list[npt.NDArray[np.float32]]]:
    """transformers' ``generate(do_sample=False, max_new_tokens=n)`` with
    ``generation_config.eos_token_id = None`` (so it neither stops nor masks), and its raw logits
    of each step. The model's own config is changed for the call (``generate`` fills the fields
    of a config passed to it that are left at their defaults, ``None`` EOS included, from the
    model's) and restored after."""
    config = model.generation_config
    eos = config.eos_token_id
    input_ids = torch.tensor([ids], dtype=torch.long)
    try:
        config.eos_token_id = None
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            out = model.generate(
                input_ids,
                attention_mask=torch.ones_like(input_ids),
                do_sample=False,
                max_new_tokens=n,
                output_logits=True,
                return_dict_in_generate=True,
            )
    finally:
        config.eos_token_id = eos
    tokens = [int(t) for t in out.sequences[0, len(ids) :]]
    steps = [np.asarray(step[0].float().numpy(), dtype=np.float32) for step in out.logits]
    return tokens, steps


def top2_gap(logits: npt.NDArray[np.float32]) -> float:
    """(largest - second largest logit) / max |logit|: below TOLERANCE is a near-tie the two
    computations may legitimately resolve differently."""
    top = np.sort(logits.astype(np.float64))[-2:]
    return float((top[1] - top[0]) / np.abs(logits).max())


def test_smollm2_greedy_continuations_equal_transformers(smollm2: Loaded) -> None:
    s = smollm2
    assert len(CHAT_PROMPTS) >= 3
    worst, closest = 0.0, 1.0
    for i, messages in enumerate(CHAT_PROMPTS):
        prompt = s.tokenizer.apply_chat_template(messages, add_generation_prompt=True)
        ids = s.tokenizer.encode(prompt, add_special_tokens=False)
        assert ids == s.hf_tokenizer.encode(prompt, add_special_tokens=False)
        ours, our_steps = riftco_greedy(s.model, ids, NEW_TOKENS)
        theirs, their_steps = hf_greedy(s.hf_model, ids, NEW_TOKENS)
        assert len(theirs) == len(ours) == NEW_TOKENS, (i, len(theirs))
        # Each step's logits, as long as both continuations are the same (the same prefix).
        agree = next((k for k, (a, b) in enumerate(zip(ours, theirs)) if a != b), NEW_TOKENS)
        for k in range(min(agree + 1, NEW_TOKENS)):
            what = f"prompt {i} step {k}"
            worst = max(worst, assert_close(our_steps[k][None], their_steps[k][None], what, report=False))
            closest = min(closest, top2_gap(our_steps[k]), top2_gap(their_steps[k]))
        if agree < NEW_TOKENS:
            ours_gap, theirs_gap = top2_gap(our_steps[agree]), top2_gap(their_steps[agree])
            tie = (
                "a NEAR-TIE (top-2 logits within the tolerance): the two f32 computations may "
                "legitimately pick differently here, but the continuations are not identical"
                if min(ours_gap, theirs_gap) <= TOLERANCE
                else "NOT a near-tie: a real difference"
            )
            pytest.fail(
                f"prompt {i} {messages[-1]['content']!r}: greedy continuations diverge at new "
                f"token {agree}: riftco {ours[agree]} {s.tokenizer.decode([ours[agree]])!r}, "
                f"transformers {theirs[agree]} {s.tokenizer.decode([theirs[agree]])!r}; top-2 gap "
                f"there {ours_gap:.2e} (riftco) / {theirs_gap:.2e} (transformers) of the largest "
                f"|logit| -- {tie}.\nriftco:       {s.tokenizer.decode(ours)!r}\n"
                f"transformers: {s.tokenizer.decode(theirs)!r}"
            )
        print(f"prompt {i}: {s.tokenizer.decode(ours)!r}")
    print(
        f"SmolLM2 decode-session steps: max relative difference {worst:.2e}; the closest top-2 "
        f"gap met {closest:.2e} of the largest |logit|"
    )


# -- a tiny grouped-query llama written here -------------------------------------------------

TINY = dict(d_model=256, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=512, context=128)
TINY_ROPE_BASE = 5e5
TINY_RMS_EPS = 1e-6
QK_K = 256

# Stored types per tensor kind and block: projections in Q8_0, Q4_K or F16 (Q and K each in
# all three over the tied and untied models, see tiny_types), norms F32, the embedding Q8_0 as
# llama.cpp stores it, an untied output Q4_K.
TINY_TYPES: dict[str, tuple[Q, Q]] = {
    "attn_q": (Q.Q4_K, Q.Q8_0),
    "attn_k": (Q.Q8_0, Q.F16),
    "attn_v": (Q.F16, Q.Q4_K),
    "attn_output": (Q.Q4_K, Q.Q8_0),
    "ffn_gate": (Q.Q8_0, Q.F16),
    "ffn_up": (Q.F16, Q.Q4_K),
    "ffn_down": (Q.Q4_K, Q.Q8_0),
}


def tiny_types(tied: bool) -> dict[str, tuple[Q, Q]]:
    """The tied model as :data:`TINY_TYPES`; the untied one with K of block 1 in Q4_K (so that
    Q and K each meet Q8_0, Q4_K and F16 over the two models)."""
    types = dict(TINY_TYPES)
    if not tied:
        types["attn_k"] = (Q.Q8_0, Q.Q4_K)
    return types


def quantize_q4_k(values: npt.NDArray[np.float32]) -> npt.NDArray[np.uint8]:
    """``values`` ``[rows, cols]`` (``cols`` a multiple of 256) as Q4_K blocks, which
    ``gguf.quants.quantize`` does not implement: per 256 values an f16 ``d`` and ``dmin``, 12
    bytes of 6-bit scales and mins of the 8 sub-blocks of 32, and 128 bytes of 4-bit quants
    (sub-blocks 2g and 2g+1 in the low and high nibbles of bytes 32g..32g+31); value =
    ``d * scale_j * q - dmin * min_j``. A plain min/max quantizer, not llama.cpp's search: any
    valid blocks will do, and the caller checks them against ``gguf.quants.dequantize``."""
    rows, cols = values.shape
    assert cols % QK_K == 0
    x = values.astype(np.float32).reshape(-1, 8, 32)
    lo = np.minimum(x.min(axis=2), 0.0)
    scale = (x.max(axis=2) - lo) / 15
    d = (scale.max(axis=1) / 63).astype(np.float16)
    dmin = ((-lo).max(axis=1) / 63).astype(np.float16)
    d32, dmin32 = d.astype(np.float32)[:, None], dmin.astype(np.float32)[:, None]
    sc = np.rint(scale / np.where(d32 > 0, d32, 1)).clip(0, 63).astype(np.uint8)
    mn = np.rint(-lo / np.where(dmin32 > 0, dmin32, 1)).clip(0, 63).astype(np.uint8)
    step = (d32 * sc)[..., None]
    q = np.rint((x + (dmin32 * mn)[..., None]) / np.where(step > 0, step, 1))
    q = np.where(step > 0, q, 0).clip(0, 15).astype(np.uint8)
    scales = np.concatenate(
        [
            (sc[:, :4] & 63) | ((sc[:, 4:] >> 4) << 6),
            (mn[:, :4] & 63) | ((mn[:, 4:] >> 4) << 6),
            (sc[:, 4:] & 15) | ((mn[:, 4:] & 15) << 4),
        ],
        axis=1,
    ).astype(np.uint8)
    pairs = q.reshape(-1, 4, 2, 32)
    qs = (pairs[:, :, 0] | (pairs[:, :, 1] << 4)).reshape(-1, 128).astype(np.uint8)
    blocks = np.concatenate(
        [d.reshape(-1, 1).view(np.uint8), dmin.reshape(-1, 1).view(np.uint8), scales, qs], axis=1
    )
    assert blocks.shape[1] == gguf.GGML_QUANT_SIZES[Q.Q4_K][1]
    out: npt.NDArray[np.uint8] = blocks.reshape(rows, cols // QK_K * blocks.shape[1])
    return out


def stored(qtype: Q, values: npt.NDArray[np.float32]) -> npt.NDArray[Any]:
    """``values`` as stored in ``qtype`` (checked to dequantize back close to them)."""
    data: npt.NDArray[Any]
    if qtype == Q.F32:
        return values
    if qtype == Q.F16:
        data = values.astype(np.float16)
    elif qtype == Q.Q4_K:
        data = quantize_q4_k(values)
    else:
        data = gguf.quants.quantize(values, qtype)
    back = np.asarray(gguf.quants.dequantize(data, qtype), dtype=np.float32).reshape(values.shape)
    rms = float(np.sqrt(np.mean(values.astype(np.float64) ** 2)))
    assert np.sqrt(np.mean((back - values) ** 2)) <= 0.2 * rms, f"{qtype.name}: a bad encoding"
    return data


def write_tiny_llama(path: Path, tok: Any, tied: bool) -> None:
    """A ``llama`` GGUF as llama.cpp's converter writes one: hyper-parameters, ``tok``'s
    byte-level BPE vocabulary (``"smollm"`` pre-tokenizer, ChatML template), random weights with
    Q and K rows permuted, each tensor stored in its :func:`tiny_types` type."""
    vocab = tok.get_vocab(with_added_tokens=True)
    tokens = sorted(vocab, key=vocab.__getitem__)
    assert [vocab[t] for t in tokens] == list(range(len(tokens)))
    d, ff, heads, kv = TINY["d_model"], TINY["d_ff"], TINY["n_heads"], TINY["n_kv_heads"]
    d_head = d // heads
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_context_length(TINY["context"])
    w.add_embedding_length(d)
    w.add_block_count(TINY["n_layers"])
    w.add_feed_forward_length(ff)
    w.add_head_count(heads)
    w.add_head_count_kv(kv)
    w.add_rope_dimension_count(d_head)
    w.add_rope_freq_base(TINY_ROPE_BASE)
    w.add_layer_norm_rms_eps(TINY_RMS_EPS)
    w.add_vocab_size(len(tokens))
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    w.add_token_list(tokens)
    w.add_token_types([3 if t in tt.SPECIALS else 1 for t in tokens])
    w.add_token_merges(tt.bpe_merges(tok))
    w.add_bos_token_id(vocab["<|im_start|>"])
    w.add_eos_token_id(vocab["<|im_end|>"])
    w.add_chat_template(tt.CHATML)

    rng = np.random.default_rng(41 + int(tied))

    def normal(shape: tuple[int, int], std: float) -> npt.NDArray[np.float32]:
        return (rng.standard_normal(shape) * std).astype(np.float32)

    def add(name: str, qtype: Q, values: npt.NDArray[np.float32]) -> None:
        data = stored(qtype, values)
        w.add_tensor(name, data, raw_dtype=None if data.dtype in (np.float32, np.float16) else qtype)

    def norm() -> npt.NDArray[np.float32]:
        return (1.0 + 0.1 * rng.standard_normal(d)).astype(np.float32)

    add("token_embd.weight", Q.Q8_0, normal((len(tokens), d), 1.0))
    if not tied:
        add("output.weight", Q.Q4_K, normal((len(tokens), d), 0.1))
    add("output_norm.weight", Q.F32, norm())
    # Large enough (std 2 / sqrt(fan_in)) that attention is far from uniform and the logits are
    # O(10): a wrong permutation or rope base shows.
    shapes = {
        "attn_q": (heads * d_head, d),
        "attn_k": (kv * d_head, d),
        "attn_v": (kv * d_head, d),
        "attn_output": (d, heads * d_head),
        "ffn_gate": (ff, d),
        "ffn_up": (ff, d),
        "ffn_down": (d, ff),
    }
    types = tiny_types(tied)
    for i in range(TINY["n_layers"]):
        add(f"blk.{i}.attn_norm.weight", Q.F32, norm())
        add(f"blk.{i}.ffn_norm.weight", Q.F32, norm())
        for kind, shape in shapes.items():
            values = normal(shape, 2.0 / np.sqrt(shape[1]))
            if kind == "attn_q":
                values = permute(values, heads)
            elif kind == "attn_k":
                values = permute(values, kv)
            add(f"blk.{i}.{kind}.weight", types[kind][i], values)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.fixture(scope="module")
def bpe() -> Any:
    return tt.reference_byte_level_bpe("smollm")


@pytest.fixture(scope="module", params=[True, False], ids=["tied", "untied"])
def tiny(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, bpe: Any) -> Loaded:
    tied: bool = request.param
    path = tmp_path_factory.mktemp("tiny-gguf") / "tiny-llama.gguf"
    write_tiny_llama(path, bpe, tied)
    infos = {i["name"]: i["type"] for i in riftco.gguf_tensor_infos(path)}
    assert {"Q8_0", "Q4_K", "F16", "F32"} <= set(infos.values())
    assert ("output.weight" in infos) is not tied
    hf_model, hf_tokenizer = load_transformers(path)
    return Loaded(path, riftco.load_model(path).eval(), riftco.load_tokenizer(path), hf_model, hf_tokenizer)


def tiny_inputs(t: Loaded) -> dict[str, list[int]]:
    """A chat prompt (encoded by riftco, equal to transformers' encoding) and random ids filling
    the context (rope at every position)."""
    chat = t.tokenizer.apply_chat_template(CHAT_PROMPTS[2], add_generation_prompt=True)
    ids = t.tokenizer.encode(chat, add_special_tokens=False)
    assert ids == t.hf_tokenizer.encode(chat, add_special_tokens=False)
    rng = np.random.default_rng(7)
    random_ids = rng.integers(0, t.model.config.vocab_size, TINY["context"]).tolist()
    return {"chat prompt": ids, "random ids": [int(i) for i in random_ids]}


def test_tiny_gqa_weights_and_config_equal_transformers(tiny: Loaded) -> None:
    c = tiny.model.config
    assert (c.d_model, c.n_layers, c.n_heads, c.n_kv_heads, c.d_ff) == (
        TINY["d_model"],
        TINY["n_layers"],
        TINY["n_heads"],
        TINY["n_kv_heads"],
        TINY["d_ff"],
    )
    assert (c.rope_theta, c.max_seq_len) == (TINY_ROPE_BASE, TINY["context"])
    assert c.rms_norm_eps == pytest.approx(TINY_RMS_EPS)
    assert_same_config(tiny.model, tiny.hf_model)
    assert_same_weights(tiny.model, tiny.hf_model)


def test_tiny_gqa_logits_match_transformers(tiny: Loaded) -> None:
    tied = "tied" if tiny.model.config.tie_word_embeddings else "untied"
    for what, ids in tiny_inputs(tiny).items():
        theirs = hf_logits(tiny.hf_model, ids)
        # The logits must be far from flat for the comparison to mean anything.
        assert np.abs(theirs).max() > 5.0 and theirs.std(axis=-1).min() > 0.5
        assert_close(riftco_logits(tiny.model, ids), theirs, f"tiny {tied} {what} ({len(ids)} tokens)")
        # The decode session (K/V cache, one token at a time) against the same full forward.
        session = tiny.model.decode_session()
        steps = np.stack([session.decode_token(t) for t in ids])
        assert_close(steps, theirs, f"tiny {tied} {what}, decode session")


def test_tiny_gqa_a_broken_model_fails_the_same_check(tiny: Loaded) -> None:
    ids = tiny_inputs(tiny)["random ids"]
    assert_broken_models_fail(
        tiny.model,
        tiny.path,
        ids,
        hf_logits(tiny.hf_model, ids),
        [qk_left_permuted, k_unpermuted_over_query_heads, rope_base_1e4],
    )
