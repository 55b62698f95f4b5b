"""``riftco.Tokenizer`` against references nobody here wrote: BPE vocabularies trained by the
``tokenizers`` package and written to GGUF by the ``gguf`` package (read back by its
``GGUFReader``), a Hugging Face folder's ``tokenizer.json``, the real SmolLM2-135M-Instruct GGUF
(when cached), and transformers' GGUF tokenizer where transformers is installed."""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import riftco
import riftco._native
from riftco.chat_template import ChatTemplateError

pytest.importorskip("tokenizers", reason="tokenizers is not installed: pip install tokenizers")
pytest.importorskip("gguf", reason="the gguf package is not installed: pip install gguf")
pytest.importorskip("jinja2", reason="Jinja2 is not installed (pip install 'riftco[chat]')")

from real_models import SMOLLM2, SMOLLM2_MISSING  # noqa: E402
import tiny_tokenizers as tt  # noqa: E402 (after the skips: it imports tokenizers and gguf)

SMOLLM = SMOLLM2
needs_smollm = pytest.mark.skipif(
    not SMOLLM.is_file(),
    reason=SMOLLM2_MISSING,
)
BPE_PRES = ["gpt-2", "smollm", "llama-bpe"]


def from_gguf(path: Path) -> riftco.Tokenizer:
    return riftco.Tokenizer.from_gguf_metadata(tt.gguf_metadata(path), name=str(path))


@pytest.fixture(scope="module")
def bpe_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Any, Path]]:
    """For each pre-tokenizer name: the trained reference and its GGUF."""
    folder = tmp_path_factory.mktemp("bpe")
    out = {}
    for pre in BPE_PRES:
        ref = tt.reference_byte_level_bpe(pre)
        out[pre] = (ref, tt.write_bpe_gguf(folder / f"{pre}.gguf", ref, pre))
    return out


@pytest.fixture(scope="module")
def spm_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tt.write_spm_gguf(tmp_path_factory.mktemp("spm") / "spm.gguf")


# -- GGUF byte-level BPE --------------------------------------------------------------------


@pytest.mark.parametrize("pre", BPE_PRES)
def test_gguf_bpe_ids_equal_the_trained_tokenizer(
    bpe_files: dict[str, tuple[Any, Path]], pre: str
) -> None:
    ref, path = bpe_files[pre]
    ours = from_gguf(path)
    assert ours.vocab_size == ref.get_vocab_size(with_added_tokens=True)
    for text in tt.TEXTS:
        ids = ours.encode(text, add_special_tokens=False)
        assert ids == ref.encode(text, add_special_tokens=False).ids, (pre, text)
        assert ours.decode(ids) == text
        assert ours.decode(ids, skip_special_tokens=True) == ref.decode(ids)
    # Control tokens are whole tokens, never split into their characters.
    for i, special in enumerate(tt.SPECIALS):
        assert ours.encode(f"a{special}b", add_special_tokens=False)[1] == i


@pytest.mark.parametrize("pre", BPE_PRES)
def test_gguf_bpe_splits_text_as_its_pre_tokenizer_names(
    bpe_files: dict[str, tuple[Any, Path]], pre: str
) -> None:
    # Where the pre-tokenizers differ, so do the ids: single digits (smollm), runs of three
    # (llama-bpe), one run (gpt-2); the trained merges alone cannot tell them apart.
    ours = {p: from_gguf(bpe_files[p][1]) for p in BPE_PRES}
    text = "in 2024 we paid 1234567"
    pieces = {p: [t.decode("utf-8") for t in _token_bytes(ours[p], text)] for p in BPE_PRES}
    assert "".join(pieces[pre]) == text
    digits = [s.strip() for s in pieces[pre] if s.strip().isdigit()]
    longest = max(len(d) for d in digits)
    assert longest == {"smollm": 1, "llama-bpe": 3}.get(pre, longest)
    if pre == "gpt-2":
        assert longest > 3  # " 1234567" is one chunk under GPT-2's expression


def _token_bytes(tok: riftco.Tokenizer, text: str) -> list[bytes]:
    return [tok.decode([i]).encode("utf-8") for i in tok.encode(text, add_special_tokens=False)]


