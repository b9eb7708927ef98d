// Env::Default(): the POSIX file system.

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "foreman/env.hpp"
#include "foreman/mutex.hpp"
#include "platform/errno_status.hpp"

namespace foreman {

namespace {

// -- errors ----------------------------------------------------------------------

// glibc declares the GNU strerror_r (returns char*) under _GNU_SOURCE, which
// g++ defines, and the XSI one (returns int) otherwise; accept either.
[[maybe_unused]] const char* StrerrorResult(int rc, const char* buf) {
  return rc == 0 ? buf : "unknown error";
}
[[maybe_unused]] const char* StrerrorResult(const char* msg, const char*) { return msg; }

std::string ErrnoMessage(int err) {
  char buf[256] = {0};
  return StrerrorResult(strerror_r(err, buf, sizeof(buf)), buf);
}

}  // namespace

Status internal::ErrnoError(const std::string& context, int err) {
  std::string msg = absl::StrCat(context, ": ", ErrnoMessage(err));
  switch (err) {
    case ENOENT:
      return absl::NotFoundError(msg);
    case EEXIST:
      return absl::AlreadyExistsError(msg);
    case EACCES:
    case EPERM:
      return absl::PermissionDeniedError(msg);
    case ENOTEMPTY:
      return absl::FailedPreconditionError(msg);
    case ENOSPC:
      return absl::ResourceExhaustedError(msg);
    default:
      return absl::InternalError(msg);
  }
}

namespace {

using internal::ErrnoError;

/// Closes `fd`, ignoring EINTR (on Linux the descriptor is gone anyway).
Status CloseFd(int fd, const std::string& path) {
  if (close(fd) != 0 && errno != EINTR) return ErrnoError(absl::StrCat("close ", path), errno);
  return absl::OkStatus();
}

/// Writes all of `data` to `fd`, retrying on EINTR and short writes.
Status WriteAll(int fd, absl::string_view data, const std::string& path) {
  while (!data.empty()) {
    ssize_t n = write(fd, data.data(), data.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoError(absl::StrCat("write ", path), errno);
    }
    data.remove_prefix(static_cast<std::size_t>(n));
  }
  return absl::OkStatus();
}

StatusOr<int> OpenFd(const std::string& path, int flags) {
  int fd;
  do {
    fd = open(path.c_str(), flags | O_CLOEXEC, 0644);
  } while (fd < 0 && errno == EINTR);
  if (fd < 0) return ErrnoError(absl::StrCat("open ", path), errno);
  return fd;
}

StatusOr<struct stat> Stat(const std::string& path) {
  struct stat st;
  if (stat(path.c_str(), &st) != 0) return ErrnoError(absl::StrCat("stat ", path), errno);
  return st;
}

// -- files -----------------------------------------------------------------------

/// Buffers appends in user space and hands them to the OS in large writes.
class PosixWritableFile : public WritableFile {
 public:
  static constexpr std::size_t kBufferSize = 64 * 1024;

  PosixWritableFile(int fd, std::string path, uint64_t size)
      : fd_(fd), path_(std::move(path)), size_(size) {
    buffer_.reserve(kBufferSize);
  }

  ~PosixWritableFile() override { Close().IgnoreError(); }

  Status Append(absl::string_view data) override {
    FOREMAN_RETURN_IF_ERROR(CheckOpen());
    if (buffer_.size() + data.size() > kBufferSize) {
      FOREMAN_RETURN_IF_ERROR(Flush());
      if (data.size() >= kBufferSize) {  // Too big to buffer: write it through a bounce buffer.
        FOREMAN_RETURN_IF_ERROR(WriteThrough(data));
        size_ += data.size();
        return absl::OkStatus();
      }
    }
    buffer_.append(data.data(), data.size());
    size_ += data.size();
    return absl::OkStatus();
  }

  Status Flush() override {
    FOREMAN_RETURN_IF_ERROR(CheckOpen());
    Status s = WriteAll(fd_, buffer_, path_);
    buffer_.clear();
    return s;
  }

  Status Sync() override {
    FOREMAN_RETURN_IF_ERROR(Flush());
    if (fdatasync(fd_) != 0) return ErrnoError(absl::StrCat("fdatasync ", path_), errno);
    return absl::OkStatus();
  }

  Status Close() override {
    if (fd_ < 0) return absl::OkStatus();
    Status s = Flush();
    Status c = CloseFd(fd_, path_);
    fd_ = -1;
    bounce_.reset();
    return s.ok() ? c : s;
  }

  uint64_t Size() const override { return size_; }

 private:
  Status CheckOpen() const {
    if (fd_ < 0) return absl::FailedPreconditionError(absl::StrCat(path_, " is closed"));
    return absl::OkStatus();
  }

