"""Explain reports: what a session runs and why, as a dict (JSON), a text table or a self-contained HTML page.

A report gathers, for one :class:`~xpuruntime.InferenceSession`:

- the engine and why it was chosen, the device, the engine's options and how each policy entry was honoured;
- every node: the kernel, backend and precision that run it, how the Dispatcher chose (``rule``), the policy rule
  that applied, the reason, and the candidates it rejected with each one's reason (and timings when autotuned);
- the host<->device copies and synchronizations each run makes, as the engine plans them;
- the memory plan (peak, arena, reuse, workspace, constants);
- optionally a timeline: the events of a :func:`xpuruntime.profile` run (per node, per kernel), or host-timed
  ``session.run`` spans when no profiler events are given.

Examples
--------
>>> from xpuruntime import report
>>> data = report.build_report(session, events=profiler.events(), summary=profiler.summary())
>>> print(report.render_text(data))
>>> pathlib.Path("report.html").write_text(report.render_html(data))

The HTML page needs no network: its CSS and JavaScript are inline, and the script draws the node table and the
timeline (an SVG) from the JSON embedded in the page. See docs/cli.md (``xpuruntime explain``).
"""

from __future__ import annotations

import html
import json
import time
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Union

SCHEMA = "xpuruntime.explain_report/1"

Event = Dict[str, Any]


def _value_infos(infos: Iterable[Any]) -> List[dict]:
    return [{"name": i.name, "dtype": i.dtype, "shape": list(i.shape)} for i in infos]


def _transfer_summary(transfers: Sequence[Mapping[str, Any]]) -> dict:
    out = {"copies_per_run": 0, "syncs_per_run": 0, "appends_per_run": 0, "host_to_device_bytes": 0,
           "device_to_host_bytes": 0, "device_to_device_bytes": 0, "host_to_host_bytes": 0}
    keys = {"host->device": "host_to_device_bytes", "device->host": "device_to_host_bytes",
            "device->device": "device_to_device_bytes", "host->host": "host_to_host_bytes"}
    for t in transfers:
        if t["kind"] == "sync":
            out["syncs_per_run"] += 1
        elif t["kind"] == "append":  # a cache appended in place: its new positions only, not a copy of the cache
            out["appends_per_run"] += 1
        else:
            out["copies_per_run"] += 1
            key = keys.get(t["direction"])
            if key:
                out[key] += int(t["bytes"])
    return out


def host_timed_events(run: Callable[[], Any], iterations: int = 3, name: str = "session.run") -> List[Event]:
    """Times ``run()`` ``iterations`` times with the host clock and returns the spans as profiler-style events
    (``name``, ``cat``, ``ts_us``, ``dur_us``, ``pid``, ``tid``, ``args``): the timeline of a report made
    without :func:`xpuruntime.profile`."""
    events: List[Event] = []
    origin = time.perf_counter()
    for i in range(iterations):
        start = time.perf_counter()
        run()
        end = time.perf_counter()
        events.append({"name": name, "cat": "session", "ts_us": (start - origin) * 1e6,
                       "dur_us": (end - start) * 1e6, "pid": 0, "tid": 0, "args": {"iteration": i}})
    return events


