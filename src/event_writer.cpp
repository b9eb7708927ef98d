// EventFileWriter (include/foreman/event_writer.hpp). TF:
// tensorflow/python/summary/writer/event_file_writer.py (queue, flush
// schedule), writer.py (B150 metadata stripping) and
// tensorflow/core/util/events_writer.cc (file name, file_version record).
#include "foreman/event_writer.hpp"

#include <unistd.h>

#include <cmath>
#include <set>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "foreman/record.hpp"
#include "log.hpp"
#include "summary.pb.h"

namespace foreman {

namespace {

constexpr char kFileVersion[] = "brain.Event:2";

/// gethostname(), or "localhost" when it fails (TF's port::Hostname()).
std::string Hostname() {
  char name[256];
  if (gethostname(name, sizeof name) != 0) return "localhost";
  name[sizeof name - 1] = '\0';
  return name;
}

Status ValidateOptions(const EventFileWriterOptions& options) {
  if (options.max_queue < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("EventFileWriter: max_queue must be >= 1, got ", options.max_queue));
  }
  if (!(options.flush_secs > 0) || std::isinf(options.flush_secs)) {
    return absl::InvalidArgumentError(
        absl::StrCat("EventFileWriter: flush_secs must be a positive number, got ", options.flush_secs));
  }
  if (options.env == nullptr || options.clock == nullptr) {
    return absl::InvalidArgumentError("EventFileWriter: env and clock must be set");
  }
  return absl::OkStatus();
}

std::string Serialize(const proto::Event& event) {
  std::string out;
  event.SerializeToString(&out);
  return out;
}

}  // namespace

// -- Impl -------------------------------------------------------------------------

struct EventFileWriter::Impl {
  Impl(EventFileWriterOptions options_in, std::string path_in, std::unique_ptr<WritableFile> file_in)
      : options(std::move(options_in)),
        path(std::move(path_in)),
        file(std::move(file_in)),
        writer(file.get()) {}

  /// Queues one serialized event, then writes and flushes if the queue is
  /// full or a flush is due.
  Status Enqueue(std::string event) {
    queue.push_back(std::move(event));
    if (queue.size() >= static_cast<std::size_t>(options.max_queue)) return WriteQueue();
    return FlushIfDue();
  }

  Status FlushIfDue() {
    if (closed || options.clock->MonotonicNow() - last_flush < absl::Seconds(options.flush_secs)) {
      return absl::OkStatus();
    }
    return WriteQueue();
  }

  /// Writes every queued event and flushes the file. Events written before
  /// an error leave the queue; the rest stay.
  Status WriteQueue() {
    std::size_t written = 0;
    Status s;
    while (written < queue.size() && (s = writer.WriteRecord(queue[written])).ok()) ++written;
    queue.erase(queue.begin(), queue.begin() + static_cast<std::ptrdiff_t>(written));
    events_written += static_cast<int64_t>(written);
    if (s.ok()) s = writer.Flush();
    if (s.ok()) last_flush = options.clock->MonotonicNow();
    return s;
  }

  /// B150: metadata stays only on the first value of each tag in the file.
  /// (TF's writer.py only counts a tag once a value with metadata has come.)
  void StripRepeatedMetadata(proto::Summary* summary) {
    for (proto::Summary::Value& value : *summary->mutable_value()) {
      if (!tags_seen.insert(value.tag()).second) value.clear_metadata();
    }
  }

  Status CheckOpen() const {
    if (closed) return absl::FailedPreconditionError(absl::StrCat(path, ": EventFileWriter is closed"));
    return absl::OkStatus();
  }

  /// An Event with wall_time = now, as TF's EventsWriter computes it (whole
  /// microseconds / 1e6: correctly rounded, unlike Clock::WallSeconds()).
  proto::Event NewEvent() const {
    proto::Event event;
    event.set_wall_time(static_cast<double>(absl::ToUnixMicros(options.clock->WallNow())) / 1e6);
    return event;
  }

