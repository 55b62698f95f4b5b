#!/usr/bin/env bash
# The documentation site (MkDocs Material, mkdocs.yml; the Python API pages come from the
# package's docstrings and .pyi stubs through mkdocstrings).
#   bash scripts/docs.sh serve [ADDR]  live preview at http://127.0.0.1:8000 (ADDR e.g. 0.0.0.0:8000)
#   bash scripts/docs.sh build         target/site, strict: a broken link or reference fails
# Sets up .venv first (scripts/setup.sh installs the `docs` extra), unless RIFTCO_SKIP_SETUP=1.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
if [[ "${RIFTCO_SKIP_SETUP:-}" != 1 ]]; then
    bash scripts/setup.sh
fi
export NO_MKDOCS_2_WARNING=1   # Material's end-of-life banner on every build
case "${1:-}" in
    serve) exec .venv/bin/mkdocs serve --strict --dev-addr "${2:-127.0.0.1:8000}" ;;
    build) exec .venv/bin/mkdocs build --strict --quiet ;;
    *) echo "usage: bash scripts/docs.sh serve [ADDR] | build" >&2; exit 2 ;;
esac
