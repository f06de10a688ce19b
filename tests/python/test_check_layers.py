"""The layering check (scripts/check_layers.py, issue 40 item 2): on a small fake tree it finds a core file including a
backend, a backend including an engine, a frontend including more than core and itself, a Python import circle (closed by an import inside a function), honours the
allowlist and fails on a new violation naming its file:line; on this repository it passes (the allowlist is current)."""

from __future__ import annotations

import pathlib
import subprocess
import sys
from typing import List

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "check_layers.py"


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=120)


def _write(root: pathlib.Path, rel: str, text: str) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def _fake_tree(root: pathlib.Path) -> pathlib.Path:
    cpp = "src/cpp/"
    _write(root, cpp + "include/xpuruntime/tensor.h", "#pragma once\n")
    _write(root, cpp + "include/xpuruntime/graph.h", '#pragma once\n#include "xpuruntime/tensor.h"\n')
    # core -> a backend (through a path relative to the including file, as core/tensor.cpp does today)
    _write(root, cpp + "core/tensor.cpp",
           '#include "xpuruntime/tensor.h"\n\n#include "../backends/cuda_raw/cuda_raw_ops.h"\n')
    _write(root, cpp + "include/xpuruntime/onnx_import.h", '#pragma once\n#include "xpuruntime/graph.h"\n')
    _write(root, cpp + "engines/native/passes/pass_utils.h",
           '#pragma once\n#include "xpuruntime/onnx_import.h"\n#include "xpuruntime/graph.h"\n')
    # allowed: a backend including core and itself, an engine including core and itself, bindings anything
    _write(root, cpp + "backends/cuda_raw/cuda_raw_ops.h",
           '#pragma once\n#include "xpuruntime/tensor.h"\n#include "xpuruntime/graph.h"\n')
    _write(root, cpp + "backends/cuda_raw/elementwise.cu",
           '#include "backends/cuda_raw/cuda_raw_ops.h"\n#include "onnx/generated.pb.h"\n')
    # a backend -> the native engine (a graph-pass helper)
    _write(root, cpp + "backends/cuda_raw/cuda_raw_register.cpp",
           '#include "cuda_raw_ops.h"\n#include "engines/native/passes/pass_utils.h"\n')
    _write(root, cpp + "engines/native/native_engine.cpp",
           '#include "xpuruntime/graph.h"\n#include "engines/native/passes/pass_utils.h"\n')
    _write(root, cpp + "bindings/module.cpp",
           '#include "backends/cuda_raw/cuda_raw_ops.h"\n#include "engines/native/passes/pass_utils.h"\n')
    # Python: a and b import each other, b only inside a function; c imports a at module level (no circle); the
    # package imports its compiled extension _core (no .py file), which is no edge to the package.
    _write(root, "src/python/pkg/__init__.py", "from . import _core\nfrom . import a\n")
    _write(root, "src/python/pkg/a.py", "import os\n\nfrom . import _core\nfrom .b import helper\n")
    _write(root, "src/python/pkg/b.py", "def helper():\n    from . import a\n    return a\n")
    _write(root, "src/python/pkg/c.py", "from pkg import a\n\n\ndef lazy():\n    import pkg.b\n")
    return root


def _lines(text: str) -> List[str]:
    return [line for line in text.splitlines() if line.strip()]


def test_finds_each_violation_and_the_circle(tmp_path):
    root = _fake_tree(tmp_path)
    result = _run("--root", str(root), "--report")
    assert result.returncode == 1, result.stdout + result.stderr  # no allowlist yet: every finding is new
    out = result.stdout
    assert "src/cpp/core/tensor.cpp:3: core includes backends/cuda_raw/cuda_raw_ops.h (backend:cuda_raw)" in out
    assert ("src/cpp/backends/cuda_raw/cuda_raw_register.cpp:2: backend:cuda_raw includes "
            "engines/native/passes/pass_utils.h (engine:native)") in out
    # The native engine's public header (include/xpuruntime/onnx_import.h) belongs to the engine, not to core; the
    # graph IR (include/xpuruntime/graph.h) is core, which a backend may include.
    assert "passes/pass_utils.h:2:" not in out
    assert "onnx_import.h:2:" not in out
    assert "xpuruntime/graph.h (" not in out
    assert "core-upward: core includes a backend or an engine: 1 file -> file pairs" in out
    assert "backend-sideways: a backend includes more than core and itself: 1 file -> file pairs" in out
    assert "engine-sideways: an engine includes more than core and itself (kernels go through the registry): 0" in out
    # the circle pkg.a <-> pkg.b, one edge of it inside a function; pkg.c and pkg._core are in no circle
    assert "src/python/pkg/a.py:4: pkg.a imports pkg.b (at module level)" in out
    assert "src/python/pkg/b.py:2: pkg.b imports pkg.a (inside function helper())" in out
    assert "circle 1: 2 modules: pkg.a, pkg.b" in out
    assert "1 circle(s) (strongly connected components), 0 of them at import time" in out
    assert "src/python/pkg/c.py:5: pkg.c imports pkg.b (inside function lazy())\n" in out  # listed, no circle
    assert "pkg.c" not in "".join(l for l in _lines(out) if "[new:" in l)
    assert "(1 name no file of the tree" in out  # onnx/generated.pb.h: not checked
    # bindings may include anything; an engine may include core and itself
    assert "bindings/module.cpp" not in out
    assert "native_engine.cpp" not in out


