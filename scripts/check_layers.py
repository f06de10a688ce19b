#!/usr/bin/env python3
"""The layering check (issue 40, item 2; STYLE.md habit 15): layers point down, and Python imports make no circle.

C++: every `#include "..."` line of src/cpp/**/*.{h,cpp,cu,cuh,inc} is resolved the way the build resolves it (the
including file's folder first, then the -I folders src/cpp and src/cpp/include: src/cpp/CMakeLists.txt gives both to
the core and, through xpurt_backend_common, to every backend) and both ends are put in a layer by their path under
src/cpp. An include that resolves to no file of the tree (a generated header: onnx/onnx-ml.pb.h,
cublaslt_enum_names.inc) is not checked; `--report` counts them.

  Layer               Paths under src/cpp (the first row that matches decides)
  ------------------  ------------------------------------------------------------------------------------------------
  bindings            bindings/**
  engine:<name>       engines/<name>/**                  (native, onnxruntime, tensorrt, openvino, qnn)
  engine:native       engines/native/**, and the native engine's public headers
                      include/xpuruntime/{onnx_import,capture_plan,graph_exec}.h (its ONNX import, plan and exec:
                      implemented in engines/native/, they are no part of core's contract; the graph IR,
                      include/xpuruntime/graph.h with core/graph.cpp, is core, like ONNX Runtime's core/graph)
  engine:onnxruntime  engines/onnxruntime/**
  frontend:<name>     frontends/<name>/**                (onnx: ONNX's schemas, the model check and external data,
                                                          which both engines share)
  backend:<name>      backends/<name>/**                 (cpu, cuda_raw, cublas, cublaslt, cudnn, codegen, nccl)
  generation          generation/**                      (the text-generation loop over InferenceSession; its
                                                          public header include/xpuruntime/generation.h is core's)
  core                core/** (what the rows above leave), include/** (the other public headers)

  Rule                 An include is a violation when
  -------------------  -----------------------------------------------------------------------------------------------
  core-upward          a core file includes a file of any other layer (a backend, a frontend or an engine)
  backend-sideways     a backend:<x> file includes anything but core and backend:<x> (another backend, a frontend, an
                       engine)
  frontend-sideways    a frontend:<x> file includes anything but core and frontend:<x> (a backend, an engine, another
                       frontend)
  engine-sideways      an engine:<x> file includes anything but core, frontends and engine:<x> (a backend: kernels are
                       reached through the KernelRegistry; another engine)
  generation-sideways  a generation file includes anything but core and generation (it drives sessions through
                       InferenceSession's public API, never an engine, frontend or backend directly)
  (bindings may include anything.)

Python: the import graph of every package under src/python (today: xpuruntime). `import` and `from ... import`
statements are read with `ast`; relative imports are resolved; `from pkg import name` is an edge to the module
pkg.name when there is one, else to pkg. Imports inside a function (at any depth) are edges too, marked as such: the
issue asks for no import inside a function that exists to break a circle, so such an import closing a circle counts
as the circle it closes. Imports under `if TYPE_CHECKING:` run at no time and are left out. Implicit imports of
parent packages are not edges (every submodule would otherwise be in a circle with its package's __init__).

  python-cycle         an import edge between two modules of one strongly connected component (Tarjan) of the
                       graph: each edge of a circle is one finding, so a circle that shrinks leaves stale entries
                       rather than new ones, and an edge added to a circle is new.

The ratchet: scripts/layers_allowlist.txt lists today's findings, one a line, as text without line numbers
(`core/tensor.cpp -> backends/cuda_raw/cuda_raw_ops.h`, `py: xpuruntime.pytorch._native -> xpuruntime.pytorch._mode`).
Exit 0 when every finding is in the allowlist; exit 1 naming each new finding with its file:line. Allowlist entries
that no longer occur are printed (exit status unchanged) so that they can be deleted. `--update` rewrites the
allowlist from the tree; `--report` prints every finding grouped by rule with counts (then checks as usual).

Standard library only (Python 3.11). Run from anywhere: .venv/bin/python scripts/check_layers.py [--root TREE].
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import pathlib
import re
import sys
from collections import defaultdict
from typing import Dict, Iterable, List, Optional, Sequence, Set, Tuple

CPP_EXTENSIONS = (".h", ".cpp", ".cu", ".cuh", ".inc")
INCLUDE_RE = re.compile(r'^\s*#\s*include\s*"([^"]+)"')
# The native engine's public headers: its ONNX import, plan and exec (see the table above).
NATIVE_PUBLIC_HEADERS = frozenset(
    f"include/xpuruntime/{name}.h" for name in ("onnx_import", "capture_plan", "graph_exec"))
# Folders under src/cpp/backends/ that hold engines, not kernel backends (until issue 40 moves them to engines/).
ENGINES_UNDER_BACKENDS = frozenset({"native", "onnxruntime"})

RULES = {
    "core-upward": "core includes a backend or an engine",
    "backend-sideways": "a backend includes more than core and itself",
    "frontend-sideways": "a frontend includes more than core and itself",
    "engine-sideways": "an engine includes more than core and itself (kernels go through the registry)",
    "generation-sideways": "generation includes more than core and itself (sessions through InferenceSession)",
    "python-cycle": "Python modules import each other in a circle",
}


@dataclasses.dataclass
class Finding:
    rule: str
    key: str                 # the allowlist text: stable, no line numbers
    locations: List[str]     # "path:line: what", one per statement that makes the finding


# ---------------------------------------------------------------------------------------------------------------- C++

def cpp_layer(rel: str) -> Optional[str]:
    """The layer of a file given by its path relative to src/cpp ('/'-separated); None: in no layer (checked by no
    rule, e.g. src/cpp/CMakeLists.txt's neighbours)."""
    parts = rel.split("/")
    top = parts[0]
    if top == "bindings":
        return "bindings"
    if top == "engines" and len(parts) > 2:
        return f"engine:{parts[1]}"
    if top == "generation" and len(parts) > 1:
        return "generation"
    if top == "frontends" and len(parts) > 2:
        return f"frontend:{parts[1]}"
    if top == "backends" and len(parts) > 2:
        name = parts[1]
        return f"engine:{name}" if name in ENGINES_UNDER_BACKENDS else f"backend:{name}"
    if top == "core" and len(parts) > 2 and parts[1] in ("runtime", "onnx"):
        return "engine:native"
    if rel in NATIVE_PUBLIC_HEADERS:
        return "engine:native"
    if top in ("core", "include"):
        return "core"
    return None


def include_rule(src_layer: str, dst_layer: str) -> Optional[str]:
    """The rule an include from `src_layer` to `dst_layer` breaks, or None."""
    if src_layer == "bindings" or dst_layer == "core" or src_layer == dst_layer:
        return None
    if src_layer == "core":
        return "core-upward"
    if src_layer.startswith("backend:"):
        return "backend-sideways"
    if src_layer.startswith("frontend:"):
        return "frontend-sideways"
    if src_layer == "generation":
        return "generation-sideways"
    if src_layer.startswith("engine:"):
        return None if dst_layer.startswith("frontend:") else "engine-sideways"
    return None


def resolve_include(cpp_root: pathlib.Path, including: pathlib.Path, spelled: str) -> Optional[pathlib.Path]:
    """The file of the tree an `#include "spelled"` in `including` names, searched as the compiler does for a quoted
    include under the build's -I folders; None when it is none of the tree's files (generated or external)."""
    for folder in (including.parent, cpp_root, cpp_root / "include"):
        candidate = folder / spelled
        if candidate.is_file():
            resolved = candidate.resolve()
            try:
                resolved.relative_to(cpp_root.resolve())
            except ValueError:
                return None
            return resolved
    return None


def scan_cpp(root: pathlib.Path) -> Tuple[List[Finding], Dict[str, int]]:
    cpp_root = root / "src" / "cpp"
    stats = {"files": 0, "includes": 0, "unresolved": 0}
    findings: Dict[str, Finding] = {}
    if not cpp_root.is_dir():
        return [], stats
    cpp_root_resolved = cpp_root.resolve()
    files = sorted(p for p in cpp_root.rglob("*") if p.is_file() and p.suffix in CPP_EXTENSIONS)
    for path in files:
        rel = path.resolve().relative_to(cpp_root_resolved).as_posix()
        src_layer = cpp_layer(rel)
        stats["files"] += 1
        text = path.read_text(encoding="utf-8", errors="replace")
        for lineno, line in enumerate(text.splitlines(), start=1):
            match = INCLUDE_RE.match(line)
            if not match:
                continue
            stats["includes"] += 1
            target = resolve_include(cpp_root, path, match.group(1))
            if target is None:
                stats["unresolved"] += 1
                continue
            dst_rel = target.relative_to(cpp_root_resolved).as_posix()
            dst_layer = cpp_layer(dst_rel)
            if src_layer is None or dst_layer is None:
                continue
            rule = include_rule(src_layer, dst_layer)
            if rule is None:
                continue
            key = f"{rel} -> {dst_rel}"
            where = f"src/cpp/{rel}:{lineno}: {src_layer} includes {dst_rel} ({dst_layer})"
            findings.setdefault(key, Finding(rule, key, [])).locations.append(where)
    return list(findings.values()), stats


# ------------------------------------------------------------------------------------------------------------- Python

@dataclasses.dataclass
class Import:
    source: str              # importing module
    target: str              # imported module of the package
    path: str                # the importing file, relative to the root
    line: int
    function: Optional[str]  # qualified name of the enclosing function; None: at module level (or in a class body)


def python_modules(root: pathlib.Path) -> Dict[str, pathlib.Path]:
    """Every module of every package under src/python: dotted name -> file (a package is its __init__.py)."""
    base = root / "src" / "python"
    modules: Dict[str, pathlib.Path] = {}
    if not base.is_dir():
        return modules
    for path in sorted(base.rglob("*.py")):
        rel = path.relative_to(base)
        parts = list(rel.with_suffix("").parts)
        # Only files inside packages: every folder from src/python down to the file has an __init__.py.
        if not all((base.joinpath(*parts[:i]) / "__init__.py").is_file() for i in range(1, len(parts))):
            continue
        if len(parts) == 1 and parts[0] != "__init__":
            continue  # a lone script beside the packages
        if parts[-1] == "__init__":
            parts = parts[:-1]
        if parts:
            modules[".".join(parts)] = path
    return modules


def _is_extension(modules: Dict[str, pathlib.Path], package: str, name: str) -> bool:
    """Whether `from package import name` names a submodule that is no .py file of the tree (a compiled extension
    such as xpuruntime._core, built or not): a file package/name.*.so|.pyd|.pyi, or a name that the package's
    __init__.py binds only by importing it from itself (`from . import _core`). Such a module imports nothing of
    the package, so it is no edge of a circle. Any other name is an attribute of the package: an edge to it."""
    init = modules[package]
    if init.name != "__init__.py":
        return False
    folder = init.parent
    if any(folder.glob(f"{name}.*.so")) or any(folder.glob(f"{name}.*.pyd")) or (folder / f"{name}.pyi").is_file():
        return True
    bound_as_submodule = False
    for node in ast.parse(init.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.ImportFrom):
            for alias in node.names:
                if (alias.asname or alias.name) != name:
                    continue
                if node.level == 1 and node.module is None and alias.name == name:
                    bound_as_submodule = True
                else:
                    return False
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == name:
            return False
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id == name for t in targets):
                return False
        elif isinstance(node, ast.Import) and any((a.asname or a.name) == name for a in node.names):
            return False
    return bound_as_submodule


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


