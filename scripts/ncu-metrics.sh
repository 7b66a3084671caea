# Sourced by scripts/gpu-session.sh and scripts/ncu-balance.sh: the ncu metrics that say how busy a kernel's
# schedulers are and what its warps wait on (each stall reason's warps per issued instruction), spelled once.
STALL_METRICS='smsp__issue_active.avg.pct_of_peak_sustained_active,regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio'
