// The roofline audit: the FLOP and byte formulas of Note [Roofline work] on known shapes (odd ones included), the
// floor and efficiency arithmetic, the ceilings and their overrides, and the profiler's per-node rooflines.
#include <algorithm>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "onnx_models.h"
#include "test_utils.h"
#include "xpuruntime/device_manager.h"
#include "xpuruntime/exceptions.h"
#include "xpuruntime/inference_session.h"
#include "xpuruntime/profiler.h"
#include "xpuruntime/roofline.h"

using namespace xpuruntime;
using roofline::NodeWork;

namespace {

TensorDesc t(std::vector<std::int64_t> shape, DType dtype = DType::kFloat32) {
  return TensorDesc::contiguous(shape, dtype, Device::cpu());
}

double bytes_of(std::initializer_list<TensorDesc> ts) {
  double b = 0;
  for (const auto& d : ts) b += static_cast<double>(d.numel()) * static_cast<double>(dtype_size(d.dtype));
  return b;
}

roofline::DeviceCeilings ceilings(double bandwidth, double peak) {
  roofline::DeviceCeilings c;
  c.device = "cpu";
  c.bandwidth = bandwidth;
  for (const char* k : {"fp32", "tf32", "fp16", "bf16", "int8", "fp8", "fp64", "vector"}) c.peaks[k] = peak;
  return c;
}

}  // namespace

TEST(Roofline, BatchedMatmulCountsTwoFlopsPerMultiplyAdd) {
  const TensorDesc a = t({3, 5, 7}), b = t({7, 11}), y = t({3, 5, 11});
  const NodeWork w = roofline::node_work("matmul", {}, {a, b}, {y});
  EXPECT_DOUBLE_EQ(w.flops, 2.0 * 3 * 5 * 11 * 7);
  EXPECT_DOUBLE_EQ(w.bytes, bytes_of({a, b, y}));
  EXPECT_EQ(w.ceiling, "fp32");
}

TEST(Roofline, LinearCeilingFollowsDtypeAndPolicy) {
  const TensorDesc x = t({2, 13}), wt = t({17, 13}), bias = t({17}), y = t({2, 17});
  NodeWork w = roofline::node_work("linear", {}, {x, wt, bias, TensorDesc{}}, {y});
  EXPECT_DOUBLE_EQ(w.flops, 2.0 * 2 * 17 * 13);
  EXPECT_DOUBLE_EQ(w.bytes, bytes_of({x, wt, bias, y}));  // the absent residual counts nothing
  EXPECT_EQ(w.ceiling, "fp32");
  EXPECT_EQ(roofline::node_work("linear", {}, {x, wt}, {y}, Precision::kTF32).ceiling, "tf32");
  const TensorDesc xh = t({2, 13}, DType::kFloat16), wh = t({17, 13}, DType::kFloat16);
  EXPECT_EQ(roofline::node_work("linear", {}, {xh, wh}, {t({2, 17}, DType::kFloat16)}).ceiling, "fp16");
  const TensorDesc xb = t({2, 13}, DType::kBFloat16);
  EXPECT_EQ(roofline::node_work("matmul", {}, {xb, t({13, 17}, DType::kBFloat16)}, {t({2, 17}, DType::kBFloat16)})
                .ceiling,
            "bf16");
}

TEST(Roofline, GroupedDilatedStridedConvolution) {
  // x [1, 6, 9, 9], groups 2 (3 channels each), 3x3 kernel, stride 2, dilation 2: out [1, 4, 3, 3]; each output
  // element is a dot product of 3 * 3 * 3 = 27 terms.
  Attributes attrs;
  attrs.set("groups", std::int64_t{2}).set("strides", std::vector<std::int64_t>{2, 2});
  attrs.set("dilations", std::vector<std::int64_t>{2, 2});
  const TensorDesc x = t({1, 6, 9, 9}), w = t({4, 3, 3, 3}), y = t({1, 4, 3, 3});
  const NodeWork work = roofline::node_work("conv2d", attrs, {x, w}, {y});
  EXPECT_DOUBLE_EQ(work.flops, 2.0 * 36 * 27);
  EXPECT_DOUBLE_EQ(work.bytes, bytes_of({x, w, y}));
  // Depthwise (groups = channels), an odd size: 2 * 8*5*5 outputs * 9 taps.
  EXPECT_DOUBLE_EQ(roofline::node_work("conv2d", {}, {t({1, 8, 7, 7}), t({8, 1, 3, 3})}, {t({1, 8, 5, 5})}).flops,
                   2.0 * 200 * 9);
  // NHWC weights [O, kh, kw, C/g] hold the same count per output channel.
  EXPECT_DOUBLE_EQ(roofline::node_work("conv2d", {}, {t({1, 7, 7, 8}), t({8, 3, 3, 1})}, {t({1, 5, 5, 8})}).flops,
                   2.0 * 200 * 9);
}