class _ImportCollector(ast.NodeVisitor):
    def __init__(self) -> None:
        self.scope: List[str] = []
        self.function_depth = 0
        self.found: List[Tuple[ast.stmt, Optional[str]]] = []

    def _function(self, node: ast.AST) -> None:
        self.scope.append(node.name)  # type: ignore[attr-defined]
        self.function_depth += 1
        self.generic_visit(node)
        self.function_depth -= 1
        self.scope.pop()

    visit_FunctionDef = _function
    visit_AsyncFunctionDef = _function

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        self.scope.append(node.name)
        self.generic_visit(node)
        self.scope.pop()

    def visit_If(self, node: ast.If) -> None:
        if _is_type_checking(node.test):
            for child in node.orelse:
                self.visit(child)
            return
        self.generic_visit(node)

    def _import(self, node: ast.stmt) -> None:
        self.found.append((node, ".".join(self.scope) if self.function_depth else None))

    visit_Import = _import
    visit_ImportFrom = _import


def scan_python_imports(root: pathlib.Path) -> Tuple[Dict[str, pathlib.Path], List[Import]]:
    modules = python_modules(root)
    imports: List[Import] = []
    for name, path in modules.items():
        is_package = path.name == "__init__.py"
        package = name if is_package else name.rpartition(".")[0]
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        collector = _ImportCollector()
        collector.visit(tree)
        rel = path.relative_to(root).as_posix()
        for node, function in collector.found:
            targets: List[str] = []
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name in modules:
                        targets.append(alias.name)
            else:
                assert isinstance(node, ast.ImportFrom)
                if node.level:
                    anchor = package.split(".") if package else []
                    if node.level - 1 > len(anchor):
                        continue  # beyond the top package: Python itself refuses it
                    anchor = anchor[:len(anchor) - (node.level - 1)]
                    base = ".".join(anchor + ([node.module] if node.module else []))
                else:
                    base = node.module or ""
                for alias in node.names:
                    submodule = f"{base}.{alias.name}" if base else alias.name
                    if alias.name != "*" and submodule in modules:
                        targets.append(submodule)
                    elif base in modules and (alias.name == "*" or not _is_extension(modules, base, alias.name)):
                        targets.append(base)
            for target in dict.fromkeys(targets):
                if target != name:
                    imports.append(Import(name, target, rel, node.lineno, function))
    return modules, imports


