// Scratch memory under the run's budget (Note [Scratch memory under the budget] in memory_manager.h): the host
// memory the reference library's ops take for their scratch (double copies of their inputs, whole intermediate
// results, im2col columns, index vectors) is charged to the MemoryBudget open on the thread, so
// ExecutionPolicy.memory_limit covers it.
//
// This executable replaces the global operator new/delete with counting versions, so each case measures the peak
// heap memory an op really took (MemoryManager allocations, the ops' outputs, use aligned_alloc and are not counted
// here) and checks that the budget saw at least that much beyond the outputs.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <new>
#include <random>
#include <string>
#include <vector>

#include "core/node_kernels.h"
#include "test_utils.h"
#include "xpuruntime/exceptions.h"
#include "xpuruntime/graph.h"
#include "xpuruntime/memory_manager.h"
#include "xpuruntime/tensor.h"

namespace {

// Live and peak bytes of operator new, over every thread (OpenMP workers included).
std::atomic<std::int64_t> heap_live{0};
std::atomic<std::int64_t> heap_peak{0};
constexpr std::size_t kHeader = 16;  // keeps malloc's 16-byte alignment; holds the block's size

void* counted_new(std::size_t bytes) {
  void* block = std::malloc(bytes + kHeader);
  if (block == nullptr) throw std::bad_alloc();
  *static_cast<std::size_t*>(block) = bytes;
  const std::int64_t live = heap_live.fetch_add(static_cast<std::int64_t>(bytes)) + static_cast<std::int64_t>(bytes);
  std::int64_t peak = heap_peak.load();
  while (live > peak && !heap_peak.compare_exchange_weak(peak, live)) {
  }
  return static_cast<char*>(block) + kHeader;
}

void counted_delete(void* ptr) noexcept {
  if (ptr == nullptr) return;
  void* block = static_cast<char*>(ptr) - kHeader;
  heap_live.fetch_sub(static_cast<std::int64_t>(*static_cast<std::size_t*>(block)));
  std::free(block);
}

}  // namespace

void* operator new(std::size_t bytes) { return counted_new(bytes); }
void* operator new[](std::size_t bytes) { return counted_new(bytes); }
void operator delete(void* ptr) noexcept { counted_delete(ptr); }
void operator delete[](void* ptr) noexcept { counted_delete(ptr); }
void operator delete(void* ptr, std::size_t) noexcept { counted_delete(ptr); }
void operator delete[](void* ptr, std::size_t) noexcept { counted_delete(ptr); }

