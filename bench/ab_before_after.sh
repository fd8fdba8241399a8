#!/bin/bash
# Sampling and training speed of two commits, side by side: bench/fast_path_ab.py run from a worktree of each,
# alternating processes (before, after, before, ...), one thread each; compare the "+small-head" row (the
# full sampling path) and the "kernel" ms/step of the training lines. Used for issue 24 (a refactor that
# must not change speed): bench/fast_path_ab.txt.
#     bench/ab_before_after.sh BEFORE_REV [AFTER_REV=HEAD] [ROUNDS=3]
set -euo pipefail
before=$1 after=${2:-HEAD} rounds=${3:-3}
root=$(git rev-parse --show-toplevel) py=$root/.venv/bin/python
tmp=$(mktemp -d)
trap 'git -C "$root" worktree remove --force "$tmp/before"; git -C "$root" worktree remove --force "$tmp/after"; rm -rf "$tmp"' EXIT
git -C "$root" worktree add -q --detach "$tmp/before" "$before"
git -C "$root" worktree add -q --detach "$tmp/after" "$after"
export OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1
for i in $(seq "$rounds"); do
  for side in before after; do
    echo "== sampling, $side ($(git -C "$tmp/$side" rev-parse --short HEAD)), round $i"
    (cd "$tmp/$side" && PYTHONPATH=. $py bench/fast_path_ab.py --rounds 5 --calls 5 | tail -1)
  done
done
for i in $(seq 2); do
  for side in before after; do
    echo "== training, $side, round $i"
    (cd "$tmp/$side" && PYTHONPATH=. $py bench/fast_path_ab.py --train --train-batch 16 --rounds 5 | tail -2)
  done
done
