// TFRecord files: the framing of TensorBoard event files (and tf.data's
// TFRecordDataset). (TF: tensorflow/core/lib/io/record_writer.h.)
//
// Each record on disk:
//   uint64  length          little-endian
//   uint32  masked_crc32c(length's 8 bytes)
//   byte    data[length]
//   uint32  masked_crc32c(data)
// masked_crc32c is foreman::crc32c::Mask(Value(...)).
//
// Usage:
//   ```cpp
//   FOREMAN_ASSIGN_OR_RETURN(auto file, env->NewWritableFile("records.tfrecord"));
//   foreman::RecordWriter writer(file.get());
//   FOREMAN_RETURN_IF_ERROR(writer.WriteRecord("payload"));
//   FOREMAN_RETURN_IF_ERROR(file->Close());
//
//   FOREMAN_ASSIGN_OR_RETURN(auto reader, foreman::RecordReader::Open(env, "records.tfrecord"));
//   std::string record;
//   foreman::Status s;
//   while ((s = reader->ReadRecord(&record)).ok()) {
//     // ... use record ...
//   }
//   if (!absl::IsOutOfRange(s)) return s;   // OUT_OF_RANGE at the end
//   ```
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/strings/string_view.h"
#include "foreman/env.hpp"
#include "foreman/status.hpp"

namespace foreman {

inline constexpr std::size_t kRecordHeaderBytes = 8 + 4;  // length + its CRC
inline constexpr std::size_t kRecordFooterBytes = 4;      // data CRC

/// Appends records to a file it does not own. One thread at a time.
class RecordWriter {
 public:
  /// REQUIRES: `file` outlives the writer.
  explicit RecordWriter(WritableFile* file) : file_(file) {}

  /// Appends one framed record, in one WritableFile::Append (a failure
  /// leaves none of the record or a prefix of it, which the file's Size()
  /// tells). Errors are the file's.
  Status WriteRecord(absl::string_view data);
  /// Flush()/Sync() of the underlying file.
  Status Flush();
  Status Sync();

 private:
  WritableFile* file_;
  std::string framed_;  // the record being appended; reused
};

struct RecordReaderOptions {
  /// A last record cut short (its writer is still appending, or died mid-write)
  /// reads as a clean end (OUT_OF_RANGE) instead of DATA_LOSS; offset() stays
  /// at that record's start, so a later ReadRecord() retries it once the file
  /// has grown.
  bool allow_truncated_tail = false;
};

/// Reads records in order. One thread at a time.
class RecordReader {
 public:
  /// NOT_FOUND (and other Env errors) naming the path.
  static StatusOr<std::unique_ptr<RecordReader>> Open(Env* env, const std::string& path,
                                                      RecordReaderOptions options = {});

  /// Reads the next record into *record.
  ///   OK            a record; offset() moves past it.
  ///   OUT_OF_RANGE  clean end of file (or a cut tail with allow_truncated_tail).
  ///   DATA_LOSS     "<path>: corrupted record at offset <n>: <what>" for a CRC
  ///                 mismatch or a record cut short; offset() does not move.
  /// Fuzz builds (-Dfuzz=true) skip the CRC checks so inputs reach the parsers.
  Status ReadRecord(std::string* record);

  /// Byte offset of the next record.
  uint64_t offset() const { return offset_; }
  const std::string& path() const { return path_; }

 private:
  RecordReader(std::unique_ptr<RandomAccessFile> file, std::string path, RecordReaderOptions options)
      : file_(std::move(file)), path_(std::move(path)), options_(options) {}

  std::unique_ptr<RandomAccessFile> file_;
  std::string path_;
  RecordReaderOptions options_;
  uint64_t offset_ = 0;
};

}  // namespace foreman
