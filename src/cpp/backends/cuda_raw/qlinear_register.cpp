// Registration of qlinear's kernels of the cuda_raw backend: "int8_wgmma", Hopper's warpgroup MMA with the epilogue
// in registers (qlinear_wgmma.cu, Note [int8 GEMM by wgmma]; it ranks before cuBLASLt from kWgmmaRanksFirstRows rows
// on sm_90), "int8_mma", the pipelined tensor-core kernel of qconv2d run as a 1x1 convolution (quant_conv_mma.cu, Note
// [Pipelined int8 convolution]; Note [qlinear as a 1x1 convolution] below), and "dp4a" (quant_gemm.cu, Note [The dp4a
// kernel of qlinear]): every shape, layout and alignment, ranked after cuBLASLt's IMMA kernel, which takes the aligned
// [N, K] GEMMs.
//
// Note [qlinear as a 1x1 convolution]
// x [M, K] is an NHWC image of one row of M pixels with K channels, the [N, K] weight a 1x1 OHWI filter: the pipelined
// convolution computes the GEMM with its requantizing epilogue in registers, where cuBLASLt's IMMA kernel writes the
// int32 accumulators to memory for a second pass (4 bytes an output written and read again, against 1 for an int8
// output) and a split of the reduction has to be cuBLASLt's own. It takes weight_layout=nk, K a multiple of 16 and
// 16-byte aligned operands. It ranks after cuBLASLt (registry order): on an H200 (2026-12-02, docs/benchmarks.md) it
// was 0.5-1.0x cuBLASLt's speed at BERT-base's shapes, so it runs where a policy pins it or autotuning
// (auto:BestPerformance) times it faster. The
// kernel multiplies a uint8 x as stored (mma.sync u8.s8), so the correction folded into the bias is -x_zero_point,
// not QLinearProblem's 128 - x_zero_point of the kernels that take x - 128.
#include <algorithm>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "backends/cuda_raw/cuda_raw_kernels.h"
#include "backends/cuda_raw/cuda_raw_ops.h"
#include "backends/cuda_raw/cuda_raw_register.h"
#include "backends/cuda_raw/quant_conv.h"
#include "backends/cuda_raw/quant_conv_mma.h"
#include "backends/cuda_raw/qlinear_wgmma.h"
#include "core/cuda_utils.h"
#include "core/quantized_gemm.h"
#include "xpuruntime/execution_policy.h"
#include "xpuruntime/device_manager.h"
#include "xpuruntime/kernel_registry.h"

namespace xpuruntime::cuda_raw {

namespace {

using quantized::QLinearProblem;

constexpr int kDp4aComputeCapability = 61;  // __dp4a: Pascal and newer
constexpr std::size_t kScratchAlignment = 256;
constexpr std::int64_t kMaxColumns = std::int64_t{65535} * 64;  // the grid's y extent times the tile's width

// What the declarations of qlinear's cuda_raw kernels share: its inputs, their dtypes, contiguous tensors on the
// device, compute capability `needs` or the backend's oldest architecture if that is newer.
KernelDecl qlinear_declaration(const char* subject, int needs) {
  KernelDecl decl;
  decl.subject = subject;
  decl.input_names = {"x", "weight", "w_scale", "bias", "x_zero_point"};
  decl.on_device = true;
  decl.min_compute_capability = std::max(needs, XPURT_CUDA_RAW_MIN_ARCH);
  decl.built_for_architectures = XPURT_CUDA_RAW_MIN_ARCH >= needs;
  decl.dtypes = DTypeSet{{DType::kInt8, DType::kUInt8, DType::kInt32, DType::kFloat32}, {}};
  decl.layout = Layout::kContiguous;
  return decl;
}

void* align_up(void* pointer, std::size_t alignment) {
  const auto address = reinterpret_cast<std::uintptr_t>(pointer);
  return reinterpret_cast<void*>((address + alignment - 1) / alignment * alignment);
}

// The per-run epilogue operands (alpha, folded zero points) where `q` needs them: made by one prologue launch into
// the plan's workspace (`needed` bytes of it), whose start is returned; null when nothing is needed.
void* run_prologue(const QLinearProblem& q, const KernelLaunch& launch, std::size_t needed, const char* who) {
  if (!q.needs_prologue(false)) return nullptr;
  XPURT_INTERNAL_ASSERT(launch.workspace != nullptr && launch.workspace_bytes >= needed, "the ", who,
                        " qlinear plan needs ", needed, " bytes of workspace, got ", launch.workspace_bytes);
  void* scratch = align_up(launch.workspace, kScratchAlignment);
  quantized_prologue(q.prologue(launch, scratch, nullptr), q.n, launch.stream.handle);
  return scratch;
}

class Dp4aPlan final : public KernelPlan {
 public:
  explicit Dp4aPlan(QLinearProblem q) : q_(q) {}

