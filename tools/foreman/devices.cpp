// `foreman devices`: the CPU's kernel instruction set, and the CUDA devices
// this build can see.
#include <cstdio>
#include <string>

#include "command.hpp"
#include "foreman/compute.hpp"
#include "foreman/cuda.hpp"
#include "foreman/logging.hpp"

namespace foreman::cli {

void AddDevicesCommand(CLI::App& app, int* exit_code) {
  auto* cmd = app.add_subcommand("devices", "List the CPU's kernel instruction set and the CUDA devices");
  cmd->callback([exit_code] {
    StatusOr<std::string> isa = compute::CpuInstructionSet();
    if (!isa.ok()) {
      std::fprintf(stderr, "foreman devices: %s\n", EscapeForTerminal(isa.status().message()).c_str());
      *exit_code = kExitUsage;
      return;
    }
    std::printf("/cpu:0: %s kernels (FOREMAN_MAX_ISA=baseline|avx2|avx512 caps them)\n", isa->c_str());
    auto n = cuda::DeviceCount();
    if (!n.ok()) {
      std::printf("no CUDA devices: %s\n", EscapeForTerminal(n.status().message()).c_str());
      *exit_code = kExitOk;  // no GPU is a normal state, not a failure
      return;
    }
    std::printf("%d CUDA device(s)\n", *n);
    for (int i = 0; i < *n; ++i) {
      auto info = cuda::GetDeviceInfo(i);
      if (!info.ok()) {
        std::printf("  %d: %s\n", i, EscapeForTerminal(info.status().message()).c_str());
        *exit_code = kExitFailed;
        continue;
      }
      std::printf("  %d: %s, compute capability %d.%d, %llu MiB, %d SMs\n", i, info->name.c_str(),
                  info->compute_capability_major, info->compute_capability_minor,
                  static_cast<unsigned long long>(info->total_memory_bytes >> 20), info->multiprocessor_count);
    }
  });
}

}  // namespace foreman::cli
