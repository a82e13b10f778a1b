#!/usr/bin/env bash
# One command that checks llmtrain on one GPU and writes a summary table, sized for a 15-minute GPU loan (the
# machine's start included): the default parts within a deadline of 360 s from the check's start, each of the three
# `--long` groups within 480 s.
#
#   scripts/gpu_check.sh [--cpu] [--long [1|2|3]] [--parts NAME[:SECONDS],...] [--deadline SECONDS] [OUTDIR]
#
# OUTDIR defaults to $OUT/gpu_check when $OUT is set, else ./gpu_check. Parts (scripts/gpu_check_parts.py holds
# their logic, scripts/gpu_check_plan.py their time limits and groups): 1 smoke run; 2 gpt-1.3b bf16 tokens/s and
# MFU with the defaults and with the fastest settings (`llmtrain plan --suggest`'s layout, fused AdamW, compile, a
# larger micro-batch); 3 the same model in a plain PyTorch loop (scripts/plain_loop.py) and llmtrain / plain; 4
# fp16 with loss scaling; 5 peak memory with recompute none and full against `llmtrain plan`; 6 a checkpoint saved
# at step 3 and resumed to step 6 against an uninterrupted run; 7 what an async save blocks against a sync one; 8
# apex's FusedAdam when apex is importable (else SKIP); 9 fp8 against bf16 on gpt-1.3b, both compiled: tokens/s and
# the loss after 30 steps within 1% (SKIP without a GPU of compute capability 8.9+ or torchao;
# scripts/gpu_check_fp8.py); 10 llama3-1b (2048-token context) in bf16, tokens/s and MFU, then the fp8 recipes
# tensorwise and rowwise against it, all compiled and 30 steps: tokens/s each, the loss within 1% of bf16's each,
# and the fastest recipe that keeps it (fp8 not run where it cannot be; scripts/gpu_check_llama.py); 11 `llmtrain
# tune` of gpt-1.3b (the plan's top 3 layouts, 10 steps each, no refinement round): the winner's MFU against the
# defaults' (scripts/gpu_check_tune.py); 12 a mixture of experts, OLMoE's shape cut to 4 layers, bf16 and compiled:
# tokens/s and MFU (active FLOPs) with the experts as torch._grouped_mm and as a loop (scripts/gpu_check_moe.py); 13
# `long`: llama3-1b at its 8192-token context with the layout `llmtrain plan --suggest 1 <GPU GiB>` ranks first
# (micro-batch, recompute, ZeRO): tokens/s, MFU and the peak memory against the plan's (scripts/gpu_check_long.py); 14
# `step`: llama3-1b (2048-token context, bf16, compiled) with train.loss=full, chunked and liger (when installed), then
# train.attention=cudnn and flash: tokens/s, MFU and peak memory of each, the fastest against loss=full
# (scripts/gpu_check_step.py).
#
# By default parts 2, 5 and 6 run; --long (or --long 1) runs group 1 (llama, long, fp16), --long 2 group 2 (plain,
# tune, moe, smoke), --long 3 group 3 (step), each a loan of its own; fp8, async_save and apex run only when named.
# --parts runs the parts named, in that order (GPU_CHECK_PARTS does the same), --deadline sets the deadline.
# `python3 scripts/gpu_check_parts.py plan [--long [1|2|3]] [--parts ...]` prints the parts with their limits and
# whether each stands on a measured time or an estimate. Each part runs under its own time limit, so one failure
# does not hide the rest: a part that fails or crashes shows FAIL with its log; one that reaches its limit is
# stopped at once with every process it started (SIGKILL: no preemption checkpoint is saved) and shows FAIL, or
# TIMEOUT when the check's deadline came first; a part that would start after the deadline is not started and shows
# SKIP. summary.md is written in any case, also when the script is interrupted. MFU is shown with the peak it is
# measured against (`MFU 46.2% of 989 TFLOPS bf16`).
#
# --cpu (or DEVICE=cpu) is the dry mode: every part's logic on CPU with tiny models and a few steps, with 3x the
# time limits and deadline. Without hydra-core/omegaconf installed, wheels in .gpu/*.whl are installed into
# /tmp/site (no index needed).
set -u
START=$(date +%s.%N)
cd "$(dirname "$0")/.."

