#!/usr/bin/env bash
# One GPU-host session: install the carried wheels, tune the target cold, run the GPU tests, and pack
# generated/ and the logs under $OUT. Run through the device tool with `.whl` carried (see README).
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site
fi
rm -rf runs  # cold: no study, no build cache
start=$(date +%s)
python3 tune.py --shape 32x512x8192 "$@" 2>&1 | tee "$OUT/tune.log"
echo "tune wall: $(( $(date +%s) - start )) s" | tee -a "$OUT/tune.log"
python3 -m pytest -q tests 2>&1 | tee "$OUT/pytest.log" | tail -25
tar czf "$OUT/generated.tgz" generated
grep -E "^(winner|variants|compile wall|search wall|re-timed|NVIDIA)" "$OUT/tune.log"
tail -1 "$OUT/pytest.log"
