"""`tilesmith installed`"""

from __future__ import annotations

import datetime as _dt

import typer

from tilesmith_cli import console


def installed(
    as_json: bool = typer.Option(False, "--json", help="Print the result as JSON."),
) -> None:
    """List the artifacts in the store: graph, kind, speedup, environment, provenance, age."""
    from tilesmith import environment, store

    def go():
        return [(m, store.verify(m.key)) for m in store.list_installed()]

    entries = console.run_guarded(go, as_json)
    if as_json:
        console.print_json([{**m.to_dict(), "problem": problem} for m, problem in entries])
        return  # (the revoked ones: store.revoked(), revoked.jsonl beside the store)
    rows = []
    for m, problem in entries:
        p = m.provenance
        prov = " ".join(f"{k}={p[k]}" for k in ("optimizer", "model", "agency", "loops") if p.get(k) is not None)
        rows.append([m.key[:12], m.kind, f"{m.evidence.speedup:.3f}x [{m.evidence.speedup_low:.3f}, "
                     f"{m.evidence.speedup_high:.3f}]", environment.describe(m.environment),
                     f"{prov} run {p.get('run_id', '?')}", _age(m.installed), problem or "ok"])
    console.out.print(console.table(f"{len(rows)} artifact(s) installed",
                                    ["graph", "kind", "speedup", "environment", "provenance", "age", "check"], rows))
    gone = store.revoked()
    if gone:  # removed by a program's own check (TILESMITH_VERIFY): what and why
        console.out.print(console.table(f"{len(gone)} artifact(s) removed after a failed check in a program",
                                        ["graph", "when", "why"],
                                        [[g.get("key", "?")[:12], g.get("when", "?"), g.get("reason", "")] for g in gone]))


def _age(iso: str) -> str:
    try:
        s = (_dt.datetime.now(_dt.timezone.utc) - _dt.datetime.fromisoformat(iso)).total_seconds()
    except ValueError:
        return "?"
    for unit, n in (("d", 86400), ("h", 3600), ("m", 60)):
        if s >= n:
            return f"{int(s // n)}{unit}"
    return f"{int(s)}s"