def test_allowlist_is_honoured_and_stale_entries_are_printed(tmp_path):
    root = _fake_tree(tmp_path)
    update = _run("--root", str(root), "--update")
    assert update.returncode == 0, update.stdout + update.stderr
    allowlist = root / "scripts" / "layers_allowlist.txt"
    entries = [l for l in _lines(allowlist.read_text()) if not l.startswith("#")]
    assert sorted(entries) == sorted([
        "core/tensor.cpp -> backends/cuda_raw/cuda_raw_ops.h",
        "backends/cuda_raw/cuda_raw_register.cpp -> engines/native/passes/pass_utils.h",
        "py: pkg.a -> pkg.b",
        "py: pkg.b -> pkg.a",
    ])
    ok = _run("--root", str(root))
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "4 finding(s), all in layers_allowlist.txt; none new" in ok.stdout

    # Editing elsewhere in a file moves line numbers but not the allowlist's text.
    _write(root, "src/cpp/core/tensor.cpp",
           '// a comment\n#include "xpuruntime/tensor.h"\n\n\n#include "../backends/cuda_raw/cuda_raw_ops.h"\n')
    assert _run("--root", str(root)).returncode == 0

    # Fixing one: the entry is printed as stale, the check still passes.
    _write(root, "src/python/pkg/b.py", "def helper():\n    return None\n")
    fixed = _run("--root", str(root))
    assert fixed.returncode == 0, fixed.stdout + fixed.stderr
    assert "no longer occurs, delete from layers_allowlist.txt: py: pkg.a -> pkg.b" in fixed.stdout
    assert "no longer occurs, delete from layers_allowlist.txt: py: pkg.b -> pkg.a" in fixed.stdout


def test_a_new_violation_fails_naming_its_line(tmp_path):
    root = _fake_tree(tmp_path)
    assert _run("--root", str(root), "--update").returncode == 0
    # a new upward include in core, a backend reaching another backend, an engine reaching a backend
    _write(root, "src/cpp/core/device_manager.cpp",
           '#include "xpuruntime/tensor.h"\n#include "backends/cuda_raw/cuda_raw_ops.h"\n')
    _write(root, "src/cpp/backends/cublas/cublas_gemm.cpp", '\n\n#include "backends/cuda_raw/cuda_raw_ops.h"\n')
    _write(root, "src/cpp/engines/onnxruntime/ort_engine.cpp", '#include "backends/cuda_raw/cuda_raw_ops.h"\n')
    # and a new module-level circle in Python
    _write(root, "src/python/pkg/d.py", "from . import e\n")
    _write(root, "src/python/pkg/e.py", "from . import d\n")
    result = _run("--root", str(root))
    assert result.returncode == 1
    out = result.stdout
    assert "src/cpp/core/device_manager.cpp:2: core includes backends/cuda_raw/cuda_raw_ops.h (backend:cuda_raw)" in out
    assert ("src/cpp/backends/cublas/cublas_gemm.cpp:3: backend:cublas includes backends/cuda_raw/cuda_raw_ops.h "
            "(backend:cuda_raw)") in out
    assert ("src/cpp/engines/onnxruntime/ort_engine.cpp:1: engine:onnxruntime includes "
            "backends/cuda_raw/cuda_raw_ops.h (backend:cuda_raw)") in out
    assert "src/python/pkg/d.py:1: pkg.d imports pkg.e (at module level)" in out
    assert "src/python/pkg/e.py:1: pkg.e imports pkg.d (at module level)" in out
    assert "5 new finding(s)" in out
    # The old, allowlisted findings are not reported as new.
    assert "core/tensor.cpp" not in out


