// MemEnv: a thread-safe in-memory Env that models crashes, for testing commit
// protocols. (The LevelDB/RocksDB fault-injection pattern:
// FaultInjectionTestEnv, DropUnsyncedFileData, SetFilesystemActive.)
//
// What a crash loses, as on a real file system after a power cut:
//   - every byte appended to a file after its last Sync();
//   - every create, rename and delete of a name (file or directory) unless
//     SyncDir() of its directory ran afterwards: a created file whose
//     directory was never synced vanishes, a renamed file reappears under its
//     old name, a deleted file comes back;
//   - locks (their holders are gone).
//
// Usage, crash after the k-th mutating operation:
//   ```cpp
//   foreman::MemEnv env;
//   FOREMAN_RETURN_IF_ERROR(env.RecursivelyCreateDir("/run"));
//   FOREMAN_RETURN_IF_ERROR(env.SyncDir("/"));
//   FOREMAN_RETURN_IF_ERROR(foreman::WriteFileAtomic(&env, "/run/checkpoint", "v1"));
//   env.SetCrashAfterOperations(3);           // op 4 and later fail UNAVAILABLE
//   foreman::Status s = foreman::WriteFileAtomic(&env, "/run/checkpoint", "v2");  // fails part-way
//   env.Crash();                              // drop what was not durable; resume
//   FOREMAN_ASSIGN_OR_RETURN(std::string text, env.ReadFileToString("/run/checkpoint"));  // "v1"
//   ```
#pragma once

#include <cstdint>
#include <limits>
#include <memory>
#include <string>

#include "foreman/env.hpp"

namespace foreman {

class MemEnv : public Env {
 public:
  MemEnv();
  ~MemEnv() override;
  MemEnv(const MemEnv&) = delete;
  MemEnv& operator=(const MemEnv&) = delete;

  // -- crash model -------------------------------------------------------------

  /// Simulates a power cut and a restart: drops unsynced data and
  /// undurable names as described above, releases every lock, makes open
  /// file objects fail (FAILED_PRECONDITION "file handle from before a
  /// crash"), and re-activates the file system.
  void Crash();

  /// While inactive every operation fails UNAVAILABLE "file system inactive
  /// (simulated crash)" and changes nothing.
  void SetFilesystemActive(bool active);

  /// After `n` more mutating operations succeed, the file system goes
  /// inactive. Mutating: NewWritableFile, NewAppendableFile, Append, Flush,
  /// Sync, Close, RenameFile, DeleteFile, CreateDir, DeleteDir, SyncDir,
  /// LockFile. Pass kNoCrash to disarm.
  static constexpr int64_t kNoCrash = std::numeric_limits<int64_t>::max();
  void SetCrashAfterOperations(int64_t n);

  /// Mutating operations that succeeded since construction.
  int64_t mutating_operations() const;
  /// Crash() calls since construction.
  int64_t crashes() const;
  /// A new MemEnv holding exactly what a Crash() now would leave (synced
  /// data, durable names; no locks), this one unchanged: what a checker
  /// reads to see whether something reported durable is. Costs a copy of
  /// every durable byte. Thread-safe.
  std::unique_ptr<MemEnv> DurableImage() const;
  /// Whether `path` (any spelling: "a/./b" is "a/b") is locked by a
  /// LockFile() whose lock is still held. Thread-safe.
  bool IsLocked(const std::string& path) const;

  // -- Env ---------------------------------------------------------------------

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

  /// Shared state; public only so that MemEnv's file objects can name it.
  struct State;

 private:
  std::shared_ptr<State> state_;
};

}  // namespace foreman
