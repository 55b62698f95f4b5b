#!/usr/bin/env bash
# Type-checks crates/riftco-gpu for Apple silicon (aarch64-apple-darwin): wgpu's Metal backend,
# through objc2-metal, is compiled only for Apple targets, so this is the one check of that code
# a Linux machine can run (nothing here can link or run it). Installs the target's standard
# library with rustup when it is missing; where rustup is absent or cannot fetch it, prints why
# and skips (the check needs the target, not a Mac).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

target=aarch64-apple-darwin

if ! command -v rustup >/dev/null 2>&1; then
    echo "check_apple: skipped: rustup is not installed, so the $target standard library cannot be added"
    exit 0
fi
if ! rustup target list --installed | grep -qx "$target"; then
    echo "check_apple: installing the $target standard library (rustup target add)"
    if ! timeout 600 rustup target add "$target"; then
        echo "check_apple: skipped: 'rustup target add $target' failed (no network to the Rust distribution server?)"
        exit 0
    fi
fi
cargo check -p riftco-gpu --target "$target"
echo "check_apple: riftco-gpu type-checks for $target"