def test_gguf_bpe_bos_follows_llama_cpp(bpe_files: dict[str, tuple[Any, Path]], tmp_path: Path) -> None:
    # llama.cpp adds BOS to the Llama 3 pre-tokenizers' vocabularies and not to GPT-2's, unless
    # tokenizer.ggml.add_bos_token says otherwise.
    bos = tt.SPECIALS.index("<|im_start|>")
    assert from_gguf(bpe_files["llama-bpe"][1]).encode("hi")[0] == bos
    assert from_gguf(bpe_files["gpt-2"][1]).encode("hi")[0] != bos
    ref = bpe_files["gpt-2"][0]
    on = from_gguf(tt.write_bpe_gguf(tmp_path / "on.gguf", ref, "gpt-2", add_bos=True))
    assert on.encode("hi") == [bos, *on.encode("hi", add_special_tokens=False)]
    off = from_gguf(tt.write_bpe_gguf(tmp_path / "off.gguf", ref, "llama-bpe", add_bos=False))
    assert off.encode("hi") == off.encode("hi", add_special_tokens=False)


def test_gguf_bpe_special_ids_and_end_of_turn(bpe_files: dict[str, tuple[Any, Path]]) -> None:
    ours = from_gguf(bpe_files["gpt-2"][1])
    im_start, im_end = tt.SPECIALS.index("<|im_start|>"), tt.SPECIALS.index("<|im_end|>")
    assert (ours.bos_token_id, ours.eos_token_id) == (im_start, im_end)
    assert (ours.bos_token, ours.eos_token) == ("<|im_start|>", "<|im_end|>")
    assert ours.end_of_turn == "<|im_end|>" and ours.stop_token_ids == {im_end}
    assert ours.stop_text is None  # the end of turn is a token: ids stop generation
    assert ours.special_token_ids == set(range(len(tt.SPECIALS)))


def test_gguf_without_pre_warns_and_uses_the_default(
    bpe_files: dict[str, tuple[Any, Path]], tmp_path: Path
) -> None:
    path = tt.write_bpe_gguf(tmp_path / "nopre.gguf", bpe_files["gpt-2"][0], None)
    with pytest.warns(RuntimeWarning, match="no tokenizer.ggml.pre: using the 'default'"):
        ours = from_gguf(path)
    assert ours.warnings and "default" in ours.warnings[0]
    for text in tt.TEXTS:
        assert ours.decode(ours.encode(text, add_special_tokens=False)) == text


# -- GGUF SentencePiece ---------------------------------------------------------------------


def spm_pieces(tok: riftco.Tokenizer, text: str, add_special_tokens: bool = False) -> list[str]:
    tokens = tt.spm_tokens()[0]
    return [tokens[i] for i in tok.encode(text, add_special_tokens=add_special_tokens)]


def test_gguf_sentencepiece_merges_the_highest_scoring_pair_first(spm_file: Path) -> None:
    ours = from_gguf(spm_file)
    # "hello world" is "▁hello▁world"; the pairs that form pieces, best score first: ld (-9),
    # ll (-10), ▁h (-11), then l+lo... llo (-12), ▁h+e (-13), ▁he+llo (-14), or (-15),
    # ▁w (-16), ▁w+or (-17), ▁wor+ld (-18). "he" (-30) and "lo" (-31) never get their turn.
    assert spm_pieces(ours, "hello world") == ["\u2581hello", "\u2581world"]
    assert spm_pieces(ours, "world hello") == ["\u2581world", "\u2581hello"]
    # "hellow": the w has no partner (no "ow", no "lw"): it stays alone.
    assert spm_pieces(ours, "hellow") == ["\u2581hello", "w"]
    # "he": ▁h (-11) before he (-30), then ▁h+e.
    assert spm_pieces(ours, "he") == ["\u2581he"]
    # A character outside the vocabulary is its UTF-8 bytes (byte fallback).
    assert spm_pieces(ours, "héllo") == ["\u2581h", "<0xC3>", "<0xA9>", "llo"]
    # BOS is added (add_bos_token), the text's spaces are ▁.
    assert spm_pieces(ours, "hello", add_special_tokens=True) == ["<s>", "\u2581hello"]
    assert (ours.bos_token_id, ours.eos_token_id) == (1, 2)


def test_gguf_sentencepiece_spaces_as_sentencepiece_writes_them(spm_file: Path) -> None:
    # SentencePiece's dummy prefix (llama.cpp's add_space_prefix): every stretch of text between
    # special tokens gets one "▁", also when it starts with a space, and after a special token.
    ours = from_gguf(spm_file)
    assert spm_pieces(ours, " hello") == ["\u2581", "\u2581hello"]
    assert spm_pieces(ours, "<s>hello") == ["<s>", "\u2581hello"]
    assert spm_pieces(ours, "hello</s>world") == ["\u2581hello", "</s>", "\u2581world"]
    for text in [*tt.TEXTS, " hello", "  two leading", "trailing  "]:
        ids = ours.encode(text, add_special_tokens=False)
        assert ours.decode(ids) == text, text


