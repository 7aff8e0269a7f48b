"""The TILESMITH_* settings, read in one place (tilesmith/settings.py): each documented in docs/settings.md, read
afresh at each call, switches on for any value but empty and `0`, and a bad choice an error only where that
setting is used."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tilesmith import paths, settings
from tilesmith.errors import TilesmithError

ROOT = Path(__file__).resolve().parent.parent


def test_every_setting_is_read_from_a_variable_docs_settings_documents():
    documented = set(re.findall(r"`(TILESMITH_[A-Z0-9_]+)`", (ROOT / "docs" / "settings.md").read_text()))
    assert set(settings.VARIABLES.values()) <= documented
    assert set(settings.VARIABLES) == set(settings.Settings.__dataclass_fields__)


def test_settings_are_read_afresh_from_the_environment_at_each_call(monkeypatch, tmp_path):
    monkeypatch.setenv("TILESMITH_HOME", str(tmp_path / "one"))
    assert settings.current().home == tmp_path / "one" == paths.home()
    monkeypatch.setenv("TILESMITH_HOME", str(tmp_path / "two"))
    assert settings.current().home == tmp_path / "two" == paths.home()
    monkeypatch.delenv("TILESMITH_HOME")
    assert settings.current().home == Path.home() / ".cache" / "tilesmith"


def test_a_switch_is_on_for_any_value_but_empty_and_zero():
    on = [settings.current({"TILESMITH_RUNTIME_STRICT": v}).runtime_strict for v in ("1", "yes", " true ", "no")]
    off = [settings.current({"TILESMITH_RUNTIME_STRICT": v}).runtime_strict for v in ("", " ", "0", " 0 ")]
    assert all(on) and not any(off) and not settings.current({}).runtime_strict


def test_unset_settings_take_their_documented_defaults():
    s = settings.current({})
    assert (s.sandbox_mode, s.fork_mode, s.web_search_mode, s.relower, s.relower_only) == ("auto", "auto", "auto",
                                                                                             "auto", "")
    assert (s.model, s.gate_spares, s.native_dir, s.model_wait_s, s.verify, s.debug) == (None, None, None, "60", "",
                                                                                         False)
    assert s.rewrites == ""  # the tuner's graph rewrites are off unless TILESMITH_REWRITES turns them on
    assert s.in_place is settings.IN_PLACE_DEFAULT
    assert s.gate_refill is False  # the parent refills CPU samples where TILESMITH_GATE_REFILL=1 turns it on
    assert settings.current({"TILESMITH_GATE_REFILL": "0"}).gate_refill is False
    assert settings.current({"TILESMITH_GATE_REFILL": "1"}).gate_refill is True
    assert s.gate_busy is True  # a busy machine's longer CPU pass, unless TILESMITH_GATE_BUSY=0 turns it off
    assert settings.current({"TILESMITH_GATE_BUSY": "0"}).gate_busy is False
    assert settings.current({"TILESMITH_IN_PLACE": "0"}).in_place is False
    assert settings.current({"TILESMITH_IN_PLACE": "1"}).in_place is True


def test_a_bad_choice_is_a_usage_error_only_where_that_setting_is_used():
    s = settings.current({"TILESMITH_SANDBOX": " Sometimes ", "TILESMITH_HOME": "/tmp/h"})
    assert s.home == Path("/tmp/h") and s.fork_mode == "auto"  # the other settings read as usual
    with pytest.raises(TilesmithError, match="TILESMITH_SANDBOX='sometimes' is not one of auto, off, require") as e:
        s.sandbox_mode
    assert e.value.code == "usage" and e.value.hint == "unset it, or set it to auto, off or require"
