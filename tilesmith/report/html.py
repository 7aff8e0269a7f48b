"""`render_html(report)`: one self-contained page for a Report: inline CSS, inline SVG drawn here, one
small inline script; nothing loaded from the network. Every number shown also sits, unrounded, in a
data-* attribute (repr of the same float the JSON holds), so a test can compare the page to the JSON.
"""

from __future__ import annotations

import html
import math

from tilesmith.report.rows import BANDWIDTH_COLUMN, BANDWIDTH_NOTE, Report, rate_text

_CSS = """
body{font:14px/1.45 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:24px auto;max-width:1100px;color:#1d2330;padding:0 16px}
h1{font-size:22px;margin:0 0 4px}h2{font-size:17px;margin:28px 0 8px;border-bottom:1px solid #dde;padding-bottom:4px}
.muted{color:#667}.note{background:#fff8e1;border-left:3px solid #f0b400;padding:6px 10px;margin:6px 0}
table{border-collapse:collapse;margin:8px 0;width:100%}th,td{border-bottom:1px solid #e5e7ef;padding:4px 8px;text-align:left;vertical-align:top}
th{background:#f4f5fa;font-weight:600}td.num{text-align:right;font-variant-numeric:tabular-nums}
.cards{display:flex;gap:12px;flex-wrap:wrap}.card{border:1px solid #dde;border-radius:6px;padding:10px 14px;min-width:180px}
.card b{display:block;font-size:20px}svg.chart{display:block;max-width:100%;height:auto;background:#fbfbfe;border:1px solid #e5e7ef;border-radius:6px;margin:8px 0}
svg text{font:12px system-ui,sans-serif;fill:#1d2330}code{font-size:12px}
"""

# After layout: record each chart's rendered size and mark count, so a headless browser's DOM dump
# proves the charts were laid out (not just present in the source). The facts go into an attribute
# of a hidden element: they are for tests, not for the reader.
_SCRIPT = """
(function(){
  var facts = {charts: {}};
  document.querySelectorAll('svg.chart').forEach(function(s){
    var r = s.getBoundingClientRect();
    var marks = s.querySelectorAll('[data-mark]').length;
    facts.charts[s.id] = {width: r.width, height: r.height, marks: marks};
    s.setAttribute('data-rendered-width', String(r.width));
    s.setAttribute('data-rendered-height', String(r.height));
  });
  var el = document.getElementById('layout-facts');
  el.setAttribute('data-facts', JSON.stringify(facts));
  el.setAttribute('data-done', '1');
})();
"""

_PALETTE = ["#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1", "#9c755f", "#bab0ac"]
_W = 1000  # chart width in px (viewBox units == px)


def render_html(report: Report) -> str:
    """The report as one HTML page with three charts; opens in a browser with no network."""
    r = report
    parts = [f"<!doctype html><html lang='en'><head><meta charset='utf-8'><title>tilesmith report {_e(r.run_id)}</title>",
             f"<style>{_CSS}</style></head><body>",
             f"<h1>tilesmith report <code id='run-id'>{_e(r.run_id)}</code></h1>",
             f"<div class='muted'>status <b id='run-status'>{_e(r.status)}</b> · optimizer {_e(r.optimizer or '?')}"
             f" · {_e(r.created or '?')} → {_e(r.ended or '—')} · workspace <code>{_e(r.workspace or '?')}</code>"
             f" · {_e(_env(r.environment))}</div>"]
    from tilesmith.report.build import agent_budgets

    if agent_budgets(r.settings):
        parts.append(f"<div class='muted' id='agent-budgets'>{_e(agent_budgets(r.settings))}</div>")
    parts += [f"<div class='note'>{_e(n)}</div>" for n in r.notes]
    parts.append(_program(r))
    parts.append(_setting(r))
    parts.append("<h2>Speedup per graph</h2><p class='muted'>original ÷ best accepted; whiskers: the confidence "
                 "interval; dashed line: 1× (no change).</p>")
    parts.append(_speedup_chart(r))
    parts.append(_graph_table(r))
    parts.append("<h2>Candidates over time</h2><p class='muted'>each point is one gate verdict, at the time it was "
                 "written; y: its speedup over the source that was best when it was judged. Filled green: accepted; "
                 "grey ×: rejected (bottom row: rejected before timing).</p>")
    parts.append(_candidates_chart(r))
    parts.append(_candidates_table(r))
    parts.append("<h2>Kernel time per graph</h2><p class='muted'>one call of Inductor's wrapper, from the baseline "
                 "profile: each kernel's time, other kernels, and launch overhead (wall minus kernel time).</p>")
    parts.append(_kernel_chart(r))
    parts.append(_kernel_tables(r))
    parts.append("<div id='layout-facts' hidden></div>")
    parts.append(f"<script>{_SCRIPT}</script></body></html>")
    return "\n".join(parts)


