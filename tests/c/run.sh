#!/usr/bin/env bash
# C tests of the riftco C ABI (crates/riftco-capi):
#   1. the checked-in header equals the pinned cbindgen's output (cargo test --test header);
#   2. the header compiles as C11 and as C++17 with -Wall -Wextra -Wpedantic -Werror;
#   3. examples/c/train.c, tests/c/test_errors.c, tests/c/test_policies.c and
#      tests/c/test_device.c build with cc -std=c11 -Wall -Wextra -Wpedantic -Werror against
#      libriftco.so (train.c also against libriftco.a);
#   4. train.c, test_errors and test_policies run under valgrind with no invalid access and no
#      "definitely lost" block; test_device runs without it (its GPU part: a model moved to the
#      GPU named by RIFTCO_TEST_GPU, default "gpu", trains, decodes and saves like the CPU one;
#      with no adapter it skips saying why, except under CI=true, where it fails);
#   5. the loss sequence, eval loss and greedy decode of train.c equal those of the Rust program
#      crates/riftco-capi/examples/reference_losses.rs (same seed, data and schedule);
#   6. on the GPU of test_device (when it did not skip) train.c's step and eval losses are
#      those of the CPU run within 1e-4;
#   7. train.c prints the decoded bytes as text, and without TEXT_FILE outside the repository
#      root it says to pass one (built with -DTRAIN_DEFAULT_TEXT=ABS_PATH it runs there);
#   8. without MODEL_PATH train.c saves its model and config.json into a new folder under
#      $TMPDIR, never into the folder it runs in (the valgrind run and the run from another
#      folder use that default).
# The Rust side is built as `cargo build --release --workspace` and `cargo test --workspace`
# resolve it, so after scripts/test.sh's bench and test builds this compiles almost nothing.
# Honours CARGO_TARGET_DIR. Exits non-zero on any failure.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
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

# Both cargo commands select the whole workspace: features are resolved per command over the
# selected packages, so `-p riftco-capi` would compile the dependency graph a second time with
# other features instead of reusing what `cargo nextest run --workspace` and
# `cargo bench --workspace` built.
step "header drift: cargo test --workspace --test header"
cargo test -q --workspace --test header

step "cargo build --release --workspace --example reference_losses (libriftco.so, libriftco.a)"
# The library is a dependency of the example here, and cargo copies only the targets it was
# asked for up to target/release; the library's files (in target/release/deps) and the
# example's executable are taken from cargo's artifact messages, so a stale copy in
# target/release is never linked.
LIB="$SCRATCH/lib"
mkdir "$LIB"
cargo build -q --release --workspace --example reference_losses \
    --message-format=json-render-diagnostics >"$SCRATCH/artifacts.json"
python3 - "$SCRATCH/artifacts.json" "$LIB" <<'EOF'
import json
import shutil
import sys

messages, lib = sys.argv[1], sys.argv[2]
found = {}
with open(messages, encoding="utf-8") as f:
    for line in f:
        if not line.startswith("{"):
            continue
        m = json.loads(line)
        if m.get("reason") != "compiler-artifact":
            continue
        target = m["target"]
        if target["name"] == "riftco" and "cdylib" in target["crate_types"]:
            for path in m["filenames"]:
                for suffix in (".so", ".a"):
                    if path.endswith("/libriftco" + suffix):
                        found[suffix] = path
        elif target["name"] == "reference_losses" and target["kind"] == ["example"]:
            found["reference_losses"] = m["executable"]
missing = {".so", ".a", "reference_losses"} - found.keys()
if missing:
    sys.exit(f"cargo reported no artifact for {sorted(missing)} (libriftco.so, libriftco.a "
             "and the reference_losses example were expected)")
for key, path in found.items():
    shutil.copy2(path, lib)
    print(f"{key}: {path}")
EOF
test -f "$LIB/libriftco.so" && test -f "$LIB/libriftco.a" && test -x "$LIB/reference_losses"

step "header compiles as C11 and as C++17"
"$CC" -std=c11 -Wall -Wextra -Wpedantic -Werror -fsyntax-only -x c "$INCLUDE/riftco.h"
"$CXX" -std=c++17 -Wall -Wextra -Wpedantic -Werror -fsyntax-only -x c++ "$INCLUDE/riftco.h"

