// Choosing and loading the CPU kernels (cpu_kernels.hpp).
#include "compute/cpu_kernels.hpp"

#include <algorithm>
#include <array>
#include <cstdlib>
#include <mutex>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "compute/modules.hpp"
#include "platform/log.hpp"

namespace foreman::compute {

const CpuKernels* BaselineCpuKernels();  // cpu_kernels_baseline.cpp

namespace {

constexpr std::array<const char*, 3> kNames = {"baseline", "avx2", "avx512"};

const CpuKernels* LoadModule(CpuIsa isa) {
  const std::string name = absl::StrCat("libforeman_cpu_", kNames[static_cast<int>(isa)], ".so");
  const std::string symbol = absl::StrCat("foreman_cpu_kernels_", kNames[static_cast<int>(isa)]);
  std::string path, error;
  using Entry = const CpuKernels* (*)();
  auto entry = reinterpret_cast<Entry>(OpenModuleEntry(name, symbol.c_str(), &path, &error));
  if (entry == nullptr) {
    FOREMAN_LOG_WARN("CPU kernels: cannot load {} ({}); using slower kernels", name, error);
    return nullptr;
  }
  const CpuKernels* kernels = entry();
  if (kernels == nullptr || kernels->abi != kCpuKernelsAbi) {
    FOREMAN_LOG_WARN("CPU kernels: {} has no {} of ABI version {}; using slower kernels", path, symbol,
                     kCpuKernelsAbi);
    return nullptr;  // the handle stays open: nothing in it ran
  }
  return kernels;
}

}  // namespace

const char* CpuIsaName(CpuIsa isa) { return kNames[static_cast<int>(isa)]; }

CpuIsa DetectCpuIsa() {
  static const CpuIsa isa = [] {
#if !defined(__x86_64__)
    return CpuIsa::kBaseline;  // the modules are x86-64 only (src/meson.build)
#else
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
        __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
        __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
      return CpuIsa::kAvx512;
    }
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return CpuIsa::kAvx2;
    return CpuIsa::kBaseline;
#endif
  }();
  return isa;
}

StatusOr<CpuIsa> ParseCpuIsa(const char* value) {
  const std::string lower = absl::AsciiStrToLower(value == nullptr ? "" : value);
  for (std::size_t i = 0; i < kNames.size(); ++i) {
    if (lower == kNames[i]) return static_cast<CpuIsa>(i);
  }
  return absl::InvalidArgumentError(
      absl::StrCat("FOREMAN_MAX_ISA='", value == nullptr ? "" : value,
                   "' is not an instruction set: use baseline, avx2 or avx512 (or leave it unset)"));
}

StatusOr<CpuIsa> MaxCpuIsaFromEnv() {
  const char* value = std::getenv("FOREMAN_MAX_ISA");
  if (value == nullptr || *value == '\0') return CpuIsa::kAvx512;
  return ParseCpuIsa(value);
}

const CpuKernels* LoadCpuKernels(CpuIsa isa) {
  if (isa == CpuIsa::kBaseline) return BaselineCpuKernels();
  if (static_cast<int>(isa) > static_cast<int>(DetectCpuIsa())) return nullptr;
  static std::once_flag once[kNames.size()];
  static const CpuKernels* loaded[kNames.size()] = {};
  const int i = static_cast<int>(isa);
  std::call_once(once[i], [&] { loaded[i] = LoadModule(isa); });
  return loaded[i];
}

const CpuKernels* SelectCpuKernels(CpuIsa max_isa, CpuIsa* chosen) {
  for (int i = std::min(static_cast<int>(max_isa), static_cast<int>(DetectCpuIsa())); i > 0; --i) {
    if (const CpuKernels* k = LoadCpuKernels(static_cast<CpuIsa>(i)); k != nullptr) {
      *chosen = static_cast<CpuIsa>(i);
      return k;
    }
  }
  *chosen = CpuIsa::kBaseline;
  return BaselineCpuKernels();
}

StatusOr<std::string> CpuInstructionSet() {
  FOREMAN_ASSIGN_OR_RETURN(CpuIsa max, MaxCpuIsaFromEnv());
  CpuIsa chosen;
  SelectCpuKernels(max, &chosen);
  return std::string(CpuIsaName(chosen));
}

}  // namespace foreman::compute
