#!/usr/bin/env python3
"""Long C++ functions (issue 40, item 5): no function in src/cpp over 150 lines without a reason in a comment.

Scans src/cpp/**/*.{h,cpp,cu,cuh} and lists every function whose definition (from the first line of its signature to
its closing brace) is longer than --max-lines (150). A function is allowed when the comment block right above its
signature (contiguous `//` lines, blank lines not allowed between) has a line

    // Long function: <the reason it stays long>

with a non-empty reason (a big switch table, a kernel body, ...).

The scanner is a brace matcher, not a parser: comments, string and character literals (raw strings too) and
preprocessor lines are blanked first, then each `{` at namespace, class or file scope whose text since the previous
`;`, `{` or `}` ends like a function signature (`... ) const override {`, a constructor's `... ) : a_(x), b_{y} {`)
opens a function; everything inside it (lambdas, local classes) counts as the function's. A `{` after a
namespace/class/struct/union/enum head opens a scope whose members are looked at again; any other brace at those
scopes (an initializer such as `= {...}`) is skipped. That is exact enough for this codebase: the fake trees of
tests/python/test_long_functions.py show what it finds.

  .venv/bin/python scripts/long_functions.py                    # the check over src/cpp: exit 1 on a long
                                                                 # function without a reason
  .venv/bin/python scripts/long_functions.py engines/native     # the check over folders (or files) of src/cpp
  .venv/bin/python scripts/long_functions.py --report [PATH...]  # every long function, with or without a reason;
                                                                 # exit 0

scripts/test.sh runs the check over all of src/cpp; --report lists every long function, the explained ones too.
Standard library only. --root TREE scans TREE/src/cpp instead of this repository's (the tests' fake trees).
"""

from __future__ import annotations

import argparse
import dataclasses
import pathlib
import re
import sys
from typing import List, Optional, Sequence

EXTENSIONS = (".h", ".cpp", ".cu", ".cuh")
MAX_LINES = 150
REASON = re.compile(r"//\s*Long function:\s*\S")
SCOPE_HEAD = re.compile(r"^(?:template\s*<.*>\s*)?(?:typedef\s+)?(?:namespace|class|struct|union|enum)\b|^extern\b")
CONTROL = re.compile(r"^(?:if|for|while|switch|catch|do|else|try|return)\b")
# What may follow a signature's closing parenthesis before its body: qualifiers and a trailing return type.
SIGNATURE_END = re.compile(
    r"\)\s*(?:(?:const|override|final|noexcept|mutable|volatile|&&|&)\s*|noexcept\s*\([^()]*\)\s*|->\s*[\w:<>,*&\s]+)*$"
)
ACCESS_LABEL = re.compile(r"(?:public|private|protected)\s*:(?!:)\s*")
# A constructor's member initializer list: `) : member(...)` (not `::`).
INITIALIZER_LIST = re.compile(r"\)\s*(?:noexcept\s*)?:(?!:)")


@dataclasses.dataclass
class Function:
    path: str     # relative to src/cpp
    line: int     # 1-based, the signature's first line
    name: str
    lines: int
    reason: bool  # a `// Long function: ...` comment right above it

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.name} ({self.lines} lines)"


def blank_code(text: str) -> str:
    """`text` with comments, string and character literals and preprocessor lines replaced by spaces (newlines
    kept, so offsets and line numbers stay)."""
    out = list(text)
    i, n = 0, len(text)
    at_line_start = True

    def blank(a: int, b: int) -> None:
        for k in range(a, min(b, n)):
            if out[k] != "\n":
                out[k] = " "

    while i < n:
        c = text[i]
        if c == "\n":
            at_line_start = True
            i += 1
            continue
        if at_line_start and c in " \t":
            i += 1
            continue
        if at_line_start and c == "#":  # a preprocessor line, with its continuations
            j = i
            while j < n and text[j] != "\n":
                if text[j] == "\\" and j + 1 < n and text[j + 1] == "\n":
                    j += 2
                    continue
                if text.startswith("/*", j):  # a comment starting on the directive line
                    end = text.find("*/", j + 2)
                    j = n if end < 0 else end + 2
                    continue
                j += 1
            blank(i, j)
            i = j
            continue
        at_line_start = False
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            blank(i, j)
            i = j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            blank(i, j)
            i = j
        elif c == '"':
            raw = re.match(r'R"([^(\s]{0,16})\(', text[i - 1:i + 20]) if i > 0 and text[i - 1] == "R" else None
            if raw:
                end = text.find(")" + raw.group(1) + '"', i)
                j = n if end < 0 else end + len(raw.group(1)) + 2
            else:
                j = i + 1
                while j < n and text[j] != '"' and text[j] != "\n":
                    j += 2 if text[j] == "\\" else 1
                j += 1
            blank(i + 1, j - 1)
            i = j
        elif c == "'":
            if i > 0 and text[i - 1].isalnum():  # a digit separator (1'000) or a u8'x' prefix
                if text[i - 1].isdigit():
                    i += 1
                    continue
            j = i + 1
            while j < n and text[j] != "'" and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            j += 1
            blank(i + 1, j - 1)
            i = j
        else:
            i += 1
    return "".join(out)


def matching_brace(code: str, open_at: int) -> int:
    depth = 0
    for k in range(open_at, len(code)):
        if code[k] == "{":
            depth += 1
        elif code[k] == "}":
            depth -= 1
            if depth == 0:
                return k
    return len(code) - 1


