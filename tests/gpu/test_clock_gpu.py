"""tilesmith.gate.clock on CUDA: the device of CUDA arguments, and a sync that waits for every stream."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from tilesmith.gate import clock  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def test_device_of_cuda_arguments_names_the_device_index():
    assert clock.device_of([1, torch.ones(2, device="cuda")]) == f"cuda:{torch.cuda.current_device()}"


def test_device_sync_waits_for_work_queued_on_a_side_stream():
    a = torch.randn(4096, 4096, device="cuda")
    side = torch.cuda.Stream()
    done = torch.cuda.Event()
    with torch.cuda.stream(side):
        for _ in range(20):
            a = a @ a / 64.0
        done.record(side)
    clock.device_sync("cuda")()
    assert done.query()  # device-wide: the side stream's work finished too


def test_timed_covers_a_queued_kernel_not_just_its_launch():
    a = torch.randn(2048, 2048, device="cuda")
    sync = clock.device_sync("cuda")
    out = []
    clock.timed(lambda: a @ a, 3, sync, after_call=lambda i, r: out.append(r))
    ev = torch.cuda.Event()
    ev.record()
    assert ev.query() and len(out) == 3  # nothing of the timed calls was left running after the window
