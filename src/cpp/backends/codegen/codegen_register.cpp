// The codegen backend: kernels generated while a plan is built. Its one kernel, "generated", runs the op
// fused_elementwise (Note [Fused elementwise programs] in core/fused_elementwise.h) from the CUDA C that
// fused::cuda_source writes for the launch's program, shapes and dtype.
//
// Note [Generated kernels]
// build() names the kernel after a hash of what its source depends on, writes the source, and compiles it with NVRTC
// for the device's architecture into a cubin, loaded through the driver API (cuModuleLoadData; entry points from the
// CUDA runtime, so the library never links libcuda). Compiled kernels are cached in the process (by source, device and
// architecture) and on disk: $XPURT_CODEGEN_CACHE, else $XDG_CACHE_HOME/xpuruntime/codegen, else
// ~/.cache/xpuruntime/codegen, one <key>.cubin and its <key>.cu per kernel, the key a hash of the source, the
// architecture and NVRTC's version; a second process that builds the same plan loads the cubin instead of compiling
// (a cache that cannot be written is skipped, never an error). A generated kernel is a kernel like the others: the
// decision names it ("generated", backend "codegen"), describe() gives the kernel's name, the source hash and the
// program, and record() the source hash, so a lock file replays exactly this code: build() with a record whose hash
// is not what this version generates refuses (UnsupportedOperationError) instead of running other code.
// NVRTC is opened with dlopen (libnvrtc.so.13, or $XPURT_NVRTC_LIBRARY): without it, supports() says what to
// install and the elementwise_fusion pass leaves CUDA plans unfused.
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <dlfcn.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <unistd.h>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/cache_dir.h"
#include "core/cuda_utils.h"
#include "core/fused_elementwise.h"
#include "core/shape_str.h"
#include "xpuruntime/device_manager.h"
#include "xpuruntime/exceptions.h"
#include "xpuruntime/execution_policy.h"
#include "xpuruntime/kernel_registry.h"

