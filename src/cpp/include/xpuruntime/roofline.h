// The roofline of a node (docs/profiling.md, "Roofline audit"): the least time a node can take on a device,
//   floor = max(bytes it must move / the device's copy bandwidth, FLOPs / the device's peak for its precision),
// and its efficiency, floor / measured time. The Profiler's summary gives every node both (NodeSummary::floor_ns,
// ::efficiency); `xpuruntime audit MODEL` ranks nodes by the run time they lose to their floor.
//
// Work (what a node must do) comes from its op and shapes: `node_work` for a registry op (the native engine's
// steps), `onnx_node_work` for an ONNX node seen only by op type and shapes (ONNX Runtime's nodes, reference
// steps). Note [Roofline work] in core/roofline.cpp has the formulas and the conventions they share with
// benchmarks/ (bench_gemm.py, bench_attention.py, kernel_roofline_bench.py).
//
// Ceilings (what a device can do) are measured once per process and device, then cached: on the CPU a memory copy
// and a float32 matmul through the registry; on CUDA a device-to-device copy, and tensor-core peaks from a table of
// per-SM rates per architecture times the SM count and clock (Note [Device ceilings]). Any figure can be overridden:
// the environment (XPURT_ROOFLINE_CPU, XPURT_ROOFLINE_CUDA: "bandwidth=20e9,fp32=1.5e11") or an explicit argument
// (Profiler::set_ceilings, `xpuruntime audit --ceiling`).
//
// Thread-safety: every function may be called from any thread; the cache is guarded.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "xpuruntime/export.h"
#include "xpuruntime/op_descriptor.h"

namespace xpuruntime::roofline {

// What a node must do at least.
struct XPURT_API NodeWork {
  double flops = 0;      // arithmetic operations; a multiply-add counts 2
  double bytes = 0;      // bytes it must read and write: its inputs' and outputs' sizes (initializers included)
  // The ceiling its FLOPs run against: a matrix-unit precision ("fp32", "tf32", "fp16", "bf16", "fp8", "int8",
  // "fp64") for GEMM-like ops (matmul, linear, convolutions, attention, quantized GEMMs), "vector" for the rest.
  // Empty: no floor (a view, an op of unknown cost and no bytes).
  std::string ceiling;
  bool known() const { return !ceiling.empty(); }
};

// A registry op (OpDescriptor::op) on these inputs and outputs (absent optional inputs: present == false).
// `precision`: the policy's (tf32 turns float32 GEMMs into "tf32").
XPURT_API NodeWork node_work(const std::string& op, const Attributes& attrs, const std::vector<TensorDesc>& inputs,
                             const std::vector<TensorDesc>& outputs, Precision precision = Precision::kFP32);
XPURT_API NodeWork node_work(const OpDescriptor& desc);
// An ONNX node by op type (no domain; "xpuruntime:FusedConv" style prefixes are stripped) and its shapes as the
// profiler records them ("float32[1,3,224,224]"; unparsable entries count as absent). Unknown op types count one
// operation per output element.
XPURT_API NodeWork onnx_node_work(const std::string& op_type, const std::vector<std::string>& input_shapes,
                                  const std::vector<std::string>& output_shapes);
XPURT_API NodeWork onnx_node_work(const std::string& op_type, const std::vector<TensorDesc>& inputs,
                                  const std::vector<TensorDesc>& outputs);
// "float16[8,128,64]" -> dtype and shape; false when `text` is not one.
XPURT_API bool parse_shape_text(const std::string& text, TensorDesc* out);

// What a device can do. Figures in bytes or operations per second; 0 = unknown.
struct XPURT_API DeviceCeilings {
  std::string device;  // "cpu", "cuda:0"
  double bandwidth = 0;  // copy bandwidth, read + write bytes per second
  std::map<std::string, double> peaks;        // FLOP/s by NodeWork::ceiling key
  std::map<std::string, std::string> source;  // per figure ("bandwidth", each peak key): how it was had, in words
  // The peak for `key` (0 when unknown).
  double peak(const std::string& key) const;
};

// The ceilings of `device` ("cpu", "cuda", "cuda:N"): measured on first use and cached for the process, then the
// environment's overrides (XPURT_ROOFLINE_CPU / XPURT_ROOFLINE_CUDA), then `overrides` applied. Only the figures
// asked for are measured: `keys` lists the peak keys wanted (empty: bandwidth only). A figure in the overrides is
// not measured. A device that cannot be measured here (no such GPU) keeps its unmeasured figures at 0 and says why
// in source["error"]. InvalidArgumentError for a malformed override.
XPURT_API DeviceCeilings ceilings(const std::string& device, const std::vector<std::string>& keys,
                                  const std::map<std::string, double>& overrides = {});
// "bandwidth=4.23e12,fp16=727e12" -> {bandwidth: 4.23e12, fp16: 7.27e14}; InvalidArgumentError naming the bad
// entry (unknown key, a value that is not a positive number).
XPURT_API std::map<std::string, double> parse_overrides(const std::string& text);
// The keys overrides may name: "bandwidth", the NodeWork::ceiling keys.
XPURT_API const std::vector<std::string>& ceiling_keys();

// The node's floor in nanoseconds on `c` (0 when unknown) and which side bounds it ("memory", "compute", "").
struct XPURT_API Floor {
  double ns = 0;
  std::string bound;
};
XPURT_API Floor floor_of(const NodeWork& work, const DeviceCeilings& c);
// floor / measured (0 when either is 0).
XPURT_API double efficiency(double floor_ns, double measured_ns);

}  // namespace xpuruntime::roofline
