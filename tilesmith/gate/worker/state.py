"""What one gate worker holds between requests (the ops serve.py runs read and write it): the graph's data, each
role's call and timing buffers, the CUDA graphs kept alive, the outputs kept for checks, and the process state
recorded before any candidate code ran (fingerprint.py, patches.py)."""

from __future__ import annotations


class State:
    """One worker's state; the main loop makes one and passes it to every op."""

    def __init__(self):
        self.data = None  # workspace.GraphData (capture/loading.py loads it)
        self.fns = {}  # role -> call
        # role -> a thunk loading the role's module again, a fresh instance for timing. The candidate only:
        # the baseline is never loaded after candidate code has run here, and its correctness calls ran
        # in the reference worker, so its instance here is fresh.
        self.loaders = {}
        self.device = "cpu"
        self.timed = {}  # role -> list of (call thunk returning the call's outputs) over rotating buffers
        self.bufs = {}  # role -> the rotating input buffers the thunks read
        self.pool = {}  # role -> input contents the buffers are refilled from between samples
        self.keep = {}  # role -> CUDA graphs, their inputs and their outputs stay alive while timing
        self.pending = None  # outputs of the last timed sample, kept until the parent says keep or drop
        self.checks = []  # outputs of timed calls the parent chose to check (CPU copies)
        self.state0 = None  # process-state fingerprint taken before any wrapper code ran
        self.shared = set()  # input positions timed in one buffer for every buffer set (parameters)
        self.rescaled = set()  # those of them refilled and scaled afresh before each sample (inputs.rescaled_parameters)
        self.patch0 = None  # gate.worker.patches.snapshot before candidate code ran
        self.watched = {}  # namespaces added to it: the globals of wrappers loaded before the candidate
        self.trees_fallback = {}  # role -> why it was asked for trees mode and timed in graph mode instead
        self.trees_roles = set()  # roles whose thunks run through the cudagraph trees set up in this process
        self.trees_live = False  # whether the trees' manager may hold functions set up since its last reset
        self.seccomp = None  # "" once the seccomp filter is in place (after the candidate's load), else why not
