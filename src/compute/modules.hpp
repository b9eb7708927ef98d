// Loading libforeman's plug-in modules (the CPU kernels for an instruction
// set, cpu_kernels.hpp; the CUDA device, cuda_module.hpp): shared objects
// built and installed next to libforeman, dlopen()ed on first use, each
// exporting one entry point and nothing else (a version script).
#pragma once

#include <string>

namespace foreman::compute {

/// The directory libforeman was loaded from, with a trailing '/' ("" when
/// dladdr cannot tell).
std::string LibforemanDirectory();

/// dlopen(RTLD_NOW | RTLD_LOCAL) of `file_name` ("libforeman_cuda.so") from
/// LibforemanDirectory(), then by the loader's search path (a libforeman
/// whose directory dladdr does not report), and dlsym of `entry`. Returns
/// the entry point, or nullptr with `*error` set to what failed: the path
/// tried first and dlerror()'s message of each attempt, or the missing
/// symbol. A handle that was opened stays open (the module may be in use);
/// on failure nothing of the module ran but its static initialisers.
/// `*path` (if not null) is the file that was opened or tried first.
/// Thread-safe (dlerror() is per thread).
void* OpenModuleEntry(const std::string& file_name, const char* entry, std::string* path, std::string* error);

}  // namespace foreman::compute
