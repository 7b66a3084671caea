#!/usr/bin/env bash
# The generic kernels compiled for one signature (K, stride, dilation as constants) against the same kernels with
# them at run time, in scripts/generic-harness.cu (thirtieth session, docs/perf-notes.md). Needs the macros of
# docs/proposed/fixedsig.diff: apply it, render with `python scripts/render-generic.py .renders/base`, then on the
# GPU host (through the device tool, .renders carried): OUT=... bash scripts/fixed-sigs.sh. Each signature's
# build runs only its own cases (ONLY): a launch refuses a signature other than the one compiled in.
set -u
flags=$(python3 -c "from dwgen.space import NVCC_FLAGS; print(*NVCC_FLAGS)")
mkdir -p $OUT
nvcc $flags -arch=sm_90 -I .renders/base -o /tmp/h_base scripts/generic-harness.cu &
declare -A SIG=([k15]="15 1 1" [k5d2]="5 1 2" [k3s3]="3 3 1" [k31]="31 1 1" [k7]="7 1 1")
declare -A ONLY=([k15]="fp16 16x512x2000 K15|fp16 4x256x16000 K15|blc fp16 16x512x2000 K15|bwd fp16 16x512x2000 K15"
  [k5d2]="fp32 8x1024x4000 K5 D2|blc fp32 8x1024x4000 K5 D2|bwd fp32 8x1024x4000 K5 D2"
  [k3s3]="bf16 8x1024x6000 K3 S3|blc bf16 8x1024x6000 K3 S3" [k31]="blc fp16 32x512x1024 K31"
  [k7]="bf16 16x512x2001 K7|bwd bf16 16x512x2001 K7")
for s in "${!SIG[@]}"; do set -- ${SIG[$s]}
  nvcc $flags -arch=sm_90 -DDWGEN_FIXED_K=$1 -DDWGEN_FIXED_S=$2 -DDWGEN_FIXED_D=$3 -I .renders/base -o /tmp/h_$s scripts/generic-harness.cu &
done
wait
for f in fwd_f16 bwd_f16 fwd_f32 bwd_f32; do
  /usr/bin/time -f "$f compile %e s" nvcc $flags -arch=sm_90 -shared -Xcompiler -fPIC -DDWGEN_FIXED_K=15 -DDWGEN_FIXED_S=1 -DDWGEN_FIXED_D=1 -o /tmp/$f.so .renders/base/src_$f.cu 2>&1 | tail -1
done | tee $OUT/compile.txt
for round in 1 2; do
  echo "== base round $round"; /tmp/h_base
  for s in "${!SIG[@]}"; do echo "== fixed $s round $round"; ONLY="${ONLY[$s]}" /tmp/h_$s; done
done > $OUT/harness.txt 2>&1
cat $OUT/harness.txt | grep -v "^$"
grep -v '^$' $OUT/harness.txt
