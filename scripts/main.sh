#!/usr/bin/env bash
# The main job on a fresh machine: set up (scripts/setup.sh), then run examples/pretrain.py with
# the arguments given (none: the README's main job, written to runs/pretrain).
#
# The script can be run from any folder. It does not change directory: relative paths among
# the arguments (--data notes.txt, --out myrun) and the default output folder runs/pretrain are
# relative to the folder it was started from, as for any command.
#
# RIFTCO_SKIP_SETUP=1 skips the setup step (for a .venv known to be up to date, as in the tests).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

if [[ "${RIFTCO_SKIP_SETUP:-0}" != "1" ]]; then
    bash "$ROOT/scripts/setup.sh"
fi

exec "$ROOT/.venv/bin/python" "$ROOT/examples/pretrain.py" "$@"
