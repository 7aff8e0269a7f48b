"""Machine-wide CPU leases for CPU graphs' timing (tilesmith/gate/cpulease.py): two timings at once pin to different
CPUs, a timing takes all the CPUs it needs or none, and one that finds none free waits, then goes on."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tilesmith.gate import cpulease

ROOT = Path(__file__).resolve().parents[1]


def test_two_timings_lease_different_cpus_and_a_third_waits_then_goes_on(tmp_path, monkeypatch):
    monkeypatch.setattr(cpulease, "lease_dir", lambda: tmp_path)
    waits = []
    monkeypatch.setattr(cpulease.time, "sleep", lambda s: waits.append(s))
    with cpulease.leased([1, 0], 1) as a, cpulease.leased([1, 0], 1) as b:
        assert (a, b) == ([1], [0]) and not waits
        with cpulease.leased([1, 0], 1, timeout_s=0.2) as c:  # none free: it polled, then went on unleased
            assert c == [1] and waits
    with cpulease.leased([1, 0], 2) as both:  # released on leaving: all free again
        assert both == [0, 1]


def test_a_timing_takes_all_it_needs_or_none(tmp_path):
    held = cpulease._try(tmp_path, 1, [1])
    assert [c for c, _ in held] == [1]
    assert cpulease._try(tmp_path, 2, [1, 0]) == []  # one of two free: none kept
    other = cpulease._try(tmp_path, 1, [0])
    assert [c for c, _ in other] == [0]  # so cpu 0 was not held while the first asked for two
    for _, f in held + other:
        f.close()


def test_a_lease_is_held_against_another_process_and_dropped_when_its_holder_dies(tmp_path):
    code = ("import sys, time\nfrom pathlib import Path\nfrom tilesmith.gate import cpulease\n"
            f"cpulease.lease_dir = lambda: Path({str(tmp_path)!r})\n"
            "with cpulease.leased([3], 1):\n    print('held', flush=True)\n    time.sleep(60)\n")
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        assert p.stdout.readline().strip() == "held"
        assert cpulease._try(tmp_path, 1, [3]) == []
    finally:
        p.kill()
        p.wait()
    held = cpulease._try(tmp_path, 1, [3])
    assert [c for c, _ in held] == [3]
    held[0][1].close()