TEST(Roofline, ThreeDimensionalAndTransposedConvolutions) {
  EXPECT_DOUBLE_EQ(
      roofline::node_work("conv3d", {}, {t({1, 2, 5, 5, 5}), t({3, 2, 2, 2, 2})}, {t({1, 3, 4, 4, 4})}).flops,
      2.0 * 192 * 16);
  // ConvTranspose: every input element scatters into O/g * prod(kernel) outputs: weight [C, O/g, kh, kw].
  EXPECT_DOUBLE_EQ(
      roofline::node_work("conv_transpose2d", {}, {t({1, 4, 5, 5}), t({4, 3, 3, 3})}, {t({1, 3, 7, 7})}).flops,
      2.0 * 100 * 27);
  // int8 convolutions run against the int8 peak.
  const NodeWork q = roofline::node_work("qconv2d", {}, {t({1, 4, 5, 5}, DType::kInt8), t({6, 4, 1, 1}, DType::kInt8)},
                                         {t({1, 6, 5, 5}, DType::kInt8)});
  EXPECT_DOUBLE_EQ(q.flops, 2.0 * 150 * 4);
  EXPECT_EQ(q.ceiling, "int8");
}

TEST(Roofline, AttentionWithGroupedHeadsAndCausalMask) {
  // q [B=2, H=4, Sq=5, D=8], k [2, Hkv=2, Sk=7, 8], v [2, 2, 7, Dv=6]: 2 B H Sq Sk (D + Dv).
  const TensorDesc q = t({2, 4, 5, 8}), k = t({2, 2, 7, 8}), v = t({2, 2, 7, 6}), y = t({2, 4, 5, 6});
  const NodeWork full = roofline::node_work("attention", {}, {q, k, v}, {y});
  EXPECT_DOUBLE_EQ(full.flops, 2.0 * 2 * 4 * 5 * 7 * (8 + 6));
  Attributes causal;
  causal.set("causal", std::int64_t{1});
  EXPECT_DOUBLE_EQ(roofline::node_work("attention", causal, {q, k, v}, {y}).flops, full.flops / 2);
  // bench_attention.py's 4 B H S S D when Dv = D.
  const TensorDesc s = t({1, 2, 3, 4});
  EXPECT_DOUBLE_EQ(roofline::node_work("attention", {}, {s, s, s}, {s}).flops, 4.0 * 1 * 2 * 3 * 3 * 4);
}

TEST(Roofline, QuantizedGemms) {
  const TensorDesc x = t({3, 9}, DType::kInt8), w = t({9, 4}, DType::kInt8), y = t({3, 4});
  const NodeWork q = roofline::node_work("qlinear", {}, {x, w}, {y});
  EXPECT_DOUBLE_EQ(q.flops, 2.0 * 12 * 9);
  EXPECT_EQ(q.ceiling, "int8");
  // matmul_nbits: int4 weights, the activations' precision computes.
  const TensorDesc xh = t({5, 64}, DType::kFloat16);
  const NodeWork n = roofline::node_work("matmul_nbits", {}, {xh, t({3, 2, 16}, DType::kUInt8), t({3, 2})},
                                         {t({5, 3}, DType::kFloat16)});
  EXPECT_DOUBLE_EQ(n.flops, 2.0 * 15 * 64);
  EXPECT_EQ(n.ceiling, "fp16");
}

