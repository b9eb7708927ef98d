// Loading libforeman's plug-in modules (modules.hpp).
#include "compute/modules.hpp"

#include <dlfcn.h>

#include "absl/strings/str_cat.h"

namespace foreman::compute {

std::string LibforemanDirectory() {
  Dl_info info;
  if (dladdr(reinterpret_cast<const void*>(&LibforemanDirectory), &info) == 0 || info.dli_fname == nullptr) {
    return "";
  }
  const std::string file = info.dli_fname;
  const std::size_t slash = file.rfind('/');
  return slash == std::string::npos ? "" : file.substr(0, slash + 1);
}

void* OpenModuleEntry(const std::string& file_name, const char* entry, std::string* path, std::string* error) {
  const std::string beside = LibforemanDirectory() + file_name;
  if (path != nullptr) *path = beside;
  void* handle = dlopen(beside.c_str(), RTLD_NOW | RTLD_LOCAL);
  std::string opened = beside;
  if (handle == nullptr) {
    const char* first = dlerror();
    const std::string first_error = first != nullptr ? first : "dlopen failed";
    handle = dlopen(file_name.c_str(), RTLD_NOW | RTLD_LOCAL);  // the search path: a relocated libforeman
    if (handle == nullptr) {
      *error = first_error;
      return nullptr;
    }
    opened = file_name;
  }
  void* symbol = dlsym(handle, entry);
  if (symbol == nullptr) {
    *error = absl::StrCat(opened, " has no entry point ", entry);
    return nullptr;  // the handle stays open: nothing in it ran
  }
  return symbol;
}

}  // namespace foreman::compute
