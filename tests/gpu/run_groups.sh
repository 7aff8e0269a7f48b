#!/usr/bin/env bash
# The GPU suite in three groups side by side (one GPU, 16 cores), so it fits one 10-minute device call:
#   OUT=/path make gpu-test-groups      (logs and junit XML per group under $OUT)
# Failures print as they happen (TILESMITH_TEST_STREAM_FAILURES), so a group cut off by a time limit
# still says why its earlier tests failed. The gate's paired, interleaved timing tolerates the load;
# calibration and benchmarks must run alone (make bench-gpu).
set -u
OUT=${OUT:-gpu-out}
LIMIT=${LIMIT:-570}
mkdir -p "$OUT"
export TILESMITH_TEST_STREAM_FAILURES=1 PYTHONUNBUFFERED=1
group() {  # name, test files...
    local name=$1; shift
    (timeout "$LIMIT" python3 -m pytest -vv -m gpu -p no:cacheprovider --basetemp="/tmp/pytest-$name" \
        --durations=15 --junitxml="$OUT/gpu-tests-$name.xml" "$@" > "$OUT/$name.log" 2>&1
     echo "rc=$?" >> "$OUT/$name.log") &
}
group gate tests/gpu/test_gate_gpu.py tests/gpu/test_cudagraph_gpu.py
group rtcap tests/gpu/test_runtime_gpu.py tests/gpu/test_capture_gpu.py
group agent tests/gpu/test_agent_gpu.py tests/gpu/test_compile_gpu.py
wait
grep -hE "PASSED|FAILED|ERROR|rc=|passed|failed" "$OUT"/gate.log "$OUT"/rtcap.log "$OUT"/agent.log
! grep -qE "FAILED|ERROR|rc=[1-9]" "$OUT"/gate.log "$OUT"/rtcap.log "$OUT"/agent.log