def _program(r: Report) -> str:
    p = r.program
    if p is None:
        return "<h2>Whole program</h2><p id='program' data-present='0'>no graph of this run has a baseline measurement</p>"
    cards = [("baseline (estimate)", "baseline-ms", p.baseline_ms, _ms(p.baseline_ms)),
             ("with accepted graphs", "optimized-ms", p.optimized_ms, _ms(p.optimized_ms)),
             ("speedup (estimate)", "speedup", p.speedup, f"{p.speedup:.3f}×"),
             ("speedup, low end", "speedup-low", p.speedup_low, f"≥ {p.speedup_low:.3f}×")]
    html_cards = "".join(f"<div class='card'>{_e(label)}<b id='program-{i}' data-value='{_v(v)}'>{_e(text)}</b></div>"
                         for label, i, v, text in cards)
    return (f"<h2>Whole program</h2><div id='program' data-present='1' data-graphs-improved='{p.graphs_improved}'>"
            f"<div class='cards'>{html_cards}</div><p class='muted'>{_e(p.note)}. "
            f"{p.graphs_improved} of {p.graphs_measured} measured graph(s) improved.</p></div>")


def _setting(r: Report) -> str:
    """Which setting wins (setting.py): the program's line, the change, one row per graph."""
    s = r.setting
    if s is None:
        return ""
    rows = [f"<tr data-key='{_e(g.key)}'><td><code title='{_e(g.key)}'>{_e(g.key[:12])}</code></td>"
            f"<td data-field='compile_mode'>{_e(g.compile_mode or '?')}</td><td>{_e(g.device or '?')}</td>"
            f"<td data-field='setting' data-winner='{_e(g.setting.winner)}' data-speedup='{_v(g.setting.speedup)}' "
            f"data-low='{_v(g.setting.speedup_low)}'>{_e(g.setting.statement)}</td></tr>"
            for g in r.graphs if g.setting is not None]
    note = f"<p class='muted'>{_e(s.note)}.</p>" if s.note else ""
    return (f"<h2>Setting: who replays each graph</h2><p id='setting' data-graphs-cudagraphs='{s.graphs_cudagraphs}' "
            f"data-tilesmith-replay-wins='{s.tilesmith_replay_wins}'>{_e(s.statement)}</p>"
            f"<p id='setting-change'><b>change:</b> {_e(s.change)}</p>{note}"
            + _table("setting", ["graph", "compile mode", "device", "setting"], rows))


def _speedup_chart(r: Report) -> str:
    rows = [g for g in r.graphs if g.status not in ("not in run", "ineligible")]
    top = max([1.0] + [x for g in rows for x in (g.speedup, g.speedup_high) if x]) * 1.15
    left, right, rh = 150, 80, 30
    h = 40 + rh * max(1, len(rows))
    x = lambda v: left + (_W - left - right) * v / top  # noqa: E731
    out = [f"<svg class='chart' id='chart-speedup' width='{_W}' height='{h}' viewBox='0 0 {_W} {h}' "
           "xmlns='http://www.w3.org/2000/svg' role='img' aria-label='speedup per graph'>"]
    for i, g in enumerate(rows):
        y = 20 + i * rh
        out.append(f"<text x='8' y='{y + 17}'>{_e(g.key[:12])}</text>")
        if g.speedup is None:
            out.append(f"<text x='{left + 4}' y='{y + 17}' class='muted' data-mark='none' data-key='{_e(g.key)}'>"
                       f"no accepted candidate ({_e(g.status)})</text>")
            continue
        lo, hi = g.speedup_low or g.speedup, g.speedup_high or g.speedup
        out.append(f"<rect data-mark='bar' data-key='{_e(g.key)}' data-speedup='{_v(g.speedup)}' data-low='{_v(g.speedup_low)}' "
                   f"data-high='{_v(g.speedup_high)}' x='{left}' y='{y + 5}' width='{x(g.speedup) - left:.2f}' height='{rh - 10}' "
                   f"fill='{'#59a14f' if g.speedup > 1 else '#bab0ac'}'><title>{g.speedup:.4f}× [{lo:.4f}, {hi:.4f}]</title></rect>")
        cy = y + rh / 2
        out.append(f"<g stroke='#1d2330' stroke-width='1.5'><line x1='{x(lo):.2f}' x2='{x(hi):.2f}' y1='{cy}' y2='{cy}'/>"
                   f"<line x1='{x(lo):.2f}' x2='{x(lo):.2f}' y1='{cy - 6}' y2='{cy + 6}'/>"
                   f"<line x1='{x(hi):.2f}' x2='{x(hi):.2f}' y1='{cy - 6}' y2='{cy + 6}'/></g>")
        out.append(f"<text x='{x(hi) + 6:.2f}' y='{y + 17}'>{g.speedup:.3f}×</text>")
    if not rows:
        out.append(f"<text x='{left}' y='30'>no graph was optimized in this run</text>")
    out.append(f"<line x1='{x(1.0):.2f}' x2='{x(1.0):.2f}' y1='12' y2='{h - 14}' stroke='#e15759' stroke-dasharray='4 3'/>"
               f"<text x='{x(1.0) - 8:.2f}' y='{h - 2}'>1×</text></svg>")
    return "".join(out)