namespace xpuruntime {

namespace {

// ---- NVRTC (dlopen; declared here so that the build needs no nvrtc.h) ----

using nvrtcResult = int;
constexpr nvrtcResult NVRTC_SUCCESS = 0;
using nvrtcProgram = struct NvrtcProgramOpaque*;

struct Nvrtc {
  void* library = nullptr;
  std::string error;  // why it cannot be used; empty when it can
  int major = 0, minor = 0;
  nvrtcResult (*Version)(int*, int*) = nullptr;
  nvrtcResult (*CreateProgram)(nvrtcProgram*, const char*, const char*, int, const char* const*,
                               const char* const*) = nullptr;
  nvrtcResult (*CompileProgram)(nvrtcProgram, int, const char* const*) = nullptr;
  nvrtcResult (*GetCUBINSize)(nvrtcProgram, std::size_t*) = nullptr;
  nvrtcResult (*GetCUBIN)(nvrtcProgram, char*) = nullptr;
  nvrtcResult (*GetProgramLogSize)(nvrtcProgram, std::size_t*) = nullptr;
  nvrtcResult (*GetProgramLog)(nvrtcProgram, char*) = nullptr;
  nvrtcResult (*DestroyProgram)(nvrtcProgram*) = nullptr;
  const char* (*GetErrorString)(nvrtcResult) = nullptr;
};

const Nvrtc& nvrtc() {
  static Nvrtc a;
  static std::once_flag once;
  std::call_once(once, [] {
    const char* override_path = std::getenv("XPURT_NVRTC_LIBRARY");
    std::vector<std::string> paths;
    if (override_path != nullptr && *override_path != '\0') {
      paths.push_back(override_path);
    } else {
      paths = {"libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"};
    }
    std::string tried;
    for (const std::string& path : paths) {
      a.library = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
      if (a.library != nullptr) break;
      const char* why = dlerror();
      tried += detail::str_cat(tried.empty() ? "" : "; ", path, ": ", why ? why : "not found");
    }
    if (a.library == nullptr) {
      a.error = detail::str_cat("NVRTC, CUDA's runtime compiler, could not be loaded (", tried,
                                "): the generated kernels need it. Install it (the CUDA toolkit's libnvrtc.so.13, "
                                "Debian/Ubuntu cuda-nvrtc-13-0, pip nvidia-cuda-nvrtc) or point "
                                "XPURT_NVRTC_LIBRARY at libnvrtc.so");
      return;
    }
    bool missing = false;
    auto load = [&](auto& fn, const char* name) {
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(a.library, name));
      missing = missing || fn == nullptr;
    };
    load(a.Version, "nvrtcVersion");
    load(a.CreateProgram, "nvrtcCreateProgram");
    load(a.CompileProgram, "nvrtcCompileProgram");
    load(a.GetCUBINSize, "nvrtcGetCUBINSize");
    load(a.GetCUBIN, "nvrtcGetCUBIN");
    load(a.GetProgramLogSize, "nvrtcGetProgramLogSize");
    load(a.GetProgramLog, "nvrtcGetProgramLog");
    load(a.DestroyProgram, "nvrtcDestroyProgram");
    load(a.GetErrorString, "nvrtcGetErrorString");
    if (missing) {
      a.error = "the NVRTC library found lacks functions the generated kernels use (nvrtcGetCUBIN needs CUDA 11.1+)";
      return;
    }
    a.Version(&a.major, &a.minor);
  });
  return a;
}

// ---- the driver API, through the CUDA runtime's entry points (no link against libcuda) ----

struct Driver {
  std::string error;
  CUresult (*ModuleLoadData)(CUmodule*, const void*) = nullptr;
  CUresult (*ModuleGetFunction)(CUfunction*, CUmodule, const char*) = nullptr;
  CUresult (*LaunchKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                           CUstream, void**, void**) = nullptr;
  CUresult (*GetErrorString)(CUresult, const char**) = nullptr;
};

const Driver& driver() {
  static Driver d;
  static std::once_flag once;
  std::call_once(once, [] {
    auto load = [&](auto& fn, const char* name) {
      void* p = nullptr;
      cudaDriverEntryPointQueryResult status{};
      if (cudaGetDriverEntryPointByVersion(name, &p, 12000, cudaEnableDefault, &status) != cudaSuccess ||
          status != cudaDriverEntryPointSuccess || p == nullptr) {
        (void)cudaGetLastError();
        if (d.error.empty()) d.error = detail::str_cat("the CUDA driver does not provide ", name);
        return;
      }
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(p);
    };
    load(d.ModuleLoadData, "cuModuleLoadData");
    load(d.ModuleGetFunction, "cuModuleGetFunction");
    load(d.LaunchKernel, "cuLaunchKernel");
    load(d.GetErrorString, "cuGetErrorString");
  });
  return d;
}

void check_driver(CUresult status, const char* call) {
  if (status == CUDA_SUCCESS) return;
  const char* text = nullptr;
  if (driver().GetErrorString != nullptr) driver().GetErrorString(status, &text);
  throw CudaError(detail::str_cat(call, " failed: ", text ? text : "unknown error", " (CUresult ",
                                  static_cast<int>(status), ")"),
                  static_cast<int>(status));
}

// ---- compiling, with the process and disk caches ----

struct Compiled {
  CUfunction function = nullptr;
  std::string how;  // "compiled in 41 ms" / "from the disk cache" / "cached in this process"
};

std::string compile_to_cubin(const std::string& source, const std::string& name, int arch) {
  const Nvrtc& n = nvrtc();
  nvrtcProgram program = nullptr;
  auto check = [&](nvrtcResult r, const char* call) {
    if (r == NVRTC_SUCCESS) return;
    std::string log;
    std::size_t size = 0;
    if (program != nullptr && n.GetProgramLogSize(program, &size) == NVRTC_SUCCESS && size > 1) {
      log.resize(size);
      n.GetProgramLog(program, log.data());
    }
    if (program != nullptr) n.DestroyProgram(&program);
    throw UnsupportedOperationError(detail::str_cat("generated kernel ", name, ": ", call, " failed (",
                                                    n.GetErrorString(r), ")", log.empty() ? "" : ": " + log));
  };
  check(n.CreateProgram(&program, source.c_str(), (name + ".cu").c_str(), 0, nullptr, nullptr), "nvrtcCreateProgram");
  const std::string arch_option = detail::str_cat("--gpu-architecture=sm_", arch);
  const char* options[] = {arch_option.c_str(), "--std=c++17", "-default-device"};
  check(n.CompileProgram(program, 3, options), "nvrtcCompileProgram");
  std::size_t size = 0;
  check(n.GetCUBINSize(program, &size), "nvrtcGetCUBINSize");
  std::string cubin(size, '\0');
  check(n.GetCUBIN(program, cubin.data()), "nvrtcGetCUBIN");
  n.DestroyProgram(&program);
  return cubin;
}

Compiled compiled(const std::string& source, const std::string& name, int device, int arch) {
  static std::mutex mutex;
  static std::map<std::string, CUfunction> loaded;  // modules stay loaded for the process
  const Nvrtc& n = nvrtc();
  const std::string key =
      fused::hash_hex(detail::str_cat(source, "\nsm_", arch, "\nnvrtc ", n.major, ".", n.minor));
  std::lock_guard<std::mutex> lock(mutex);
  const std::string process_key = detail::str_cat(key, "@", device);
  if (auto it = loaded.find(process_key); it != loaded.end()) return {it->second, "cached in this process"};
  const std::filesystem::path dir = detail::build_cache_dir();
  std::string cubin;
  std::string how;
  if (!dir.empty()) {
    std::ifstream in(dir / (key + ".cubin"), std::ios::binary);
    if (in) {
      std::ostringstream bytes;
      bytes << in.rdbuf();
      cubin = bytes.str();
      how = "from the disk cache " + (dir / (key + ".cubin")).string();
    }
  }
  if (cubin.empty()) {
    const auto start = std::chrono::steady_clock::now();
    cubin = compile_to_cubin(source, name, arch);
    const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start);
    how = detail::str_cat("compiled by NVRTC ", n.major, ".", n.minor, " in ", ms.count(), " ms");
    if (!dir.empty()) {
      std::error_code ec;
      std::filesystem::create_directories(dir, ec);
      const std::filesystem::path tmp = dir / (key + ".cubin.tmp" + std::to_string(::getpid()));
      std::ofstream out(tmp, std::ios::binary);
      if (out && out.write(cubin.data(), static_cast<std::streamsize>(cubin.size()))) {
        out.close();
        std::filesystem::rename(tmp, dir / (key + ".cubin"), ec);  // atomic: readers see all of it or nothing
        std::ofstream(dir / (key + ".cu")) << source;
      } else {
        std::filesystem::remove(tmp, ec);
      }
    }
  }
  detail::CudaDeviceGuard guard(device);
  XPURT_CUDA_CHECK(cudaFree(nullptr));  // the primary context exists and is current
  const Driver& d = driver();
  CUmodule module = nullptr;
  check_driver(d.ModuleLoadData(&module, cubin.data()), "cuModuleLoadData");
  CUfunction function = nullptr;
  check_driver(d.ModuleGetFunction(&function, module, name.c_str()), "cuModuleGetFunction");
  loaded[process_key] = function;
  return {function, how};
}

