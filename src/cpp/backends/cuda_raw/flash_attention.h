// flash_v2: the cuda_raw backend's flash-attention forward kernel; registered by register_cuda_raw.
#pragma once

#include "xpuruntime/kernel_registry.h"

namespace xpuruntime { void register_flash_attention(KernelRegistry& registry); }