  /// Writes a large append in kBounceSize pieces copied into one buffer of
  /// our own. Handing the kernel a large caller buffer directly costs it a
  /// first access to every page of that buffer; on the VMs this runs on
  /// (shadow paging) that made a 100 MB checkpoint's write() calls take
  /// 0.16-0.5 s against dd's 0.01 s for the same bytes from a 1 MiB buffer.
  /// The copy into a hot 1 MiB buffer costs ~10 ms per 100 MB.
  Status WriteThrough(absl::string_view data) {
    if (bounce_ == nullptr) bounce_ = std::make_unique<char[]>(kBounceSize);
    while (!data.empty()) {
      const std::size_t n = std::min(data.size(), kBounceSize);
      std::memcpy(bounce_.get(), data.data(), n);
      FOREMAN_RETURN_IF_ERROR(WriteAll(fd_, absl::string_view(bounce_.get(), n), path_));
      data.remove_prefix(n);
    }
    return absl::OkStatus();
  }

  static constexpr std::size_t kBounceSize = 1 << 20;

  int fd_;
  std::string path_;
  uint64_t size_;
  std::string buffer_;
  std::unique_ptr<char[]> bounce_;  // allocated by the first large append
};

class PosixRandomAccessFile : public RandomAccessFile {
 public:
  PosixRandomAccessFile(int fd, std::string path) : fd_(fd), path_(std::move(path)) {}

  ~PosixRandomAccessFile() override { CloseFd(fd_, path_).IgnoreError(); }

  // The file may still be growing (an event file being written): reads and
  // Size() see its current length, not the length at open.
  StatusOr<absl::string_view> Read(uint64_t offset, std::size_t n, char* scratch) const override {
    std::size_t done = 0;
    while (done < n) {
      ssize_t r = pread(fd_, scratch + done, n - done, static_cast<off_t>(offset + done));
      if (r < 0) {
        if (errno == EINTR) continue;
        return ErrnoError(absl::StrCat("pread ", path_), errno);
      }
      if (r == 0) break;  // End of file.
      done += static_cast<std::size_t>(r);
    }
    if (done == 0 && n > 0 && offset > Size()) {
      return absl::OutOfRangeError(absl::StrCat("read ", path_, " at offset ", offset, " past its size ", Size()));
    }
    return absl::string_view(scratch, done);
  }

  uint64_t Size() const override {
    struct stat st;
    return fstat(fd_, &st) == 0 ? static_cast<uint64_t>(st.st_size) : 0;
  }

 private:
  int fd_;
  std::string path_;
};

// -- locks -----------------------------------------------------------------------

/// The paths locked by this process: fcntl locks are per process, so they
/// cannot tell two lock objects of one process apart.
///
/// Caveat of fcntl locks: closing *any* descriptor of the lock file in this
/// process releases the lock, so nothing else may open a lock file while it
/// is held. Linux's open-file-description locks (F_OFD_SETLK) lack that trap
/// but cannot report the holder's pid, which our error message names.
// The files this process holds locks on, by identity (device, inode), so
// that one file reached through two spellings ("d", "./d", a symlink) is one
// entry: an fcntl lock belongs to the process, and closing any descriptor of
// the file would drop it.
using FileId = std::pair<dev_t, ino_t>;
struct LockTable {
  Mutex mu;
  std::set<FileId> files ABSL_GUARDED_BY(mu);
};

LockTable& Locks() {
  static LockTable* table = new LockTable;
  return *table;
}

class PosixFileLock : public FileLock {
 public:
  PosixFileLock(int fd, std::string path, FileId id) : fd_(fd), path_(std::move(path)), id_(id) {}

  ~PosixFileLock() override {
    LockTable& locks = Locks();
    // Unlock before the file leaves the table, so that no other lock object
    // of this process can take the lock in between and lose it to our close.
    MutexLock l(locks.mu);
    CloseFd(fd_, path_).IgnoreError();  // Releases the fcntl lock.
    locks.files.erase(id_);
  }