def strongly_connected_components(nodes: Iterable[str], edges: Dict[str, Set[str]]) -> List[List[str]]:
    """Tarjan's algorithm (iterative); each component sorted, components in order of their first module."""
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    on_stack: Set[str] = set()
    stack: List[str] = []
    components: List[List[str]] = []
    counter = 0
    for start in sorted(nodes):
        if start in index:
            continue
        work: List[Tuple[str, Iterable[str]]] = [(start, iter(sorted(edges.get(start, ()))))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            advanced = False
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                    advanced = True
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            if advanced:
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                components.append(sorted(component))
    return sorted(components, key=lambda c: c[0])


def python_cycles(modules: Dict[str, pathlib.Path], imports: Sequence[Import],
                  module_level_only: bool = False) -> List[List[str]]:
    edges: Dict[str, Set[str]] = defaultdict(set)
    for imp in imports:
        if module_level_only and imp.function is not None:
            continue
        edges[imp.source].add(imp.target)
    return [c for c in strongly_connected_components(modules, edges)
            if len(c) > 1 or c[0] in edges.get(c[0], ())]


def _describe(imp: Import) -> str:
    where = f"inside function {imp.function}()" if imp.function else "at module level"
    return f"{imp.path}:{imp.line}: {imp.source} imports {imp.target} ({where})"


def scan_python(root: pathlib.Path) -> Tuple[List[Finding], Dict[str, object]]:
    modules, imports = scan_python_imports(root)
    cycles = python_cycles(modules, imports)
    component_of = {m: i for i, c in enumerate(cycles) for m in c}
    findings: Dict[str, Finding] = {}
    for imp in sorted(imports, key=lambda i: (i.source, i.target, i.line)):
        c = component_of.get(imp.source)
        if c is None or component_of.get(imp.target) != c:
            continue
        key = f"py: {imp.source} -> {imp.target}"
        findings.setdefault(key, Finding("python-cycle", key, [])).locations.append(_describe(imp))
    details = {
        "modules": modules,
        "imports": imports,
        "cycles": cycles,
        "import_time_cycles": python_cycles(modules, imports, module_level_only=True),
    }
    return list(findings.values()), details


# ------------------------------------------------------------------------------------------------------------ ratchet

ALLOWLIST_HEADER = """\
# Today's layering findings (scripts/check_layers.py; docs/architecture.md, "Layering rules"). The check fails on a
# finding not listed here; it prints listed ones that no longer occur. Each line is removed as issue 40's moves fix it:
# never add one by hand to let a new include or import through.
# Regenerate: .venv/bin/python scripts/check_layers.py --update
"""


def read_allowlist(path: pathlib.Path) -> List[str]:
    if not path.is_file():
        return []
    entries = []
    for line in path.read_text(encoding="utf-8").splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            entries.append(line)
    return entries


def write_allowlist(path: pathlib.Path, findings: Sequence[Finding]) -> None:
    by_rule: Dict[str, List[str]] = defaultdict(list)
    for f in findings:
        by_rule[f.rule].append(f.key)
    out = [ALLOWLIST_HEADER]
    for rule, description in RULES.items():
        keys = sorted(by_rule.get(rule, []))
        if not keys:
            continue
        out.append(f"\n# {rule}: {description} ({len(keys)})\n")
        out.extend(k + "\n" for k in keys)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(out), encoding="utf-8")


