"""Issue 44's target table (text generation): Llama-style decoders of about 1B and 8B parameters (random weights from
Llama-3.2-1B's and Llama-3.1-8B's shapes, float16) through xpuruntime's Generator against transformers' `generate`
with its static cache, eager and under `torch.compile`, on the same device in the same run.

Per model and batch (--batches, every row a prompt of --prompt random tokens, --new-tokens greedy new tokens):

  xpuruntime       Generator(model.onnx, GenerationConfig(cache_layout="static"), engine="native"): one warm-up
                   generation of the same shapes (plans, CUDA graph capture), then the median of --repeat; TTFT is
                   GenerationStats.prefill_ms, ms/step its ms_per_decode_step (whether a CUDA graph was replayed:
                   session.explain())
  transformers     model.generate(cache_implementation="static", disable_compile=True), attention "sdpa"
  torch.compile    the same, the decode step compiled (fullgraph, mode "reduce-overhead"): by generate itself
                   (compile_config; transformers compiles the decode step only, never the prefill), or, if that
                   fails, the docs' recipe model.forward = torch.compile(model.forward, ...). TTFT is generate with
                   max_new_tokens=1; ms/step = (t(N) - t(1)) / (N - 1); both medians of --repeat after two warm-ups
  sampled          --sampled host,device: the xpuruntime rows again with do_sample (top_p 0.9, temperature 0.8), the
                   tokens drawn by the host Sampler or where the logits are (GenerationConfig.sampling)
  xpuruntime int4  --weights float16,int4: the xpuruntime rows again on the export quantized by the SDK
                   (xrt.quantize(precision="int4-weights", block_size=32): int4 weights in blocks of 32 along K,
                   float16 scales, dequantized in front of each MatMul; written once beside model.onnx as
                   model-int4.onnx), its floor from the int4 bytes (0.5 + 2 / 32 bytes a weight)
  continuous       --requests requests, prompts of 64..--prompt tokens, through a ContinuousBatcher (max_batch =
                   --requests) on the xpuruntime session: new tokens / wall time (prefills included), against
                   xpuruntime's batch-1 decode tokens/s

% of floor: the bandwidth floor of a decode step over xpuruntime's ms/step. The floor is (the weight bytes a step reads
+ batch x the cache bytes of the average context, prompt + new_tokens / 2) / the copy bandwidth, measured as a
device-to-device copy of 1 GiB (bytes read + written / time; printed). Targets (issue 44): batch-1 decode >= 1.3x
torch.compile and >= 75% of the floor; continuous batching >= 10x batch-1 tokens/s.

The ONNX model (the Concat form of docs/generation.md: past_key_values.{i}.key/value -> present.{i}.key/value, left
padding) is exported once per preset into --work and reused: transformers' LlamaForCausalLM (attention "eager") in a
wrapper that fills a DynamicCache from the flat past inputs and passes a 4-D additive mask (causal + padding), which
transformers' mask code returns as it is. The TorchScript exporter first, torch.export (dynamo=True) if it fails.
--logits last (the default) exports the last position's logits only (transformers' logits_to_keep=1, what its
generate computes: the LM head over one position, not the prompt's every one); --logits all every position (the
2026-12-02 15:20 table in docs/benchmarks.md was measured so). A line says how many of xpuruntime's batch-1 greedy
tokens equal transformers' (a check of the export).

Each stage prints what it does; a failing stage or column is printed and becomes "failed: <reason>" in the table while
the others go on. Without transformers a model already exported into --work still runs (no torch columns). A device
with a time limit per command can run a preset per command, or the columns apart (--skip-torch, --skip-xpuruntime).

    PYTHONPATH=src/python python benchmarks/llama_generation_bench.py --models 1b,8b [--batches 1,8,64] \\
        [--prompt 512] [--new-tokens 128] [--work /tmp/llama_bench] [--out llama.json] [--skip-torch] [--profile 2]
    PYTHONPATH=src/python python benchmarks/llama_generation_bench.py --models tiny --prompt 32 --new-tokens 8
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import gc
import inspect
import json
import math
import pathlib
import shutil
import statistics
import sys
import time
import warnings
from typing import Callable, Dict, List, Optional

import numpy as np
import torch

try:
    import transformers

    HAVE_TRANSFORMERS, TRANSFORMERS_VERSION = True, transformers.__version__
except ImportError:
    HAVE_TRANSFORMERS, TRANSFORMERS_VERSION = False, None

PRESETS: Dict[str, dict] = {
    "tiny": dict(hidden_size=64, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=16, vocab_size=1000, rope_theta=10000.0, tie_word_embeddings=True,
                 max_position_embeddings=4096),
    "1b": dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,  # Llama-3.2-1B
               num_key_value_heads=8, head_dim=64, vocab_size=128256, rope_theta=500000.0, tie_word_embeddings=True,
               max_position_embeddings=131072),
    "8b": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,  # Llama-3.1-8B
               num_key_value_heads=8, head_dim=128, vocab_size=128256, rope_theta=500000.0, tie_word_embeddings=False,
               max_position_embeddings=131072),
}


def log(message: str) -> None:
    print(message, flush=True)


def short(error: BaseException) -> str:
    lines = str(error).strip().splitlines()
    return f"{type(error).__name__}: {lines[0][:140] if lines else ''}"


def sizes(preset: str) -> dict:
    """Parameters, the float16 weight bytes one decode step reads (the embedding table is gathered, a few rows; the
    LM head is read whole, the same table when tied) and the cache bytes per position (keys and values, all layers)."""
    s = PRESETS[preset]
    h, heads, kv, d = s["hidden_size"], s["num_attention_heads"], s["num_key_value_heads"], s["head_dim"]
    layer = h * heads * d + 2 * h * kv * d + heads * d * h + 3 * h * s["intermediate_size"] + 2 * h
    embed = s["vocab_size"] * h
    params = embed + s["num_hidden_layers"] * layer + h + (0 if s["tie_word_embeddings"] else embed)
    read = params - (0 if s["tie_word_embeddings"] else embed)
    cache = 2 * s["num_hidden_layers"] * kv * d * 2
    return {"params": params, "weight_bytes": 2 * read, "cache_bytes_per_position": cache}


def timed(device: str, fn: Callable[[], object]) -> float:
    """Seconds `fn` takes, the device synchronized before and after."""
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    sync()
    start = time.perf_counter()
    fn()
    sync()
    return time.perf_counter() - start


def copy_bandwidth(device: str) -> float:
    """Bytes per second of a device-to-device copy, read + written."""
    n = (1 << 30) if device.startswith("cuda") else (1 << 26)
    src = torch.empty(n, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)
    seconds = timed(device, lambda: [dst.copy_(src) for _ in range(10)])
    del src, dst
    return 2 * n * 10 / seconds


# Bytes an int4-weights model reads per float16 weight byte: half a byte of weight and a float16 scale per 32 weights,
# over the float16 weight's two bytes (the few float16 norm weights counted at that rate too: a rounding error).
INT4_BYTES_PER_FLOAT16_BYTE = (0.5 + 2 / 32) / 2


def floor_ms(preset: str, batch: int, args, bandwidth: float, weight_scale: float = 1.0) -> float:
    s = sizes(preset)
    context = args.prompt + args.new_tokens / 2
    return (weight_scale * s["weight_bytes"] + batch * s["cache_bytes_per_position"] * context) / bandwidth * 1e3


def prompts(batch: int, length: int, vocab: int, seed: int) -> List[List[int]]:
    rng = np.random.default_rng(seed)
    return rng.integers(1, vocab, size=(batch, length)).tolist()


def free(device: str) -> None:
    """Frees what the finished column held: torch's cache and xpuruntime's (sessions and plans dropped first)."""
    gc.collect()
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
        try:
            import xpuruntime.runtime as xrt

            log(f"  xpuruntime memory on {device}: {xrt.memory_allocated(device) / 2**30:.2f} GiB allocated, "
                f"{xrt.memory_reserved(device) / 2**30:.2f} GiB reserved, peak "
                f"{xrt.max_memory_allocated(device) / 2**30:.2f} GiB; emptying its cache")
            xrt.empty_cache()
        except Exception as error:  # noqa: BLE001: only housekeeping
            log(f"  xpuruntime's cache not emptied: {short(error)}")


# --- the transformers model and its export -------------------------------------------------------------------------

def llama_config(preset: str, attention: str):
    """LlamaConfig of the preset, rope_theta as rope_parameters where the config has those (transformers 5's
    dataclass configs), and the attention implementation asked for."""
    from transformers import LlamaConfig

    fields = dict(PRESETS[preset])
    theta = fields.pop("rope_theta")
    known = set(inspect.signature(LlamaConfig.__init__).parameters) | set(getattr(LlamaConfig, "__annotations__", {}))
    if "rope_parameters" in known:
        fields["rope_parameters"] = {"rope_type": "default", "rope_theta": theta}
    else:
        fields["rope_theta"] = theta
    config = LlamaConfig(rms_norm_eps=1e-5, **fields)
    try:
        config._attn_implementation = attention  # read by the model's __init__ (a property with a setter)
    except (AttributeError, TypeError, ValueError):  # then build_model's set_attn_implementation
        pass
    return config


def build_model(preset: str, attention: str, device: str):
    """LlamaForCausalLM with torch.manual_seed(0) random weights, float16, made on `device` directly (as
    from_pretrained(dtype=float16) does: the default dtype float16 while it is built, so rotary's float32 inv_freq stays
    float32)."""
    from transformers import LlamaForCausalLM

    config = llama_config(preset, attention)
    torch.manual_seed(0)
    previous = torch.get_default_dtype()
    try:
        torch.set_default_dtype(torch.float16)
    except (TypeError, RuntimeError):  # an old torch: made in float32, converted below
        pass
    try:
        with torch.device(device) if hasattr(torch.device, "__enter__") else contextlib.nullcontext():
            model = LlamaForCausalLM(config)
    finally:
        torch.set_default_dtype(previous)
    if any(p.dtype != torch.float16 for p in model.parameters()):
        model = model.half()
    model = model.to(device).eval()
    if getattr(model.config, "_attn_implementation", None) != attention and hasattr(model, "set_attn_implementation"):
        model.set_attn_implementation(attention)
    log(f"  built LlamaForCausalLM '{preset}': {sum(p.numel() for p in model.parameters()) / 1e9:.3f} B parameters, "
        f"attention {getattr(model.config, '_attn_implementation', '?')!r}, on {device}")
    return model


def additive_mask(attention_mask: torch.Tensor, seq: int, dtype: torch.dtype) -> torch.Tensor:
    """[batch, 1, seq, total]: 0 where query i (absolute position total - seq + i) may see key j (j <= i's position
    and attention_mask[b, j] == 1), the dtype's lowest value elsewhere. Every query also sees itself, so a padded
    query's row is never fully masked (a softmax of only -inf is NaN, which the next layer's keys would carry)."""
    total = attention_mask.shape[1]
    queries = torch.arange(total - seq, total, device=attention_mask.device).unsqueeze(1)
    keys = torch.arange(total, device=attention_mask.device).unsqueeze(0)
    allowed = ((keys <= queries)[None, None] & attention_mask.bool()[:, None, None, :]) | (keys == queries)[None, None]
    low = torch.full((), torch.finfo(dtype).min, dtype=dtype, device=attention_mask.device)
    return torch.where(allowed, torch.zeros((), dtype=dtype, device=attention_mask.device), low)


def cache_tensors(cache, layers: int) -> List[torch.Tensor]:
    """A filled transformers cache's keys and values per layer: `layers[i].keys` (transformers >= 4.56), else
    `key_cache[i]`, else `cache[i]`."""
    out = []
    for i in range(layers):
        if hasattr(cache, "layers"):
            out += [cache.layers[i].keys, cache.layers[i].values]
        elif hasattr(cache, "key_cache"):
            out += [cache.key_cache[i], cache.value_cache[i]]
        else:
            out += list(cache[i])
    return out


class CacheWrapper(torch.nn.Module):
    """forward(input_ids, attention_mask, position_ids, *past) -> (logits, present.0.key, present.0.value, ...): the
    flat past fills a DynamicCache (cache.update, layer by layer), to which the model appends the step's keys and
    values (a Concat in the graph); attention_mask [batch, total] becomes additive_mask's 4-D mask."""

    def __init__(self, model, last_logits: bool) -> None:
        super().__init__()
        self.model = model
        self.layers = model.config.num_hidden_layers
        parameters = inspect.signature(model.forward).parameters
        keep = next((k for k in ("logits_to_keep", "num_logits_to_keep") if k in parameters), None)
        self.keep = {keep: 1} if last_logits and keep else {}
        self.slice_last = last_logits and not keep

    def forward(self, input_ids, attention_mask, position_ids, *past):
        from transformers import DynamicCache

        cache = DynamicCache()
        for i in range(self.layers):
            cache.update(past[2 * i], past[2 * i + 1], i)
        mask = additive_mask(attention_mask, input_ids.shape[1], past[0].dtype)
        out = self.model(input_ids=input_ids, attention_mask=mask, position_ids=position_ids, past_key_values=cache,
                         use_cache=True, **self.keep)
        logits = out.logits[:, -1:] if self.slice_last else out.logits
        return (logits, *cache_tensors(cache, self.layers))