def _candidates_chart(r: Report) -> str:
    cs = r.candidates
    h, left, bottom, top_pad = 300, 60, 40, 16
    timed = [c.speedup for c in cs if c.speedup is not None]
    lo_v = min([1.0] + timed) * 0.95
    hi_v = max([1.0] + timed) * 1.05
    use_time = bool(cs) and all(c.t_s is not None for c in cs)
    xs = [c.t_s if use_time else float(i) for i, c in enumerate(cs)]
    xmax = max(xs + [1.0])
    plot_h = h - bottom - top_pad - 24  # 24 px at the bottom for "rejected before timing"
    x = lambda v: left + (_W - left - 20) * v / xmax  # noqa: E731
    y = lambda v: top_pad + plot_h * (1 - (v - lo_v) / (hi_v - lo_v))  # noqa: E731
    out = [f"<svg class='chart' id='chart-candidates' width='{_W}' height='{h}' viewBox='0 0 {_W} {h}' "
           "xmlns='http://www.w3.org/2000/svg' role='img' aria-label='candidates over time'>",
           f"<line x1='{left}' x2='{_W - 20}' y1='{y(1.0):.2f}' y2='{y(1.0):.2f}' stroke='#e15759' stroke-dasharray='4 3'/>",
           f"<text x='8' y='{y(1.0) + 4:.2f}'>1×</text><text x='8' y='{top_pad + 10}'>{hi_v:.3g}×</text>",
           f"<text x='8' y='{h - bottom - 4}' class='muted'>no timing</text>",
           f"<text x='{left}' y='{h - 8}'>0</text><text x='{_W - 20}' y='{h - 8}' text-anchor='end'>"
           f"{(f'{xmax:.0f} s since start' if use_time else f'{len(cs)} verdicts')}</text>"]
    keys = sorted({c.key for c in cs})
    for c, xv in zip(cs, xs):
        color = _PALETTE[keys.index(c.key) % len(_PALETTE)]
        yy = y(c.speedup) if c.speedup is not None else h - bottom - 8
        attrs = (f"data-mark='candidate' data-key='{_e(c.key)}' data-index='{c.index}' data-accepted='{int(c.accepted)}' "
                 f"data-stage='{_e(c.stage)}' data-speedup='{_v(c.speedup)}' data-t='{_v(c.t_s)}'")
        tip = (f"<title>{_e(c.key[:12])} #{c.index} {_e(c.label)}: {'accepted' if c.accepted else 'rejected at ' + _e(c.stage)}"
               f"{'' if c.speedup is None else f', {c.speedup:.4f}×'}</title>")
        if c.accepted:
            out.append(f"<circle {attrs} cx='{x(xv):.2f}' cy='{yy:.2f}' r='7' fill='#59a14f' stroke='{color}' stroke-width='2'>{tip}</circle>")
        else:
            X, Y = x(xv), yy
            out.append(f"<path {attrs} d='M{X - 5:.2f},{Y - 5:.2f}L{X + 5:.2f},{Y + 5:.2f}M{X - 5:.2f},{Y + 5:.2f}L{X + 5:.2f},{Y - 5:.2f}' "
                       f"stroke='#888' stroke-width='2'>{tip}</path>")
    if not cs:
        out.append(f"<text x='{left + 10}' y='{h / 2}'>the gate judged no candidate in this run</text>")
    out.append("</svg>")
    return "".join(out)