  void run(const KernelLaunch& launch) const override {
    if (q_.m == 0 || q_.n == 0) return;
    ::xpuruntime::detail::CudaDeviceGuard guard(launch.desc->device.index);
    void* scratch = run_prologue(q_, launch, workspace_bytes(), "dp4a");
    QLinearDp4a args;
    args.x = launch.input(0).data_ptr();
    args.x_unsigned = q_.x_unsigned;
    args.weight = static_cast<const std::int8_t*>(launch.input(1).data_ptr());
    args.weight_nk = q_.weight_nk;
    args.out = launch.output(0).data_ptr();
    args.m = q_.m;
    args.n = q_.n;
    args.k = q_.k;
    args.epilogue = q_.epilogue(launch, scratch);
    qlinear_dp4a(args, launch.stream.handle);
  }

  std::size_t workspace_bytes() const override {
    return q_.needs_prologue(false) ? q_.prologue_bytes() + kScratchAlignment : 0;
  }

  std::string describe() const override {
    return ::xpuruntime::detail::str_cat("cuda_raw dp4a 64x64 tiles, m=", q_.m, " n=", q_.n, " k=", q_.k, " weight ",
                           q_.weight_nk ? "[N, K]" : "[K, N]", ", epilogue fused: ", q_.describe_epilogue());
  }

 private:
  QLinearProblem q_;
};

class Dp4aKernel final : public Kernel {
 public:
  Dp4aKernel() : Kernel(make_info()) {}

  Support accepts(const OpDescriptor& desc, const ExecutionPolicy&) const override {
    if (desc.outputs.empty()) return Support::no("the descriptor has no inferred output (call infer first)");
    const QLinearProblem q = QLinearProblem::of(desc);
    if (q.n > kMaxColumns) {
      return Support::no(::xpuruntime::detail::str_cat("dp4a qlinear takes up to ", kMaxColumns, " output channels, got ", q.n));
    }
    return Support::yes();
  }

  std::unique_ptr<KernelPlan> build(const OpDescriptor& desc, const ExecutionPolicy&,
                                    const std::string&) const override {
    return std::make_unique<Dp4aPlan>(QLinearProblem::of(desc));
  }

 private:
  static KernelInfo make_info() {
    KernelDecl decl = qlinear_declaration("dp4a qlinear", kDp4aComputeCapability);
    return KernelInfo{"qlinear", "dp4a", "cuda_raw", DeviceType::kCUDA, true,
                      "int8 GEMM by __dp4a in 64x64 tiles with the epilogue fused (any shape, alignment and weight "
                      "layout; Note [The dp4a kernel of qlinear])",
                      std::move(decl)};
  }
};

// ---- int8_mma (Note [qlinear as a 1x1 convolution]) ----

constexpr int kMmaComputeCapability = 80;  // mma.sync m16n8k32 on integers, cp.async, ldmatrix

QConvGeometry gemm_geometry(const QLinearProblem& q) {
  QConvGeometry g;
  g.batch = 1;
  g.channels = static_cast<int>(q.k);
  g.in_h = g.out_h = static_cast<int>(q.m);
  g.in_w = g.out_w = 1;
  g.out_channels = static_cast<int>(q.n);
  g.kernel_h = g.kernel_w = 1;
  g.nhwc = true;
  return g;
}

// The problem as the kernel sees it: uint8 x multiplied as stored.
QLinearProblem unsigned_view(QLinearProblem q) {
  if (q.x_unsigned) q.zero_point_correction -= 128;
  return q;
}

class MmaPlan final : public KernelPlan {
 public:
  MmaPlan(QLinearProblem q, QConvPipeline pipeline) : q_(unsigned_view(q)), g_(gemm_geometry(q)), pipeline_(pipeline) {}

