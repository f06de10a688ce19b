// cuDNN's own quantized convolutions against its float16 one (issue 41): ResNet-50's convolutions, NHWC, each as a
// cuDNN graph (the backend API, as backends/cudnn/cudnn_attention.cpp builds its graphs) with the epilogue a quantized
// model needs: convolution -> times a per-channel scale -> plus a per-channel bias -> ReLU, in
//   fp16        float16 x and w, float accumulation (no scale: the float16 model's convolution)
//   int8->half  int8 x and w, int32 accumulation, float16 output
//   int8->int8  the same, int8 output
//   fp8->half   float8 e4m3 x and w, float accumulation, float16 output
// timed over the first `plans` execution plans cuDNN's heuristic (mode A) ranks, the fastest kept (microseconds per
// convolution, back-to-back launches, CUDA events). Before the table, the int8 graph is checked against a CPU
// reference on one small shape. Prints one markdown table per batch and the sums over the 52 convolutions after the
// stem, weighted by their count in ResNet-50. Needs a GPU; run from the build folder:
//
//   benchmarks/bench_cudnn_qconv [plans=4] [batches=16,64,1]
//
// docs/benchmarks.md ("cuDNN's own int8 and fp8 convolutions, measured") has its figures on an H200.
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <cudnn.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

void check_cudnn(cudnnStatus_t status, const char* call) {
  if (status == CUDNN_STATUS_SUCCESS) return;
  char detail[1024] = {0};
  cudnnGetLastErrorString(detail, sizeof(detail));
  throw std::runtime_error(std::string(call) + ": " + cudnnGetErrorString(status) + " " + detail);
}

void check_cuda(cudaError_t status, const char* call) {
  if (status != cudaSuccess) throw std::runtime_error(std::string(call) + ": " + cudaGetErrorString(status));
}

// One backend descriptor, destroyed with its owner.
class Descriptor {
 public:
  explicit Descriptor(cudnnBackendDescriptorType_t type) {
    check_cudnn(cudnnBackendCreateDescriptor(type, &raw_), "cudnnBackendCreateDescriptor");
  }
  ~Descriptor() {
    if (raw_ != nullptr) cudnnBackendDestroyDescriptor(raw_);
  }
  Descriptor(const Descriptor&) = delete;
  Descriptor& operator=(const Descriptor&) = delete;
  cudnnBackendDescriptor_t get() const { return raw_; }
  void set(cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type, std::int64_t count, const void* v) {
    check_cudnn(cudnnBackendSetAttribute(raw_, name, type, count, v), "cudnnBackendSetAttribute");
  }
  void set(cudnnBackendAttributeName_t name, const Descriptor& d) {
    cudnnBackendDescriptor_t r = d.raw_;
    set(name, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &r);
  }
  void set_int(cudnnBackendAttributeName_t name, std::int64_t v) { set(name, CUDNN_TYPE_INT64, 1, &v); }
  void set_type(cudnnBackendAttributeName_t name, cudnnDataType_t v) { set(name, CUDNN_TYPE_DATA_TYPE, 1, &v); }
  void finalize() { check_cudnn(cudnnBackendFinalize(raw_), "cudnnBackendFinalize"); }

 private:
  cudnnBackendDescriptor_t raw_ = nullptr;
};
using Shared = std::shared_ptr<Descriptor>;

struct ConvShape {
  std::int64_t batch, size, in, out, kernel, stride, count;  // size: input height = width
  std::int64_t pad() const { return kernel / 2; }
  std::int64_t out_size() const { return (size + 2 * pad() - kernel) / stride + 1; }
};

enum class Variant { kHalf, kInt8Half, kInt8Int8, kFp8Half };
constexpr Variant kVariants[] = {Variant::kHalf, Variant::kInt8Half, Variant::kInt8Int8, Variant::kFp8Half};

// Tensor uids of the variant pack.
constexpr std::int64_t kX = 1, kW = 2, kScale = 3, kBias = 4, kY = 5;