namespace xpuruntime {
namespace {

using Shape = std::vector<std::int64_t>;
constexpr std::int64_t kMiB = 1 << 20;

Tensor random_tensor(const Shape& shape, DType dtype, std::mt19937& rng) {
  Tensor t = Tensor::empty(shape, dtype);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  for (std::int64_t i = 0; i < t.numel(); ++i) {
    if (dtype == DType::kFloat32) {
      static_cast<float*>(t.data_ptr())[i] = dist(rng);
    } else if (dtype == DType::kUInt8) {
      static_cast<std::uint8_t*>(t.data_ptr())[i] = static_cast<std::uint8_t>(rng() % 256);
    } else {
      throw InvalidArgumentError("random_tensor: unsupported dtype");
    }
  }
  return t;
}

Tensor int64_tensor(const Shape& shape, const std::vector<std::int64_t>& values) {
  Tensor t = Tensor::empty(shape, DType::kInt64);
  for (std::size_t i = 0; i < values.size(); ++i) static_cast<std::int64_t*>(t.data_ptr())[i] = values[i];
  return t;
}

Tensor float_tensor(const Shape& shape, const std::vector<float>& values) {
  Tensor t = Tensor::empty(shape, DType::kFloat32);
  for (std::size_t i = 0; i < values.size(); ++i) static_cast<float*>(t.data_ptr())[i] = values[i];
  return t;
}

struct Case {
  std::string name;
  Node node;
  std::int64_t opset;
  std::vector<Tensor> inputs;
};

Node make_node(const std::string& op, std::size_t inputs, std::size_t outputs, Attributes attrs = {}) {
  Node node;
  node.op_type = op;
  node.name = "n";
  for (std::size_t i = 0; i < inputs; ++i) node.inputs.push_back(std::string("x").append(std::to_string(i)));
  for (std::size_t i = 0; i < outputs; ++i) node.outputs.push_back(std::string("y").append(std::to_string(i)));
  node.attrs = std::move(attrs);
  return node;
}

// Ops whose scratch is several times the size of their tensors, each at a size where that scratch is megabytes.
std::vector<Case> cases() {
  std::mt19937 rng(7);
  std::vector<Case> out;
  {
    Attributes a;
    a.set("pads", std::vector<std::int64_t>{1, 1, 1, 1});
    out.push_back({"Conv", make_node("Conv", 2, 1, a), 11,
                   {random_tensor({1, 16, 96, 96}, DType::kFloat32, rng),
                    random_tensor({16, 16, 3, 3}, DType::kFloat32, rng)}});
  }
  out.push_back({"MatMul", make_node("MatMul", 2, 1), 13,
                 {random_tensor({256, 2048}, DType::kFloat32, rng), random_tensor({2048, 256}, DType::kFloat32, rng)}});
  {
    Attributes a;
    a.set("mode", std::string("linear"));
    // Three resized axes: the whole-tensor passes in double (Note [Separable resize]); a resize of H and W alone runs
    // plane by plane with one row of scratch (Note [Resize of the last two axes]).
    out.push_back({"Resize", make_node("Resize", 3, 1, a), 13,
                   {random_tensor({1, 4, 200, 200}, DType::kFloat32, rng), Tensor(),
                    float_tensor({4}, {1.0f, 2.0f, 2.0f, 2.0f})}});
  }
  out.push_back({"LayerNormalization", make_node("LayerNormalization", 3, 1), 17,
                 {random_tensor({1024, 768}, DType::kFloat32, rng), random_tensor({768}, DType::kFloat32, rng),
                  random_tensor({768}, DType::kFloat32, rng)}});
  out.push_back({"InstanceNormalization", make_node("InstanceNormalization", 3, 1), 6,
                 {random_tensor({2, 8, 128, 128}, DType::kFloat32, rng), random_tensor({8}, DType::kFloat32, rng),
                  random_tensor({8}, DType::kFloat32, rng)}});
  out.push_back({"GridSample", make_node("GridSample", 2, 1), 16,
                 {random_tensor({1, 4, 256, 256}, DType::kFloat32, rng),
                  random_tensor({1, 256, 256, 2}, DType::kFloat32, rng)}});
  {
    std::vector<std::int64_t> indices(1 << 19);
    for (auto& i : indices) i = static_cast<std::int64_t>(rng() % 1024);
    out.push_back({"Gather", make_node("Gather", 2, 1), 13,
                   {random_tensor({1024, 1}, DType::kFloat32, rng),
                    int64_tensor({static_cast<std::int64_t>(indices.size())}, indices)}});
  }
  out.push_back({"Unique", make_node("Unique", 1, 4), 11, {random_tensor({1 << 18}, DType::kFloat32, rng)}});
  out.push_back({"DFT", make_node("DFT", 1, 1), 17, {random_tensor({1, 1 << 17, 1}, DType::kFloat32, rng)}});
  {
    Attributes a;
    a.set("hidden_size", std::int64_t{64});
    out.push_back({"GRU", make_node("GRU", 3, 1, a), 14,
                   {random_tensor({256, 64, 32}, DType::kFloat32, rng),
                    random_tensor({1, 192, 32}, DType::kFloat32, rng),
                    random_tensor({1, 192, 64}, DType::kFloat32, rng)}});
  }
  out.push_back({"MatMulInteger", make_node("MatMulInteger", 2, 1), 10,
                 {random_tensor({512, 256}, DType::kUInt8, rng), random_tensor({256, 512}, DType::kUInt8, rng)}});
  return out;
}

std::int64_t output_bytes(const std::vector<Tensor>& outputs) {
  std::int64_t bytes = 0;
  for (const Tensor& t : outputs) bytes += t.defined() ? t.nbytes() : 0;
  return bytes;
}

TEST(ScratchMemory, TheBudgetSeesWhatTheReferenceOpsTakeFromTheHeap) {
  for (const Case& c : cases()) {
    SCOPED_TRACE(c.name);
    auto budget = std::make_shared<MemoryBudget>(std::size_t{1} << 40, "a test's 1 TiB");
    std::int64_t outputs = 0;
    const std::int64_t before = heap_live.load();
    heap_peak.store(before);
    {
      const MemoryBudgetScope scope(budget);
      const std::vector<Tensor> ys = onnx_ref::run_node(c.node, c.opset, c.inputs);
      outputs = output_bytes(ys);
    }
    const std::int64_t heap = heap_peak.load() - before;  // the op's own heap memory at its peak
    const std::int64_t charged = static_cast<std::int64_t>(budget->peak());
    // The case is one whose scratch matters: megabytes, more than its outputs (which are not heap memory).
    EXPECT_GT(heap, outputs + kMiB) << "outputs " << outputs << " bytes";
    // The budget saw at least the heap's peak: everything but small bookkeeping (shapes, strides, strings: well
    // under 256 KiB) was charged. (Its own peak also holds the outputs, when they live at the same time.)
    EXPECT_GE(charged, heap - 256 * 1024) << "heap peak " << heap << " bytes, charged " << charged
                                          << " bytes, outputs " << outputs;
    EXPECT_EQ(budget->used(), 0u) << "the outputs died with the scope's tensors; nothing else stays charged";
  }
}

TEST(ScratchMemory, ScratchPastTheBudgetIsATypedErrorAndKeepsNothing) {
  for (const Case& c : cases()) {
    SCOPED_TRACE(c.name);
    // A budget with room for the outputs but not for the scratch.
    std::int64_t outputs = 0;
    {
      const std::vector<Tensor> ys = onnx_ref::run_node(c.node, c.opset, c.inputs);
      outputs = output_bytes(ys);
    }
    auto budget = std::make_shared<MemoryBudget>(static_cast<std::size_t>(outputs + 64 * 1024),
                                                 "ExecutionPolicy.memory_limit of a test");
    const std::int64_t before = heap_live.load();
    {
      const MemoryBudgetScope scope(budget);
      XPURT_EXPECT_THROW_WITH(onnx_ref::run_node(c.node, c.opset, c.inputs), OutOfMemoryError,
                              "ExecutionPolicy.memory_limit of a test");
    }
    EXPECT_EQ(budget->used(), 0u) << "a refused op releases what it had charged";
    EXPECT_LE(heap_live.load() - before, 64 * 1024) << "a refused op frees its scratch";
  }
}

TEST(ScratchMemory, WithoutABudgetTheOpsRunAsBefore) {
  ASSERT_EQ(MemoryBudgetScope::current(), nullptr);
  for (const Case& c : cases()) {
    SCOPED_TRACE(c.name);
    EXPECT_FALSE(onnx_ref::run_node(c.node, c.opset, c.inputs).empty());
  }
}

TEST(ScratchMemory, ScratchVectorsChargeAndReleaseTheBudgetTheyWereMadeUnder) {
  auto budget = std::make_shared<MemoryBudget>(1 << 20, "a test's 1 MiB");
  ScratchVector<double> kept;
  {
    const MemoryBudgetScope scope(budget);
    ScratchVector<double> a(1000);
    EXPECT_EQ(budget->used(), 8000u);
    kept = std::move(a);  // the allocator travels with the memory
    ScratchVector<double> b(kept);
    EXPECT_EQ(budget->used(), 16000u);
    EXPECT_THROW(ScratchVector<double>(200000), OutOfMemoryError);  // 1.6 MB > 1 MiB
    EXPECT_EQ(budget->used(), 16000u);
  }
  EXPECT_EQ(budget->used(), 8000u);  // b died; kept still holds its charge after the scope closed
  kept.push_back(1.0);               // grows under the budget it was made under
  EXPECT_GT(budget->used(), 8000u);
  kept = ScratchVector<double>();  // made with no budget open: moved-in allocator, old memory released
  EXPECT_EQ(budget->used(), 0u);
  EXPECT_EQ(budget->peak(), 24000u) << "the most held at once: the grown copy (16000) while the old (8000) lived";
}

// run_node_into (Note [Reference kernels write into the launch's outputs] in backends/cpu/cpu_onnx_ops.cpp): the
// output lands in the destination when it fits, and a destination that is an input's memory, or of another shape, is
// left alone.
TEST(ScratchMemory, OutputsLandInTheirDestinationsWhenTheyFit) {
  std::mt19937 rng(7);
  const Tensor a = random_tensor({64, 48}, DType::kFloat32, rng);
  const Tensor b = random_tensor({64, 48}, DType::kFloat32, rng);
  const Node add = make_node("Add", 2, 1);
  const Tensor expected = onnx_ref::run_node(add, 14, {a, b})[0];
  const auto same = [&](const Tensor& y) {
    return y.shape() == expected.shape() &&
           std::memcmp(y.data_ptr(), expected.data_ptr(), static_cast<std::size_t>(expected.nbytes())) == 0;
  };

  const Tensor into = Tensor::empty({64, 48}, DType::kFloat32);
  const Tensor y = onnx_ref::run_node_into(add, 14, {a, b}, {into})[0];
  EXPECT_EQ(y.data_ptr(), into.data_ptr());
  EXPECT_TRUE(same(into));

  std::vector<char> a_before(static_cast<std::size_t>(a.nbytes()));
  std::memcpy(a_before.data(), a.data_ptr(), a_before.size());
  const Tensor onto_input = onnx_ref::run_node_into(add, 14, {a, b}, {a})[0];  // the input's own memory
  EXPECT_NE(onto_input.data_ptr(), a.data_ptr());
  EXPECT_TRUE(same(onto_input));
  EXPECT_EQ(std::memcmp(a.data_ptr(), a_before.data(), a_before.size()), 0);

  const Tensor wrong = Tensor::empty({48, 64}, DType::kFloat32);
  const Tensor other_shape = onnx_ref::run_node_into(add, 14, {a, b}, {wrong})[0];
  EXPECT_NE(other_shape.data_ptr(), wrong.data_ptr());
  EXPECT_TRUE(same(other_shape));
}

}  // namespace
}  // namespace xpuruntime