def example_inputs(preset: str, device: str, batch: int = 2, past: int = 3, seq: int = 4) -> tuple:
    s = PRESETS[preset]
    ids = torch.randint(1, s["vocab_size"], (batch, seq), device=device)
    mask = torch.ones(batch, past + seq, dtype=torch.int64, device=device)
    positions = torch.arange(past, past + seq, device=device).repeat(batch, 1)
    caches = [torch.randn(batch, s["num_key_value_heads"], past, s["head_dim"], device=device, dtype=torch.float16)
              for _ in range(2 * s["num_hidden_layers"])]
    return (ids, mask, positions, *caches)


def check_wrapper(wrapper: CacheWrapper, preset: str, device: str) -> None:
    """The wrapper with an empty past against the model's own forward: last-position logits, present shapes."""
    s = PRESETS[preset]
    ids = torch.randint(1, s["vocab_size"], (2, 8), device=device)
    empty = [torch.zeros(2, s["num_key_value_heads"], 0, s["head_dim"], device=device, dtype=torch.float16)
             for _ in range(2 * s["num_hidden_layers"])]
    with torch.no_grad():
        ours = wrapper(ids, torch.ones_like(ids), torch.arange(8, device=device).repeat(2, 1), *empty)
        reference = wrapper.model(input_ids=ids).logits[:, -1]
    difference = (ours[0][:, -1].float() - reference.float()).abs().max().item()
    log(f"  wrapper check: max |logits - model(input_ids).logits| = {difference:.3g} (last position), present.0.key "
        f"{list(ours[1].shape)}")
    if not math.isfinite(difference) or list(ours[1].shape) != [2, s["num_key_value_heads"], 8, s["head_dim"]]:
        raise RuntimeError(f"the export wrapper is wrong: logits difference {difference}, present.0.key "
                           f"{list(ours[1].shape)}")