# -- bad GGUF metadata ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"tokenizer.ggml.model": "bert"}, "tokenizer.ggml.model 'bert' is not a tokenizer"),
        ({"tokenizer.ggml.model": 3}, "tokenizer.ggml.model must be a string"),
        ({"tokenizer.ggml.pre": "qwen9"}, "tokenizer.ggml.pre 'qwen9' is not a pre-tokenizer"),
        ({"tokenizer.ggml.tokens": None}, "has no tokenizer.ggml.tokens"),
        ({"tokenizer.ggml.tokens": []}, "tokenizer.ggml.tokens is empty"),
        ({"tokenizer.ggml.tokens": "abc"}, "tokenizer.ggml.tokens must be an array of strings"),
        ({"tokenizer.ggml.token_type": [1, 2]}, "token_type has 2 entries for"),
        ({"tokenizer.ggml.merges": ["Ġt", "a b"]}, r"tokenizer.ggml.merges\[0\] 'Ġt' is not two"),
        ({"tokenizer.ggml.merges": ["zz qq"]}, r"merges\[0\] 'zz qq' needs the token 'zz'"),
        ({"tokenizer.ggml.eos_token_id": 10**9}, "eos_token_id 1000000000 is outside"),
        ({"tokenizer.ggml.bos_token_id": "1"}, "bos_token_id must be an integer"),
        ({"tokenizer.ggml.add_bos_token": 1}, "add_bos_token must be a boolean"),
        (
            {"tokenizer.ggml.add_bos_token": True, "tokenizer.ggml.bos_token_id": None},
            "add_bos_token is true but the file has no tokenizer.ggml.bos_token_id",
        ),
    ],
)
def test_bad_gguf_metadata_is_one_clear_error(
    bpe_files: dict[str, tuple[Any, Path]], change: dict[str, Any], match: str
) -> None:
    meta = tt.gguf_metadata(bpe_files["gpt-2"][1])
    for key, value in change.items():
        if value is None:
            meta.pop(key, None)
        else:
            meta[key] = value
    with pytest.raises(riftco.ModelStateError, match=match) as e:
        riftco.Tokenizer.from_gguf_metadata(meta, name="bad.gguf")
    assert "bad.gguf" in str(e.value)


def test_duplicate_tokens_and_bad_scores_are_named(spm_file: Path) -> None:
    meta = tt.gguf_metadata(spm_file)
    tokens = list(meta["tokenizer.ggml.tokens"])
    tokens[-1] = tokens[-2]
    with pytest.raises(riftco.ModelStateError, match=r"duplicate token .* has ids \d+ and \d+"):
        riftco.Tokenizer.from_gguf_metadata({**meta, "tokenizer.ggml.tokens": tokens}, "x.gguf")
    scores = list(meta["tokenizer.ggml.scores"])
    scores[270] = float("nan")
    with pytest.raises(riftco.ModelStateError, match=r"scores\[270\] is nan"):
        riftco.Tokenizer.from_gguf_metadata({**meta, "tokenizer.ggml.scores": scores}, "x.gguf")
    meta.pop("tokenizer.ggml.scores")
    with pytest.raises(riftco.ModelStateError, match="has no tokenizer.ggml.scores"):
        riftco.Tokenizer.from_gguf_metadata(meta, "x.gguf")


def test_text_a_vocabulary_cannot_spell_is_an_error_not_dropped() -> None:
    # A BPE without byte fallback or unknown token whose vocabulary lacks "z": the tokenizers
    # package would leave the "z" out silently.
    meta = {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": "gpt-2",
        "tokenizer.ggml.tokens": ["a", "b", "ab", "Ġ"],
        "tokenizer.ggml.merges": ["a b"],
    }
    tok = riftco.Tokenizer.from_gguf_metadata(meta, name="abc.gguf")
    assert tok.encode("ab ab", add_special_tokens=False) == [2, 3, 2]
    with pytest.raises(riftco.TokenError, match=r"abc.gguf cannot encode 'z' \(U\+007A, at character 3\)"):
        tok.encode("ab z", add_special_tokens=False)