  void run(const KernelLaunch& launch) const override {
    if (q_.m == 0 || q_.n == 0) return;
    ::xpuruntime::detail::CudaDeviceGuard guard(launch.desc->device.index);
    XPURT_INTERNAL_ASSERT(workspace_bytes() == 0 || (launch.workspace != nullptr &&
                                                     launch.workspace_bytes >= workspace_bytes()),
                          "the int8_mma qlinear plan needs ", workspace_bytes(), " bytes of workspace, got ",
                          launch.workspace_bytes);
    char* scratch = workspace_bytes() > 0 ? static_cast<char*>(align_up(launch.workspace, kScratchAlignment)) : nullptr;
    void* prologue_scratch = nullptr;
    if (q_.needs_prologue(false)) {
      prologue_scratch = scratch;
      quantized_prologue(q_.prologue(launch, scratch, nullptr), q_.n, launch.stream.handle);
    }
    void* split = pipeline_.splits > 1 ? scratch + prologue_bytes() : nullptr;
    qconv2d_pipelined(g_, launch.input(0).data_ptr(), q_.x_unsigned, 0,
                      static_cast<const std::int8_t*>(launch.input(1).data_ptr()), launch.output(0).data_ptr(),
                      q_.epilogue(launch, prologue_scratch), pipeline_, split, launch.stream.handle);
  }

  std::size_t workspace_bytes() const override {
    const std::size_t bytes = prologue_bytes() + qconv2d_pipeline_workspace_bytes(g_, pipeline_);
    return bytes > 0 ? bytes + kScratchAlignment : 0;
  }
  std::string record() const override {
    nlohmann::json json;
    json["tiles"] = pipeline_.small_tiles ? 64 : 128;
    json["splits"] = pipeline_.splits;
    return json.dump();
  }
  std::string describe() const override {
    return ::xpuruntime::detail::str_cat(
        "cuda_raw pipelined tensor-core int8 GEMM (cp.async, ldmatrix, mma.sync m16n8k32), ",
        pipeline_.small_tiles ? "64x64" : "128x128", " tiles", pipeline_.splits > 1 ?
        ::xpuruntime::detail::str_cat(", reduction split in ", pipeline_.splits) : std::string(), ", m=", q_.m,
        " n=", q_.n, " k=", q_.k, ", epilogue fused: ", q_.describe_epilogue());
  }

 private:
  std::size_t prologue_bytes() const { return q_.needs_prologue(false) ? q_.prologue_bytes() : 0; }

  QLinearProblem q_;
  QConvGeometry g_;
  QConvPipeline pipeline_;
};

// The multiprocessors of the descriptor's device, or an H100's 132 where it is absent (plans are built from the
// descriptor alone).
int sm_count(const OpDescriptor& desc) {
  constexpr int kUnknownDevice = 132;
  DeviceManager& devices = DeviceManager::instance();
  if (desc.device.index < 0 || desc.device.index >= devices.get_device_count()) return kUnknownDevice;
  return devices.get_device_info(desc.device).sm_count;
}

// {"tiles": 64|128, "splits": 1..32}; InvalidArgumentError otherwise.
QConvPipeline pipeline_from_record(const QConvGeometry& g, const std::string& record) {
  const nlohmann::json json = nlohmann::json::parse(record, nullptr, /*allow_exceptions=*/false);
  const auto integer = [&](const char* key, std::int64_t lo, std::int64_t hi) {
    if (!json.is_object() || !json.contains(key) || !json[key].is_number_integer() ||
        json[key].get<std::int64_t>() < lo || json[key].get<std::int64_t>() > hi) {
      throw InvalidArgumentError(::xpuruntime::detail::str_cat(
          "int8_mma qlinear: invalid plan record ('", key, "' must be an integer ", lo, "..", hi, "): ", record));
    }
    return static_cast<int>(json[key].get<std::int64_t>());
  };
  const int tiles = integer("tiles", 64, 128);
  if (tiles != 64 && tiles != 128) {
    throw InvalidArgumentError("int8_mma qlinear: invalid plan record ('tiles' must be 64 or 128): " + record);
  }
  return qconv2d_pipeline(g, tiles == 64, 1, integer("splits", 1, 32));
}

class MmaKernel final : public Kernel {
 public:
  MmaKernel() : Kernel(make_info()) {}