def print_report(findings: Sequence[Finding], cpp_stats: Dict[str, int], py: Dict[str, object]) -> None:
    by_rule: Dict[str, List[Finding]] = defaultdict(list)
    for f in findings:
        by_rule[f.rule].append(f)
    print(f"C++: {cpp_stats['files']} files, {cpp_stats['includes']} quoted includes "
          f"({cpp_stats['unresolved']} name no file of the tree: generated or external, not checked)")
    for rule, description in RULES.items():
        group = sorted(by_rule.get(rule, []), key=lambda f: f.key)
        count = sum(len(f.locations) for f in group)
        unit = "edges" if rule == "python-cycle" else "file -> file pairs"
        print(f"\n== {rule}: {description}: {len(group)} {unit}, {count} lines")
        for f in group:
            print(f"  {f.key}")
            for where in f.locations:
                print(f"      {where}")
    cycles: List[List[str]] = py["cycles"]  # type: ignore[assignment]
    import_time: List[List[str]] = py["import_time_cycles"]  # type: ignore[assignment]
    imports: List[Import] = py["imports"]  # type: ignore[assignment]
    print(f"\nPython: {len(py['modules'])} modules, {len(imports)} import edges within the packages; "  # type: ignore
          f"{len(cycles)} circle(s) (strongly connected components), {len(import_time)} of them at import time "
          "(module-level imports alone)")
    for i, component in enumerate(cycles, start=1):
        members = set(component)
        closing = [imp for imp in imports
                   if imp.source in members and imp.target in members and imp.function is not None]
        print(f"  circle {i}: {len(component)} modules: {', '.join(component)}; "
              f"{len(closing)} of its imports are inside functions")
    in_functions = sorted((imp for imp in imports if imp.function is not None), key=lambda i: (i.path, i.line))
    component_of = {m: i for i, c in enumerate(cycles) for m in c}
    print(f"\nPython imports inside functions ({len(in_functions)}; those marked close a circle):")
    for imp in in_functions:
        c = component_of.get(imp.source)
        mark = "  [closes a circle]" if c is not None and component_of.get(imp.target) == c else ""
        print(f"  {_describe(imp)}{mark}")
    print()


