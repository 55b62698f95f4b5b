#!/usr/bin/env bash
# Prepares a fresh or existing checkout: a virtual environment in .venv with the build and test
# dependencies (the extras test, plot, examples, docs, chat, mpi, hf and gguf of pyproject.toml), and the
# riftco package built in release mode and installed into it.
# Idempotent: each step is skipped when what it would install is already there and unchanged.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

VENV=.venv
PY="$VENV/bin/python"

# Build tools. Lower bounds only: any later release that keeps its API works. What the tests,
# the pictures, the examples and the docs need are the package's extras (pyproject.toml), which
# the build below installs with it.
PY_DEPS=(
    "maturin>=1.9,<2"
    "pip>=23"
)
EXTRAS=test,plot,examples,docs,chat,mpi,hf,gguf

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
    log "installing the build tools (maturin, pip)"
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
    build_log="$VENV/build.log"
    log "building riftco in release mode and installing it into $VENV (3 to 10 minutes on 2"
    log "  cores for a first build; seconds when little changed); cargo's and maturin's output:"
    log "  $build_log"
    # PIP_QUIET: pip, which maturin runs to install the extras, would otherwise list every
    # requirement already satisfied and every dependency of an extra not asked for
    # ("Ignoring tokenizers: markers ... don't match your environment"). maturin prints its
    # progress lines even under --quiet: everything goes to the log, which is shown on failure.
    t0=$SECONDS
    if ! VIRTUAL_ENV="$PWD/$VENV" PIP_QUIET=1 "$VENV/bin/maturin" develop --release \
        --quiet --extras "$EXTRAS" >"$build_log" 2>&1; then
        tail -n 40 "$build_log" >&2
        log "the build failed: the last 40 lines of $build_log are above"
        exit 1
    fi
    log "  ... $((SECONDS - t0)) s"
    printf '%s' "$build_key" >"$build_stamp"
else
    log "riftco is up to date in $VENV"
fi
