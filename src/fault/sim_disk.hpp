// The simulated disk of `foreman chaos --disk sim` (power loss): one run
// directory on a MemEnv, everything else read from the real file system.
// Internal (docs/fault-injection.md, "Power loss").
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "foreman/env.hpp"
#include "foreman/mem_env.hpp"
#include "foreman/mutex.hpp"

namespace foreman::internal {

/// An Env whose paths under `root` (the run directory, an absolute path
/// without a trailing '/') live on `disk`, a MemEnv (so FaultyEnv's crash
/// and torn-write faults reach it through base()), and whose other paths are
/// `outside`'s, read-only: a mutating call outside `root` is
/// PERMISSION_DENIED "<op> <path>: outside the simulated disk <root>", so a
/// simulated process never writes the real disk.
///
/// It also checks one rule of the run directory as the job runs: a file
/// under `root` is created, renamed or deleted only while
/// <root>/.foreman.lock is held (the lock, and the harness's own
/// fault_record.json, excepted). Each breach is kept (TakeLockViolations()).
///
/// And one rule of the summaries: after every successful Flush of an event
/// file ("events.out.tfevents" in its name) opened through
/// it, the file's bytes are whole TFRecord records by the oracle's own reader
/// (OracleCheckRecords); after a failed append the file may end in that cut
/// record, but nothing may be appended after it (the retry that once
/// rewrote a whole record after half of it). Each breach is kept
/// (TakeRecordViolations()). Thread-safe.
class SimDisk : public EnvWrapper {
 public:
  /// Creates `root` and its ancestors on `disk`, durably. Neither pointer
  /// is owned; both outlive this Env and its files.
  SimDisk(MemEnv* disk, std::string root, Env* outside);

  const std::string& root() const { return root_; }
  MemEnv* disk() const { return disk_; }
  /// Whether `path` is on the simulated disk.
  bool Inside(const std::string& path) const;
  /// The lock rule's breaches so far ("create <path relative to root> while
  /// the directory's lock was not held"), and forgets them.
  std::vector<std::string> TakeLockViolations();
  /// The summaries rule's breaches so far ("<path relative to root> after a
  /// flush: <what the oracle read>"), and forgets them.
  std::vector<std::string> TakeRecordViolations();
  // Called by the event files' wrappers (sim_disk.cpp): checks `path`'s
  // first `whole_bytes` bytes (all of them when -1) after `op`; records a
  // breach `what` as given when `what` is not empty.
  void CheckRecords(const char* op, const std::string& path, int64_t whole_bytes);
  void RecordBreach(const std::string& path, const std::string& what);

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
  Env* For(const std::string& path) const { return Inside(path) ? static_cast<Env*>(disk_) : outside_; }
  // OK inside; PERMISSION_DENIED outside.
  Status Writable(const char* op, const std::string& path) const;
  // Records a breach of the lock rule by `op` on `path` (inside).
  void CheckLocked(const char* op, const std::string& path);

  MemEnv* const disk_;
  std::string root_;  // set once, in the constructor
  Env* const outside_;
  Mutex mu_;
  std::vector<std::string> violations_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> record_violations_ ABSL_GUARDED_BY(mu_);
};

/// Copies every file and directory under `root` of `disk` to the same paths
/// on `real` (a failed seed's run directory, for a person to read). The
/// Env's error otherwise.
Status CopyOutOfDisk(MemEnv* disk, const std::string& root, Env* real);

}  // namespace foreman::internal
