"""The long-function check (scripts/long_functions.py, issue 40 item 5): on a small fake tree a function over 150
lines fails naming its file:line, the same function with a `// Long function: <reason>` comment above it passes;
braces in strings, comments, default arguments and member initializers do not confuse it; on this repository all of
src/cpp passes, as scripts/test.sh checks it."""

from __future__ import annotations

import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "long_functions.py"


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=120)


def _body(lines: int) -> str:
    return "".join(f"  total += {k};  // '{{' in a comment\n" for k in range(lines))


def _tree(root: pathlib.Path, reason: bool) -> None:
    cpp = root / "src" / "cpp" / "engines" / "native"
    cpp.mkdir(parents=True)
    comment = "// Long function: one table of cases, split it and the cases scatter\n" if reason else ""
    (cpp / "long.cpp").write_text(
        "#include <string>\n"
        "namespace x {\n"
        "namespace {\n"
        "const char* kBrace = \"{ not a scope\";\n"
        "}  // namespace\n"
        "\n"
        "// Sums things.\n"
        + comment +
        "int long_one(int a, std::string s = {}) {\n"
        "  int total = a;\n"
        + _body(160) +
        "  return total;\n"
        "}\n"
        "\n"
        "class Short {\n"
        " public:\n"
        "  Short(int a) : a_(a), b_{a} {\n"
        + _body(20) +
        "  }\n"
        "  int a_, b_;\n"
        "};\n"
        "}  // namespace x\n")


def test_a_long_function_without_a_reason_fails_naming_it(tmp_path: pathlib.Path) -> None:
    _tree(tmp_path, reason=False)
    result = _run("--root", str(tmp_path))
    assert result.returncode == 1, result.stdout + result.stderr
    assert "src/cpp/engines/native/long.cpp:8: long_one (164 lines)" in result.stdout
    assert "Short" not in result.stdout


def test_a_long_function_with_a_reason_passes(tmp_path: pathlib.Path) -> None:
    _tree(tmp_path, reason=True)
    result = _run("--root", str(tmp_path))
    assert result.returncode == 0, result.stdout + result.stderr
    report = _run("--root", str(tmp_path), "--report")
    assert report.returncode == 0
    assert "long.cpp:9: long_one (164 lines)" in report.stdout and "[no reason]" not in report.stdout


def test_report_mode_lists_without_failing(tmp_path: pathlib.Path) -> None:
    _tree(tmp_path, reason=False)
    result = _run("--root", str(tmp_path), "--report", "--max-lines", "10")
    assert result.returncode == 0
    assert "long_one" in result.stdout and "Short (22 lines)  [no reason]" in result.stdout


def test_src_cpp_has_no_unexplained_long_function() -> None:
    # What scripts/test.sh runs: the check over all of src/cpp (no folder named).
    result = _run()
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 without a" in _run("--report").stdout