def main(argv: Optional[Sequence[str]] = None) -> int:
    default_root = pathlib.Path(__file__).resolve().parent.parent
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", type=pathlib.Path, default=default_root,
                        help="the tree to check (holds src/cpp and src/python; default: this repository)")
    parser.add_argument("--allowlist", type=pathlib.Path, default=None,
                        help="default: ROOT/scripts/layers_allowlist.txt")
    parser.add_argument("--update", action="store_true", help="rewrite the allowlist with today's findings")
    parser.add_argument("--report", action="store_true", help="print every finding grouped by rule, with counts")
    args = parser.parse_args(argv)
    root = args.root.resolve()
    if not (root / "src").is_dir():
        print(f"check_layers: {root} has no src/ folder (pass --root the repository)", file=sys.stderr)
        return 2
    allowlist_path = args.allowlist or root / "scripts" / "layers_allowlist.txt"

    cpp_findings, cpp_stats = scan_cpp(root)
    py_findings, py_details = scan_python(root)
    findings = cpp_findings + py_findings

    if args.report:
        print_report(findings, cpp_stats, py_details)
    if args.update:
        write_allowlist(allowlist_path, findings)
        print(f"check_layers: wrote {len(findings)} entries to {allowlist_path}")
        return 0

    allowed = set(read_allowlist(allowlist_path))
    new = [f for f in findings if f.key not in allowed]
    current = {f.key for f in findings}
    stale = sorted(allowed - current)
    for entry in stale:
        print(f"check_layers: no longer occurs, delete from {allowlist_path.name}: {entry}")
    if new:
        for f in sorted(new, key=lambda f: (f.rule, f.key)):
            for where in f.locations:
                print(f"{where}  [new: {f.rule}: {RULES[f.rule]}]")
        print(f"check_layers: {len(new)} new finding(s) not in {allowlist_path} (docs/architecture.md says where code "
              "goes; the allowlist holds only what existed before the check)")
        return 1
    print(f"check_layers: {len(findings)} finding(s), all in {allowlist_path.name}; none new"
          + (f"; {len(stale)} stale entr{'y' if len(stale) == 1 else 'ies'}" if stale else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
