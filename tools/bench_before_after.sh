#!/usr/bin/env bash
# Before/after benchmark of a branch against main, in one run (issue 12).
#
#   bash tools/bench_before_after.sh [ROUNDS] [BASE]
#
# Checks BASE (default: main) out into a temp dir (git archive) and runs
# `securepad bench --quick` (securepad only; put, read, concurrent, resume)
# on it and on this tree, alternating, ROUNDS times (default 3), with this
# tree's venv. PYTHONPATH makes each run (and its child processes) import
# its own securepad. Results: one JSON per run under $OUT (default: a temp dir).
set -euo pipefail
ROUNDS=${1:-3}
BASE=${2:-main}
HERE=$(cd "$(dirname "$0")/.." && pwd)
PY=${PY:-$HERE/.venv/bin/python}
OUT=${OUT:-$(mktemp -d)}
BEFORE=$(mktemp -d)
git -C "$HERE" archive "$BASE" | tar -x -C "$BEFORE"
ARGS=(bench --quick --backends securepad --workloads put,read,concurrent,resume --no-progress --no-chart)
for round in $(seq 1 "$ROUNDS"); do
  for side in before after; do
    root=$BEFORE; [ "$side" = after ] && root=$HERE
    echo "== round $round: $side ($root)"
    (cd "$root" && PYTHONPATH="$root" "$PY" -m securepad "${ARGS[@]}" --out "$OUT/$side-$round")
  done
done
echo "results in $OUT"
rm -rf "$BEFORE"
