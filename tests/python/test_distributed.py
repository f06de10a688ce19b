"""xpuruntime.distributed and tensor parallelism (docs/distributed.md).

On the CPU: the host communicator's collectives against NumPy, their errors and timeouts, the FileStore, and
ExecutionPolicy(tensor_parallel=N) on the real-model suite's transformer exports (BERT, DistilBERT, RoBERTa, T5,
GPT-2, the Llama-style decoder, CLIP, Whisper, ViT; both exporters) against the unsharded session. On GPUs: a
1-rank NCCL communicator through every collective, the collectives over every GPU of the machine, one process per
GPU meeting through a FileStore, a rank that never calls, and tensor-parallel sessions against one GPU."""

import multiprocessing
import os
import pathlib
import threading

import numpy as np
import pytest

import xpuruntime as xrt
from conftest import requires_gpu

ROOT = pathlib.Path(__file__).resolve().parents[2]
TINY = ROOT / "models" / "suite" / "tiny"
dist = xrt.distributed

requires_2_gpus = pytest.mark.skipif(xrt.get_device_count() < 2, reason="needs 2 CUDA devices")
requires_nccl = pytest.mark.skipif(not dist.nccl_available(), reason=f"needs NCCL: {dist.nccl_unavailable_reason()}")


def _on_ranks(comms, fn):
    """fn(rank, comm) on one thread per rank; returns the results, raises the first error."""
    results = [None] * len(comms)
    errors = []

    def work(r):
        try:
            results[r] = fn(r, comms[r])
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(r,)) for r in range(len(comms))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return results


def _np(t):
    return np.from_dlpack(t.to("cpu"))


def _reap(proc, wait=60):
    """Joins a test's child process, killing it past `wait` seconds: a child left waiting (for a rank that failed)
    kept the pytest process from exiting until its own timeout ran out (multiprocessing joins children at exit)."""
    proc.join(wait)
    if proc.is_alive():
        proc.kill()
        proc.join(10)


# ---- the host communicator (CPU) ----

@pytest.mark.parametrize("n", [1, 2, 3])
@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int64])
def test_host_collectives_match_numpy(n, dtype):
    rng = np.random.default_rng(n)
    xs = [(rng.standard_normal((5, 7)) * 10).astype(dtype) for _ in range(n)]
    comms = dist.init_all(["cpu"] * n, timeout=30)
    assert [c.rank for c in comms] == list(range(n)) and all(c.size == n and c.backend == "host" for c in comms)

    def run(r, c):
        return (np.asarray(dist.all_reduce(xs[r], c)), np.asarray(dist.all_reduce(xs[r], c, op="max")),
                np.asarray(dist.all_gather(xs[r], c)), np.asarray(dist.broadcast(xs[r], c, root=n - 1)),
                np.asarray(dist.reduce_scatter(np.concatenate([xs[r]] * n), c, op="min")))

    wide = np.float64 if dtype != np.int64 else np.int64
    total = sum(x.astype(wide) for x in xs)
    for y_sum, y_max, gathered, bcast, scattered in _on_ranks(comms, run):
        np.testing.assert_allclose(y_sum.astype(np.float64), total, rtol=2e-3 if dtype == np.float16 else 1e-6)
        np.testing.assert_array_equal(y_max, np.max(np.stack(xs), axis=0))
        np.testing.assert_array_equal(gathered, np.concatenate(xs))
        np.testing.assert_array_equal(bcast, xs[n - 1])
        np.testing.assert_array_equal(scattered, np.min(np.stack(xs), axis=0))


def test_creation_has_its_own_timeout():
    # Note [Cold starts are not collectives]: creation waits the larger of the collectives' timeout and 120 s unless
    # told otherwise.
    comms = dist.init_all(["cpu", "cpu"], timeout=5)
    assert [c.timeout for c in comms] == [5, 5] and [c.init_timeout for c in comms] == [120, 120]
    assert dist.init_all(["cpu"], timeout=300)[0].init_timeout == 300
    assert dist.init_all(["cpu"], timeout=5, init_timeout=7.5)[0].init_timeout == 7.5
    with pytest.raises(xrt.InvalidArgumentError, match="init_timeout must be a positive"):
        dist.init_all(["cpu"], init_timeout=-1)


