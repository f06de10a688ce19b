"""xpuruntime.dask on a distributed.LocalCluster of two worker processes (one thread each) on the CPU: outputs equal to
a single-process run bit for bit for arrays, dicts of arrays, bags and DataFrames; one session per worker, reused;
a killed worker's partitions recomputed; a worker resolving the model differently named; bad records named by
partition and record. The GPU case (one worker per GPU) runs where there are GPUs."""

import ast
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest

import xpuruntime as xrt
from conftest import requires_gpu

distributed = pytest.importorskip("distributed")
da = pytest.importorskip("dask.array")
db = pytest.importorskip("dask.bag")
dd = pytest.importorskip("dask.dataframe")
pd = pytest.importorskip("pandas")
xdask = pytest.importorskip("xpuruntime.dask")
from xpuruntime.dask import _worker  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
# The hand-made zoo is generated, not committed (scripts/make_model_zoo.py): made here, kept for the module's life.
sys.path.insert(0, str(ROOT / "scripts"))
import make_model_zoo  # noqa: E402

_ZOO_DIR = tempfile.TemporaryDirectory(prefix="xpurt-dask-zoo-")
_ZOO = make_model_zoo.generate(_ZOO_DIR.name, tiny_only=True, dtypes=("fp32",))
MLP = _ZOO["mlp_tiny"]
BERT_ZOO = _ZOO["bert_tiny"]
RESNET = ROOT / "models" / "suite" / "tiny" / "resnet.dynamo.float32.onnx"
BERT = ROOT / "models" / "suite" / "tiny" / "bert.dynamo.float32.onnx"


@pytest.fixture(scope="module")
def client():
    cluster = distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None)
    with distributed.Client(cluster) as c:
        c.wait_for_workers(2)
        yield c
    cluster.close()


def reference_by_blocks(model, feeds, chunk, engine="auto", **kwargs):
    """The single-process run over the same blocks: what every worker must reproduce bit for bit."""
    session = xrt.InferenceSession(str(model), engine=engine, **kwargs)
    n = len(next(iter(feeds.values())))
    runs = [session.run({k: v[i:i + chunk] for k, v in feeds.items()}) for i in range(0, n, chunk)]
    return {name: np.concatenate([r[name] for r in runs]) for name in runs[0]}


def test_import_is_optional():
    code = "import sys, xpuruntime; assert 'dask' not in sys.modules and 'distributed' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)
    blocked = ("import sys; sys.modules['distributed'] = None\n"
               "try:\n    import xpuruntime.dask\nexcept ImportError as e:\n    print(e)\n")
    out = subprocess.run([sys.executable, "-c", blocked], check=True, capture_output=True, text=True).stdout
    assert "python3-dask" in out and "python3-distributed" in out


@pytest.mark.parametrize("engine", ["auto", "native"])
def test_array_bit_identical_and_one_session_per_worker(client, engine):
    x = np.random.default_rng(1).standard_normal((23, 3, 32, 32)).astype(np.float32)
    model = xdask.ClusterSession(RESNET, client, engine=engine)
    y = model.run(da.from_array(x, chunks=(5, 3, 16, 32)))["output"]   # rechunked to whole records
    assert y.chunks == ((5, 5, 5, 5, 3), (10,))
    np.testing.assert_array_equal(y.compute(), reference_by_blocks(RESNET, {"pixel_values": x}, 5, engine)["output"])
    sessions = client.run(lambda key: id(_worker._SESSIONS[key][0]) if key in _worker._SESSIONS else None,
                          model.key)
    with distributed.get_task_stream(client) as stream:   # what the dashboard and progress show: graph tasks
        assert y.compute().shape == (23, 10)
    # One run task per block (Dask fuses each with its input's rechunk): the tasks progress and the dashboard show.
    runs = [ast.literal_eval(str(t["key"])) for t in stream.data if "xpuruntime-run-" in str(t["key"])]
    assert sorted({key[1] for key in runs}) == [0, 1, 2, 3, 4]
    again = client.run(lambda key: id(_worker._SESSIONS[key][0]) if key in _worker._SESSIONS else None, model.key)
    assert sessions == again and all(v is not None for v in again.values())   # made once per worker, reused


