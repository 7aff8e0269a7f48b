"""install: only gate-accepted sources whose bytes still hash to what the gate judged get in.

The runs here are written by hand through runs.record_best: the verdict is input data to install
(the gate's own tests prove verdicts; test_runtime.py goes through the real gate)."""

from __future__ import annotations

import json

from tilesmith import runs, store
from tilesmith.install import install
from tilesmith.workspace import write_json

KEY = "12" * 32
ENV = {"torch": "2.13.0+cpu", "triton": None, "gpu": None, "machine": "x86_64", "numerics": {}}
SRC = "def call(args):\n    args.clear()\n    return ()\n"


def verdict(text: str, accepted: bool = True, low: float = 1.3) -> dict:
    timing = {"mode": "launch", "baseline_ms": 2.0, "candidate_ms": 1.5, "speedup": low + 0.05,
              "speedup_low": low, "speedup_high": low + 0.1, "samples": 40, "calls_per_sample": 3}
    sets = [{"name": "captured", "ok": True, "max_abs_error": 1e-7, "max_rel_error": 2e-7}]
    return {"accepted": accepted, "stage": "confirmation" if accepted else "timing", "graph_key": KEY,
            "candidate_sha256": store.sha256_bytes(text.encode()), "reasons": [] if accepted else
            [{"code": "not-faster", "message": "no"}], "min_improvement": 0.02,
            "first": {"seed": 0, "correctness": sets, "timing": timing},
            "confirmation": {"seed": 1, "correctness": sets, "timing": {**timing, "speedup_low": low + 0.01}}}


def make_run(tmp_path, text: str = SRC, accepted: bool = True, low: float = 1.3) -> str:
    gdir = tmp_path / "ws" / "graphs" / KEY
    gdir.mkdir(parents=True, exist_ok=True)
    write_json(gdir / "graph.json", {"key": KEY, "kind": "forward", "environment": ENV})
    rid = runs.new_run_id() + f"{low:.2f}".replace(".", "")
    runs.create_run({"optimizer": "tuner", "loops": 1}, str(tmp_path / "ws"), ENV, run_id=rid)
    if accepted:
        runs.record_best(rid, KEY, text, verdict(text, True, low), str(gdir), "forward", {"agency": "low"})
    else:
        runs.push_attempt(rid, KEY, text)
    return rid


def test_install_puts_an_accepted_source_into_the_store_byte_for_byte(tmp_path):
    rid = make_run(tmp_path)
    r = install(rid)
    assert [(g.status, g.speedup_low) for g in r.graphs] == [("installed", 1.3)]
    assert store.artifact_path(KEY).read_text() == SRC
    m = store.get(KEY)
    assert m.environment == ENV and m.kind == "forward"
    assert m.provenance["run_id"] == rid and m.provenance["optimizer"] == "tuner" and m.provenance["agency"] == "low"
    assert m.evidence.max_abs_error == 1e-7 and m.evidence.correctness_sets == 2 and m.evidence.mode == "launch"


def test_install_defaults_to_the_newest_run_and_keeps_what_is_already_there(tmp_path):
    make_run(tmp_path)
    assert install().graphs[0].status == "installed"
    again = install()
    assert again.graphs[0].status == "kept"


def test_install_skips_a_source_modified_after_the_gate_judged_it(tmp_path):
    rid = make_run(tmp_path)
    (runs.track_dir(rid, KEY) / "best.py").write_text(SRC + "print('sneaky')\n")
    g = install(rid).graphs[0]
    assert g.status == "skipped" and "do not hash" in g.reason
    assert store.get(KEY) is None


def test_install_skips_a_best_json_rewritten_to_match_bytes_the_gate_never_judged(tmp_path):
    rid = make_run(tmp_path)
    t = runs.track_dir(rid, KEY)
    (t / "best.py").write_text(SRC + "# changed\n")
    best = json.loads((t / "best.json").read_text())
    best["sha256"] = runs.sha256_file(t / "best.py")  # best.json agrees, the verdict does not
    write_json(t / "best.json", best)
    assert install(rid).graphs[0].status == "skipped"
    assert store.get(KEY) is None


def test_install_skips_a_verdict_that_is_not_accepted(tmp_path):
    rid = make_run(tmp_path)
    t = runs.track_dir(rid, KEY)
    best = json.loads((t / "best.json").read_text())
    best["verdict"]["accepted"] = False
    write_json(t / "best.json", best)
    g = install(rid).graphs[0]
    assert g.status == "skipped" and "not accepted" in g.reason


def test_install_reports_a_track_without_an_accepted_source_as_skipped(tmp_path):
    rid = make_run(tmp_path, accepted=False)
    g = install(rid).graphs[0]
    assert (g.key, g.status) == (KEY, "skipped") and "no accepted source" in g.reason


def test_install_replaces_only_with_better_evidence_unless_forced(tmp_path):
    install(make_run(tmp_path, low=1.5))
    worse = make_run(tmp_path, text=SRC + "# other\n", low=1.2)
    assert install(worse).graphs[0].status == "kept"
    assert install(worse, dry_run=True, force=True).graphs[0].status == "would-replace"
    assert store.get(KEY).evidence.speedup_low == 1.5
    assert install(worse, force=True).graphs[0].status == "replaced"
    assert store.artifact_path(KEY).read_text() == SRC + "# other\n"
