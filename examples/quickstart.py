"""xpuruntime quick start: devices, memory, zero-copy tensors, and what the allocator did.

    .venv/bin/python examples/quickstart.py
"""

import numpy as np

import xpuruntime as xrt


def main() -> None:
    print(f"xpuruntime {xrt.__version__}  build: {xrt.build_info()}")
    print("devices:", xrt.get_all_devices())
    if xrt.get_device_count() == 0:
        print("no CUDA device:", xrt.runtime.cuda_unavailable_reason())
    device = "cuda:0" if xrt.get_device_count() > 0 else "cpu"

    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    t = xrt.from_dlpack(a)  # zero-copy view of the numpy array
    print("imported:", t, "shares memory with numpy:", np.shares_memory(np.from_dlpack(t), a))
    on_device = t.to(device)
    print("on", device, ":", on_device, "->", on_device.to_numpy().sum())

    with xrt.runtime.allocate(1 << 20, device=device) as buffer:
        print("allocated:", buffer)
    stats = xrt.runtime.memory_stats(device)
    print(f"allocator on {device}: allocated {stats['allocated_bytes.current']} B, "
          f"peak {stats['allocated_bytes.peak']} B, reserved {stats['reserved_bytes.current']} B")


if __name__ == "__main__":
    main()
