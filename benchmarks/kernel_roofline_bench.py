"""Generic kernels against the copy roofline (issue 19, "Kernels at the roofline").

Each case runs one registry op (gather, transpose, concat, slice, pad, resize, expand, tile, elementwise, where, cast,
reductions, softmax, layer_norm) through ``xrt.ops.call`` on large float16 tensors, outputs and workspace
preallocated (``out=``, ``workspace=``; nothing is allocated per call), on torch's current stream, and the same
computation through PyTorch's own op. A case's traffic is the bytes it must move at least: every input element it
needs read once, every output element written once. Its bandwidth is that traffic over the median time per call,
set against the bandwidth of a device-to-device copy measured in the same run (``x.copy_(y)`` of 256 MiB; the
"roofline") and against a nominal figure (``--reference-tbps``, 4.2 TB/s read+write for an H200).

Times: calls enqueued back to back between CUDA events (the sizes make each call far longer than its launch), the
median of ``--repeats`` groups of ``--calls``. Every case's output is checked against PyTorch's before it is timed.

    python3 benchmarks/kernel_roofline_bench.py [--cases add,transpose_nchw_nhwc] [--scale 1.0] \\
        [--json out.json] [--markdown out.md]
    python3 benchmarks/kernel_roofline_bench.py --device cpu --dtype float32 --scale 0.002   # a check, no GPU
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import pathlib
import statistics
import sys
import time
from typing import Callable, Dict, List

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src" / "python"))

import xpuruntime as xrt  # noqa: E402


def _scaled(shape, scale: float, axis: int = 0) -> List[int]:
    """``shape`` with dim ``axis`` scaled by ``scale`` (at least 1)."""
    out = list(shape)
    out[axis] = max(1, int(round(out[axis] * scale)))
    return out


def cases(torch, device: str, scale: float, dtype: str = "float16") -> List[dict]:
    """The benchmark cases: name, op, inputs, attrs, PyTorch's function and the least traffic in bytes."""
    F = torch.nn.functional
    half = getattr(torch, dtype)
    gen = torch.Generator(device=device).manual_seed(0)  # drawn where the tensors live: large sizes stay quick

    def rand(shape, dtype=half):
        return torch.randn(*shape, generator=gen, dtype=torch.float32, device=device).to(dtype)

    def nbytes(*tensors):
        return sum(t.numel() * t.element_size() for t in tensors)

    out: List[dict] = []

    def case(name, op, inputs, attrs, reference, note, extra_read=0, xrt_inputs=None):
        want = reference(*inputs)
        out.append({"name": name, "op": op, "inputs": inputs, "attrs": attrs, "reference": reference, "note": note,
                    "xrt_inputs": xrt_inputs or inputs,
                    "bytes": sum(nbytes(t) for t in inputs if t is not None) - extra_read + nbytes(want)})

    rows = _scaled([16384, 4096], scale)
    nchw = _scaled([64, 256, 64, 64], scale)
    a, b = rand(rows), rand(rows)
    case("add", "add", [a, b], None, torch.add, "a + b, same shape")
    bias = rand(rows[1:])
    case("add_bias", "add", [a, bias], None, torch.add, "a + b[C] (broadcast over rows)")
    x4 = rand(nchw)
    gate = rand(nchw[:2] + [1, 1])
    case("mul_channel_gate", "mul", [x4, gate], None, torch.mul, "x[N,C,H,W] * g[N,C,1,1] (squeeze-excitation)")
    case("gelu", "gelu", [a], {"approximate": "none"}, lambda x: F.gelu(x), "erf GELU")
    case("silu", "silu", [a], None, lambda x: F.silu(x), "x * sigmoid(x)")
    cond = a > 0
    try:  # older torch cannot hand bool tensors over DLPack: the condition is then xpuruntime's own tensor
        torch.utils.dlpack.to_dlpack(cond)
        xrt_cond = cond
    except (RuntimeError, BufferError):
        xrt_cond = xrt.ops.call("greater", [a, torch.zeros((), dtype=half, device=device)])[0]
    case("where", "where", [cond, a, b], None, torch.where, "cond ? a : b", xrt_inputs=[xrt_cond, a, b])
    to = "float32" if dtype != "float32" else "float16"
    case(f"cast_to_{to}", "cast", [a], {"to": to}, lambda x: x.to(getattr(torch, to)), f"{dtype} -> {to}")

    square = _scaled([8192, 8192], scale)
    xs = rand(square)
    case("transpose_2d", "transpose", [xs], {"perm": [1, 0]}, lambda x: x.t().contiguous(), "[R, C] -> [C, R]")
    case("transpose_nchw_nhwc", "transpose", [x4], {"perm": [0, 2, 3, 1]},
         lambda x: x.permute(0, 2, 3, 1).contiguous(), "NCHW -> NHWC (channels-last blocks)")
    heads = rand(_scaled([64, 1024, 16, 64], scale))
    case("transpose_heads", "transpose", [heads], {"perm": [0, 2, 1, 3]},
         lambda x: x.permute(0, 2, 1, 3).contiguous(), "[B, S, H, D] -> [B, H, S, D]")

    table = rand(_scaled([32768, 2048], scale))
    idx = torch.randint(0, table.shape[0], (table.shape[0],), generator=gen, device=device)
    case("gather_rows", "gather", [table, idx], {"axis": 0}, lambda t, i: torch.index_select(t, 0, i),
         "embedding rows, random int64 indices")
    qkv = rand(_scaled([3, 64, 16, 1024, 64], scale, axis=1))
    one = torch.tensor(1, dtype=torch.int64).to(device)
    case("gather_outer", "gather", [qkv, one], {"axis": 0}, lambda t, i: t[1].clone(),
         "scalar index on axis 0 (the exporter's q/k/v select): one third read", extra_read=nbytes(qkv) * 2 // 3)

    left, right = rand(_scaled([16384, 2048], scale)), rand(_scaled([16384, 2048], scale))
    case("concat_last", "concat", [left, right], {"axis": -1}, lambda p, q: torch.cat([p, q], -1),
         "two [R, 2048] -> [R, 4096]")
    case("concat_outer", "concat", [left, right], {"axis": 0}, lambda p, q: torch.cat([p, q], 0),
         "two [R, 2048] -> [2R, 2048]")
    wide = rand(_scaled([16384, 8192], scale))
    half_cols = wide.shape[1] // 2
    case("slice_last_half", "slice", [wide], {"starts": [0], "ends": [half_cols], "axes": [1]},
         lambda x: x[:, :half_cols].contiguous(), "[R, 8192] -> [R, :4096]: half read",
         extra_read=nbytes(wide) // 2)
    case("pad_spatial", "pad", [x4], {"pads": [0, 0, 1, 1, 0, 0, 1, 1], "mode": "constant"},
         lambda x: F.pad(x, (1, 1, 1, 1)), "NCHW, 1 on each side of H and W")
    small = rand(_scaled([64, 128, 64, 64], scale))
    up = [small.shape[0], small.shape[1], small.shape[2] * 2, small.shape[3] * 2]
    case("resize_nearest_2x", "resize", [small],
         {"sizes": up, "scales": [1.0, 1.0, 2.0, 2.0], "mode": "nearest",
          "coordinate_transformation_mode": "asymmetric", "nearest_mode": "floor"},
         lambda x: F.interpolate(x, scale_factor=2, mode="nearest"), "NCHW upsampling (FCN, SSD heads)")
    base = rand(_scaled([4096, 1, 4096], scale))
    case("expand", "expand", [base], {"shape": [base.shape[0], 4, base.shape[2]]},
         lambda x: x.expand(x.shape[0], 4, x.shape[2]).contiguous(), "[R, 1, C] -> [R, 4, C]")
    case("tile", "tile", [xs], {"repeats": [1, 2]}, lambda x: x.repeat(1, 2), "[R, C] -> [R, 2C]")

    case("reduce_sum_rows", "reduce_sum", [a], {"axes": [-1], "keepdims": 1},
         lambda x: x.sum(-1, keepdim=True), "sum over the last axis (4096)")
    case("reduce_mean_channels", "reduce_mean", [x4], {"axes": [1], "keepdims": 1},
         lambda x: x.mean(1, keepdim=True), "NCHW mean over C (LayerNorm over channels)")
    case("reduce_mean_spatial", "reduce_mean", [x4], {"axes": [2, 3], "keepdims": 1},
         lambda x: x.mean((2, 3), keepdim=True), "NCHW mean over H, W (squeeze-excitation)")
    case("softmax_rows", "softmax", [a], {"axis": -1}, lambda x: torch.softmax(x, -1), "rows of 4096")
    short = rand(_scaled([524288, 128], scale))
    case("softmax_short_rows", "softmax", [short], {"axis": -1}, lambda x: torch.softmax(x, -1),
         "rows of 128 (attention scores)")
    gamma, beta = rand(rows[1:]), rand(rows[1:])
    case("layer_norm", "layer_norm", [a, gamma, beta], {"axis": -1, "epsilon": 1e-5},
         lambda x, g, c: F.layer_norm(x, (x.shape[-1],), g, c, 1e-5), "rows of 4096, scale and bias")
    awkward_cases(torch, case, rand, scale)
    nms_cases(torch, case, device, scale)
    return out


def awkward_cases(torch, case, rand, scale: float) -> None:
    """Awkward shapes (issue 42, "no kernel off a cliff"): one result from a whole tensor, a huge row, prime sizes,
    integer inputs. ``torch.isinf(x).any()`` and ``(x > 0).all()`` export as a Cast to int64 and a ReduceMax /
    ReduceMin; ``x.max()`` as a ReduceMax over every axis; ``x.argmax()`` as an ArgMax of the flattened tensor."""
    flat = rand(_scaled([10485760], scale))  # 20 MiB of float16 (40 MiB of float32)
    case("reduce_max_all", "reduce_max", [flat], {"keepdims": 0}, lambda x: x.amax(), "x.max(): one output")
    prime = rand(_scaled([1000003], scale))
    case("reduce_sum_all_prime", "reduce_sum", [prime], {"keepdims": 0}, lambda x: x.float().sum().to(x.dtype),
         "sum of 1000003 elements")
    flags = (flat.float().abs() > 3.0).to(torch.int64)  # isinf(x).any()'s Cast, mostly zeros
    case("reduce_max_all_int64", "reduce_max", [flags], {"keepdims": 0}, lambda x: x.amax(),
         "isinf(x).any(): ReduceMax of int64 flags")
    small = flags[:65536]  # T5's guard at batch 1 ([1, 128, 512] hidden states): latency, not bandwidth
    case("reduce_max_all_int64_65536", "reduce_max", [small], {"keepdims": 0}, lambda x: x.amax(),
         "T5's isinf(x).any() at batch 1: ReduceMax of 65,536 int64 flags")
    bools = flat.float().abs() > 3.0  # what predicate_reduction reduces (Note [Reductions of predicates])
    case("reduce_max_all_bool", "reduce_max", [bools], {"keepdims": 0}, lambda x: x.any(),
         "isinf(x).any() after predicate_reduction: ReduceMax (any) of the bools")
    case("reduce_max_all_bool_65536", "reduce_max", [bools[:65536]], {"keepdims": 0}, lambda x: x.any(),
         "T5's guard at batch 1 after predicate_reduction: any of 65,536 bools")
    positive = (flat.float() > -10.0).to(torch.int64)
    case("reduce_min_all_int64", "reduce_min", [positive], {"keepdims": 0}, lambda x: x.amin(),
         "(x > 0).all(): ReduceMin of int64 flags")
    counts = (flat.float() > 0).to(torch.int32)
    case("reduce_sum_all_int32", "reduce_sum", [counts], {"keepdims": 0}, lambda x: x.sum(dtype=torch.int32),
         "int32 count of one tensor")
    signs = torch.where(flat.float() > 0, 1.0, -1.0).to(flat.dtype)
    case("reduce_prod_all", "reduce_prod", [signs], {"keepdims": 0}, lambda x: x.prod(), "product of +-1")
    case("arg_max_all", "arg_max", [flat], {"axis": 0, "keepdims": 0}, lambda x: x.argmax(),
         "x.argmax() of a flattened tensor")
    vocab = rand(_scaled([64, 128000], scale))
    case("arg_max_rows", "arg_max", [vocab], {"axis": -1, "keepdims": 0}, lambda x: x.argmax(-1),
         "greedy decoding: argmax over a vocabulary of 128000")
    tall = rand(_scaled([1000003, 3], scale))
    case("arg_min_columns", "arg_min", [tall], {"axis": 0, "keepdims": 0}, lambda x: x.argmin(0),
         "argmin down 3 columns of 1000003")
    walk = torch.where(flat.float() > 0, 0.125, -0.125).to(flat.dtype)  # sums stay exact
    case("cum_sum_long", "cum_sum", [walk], {"axis": 0}, lambda x: torch.cumsum(x.float(), 0).to(x.dtype),
         "cumsum of one long vector")
    # Note [Transposes of small matrices]: ShuffleNetV2's channels-last shuffle (millions of 2 x 58 matrices), an
    # image's planes to channels-last (a side of 3)
    shuffle = rand(_scaled([16 * 28 * 28, 2, 58], scale))
    case("transpose_channel_shuffle", "transpose", [shuffle], {"perm": [0, 2, 1]},
         lambda x: x.transpose(1, 2).contiguous(), "[NHW, 2, 58] -> [NHW, 58, 2] (channel shuffle)")
    image = rand(_scaled([64, 3, 224 * 224], scale))
    case("transpose_short_side", "transpose", [image], {"perm": [0, 2, 1]},
         lambda x: x.transpose(1, 2).contiguous(), "[N, 3, HW] -> [N, HW, 3] (an image to channels-last)")
    # channels-last depthwise convolutions (Note [Depthwise channels in part tiles]): 58 and 96 channels
    for channels in (58, 96):
        x = rand(_scaled([16, 56, 56, channels], scale))
        w = rand([channels, 3, 3, 1]) / 3.0
        case(f"depthwise_nhwc_c{channels}", "conv2d", [x, w],
             {"strides": [1, 1], "pads": [1, 1, 1, 1], "dilations": [1, 1], "groups": channels, "layout": "NHWC"},
             lambda x, w, c=channels: torch.nn.functional.conv2d(
                 x.permute(0, 3, 1, 2), w.permute(0, 3, 1, 2), padding=1, groups=c).permute(0, 2, 3, 1),
             f"3x3 depthwise, {channels} channels, NHWC")
    # Note [Grouped convolutions as GEMMs]: wav2vec 2.0's positional convolution (768 channels in 16 groups, kernel
    # 128 along time, 49 frames of a second of audio), channels-last as the native engine runs it
    frames = rand([1, 1, 49, 768])
    taps = rand([768, 1, 128, 48]) / 64.0
    case("grouped_conv_wav2vec2", "conv2d", [frames, taps],
         {"strides": [1, 1], "pads": [0, 64, 0, 64], "dilations": [1, 1], "groups": 16, "layout": "NHWC"},
         lambda x, w: torch.nn.functional.conv2d(x.permute(0, 3, 1, 2), w.permute(0, 3, 1, 2), padding=(0, 64),
                                                 groups=16).permute(0, 2, 3, 1).contiguous(),
         "wav2vec 2.0's positional convolution: 16 groups, kernel 1x128, NHWC")
    case("cum_sum_long_int64", "cum_sum", [flags], {"axis": 0}, lambda x: torch.cumsum(x, 0),
         "int64 cumsum of one long vector")
    # One long row, few rows: a vocabulary's softmax at batch 1, a norm over a whole feature map (GroupNorm(1),
    # PoolFormer's, as a LayerNormalization over C, H and W)
    vocab_row = rand([1, 128256])
    case("softmax_vocab_b1", "softmax", [vocab_row], {"axis": -1}, lambda x: torch.softmax(x.float(), -1).to(x.dtype),
         "softmax over a vocabulary of 128256 at batch 1")
    long_rows = rand(_scaled([2, 1048583], scale, axis=1))
    case("softmax_two_long_rows", "softmax", [long_rows], {"axis": -1},
         lambda x: torch.softmax(x.float(), -1).to(x.dtype), "softmax of 2 rows of 1048583")
    feature_map = rand([1, 64 * 56 * 56])
    case("layer_norm_one_row", "layer_norm", [feature_map], {"axis": -1, "epsilon": 1e-5},
         lambda x: torch.nn.functional.layer_norm(x.float(), (x.shape[-1],), eps=1e-5).to(x.dtype),
         "a norm over a whole [64, 56, 56] feature map at batch 1")
    # Note [TopK by radix select]: SSDlite's per-class TopK, top-k sampling over a vocabulary, one long row
    for name, shape, k, note in (("top_k_ssdlite", [1, 3234], 300, "SSDlite's per-class TopK: 300 of 3234 scores"),
                                 ("top_k_vocab", [64, 32000], 50, "top-50 of a 32000 vocabulary, 64 rows"),
                                 ("top_k_long_row", [1, 1048583], 100, "top-100 of one row of 1048583")):
        case(name, "top_k", [rand(shape)], {"k": k, "axis": -1, "largest": 1},
             lambda x, k=k: torch.topk(x, k).values, note)


def nms_cases(torch, case, device: str, scale: float) -> None:
    """NonMaxSuppression as SSDlite's export runs it (Note [The NMS walk]): torchvision's batched_nms offsets each
    class's boxes past the others' and hands one class of every candidate (90 classes x 300) to NonMaxSuppression, a
    walk that is serial in its tiles. The reference is torchvision's nms (the mask on the device, the walk on the
    host). Coordinates are multiples of 1/64, so areas and overlaps are exact in float32 as in float64."""
    try:
        import torchvision
    except ImportError:  # the case needs torchvision's nms as its reference
        return
    gen = torch.Generator(device="cpu").manual_seed(1)
    classes, per_class = max(1, round(90 * scale)), 300
    n = classes * per_class
    centre = torch.rand(n, 2, generator=gen)
    size = 0.05 + 0.45 * torch.rand(n, 2, generator=gen)
    offset = (torch.arange(n) // per_class).float()[:, None] * 2.0  # batched_nms: a class's boxes past the others'
    corners = torch.cat([centre - size / 2 + offset, centre + size / 2 + offset], dim=1)
    corners = (corners * 64).round() / 64
    boxes = corners[None].to(device)                                      # [1, n, 4], (x1, y1, x2, y2)
    scores = (torch.randperm(n, generator=gen).float() / n)[None, None].to(device)  # distinct: no ties

    def reference(b, s):
        keep = torchvision.ops.nms(b[0], s[0, 0], 0.55)
        out = torch.zeros((n, 3), dtype=torch.int64, device=b.device)
        out[:keep.numel(), 2] = keep
        return out

    case("nms_one_class_27000", "non_max_suppression", [boxes, scores],
         {"max_output_boxes_per_class": n, "iou_threshold": 0.55}, reference,
         f"{n} candidates in one class (SSDlite's batched NMS): a latency-bound walk, not a roofline case")


def timer(torch, device: str):
    """A function timing ``fn`` (median microseconds per call over groups of back-to-back calls)."""
    if device.startswith("cuda"):
        def measure(fn: Callable[[], object], calls: int, repeats: int) -> float:
            for _ in range(3):
                fn()
            torch.cuda.synchronize()
            times = []
            for _ in range(repeats):
                start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                for _ in range(calls):
                    fn()
                stop.record()
                stop.synchronize()
                times.append(start.elapsed_time(stop) * 1e3 / calls)
            return statistics.median(times)
    else:
        def measure(fn: Callable[[], object], calls: int, repeats: int) -> float:
            fn()
            times = []
            for _ in range(repeats):
                t0 = time.perf_counter()
                for _ in range(calls):
                    fn()
                times.append((time.perf_counter() - t0) * 1e6 / calls)
            return statistics.median(times)
    return measure


def run_case(torch, c: dict, device: str, measure, calls: int, repeats: int) -> dict:
    decision, outputs, workspace_bytes = xrt.ops.plan(c["op"], c["xrt_inputs"], c["attrs"])
    dtypes = {"float16": torch.float16, "float32": torch.float32, "bfloat16": torch.bfloat16,
              "float64": torch.float64, "int64": torch.int64, "int32": torch.int32, "bool": torch.bool}
    out = [torch.empty(list(shape), dtype=dtypes[str(dtype)], device=device) for shape, dtype in outputs]
    workspace = torch.empty(max(1, workspace_bytes), dtype=torch.uint8, device=device) if workspace_bytes else None
    stream = torch.cuda.current_stream() if device.startswith("cuda") else None

    def ours():
        xrt.ops.call(c["op"], c["xrt_inputs"], c["attrs"], out=out, workspace=workspace, stream=stream)

    ours()
    want = c["reference"](*c["inputs"])
    got = out[0]
    if want.dtype == torch.bool or not want.is_floating_point():
        error = 0.0 if torch.equal(got, want) else math.inf
    else:
        error = ((got.float() - want.float()).abs().max() / want.float().abs().max().clamp_min(1e-6)).item()
    if tuple(got.shape) != tuple(want.shape) or error > 2e-2:
        raise RuntimeError(f"{c['name']}: xpuruntime's {decision.kernel} differs from PyTorch (shape "
                           f"{tuple(got.shape)} vs {tuple(want.shape)}, relative error {error:.2e})")
    ours_us = measure(ours, calls, repeats)
    torch_us = measure(lambda: c["reference"](*c["inputs"]), calls, repeats)
    return {"case": c["name"], "op": c["op"], "kernel": f"{decision.kernel} ({decision.backend})", "note": c["note"],
            "shape": "x".join(str(d) for d in c["inputs"][0].shape), "mbytes": c["bytes"] / 2**20,
            "ours_us": ours_us, "torch_us": torch_us, "ours_gbs": c["bytes"] / ours_us / 1e3,
            "torch_gbs": c["bytes"] / torch_us / 1e3, "error": error}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--cases", default="", help="comma-separated case names (default: all)")
    ap.add_argument("--scale", type=float, default=1.0, help="scales each case's leading dim (0.002 for a CPU check)")
    ap.add_argument("--dtype", default="float16", help="the cases' float dtype (float32 for a CPU check)")
    ap.add_argument("--calls", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--reference-tbps", type=float, default=4.2, help="nominal read+write bandwidth (TB/s)")
    ap.add_argument("--json")
    ap.add_argument("--markdown")
    args = ap.parse_args()

    import torch
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("kernel_roofline_bench: no CUDA device for torch (use --device cpu for a check of the script)")
        return 2
    measure = timer(torch, args.device)
    copy_src = torch.empty(max(1, int(128 * 2**20 * args.scale)), dtype=torch.float16, device=args.device)
    copy_dst = torch.empty_like(copy_src)
    copy_us = measure(lambda: copy_dst.copy_(copy_src), args.calls, args.repeats)
    copy_gbs = 2 * copy_src.numel() * 2 / copy_us / 1e3

    # What one call costs the host: a call whose kernel is shorter cannot be timed by back-to-back calls (they then
    # measure this floor, not the kernel). Bench cases well above it.
    tiny = torch.zeros(8, dtype=getattr(torch, args.dtype), device=args.device)
    tiny_out = torch.empty_like(tiny)
    tiny_stream = torch.cuda.current_stream() if args.device.startswith("cuda") else None
    floor_us = measure(lambda: xrt.ops.call("add", [tiny, tiny], None, out=[tiny_out], stream=tiny_stream),
                       args.calls, args.repeats)

    wanted = {n for n in args.cases.split(",") if n}
    rows: List[dict] = []
    failures: Dict[str, str] = {}
    for c in cases(torch, args.device, args.scale, args.dtype):
        if wanted and c["name"] not in wanted:
            continue
        try:
            rows.append(run_case(torch, c, args.device, measure, args.calls, args.repeats))
        except Exception as error:  # a case that cannot run is reported, the others still run
            failures[c["name"]] = f"{type(error).__name__}: {str(error).splitlines()[0][:200]}"
        print(f"{c['name']}: done", file=sys.stderr, flush=True)

    name = torch.cuda.get_device_name(args.device) if args.device.startswith("cuda") else "CPU"
    nominal = args.reference_tbps * 1e3
    lines = [f"{datetime.date.today()} on {name}, torch {torch.__version__}, {args.dtype} unless noted; device copy "
             f"({copy_src.numel() * 2 / 2**20:.0f} MiB read and written, `copy_`) {copy_gbs:.0f} GB/s = the roofline; "
             f"nominal {nominal:.0f} GB/s; one call's host time (a one-word add) {floor_us:.1f} us: times within 1.3x "
             "of it are marked *host-bound* (the kernel is shorter; its bandwidth is higher than shown)", "",
             "| case | what | kernel | MiB moved | xpuruntime us | GB/s | % of copy | % of nominal | PyTorch us | "
             "PyTorch GB/s | xpuruntime / PyTorch |",
             "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in rows:
        bound = " *host-bound*" if r["ours_us"] < 1.3 * floor_us else ""
        lines.append(f"| {r['case']} | {r['note']} | {r['kernel']} | {r['mbytes']:.0f} | {r['ours_us']:.1f}{bound} | "
                     f"{r['ours_gbs']:.0f} | {100 * r['ours_gbs'] / copy_gbs:.0f}% | "
                     f"{100 * r['ours_gbs'] / nominal:.0f}% | {r['torch_us']:.1f} | {r['torch_gbs']:.0f} | "
                     f"{r['torch_us'] / r['ours_us']:.2f}x |")
    if rows:
        at = sum(1 for r in rows if r["ours_gbs"] >= 0.8 * copy_gbs)
        lines += ["", f"{at} of {len(rows)} cases at 80% of the measured copy bandwidth or more; geometric mean of "
                  f"xpuruntime / PyTorch speed "
                  f"{math.exp(statistics.mean(math.log(r['torch_us'] / r['ours_us']) for r in rows)):.2f}x."]
    for case_name, why in failures.items():
        lines.append(f"- {case_name}: not run ({why})")
    text = "\n".join(lines)
    print(text)
    if args.markdown:
        pathlib.Path(args.markdown).write_text(text + "\n")
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps({"device": name, "copy_gbs": copy_gbs, "call_floor_us": floor_us,
                                                       "rows": rows,
                                                       "failures": failures}, indent=1))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