def build_report(session: Any, *, model: Optional[Union[str, Path]] = None, events: Optional[Sequence[Event]] = None,
                 summary: Optional[Sequence[Mapping[str, Any]]] = None, timeline_source: Optional[str] = None,
                 run_info: Optional[Mapping[str, Any]] = None) -> dict:
    """The explain report of ``session`` as a JSON-serializable dict.

    Parameters
    ----------
    session : InferenceSession
        The session (run it once first: plans and execution providers are known after the first run).
    model : str or Path, optional
        The model file, recorded in the report.
    events : list of dict, optional
        Timeline events (``Profiler.events()`` or :func:`host_timed_events`).
    summary : list of dict, optional
        ``Profiler.summary()``: per-node time and share, merged into the node rows by node name.
    timeline_source : str, optional
        What the events are (``"profiler"``, ``"host timer"``); defaults from whether ``summary`` is given.
    run_info : mapping, optional
        Extra facts about the runs behind the report (input shapes, iterations), recorded as they are.
    """
    from . import __version__

    e = session.explain()
    per_node = {str(s.get("node")): s for s in (summary or [])}
    nodes = []
    for n in e.nodes:
        candidates = list(n.get("candidates", []))
        rejected = [c for c in candidates if c["kernel"] != n["kernel"]]
        row = {key: n.get(key, "") for key in ("node", "op_type", "op", "kernel", "backend", "precision", "rule",
                                               "policy_rule", "reason")}
        row["candidates"] = candidates
        row["rejected"] = rejected
        timing = per_node.get(n["node"])
        if timing is not None:
            row["time_us"] = timing.get("total_us")
            row["mean_us"] = timing.get("mean_us")
            row["calls"] = timing.get("calls")
            row["share"] = timing.get("share")
            if timing.get("bytes") is not None:
                row["bytes"] = timing.get("bytes")
            if timing.get("ceiling"):  # the roofline audit (docs/profiling.md): floor and efficiency
                for key in ("flops", "floor_bytes", "ceiling", "floor_us", "bound", "efficiency", "lost_share",
                            "flagged"):
                    row[key] = timing.get(key)
        nodes.append(row)
    transfers = list(getattr(e, "transfers", []))
    events = list(events or [])
    if timeline_source is None:
        timeline_source = "profiler" if summary is not None else ("host timer" if events else "none")
    return {
        "schema": SCHEMA,
        "xpuruntime_version": __version__,
        "model": str(model) if model is not None else None,
        "engine": e.engine,
        "engine_reason": e.engine_reason,
        "device": e.device,
        "inputs": _value_infos(session.get_inputs()),
        "outputs": _value_infos(session.get_outputs()),
        "options": list(e.options),
        "policy_notes": list(e.policy_notes),
        "nodes": nodes,
        "transfers": {"items": transfers, "summary": _transfer_summary(transfers),
                      "reported_by_engine": bool(transfers) or e.engine == "native"},
        "memory": {"text": e.memory, "plan": getattr(e, "memory_plan", None)},
        "run": dict(run_info or {}),
        "timeline": {"source": timeline_source, "events": events},
        "summary": [dict(s) for s in summary] if summary is not None else None,
    }


# ---------------------------------------------------------------------------------------------------------------
# Text
# ---------------------------------------------------------------------------------------------------------------


def _bytes(n: Optional[float]) -> str:
    if n is None:
        return "-"
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> List[str]:
    widths = [len(h) for h in header]
    for row in rows:
        widths = [max(w, len(c)) for w, c in zip(widths, row)]
    fmt = lambda row: "  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip()  # noqa: E731
    return [fmt(header), fmt(["-" * w for w in widths])] + [fmt(r) for r in rows]


def render_text(report: Mapping[str, Any], *, candidates: bool = True) -> str:
    """The report as plain text: a header, copies and syncs, the memory plan, a node table and (when
    ``candidates``) every rejected candidate with its reason."""
    lines = []
    if report.get("model"):
        lines.append(f"model:   {report['model']}")
    lines.append(f"engine:  {report['engine']} ({report['engine_reason']})")
    lines.append(f"device:  {report['device']}")
    for key in ("inputs", "outputs"):
        values = ", ".join(f"{v['name']}: {v['dtype']}[{', '.join(str(d) for d in v['shape'])}]" for v in report[key])
        lines.append(f"{key + ':':8} {values}")
    for option in report["options"]:
        lines.append(f"option:  {option}")
    for note in report["policy_notes"]:
        lines.append(f"policy:  {note}")
    if report["memory"]["text"]:
        lines.append(f"memory:  {report['memory']['text']}")
    t = report["transfers"]
    s = t["summary"]
    if t["reported_by_engine"]:
        lines.append(f"per run: {s['copies_per_run']} copies (host->device {_bytes(s['host_to_device_bytes'])}, "
                     f"device->host {_bytes(s['device_to_host_bytes'])}, device->device "
                     f"{_bytes(s['device_to_device_bytes'])}, host->host {_bytes(s['host_to_host_bytes'])}), "
                     f"{s['syncs_per_run']} syncs" + (f", {s['appends_per_run']} caches appended in place"
                                                      if s["appends_per_run"] else ""))
        for item in t["items"]:
            if item["kind"] == "sync":
                lines.append(f"  sync: {item['reason']}")
            else:
                lines.append(f"  {item['kind']}: {item['value']} {item['direction']} {_bytes(item['bytes'])}: "
                             f"{item['reason']}")
    else:
        lines.append("per run: copies and syncs are not reported by this engine (see its options)")
    timed = any("time_us" in n for n in report["nodes"])
    audited = any(n.get("floor_us") for n in report["nodes"])
    header = ["node", "op_type", "kernel", "backend", "precision", "rule"] + (["time", "share"] if timed else [])
    header += ["floor", "eff"] if audited else []
    rows = []
    for n in report["nodes"]:
        row = [n["node"], n["op_type"], n["kernel"], n["backend"] or "-", n["precision"] or "-", n["rule"] or "-"]
        if timed:
            row += [f"{n['time_us']:.1f} us" if n.get("time_us") is not None else "-",
                    f"{100 * n['share']:.1f}%" if n.get("share") is not None else "-"]
        if audited:
            row += [f"{n['floor_us']:.1f} us" if n.get("floor_us") else "-",
                    (f"{100 * n['efficiency']:.0f}%" + (" !" if n.get("flagged") else "")) if n.get("floor_us")
                    else "-"]
        rows.append(row)
    lines.append("")
    lines += _table(header, rows)
    if audited:
        lines.append("floor = max(bytes / copy bandwidth, FLOPs / peak) over the timed runs; eff = floor / time; '!': "
                     "over 2% of the run at under 50% of its floor (xpuruntime audit ranks them)")
    lines.append("")
    lines.append("why:")
    for n in report["nodes"]:
        lines.append(f"  {n['node']}: {n['reason']}")
    if candidates and any(n["rejected"] for n in report["nodes"]):
        lines.append("")
        lines.append("rejected candidates:")
        for n in report["nodes"]:
            for c in n["rejected"]:
                timing = f", {c['time_us']:.1f} us" if c.get("time_us") is not None else ""
                lines.append(f"  {n['node']}: {c['kernel']} ({c['backend']}{timing}): {c['reason']}")
    timeline = report["timeline"]
    if timeline["events"]:
        lines.append("")
        lines.append(f"timeline: {len(timeline['events'])} events ({timeline['source']}); the HTML report draws them")
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------------------------
# HTML
# ---------------------------------------------------------------------------------------------------------------

