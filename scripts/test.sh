#!/usr/bin/env bash
# Every check the project has: Rust formatting, lints, tests, doc tests and bench builds, the
# hand-written Python stubs against the built module, and the Python tests.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

# `step NAME` prints the wall and CPU time of the step before it; the summary at exit lists
# every step's times and the total.
source scripts/steps.sh
trap steps_summary EXIT

step "setup"
bash scripts/setup.sh

step "cargo fmt --all --check"
cargo fmt --all --check

step "cargo clippy --workspace --all-targets -- -D warnings"
cargo clippy --workspace --all-targets -- -D warnings

if cargo nextest --version >/dev/null 2>&1; then
    step "cargo nextest run --workspace"
    cargo nextest run --workspace
else
    step "cargo test --workspace (cargo-nextest not installed)"
    cargo test --workspace
fi

step "cargo test --workspace --doc"
cargo test --workspace --doc

step "cargo doc --workspace --no-deps (warnings are errors: broken intra-doc links)"
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps

step "cargo bench --workspace --no-run"
cargo bench --workspace --no-run

step "mypy.stubtest riftco._native"
.venv/bin/python -m mypy.stubtest riftco._native

step "mypy (strict; python/riftco, tests/python, examples)"
.venv/bin/python -m mypy

step "pytest tests/python"
.venv/bin/python -m pytest tests/python -q

# ---------------------------------------------------------------------------------------------
# C tests: tests/c/run.sh builds the C ABI library and the C programs against its header and
# runs them. It does not exist yet; this step runs it as soon as it does.
# ---------------------------------------------------------------------------------------------
run_c_tests() {
    if [[ -f tests/c/run.sh ]]; then
        step "C tests (tests/c/run.sh)"
        bash tests/c/run.sh
    else
        step "C tests: tests/c/run.sh not present yet, skipped"
    fi
}
run_c_tests

steps_summary
trap - EXIT
printf '\n==> all checks passed\n'
