#!/usr/bin/env bash
# GPU-host steps, run through the device tool with `.whl` carried (README). Steps, in the order given:
#   smoke   GPU variant checks only (fast; stops the session early when a kernel is wrong)
#   tune    cold tune of the target shape (the README's command)
#   tunecheck  the same, without touching generated/
#   tunebwd the target shape's backward (tune.py --direction bwd), frozen beside its forward through the gate
#   suitebwd  the suite's backward (tune.py --suite benchmarks/suite.txt --direction bwd; strided problems skipped)
#   generic choose the fast generic kernel of each (dtype, layout, K) by measurement (frozen into generated/);
#           GENERIC_RECORDS=<dir> first copies kept measurements (runs/generic/*.json of an earlier call) in, so that
#           only the rest are measured (those made on another kind of GPU are measured again); every record comes
#           back as generic-records.tgz
#   suite   cold tune of benchmarks/suite.txt, frozen together (through the gate)
#   gate    python -m dwgen.gate on generated/ (every frozen kernel through the built module)
#   bench   python -m dwgen.bench (results into benchmarks/); BENCH_ONLY=a,b picks contenders
#   exhaustive  every variant of the target's space, compared with the frozen winner (no freeze)
#   tests   the whole test suite, GPU tests included
#   gputests  only the GPU tests and the frozen-module tests
#   frozentests  the frozen module's tests alone (random problems, edge inputs, memcheck)
#   kerneltests  the search-side GPU tests alone (sampled variants through the gate, a crashing variant,
#           every fault of dwgen.faults in one search)
#   bwdtests  the backward tuning's GPU tests (sampled backward variants through the worker, a small tune
#           frozen into a copy of generated/ and dispatched)
#   SUITE_WORKERS=N makes the suite step search with one worker process per GPU (tune.py --workers N)
#   SUITE_TRIALS=N and BWD_TRIALS=N set the trials a problem of suite and suitebwd (BWD_TRIALS defaults to
#   SUITE_TRIALS); SEEDS=snapshot copies generated/ before the first step and has both tunes ask its winners
#   first (tune.py --seeds-from): a re-tune of both directions after a template change; SEEDS=<dir> seeds
#   from a copy of generated/ made before (carried). A freeze drops stale entries but keeps their designs under
#   the manifest's "retired" (since the forty-ninth session), so a snapshot taken after one still seeds them
#   build   the first build of generated/, timed, in a fresh folder; scripts/build-times.py then says where the time went
#   tcself  scripts/tc_selftest.py: the tensor-core forward against float64 on edge problems, then timed
#   host    scripts/probe-host.py: µs of CPU per call, dwgen beside F.conv1d (1x768x512)
#   probe   scripts/probe-train.py: forward, backward and both against PyTorch, x copy (a quick look, not the bench)
#   some    python -m pytest on TEST_FILES
#   optests the registered op and its backward alone (opcheck, gradients, compile, graphs, training)
#   rows    python -m dwgen.bench on a few rows alone (ROWS_FILE, default scripts/ab-untuned-fwd.txt; contenders
#           BENCH_ONLY, default dwgen; copy_ always), into $OUT/rows<n> and rows<n>.log: given twice, e.g.
#           `rows generic rows`, it times the same rows on the module before and after a freeze in one call,
#           at a fraction of the whole bench's time (a comparison within one machine's run)
#   tunefile  python tune.py --suite $TUNE_FILE $TUNE_ARGS, seeded like suite (SEEDS=snapshot), runs/ kept: a
#           chosen few problems, e.g. TUNE_FILE=scripts/nearmiss-bwd.txt TUNE_ARGS="--direction bwd --sampler
#           grid --trials 100000" (every variant of the backward's near misses)
#   ncu     Nsight Compute on one training step of each case of scripts/probe-train.py (NCU_CASES, default
#           1 2 3: the bf16 target and Mamba's conv in both layouts): forward, backward and its weight sum,
#           with speed of light, occupancy, pipe use, each warp stall reason and instructions executed (logs ncu<i>.log)
#   ncuvariant  Nsight Compute on named variants, frozen or not (scripts/probe-variant.py $PROBE_ARGS, e.g.
#           PROBE_ARGS="--shape 32x512x1024 -k 31 --padding 15 --dtype fp16 --direction bwd NAME"); each variant is
#           checked first, outside the NVTX range ncu profiles; NCU_COUNT kernels (default 6) are profiled, with
#           the memory workload (DRAM bytes, L2 and L1 traffic) beside speed of light, occupancy and warp stalls
#   ncusass the first variant of PROBE_ARGS under Nsight Compute's source counters: each SASS instruction with
#           how often it ran (ncusass.csv) and the executed instructions by opcode (ncusass.log)
#   ncusassgeneric  the same for the first generic kernel matching NCU_KERNEL (a regex, default dw1d_any_f16_window:
#           the fp16 K15 forward) in scripts/probe-generic.py (e.g. NCU_KERNEL=grad_x_rows, grad_w_rows)
#   renders scripts/generic-harness.cu built against each folder of RENDERS (renderings of the generic kernels made
#           with scripts/render-generic.py under .renders/, carried: e.g. RENDERS=".renders/base .renders/new"), the
#           whole set run twice, interleaved (renders.log): one process's timings and output hashes side by side
#           (python scripts/renders-table.py renders.log: one line a problem)
#   ab      scripts/probe-ab.py $AB_ARGS: tuned variants rendered as now (A) and with a named edit to the rendered
#           source (B), both checked, then timed in shuffled interleaved rounds beside copy_ (ab.log); e.g.
#           AB_ARGS="--shape 8x4096x2048 -k 4 --padding causal --activation silu --dtype bf16 --direction bwd
#           --edit same --edit stream dw1d_bwdlane_bf16_k4_t128_o8_n2_h2" (`same`, A built again, is the control)
#           AB_FILE=<file> instead: one such argument list a line (# comments), each run in turn (ab<n>.log)
# Candidates compiled on another machine (python -m search.generic --dry-run) travel as runs/build.tgz (made with
# `tar czf runs/build.tgz -C runs build`: the folder itself is past what a call carries beside the tree), unpacked
# here before the first step (runs/ is ignored by git: name runs/build.tgz in the device tool's carry).
# Logs and generated/ and benchmarks/ come back under $OUT (results.tgz). STEP_TIMEOUT (s) bounds each step.
set -uo pipefail
. "$(dirname "$0")/ncu-metrics.sh"  # STALL_METRICS
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site
fi
# The steps that run the search need optuna, which the GPU host lacks unless `.whl` came along: stop here in one
# line rather than after the steps before them (the fifty-second session lost a call's tune to a missing carry).
for step in "$@"; do
  case $step in
    tune|tunecheck|tunebwd|generic|suite|suitebwd|exhaustive|tunefile|tests|gputests|kerneltests|bwdtests)
      python3 -c 'import optuna' 2>/dev/null || {
        echo "gpu-session.sh: step $step needs optuna, which is not importable here: carry .whl (made by bash ../shared/gpu/wheels.sh .whl)" >&2
        exit 2; }
      break ;;
  esac
