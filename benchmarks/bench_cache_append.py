"""One decode step of a Concat-form decoder through I/O binding, with the present bound over its own past (appended in
place: Note [Cache appended in place] in src/cpp/engines/native/plan/capture_plan.cpp) against the same step with the
present bound to a buffer of its own (the Concat reads the whole past and writes the whole present), in one run:

  native, in place   the past a view of the bound present's first positions: only the new position is written
  native, concat     the present bound elsewhere: the Concat's copies, and the copy of the past in and of the
                     present out where the engine stages them
  onnxruntime        ONNX Runtime's engine with the second binding (it has no in-place form for a Concat)

The decoder is the tests' tiny one (tests/python/decoder_models.py: 2 layers, 2 heads of 8, so 4 cache slots of
64 bytes per row and position): its GEMMs are negligible, so the step's time is the cache's memory traffic and the
engine's per-step overhead, which is what the append changes. Steps are the static cache layout's (the whole capacity
fed, the new position last), timed as the median of --iterations steps after --warmup.

    python benchmarks/bench_cache_append.py [--device cpu|cuda] [--batches 1,8] [--capacities 256,1024,4096]
"""

from __future__ import annotations

import argparse
import datetime
import pathlib
import platform
import statistics
import sys
import time

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "python"))

from decoder_models import HEAD_DIM, HEADS, LAYERS, tiny_decoder  # noqa: E402
from timing import emit_table  # noqa: E402

SLOTS = [f"{layer}.{kind}" for layer in range(LAYERS) for kind in ("key", "value")]


def device_buffer(xrt, array: np.ndarray, device: str):
    tensor = xrt.from_numpy(array)
    return tensor if device == "cpu" else tensor.to(device)


def time_steps(session, feeds: dict, pasts: dict, presents: dict, args) -> float:
    """Median ms of one run_with_iobinding over these bindings."""
    binding = session.io_binding()
    for name, value in feeds.items():
        binding.bind_input(name, value)
    for slot in SLOTS:
        binding.bind_input(f"past_key_values.{slot}", pasts[slot])
        binding.bind_output(f"present.{slot}", presents[slot])
    binding.bind_output("logits")
    times = []
    for i in range(args.warmup + args.iterations):
        start = time.perf_counter()
        session.run_with_iobinding(binding)
        if i >= args.warmup:
            times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def row(xrt, model: bytes, batch: int, capacity: int, args) -> dict:
    rng = np.random.default_rng(0)
    feeds = {"input_ids": rng.integers(0, 30, (batch, 1)), "attention_mask": np.ones((batch, capacity + 1), np.int64),
             "position_ids": np.full((batch, 1), capacity % 64, np.int64)}  # the decoder has 64 positions
    shape = (batch, HEADS, capacity + 1, HEAD_DIM)
    result = {}
    for engine in args.engines:
        try:
            session = xrt.InferenceSession(model, device=args.device, engine=engine)
        except xrt.XpuRuntimeError as error:
            result[engine] = f"{type(error).__name__}"
            continue
        if engine == "native":  # the present over the past: one buffer per slot, the past its first positions
            host = {s: rng.standard_normal(shape).astype(np.float32) for s in SLOTS}
            if args.device == "cpu":
                buffers = {s: xrt.from_dlpack(h) for s, h in host.items()}
                pasts = {s: xrt.from_dlpack(h[:, :, :capacity, :]) for s, h in host.items()}
            else:
                import torch  # a strided device view by DLPack

                views = {s: torch.from_numpy(h).to(args.device) for s, h in host.items()}
                buffers = {s: xrt.from_dlpack(v) for s, v in views.items()}
                pasts = {s: xrt.from_dlpack(v[:, :, :capacity, :]) for s, v in views.items()}
            result["native, in place"] = time_steps(session, feeds, pasts, buffers, args)
            text = str(session.explain())
            result["appended"] = "cache appended in place" in text
        own = {s: device_buffer(xrt, rng.standard_normal((batch, HEADS, capacity, HEAD_DIM)).astype(np.float32),
                                args.device) for s in SLOTS}
        elsewhere = {s: device_buffer(xrt, np.zeros(shape, np.float32), args.device) for s in SLOTS}
        result[f"{engine}, concat"] = time_steps(session, feeds, own, elsewhere, args)
    result["cache_mib"] = len(SLOTS) * batch * HEADS * (capacity + 1) * HEAD_DIM * 4 / 2**20
    return result


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--engines", nargs="+", default=["native", "onnxruntime"])
    parser.add_argument("--batches", default="1,8")
    parser.add_argument("--capacities", default="256,1024,4096")
    parser.add_argument("--iterations", type=int, default=50)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--out", default=None, help="also write the table here")
    args = parser.parse_args(argv)
    import xpuruntime as xrt

    model = tiny_decoder()
    columns = ["native, in place", "native, concat", "onnxruntime, concat"]
    when = datetime.datetime.now(datetime.timezone.utc)
    lines = [f"bench_cache_append, {when:%Y-%m-%d %H:%M} UTC, {args.device} ({platform.processor() or platform.machine()})"
             f", median of {args.iterations} steps, ms per decode step", "",
             "| batch | capacity | cache MiB | " + " | ".join(columns) + " | concat / in place | appended |",
             "| ---: | ---: | ---: | " + " | ".join("---:" for _ in columns) + " | ---: | --- |"]
    for batch in (int(b) for b in args.batches.split(",")):
        for capacity in (int(c) for c in args.capacities.split(",")):
            r = row(xrt, model, batch, capacity, args)
            cells = [f"{r[c]:.3f}" if isinstance(r.get(c), float) else str(r.get(c, "-")) for c in columns]
            ratio = (f"{r['native, concat'] / r['native, in place']:.2f}"
                     if isinstance(r.get("native, in place"), float) else "-")
            lines.append(f"| {batch} | {capacity} | {r['cache_mib']:.2f} | " + " | ".join(cells) +
                         f" | {ratio} | {'yes' if r.get('appended') else 'no'} |")
    emit_table(lines, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