_CSS = """
body { font: 13px/1.4 -apple-system, "Segoe UI", Roboto, sans-serif; margin: 24px; color: #1d2330; }
h1 { font-size: 20px; margin: 0 0 4px; } h2 { font-size: 15px; margin: 24px 0 8px; }
table { border-collapse: collapse; width: 100%; }
th, td { text-align: left; padding: 3px 8px; border-bottom: 1px solid #e3e6ec; vertical-align: top; }
th { background: #f3f5f8; position: sticky; top: 0; }
tr.node-row:hover { background: #f7f9ff; cursor: pointer; }
tr.candidates td { background: #fafbfc; color: #4a5264; font-size: 12px; }
.muted { color: #6b7385; } .mono { font-family: ui-monospace, Menlo, monospace; }
.tag { display: inline-block; padding: 0 6px; border-radius: 8px; background: #e8eefc; font-size: 11px; }
#timeline-box { overflow-x: auto; border: 1px solid #e3e6ec; }
#timeline rect.event { stroke: #fff; stroke-width: 0.5; } #timeline text { font-size: 11px; fill: #1d2330; }
dl { display: grid; grid-template-columns: max-content auto; gap: 2px 12px; margin: 0; } dt { color: #6b7385; }
"""

_JS = r"""
(function () {
  const data = JSON.parse(document.getElementById("report-data").textContent);
  const el = (tag, attrs, text) => {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
    if (text !== undefined) node.textContent = text;
    return node;
  };
  const bytes = (n) => {
    if (n === null || n === undefined) return "-";
    const units = ["B", "KiB", "MiB", "GiB"]; let i = 0;
    while (Math.abs(n) >= 1024 && i < units.length - 1) { n /= 1024; i++; }
    return i === 0 ? n + " B" : n.toFixed(1) + " " + units[i];
  };

  // Summary
  const summary = document.getElementById("summary");
  const facts = [["model", data.model || "-"], ["engine", data.engine + " (" + data.engine_reason + ")"],
                 ["device", data.device], ["xpuruntime", data.xpuruntime_version],
                 ["inputs", data.inputs.map(v => v.name + ": " + v.dtype + "[" + v.shape.join(", ") + "]").join("; ")],
                 ["outputs", data.outputs.map(v => v.name + ": " + v.dtype + "[" + v.shape.join(", ") + "]").join("; ")],
                 ["memory", data.memory.text || "-"]];
  for (const o of data.options) facts.push(["option", o]);
  for (const p of data.policy_notes) facts.push(["policy", p]);
  const dl = el("dl");
  for (const [k, v] of facts) { dl.appendChild(el("dt", {}, k)); dl.appendChild(el("dd", {}, v)); }
  summary.appendChild(dl);

  // Copies and syncs
  const transfers = document.getElementById("transfers");
  if (!data.transfers.reported_by_engine) {
    transfers.appendChild(el("p", {"class": "muted"}, "This engine does not report its copies and syncs."));
  } else {
    const s = data.transfers.summary;
    transfers.appendChild(el("p", {}, s.copies_per_run + " copies and " + s.syncs_per_run + " syncs per run: host->device " +
      bytes(s.host_to_device_bytes) + ", device->host " + bytes(s.device_to_host_bytes) + ", device->device " +
      bytes(s.device_to_device_bytes) + ", host->host " + bytes(s.host_to_host_bytes) + "."));
    const table = el("table", {"id": "transfer-table"});
    const head = el("tr"); for (const h of ["kind", "value", "direction", "bytes", "why"]) head.appendChild(el("th", {}, h));
    table.appendChild(head);
    for (const t of data.transfers.items) {
      const tr = el("tr");
      for (const v of [t.kind, t.value || "-", t.direction || "-", t.kind === "sync" ? "-" : bytes(t.bytes), t.reason])
        tr.appendChild(el("td", {}, v));
      table.appendChild(tr);
    }
    transfers.appendChild(table);
  }

  // Nodes
  const timed = data.nodes.some(n => n.time_us !== undefined && n.time_us !== null);
  const nodeTable = el("table", {"id": "node-table"});
  const head = el("tr");
  const cols = ["node", "op_type", "kernel", "backend", "precision", "rule", "rejected"].concat(timed ? ["total time", "share"] : []);
  for (const h of cols) head.appendChild(el("th", {}, h));
  nodeTable.appendChild(head);
  data.nodes.forEach((n, i) => {
    const tr = el("tr", {"class": "node-row", "data-node": n.node, "title": n.reason});
    tr.appendChild(el("td", {"class": "node-name mono"}, n.node));
    tr.appendChild(el("td", {}, n.op_type));
    tr.appendChild(el("td", {"class": "kernel mono"}, n.kernel));
    tr.appendChild(el("td", {}, n.backend || "-"));
    tr.appendChild(el("td", {}, n.precision || "-"));
    tr.appendChild(el("td", {}, n.rule || "-"));
    tr.appendChild(el("td", {}, String(n.rejected.length)));
    if (timed) {
      tr.appendChild(el("td", {}, n.time_us === undefined || n.time_us === null ? "-" : n.time_us.toFixed(1) + " us"));
      tr.appendChild(el("td", {}, n.share === undefined || n.share === null ? "-" : (100 * n.share).toFixed(1) + "%"));
    }
    nodeTable.appendChild(tr);
    const detail = el("tr", {"class": "candidates", "id": "candidates-" + i});
    const td = el("td", {"colspan": String(cols.length)});
    td.appendChild(el("div", {}, "why: " + n.reason));
    for (const c of n.rejected) {
      const time = c.time_us === null || c.time_us === undefined ? "" : ", " + c.time_us.toFixed(1) + " us";
      td.appendChild(el("div", {"class": "rejected"}, "rejected " + c.kernel + " (" + c.backend + time + "): " + c.reason));
    }
    detail.appendChild(td);
    detail.style.display = "none";
    nodeTable.appendChild(detail);
    tr.addEventListener("click", () => { detail.style.display = detail.style.display === "none" ? "" : "none"; });
  });
  document.getElementById("nodes").appendChild(nodeTable);

  // Timeline: one lane per (pid, tid), events as rectangles, a time axis in microseconds.
  const box = document.getElementById("timeline-box");
  const events = data.timeline.events.filter(e => typeof e.ts_us === "number" && typeof e.dur_us === "number");
  const svgNS = "http://www.w3.org/2000/svg";
  const svg = document.createElementNS(svgNS, "svg");
  svg.setAttribute("id", "timeline");
  const sv = (tag, attrs, text) => {
    const node = document.createElementNS(svgNS, tag);
    for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
    if (text !== undefined) node.textContent = text;
    return node;
  };
  if (events.length === 0) {
    box.appendChild(el("p", {"class": "muted", "id": "timeline-empty"}, "No timeline events in this report."));
  } else {
    // One lane per category and thread, so that nested events (a run, its nodes, their kernels) do not overlap.
    const order = ["range", "session", "node", "kernel", "memcpy", "memset", "sync", "alloc"];
    const rank = c => (order.indexOf(c) < 0 ? order.length : order.indexOf(c));
    const laneKey = e => (e.cat || "") + " " + String(e.pid) + ":" + String(e.tid);
    const lanes = [...new Set(events.map(laneKey))].sort((a, b) => {
      const ca = a.split(" ")[0], cb = b.split(" ")[0];
      return rank(ca) - rank(cb) || ca.localeCompare(cb) || a.localeCompare(b);
    });
    const t0 = Math.min(...events.map(e => e.ts_us));
    const t1 = Math.max(...events.map(e => e.ts_us + e.dur_us));
    const span = Math.max(t1 - t0, 1e-3);
    const left = 150, width = Math.max(900, Math.min(6000, events.length * 6)), laneH = 22, top = 24;
    const height = top + lanes.length * (laneH + 6) + 10;
    svg.setAttribute("width", left + width + 70);
    svg.setAttribute("height", height);
    const x = t => left + (t - t0) / span * width;
    for (let k = 0; k <= 10; k++) {
      const t = t0 + span * k / 10;
      svg.appendChild(sv("line", {"x1": x(t), "x2": x(t), "y1": 16, "y2": height, "stroke": "#e3e6ec"}));
      svg.appendChild(sv("text", {"x": x(t) + 2, "y": 12}, ((t - t0) / 1000).toFixed(3) + " ms"));
    }
    const cats = [...new Set(events.map(e => e.cat || ""))];
    const palette = ["#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1", "#ff9da7", "#9c755f"];
    lanes.forEach((lane, i) => {
      svg.appendChild(sv("text", {"class": "lane", "x": 4, "y": top + i * (laneH + 6) + 15}, lane));
    });
    for (const e of events) {
      const i = lanes.indexOf(laneKey(e));
      const rect = sv("rect", {"class": "event", "x": x(e.ts_us), "y": top + i * (laneH + 6),
                               "width": Math.max(1, e.dur_us / span * width), "height": laneH,
                               "fill": palette[cats.indexOf(e.cat || "") % palette.length],
                               "data-name": e.name, "data-cat": e.cat || ""});
      const args = e.args && Object.keys(e.args).length ? "\n" + JSON.stringify(e.args) : "";
      rect.appendChild(sv("title", {}, e.name + " [" + (e.cat || "") + "] " + e.dur_us.toFixed(1) + " us" + args));
      svg.appendChild(rect);
    }
    box.appendChild(svg);
    const legend = el("p", {"class": "muted", "id": "timeline-legend"},
                      events.length + " events from the " + data.timeline.source + "; categories: " + cats.join(", "));
    box.parentNode.insertBefore(legend, box);
  }
  document.body.setAttribute("data-rendered", "true");
})();
"""


