// Shared helpers of the ONNX reference ops (see onnx_common.h).
#include "backends/cpu/onnx/onnx_common.h"

#include "core/data_ops.h"
#include "core/scalar.h"

namespace xpuruntime::onnx_ref {

std::int64_t numel_of(const std::vector<std::int64_t>& shape) {
  std::int64_t n = 1;
  for (std::int64_t d : shape) n *= d;
  return n;
}

std::vector<std::int64_t> broadcast_shapes(const std::vector<std::int64_t>& a, const std::vector<std::int64_t>& b,
                                           const std::string& where) {
  const std::size_t rank = std::max(a.size(), b.size());
  std::vector<std::int64_t> out(rank);
  for (std::size_t i = 0; i < rank; ++i) {
    const std::int64_t da = i < rank - a.size() ? 1 : a[i - (rank - a.size())];
    const std::int64_t db = i < rank - b.size() ? 1 : b[i - (rank - b.size())];
    XPURT_CHECK(da == db || da == 1 || db == 1, where, ": shapes cannot be broadcast together (dimension ", i,
                ": ", da, " vs ", db, ")");
    out[i] = da == 1 ? db : da;
  }
  return out;
}

std::vector<std::int64_t> broadcast_strides(const std::vector<std::int64_t>& shape,
                                            const std::vector<std::int64_t>& out) {
  return data_ops::broadcast_strides(shape, out);
}

std::int64_t normalize_axis(std::int64_t axis, std::int64_t rank, const std::string& where) {
  // A 0-d tensor has no axis: callers index the shape with the result (Split, ArgMax, CumSum, Compress and
  // MeanVarianceNormalization of a 0-d input read element 0 of an empty shape; found by the structural fuzzer).
  XPURT_CHECK(axis >= -rank && axis < rank, where, ": axis ", axis, " is out of range for rank ", rank,
              rank == 0 ? " (the input is 0-d: it has no axis)" : "");
  return axis < 0 ? axis + rank : axis;
}

namespace {

template <typename Ints>
Ints read_ints_as(const Tensor& t, const std::string& where) {
  Ints out(static_cast<std::size_t>(t.numel()));
  const Tensor c = t.device().is_cpu() ? t.contiguous() : t.to(Device::cpu()).contiguous();
  if (out.empty()) {
    // memcpy with an empty vector's null pointer is undefined even for 0 bytes (UBSan, scripts/sanitize.sh)
  } else if (c.dtype() == DType::kInt64) {
    std::memcpy(out.data(), c.data_ptr(), out.size() * sizeof(std::int64_t));
  } else if (c.dtype() == DType::kInt32) {
    const auto* p = static_cast<const std::int32_t*>(c.data_ptr());
    for (std::size_t i = 0; i < out.size(); ++i) out[i] = p[i];
  } else {
    throw InvalidTypeError(detail::str_cat(where, ": expected an int32 or int64 tensor, got ", dtype_name(c.dtype())));
  }
  return out;
}

}  // namespace

std::vector<std::int64_t> read_ints(const Tensor& t, const std::string& where) {
  return read_ints_as<std::vector<std::int64_t>>(t, where);
}

ScratchVector<std::int64_t> read_indices(const Tensor& t, const std::string& where) {
  return read_ints_as<ScratchVector<std::int64_t>>(t, where);
}

double read_scalar(const Tensor& t, const std::string& where) {
  return detail::scalar_as_double(t, where);  // Note [Scalars read from tensors]
}

}  // namespace xpuruntime::onnx_ref