def _kernel_chart(r: Report) -> str:
    rows = [g for g in r.graphs if g.top_kernels]
    left, rh = 150, 34
    h = 20 + rh * max(1, len(rows))
    out = [f"<svg class='chart' id='chart-kernels' width='{_W}' height='{h}' viewBox='0 0 {_W} {h}' "
           "xmlns='http://www.w3.org/2000/svg' role='img' aria-label='kernel time per graph'>"]
    for i, g in enumerate(rows):
        y = 10 + i * rh
        segs = [(k.name, k.kind, k.time_ms) for k in g.top_kernels]
        if g.other_kernels_ms > 0:
            segs.append(("other kernels", "other", g.other_kernels_ms))
        if g.launch_overhead_ms and g.launch_overhead_ms > 0:
            segs.append(("launch overhead", "overhead", g.launch_overhead_ms))
        total = sum(s[2] for s in segs) or 1.0
        out.append(f"<text x='8' y='{y + 19}'>{_e(g.key[:12])}</text>")
        xx, width = float(left), _W - left - 110
        for j, (name, kind, ms) in enumerate(segs):
            w = width * ms / total
            fill = "#d0d3dc" if kind in ("other", "overhead") else _PALETTE[j % len(_PALETTE)]
            out.append(f"<rect data-mark='kernel' data-key='{_e(g.key)}' data-kernel='{_e(name)}' data-ms='{_v(ms)}' "
                       f"x='{xx:.2f}' y='{y + 4}' width='{w:.2f}' height='{rh - 10}' fill='{fill}' stroke='#fff'>"
                       f"<title>{_e(name)} ({_e(kind)}): {ms:.4f} ms</title></rect>")
            if w > 70:
                out.append(f"<text x='{xx + 4:.2f}' y='{y + 19}' style='fill:#fff'>{_e(_clip(name, int(w / 7)))}</text>")
            xx += w
        out.append(f"<text x='{xx + 6:.2f}' y='{y + 19}'>{total:.4g} ms</text>")
    if not rows:
        out.append(f"<text x='{left}' y='24'>no baseline profile in this run</text>")
    out.append("</svg>")
    return "".join(out)


def _graph_table(r: Report) -> str:
    head = ["graph", "kind", "eligible", "status", "baseline ms", "best ms", "speedup [interval]", "loops",
            "candidates", "rejected by stage", "variants", "model calls"]
    rows = []
    for g in r.graphs:
        elig = "?" if g.eligible is None else ("yes" if g.eligible else f"no: {g.ineligible_reason}")
        sp = "—" if g.speedup is None else f"{g.speedup:.3f}× [{_fmt(g.speedup_low)}, {_fmt(g.speedup_high)}]"
        rej = ", ".join(f"{k} {v}" for k, v in sorted(g.rejected_by_stage.items())) or "—"
        notes = "".join(f"<div class='note'>{_e(n)}</div>" for n in g.notes)
        status = _e(g.status) + (f"<div class='muted'>{_e(g.reason)}</div>" if g.reason else "") + notes
        rows.append(f"<tr data-key='{_e(g.key)}'><td><code title='{_e(g.key)}'>{_e(g.key[:12])}</code></td><td>{_e(g.kind)}</td>"
                    f"<td>{_e(elig)}</td><td>{status}</td>"
                    f"{_td('baseline_ms', g.baseline_ms, _fmt(g.baseline_ms, 4))}{_td('best_ms', g.best_ms, _fmt(g.best_ms, 4))}"
                    f"<td class='num' data-field='speedup' data-value='{_v(g.speedup)}' data-low='{_v(g.speedup_low)}' "
                    f"data-high='{_v(g.speedup_high)}'>{_e(sp)}</td>"
                    f"{_td('loops_done', g.loops_done, str(g.loops_done))}{_td('candidates', g.candidates, str(g.candidates))}"
                    f"<td>{_e(rej)}</td>{_td('variants_screened', g.variants_screened, str(g.variants_screened))}"
                    f"{_td('model_calls', g.model_calls, '—' if g.model_calls is None else str(g.model_calls))}</tr>")
    return _table("graphs", head, rows)


