// The `gpu` suite: runs a kernel on every visible device. Exits 77 (meson's
// "skipped") when there is no device, so it never fails a GPU-less CI.
#include <cstdio>

#include "foreman/cuda.hpp"

int main() {
  auto n = foreman::cuda::DeviceCount();
  if (!n.ok() || *n == 0) {
    std::printf("skipped: %s\n", n.ok() ? "no CUDA device" : std::string(n.status().message()).c_str());
    return 77;
  }
  int failures = 0;
  for (int i = 0; i < *n; ++i) {
    auto info = foreman::cuda::GetDeviceInfo(i);
    foreman::Status s = foreman::cuda::SelfTest(i);
    std::printf("device %d %s (sm_%d%d, %llu MiB): %s\n", i, info.ok() ? info->name.c_str() : "?",
                info.ok() ? info->compute_capability_major : 0, info.ok() ? info->compute_capability_minor : 0,
                info.ok() ? static_cast<unsigned long long>(info->total_memory_bytes >> 20) : 0ULL,
                s.ok() ? "ok" : std::string(s.message()).c_str());
    failures += s.ok() ? 0 : 1;
  }
  return failures == 0 ? 0 : 1;
}
