#!/usr/bin/env python3
"""A structural fuzzing campaign of both engines (docs/reliability.md, Fuzzing).

Mutants come from ``fuzz_mutate`` (tests/fuzz/structure_mutator.h: 1-3 protobuf-structure edits of a real model:
inputs dropped, repeated or rewired, op types swapped, attributes retyped, shapes, dtypes and initializers changed,
nodes dropped, repeated or reordered, opset and IR versions changed, control-flow bodies too). Each mutant runs in
one long-lived ``fuzz_worker`` per engine (model -> InferenceSession on the CPU -> one run on zero inputs, the
libFuzzer harnesses' code), which is started again when a mutant kills it or runs past the per-mutant deadline.

Each mutant ends as one of: ``ran`` (created and ran), ``built`` (created, not run: inputs too large or not
tensors), ``typed`` (an XpuRuntimeError: what bad input must give), ``untyped`` (another C++ exception: a
finding), ``crash`` (the worker died: a signal, an abort; a finding, kept with a gdb backtrace) or ``timeout``
(past ``--timeout`` seconds; kept, and said to be a legitimate endless loop when the model has a Loop whose trip
count and condition are left to run, or a finding otherwise).

    scripts/fuzz_structure.py --mutants 20000                        # both engines, models/suite/tiny + the corpus
    scripts/fuzz_structure.py --mutants 500 --engines native --seed 7 --out /tmp/fz
    build/tests/fuzz/fuzz_mutate --seed 7 --count 1 /tmp/m models/suite/tiny   # one batch again, to reproduce

Findings land in ``--out`` (default build/fuzz-structure): ``crash-<engine>-<mutant>.onnx`` with a ``.txt`` saying
the corpus file, the edits, the exit status and a backtrace; the same for ``untyped-`` and ``timeout-``. The summary
is printed and written to ``<out>/summary.json``. The exit status is 1 when there was a finding (``--fail-on``).
"""

import argparse
import collections
import datetime
import json
import os
import resource
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _limits(memory_gib, core):
    def apply():
        # A mutant asking for terabytes is refused by the allocator (a typed OutOfMemoryError or std::bad_alloc),
        # not by the machine's OOM killer next to other work.
        resource.setrlimit(resource.RLIMIT_AS, (memory_gib << 30, memory_gib << 30))
        # A core file (in the worker's folder) gives the crash's backtrace: a rerun under gdb, without address
        # randomization, does not always crash the same way.
        limit = resource.RLIM_INFINITY if core else 0
        resource.setrlimit(resource.RLIMIT_CORE, (limit, limit))
    return apply


def snapshot(build, folder):
    """Copies fuzz_mutate, fuzz_worker and the core library out of the build folder, which other builds may relink
    while the campaign runs (a worker started then fails to load: exit status 127). Returns (mutate, worker, env)."""
    os.makedirs(folder, exist_ok=True)
    core = os.path.realpath(os.path.join(build, "src/cpp/libxpuruntime_core.so.0"))
    for attempt in range(30):
        try:
            for src, name in ((os.path.join(build, "tests/fuzz/fuzz_mutate"), "fuzz_mutate"),
                              (os.path.join(build, "tests/fuzz/fuzz_worker"), "fuzz_worker"),
                              (core, "libxpuruntime_core.so.0")):
                shutil.copy2(src, os.path.join(folder, name))
            env = dict(os.environ, LD_LIBRARY_PATH=folder)  # the binaries' RUNPATH comes after it
            r = subprocess.run([os.path.join(folder, "fuzz_worker")], input=b"", env=env, capture_output=True)
            if r.returncode == 0:
                return os.path.join(folder, "fuzz_mutate"), os.path.join(folder, "fuzz_worker"), env
        except OSError:
            pass
        time.sleep(10)  # a build is writing them
    sys.exit("could not copy a working fuzz_worker out of the build folder")


