// An asynchronous event-file writer for one logdir (TF: tf.summary.FileWriter,
// tf.compat.v1.summary.FileWriter): the writer that training sessions use for
// their summaries, on its own, for programs that write summaries themselves.
//
// It differs from EventFileWriter (event_writer.hpp), which it runs on, in
// where the work happens: EventFileWriter writes on the caller's thread and
// returns each write's Status; a FileWriter hands every event to a writer of
// its own running in the background (one per FileWriter) and returns at
// once, so the caller never waits for the disk except in Flush() and
// Close(), and a write error comes back from the next Flush() or Close().
// The file is the same: the same name, records, order and flushing rules
// (TF's max_queue 10 and flush_secs 120, on options.clock), and the events
// reach it in the order they were added, whichever thread added them.
//
//   ```cpp
//   #include "foreman/file_writer.hpp"
//   #include "foreman/summary.hpp"
//   FOREMAN_ASSIGN_OR_RETURN(auto writer, foreman::FileWriter::Create("train_dir"));
//   writer->AddSummary(foreman::ScalarSummary("loss", 0.3f), step);  // queued; returns at once
//   FOREMAN_RETURN_IF_ERROR(writer->Flush(absl::Seconds(10)));       // now in the file
//   FOREMAN_RETURN_IF_ERROR(writer->Close(absl::Seconds(10)));
//   ```
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "foreman/clock.hpp"
#include "foreman/env.hpp"
#include "foreman/event_writer.hpp"
#include "foreman/status.hpp"

namespace foreman {

struct FileWriterOptions {
  /// Every file operation of the writer (nullptr: Env::Default()). Not
  /// owned; must outlive the FileWriter.
  Env* env = Env::Default();
  /// The events' wall_time and the flush_secs decisions (nullptr:
  /// Clock::Real()). Not owned; must outlive the FileWriter. Flush() and Close() timeouts are real time.
  Clock* clock = Clock::Real();
};

class FileWriter {
 public:
  /// Creates `logdir` if missing and opens a new event file in it (its
  /// file_version record written and flushed before this returns), with a
  /// background writer for it. Errors: INVALID_ARGUMENT for an empty
  /// `logdir`; when the directory or the file cannot be made, the Env's error
  /// (its code, e.g. FAILED_PRECONDITION for a path through a regular file,
  /// PERMISSION_DENIED) with "FileWriter(<logdir>): " before its message.
  /// The caller owns the result.
  static StatusOr<std::unique_ptr<FileWriter>> Create(const std::string& logdir,
                                                      const FileWriterOptions& options = {});
  /// Close(absl::Seconds(60)) when nobody closed it; an error is logged.
  ~FileWriter();
  FileWriter(const FileWriter&) = delete;
  FileWriter& operator=(const FileWriter&) = delete;

  /// Queues Event{wall_time=now, step=global_step, summary} and returns at
  /// once (TF: add_summary). `serialized_summary` is a serialized Summary
  /// (summary.hpp); its bytes are copied. A summary that does not parse is
  /// skipped by the writer, which then reports INVALID_ARGUMENT from the
  /// next Flush() and Close(). After Close() the event is dropped (TF: a
  /// closed FileWriter's add_* do nothing). Thread-safe: events added from
  /// several threads reach the file in the order the calls happened.
  void AddSummary(absl::string_view serialized_summary, int64_t global_step);

  /// Queues Event{wall_time=now, session_log{status, checkpoint_path, msg}},
  /// with `step` when given, and returns at once (TF: add_session_log). As
  /// EventFileWriter::AddSessionLog, START and CHECKPOINT need a step (else
  /// INVALID_ARGUMENT from the next Flush()). Dropped after Close().
  /// Thread-safe, ordered with AddSummary.
  void AddSessionLog(SessionLogStatus status, std::optional<int64_t> step, const std::string& checkpoint_path = "",
                     const std::string& msg = "");

  /// Blocks until every event added before the call is written and the file
  /// flushed (TF: flush). Returns the writer's first error (sticky: every
  /// later Flush returns it too) once those events are handled;
  /// DEADLINE_EXCEEDED when `timeout` (real time) passes first (the events
  /// stay queued); UNAVAILABLE naming the logdir after Close(). Thread-safe.
  Status Flush(absl::Duration timeout);

  /// Flushes, closes the event file and stops the background writer (TF:
  /// close), bounded by `timeout` (real time; DEADLINE_EXCEEDED when the
  /// writer did not stop in time). Returns the writer's first error, else
  /// OK. Idempotent: later calls return the first call's result at once.
  /// Thread-safe; events added while it runs may be dropped.
  Status Close(absl::Duration timeout);

  /// The logdir as given to Create (TF: get_logdir).
  const std::string& logdir() const;

 private:
  struct Impl;
  explicit FileWriter(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace foreman
