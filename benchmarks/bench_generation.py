"""Text generation's decode loop (docs/generation.md) on the test decoders, both engines, both cache forms, in one run:

  form      concat  transformers' form: present = Concat(past, new), rows left-padded (tiny_decoder), with
                    GenerationConfig(cache_layout="dynamic"): the past as long as the sequence so far
            concat-static  the same model with cache_layout="static" (what "auto" takes for it): decode steps feed the
                    whole fixed-size cache, so they all have one shape (Note [Static cache layout]); the continuous
                    batcher's decode steps likewise (Note [Static decode steps of the batcher])
            gqa     ONNX Runtime's GroupQueryAttention form: rows right-padded, one shared cache buffer per slot
                    appended in place, decode masks of a fixed width (tiny_gqa_decoder, the same weights)
  engine    native / onnxruntime (the engine a user would otherwise pick), same session options
For each (form, engine): a Generator over --batch prompts of mixed lengths and --new tokens, run twice in one process:
`first` (a fresh session: the native engine builds a plan per input-shape signature, so a decode step whose shapes it
has not seen pays for one) and `warm` (ms per decode step from GenerationStats, median of --repeat generations), and
whether the session replayed a CUDA graph (explain()); on CUDA the native engine again with cuda_graphs=False. Then
continuous batching: --requests requests of mixed lengths through a ContinuousBatcher of --max-batch against the same
requests generated one at a time (batch 1), decode tokens/s of each and the ratio.

The decoders are the tests' tiny models (tests/python/decoder_models.py: 2 layers, 16 wide, vocabulary 37), so the
figures measure the loop, the cache handling and the engines' per-step overhead, not a language model's GEMMs.

    python benchmarks/bench_generation.py [--device cpu|cuda] [--batch 4] [--new 40] [--requests 32] [--max-batch 8]
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

from decoder_models import tiny_decoder, tiny_gqa_decoder  # noqa: E402
from timing import emit_table  # noqa: E402
from xpuruntime.generation import ContinuousBatcher, GenerationConfig, Generator, PagedCacheConfig  # noqa: E402


def prompts(count: int, seed: int) -> list:
    rng = np.random.default_rng(seed)
    return [[int(t) for t in rng.integers(1, 37, size=int(n))] for n in rng.integers(1, 20, size=count)]


def generator_row(model: bytes, engine: str, args, graphs: bool = True, layout: str = "auto") -> dict:
    import xpuruntime as xrt

    config = GenerationConfig(max_new_tokens=args.new, cache_layout=layout)
    batch = prompts(args.batch, 1)
    session = xrt.InferenceSession(model, device=args.device, engine=engine,
                                   exec_policy=xrt.ExecutionPolicy(cuda_graphs=graphs))
    generator = Generator(session, config)
    rows = {}
    for run in ("first", "warm"):
        times = []
        for _ in range(1 if run == "first" else args.repeat):
            generation = generator.start(batch)
            while not generation.done:
                generation.step()
            times.append(generation.stats.ms_per_decode_step)
        rows[run] = statistics.median(times)
    rows["replayed"] = "captured and replayed" in str(session.explain())
    return rows


def batching_row(model: bytes, engine: str, args, layout: str = "auto") -> dict:
    config = GenerationConfig(max_new_tokens=args.new, cache_layout=layout)
    requests = prompts(args.requests, 2)
    alone = Generator(model, config, device=args.device, engine=engine)
    alone.generate(requests[0])  # warm the batch-1 plans
    start = time.perf_counter()
    expected = [alone.generate(p) for p in requests]
    alone_s = time.perf_counter() - start
    batcher = ContinuousBatcher(model, config, PagedCacheConfig(max_batch=args.max_batch, block_size=16),
                                device=args.device, engine=engine)
    for p in requests[:args.max_batch]:  # warm its plans on a first round
        batcher.submit(p)
    batcher.run()
    batcher = ContinuousBatcher(batcher.session, config, PagedCacheConfig(max_batch=args.max_batch, block_size=16))
    start = time.perf_counter()
    ids = [batcher.submit(p) for p in requests]
    out = batcher.run()
    batched_s = time.perf_counter() - start
    same = [out[i] for i in ids] == expected
    tokens = sum(len(t) for t in expected)
    return {"alone": tokens / alone_s, "batched": tokens / batched_s, "same": same,
            "stats": str(batcher.stats)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--engines", nargs="+", default=["native", "onnxruntime"])
    parser.add_argument("--batch", type=int, default=4, help="prompts per Generator batch")
    parser.add_argument("--new", type=int, default=40, help="new tokens per row")
    parser.add_argument("--repeat", type=int, default=5, help="warm generations (median)")
    parser.add_argument("--requests", type=int, default=32, help="requests through continuous batching")
    parser.add_argument("--max-batch", type=int, default=8)
    parser.add_argument("--out", default=None, help="also write the tables here")
    args = parser.parse_args(argv)
    forms = {"concat": tiny_decoder(), "concat-static": tiny_decoder(), "gqa": tiny_gqa_decoder()}
    lines = [f"bench_generation, {datetime.date.today()}, {args.device} ({platform.processor() or platform.machine()})"
             f", batch {args.batch}, {args.new} new tokens, {args.requests} requests, max_batch {args.max_batch}", "",
             "| form | engine | first generation, ms / decode step | warm, ms / decode step | CUDA graph replayed |",
             "| --- | --- | ---: | ---: | --- |"]
    batching = ["", "| form | engine | batch-1 one at a time, tokens/s | continuous batching, tokens/s | ratio | "
                    "same tokens |", "| --- | --- | ---: | ---: | ---: | --- |"]
    notes = []
    for form, model in forms.items():
        for engine in args.engines:
            try:
                layout = "static" if form.endswith("-static") else "dynamic" if form == "concat" else "auto"
                g = generator_row(model, engine, args, layout=layout)
                lines.append(f"| {form} | {engine} | {g['first']:.3f} | {g['warm']:.3f} | "
                             f"{'yes' if g['replayed'] else 'no'} |")
                if args.device.startswith("cuda") and engine == "native":  # the same without CUDA graphs
                    g = generator_row(model, engine, args, graphs=False, layout=layout)
                    lines.append(f"| {form} | native, cuda_graphs=False | {g['first']:.3f} | {g['warm']:.3f} | no |")
                b = batching_row(model, engine, args, layout)
                batching.append(f"| {form} | {engine} | {b['alone']:.0f} | {b['batched']:.0f} | "
                                f"{b['batched'] / b['alone']:.2f} | {'yes' if b['same'] else 'NO'} |")
                notes.append(f"- {form}, {engine}: {b['stats']}")
            except Exception as error:  # noqa: BLE001: reported in the table
                lines.append(f"| {form} | {engine} | {type(error).__name__}: {str(error).splitlines()[0][:120]} | |")
    emit_table(lines + batching + [""] + notes, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
