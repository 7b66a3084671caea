#!/usr/bin/env bash
# The H200 plan of docs/proposed/README.md as one device call: it does nothing on another card (prints the card
# and exits 0), so a session can ask for `nvidia-h200` and give back whatever else comes at once. On an H200:
# the untuned rows and the two Mamba `(B, L, C)` rows timed, those two re-tuned seeded from the forty-second
# session's module (its H200 designs asked first), the 30 forward generic keys of the K values whose H100
# choices miss on the H200 (K 3, 4, 5, 9 and 15, both layouts, every dtype) chosen again on it, the same rows
# timed again; about 450 s. Made ready here first (neither is in git):
#   mkdir -p .seeds42 && git archive cdc8dba generated | tar x -C .seeds42
#   python -m search.generic --dry-run --arch sm_90 --direction fwd --layouts bcl,blc --dtypes fp32,fp16,bf16 \
#     --kernel-sizes 3,4,5,9,15 && tar czf runs/build.tgz -C runs build      # 464 candidates, about 270 s here
# and carried: [".whl", "runs/build.tgz"] (.seeds42 travels with the tree; without runs/build.tgz the search
# compiles the candidates there, about a minute on 16 cores). Results under $OUT/a (a.tgz: logs,
# generated/, benchmarks/ in results.tgz); the last lines are each row's dwgen x copy before and after.
# `scripts/h200-plan.sh short` leaves out the rows before (about 370 s); `mamba` re-tunes the Mamba SiLU row
# alone in 4 trials and times the two Mamba rows after it.
# `scripts/h200-plan.sh bwd` (the sixty-first and sixty-second sessions' next steps, about 7 minutes; carry
# [".whl", "runs/build.tgz", ".renders/walknew", ".renders/lanetanh", ".renders/lanetanh-gh"], runs/build.tgz
# holding the 84 backward candidates of fp16 and bf16 (B, C, L) K 3, 4 and 7, made here by `python -m
# search.generic --dry-run --arch sm_90 --direction bwd --layouts bcl --dtypes fp16,bf16 --kernel-sizes 3,4,7`, and
# the .renders folders the renderings of walkissue.diff and lanetanh.diff (and its 40-register form), as
# docs/proposed/README.md says): the two diffs' A/Bs on the walking and the lane backward (scripts/ab-walkissue.txt,
# scripts/ab-lanetanh.txt: six lines, about 150 s; scripts/ab-k31-regs.txt's forward line, about 40 s, rides
# along), then those six backward generic keys chosen again on the H200 with the two untuned training rows they
# serve timed before and after.
# `scripts/h200-plan.sh bwdbench` (about 450 s): the same without the rows before, then `bench` and `frozentests`
# on the module it made, all in one call (for a session with under about 900 s of device time left).
# `scripts/h200-plan.sh bench`, the next call (on the module that call made, unpacked into the tree here): the
# whole bench, the host-time probe and the frozen module's tests (about 300 s); the README's table must equal its
# results.md.
# Ran (sixty-first session, an H200): the whole plan 317 s (rows 46 s, tunefile 96 s, generic 126 s, rows 46 s),
# `bench` 183 s; the module of 340afe1 and benchmarks/results.md came from those two calls.
set -u
case "${1:-}" in ''|short|mamba|bench|bwd|bwdbench) ;;  # a mistyped mode would otherwise run the whole plan
  *) echo "h200-plan.sh: unknown mode '$1': give none, short, mamba, bwd, bwdbench or bench" >&2; exit 2 ;; esac
card=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1); echo "card: $card"
echo "$card" | grep -q H200 || exit 0
steps="rows tunefile generic rows"
[ "${1:-}" = short ] && steps="tunefile generic rows"  # with less budget: no rows before (about 370 s)
[ "${1:-}" = mamba ] && steps="tunefile rows"  # less still: the Mamba re-tune alone, its rows after
if [ "${1:-}" = bench ]; then
  STEP_TIMEOUT=400 bash scripts/gpu-session.sh bench host frozentests | tail -6
  exit 0
fi
FINAL=$OUT; mkdir -p "$FINAL/a"
# The call's results as one archive, then each timed row's dwgen cell and kernel: columns $1 and $2 of results.md's
# rows (8 and 9 in the forward tables, 6 and 7 in the training table's)
finish() { tar czf "$FINAL/a.tgz" -C "$FINAL" a
  for r in "$FINAL"/a/rows*/results.md; do
    echo "$r"; grep -E '^\| [0-9]' "$r" | awk -F'|' -v d="$1" -v k="$2" '{print $2 "|" $d "|" $k}'
  done; }
if [ "${1:-}" = bwd ] || [ "${1:-}" = bwdbench ]; then
  # the untuned training rows the six keys serve: Mamba's conv at 4x2048x3072 (bf16 K4) and fp16 K7 8x1536x2048
  bwd_steps="ab rows generic rows"
  # with less device time: no rows before, and the bench and the frozen tests on the new module in the same call
  [ "$1" = bwdbench ] && bwd_steps="ab generic rows bench frozentests"
  bwd_steps=${BWD_STEPS:-$bwd_steps}  # fewer still where the device time left asks (e.g. "generic bench frozentests")
  grep -E -- '--kernel-size (4|7) .*--dtype (fp16|bf16) --backward --graph' benchmarks/training.txt | sed 's/ *#.*//' \
    > /tmp/bwdrows.txt
  # and the fp32 K31 forward's register ceilings (sixty-fourth session), a forward A/B that rides along
  cat scripts/ab-walkissue.txt scripts/ab-lanetanh.txt scripts/ab-k31-regs.txt > /tmp/ab-bwd.txt
  OUT=$FINAL/a AB_FILE=/tmp/ab-bwd.txt ROWS_FILE=/tmp/bwdrows.txt STEP_TIMEOUT=300 \
    GENERIC_ARGS="--direction bwd --layouts bcl --dtypes fp16,bf16 --kernel-sizes 3,4,7 --freeze-once" \
    bash scripts/gpu-session.sh $bwd_steps
  echo "h200-plan $1 rc $?"
  grep -hE 'interleaved rounds|(walk|lane).*(same|from:)|WRONG|failed' "$FINAL"/a/ab*.log | cut -c1-150
  finish 6 7
  exit 0
fi
[ -d .seeds42/generated ] || { echo "h200-plan.sh: .seeds42/generated is missing (see the header)" >&2; exit 2; }
grep -E '^--shape 8x4096x2048 --kernel-size 4 .*--layout blc' benchmarks/suite.txt | sed 's/ *#.*//' > /tmp/mamba.txt
{ cat /tmp/mamba.txt; grep -v '^#' benchmarks/untuned.txt | sed 's/ *#.*//'; } > /tmp/rows.txt
trials=8
if [ "${1:-}" = mamba ]; then  # the SiLU row alone (the P3 one is at 0.99x), 4 trials: the seeds asked first
  cp /tmp/mamba.txt /tmp/rows.txt; grep silu /tmp/rows.txt > /tmp/mamba.txt; trials=4
fi
OUT=$FINAL/a SEEDS=.seeds42/generated ROWS_FILE=/tmp/rows.txt TUNE_FILE=/tmp/mamba.txt TUNE_ARGS="--trials $trials" \
  STEP_TIMEOUT=240 GENERIC_ARGS="--direction fwd --layouts bcl,blc --dtypes fp32,fp16,bf16 --kernel-sizes 3,4,5,9,15 --freeze-once" \
  bash scripts/gpu-session.sh $steps
echo "h200-plan rc $?"
finish 8 9
