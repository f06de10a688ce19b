// The CUDA C that the codegen backend writes for fused elementwise programs (Note [Fused elementwise programs]): which
// launches take the vector loops (Note [Vectorised programs]), the row groups' shapes (Note [Row programs]), and that
// NVRTC compiles every variant (no GPU needed; skipped without NVRTC). The kernels' results are checked against the
// cpu kernel on a GPU by tests/python/test_conformance.py.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

#include "core/fused_elementwise.h"
#include "xpuruntime/exceptions.h"

namespace xpuruntime {
namespace {

struct Case {
  std::string program;
  std::vector<std::vector<std::int64_t>> inputs;
  std::vector<std::int64_t> output;
  std::int64_t row_axes;
  std::vector<DType> dtypes;
  DType out;
  int vec;  // the expected vector width
};

std::vector<Case> cases() {
  const DType h = DType::kFloat16, f = DType::kFloat32, b = DType::kBFloat16;
  return {
      // SwiGLU of two [tokens, 2816] projections: 16-bit vectors of 8.
      {"sigmoid x0; mul x0 t0; mul t1 x1", {{128, 2816}, {128, 2816}}, {128, 2816}, 0, {h, h}, h, 8},
      // a bias row broadcast over rows (stride 1 along the vector), a per-row scale (stride 0), a scalar.
      {"mul x0 x1; add t0 x2; mul t1 x3", {{64, 96}, {96}, {64, 1}, {}}, {64, 96}, 0, {h, h, h, h}, h, 8},
      // float32 data: vectors of 4.
      {"add x0 x1; relu t0", {{5, 12}, {5, 12}}, {5, 12}, 0, {f, f}, f, 4},
      // an odd innermost axis: element by element.
      {"add x0 x1", {{7, 13}, {13}}, {7, 13}, 0, {h, h}, h, 1},
      // a column broadcast on an innermost axis of 6: vectors of 2.
      {"mul x0 x1", {{3, 6}, {3, 6}}, {3, 6}, 0, {b, b}, b, 2},
      // a transposed read (innermost stride not 1 or 0): element by element.
      {"add x0 x1", {{4, 8, 1}, {4, 1, 8}}, {4, 8, 8}, 0, {h, h}, h, 8},
      // RMSNorm over rows of 1024 (Llama), float32 accumulation, float16 weight.
      {"f32 x0; mul t0 t0; reduce_mean t1; add t2 x1; sqrt t3; reciprocal t4; mul t0 t5; f16 t6; mul x2 t7",
       {{128, 1024}, {}, {1024}}, {128, 1024}, 1, {h, h, h}, h, 8},
      // softmax over rows of 96 (a sub-warp group), and over rows of 5 (element by element).
      {"reduce_max x0; sub x0 t0; exp t1; reduce_sum t2; div t2 t3", {{300, 96}}, {300, 96}, 1, {h}, h, 8},
      {"reduce_max x0; sub x0 t0; exp t1; reduce_sum t2; div t2 t3", {{300, 5}}, {300, 5}, 1, {f}, f, 1},
      // long rows: a block per row.
      {"reduce_sum x0; div x0 t0", {{4, 40000}}, {4, 40000}, 1, {h}, f, 4},
      // rotary: rotate_half over heads of 64 (vectors stay on one side of D / 2), and of 4 (they would not).
      {"mul x0 x1; rotate_half x0; mul t1 x2; add t0 t2", {{2, 16, 64}, {16, 64}, {16, 64}}, {2, 16, 64}, 0,
       {h, h, h}, h, 8},
      {"mul x0 x1; rotate_half x0; mul t1 x2; add t0 t2", {{2, 16, 4}, {16, 4}, {16, 4}}, {2, 16, 4}, 0, {h, h, h},
       h, 2},
      // a quantized output (Note [Quantized output of a fused program]): the residual Add -> Relu -> Q of an int8
      // CNN, and a row program ending in uint8: vectors of bytes, as wide as the inputs' vectors.
      {"add x0 x1; relu t0; f16 t1", {{16, 28, 28, 512}, {16, 28, 28, 512}}, {16, 28, 28, 512}, 0, {h, h},
       DType::kInt8, 8},
      {"reduce_max x0; sub x0 t0; exp t1", {{30, 96}}, {30, 96}, 1, {f}, DType::kUInt8, 4},
      // float8: BERT's GELU -> Q in a float16 plan; an odd row ending in float8e5m2 (element by element).
      {"gelu x0; f16 t0", {{2048, 3072}}, {2048, 3072}, 0, {h}, DType::kFloat8E4M3FN, 8},
      {"reduce_max x0; sub x0 t0; exp t1", {{30, 7}}, {30, 7}, 1, {f}, DType::kFloat8E5M2, 1},
  };
}

TEST(Codegen, VectorWidthFollowsTheLayout) {
  for (const Case& c : cases()) {
    const fused::Program program = fused::parse(c.program, c.inputs.size());
    const fused::Layout layout = fused::layout(c.inputs, c.output, c.row_axes);
    EXPECT_EQ(fused::vector_width(program, layout, c.dtypes, c.out), c.vec) << c.program;
    const std::string source = fused::cuda_source(program, layout, c.dtypes, c.out, "k");
    EXPECT_EQ(source.find("vectors of") != std::string::npos, c.vec > 1) << source;
  }
}

TEST(Codegen, RowGroupsFitTheRows) {
  const DType h = DType::kFloat16;
  const fused::Program rms = fused::parse("mul x0 x0; reduce_mean t0; add t1 x1; sqrt t2; div x0 t3", 2);
  // Llama at batch 1: 128 rows of 1024, 128 vector steps each: a warp per row, one row per block (128 blocks).
  fused::LaunchShape shape = fused::launch_shape(rms, fused::layout({{128, 1024}, {}}, {128, 1024}, 1), {h, h}, h);
  EXPECT_EQ(shape.vec, 8);
  EXPECT_EQ(shape.row_threads, 32);
  EXPECT_EQ(shape.rows_per_block, 1);
  EXPECT_EQ(shape.threads, 32);
  // Many short rows (12 vector steps): 8 lanes a row, 32 rows a block.
  shape = fused::launch_shape(rms, fused::layout({{50176, 96}, {}}, {50176, 96}, 1), {h, h}, h);
  EXPECT_EQ(shape.row_threads, 8);
  EXPECT_EQ(shape.rows_per_block, 32);
  EXPECT_EQ(shape.threads, 256);
  // Few short rows: still whole warps.
  shape = fused::launch_shape(rms, fused::layout({{3, 16}, {}}, {3, 16}, 1), {h, h}, h);
  EXPECT_EQ(shape.row_threads, 4);
  EXPECT_EQ(shape.threads, 32);
  // Rows of 40000 float16: a block per row.
  shape = fused::launch_shape(rms, fused::layout({{4, 40000}, {}}, {4, 40000}, 1), {h, h}, h);
  EXPECT_EQ(shape.row_threads, shape.threads);
  EXPECT_GE(shape.threads, 256);
}

TEST(Codegen, NvrtcCompilesEveryVariant) {
  for (const Case& c : cases()) {
    const fused::Program program = fused::parse(c.program, c.inputs.size());
    const fused::Layout layout = fused::layout(c.inputs, c.output, c.row_axes);
    fused::OutputQuantization quantization;
    quantization.scale = 0.0173f;
    quantization.zero_point = c.out == DType::kInt8 ? -3 : (c.out == DType::kUInt8 ? 121 : 0);
    const std::string source = fused::cuda_source(program, layout, c.dtypes, c.out, "xrt_fused_test", quantization);
    if (fused::quantized_output(c.out)) {
      EXPECT_NE(source.find("st_" + std::string(dtype_name(c.out)) + "(float f)"), std::string::npos) << source;
      // integers: the zero point added; float8: the format's largest finite value, the saturation
      const std::string step = c.out == DType::kFloat8E4M3FN ? "448.0f"
                               : c.out == DType::kFloat8E5M2 ? "57344.0f"
                                                             : "rintf(s) + " + std::to_string(quantization.zero_point);
      EXPECT_NE(source.find(step), std::string::npos) << source;
    }
    try {
      EXPECT_FALSE(fused::compile_cubin(source, "xrt_fused_test", 90).empty());
      // float8 stores: one cvt instruction from sm_89 on, the integer conversion before
      if (is_float8_dtype(c.out)) {
        EXPECT_FALSE(fused::compile_cubin(source, "xrt_fused_test", 80).empty());
      }
    } catch (const UnsupportedOperationError& e) {
      const std::string what = e.what();
      if (what.find("could not be loaded") != std::string::npos || what.find("without the codegen") != std::string::npos) {
        GTEST_SKIP() << what;
      }
      ADD_FAILURE() << c.program << ": " << what << "\n" << source;
    }
  }
}

// Compiles a generated kernel's `source` for sm_90 with NVRTC, adding a failure (naming `label`) when it does not
// compile; returns why to skip instead when NVRTC cannot be loaded or the build has no codegen backend ("" otherwise).
std::string compiles_for_sm90(const std::string& source, const std::string& name, const std::string& label) {
  try {
    EXPECT_FALSE(fused::compile_cubin(source, name, 90).empty());
  } catch (const UnsupportedOperationError& e) {
    const std::string what = e.what();
    if (what.find("could not be loaded") != std::string::npos ||
        what.find("without the codegen") != std::string::npos) {
      return what;
    }
    ADD_FAILURE() << label << ": " << what << "\n" << source;
  }
  return "";
}

// Inputs read through views (Note [Inputs read through a view]): the source indexes the view's strides, vectors only
// where every vector of the view stays aligned (its rows a whole number of vectors apart), and NVRTC compiles it.
TEST(Codegen, ViewedInputsTakeVectorsWhereTheirRowsAlign) {
  const DType h = DType::kFloat16;
  struct ViewCase {
    std::string program;
    std::vector<std::vector<std::int64_t>> stored;
    std::string views;  // the input_views attribute, as ints separated by spaces
    std::vector<std::int64_t> output;
    int vec;
  };
  const std::vector<ViewCase> view_cases = {
      // Phi-3's k cut of a packed [2, 5, 3 * 4 * 8] projection as [B, S, H, D], rotated: vectors of D / 2.
      {"mul x0 x1; rotate_half x0; mul t1 x2; add t0 t2", {{2, 5, 96}, {5, 1, 8}, {5, 1, 8}},
       "0 4 32 2 5 4 8 480 96 8 1", {2, 5, 4, 8}, 4},
      // SwiGLU over the gate and up halves of one [7, 2 * 2816] projection.
      {"sigmoid x0; mul x0 t0; mul t1 x1", {{7, 5632}, {7, 5632}}, "0 2 0 7 2816 5632 1 1 2 2816 7 2816 5632 1",
       {7, 2816}, 8},
      // rows 10 elements apart: 16-byte vectors would not stay aligned, pairs do.
      {"neg x0", {{3, 10}}, "0 2 1 3 8 10 1", {3, 8}, 2},
      // a head transpose read in place: vectors along D.
      {"add x0 x1", {{2, 6, 4, 8}, {2, 4, 6, 8}}, "0 4 0 2 4 6 8 192 8 32 1", {2, 4, 6, 8}, 8},
  };
  for (const ViewCase& c : view_cases) {
    std::vector<std::int64_t> ints;
    std::stringstream words(c.views);
    for (std::int64_t v; words >> v;) ints.push_back(v);
    Attributes attrs;
    attrs.set("input_views", ints);
    const fused::InputViews views = fused::input_views(attrs, c.stored);
    const fused::Program program = fused::parse(c.program, c.stored.size());
    const fused::Layout layout = fused::layout(fused::read_shapes(views, c.stored), c.output, 0, views);
    const std::vector<DType> dtypes(c.stored.size(), h);
    EXPECT_EQ(fused::vector_width(program, layout, dtypes, h), c.vec) << c.program;
    const std::string source = fused::cuda_source(program, layout, dtypes, h, "xrt_fused_view_test");
    const std::string skip = compiles_for_sm90(source, "xrt_fused_view_test", c.program);
    if (!skip.empty()) GTEST_SKIP() << skip;
  }
}

// A malformed input_views attribute or a view past its tensor is a typed error, never a read out of bounds.
TEST(Codegen, MalformedInputViewsAreTypedErrors) {
  const std::vector<std::vector<std::int64_t>> stored = {{3, 10}, {8}};
  const std::vector<std::vector<std::int64_t>> bad = {
      {0, 2, 3, 3, 8, 10, 1},        // offset 3: the last row reaches element 3 + 20 + 7 = 30 of 30
      {0, 2, 0, 3, 8, 10},           // a stride missing
      {2, 1, 0, 8, 1},               // no input 2
      {0, 1, 0, 8, 1, 0, 1, 0, 8, 1},  // input 0 twice
      {1, 1, 0, 8, -1},              // a negative stride
      {0, 9, 0},                     // rank 9
      {0, 1, -1, 8, 1},              // a negative offset
      {0, 1, 0, 4, INT64_MAX},       // the extent overflows
  };
  for (const auto& ints : bad) {
    Attributes attrs;
    attrs.set("input_views", ints);
    EXPECT_THROW(fused::input_views(attrs, stored), InvalidArgumentError) << ::testing::PrintToString(ints);
  }
  Attributes good;
  good.set("input_views", std::vector<std::int64_t>{0, 2, 2, 3, 8, 10, 1});  // reaches element 2 + 20 + 7 = 29
  const fused::InputViews views = fused::input_views(good, stored);
  ASSERT_EQ(views.size(), 2u);
  EXPECT_TRUE(views[0] && !views[1]);
  EXPECT_EQ(fused::read_shapes(views, stored), (std::vector<std::vector<std::int64_t>>{{3, 8}, {8}}));
}

// Note [Pieces of a concatenation]: a pieced node's kernel compiles with NVRTC, vectors only as wide as every piece's
// slab allows (GPT-NeoX's rotated quarter and pass-through part of a head: [2, 4, 5, 16 | 48], 8 halves; a middle
// axis cut 3 + 5 of rows of 7: scalar), with broadcast inputs, views and a float32 piece beside float16 ones.
TEST(Codegen, PiecesCompileWithVectorsThatStayInsideTheirSlab) {
  const DType h = DType::kFloat16;
  struct PieceCase {
    std::string program;
    std::vector<std::int64_t> pieces;
    std::vector<std::vector<std::int64_t>> stored;
    std::vector<DType> dtypes;
    std::string views;
    std::vector<std::int64_t> output;
    int vec;
  };
  const std::vector<PieceCase> cases = {
      {"mul x0 x1; rotate_half x0; mul t1 x2; add t0 t2 | f32 x3", {3, 16, 48},
       {{2, 5, 768}, {1, 1, 5, 16}, {1, 1, 5, 16}, {2, 5, 768}}, {h, h, h, h},
       "0 4 0 2 4 5 16 3840 192 768 1 3 4 16 2 4 5 48 3840 192 768 1", {2, 4, 5, 64}, 8},
      {"sigmoid x0; mul x0 t0 | add x1 x2 | neg x2", {1, 3, 5, 1}, {{4, 3, 7}, {4, 5, 7}, {1, 1, 7}},
       {h, DType::kFloat32, h}, "", {4, 9, 7}, 1},
      {"f32 x0 | f32 x1", {0, 2, 6}, {{2, 16}, {6, 16}}, {h, h}, "", {8, 16}, 8},
  };
  for (const PieceCase& c : cases) {
    Attributes attrs;
    attrs.set("program", c.program);
    attrs.set("pieces", c.pieces);
    if (!c.views.empty()) {
      std::vector<std::int64_t> ints;
      std::stringstream words(c.views);
      for (std::int64_t v; words >> v;) ints.push_back(v);
      attrs.set("input_views", ints);
    }
    const fused::Pieces pieces = fused::pieces(attrs, c.stored.size());
    ASSERT_EQ(pieces.pieces.size(), c.pieces.size() - 1);
    EXPECT_EQ(pieces.text(), c.program);
    const fused::InputViews views = fused::input_views(attrs, c.stored);
    const auto shapes = fused::read_shapes(views, c.stored);
    EXPECT_EQ(fused::pieces_output_shape(pieces, shapes), c.output) << c.program;
    const std::vector<fused::Layout> layouts = fused::piece_layouts(pieces, shapes, views, c.output);
    EXPECT_EQ(fused::pieces_vector_width(pieces, layouts, c.dtypes, h, c.output), c.vec) << c.program;
    const std::string source = fused::cuda_source(pieces, layouts, c.dtypes, h, c.output, "xrt_fused_pieces_test");
    const std::string skip = compiles_for_sm90(source, "xrt_fused_pieces_test", c.program);
    if (!skip.empty()) GTEST_SKIP() << skip;
  }
}

// A malformed pieces attribute, or pieces whose shapes do not fit, is a typed error naming what is wrong.
TEST(Codegen, MalformedPiecesAreTypedErrors) {
  struct Bad {
    std::string program;
    std::vector<std::int64_t> pieces;
    std::string message;
  };
  const std::vector<Bad> bad = {
      {"neg x0 | neg x1", {1, 3}, "at least two pieces"},
      {"neg x0 | neg x1", {1, 3, 4, 5}, "3 pieces but 2 programs"},
      {"neg x0 | neg x1", {1, 3, 0}, "size 0"},
      {"neg x0 | neg x0", {1, 3, 4}, "input x1 is read by no piece"},
      {"neg x0 | bogus x1", {1, 3, 4}, "unknown op 'bogus'"},
      {"neg x0 | neg x2", {1, 3, 4}, "the node has 2 inputs"},
      {"neg x0 | neg x1", {9, 3, 4}, "axis 9"},
  };
  for (const Bad& b : bad) {
    Attributes attrs;
    attrs.set("program", b.program);
    attrs.set("pieces", b.pieces);
    try {
      fused::pieces(attrs, 2);
      ADD_FAILURE() << b.program << " " << ::testing::PrintToString(b.pieces) << " was accepted";
    } catch (const InvalidArgumentError& e) {
      EXPECT_NE(std::string(e.what()).find(b.message), std::string::npos) << e.what();
    }
  }
  Attributes reduces;
  reduces.set("program", std::string("neg x0 | neg x1"));
  reduces.set("pieces", std::vector<std::int64_t>{1, 3, 4});
  reduces.set("row_axes", std::int64_t{1});
  EXPECT_THROW(fused::pieces(reduces, 2), InvalidArgumentError);
  Attributes good;
  good.set("program", std::string("neg x0 | neg x1"));
  good.set("pieces", std::vector<std::int64_t>{1, 3, 4});
  const fused::Pieces pieces = fused::pieces(good, 2);
  // the pieces' other axes must agree: [2, 3, 5] beside [2, 4, 6] along axis 1
  EXPECT_THROW(fused::pieces_output_shape(pieces, {{2, 3, 5}, {2, 4, 6}}), InvalidArgumentError);
  EXPECT_THROW(fused::pieces_output_shape(pieces, {{2, 2, 5}, {2, 4, 5}}), InvalidArgumentError);  // 2 is not 3
  EXPECT_EQ(fused::pieces_output_shape(pieces, {{2, 3, 5}, {1, 4, 1}}), (std::vector<std::int64_t>{2, 7, 5}));
}

// The level a quantized output stores (Note [Quantized output of a fused program]): QuantizeLinear's, ties to even,
// saturated, NaN to the zero point; the attributes checked.
TEST(Codegen, QuantizedOutputLevelsAreQuantizeLinears) {
  fused::OutputQuantization q;
  q.scale = 0.5f;
  q.zero_point = 3;
  EXPECT_EQ(static_cast<std::int8_t>(fused::quantized_byte(1.25f, q, DType::kInt8)), 5);   // 2.5 -> 2 (even) + 3
  EXPECT_EQ(static_cast<std::int8_t>(fused::quantized_byte(1.75f, q, DType::kInt8)), 7);   // 3.5 -> 4 + 3
  EXPECT_EQ(static_cast<std::int8_t>(fused::quantized_byte(-0.25f, q, DType::kInt8)), 3);  // -0.5 -> -0 + 3
  EXPECT_EQ(static_cast<std::int8_t>(fused::quantized_byte(1e9f, q, DType::kInt8)), 127);
  EXPECT_EQ(static_cast<std::int8_t>(fused::quantized_byte(-1e9f, q, DType::kInt8)), -128);
  EXPECT_EQ(fused::quantized_byte(-1e9f, q, DType::kUInt8), 0);
  EXPECT_EQ(fused::quantized_byte(NAN, q, DType::kUInt8), 3);
  // float8 (zero point 0): v / y_scale rounded to nearest even, saturated, NaN keeping its sign.
  q.zero_point = 0;
  EXPECT_EQ(fused::quantized_byte(0.5f, q, DType::kFloat8E4M3FN), 0x38);         // 1.0
  EXPECT_EQ(fused::quantized_byte(1e9f, q, DType::kFloat8E4M3FN), 0x7E);         // saturated: 448
  EXPECT_EQ(fused::quantized_byte(-INFINITY, q, DType::kFloat8E5M2), 0xFB);      // -57344
  EXPECT_EQ(fused::quantized_byte(-NAN, q, DType::kFloat8E4M3FN), 0xFF);
  EXPECT_EQ(fused::quantized_byte(0.5f * 1.0625f, q, DType::kFloat8E4M3FN), 0x38);  // 1.0625: a tie, to 1.0
  Attributes attrs;
  attrs.set("y_scale", 0.25).set("y_zero_point", std::int64_t{-5});
  EXPECT_EQ(fused::output_quantization(attrs, DType::kInt8).scale, 0.25f);
  EXPECT_EQ(fused::output_quantization(attrs, DType::kInt8).zero_point, -5);
  EXPECT_THROW(fused::output_quantization(attrs, DType::kUInt8), InvalidArgumentError);  // -5 is not a uint8
  EXPECT_THROW(fused::output_quantization(attrs, DType::kFloat8E4M3FN), InvalidArgumentError);  // float8: 0 only
  attrs.set("y_zero_point", std::int64_t{0});
  EXPECT_EQ(fused::output_quantization(attrs, DType::kFloat8E5M2).zero_point, 0);
  attrs.set("y_scale", 0.0);
  EXPECT_THROW(fused::output_quantization(attrs, DType::kInt8), InvalidArgumentError);
  attrs.set("y_scale", 1e300);  // infinite in float32
  EXPECT_THROW(fused::output_quantization(attrs, DType::kInt8), InvalidArgumentError);
}

}  // namespace
}  // namespace xpuruntime