DEVICE=${DEVICE:-cuda}
PLAN_ARGS=()
OUTDIR=
while [ $# -gt 0 ]; do
  case $1 in
    --cpu) DEVICE=cpu ;;
    --long=*) PLAN_ARGS+=("$1") ;;
    --long)  # an optional group number
      if [ $# -ge 2 ] && [[ $2 =~ ^[0-9]+$ ]]; then PLAN_ARGS+=("--long=$2"); shift; else PLAN_ARGS+=(--long); fi ;;
    --parts|--deadline)
      [ $# -ge 2 ] || { echo "gpu_check: $1 needs a value" >&2; exit 2; }
      PLAN_ARGS+=("$1" "$2"); shift ;;
    -*) echo "gpu_check: unknown option $1 (options: --cpu --long [1|2|3] --parts --deadline)" >&2; exit 2 ;;
    *) OUTDIR=$1 ;;
  esac
  shift
done
if [ -n "${GPU_CHECK_PARTS:-}" ]; then PLAN_ARGS+=(--parts "$GPU_CHECK_PARTS"); fi
if [ -z "$OUTDIR" ]; then if [ -n "${OUT:-}" ]; then OUTDIR=$OUT/gpu_check; else OUTDIR=gpu_check; fi; fi
mkdir -p "$OUTDIR/logs"
OUTDIR=$(cd "$OUTDIR" && pwd)
rm -rf "$OUTDIR/results"

export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
finish() {
  python3 scripts/gpu_check_parts.py summary --out "$OUTDIR"
  echo "gpu_check: $(since) s; summary in $OUTDIR/summary.md, logs in $OUTDIR/logs/"
}
since() { awk -v a="$START" -v b="$(date +%s.%N)" 'BEGIN { printf "%.0f", b - a }'; }
trap finish EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

PLAN=$(python3 scripts/gpu_check_parts.py plan --shell --device "$DEVICE" ${PLAN_ARGS[@]+"${PLAN_ARGS[@]}"}) || exit 2
DEADLINE=$(echo "$PLAN" | sed -n 1p)
ENTRIES=$(echo "$PLAN" | sed -n 2p)
echo "gpu_check: parts $ENTRIES (seconds each); deadline $DEADLINE s from the start"

if ! python3 -c "import hydra, omegaconf" 2>/dev/null; then
  if ls .gpu/*.whl >/dev/null 2>&1; then
    echo "gpu_check: installing $(ls .gpu/*.whl | wc -l) wheel(s) from .gpu/ into /tmp/site"
    python3 -m pip install -q --no-index --no-deps --target /tmp/site .gpu/*.whl
    export PYTHONPATH="/tmp/site:$PYTHONPATH"
  else
    echo "gpu_check: hydra-core/omegaconf are not importable and .gpu/ holds no wheels" >&2
  fi
fi

record() {  # part status detail log: the row of a part that wrote none itself
  python3 - "$OUTDIR" "$@" <<'EOF'
import sys
from pathlib import Path
sys.path.insert(0, "scripts")
from gpu_check_parts import record
record(Path(sys.argv[1]), *sys.argv[2:])
EOF
}

for entry in $ENTRIES; do
  part=${entry%%:*}
  limit=${entry##*:}
  log="$OUTDIR/logs/$part.log"
  left=$(awk -v a="$START" -v b="$(date +%s.%N)" -v d="$DEADLINE" 'BEGIN { printf "%.1f", d - (b - a) }')
  if awk -v l="$left" 'BEGIN { exit !(l <= 0) }'; then
    record "$part" SKIP "not started: past the check's deadline of $DEADLINE s" ""
    echo "gpu_check: $part skipped: past the deadline of $DEADLINE s"
    continue
  fi
  cut=$(awk -v l="$left" -v m="$limit" 'BEGIN { print (l < m) ? l : "" }')  # the deadline comes first
  t0=$(date +%s)
  # The part stops itself at --limit (gpu_check_stop.py: SIGKILL to all it started, exit 124). SIGTERM or SIGINT
  # would have llmtrain save a preemption checkpoint first; `timeout` only backs that up for a part that hangs.
  run_for=${cut:-$limit}
  timeout --foreground -k 5 -s INT "$(awk -v s="$run_for" 'BEGIN { printf "%.0f", s + 30 }')" \
    python3 scripts/gpu_check_parts.py "$part" --out "$OUTDIR" --device "$DEVICE" --log "$log" --limit "$run_for" \
    >"$log" 2>&1
  rc=$?
  if [ ! -f "$OUTDIR/results/$part.json" ]; then  # died before writing its row
    if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
      if [ -n "$cut" ]; then
        record "$part" TIMEOUT "stopped at the check's deadline of $DEADLINE s, after running $cut s (no checkpoint)" \
          "$log"
      else
        record "$part" FAIL "timed out after $limit s (stopped at once, no checkpoint)" "$log"
      fi
    else
      record "$part" FAIL "exit $rc" "$log"
    fi
  fi
  echo "gpu_check: $part done in $(( $(date +%s) - t0 )) s (exit $rc)"
done
