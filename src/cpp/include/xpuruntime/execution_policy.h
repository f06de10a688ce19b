// ExecutionPolicy: how a run executes, apart from which kernel runs each op (that is the KernelPolicy):
// precision, determinism, CUDA graphs, shapes, memory limits, threads.
//
// Serialization is canonical: the same policy always gives the same bytes (keys sorted, every field written,
// sizes as integers), so `fingerprint()` identifies it. Loading accepts sizes as integers or strings with a
// unit ("256MiB", "1.5GB") and rejects unknown keys and bad values with the list of valid ones.
//
// Ownership: a plain value. Thread-safety: like any value type.
#pragma once

#include <cstdint>
#include <string>

#include "xpuruntime/export.h"
#include "xpuruntime/op_descriptor.h"

namespace xpuruntime {

struct XPURT_API ExecutionPolicy {
  // Math precision. fp32: exact fp32 GEMM/conv. tf32: fp32 tensors may use TF32 tensor cores. fp16 / bf16:
  // a session converts weights and activations to that type at build time (the functional ops compute in the
  // dtype of their tensors, accumulating in fp32). int8, fp8, int4-weights: a session runs a quantized model, the
  // one the decisions in `quantization` make of the float model, or the model as its producer quantized it (a float
  // model without decisions is refused); its QDQ nodes carry the precision (the int8 ops, int4 weight-only GEMMs)
  // and every other op computes as under fp32 (docs/quantization.md). Default fp32.
  Precision precision = Precision::kFP32;
  // Only kernels that give the same bits run after run (kernels declare it; cuDNN algorithms and cuBLASLt
  // split-K reductions that use atomics are excluded). Default false.
  bool deterministic = false;
  // Capture a session's plan into a CUDA graph and replay it (CUDA devices only). Default true.
  bool cuda_graphs = true;
  // Reject inputs whose shapes differ from the first run's instead of building a new plan. Default false.
  bool static_shape = false;
  // The most workspace one kernel may use, in bytes; 0 means the library's own default. Default 0.
  std::uint64_t workspace_limit = 0;
  // A cap on the bytes a session's device allocator may reserve; 0 means no cap. Default 0.
  std::uint64_t memory_limit = 0;
  // CPU threads for intra-op parallelism, the calling thread included; 0 means the CPUs the process may use (its
  // affinity mask and cgroup CPU quota, not the machine's core count). Default 0.
  int intra_op_threads = 0;
  // Whether the cpu backend's idle worker threads spin briefly (50 us) after a parallel loop before they park, so that
  // the next op's loop finds them awake (what ONNX Runtime's session.intra_op.allow_spinning does). false: they park
  // at once and every loop wakes them, which leaves the cores to other processes at once (Note [CPU worker threads]
  // in backends/cpu/cpu_threads.cpp). The native engine's cpu kernels only (ONNX Runtime keeps its own setting,
  // session.intra_op.allow_spinning). Default true.
  // Serialized only when false, so that policies written before this key keep their bytes and fingerprints.
  bool allow_spinning = true;
  // What a session on a CUDA device does with a node no CUDA kernel can run. "error" (default): session creation
  // raises UnsupportedOperationError listing every such node. "cpu": the node runs on the CPU (the ONNX reference
  // library), its inputs copied to the host and its outputs back; explain() lists those copies and the plan is not
  // captured into a CUDA graph.
  std::string fallback = "error";
  // Tensor parallelism of the native engine: a session's model is sharded over this many ranks (the transformer
  // blocks' GEMMs column/row-parallel, attention heads split, an all-reduce after each row-parallel GEMM; one
  // plan and one CUDA graph per rank). On cuda:d the ranks are cuda:d .. cuda:d+N-1 (NCCL); on the CPU, N ranks of
  // the host communicator. 1 to 64. Default 1 (docs/distributed.md).
  int tensor_parallel = 1;
  // Run a model whose IR version or ONNX opset is newer than the ONNX schemas xpuruntime knows (docs/reliability.md),
  // each operator with the newest semantics xpuruntime knows of it. Default false: such a model is refused with
  // UnsupportedOperationError naming the opset and a node. Serialized only when true, so that policies written
  // before this key keep their bytes and fingerprints.
  bool allow_newer_opsets = false;
  // Float8 GEMMs (qlinear_fp8 on cuBLASLt) with Hopper's fast accumulation (CUBLASLT_MATMUL_DESC_FAST_ACCUM): the
  // float8 tensor cores' partial sums are not promoted to float32 registers along K, which makes BERT-base's float8
  // GEMMs about 1.4x faster than without it on an H200 at batch 16 (docs/quantization.md, "Float8 GEMMs") and their
  // sums less exact (the partial sums keep fewer bits: an error that grows with K). What TensorRT-LLM and
  // torch._scaled_mm(use_fast_accum=True) offer; a numerics choice, so a policy key and never a timed tactic. Default
  // false. Serialized only when true, as allow_newer_opsets.
  bool fp8_fast_accumulation = false;
  // Quantization decisions (include/xpuruntime/quantization.h: scales, zero points, the nodes quantized and those
  // left float) as canonical JSON; "" for none. With precision int8, fp8 or int4-weights (the decisions' own), a
  // session applies them to the float model before its engine builds it (apply_quantization), so a policy file
  // replays the quantized model exactly; the Python SDK's calibration makes them (xrt.quantize,
  // ExecutionPolicy(calibration=...)). Validated on load (QuantizationDecisions::from_json: unknown keys refused).
  // Serialized only when set, as allow_newer_opsets.
  std::string quantization;

  std::string to_json() const;  // canonical, 2-space indented, ends with a newline
  std::string to_yaml() const;  // canonical
  static ExecutionPolicy from_json(const std::string& text);
  static ExecutionPolicy from_yaml(const std::string& text);
  // By extension: ".json", ".yaml"/".yml". Errors name the file.
  void save(const std::string& path) const;
  static ExecutionPolicy load(const std::string& path);
  // 16 hex digits of a 64-bit FNV-1a hash of `to_json()`.
  std::string fingerprint() const;
  std::string str() const;  // "ExecutionPolicy(precision=fp32, deterministic=false, ...)"

  bool operator==(const ExecutionPolicy& other) const = default;
};

// "fp32" etc.; InvalidArgumentError listing the valid names otherwise.
XPURT_API Precision precision_from_name(const std::string& name);
// "256MiB" / "1GB" / "4096" -> bytes; InvalidArgumentError otherwise.
XPURT_API std::uint64_t parse_byte_size(const std::string& text);

}  // namespace xpuruntime