def _candidates_table(r: Report) -> str:
    head = ["t (s)", "graph", "#", "label", "result", "speedup [interval]", "gate s"]
    rows = []
    for c in r.candidates:
        res = "accepted" if c.accepted else f"rejected at {c.stage}" + (f" ({', '.join(c.reasons)})" if c.reasons else "")
        res += f": {c.why}" if c.why else ""
        sp = "—" if c.speedup is None else f"{c.speedup:.3f}× [{_fmt(c.speedup_low)}, {_fmt(c.speedup_high)}]"
        rows.append(f"<tr data-key='{_e(c.key)}' data-index='{c.index}' data-accepted='{int(c.accepted)}'>"
                    f"{_td('t_s', c.t_s, _fmt(c.t_s, 1))}<td><code>{_e(c.key[:12])}</code></td><td>{c.index}</td>"
                    f"<td>{_e(c.label)}</td><td>{_e(res)}</td>{_td('speedup', c.speedup, sp)}"
                    f"{_td('wall_s', c.wall_s, _fmt(c.wall_s, 1))}</tr>")
    return _table("candidates", head, rows)


def _kernel_tables(r: Report) -> str:
    out = []
    for g in r.graphs:
        if not g.top_kernels:
            continue
        rows = [f"<tr data-key='{_e(g.key)}' data-kernel='{_e(k.name)}'><td><code>{_e(k.name)}</code></td><td>{_e(k.kind)}</td>"
                f"<td class='num'>{k.calls}</td>{_td('time_ms', k.time_ms, _fmt(k.time_ms, 4))}"
                f"{_td('share', k.share, f'{100 * k.share:.1f} %')}"
                f"{_td('gbps', k.gbps, rate_text(k.gbps, k.bw_frac, True))}{_td('tflops', k.tflops, rate_text(k.tflops, k.flop_frac))}"
                f"<td>{_e(k.klass or '-')}</td>{_td('headroom_ms', k.headroom_ms, _fmt(k.headroom_ms, 4))}"
                f"<td><code>{_e(k.site)}</code></td><td>{_e(k.tried or '-')}</td></tr>" for k in g.top_kernels]
        gap = f", device idle between kernels {_fmt(g.gap_ms, 4)} ms" if g.gap_ms is not None else ""
        out.append(f"<h3><code>{_e(g.key[:12])}</code> <span class='muted'>{_e(g.kind)}: kernels {_fmt(g.kernel_ms, 4)} ms, "
                   f"launch overhead {_fmt(g.launch_overhead_ms, 4)} ms{_e(gap)}"
                   f"{_e(', ' + g.profile_class + '-bound') if g.profile_class else ''}</span></h3>")
        if g.ceilings:
            out.append(f"<p class='muted'>ceilings: {_e(g.ceilings)}. {_e(g.counters)}</p>")
        out.append(_table(f"kernels-{g.key[:12]}", ["kernel", "kind", "calls", "ms per call", "share", BANDWIDTH_COLUMN,
                                                    "TFLOP/s (of peak)", "class", "headroom ms", "wrapper line",
                                                    "the tuner tried"], rows))
        if any((k.bw_frac or 0) > 1 for k in g.top_kernels):
            out.append(f"<p class='muted'>{_e(BANDWIDTH_NOTE)}.</p>")
    return "".join(out)


def _table(tid: str, head: list[str], rows: list[str]) -> str:
    if not rows:
        return f"<p id='table-{tid}' class='muted'>none</p>"
    return (f"<table id='table-{tid}'><thead><tr>{''.join(f'<th>{_e(h)}</th>' for h in head)}</tr></thead>"
            f"<tbody>{''.join(rows)}</tbody></table>")


def _td(field: str, value, text: str) -> str:
    return f"<td class='num' data-field='{field}' data-value='{_v(value)}'>{_e(text)}</td>"


def _v(v) -> str:
    """The exact value for a data-* attribute: repr of the float (what json.dumps writes), '' for None."""
    if v is None:
        return ""
    return repr(float(v)) if isinstance(v, float) else str(v)


def _fmt(v, digits: int = 3) -> str:
    return "—" if v is None or (isinstance(v, float) and not math.isfinite(v)) else f"{v:.{digits}f}"


def _ms(v: float) -> str:
    return f"{v:.4f} ms"


def _env(env: dict) -> str:
    return " ".join(f"{k} {env[k]}" for k in ("torch", "triton", "gpu", "python") if env.get(k))


def _clip(s: str, n: int) -> str:
    return s if len(s) <= n else s[: max(1, n - 1)] + "…"


def _e(s) -> str:
    return html.escape(str(s), quote=True)
