"""tilesmith.replay.native: the lean replay's address check in C, compiled here for real against this torch. It
gives the Python check's answers (through _Record.ptrs_ok, the path the replay takes), says False for
anything it cannot vouch for, and a missing, failed or broken build is a reason in status(), never an
error: the replay then checks in Python."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from tilesmith.replay import native, record as cudagraph_record  # noqa: E402


def _reset(monkeypatch, d):
    """native's per-process state reset, its cache in `d`; both restored after the test."""
    monkeypatch.setenv("TILESMITH_NATIVE_DIR", str(d))
    for name in ("_same", "_status", "_tried"):
        monkeypatch.setattr(native, name, getattr(native, name))
    native._tried = False


@pytest.fixture
def fresh(monkeypatch, tmp_path):
    _reset(monkeypatch, tmp_path / "native")
    return tmp_path / "native"


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """One real build for the module (about 20 s: torch's headers)."""
    d = tmp_path_factory.mktemp("native")
    mp = pytest.MonkeyPatch()
    mp.setenv("TILESMITH_NATIVE_DIR", str(d))
    try:
        path, what = native.build()
        assert path is not None and path.exists() and what.startswith("built: "), what
        yield d, path
    finally:
        mp.undo()


def _load(monkeypatch, d):
    _reset(monkeypatch, d)
    return native.same_ptrs()


def test_without_a_build_the_check_is_pythons_and_status_says_how_to_build(fresh):
    assert native.same_ptrs() is None
    s = native.status()
    assert "not built for this torch and Python" in s and "tilesmith install" in s, s
    assert not fresh.exists()  # loading never builds


def test_a_build_is_made_once_and_loaded_and_its_check_answers_as_data_ptr_does(built, monkeypatch):
    d, path = built
    monkeypatch.setenv("TILESMITH_NATIVE_DIR", str(d))
    again, what = native.build()
    assert again == path and what.startswith("built already"), what
    same = _load(monkeypatch, d)
    assert same is not None and native.status() == f"C ({path})"

    xs = [torch.randn(4), torch.randn(2, 3).t(), torch.nn.Parameter(torch.randn(5)), torch.zeros(())]
    want = native.pack([x.data_ptr() for x in xs])
    assert same(xs, want) is True
    assert same(xs[:3] + [torch.zeros(())], want) is False  # one tensor elsewhere
    assert same(xs[:3], want) is False and same(xs + [xs[0]], want) is False  # another count
    assert same(xs[:3] + [0.5], want) is False  # a non-tensor where a tensor was
    view = xs[0][1:]
    assert same([view], native.pack([view.data_ptr()])) is True  # a view: its own first element's address
    p = xs[2]
    p.data = torch.randn(5)  # the same Parameter object over new memory, as module.to() does
    assert same(xs, want) is False
    with pytest.raises(TypeError):
        same(tuple(xs), want)  # the replay passes a list; anything else is a caller's bug, said loudly
    with pytest.raises(TypeError):
        same(xs)


def test_the_replays_ptrs_ok_gives_the_same_answers_in_c_and_in_python(built, monkeypatch):
    d, _ = built
    same = _load(monkeypatch, d)
    xs = [torch.randn(3) for _ in range(51)]
    rec = cudagraph_record._Record.__new__(cudagraph_record._Record)
    rec.ptrs = rec.all_ptrs = [x.data_ptr() for x in xs]
    rec.packed = native.pack(rec.all_ptrs)
    rec.static_idx = list(range(len(xs)))
    moved = list(xs)
    moved[37] = torch.randn(3)
    cases = {"unchanged": list(xs), "one moved": moved, "reversed": xs[::-1]}
    answers = {}
    for check in (same, None):
        monkeypatch.setattr(cudagraph_record, "_same_ptrs", check)
        answers[check is not None] = {k: rec.ptrs_ok(v) for k, v in cases.items()}
    assert answers[True] == answers[False] == {"unchanged": True, "one moved": False, "reversed": False}


def test_a_broken_build_is_a_reason_not_an_error(fresh):
    fresh.mkdir(parents=True)
    native.path().write_bytes(b"not a shared object")
    assert native.same_ptrs() is None
    assert native.status().startswith("not loaded: ImportError"), native.status()


@pytest.mark.parametrize("cxx,why", [("false", "false failed (exit 1)"), ("/nonexistent/c++", "no C++ compiler")])
def test_a_failed_compile_is_said_and_leaves_nothing_behind(fresh, monkeypatch, cxx, why):
    monkeypatch.setenv("CXX", cxx)
    path, what = native.build()
    assert path is None and what.startswith(why), what
    assert list(fresh.iterdir()) == []  # no half-written build that a later load would trust
    assert native.same_ptrs() is None
