#!/usr/bin/env bash
# Runs the packed riftco-gpu tests (scripts/gpu_bundle/make.sh) on this machine's GPU, each test in
# its own process (as nextest does: the memory tests read process-wide counters), 8 at a time.
# RIFTCO_TEST_GPU selects the adapter (default vulkan); CI=true makes a missing adapter a failure.
# Prints the adapter and a summary; every test's output goes to $OUT/all.txt (or /tmp/out).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"
outd=${OUT:-/tmp/out}
mkdir -p "$outd/res"
tar xJf bin.tar.xz
if ! ldconfig -p | grep -q 'libvulkan.so.1 '; then
    echo "no system Vulkan loader: using the packed libvulkan.so.1"
    export LD_LIBRARY_PATH=$PWD${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
fi
# NVIDIA images ship a manifest naming libGLX_nvidia.so.0, whose vkCreateInstance cannot be
# resolved without an X server; libEGL_nvidia.so.0 holds the same Vulkan driver and works headless.
if [[ -z "${VK_ICD_FILENAMES:-}" ]]; then
    egl=$(ldconfig -p | grep -o '/[^ ]*/libEGL_nvidia.so.0$' | head -1 || true)
    if [[ -n "$egl" ]]; then
        printf '{"file_format_version":"1.0.1","ICD":{"library_path":"%s","api_version":"1.3.0"}}\n' "$egl" >icd.json
        export VK_ICD_FILENAMES=$PWD/icd.json
        echo "Vulkan driver: $egl"
    fi
fi
export RIFTCO_TEST_GPU=${RIFTCO_TEST_GPU:-vulkan} CI=${CI:-true}
bin/device --exact --nocapture the_opened_adapter_is_reported 2>&1 | grep "GPU tests run on" || echo "no adapter opened"
for b in bin/*; do
    "$b" --list --format terse 2>/dev/null | sed -n 's|: test$||p' | sed "s|^|$b |"
done >tests.txt
run_one() {
    local f="$OUTD/res/$(basename "$1")__$2.txt"
    if timeout 300 "$1" --exact --nocapture "$2" >"$f" 2>&1; then echo "ok $(basename "$1")::$2"; else echo "FAIL $(basename "$1")::$2"; fi
}
export -f run_one
export OUTD=$outd
xargs -P 8 -L 1 bash -c 'run_one "$0" "$1"' <tests.txt >results.txt
for f in "$outd"/res/*; do echo "--- $(basename "$f")"; grep -v XDG_RUNTIME "$f"; done >"$outd/all.txt"
rm -rf "$outd/res"
grep '^FAIL' results.txt || true
echo "$(grep -c '^ok' results.txt) passed, $(grep -c '^FAIL' results.txt) failed"
! grep -q '^FAIL' results.txt
