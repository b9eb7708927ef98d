// Env: every file operation Foreman makes goes through this interface, so a
// test can swap in the in-memory MemEnv (foreman/mem_env.hpp), whose crash
// loses exactly what a real crash loses. (TF: tensorflow::Env / FileSystem;
// LevelDB: leveldb::Env.) EnvWrapper, below, forwards every call to another
// Env, so a decorator (FaultyEnv in foreman/fault.hpp, a test's counting
// Env) overrides only the calls it changes (LevelDB keeps its EnvWrapper in
// env.h too).
//
// Durability model, the one the checkpoint commit protocol relies on:
//   - WritableFile::Sync() makes the bytes appended so far durable.
//   - A create, rename or delete is durable only once SyncDir() of the
//     directory that holds the name has run after it.
//   - WriteFileAtomic() below combines both: temp file, sync, rename, sync dir.
//
// Usage:
//   ```cpp
//   foreman::Env* env = foreman::Env::Default();
//   FOREMAN_RETURN_IF_ERROR(env->RecursivelyCreateDir("train_dir"));
//   FOREMAN_RETURN_IF_ERROR(foreman::WriteFileAtomic(env, "train_dir/checkpoint", text));
//   ```
//
// Paths are plain strings with '/' separators. Error codes: NOT_FOUND (missing
// file or directory), ALREADY_EXISTS, PERMISSION_DENIED, FAILED_PRECONDITION
// (a lock held by another owner; a directory that is not empty),
// RESOURCE_EXHAUSTED (ENOSPC: the disk is full), DATA_LOSS (short read), and
// INTERNAL for other OS errors (EIO, EROFS, ...); every message
// names the path. All Env methods are thread-safe; a file object is used by
// one thread at a time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "foreman/status.hpp"

namespace foreman {

/// A file opened for appending. Close() (or the destructor, which ignores
/// errors) releases it; data not Sync()ed may be lost in a crash.
class WritableFile {
 public:
  virtual ~WritableFile() = default;
  virtual Status Append(absl::string_view data) = 0;
  /// Hands buffered bytes to the OS (survives a process crash, not a power cut).
  virtual Status Flush() = 0;
  /// Makes every byte appended so far durable (fdatasync).
  virtual Status Sync() = 0;
  virtual Status Close() = 0;
  /// Bytes appended so far, including any the file held when opened.
  virtual uint64_t Size() const = 0;
};

/// A file opened for positional reads; thread-safe.
class RandomAccessFile {
 public:
  virtual ~RandomAccessFile() = default;
  /// Reads up to `n` bytes at `offset` into `scratch` and returns the bytes
  /// read (fewer at end of file; OUT_OF_RANGE when offset > size).
  virtual StatusOr<absl::string_view> Read(uint64_t offset, std::size_t n, char* scratch) const = 0;
  /// The file's current size: a file still being appended to by another
  /// writer grows, and later reads see the new bytes.
  virtual uint64_t Size() const = 0;
};

/// An advisory lock, released by its destructor (or when the process dies).
class FileLock {
 public:
  virtual ~FileLock() = default;
};

class Env {
 public:
  virtual ~Env() = default;

  /// The POSIX file system. Never deleted.
  static Env* Default();

  // -- reading ---------------------------------------------------------------

  /// The whole file. NOT_FOUND naming the path when it does not exist.
  virtual StatusOr<std::string> ReadFileToString(const std::string& path) = 0;
  virtual StatusOr<std::unique_ptr<RandomAccessFile>> NewRandomAccessFile(const std::string& path) = 0;

  // -- writing ---------------------------------------------------------------

  /// Creates or truncates `path`. NOT_FOUND when the directory is missing.
  virtual StatusOr<std::unique_ptr<WritableFile>> NewWritableFile(const std::string& path) = 0;
  /// Opens `path` for appending, creating it when missing.
  virtual StatusOr<std::unique_ptr<WritableFile>> NewAppendableFile(const std::string& path) = 0;

  // -- names -----------------------------------------------------------------

