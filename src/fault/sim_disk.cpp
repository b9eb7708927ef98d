// The simulated disk of `foreman chaos --disk sim` (sim_disk.hpp).
#include "fault/sim_disk.hpp"

#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace foreman::internal {
namespace {

constexpr char kLockName[] = ".foreman.lock";

std::string Basename(const std::string& path) {
  const std::size_t slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

// The harness's record of fired faults is written by whoever fires, lock or
// not (a fault may fire as the job ends): not the job's file.
bool ExemptFromLockRule(const std::string& path) {
  const std::string name = Basename(path);
  return name == kLockName || absl::StartsWith(name, "fault_record.json");
}

}  // namespace

SimDisk::SimDisk(MemEnv* disk, std::string root, Env* outside)
    : EnvWrapper(disk), disk_(disk), root_(std::move(root)), outside_(outside) {
  while (root_.size() > 1 && root_.back() == '/') root_.pop_back();
  disk_->RecursivelyCreateDir(root_).IgnoreError();  // a fresh MemEnv: cannot fail
  // Every ancestor's entry made durable, as a directory made long ago is.
  for (std::string dir = root_; !dir.empty();) {
    disk_->SyncDir(dir).IgnoreError();
    const std::size_t slash = dir.rfind('/');
    if (slash == std::string::npos || dir == "/") break;
    dir = slash == 0 ? "/" : dir.substr(0, slash);
  }
}

bool SimDisk::Inside(const std::string& path) const {
  return path == root_ || (absl::StartsWith(path, root_) && path.size() > root_.size() && path[root_.size()] == '/');
}

std::vector<std::string> SimDisk::TakeLockViolations() {
  MutexLock l(mu_);
  return std::exchange(violations_, {});
}

Status SimDisk::Writable(const char* op, const std::string& path) const {
  if (Inside(path)) return absl::OkStatus();
  return absl::PermissionDeniedError(absl::StrCat(op, " ", path, ": outside the simulated disk ", root_));
}

void SimDisk::CheckLocked(const char* op, const std::string& path) {
  if (path == root_ || ExemptFromLockRule(path)) return;
  if (disk_->IsLocked(absl::StrCat(root_, "/", kLockName))) return;
  MutexLock l(mu_);
  violations_.push_back(absl::StrCat(op, " ", path.substr(root_.size() + 1), " while the directory's lock was not held"));
}

StatusOr<std::string> SimDisk::ReadFileToString(const std::string& path) { return For(path)->ReadFileToString(path); }

StatusOr<std::unique_ptr<RandomAccessFile>> SimDisk::NewRandomAccessFile(const std::string& path) {
  return For(path)->NewRandomAccessFile(path);
}

StatusOr<std::unique_ptr<WritableFile>> SimDisk::NewWritableFile(const std::string& path) {
  FOREMAN_RETURN_IF_ERROR(Writable("create", path));
  CheckLocked("create", path);
  return disk_->NewWritableFile(path);
}

StatusOr<std::unique_ptr<WritableFile>> SimDisk::NewAppendableFile(const std::string& path) {
  FOREMAN_RETURN_IF_ERROR(Writable("open for append", path));
  CheckLocked("open for append", path);
  return disk_->NewAppendableFile(path);
}

Status SimDisk::RenameFile(const std::string& from, const std::string& to) {
  FOREMAN_RETURN_IF_ERROR(Writable("rename", from));
  FOREMAN_RETURN_IF_ERROR(Writable("rename", to));
  CheckLocked("rename to", to);
  return disk_->RenameFile(from, to);
}

Status SimDisk::DeleteFile(const std::string& path) {
  FOREMAN_RETURN_IF_ERROR(Writable("delete", path));
  CheckLocked("delete", path);
  return disk_->DeleteFile(path);
}

Status SimDisk::FileExists(const std::string& path) { return For(path)->FileExists(path); }

StatusOr<uint64_t> SimDisk::GetFileSize(const std::string& path) { return For(path)->GetFileSize(path); }

StatusOr<std::vector<std::string>> SimDisk::GetChildren(const std::string& dir) { return For(dir)->GetChildren(dir); }

StatusOr<bool> SimDisk::IsDirectory(const std::string& path) { return For(path)->IsDirectory(path); }

Status SimDisk::CreateDir(const std::string& dir) {
  // The root's ancestors exist already: creating them is asking for them.
  if (!Inside(dir) && absl::StartsWith(root_, dir)) return absl::AlreadyExistsError(absl::StrCat(dir, " already exists"));
  FOREMAN_RETURN_IF_ERROR(Writable("mkdir", dir));
  return disk_->CreateDir(dir);
}

Status SimDisk::RecursivelyCreateDir(const std::string& dir) {
  if (!Inside(dir) && absl::StartsWith(root_, dir)) return absl::OkStatus();
  FOREMAN_RETURN_IF_ERROR(Writable("mkdir", dir));
  return disk_->RecursivelyCreateDir(dir);
}

Status SimDisk::DeleteDir(const std::string& dir) {
  FOREMAN_RETURN_IF_ERROR(Writable("rmdir", dir));
  if (dir == root_) return disk_->DeleteDir(dir);
  CheckLocked("rmdir", dir);
  return disk_->DeleteDir(dir);
}

Status SimDisk::SyncDir(const std::string& dir) {
  // An ancestor of the root is already durable (the constructor synced it).
  if (!Inside(dir) && absl::StartsWith(root_, dir)) return disk_->SyncDir(dir);
  FOREMAN_RETURN_IF_ERROR(Writable("fsync", dir));
  return disk_->SyncDir(dir);
}

StatusOr<std::unique_ptr<FileLock>> SimDisk::LockFile(const std::string& path) {
  FOREMAN_RETURN_IF_ERROR(Writable("lock", path));
  return disk_->LockFile(path);
}

namespace {

Status CopyTree(MemEnv* disk, const std::string& dir, Env* real) {
  FOREMAN_RETURN_IF_ERROR(real->RecursivelyCreateDir(dir));
  FOREMAN_ASSIGN_OR_RETURN(std::vector<std::string> names, disk->GetChildren(dir));
  for (const std::string& name : names) {
    const std::string path = JoinPath(dir, name);
    FOREMAN_ASSIGN_OR_RETURN(bool is_dir, disk->IsDirectory(path));
    if (is_dir) {
      FOREMAN_RETURN_IF_ERROR(CopyTree(disk, path, real));
      continue;
    }
    FOREMAN_ASSIGN_OR_RETURN(std::string bytes, disk->ReadFileToString(path));
    FOREMAN_RETURN_IF_ERROR(WriteStringToFile(real, path, bytes));
  }
  return absl::OkStatus();
}

}  // namespace

Status CopyOutOfDisk(MemEnv* disk, const std::string& root, Env* real) { return CopyTree(disk, root, real); }

}  // namespace foreman::internal