// ---- the kernel ----

class GeneratedPlan final : public KernelPlan {
 public:
  GeneratedPlan(CUfunction function, std::string name, std::string source_hash, std::string program,
                std::string how, std::int64_t numel, unsigned blocks, unsigned threads,
                std::vector<std::int64_t> offset_bytes)
      : function_(function),
        name_(std::move(name)),
        source_hash_(std::move(source_hash)),
        program_(std::move(program)),
        how_(std::move(how)),
        numel_(numel),
        blocks_(blocks),
        threads_(threads),
        offset_bytes_(std::move(offset_bytes)) {}

  void run(const KernelLaunch& launch) const override {
    if (numel_ == 0) return;
    std::vector<void*> pointers(launch.num_inputs + 1);
    std::vector<void*> args(launch.num_inputs + 1);
    for (std::size_t k = 0; k < launch.num_inputs; ++k) {  // a view's offset (Note [Inputs read through a view])
      pointers[k] = static_cast<char*>(launch.input(k).data_ptr()) + (k < offset_bytes_.size() ? offset_bytes_[k] : 0);
    }
    pointers[launch.num_inputs] = launch.output(0).data_ptr();
    for (std::size_t k = 0; k < pointers.size(); ++k) args[k] = &pointers[k];
    check_driver(driver().LaunchKernel(function_, blocks_, 1, 1, threads_, 1, 1, 0,
                                       reinterpret_cast<CUstream>(launch.stream.handle), args.data(), nullptr),
                 "cuLaunchKernel (generated kernel)");
  }
  std::string record() const override { return nlohmann::json{{"source_hash", source_hash_}}.dump(); }
  std::string describe() const override {
    return detail::str_cat("generated ", name_, ", source ", source_hash_, ", ", how_, ": ", program_);
  }

