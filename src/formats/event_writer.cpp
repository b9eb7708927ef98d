// EventFileWriter (include/foreman/event_writer.hpp). TF:
// tensorflow/python/summary/writer/event_file_writer.py (queue, flush
// schedule), writer.py (B150 metadata stripping) and
// tensorflow/core/util/events_writer.cc (file name, file_version record).
#include "foreman/event_writer.hpp"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <mutex>
#include <optional>
#include <set>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "foreman/record.hpp"
#include "platform/log.hpp"
#include "summary.pb.h"

namespace foreman {

namespace {

constexpr char kFileVersion[] = "brain.Event:2";

/// How many seconds past the clock's a new file name may be stamped when the
/// names before it are taken (B145, see the header).
constexpr int kMaxNameTries = 1000;

/// Serialises choosing a free name and creating that file, process-wide, so
/// two writers in different threads cannot both pick the same name.
std::mutex& NewEventFileMutex() {
  static auto* mu = new std::mutex;  // never destroyed: usable during exit
  return *mu;
}

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

struct NewFile {
  std::string path;
  std::unique_ptr<WritableFile> file;
  int64_t secs;  // in the name
};

/// Creates <logdir>/events.out.tfevents.<secs>.<hostname><suffix> with secs
/// the clock's (or `min_secs` if later), or the first of secs+1, secs+2, ...
/// whose name is free: an existing event file is never truncated (B145).
StatusOr<NewFile> CreateEventFile(const EventFileWriterOptions& options, const std::string& logdir,
                                  const std::string& hostname, int64_t min_secs) {
  std::lock_guard<std::mutex> lock(NewEventFileMutex());
  const int64_t secs = std::max(absl::ToUnixSeconds(options.clock->WallNow()), min_secs);
  for (int i = 0; i < kMaxNameTries; ++i) {
    std::string path = JoinPath(
        logdir, absl::StrFormat("events.out.tfevents.%010d.%s%s", secs + i, hostname, options.filename_suffix));
    const Status exists = options.env->FileExists(path);
    if (exists.ok()) continue;
    if (!absl::IsNotFound(exists)) return exists;
    FOREMAN_ASSIGN_OR_RETURN(std::unique_ptr<WritableFile> file, options.env->NewWritableFile(path));
    return NewFile{std::move(path), std::move(file), secs + i};
  }
  return absl::AlreadyExistsError(absl::StrFormat(
      "%s: no free event file name: events.out.tfevents.<secs>.%s%s exists for the %d seconds from %010d", logdir,
      hostname, options.filename_suffix, kMaxNameTries, secs));
}

}  // namespace

// -- Impl -------------------------------------------------------------------------

struct EventFileWriter::Impl {
  /// A queued event: its bytes, or (for AddSummary) the event before B150's
  /// metadata stripping, which is done as it is written to a file.
  struct Pending {
    std::string serialized;
    std::optional<proto::Event> summary_event;
  };

  Impl(EventFileWriterOptions options_in, std::string logdir_in, std::string hostname_in)
      : options(std::move(options_in)), logdir(std::move(logdir_in)), hostname(std::move(hostname_in)) {}

  /// Creates a new event file (B145), makes it the current one (closing the
  /// previous one, if any) and writes and flushes its file_version record
  /// (B146). A replacement (B152) is named after the file it replaces, even
  /// in the same second. On error the current file stays as it was.
  Status OpenNewFile() {
    const int64_t min_secs = file != nullptr ? file_secs + 1 : std::numeric_limits<int64_t>::min();
    FOREMAN_ASSIGN_OR_RETURN(NewFile created, CreateEventFile(options, logdir, hostname, min_secs));
    if (file != nullptr) file->Close().IgnoreError();  // B152: it is gone, and what it held with it
    path = std::move(created.path);
    file = std::move(created.file);
    file_secs = created.secs;
    writer.emplace(file.get());
    tags_seen.clear();
    events_written = 0;
    proto::Event event = NewEvent();
    event.set_file_version(kFileVersion);
    FOREMAN_RETURN_IF_ERROR(writer->WriteRecord(Serialize(event)));
    events_written = 1;
    return writer->Flush();
  }

  /// Queues one event, then writes and flushes if the queue is full or a
  /// flush is due.
  Status Enqueue(Pending event) {
    queue.push_back(std::move(event));
    if (queue.size() >= static_cast<std::size_t>(options.max_queue)) return WriteQueue();
    return FlushIfDue();
  }

  /// B148: due before the first event is written (last_flush unset), then
  /// flush_secs after the last flush that wrote events.
  Status FlushIfDue() {
    if (closed || queue.empty()) return absl::OkStatus();
    if (last_flush.has_value() &&
        options.clock->MonotonicNow() - *last_flush < absl::Seconds(options.flush_secs)) {
      return absl::OkStatus();
    }
    return WriteQueue();
  }

