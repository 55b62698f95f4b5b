#!/usr/bin/env bash
# Prepares a fresh or existing checkout: a virtual environment in .venv with the build and test
# dependencies, and the riftco package built in release mode and installed into it.
# Idempotent: each step is skipped when what it would install is already there and unchanged.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

VENV=.venv
PY="$VENV/bin/python"

# Build and test dependencies. Lower bounds only: any later release that keeps its API works.
PY_DEPS=(
    "maturin>=1.9,<2"
    "pip>=23"
    "pytest>=7"
    "hypothesis>=6.80"
    "numpy>=1.24"
    "mypy>=1.8"
    "tqdm>=4.60"
    "matplotlib>=3.7"
)

log() { printf '[setup] %s\n' "$*" >&2; }
# Runs a command and logs how long it took (whole seconds).
timed() {
    local t0=$SECONDS
    "$@"
    log "  ... $((SECONDS - t0)) s"
}

if [[ ! -x "$PY" ]]; then
    log "creating $VENV with $(python3 --version 2>&1)"
    python3 -m venv "$VENV"
fi

# pip only runs when the dependency list changed since the last successful install.
deps_stamp="$VENV/.riftco-deps"
deps_key="$(printf '%s\n' "${PY_DEPS[@]}")"
if [[ ! -f "$deps_stamp" ]] || [[ "$(cat "$deps_stamp")" != "$deps_key" ]]; then
    log "installing Python build and test dependencies"
    timed "$PY" -m pip install --quiet --disable-pip-version-check "${PY_DEPS[@]}"
    printf '%s' "$deps_key" >"$deps_stamp"
fi

# The extension module is rebuilt only when a Rust input changed. The pure-Python sources are
# installed editable (a .pth pointing at python/), so editing them needs no rebuild.
rust_inputs() {
    local paths=(Cargo.toml Cargo.lock pyproject.toml rust-toolchain.toml crates)
    git ls-files --cached --others --exclude-standard -- "${paths[@]}" 2>/dev/null \
        || find "${paths[@]}" -type f 2>/dev/null
}
build_stamp="$VENV/.riftco-build"
build_key="$(
    {
        rustc --version
        "$PY" --version
        rust_inputs | LC_ALL=C sort | while IFS= read -r f; do
            if [[ -f "$f" ]]; then sha256sum -- "$f"; fi
        done
    } | sha256sum | cut -d' ' -f1
)"
if [[ ! -f "$build_stamp" ]] || [[ "$(cat "$build_stamp")" != "$build_key" ]] \
    || ! "$PY" -c 'import riftco._native' >/dev/null 2>&1; then
    log "building riftco (maturin develop --release)"
    VIRTUAL_ENV="$PWD/$VENV" timed "$VENV/bin/maturin" develop --release --quiet
    printf '%s' "$build_key" >"$build_stamp"
else
    log "riftco is up to date in $VENV"
fi