done
if [ -f runs/build.tgz ]; then
  # kept after: run on the working machine, the archive is the only copy (unpacking again is harmless)
  tar xzf runs/build.tgz -C runs && echo "unpacked $(ls runs/build | wc -l) compiled candidates into runs/build" \
    || echo "runs/build.tgz: unpack failed; the search compiles its candidates here" >&2
fi
SEED_ARGS=()
if [ "${SEEDS:-}" = snapshot ]; then
  rm -rf /tmp/dwgen-seeds && cp -r generated /tmp/dwgen-seeds && SEED_ARGS=(--seeds-from /tmp/dwgen-seeds)
elif [ -n "${SEEDS:-}" ]; then
  SEED_ARGS=(--seeds-from "$SEEDS")
fi
# Source counters of the first kernel matching $1 in the NVTX range `probe` of the command after it (ncusass.*).
sass_counters() { local kernel=$1; shift
  timed ncusass ncu --section SourceCounters --section InstructionStats \
    --metrics 'gpu__time_duration.sum,smsp__inst_executed.sum,sass__inst_executed_per_opcode' \
    --print-metric-instances details --nvtx --nvtx-include probe/ -k "regex:$kernel" -c 1 -o "$OUT/ncusass" "$@" \
  && ncu -i "$OUT/ncusass.ncu-rep" --page details --print-metric-instances details >> "$OUT/ncusass.log" \
  && ncu -i "$OUT/ncusass.ncu-rep" --page source --print-source sass --csv > "$OUT/ncusass.csv"
  local rc=$?; rm -f "$OUT/ncusass.ncu-rep"; return "$rc"; }
