"""Tokenizing text for a Hugging Face model folder: its ``tokenizer.json`` through the
``tokenizers`` package (an optional dependency: ``pip install tokenizers``), or riftco's byte
tokens (token ``i`` is byte ``i``) for a model whose vocabulary is bytes.

A folder's vocabulary is bytes when it has no ``tokenizer.json`` (a riftco pretraining output,
or any model trained on raw bytes): the byte tokenizer covers ids ``0..255``, which every riftco
model has (``vocab_size >= 256``). With a ``tokenizer.json`` the folder's own tokenizer is used,
whatever its size.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from riftco._native import DecoderOnlyTransformer, TokenError
from riftco.data.text import Corpus
from riftco.generation import generate_tokens

TOKENIZER_FILE = "tokenizer.json"


def load_folder_tokenizer(model_path: str | os.PathLike[str]) -> Any | None:
    """The ``tokenizers.Tokenizer`` of ``model_path`` (a folder, or a file in one) when it holds
    a ``tokenizer.json``; ``None`` when it does not (byte tokens).

    Raises:
        ImportError: the folder has a ``tokenizer.json`` but the ``tokenizers`` package is not
            installed (the message says ``pip install tokenizers``).
        TokenError: the file is not a tokenizer ``tokenizers`` can read (naming the file).
    """
    folder = Path(model_path)
    if not folder.is_dir():
        folder = folder.parent
    path = folder / TOKENIZER_FILE
    if not path.is_file():
        return None
    try:
        import tokenizers  # type: ignore[import-not-found, unused-ignore]
    except ImportError:
        raise ImportError(
            f"{path} needs the tokenizers package to tokenize the corpus: pip install tokenizers"
        ) from None
    try:
        return tokenizers.Tokenizer.from_file(str(path))
    except Exception as e:  # the package raises a plain Exception for a bad file
        raise TokenError(f"{path} is not a tokenizer the tokenizers package reads: {e}") from None


def tokenize_corpus(corpus: Corpus, tokenizer: Any, vocab_size: int) -> Corpus:
    """``corpus`` as the ``uint32`` token ids of ``tokenizer`` (its bytes decoded as UTF-8, an
    invalid sequence replaced by U+FFFD), description and files kept.

    Raises:
        TokenError: a token id at or above the model's ``vocab_size`` (the tokenizer does not
            belong to the model), naming the id.
    """
    text = corpus.tokens.tobytes().decode("utf-8", errors="replace")
    ids = np.asarray(tokenizer.encode(text).ids, dtype=np.uint32)
    if ids.size and int(ids.max()) >= vocab_size:
        raise TokenError(
            f"the tokenizer produced token id {int(ids.max())}, outside the model's vocabulary "
            f"(vocab_size {vocab_size})"
        )
    return Corpus(
        tokens=ids,  # type: ignore[arg-type, unused-ignore]
        description=f"{corpus.description}, {ids.size:,} tokens",
        files=corpus.files,
    )


def generate_ids(
    model: DecoderOnlyTransformer,
    prompt: list[int],
    max_new_tokens: int,
    temperature: float = 1.0,
    top_k: int | None = None,
    seed: int = 0,
) -> list[int]:
    """Continue the token ids ``prompt`` by at most ``max_new_tokens`` ids sampled from the whole
    vocabulary (:func:`riftco.generation.generate_tokens`: :func:`riftco.generation.sample_token`,
    ``numpy.random.default_rng(seed)``), stopping before the first id in
    ``model.eos_token_ids``. Returns the new ids.

    Raises:
        TokenError: an empty prompt, an id outside the model's vocabulary, or more positions
            than ``max_seq_len``.
    """
    return list(generate_tokens(model, prompt, max_new_tokens, temperature, top_k, seed))
