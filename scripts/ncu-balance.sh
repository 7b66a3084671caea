#!/usr/bin/env bash
# How evenly the backwards keep the SMs busy, beside the DRAM rate PyTorch's own three-tensor pass reaches
# (fifty-ninth session). The walking `(B, L, C)` backward reads at 80.5% of DRAM peak and the `(B, C, L)` lane
# backward at 85.8% (fifty-sixth session); the walk's grid is about one wave of long blocks, so SMs that finish
# early would sit idle while the slowest blocks end. This reads, under Nsight Compute, each kernel's SM-active
# cycles (mean, least and most over the SMs) against its elapsed cycles, its waves an SM and DRAM's share of peak,
# for both walk designs, the lane design and torch.add on tensors of the same size (copy_ is a cudaMemcpy, which ncu
# does not profile). Logs to $OUT/balance.log.
# Run on the device (probe-variant.py needs no optuna, so nothing need be carried): bash scripts/ncu-balance.sh
# (about a minute); `floor` reads torch's kernels alone; `waves` the Mamba walk over grids of 256, 264 and 272 blocks
# (scripts/ab-walkwave.txt), into $OUT/balance-waves.log; `stalls` what the Mamba walk's and the lane's warps wait on
# (each stall reason's warps per issued instruction, issue-active share, scheduler and occupancy sections), into
# $OUT/balance-stalls-walk.log and -lane.log.
# Measured (H100, sixtieth session): SM-active 90.4% of elapsed for the Mamba walk, 92.2% P3, 96.8% the lane, 97.9%
# torch.add; DRAM 82.1 / 85.6 / 88.0 / 90.5% of peak. `waves`: 89.0 / 93.0% SM-active at 256 / 264 blocks.
# `stalls` (H200, sixty-first session): the walk 75% issue-active, long scoreboard 0.16 and not selected 1.74 warps
# an issued instruction; the lane 86%, 3.54 and 4.13
set -uo pipefail
. "$(dirname "$0")/ncu-metrics.sh"  # STALL_METRICS
case "${1:-}" in ''|floor|waves|stalls) ;;  # a mistyped mode would otherwise run the whole read
  *) echo "ncu-balance.sh: unknown mode '$1': give none, floor, waves or stalls" >&2; exit 2 ;; esac
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
metrics='gpu__time_duration.sum,sm__cycles_elapsed.avg,sm__cycles_active.avg,sm__cycles_active.min,sm__cycles_active.max'
metrics+=',launch__grid_size,launch__waves_per_multiprocessor,launch__occupancy_per_block_size'
metrics+=',dram__throughput.avg.pct_of_peak_sustained_elapsed,dram__bytes_read.sum,dram__bytes_write.sum'
mamba='--shape 8x4096x2048 -k 4 --dtype bf16 --direction bwd'
walk_silu=dw1d_bwdwalk_bf16_k4_t256_c64_v4_s256_u4_a3  # the frozen designs of the Mamba rows
walk_p3=dw1d_bwdwalk_bf16_k4_t256_c32_v4_s128_u4_a3
lane_silu=dw1d_bwdlane_bf16_k4_t128_o8_n2_h2
probe() { ncu --clock-control none --metrics "$metrics" --nvtx --nvtx-include probe/ -k regex:dw1d -c 2 \
            python3 scripts/probe-variant.py --reps 2 "$@"; }
rc=0  # any part that fails makes the whole run fail, so that a missing kernel is not read as a result
if [ "${1:-}" = stalls ]; then  # where the walk's warps spend the cycles its SMs are active (the lane beside it)
  for k in walk lane; do
    a=(--padding causal --activation silu --layout blc $walk_silu)
    [ $k = lane ] && a=(--padding causal --activation silu $lane_silu)
    ncu --clock-control none --section SchedulerStats --section Occupancy --section LaunchStats \
      --metrics "$STALL_METRICS" \
      --nvtx --nvtx-include probe/ -k regex:dw1d -c 1 \
      python3 scripts/probe-variant.py --reps 2 $mamba "${a[@]}" > "$OUT/balance-stalls-$k.log" 2>&1 || rc=1
    grep -q 'No kernels were profiled' "$OUT/balance-stalls-$k.log" && rc=1
  done
  echo "ncu-balance stalls rc $rc"
  # each stall reason's warps per issued instruction, the larger ones (a read under 0.05 says nothing)
  grep -hE 'dw1d_|stalled|issue_active|Eligible|Registers|Achieved Occ|Theoretical Occ' "$OUT"/balance-stalls-*.log |
    grep -v '^==PROF==' | awk '!/stalled/ || $NF+0 >= 0.05' | sed 's/smsp__average_warps_issue_stalled_//' | cut -c1-150
  exit $rc
fi
if [ "${1:-}" = waves ]; then  # the Mamba walk at L 1024 over 256, 264 and 272 blocks (scripts/ab-walkwave.txt)
  for c in 8192 8448 8704; do
    probe --shape 8x${c}x1024 -k 4 --dtype bf16 --direction bwd --padding causal --activation silu --layout blc \
      $walk_silu || rc=1
  done > "$OUT/balance-waves.log" 2>&1
  echo "ncu-balance waves rc $rc"
  grep -E '^  [a-zA-Z_]|dw1d_|correct|WRONG|No kernels' "$OUT/balance-waves.log" | grep -v '^==PROF==' | cut -c1-150
  exit $rc
fi
{
  if [ "${1:-}" != floor ]; then  # `floor`: torch's kernels alone
    probe $mamba --padding causal --activation silu --layout blc $walk_silu || rc=1
    probe $mamba --padding 3 --layout blc $walk_p3 || rc=1
    probe $mamba --padding causal --activation silu $lane_silu || rc=1
  fi
  ncu --clock-control none --metrics "$metrics" -c 6 python3 -c "
import torch
a = torch.randn(8, 4096, 2048, device='cuda', dtype=torch.bfloat16); b = a.clone(); c = torch.empty_like(a)
torch.add(a, b, out=c); c.copy_(a); torch.cuda.synchronize()" || rc=1
} > "$OUT/balance.log" 2>&1
grep -q 'No kernels were profiled' "$OUT/balance.log" && rc=1
echo "ncu-balance rc $rc"
grep -E '^  [a-zA-Z_]|dw1d_|elementwise|copy|correct|WRONG' "$OUT/balance.log" | grep -v '^==PROF==' | cut -c1-150
exit $rc
