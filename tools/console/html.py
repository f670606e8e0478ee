"""The console's HTML: one page layout, tables, forms and the TPS chart.

Everything the console shows is text from brokers and users (topic names,
message bodies, properties), so every value goes through ``esc`` unless it
is ``Html``: markup this module or ``pages`` built from escaped parts. No
script and no file from anywhere else: the style sheet is inline and the
charts are inline SVG drawn here, so a page works on a host with no
internet, and a chart is as fresh as the page (reload to redraw).
"""
from __future__ import annotations

import datetime
import html
from urllib.parse import urlencode

NAV = [("/cluster", "Cluster"), ("/topics", "Topics"), ("/groups", "Consumers"),
       ("/producers", "Producers"), ("/messages", "Messages")]
CHART_W, CHART_H, CHART_PAD = 640, 160, 36     # px: the plot, and the room for the axis labels

STYLE = """
body{font:14px/1.4 system-ui,sans-serif;margin:0;color:#222}
header{background:#1f3a5f;color:#fff;padding:8px 16px;display:flex;gap:20px;align-items:center}
header a{color:#fff;text-decoration:none;font-weight:600}header .ns{margin-left:auto;opacity:.8}
main{padding:12px 16px}h1{font-size:20px;margin:8px 0}h2{font-size:16px;margin:18px 0 6px}
table{border-collapse:collapse;margin:4px 0 10px}th,td{border:1px solid #ccd;padding:3px 8px;
text-align:left;vertical-align:top}th{background:#eef2f7}td.n{text-align:right}
.notice{background:#e6f4e6;border:1px solid #7b7;padding:8px;margin:8px 0}
.error{background:#fbe9e9;border:1px solid #d77;padding:8px;margin:8px 0}
.note{color:#666}form{margin:6px 0 12px;padding:8px;border:1px solid #dde;display:inline-block}
form.inline{border:0;padding:0;margin:0}label{margin-right:10px}
input[type=text]{width:16em}pre{background:#f6f6f6;padding:8px;white-space:pre-wrap;max-width:90em}
.chart{margin:4px 16px 12px 0;display:inline-block}.put{stroke:#1565c0}.get{stroke:#e65100}
"""


class Html(str):
    """Markup that is already safe to insert. Html + Html is Html; Html +
    str is an error (the str would have to be escaped first)."""

    def __add__(self, other):
        if not isinstance(other, Html):
            raise TypeError(f"Html + {type(other).__name__}: escape it with esc() first")
        return Html(str.__add__(self, other))


def esc(value) -> Html:
    if isinstance(value, Html):
        return value
    return Html(html.escape("" if value is None else str(value)))


def href(path: str, **query) -> str:
    q = {k: v for k, v in query.items() if v is not None}
    return path + ("?" + urlencode(q) if q else "")


def link(path: str, text, **query) -> Html:
    return Html(f'<a href="{esc(href(path, **query))}">{esc(text)}</a>')


def ms_text(ms) -> str:
    """A store/born timestamp (ms) in local time, as the dashboard shows it."""
    try:
        ms = int(ms)
    except (TypeError, ValueError):
        return ""
    if ms <= 0:
        return ""
    return datetime.datetime.fromtimestamp(ms / 1000).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]


def table(headers: list[str], rows: list[list], numeric: set[int] = frozenset()) -> Html:
    """``numeric``: the columns to align right."""
    out = ["<table><tr>", *(f"<th>{esc(h)}</th>" for h in headers), "</tr>"]
    for row in rows:
        out.append("<tr>")
        out += [f'<td class="n">{esc(c)}</td>' if i in numeric else f"<td>{esc(c)}</td>"
                for i, c in enumerate(row)]
        out.append("</tr>")
    out.append("</table>")
    return Html("".join(out))


def kv_table(d: dict) -> Html:
    return table(["key", "value"], [[k, v] for k, v in d.items()])


def form(action: str, fields: list[Html], button: str, method: str = "post", css: str = "") -> Html:
    cls = f' class="{css}"' if css else ""
    return Html(f'<form method="{method}" action="{esc(action)}"{cls}>{"".join(fields)}'
                f'<button type="submit">{esc(button)}</button></form>')