step "compile examples/c/train.c and tests/c/test_{errors,policies,device}.c (${CFLAGS[*]})"
"$CC" "${CFLAGS[@]}" examples/c/train.c -o "$SCRATCH/train" \
    -L"$LIB" -lriftco -Wl,-rpath,"$LIB"
"$CC" "${CFLAGS[@]}" tests/c/test_errors.c -o "$SCRATCH/test_errors" \
    -L"$LIB" -lriftco -Wl,-rpath,"$LIB" -lm
"$CC" "${CFLAGS[@]}" tests/c/test_policies.c -o "$SCRATCH/test_policies" \
    -L"$LIB" -lriftco -Wl,-rpath,"$LIB"
"$CC" "${CFLAGS[@]}" tests/c/test_device.c -o "$SCRATCH/test_device" \
    -L"$LIB" -lriftco -Wl,-rpath,"$LIB" -lm
"$CC" "${CFLAGS[@]}" examples/c/train.c -o "$SCRATCH/train_static" \
    "$LIB/libriftco.a" -lpthread -ldl -lm

step "valgrind tests/c/test_errors"
mkdir -p "$SCRATCH/errors"
"${VALGRIND[@]}" "$SCRATCH/test_errors" "$SCRATCH/errors"

step "valgrind tests/c/test_policies"
mkdir -p "$SCRATCH/policies"
"${VALGRIND[@]}" "$SCRATCH/test_policies" "$SCRATCH/policies"

# Not under valgrind: the GPU part runs inside the Vulkan driver (llvmpipe JIT-compiles the
# shaders), whose allocations and uninitialised reads are not this library's and would take
# minutes under valgrind.
step "tests/c/test_device (CPU and GPU: RIFTCO_TEST_GPU=${RIFTCO_TEST_GPU:-gpu}, CI=${CI:-unset})"
mkdir -p "$SCRATCH/device"
"$SCRATCH/test_device" "$SCRATCH/device" | tee "$SCRATCH/test_device.txt"

# `saved_in_tmp OUTPUT TMP`: the run whose stdout is OUTPUT saved its model (no MODEL_PATH given)
# as TMP/riftco-train-c-*/riftco_train_c.safetensors, with config.json beside it.
saved_in_tmp() {
    local saved
    saved="$(sed -n 's/^saved \(.*\) and reloaded it$/\1/p' "$1")"
    case "$saved" in
        "$2"/riftco-train-c-*/riftco_train_c.safetensors) ;;
        *) echo "FAIL: without MODEL_PATH the model was saved as '$saved', not in a new folder under $2" >&2
           return 1 ;;
    esac
    test -f "$saved" && test -f "$(dirname "$saved")/config.json" \
        || { echo "FAIL: $saved or the config.json beside it is missing" >&2; return 1; }
}

step "valgrind examples/c/train.c (shared library; the default MODEL_PATH)"
mkdir -p "$SCRATCH/vg"
TMPDIR="$SCRATCH/vg" "${VALGRIND[@]}" "$SCRATCH/train" examples/c/train.c \
    > "$SCRATCH/train_valgrind.txt"
tail -n 4 "$SCRATCH/train_valgrind.txt"
saved_in_tmp "$SCRATCH/train_valgrind.txt" "$SCRATCH/vg"

step "train.c (static library) vs the Rust reference: losses, eval loss, greedy decode"
mkdir -p "$SCRATCH/native"
"$SCRATCH/train_static" examples/c/train.c "$SCRATCH/native/model.safetensors" \
    > "$SCRATCH/train_c.txt"
"$LIB/reference_losses" examples/c/train.c > "$SCRATCH/train_rust.txt"
pick() { grep -E '^(step |eval loss |decode )' "$1"; }
pick "$SCRATCH/train_c.txt" > "$SCRATCH/c.txt"
pick "$SCRATCH/train_rust.txt" > "$SCRATCH/rust.txt"
cat "$SCRATCH/c.txt"
if [[ "$(wc -l < "$SCRATCH/c.txt")" -lt 8 ]] || ! diff -u "$SCRATCH/rust.txt" "$SCRATCH/c.txt"; then
    echo "FAIL: the C program's losses differ from the Rust reference (diff above: - Rust, + C)" >&2
    exit 1
