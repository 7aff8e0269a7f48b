"""The gate worker's process-state fingerprint: process-wide settings taken before candidate code first
runs in the worker and compared after every request (a change is the reply `process-state`)."""

from __future__ import annotations

import os
import signal
import sys
import threading

import torch

from tilesmith.gate.worker.state import State


def process_state() -> dict:
    """Process-wide settings a call could change to slow down, or change the numerics of, code that runs
    after it: compared before and after candidate code runs."""
    tiny = torch.tensor([1e-40], dtype=torch.float32)
    st = {"threads": torch.get_num_threads(), "interop_threads": torch.get_num_interop_threads(),
          "matmul_precision": torch.get_float32_matmul_precision(),
          "cuda_matmul_tf32": torch.backends.cuda.matmul.allow_tf32,
          "cuda_fp16_reduced": torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction,
          "cuda_bf16_reduced": torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction,
          "cudnn": [torch.backends.cudnn.enabled, torch.backends.cudnn.allow_tf32, torch.backends.cudnn.benchmark,
                    torch.backends.cudnn.deterministic],
          "deterministic": [torch.are_deterministic_algorithms_enabled(),
                            torch.is_deterministic_algorithms_warn_only_enabled()],
          "flush_denormal": bool((tiny * 1.0).item() == 0.0), "default_dtype": str(torch.get_default_dtype()),
          "default_device": str(torch.get_default_device()) if hasattr(torch, "get_default_device") else "",
          "grad": torch.is_grad_enabled(), "inference_mode": torch.is_inference_mode_enabled(),
          # Every thread that runs Python, also one started below `threading` (its bookkeeping misses those).
          "python_threads": threading.active_count(), "thread_states": len(sys._current_frames()), "affinity": sorted(os.sched_getaffinity(0))
          if hasattr(os, "sched_getaffinity") else [], "nice": os.getpriority(os.PRIO_PROCESS, 0),
          "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""),
          # Modes left entered (a TorchFunctionMode or TorchDispatchMode sees, and can slow or answer, every op
          # that runs after it), autocast, the attention kernels allowed, and how the scheduler treats the process.
          "modes": [_ask(torch._C, "_len_torch_function_stack"), _ask(torch._C, "_len_torch_dispatch_stack")],
          "autocast": [_ask(torch, "is_autocast_enabled", d) for d in ("cpu", "cuda")],
          "sdp": [_ask(torch.backends.cuda, "flash_sdp_enabled"), _ask(torch.backends.cuda, "mem_efficient_sdp_enabled"),
                  _ask(torch.backends.cuda, "math_sdp_enabled")],
          "switch_interval": sys.getswitchinterval(),
          # A Python signal handler is handed the running frame: on an interval timer it runs between any two of
          # the worker's bytecodes (after a window, before the digest of its outputs, say). None may be set or
          # armed when a request ends; one that removes itself within a request is not seen (see audit.py).
          "signals": _signal_handlers(), "interval_timers": _armed_timers(),
          "scheduler": [os.sched_getscheduler(0), os.sched_getparam(0).sched_priority]
          if hasattr(os, "sched_getscheduler") else []}
    # Nothing about CUDA is asked at import: the zygote that workers fork from imports this module, and a
    # driver initialised there (torch.cuda.is_available() runs cuInit) leaves its children without CUDA.
    if torch.cuda.is_initialized():
        st["cuda_device"] = torch.cuda.current_device()
        st["cuda_stream"] = torch.cuda.current_stream().cuda_stream
        st["allocator"] = torch.cuda.get_allocator_backend()
    return st


def _signal_handlers() -> list:
    """The Python-level handler of every signal a process can catch (the callable, or SIG_DFL/SIG_IGN/None)."""
    return [signal.getsignal(n) for n in sorted(signal.valid_signals()) if n not in _UNCATCHABLE]


def _armed_timers() -> list:
    """Which interval timers (real, virtual, profiling) are armed."""
    return [signal.getitimer(w) != (0.0, 0.0) for w in (signal.ITIMER_REAL, signal.ITIMER_VIRTUAL, signal.ITIMER_PROF)]


_UNCATCHABLE = {signal.SIGKILL, signal.SIGSTOP} if hasattr(signal, "SIGKILL") else set()


def _ask(obj, name: str, *args):
    """obj.name(*args) where this torch has it, else None (the fingerprint's entries differ across versions)."""
    fn = getattr(obj, name, None)
    try:
        return fn(*args) if fn is not None else None
    except Exception:  # noqa: BLE001 - a query this build cannot answer is not a change
        return None


def _state_change(st: State) -> str:
    if st.state0 is None:
        return ""
    now = process_state()
    diff = [f"{k} {st.state0.get(k)!r} -> {now.get(k)!r}" for k in sorted(set(now) | set(st.state0))
            if now.get(k) != st.state0.get(k) and k in st.state0]
    return "; ".join(diff)
