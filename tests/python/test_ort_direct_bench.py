"""benchmarks/ort_direct_bench, the ONNX Runtime baseline of the suite benchmarks, on the CPU: its JSON line, and
--static-shapes, which fixes the inputs' dynamic axes in ORT's session options (the retry where ORT's CUDA plugin EP
crashes on an export as it is: benchmarks/model_suite_bench.py's run_ort)."""

import json
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

from session_bench import find_bench  # noqa: E402

BINARY = find_bench(None)
BERT = ROOT / "models" / "suite" / "tiny" / "bert.dynamo.float16.onnx"
pytestmark = pytest.mark.skipif(BINARY is None, reason="ort_direct_bench is built only where ONNX Runtime was found")


def run(*flags: str) -> dict:
    done = subprocess.run([str(BINARY), "--model", str(BERT), "--device", "cpu", "--iterations", "3", "--warmup",
                           "1", "--batch", "2", *flags], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_the_export_as_it_is_by_default():
    row = run("--dim", "sequence=5")
    assert row["static_shapes"] is False and row["free_dims"] == {}
    assert row["batch"] == 2 and row["median_ms"] > 0


def test_static_shapes_fix_every_dynamic_axis_of_the_inputs():
    row = run("--dim", "sequence=5", "--static-shapes", "1")
    assert row["static_shapes"] is True
    # batch from --batch (no --dim for it), sequence from --dim
    assert row["free_dims"] == {"batch": 2, "sequence": 5}


def test_an_unknown_flag_is_refused():
    done = subprocess.run([str(BINARY), "--model", str(BERT), "--static-shape", "1"], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode != 0
