#pragma once
// DeviceOps on the CUDA runtime, for one device. Streams are cudaStreamNonBlocking, events are
// created with cudaEventDisableTiming, pinned memory comes from cudaHostAlloc. Every call sets
// the device first (the pager calls from its own threads, whose current device is unknown).

#include <memory>
#include <string>

#include "device_ops.h"

namespace jaxoff::aio {

// Creates the CUDA implementation for `device`; throws DeviceError (naming the runtime's
// error) when there is no usable device, e.g. no driver on a build machine.
std::unique_ptr<DeviceOps> MakeCudaDeviceOps(int device);

// Devices the runtime sees, or -1 with `why` set when it cannot (no driver, no device).
int CudaDeviceCount(std::string* why);

}  // namespace jaxoff::aio
