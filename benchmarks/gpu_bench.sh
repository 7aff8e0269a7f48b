#!/usr/bin/env bash
# The GPU benchmarks in one 10-minute device call (`make bench-gpu OUT=...`), each alone on the machine:
#   1. benchmarks/models.py run: the model suite (capture, optimize with the tuner, install, then every
#      torch.compile mode and tilesmith timed interleaved, each path in its own process). MODELS picks
#      the models (two fit one call; e.g. MODELS=resnet18,gpt2-train for a second call; none: skip), TS_ON the
#      modes tilesmith starts from, MODES the compile modes timed, MAX_MINUTES the optimize budget, LOOPS the accepted candidates per graph, READY_MINUTES how long a path may compile before it is left out.
#   2. benchmarks/replay_host.py: host time per call of the lean CUDA-graph replay (~20 s, and its C check's build)
#   3. the gate calibration with whatever time is left (A/A on the small example, power near 5 % on the same
#      script at POWER_BATCH, default 32768: a 0.26 ms graph, where a 5 % slower copy can be made; seconds per decision)
#   4. benchmark.py run (the small fixture), only when BENCH_SMALL=1
# The whole suite over several calls (see CONTRIBUTING.md): FLOWS_ONLY=1 runs the flows alone (--no-timing) into
# PREP_DIR (default .gpu/prep) and leaves them in $OUT/prep.tgz (models.json, each home's manifests and artifacts)
# to unpack here and carry; REUSE=DIR[,DIR] times every model and mode over such flows (--reuse).
# Logs and JSON land in $OUT. LIMIT is the wall seconds the whole pass may take; CAL_ARGS go to the calibration,
# CALIBRATE=0 and REPLAY_HOST=0 skip those; DEADLINE_MINUTES (default 5): no model starts later; PROFILE_CALLS: steps profiled per path.
set -u
OUT=${OUT:-gpu-out}
LIMIT=${LIMIT:-575}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
left() { echo $((LIMIT - SECONDS)); }
MODELS_OUT=/tmp/models-out
[ -n "${FLOWS_ONLY:-}" ] && MODELS_OUT=${PREP_DIR:-.gpu/prep}

[ "${MODELS:-}" = none ] || timeout $(( $(left) - 60 )) python3 benchmarks/models.py run --models "${MODELS:-moe,gpt2}" \
    --modes "${MODES:-default,reduce-overhead,max-autotune-no-cudagraphs}" --tilesmith-on "${TS_ON:-default,reduce-overhead}" \
    --max-minutes "${MAX_MINUTES:-0.75}" --loops "${LOOPS:-2}" --ready-minutes "${READY_MINUTES:-4}" --seconds "${SECONDS_PER_MODEL:-6}" \
    --deadline-minutes "${DEADLINE_MINUTES:-5}" --profile-calls "${PROFILE_CALLS:-50}" \
    ${FLOWS_ONLY:+--no-timing} ${REUSE:+--reuse "$REUSE"} \
    --out-dir "$MODELS_OUT" > "$OUT/models.log" 2>&1
echo "models rc=$? after ${SECONDS} s" | tee -a "$OUT/models.log"
cp "$MODELS_OUT/models.json" "$OUT/" 2>/dev/null
# The optimize runs' small files (run.json, baseline profiles or why they failed, every verdict with its stage
# seconds, every screened variant with its error): where a decision's time went and why a track found nothing.
(cd "$MODELS_OUT" 2>/dev/null && find . -path '*/home/runs/*' \( -name 'verdict_*.json' -o -name run.json \
    -o -name baseline.json -o -name baseline_error.json -o -name tuner_variants.jsonl \) -print0 | tar czf "$OUT/runs.tgz" --null -T -) 2>/dev/null
[ -n "${FLOWS_ONLY:-}" ] && find "$MODELS_OUT" \( -name models.json -o -path '*/home/manifests/*' -o -path '*/home/artifacts/*' \) \
    -print0 | tar czf "$OUT/prep.tgz" --null -T -  # unpack in the repo's root here, then carry .gpu
tail -n 12 "$OUT/models.log"

if [ "${REPLAY_HOST:-1}" = 1 ] && [ "$(left)" -gt 80 ]; then
    timeout 75 python3 benchmarks/replay_host.py --out "$OUT/replay_host.json" > "$OUT/replay_host.log" 2>&1
    cat "$OUT/replay_host.log"
fi

if [ "${BENCH_SMALL:-0}" = 1 ] && [ "$(left)" -gt 200 ]; then
    timeout $(( $(left) - 60 )) python3 benchmark.py run --out-dir /tmp/bench-out > "$OUT/benchmark.log" 2>&1
    cp /tmp/bench-out/benchmark.json "$OUT/" 2>/dev/null
    tail -n 8 "$OUT/benchmark.log"
fi

budget=$(( $(left) - 40 ))
if [ "${CALIBRATE:-1}" = 1 ] && [ "$budget" -gt 90 ]; then
    timeout $(( budget + 30 )) python3 benchmarks/gate_calibration.py --device cuda --budget-s "$budget" \
        --power-batch "${POWER_BATCH:-32768}" --out "$OUT/gate_calibration.json" ${CAL_ARGS:-} > "$OUT/gate_calibration.log" 2>&1
    echo "calibration rc=$? after ${SECONDS} s" >> "$OUT/gate_calibration.log"
    grep -vE "^  (trial|decision)" "$OUT/gate_calibration.log" | tail -n 25
fi