  Support accepts(const OpDescriptor& desc, const ExecutionPolicy&) const override {
    if (desc.outputs.empty()) return Support::no("the descriptor has no inferred output (call infer first)");
    const QLinearProblem q = QLinearProblem::of(desc);
    if (!q.weight_nk) return Support::no("int8_mma qlinear takes weight_layout=nk ([N, K])");
    if (q.k <= 0 || q.k % 16 != 0) {
      return Support::no(::xpuruntime::detail::str_cat("int8_mma qlinear takes K a multiple of 16, got ", q.k));
    }
    constexpr std::int64_t kMax = 1 << 30;
    if (q.m > kMax || q.n > kMax || q.k > kMax || !qconv2d_fits_int32(gemm_geometry(q))) {
      return Support::no("int8_mma qlinear indexes in 32 bits: the GEMM is too large");
    }
    return Support::yes();
  }

  std::unique_ptr<KernelPlan> build(const OpDescriptor& desc, const ExecutionPolicy&,
                                    const std::string& record) const override {
    const QLinearProblem q = QLinearProblem::of(desc);
    const QConvGeometry g = gemm_geometry(q);
    return std::make_unique<MmaPlan>(q, record.empty() ? qconv2d_pipeline(g, false, sm_count(desc))
                                                       : pipeline_from_record(g, record));
  }

  // The other tile size, and the default tiles unsplit where the default splits, for autotuning.
  std::vector<std::string> tactics(const OpDescriptor& desc, const ExecutionPolicy& policy) const override {
    if (!supports(desc, policy)) return {};
    const QConvGeometry g = gemm_geometry(QLinearProblem::of(desc));
    const QConvPipeline chosen = qconv2d_pipeline(g, false, sm_count(desc));
    std::vector<std::string> out;
    const auto record = [](int tiles, int splits) {
      nlohmann::json json;
      json["tiles"] = tiles;
      json["splits"] = splits;
      return json.dump();
    };
    if (chosen.splits > 1) out.push_back(record(chosen.small_tiles ? 64 : 128, 1));
    if (!chosen.small_tiles) out.push_back(record(64, qconv2d_pipeline(g, true, sm_count(desc)).splits));
    return out;
  }

 private:
  static KernelInfo make_info() {
    KernelDecl decl = qlinear_declaration("int8_mma qlinear", kMmaComputeCapability);
    decl.alignment = 16;  // 16-byte cp.async copies of x and the weight
    return KernelInfo{"qlinear", "int8_mma", "cuda_raw", DeviceType::kCUDA, true,
                      "int8 GEMM on tensor cores: the pipelined int8 convolution as a 1x1 convolution (cp.async, "
                      "ldmatrix, mma.sync m16n8k32), split-K where the tiles do not fill the GPU, the requantizing "
                      "epilogue fused (weight [N, K], K a multiple of 16; Note [qlinear as a 1x1 convolution])",
                      std::move(decl)};
  }
};

// ---- int8_wgmma (Note [int8 GEMM by wgmma] in qlinear_wgmma.cu) ----

constexpr int kWgmmaComputeCapability = 90;  // wgmma.mma_async: sm_90a, compute capability 9.0 only
// From this many rows of x the kernel ranks before cuBLASLt's IMMA GEMM on sm_90 (Note [Shape-dependent priority]).
constexpr std::int64_t kWgmmaRanksFirstRows = 256;

// A tile shape of int8_wgmma: warpgroups of 128 threads that multiply, each taking row_tiles strips of 64 rows; `tma`:
// beside them a producer warpgroup copying by TMA (Note [int8 GEMM by wgmma, fed by TMA]), else they copy by cp.async
// themselves.
struct WgmmaShape {
  int warpgroups;
  int row_tiles;
  bool tma = false;
  int rows() const { return 64 * warpgroups * row_tiles; }
  bool operator==(const WgmmaShape& o) const {
    return warpgroups == o.warpgroups && row_tiles == o.row_tiles && tma == o.tma;
  }
};
constexpr WgmmaShape kWgmmaShapes[] = {{2, 2, true}, {2, 1, true}, {2, 2}, {2, 1}, {1, 2}, {1, 1}};

// The tallest of 256-, 128- and 64-row tiles (2 warpgroups of 2 and 1 strips fed by TMA, 1 of 1) whose blocks cover
// the SMs; the taller tile reads fewer bytes a multiply-add from L2.
WgmmaShape wgmma_shape(const QLinearProblem& q, int sms) {
  const std::int64_t columns = (q.n + 127) / 128;
  for (const WgmmaShape shape : {WgmmaShape{2, 2, true}, WgmmaShape{2, 1, true}}) {
    if ((q.m + shape.rows() - 1) / shape.rows() * columns >= sms) return shape;
  }
  return {1, 1};
}

std::string wgmma_record(const WgmmaShape& shape) {
  nlohmann::json json;
  json["warpgroups"] = shape.warpgroups;
  json["row_tiles"] = shape.row_tiles;
  if (shape.tma) json["pipeline"] = "tma";
  return json.dump();
}

// A plan record's shape: {"warpgroups": 1 or 2, "row_tiles": 1 or 2 (default 1), "pipeline": "tma" or "cp.async"
// (default)}; the TMA pipeline's one warpgroup takes one strip (64-row tiles, two blocks an SM: only a record names
// it, no tactic yet: Note [int8 GEMM by wgmma, fed by TMA]).
WgmmaShape parse_wgmma_record(const std::string& record) {
  const nlohmann::json json = nlohmann::json::parse(record, nullptr, /*allow_exceptions=*/false);
  const auto field = [&](const char* key, int fallback) {
    if (!json.is_object() || (json.contains(key) && (!json[key].is_number_integer() ||
                                                     (json[key] != 1 && json[key] != 2)))) {
      throw InvalidArgumentError(::xpuruntime::detail::str_cat("int8_wgmma qlinear: invalid plan record ('", key,
                                                               "' must be 1 or 2): ", record));
    }
    return json.contains(key) ? json[key].get<int>() : fallback;
  };
  if (!json.is_object() || !json.contains("warpgroups")) {
    throw InvalidArgumentError("int8_wgmma qlinear: invalid plan record ('warpgroups' must be 1 or 2): " + record);
  }
  WgmmaShape shape{field("warpgroups", 2), field("row_tiles", 1)};
  if (json.contains("pipeline")) {
    const nlohmann::json& pipeline = json["pipeline"];
    if (!pipeline.is_string() || (pipeline != "tma" && pipeline != "cp.async")) {
      throw InvalidArgumentError("int8_wgmma qlinear: invalid plan record ('pipeline' must be \"tma\" or "
                                 "\"cp.async\"): " + record);
    }
    shape.tma = pipeline == "tma";
  }
  if (shape.tma && shape.warpgroups == 1 && shape.row_tiles != 1) {
    throw InvalidArgumentError("int8_wgmma qlinear: invalid plan record (the \"tma\" pipeline's one warpgroup takes "
                               "one strip): " + record);
  }
  return shape;
}

class WgmmaPlan final : public KernelPlan {
 public:
  WgmmaPlan(QLinearProblem q, WgmmaShape shape) : q_(unsigned_view(q)), shape_(shape) {}

