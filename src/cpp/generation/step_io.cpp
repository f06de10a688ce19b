// What a generation step feeds and reads (step_io.h).
#include "generation/step_io.h"

#include <algorithm>
#include <cstring>

#include "core/half.h"
#include "xpuruntime/exceptions.h"

namespace xpuruntime::generation::step_io {

Tensor host_matrix(const std::vector<std::vector<std::int64_t>>& rows, std::int64_t from, DType dtype) {
  const auto batch = static_cast<std::int64_t>(rows.size());
  const std::int64_t width = static_cast<std::int64_t>(rows.front().size()) - from;
  Tensor t = Tensor::empty({batch, width}, dtype);
  for (std::int64_t r = 0; r < batch; ++r) {
    for (std::int64_t j = 0; j < width; ++j) {
      const std::int64_t v = rows[static_cast<std::size_t>(r)][static_cast<std::size_t>(from + j)];
      if (dtype == DType::kInt64) {
        static_cast<std::int64_t*>(t.data_ptr())[r * width + j] = v;
      } else {
        static_cast<std::int32_t*>(t.data_ptr())[r * width + j] = static_cast<std::int32_t>(v);
      }
    }
  }
  return t;
}

std::vector<std::vector<std::int64_t>> positions_of(const std::vector<std::vector<std::int64_t>>& mask) {
  std::vector<std::vector<std::int64_t>> out(mask.size());
  for (std::size_t r = 0; r < mask.size(); ++r) {
    std::int64_t seen = 0;
    for (std::int64_t m : mask[r]) {
      seen += m;
      out[r].push_back(m != 0 ? seen - 1 : 1);
    }
  }
  return out;
}

std::vector<float> last_position_logits(const Tensor& logits, std::int64_t row, const std::string& name) {
  XPURT_CHECK_TYPE(logits.dim() == 3, "logits output '", name, "' should be [batch, seq, vocab], got ", logits.str());
  return position_logits(logits, row, logits.shape()[1] - 1, name);
}

std::vector<float> position_logits(const Tensor& logits, std::int64_t row, std::int64_t position,
                                   const std::string& name) {
  XPURT_CHECK_TYPE(logits.dim() == 3 && row < logits.shape()[0] && position >= 0 && position < logits.shape()[1],
                   "logits output '", name, "' should be [batch, seq, vocab] with a row ", row, " and a position ",
                   position, ", got ", logits.str());
  // Bound to the host by the callers, so this is no copy unless it is strided.
  const Tensor host = logits.device().is_cpu() ? logits.contiguous() : logits.to(Device::cpu()).contiguous();
  const std::int64_t seq = host.shape()[1];
  const std::int64_t vocab = host.shape()[2];
  const std::int64_t at = (row * seq + position) * vocab;
  std::vector<float> out(static_cast<std::size_t>(vocab));
  switch (host.dtype()) {
    case DType::kFloat32:
      std::memcpy(out.data(), static_cast<const float*>(host.data_ptr()) + at, out.size() * sizeof(float));
      break;
    case DType::kFloat16:
    case DType::kBFloat16: {
      const auto* bits = static_cast<const std::uint16_t*>(host.data_ptr()) + at;
      for (std::size_t i = 0; i < out.size(); ++i) {
        out[i] = host.dtype() == DType::kFloat16 ? detail::half_to_float(bits[i])
                                                 : detail::bfloat16_to_float(bits[i]);
      }
      break;
    }
    default:
      throw InvalidTypeError(detail::str_cat("logits output '", name, "' is ", dtype_name(host.dtype()),
                                                         "; expected float32, float16 or bfloat16"));
  }
  return out;
}

Tensor bound_output(const IoBinding& binding, const std::string& name) {
  const std::vector<std::string> names = binding.output_names();
  const auto it = std::find(names.begin(), names.end(), name);
  XPURT_INTERNAL_ASSERT(it != names.end(), "output '", name, "' was not bound");
  return binding.outputs()[static_cast<std::size_t>(it - names.begin())];
}

Tensor cache_branch(bool value) {
  Tensor branch = Tensor::empty({1}, DType::kBool);
  *static_cast<bool*>(branch.data_ptr()) = value;
  return branch;
}

}  // namespace xpuruntime::generation::step_io
