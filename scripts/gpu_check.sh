#!/usr/bin/env bash
# One command that checks llmtrain on one GPU (sized to finish in under 8 minutes) and writes a summary table:
#
#   scripts/gpu_check.sh [--cpu] [OUTDIR]      (OUTDIR default: $OUT/gpu_check when $OUT is set, else ./gpu_check)
#
# Parts (scripts/gpu_check_parts.py holds their logic): 1 smoke run; 2 gpt-1.3b bf16 tokens/s and MFU with the
# defaults and with the fastest settings (`llmtrain plan --suggest`'s layout, fused AdamW, compile, a larger
# micro-batch); 3 the same model in a plain PyTorch loop (scripts/plain_loop.py) and llmtrain / plain; 4 fp16 with
# loss scaling; 5 peak memory with recompute none and full against `llmtrain plan`; 6 a checkpoint saved at step 3
# and resumed to step 6 against an uninterrupted run; 7 what an async save blocks against a sync one; 8 apex's
# FusedAdam when apex is importable (else SKIP); 9 fp8 against bf16, both compiled: tokens/s and the loss after 30
# steps within 1% (SKIP without a GPU of compute capability 8.9+ or torchao). Each part runs under its own timeout,
# so one failure does not hide the rest: a part that fails, crashes or times out shows FAIL with its log.
#
# --cpu (or DEVICE=cpu) is the dry mode: every part's logic on CPU with tiny models and a few steps.
# Without hydra-core/omegaconf installed, wheels in .gpu/*.whl are installed into /tmp/site (no index needed).
set -u
cd "$(dirname "$0")/.."

DEVICE=${DEVICE:-cuda}
if [ "${1:-}" = "--cpu" ]; then DEVICE=cpu; shift; fi
if [ -n "${1:-}" ]; then OUTDIR=$1; elif [ -n "${OUT:-}" ]; then OUTDIR=$OUT/gpu_check; else OUTDIR=gpu_check; fi
mkdir -p "$OUTDIR/logs"
OUTDIR=$(cd "$OUTDIR" && pwd)
rm -rf "$OUTDIR/results"

export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
if ! python3 -c "import hydra, omegaconf" 2>/dev/null; then
  if ls .gpu/*.whl >/dev/null 2>&1; then
    echo "gpu_check: installing $(ls .gpu/*.whl | wc -l) wheel(s) from .gpu/ into /tmp/site"
    python3 -m pip install -q --no-index --no-deps --target /tmp/site .gpu/*.whl
    export PYTHONPATH="/tmp/site:$PYTHONPATH"
  else
    echo "gpu_check: hydra-core/omegaconf are not importable and .gpu/ holds no wheels" >&2
  fi
fi

# part name and its time limit in seconds (the compiled gpt-1.3b run starts in ~50 s); GPU_CHECK_PARTS runs a
# subset, e.g. GPU_CHECK_PARTS="smoke:120 memory:150"
PARTS=${GPU_CHECK_PARTS:-"smoke:120 throughput:300 plain:150 fp16:120 memory:150 resume:180 async_save:150 apex:120 fp8:330"}
START=$(date +%s)
for entry in $PARTS; do
  part=${entry%%:*}
  limit=${entry##*:}
  log="$OUTDIR/logs/$part.log"
  t0=$(date +%s)
  timeout "$limit" python3 scripts/gpu_check_parts.py "$part" --out "$OUTDIR" --device "$DEVICE" --log "$log" \
    >"$log" 2>&1
  rc=$?
  if [ ! -f "$OUTDIR/results/$part.json" ]; then  # died before writing its row
    if [ "$rc" = 124 ]; then why="timed out after $limit s"; else why="exit $rc"; fi
    python3 - "$OUTDIR" "$part" "$why" "$log" <<'EOF'
import json, sys
from pathlib import Path
sys.path.insert(0, "scripts")
from gpu_check_parts import record
record(Path(sys.argv[1]), sys.argv[2], "FAIL", sys.argv[3], sys.argv[4])
EOF
  fi
  echo "gpu_check: $part done in $(( $(date +%s) - t0 )) s (exit $rc)"
done
python3 scripts/gpu_check_parts.py summary --out "$OUTDIR"
echo "gpu_check: $(( $(date +%s) - START )) s; summary in $OUTDIR/summary.md, logs in $OUTDIR/logs/"