timed() { local name=$1; shift; local t0; t0=$(date +%s); timeout "${STEP_TIMEOUT:-3600}" "$@" 2>&1 | tee "$OUT/$name.log"
  local rc=${PIPESTATUS[0]}
  echo "$name: rc $rc, $(( $(date +%s) - t0 )) s wall" | tee -a "$OUT/summary.log"; return "$rc"; }
for step in "$@"; do
  case $step in
    smoke) timed smoke python3 -m pytest -q -x tests/gpu/test_variants_gpu.py || exit 1 ;;
    tune) rm -rf runs; timed tune python3 tune.py --shape 32x512x8192 ;;
    tunecheck) rm -rf runs; timed tunecheck python3 tune.py --shape 32x512x8192 --no-freeze ;;
    tunebwd) timed tunebwd python3 tune.py --shape 32x512x8192 --direction bwd ;;
    generic) if [ -n "${GENERIC_RECORDS:-}" ]; then mkdir -p runs/generic && cp "$GENERIC_RECORDS"/*.json runs/generic/; fi
             timed generic python3 -m search.generic ${GENERIC_ARGS:-}
             tar czf "$OUT/generic-records.tgz" runs/generic 2>/dev/null ;;  # one file: the tool returns a few files, not dozens
    gate) timed gate python3 -m dwgen.gate ;;
    suite) rm -rf runs; timed suite python3 tune.py --suite benchmarks/suite.txt ${SUITE_TRIALS:+--trials $SUITE_TRIALS} \
             ${SUITE_WORKERS:+--workers $SUITE_WORKERS} "${SEED_ARGS[@]}" ;;
    suitebwd) BT=${BWD_TRIALS:-${SUITE_TRIALS:-}}; timed suitebwd python3 tune.py --suite benchmarks/suite.txt --direction bwd \
               ${BT:+--trials $BT} ${SUITE_WORKERS:+--workers $SUITE_WORKERS} "${SEED_ARGS[@]}" ;;
    bench) timed bench python3 -m dwgen.bench ${BENCH_ONLY:+--only "$BENCH_ONLY"} ;;
    exhaustive) timed exhaustive python3 tune.py --shape 32x512x8192 --sampler grid --trials 100000 \
                  --storage memory --no-freeze ;;
    tests) timed tests python3 -m pytest -q tests ;;
    gputests) timed gputests python3 -m pytest -q tests/gpu tests/test_generated.py ;;
    frozentests) timed frozentests python3 -m pytest -q -rs tests/gpu/test_generated_gpu.py tests/test_generated.py ;;
    kerneltests) timed kerneltests python3 -m pytest -q -rs tests/gpu/test_variants_gpu.py tests/gpu/test_crash_gpu.py \
                   tests/gpu/test_faults_gpu.py ;;
    build) rm -rf /tmp/dwgen-build-timed && mkdir -p /tmp/dwgen-build-timed
           DWGEN_BUILD_DIR=/tmp/dwgen-build-timed timed build python3 -c "import time, generated; t = time.time(); generated.build(); print(f'built in {time.time() - t:.0f} s')" \
           && python3 scripts/build-times.py /tmp/dwgen-build-timed/.ninja_log | tee -a "$OUT/build.log" ;;
    probe) timed probe python3 scripts/probe-train.py ;;
    host) timed host python3 scripts/probe-host.py ;;
    tcself) timed tcself python3 scripts/tc_selftest.py ;;
    some) timed some python3 -m pytest -q -rs ${TEST_FILES:-tests/gpu} ;;
    tunefile) timed tunefile python3 tune.py --suite "${TUNE_FILE:?TUNE_FILE names a file of problems}" ${TUNE_ARGS:-} \
                "${SEED_ARGS[@]}" ;;
    ncu) for i in ${NCU_CASES:-1 2 3}; do
           timed ncu$i ncu --section SpeedOfLight --section Occupancy --section WarpStateStats \
             --section ComputeWorkloadAnalysis \
             --metrics "smsp__inst_executed.sum,$STALL_METRICS" \
             -k regex:dw1d --launch-skip 3 -c 3 python3 scripts/probe-bwd-ncu.py "$i"
         done ;;
    ncuvariant) timed ncuvariant ncu --section SpeedOfLight --section Occupancy --section WarpStateStats \
                  --section MemoryWorkloadAnalysis \
                  --metrics 'gpu__time_duration.sum,smsp__inst_executed.sum,smsp__issue_active.avg.pct_of_peak_sustained_active,dram__bytes_read.sum,dram__bytes_write.sum' \
                  --nvtx --nvtx-include probe/ -k regex:dw1d -c "${NCU_COUNT:-6}" \
                  python3 scripts/probe-variant.py ${PROBE_ARGS:?PROBE_ARGS names a problem and variants} ;;
    ncusass) sass_counters dw1d python3 scripts/probe-variant.py ${PROBE_ARGS:?PROBE_ARGS names a problem and a variant} ;;
    ncusassgeneric) sass_counters "${NCU_KERNEL:-dw1d_any_f16_window}" python3 scripts/probe-generic.py ;;
    renders) timed renders bash -c 'set -e; flags=$(python3 -c "from dwgen.space import NVCC_FLAGS; print(*NVCC_FLAGS)")
               for d in ${RENDERS:?RENDERS names folders of renderings}; do
                 nvcc $flags -arch=sm_90 -I "$d" -o "/tmp/harness_${d//\//_}" scripts/generic-harness.cu; done
               rc=0; for round in 1 2; do for d in $RENDERS; do echo "== $d (round $round)"
                 "/tmp/harness_${d//\//_}" || rc=1; done; done; exit $rc' ;;
    ab) if [ -n "${AB_FILE:-}" ]; then n=0  # one probe-ab.py command line a line, logs ab1.log, ab2.log, ...
          while read -r args; do case $args in ''|'#'*) continue ;; esac; n=$((n + 1))
            timed "ab$n" python3 scripts/probe-ab.py $args < /dev/null; done < "$AB_FILE"
        else timed ab python3 scripts/probe-ab.py ${AB_ARGS:?AB_ARGS or AB_FILE names a problem, edits and variants}; fi ;;
    optests) timed optests python3 -m pytest -q -rs tests/gpu/test_op_gpu.py ;;
    rows) ROWS_N=$((${ROWS_N:-0} + 1))  # numbered, so that rows before and after a freeze both come back
          timed "rows$ROWS_N" python3 -m dwgen.bench --suite "${ROWS_FILE:-scripts/ab-untuned-fwd.txt}" \
            --only "${BENCH_ONLY:-dwgen}" --out "$OUT/rows$ROWS_N" ;;
    bwdtests) timed bwdtests python3 -m pytest -q -rs tests/gpu/test_bwd_variants_gpu.py tests/gpu/test_tune_bwd_gpu.py ;;
    *) echo "unknown step $step"; exit 2 ;;
  esac
  tar czf "$OUT/results.tgz" generated benchmarks 2>/dev/null  # after every step: a later time-out loses only that step
done
cat "$OUT/summary.log"
