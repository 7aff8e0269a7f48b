"""Every TILESMITH_* setting a user gives tilesmith through the environment, read in one place (docs/settings.md
says what each does; tests/test_settings.py holds the two together).

`current()` reads them all into one frozen Settings. It reads the environment afresh at each call, as each module
did before, so a program (or a test) that sets a variable sees it at the next use. A value that is not one of
those allowed is a usage error where the setting is used, not where another one is read: such settings are
properties that check the text as given. Standard library only: the runtime reads it.

Not here: the variables tilesmith sets for the processes it starts (TILESMITH_GATE_DEVICE,
TILESMITH_GATE_HEADER_DIR, TILESMITH_INDUCTOR_DEFAULT_DIR, TILESMITH_GRAPH_DIR), which those processes read;
TILESMITH_RUNTIME, which the .pth file installed with the package reads at interpreter start-up, before tilesmith
can be imported (it is a field here all the same); and TILESMITH_MIN_IMPROVEMENT, which gate/verdict.py reads.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from tilesmith.errors import TilesmithError

# field -> the variable it is read from
VARIABLES = {
    "home": "TILESMITH_HOME", "runtime": "TILESMITH_RUNTIME", "runtime_quiet": "TILESMITH_RUNTIME_QUIET",
    "runtime_verbose": "TILESMITH_RUNTIME_VERBOSE", "runtime_strict": "TILESMITH_RUNTIME_STRICT",
    "verify": "TILESMITH_VERIFY", "model": "TILESMITH_MODEL", "model_wait_s": "TILESMITH_MODEL_WAIT_S",
    "web_search": "TILESMITH_WEB_SEARCH", "sandbox": "TILESMITH_SANDBOX", "fork_workers": "TILESMITH_FORK_WORKERS",
    "gate_spares": "TILESMITH_GATE_SPARES", "relower": "TILESMITH_RELOWER", "relower_only": "TILESMITH_RELOWER_ONLY",
    "native_dir": "TILESMITH_NATIVE_DIR", "debug": "TILESMITH_DEBUG", "rewrites": "TILESMITH_REWRITES",
    "in_place": "TILESMITH_IN_PLACE", "gate_refill": "TILESMITH_GATE_REFILL", "gate_busy": "TILESMITH_GATE_BUSY",
}
# Whether graphs that update their inputs in place (running statistics, optimizer steps, KV caches) are optimized
# when TILESMITH_IN_PLACE is unset. On since `make gpu-smoke` passed with them on an H100 (the training flow's 4 graphs
# accepted, installed and substituted with the program's checksum unchanged; the gate's corpus, optimizer steps
# included, at 0 false rejections: benchmarks/RESULTS.md). TILESMITH_IN_PLACE=0 leaves such graphs to Inductor.
IN_PLACE_DEFAULT = True
GATE_REFILL_DEFAULT = False  # on needs a GPU smoke of the code that turns it on (not run yet)
# A CPU pass undecided at its budget on a busy machine goes on, up to 3x (gate/timing.py _budget_s). On by default since
# beside two CPU hogs a genuine 1.35x win was shown in 15 of 24 decisions without it (benchmarks/RESULTS.md); CUDA
# passes keep their budget either way. TILESMITH_GATE_BUSY=0 turns it off.
GATE_BUSY_DEFAULT = True


@dataclass(frozen=True)
class Settings:
    """The TILESMITH_* variables as tilesmith reads them (see docs/settings.md). A switch is on for any value but
    empty and `0`; text is kept as given where a module reads it further (stripped, lower case where noted)."""

    home: Path  # TILESMITH_HOME, absolute; default ~/.cache/tilesmith
    runtime: bool  # load the runtime at interpreter start-up (the .pth file reads it itself)
    runtime_quiet: bool  # no line at exit about what the runtime substituted
    runtime_verbose: bool  # one line per graph the runtime loads from the store
    runtime_strict: bool  # an installed artifact that cannot be used is an error, not a warning
    verify: str  # calls of each substituted graph to verify, as given (runtime/verify.py reads the number)
    model: str | None  # the agent's model; None when unset
    model_wait_s: str  # seconds to wait for a gateway to list the model, as given; default "60"
    web_search: str  # auto | on | off as given, lower case; default auto (web_search_mode checks it)
    sandbox: str  # auto | off | require as given, lower case; default auto (sandbox_mode checks it)
    fork_workers: str  # auto | on | off as given, lower case; default auto (fork_mode checks it)
    gate_spares: str | None  # gate workers started ahead, as given; None when unset (gate/spares.py reads the number)
    relower: str  # auto | 1/on/true | 0/off/false, as given; default auto
    relower_only: str  # comma-separated words; "" keeps every variant
    native_dir: str | None  # where the replay's C address check is built; None or "" for the default
    debug: bool  # the CLI prints the traceback of an unexpected error (any non-empty value)
    rewrites: str  # the tuner's graph rewrites: "" (off, the default), 1/all, or names (search/rewrites reads it)
    in_place: bool  # capture makes graphs that update their inputs in place eligible (default IN_PLACE_DEFAULT)
    gate_refill: bool  # the gate writes a CPU sample's inputs into the stopped worker, timed from there (default off)
    gate_busy: bool  # a CPU pass undecided at its budget goes on, up to 3x, on a busy machine (default on)

    @property
    def sandbox_mode(self) -> str:
        return _one_of("TILESMITH_SANDBOX", self.sandbox, ("auto", "off", "require"),
                       "unset it, or set it to auto, off or require")

    @property
    def fork_mode(self) -> str:
        return _one_of("TILESMITH_FORK_WORKERS", self.fork_workers, ("auto", "on", "off"),
                       "unset it, or set it to auto, on or off")

    @property
    def web_search_mode(self) -> str:
        return _one_of("TILESMITH_WEB_SEARCH", self.web_search, ("auto", "on", "off"),
                       "auto (default): web search on api.openai.com only; on: also through a gateway")


def current(environ=None) -> Settings:
    """The settings as the environment (os.environ, or `environ`) holds them now."""
    env = os.environ if environ is None else environ
    raw = {field: env.get(name) for field, name in VARIABLES.items()}
    home = raw["home"] or Path.home() / ".cache" / "tilesmith"
    return Settings(
        home=Path(os.path.abspath(os.path.expanduser(os.fspath(home)))),
        runtime=_switch(raw["runtime"]), runtime_quiet=_switch(raw["runtime_quiet"]),
        runtime_verbose=_switch(raw["runtime_verbose"]), runtime_strict=_switch(raw["runtime_strict"]),
        verify=(raw["verify"] or "").strip(), model=raw["model"],
        model_wait_s=raw["model_wait_s"] if raw["model_wait_s"] is not None else "60",
        web_search=_word(raw["web_search"]), sandbox=_word(raw["sandbox"]), fork_workers=_word(raw["fork_workers"]),
        gate_spares=raw["gate_spares"], relower=raw["relower"] if raw["relower"] is not None else "auto",
        relower_only=raw["relower_only"] or "", native_dir=raw["native_dir"], debug=bool(raw["debug"]),
        rewrites=(raw["rewrites"] or "").strip(),
        in_place=_switch(raw["in_place"]) if (raw["in_place"] or "").strip() else IN_PLACE_DEFAULT,
        gate_refill=_switch(raw["gate_refill"]) if (raw["gate_refill"] or "").strip() else GATE_REFILL_DEFAULT,
        gate_busy=_switch(raw["gate_busy"]) if (raw["gate_busy"] or "").strip() else GATE_BUSY_DEFAULT)


def _switch(value: str | None) -> bool:
    return (value or "").strip() not in ("", "0")


def _word(value: str | None) -> str:
    return (value or "").strip().lower() or "auto"


def _one_of(name: str, value: str, allowed: tuple, hint: str) -> str:
    if value not in allowed:
        raise TilesmithError(f"{name}={value!r} is not one of {', '.join(allowed)}", code="usage", hint=hint)
    return value
