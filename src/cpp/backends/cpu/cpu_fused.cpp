// The cpu kernel of fused_elementwise: the program interpreted over chunks of the output (Note [Fused elementwise
// programs] in core/fused_elementwise.h), every instruction in float32.
#include <algorithm>
#include <vector>

#include "backends/cpu/cpu_common.h"
#include "core/fused_elementwise.h"
#include "core/half.h"
#include "xpuruntime/exceptions.h"
#include "xpuruntime/kernel_registry.h"

namespace xpuruntime::cpu {

namespace {

using fused::Instruction;
using fused::Layout;
using fused::Operand;
using fused::Program;

// Runs `program` for `layout`: inputs of `dtype` (float32, float16, bfloat16), output contiguous.
void evaluate(const Program& program, const Layout& layout, DType dtype, const std::vector<const void*>& inputs,
              void* output, int threads) {
  constexpr std::int64_t kChunk = 256;
  const std::size_t num_inputs = inputs.size();
  const std::size_t rank = layout.dims.size();
  auto read = [&](const void* base, std::int64_t offset) -> float {
    switch (dtype) {
      case DType::kFloat16: return detail::half_to_float(static_cast<const std::uint16_t*>(base)[offset]);
      case DType::kBFloat16: return detail::bfloat16_to_float(static_cast<const std::uint16_t*>(base)[offset]);
      default: return static_cast<const float*>(base)[offset];
    }
  };
  std::vector<char> full(num_inputs), scalar(num_inputs);
  for (std::size_t k = 0; k < num_inputs; ++k) {
    full[k] = layout.full(k);
    scalar[k] = layout.scalar(k);
  }
  const std::int64_t chunks = (layout.numel + kChunk - 1) / kChunk;
  parallel_for(chunks, threads, 16, [&](std::int64_t c0, std::int64_t c1) {
    std::vector<float> regs((num_inputs + program.code.size()) * kChunk);
    std::vector<std::int64_t> coord(rank);
    for (std::int64_t c = c0; c < c1; ++c) {
      const std::int64_t begin = c * kChunk;
      const std::int64_t n = std::min(kChunk, layout.numel - begin);
      for (std::size_t k = 0; k < num_inputs; ++k) {
        float* r = regs.data() + k * kChunk;
        if (scalar[k]) {
          std::fill(r, r + n, read(inputs[k], 0));
        } else if (full[k]) {
          for (std::int64_t i = 0; i < n; ++i) r[i] = read(inputs[k], begin + i);
        } else {
          for (std::int64_t i = 0; i < n; ++i) {
            std::int64_t rest = begin + i, offset = 0;
            for (std::size_t d = rank; d-- > 0;) {
              offset += (rest % layout.dims[d]) * layout.strides[k][d];
              rest /= layout.dims[d];
            }
            r[i] = read(inputs[k], offset);
          }
        }
      }
      for (std::size_t j = 0; j < program.code.size(); ++j) {
        const Instruction& in = program.code[j];
        auto at = [&](const Operand& o) {
          return regs.data() + (o.input ? static_cast<std::size_t>(o.index)
                                        : num_inputs + static_cast<std::size_t>(o.index)) * kChunk;
        };
        float* out = regs.data() + (num_inputs + j) * kChunk;
        const float* a = at(in.a);
        const float* b = fused::is_binary(in.code) ? at(in.b) : a;
        for (std::int64_t i = 0; i < n; ++i) out[i] = fused::apply(in.code, a[i], b[i]);
      }
      const float* result = regs.data() + (num_inputs + program.code.size() - 1) * kChunk;
      switch (dtype) {
        case DType::kFloat16: {
          auto* y = static_cast<std::uint16_t*>(output) + begin;
          for (std::int64_t i = 0; i < n; ++i) y[i] = detail::float_to_half(result[i]);
          break;
        }
        case DType::kBFloat16: {
          auto* y = static_cast<std::uint16_t*>(output) + begin;
          for (std::int64_t i = 0; i < n; ++i) y[i] = detail::float_to_bfloat16(result[i]);
          break;
        }
        default: std::copy(result, result + n, static_cast<float*>(output) + begin);
      }
    }
  });
}

}  // namespace

void register_fused_kernels(KernelRegistry& registry) {
  add_cpu_kernel(registry, "fused_elementwise",
                 "the program interpreted over 256-element chunks of the output, float32 math, OpenMP over chunks",
                 [](const KernelLaunch& launch, const CpuContext& context) {
                   const OpDescriptor& desc = *launch.desc;
                   const Program program = fused::parse(desc.attrs.get_string("program", ""), desc.inputs.size());
                   std::vector<std::vector<std::int64_t>> shapes;
                   std::vector<const void*> inputs;
                   for (std::size_t k = 0; k < launch.num_inputs; ++k) {
                     shapes.push_back(launch.input(k).shape());
                     inputs.push_back(launch.input(k).data_ptr());
                   }
                   const Layout layout = fused::layout(shapes, launch.output(0).shape());
                   evaluate(program, layout, desc.inputs[0].dtype, inputs, launch.output(0).data_ptr(),
                            context.threads);
                 });
}

}  // namespace xpuruntime::cpu
