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
/// LibforemanDirectory() (symbolic links and ".." resolved), and dlsym of
/// `entry`. Only when no such file is there (or dladdr cannot tell the
/// directory) is the loader's search path tried; a file there that is
/// damaged or cannot be loaded is an error, not a reason to load another.
/// A truncated ELF file (a loadable segment past its end) is refused before
/// dlopen(), which would die of SIGBUS on it. Returns the entry point, or
/// nullptr with `*error` set to what failed: the path and what is wrong
/// with it, dlerror()'s message, or the missing symbol. A handle that was
/// opened stays open (the module may be in use); on failure nothing of the
/// module ran but its static initialisers. `*path` (if not null) is the
/// file that was opened, else the one beside libforeman.
/// Thread-safe (dlerror() is per thread).
void* OpenModuleEntry(const std::string& file_name, const char* entry, std::string* path, std::string* error);

}  // namespace foreman::compute