 private:
  CUfunction function_;
  std::string name_, source_hash_, program_, how_;
  std::int64_t numel_;
  unsigned blocks_, threads_;
  std::vector<std::int64_t> offset_bytes_;  // per input: where its view starts
};

// What the generated kernel declares (Note [Kernel declarations] in core/kernel_registry.cpp): contiguous inputs.
// The op's device is asked by accepts() (the inputs' devices are not), bfloat16 against the device's architecture.
KernelDecl declaration() {
  KernelDecl decl;
  decl.layout = Layout::kContiguous;
  return decl;
}

class GeneratedKernel final : public Kernel {
 public:
  GeneratedKernel()
      : Kernel(KernelInfo{"fused_elementwise", "generated", "codegen", DeviceType::kCUDA, true,
                          "CUDA C written for the program, shapes and dtype (Note [Fused elementwise programs]), "
                          "compiled by NVRTC while the plan is built, cached in the process and on disk",
                          declaration()}) {}

  Support accepts(const OpDescriptor& desc, const ExecutionPolicy& policy) const override {
    (void)policy;
    if (!desc.device.is_cuda()) {
      return Support::no(detail::str_cat("runs on CUDA devices; the input is on ", desc.device.str()));
    }
    if (!nvrtc().error.empty()) return Support::no(nvrtc().error);
    if (!driver().error.empty()) return Support::no(driver().error);
    bool bfloat16 = !desc.outputs.empty() && desc.outputs[0].dtype == DType::kBFloat16;
    for (const TensorDesc& x : desc.inputs) bfloat16 = bfloat16 || x.dtype == DType::kBFloat16;
    if (bfloat16 && arch(desc.device) < 80) {
      return Support::no("bfloat16 conversions need compute capability 8.0 or newer");
    }
    return Support::yes();
  }

  std::unique_ptr<KernelPlan> build(const OpDescriptor& desc, const ExecutionPolicy& policy,
                                    const std::string& record) const override {
    Support support = supports(desc, policy);
    if (!support) throw UnsupportedOperationError(support.reason());
    std::vector<std::vector<std::int64_t>> stored;
    std::vector<DType> dtypes;
    for (const TensorDesc& x : desc.inputs) {
      stored.push_back(x.shape);
      dtypes.push_back(x.dtype);
    }
    // Note [Inputs read through a view]: the source reads the view's strides; run() adds its offset to the pointer.
    const fused::InputViews views = fused::input_views(desc.attrs, stored);
    std::vector<std::int64_t> offset_bytes(desc.inputs.size(), 0);
    for (std::size_t k = 0; k < views.size(); ++k) {
      if (views[k]) offset_bytes[k] = views[k]->offset * static_cast<std::int64_t>(dtype_size(dtypes[k]));
    }
    const Source s = source(desc, stored, views, dtypes);
    const std::string& name = s.name;
    const std::string source_hash = fused::hash_hex(s.text);
    if (!record.empty()) {
      std::string recorded;
      try {
        recorded = nlohmann::json::parse(record).at("source_hash").get<std::string>();
      } catch (const std::exception& e) {
        throw UnsupportedOperationError(
            detail::str_cat("generated kernel: the record '", record, "' has no source_hash (", e.what(), ")"));
      }
      if (recorded != source_hash) {
        throw UnsupportedOperationError(detail::str_cat(
            "generated kernel: the record asks for source ", recorded, " but this version of xpuruntime generates ",
            source_hash, " for this op (", s.program, "); re-tune or regenerate the lock file"));
      }
    }
    const int device = desc.device.index;
    const Compiled c = compiled(s.text, name, device, arch(desc.device));
    int sms = 0;
    XPURT_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
    const fused::LaunchShape& shape = s.shape;
    const std::int64_t steps = s.numel / shape.vec;  // vector steps (vec divides numel)
    const std::int64_t wanted = shape.row_threads ? (s.rows + shape.rows_per_block - 1) / shape.rows_per_block
                                                  : (steps + shape.threads - 1) / shape.threads;
    const std::int64_t resident = sms * std::max<std::int64_t>(1, 4096 / shape.threads);
    const auto blocks = static_cast<unsigned>(std::max<std::int64_t>(1, std::min<std::int64_t>(wanted, resident)));
    return std::make_unique<GeneratedPlan>(c.function, name, source_hash, s.program, c.how, s.numel, blocks,
                                           static_cast<unsigned>(shape.threads), std::move(offset_bytes));
  }

