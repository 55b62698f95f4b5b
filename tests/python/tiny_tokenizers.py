"""Small tokenizers and GGUF files for the tokenizer tests, made here with the references
themselves: byte-level BPE vocabularies trained by the ``tokenizers`` package (with the
pre-tokenizer each ``tokenizer.ggml.pre`` name stands for, as the original ``tokenizer.json``
files write it), written into GGUF files by the ``gguf`` package's ``GGUFWriter`` and read back
with its ``GGUFReader``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

CHATML = (
    "{% for message in messages %}"
    "{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\\nYou are a helpful AI assistant.<|im_end|>\\n' }}"
    "{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
"""SmolLM2-Instruct's ChatML template (system line shortened)."""

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

# Llama 3's split expression as its tokenizer.json writes it (Meta-Llama-3-8B).
LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

CORPUS = [
    "The quick brown fox jumps over the lazy dog. The dog sleeps; the fox runs away.",
    "def greet(name):\n    return f'Hello, {name}!'\n\nfor i in range(10):\n    print(greet(i))\n",
    "class Stack:\n\tdef push(self, x):\n\t\tself.items.append(x)\n",
    "In 2024 the price rose from 1,234.56 to 7,890.12 (a 540% rise); call 555-0199.",
    "I'm sure they'll say we've done what you'd expect, and it's fine. DON'T SHOUT.",
    "日本語のテキストです。中文文本。한국어 문장. Ελληνικά κείμενα. Русский текст.",
    "emoji: 🎉🎉 👍 ✓ — “quotes” and ‘single’ …",
    "   indented   text  with   runs of    spaces\n\n\nand blank lines\r\n",
] * 8

TEXTS = [
    "Hello world! 123",
    "def f(x):\n    return x**2  # square\n",
    "  leading   spaces\t\ttabs\n\n\nnewlines at the end\n",
    "日本語のテキスト、中文，한국어 Ελληνικά русский العربية हिन्दी",
    "emoji 🎉👩\u200d👩\u200d👧 ✓ and a rare one 🦩",
    "3.14159 2024-12-06 1,000,000 007",
    "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n",
    "don't I'm we'll THEY'RE it's",
    "x" * 40 + " " * 9 + "y",
    "<|endoftext|>text right after a special token<|im_end|>",
    "a\r\nb\u00a0c\u2028d\x00e",
    "",
]
"""Varied text: code, digits, whitespace runs, non-Latin scripts, emoji, special tokens."""


