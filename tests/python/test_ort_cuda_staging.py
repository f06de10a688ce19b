"""scripts/ort_cuda_unstage.sh: the parts carried over several device calls become the plugin and the core again."""
import hashlib
import io
import lzma
import os
import pathlib
import shutil
import subprocess
import tarfile

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


def bundle_parts(files, part_size):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    stream = lzma.compress(buf.getvalue())
    return [stream[i:i + part_size] for i in range(0, len(stream), part_size)], stream


@pytest.fixture
def staged(tmp_path):
    repo = tmp_path / "repo"
    (repo / "scripts").mkdir(parents=True)
    shutil.copy(ROOT / "scripts" / "ort_cuda_unstage.sh", repo / "scripts")
    plugin, core = os.urandom(3000), os.urandom(2000)
    parts, stream = bundle_parts({"ort/libonnxruntime_providers_cuda.so": plugin,
                                  "onnxruntime/lib/libonnxruntime.so": core,
                                  "onnxruntime/.version": b"1.29.0\n"}, 2200)
    assert len(parts) >= 2
    manifest = (f"package test\nparts {len(parts)}\nkeep_arch 90\n"
                f"library_sha256 {hashlib.sha256(plugin).hexdigest()}\ncore_sha256 {hashlib.sha256(core).hexdigest()}\n"
                f"stream_sha256 {hashlib.sha256(stream).hexdigest()}\n")
    for i, part in enumerate(parts):
        folder = tmp_path / f"ortgpu{i + 1}"
        folder.mkdir()
        (folder / f"part{i:02d}").write_bytes(part)
        (folder / "MANIFEST").write_text(manifest)
    return repo, [tmp_path / f"ortgpu{i + 1}" for i in range(len(parts))], plugin, core


def unstage(repo, tmp_path, *args):
    env = dict(os.environ, XPURT_ORT_STAGE=str(tmp_path / "stage"))
    return subprocess.run(["bash", str(repo / "scripts" / "ort_cuda_unstage.sh"), "--dest", str(tmp_path / "ort"),
                           *args], env=env, capture_output=True, text=True)


def carry(repo, folder):
    """What a device call does with a carried .ortgpuN: it is there for this call only."""
    for old in repo.glob(".ortgpu*"):
        shutil.rmtree(old)
    shutil.copytree(folder, repo / f".{folder.name}")


def test_parts_over_calls_rebuild_the_plugin_and_restore_the_core(staged, tmp_path):
    repo, folders, plugin, core = staged
    for folder in folders[:-1]:
        carry(repo, folder)
        first = unstage(repo, tmp_path)
        assert first.returncode == 0 and "waiting for" in first.stdout
        assert unstage(repo, tmp_path, "--export").returncode == 3
    carry(repo, folders[-1])
    done = unstage(repo, tmp_path)
    assert done.returncode == 0, done.stderr
    library = tmp_path / "ort" / "libonnxruntime_providers_cuda.so"
    assert f"export XPURT_ORT_CUDA_PROVIDER={library}" in done.stdout
    assert library.read_bytes() == plugin
    assert (repo / ".deps" / "onnxruntime" / "lib" / "libonnxruntime.so").read_bytes() == core
    # A later call (the parts no longer carried) only prints the export line, and restores a core that went away.
    for old in repo.glob(".ortgpu*"):
        shutil.rmtree(old)
    shutil.rmtree(repo / ".deps")
    again = unstage(repo, tmp_path, "--export")
    assert again.returncode == 0 and again.stdout.strip() == f"export XPURT_ORT_CUDA_PROVIDER={library}"
    assert (repo / ".deps" / "onnxruntime" / "lib" / "libonnxruntime.so").read_bytes() == core


def test_a_corrupt_part_is_refused(staged, tmp_path):
    repo, folders, _, _ = staged
    part = next(folders[0].glob("part*"))
    data = bytearray(part.read_bytes())
    data[100] ^= 0xFF
    part.write_bytes(bytes(data))
    for folder in folders:
        carry(repo, folder)
        result = unstage(repo, tmp_path)
    assert result.returncode == 1 and "do not match the MANIFEST" in result.stderr
    assert not (tmp_path / "ort" / "libonnxruntime_providers_cuda.so").exists()
