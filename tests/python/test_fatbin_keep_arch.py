"""scripts/fatbin_keep_arch.py: the GPU code of other architectures is zeroed, the kept one is left byte for byte."""
import pathlib
import shutil
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
import fatbin_keep_arch as fka  # noqa: E402

NVCC = shutil.which("nvcc") or ("/usr/local/cuda/bin/nvcc" if pathlib.Path("/usr/local/cuda/bin/nvcc").exists()
                                else None)
KERNEL = """
__global__ void add_one(float* x, int n) { int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) x[i] += 1.0f; }
extern "C" void launch(float* x, int n) { add_one<<<(n + 255) / 256, 256>>>(x, n); }
"""


@pytest.fixture(scope="module")
def two_arch_library(tmp_path_factory):
    if NVCC is None:
        pytest.skip("nvcc not found")
    d = tmp_path_factory.mktemp("fatbin")
    (d / "k.cu").write_text(KERNEL)
    subprocess.run([NVCC, "-shared", "-Xcompiler", "-fPIC", "-gencode", "arch=compute_80,code=sm_80",
                    "-gencode", "arch=compute_90,code=[sm_90,compute_90]", str(d / "k.cu"), "-o", str(d / "k.so")],
                   check=True)
    return d / "k.so"


def payloads(data, kind, arch):
    return [bytes(data[e.payload_offset:e.payload_offset + e.payload_size])
            for off, size in fka.fatbin_sections(data) for entries in fka.containers(data, off, size)
            for e in entries if e.kind == kind and e.arch == arch]


def test_other_architectures_are_zeroed_and_the_kept_one_is_unchanged(two_arch_library, tmp_path):
    before = two_arch_library.read_bytes()
    listed = fka.listing(before)
    assert ("sass", 80) in listed and ("sass", 90) in listed and ("ptx", 90) in listed
    out = tmp_path / "k90.so"
    assert fka.main([str(two_arch_library), str(out), "--keep", "90"]) == 0
    after = out.read_bytes()
    assert len(after) == len(before)
    assert payloads(after, fka.KIND_SASS, 90) == payloads(before, fka.KIND_SASS, 90)
    assert all(p and not any(p) for p in payloads(after, fka.KIND_SASS, 80))
    # A container with sm_90 SASS never JIT-compiles its PTX on sm_90: the PTX goes too.
    assert all(not any(p) for p in payloads(after, fka.KIND_PTX, 90))
    # Everything outside the dropped payloads is byte for byte the same.
    changed = [i for i, (a, b) in enumerate(zip(before, after)) if a != b]
    dropped = [(e.payload_offset, e.payload_offset + e.payload_size)
               for off, size in fka.fatbin_sections(before) for entries in fka.containers(before, off, size)
               for e in fka.entries_to_zero(entries, [90])]
    assert changed and all(any(lo <= i < hi for lo, hi in dropped) for i in changed)


def test_ptx_is_kept_where_no_sass_of_a_kept_architecture_exists():
    entries = [fka.Entry(fka.KIND_SASS, 80, 0, 4), fka.Entry(fka.KIND_PTX, 80, 4, 4),
               fka.Entry(fka.KIND_PTX, 100, 8, 4)]
    dropped = fka.entries_to_zero(entries, [90])
    assert [(e.kind, e.arch) for e in dropped] == [(fka.KIND_SASS, 80), (fka.KIND_PTX, 100)]


def test_a_library_without_code_a_kept_architecture_can_load_is_an_error(two_arch_library, tmp_path, capsys):
    assert fka.main([str(two_arch_library), str(tmp_path / "out.so"), "--keep", "75"]) == 1
    assert "no GPU code for sm_75" in capsys.readouterr().err
    assert not (tmp_path / "out.so").exists()


def test_a_file_that_is_not_elf_is_an_error(tmp_path, capsys):
    bad = tmp_path / "bad.so"
    bad.write_bytes(b"not an elf file at all" * 4)
    assert fka.main([str(bad), "--list"]) == 1
    assert "not a 64-bit little-endian ELF" in capsys.readouterr().err