def reference_byte_level_bpe(pre: str, vocab_size: int = 600) -> Any:
    """A byte-level BPE trained on :data:`CORPUS` by the ``tokenizers`` package, cutting text as
    the original tokenizer of the ``tokenizer.ggml.pre`` name ``pre`` does: ``"gpt-2"`` GPT-2's
    ``ByteLevel`` expression; ``"smollm"`` single digits, then GPT-2's (SmolLM2's
    tokenizer.json); ``"llama-bpe"`` Llama 3's expression with ``ignore_merges``."""
    import tokenizers as tk  # type: ignore[import-not-found, unused-ignore]

    byte_level = tk.pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    pre_tokenizer: Any
    if pre == "gpt-2":
        pre_tokenizer = byte_level
    elif pre == "smollm":
        pre_tokenizer = tk.pre_tokenizers.Sequence(
            [tk.pre_tokenizers.Digits(individual_digits=True), byte_level]
        )
    elif pre == "llama-bpe":
        pre_tokenizer = tk.pre_tokenizers.Sequence(
            [
                tk.pre_tokenizers.Split(tk.Regex(LLAMA3_SPLIT), behavior="isolated"),
                tk.pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
    else:
        raise ValueError(pre)
    tok = tk.Tokenizer(tk.models.BPE(ignore_merges=pre == "llama-bpe"))
    tok.pre_tokenizer = pre_tokenizer
    tok.decoder = tk.decoders.ByteLevel()
    trainer = tk.trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIALS,
        initial_alphabet=tk.pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS, trainer)
    return tok


def bpe_merges(tok: Any) -> list[str]:
    """The ranked merges of a trained ``tokenizers`` BPE, as GGUF writes them (``"a b"``)."""
    import json

    merges = json.loads(tok.to_str())["model"]["merges"]
    return [m if isinstance(m, str) else " ".join(m) for m in merges]


def write_llama_keys(writer: Any, vocab_size: int) -> None:
    """The ``llama.*`` hyperparameters transformers reads with a GGUF tokenizer (a tiny shape)."""
    writer.add_context_length(64)
    writer.add_embedding_length(16)
    writer.add_block_count(1)
    writer.add_feed_forward_length(32)
    writer.add_head_count(2)
    writer.add_head_count_kv(2)
    writer.add_rope_dimension_count(8)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(vocab_size)


def finish(writer: Any) -> None:
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def write_bpe_gguf(
    path: Path,
    tok: Any,
    pre: str | None,
    *,
    add_bos: bool | None = None,
    chat_template: str | None = CHATML,
    eos: str = "<|im_end|>",
) -> Path:
    """A GGUF holding ``tok``'s vocabulary (ids in order; the trainer's special tokens are
    control tokens) and merges as a ``"gpt2"`` tokenizer with ``tokenizer.ggml.pre`` ``pre``
    (``None``: no key), BOS ``<|im_start|>`` and EOS ``eos``."""
    import gguf  # type: ignore[import-not-found, unused-ignore]

    vocab = tok.get_vocab(with_added_tokens=True)
    tokens = sorted(vocab, key=vocab.__getitem__)
    assert [vocab[t] for t in tokens] == list(range(len(tokens)))
    writer = gguf.GGUFWriter(str(path), "llama")
    write_llama_keys(writer, len(tokens))
    writer.add_tokenizer_model("gpt2")
    if pre is not None:
        writer.add_tokenizer_pre(pre)
    writer.add_token_list(tokens)
    writer.add_token_types([3 if t in SPECIALS else 1 for t in tokens])
    writer.add_token_merges(bpe_merges(tok))
    writer.add_bos_token_id(vocab["<|im_start|>"])
    writer.add_eos_token_id(vocab[eos])
    if add_bos is not None:
        writer.add_add_bos_token(add_bos)
    if chat_template is not None:
        writer.add_chat_template(chat_template)
    finish(writer)
    return path


# A SentencePiece vocabulary small enough to follow by hand: <unk>, <s>, </s>, the 256 byte
# tokens, then pieces with their scores (the higher, the earlier the pair is merged).
SPM_PIECES: list[tuple[str, float]] = [
    ("\u2581", -1.0),
    ("h", -2.0),
    ("e", -3.0),
    ("l", -4.0),
    ("o", -5.0),
    ("w", -6.0),
    ("r", -7.0),
    ("d", -8.0),
    ("ld", -9.0),
    ("ll", -10.0),
    ("\u2581h", -11.0),
    ("llo", -12.0),
    ("\u2581he", -13.0),
    ("\u2581hello", -14.0),
    ("or", -15.0),
    ("\u2581w", -16.0),
    ("\u2581wor", -17.0),
    ("\u2581world", -18.0),
    ("he", -30.0),
    ("lo", -31.0),
]
SPM_FIRST_PIECE = 3 + 256


def spm_tokens() -> tuple[list[str], list[float], list[int]]:
    """Tokens, scores and token types (2 unknown, 3 control, 6 byte, 1 normal) of the tiny
    SentencePiece vocabulary, in llama.cpp's layout."""
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    scores = [0.0, 0.0, 0.0] + [0.0] * 256
    types = [2, 3, 3] + [6] * 256
    for piece, score in SPM_PIECES:
        tokens.append(piece)
        scores.append(score)
        types.append(1)
    return tokens, scores, types


def write_spm_gguf(path: Path, *, chat_template: str | None = None) -> Path:
    """A ``"llama"`` (SentencePiece) GGUF of :func:`spm_tokens`, BOS 1, EOS 2, UNK 0."""
    import gguf  # type: ignore[import-not-found, unused-ignore]

    tokens, scores, types = spm_tokens()
    writer = gguf.GGUFWriter(str(path), "llama")
    write_llama_keys(writer, len(tokens))
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_unk_token_id(0)
    writer.add_add_bos_token(True)
    writer.add_add_eos_token(False)
    if chat_template is not None:
        writer.add_chat_template(chat_template)
    finish(writer)
    return path


def gguf_metadata(path: Path) -> dict[str, Any]:
    """Every metadata key of a GGUF file as plain Python values (str, int, float, bool, lists),
    read by the ``gguf`` package's ``GGUFReader`` — what ``riftco._native.read_gguf_metadata``
    gives."""
    import gguf  # type: ignore[import-not-found, unused-ignore]

    reader = gguf.GGUFReader(str(path))
    return {name: field.contents() for name, field in reader.fields.items()}