def text_input(name: str, label: str, value="", placeholder: str = "", size: int = 0) -> Html:
    style = f' style="width:{size}em"' if size else ""
    return Html(f'<label>{esc(label)} <input type="text" name="{esc(name)}" value="{esc(value)}" '
                f'placeholder="{esc(placeholder)}"{style}></label>')


def hidden(name: str, value) -> Html:
    return Html(f'<input type="hidden" name="{esc(name)}" value="{esc(value)}">')


def select(name: str, label: str, options: list[str], chosen: str | None = None) -> Html:
    opts = "".join(f'<option{" selected" if o == chosen else ""}>{esc(o)}</option>' for o in options)
    return Html(f'<label>{esc(label)} <select name="{esc(name)}">{opts}</select></label>')


def checkbox(name: str, label: str, checked: bool = False) -> Html:
    return Html(f'<label><input type="checkbox" name="{esc(name)}" value="true"'
                f'{" checked" if checked else ""}> {esc(label)}</label>')


def page(title: str, body: str, namesrv: str, notice: str | None = None,
         error: str | None = None) -> str:
    nav = "".join(f'<a href="{p}">{t}</a>' for p, t in NAV)
    boxes = ""
    if notice:
        boxes += f'<div class="notice">{esc(notice)}</div>'
    if error:
        boxes += f'<div class="error">{esc(error)}</div>'
    return (f'<!DOCTYPE html><html><head><meta charset="utf-8"><title>{esc(title)} - shmq console'
            f'</title><style>{STYLE}</style></head><body><header><span>shmq console</span>{nav}'
            f'<span class="ns">NameServer {esc(namesrv)}</span></header><main><h1>{esc(title)}</h1>'
            f"{boxes}{body}</main></body></html>")


def tps_chart(title: str, samples: list[tuple[int, float, float]]) -> Html:
    """An SVG line chart of (time ms, put TPS, get TPS) samples, oldest
    first: put in blue, get in orange, the y axis from 0 to the highest
    rate, the x axis the samples' time span."""
    w, h, pad = CHART_W, CHART_H, CHART_PAD
    head = (f'<svg class="chart" width="{w + pad}" height="{h + 2 * pad}" '
            f'xmlns="http://www.w3.org/2000/svg" role="img" aria-label="{esc(title)}">'
            f'<text x="{pad}" y="14" font-size="13" font-weight="600">{esc(title)}</text>'
            f'<rect x="{pad}" y="{pad}" width="{w - pad}" height="{h - pad}" fill="#fafbfd" '
            f'stroke="#ccd"/>')
    if len(samples) < 2:
        return Html(head + f'<text x="{pad + 8}" y="{pad + 20}" font-size="12" fill="#666">'
                           f'collecting samples ({len(samples)} so far)</text></svg>')
    t0, t1 = samples[0][0], samples[-1][0]
    top = max(1.0, max(max(p, g) for _, p, g in samples))

    def points(i: int) -> str:
        return " ".join(f"{pad + (s[0] - t0) / (t1 - t0 or 1) * (w - pad):.1f},"
                        f"{h - s[i] / top * (h - pad):.1f}" for s in samples)

    span_s = (t1 - t0) / 1000
    return Html(
        head + f'<polyline class="put" fill="none" stroke-width="2" points="{points(1)}"/>'
        f'<polyline class="get" fill="none" stroke-width="2" points="{points(2)}"/>'
        f'<text x="2" y="{pad + 10}" font-size="11">{top:.1f}</text>'
        f'<text x="2" y="{h}" font-size="11">0</text>'
        f'<text x="{pad}" y="{h + 16}" font-size="11">{esc(ms_text(t0)[11:19])}</text>'
        f'<text x="{w - 50}" y="{h + 16}" font-size="11">{esc(ms_text(t1)[11:19])}</text>'
        f'<text x="{pad}" y="{h + 32}" font-size="11"><tspan class="put" fill="#1565c0">'
        f'put TPS {samples[-1][1]:.1f}</tspan>  <tspan fill="#e65100">get TPS '
        f'{samples[-1][2]:.1f}</tspan>  over {span_s:.0f} s, {len(samples)} samples</text></svg>')
