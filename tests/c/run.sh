#!/usr/bin/env bash
# C tests of the riftco C ABI (crates/riftco-capi):
#   1. the checked-in header equals the pinned cbindgen's output (cargo test --test header);
#   2. the header compiles as C11 and as C++17 with -Wall -Wextra -Wpedantic -Werror;
#   3. examples/c/train.c and tests/c/test_errors.c build with
#      cc -std=c11 -Wall -Wextra -Wpedantic -Werror against libriftco.so (train.c also against
#      libriftco.a);
#   4. both run under valgrind with no invalid access and no "definitely lost" block;
#   5. the loss sequence, eval loss and greedy decode of train.c equal those of the Rust program
#      crates/riftco-capi/examples/reference_losses.rs (same seed, data and schedule).
# Honours CARGO_TARGET_DIR (default: target/). Exits non-zero on any failure.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
TARGET="${CARGO_TARGET_DIR:-$ROOT/target}"
LIB="$TARGET/release"
INCLUDE="$ROOT/crates/riftco-capi/include"
CC="${CC:-cc}"
CXX="${CXX:-c++}"
CFLAGS=(-std=c11 -Wall -Wextra -Wpedantic -Werror -g -O1 -I"$INCLUDE")
VALGRIND=(valgrind --error-exitcode=1 --leak-check=full --errors-for-leak-kinds=definite
          --show-leak-kinds=definite --track-origins=yes -q)
SCRATCH="$(mktemp -d)"
# `step NAME` prints the wall and CPU time of the step before it; the summary at exit lists them.
STEPS_TAG="--> C ABI:"
source "$ROOT/scripts/steps.sh"
trap 'steps_summary; rm -rf "$SCRATCH"' EXIT

step "header drift: cargo test -p riftco-capi --test header"
cargo test -q -p riftco-capi --test header

step "cargo build -p riftco-capi --release (libriftco.so, libriftco.a) + reference_losses"
cargo build -q -p riftco-capi --release
cargo build -q -p riftco-capi --release --example reference_losses
test -f "$LIB/libriftco.so" && test -f "$LIB/libriftco.a"

step "header compiles as C11 and as C++17"
"$CC" -std=c11 -Wall -Wextra -Wpedantic -Werror -fsyntax-only -x c "$INCLUDE/riftco.h"
"$CXX" -std=c++17 -Wall -Wextra -Wpedantic -Werror -fsyntax-only -x c++ "$INCLUDE/riftco.h"

step "compile examples/c/train.c and tests/c/test_errors.c (${CFLAGS[*]})"
"$CC" "${CFLAGS[@]}" examples/c/train.c -o "$SCRATCH/train" \
    -L"$LIB" -lriftco -Wl,-rpath,"$LIB"
"$CC" "${CFLAGS[@]}" tests/c/test_errors.c -o "$SCRATCH/test_errors" \
    -L"$LIB" -lriftco -Wl,-rpath,"$LIB" -lm
"$CC" "${CFLAGS[@]}" examples/c/train.c -o "$SCRATCH/train_static" \
    "$LIB/libriftco.a" -lpthread -ldl -lm

step "valgrind tests/c/test_errors"
mkdir -p "$SCRATCH/errors"
"${VALGRIND[@]}" "$SCRATCH/test_errors" "$SCRATCH/errors"

step "valgrind examples/c/train.c (shared library)"
mkdir -p "$SCRATCH/vg"
"${VALGRIND[@]}" "$SCRATCH/train" examples/c/train.c "$SCRATCH/vg/model.safetensors" \
    > "$SCRATCH/train_valgrind.txt"
tail -n 4 "$SCRATCH/train_valgrind.txt"

step "train.c (static library) vs the Rust reference: losses, eval loss, greedy decode"
mkdir -p "$SCRATCH/native"
"$SCRATCH/train_static" examples/c/train.c "$SCRATCH/native/model.safetensors" \
    > "$SCRATCH/train_c.txt"
"$TARGET/release/examples/reference_losses" examples/c/train.c > "$SCRATCH/train_rust.txt"
pick() { grep -E '^(step |eval loss |decode )' "$1"; }
pick "$SCRATCH/train_c.txt" > "$SCRATCH/c.txt"
pick "$SCRATCH/train_rust.txt" > "$SCRATCH/rust.txt"
cat "$SCRATCH/c.txt"
if [[ "$(wc -l < "$SCRATCH/c.txt")" -lt 8 ]] || ! diff -u "$SCRATCH/rust.txt" "$SCRATCH/c.txt"; then
    echo "FAIL: the C program's losses differ from the Rust reference (diff above: - Rust, + C)" >&2
    exit 1
fi
echo "C and Rust agree bit for bit on $(grep -c '^step ' "$SCRATCH/c.txt") step losses, the eval loss and the decoded tokens"

steps_summary
trap 'rm -rf "$SCRATCH"' EXIT
printf '\n--> C ABI: all C ABI checks passed\n'