  const EventFileWriterOptions options;
  const std::string path;
  const std::unique_ptr<WritableFile> file;
  RecordWriter writer;
  std::vector<std::string> queue;  // serialized events not yet written
  std::set<std::string> tags_seen;
  absl::Duration last_flush;
  int64_t events_written = 0;
  bool closed = false;
  Status close_status;
};

// -- EventFileWriter ----------------------------------------------------------------

StatusOr<std::unique_ptr<EventFileWriter>> EventFileWriter::Create(const std::string& logdir,
                                                                   EventFileWriterOptions options) {
  FOREMAN_RETURN_IF_ERROR(ValidateOptions(options));
  FOREMAN_RETURN_IF_ERROR(options.env->RecursivelyCreateDir(logdir));
  const std::string path =
      JoinPath(logdir, absl::StrFormat("events.out.tfevents.%010d.%s%s", absl::ToUnixSeconds(options.clock->WallNow()),
                                       options.hostname.empty() ? Hostname() : options.hostname,
                                       options.filename_suffix));
  FOREMAN_ASSIGN_OR_RETURN(std::unique_ptr<WritableFile> file, options.env->NewWritableFile(path));
  auto impl = std::make_unique<Impl>(std::move(options), path, std::move(file));

  proto::Event event = impl->NewEvent();
  event.set_file_version(kFileVersion);
  impl->queue.push_back(Serialize(event));
  FOREMAN_RETURN_IF_ERROR(impl->WriteQueue());
  return std::unique_ptr<EventFileWriter>(new EventFileWriter(std::move(impl)));
}

EventFileWriter::EventFileWriter(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

EventFileWriter::~EventFileWriter() {
  if (impl_->closed) return;
  Status s = Close();
  if (!s.ok()) FOREMAN_LOG_ERROR("Closing event file {} failed: {}", impl_->path, s.ToString());
}

Status EventFileWriter::AddSummary(absl::string_view serialized_summary, int64_t step) {
  FOREMAN_RETURN_IF_ERROR(impl_->CheckOpen());
  proto::Event event = impl_->NewEvent();
  event.set_step(step);
  if (!event.mutable_summary()->ParseFromArray(serialized_summary.data(),
                                               static_cast<int>(serialized_summary.size()))) {
    return absl::InvalidArgumentError(absl::StrCat(impl_->path, ": AddSummary: not a serialized Summary"));
  }
  impl_->StripRepeatedMetadata(event.mutable_summary());
  return impl_->Enqueue(Serialize(event));
}

Status EventFileWriter::AddSessionLog(SessionLogStatus status, std::optional<int64_t> step,
                                      const std::string& checkpoint_path, const std::string& msg) {
  FOREMAN_RETURN_IF_ERROR(impl_->CheckOpen());
  proto::Event event = impl_->NewEvent();
  if (step.has_value()) event.set_step(*step);
  proto::SessionLog* log = event.mutable_session_log();
  log->set_status(static_cast<proto::SessionLog::SessionStatus>(status));
  log->set_checkpoint_path(checkpoint_path);
  log->set_msg(msg);
  return impl_->Enqueue(Serialize(event));
}

Status EventFileWriter::AddSerializedEvent(absl::string_view serialized_event) {
  FOREMAN_RETURN_IF_ERROR(impl_->CheckOpen());
  proto::Event event;
  if (!event.ParseFromArray(serialized_event.data(), static_cast<int>(serialized_event.size()))) {
    return absl::InvalidArgumentError(
        absl::StrCat(impl_->path, ": AddSerializedEvent: not a serialized Event"));
  }
  return impl_->Enqueue(std::string(serialized_event));
}

Status EventFileWriter::FlushIfDue() { return impl_->FlushIfDue(); }

Status EventFileWriter::Flush() { return impl_->closed ? absl::OkStatus() : impl_->WriteQueue(); }

Status EventFileWriter::Close() {
  if (impl_->closed) return impl_->close_status;
  impl_->closed = true;
  Status s = impl_->WriteQueue();
  s.Update(impl_->file->Close());
  impl_->close_status = s;
  return s;
}

const std::string& EventFileWriter::path() const { return impl_->path; }

int64_t EventFileWriter::events_written() const { return impl_->events_written; }

}  // namespace foreman