def io_names(layers: int) -> "tuple[List[str], List[str]]":
    pasts = [f"past_key_values.{i}.{k}" for i in range(layers) for k in ("key", "value")]
    presents = [f"present.{i}.{k}" for i in range(layers) for k in ("key", "value")]
    return ["input_ids", "attention_mask", "position_ids"] + pasts, ["logits"] + presents


def export_torchscript(wrapper, example, path: pathlib.Path, layers: int, last: bool) -> None:
    """TorchScript exporter, opset 17 (as tests/python/decoder_models.py does); a model over 2 GB has its weights
    written as external data next to `path` (one file per tensor)."""
    inputs, outputs = io_names(layers)
    axes = {"input_ids": {0: "batch", 1: "seq"}, "attention_mask": {0: "batch", 1: "total"},
            "position_ids": {0: "batch", 1: "seq"}, "logits": {0: "batch"} if last else {0: "batch", 1: "seq"}}
    axes.update({n: {0: "batch", 2: "past"} for n in inputs[3:]})
    axes.update({n: {0: "batch", 2: "total"} for n in outputs[1:]})
    choice = {"dynamo": False} if "dynamo" in inspect.signature(torch.onnx.export).parameters else {}
    torch.onnx.export(wrapper, example, str(path), opset_version=17, dynamic_axes=axes, input_names=inputs,
                      output_names=outputs, do_constant_folding=True, **choice)


