// Reading event files: for tests, `foreman events`, and anyone who wants the
// numbers back. Decodes what Foreman writes and what TensorFlow writes.
//
//   ```cpp
//   FOREMAN_ASSIGN_OR_RETURN(auto events, foreman::ReadEventFile(env, path));
//   for (const foreman::Event& e : events)
//     for (const foreman::SummaryValue& v : e.values)
//       if (v.kind == foreman::SummaryValue::Kind::kScalar)
//         std::printf("step %lld: %s = %g\n", static_cast<long long>(e.step), v.tag.c_str(), v.scalar);
//   ```
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "foreman/env.hpp"
#include "foreman/event_writer.hpp"
#include "foreman/record.hpp"
#include "foreman/status.hpp"

namespace foreman {

struct HistogramValue {
  double min = 0, max = 0, num = 0, sum = 0, sum_squares = 0;
  std::vector<double> bucket_limit;
  std::vector<double> bucket;
};

struct SummaryValue {
  enum class Kind { kScalar, kHistogram, kText, kTensor, kOther };
  std::string tag;
  Kind kind = Kind::kOther;
  std::string plugin_name;    // metadata.plugin_data.plugin_name, if any
  double scalar = 0;          // kScalar: simple_value; kTensor: a numeric scalar tensor's value
  HistogramValue histogram;   // kHistogram
  std::string text;           // kText: the string (first element of a string tensor)
};

struct Event {
  enum class Kind { kNone, kFileVersion, kSummary, kSessionLog, kLogMessage, kGraph, kOther };
  double wall_time = 0;       // seconds since the epoch
  int64_t step = 0;
  Kind kind = Kind::kNone;
  std::string file_version;   // kFileVersion
  std::vector<SummaryValue> values;   // kSummary
  SessionLogStatus session_status = SessionLogStatus::kUnspecified;  // kSessionLog
  std::string checkpoint_path;        // kSessionLog
  std::string message;                // kSessionLog msg, kLogMessage message
};

/// Parses one serialized Event. INVALID_ARGUMENT when it does not parse.
StatusOr<Event> ParseEvent(absl::string_view serialized);

/// Every event of one file, in order. Errors: the RecordReader's (DATA_LOSS
/// naming file and offset), INVALID_ARGUMENT "<path>: record at offset <n> is
/// not an Event". With allow_truncated_tail a cut last record is ignored.
StatusOr<std::vector<Event>> ReadEventFile(Env* env, const std::string& path,
                                           bool allow_truncated_tail = false);

/// ReadEventFile, keeping what was read before an error: appends every event
/// before the first bad record to *events (not cleared first) and returns
/// that record's error, OK at a clean end. TF's summary_iterator and
/// TensorBoard's loader do the same: the records before the damage, then
/// the error. `events` must not be null; one call per vector at a time.
Status ReadEventFileInto(Env* env, const std::string& path, std::vector<Event>* events,
                         bool allow_truncated_tail = false);

/// Paths of the event files in `logdir` (names containing "tfevents"),
/// sorted by name (= by creation time). NOT_FOUND for a missing directory.
StatusOr<std::vector<std::string>> ListEventFiles(Env* env, const std::string& logdir);

/// TensorBoard's purge of orphaned data (its event accumulator's
/// purge_orphaned_data, on by default): what a restarted run shows.
/// `events` are one run directory's events in the order TensorBoard reads
/// them (the files of ListEventFiles in order, each file's events in order);
/// a SessionLog START at step s discards every event before it whose step is
/// >= s (the events a restart from the checkpoint before s replays). The
/// START itself stays (a later START at a step <= its own discards it).
/// Returns the indices into `events` of the events that stay, ascending.
/// O(events) per START. Thread-safe (a pure function).
std::vector<std::size_t> EventsKeptAfterPurge(const std::vector<Event>& events);

}  // namespace foreman
