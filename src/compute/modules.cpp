// Loading libforeman's plug-in modules (modules.hpp).
#include "compute/modules.hpp"

#include <dlfcn.h>
#include <elf.h>
#include <fcntl.h>
#include <link.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"

namespace foreman::compute {

namespace {

// Reads exactly `n` bytes at `offset`; false on a short read or an error.
bool ReadAt(int fd, void* out, size_t n, off_t offset) {
  size_t done = 0;
  while (done < n) {
    const ssize_t r = pread(fd, static_cast<char*>(out) + done, n - done, offset + static_cast<off_t>(done));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    done += static_cast<size_t>(r);
  }
  return true;
}

// Whether `path` is a whole 64-bit ELF file: every PT_LOAD segment's bytes
// lie inside the file. glibc's dlopen() maps a truncated file's segments
// anyway and dies with SIGBUS when it touches a page past the end; this
// check turns that into an error. "" when whole, else what is wrong.
std::string CheckWholeElf(const std::string& path) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return "";  // dlopen() names the error
  struct Closer {
    int fd;
    ~Closer() { close(fd); }
  } closer{fd};
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) return "";  // a directory, a device: dlopen() refuses it
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  Elf64_Ehdr header;
  if (!ReadAt(fd, &header, sizeof header, 0) || std::memcmp(header.e_ident, ELFMAG, SELFMAG) != 0 ||
      header.e_ident[EI_CLASS] != ELFCLASS64) {
    return "";  // not a 64-bit ELF file: dlopen() says so without mapping it
  }
  if (header.e_phentsize != sizeof(Elf64_Phdr) || header.e_phnum == 0 || header.e_phoff > size ||
      header.e_phoff + uint64_t{header.e_phnum} * sizeof(Elf64_Phdr) > size) {
    return absl::StrCat("truncated or damaged: its program headers are not inside the file (", size, " bytes)");
  }
  std::vector<Elf64_Phdr> segments(header.e_phnum);
  if (!ReadAt(fd, segments.data(), segments.size() * sizeof(Elf64_Phdr), static_cast<off_t>(header.e_phoff))) {
    return "cannot read its program headers";
  }
  for (const Elf64_Phdr& s : segments) {
    if (s.p_type == PT_LOAD && (s.p_offset > size || s.p_filesz > size - s.p_offset)) {
      return absl::StrCat("truncated: a loadable segment ends at byte ", s.p_offset + s.p_filesz, ", the file has ",
                          size, " (reinstall it)");
    }
  }
  return "";
}

// The file a dlopen() handle came from, or `fallback`.
std::string LoadedPath(void* handle, const std::string& fallback) {
  link_map* map = nullptr;
  if (dlinfo(handle, RTLD_DI_LINKMAP, &map) == 0 && map != nullptr && map->l_name != nullptr && *map->l_name) {
    return map->l_name;
  }
  return fallback;
}

}  // namespace

std::string LibforemanDirectory() {
  Dl_info info;
  if (dladdr(reinterpret_cast<const void*>(&LibforemanDirectory), &info) == 0 || info.dli_fname == nullptr) {
    return "";
  }
  const std::string file = info.dli_fname;
  const std::size_t slash = file.rfind('/');
  if (slash == std::string::npos) return "";
  const std::string dir = file.substr(0, slash + 1);
  char resolved[PATH_MAX];
  if (realpath(dir.c_str(), resolved) == nullptr) return dir;  // "lib/../lib/" as the loader had it
  return absl::StrCat(resolved, "/");
}

void* OpenModuleEntry(const std::string& file_name, const char* entry, std::string* path, std::string* error) {
  const std::string directory = LibforemanDirectory();
  const std::string beside = directory + file_name;
  struct stat st;
  const bool beside_exists = !directory.empty() && stat(beside.c_str(), &st) == 0;
  void* handle = nullptr;
  std::string opened = beside;
  if (path != nullptr) *path = beside;
  if (beside_exists || (!directory.empty() && errno != ENOENT)) {
    // The module of this libforeman: a damaged one is an error, never a
    // reason to load another from the search path.
    if (std::string damaged = CheckWholeElf(beside); !damaged.empty()) {
      *error = absl::StrCat(beside, ": ", damaged);
      return nullptr;
    }
    handle = dlopen(beside.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr) {
      const char* why = dlerror();
      *error = why != nullptr ? why : absl::StrCat(beside, ": dlopen failed");
      return nullptr;
    }
  } else {
    // None beside libforeman (or its directory unknown): the loader's
    // search path, as for a libforeman copied without its modules.
    handle = dlopen(file_name.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr) {
      const char* why = dlerror();
      *error = absl::StrCat(directory.empty() ? "" : absl::StrCat(beside, " does not exist, and "),
                            why != nullptr ? why : "dlopen failed");
      return nullptr;
    }
    opened = LoadedPath(handle, file_name);
    if (path != nullptr) *path = opened;
  }
  void* symbol = dlsym(handle, entry);
  if (symbol == nullptr) {
    *error = absl::StrCat(opened, " has no entry point ", entry);
    return nullptr;  // the handle stays open: nothing in it ran
  }
  return symbol;
}

}  // namespace foreman::compute
