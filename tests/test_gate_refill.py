"""The parent's own refill of a CPU worker's buffers (tilesmith/gate/refill.py): the values it writes into a process's
memory are, bit for bit, those the worker's own refill (worker.sample._set_content) gives the same buffers, which the
original's checks rebuild; and what it cannot write is the candidate's failure."""

from __future__ import annotations

import os
import sys
from types import SimpleNamespace

import pytest
import torch

from tilesmith.capture.tensors import span_numel
from tilesmith.gate import refill
from tilesmith.gate.worker.sample import _set_content
from tilesmith.gate.worker.state import State
from tilesmith.gate.worker.tensors import _to_device

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/PID/mem: Linux")

META = {"inputs": [{}, {}, {"range": {"min": 3, "max": 40}}, {}, {"parameter": True}, {"parameter": True}, {},
                   {"range": {"min": 0, "max": 1}}, {}],
        "mutated_inputs": [5]}


def _contents(k: int) -> list:
    g = torch.Generator().manual_seed(k)
    wide = torch.randn(6, 10, generator=g)
    return [torch.randn(4, 5, generator=g),
            wide[:, ::3],  # strided, with gaps in its span
            torch.randint(3, 41, (7,), generator=g),
            torch.randn(9, generator=g).to(torch.bfloat16),
            torch.randn(3, 3, generator=g),  # a parameter: one buffer in every set
            torch.randn(5, generator=g),  # a parameter the graph updates in place: set 0 gets its content back
            torch.randn(2, 2, generator=g, dtype=torch.complex64),
            torch.randint(0, 2, (6,), generator=g).bool(),
            torch.empty(0, 3)]


def _buffers(contents: list, shared: set, n: int) -> list:
    """The worker's buffer sets as its timing setup makes them (worker.setup.op_time_setup)."""
    bufs = []
    for b in range(n):
        bufs.append([bufs[0][i] if b and i in shared else _to_device(x, "cpu") for i, x in enumerate(contents[b % len(contents)])])
    return bufs


def _spans(bufs: list) -> list:
    return [[bytes(x.as_strided((span_numel(x),), (1,), 0).view(torch.uint8).numpy()) if span_numel(x) else b""
             for x in s] for s in bufs]


@pytest.mark.parametrize("perturb", [None, 12345678901])
def test_the_parent_writes_the_values_the_workers_own_refill_gives(perturb):
    contents = [_contents(k) for k in range(3)]
    shared = {4, 5}
    st = State()
    st.data, st.shared = SimpleNamespace(meta=META), shared
    st.pool["candidate"] = [[_to_device(x, "cpu") for x in c] for c in contents]
    theirs, ours = _buffers(contents, shared, 4), _buffers(contents, shared, 4)
    for s in ours:  # the parent's write must not lean on what a buffer held before
        for x in s:
            if span_numel(x):
                x.as_strided((span_numel(x),), (1,), 0).view(torch.uint8).fill_(0xAB)
    fill = [2, 0, 1, 2]
    for b, c in enumerate(fill):
        _set_content(st, theirs[b], st.pool["candidate"][c], perturb, b)
    addresses = [[x.data_ptr() if isinstance(x, torch.Tensor) else 0 for x in s] for s in ours]
    written = refill.Refill(contents, META).write(os.getpid(), addresses, fill, perturb)
    assert written > 0
    want, got = _spans(theirs), _spans(ours)
    for b in range(4):
        for i in range(len(contents[0])):
            if i in shared and b:  # one buffer: compared at set 0
                continue
            if i == 4:  # a parameter not updated: neither refill touches it
                continue
            assert got[b][i] == want[b][i], (b, i)
    if perturb is not None:  # new values, not the pool's: the perturbation was applied
        assert got[0][0] != _spans([[_to_device(contents[2][0], "cpu")]])[0][0]


def test_a_buffer_set_without_its_addresses_or_with_an_unmapped_one_is_unwritable():
    contents = [_contents(0)]
    r = refill.Refill(contents, META)
    with pytest.raises(refill.Unwritable, match="do not cover"):
        r.write(os.getpid(), [], [0], 1)
    with pytest.raises(refill.Unwritable, match="addresses for"):
        r.write(os.getpid(), [[1, 2]], [0], 1)
    with pytest.raises(refill.Unwritable, match="is not one"):
        r.write(os.getpid(), [[0] * len(contents[0])], [0], 1)
    with pytest.raises(refill.Unwritable, match="could not be written"):
        r.write(os.getpid(), [[4096] * len(contents[0])], [0], 1)
