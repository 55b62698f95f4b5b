#!/usr/bin/env bash
# Packs the GPU tests of crates/riftco-gpu for a machine with a real GPU but no Rust toolchain
# (such as a lent accelerator machine): every test binary (built here in the test profile,
# stripped, xz-compressed), Debian's Vulkan loader (libvulkan.so.1, for images without one) and
# run.sh, which runs each test in its own process there. Writes target/gpu-bundle (about 22 MB).
#
#   bash scripts/gpu_bundle/make.sh
#   # copy target/gpu-bundle to the GPU machine, then there:
#   bash target/gpu-bundle/run.sh          # RIFTCO_TEST_GPU=vulkan by default; results in $OUT or /tmp/out
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."

out=target/gpu-bundle
rm -rf "$out" && mkdir -p "$out/bin"
# The naga-only shaders test needs no GPU (and reads the shaders folder at run time).
cargo test -p riftco-gpu --no-run --message-format=json 2>/dev/null \
    | python3 -c '
import json, sys
for line in sys.stdin:
    try:
        m = json.loads(line)
    except ValueError:
        continue
    if (m.get("reason") == "compiler-artifact" and m.get("executable") and m["profile"]["test"]
            and m["target"]["name"] != "shaders"):
        print(m["target"]["name"], m["executable"])
' | while read -r name exe; do
    cp "$exe" "$out/bin/$name"
    strip "$out/bin/$name"
done
echo "packed $(ls "$out/bin" | wc -l) test binaries"
tar -C "$out" -cf - bin | xz -T2 -6 >"$out/bin.tar.xz"
rm -rf "$out/bin"
loader=$(ldconfig -p | grep -o '/[^ ]*/libvulkan.so.1$' | head -1 || true)
if [[ -n "$loader" ]]; then
    cp -L "$loader" "$out/libvulkan.so.1"
else
    echo "no libvulkan.so.1 here (apt-get install libvulkan1): the bundle relies on the GPU machine's"
fi
cp scripts/gpu_bundle/run.sh "$out/run.sh"
du -sh "$out"
