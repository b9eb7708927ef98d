// Event files for TensorBoard. (TF: tf.compat.v1.summary.FileWriter /
// EventFileWriter; C++ tensorflow::EventsWriter; spec §14, B145-B154.)
//
// File: <logdir>/events.out.tfevents.<10-digit seconds>.<hostname><suffix>,
// TFRecord-framed serialized Event protos. The first record is
// Event{wall_time, file_version: "brain.Event:2"}, flushed at creation.
//
// This writer is synchronous (the summary_writer actor wraps it): events are
// queued in memory and written and flushed when max_queue events are pending,
// when flush_secs have passed since the last flush (checked by every Add* and
// by FlushIfDue(), on the Clock), on Flush() and on Close().
//
//   FOREMAN_ASSIGN_OR_RETURN(auto writer, foreman::EventFileWriter::Create("/tmp/run/train"));
//   FOREMAN_RETURN_IF_ERROR(writer->AddSummary(foreman::ScalarSummary("loss", 0.3f), step));
//   FOREMAN_RETURN_IF_ERROR(writer->Close());
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "absl/strings/string_view.h"
#include "foreman/clock.hpp"
#include "foreman/env.hpp"
#include "foreman/status.hpp"

namespace foreman {

/// TF's SessionLog.SessionStatus numbers (B153).
enum class SessionLogStatus : int { kUnspecified = 0, kStart = 1, kStop = 2, kCheckpoint = 3 };

struct EventFileWriterOptions {
  /// Events held before a write+flush (TF: max_queue). Must be >= 1.
  int max_queue = 10;
  /// Seconds between flushes (TF: flush_secs). Must be > 0.
  double flush_secs = 120;
  /// Appended to the file name (TF: filename_suffix), e.g. ".v2".
  std::string filename_suffix;
  /// Host name in the file name; empty means gethostname().
  std::string hostname;
  Env* env = Env::Default();
  Clock* clock = Clock::Real();
};

class EventFileWriter {
 public:
  /// Creates `logdir` if missing (B145), opens a new event file and writes and
  /// flushes the file_version record (B146). INVALID_ARGUMENT for bad options;
  /// Env errors naming the path.
  static StatusOr<std::unique_ptr<EventFileWriter>> Create(const std::string& logdir,
                                                           EventFileWriterOptions options = {});
  /// Closes (errors are logged, not returned: call Close() to see them).
  ~EventFileWriter();
  EventFileWriter(const EventFileWriter&) = delete;
  EventFileWriter& operator=(const EventFileWriter&) = delete;

  /// Queues an Event{wall_time=now, step, summary}. `serialized_summary` is a
  /// serialized Summary (see summary.hpp); INVALID_ARGUMENT if it does not
  /// parse. B150: summary metadata is kept only on the first value seen for
  /// each tag in this file. After Close(): FAILED_PRECONDITION.
  Status AddSummary(absl::string_view serialized_summary, int64_t step);

  /// Queues an Event{wall_time=now, session_log{status, checkpoint_path, msg}},
  /// with `step` when given (B154: START carries the restored step, STOP none).
  Status AddSessionLog(SessionLogStatus status, std::optional<int64_t> step,
                       const std::string& checkpoint_path = "", const std::string& msg = "");

  /// Queues an already serialized Event as is (its wall_time and step kept).
  /// INVALID_ARGUMENT if it does not parse.
  Status AddSerializedEvent(absl::string_view serialized_event);

  /// Writes and flushes the queue if flush_secs have passed since the last
  /// flush; otherwise does nothing.
  Status FlushIfDue();
  /// Writes every queued event and flushes the file (B149).
  Status Flush();
  /// Flush() then close the file; later calls return the first Close()'s status.
  Status Close();

  /// Full path of the event file.
  const std::string& path() const;
  /// Events written to the file so far, the file_version record included.
  int64_t events_written() const;

 private:
  struct Impl;
  explicit EventFileWriter(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace foreman