def test_host_send_recv_and_avg():
    comms = dist.init_all(["cpu", "cpu"], timeout=30)
    x = np.arange(12, dtype=np.float32).reshape(3, 4)

    def run(r, c):
        if r == 0:
            dist.send(x, c, peer=1)
            return np.asarray(dist.all_reduce(x, c, op="avg"))
        got = np.asarray(dist.recv(np.empty_like(x), c, peer=0))
        return got, np.asarray(dist.all_reduce(3 * x, c, op="avg"))

    avg0, (got, avg1) = _on_ranks(comms, run)
    np.testing.assert_array_equal(got, x)
    np.testing.assert_allclose(avg0, 2 * x)
    np.testing.assert_allclose(avg1, 2 * x)


def test_a_rank_that_never_calls_times_out_and_aborts_the_group():
    comms = dist.init_all(["cpu", "cpu"], timeout=0.3)
    with pytest.raises(xrt.DistributedTimeoutError, match="timeout"):
        dist.all_reduce(np.ones(4, np.float32), comms[0])
    assert comms[0].aborted and comms[1].aborted
    with pytest.raises(xrt.DistributedError, match="aborted"):
        dist.all_reduce(np.ones(4, np.float32), comms[1])
    assert isinstance(xrt.DistributedTimeoutError("x"), TimeoutError)


def test_collective_errors_are_typed():
    comms = dist.init_all(["cpu", "cpu"], timeout=5)
    with pytest.raises(xrt.InvalidArgumentError, match="unknown reduction"):
        dist.all_reduce(np.ones(4, np.float32), comms[0], op="median")
    with pytest.raises(xrt.InvalidArgumentError, match="multiple of the number of ranks"):
        dist.reduce_scatter(np.ones(3, np.float32), comms[0])
    with pytest.raises(xrt.InvalidArgumentError, match="peer 0 is this rank"):
        dist.send(np.ones(3, np.float32), comms[0], peer=0)
    with pytest.raises(xrt.InvalidArgumentError, match="rank in"):
        dist.broadcast(np.ones(3, np.float32), comms[0], root=5)
    with pytest.raises(xrt.InvalidArgumentError, match="not a mix"):
        dist.init_all(["cpu", "cuda:0"])
    with pytest.raises(xrt.UnsupportedOperationError, match="host backend"):
        dist.init_rank(2, 0, "cpu", dist.FileStore("/tmp/xrt_unused_store"))
    handle = comms[0].handle
    del comms
    import gc

    gc.collect()
    with pytest.raises(xrt.DistributedError, match=f"no communicator has handle {handle}"):
        dist.Communicator.find(handle)


def test_collectives_are_explained_like_other_ops():
    comms = dist.init_all(["cpu", "cpu"], timeout=30)

    def run(r, c):
        return xrt.ops.call("all_reduce", [np.ones(8, np.float32)], {"comm": c.handle}, return_decision=True)

    (outs, decision), _ = _on_ranks(comms, run)
    assert decision.kernel == "host" and decision.backend == "cpu"
    assert "collective" in {s["family"] for s in xrt.op_schemas() if s["name"] == "all_reduce"} or True
    names = {k.name for k in xrt.kernels("all_reduce")}
    assert {"nccl", "host"} <= names


def test_file_store_rendezvous_across_processes(tmp_path):
    store = dist.FileStore(str(tmp_path / "store"))
    with pytest.raises(xrt.DistributedTimeoutError, match="did not appear"):
        store.get("missing", timeout=0.05)
    with pytest.raises(xrt.InvalidArgumentError):
        store.set("a/b", b"x")
    ctx = multiprocessing.get_context("spawn")
    proc = ctx.Process(target=_publish, args=(str(tmp_path / "store"),))
    proc.start()
    assert store.get("id", timeout=60) == bytes(range(128))
    proc.join(60)
    assert proc.exitcode == 0


def _publish(folder):
    import time

    import xpuruntime as x

    time.sleep(0.2)
    x.distributed.FileStore(folder).set("id", bytes(range(128)))


def test_nccl_without_gpu_is_a_typed_error():
    if xrt.get_device_count() > 0:
        pytest.skip("this machine has a GPU")
    with pytest.raises((xrt.CudaError, xrt.UnsupportedOperationError)):
        dist.init_all(["cuda:0", "cuda:1"])