// The operation graph of one convolution and its epilogue.
class ConvGraph {
 public:
  ConvGraph(cudnnHandle_t handle, const ConvShape& s, Variant v) : handle_(handle) {
    const std::int64_t n = s.batch, c = s.in, h = s.size, k = s.out, r = s.kernel, p = s.out_size();
    const bool int8 = v == Variant::kInt8Half || v == Variant::kInt8Int8;
    const cudnnDataType_t in = v == Variant::kHalf ? CUDNN_DATA_HALF : int8 ? CUDNN_DATA_INT8 : CUDNN_DATA_FP8_E4M3;
    const cudnnDataType_t accumulate = int8 ? CUDNN_DATA_INT32 : CUDNN_DATA_FLOAT;
    const cudnnDataType_t out = v == Variant::kInt8Int8 ? CUDNN_DATA_INT8 : CUDNN_DATA_HALF;
    const Shared x = tensor(kX, in, {n, c, h, h}, {h * h * c, 1, h * c, c});  // NHWC
    const Shared w = tensor(kW, in, {k, c, r, r}, {r * r * c, 1, r * c, c});
    const std::vector<std::int64_t> dims = {n, k, p, p}, strides = {p * p * k, 1, p * k, k};
    const Shared acc = tensor(next_virtual_++, accumulate, dims, strides, /*is_virtual=*/true);
    convolution(s, x, w, acc, accumulate);
    const std::vector<std::int64_t> channel = {1, k, 1, 1}, channel_strides = {k, 1, 1, 1};
    Shared value = acc;
    if (v != Variant::kHalf) {
      value = pointwise(CUDNN_POINTWISE_MUL, value, tensor(kScale, CUDNN_DATA_FLOAT, channel, channel_strides),
                        CUDNN_DATA_FLOAT, dims, strides);
    }
    const cudnnDataType_t bias_type = v == Variant::kHalf ? CUDNN_DATA_HALF : CUDNN_DATA_FLOAT;
    value = pointwise(CUDNN_POINTWISE_ADD, value, tensor(kBias, bias_type, channel, channel_strides), CUDNN_DATA_FLOAT,
                      dims, strides);
    pointwise(CUDNN_POINTWISE_RELU_FWD, value, nullptr, out, dims, strides, kY);
    graph_ = std::make_shared<Descriptor>(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
    graph_->set(CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, static_cast<std::int64_t>(ops_.size()),
                ops_.data());
    graph_->set(CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle_);
    graph_->finalize();
  }

  // Up to `limit` execution plans of cuDNN's heuristic ranking that finalize, with their workspace sizes.
  std::vector<std::pair<Shared, std::int64_t>> plans(std::size_t limit) const {
    Descriptor heuristic(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
    heuristic.set(CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, *graph_);
    const cudnnBackendHeurMode_t mode = CUDNN_HEUR_MODE_A;
    heuristic.set(CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode);
    heuristic.finalize();
    std::int64_t count = 0;
    check_cudnn(cudnnBackendGetAttribute(heuristic.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                         CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &count, nullptr),
                "engine heuristic");
    std::vector<Shared> configs;
    std::vector<cudnnBackendDescriptor_t> raw;
    for (std::int64_t i = 0; i < count; ++i) {
      configs.push_back(std::make_shared<Descriptor>(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR));
      raw.push_back(configs.back()->get());
    }
    std::int64_t got = 0;
    if (count > 0) {
      check_cudnn(cudnnBackendGetAttribute(heuristic.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                           CUDNN_TYPE_BACKEND_DESCRIPTOR, count, &got, raw.data()),
                  "engine heuristic");
    }
    std::vector<std::pair<Shared, std::int64_t>> out;
    for (std::int64_t i = 0; i < got && out.size() < limit; ++i) {
      try {
        auto plan = std::make_shared<Descriptor>(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
        plan->set(CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle_);
        plan->set(CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, *configs[static_cast<std::size_t>(i)]);
        plan->finalize();
        std::int64_t workspace = 0, n = 0;
        check_cudnn(cudnnBackendGetAttribute(plan->get(), CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64,
                                             1, &n, &workspace),
                    "workspace size");
        out.emplace_back(plan, workspace);
      } catch (const std::runtime_error&) {
        // a configuration that does not finalize (CUDNN_STATUS_NOT_SUPPORTED_*): the next one
      }
    }
    return out;
  }

 private:
  Shared tensor(std::int64_t uid, cudnnDataType_t type, const std::vector<std::int64_t>& dims,
                const std::vector<std::int64_t>& strides, bool is_virtual = false) {
    auto t = std::make_shared<Descriptor>(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
    t->set_int(CUDNN_ATTR_TENSOR_UNIQUE_ID, uid);
    t->set_type(CUDNN_ATTR_TENSOR_DATA_TYPE, type);
    t->set(CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, static_cast<std::int64_t>(dims.size()), dims.data());
    t->set(CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, static_cast<std::int64_t>(strides.size()), strides.data());
    t->set_int(CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, 16);
    if (is_virtual) {
      const bool yes = true;
      t->set(CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &yes);
    }
    t->finalize();
    parts_.push_back(t);
    return t;
  }

  void convolution(const ConvShape& s, const Shared& x, const Shared& w, const Shared& y, cudnnDataType_t compute) {
    auto conv = std::make_shared<Descriptor>(CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR);
    conv->set_type(CUDNN_ATTR_CONVOLUTION_COMP_TYPE, compute);
    const cudnnConvolutionMode_t mode = CUDNN_CROSS_CORRELATION;
    conv->set(CUDNN_ATTR_CONVOLUTION_CONV_MODE, CUDNN_TYPE_CONVOLUTION_MODE, 1, &mode);
    conv->set_int(CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS, 2);
    const std::int64_t dilation[2] = {1, 1}, stride[2] = {s.stride, s.stride}, pad[2] = {s.pad(), s.pad()};
    conv->set(CUDNN_ATTR_CONVOLUTION_DILATIONS, CUDNN_TYPE_INT64, 2, dilation);
    conv->set(CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES, CUDNN_TYPE_INT64, 2, stride);
    conv->set(CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS, CUDNN_TYPE_INT64, 2, pad);
    conv->set(CUDNN_ATTR_CONVOLUTION_POST_PADDINGS, CUDNN_TYPE_INT64, 2, pad);
    conv->finalize();
    auto op = std::make_shared<Descriptor>(CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR);
    op->set(CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X, *x);
    op->set(CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_W, *w);
    op->set(CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_Y, *y);
    op->set(CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_CONV_DESC, *conv);
    const float alpha = 1.0f, beta = 0.0f;
    op->set(CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_ALPHA, CUDNN_TYPE_FLOAT, 1, &alpha);
    op->set(CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_BETA, CUDNN_TYPE_FLOAT, 1, &beta);
    add(conv, op);
  }

  // y = mode(x[, b]) into a new virtual tensor (or the output `uid`).
  Shared pointwise(cudnnPointwiseMode_t mode, const Shared& x, const Shared& b, cudnnDataType_t out_type,
                   const std::vector<std::int64_t>& dims, const std::vector<std::int64_t>& strides,
                   std::int64_t uid = -1) {
    const Shared y = uid >= 0 ? tensor(uid, out_type, dims, strides) : tensor(next_virtual_++, out_type, dims, strides,
                                                                              /*is_virtual=*/true);
    auto pw = std::make_shared<Descriptor>(CUDNN_BACKEND_POINTWISE_DESCRIPTOR);
    pw->set(CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode);
    pw->set_type(CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_DATA_FLOAT);
    pw->finalize();
    auto op = std::make_shared<Descriptor>(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR);
    op->set(CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, *pw);
    op->set(CUDNN_ATTR_OPERATION_POINTWISE_XDESC, *x);
    if (b) op->set(CUDNN_ATTR_OPERATION_POINTWISE_BDESC, *b);
    op->set(CUDNN_ATTR_OPERATION_POINTWISE_YDESC, *y);
    const float one = 1.0f;
    op->set(CUDNN_ATTR_OPERATION_POINTWISE_ALPHA1, CUDNN_TYPE_FLOAT, 1, &one);
    op->set(CUDNN_ATTR_OPERATION_POINTWISE_ALPHA2, CUDNN_TYPE_FLOAT, 1, &one);
    add(pw, op);
    return y;
  }

  void add(const Shared& inner, const Shared& op) {
    op->finalize();
    parts_.push_back(inner);
    parts_.push_back(op);
    ops_.push_back(op->get());
  }

  cudnnHandle_t handle_;
  std::int64_t next_virtual_ = 1000;
  std::vector<Shared> parts_;
  std::vector<cudnnBackendDescriptor_t> ops_;
  Shared graph_;
};

// Device buffers for every variant and shape (the largest of each), filled with small values valid in every type.
struct Buffers {
  void* x = nullptr;
  void* w = nullptr;
  void* scale = nullptr;
  void* bias = nullptr;
  void* y = nullptr;
  void* workspace = nullptr;
  std::size_t workspace_bytes = 256u << 20;
};

// Microseconds per run of `plan` over `iterations` back-to-back launches (after 3 warm-up runs).
float time_plan(cudnnHandle_t handle, const Descriptor& plan, const Buffers& b, bool with_scale, int iterations) {
  std::vector<std::int64_t> uids = {kX, kW, kBias, kY};
  std::vector<void*> pointers = {b.x, b.w, b.bias, b.y};
  if (with_scale) {
    uids.push_back(kScale);
    pointers.push_back(b.scale);
  }
  Descriptor pack(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
  pack.set(CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, static_cast<std::int64_t>(uids.size()), uids.data());
  pack.set(CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, static_cast<std::int64_t>(pointers.size()),
           pointers.data());
  void* workspace = b.workspace;
  pack.set(CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &workspace);
  pack.finalize();
  for (int i = 0; i < 3; ++i) check_cudnn(cudnnBackendExecute(handle, plan.get(), pack.get()), "execute");
  cudaEvent_t start = nullptr, stop = nullptr;
  check_cuda(cudaEventCreate(&start), "cudaEventCreate");
  check_cuda(cudaEventCreate(&stop), "cudaEventCreate");
  check_cuda(cudaEventRecord(start), "cudaEventRecord");
  for (int i = 0; i < iterations; ++i) check_cudnn(cudnnBackendExecute(handle, plan.get(), pack.get()), "execute");
  check_cuda(cudaEventRecord(stop), "cudaEventRecord");
  check_cuda(cudaEventSynchronize(stop), "cudaEventSynchronize");
  float ms = 0.0f;
  check_cuda(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime");
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return ms * 1000.0f / static_cast<float>(iterations);
}

// The int8 -> float16 graph against a CPU reference on a small shape: the largest relative error.
double check_int8(cudnnHandle_t handle) {
  const ConvShape s{2, 9, 16, 24, 3, 1, 1};
  const std::int64_t n = s.batch, c = s.in, h = s.size, k = s.out, r = s.kernel, p = s.out_size(), pad = s.pad();
  std::mt19937 rng(1);
  std::uniform_int_distribution<int> value(-127, 127);
  std::vector<std::int8_t> x(static_cast<std::size_t>(n * h * h * c)), w(static_cast<std::size_t>(k * r * r * c));
  for (auto& v : x) v = static_cast<std::int8_t>(value(rng));
  for (auto& v : w) v = static_cast<std::int8_t>(value(rng));
  std::vector<float> scale(static_cast<std::size_t>(k)), bias(static_cast<std::size_t>(k));
  for (std::int64_t i = 0; i < k; ++i) {
    scale[static_cast<std::size_t>(i)] = 1e-4f * static_cast<float>(1 + i);
    bias[static_cast<std::size_t>(i)] = 0.5f * static_cast<float>(i % 5) - 1.0f;
  }
  Buffers b;
  const std::size_t y_bytes = static_cast<std::size_t>(n * p * p * k) * sizeof(__half);
  check_cuda(cudaMalloc(&b.x, x.size()), "cudaMalloc");
  check_cuda(cudaMalloc(&b.w, w.size()), "cudaMalloc");
  check_cuda(cudaMalloc(&b.scale, scale.size() * sizeof(float)), "cudaMalloc");
  check_cuda(cudaMalloc(&b.bias, bias.size() * sizeof(float)), "cudaMalloc");
  check_cuda(cudaMalloc(&b.y, y_bytes), "cudaMalloc");
  check_cuda(cudaMemcpy(b.x, x.data(), x.size(), cudaMemcpyHostToDevice), "cudaMemcpy");
  check_cuda(cudaMemcpy(b.w, w.data(), w.size(), cudaMemcpyHostToDevice), "cudaMemcpy");
  check_cuda(cudaMemcpy(b.scale, scale.data(), scale.size() * sizeof(float), cudaMemcpyHostToDevice), "cudaMemcpy");
  check_cuda(cudaMemcpy(b.bias, bias.data(), bias.size() * sizeof(float), cudaMemcpyHostToDevice), "cudaMemcpy");
  const ConvGraph graph(handle, s, Variant::kInt8Half);
  const auto plans = graph.plans(1);
  if (plans.empty()) throw std::runtime_error("no plan for the int8 check's graph");
  b.workspace_bytes = static_cast<std::size_t>(std::max<std::int64_t>(plans[0].second, 16));
  check_cuda(cudaMalloc(&b.workspace, b.workspace_bytes), "cudaMalloc");
  time_plan(handle, *plans[0].first, b, /*with_scale=*/true, 1);
  std::vector<__half> y(static_cast<std::size_t>(n * p * p * k));
  check_cuda(cudaMemcpy(y.data(), b.y, y_bytes, cudaMemcpyDeviceToHost), "cudaMemcpy");
  double worst = 0.0;
  for (std::int64_t in = 0; in < n; ++in) {
    for (std::int64_t oy = 0; oy < p; ++oy) {
      for (std::int64_t ox = 0; ox < p; ++ox) {
        for (std::int64_t o = 0; o < k; ++o) {
          std::int64_t acc = 0;
          for (std::int64_t ky = 0; ky < r; ++ky) {
            for (std::int64_t kx = 0; kx < r; ++kx) {
              const std::int64_t iy = oy + ky - pad, ix = ox + kx - pad;
              if (iy < 0 || ix < 0 || iy >= h || ix >= h) continue;
              for (std::int64_t i = 0; i < c; ++i) {
                acc += std::int64_t{x[static_cast<std::size_t>(((in * h + iy) * h + ix) * c + i)]} *
                       w[static_cast<std::size_t>(((o * r + ky) * r + kx) * c + i)];
              }
            }
          }
          const double ref = std::max(0.0, static_cast<double>(acc) * scale[static_cast<std::size_t>(o)] +
                                               bias[static_cast<std::size_t>(o)]);
          const double got = __half2float(y[static_cast<std::size_t>(((in * p + oy) * p + ox) * k + o)]);
          worst = std::max(worst, std::fabs(ref - got) / (1.0 + std::fabs(ref)));
        }
      }
    }
  }
  for (void* ptr : {b.x, b.w, b.scale, b.bias, b.y, b.workspace}) cudaFree(ptr);
  return worst;
}

std::vector<int> parse_batches(const char* text) {
  std::vector<int> out;
  std::stringstream in(text);
  for (std::string item; std::getline(in, item, ',');) out.push_back(std::atoi(item.c_str()));
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("bench_cudnn_qconv: no CUDA device; nothing to measure\n");
    return 0;
  }
  const std::size_t plan_limit = argc > 1 ? static_cast<std::size_t>(std::atoi(argv[1])) : 4;
  const std::vector<int> batches = parse_batches(argc > 2 ? argv[2] : "16,64,1");
  try {
    cudnnHandle_t handle = nullptr;
    check_cudnn(cudnnCreate(&handle), "cudnnCreate");
    std::printf("cuDNN %zu; int8 -> float16 graph against the CPU: max relative error %.3g\n", cudnnGetVersion(),
                check_int8(handle));
    // ResNet-50's convolutions: the stem (input channels padded to 4), then the 52 after it with their counts.
    const std::vector<ConvShape> shapes = {
        {0, 224, 4, 64, 7, 2, 1},    {0, 56, 64, 64, 1, 1, 1},    {0, 56, 64, 64, 3, 1, 3},
        {0, 56, 64, 256, 1, 1, 4},   {0, 56, 256, 64, 1, 1, 2},   {0, 56, 256, 128, 1, 1, 1},
        {0, 56, 128, 128, 3, 2, 1},  {0, 28, 128, 512, 1, 1, 4},  {0, 56, 256, 512, 1, 2, 1},
        {0, 28, 512, 128, 1, 1, 3},  {0, 28, 128, 128, 3, 1, 3},  {0, 28, 512, 256, 1, 1, 1},
        {0, 28, 256, 256, 3, 2, 1},  {0, 14, 256, 1024, 1, 1, 6}, {0, 28, 512, 1024, 1, 2, 1},
        {0, 14, 1024, 256, 1, 1, 5}, {0, 14, 256, 256, 3, 1, 5},  {0, 14, 1024, 512, 1, 1, 1},
        {0, 14, 512, 512, 3, 2, 1},  {0, 7, 512, 2048, 1, 1, 3},  {0, 14, 1024, 2048, 1, 2, 1},
        {0, 7, 2048, 512, 1, 1, 2},  {0, 7, 512, 512, 3, 1, 2},
    };
    const std::size_t buffer_bytes = std::size_t{64} * 224 * 224 * 64 * 4;
    Buffers b;
    for (void** ptr : {&b.x, &b.w, &b.scale, &b.bias, &b.y}) {
      check_cuda(cudaMalloc(ptr, buffer_bytes), "cudaMalloc");
      check_cuda(cudaMemset(*ptr, 0, buffer_bytes), "cudaMemset");
    }
    check_cuda(cudaMalloc(&b.workspace, b.workspace_bytes), "cudaMalloc");
    std::vector<std::uint8_t> small(64u << 20);
    std::mt19937 rng(3);
    for (auto& v : small) v = static_cast<std::uint8_t>(rng() & 0x3f);  // small positive values in every type
    check_cuda(cudaMemcpy(b.x, small.data(), small.size(), cudaMemcpyHostToDevice), "cudaMemcpy");
    check_cuda(cudaMemcpy(b.w, small.data(), small.size(), cudaMemcpyHostToDevice), "cudaMemcpy");
    for (int batch : batches) {
      double sums[4] = {0, 0, 0, 0};
      std::printf("\n| batch | H | C -> K | k, s | count | fp16 us | int8->half us | int8->int8 us | fp8->half us |\n"
                  "| ---: | ---: | --- | --- | ---: | ---: | ---: | ---: | ---: |\n");
      for (std::size_t si = 0; si < shapes.size(); ++si) {
        ConvShape s = shapes[si];
        s.batch = batch;
        float best[4] = {-1, -1, -1, -1};
        for (int vi = 0; vi < 4; ++vi) {
          try {
            const ConvGraph graph(handle, s, kVariants[vi]);
            for (const auto& [plan, workspace] : graph.plans(plan_limit)) {
              if (static_cast<std::size_t>(workspace) > b.workspace_bytes) continue;
              const float us = time_plan(handle, *plan, b, kVariants[vi] != Variant::kHalf, 20);
              if (best[vi] < 0 || us < best[vi]) best[vi] = us;
            }
          } catch (const std::runtime_error& e) {
            std::printf("  (shape %zu, variant %d: %s)\n", si, vi, e.what());
          }
          if (si > 0 && best[vi] > 0) sums[vi] += best[vi] * static_cast<double>(s.count);
        }
        std::printf("| %d | %lld | %lld -> %lld | %lld, %lld | %lld | %.2f | %.2f | %.2f | %.2f |\n", batch,
                    static_cast<long long>(s.size), static_cast<long long>(s.in), static_cast<long long>(s.out),
                    static_cast<long long>(s.kernel), static_cast<long long>(s.stride),
                    static_cast<long long>(s.count), best[0], best[1], best[2], best[3]);
        std::fflush(stdout);
      }
      std::printf("batch %d, the 52 convolutions after the stem weighted by count (us): fp16 %.0f, int8->half %.0f, "
                  "int8->int8 %.0f, fp8->half %.0f\n", batch, sums[0], sums[1], sums[2], sums[3]);
    }
    for (void* ptr : {b.x, b.w, b.scale, b.bias, b.y, b.workspace}) cudaFree(ptr);
    cudnnDestroy(handle);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_cudnn_qconv: %s\n", e.what());
    return 1;
  }
  return 0;
}
