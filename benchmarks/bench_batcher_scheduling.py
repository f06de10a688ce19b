"""How the continuous batcher's scheduling choices pay on a serving load (docs/generation.md "Continuous batching").

The load: --requests requests over one system prompt of --system tokens (each with its own question of 1-12
tokens), --max-new new tokens at most, ending early at any of --stops stop tokens (an end-of-sequence token), all
submitted at once to a ContinuousBatcher of --max-batch over a pool of --blocks blocks of --block-size positions.
The same requests, the same session, in one run, under each PagedCacheConfig:

  whole, no sharing   reservation="whole_length", share_prefixes=False: each request holds the blocks of its prompt
                      and its whole new-token limit from admission, and computes its whole prompt
  whole, sharing      reservation="whole_length": the system prompt's blocks shared (Note [Prefills over shared
                      pasts], Note [Cached prefixes])
  on demand, sharing  the defaults: blocks as decoding needs them, preempting the request submitted last when the
                      pool is full (Note [Blocks on demand])

and the same requests generated one at a time by a Generator (batch 1). Per row: the wall time of the whole load,
tokens/s (median of --repeat), prefill runs, prompt positions computed and shared, the most requests decoded in one step, decode steps,
preemptions and the positions they recomputed, and whether every request's tokens equal its tokens alone.

The decoder is the tests' tiny model (tests/python/decoder_models.py: 2 layers, 16 wide, vocabulary 37), so the
figures measure scheduling, prefills and cache handling, not a language model's GEMMs.

    python benchmarks/bench_batcher_scheduling.py [--device cpu|cuda] [--engines native onnxruntime]
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

from decoder_models import tiny_decoder  # noqa: E402
from timing import emit_table  # noqa: E402
from xpuruntime.generation import ContinuousBatcher, GenerationConfig, Generator, PagedCacheConfig  # noqa: E402

SCHEDULES = {"whole, no sharing": dict(reservation="whole_length", share_prefixes=False),
             "whole, sharing": dict(reservation="whole_length"),
             "on demand, sharing": dict()}


def load(args) -> list:
    rng = np.random.default_rng(args.seed)
    system = [int(t) for t in rng.integers(1, 37, size=args.system)]
    return [system + [int(t) for t in rng.integers(1, 37, size=int(n))]
            for n in rng.integers(1, 13, size=args.requests)]


def serve(session, config, cache: PagedCacheConfig, requests: list) -> tuple:
    batcher = ContinuousBatcher(session, config, cache)
    start = time.perf_counter()
    ids = [batcher.submit(p) for p in requests]
    batcher.run()
    return time.perf_counter() - start, [batcher.tokens(i) for i in ids], batcher.stats


def rows_for(engine: str, args, requests: list) -> list:
    import xpuruntime as xrt

    model = tiny_decoder()
    config = GenerationConfig(max_new_tokens=args.max_new, stop_tokens=list(range(1, args.stops + 1)))
    session = xrt.InferenceSession(model, device=args.device, engine=engine)
    alone = Generator(session, config)
    alone.generate(requests[0])  # its plans built before the clock starts
    times = []
    for _ in range(args.repeat):
        start = time.perf_counter()
        expected = [alone.generate(p) for p in requests]
        times.append(time.perf_counter() - start)
    alone_s = statistics.median(times)
    tokens = sum(len(t) for t in expected)
    out = [f"| {engine} | one at a time (Generator, batch 1) | {alone_s * 1e3:.1f} | {tokens / alone_s:.0f} | "
           f"{len(requests)} | {sum(map(len, requests))} | 0 | 1 | | | | yes |"]
    for name, fields in SCHEDULES.items():
        cache = PagedCacheConfig(max_batch=args.max_batch, block_size=args.block_size, num_blocks=args.blocks,
                                 **fields)
        serve(session, config, cache, requests)  # plans of every shape this schedule runs, built once
        runs = [serve(session, config, cache, requests) for _ in range(args.repeat)]
        seconds = statistics.median(run[0] for run in runs)
        _, got, st = runs[0]
        out.append(f"| {engine} | {name} | {seconds * 1e3:.1f} | {tokens / seconds:.0f} | {st.prefill_runs} | "
                   f"{st.prefill_tokens} | {st.shared_tokens} | {st.max_running} | {st.decode_steps} | "
                   f"{st.preemptions} | {st.recomputed_tokens} | {'yes' if got == expected else 'NO'} |")
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--engines", nargs="+", default=["native", "onnxruntime"])
    parser.add_argument("--requests", type=int, default=48)
    # (the tiny decoder's position table has 64 rows: system + question + new tokens stay under that)
    parser.add_argument("--system", type=int, default=24, help="tokens of the shared system prompt")
    parser.add_argument("--max-new", type=int, default=24, help="new tokens at most per request")
    parser.add_argument("--stops", type=int, default=3, help="token ids 1..N end a request")
    parser.add_argument("--max-batch", type=int, default=16)
    parser.add_argument("--block-size", type=int, default=8)
    parser.add_argument("--blocks", type=int, default=48, help="blocks in the pool")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeat", type=int, default=5, help="times the load is served (median)")
    parser.add_argument("--out", default=None, help="also write the table here")
    args = parser.parse_args(argv)
    requests = load(args)
    lines = [f"bench_batcher_scheduling, {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, "
             f"{args.device} ({platform.processor() or platform.machine()}), {args.requests} requests over a "
             f"{args.system}-token system prompt, up to {args.max_new} new tokens (stop tokens 1..{args.stops}), "
             f"max_batch {args.max_batch}, {args.blocks} blocks of {args.block_size}, median of {args.repeat}", "",
             "| engine | schedule | ms | tokens/s | prefill runs | prompt positions computed | shared | most running "
             "| decode steps | preemptions | recomputed | same tokens |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    for engine in args.engines:
        try:
            lines += rows_for(engine, args, requests)
        except Exception as error:  # noqa: BLE001: reported in the table
            lines.append(f"| {engine} | {type(error).__name__}: {str(error).splitlines()[0][:120]} | |")
    emit_table(lines, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