def render_html(report: Mapping[str, Any], title: Optional[str] = None) -> str:
    """The report as one self-contained HTML page (inline CSS and JavaScript, no network). The script draws the
    summary, the copies and syncs, the node table (click a row for its reason and rejected candidates) and the
    timeline (an SVG) from the report's JSON embedded in the page."""
    title = title or f"xpuruntime explain: {Path(report['model']).name if report.get('model') else report['engine']}"
    # "</" would end the <script> element early; "<\/" is the same JSON string.
    payload = json.dumps(report, default=str).replace("</", "<\\/")
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>{html.escape(title)}</title>
<style>{_CSS}</style>
</head>
<body>
<h1>{html.escape(title)}</h1>
<p class="muted">Generated by xpuruntime {html.escape(str(report.get('xpuruntime_version', '')))}. Click a node row for
the dispatcher's reason and the candidates it rejected.</p>
<noscript><p>This report draws its tables and timeline with JavaScript; the raw data is in the page source.</p></noscript>
<h2>Session</h2><div id="summary"></div>
<h2>Host&lt;-&gt;device copies and syncs</h2><div id="transfers"></div>
<h2>Timeline</h2><div id="timeline-box"></div>
<h2>Nodes</h2><div id="nodes"></div>
<script type="application/json" id="report-data">{payload}</script>
<script>{_JS}</script>
</body>
</html>
"""


def render_json(report: Mapping[str, Any], indent: Optional[int] = 2) -> str:
    """The report as JSON text."""
    return json.dumps(report, indent=indent, default=str)


def render(report: Mapping[str, Any], fmt: str) -> str:
    """``fmt``: ``"text"``, ``"json"`` or ``"html"``."""
    if fmt == "text":
        return render_text(report)
    if fmt == "json":
        return render_json(report) + "\n"
    if fmt == "html":
        return render_html(report)
    from . import _core

    raise _core.InvalidArgumentError(f"unknown report format '{fmt}'; valid formats: html, json, text")


__all__ = ["SCHEMA", "build_report", "host_timed_events", "render", "render_html", "render_json", "render_text"]