def export_dynamo(wrapper, example, path: pathlib.Path, layers: int) -> None:
    """torch.export-based exporter (opset 18, external data), every batch/sequence dimension Dim.DYNAMIC."""
    dynamic = torch.export.Dim.DYNAMIC
    inputs, outputs = io_names(layers)
    shapes = {"input_ids": {0: dynamic, 1: dynamic}, "attention_mask": {0: dynamic, 1: dynamic},
              "position_ids": {0: dynamic, 1: dynamic}, "past": tuple({0: dynamic, 2: dynamic} for _ in example[3:])}
    torch.onnx.export(wrapper, example, str(path), dynamo=True, opset_version=18, dynamic_shapes=shapes,
                      input_names=inputs, output_names=outputs, external_data=True)
    import onnx

    proto = onnx.load(str(path), load_external_data=False)
    if proto.ir_version > 10:  # what scripts/model_suite.py does for the readers of IR <= 10
        proto.ir_version = 10
        onnx.save(proto, str(path))


def export_into(partial: pathlib.Path, preset: str, args) -> str:
    """Builds the model (attention "eager"), checks the wrapper and exports it to partial/model.onnx: the TorchScript
    exporter, else dynamo. Returns which one wrote it; the model is freed whatever happens."""
    model = build_model(preset, "eager", args.device)
    wrapper = CacheWrapper(model, args.logits == "last").eval()
    try:
        check_wrapper(wrapper, preset, args.device)
        example = example_inputs(preset, args.device)
        layers = PRESETS[preset]["num_hidden_layers"]
        warnings.filterwarnings("ignore", category=torch.jit.TracerWarning)
        try:
            with torch.no_grad():
                export_torchscript(wrapper, example, partial / "model.onnx", layers, args.logits == "last")
            return "TorchScript exporter (dynamo=False, opset 17)"
        except Exception as error:  # noqa: BLE001: reported, then the other exporter
            log(f"  export: the TorchScript exporter failed ({short(error)}); trying dynamo=True")
        for stale in partial.iterdir():
            stale.unlink()
        export_dynamo(wrapper, example, partial / "model.onnx", layers)
        return "dynamo exporter (torch.export, opset 18)"
    finally:
        del wrapper, model
        free(args.device)