  /// Atomically replaces `to` with `from` (POSIX rename).
  virtual Status RenameFile(const std::string& from, const std::string& to) = 0;
  virtual Status DeleteFile(const std::string& path) = 0;
  /// OK when `path` exists (file or directory), NOT_FOUND otherwise.
  virtual Status FileExists(const std::string& path) = 0;
  virtual StatusOr<uint64_t> GetFileSize(const std::string& path) = 0;
  /// Names (not paths) of the entries of `dir`, sorted, without "." and "..".
  virtual StatusOr<std::vector<std::string>> GetChildren(const std::string& dir) = 0;
  virtual StatusOr<bool> IsDirectory(const std::string& path) = 0;

  // -- directories -----------------------------------------------------------

  /// ALREADY_EXISTS when present; NOT_FOUND when the parent is missing.
  virtual Status CreateDir(const std::string& dir) = 0;
  /// mkdir -p; OK when it already exists. Each created level is made durable
  /// by syncing its parent.
  virtual Status RecursivelyCreateDir(const std::string& dir) = 0;
  /// FAILED_PRECONDITION when not empty.
  virtual Status DeleteDir(const std::string& dir) = 0;
  /// Makes the creates, renames and deletes of names in `dir` durable.
  virtual Status SyncDir(const std::string& dir) = 0;

  // -- locks -----------------------------------------------------------------

  /// Takes an exclusive advisory lock on `path` (created if missing) and
  /// writes the holder's pid into it. FAILED_PRECONDITION naming the path and
  /// the holder's pid when another process, or another lock object in this
  /// process, holds it.
  virtual StatusOr<std::unique_ptr<FileLock>> LockFile(const std::string& path) = 0;
};

/// An Env that forwards every call to `base`. Subclass it and override the
/// calls you want to change; the others keep forwarding. Thread-safe as the
/// base is. Files it returns are the base's own.
class EnvWrapper : public Env {
 public:
  /// `base` is not owned and must outlive the wrapper and every file it
  /// returned. Must not be null.
  explicit EnvWrapper(Env* base) : base_(base) {}

  /// The Env calls forward to.
  Env* base() const { return base_; }

  StatusOr<std::string> ReadFileToString(const std::string& path) override;
  StatusOr<std::unique_ptr<RandomAccessFile>> NewRandomAccessFile(const std::string& path) override;
  StatusOr<std::unique_ptr<WritableFile>> NewWritableFile(const std::string& path) override;
  StatusOr<std::unique_ptr<WritableFile>> NewAppendableFile(const std::string& path) override;
  Status RenameFile(const std::string& from, const std::string& to) override;
  Status DeleteFile(const std::string& path) override;
  Status FileExists(const std::string& path) override;
  StatusOr<uint64_t> GetFileSize(const std::string& path) override;
  StatusOr<std::vector<std::string>> GetChildren(const std::string& dir) override;
  StatusOr<bool> IsDirectory(const std::string& path) override;
  Status CreateDir(const std::string& dir) override;
  Status RecursivelyCreateDir(const std::string& dir) override;
  Status DeleteDir(const std::string& dir) override;
  Status SyncDir(const std::string& dir) override;
  StatusOr<std::unique_ptr<FileLock>> LockFile(const std::string& path) override;

 private:
  Env* base_;
};

// -- helpers built on any Env ----------------------------------------------------

/// Writes `contents` to `path` so that a crash leaves either the old file or
/// the new one, never a mix: write to "<path>.tmp<unique>", Sync, Close,
/// RenameFile over `path`, SyncDir of its directory. On error the temporary
/// file is removed and `path` is untouched.
Status WriteFileAtomic(Env* env, const std::string& path, absl::string_view contents);

/// Writes `contents` to `path` (truncating), without syncing.
Status WriteStringToFile(Env* env, const std::string& path, absl::string_view contents);

/// "a/b" for ("a", "b"); handles a trailing '/' on `dir` and an empty `dir`.
std::string JoinPath(absl::string_view dir, absl::string_view name);
/// The directory part: "a/b" for "a/b/c", "." for "c", "/" for "/c".
std::string Dirname(absl::string_view path);
/// The last component: "c" for "a/b/c".
std::string Basename(absl::string_view path);
/// True for paths starting with '/'.
bool IsAbsolutePath(absl::string_view path);

}  // namespace foreman