  void run(const KernelLaunch& launch) const override {
    if (q_.m == 0 || q_.n == 0) return;
    ::xpuruntime::detail::CudaDeviceGuard guard(launch.desc->device.index);
    void* scratch = run_prologue(q_, launch, workspace_bytes(), "int8_wgmma");
    QLinearWgmmaArgs args;
    args.x = launch.input(0).data_ptr();
    args.x_unsigned = q_.x_unsigned;
    args.weight = static_cast<const std::int8_t*>(launch.input(1).data_ptr());
    args.out = launch.output(0).data_ptr();
    args.m = q_.m;
    args.n = q_.n;
    args.k = q_.k;
    args.epilogue = q_.epilogue(launch, scratch);
    args.warpgroups = shape_.warpgroups;
    args.row_tiles = shape_.row_tiles;
    args.tma = shape_.tma;
    qlinear_wgmma(args, launch.stream.handle);
  }

  std::size_t workspace_bytes() const override {
    return q_.needs_prologue(false) ? q_.prologue_bytes() + kScratchAlignment : 0;
  }
  std::string record() const override { return wgmma_record(shape_); }
  std::string describe() const override {
    const int stages = qlinear_wgmma_stages(shape_.warpgroups, shape_.row_tiles, shape_.tma);
    return ::xpuruntime::detail::str_cat(
        "cuda_raw int8 GEMM on Hopper's warpgroup tensor cores (wgmma.mma_async m64n128k32, ",
        shape_.tma ? "a producer warpgroup's TMA copies with mbarriers" : "cp.async", " into 128-byte swizzled shared "
        "memory, ", stages, " stages), ", shape_.rows(), "x128 tiles (", shape_.warpgroups, " warpgroups of ",
        shape_.row_tiles, " strips), m=", q_.m, " n=", q_.n, " k=", q_.k, ", epilogue fused: ", q_.describe_epilogue());
  }

 private:
  QLinearProblem q_;
  WgmmaShape shape_;
};

class WgmmaKernel final : public Kernel {
 public:
  WgmmaKernel() : Kernel(make_info()) {}

