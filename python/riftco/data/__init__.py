"""The data wing: what a model trains on, and the tokenizers and templates that make it.

- :mod:`riftco.data.text`: byte-level text corpora (the built-in standard-library corpora, files
  and folders), the held-out split and the batch sampler;
- :mod:`riftco.data.examples`: corpora of examples (``input_ids`` with ``labels``), their
  batches and packing;
- :mod:`riftco.data.instruct`: instruction and chat rows (JSON Lines) tokenized with the loss on
  the answers; :mod:`riftco.data.instruct_corpus` turns them into an example corpus with a model
  folder's tokenizer; :mod:`riftco.data.stdlib_instructions` is the built-in instruction set;
- :mod:`riftco.data.chat_template`: a model folder's Jinja2 chat template;
- :mod:`riftco.data.hf_tokenizer`: a Hugging Face model folder's ``tokenizer.json``.

The data wing imports only ``riftco._native`` and :mod:`riftco.generation` (sampling), never
the training loop or the commands (see docs/architecture.md). ``riftco.data`` itself keeps the
names of the former ``riftco.data`` module, now :mod:`riftco.data.text`.
"""

from riftco.data.text import *  # noqa: F403
from riftco.data.text import LOAD_CORPUS_MAX_BYTES as LOAD_CORPUS_MAX_BYTES
from riftco.data.text import VOCAB_SIZE as VOCAB_SIZE
from riftco.data.text import __all__ as __all__
