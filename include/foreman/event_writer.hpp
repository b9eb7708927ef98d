// Event files for TensorBoard. (TF: tf.compat.v1.summary.FileWriter /
// EventFileWriter; C++ tensorflow::EventsWriter: the same file names,
// records and flushing rules.)
//
// File: <logdir>/events.out.tfevents.<10-digit seconds>.<hostname><suffix>,
// TFRecord-framed serialized Event protos. The first record is
// Event{wall_time, file_version: "brain.Event:2"}, flushed at creation.
//
// An existing file is never truncated: when the name for the clock's second
// is taken (another writer in the same logdir, same second, host and suffix),
// the next second's name is used (secs+1, secs+2, ..., up to 1000 tries, then
// ALREADY_EXISTS). The seconds field is then a unique creation stamp >= the
// real time, and names still sort in creation order. Within one process the
// check and the creation happen under one process-wide mutex, so writers in
// different threads never pick the same name; writers in different processes
// are not serialised (TF's names collide there too).
//
// This writer is synchronous (the summary_writer actor wraps it): events are
// queued in memory and written and flushed by the first Add* after Create
// (as TF: the first event flushes at once), then when max_queue events are
// pending or when flush_secs have passed since the last flush that wrote
// events (checked by every Add* and by FlushIfDue(), on the Clock), and on
// Flush() and Close().
//
// As TF: if the event file disappears while open, the next write of queued
// events notices, logs an error naming it, and moves on to a new file (named
// as above, but always later than the lost one, even in the same second; with
// its own file_version record): the queued events go there, those already in
// the lost file are gone. path() then names the new file.
//
// Not TF's: each record is one append, and a write that may have left part
// of a record at the end of the file (a short append, a failed flush) makes
// the next write move on to a new file the same way (an error logged naming
// both): the event that failed and the later ones go there, once each, and
// the events before it stay readable in the old file (whose cut last record
// a reader sees as its end). Appending after the partial record would leave
// the rest of the file unreadable.
//
//   ```cpp
//   FOREMAN_ASSIGN_OR_RETURN(auto writer, foreman::EventFileWriter::Create("train_dir"));
//   FOREMAN_RETURN_IF_ERROR(writer->AddSummary(foreman::ScalarSummary("loss", 0.3f), step));
//   FOREMAN_RETURN_IF_ERROR(writer->Close());
//   ```
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "foreman/clock.hpp"
#include "foreman/env.hpp"
#include "foreman/status.hpp"

namespace foreman {

/// TF's SessionLog.SessionStatus numbers (event.proto).
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
  /// Creates `logdir` if missing, opens a new event file and writes and
  /// flushes the file_version record. INVALID_ARGUMENT for bad options;
  /// Env errors naming the path.
  static StatusOr<std::unique_ptr<EventFileWriter>> Create(const std::string& logdir,
                                                           EventFileWriterOptions options = {});
  /// Closes (errors are logged, not returned: call Close() to see them).
  ~EventFileWriter();
  EventFileWriter(const EventFileWriter&) = delete;
  EventFileWriter& operator=(const EventFileWriter&) = delete;

  /// Queues an Event{wall_time=now, step, summary}. `serialized_summary` is a
  /// serialized Summary (see summary.hpp); INVALID_ARGUMENT if it does not
  /// parse. As TF: summary metadata is kept only on the first value seen
  /// for each tag in this file. After Close(): FAILED_PRECONDITION.
  Status AddSummary(absl::string_view serialized_summary, int64_t step);

  /// One summary for AddSummaries(): the bytes are not owned.
  struct SummaryAtStep {
    absl::string_view serialized_summary;
    int64_t step = 0;
  };
  /// AddSummary() for each of `summaries` in order, except that the write
  /// and flush that max_queue or flush_secs call for happen once, after the
  /// last one is queued: the same events, one write() for many. A summary
  /// that does not parse is skipped (the others are queued) and the result
  /// is INVALID_ARGUMENT naming the first one's index and how many more were
  /// skipped; otherwise the write's status. After Close():
  /// FAILED_PRECONDITION, nothing queued.
  Status AddSummaries(absl::Span<const SummaryAtStep> summaries);

  /// Queues an Event{wall_time=now, session_log{status, checkpoint_path, msg}},
  /// with `step` when given (TF's sessions: START carries the restored step,
  /// STOP none). INVALID_ARGUMENT for START or CHECKPOINT (written at the
  /// step saved) without a step.
  Status AddSessionLog(SessionLogStatus status, std::optional<int64_t> step,
                       const std::string& checkpoint_path = "", const std::string& msg = "");

  /// Queues an already serialized Event as is (its wall_time and step kept).
  /// INVALID_ARGUMENT if it does not parse.
  Status AddSerializedEvent(absl::string_view serialized_event);

  /// Writes and flushes the queue if it holds events and a flush is due (no
  /// event written since Create, or flush_secs passed since the last flush
  /// that wrote events); otherwise does nothing.
  Status FlushIfDue();
  /// Writes every queued event and flushes the file.
  Status Flush();
  /// Flush() then close the file; later calls return the first Close()'s status.
  Status Close();

  /// Full path of the current event file (a new one after the old one
  /// disappeared, see above).
  const std::string& path() const;
  /// Events written to the current file so far, the file_version record
  /// included.
  int64_t events_written() const;

 private:
  struct Impl;
  explicit EventFileWriter(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace foreman
