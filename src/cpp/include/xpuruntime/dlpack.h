// DLPack exchange for Tensor: zero-copy import from and export to numpy, torch, cupy and anything else that
// speaks DLPack. Both the legacy DLManagedTensor ("dltensor" capsules) and the versioned ABI 1.x
// DLManagedTensorVersioned ("dltensor_versioned") are supported.
//
// Ownership: to_dlpack*() returns a managed tensor the consumer owns (it must call its deleter once); it keeps
// the Tensor's storage alive. from_dlpack*() takes ownership of the managed tensor: its deleter runs when the
// last Tensor viewing it is gone (also when the import throws).
#pragma once

#include <dlpack/dlpack.h>

#include <cstdint>

#include "xpuruntime/export.h"
#include "xpuruntime/tensor.h"

namespace xpuruntime {

// The versioned DLPack ABI (DLPack >= 0.8, major version 1). Debian's dlpack.h (0.6) predates it, so the
// struct is declared here with the layout the DLPack specification fixes for major version 1.
struct DLPackVersionV1 {
  std::uint32_t major;
  std::uint32_t minor;
};
struct DLManagedTensorVersionedV1 {
  DLPackVersionV1 version;
  void* manager_ctx;
  void (*deleter)(DLManagedTensorVersionedV1* self);
  std::uint64_t flags;
  DLTensor dl_tensor;
};
inline constexpr std::uint64_t kDLPackFlagReadOnly = 1ULL << 0;
inline constexpr std::uint64_t kDLPackFlagIsCopied = 1ULL << 1;
inline constexpr std::uint8_t kDLPackBoolCode = 6;  // kDLBool, absent from DLPack 0.6

XPURT_API DLManagedTensor* to_dlpack(const Tensor& tensor);
XPURT_API DLManagedTensorVersionedV1* to_dlpack_versioned(const Tensor& tensor);
// Throws InvalidTypeError for dtypes/devices xpuruntime does not handle (the deleter still runs).
XPURT_API Tensor from_dlpack(DLManagedTensor* managed);
XPURT_API Tensor from_dlpack_versioned(DLManagedTensorVersionedV1* managed);

// DLPack device of a tensor: {kDLCPU | kDLCUDA | kDLCUDAHost, index}.
XPURT_API DLDevice to_dlpack_device(const Tensor& tensor);

}  // namespace xpuruntime