 private:
  // A kernel's source, its name (a hash of everything the source depends on, so that it is written once) and how it
  // is launched.
  struct Source {
    std::string name, text, program;
    fused::LaunchShape shape;
    std::int64_t numel = 0, rows = 0;
  };

  static Source source(const OpDescriptor& desc, const std::vector<std::vector<std::int64_t>>& stored,
                       const fused::InputViews& views, const std::vector<DType>& dtypes) {
    const TensorDesc& output = desc.outputs.at(0);
    const std::vector<std::vector<std::int64_t>> shapes = fused::read_shapes(views, stored);
    Source s;
    std::string what;
    auto strides = [&](const fused::Layout& layout, const std::vector<DType>& of) {
      for (std::size_t k = 0; k < of.size(); ++k) {
        what += detail::str_cat("|", dtype_name(of[k]), ":", detail::shape_str(layout.strides[k], ","));
      }
    };
    const fused::Pieces pieces = fused::pieces(desc.attrs, desc.inputs.size());
    if (!pieces.empty()) {  // Note [Pieces of a concatenation]
      const std::vector<fused::Layout> layouts = fused::piece_layouts(pieces, shapes, views, output.shape);
      s.program = pieces.text();
      what = detail::str_cat(s.program, "|", dtype_name(output.dtype), "|", detail::shape_str(output.shape, ","), "|",
                             pieces.axis);
      for (std::size_t p = 0; p < layouts.size(); ++p) {
        what += detail::str_cat("|", detail::shape_str(layouts[p].dims, ","));
        strides(layouts[p], fused::piece_dtypes(pieces.pieces[p], dtypes));
      }
      s.name = "xrt_fused_" + fused::hash_hex(what);
      s.text = fused::cuda_source(pieces, layouts, dtypes, output.dtype, output.shape, s.name);
      s.shape.vec = fused::pieces_vector_width(pieces, layouts, dtypes, output.dtype, output.shape);
      for (const fused::Layout& layout : layouts) s.numel += layout.numel;
      return s;
    }
    const fused::Program program = fused::parse(desc.attrs.get_string("program", ""), desc.inputs.size());
    const fused::Layout layout = fused::layout(shapes, output.shape, desc.attrs.get_int("row_axes", 0), views);
    s.program = program.text();
    what = detail::str_cat(s.program, "|", dtype_name(output.dtype), "|", layout.numel, "|", layout.row, "|",
                           detail::shape_str(layout.dims, ","));
    strides(layout, dtypes);
    fused::OutputQuantization quantization;
    if (fused::quantized_output(output.dtype)) {
      quantization = fused::output_quantization(desc.attrs, output.dtype);
      std::uint32_t scale_bits = 0;
      std::memcpy(&scale_bits, &quantization.scale, sizeof(scale_bits));
      what += detail::str_cat("|q:", scale_bits, ":", quantization.zero_point);
    }
    s.name = "xrt_fused_" + fused::hash_hex(what);
    s.text = fused::cuda_source(program, layout, dtypes, output.dtype, s.name, quantization);
    s.shape = fused::launch_shape(program, layout, dtypes, output.dtype);
    s.numel = layout.numel;
    s.rows = layout.rows();
    return s;
  }

  static int arch(Device device) {
    int major = 0, minor = 0;
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device.index) != cudaSuccess ||
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device.index) != cudaSuccess) {
      (void)cudaGetLastError();
      return 0;
    }
    return major * 10 + minor;
  }
};

}  // namespace

namespace fused {

std::string compile_cubin(const std::string& source, const std::string& name, int arch) {
  if (!nvrtc().error.empty()) throw UnsupportedOperationError(nvrtc().error);
  return xpuruntime::compile_to_cubin(source, name, arch);
}

}  // namespace fused

void register_codegen(KernelRegistry& registry) { registry.add_kernel(std::make_unique<GeneratedKernel>()); }

}  // namespace xpuruntime