class Worker:
    """One fuzz_worker process: a model path in, one line out."""

    def __init__(self, binary, engine, memory_gib, folder, env):
        self.binary, self.engine, self.memory_gib, self.env = binary, engine, memory_gib, env
        self.folder = os.path.join(folder, engine)  # its working directory: its core file lands there
        os.makedirs(self.folder, exist_ok=True)
        self.log_path = os.path.join(folder, f"worker-{engine}.stderr")
        self.proc = None
        self.starts = 0
        self.cores = True

    def start(self):
        self.log = open(self.log_path, "wb")
        env = dict(self.env, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
        self.proc = subprocess.Popen([self.binary, "--engine", self.engine], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=self.log, env=env, cwd=self.folder,
                                     preexec_fn=_limits(self.memory_gib, self.cores))
        self.buffer = b""
        self.starts += 1

    def core_backtrace(self):
        """The backtrace in the core file the last crash left (kernel.core_pattern "core"), or None."""
        core = os.path.join(self.folder, "core")
        if not os.path.exists(core) or shutil.which("gdb") is None:
            return None
        try:
            r = subprocess.run(["gdb", "-batch", "-nx", "-ex", "bt 25", self.binary, core], capture_output=True,
                               text=True, timeout=120, env=self.env)
            return "\n".join(ln[:300] for ln in r.stdout.splitlines() if ln.startswith("#"))
        except subprocess.TimeoutExpired:
            return "(gdb timed out)"
        finally:
            os.unlink(core)

    def stop(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
        if self.proc is not None:
            self.proc.wait()
            self.log.close()
        self.proc = None

    def stderr_tail(self, n=4000):
        self.log.flush()
        with open(self.log_path, "rb") as f:
            data = f.read()
        return data[-n:].decode("utf-8", "replace")

    def run(self, path, timeout):
        """("answer", line) or ("crash", returncode) or ("timeout", None)."""
        if self.proc is None:
            self.start()
        try:
            self.proc.stdin.write(path.encode() + b"\n")
            self.proc.stdin.flush()
        except BrokenPipeError:
            return "crash", self.proc.wait()
        deadline = time.monotonic() + timeout
        fd = self.proc.stdout.fileno()
        while b"\n" not in self.buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                return "timeout", None
            ready, _, _ = select.select([fd], [], [], left)
            if ready:
                chunk = os.read(fd, 65536)
                if not chunk:
                    return "crash", self.proc.wait()
                self.buffer += chunk
        line, self.buffer = self.buffer.split(b"\n", 1)
        return "answer", line.decode("utf-8", "replace")


def _ops(graph, out):
    for node in graph.node:
        out.append(node)
        for attr in node.attribute:
            if attr.HasField("g"):
                _ops(attr.g, out)
            for g in attr.graphs:
                _ops(g, out)
    return out


def endless_loop_reason(path):
    """Why a mutant that ran past its deadline may be a legitimate endless loop (spec-correct: a Loop whose trip
    count is absent or huge and whose condition stays true), or None."""
    try:
        import onnx
        model = onnx.load(path, load_external_data=False)
    except Exception:  # noqa: BLE001 - a model onnx cannot load is no legitimate loop
        return None
    loops = [n for n in _ops(model.graph, []) if n.op_type in ("Loop", "Scan")]
    if not loops:
        return None
    return f"{len(loops)} Loop/Scan node(s): {', '.join(n.name or n.op_type for n in loops[:3])}"


def backtrace(binary, engine, path, env, seconds=60):
    """A gdb backtrace of the worker on `path` (the normal build: RelWithDebInfo)."""
    if shutil.which("gdb") is None:
        return "(gdb not installed)"
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
        f.write(path + "\n")
        feed = f.name
    try:
        r = subprocess.run(["gdb", "-batch", "-nx", "-ex", f"run < {feed}", "-ex", "bt 25", "--args", binary,
                            "--engine", engine], capture_output=True, text=True, timeout=seconds,
                           env=dict(env, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1"))
        lines = [ln for ln in r.stdout.splitlines() if ln.startswith("#") or "signal" in ln.lower()]
        return "\n".join(lines[:40])
    except subprocess.TimeoutExpired:
        return "(gdb timed out)"
    finally:
        os.unlink(feed)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mutants", type=int, default=1000, help="mutants per engine (default 1000)")
    p.add_argument("--engines", default="native,onnxruntime")
    p.add_argument("--seed", type=int, default=1, help="the first batch's seed; batch b uses seed + b")
    p.add_argument("--batch", type=int, default=200, help="mutants made per fuzz_mutate call")
    p.add_argument("--timeout", type=float, default=20.0, help="seconds per mutant and engine (default 20)")
    p.add_argument("--memory-gib", type=int, default=8, help="address-space limit of a worker (default 8 GiB)")
    p.add_argument("--corpus", nargs="*",
                   default=[os.path.join(ROOT, "models/suite/tiny"), os.path.join(ROOT, "tests/fuzz/corpus/model")])
    p.add_argument("--build", default=os.path.join(ROOT, "build"), help="the build folder (tests/fuzz/ tools)")
    p.add_argument("--out", default=None, help="findings and summary (default <build>/fuzz-structure)")
    p.add_argument("--max-backtraces", type=int, default=30)
    p.add_argument("--fail-on", default="crash,untyped,timeout",
                   help="outcomes that make the exit status 1 (default crash,untyped,timeout; timeouts of "
                        "legitimate endless loops never do)")
    args = p.parse_args()
    for b in ("tests/fuzz/fuzz_mutate", "tests/fuzz/fuzz_worker"):
        if not os.access(os.path.join(args.build, b), os.X_OK):
            sys.exit(f"{os.path.join(args.build, b)} is missing: build the targets fuzz_mutate and fuzz_worker")
    out = args.out or os.path.join(args.build, "fuzz-structure")
    os.makedirs(out, exist_ok=True)
    scratch = tempfile.mkdtemp(prefix="fuzz-structure-")
    mutate, worker_bin, env = snapshot(args.build, os.path.join(scratch, "bin"))
    core_files = open("/proc/sys/kernel/core_pattern").read().strip() == "core"
    engines = [e for e in args.engines.split(",") if e]
    workers = {e: Worker(worker_bin, e, args.memory_gib, scratch, env) for e in engines}
    for w in workers.values():
        w.cores = core_files and args.max_backtraces > 0
    counts = {e: collections.Counter() for e in engines}
    typed = {e: collections.Counter() for e in engines}
    findings = []
    backtraces = 0
    start = time.monotonic()
    done = 0
    batch = 0
    commit = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()

    def record(kind, engine, path, source, edits, detail):
        nonlocal backtraces
        name = f"{kind}-{engine}-{os.path.basename(path)}"
        shutil.copy(path, os.path.join(out, name))
        text = [f"engine: {engine}", f"source: {source}", f"edits: {edits}", f"outcome: {kind} {detail}"]
        if kind == "crash":
            w = workers[engine]
            text.append("worker stderr (tail):\n" + w.stderr_tail())
            if backtraces < args.max_backtraces:
                backtraces += 1
                text.append("backtrace:\n" + (w.core_backtrace() or backtrace(worker_bin, engine, path, env)))
                w.cores = backtraces < args.max_backtraces
        with open(os.path.join(out, name[:-len(".onnx")] + ".txt"), "w") as f:
            f.write("\n".join(text) + "\n")
        findings.append({"kind": kind, "engine": engine, "file": name, "source": os.path.basename(source),
                         "edits": edits, "detail": str(detail)})
        print(f"[fuzz] {kind} {engine} {name}: {edits} ({detail})", flush=True)

    try:
        while done < args.mutants:
            count = min(args.batch, args.mutants - done)
            batch_dir = os.path.join(scratch, "batch")
            shutil.rmtree(batch_dir, ignore_errors=True)
            r = subprocess.run([mutate, "--seed", str(args.seed + batch), "--count", str(count), batch_dir]
                               + args.corpus, capture_output=True, text=True, check=True)
            batch += 1
            for line in r.stdout.splitlines():
                path, source, edits = (line.split("\t") + ["", ""])[:3]
                for engine in engines:
                    w = workers[engine]
                    status, value = w.run(path, args.timeout)
                    if status == "answer":
                        kind = value.split("\t", 1)[0]
                        counts[engine][kind] += 1
                        if kind == "typed":
                            typed[engine][value.split("\t")[1]] += 1
                        elif kind == "untyped":
                            record("untyped", engine, path, source, edits, value.split("\t", 1)[1])
                    elif status == "crash":
                        counts[engine]["crash"] += 1
                        detail = (f"signal {signal.Signals(-value).name}" if value is not None and value < 0
                                  else f"exit status {value}")
                        record("crash", engine, path, source, edits, detail)
                        w.stop()
                    else:
                        w.stop()
                        reason = endless_loop_reason(path)
                        if reason:
                            counts[engine]["timeout_loop"] += 1
                            record("timeout_loop", engine, path, source, edits, reason)
                        else:
                            counts[engine]["timeout"] += 1
                            record("timeout", engine, path, source, edits, f"past {args.timeout:g} s")
                done += 1
                if done % 500 == 0:
                    rate = done / (time.monotonic() - start)
                    summary = "; ".join(f"{e}: {dict(counts[e])}" for e in engines)
                    print(f"[fuzz] {done}/{args.mutants} mutants ({rate:.1f}/s) {summary}", flush=True)
    except KeyboardInterrupt:
        print("[fuzz] interrupted", flush=True)
    finally:
        for w in workers.values():
            w.stop()
        shutil.rmtree(scratch, ignore_errors=True)
    seconds = time.monotonic() - start
    summary = {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "commit": commit,
        "seed": args.seed,
        "timeout_s": args.timeout,
        "seconds": round(seconds, 1),
        "corpus": args.corpus,
        "engines": {e: {"mutants": sum(counts[e].values()), **dict(counts[e]), "typed_by_code": dict(typed[e]),
                        "worker_starts": workers[e].starts} for e in engines},
        "findings": findings,
    }
    with open(os.path.join(out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
    print(f"[fuzz] {done} mutants in {seconds:.0f} s (commit {commit}); findings in {out}")
    for e in engines:
        c = counts[e]
        print(f"[fuzz] {e}: {sum(c.values())} mutants: ran {c['ran']}, built {c['built']}, typed errors "
              f"{c['typed']}, untyped {c['untyped']}, crashes {c['crash']}, timeouts {c['timeout']} "
              f"(+ {c['timeout_loop']} with a Loop/Scan)")
    fail = set(args.fail_on.split(","))
    return 1 if any(counts[e][k] for e in engines for k in fail) else 0


if __name__ == "__main__":
    sys.exit(main())