def test_dict_of_arrays_with_symbolic_dims(client):
    rng = np.random.default_rng(2)
    feeds = {"input_ids": rng.integers(0, 100, (10, 7)), "attention_mask": np.ones((10, 7), np.int64)}
    feeds["attention_mask"][3, 5:] = 0
    model = xdask.ClusterSession(BERT, client, engine="native")
    out = model.run({k: da.from_array(v, chunks=(4, 7)) for k, v in feeds.items()})["last_hidden_state"]
    assert out.shape == (10, 7, 32)                     # the tail from one probe record: 'sequence' is symbolic
    np.testing.assert_array_equal(out.compute(), reference_by_blocks(BERT, feeds, 4, "native")["last_hidden_state"])


def test_bag_of_records_in_order_with_their_ids(client, tmp_path):
    lock = tmp_path / "policy.lock.json"
    xrt.KernelPolicy(linear=xrt.pinned("cpu")).save(str(lock))   # shipped as text, not as a path
    x = np.random.default_rng(3).standard_normal((30, 64)).astype(np.float32)
    model = xdask.ClusterSession(MLP, client, engine="native", kernel_policy=lock)
    records = [{"x": x[i], "id": f"r{i}"} for i in range(30)]
    out = model.run(db.from_sequence(records, npartitions=4)).compute()
    assert [r["id"] for r in out] == [f"r{i}" for i in range(30)]
    session = xrt.InferenceSession(str(MLP), engine="native", kernel_policy=xrt.KernelPolicy.load(str(lock)))
    sizes = db.from_sequence(records, npartitions=4).map_partitions(lambda p: [len(list(p))]).compute()
    assert sizes == [8, 8, 8, 6]                       # each partition one batch, as the reference's blocks
    expected = reference_by_blocks(MLP, {"x": x}, 8, "native", kernel_policy=xrt.KernelPolicy.load(str(lock)))["y"]
    np.testing.assert_array_equal(np.stack([r["y"] for r in out]), expected)
    explained = model.explain(model.workers[1])
    assert explained["worker"] == model.workers[1]
    assert {n["policy_rule"] for n in explained["explain"]["nodes"]} == {"pin:cpu"}
    assert session.explain().nodes[0]["kernel"] == explained["explain"]["nodes"][0]["kernel"]


def test_dataframe_columns_to_inputs(client):
    x = np.random.default_rng(4).standard_normal((40, 64)).astype(np.float32)
    frame = pd.DataFrame(x, columns=[f"x_{i}" for i in range(64)], index=np.arange(100, 140))
    frame["label"] = np.arange(40)
    model = xdask.ClusterSession(MLP, client)
    out = model.run(dd.from_pandas(frame, npartitions=3))
    assert list(out.columns) == [f"y_{i}" for i in range(64)]
    result = out.compute()
    assert list(result.index) == list(range(100, 140))
    np.testing.assert_array_equal(result.to_numpy(), reference_by_blocks(MLP, {"x": x}, 14)["y"])
    renamed = frame.rename(columns={f"x_{i}": f"f{i}" for i in range(64)})
    mapped = model.run(dd.from_pandas(renamed, npartitions=2), columns={"x": [f"f{i}" for i in range(64)]})
    np.testing.assert_array_equal(mapped.compute().to_numpy(), result.to_numpy())
    with pytest.raises(xrt.InvalidArgumentError, match="input 'x'"):
        model.run(dd.from_pandas(frame[["label"]], npartitions=2))