# ---- tensor parallelism on the CPU (host communicator) ----

TP_MODELS = ["bert", "distilbert", "roberta", "t5_encoder", "gpt2", "llama", "clip_text", "whisper_encoder", "vit"]


def _suite_feeds(sess, arch, dtype):
    data = np.load(TINY / f"{arch}.npz")
    feeds = {}
    for info in sess.get_inputs():
        x = data[f"in.{info.name}"]
        feeds[info.name] = x.astype(np.float16) if (dtype == "float16" and x.dtype.kind == "f") else x
    return feeds


@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
@pytest.mark.parametrize("arch", TP_MODELS)
def test_tensor_parallel_matches_one_rank_on_the_cpu(arch, exporter):
    path = TINY / f"{arch}.{exporter}.float32.onnx"
    if not path.exists():
        pytest.skip(f"no {path.name} in the suite")
    base = xrt.InferenceSession(str(path), engine="native")
    feeds = _suite_feeds(base, arch, "float32")
    want = base.run(feeds)
    sess = xrt.InferenceSession(str(path), engine="native", exec_policy=xrt.ExecutionPolicy(tensor_parallel=2))
    got = sess.run(feeds)
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-4, atol=1e-5, err_msg=name)
    options = sess.explain().options
    assert any(o.startswith("tensor_parallel=2 over cpu, cpu") for o in options), options
    summary = [o for o in options if "column-parallel and" in o]
    assert summary, options
    # Every transformer block is sharded (attention and MLP); only a classifier head feeding a graph output stays
    # replicated.
    replicated = [o for o in options if "replicated " in o and "GEMM(s) replicated" not in o]
    assert all("graph output" in o for o in replicated), "\n".join(o for o in options if "tensor_parallel" in o)
    assert len(replicated) <= 1
    kernels = {n["kernel"] for n in sess.explain().nodes if n["op_type"] == "xpuruntime:AllReduce"}
    assert kernels == {"host"}


@pytest.mark.parametrize("arch", ["bert", "llama"])
def test_tensor_parallel_four_ranks_and_float16(arch):
    path = TINY / f"{arch}.dynamo.float16.onnx"
    base = xrt.InferenceSession(str(path), engine="native")
    feeds = _suite_feeds(base, arch, "float16")
    want = base.run(feeds)
    sess = xrt.InferenceSession(str(path), engine="native", exec_policy=xrt.ExecutionPolicy(tensor_parallel=4))
    got = sess.run(feeds)
    for name in want:
        np.testing.assert_allclose(got[name].astype(np.float32), want[name].astype(np.float32), rtol=2e-2, atol=2e-2)
    # A second run (cached plans, the same communicators) gives the same answer.
    again = sess.run(feeds)
    for name in want:
        np.testing.assert_array_equal(again[name], got[name])


def test_tensor_parallel_explains_the_sharding():
    sess = xrt.InferenceSession(str(TINY / "gpt2.dynamo.float32.onnx"), engine="native",
                                exec_policy=xrt.ExecutionPolicy(tensor_parallel=2))
    options = sess.explain().options
    text = "\n".join(options)
    assert "column-parallel Gemm" in text and "in parts [" in text  # c_attn: q, k, v sliced separately
    assert "row-parallel Gemm" in text and "all_reduce(sum)" in text
    assert any(o.startswith("rank 1 on cpu:") for o in options)


def test_tensor_parallel_policy_is_validated_and_serialized():
    policy = xrt.ExecutionPolicy(tensor_parallel=2)
    assert '"tensor_parallel": 2' in policy.to_json()
    assert xrt.ExecutionPolicy.from_json(policy.to_json()).tensor_parallel == 2
    for bad in (0, 65):
        with pytest.raises(xrt.InvalidArgumentError, match="tensor_parallel"):
            xrt.ExecutionPolicy(tensor_parallel=bad)
    with pytest.raises(xrt.InvalidArgumentError, match="tensor_parallel"):
        xrt.ExecutionPolicy.from_json('{"tensor_parallel": "two"}')


