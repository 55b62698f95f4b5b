#!/usr/bin/env bash
# A/B of the Rust train_step bench between two git revisions, interleaved run by run so a noisy
# neighbour slows both alike: prints each run's median step time per (attention, policy) and the
# geometric mean of the paired ratios B/A.
#
#   bash benches/ab_revisions.sh REV_A REV_B [RUNS]        (default RUNS 3)
#
# Builds each revision's bench (release) in a temporary worktree with its own target directory
# (seeded from target/release when present, so dependencies are not rebuilt). Environment:
# RIFTCO_BENCH_STEPS (default 3 here), RIFTCO_BENCH_ATTENTION / RIFTCO_BENCH_POLICY as in the bench.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
A=${1:?REV_A}; B=${2:?REV_B}; RUNS=${3:-3}
SCRATCH=${RIFTCO_AB_DIR:-$(mktemp -d)}
build() { # rev name
    local dir="$SCRATCH/$2"
    [[ -d "$dir" ]] || git worktree add -q --detach "$dir" "$1"
    if [[ ! -d "$dir-target/release" && -d target/release ]]; then mkdir -p "$dir-target" && cp -a target/release "$dir-target/"; fi
    (cd "$dir" && CARGO_TARGET_DIR="$dir-target" cargo bench -q -p riftco-transformer --bench train_step --no-run >&2)
    ls -t "$dir-target"/release/deps/train_step-* | grep -v '\.d$' | head -1
}
BIN_A=$(build "$A" a); BIN_B=$(build "$B" b)
export RIFTCO_BENCH_STEPS=${RIFTCO_BENCH_STEPS:-3}
for i in $(seq "$RUNS"); do
    for side in a b; do
        bin=$BIN_A; [[ $side == b ]] && bin=$BIN_B
        (cd "$SCRATCH/$side" && "$bin" --bench) | awk -v s=$side -v r=$i '$2 ~ /^(disabled|block)$/ && NF == 8 {print s, r, $1, $2, $3}'
    done
done | tee "$SCRATCH/runs.txt"
awk '{t[$1" "$2" "$3" "$4]=$5; k[$3" "$4]=1; n=($2>n?$2:n)} END {
  for (c in k) { l=0; m=0; for (r=1; r<=n; r++) { a=t["a "r" "c]; b=t["b "r" "c]; if (a>0 && b>0) { l+=log(b/a); m++ } }
    if (m) printf "%s: B/A median step time, geometric mean of %d paired runs = %.3f\n", c, m, exp(l/m) } }' "$SCRATCH/runs.txt"
echo "worktrees and runs in $SCRATCH (git worktree prune after removing it)"
