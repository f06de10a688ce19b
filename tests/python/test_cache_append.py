"""Note [Cache appended in place] (engines/native/plan/capture_plan.cpp): a present = Concat(past, new) output bound
over its own past (the past a view of the present's first positions) is written only at the new positions, on the
CPU and (with CUDA graphs) on the GPU; any other binding runs the Concat, with the same values as run()."""

import re

import numpy as np
import pytest

import xpuruntime as xrt
from conftest import requires_torch_gpu
from decoder_models import HEAD_DIM, HEADS, LAYERS, tiny_decoder
from xpuruntime.generation import GenerationConfig, Generator

BATCH, PAST = 2, 5
SLOTS = [f"{layer}.{kind}" for layer in range(LAYERS) for kind in ("key", "value")]


@pytest.fixture(scope="module")
def model() -> bytes:
    return tiny_decoder()


def step_feeds(rng, past_length=PAST):
    return {"input_ids": rng.integers(0, 30, (BATCH, 1)), "attention_mask": np.ones((BATCH, past_length + 1), np.int64),
            "position_ids": np.full((BATCH, 1), past_length, np.int64)}


def appended(session) -> int:
    """Concat steps the session ran as appends so far (0 when explain() does not mention any)."""
    found = re.search(r"cache appended in place: (\d+) Concat step", str(session.explain()))
    return int(found[1]) if found else 0


def bind(session, feeds, pasts, presents, wrap=xrt.from_dlpack):
    binding = session.io_binding()
    for name, value in feeds.items():
        binding.bind_input(name, value)
    for slot in SLOTS:
        binding.bind_input(f"past_key_values.{slot}", wrap(pasts[slot]))
        binding.bind_output(f"present.{slot}", wrap(presents[slot]))
    binding.bind_output("logits", "cpu")
    return binding


def test_a_present_bound_over_its_past_is_written_at_the_new_positions_only(model):
    """The past a strided view of the bound present's first positions: the present holds the past and the step's
    keys and values, the logits equal run()'s, every Concat ran as an append, and a second step over the same
    buffers (its new position overwritten) is right too."""
    session = xrt.InferenceSession(model, engine="native")
    rng = np.random.default_rng(0)
    buffers = {s: rng.standard_normal((BATCH, HEADS, PAST + 1, HEAD_DIM)).astype(np.float32) for s in SLOTS}
    pasts = {s: b[:, :, :PAST, :] for s, b in buffers.items()}
    for step in range(2):
        feeds = step_feeds(rng)
        expected = session.run({**feeds, **{f"past_key_values.{s}": np.ascontiguousarray(p) for s, p in pasts.items()}})
        binding = bind(session, feeds, pasts, buffers)
        session.run_with_iobinding(binding)
        np.testing.assert_allclose(binding.copy_outputs_to_cpu()[-1], expected["logits"], rtol=1e-5, atol=1e-6)
        for slot, buffer in buffers.items():
            np.testing.assert_array_equal(buffer, expected[f"present.{slot}"])
        assert appended(session) == len(SLOTS) * (step + 1)
    assert "only the new positions" in str(session.explain())
    # The transfers say so: an append per present (its new position's bytes), no copy of a past or a present.
    transfers = session.explain().transfers
    appends = [t for t in transfers if t["kind"] == "append"]
    assert sorted(t["value"] for t in appends) == sorted(f"present.{s}" for s in SLOTS)
    assert all(t["bytes"] == BATCH * HEADS * HEAD_DIM * 4 for t in appends)
    assert not [t for t in transfers if t["kind"] == "copy" and ("present" in t["value"] or "past" in t["value"])]
    from xpuruntime import report  # the CLI's report (xpuruntime explain) counts them apart from copies

    summary = report.build_report(session)["transfers"]["summary"]
    assert summary["appends_per_run"] == len(SLOTS) and summary["copies_per_run"] == 0
    assert "4 caches appended in place" in report.render_text(report.build_report(session))


