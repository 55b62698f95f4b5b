"""Marks the numerics-sensitive test modules ``numerics``: those whose assertions are bitwise
claims, derived tolerances or determinism across runs, ranks, policies or devices. The test
command (scripts/test.sh) runs the whole suite at the CPU's best SIMD level, then
``pytest -m numerics`` once more under ``RIFTCO_SIMD=<level>`` for every other level the machine
has, so that a claim that holds on an AVX2 host and not on an AVX-512 one (or the reverse) fails
on either."""

from __future__ import annotations

import pytest

NUMERICS_MODULES = frozenset(
    {
        "test_checkpoint_api",
        "test_checkpoint_mlp_memory",
        "test_chunked_loss",
        "test_contracts",
        "test_determinism",
        "test_distributed",
        "test_zero3",
        "test_dropout",
        "test_frozen_dtype",
        "test_gguf",
        "test_gguf_transformers",
        "test_gqa_tied",
        "test_lean_backward",
        "test_ops_math",
        "test_packing",
        "test_prefill",
        "test_policies",
        "test_policy_stages",
        "test_quantize",
        "test_quantized_base",
        "test_resume",
        "test_training",
        "test_variable_parity",
    }
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.stem in NUMERICS_MODULES:
            item.add_marker(pytest.mark.numerics)
