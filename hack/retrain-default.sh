#!/usr/bin/env bash
# Retrain the default checkpoint by its recipe (docs/accuracy.md), resumably.
#
# From nothing the recipe is longer than a working session here: the timm exports and the
# zoo's graphs (about 2 h 15 min on two cores), a families run for the new network's boundary
# margins (about 35 min), the architectures run that trains it (about 35 min), and the shipped
# checkpoint re-scored on the same split for comparison (about 12 min). Each step writes its
# result under OUT (default ~/.cache/kubeseer/retrain) and is skipped when that result exists,
# so a run cut short goes on where it stopped, in a later session too; the graph caches the
# first step fills are the same ones the others read. OUT/revision says which commit began the
# run: after a change that moves graphs, labels or training, remove OUT and start again. Nothing here replaces the shipped checkpoint:
# compare OUT/arch.json with OUT/shipped.json (held-out MAPE per metric, and at the boundaries
# would-be out-of-memory placements, point fits and --max-batch) and copy OUT/new.pt to
# kubeseer/predictor/checkpoints/default.pt only if it is not worse at the boundaries.
#
#   bash hack/retrain-default.sh            # every step not done yet
#   DRY_RUN=1 bash hack/retrain-default.sh  # say what would run
set -euo pipefail

cd "$(dirname "$0")/.."
PY=.venv/bin/python
OUT=${OUT:-$HOME/.cache/kubeseer/retrain}
MARGINS=bench/data/boundary-margins.json
UNSEEN=bench/data/unseen-gpu-margins.json
mkdir -p "$OUT"
[[ -e $OUT/revision ]] || git rev-parse HEAD >"$OUT/revision"
if [[ $(cat "$OUT/revision") != $(git rev-parse HEAD) ]]; then
  echo "note: $OUT was begun at $(cat "$OUT/revision"), HEAD is $(git rev-parse HEAD)"
fi

# step NAME RESULT COMMAND...: run COMMAND (its output in OUT/NAME.log) unless RESULT exists.
step() {
  local name=$1 result=$2
  shift 2
  if [[ -e $result ]]; then
    echo "$name: done ($result)"
    return
  fi
  echo "$name: $*"
  if [[ -n ${DRY_RUN:-} ]]; then
    return
  fi
  local started=$SECONDS
  nice "$@" >"$OUT/$name.log" 2>&1
  echo "$name: $((SECONDS - started)) s, log $OUT/$name.log"
}

# The exports and graphs every later step reads, filled in two processes; the analytic
# estimate's scores on the architectures split are what this step leaves behind.
step caches "$OUT/analytic.json" "$PY" bench/gpu_predictor.py --export --workers 2 \
  --splits architectures --models analytic --json "$OUT/analytic.json"

step families "$OUT/margins.json" "$PY" bench/gpu_predictor.py --splits families --boundaries \
  --epochs 9 --minutes 30 --models seernet-multi --margins-out "$OUT/margins.json" \
  --json "$OUT/families.json"

# As many epochs as the shipped checkpoint trained (33), not a time limit: beside other work a
# time limit trains fewer, and the comparison with the shipped checkpoint is then unfair.
step architectures "$OUT/new.pt" "$PY" bench/gpu_predictor.py --splits architectures \
  --epochs 33 --minutes 90 --models seernet-multi --boundary-margins "$OUT/margins.json" \
  --unseen-gpu-margins "$UNSEEN" --boundaries --out "$OUT/new.pt" --json "$OUT/arch.json"

step shipped "$OUT/shipped.json" "$PY" bench/gpu_predictor.py --splits architectures \
  --checkpoint kubeseer/predictor/checkpoints/default.pt --relabelled --models seernet-multi \
  --boundary-margins "$MARGINS" --unseen-gpu-margins "$UNSEEN" --boundaries \
  --json "$OUT/shipped.json"

step llama "$OUT/llama-new.json" "$PY" bench/llama_memory.py --ckpt "$OUT/new.pt" \
  --json "$OUT/llama-new.json"

echo "results in $OUT: arch.json (new), shipped.json (shipped), llama-new.json, analytic.json"