# -- Hugging Face folders, byte models, run folders, GGUF files -----------------------------


@pytest.fixture(scope="module")
def hf_folder(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Path]:
    folder = tmp_path_factory.mktemp("hf")
    ref = tt.reference_byte_level_bpe("gpt-2")
    ref.save(str(folder / "tokenizer.json"))
    config = {"bos_token": "<|im_start|>", "eos_token": {"content": "<|im_end|>"},
              "chat_template": tt.CHATML}
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    (folder / "model.safetensors").touch()  # where the weights would be: a file in the folder
    return ref, folder


def test_hf_folder_tokenizer_is_its_tokenizer_json(hf_folder: tuple[Any, Path]) -> None:
    import tokenizers

    ref_in_memory, folder = hf_folder
    ref = tokenizers.Tokenizer.from_file(str(folder / "tokenizer.json"))
    for path in (folder, folder / "model.safetensors", str(folder)):
        ours = riftco.load_tokenizer(path)
        assert ours.name == str(folder / "tokenizer.json")
    for text in tt.TEXTS:
        ids = ours.encode(text)
        assert ids == ref.encode(text).ids == ref_in_memory.encode(text).ids
        assert ours.decode(ids) == ref.decode(ids, skip_special_tokens=False) == text
    assert (ours.bos_token_id, ours.eos_token_id) == (1, 2)
    assert ours.stop_token_ids == {2} and ours.end_of_turn == "<|im_end|>"
    msgs = [{"role": "user", "content": "Hi"}]
    assert ours.apply_chat_template(msgs, add_generation_prompt=True) == (
        "<|im_start|>system\nYou are a helpful AI assistant.<|im_end|>\n"
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    )


def test_hf_folder_eos_that_is_not_a_token_is_named(tmp_path: Path, hf_folder: tuple[Any, Path]) -> None:
    (tmp_path / "tokenizer.json").write_bytes((hf_folder[1] / "tokenizer.json").read_bytes())
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"eos_token": "</nope>"}))
    with pytest.raises(riftco.TokenError, match="eos_token '</nope>' is not a token of"):
        riftco.load_tokenizer(tmp_path)
    (tmp_path / "tokenizer_config.json").write_text("{oops")
    with pytest.raises(ChatTemplateError, match="invalid JSON"):
        riftco.load_tokenizer(tmp_path)


def test_byte_model_folder_is_byte_tokens(tmp_path: Path) -> None:
    ours = riftco.load_tokenizer(tmp_path)
    assert ours.is_bytes and ours.vocab_size == 256 and ours.name == "riftco byte tokens"
    text = "héllo 🎉"
    assert ours.encode(text) == list(text.encode("utf-8"))
    assert ours.decode(list(text.encode("utf-8"))) == text
    assert ours.decode([0xFF, 0x41]) == "\ufffdA"
    # riftco's default template: its end of turn is text, not a token.
    assert ours.end_of_turn == "<|end|>" and ours.stop_text == "<|end|>"
    assert ours.stop_token_ids == frozenset() and ours.bos_token_id is None
    with pytest.raises(riftco.TokenError, match="token id 256 at index 1 is outside"):
        ours.decode([1, 256])
    with pytest.raises(riftco.TokenError, match="not encodable as UTF-8"):
        ours.encode("\udcff")
    with pytest.raises(TypeError, match="must be a str"):
        ours.encode(b"abc")  # type: ignore[arg-type]


def test_run_folders_use_the_base_models_tokenizer(tmp_path: Path, hf_folder: tuple[Any, Path]) -> None:
    base = hf_folder[1]
    run = tmp_path / "run"
    (run / "adapter").mkdir(parents=True)
    (run / "training_metadata.json").write_text(
        json.dumps({"base_model": str(base / "model.safetensors")})
    )
    for path in (run, run / "adapter"):
        assert riftco.load_tokenizer(path).name == str(base / "tokenizer.json")
    # A chain: a full post-training output of that run's output.
    again = tmp_path / "again"
    again.mkdir()
    (again / "training_metadata.json").write_text(json.dumps({"base_model": str(run)}))
    assert riftco.load_tokenizer(again).name == str(base / "tokenizer.json")
    # A pretraining output (no base model) and a cycle end in byte tokens.
    (tmp_path / "loop").mkdir()
    (tmp_path / "loop" / "training_metadata.json").write_text(
        json.dumps({"base_model": str(tmp_path / "loop")})
    )
    assert riftco.load_tokenizer(tmp_path / "loop").is_bytes
    with pytest.raises(riftco.ModelStateError, match="no model or tokenizer at"):
        riftco.load_tokenizer(tmp_path / "missing")


