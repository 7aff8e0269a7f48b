"""Everything that runs inside a gate worker, the process that runs candidate code and never decides
(`python -m tilesmith.gate.worker RESULT_FD MARK_FD`, started by gate/proc.py):

    serve.py        the request loop and its op table (ready, and the ops below)
    setup.py        the ops load, time_setup and pin: wrappers loaded, timing buffers, CUDA graphs or trees
    sample.py       the ops warm and time: the timed sample, its window and its mark socket
    checks.py       the ops original_checks and checks; what candidate code replaced (patches.py)
    state.py        what one worker holds between requests
    outputs.py      the correctness-side ops; reference.py, the FX program in float64
    tensors.py      device copies, refills, snapshots and the outputs' digest
    trees.py        the gate's trees mode (Inductor's cudagraph trees); warm.py, the imports before any request
    guard.py        the worker's own code and state, checked after every request
    audit.py        the audit hook; seccomp.py, the seccomp filter; patches.py and fingerprint.py, what
                    candidate code could change in the process

Nothing is imported here: the zygote preloads some of these modules (launch/zygote.py) and never serve.py or the
ops' modules it imports (setup.py, sample.py, checks.py), which bind the clock and the CUDA synchronisation as a
worker starts.
"""
