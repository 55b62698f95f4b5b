#!/usr/bin/env bash
# Installs Mesa's Vulkan drivers (llvmpipe: a software Vulkan device found headless, no display)
# so that the GPU tests of crates/riftco-gpu have an adapter on a machine without a GPU.
# Idempotent: does nothing when the package is already installed. A no-op (saying why) where the
# system is not Debian-like (no apt-get/dpkg) or the script does not run as root.
set -euo pipefail

pkg=mesa-vulkan-drivers

if ! command -v dpkg-query >/dev/null 2>&1 || ! command -v apt-get >/dev/null 2>&1; then
    echo "gpu_setup: not a Debian-like system (no dpkg/apt-get); not installing $pkg"
    exit 0
fi

if dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed"; then
    echo "gpu_setup: $pkg already installed"
    exit 0
fi

as_root=()
if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
        as_root=(sudo -n)
    else
        echo "gpu_setup: not root and no password-less sudo; not installing $pkg (run as root:"
        echo "  apt-get install -y $pkg)"
        exit 0
    fi
fi

echo "gpu_setup: installing $pkg"
export DEBIAN_FRONTEND=noninteractive
if ! "${as_root[@]}" apt-get install -y --no-install-recommends "$pkg"; then
    # The package lists may be missing or stale on a fresh machine.
    "${as_root[@]}" apt-get update
    "${as_root[@]}" apt-get install -y --no-install-recommends "$pkg"
fi
echo "gpu_setup: $pkg installed"
