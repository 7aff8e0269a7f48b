"""The built-in skills agree with the gate: every code block a skill shows is tagged, each `allowed`
block passes the static screen and each `rejected-static` block fails it; pinned-config rewrites are
exactly the tuner's route; a rewrite tagged as taken from a real wrapper is found in a real capture
and, applied there, passes the gate's check."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from tilesmith.gate.static import screen
from tilesmith.search import kernels as K

SKILLS = Path(__file__).resolve().parent.parent / "tilesmith" / "skills"
BLOCK = re.compile(r"^```(\w*)([^\n]*)\n(.*?)^```", re.M | re.S)
TAGS = {"allowed", "rejected-static"}


def blocks() -> list[dict]:
    out = []
    for f in sorted(SKILLS.glob("*/SKILL.md")):
        for m in BLOCK.finditer(f.read_text()):
            lang, words = m.group(1), m.group(2).split()
            tags = {w for w in words if "=" not in w}
            attrs = dict(w.split("=", 1) for w in words if "=" in w)
            out.append({"skill": f.parent.name, "lang": lang, "tags": tags, "code": m.group(3), **attrs})
    return out


def pairs(**match) -> dict[str, tuple[str, str]]:
    found: dict[str, dict] = {}
    for b in blocks():
        if "id" in b and all(b.get(k) == v for k, v in match.items()):
            found.setdefault(b["id"], {})[b["role"]] = b["code"]
    return {k: (v["before"], v["after"]) for k, v in found.items()}


def test_every_python_block_in_the_skills_is_tagged_and_the_static_screen_agrees_with_its_tag():
    py = [b for b in blocks() if b["lang"] == "python"]
    assert len(py) >= 15 and {b["skill"] for b in py} >= {"worked-rewrites", "cuda-extensions", "inductor-wrapper-abi"}
    for b in py:
        (tag,) = b["tags"] & TAGS or {None}
        assert tag, f"untagged python block in {b['skill']}: {b['code'][:80]!r}"
        # A fragment defines no call(args) of its own; everything else the screen says counts.
        codes = [f.code for f in screen(b["code"]) if f.code != "static-no-call"]
        if tag == "allowed":
            assert codes == [], (b["skill"], b.get("id"), codes)
        else:
            assert codes and "static-syntax" not in codes, (b["skill"], codes)
    assert any("static-native" in [f.code for f in screen(b["code"])] for b in py if "rejected-static" in b["tags"])


def test_the_worked_rewrites_are_six_before_after_pairs():
    got = pairs(skill="worked-rewrites")
    assert set(got) == {"graphed", "epilogue", "fuse", "single-pass", "transpose", "pin"}
    for before, after in got.values():
        assert before != after


def test_no_skill_teaches_a_route_the_gate_rejects():
    text = "\n".join(f.read_text() for f in SKILLS.glob("*/SKILL.md"))
    assert "load_inline` at module level) are fine" not in text and "unless the agency level and tolerances" not in text
    assert "replace the heuristic list with a single" not in text  # the old pinning recipe
    assert "fixed_config" in (SKILLS / "triton-performance" / "SKILL.md").read_text()


@pytest.mark.parametrize("rid", ["pin", "single-pass"])
def test_a_pinned_config_rewrite_is_exactly_what_the_tuners_fixed_config_route_writes(rid):
    before, after = pairs(skill="worked-rewrites")[rid]
    (k,) = K.find_kernels(before)
    (ka,) = K.find_kernels(after)
    call = re.search(r"@triton_heuristics\.fixed_config\((\{.*?\}), filename", ka.code).group(1)
    cfg = ast.literal_eval(call)
    warps, stages = cfg.pop("num_warps"), cfg.pop("num_stages")
    assert K.replace_kernel(before, k, K.with_fixed_config(k.code, cfg, warps, stages)) == after
    assert k.params["heuristic"] in ("pointwise", "reduction") and set(cfg) == set(k.params["blocks"])


def test_a_rewrite_taken_from_a_real_wrapper_applies_to_the_capture_and_passes_the_gates_check(inference_ws, tmp_path):
    from tilesmith.gate import judge
    from tilesmith.gate.verdict import Policy

    real = pairs(real="inference-cpu")
    assert "graphed" in real
    graph = max((ws for ws in (inference_ws / "graphs").iterdir()), key=lambda g: len((g / "wrapper.py").read_text()))
    text = (graph / "wrapper.py").read_text()
    for rid, (before, after) in real.items():
        assert before in text, f"{rid}: the before block is not in the captured wrapper"
        rewritten = text.replace(before, after, 1)
        assert [f.code for f in screen(rewritten)] == []
        cand = tmp_path / f"{rid}.py"
        cand.write_text(rewritten)
        v = judge(graph, cand, Policy(correctness_only=True, confirm=False, random_sets=2))
        assert v.checked_only and not v.accepted and v.reasons == [] and v.stage == "correctness", v.reasons
        assert v.first.correctness and all(c.ok for c in v.first.correctness)