def function_name(header: str) -> str:
    """The name before the parameter list: the last top-level parenthesised group (not a noexcept's), or for a
    constructor with a member initializer list the last one before its `:`."""
    init = INITIALIZER_LIST.search(header)
    text = header[:init.start() + 1] if init else header
    groups = []  # (open, close) of top-level parenthesised groups
    depth, open_at = 0, -1
    for k, c in enumerate(text):
        if c == "(":
            if depth == 0:
                open_at = k
            depth += 1
        elif c == ")" and depth > 0:
            depth -= 1
            if depth == 0:
                groups.append((open_at, k))
    for open_at, _ in reversed(groups):
        head = text[:open_at].rstrip()
        if head.endswith("noexcept"):
            continue
        if head.endswith("operator") and text[open_at:].startswith("()"):
            continue  # operator()'s own "()": the parameter list is the next group
        m = re.search(r"(operator\s*(?:\(\s*\)|[^\w\s(]+|\w+)|~?[\w:]+)$", head)
        return m.group(1) if m else "?"
    return "?"


def has_reason(lines: List[str], first_line: int) -> bool:
    """Whether the `//` comment block right above line `first_line` (1-based) gives a reason."""
    k = first_line - 2
    while k >= 0 and lines[k].strip().startswith("//"):
        if REASON.search(lines[k]):
            return True
        k -= 1
    return False


def scan(text: str, path: str, max_lines: int = MAX_LINES) -> List[Function]:
    """Every function of `text` longer than `max_lines` lines."""
    code = blank_code(text)
    lines = text.split("\n")
    found: List[Function] = []

    def line_of(offset: int) -> int:
        return code.count("\n", 0, offset) + 1

    def walk(begin: int, end: int) -> None:  # a scope's members: code[begin:end]
        start = begin  # where the current member's text began
        k = begin
        while k < end:
            c = code[k]
            if c in ";}":
                start = k + 1
            elif c == "{":
                header = " ".join(code[start:k].split())
                close = matching_brace(code, k)
                if header.count("(") > header.count(")"):
                    # Inside a parameter list (a default argument `x = {}`): part of the header.
                    k = close + 1
                    continue
                if SCOPE_HEAD.match(header) and "(" not in header.split("{")[0].split("=")[0] or header.startswith(
                        "extern") or header.startswith("namespace"):
                    walk(k + 1, close)
                    start = close + 1
                    k = close + 1
                    continue
                is_ctor_init = INITIALIZER_LIST.search(header) is not None
                if is_ctor_init and not SIGNATURE_END.search(header) and not header.endswith("}"):
                    # A brace initializer of the member initializer list (`b_{y}`): part of the header.
                    k = close + 1
                    continue
                if "(" in header and not CONTROL.match(header) and (SIGNATURE_END.search(header) or is_ctor_init) \
                        and "=" not in re.sub(r"\([^()]*\)|operator\s*\S+", "", header.split("(")[0]):
                    first = start
                    while first < k and code[first].isspace():
                        first += 1
                    label = ACCESS_LABEL.match(code, first)
                    if label:  # `public:` before a member function is no line of it
                        first = label.end()
                    first_line = line_of(first)
                    length = line_of(close) - first_line + 1
                    if length > max_lines:
                        found.append(Function(path, first_line, function_name(header), length,
                                              has_reason(lines, first_line)))
                start = close + 1
                k = close + 1
                continue
            k += 1

    walk(0, len(code))
    return found


def scan_tree(cpp_root: pathlib.Path, paths: Sequence[str], max_lines: int = MAX_LINES) -> List[Function]:
    files: List[pathlib.Path] = []
    for p in paths or ["."]:
        target = (cpp_root / p).resolve()
        if target.is_file():
            files.append(target)
        elif target.is_dir():
            files.extend(f for f in sorted(target.rglob("*")) if f.suffix in EXTENSIONS and f.is_file())
        else:
            raise SystemExit(f"long_functions.py: no such file or folder under {cpp_root}: {p}")
    found: List[Function] = []
    for f in sorted(set(files)):
        found.extend(scan(f.read_text(encoding="utf-8", errors="replace"), f.relative_to(cpp_root.resolve()).as_posix(),
                          max_lines))
    return found


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("paths", nargs="*", help="folders or files under src/cpp (default: all of it)")
    parser.add_argument("--report", action="store_true", help="list every long function and exit 0")
    parser.add_argument("--root", default=str(pathlib.Path(__file__).resolve().parents[1]),
                        help="the repository (its src/cpp is scanned)")
    parser.add_argument("--max-lines", type=int, default=MAX_LINES)
    args = parser.parse_args(argv)
    cpp_root = pathlib.Path(args.root) / "src" / "cpp"
    found = scan_tree(cpp_root, args.paths, args.max_lines)
    unexplained = [f for f in found if not f.reason]
    if args.report:
        for f in found:
            print(f"{f}{'' if f.reason else '  [no reason]'}")
        print(f"{len(found)} function(s) over {args.max_lines} lines, {len(unexplained)} without a "
              f"'// Long function: <reason>' comment")
        return 0
    for f in unexplained:
        print(f"src/cpp/{f}: over {args.max_lines} lines; split it, or say why it stays long in a "
              f"'// Long function: <reason>' comment right above it")
    if unexplained:
        return 1
    print(f"long functions: none over {args.max_lines} lines without a reason "
          f"({len(found)} with one) in {', '.join(args.paths) or 'src/cpp'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