def export(preset: str, args) -> pathlib.Path:
    """--work/<preset>-<logits>-logits/model.onnx, exported unless it is there (into a .partial folder first, renamed
    when complete, so that a folder without .partial is a whole export)."""
    folder = pathlib.Path(args.work) / f"{preset}-{args.logits}-logits"
    path = folder / "model.onnx"
    if path.exists():
        log(f"  export: reusing {path}")
        return path
    if not HAVE_TRANSFORMERS:
        raise RuntimeError(f"no {path}, and no transformers here to export it (export it into --work elsewhere)")
    partial = folder.with_name(folder.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    start = time.perf_counter()
    how = export_into(partial, preset, args)
    shutil.rmtree(folder, ignore_errors=True)
    partial.rename(folder)
    size = sum(f.stat().st_size for f in folder.iterdir()) / 2**30
    log(f"  export: {how} wrote {path} ({size:.2f} GiB with its data) in {time.perf_counter() - start:.0f} s")
    return path


# --- the columns ---------------------------------------------------------------------------------------------------

def row(preset: str, column: str, batch: int, **fields) -> dict:
    return {"model": preset, "params": sizes(preset)["params"], "column": column, "batch": batch, **fields}


def run_generation(generator, batch: List[List[int]]):
    generation = generator.start(batch)
    while not generation.done:
        generation.step()
    return generation


def xpuruntime_row(generator, preset: str, batch: int, args, bandwidth: float, column: str = "xpuruntime",
                   weight_scale: float = 1.0) -> dict:
    rows = prompts(batch, args.prompt, PRESETS[preset]["vocab_size"], seed=batch)
    cold = run_generation(generator, rows).stats
    log(f"    batch {batch}: warm-up generation (plans, graph capture): prefill {cold.prefill_ms:.1f} ms, "
        f"{cold.ms_per_decode_step:.2f} ms/step")
    runs = [run_generation(generator, rows) for _ in range(args.repeat)]
    stats = [r.stats for r in runs]
    step_ms = statistics.median(s.ms_per_decode_step for s in stats)
    replayed = "captured and replayed" in str(generator.session.explain())
    floor = floor_ms(preset, batch, args, bandwidth, weight_scale)
    log(f"    batch {batch}: {stats[-1]}; the session has replayed a CUDA graph: {replayed}")
    return row(preset, column, batch, ttft_ms=statistics.median(s.prefill_ms for s in stats),
               ms_per_step=step_ms, tokens_per_s=statistics.median(s.decode_tokens_per_s for s in stats),
               floor_ms=floor, floor_pct=100 * floor / step_ms, graph_replayed=replayed,
               tokens=runs[-1].tokens[0] if batch == 1 else None)


def continuous_row(session, preset: str, args, batch1_tokens_per_s: Optional[float]) -> dict:
    from xpuruntime.generation import ContinuousBatcher, GenerationConfig, PagedCacheConfig

    rng = np.random.default_rng(64)
    lengths = rng.integers(min(64, args.prompt), args.prompt + 1, size=args.requests)
    requests = [prompts(1, int(n), PRESETS[preset]["vocab_size"], seed=1000 + i)[0] for i, n in enumerate(lengths)]
    config = GenerationConfig(max_new_tokens=args.new_tokens)
    blocks = sum(math.ceil((int(n) + args.new_tokens) / 16) for n in lengths) + args.requests
    cache = PagedCacheConfig(max_batch=args.requests, block_size=16, num_blocks=blocks)

    def serve():
        batcher = ContinuousBatcher(session, config, cache)
        start = time.perf_counter()
        ids = [batcher.submit(p) for p in requests]
        out = batcher.run()
        return batcher, sum(len(out[i]) for i in ids), time.perf_counter() - start

    serve()  # warm-up: the plans of every shape the timed run meets (the same requests, the same order)
    batcher, tokens, seconds = serve()
    stats = batcher.stats
    log(f"    continuous: {tokens} tokens in {seconds:.2f} s; {stats}")
    tokens_per_s = tokens / seconds
    return row(preset, "continuous batching", args.requests, ttft_ms=None,
               ms_per_step=stats.decode_ms / max(stats.decode_steps, 1), tokens_per_s=tokens_per_s,
               decode_tokens_per_s=stats.decode_tokens_per_s, prompt_lengths=f"{lengths.min()}..{lengths.max()}",
               vs_batch1=tokens_per_s / batch1_tokens_per_s if batch1_tokens_per_s else None)


def profile_decode(generator, preset: str, args) -> None:
    """--profile N: the kernels of N batch-1 generations (prefill and --new-tokens steps each), per generation, as
    kernel_breakdown.py prints them (torch.profiler's CUPTI records, CUDA graph replays included)."""
    import torch
    from kernel_breakdown import profile_runs

    rows = prompts(1, args.prompt, PRESETS[preset]["vocab_size"], seed=1)
    profile_runs(f"{preset} batch 1, one generation of {args.new_tokens} tokens",
                 lambda: run_generation(generator, rows), torch.cuda.synchronize, args.profile, 30)


def int4_export(path: pathlib.Path) -> pathlib.Path:
    """model-int4.onnx beside `path`: the SDK's int4 weight-only quantization of it, written once."""
    import xpuruntime as xrt

    out = path.with_name("model-int4.onnx")
    if out.exists():
        log(f"  int4: reusing {out}")
        return out
    import onnx

    start = time.perf_counter()
    result = xrt.quantize(str(path), precision="int4-weights", block_size=32)
    # External data: an 8B model's int4 weights alone are past protobuf's 2 GiB. Written under another name first,
    # so that a file named model-int4.onnx is a whole one.
    partial = out.with_name("partial-" + out.name)
    onnx.save_model(result.model, str(partial), save_as_external_data=True, all_tensors_to_one_file=True,
                    location=out.name + ".data", size_threshold=1024)
    partial.rename(out)
    size = (out.stat().st_size + out.with_name(out.name + ".data").stat().st_size) / 2**30
    log(f"  int4: xrt.quantize(precision='int4-weights', block_size=32) quantized {len(result.quantized_nodes)} "
        f"MatMul/Gemm weights, wrote {out} ({size:.2f} GiB with its data) in {time.perf_counter() - start:.0f} s")
    return out


def xpuruntime_rows(path: pathlib.Path, preset: str, args, bandwidth: float, weights: str = "float16") -> List[dict]:
    from xpuruntime.generation import GenerationConfig, Generator

    column = "xpuruntime" if weights == "float16" else f"xpuruntime {weights}"
    scale = 1.0 if weights == "float16" else INT4_BYTES_PER_FLOAT16_BYTE
    start = time.perf_counter()
    generator = Generator(str(path), GenerationConfig(max_new_tokens=args.new_tokens, cache_layout="static"),
                          device=args.device, engine="native")
    log(f"  {column}: session in {time.perf_counter() - start:.1f} s; {generator.signature}; cache layout "
        f"{generator.cache_layout}")
    rows = []
    for batch in args.batches:
        try:
            rows.append(xpuruntime_row(generator, preset, batch, args, bandwidth, column, scale))
        except Exception as error:  # noqa: BLE001: reported in the table
            log(f"    batch {batch}: failed: {short(error)}")
            rows.append(row(preset, column, batch, error=short(error)))
    if weights != "float16":  # the float16 session's rows alone go on to sampling, profiles and continuous batching
        del generator
        free(args.device)
        return rows
    for site in args.sampled:  # the same batches sampled (top_p 0.9, temperature 0.8), the tokens drawn at `site`
        sampled = Generator(generator.session, GenerationConfig(
            max_new_tokens=args.new_tokens, cache_layout="static", do_sample=True, top_p=0.9, temperature=0.8,
            seed=1, sampling=site))
        for batch in args.batches:
            column = f"xpuruntime sampled ({site})"
            try:
                rows.append(xpuruntime_row(sampled, preset, batch, args, bandwidth, column))
            except Exception as error:  # noqa: BLE001: reported in the table
                log(f"    {column}, batch {batch}: failed: {short(error)}")
                rows.append(row(preset, column, batch, error=short(error)))
    if args.profile:
        profile_decode(generator, preset, args)
    if args.skip_continuous:
        log("  continuous batching: skipped")
    else:
        batch1 = next((r["tokens_per_s"] for r in rows if r["batch"] == 1 and "error" not in r), None)
        try:
            rows.append(continuous_row(generator.session, preset, args, batch1))
        except Exception as error:  # noqa: BLE001
            log(f"    continuous: failed: {short(error)}")
            rows.append(row(preset, "continuous batching", args.requests, error=short(error)))
    explained = str(generator.session.explain())
    for line in explained.splitlines():  # what the session built for all of the above (Note [Constants shared ...])
        if "plans built" in line or "device constants" in line or line.startswith("memory"):
            log(f"  session: {line.strip()}")
    del generator
    free(args.device)
    return rows


def generate_kwargs(model, compiled: bool) -> "tuple[dict, str]":
    """generate()'s static-cache arguments, and the recipe in words. Eager: disable_compile (on CUDA generate compiles a
    static cache's decode step by itself otherwise). Compiled: generate's own compile_config, where there is one."""
    kwargs = {"cache_implementation": "static"}
    config = model.generation_config
    if not compiled:
        if hasattr(config, "disable_compile"):
            return dict(kwargs, disable_compile=True), "static cache, no compile"
        return kwargs, "static cache (this transformers has no disable_compile)"
    try:
        from transformers import CompileConfig
    except ImportError:
        return compile_forward(model)
    return (dict(kwargs, compile_config=CompileConfig(fullgraph=True, mode="reduce-overhead")),
            "static cache, generate's compile_config(fullgraph, reduce-overhead)")


def compile_forward(model) -> "tuple[dict, str]":
    """The docs' recipe (docs/source/en/llm_optims.md), generate's own compilation off."""
    model.forward = torch.compile(model.forward, mode="reduce-overhead", fullgraph=True)
    kwargs = {"cache_implementation": "static"}
    if hasattr(model.generation_config, "disable_compile"):
        kwargs["disable_compile"] = True
    return kwargs, "static cache, model.forward = torch.compile(fullgraph, reduce-overhead)"


def dynamo_graphs() -> Optional[int]:
    """Graphs torch.compile has made so far in this process (None where torch does not count them)."""
    try:
        from torch._dynamo.utils import counters

        return int(counters["stats"]["unique_graphs"])
    except Exception:  # noqa: BLE001: only a diagnostic
        return None


def torch_row(model, preset: str, column: str, batch: int, args, kwargs: dict) -> dict:
    ids = torch.tensor(prompts(batch, args.prompt, PRESETS[preset]["vocab_size"], seed=batch), device=args.device)
    mask = torch.ones_like(ids)

    def generate(n: int):
        return model.generate(ids, attention_mask=mask, max_new_tokens=n, min_new_tokens=n, do_sample=False,
                              pad_token_id=0, **kwargs)

    graphs = dynamo_graphs()
    for _ in range(2):  # compilation, CUDA graph recording, the static cache
        out = generate(args.new_tokens)
    made = out.shape[1] - args.prompt
    graphs = None if graphs is None else dynamo_graphs() - graphs
    generate(1)
    full = statistics.median(timed(args.device, lambda: generate(args.new_tokens)) for _ in range(args.repeat))
    first = statistics.median(timed(args.device, lambda: generate(1)) for _ in range(args.repeat))
    step_s = (full - first) / max(args.new_tokens - 1, 1)
    log(f"    {column}, batch {batch}: TTFT {first * 1e3:.1f} ms, {step_s * 1e3:.2f} ms/step ({made} new tokens; "
        f"torch.compile graphs made in the warm-up: {graphs})")
    return row(preset, column, batch, ttft_ms=first * 1e3, ms_per_step=step_s * 1e3, tokens_per_s=batch / step_s,
               compiled_graphs=graphs, tokens=out[0, args.prompt:].tolist() if batch == 1 else None)


def torch_column(model, preset: str, column: str, recipe: "tuple[dict, str]", args) -> List[dict]:
    kwargs, words = recipe
    log(f"  {column}: {words}")
    rows = []
    for batch in args.batches:
        try:
            rows.append(dict(torch_row(model, preset, column, batch, args, kwargs), recipe=words))
        except Exception as error:  # noqa: BLE001: reported in the table
            log(f"    {column}, batch {batch}: failed: {short(error)}")
            rows.append(row(preset, column, batch, error=short(error), recipe=words))
    return rows


def torch_rows(preset: str, args) -> List[dict]:
    """The transformers columns on one model (attention "sdpa"): eager, then compiled; the compiled column falls back
    to the docs' recipe when generate's own compilation fails, or compiles nothing, at every batch."""
    for limit in ("recompile_limit", "cache_size_limit"):  # one compilation per batch size
        if hasattr(torch._dynamo.config, limit):
            setattr(torch._dynamo.config, limit, 64)
    model = build_model(preset, "sdpa", args.device)
    try:
        rows = torch_column(model, preset, "transformers", generate_kwargs(model, compiled=False), args)
        compiled = generate_kwargs(model, compiled=True)
        tried = torch_column(model, preset, "torch.compile", compiled, args)
        if all("error" in r or r["compiled_graphs"] == 0 for r in tried) and "model.forward" not in compiled[1]:
            log("  torch.compile: generate's own compilation failed or compiled nothing; the docs' recipe instead")
            tried = torch_column(model, preset, "torch.compile", compile_forward(model), args)
        return rows + tried
    finally:
        del model
        torch._dynamo.reset()
        free(args.device)


# --- the report ----------------------------------------------------------------------------------------------------

def cell(value: Optional[float], digits: int) -> str:
    return "—" if value is None else f"{value:.{digits}f}"


def table(rows: List[dict]) -> str:
    lines = ["| model | params | column | batch | TTFT ms | ms/step | tokens/s | % of floor |",
             "| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: |"]
    for r in rows:
        params = f"{r['params'] / 1e9:.2f} B" if r["params"] >= 1e8 else f"{r['params'] / 1e6:.2f} M"
        head = f"| {r['model']} | {params} | {r['column']} | {r['batch']} |"
        if "error" in r:
            lines.append(f"{head} failed: {r['error'].replace('|', '/')} | | | |")
            continue
        lines.append(f"{head} {cell(r.get('ttft_ms'), 1)} | {cell(r['ms_per_step'], 2)} | "
                     f"{cell(r['tokens_per_s'], 0)} | {cell(r.get('floor_pct'), 0)} |")
    return "\n".join(lines)


def targets(rows: List[dict]) -> List[str]:
    """Issue 44's three targets, from the batch-1 rows and the continuous-batching row."""
    def find(column: str, batch: Optional[int] = None) -> Optional[dict]:
        return next((r for r in rows if r["column"] == column and (batch is None or r["batch"] == batch)
                     and "error" not in r), None)

    ours, theirs, served = find("xpuruntime", 1), find("torch.compile", 1), find("continuous batching")
    out = []
    if ours and theirs:
        ratio = ours["tokens_per_s"] / theirs["tokens_per_s"]
        out.append(f"batch-1 decode: {ratio:.2f}x torch.compile (target >= 1.3x): "
                   f"{'met' if ratio >= 1.3 else 'NOT met'}")
    if ours:
        pct = ours["floor_pct"]
        out.append(f"batch-1 decode: {pct:.0f}% of the bandwidth floor ({ours['floor_ms']:.3f} ms/step) "
                   f"(target >= 75%): {'met' if pct >= 75 else 'NOT met'}")
    reference = find("transformers", 1)
    if ours and reference and ours.get("tokens") and reference.get("tokens"):
        same = next((i for i, (a, b) in enumerate(zip(ours["tokens"], reference["tokens"])) if a != b),
                    min(len(ours["tokens"]), len(reference["tokens"])))
        out.append(f"batch-1 greedy tokens: the first {same} of {len(ours['tokens'])} equal transformers' (float16 "
                   f"near-ties of random weights may part them later; none equal suggests a wrong export)")
    if served and served.get("vs_batch1"):
        ratio = served["vs_batch1"]
        out.append(f"continuous batching: {ratio:.1f}x batch-1 tokens/s (target >= 10x): "
                   f"{'met' if ratio >= 10 else 'NOT met'}")
    return out


def bench_model(preset: str, args, bandwidth: float) -> List[dict]:
    s = sizes(preset)
    log(f"\n== {preset}: {s['params'] / 1e9:.3f} B parameters, {s['weight_bytes'] / 1e9:.2f} GB of weights read per "
        f"decode step, {s['cache_bytes_per_position'] / 1024:.0f} KiB of cache per position")
    rows: List[dict] = []
    if args.skip_xpuruntime:
        log("  xpuruntime: skipped (--skip-xpuruntime)")
    else:
        path = None
        try:
            import xpuruntime.generation  # noqa: F401: before an export of minutes
            path = export(preset, args)
            if "float16" in args.weights:
                rows += xpuruntime_rows(path, preset, args, bandwidth)
        except Exception as error:  # noqa: BLE001: the torch columns can still run
            log(f"  xpuruntime: failed: {short(error)}")
            rows += [row(preset, "xpuruntime", b, error=short(error)) for b in args.batches]
        if path is not None and "int4" in args.weights:
            try:
                rows += xpuruntime_rows(int4_export(path), preset, args, bandwidth, "int4")
            except Exception as error:  # noqa: BLE001
                log(f"  xpuruntime int4: failed: {short(error)}")
                rows += [row(preset, "xpuruntime int4", b, error=short(error)) for b in args.batches]
    if args.skip_torch or not HAVE_TRANSFORMERS:
        log(f"  transformers / torch.compile: skipped ({'--skip-torch' if args.skip_torch else 'no transformers'})")
    else:
        try:
            rows += torch_rows(preset, args)
        except Exception as error:  # noqa: BLE001
            log(f"  transformers: failed: {short(error)}")
            rows += [row(preset, c, b, error=short(error)) for c in ("transformers", "torch.compile")
                     for b in args.batches]
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="1b,8b", help=f"comma-separated presets: {', '.join(PRESETS)}")
    parser.add_argument("--batches", default="1,8,64")
    parser.add_argument("--prompt", type=int, default=512, help="prompt tokens per row")
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--requests", type=int, default=64, help="requests through continuous batching")
    parser.add_argument("--repeat", type=int, default=3, help="timed generations per row (median)")
    parser.add_argument("--logits", choices=("all", "last"), default="last",
                        help="positions the export's logits hold: last (logits_to_keep=1, what transformers' generate "
                             "computes) or all")
    parser.add_argument("--work", default="/tmp/llama_bench", help="where the exported models are kept")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--skip-torch", action="store_true", help="no transformers / torch.compile columns")
    parser.add_argument("--skip-xpuruntime", action="store_true", help="no export, no xpuruntime columns")
    parser.add_argument("--skip-continuous", action="store_true")
    parser.add_argument("--sampled", default="", help="comma-separated sampling sites (host, device): the xpuruntime "
                        "rows again with do_sample, top_p 0.9, temperature 0.8, the tokens drawn there")
    parser.add_argument("--weights", default="float16",
                        help="comma-separated: float16 (the export), int4 (the export quantized by xrt.quantize, "
                             "int4-weights)")
    parser.add_argument("--profile", type=int, default=0,
                        help="after the xpuruntime rows, print the top kernels of this many batch-1 generations")
    parser.add_argument("--out", default=None, help="write the rows here as JSON")
    args = parser.parse_args(argv)
    args.batches = [int(b) for b in args.batches.split(",") if b]
    args.sampled = [s for s in args.sampled.split(",") if s]
    args.weights = [w for w in args.weights.split(",") if w]
    if any(w not in ("float16", "int4") for w in args.weights):
        parser.error(f"--weights takes float16 and int4, got {args.weights}")
    models = [m for m in args.models.split(",") if m]
    unknown = [m for m in models if m not in PRESETS]
    if unknown:
        parser.error(f"unknown model preset(s) {unknown}; expected some of {list(PRESETS)}")
    if not HAVE_TRANSFORMERS:
        log("transformers is not importable: no export (a model already in --work still runs) and no torch columns")
    device_name = torch.cuda.get_device_name() if args.device.startswith("cuda") else args.device
    log(f"llama_generation_bench {datetime.date.today()}: {device_name}, torch {torch.__version__}, transformers "
        f"{TRANSFORMERS_VERSION}; prompt {args.prompt}, {args.new_tokens} new tokens, batches {args.batches}")
    bandwidth = copy_bandwidth(args.device)
    free(args.device)
    log(f"copy bandwidth (device-to-device copy of {'1 GiB' if args.device.startswith('cuda') else '64 MiB'}, read + "
        f"written): {bandwidth / 1e9:.0f} GB/s")
    rows, summary = [], []
    for preset in models:
        model_rows = bench_model(preset, args, bandwidth)
        rows += model_rows
        summary += [f"{preset}: {line}" for line in targets(model_rows)]
        log("\n" + table(model_rows))
    log(f"\ncopy bandwidth {bandwidth / 1e9:.0f} GB/s; the floor: (weight bytes + batch x cache bytes at prompt + "
        f"new_tokens / 2) / that")
    log("\n".join(summary))
    if args.out:
        pathlib.Path(args.out).write_text(json.dumps({
            "date": str(datetime.date.today()), "device": device_name, "torch": torch.__version__,
            "transformers": TRANSFORMERS_VERSION, "copy_bandwidth_gb_s": bandwidth / 1e9,
            "args": {k: v for k, v in vars(args).items()}, "rows": rows, "targets": summary}, indent=1) + "\n")
        log(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
