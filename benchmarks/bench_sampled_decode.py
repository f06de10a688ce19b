"""Sampled decode steps over a large vocabulary on the CPU (docs/generation.md, "Sampling"; Note [Rows picked in
parallel] in src/cpp/generation/step_io.cpp): the tests' tiny decoder (tests/python/decoder_models.py, 2 layers, 16
wide) with its vocabulary widened to --vocab (Llama 3's 128,256 by default), so that a step's time is mostly the host
Sampler's (top_p 0.9, temperature 0.8) rather than the model's. Per engine (the native engine, and ONNX Runtime's CPU
engine under the same Generator, the engine a user would otherwise pick) and batch: a Generator of --new sampled tokens
over random prompts, the best of --repeat generations after one warm-up, in ms per new token (the generation's time
over --new, its prefill included), and the first row's
first tokens (the same seed gives the same tokens on both engines when their logits agree).

    .venv/bin/python benchmarks/bench_sampled_decode.py [--vocab 128256] [--batches 1,8] [--new 8] [--repeat 3]
"""

from __future__ import annotations

import argparse
import datetime
import pathlib
import platform
import sys
import time

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "python"))
sys.path.insert(0, str(ROOT / "src" / "python"))

import decoder_models  # noqa: E402


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vocab", type=int, default=128256)
    parser.add_argument("--batches", default="1,8")
    parser.add_argument("--new", type=int, default=8, help="sampled tokens per row")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--engines", default="native,onnxruntime")
    args = parser.parse_args(argv)
    decoder_models.VOCAB = args.vocab  # the builder reads it when it runs
    from xpuruntime.generation import GenerationConfig, Generator

    model = decoder_models.tiny_decoder()
    config = GenerationConfig(max_new_tokens=args.new, do_sample=True, top_p=0.9, temperature=0.8, seed=1)
    print(f"bench_sampled_decode {datetime.date.today()}: {platform.node()}, vocabulary {args.vocab}, "
          f"{args.new} sampled tokens a row, best of {args.repeat}")
    print("| engine | batch | ms / new token | first tokens of row 0 |")
    print("| --- | ---: | ---: | --- |")
    rng = np.random.default_rng(0)
    for batch in [int(b) for b in args.batches.split(",") if b]:
        prompts = [rng.integers(1, min(args.vocab, 1000), size=6).tolist() for _ in range(batch)]
        for engine in [e for e in args.engines.split(",") if e]:
            gen = Generator(model, config, device="cpu", engine=engine)
            gen.generate(prompts)
            best, out = float("inf"), None
            for _ in range(args.repeat):
                start = time.perf_counter()
                out = gen.generate(prompts)
                best = min(best, time.perf_counter() - start)
            steps = max(1, args.new)
            print(f"| {engine} | {batch} | {best * 1e3 / steps:.1f} | {out[0][:4]} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