 private:
  int fd_;
  std::string path_;
  FileId id_;
};

/// A write lock on the whole file.
struct flock WholeFileLock() {
  struct flock fl;
  std::memset(&fl, 0, sizeof(fl));
  fl.l_type = F_WRLCK;
  fl.l_whence = SEEK_SET;
  fl.l_start = 0;
  fl.l_len = 0;
  return fl;
}

/// FAILED_PRECONDITION naming the process that holds the lock on `fd`.
Status HeldByOther(int fd, const std::string& path) {
  struct flock fl = WholeFileLock();
  if (fcntl(fd, F_GETLK, &fl) == 0 && fl.l_type != F_UNLCK) {
    return absl::FailedPreconditionError(
        absl::StrCat("lock ", path, " is held by process ", static_cast<int64_t>(fl.l_pid)));
  }
  // Released between F_SETLK and F_GETLK: report it as held all the same.
  return absl::FailedPreconditionError(absl::StrCat("lock ", path, " is held by another process"));
}

/// Truncates the lock file `fd` and writes "<pid>\n" into it.
Status WritePid(int fd, const std::string& path) {
  if (ftruncate(fd, 0) != 0) return ErrnoError(absl::StrCat("ftruncate ", path), errno);
  return WriteAll(fd, absl::StrCat(static_cast<int64_t>(getpid()), "\n"), path);
}

// -- the env ---------------------------------------------------------------------

class PosixEnv : public Env {
 public:
  StatusOr<std::string> ReadFileToString(const std::string& path) override {
    FOREMAN_ASSIGN_OR_RETURN(int fd, OpenFd(path, O_RDONLY));
    std::string result;
    char buf[64 * 1024];
    while (true) {
      ssize_t n = read(fd, buf, sizeof(buf));
      if (n < 0) {
        if (errno == EINTR) continue;
        Status s = ErrnoError(absl::StrCat("read ", path), errno);
        CloseFd(fd, path).IgnoreError();
        return s;
      }
      if (n == 0) break;
      result.append(buf, static_cast<std::size_t>(n));
    }
    FOREMAN_RETURN_IF_ERROR(CloseFd(fd, path));
    return result;
  }

  StatusOr<std::unique_ptr<RandomAccessFile>> NewRandomAccessFile(const std::string& path) override {
    FOREMAN_ASSIGN_OR_RETURN(int fd, OpenFd(path, O_RDONLY));
    return std::unique_ptr<RandomAccessFile>(new PosixRandomAccessFile(fd, path));
  }

  StatusOr<std::unique_ptr<WritableFile>> NewWritableFile(const std::string& path) override {
    FOREMAN_ASSIGN_OR_RETURN(int fd, OpenFd(path, O_WRONLY | O_CREAT | O_TRUNC));
    return std::unique_ptr<WritableFile>(new PosixWritableFile(fd, path, 0));
  }

  StatusOr<std::unique_ptr<WritableFile>> NewAppendableFile(const std::string& path) override {
    FOREMAN_ASSIGN_OR_RETURN(int fd, OpenFd(path, O_WRONLY | O_CREAT | O_APPEND));
    struct stat st;
    if (fstat(fd, &st) != 0) {
      Status s = ErrnoError(absl::StrCat("fstat ", path), errno);
      CloseFd(fd, path).IgnoreError();
      return s;
    }
    return std::unique_ptr<WritableFile>(
        new PosixWritableFile(fd, path, static_cast<uint64_t>(st.st_size)));
  }

  Status RenameFile(const std::string& from, const std::string& to) override {
    if (rename(from.c_str(), to.c_str()) != 0) {
      return ErrnoError(absl::StrCat("rename ", from, " to ", to), errno);
    }
    return absl::OkStatus();
  }

  Status DeleteFile(const std::string& path) override {
    if (unlink(path.c_str()) != 0) return ErrnoError(absl::StrCat("unlink ", path), errno);
    return absl::OkStatus();
  }

  Status FileExists(const std::string& path) override { return Stat(path).status(); }

  StatusOr<uint64_t> GetFileSize(const std::string& path) override {
    FOREMAN_ASSIGN_OR_RETURN(struct stat st, Stat(path));
    if (S_ISDIR(st.st_mode)) {
      return absl::FailedPreconditionError(absl::StrCat(path, " is a directory"));
    }
    return static_cast<uint64_t>(st.st_size);
  }

  StatusOr<std::vector<std::string>> GetChildren(const std::string& dir) override {
    DIR* d = opendir(dir.c_str());
    if (d == nullptr) return ErrnoError(absl::StrCat("opendir ", dir), errno);
    std::vector<std::string> names;
    while (true) {
      errno = 0;
      struct dirent* entry = readdir(d);
      if (entry == nullptr) break;
      absl::string_view name = entry->d_name;
      if (name != "." && name != "..") names.emplace_back(name);
    }
    const int err = errno;
    closedir(d);
    if (err != 0) return ErrnoError(absl::StrCat("readdir ", dir), err);
    std::sort(names.begin(), names.end());
    return names;
  }

  StatusOr<bool> IsDirectory(const std::string& path) override {
    FOREMAN_ASSIGN_OR_RETURN(struct stat st, Stat(path));
    return S_ISDIR(st.st_mode);
  }

