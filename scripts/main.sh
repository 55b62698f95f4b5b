#!/usr/bin/env bash
# The main job on a fresh machine: set up, then run the pretraining example (arguments are passed
# to it), or the smoke check of the native module while that example does not exist yet.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

bash scripts/setup.sh

if [[ -f examples/pretrain.py ]]; then
    exec .venv/bin/python examples/pretrain.py "$@"
else
    exec .venv/bin/python examples/smoke.py "$@"
fi