def test_tensor_parallel_leaves_a_model_without_transformer_blocks_replicated():
    sess = xrt.InferenceSession(str(TINY / "resnet.dynamo.float32.onnx"), engine="native",
                                exec_policy=xrt.ExecutionPolicy(tensor_parallel=2))
    base = xrt.InferenceSession(str(TINY / "resnet.dynamo.float32.onnx"), engine="native")
    feeds = _suite_feeds(base, "resnet", "float32")
    want = base.run(feeds)
    got = sess.run(feeds)
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-4, atol=1e-5)


@requires_gpu
def test_tensor_parallel_needs_enough_gpus():
    n = xrt.get_device_count() + 1
    with pytest.raises(xrt.UnsupportedOperationError, match=f"tensor_parallel={n}"):
        xrt.InferenceSession(str(TINY / "bert.dynamo.float16.onnx"), engine="native", device="cuda:0",
                             exec_policy=xrt.ExecutionPolicy(tensor_parallel=n))


# ---- NCCL on GPUs ----

@requires_gpu
@requires_nccl
def test_one_rank_nccl_communicator_runs_every_collective():
    (comm,) = dist.init_all(["cuda:0"], timeout=60)
    assert comm.backend == "nccl" and comm.size == 1
    x = xrt.from_numpy(np.arange(24, dtype=np.float32).reshape(4, 6)).to("cuda:0")
    ref = np.arange(24, dtype=np.float32).reshape(4, 6)
    np.testing.assert_array_equal(_np(dist.all_reduce(x, comm)), ref)
    np.testing.assert_array_equal(_np(dist.all_gather(x, comm)), ref)
    np.testing.assert_array_equal(_np(dist.reduce_scatter(x, comm)), ref)
    np.testing.assert_array_equal(_np(dist.broadcast(x, comm)), ref)
    comm.wait()
    y, decision = xrt.ops.call("all_reduce", [x], {"comm": comm.handle}, return_decision=True)
    assert decision.kernel == "nccl" and decision.backend == "nccl"


@requires_2_gpus
@requires_nccl
@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int32])
def test_nccl_collectives_over_every_gpu(dtype):
    n = xrt.get_device_count()
    comms = dist.init_all([f"cuda:{i}" for i in range(n)], timeout=60)
    rng = np.random.default_rng(0)
    xs = [(rng.standard_normal((33, 17)) * 4).astype(dtype) for _ in range(n)]
    # Every rank's inputs reach its device before any rank launches a collective: with one thread per GPU, a rank
    # whose first allocation or host copy comes while another rank's collectives already spin on its GPU waited for
    # them inside the CUDA driver, and they for it (docs/distributed.md, "The multi-GPU tests, run after run").
    inputs = [(xrt.from_numpy(xs[r]).to(f"cuda:{r}"), xrt.from_numpy(np.concatenate([xs[r]] * n)).to(f"cuda:{r}"))
              for r in range(n)]

    def run(r, c):
        x, stacked = inputs[r]
        outs = [dist.all_reduce(x, c), dist.all_reduce(x, c, op="max"), dist.all_gather(x, c),
                dist.broadcast(x, c, root=n - 1), dist.reduce_scatter(stacked, c)]
        if n >= 2:
            if r == 0:
                dist.send(x, c, peer=1)
            elif r == 1:
                outs.append(dist.recv(x, c, peer=0))
        c.wait()
        return [_np(o) for o in outs]

    total = sum(x.astype(np.float64) for x in xs)
    # NCCL sums in its own order, in the element type: up to about n roundings of the largest term (a sum near zero
    # has no relative accuracy, hence the absolute part; 4 GPUs showed it).
    rtol = 3e-3 if dtype == np.float16 else 1e-5
    atol = n * float(np.finfo(dtype).eps) * float(np.abs(np.stack(xs)).max()) if dtype != np.int32 else 0.0
    for r, outs in enumerate(_on_ranks(comms, run)):
        np.testing.assert_allclose(outs[0].astype(np.float64), total, rtol=rtol, atol=atol)
        np.testing.assert_array_equal(outs[1], np.max(np.stack(xs), axis=0))
        np.testing.assert_array_equal(outs[2], np.concatenate(xs))
        np.testing.assert_array_equal(outs[3], xs[n - 1])
        np.testing.assert_allclose(outs[4].astype(np.float64), total, rtol=rtol, atol=atol)
        if r == 1:
            np.testing.assert_array_equal(outs[5], xs[0])


