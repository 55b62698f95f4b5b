"""``riftco.hf_tokenizer`` re-exports :mod:`riftco.data.hf_tokenizer` (the module's path before the
package had wings), so that code written against it keeps working. Code inside riftco imports
:mod:`riftco.data.hf_tokenizer`."""

from riftco.data.hf_tokenizer import (
    TOKENIZER_FILE,
    generate_ids,
    load_folder_tokenizer,
    tokenize_corpus,
)

__all__ = ["TOKENIZER_FILE", "generate_ids", "load_folder_tokenizer", "tokenize_corpus"]
