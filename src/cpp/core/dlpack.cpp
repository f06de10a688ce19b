#include "xpuruntime/dlpack.h"

#include <memory>
#include <vector>

#include "xpuruntime/device_manager.h"
#include "xpuruntime/exceptions.h"

namespace xpuruntime {

namespace {

DLDataType to_dl_dtype(DType dtype) {
  DLDataType t{};
  t.lanes = 1;
  t.bits = static_cast<std::uint8_t>(dtype_size(dtype) * 8);
  switch (dtype) {
    case DType::kFloat16:
    case DType::kFloat32:
    case DType::kFloat64:
      t.code = kDLFloat;
      break;
    case DType::kBFloat16:
      t.code = kDLBfloat;
      break;
    case DType::kInt8:
    case DType::kInt16:
    case DType::kInt32:
    case DType::kInt64:
      t.code = kDLInt;
      break;
    case DType::kUInt8:
    case DType::kUInt16:
    case DType::kUInt32:
    case DType::kUInt64:
      t.code = kDLUInt;
      break;
    case DType::kBool:
      t.code = kDLPackBoolCode;
      break;
    case DType::kFloat8E4M3FN:
    case DType::kFloat8E4M3FNUZ:
    case DType::kFloat8E5M2:
    case DType::kFloat8E5M2FNUZ:
    case DType::kInt4:
    case DType::kUInt4:
      throw InvalidTypeError(detail::str_cat("DLPack: ", dtype_name(dtype), " tensors are not exported (the "
                                             "DLPack version here has no code for them); t.view(\"uint8\") "
                                             "gives their bytes (Note [Float8 and 4-bit dtypes])"));
  }
  return t;
}

DType from_dl_dtype(DLDataType t) {
  XPURT_CHECK_TYPE(t.lanes == 1, "DLPack: vector dtypes (lanes=", t.lanes, ") are not supported");
  if (t.code == kDLFloat && t.bits == 16) return DType::kFloat16;
  if (t.code == kDLFloat && t.bits == 32) return DType::kFloat32;
  if (t.code == kDLFloat && t.bits == 64) return DType::kFloat64;
  if (t.code == kDLBfloat && t.bits == 16) return DType::kBFloat16;
  if (t.code == kDLInt && t.bits == 8) return DType::kInt8;
  if (t.code == kDLInt && t.bits == 16) return DType::kInt16;
  if (t.code == kDLInt && t.bits == 32) return DType::kInt32;
  if (t.code == kDLInt && t.bits == 64) return DType::kInt64;
  if (t.code == kDLUInt && t.bits == 8) return DType::kUInt8;
  if (t.code == kDLUInt && t.bits == 16) return DType::kUInt16;
  if (t.code == kDLUInt && t.bits == 32) return DType::kUInt32;
  if (t.code == kDLUInt && t.bits == 64) return DType::kUInt64;
  if (t.code == kDLPackBoolCode && t.bits == 8) return DType::kBool;
  throw InvalidTypeError(detail::str_cat("DLPack: unsupported dtype (code ", static_cast<int>(t.code), ", ",
                                         static_cast<int>(t.bits),
                                         " bits); xpuruntime handles float16/bfloat16/float32/float64, "
                                         "int8/int16/int32/int64, uint8/uint16/uint32/uint64 and bool"));
}

// What an exported managed tensor owns: the tensor (keeps storage alive) and the shape/stride arrays.
template <typename Managed>
struct ExportContext {
  Managed managed{};
  Tensor tensor;
  std::vector<std::int64_t> shape;
  std::vector<std::int64_t> strides;
};

template <typename Managed>
Managed* export_tensor(const Tensor& tensor) {
  XPURT_CHECK(tensor.defined(), "to_dlpack: the tensor is undefined");
  auto ctx = std::make_unique<ExportContext<Managed>>();
  ctx->tensor = tensor;
  ctx->shape = tensor.shape();
  ctx->strides = tensor.strides();
  DLTensor& dl = ctx->managed.dl_tensor;
  dl.data = tensor.data_ptr();
  dl.device = to_dlpack_device(tensor);
  dl.ndim = tensor.dim();
  dl.dtype = to_dl_dtype(tensor.dtype());
  dl.shape = ctx->shape.data();
  dl.strides = ctx->strides.data();
  dl.byte_offset = 0;
  ctx->managed.manager_ctx = ctx.get();
  ctx->managed.deleter = [](Managed* self) {
    if (self != nullptr) delete static_cast<ExportContext<Managed>*>(self->manager_ctx);
  };
  return &ctx.release()->managed;
}

Device import_device(DLDevice device) {
  switch (device.device_type) {
    case kDLCPU:
    case kDLCUDAHost:
      return Device::cpu();
    case kDLCUDA:
    case kDLCUDAManaged: {
      const Device d = Device::cuda(device.device_id);
      DeviceManager::instance().check_device(d);
      return d;
    }
    default:
      throw InvalidTypeError(detail::str_cat("DLPack: device type ", static_cast<int>(device.device_type),
                                             " is not supported; xpuruntime takes CPU, CUDA host and CUDA memory"));
  }
}

template <typename Managed>
Tensor import_tensor(Managed* managed) {
  XPURT_CHECK(managed != nullptr, "from_dlpack: got a null managed tensor");
  // From here on the deleter runs exactly once, whether the import succeeds or throws.
  std::shared_ptr<void> owner(managed, [](void* p) {
    auto* m = static_cast<Managed*>(p);
    if (m->deleter != nullptr) m->deleter(m);
  });
  const DLTensor& dl = managed->dl_tensor;
  const Device device = import_device(dl.device);
  const DType dtype = from_dl_dtype(dl.dtype);
  XPURT_CHECK(dl.ndim >= 0, "DLPack: negative ndim ", dl.ndim);
  std::vector<std::int64_t> shape(dl.shape, dl.shape + dl.ndim);
  std::vector<std::int64_t> strides;
  if (dl.strides != nullptr) strides.assign(dl.strides, dl.strides + dl.ndim);
  char* data = static_cast<char*>(dl.data) + dl.byte_offset;
  Tensor t = Tensor::from_blob(data, shape, strides, dtype, device, std::move(owner));
  t.storage()->pinned = dl.device.device_type == kDLCUDAHost;
  return t;
}

}  // namespace

DLDevice to_dlpack_device(const Tensor& tensor) {
  DLDevice d{};
  if (tensor.device().is_cuda()) {
    d.device_type = kDLCUDA;
    d.device_id = tensor.device().index;
  } else {
    // Pinned memory is ordinary host memory to consumers such as numpy, which only take kDLCPU.
    d.device_type = kDLCPU;
    d.device_id = 0;
  }
  return d;
}

DLManagedTensor* to_dlpack(const Tensor& tensor) { return export_tensor<DLManagedTensor>(tensor); }

DLManagedTensorVersionedV1* to_dlpack_versioned(const Tensor& tensor) {
  DLManagedTensorVersionedV1* m = export_tensor<DLManagedTensorVersionedV1>(tensor);
  m->version = {1, 0};
  m->flags = 0;
  return m;
}

Tensor from_dlpack(DLManagedTensor* managed) { return import_tensor(managed); }

Tensor from_dlpack_versioned(DLManagedTensorVersionedV1* managed) {
  XPURT_CHECK(managed != nullptr, "from_dlpack: got a null managed tensor");
  if (managed->version.major != 1) {
    const auto major = managed->version.major;
    if (managed->deleter != nullptr) managed->deleter(managed);
    throw InvalidTypeError(detail::str_cat("DLPack: the producer uses ABI major version ", major,
                                           "; xpuruntime understands version 1"));
  }
  return import_tensor(managed);
}

}  // namespace xpuruntime