  /// B152: when the event file has disappeared, logs an error and moves on
  /// to a new file, where the queued events go.
  Status ReopenIfFileDisappeared() {
    if (!absl::IsNotFound(options.env->FileExists(path))) return absl::OkStatus();
    const std::string old_path = path;
    if (Status s = OpenNewFile(); !s.ok()) {
      FOREMAN_LOG_ERROR("The events file {} has disappeared, and opening a new one failed: {}", old_path,
                        s.ToString());
      return absl::Status(s.code(), absl::StrCat("events file ", old_path,
                                                 " has disappeared, and opening a new one failed: ", s.message()));
    }
    FOREMAN_LOG_ERROR("The events file {} has disappeared (the events in it are lost); writing to {}.",
                      old_path, path);
    return absl::OkStatus();
  }

  /// Writes every queued event and flushes the file. Events written before
  /// an error leave the queue; the rest stay. B152 is checked only when
  /// there are events to write (as TF's EventsWriter does).
  Status WriteQueue() {
    if (!queue.empty()) FOREMAN_RETURN_IF_ERROR(ReopenIfFileDisappeared());
    std::size_t written = 0;
    Status s;
    while (written < queue.size() && (s = WritePending(queue[written])).ok()) ++written;
    queue.erase(queue.begin(), queue.begin() + static_cast<std::ptrdiff_t>(written));
    events_written += static_cast<int64_t>(written);
    if (s.ok()) s = writer->Flush();
    if (s.ok() && written > 0) last_flush = options.clock->MonotonicNow();
    return s;
  }

  /// Writes one queued event. B150: summary metadata stays only on the first
  /// value of each tag in the file. (TF's writer.py only counts a tag once a
  /// value with metadata has come.)
  Status WritePending(const Pending& pending) {
    if (!pending.summary_event.has_value()) return writer->WriteRecord(pending.serialized);
    proto::Event event = *pending.summary_event;
    std::set<std::string> new_tags;
    for (proto::Summary::Value& value : *event.mutable_summary()->mutable_value()) {
      if (tags_seen.count(value.tag()) != 0 || !new_tags.insert(value.tag()).second) value.clear_metadata();
    }
    FOREMAN_RETURN_IF_ERROR(writer->WriteRecord(Serialize(event)));
    tags_seen.merge(new_tags);
    return absl::OkStatus();
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
  const std::string logdir;
  const std::string hostname;
  std::string path;                     // the current event file
  int64_t file_secs = 0;                // the seconds in its name
  std::unique_ptr<WritableFile> file;
  std::optional<RecordWriter> writer;  // on `file`
  std::vector<Pending> queue;          // events not yet written
  std::set<std::string> tags_seen;     // in the current file
  std::optional<absl::Duration> last_flush;
  int64_t events_written = 0;  // to the current file
  bool closed = false;
  Status close_status;
};

// -- EventFileWriter ----------------------------------------------------------------

StatusOr<std::unique_ptr<EventFileWriter>> EventFileWriter::Create(const std::string& logdir,
                                                                   EventFileWriterOptions options) {
  FOREMAN_RETURN_IF_ERROR(ValidateOptions(options));
  FOREMAN_RETURN_IF_ERROR(options.env->RecursivelyCreateDir(logdir));
  std::string hostname = options.hostname.empty() ? Hostname() : options.hostname;
  auto impl = std::make_unique<Impl>(std::move(options), logdir, std::move(hostname));
  FOREMAN_RETURN_IF_ERROR(impl->OpenNewFile());
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
  return impl_->Enqueue(Impl::Pending{{}, std::move(event)});
}

Status EventFileWriter::AddSessionLog(SessionLogStatus status, std::optional<int64_t> step,
                                      const std::string& checkpoint_path, const std::string& msg) {
  FOREMAN_RETURN_IF_ERROR(impl_->CheckOpen());
  if (!step.has_value() && status == SessionLogStatus::kStart) {
    return absl::InvalidArgumentError(
        absl::StrCat(impl_->path, ": SessionLog START must carry the step it starts from (B154)"));
  }
  if (!step.has_value() && status == SessionLogStatus::kCheckpoint) {
    return absl::InvalidArgumentError(
        absl::StrCat(impl_->path, ": SessionLog CHECKPOINT must carry the step it was saved at (B106)"));
  }
  proto::Event event = impl_->NewEvent();
  if (step.has_value()) event.set_step(*step);
  proto::SessionLog* log = event.mutable_session_log();
  log->set_status(static_cast<proto::SessionLog::SessionStatus>(status));
  log->set_checkpoint_path(checkpoint_path);
  log->set_msg(msg);
  return impl_->Enqueue(Impl::Pending{Serialize(event), std::nullopt});
}

Status EventFileWriter::AddSerializedEvent(absl::string_view serialized_event) {
  FOREMAN_RETURN_IF_ERROR(impl_->CheckOpen());
  proto::Event event;
  if (!event.ParseFromArray(serialized_event.data(), static_cast<int>(serialized_event.size()))) {
    return absl::InvalidArgumentError(
        absl::StrCat(impl_->path, ": AddSerializedEvent: not a serialized Event"));
  }
  return impl_->Enqueue(Impl::Pending{std::string(serialized_event), std::nullopt});
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