def test_gguf_file_is_read_by_riftcos_reader(
    bpe_files: dict[str, tuple[Any, Path]], monkeypatch: pytest.MonkeyPatch
) -> None:
    ref, path = bpe_files["smollm"]
    calls: list[str] = []

    def read(p: str) -> dict[str, Any]:
        calls.append(p)
        return tt.gguf_metadata(Path(p))

    monkeypatch.setattr(riftco._native, "read_gguf_metadata", read, raising=False)
    ours = riftco.load_tokenizer(path)
    assert calls == [str(path)] and ours.name == str(path)
    assert ours.encode("x = 12") == ref.encode("x = 12").ids
    monkeypatch.delattr(riftco._native, "read_gguf_metadata", raising=False)
    with pytest.raises(riftco.ModelStateError, match="needs riftco's GGUF reader"):
        riftco.load_tokenizer(path)


# -- streaming ------------------------------------------------------------------------------


def stream_pieces(tok: riftco.Tokenizer, ids: list[int], context: list[int] | None = None) -> list[str]:
    stream = tok.stream(context or [])
    return [stream.add_token(i) for i in ids] + [stream.finalize()]


def test_streaming_never_prints_half_a_character(bpe_files: dict[str, tuple[Any, Path]], spm_file: Path) -> None:
    for tok in (from_gguf(bpe_files["gpt-2"][1]), from_gguf(spm_file), riftco.Tokenizer.byte_tokens()):
        for text in tt.TEXTS:
            ids = tok.encode(text, add_special_tokens=False)
            pieces = stream_pieces(tok, ids)
            assert "".join(pieces) == tok.decode(ids) == text, (tok.name, text)
            assert not any("\ufffd" in p for p in pieces), (tok.name, text, pieces)
    # The emoji is 4 bytes: 4 byte tokens, printed once, whole, with the last.
    byte_tok = riftco.Tokenizer.byte_tokens()
    assert stream_pieces(byte_tok, list("a🦩".encode()))[:6] == ["a", "", "", "", "🦩", ""]


def test_streaming_invalid_bytes_equals_decoding_them_whole() -> None:
    tok = riftco.Tokenizer.byte_tokens()
    rng = np.random.default_rng(7)
    for _ in range(50):
        ids = [int(b) for b in rng.integers(0x80, 0x100, size=12)] + [ord("x")]
        assert "".join(stream_pieces(tok, ids)) == bytes(ids).decode("utf-8", errors="replace")
    # An unfinished character at the end comes out on finalize, as U+FFFD.
    assert stream_pieces(tok, [0x61, 0xE2, 0x82]) == ["a", "", "", "\ufffd"]


def test_streaming_after_a_prompt_keeps_the_leading_space(spm_file: Path) -> None:
    # A SentencePiece decoder drops the space of a sequence's first "▁" piece: decoded alone,
    # "▁world" is "world", but after the prompt it is " world".
    tok = from_gguf(spm_file)
    prompt, new = tok.encode("hello"), tok.encode("world", add_special_tokens=False)
    assert tok.decode(new) == "world"
    assert "".join(stream_pieces(tok, new, context=prompt)) == " world"
    full, before = tok.decode(prompt + new), tok.decode(prompt)
    assert "".join(stream_pieces(tok, new, context=prompt)) == full[len(before) :]


# -- the real model -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def smollm() -> riftco.Tokenizer:
    if not SMOLLM.is_file():
        pytest.skip(SMOLLM2_MISSING)
    return riftco.Tokenizer.from_gguf_metadata(tt.gguf_metadata(SMOLLM), name=str(SMOLLM))