TEST(Roofline, ElementwiseReductionsAndNormsPerElement) {
  const TensorDesc x = t({3, 7});
  EXPECT_DOUBLE_EQ(roofline::node_work("add", {}, {x, t({7})}, {x}).flops, 21);
  EXPECT_DOUBLE_EQ(roofline::node_work("add", {}, {x, t({7})}, {x}).bytes, bytes_of({x, t({7}), x}));
  EXPECT_EQ(roofline::node_work("add", {}, {x, t({7})}, {x}).ceiling, "vector");
  EXPECT_DOUBLE_EQ(roofline::node_work("reduce_sum", {}, {x}, {t({3, 1})}).flops, 21);
  EXPECT_DOUBLE_EQ(roofline::node_work("reduce_max", {}, {x}, {t({})}).flops, 21);  // to one value
  EXPECT_DOUBLE_EQ(roofline::node_work("softmax", {}, {x}, {x}).flops, 5 * 21);
  EXPECT_DOUBLE_EQ(roofline::node_work("layer_norm", {}, {x, t({7}), t({7})}, {x}).flops, 8 * 21);
  Attributes program;
  program.set("program", std::string("mul x0 x1; sigmoid t0; add t1 x0"));
  EXPECT_DOUBLE_EQ(roofline::node_work("fused_elementwise", program, {x, x}, {x}).flops, 3 * 21);
  Attributes pool;
  pool.set("kernel_shape", std::vector<std::int64_t>{3, 3});
  EXPECT_DOUBLE_EQ(roofline::node_work("max_pool2d", pool, {t({1, 2, 9, 9})}, {t({1, 2, 4, 4})}).flops, 32 * 9);
  // Data movement: bytes only.
  const NodeWork tr = roofline::node_work("transpose", {}, {x}, {t({7, 3})});
  EXPECT_DOUBLE_EQ(tr.flops, 0);
  EXPECT_EQ(tr.ceiling, "vector");
}

TEST(Roofline, GatherAndSliceCountOnlyWhatTheyRead) {
  const TensorDesc table = t({100, 16}), idx = t({5}, DType::kInt64), rows = t({5, 16});
  EXPECT_DOUBLE_EQ(roofline::node_work("gather", {}, {table, idx}, {rows}).bytes, 2.0 * 5 * 16 * 4 + 5 * 8);
  EXPECT_DOUBLE_EQ(roofline::node_work("slice", {}, {table}, {rows}).bytes, 2.0 * 5 * 16 * 4);
}

TEST(Roofline, OnnxNodesFromShapeText) {
  TensorDesc d;
  ASSERT_TRUE(roofline::parse_shape_text("float16[8,128,64]", &d));
  EXPECT_EQ(d.dtype, DType::kFloat16);
  EXPECT_EQ(d.shape, (std::vector<std::int64_t>{8, 128, 64}));
  ASSERT_TRUE(roofline::parse_shape_text("float32[]", &d));
  EXPECT_TRUE(d.shape.empty());
  EXPECT_FALSE(roofline::parse_shape_text("float32[batch,3]", &d));
  EXPECT_FALSE(roofline::parse_shape_text("nonsense", &d));
  EXPECT_FALSE(roofline::parse_shape_text("complex[3]", &d));
  using Shapes = std::vector<std::string>;
  // Gemm with transA: A [K=6, M=4], out [4, 3]: K = A's elements / M.
  const NodeWork gemm = roofline::onnx_node_work("Gemm", Shapes{"float32[6,4]", "float32[6,3]"}, Shapes{"float32[4,3]"});
  EXPECT_DOUBLE_EQ(gemm.flops, 2.0 * 12 * 6);
  EXPECT_EQ(gemm.ceiling, "fp32");
  EXPECT_DOUBLE_EQ(roofline::onnx_node_work("FusedGemm", Shapes{"float32[4,6]", "float32[3,6]"}, Shapes{"float32[4,3]"})
                       .flops,
                   2.0 * 12 * 6);  // ONNX Runtime's Gemm + activation
  EXPECT_DOUBLE_EQ(
      roofline::onnx_node_work("MatMul", Shapes{"float16[2,3,5]", "float16[5,7]"}, Shapes{"float16[2,3,7]"}).flops,
      2.0 * 42 * 5);
  EXPECT_DOUBLE_EQ(roofline::onnx_node_work("com.microsoft:FusedConv", Shapes{"float32[1,2,5,5]", "float32[4,2,3,3]"},
                                            Shapes{"float32[1,4,3,3]"})
                       .flops,
                   2.0 * 36 * 18);
  const NodeWork qmm = roofline::onnx_node_work(
      "QLinearMatMul", Shapes{"uint8[2,8]", "float32[]", "uint8[]", "int8[8,3]", "float32[]", "int8[]"},
      Shapes{"uint8[2,3]"});
  EXPECT_DOUBLE_EQ(qmm.flops, 2.0 * 6 * 8);
  EXPECT_EQ(qmm.ceiling, "int8");
  EXPECT_FALSE(roofline::onnx_node_work("Reshape", Shapes{"float32[6]"}, Shapes{"float32[2,3]"}).known());
  const NodeWork unknown = roofline::onnx_node_work("Erf", Shapes{"float32[2,3]"}, Shapes{"float32[2,3]"});
  EXPECT_DOUBLE_EQ(unknown.flops, 6);
  EXPECT_DOUBLE_EQ(unknown.bytes, 48);
}

