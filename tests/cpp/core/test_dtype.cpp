// The element types: names, sizes and numbering of every DType, DLPack exchange of the unsigned 16/32/64-bit
// integers, Tensor::view(dtype) reinterpretation, and the CPU kernels that compute on the unsigned types (the
// registry's cast and comparisons, the ONNX reference ops) at values a signed or float detour would get wrong;
// cuda_raw refuses those types through supports().
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "test_utils.h"
#include "xpuruntime/dlpack.h"
#include "xpuruntime/dtype.h"
#include "xpuruntime/exceptions.h"
#include "xpuruntime/graph.h"
#include "xpuruntime/kernel_policy.h"
#include "xpuruntime/kernel_registry.h"
#include "xpuruntime/ops.h"
#include "xpuruntime/tensor.h"

// The ONNX reference library's entry points are exported; its header is internal (src/cpp).
#include "core/node_kernels.h"

namespace xpuruntime {
namespace {

using Shape = std::vector<std::int64_t>;

constexpr std::uint64_t kTop64 = std::uint64_t{1} << 63;  // 2^63: negative as int64
constexpr std::uint64_t kMaxU64 = std::numeric_limits<std::uint64_t>::max();
constexpr std::uint32_t kMaxU32 = std::numeric_limits<std::uint32_t>::max();

template <typename T>
Tensor make(const Shape& shape, DType dtype, const std::vector<T>& values) {
  EXPECT_EQ(sizeof(T), dtype_size(dtype));
  Tensor t = Tensor::empty(shape, dtype);
  EXPECT_EQ(static_cast<std::size_t>(t.numel()), values.size());
  if (!values.empty()) std::memcpy(t.data_ptr(), values.data(), values.size() * sizeof(T));
  return t;
}

template <typename T>
std::vector<T> values_of(const Tensor& t) {
  EXPECT_EQ(sizeof(T), t.element_size()) << t.str();
  const Tensor c = t.contiguous();
  const auto* p = static_cast<const T*>(c.data_ptr());
  return std::vector<T>(p, p + c.numel());
}

// ---- names, sizes, numbering ----

TEST(DType, EveryDtypeHasANameASizeAndRoundTripsByName) {
  const struct {
    DType dtype;
    const char* name;
    std::size_t size;
  } cases[] = {
      {DType::kFloat16, "float16", 2}, {DType::kBFloat16, "bfloat16", 2}, {DType::kFloat32, "float32", 4},
      {DType::kFloat64, "float64", 8}, {DType::kInt8, "int8", 1},         {DType::kUInt8, "uint8", 1},
      {DType::kInt16, "int16", 2},     {DType::kInt32, "int32", 4},       {DType::kInt64, "int64", 8},
      {DType::kBool, "bool", 1},       {DType::kUInt16, "uint16", 2},     {DType::kUInt32, "uint32", 4},
      {DType::kUInt64, "uint64", 8},
  };
  for (const auto& c : cases) {
    EXPECT_EQ(dtype_name(c.dtype), c.name);
    EXPECT_EQ(dtype_size(c.dtype), c.size) << c.name;
    EXPECT_EQ(dtype_from_name(c.name), c.dtype) << c.name;
  }
  XPURT_EXPECT_THROW_WITH(dtype_from_name("uint128"), InvalidTypeError, "uint16, int32, uint32, int64, uint64");
}

TEST(DType, TheUnsignedTypesComeAfterTheEarlierOnes) {
  // The earlier dtypes keep their numeric values (anything that stored them as numbers still reads them right).
  EXPECT_EQ(static_cast<int>(DType::kFloat16), 0);
  EXPECT_EQ(static_cast<int>(DType::kUInt8), 5);
  EXPECT_EQ(static_cast<int>(DType::kBool), 9);
  EXPECT_EQ(static_cast<int>(DType::kUInt16), 10);
  EXPECT_EQ(static_cast<int>(DType::kUInt32), 11);
  EXPECT_EQ(static_cast<int>(DType::kUInt64), 12);
}

// ---- DLPack ----

TEST(DType, UnsignedTensorsRoundTripThroughDLPack) {
  const struct {
    DType dtype;
    std::uint8_t bits;
  } cases[] = {{DType::kUInt8, 8}, {DType::kUInt16, 16}, {DType::kUInt32, 32}, {DType::kUInt64, 64}};
  for (const auto& c : cases) {
    Tensor t = Tensor::zeros({2, 3}, c.dtype);
    std::memset(t.data_ptr(), 0xab, t.nbytes());
    DLManagedTensor* legacy = to_dlpack(t);
    EXPECT_EQ(legacy->dl_tensor.dtype.code, kDLUInt) << dtype_name(c.dtype);
    EXPECT_EQ(legacy->dl_tensor.dtype.bits, c.bits);
    EXPECT_EQ(legacy->dl_tensor.dtype.lanes, 1);
    const Tensor back = from_dlpack(legacy);
    EXPECT_EQ(back.dtype(), c.dtype);
    EXPECT_EQ(back.shape(), (Shape{2, 3}));
    EXPECT_EQ(back.data_ptr(), t.data_ptr());  // zero-copy both ways
    DLManagedTensorVersionedV1* versioned = to_dlpack_versioned(t);
    EXPECT_EQ(versioned->dl_tensor.dtype.bits, c.bits);
    EXPECT_EQ(from_dlpack_versioned(versioned).dtype(), c.dtype);
  }
}

// ---- Tensor::view ----

TEST(DType, ViewReinterpretsTheBitsOfOneElementSize) {
  // bfloat16 1.0 is 0x3f80, -2.0 is 0xc000.
  Tensor bits = make<std::uint16_t>({2, 2}, DType::kUInt16, {0x3f80, 0xc000, 0x0000, 0x7fc0});
  const Tensor bf16 = bits.view(DType::kBFloat16);
  EXPECT_EQ(bf16.dtype(), DType::kBFloat16);
  EXPECT_EQ(bf16.shape(), bits.shape());
  EXPECT_EQ(bf16.strides(), bits.strides());
  EXPECT_EQ(bf16.data_ptr(), bits.data_ptr());
  EXPECT_EQ(bf16.storage(), bits.storage());                 // the memory is shared: writes show through
  static_cast<std::uint16_t*>(bits.data_ptr())[2] = 0x4040;  // 3.0
  const Tensor as_float = ops::call("cast", {bf16}, Attributes().set("to", std::string("float32"))).at(0);
  const std::vector<float> v = values_of<float>(as_float);
  EXPECT_EQ(v[0], 1.0f);
  EXPECT_EQ(v[1], -2.0f);
  EXPECT_EQ(v[2], 3.0f);
  EXPECT_TRUE(std::isnan(v[3]));
  // Back to the bits, and other same-size pairs.
  EXPECT_EQ(bf16.view(DType::kUInt16).dtype(), DType::kUInt16);
  EXPECT_EQ(Tensor::zeros({3}, DType::kFloat32).view(DType::kUInt32).dtype(), DType::kUInt32);
  EXPECT_EQ(Tensor::zeros({3}, DType::kInt64).view(DType::kUInt64).dtype(), DType::kUInt64);
  // A strided view keeps its strides and offset.
  Tensor wide = make<std::uint32_t>({4}, DType::kUInt32, {1, 2, 3, 4});
  const Tensor every_other = Tensor::from_blob(static_cast<std::uint32_t*>(wide.data_ptr()) + 1, {2}, {2},
                                               DType::kUInt32, Device::cpu(), wide.storage());
  const Tensor as_int = every_other.view(DType::kInt32);
  EXPECT_EQ(as_int.strides(), (Shape{2}));
  EXPECT_EQ(values_of<std::int32_t>(as_int), (std::vector<std::int32_t>{2, 4}));
}

TEST(DType, ViewRefusesAnotherElementSize) {
  const Tensor bits = Tensor::zeros({4}, DType::kUInt16);
  XPURT_EXPECT_THROW_WITH(bits.view(DType::kFloat32), InvalidTypeError,
                          "cannot reinterpret uint16 (2-byte elements) as float32 (4-byte elements)");
  XPURT_EXPECT_THROW_WITH(Tensor().view(DType::kInt8), InvalidArgumentError, "undefined");
}

// ---- the registry's cpu kernels ----

Tensor cpu_call(const std::string& op, const std::vector<Tensor>& inputs, const Attributes& attrs = {}) {
  KernelPolicy policy;
  policy.set(op, "pin:cpu");
  ops::CallOptions options;
  options.kernel_policy = &policy;
  return ops::call(op, inputs, attrs, options).at(0);
}

Tensor cast_to(const Tensor& x, const char* dtype) {
  return cpu_call("cast", {x}, Attributes().set("to", std::string(dtype)));
}

TEST(DType, CpuCastConvertsUnsignedValuesAboveTheSignedRange) {
  const Tensor u64 = make<std::uint64_t>({4}, DType::kUInt64, {kTop64, kMaxU64, 5, 0});
  // Through int64 these would be negative; as values they are 2^63, 2^64 - 1 (2^64 in float), 5 and 0.
  EXPECT_EQ(values_of<double>(cast_to(u64, "float64")),
            (std::vector<double>{9223372036854775808.0, 18446744073709551616.0, 5.0, 0.0}));
  EXPECT_EQ(values_of<float>(cast_to(u64, "float32"))[0], 9223372036854775808.0f);
  EXPECT_EQ(values_of<std::int64_t>(cast_to(u64, "int64"))[1], -1);  // integers wrap, like C
  EXPECT_EQ(values_of<std::uint32_t>(cast_to(u64, "uint32")), (std::vector<std::uint32_t>{0, kMaxU32, 5, 0}));
  EXPECT_EQ(values_of<std::uint8_t>(cast_to(u64, "bool")), (std::vector<std::uint8_t>{1, 1, 1, 0}));
  // bfloat16 of 2^63 is exact (0x5f00).
  EXPECT_EQ(values_of<std::uint16_t>(cast_to(u64, "bfloat16"))[0], 0x5f00);

  const Tensor f = make<float>({5}, DType::kFloat32, {-1.0f, 3.9f, 5e9f, 70000.0f, 1e30f});
  // Floats truncate toward zero and saturate; negative values into unsigned types are not representable: 0.
  EXPECT_EQ(values_of<std::uint32_t>(cast_to(f, "uint32")),
            (std::vector<std::uint32_t>{0, 3, kMaxU32, 70000, kMaxU32}));
  EXPECT_EQ(values_of<std::uint16_t>(cast_to(f, "uint16")), (std::vector<std::uint16_t>{0, 3, 65535, 65535, 65535}));
  EXPECT_EQ(values_of<std::uint64_t>(cast_to(f, "uint64"))[2], 5000000000u);

  const Tensor i64 = make<std::int64_t>({2}, DType::kInt64, {-1, 65537});
  EXPECT_EQ(values_of<std::uint64_t>(cast_to(i64, "uint64")), (std::vector<std::uint64_t>{kMaxU64, 65537}));
  EXPECT_EQ(values_of<std::uint16_t>(cast_to(i64, "uint16")), (std::vector<std::uint16_t>{65535, 1}));
}

TEST(DType, CpuComparisonsWhereAndDataMovementTakeUnsignedTypes) {
  const Tensor a = make<std::uint32_t>({3}, DType::kUInt32, {kMaxU32, 1, 7});
  const Tensor b = make<std::uint32_t>({1}, DType::kUInt32, {2});
  EXPECT_EQ(values_of<std::uint8_t>(cpu_call("greater", {a, b})), (std::vector<std::uint8_t>{1, 0, 1}));
  EXPECT_EQ(values_of<std::uint8_t>(cpu_call("less", {a, b})), (std::vector<std::uint8_t>{0, 1, 0}));
  const Tensor c = make<std::uint64_t>({2}, DType::kUInt64, {kTop64, 1});
  EXPECT_EQ(values_of<std::uint8_t>(cpu_call("greater", {c, make<std::uint64_t>({1}, DType::kUInt64, {2})})),
            (std::vector<std::uint8_t>{1, 0}));
  const Tensor cond = make<std::uint8_t>({2}, DType::kBool, {1, 0});
  EXPECT_EQ(values_of<std::uint64_t>(cpu_call("where", {cond, c, make<std::uint64_t>({2}, DType::kUInt64, {8, 9})})),
            (std::vector<std::uint64_t>{kTop64, 9}));
  const Tensor m = make<std::uint16_t>({2, 3}, DType::kUInt16, {1, 2, 3, 4, 5, 65535});
  const Tensor t = cpu_call("transpose", {m});
  EXPECT_EQ(t.dtype(), DType::kUInt16);
  EXPECT_EQ(values_of<std::uint16_t>(t), (std::vector<std::uint16_t>{1, 4, 2, 5, 3, 65535}));
}

TEST(DType, CudaRawRefusesTheUnsignedTypesThroughSupports) {
  const Kernel* cast = KernelRegistry::global().find_kernel("cast", "cuda_raw");
  if (cast == nullptr || KernelRegistry::global().find_kernel("transpose", "cuda_raw") == nullptr) {
    GTEST_SKIP() << "this build has no cuda_raw backend";
  }
  const Device gpu = Device::cuda(0);  // a descriptor only: supports() runs nothing
  OpDescriptor desc;
  desc.op = "transpose";
  desc.device = gpu;
  desc.inputs = {TensorDesc::contiguous({2, 3}, DType::kUInt32, gpu)};
  desc.outputs = {TensorDesc::contiguous({3, 2}, DType::kUInt32, gpu)};
  const Support transpose = KernelRegistry::global().find_kernel("transpose", "cuda_raw")->supports(desc, {});
  EXPECT_FALSE(transpose.ok());
  EXPECT_NE(transpose.reason().find("except uint16, uint32 and uint64, got uint32"), std::string::npos)
      << transpose.reason();
  desc.op = "cast";
  desc.attrs.set("to", std::string("uint64"));
  desc.inputs = {TensorDesc::contiguous({2}, DType::kFloat32, gpu)};
  desc.outputs = {TensorDesc::contiguous({2}, DType::kUInt64, gpu)};
  const Support to_u64 = cast->supports(desc, {});
  EXPECT_FALSE(to_u64.ok());
  EXPECT_NE(to_u64.reason().find("cannot cast to uint64"), std::string::npos) << to_u64.reason();
}

// ---- the ONNX reference ops ----

Tensor run1(const std::string& op, const std::vector<Tensor>& inputs, Attributes attrs = {}, std::int64_t opset = 18) {
  Node node;
  node.name = "n0";
  node.op_type = op;
  for (std::size_t i = 0; i < inputs.size(); ++i) node.inputs.push_back(std::string("x").append(std::to_string(i)));
  node.outputs = {"y"};
  node.attrs = std::move(attrs);
  return onnx_ref::run_node(node, opset, inputs).at(0);
}

TEST(DType, OnnxMaxMinModAndReduceCompareUnsignedValuesAsUnsigned) {
  const Tensor a = make<std::uint64_t>({3}, DType::kUInt64, {kTop64, 3, kMaxU64});
  const Tensor b = make<std::uint64_t>({3}, DType::kUInt64, {1, kTop64 + 1, 0});
  EXPECT_EQ(values_of<std::uint64_t>(run1("Max", {a, b})), (std::vector<std::uint64_t>{kTop64, kTop64 + 1, kMaxU64}));
  EXPECT_EQ(values_of<std::uint64_t>(run1("Min", {a, b})), (std::vector<std::uint64_t>{1, 3, 0}));
  EXPECT_EQ(values_of<std::uint64_t>(run1("ReduceMax", {a}, Attributes().set("keepdims", std::int64_t{0}))),
            (std::vector<std::uint64_t>{kMaxU64}));
  const Tensor x = make<std::uint32_t>({3}, DType::kUInt32, {kMaxU32, 10, 7});
  const Tensor y = make<std::uint32_t>({3}, DType::kUInt32, {10, 3, kMaxU32});
  EXPECT_EQ(values_of<std::uint32_t>(run1("Mod", {x, y})), (std::vector<std::uint32_t>{5, 1, 7}));
  EXPECT_EQ(values_of<std::uint32_t>(run1("Add", {x, make<std::uint32_t>({1}, DType::kUInt32, {1})})),
            (std::vector<std::uint32_t>{0, 11, 8}));                      // wraps
  XPURT_EXPECT_THROW_WITH(run1("Neg", {x}), InvalidTypeError, "uint32");  // ONNX Neg has no unsigned types
}

TEST(DType, OnnxBitShiftAndPowTakeEveryUnsignedWidth) {
  const Tensor x16 = make<std::uint16_t>({3}, DType::kUInt16, {1, 0x8001, 5});
  const Tensor s16 = make<std::uint16_t>({3}, DType::kUInt16, {15, 1, 16});
  EXPECT_EQ(values_of<std::uint16_t>(run1("BitShift", {x16, s16}, Attributes().set("direction", std::string("LEFT")))),
            (std::vector<std::uint16_t>{0x8000, 0x0002, 0}));  // a shift by the width gives 0
  const Tensor x64 = make<std::uint64_t>({2}, DType::kUInt64, {kMaxU64, kTop64});
  const Tensor s64 = make<std::uint64_t>({2}, DType::kUInt64, {60, 63});
  EXPECT_EQ(values_of<std::uint64_t>(run1("BitShift", {x64, s64}, Attributes().set("direction", std::string("RIGHT")))),
            (std::vector<std::uint64_t>{15, 1}));  // logical, not arithmetic, shifts
  XPURT_EXPECT_THROW_WITH(
      run1("BitShift", {make<std::int32_t>({1}, DType::kInt32, {1}), make<std::int32_t>({1}, DType::kInt32, {1})},
           Attributes().set("direction", std::string("LEFT"))),
      InvalidTypeError, "uint8, uint16, uint32, uint64");
  const Tensor base = make<float>({2}, DType::kFloat32, {2.0f, 3.0f});
  const Tensor exponent = make<std::uint64_t>({2}, DType::kUInt64, {10, 2});
  EXPECT_EQ(values_of<float>(run1("Pow", {base, exponent})), (std::vector<float>{1024.0f, 9.0f}));
}

TEST(DType, OnnxCastRoundsFloatToBFloat16ToNearestEven) {
  // 0x3ef5eeb0 lies above the midpoint of bfloat16 0x3ef5 and 0x3ef6: to nearest gives 0x3ef6 (truncating would
  // give 0x3ef5); 0x3f808000 is a tie: to even (0x3f80); 0x3f818000 is a tie: to even (0x3f82).
  const std::vector<std::uint32_t> bits = {0x3ef5eeb0u, 0x3ef535b8u, 0x3f808000u,
                                           0x3f818000u, 0x7fc00000u, 0xff800000u};
  const Tensor f = make<std::uint32_t>({6}, DType::kUInt32, bits).view(DType::kFloat32);
  const Tensor bf16 = run1("Cast", {f}, Attributes().set("to", std::int64_t{16}));
  EXPECT_EQ(bf16.dtype(), DType::kBFloat16);
  EXPECT_EQ(values_of<std::uint16_t>(bf16),
            (std::vector<std::uint16_t>{0x3ef6, 0x3ef5, 0x3f80, 0x3f82, 0x7fc0, 0xff80}));
  const Tensor u64 =
      run1("Cast", {make<float>({2}, DType::kFloat32, {1e19f, 7.5f})}, Attributes().set("to", std::int64_t{13}));
  EXPECT_EQ(values_of<std::uint64_t>(u64), (std::vector<std::uint64_t>{9999999980506447872u, 7}));
  const Tensor back =
      run1("Cast", {make<std::uint64_t>({1}, DType::kUInt64, {kMaxU64})}, Attributes().set("to", std::int64_t{11}));
  EXPECT_EQ(values_of<double>(back), (std::vector<double>{18446744073709551616.0}));
}

}  // namespace
}  // namespace xpuruntime