def test_bad_records_name_partition_and_record(client):
    x = np.random.default_rng(5).standard_normal((12, 64)).astype(np.float32)
    model = xdask.ClusterSession(MLP, client)
    records = [{"x": x[i]} for i in range(12)]
    records[7] = {"x": x[7][:50]}
    with pytest.raises(xdask.BadRecordError, match=r"partition 1, record 1: input 'x' has shape \[50\]") as info:
        model.run(db.from_sequence(records, npartitions=2)).compute()
    assert (info.value.partition, info.value.record) == (1, 1)
    records[7] = {"y": x[7]}
    with pytest.raises(xdask.BadRecordError, match="input 'x' is missing"):
        model.run(db.from_sequence(records, npartitions=2)).compute()
    # A value the model refuses: a token id past BERT's vocabulary, found by running the failed batch's records.
    ids = np.zeros((9, 16), np.int64)
    ids[6, 3] = 10**6
    bert = xdask.ClusterSession(BERT_ZOO, client)
    with pytest.raises(xdask.BadRecordError, match="partition 1, record 2: the model refused it") as info:
        bert.run(da.from_array(ids, chunks=(4, 16)))["last_hidden_state"].compute()
    assert (info.value.partition, info.value.record) == (1, 2)
    frame = pd.DataFrame({"x_%d" % i: x[:, i].astype(object) for i in range(64)})
    frame.iloc[9, 5] = "not a number"
    with pytest.raises(xdask.BadRecordError, match="partition 1, record 3"):
        model.run(dd.from_pandas(frame, npartitions=2)).compute()


def test_arguments_checked_on_the_client(client, tmp_path):
    model = xdask.ClusterSession(MLP.read_bytes(), client)        # bytes, as a path: the same spec key
    assert model.key == xdask.ClusterSession(MLP, client).key
    assert model.key != xdask.ClusterSession(MLP, client, kernel_policy=xrt.KernelPolicy(linear="cpu")).key
    with pytest.raises(xrt.InvalidArgumentError, match=r"feeds \['z'\] do not match the model's inputs \['x'\]"):
        model.run({"z": da.zeros((4, 64), chunks=2)})
    with pytest.raises(xrt.InvalidTypeError, match="dask array, a dict of dask arrays"):
        model.run(np.zeros((4, 64), np.float32))
    with pytest.raises(xrt.InvalidArgumentError, match="no policy file"):
        xdask.ClusterSession(MLP, client, kernel_policy=tmp_path / "missing.json")
    calibrated = xrt.ExecutionPolicy(precision="int8", calibration=[{"x": np.ones((1, 64), np.float32)}])
    with pytest.raises(xrt.InvalidArgumentError, match="calibration data is not part of the policy"):
        xdask.ClusterSession(MLP, client, exec_policy=calibrated)


def test_policy_mismatch_names_worker_and_node(client):
    x = np.ones((2, 64), np.float32)
    model = xdask.ClusterSession(MLP, client, engine="native")
    decisions = model.check_same_kernels({"x": x})
    assert sorted(decisions) == model.workers and set(decisions[model.workers[0]].values()) == {"cpu"}
    odd = model.workers[1]
    try:
        model._set_worker_kernel_policy_for_tests(odd, xrt.KernelPolicy(linear="cublasLt"))
        with pytest.raises(xdask.KernelMismatchError, match=f"worker {odd} resolved node 'fc0_0'") as info:
            model.check_same_kernels({"x": x})
        assert info.value.worker == odd and info.value.node == "fc0_0"
        assert info.value.got["rule"] == "fallback" and info.value.expected["rule"] == "first-supported"
        assert model.explain(odd)["policy_sha256"] != model.explain(model.workers[0])["policy_sha256"]
    finally:
        model._set_worker_kernel_policy_for_tests(odd, None)
    # The onnxruntime engine reports ORT's own partitioning: a different policy shows as other policies.
    ort = xdask.ClusterSession(MLP, client, engine="auto")
    ort._set_worker_kernel_policy_for_tests(odd, xrt.KernelPolicy(linear="cublasLt"))
    try:
        with pytest.raises(xdask.KernelMismatchError, match=f"worker {odd} .*other policies") as info:
            ort.check_same_kernels({"x": x})
        assert info.value.node is None or info.value.worker == odd
    finally:
        ort._set_worker_kernel_policy_for_tests(odd, None)