fi
echo "C and Rust agree bit for bit on $(grep -c '^step ' "$SCRATCH/c.txt") step losses, the eval loss and the decoded tokens"

step "train.c on the GPU (DEVICE=${RIFTCO_TEST_GPU:-gpu}) vs the CPU: step and eval losses within 1e-4"
if grep -q "GPU part skipped" "$SCRATCH/test_device.txt"; then
    echo "SKIPPED: no GPU (test_device said why above)"
else
    mkdir -p "$SCRATCH/gpu"
    "$SCRATCH/train" examples/c/train.c "$SCRATCH/gpu/model.safetensors" block \
        "${RIFTCO_TEST_GPU:-gpu}" > "$SCRATCH/train_gpu.txt"
    grep '^device ' "$SCRATCH/train_gpu.txt"
    python3 - "$SCRATCH/c.txt" "$SCRATCH/train_gpu.txt" <<'EOF'
import re
import sys

def losses(path):
    pattern = re.compile(r"^(step \d+|eval)(?: policy \S+)? loss (\S+)")
    return [(m[1], float(m[2])) for m in map(pattern.match, open(path)) if m]

cpu, gpu = losses(sys.argv[1]), losses(sys.argv[2])
if [k for k, _ in cpu] != [k for k, _ in gpu] or len(cpu) < 7:
    sys.exit(f"FAIL: the GPU run printed {gpu}, the CPU run {cpu}")
for (what, c), (_, g) in zip(cpu, gpu):
    print(f"{what}: cpu {c:.6f} gpu {g:.6f}")
    if abs(g - c) > 1e-4 * max(abs(c), 1.0):
        sys.exit(f"FAIL: {what} loss on the GPU {g} vs the CPU {c} (tolerance 1e-4)")
EOF
fi

step "train.c: the decoded tokens as text; the default text file and model path from another folder"
# The sample line is the decode line's tokens as bytes (printable ASCII here: the data is C).
grep -E '^sample \(greedy, prompt = the first 8 bytes of the data\): "' "$SCRATCH/train_c.txt"
mkdir -p "$SCRATCH/elsewhere"
# Built with a relative __FILE__, the default text cannot be found from another folder: the
# program must say to pass a text file (and fail), not just print a perror line.
if (cd "$SCRATCH/elsewhere" && "$SCRATCH/train" > out.txt 2> err.txt); then
    echo "FAIL: train without TEXT_FILE succeeded outside the repository root" >&2
    exit 1
fi
grep -q "pass a text file" "$SCRATCH/elsewhere/err.txt" || {
    cat "$SCRATCH/elsewhere/err.txt" >&2
    echo "FAIL: no hint to pass a text file" >&2
    exit 1
}
"$CC" "${CFLAGS[@]}" -DTRAIN_DEFAULT_TEXT="\"$PWD/examples/c/train.c\"" examples/c/train.c \
    -o "$SCRATCH/train_abs" -L"$LIB" -lriftco -Wl,-rpath,"$LIB"
mkdir -p "$SCRATCH/tmp"
rm -f "$SCRATCH/elsewhere/out.txt" "$SCRATCH/elsewhere/err.txt"
(cd "$SCRATCH/elsewhere" && TMPDIR="$SCRATCH/tmp" "$SCRATCH/train_abs" > "$SCRATCH/train_abs.txt") \
    || { echo "FAIL: train built with TRAIN_DEFAULT_TEXT did not run from another folder" >&2; exit 1; }
saved_in_tmp "$SCRATCH/train_abs.txt" "$SCRATCH/tmp"
# A run with the defaults writes nothing where it runs (from the repository root: no
# config.json or model there).
if [[ -n "$(ls -A "$SCRATCH/elsewhere")" ]]; then
    ls -la "$SCRATCH/elsewhere" >&2
    echo "FAIL: train with the defaults wrote into the folder it ran in" >&2
    exit 1
fi

steps_summary
trap 'rm -rf "$SCRATCH"' EXIT
printf '\n--> C ABI: all C ABI checks passed\n'
