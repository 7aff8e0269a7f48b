#!/usr/bin/env bash
# The GPU benchmarks in one 10-minute device call (`make bench-gpu OUT=...`), each alone on the machine:
#   1. moe_benchmark.py run --chip H200 (capture, optimize with the tuner, install, the interleaved table)
#   2. the gate calibration with whatever time is left (A/A, power near 5 %, seconds per decision)
#   3. benchmark.py run (the small fixture), only when BENCH_SMALL=1
# Logs and JSON land in $OUT. LIMIT is the wall seconds the whole pass may take; CAL_ARGS go to the calibration.
set -u
OUT=${OUT:-gpu-out}
LIMIT=${LIMIT:-575}
MOE_MINUTES=${MOE_MINUTES:-2.5}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
left() { echo $((LIMIT - SECONDS)); }

timeout $(( $(left) - 120 )) python3 moe_benchmark.py run --chip "${CHIP:-H200}" --max-minutes "$MOE_MINUTES" \
    --out-dir /tmp/moe-out > "$OUT/moe.log" 2>&1
echo "moe rc=$? after ${SECONDS} s" | tee -a "$OUT/moe.log"
cp /tmp/moe-out/moe_benchmark.json "$OUT/" 2>/dev/null
TILESMITH_HOME=/tmp/moe-out/home python3 -m tilesmith_cli.app report --json > "$OUT/moe_report.json" 2>>"$OUT/moe.log"
tail -n 15 "$OUT/moe.log"

if [ "${BENCH_SMALL:-0}" = 1 ] && [ "$(left)" -gt 200 ]; then
    timeout $(( $(left) - 60 )) python3 benchmark.py run --out-dir /tmp/bench-out > "$OUT/benchmark.log" 2>&1
    cp /tmp/bench-out/benchmark.json "$OUT/" 2>/dev/null
    tail -n 8 "$OUT/benchmark.log"
fi

budget=$(( $(left) - 40 ))
if [ "$budget" -gt 60 ]; then
    timeout $(( budget + 30 )) python3 benchmarks/gate_calibration.py --device cuda --budget-s "$budget" \
        --out "$OUT/gate_calibration.json" ${CAL_ARGS:-} > "$OUT/gate_calibration.log" 2>&1
    echo "calibration rc=$? after ${SECONDS} s" >> "$OUT/gate_calibration.log"
    grep -vE "^  (trial|decision)" "$OUT/gate_calibration.log" | tail -n 25
fi