  Support accepts(const OpDescriptor& desc, const ExecutionPolicy&) const override {
    if (!XPURT_CUDA_RAW_SM90A) return Support::no("int8_wgmma was not built (it needs nvcc 12 or newer for sm_90a)");
    if (desc.compute_capability > kWgmmaComputeCapability) {
      return Support::no(::xpuruntime::detail::str_cat(
          "int8_wgmma runs on compute capability 9.0 only (sm_90a instructions), this device has ",
          desc.compute_capability / 10, ".", desc.compute_capability % 10));
    }
    if (desc.outputs.empty()) return Support::no("the descriptor has no inferred output (call infer first)");
    const QLinearProblem q = QLinearProblem::of(desc);
    if (!q.weight_nk) return Support::no("int8_wgmma qlinear takes weight_layout=nk ([N, K])");
    if (q.k <= 0 || q.k % 16 != 0) {
      return Support::no(::xpuruntime::detail::str_cat("int8_wgmma qlinear takes K a multiple of 16, got ", q.k));
    }
    if (!qlinear_wgmma_sizes_fit(std::max<std::int64_t>(q.m, 1), std::max<std::int64_t>(q.n, 1), q.k)) {
      return Support::no("int8_wgmma qlinear takes M and K below 2^30 and N up to 65535 x 128");
    }
    return Support::yes();
  }

  std::string ranks_first(const OpDescriptor& desc) const override {
    if (desc.compute_capability != kWgmmaComputeCapability) return {};
    const QLinearProblem q = QLinearProblem::of(desc);
    if (q.m < kWgmmaRanksFirstRows) return {};
    return ::xpuruntime::detail::str_cat("int8_wgmma ranks first on sm_90 from ", kWgmmaRanksFirstRows,
                                         " rows (m = ", q.m, ")");
  }

  // Where it ranks first it is timed against cuBLASLt's GEMM and the others (Note [Timed first choices]): which is
  // faster depends on the shape (docs/benchmarks.md, 2026-12-07).
  std::string timed_against_others(const OpDescriptor& desc) const override {
    return ranks_first(desc).empty() ? std::string()
                                     : std::string("int8_wgmma against cuBLASLt's IMMA GEMM: the faster depends on "
                                                   "the shape");
  }

  std::unique_ptr<KernelPlan> build(const OpDescriptor& desc, const ExecutionPolicy&,
                                    const std::string& record) const override {
    const QLinearProblem q = QLinearProblem::of(desc);
    WgmmaShape shape = wgmma_shape(q, sm_count(desc));
    if (!record.empty()) shape = parse_wgmma_record(record);
    return std::make_unique<WgmmaPlan>(q, shape);
  }

  // The other tile shapes, for autotuning.
  std::vector<std::string> tactics(const OpDescriptor& desc, const ExecutionPolicy& policy) const override {
    if (!supports(desc, policy)) return {};
    const WgmmaShape chosen = wgmma_shape(QLinearProblem::of(desc), sm_count(desc));
    std::vector<std::string> out;
    for (const WgmmaShape& shape : kWgmmaShapes) {
      if (!(shape == chosen)) out.push_back(wgmma_record(shape));
    }
    return out;
  }

 private:
  static KernelInfo make_info() {
    // Built for sm_90a by a library of its own whatever the backend's oldest architecture (qlinear_wgmma.h): below
    // 9.0 it is the hardware that lacks the instructions.
    KernelDecl decl = qlinear_declaration("int8_wgmma qlinear", kWgmmaComputeCapability);
    decl.min_compute_capability = kWgmmaComputeCapability;
    decl.built_for_architectures = false;
    decl.alignment = 16;  // 16-byte cp.async copies of x and the weight
    return KernelInfo{"qlinear", "int8_wgmma", "cuda_raw", DeviceType::kCUDA, true,
                      "int8 GEMM on Hopper's warpgroup tensor cores (wgmma.mma_async, sm_90a), the requantizing "
                      "epilogue fused (weight [N, K], K a multiple of 16; Note [int8 GEMM by wgmma])",
                      std::move(decl)};
  }
};

}  // namespace

void register_qlinear(KernelRegistry& registry) {
  registry.add_kernel(std::make_unique<WgmmaKernel>());
  registry.add_kernel(std::make_unique<MmaKernel>());
  registry.add_kernel(std::make_unique<Dp4aKernel>());
}

}  // namespace xpuruntime::cuda_raw
