// Adapters that let LevelDB's table code (leveldb::Table, leveldb::TableBuilder)
// do its I/O through a foreman::Env file, so that a bundle's index is read and
// written through whatever Env the caller passed (MemEnv in tests).
//
// LevelDB's Status has no room for our codes, so each adapter keeps the first
// foreman::Status a call failed with; FromLevelDb() returns that one when LevelDB
// reports an error caused by it, and otherwise maps LevelDB's error (a corrupt
// table becomes DATA_LOSS naming the file).
#pragma once

#include <string>

#include <leveldb/env.h>
#include <leveldb/status.h>

#include "foreman/env.hpp"
#include "foreman/mutex.hpp"
#include "foreman/status.hpp"

namespace foreman::internal {

/// Remembers the first error seen by an adapter. Thread-safe.
class FirstError {
 public:
  /// Records `s` if it is the first error; returns it as a leveldb::Status.
  leveldb::Status Record(const Status& s);
  Status Get() const;

 private:
  mutable Mutex mu_;
  Status status_ ABSL_GUARDED_BY(mu_);
};

/// A leveldb::WritableFile writing into `file` (not owned).
class LevelDbWritableFile : public leveldb::WritableFile {
 public:
  explicit LevelDbWritableFile(foreman::WritableFile* file) : file_(file) {}

  leveldb::Status Append(const leveldb::Slice& data) override;
  leveldb::Status Close() override;
  leveldb::Status Flush() override;
  leveldb::Status Sync() override;

  /// The first error of `file`, or OK.
  Status error() const { return error_.Get(); }

 private:
  foreman::WritableFile* const file_;
  FirstError error_;
};

/// A leveldb::RandomAccessFile reading from `file` (not owned). Thread-safe.
class LevelDbRandomAccessFile : public leveldb::RandomAccessFile {
 public:
  explicit LevelDbRandomAccessFile(const foreman::RandomAccessFile* file) : file_(file) {}

  leveldb::Status Read(uint64_t offset, size_t n, leveldb::Slice* result, char* scratch) const override;

  /// The first error of `file`, or OK.
  Status error() const { return error_.Get(); }

 private:
  const foreman::RandomAccessFile* const file_;
  mutable FirstError error_;
};

/// The Status for a failed LevelDB call on `path`: `io_error` (annotated with
/// `path`) when the adapter saw one, else DATA_LOSS for corruption and
/// INTERNAL for the rest, naming `path`. OK stays OK. Read `io_error` (the
/// adapter's error()) only after the LevelDB call returned: not as another
/// argument of the same call, whose evaluation order is unspecified.
Status FromLevelDb(const leveldb::Status& s, const Status& io_error, const std::string& path);

}  // namespace foreman::internal
