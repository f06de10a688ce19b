"""The HTML explain report (src/python/xpuruntime/report.py) opened in a real browser: headless Chromium dumps the DOM
after the page's script ran, and the node table and the timeline it draws must be there. Skipped only when no
Chromium is installed (scripts/setup.sh installs Debian's ``chromium`` when XPURT_TEST_DEPS=1, as scripts/test.sh
sets)."""

from __future__ import annotations

import html
import json
import pathlib
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest

import xpuruntime as xrt
from xpuruntime import cli, report

ROOT = pathlib.Path(__file__).resolve().parents[2]
TINY = ROOT / "examples" / "models" / "tiny_classifier.onnx"

CHROMIUM = next((shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome") if shutil.which(n)), None)
requires_chromium = pytest.mark.skipif(
    CHROMIUM is None, reason="no chromium found: install Debian's chromium (scripts/setup.sh does with XPURT_TEST_DEPS=1)")
requires_profiler = pytest.mark.skipif(not hasattr(xrt, "profile"),
                                       reason="this xpuruntime has no profiler yet (xpuruntime.profile)")


def dump_dom(page: pathlib.Path, tmp_path: pathlib.Path) -> str:
    """The DOM after the page's scripts ran, as headless Chromium serializes it."""
    result = subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-extensions",
         f"--user-data-dir={tmp_path / 'chromium-profile'}", "--dump-dom", page.as_uri()],
        capture_output=True, text=True, timeout=180)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip(), result.stderr[-2000:]
    return result.stdout


def embedded_report(page_text: str) -> dict:
    return json.loads(page_text.split('id="report-data">')[1].split("</script>")[0])


def check_rendered(static: str, dom: str, data: dict) -> None:
    # What the script draws is absent from the file and present after Chromium ran it.
    for marker in ('data-rendered="true"', 'class="node-name', "<rect", 'id="node-table"'):
        assert marker not in static
    assert 'data-rendered="true"' in dom
    table = re.search(r'<table id="node-table">(.*?)</table>', dom, re.S)
    assert table, "the node table was not drawn"
    names = [html.unescape(n) for n in re.findall(r'<td class="node-name mono">(.*?)</td>', table.group(1))]
    assert names == [n["node"] for n in data["nodes"]]
    kernels = [html.unescape(k) for k in re.findall(r'<td class="kernel mono">(.*?)</td>', table.group(1))]
    assert kernels == [n["kernel"] for n in data["nodes"]]
    assert 'id="timeline"' in dom, "the timeline SVG was not drawn"
    drawn = [html.unescape(n) for n in re.findall(r'<rect class="event"[^>]*data-name="([^"]*)"', dom)]
    assert sorted(drawn) == sorted(e["name"] for e in data["timeline"]["events"])
    assert drawn


@requires_chromium
def test_cli_html_report_renders_its_node_table_and_timeline(tmp_path):
    page = tmp_path / "report.html"
    code = cli.main(["explain", str(TINY), "--engine", "native", "--format", "html", "-o", str(page), "--batch", "2"])
    assert code == 0
    static = page.read_text()
    data = embedded_report(static)
    dom = dump_dom(page, tmp_path)
    check_rendered(static, dom, data)
    # The copies paragraph: on the CPU the output is written where the caller gets it, so there is nothing to copy.
    assert "0 copies and 0 syncs per run" in dom
    assert "rejected cublasLt (cublasLt): runs on CUDA devices" in dom  # candidates under each node row


@requires_chromium
@requires_profiler
def test_html_timeline_draws_profiler_node_events(tmp_path):
    sys.path.insert(0, str(ROOT / "scripts"))
    pytest.importorskip("onnx", reason="the model zoo is generated with the onnx package (python3-onnx)")
    import make_model_zoo

    model = make_model_zoo.generate(tmp_path / "zoo", tiny_only=True, dtypes=("fp32",), names=("bert",))["bert_tiny"]
    page = tmp_path / "bert.html"
    assert cli.main(["explain", str(model), "--engine", "native", "--format", "html", "-o", str(page),
                     "--iterations", "2"]) == 0
    static = page.read_text()
    data = embedded_report(static)
    assert data["timeline"]["source"] == "profiler"
    dom = dump_dom(page, tmp_path)
    check_rendered(static, dom, data)
    node_rects = re.findall(r'<rect class="event"[^>]*data-cat="node"', dom)
    assert len(node_rects) == sum(1 for e in data["timeline"]["events"] if e["cat"] == "node") > 0
    assert re.search(r"total time</th>", dom)  # per-node times from the profiler's summary


@requires_chromium
def test_html_escapes_names_that_look_like_markup(tmp_path):
    """Node and event names are data, not markup: a name holding </script> neither ends the JSON block nor runs."""
    session = xrt.InferenceSession(str(TINY), engine="native")
    session.run({"x": np.ones((1, 8), np.float32)})
    data = report.build_report(session, model=TINY)
    evil = '</script><script>document.title="pwned"</script><b>x</b>'
    data["nodes"][0]["node"] = evil
    data["timeline"] = {"source": "test", "events": [
        {"name": evil, "cat": "node", "ts_us": 0.0, "dur_us": 5.0, "pid": 1, "tid": 1, "args": {}},
        {"name": "second", "cat": "kernel", "ts_us": 2.0, "dur_us": 1.0, "pid": 1, "tid": 2, "args": {"k": 1}},
    ]}
    page = tmp_path / "evil.html"
    page.write_text(report.render_html(data))
    dom = dump_dom(page, tmp_path)
    assert "pwned" not in re.search(r"<title>(.*?)</title>", dom, re.S).group(1)
    assert "<b>x</b>" not in dom.split("</h1>", 1)[1].split('id="report-data"')[0]
    check_rendered(page.read_text(), dom, data)