TEST(Roofline, FloorIsTheSlowerSideAndEfficiencyFloorOverTime) {
  const roofline::DeviceCeilings c = ceilings(1e9, 1e10);  // 1 GB/s, 10 GFLOP/s
  NodeWork gemm;
  gemm.flops = 2e6;
  gemm.bytes = 1e3;
  gemm.ceiling = "fp32";
  roofline::Floor f = roofline::floor_of(gemm, c);
  EXPECT_DOUBLE_EQ(f.ns, 2e5);  // 2e6 / 1e10 s
  EXPECT_EQ(f.bound, "compute");
  NodeWork copy;
  copy.bytes = 3e6;
  copy.ceiling = "vector";
  f = roofline::floor_of(copy, c);
  EXPECT_DOUBLE_EQ(f.ns, 3e6);
  EXPECT_EQ(f.bound, "memory");
  EXPECT_DOUBLE_EQ(roofline::efficiency(2e5, 4e5), 0.5);
  EXPECT_DOUBLE_EQ(roofline::efficiency(0, 4e5), 0.0);
  EXPECT_DOUBLE_EQ(roofline::efficiency(2e5, 0), 0.0);
  EXPECT_DOUBLE_EQ(roofline::floor_of(NodeWork{}, c).ns, 0.0);  // a view has no floor
  roofline::DeviceCeilings no_peak = c;
  no_peak.peaks.clear();
  EXPECT_DOUBLE_EQ(roofline::floor_of(gemm, no_peak).ns, 1e3);  // only the bytes side is known
}

TEST(Roofline, FlaggedMeansOverTwoPercentAtUnderHalfTheFloor) {
  NodeSummary s;
  s.ceiling = "fp32";
  s.floor_ns = 100;
  s.total_ns = 1000;
  s.efficiency = 0.1;
  s.share = 0.03;
  EXPECT_TRUE(s.flagged());
  EXPECT_DOUBLE_EQ(s.lost_share(), 0.03 * 0.9);
  s.share = 0.01;
  EXPECT_FALSE(s.flagged());
  s.share = 0.5;
  s.efficiency = 0.6;
  EXPECT_FALSE(s.flagged());
  s.efficiency = 1.5;  // past the copy ceiling (cache-resident data): loses nothing
  EXPECT_DOUBLE_EQ(s.lost_share(), 0.0);
}

TEST(Roofline, OverridesAreParsedAndCheckedAndWin) {
  const auto o = roofline::parse_overrides(" bandwidth=4.23e12, fp16=727e12 ");
  EXPECT_DOUBLE_EQ(o.at("bandwidth"), 4.23e12);
  EXPECT_DOUBLE_EQ(o.at("fp16"), 7.27e14);
  EXPECT_THROW(roofline::parse_overrides("fp17=1"), InvalidArgumentError);
  EXPECT_THROW(roofline::parse_overrides("fp16=-1"), InvalidArgumentError);
  EXPECT_THROW(roofline::parse_overrides("fp16=1x"), InvalidArgumentError);
  EXPECT_THROW(roofline::parse_overrides("fp16"), InvalidArgumentError);
  const roofline::DeviceCeilings c = roofline::ceilings("cpu", {"fp32"}, {{"bandwidth", 123.0}});
  EXPECT_DOUBLE_EQ(c.bandwidth, 123.0);
  EXPECT_EQ(c.source.at("bandwidth"), "override: given");
  EXPECT_GT(c.peak("fp32"), 1e8);  // measured: the registry's matmul does more than 0.1 GFLOP/s anywhere
  EXPECT_NE(c.source.at("fp32").find("measured"), std::string::npos);
  const roofline::DeviceCeilings measured = roofline::ceilings("cpu", {});
  EXPECT_GT(measured.bandwidth, 1e8);
}

TEST(Roofline, EnvironmentOverridesTheMeasuredCeilings) {
  ::setenv("XPURT_ROOFLINE_CPU", "bandwidth=5e9,vector=7e9", 1);
  const roofline::DeviceCeilings c = roofline::ceilings("cpu", {"vector"});
  ::unsetenv("XPURT_ROOFLINE_CPU");
  EXPECT_DOUBLE_EQ(c.bandwidth, 5e9);
  EXPECT_DOUBLE_EQ(c.peak("vector"), 7e9);
  EXPECT_EQ(c.source.at("vector"), "override: XPURT_ROOFLINE_CPU");
  ::setenv("XPURT_ROOFLINE_CPU", "bandwidth=oops", 1);
  EXPECT_THROW(roofline::ceilings("cpu", {}), InvalidArgumentError);
  ::unsetenv("XPURT_ROOFLINE_CPU");
}