def test_frontends_include_core_and_themselves_and_only_engines_include_them(tmp_path):
    """A frontend (frontends/<name>/**, the ONNX model check both engines share) includes only core and itself; engines
    and bindings may include it, core and backends may not."""
    root = _fake_tree(tmp_path)
    cpp = "src/cpp/"
    _write(root, cpp + "frontends/onnx/onnx_schemas.h", '#pragma once\n#include "xpuruntime/tensor.h"\n')
    _write(root, cpp + "frontends/onnx/onnx_check.h",
           '#pragma once\n#include "xpuruntime/graph.h"\n#include "onnx_schemas.h"\n')
    # a frontend reaching the native engine's public header, an engine and a backend: three findings
    _write(root, cpp + "frontends/onnx/onnx_validate.cpp",
           '#include "frontends/onnx/onnx_check.h"\n#include "xpuruntime/onnx_import.h"\n'
           '#include "engines/native/passes/pass_utils.h"\n#include "backends/cuda_raw/cuda_raw_ops.h"\n')
    # and another frontend
    _write(root, cpp + "frontends/tflite/tflite_check.cpp", '#include "frontends/onnx/onnx_check.h"\n')
    # engines and bindings may include a frontend
    _write(root, cpp + "engines/onnxruntime/ort_model_fixes.cpp",
           '#include "frontends/onnx/onnx_check.h"\n#include "frontends/onnx/onnx_schemas.h"\n')
    _write(root, cpp + "engines/native/import/onnx_import.cpp", '#include "frontends/onnx/onnx_check.h"\n')
    _write(root, cpp + "bindings/onnx.cpp", '#include "frontends/onnx/onnx_check.h"\n')
    # core and a backend may not
    _write(root, cpp + "core/engine.cpp", '#include "frontends/onnx/onnx_check.h"\n')
    _write(root, cpp + "backends/cpu/cpu_onnx_ops.cpp", '#include "frontends/onnx/onnx_schemas.h"\n')
    result = _run("--root", str(root), "--report")
    assert result.returncode == 1, result.stdout + result.stderr
    out = result.stdout
    assert ("src/cpp/frontends/onnx/onnx_validate.cpp:2: frontend:onnx includes include/xpuruntime/onnx_import.h "
            "(engine:native)  [new: frontend-sideways") in out
    assert ("src/cpp/frontends/onnx/onnx_validate.cpp:3: frontend:onnx includes engines/native/passes/pass_utils.h "
            "(engine:native)  [new: frontend-sideways") in out
    assert ("src/cpp/frontends/onnx/onnx_validate.cpp:4: frontend:onnx includes backends/cuda_raw/cuda_raw_ops.h "
            "(backend:cuda_raw)  [new: frontend-sideways") in out
    assert ("src/cpp/frontends/tflite/tflite_check.cpp:1: frontend:tflite includes frontends/onnx/onnx_check.h "
            "(frontend:onnx)  [new: frontend-sideways") in out
    assert "frontend-sideways: a frontend includes more than core and itself: 4 file -> file pairs" in out
    assert ("src/cpp/core/engine.cpp:1: core includes frontends/onnx/onnx_check.h (frontend:onnx)  "
            "[new: core-upward") in out
    assert ("src/cpp/backends/cpu/cpu_onnx_ops.cpp:1: backend:cpu includes frontends/onnx/onnx_schemas.h "
            "(frontend:onnx)  [new: backend-sideways") in out
    # a frontend including core and itself, engines and bindings including it: no finding
    assert "onnx_check.h:" not in out and "onnx_validate.cpp:1:" not in out
    assert "ort_model_fixes.cpp" not in out and "onnx_import.cpp" not in out and "bindings/onnx.cpp" not in out
    assert "engine-sideways: an engine includes more than core and itself (kernels go through the registry): 0" in out


def test_generation_includes_core_and_itself_only(tmp_path):
    """generation/** (the text-generation loop) drives sessions through InferenceSession's public API: it includes
    core and itself; an engine or a backend from there is a finding, and core may not include it."""
    root = _fake_tree(tmp_path)
    cpp = "src/cpp/"
    _write(root, cpp + "include/xpuruntime/generation.h", '#pragma once\n#include "xpuruntime/tensor.h"\n')
    _write(root, cpp + "generation/kv_cache.h", '#pragma once\n#include "xpuruntime/generation.h"\n')
    _write(root, cpp + "generation/generator.cpp",
           '#include "generation/kv_cache.h"\n#include "engines/native/passes/pass_utils.h"\n'
           '#include "backends/cuda_raw/cuda_raw_ops.h"\n')
    _write(root, cpp + "bindings/generation_binding.cpp", '#include "generation/kv_cache.h"\n')
    _write(root, cpp + "core/engine.cpp", '#include "generation/kv_cache.h"\n')
    result = _run("--root", str(root), "--report")
    assert result.returncode == 1, result.stdout + result.stderr
    out = result.stdout
    assert ("src/cpp/generation/generator.cpp:2: generation includes engines/native/passes/pass_utils.h "
            "(engine:native)  [new: generation-sideways") in out
    assert ("src/cpp/generation/generator.cpp:3: generation includes backends/cuda_raw/cuda_raw_ops.h "
            "(backend:cuda_raw)  [new: generation-sideways") in out
    assert "generation-sideways: generation includes more than core and itself" in out
    assert "src/cpp/core/engine.cpp:1: core includes generation/kv_cache.h (generation)  [new: core-upward" in out
    assert "generator.cpp:1:" not in out and "kv_cache.h:" not in out and "generation_binding.cpp" not in out


def test_this_repository_passes_with_its_allowlist():
    result = _run()
    assert result.returncode == 0, (
        "scripts/check_layers.py found a layering violation or import circle not in scripts/layers_allowlist.txt "
        "(docs/architecture.md):\n" + result.stdout + result.stderr)