  Status CreateDir(const std::string& dir) override {
    if (mkdir(dir.c_str(), 0755) != 0) return ErrnoError(absl::StrCat("mkdir ", dir), errno);
    return absl::OkStatus();
  }

  Status RecursivelyCreateDir(const std::string& dir) override {
    // Walk up to the deepest existing ancestor, then create downwards.
    std::vector<std::string> missing;
    for (std::string p = dir;;) {
      struct stat st;
      if (stat(p.c_str(), &st) == 0) {
        if (!S_ISDIR(st.st_mode)) {
          return absl::FailedPreconditionError(absl::StrCat(p, " is not a directory"));
        }
        break;
      }
      // ENOTDIR: an ancestor is a file, which the walk up reports.
      if (errno != ENOENT && errno != ENOTDIR) return ErrnoError(absl::StrCat("stat ", p), errno);
      missing.push_back(p);
      std::string parent = Dirname(p);
      if (parent == p) break;
      p = std::move(parent);
    }
    for (auto it = missing.rbegin(); it != missing.rend(); ++it) {
      Status s = CreateDir(*it);
      // Someone else created it in the meantime, or "a/.." already existed.
      if (absl::IsAlreadyExists(s)) {
        FOREMAN_ASSIGN_OR_RETURN(bool is_dir, IsDirectory(*it));
        if (is_dir) s = absl::OkStatus();
      }
      FOREMAN_RETURN_IF_ERROR(s);
      FOREMAN_RETURN_IF_ERROR(SyncDir(Dirname(*it)));
    }
    return absl::OkStatus();
  }

  Status DeleteDir(const std::string& dir) override {
    if (rmdir(dir.c_str()) != 0) return ErrnoError(absl::StrCat("rmdir ", dir), errno);
    return absl::OkStatus();
  }

  Status SyncDir(const std::string& dir) override {
    FOREMAN_ASSIGN_OR_RETURN(int fd, OpenFd(dir, O_RDONLY | O_DIRECTORY));
    Status s;
    if (fsync(fd) != 0) s = ErrnoError(absl::StrCat("fsync ", dir), errno);
    Status c = CloseFd(fd, dir);
    return s.ok() ? c : s;
  }

  StatusOr<std::unique_ptr<FileLock>> LockFile(const std::string& path) override {
    LockTable& locks = Locks();
    MutexLock l(locks.mu);
    // Checked before opening: closing any descriptor of the file would drop
    // this process's fcntl lock on it. (A file that does not exist yet is
    // not locked by anyone.)
    const auto held_here = [&] {
      return absl::FailedPreconditionError(absl::StrCat(
          "lock ", path, " is held by this process (pid ", static_cast<int64_t>(getpid()), ")"));
    };
    struct stat before;
    if (stat(path.c_str(), &before) == 0 && locks.files.count(FileId{before.st_dev, before.st_ino}) != 0) {
      return held_here();
    }
    FOREMAN_ASSIGN_OR_RETURN(int fd, OpenFd(path, O_RDWR | O_CREAT));
    struct stat opened;
    if (fstat(fd, &opened) != 0) {
      Status s = ErrnoError(absl::StrCat("fstat ", path), errno);
      CloseFd(fd, path).IgnoreError();
      return s;
    }
    const FileId id{opened.st_dev, opened.st_ino};
    if (locks.files.count(id) != 0) {
      // Created or renamed into place between the two looks: the lock is
      // ours, and closing this descriptor would drop it. Keep the descriptor
      // open until the holder closes (leaked: a race that needs two spellings
      // of one path locked at the same instant).
      return held_here();
    }
    struct flock fl = WholeFileLock();
    Status s;
    if (fcntl(fd, F_SETLK, &fl) != 0) {
      s = (errno == EACCES || errno == EAGAIN) ? HeldByOther(fd, path)
                                               : ErrnoError(absl::StrCat("lock ", path), errno);
    } else if (struct stat now; stat(path.c_str(), &now) != 0 || now.st_dev != opened.st_dev ||
                                now.st_ino != opened.st_ino) {
      // The holder removed the file (a refused start cleaning up after
      // itself) between our open and our lock: this lock is on a file no
      // one else will open. Whoever holds the path now holds the lock.
      s = absl::FailedPreconditionError(
          absl::StrCat("lock ", path, " was removed by its holder while this process took it"));
    } else {
      s = WritePid(fd, path);
    }
    if (!s.ok()) {
      CloseFd(fd, path).IgnoreError();
      return s;
    }
    locks.files.insert(id);
    return std::unique_ptr<FileLock>(new PosixFileLock(fd, path, id));
  }
};

}  // namespace

Env* Env::Default() {
  static Env* env = new PosixEnv;
  return env;
}

}  // namespace foreman
