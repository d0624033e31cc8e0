// What the CUDA runtime reports about the devices present (used by `cedar doctor`, tests' skip logic).
#pragma once

#include <string>
#include <vector>

#include "core/status.h"

namespace cedar::cuda {

struct DeviceInfo {
  int index = 0;
  std::string name;
  int cc_major = 0, cc_minor = 0;
  size_t total_memory_bytes = 0;
  int multiprocessors = 0;
};

struct RuntimeInfo {
  int driver_version = 0;   // e.g. 13000
  int runtime_version = 0;  // e.g. 13000
  std::vector<DeviceInfo> devices;
};

struct DeviceMemory {
  size_t free_bytes = 0, total_bytes = 0;
};

// Free / total memory of one device (creates its context).
Result<DeviceMemory> device_memory(int device);

// Never fails hard: with no driver or no GPU it returns an error naming why.
Result<RuntimeInfo> query_runtime();

}  // namespace cedar::cuda