def test_other_bindings_run_the_concat(model):
    """A present in a buffer of its own, and a past at the present's address read with other strides (its elements
    are not the present's first positions): the Concat runs, with run()'s values, and no append is counted."""
    session = xrt.InferenceSession(model, engine="native")
    rng = np.random.default_rng(1)
    feeds = step_feeds(rng)
    shape = (BATCH, HEADS, PAST + 1, HEAD_DIM)
    own = {s: rng.standard_normal((BATCH, HEADS, PAST, HEAD_DIM)).astype(np.float32) for s in SLOTS}
    presents = {s: np.zeros(shape, np.float32) for s in SLOTS}
    expected = session.run({**feeds, **{f"past_key_values.{s}": p for s, p in own.items()}})
    session.run_with_iobinding(bind(session, feeds, own, presents))
    for slot in SLOTS:
        np.testing.assert_array_equal(presents[slot], expected[f"present.{slot}"])
    # The same first address, contiguous strides: the past's rows are not where the present keeps them.
    buffers = {s: rng.standard_normal(shape).astype(np.float32) for s in SLOTS}
    pasts = {s: b.reshape(-1)[: BATCH * HEADS * PAST * HEAD_DIM].reshape(BATCH, HEADS, PAST, HEAD_DIM)
             for s, b in buffers.items()}
    assert all(p.ctypes.data == buffers[s].ctypes.data for s, p in pasts.items())
    expected = session.run({**feeds, **{f"past_key_values.{s}": p.copy() for s, p in pasts.items()}})
    binding = bind(session, feeds, pasts, buffers)
    session.run_with_iobinding(binding)
    np.testing.assert_allclose(binding.copy_outputs_to_cpu()[-1], expected["logits"], rtol=1e-5, atol=1e-6)
    for slot in SLOTS:
        np.testing.assert_array_equal(buffers[slot], expected[f"present.{slot}"])
    assert appended(session) == 0
    assert "cache appended in place" not in str(session.explain())


def test_the_static_cache_layout_appends_in_place(model):
    """Note [Static cache layout], in place: the native engine's decode steps write only their new position (one
    buffer of capacity + 1 positions per slot, no scratch), with the tokens of the dynamic layout and of ONNX
    Runtime's scratch form where it is installed."""
    prompts = [[1, 2, 3, 4, 5], [7, 8], [9, 10, 11]]
    expected = Generator(model, GenerationConfig(max_new_tokens=12, cache_layout="dynamic")).generate(prompts)
    session = xrt.InferenceSession(model, engine="native")
    generation = Generator(session, GenerationConfig(max_new_tokens=12, cache_layout="static")).start(prompts)
    while not generation.done:
        generation.step()
    assert generation.tokens == expected
    stats = generation.stats
    assert appended(session) == len(SLOTS) * stats.decode_steps
    batch = 4  # Note [Shape buckets]: three rows run as four
    assert stats.cache_bytes == len(SLOTS) * batch * HEADS * (stats.cache_capacity + 1) * HEAD_DIM * 4
    assert "a step writes only its new position" in generation.explain()


@requires_torch_gpu
def test_gpu_appends_in_place_replay_and_recapture_over_other_buffers(model):
    """On CUDA with graphs: bound presents over their pasts are appended in place in the captured graph; the same
    buffers replay it, other buffers capture again, a binding that is not an append runs the Concat; every step's
    values equal the CPU's."""
    import torch

    cpu = xrt.InferenceSession(model, engine="native")
    gpu = xrt.InferenceSession(model, device="cuda", engine="native")
    rng = np.random.default_rng(2)

    def run_step(buffers, pasts):
        feeds = step_feeds(rng)
        host = {s: np.ascontiguousarray(p.cpu().numpy()) for s, p in pasts.items()}
        expected = cpu.run({**feeds, **{f"past_key_values.{s}": v for s, v in host.items()}})
        binding = bind(gpu, feeds, pasts, buffers, wrap=lambda t: xrt.from_dlpack(t))
        gpu.run_with_iobinding(binding)
        torch.cuda.synchronize()
        np.testing.assert_allclose(binding.copy_outputs_to_cpu()[-1], expected["logits"], rtol=1e-4, atol=1e-5)
        for slot, buffer in buffers.items():
            got, want = buffer.cpu().numpy(), expected[f"present.{slot}"]
            np.testing.assert_array_equal(got[:, :, :PAST], host[slot])  # the past untouched, bit for bit
            # the new position: the GPU's float32 projection against the CPU's (GEMMs of other summation orders)
            np.testing.assert_allclose(got[:, :, PAST:], want[:, :, PAST:], rtol=1e-4, atol=1e-5)

    def fresh():
        buffers = {s: torch.randn(BATCH, HEADS, PAST + 1, HEAD_DIM, device="cuda") for s in SLOTS}
        return buffers, {s: b[:, :, :PAST, :] for s, b in buffers.items()}

    first = fresh()
    for _ in range(4):  # eager, capture, replays
        run_step(*first)
    assert "captured and replayed" in str(gpu.explain())
    run_step(*fresh())  # other presents: captured again
    run_step(*first)
    buffers, _ = fresh()
    own = {s: torch.randn(BATCH, HEADS, PAST, HEAD_DIM, device="cuda") for s in SLOTS}
    run_step(buffers, own)  # not an append: the Concat, in a graph of its own
    assert appended(gpu) == len(SLOTS) * 6