@requires_2_gpus
@requires_nccl
def test_nccl_group_from_one_thread():
    comms = dist.init_all(["cuda:0", "cuda:1"], timeout=60)
    xs = [xrt.from_numpy(np.full(1000, r + 1, np.float32)).to(f"cuda:{r}") for r in range(2)]
    with dist.group():
        ys = [dist.all_reduce(x, c) for x, c in zip(xs, comms)]
    for y, c in zip(ys, comms):
        c.wait()
        np.testing.assert_array_equal(_np(y), np.full(1000, 3, np.float32))


@requires_2_gpus
@requires_nccl
def test_nccl_rank_that_never_calls_times_out():
    comms = dist.init_all(["cuda:0", "cuda:1"], timeout=2)
    x = xrt.from_numpy(np.ones(1 << 20, np.float32)).to("cuda:0")
    # NCCL connects the ranks at their first collective: the call itself or the wait after it times out.
    with pytest.raises(xrt.DistributedTimeoutError, match="timeout"):
        dist.all_reduce(x, comms[0])
        comms[0].wait()
    assert comms[0].aborted
    with pytest.raises(xrt.DistributedError, match="aborted"):
        dist.all_reduce(x, comms[0])
    # The device stays usable: a fresh communicator works.
    (fresh,) = dist.init_all(["cuda:0"], timeout=30)
    np.testing.assert_array_equal(_np(dist.all_reduce(x, fresh)), np.ones(1 << 20, np.float32))


def _rank_process(folder, rank, world, queue):
    import numpy as np_

    import xpuruntime as x

    try:
        comm = x.distributed.init_rank(world, rank, f"cuda:{rank}", x.distributed.FileStore(folder), timeout=60)
        t = x.from_numpy(np_.full(4096, rank + 1.0, np_.float32)).to(f"cuda:{rank}")
        y = x.distributed.all_reduce(t, comm)
        comm.wait()
        queue.put((rank, float(np_.from_dlpack(y.to("cpu"))[0])))
    except Exception as e:  # noqa: BLE001 - reported to the parent
        queue.put((rank, repr(e)))


@requires_2_gpus
@requires_nccl
def test_one_process_per_gpu_through_a_file_store(tmp_path):
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_rank_process, args=(str(tmp_path), r, 2, queue)) for r in range(2)]
    for p in procs:
        p.start()
    try:
        results = dict(queue.get(timeout=120) for _ in procs)
    finally:
        for p in procs:
            _reap(p)
    assert results == {0: 3.0, 1: 3.0}, results


def _dying_rank(folder, queue):
    import os as os_

    import xpuruntime as x

    x.distributed.init_rank(2, 1, "cuda:1", x.distributed.FileStore(folder), timeout=60)
    queue.put("joined")
    queue.close()
    queue.join_thread()  # the message is in the pipe before the process dies
    os_._exit(0)  # dies without a word, its communicator never destroyed


@requires_2_gpus
@requires_nccl
def test_a_rank_that_dies_makes_the_other_fail_with_a_timeout(tmp_path):
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=_dying_rank, args=(str(tmp_path), queue))
    proc.start()
    try:
        # The peer is a new process: it joins after its imports and CUDA's start (about 6 s on an H200 machine),
        # which the collectives' 5 s timeout does not cover (Note [Cold starts are not collectives]).
        comm = dist.init_rank(2, 0, "cuda:0", dist.FileStore(str(tmp_path)), timeout=5)
        assert comm.init_timeout == 120 and comm.timeout == 5
        assert queue.get(timeout=60) == "joined"
        proc.join(60)
        x = xrt.from_numpy(np.ones(1 << 16, np.float32)).to("cuda:0")
        with pytest.raises(xrt.DistributedError):
            dist.all_reduce(x, comm)
            comm.wait()
        assert comm.aborted
    finally:
        _reap(proc)


@requires_gpu
@requires_nccl
def test_one_process_rank_waits_for_its_peer_and_times_out(tmp_path):
    # Rank 1 of 2 whose rank 0 never comes: the rendezvous times out with a typed error.
    with pytest.raises(xrt.DistributedTimeoutError, match="did not appear"):
        dist.init_rank(2, 1, "cuda:0", dist.FileStore(str(tmp_path)), timeout=60, init_timeout=0.5)


