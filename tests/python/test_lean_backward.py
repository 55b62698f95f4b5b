"""``backward(retain_graph=False)`` from Python: the gradients of a graph that is kept, bit for
bit (every policy, LoRA and dropout, the materialized and flash attention), a lower activation
peak for a checkpointed model, an error naming ``retain_graph`` when a freed graph is
differentiated again, and the keyword's validation."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import riftco

POLICIES = ["disabled", "block", "segments:2", "selective:attention_ffn", "auto"]


def model(policy: str, lora: bool, attention: str) -> riftco.DecoderOnlyTransformer:
    cfg = riftco.TransformerConfig(
        vocab_size=64,
        d_model=16,
        n_heads=2,
        n_layers=4,
        d_ff=32,
        max_seq_len=16,
        seed=3,
        attention_dropout=0.1,
        residual_dropout=0.1,
    )
    m = riftco.DecoderOnlyTransformer(cfg, attention, activation_checkpointing=policy)
    if lora:
        m.enable_lora(rank=2, alpha=4.0, dropout=0.1)
    return m


TOKENS = (np.arange(2 * 13, dtype=np.int64).reshape(2, 13) * 7) % 64


def step(m: riftco.DecoderOnlyTransformer, retain: bool) -> tuple[float, list[Any], int]:
    """One loss and backward at dropout step 0: the loss, every trainable gradient and the
    activation peak of the step."""
    m.dropout_step = 0
    params = [p for p in m.parameters() if p.requires_grad]
    for p in params:
        p.zero_grad()
    m.activation_checkpointing_plan(2, 12)  # planned before the peak is read
    riftco.reset_peak_memory_stats()
    before = riftco.memory_stats()["activation"]["current_bytes"]
    loss = m.loss(TOKENS)
    loss.backward(retain_graph=retain)
    peak = riftco.memory_stats()["activation"]["peak_bytes"] - before
    return loss.item(), [np.array(p.grad) for p in params], peak


@pytest.mark.parametrize("attention", ["flash", "materialized"])
@pytest.mark.parametrize("lora", [False, True])
@pytest.mark.parametrize("policy", POLICIES)
def test_freeing_backward_gives_the_kept_graphs_gradients_bit_for_bit(
    policy: str, lora: bool, attention: str
) -> None:
    m = model(policy, lora, attention)
    loss_kept, kept, peak_kept = step(m, True)
    loss_freed, freed, peak_freed = step(m, False)
    assert loss_kept == loss_freed
    assert len(kept) == len(freed) > 0
    for a, b in zip(kept, freed):
        assert np.array_equal(a, b)
    assert peak_freed <= peak_kept


def test_a_checkpointed_model_peaks_lower_when_backward_frees_the_graph() -> None:
    # With whole logits the head keeps them (and the plain part of the graph): a kept graph
    # holds them through every replay, a freed one has let them go by the first.
    m = model("segments:2", lora=False, attention="materialized")
    m.loss_chunk_bytes = None
    _, _, peak_kept = step(m, True)
    _, _, peak_freed = step(m, False)
    assert peak_freed < peak_kept, (peak_freed, peak_kept)


def test_a_freed_graph_differentiated_again_is_an_error_naming_retain_graph() -> None:
    m = model("block", lora=False, attention="flash")
    loss = m.loss(TOKENS)
    loss.backward()
    loss.backward()  # kept: the same gradients again
    loss.backward(retain_graph=False)
    with pytest.raises(riftco.RiftcoError, match="retain_graph"):
        loss.backward()
    with pytest.raises(riftco.RiftcoError, match="retain_graph"):
        loss.backward_accumulate(retain_graph=False)
    assert np.isfinite(loss.item())  # the output's own value stays readable


@pytest.mark.parametrize("value", ["no", 1, 0.0])
def test_retain_graph_must_be_a_bool(value: Any) -> None:
    loss = model("disabled", lora=False, attention="flash").loss(TOKENS)
    with pytest.raises(TypeError):
        loss.backward(retain_graph=value)
    loss.backward(retain_graph=None)  # the default: the graph is kept
    loss.backward(retain_graph=True)


def test_retain_graph_is_keyword_only() -> None:
    loss = model("disabled", lora=False, attention="flash").loss(TOKENS)
    with pytest.raises(TypeError):
        loss.backward(False)  # type: ignore[call-arg]
