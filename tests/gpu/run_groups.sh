#!/usr/bin/env bash
# The GPU suite in groups side by side (one GPU, 16 cores), logs per group, one device call or two:
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
# TEST_GROUPS picks which run (default: gate, runtime, capture, agent side by side). Under that load the four no longer fit
# one 10-minute call on an H200: run TEST_GROUPS="gate runtime" and TEST_GROUPS="capture agent" as two calls.
# The gate group alone took 430 s for 18 of its 30 tests with new-interpreter workers (session 10): its streams,
# clock and forked tests are group gate2, so "gate gate2" runs them side by side.
for name in ${TEST_GROUPS:-gate gate2 runtime capture agent}; do
    case $name in
        gate) group gate tests/gpu/test_gate_gpu.py tests/gpu/test_gate_redteam_gpu.py ;;
        gate2) group gate2 tests/gpu/test_streams_gpu.py tests/gpu/test_clock_gpu.py tests/gpu/test_forked_gpu.py ;;
        forked) group forked tests/gpu/test_forked_gpu.py ;;
        replay) group replay tests/gpu/test_cudagraph_gpu.py ;;
        runtime) group runtime tests/gpu/test_runtime_gpu.py ;;
        capture) group capture tests/gpu/test_capture_gpu.py tests/gpu/test_relower_gpu.py ;;
        agent) group agent tests/gpu/test_agent_gpu.py tests/gpu/test_compile_gpu.py ;;
        *) echo "unknown group $name (gate, gate2, forked, replay, runtime, capture, agent)"; exit 2 ;;
    esac
    names="${names:-} $name"
done
wait
logs=$(for n in $names; do echo "$OUT/$n.log"; done)
grep -hE "PASSED|FAILED|ERROR|rc=|passed|failed" $logs
! grep -qE "FAILED|ERROR|rc=[1-9]" $logs