@needs_smollm
def test_smollm_gguf_equals_its_tokenizer_json_layout(smollm: riftco.Tokenizer) -> None:
    # The reference: SmolLM2's tokenizer.json layout (single digits, then GPT-2's ByteLevel
    # split; its 17 control tokens special) over the file's vocabulary and merges, built by
    # the tokenizers package.
    import tokenizers as tk

    meta = tt.gguf_metadata(SMOLLM)
    tokens = meta["tokenizer.ggml.tokens"]
    ref = tk.Tokenizer(
        tk.models.BPE(
            {t: i for i, t in enumerate(tokens)},
            [tuple(m.split(" ")) for m in meta["tokenizer.ggml.merges"]],
        )
    )
    ref.pre_tokenizer = tk.pre_tokenizers.Sequence(
        [
            tk.pre_tokenizers.Digits(individual_digits=True),
            tk.pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    ref.decoder = tk.decoders.ByteLevel()
    types = meta["tokenizer.ggml.token_type"]
    ref.add_special_tokens([tk.AddedToken(t, special=True, normalized=False)
                            for t, k in zip(tokens, types) if k == 3])
    assert smollm.vocab_size == len(tokens) == 49152
    for text in tt.TEXTS:
        ids = smollm.encode(text)
        assert ids == ref.encode(text).ids, text
        assert smollm.decode(ids) == text
    assert smollm.encode("<|im_start|>user") == [1, *smollm.encode("user")]
    assert smollm.stop_token_ids == {2} and smollm.end_of_turn == "<|im_end|>"
    prompt = smollm.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}], add_generation_prompt=True
    )
    assert prompt.startswith("<|im_start|>system\n") and prompt.endswith("<|im_start|>assistant\n")


# -- transformers' GGUF tokenizer -----------------------------------------------------------


def transformers_tokenizer(path: Path) -> Any:
    transformers = pytest.importorskip(
        "transformers", reason="transformers is not installed: the GGUF parity checks are skipped"
    )
    pytest.importorskip("torch", reason="transformers' GGUF loading needs torch, not installed")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)


def assert_same_ids(ours: riftco.Tokenizer, theirs: Any, texts: list[str]) -> None:
    for text in texts:
        for special in (False, True):
            assert ours.encode(text, add_special_tokens=special) == theirs.encode(
                text, add_special_tokens=special
            ), (text, special)
        ids = ours.encode(text, add_special_tokens=False)
        for skip in (False, True):
            assert ours.decode(ids, skip_special_tokens=skip) == theirs.decode(
                ids, skip_special_tokens=skip
            ), (text, skip)


CONVERSATIONS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"},
     {"role": "assistant", "content": "4"}, {"role": "user", "content": "And 3+3?"}],
]


@needs_smollm
def test_smollm_gguf_matches_transformers(smollm: riftco.Tokenizer) -> None:
    theirs = transformers_tokenizer(SMOLLM)
    assert_same_ids(smollm, theirs, tt.TEXTS)
    assert (smollm.bos_token_id, smollm.eos_token_id) == (theirs.bos_token_id, theirs.eos_token_id)
    for messages in CONVERSATIONS:
        for generation_prompt in (True, False):
            assert smollm.apply_chat_template(
                messages, add_generation_prompt=generation_prompt
            ) == theirs.apply_chat_template(
                messages, add_generation_prompt=generation_prompt, tokenize=False
            )


@pytest.mark.parametrize("pre", BPE_PRES)
def test_small_bpe_ggufs_match_transformers(
    bpe_files: dict[str, tuple[Any, Path]], tmp_path: Path, pre: str
) -> None:
    ref, _ = bpe_files[pre]
    # add_bos_token written out: transformers adds no BOS when the key is absent, llama.cpp
    # (and riftco) do for Llama 3's pre-tokenizer (test_gguf_bpe_bos_follows_llama_cpp).
    path = tt.write_bpe_gguf(tmp_path / f"{pre}.gguf", ref, pre, add_bos=pre == "llama-bpe")
    theirs = transformers_tokenizer(path)
    ours = from_gguf(path)
    assert_same_ids(ours, theirs, tt.TEXTS)
    for messages in CONVERSATIONS:
        assert ours.apply_chat_template(messages, add_generation_prompt=True) == (
            theirs.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        )


def test_small_sentencepiece_gguf_matches_transformers(spm_file: Path) -> None:
    theirs = transformers_tokenizer(spm_file)
    ours = from_gguf(spm_file)
    # Text that starts with a space or follows a special token is left out: there transformers
    # (a Metaspace pre-tokenizer prepending "▁" to the first word only) and SentencePiece /
    # llama.cpp (riftco: "▁" before every stretch of text) differ, see
    # test_gguf_sentencepiece_spaces_as_sentencepiece_writes_them.
    texts = [t for t in tt.TEXTS if not t.startswith((" ", "<"))]
    texts += ["hello world", "world hello hellow", "héllo wörld", "he said: hello!\n"]
    assert_same_ids(ours, theirs, texts)
    assert (ours.bos_token_id, ours.eos_token_id) == (theirs.bos_token_id, theirs.eos_token_id)
