"""Re-exports :mod:`riftco.data.hf_tokenizer`, this module's home since the package has wings."""

from riftco.data import hf_tokenizer as _module
from riftco.data.hf_tokenizer import (
    TOKENIZER_FILE,
    generate_ids,
    load_folder_tokenizer,
    tokenize_corpus,
)

__all__ = ["TOKENIZER_FILE", "generate_ids", "load_folder_tokenizer", "tokenize_corpus"]
__getattr__ = _module.__getattribute__  # its other names, private helpers too (read only)