def test_killed_worker_partitions_recomputed(client):
    x = np.random.default_rng(6).standard_normal((48, 3, 32, 32)).astype(np.float32)
    model = xdask.ClusterSession(RESNET, client, engine="native")
    expected = reference_by_blocks(RESNET, {"pixel_values": x}, 4, "native")["output"]
    y = model.run(da.from_array(x, chunks=(4, 3, 32, 32)))["output"].persist()
    futures = distributed.futures_of(y)
    distributed.wait(futures[:1])                      # mid-computation: some partitions done, others not
    holders = client.who_has(futures)
    victim = next(iter(holders.get(futures[0].key) or holders[str(futures[0].key)]))   # keys: str in some versions
    pid = client.run(os.getpid, workers=[victim])[victim]
    os.kill(pid, signal.SIGKILL)                       # the worker process dies with the partitions it holds
    np.testing.assert_array_equal(client.compute(y).result(timeout=60), expected)
    client.wait_for_workers(2, timeout=60)             # the nanny started a new one; its session is made anew
    again = model.run(da.from_array(x, chunks=(16, 3, 32, 32)))["output"]
    np.testing.assert_array_equal(client.compute(again).result(timeout=60),
                                  reference_by_blocks(RESNET, {"pixel_values": x}, 16, "native")["output"])


def test_gpu_worker_spec_pins_one_gpu_per_worker(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    spec = xdask.gpu_worker_spec([0, 1])
    assert [s["options"]["env"]["CUDA_VISIBLE_DEVICES"] for s in spec.values()] == ["0", "1"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")
    spec = xdask.gpu_worker_spec([1], memory_limit="1GiB")
    assert spec["gpu-1"]["options"]["env"]["CUDA_VISIBLE_DEVICES"] == "5"
    assert spec["gpu-1"]["options"]["memory_limit"] == "1GiB"
    with pytest.raises(xrt.InvalidArgumentError, match="sees 2 GPUs"):
        xdask.gpu_worker_spec([2])
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    if xrt.get_device_count() == 0:
        with pytest.raises(xrt.UnsupportedOperationError, match="LocalCluster"):
            xdask.local_gpu_cluster()
    # The worker processes really get their GPU's CUDA_VISIBLE_DEVICES (no GPU needed to check that).
    with xdask.local_gpu_cluster([0, 1], dashboard_address=None) as cluster, distributed.Client(cluster) as c:
        c.wait_for_workers(2)
        seen = c.run(lambda: os.environ.get("CUDA_VISIBLE_DEVICES"))
        assert sorted(seen.values()) == ["0", "1"]


@requires_gpu
def test_one_worker_per_gpu_same_kernels_and_bits():
    gpus = list(range(min(xrt.get_device_count(), 2)))
    x = np.random.default_rng(7).standard_normal((37, 3, 32, 32)).astype(np.float32)
    with xdask.local_gpu_cluster(gpus, dashboard_address=None) as cluster, distributed.Client(cluster) as c:
        c.wait_for_workers(len(gpus))
        model = xdask.ClusterSession(RESNET, c, device="cuda", engine="native",
                                     exec_policy=xrt.ExecutionPolicy(deterministic=True))
        decisions = model.check_same_kernels({"pixel_values": x[:4]})
        assert len(decisions) == len(gpus)
        y = model.run(da.from_array(x, chunks=(8, 3, 32, 32)))["output"].compute()
    session = xrt.InferenceSession(str(RESNET), device="cuda:0", engine="native",
                                   exec_policy=xrt.ExecutionPolicy(deterministic=True))
    outs = [session.run({"pixel_values": x[i:i + 8]})["output"] for i in range(0, 37, 8)]
    expected = np.concatenate([o if isinstance(o, np.ndarray) else o.to_numpy() for o in outs])
    np.testing.assert_array_equal(y, expected)
    cpu = reference_by_blocks(RESNET, {"pixel_values": x}, 8, "native")["output"]
    np.testing.assert_allclose(y, cpu, rtol=1e-3, atol=1e-3)
