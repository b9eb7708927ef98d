// EnvWrapper and the Env helpers that work on any Env: atomic writes and path
// arithmetic.

#include "foreman/env.hpp"

#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "platform/path.hpp"

namespace foreman {

namespace {

/// "<path>.tmp<pid>-<n>": unique within this process and, through the pid,
/// across processes writing into the same directory.
std::string TempPathFor(const std::string& path) {
  static std::atomic<uint64_t> counter{0};
  return absl::StrCat(path, ".tmp", static_cast<int64_t>(getpid()), "-", counter.fetch_add(1));
}

/// Writes `contents` to the temporary `tmp`, makes it durable and closes it.
Status WriteAndSync(Env* env, const std::string& tmp, absl::string_view contents) {
  FOREMAN_ASSIGN_OR_RETURN(std::unique_ptr<WritableFile> file, env->NewWritableFile(tmp));
  FOREMAN_RETURN_IF_ERROR(file->Append(contents));
  FOREMAN_RETURN_IF_ERROR(file->Sync());
  return file->Close();
}

}  // namespace

// -- EnvWrapper --------------------------------------------------------------------

StatusOr<std::string> EnvWrapper::ReadFileToString(const std::string& path) {
  return base_->ReadFileToString(path);
}
StatusOr<std::unique_ptr<RandomAccessFile>> EnvWrapper::NewRandomAccessFile(const std::string& path) {
  return base_->NewRandomAccessFile(path);
}
StatusOr<std::unique_ptr<WritableFile>> EnvWrapper::NewWritableFile(const std::string& path) {
  return base_->NewWritableFile(path);
}
StatusOr<std::unique_ptr<WritableFile>> EnvWrapper::NewAppendableFile(const std::string& path) {
  return base_->NewAppendableFile(path);
}
Status EnvWrapper::RenameFile(const std::string& from, const std::string& to) { return base_->RenameFile(from, to); }
Status EnvWrapper::DeleteFile(const std::string& path) { return base_->DeleteFile(path); }
Status EnvWrapper::FileExists(const std::string& path) { return base_->FileExists(path); }
StatusOr<uint64_t> EnvWrapper::GetFileSize(const std::string& path) { return base_->GetFileSize(path); }
StatusOr<std::vector<std::string>> EnvWrapper::GetChildren(const std::string& dir) {
  return base_->GetChildren(dir);
}
StatusOr<bool> EnvWrapper::IsDirectory(const std::string& path) { return base_->IsDirectory(path); }
Status EnvWrapper::CreateDir(const std::string& dir) { return base_->CreateDir(dir); }
Status EnvWrapper::RecursivelyCreateDir(const std::string& dir) { return base_->RecursivelyCreateDir(dir); }
Status EnvWrapper::DeleteDir(const std::string& dir) { return base_->DeleteDir(dir); }
Status EnvWrapper::SyncDir(const std::string& dir) { return base_->SyncDir(dir); }
StatusOr<std::unique_ptr<FileLock>> EnvWrapper::LockFile(const std::string& path) { return base_->LockFile(path); }

// -- atomic writes ---------------------------------------------------------------

Status WriteFileAtomic(Env* env, const std::string& path, absl::string_view contents) {
  const std::string tmp = TempPathFor(path);
  Status s = WriteAndSync(env, tmp, contents);
  if (s.ok()) s = env->RenameFile(tmp, path);
  if (!s.ok()) {
    env->DeleteFile(tmp).IgnoreError();  // Best effort; may not even exist.
    return s;
  }
  return env->SyncDir(Dirname(path));
}

Status WriteStringToFile(Env* env, const std::string& path, absl::string_view contents) {
  FOREMAN_ASSIGN_OR_RETURN(std::unique_ptr<WritableFile> file, env->NewWritableFile(path));
  FOREMAN_RETURN_IF_ERROR(file->Append(contents));
  return file->Close();
}

// -- paths -----------------------------------------------------------------------

std::string internal::NormalizeDirectory(absl::string_view dir) {
  while (dir.size() > 1 && dir.back() == '/') dir.remove_suffix(1);
  return std::string(dir);
}

std::string JoinPath(absl::string_view dir, absl::string_view name) {
  if (dir.empty()) return std::string(name);
  if (name.empty()) return std::string(dir);
  if (dir.back() == '/') return absl::StrCat(dir, name);
  return absl::StrCat(dir, "/", name);
}

std::string Dirname(absl::string_view path) {
  const std::string dir = internal::NormalizeDirectory(path);
  const std::size_t pos = dir.rfind('/');
  if (pos == std::string::npos) return ".";
  return internal::NormalizeDirectory(absl::string_view(dir).substr(0, pos == 0 ? 1 : pos));
}

std::string Basename(absl::string_view path) {
  const std::string dir = internal::NormalizeDirectory(path);
  if (dir == "/") return "/";
  const std::size_t pos = dir.rfind('/');
  return pos == std::string::npos ? dir : dir.substr(pos + 1);
}

bool IsAbsolutePath(absl::string_view path) { return !path.empty() && path.front() == '/'; }

}  // namespace foreman
