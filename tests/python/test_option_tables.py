"""The option names the Python layer offers come from the Rust tables: the native tuples are what
the model accepts and what its errors list, and ``riftco.configs`` re-exports them. The
activation-checkpointing policies are spellings with parameters (``segments:K``, ...): their
tuple holds the names without one, and errors list every form, ``ACTIVATION_CHECKPOINTING_FORMS``
(the Rust parser's own list)."""

from __future__ import annotations

import re
from typing import Any

import pytest

import riftco
from riftco import _native, configs


def tiny_config() -> riftco.TransformerConfig:
    return riftco.TransformerConfig(
        vocab_size=32, d_model=8, n_heads=2, n_layers=1, d_ff=16, max_seq_len=8
    )


def kw(field: str, value: str) -> dict[str, Any]:
    return {field: value}


TABLES = [
    ("attention", _native.ATTENTION_KINDS, configs.ATTENTION_KINDS),
    (
        "activation_checkpointing",
        _native.ACTIVATION_CHECKPOINTING_POLICIES,
        configs.ACTIVATION_CHECKPOINTING_POLICIES,
    ),
]


@pytest.mark.parametrize(("field", "native", "exported"), TABLES)
def test_configs_reexport_the_native_tables(
    field: str, native: tuple[str, ...], exported: tuple[str, ...]
) -> None:
    assert isinstance(native, tuple) and all(isinstance(n, str) for n in native)
    assert exported is native and getattr(riftco, exported_name(field)) is native
    assert len(set(native)) == len(native) >= 2


def exported_name(field: str) -> str:
    return {"attention": "ATTENTION_KINDS"}.get(field, "ACTIVATION_CHECKPOINTING_POLICIES")


@pytest.mark.parametrize(("field", "native", "exported"), TABLES)
def test_every_name_is_accepted_and_the_first_is_the_default(
    field: str, native: tuple[str, ...], exported: tuple[str, ...]
) -> None:
    default_model = riftco.DecoderOnlyTransformer(tiny_config())
    assert getattr(default_model, field) == native[0]
    assert getattr(riftco.PretrainingConfig(), field) == native[0]
    for name in native:
        model = riftco.DecoderOnlyTransformer(tiny_config(), **kw(field, name))
        # The model reads back the canonical spelling: plain "selective" is the first named
        # selective policy; every other simple name is its own canonical form.
        canonical = (
            f"selective:{next(iter(riftco.SELECTIVE_POLICIES))}" if name == "selective" else name
        )
        assert getattr(model, field) == canonical
        assert getattr(riftco.PostTrainingConfig(**kw(field, name)), field) == name


@pytest.mark.parametrize(("field", "native", "exported"), TABLES)
def test_errors_list_exactly_the_table_in_order(
    field: str, native: tuple[str, ...], exported: tuple[str, ...]
) -> None:
    if field == "activation_checkpointing":
        # The model and the stage configs share the native parser and its list of forms, which
        # starts with the simple names in table order.
        forms = riftco.ACTIVATION_CHECKPOINTING_FORMS
        assert forms.startswith('"disabled", "block"') and all(f'"{n}"' in forms for n in native)
        for make in (
            lambda: riftco.DecoderOnlyTransformer(tiny_config(), **kw(field, "nope")),
            lambda: riftco.PretrainingConfig(**kw(field, "nope")),
        ):
            expected = re.escape(f'"nope": expected one of {forms}')
            with pytest.raises(riftco.ConfigError, match=expected):
                make()
        return
    listed = ", ".join(f'"{n}"' for n in native)
    with pytest.raises(riftco.ConfigError, match=re.escape(f'"nope"; expected one of {listed}')):
        riftco.DecoderOnlyTransformer(tiny_config(), **kw(field, "nope"))
    listed = ", ".join(repr(n) for n in native)
    with pytest.raises(riftco.ConfigError, match=re.escape(f"must be one of {listed}")):
        riftco.PretrainingConfig(**kw(field, "nope"))