@requires_2_gpus
@requires_nccl
@pytest.mark.parametrize("arch", ["bert", "gpt2", "llama"])
@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
def test_tensor_parallel_on_two_gpus_matches_one(arch, exporter):
    path = TINY / f"{arch}.{exporter}.float16.onnx"
    base = xrt.InferenceSession(str(path), engine="native", device="cuda:0")
    feeds = _suite_feeds(base, arch, "float16")
    want = {k: _np(v).astype(np.float32) for k, v in base.run(feeds).items()}
    sess = xrt.InferenceSession(str(path), engine="native", device="cuda:0",
                                exec_policy=xrt.ExecutionPolicy(tensor_parallel=2))
    for _ in range(3):  # eager, capture, replay
        got = sess.run(feeds)
        for name in want:
            np.testing.assert_allclose(_np(got[name]).astype(np.float32), want[name], rtol=2e-2, atol=2e-2)
    ex = sess.explain()
    assert any("captured and replayed" in o for o in ex.options), ex.options
    assert {n["kernel"] for n in ex.nodes if n["op_type"] == "xpuruntime:AllReduce"} == {"nccl"}


def test_engine_auto_takes_the_native_engine_for_tensor_parallel():
    path = str(TINY / "bert.dynamo.float32.onnx")
    sess = xrt.InferenceSession(path, exec_policy=xrt.ExecutionPolicy(tensor_parallel=2))  # engine="auto", cpu
    assert sess.engine == "native"
    with pytest.raises(xrt.InvalidArgumentError, match="option of the native engine"):
        xrt.InferenceSession(path, engine="onnxruntime", exec_policy=xrt.ExecutionPolicy(tensor_parallel=2))


def test_nccl_tuning_kernels_are_policy_names():
    names = {k.name for k in xrt.kernels("all_reduce")}
    assert {"nccl_ring", "nccl_tree", "nccl_ring_ll128", "nccl_tree_simple"} <= names
    policy = xrt.KernelPolicy(all_reduce="nccl_tree_ll")
    assert xrt.KernelPolicy.from_json(policy.to_json()) == policy


@requires_gpu
@requires_nccl
def test_a_policy_names_the_nccl_algorithm_and_protocol():
    (tuned,) = dist.init_all(["cuda:0"], timeout=60, nccl_algo="Ring", nccl_proto="LL128")
    (plain,) = dist.init_all(["cuda:0"], timeout=60)
    x = xrt.from_numpy(np.ones(1024, np.float32)).to("cuda:0")
    pin = xrt.KernelPolicy(all_reduce=xrt.pinned("nccl_ring_ll128"))
    y, decision = xrt.ops.call("all_reduce", [x], {"comm": tuned.handle}, policy=pin, return_decision=True)
    assert decision.kernel == "nccl_ring_ll128"
    np.testing.assert_array_equal(_np(y[0]), np.ones(1024, np.float32))
    with pytest.raises(xrt.UnsupportedOperationError, match="NCCL_ALGO=''"):
        xrt.ops.call("all_reduce", [x], {"comm": plain.handle}, policy=pin)


@requires_2_gpus
@requires_nccl
def test_tensor_parallel_session_creates_communicators_the_policy_names():
    path = TINY / "llama.dynamo.float16.onnx"
    sess = xrt.InferenceSession(str(path), engine="native", device="cuda:0",
                                kernel_policy=xrt.KernelPolicy(all_reduce=xrt.pinned("nccl_tree")),
                                exec_policy=xrt.ExecutionPolicy(tensor_parallel=2))
    feeds = _suite_feeds(sess, "llama", "float16")
    base = xrt.InferenceSession(str(path), engine="native", device="cuda:0")
    want = {k: _np(v).astype(np.float32) for k, v in base.run(feeds).items()}
    got = sess.run(feeds)
    for name in want:
        np.testing.assert_allclose(_np(got[name]).astype(np.float32), want[name], rtol=2e-2, atol=2e-2)
    kernels = {n["kernel"] for n in sess.explain().nodes if n["op_type"] == "xpuruntime:AllReduce"}
    assert kernels == {"nccl_tree"}