TEST(Roofline, ProfilerSummaryGivesEveryKernelNodeItsFloor) {
  SessionOptions options;
  options.engine = "native";
  const std::string model(reinterpret_cast<const char*>(test_models::kLinearReluModel),
                          test_models::kLinearReluModelSize);
  InferenceSession session = InferenceSession::from_bytes(model, options);
  Tensor x = Tensor::empty({5, 4}, DType::kFloat32);
  for (std::int64_t i = 0; i < x.numel(); ++i) static_cast<float*>(x.data_ptr())[i] = static_cast<float>(i % 3);
  session.run({{"X", x}});
  ProfilerOptions po;
  po.cuda = ProfilerOptions::CudaActivity::kOff;
  Profiler profiler(po);
  profiler.start();
  for (int i = 0; i < 3; ++i) session.run({{"X", x}});
  profiler.stop();
  // Known ceilings, so that the floor is exact: 1 GB/s and 1 GFLOP/s.
  profiler.set_ceilings("cpu", {{"bandwidth", 1e9}, {"fp32", 1e9}, {"vector", 1e9}});
  const std::vector<NodeSummary> rows = profiler.summary();
  ASSERT_FALSE(rows.empty());
  bool gemm_seen = false;
  for (const auto& s : rows) {
    if (s.ceiling.empty()) continue;
    EXPECT_EQ(s.device, "cpu");
    EXPECT_GT(s.floor_ns, 0) << s.node;
    EXPECT_NEAR(s.efficiency, static_cast<double>(s.floor_ns) / static_cast<double>(s.total_ns), 1e-3) << s.node;
    EXPECT_FALSE(s.reason.empty()) << s.node;
    if (s.op == "linear" || s.op == "matmul") {
      gemm_seen = true;
      EXPECT_DOUBLE_EQ(s.flops, 3 * 2.0 * 5 * 3 * 4) << s.node;  // 3 runs of [5, 4] @ [4, 3]
      // bytes at 1 GB/s: x [5,4], W [4,3], (bias [3]), y [5,3] floats; FLOPs at 1 GFLOP/s: 120 per run -> 120 ns.
      const double ns = std::max(s.floor_bytes, s.flops);
      EXPECT_NEAR(static_cast<double>(s.floor_ns), ns, 1.0) << s.node;
    }
  }
  EXPECT_TRUE(gemm_seen);
  const std::vector<NodeSummary> audit = profiler.audit(1);
  ASSERT_EQ(audit.size(), 1u);
  for (const auto& s : rows) EXPECT_LE(s.lost_share(), audit[0].lost_share() + 1e-12) << s.node;
  EXPECT_NE(profiler.summary_table().find("efficiency"), std::string::npos);
  EXPECT_THROW(profiler.set_ceilings("cpu", {{"fp99", 1.0}}), InvalidArgumentError);
  EXPECT_THROW(profiler.set_ceilings("cpu", {{"fp16", 0.0}}), InvalidArgumentError);
  // A slower ceiling makes a higher floor (the override is this profiler's).
  profiler.set_ceilings("cpu", {{"bandwidth", 1e6}, {"fp32", 1e6}, {"vector", 1e6}});
  EXPECT_GT(profiler.summary()[0].floor_ns, rows[0].floor_ns);
}

TEST(Roofline, AnUnmeasurableDeviceHasUnknownCeilingsNotAnError) {
  if (DeviceManager::instance().get_device_count() > 0) GTEST_SKIP() << "a CUDA device is present";
  const roofline::DeviceCeilings c = roofline::ceilings("cuda:0", {"fp16"}, {{"fp16", 1e12}});
  EXPECT_DOUBLE_EQ(c.bandwidth, 0.0);
  EXPECT_DOUBLE_EQ(c.peak("fp16"), 1e12);  // the override still holds
  EXPECT_NE(c.source.at("error").find("not measured"), std::string::npos);
}

TEST(Roofline, CudaCeilingsComeFromTheCopyProbeAndTheTable) {
  XPURT_SKIP_WITHOUT_GPU();
  const roofline::DeviceCeilings c = roofline::ceilings("cuda:0", {"fp16"});
  EXPECT_GT(c.bandwidth, 1e11);   // a device-to-device copy of any recent GPU moves more than 100 GB/s
  EXPECT_LT(c.bandwidth, 2e13);
  EXPECT_GT(c.peak("fp16"), 1e13);
  EXPECT_GE(c.peak("fp16"), c.peak("fp32"));
  EXPECT_NE(c.source.at("fp16").find("table"), std::string::npos);
  EXPECT_NE(c.source.at("bandwidth").find("measured"), std::string::npos);
}
