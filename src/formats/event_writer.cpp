// EventFileWriter (include/foreman/event_writer.hpp). TF:
// tensorflow/python/summary/writer/event_file_writer.py (queue, flush
// schedule), writer.py (B150 metadata stripping) and
// tensorflow/core/util/events_writer.cc (file name, file_version record).
#include "foreman/event_writer.hpp"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <mutex>
#include <optional>
#include <set>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "foreman/crc32c.hpp"
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

// -- the plain scalar summary path ----------------------------------------------------
//
// Most summaries are scalars (ScalarSummary: a tag and a simple_value per
// value), and parsing each into a proto::Event, copying it, looking its tags
// up and serialising it again cost more than writing it. A Summary in
// exactly the shape protobuf itself writes for such values is recognised on
// its bytes and put into the Event as is: protobuf would write the same
// bytes back (the golden test in event_writer_test checks it), and with no
// metadata there is nothing for B150 to strip. Anything else (metadata,
// histograms, non-ASCII tags, unusual encodings) takes the protobuf path.

/// Protobuf's wire-format tags (field number << 3 | wire type).
constexpr unsigned char kSummaryValueTag = 0x0A;  // Summary.value = 1, length-delimited
constexpr unsigned char kValueTagTag = 0x0A;      // Summary.Value.tag = 1, length-delimited
constexpr unsigned char kSimpleValueTag = 0x15;   // Summary.Value.simple_value = 2, fixed32
constexpr unsigned char kWallTimeTag = 0x09;      // Event.wall_time = 1, fixed64
constexpr unsigned char kStepTag = 0x10;          // Event.step = 2, varint
constexpr unsigned char kSummaryTag = 0x2A;       // Event.summary = 5, length-delimited

/// Reads a length (a varint below 2^31, as protobuf allows) at *p, in its
/// shortest form only (protobuf writes no other); false otherwise. Advances
/// *p.
bool ReadShortestVarint32(const unsigned char** p, const unsigned char* end, uint32_t* out) {
  uint32_t value = 0;
  for (int shift = 0; shift < 35 && *p < end; shift += 7) {
    const unsigned char byte = *(*p)++;
    if (shift == 28 && byte > 0x07) return false;
    value |= static_cast<uint32_t>(byte & 0x7Fu) << shift;
    if ((byte & 0x80u) == 0) {
      if (byte == 0 && shift > 0) return false;  // a longer form than needed
      *out = value;
      return true;
    }
  }
  return false;
}

std::size_t VarintBytes(uint64_t v) {
  std::size_t n = 1;
  while (v >= 0x80) {
    v >>= 7;
    ++n;
  }
  return n;
}

char* WriteVarint(char* p, uint64_t v) {
  while (v >= 0x80) {
    *p++ = static_cast<char>(static_cast<unsigned char>(v) | 0x80u);
    v >>= 7;
  }
  *p++ = static_cast<char>(v);
  return p;
}

/// Calls `on_tag(tag)` for every value of `summary` and returns true when
/// `summary` is a Summary whose values each hold exactly a non-empty ASCII
/// tag and a simple_value, encoded as protobuf encodes them (fields in
/// order, shortest lengths). Stops at the first byte out of that shape
/// (some tags may have been passed to `on_tag` by then).
template <class OnTag>
bool ForEachPlainScalarTag(absl::string_view summary, OnTag&& on_tag) {
  const auto* p = reinterpret_cast<const unsigned char*>(summary.data());
  const unsigned char* const end = p + summary.size();
  while (p < end) {
    uint32_t value_bytes = 0;
    uint32_t tag_bytes = 0;
    if (*p++ != kSummaryValueTag || !ReadShortestVarint32(&p, end, &value_bytes) ||
        value_bytes > static_cast<std::size_t>(end - p)) {
      return false;
    }
    const unsigned char* const value_end = p + value_bytes;
    if (p == value_end || *p++ != kValueTagTag || !ReadShortestVarint32(&p, value_end, &tag_bytes) ||
        tag_bytes == 0 || static_cast<std::size_t>(value_end - p) != std::size_t{tag_bytes} + 5 ||
        p[tag_bytes] != kSimpleValueTag) {
      return false;
    }
    for (uint32_t i = 0; i < tag_bytes; ++i) {
      if (p[i] >= 0x80) return false;  // UTF-8 beyond ASCII: protobuf checks it
    }
    on_tag(absl::string_view(reinterpret_cast<const char*>(p), tag_bytes));
    p = value_end;
  }
  return true;
}

bool IsPlainScalarSummary(absl::string_view summary) {
  return ForEachPlainScalarTag(summary, [](absl::string_view) {});
}

/// Appends a TFRecord (record.hpp) of `payload_bytes` bytes to *out, its
/// payload written by `write(char* dst)`: the same bytes as
/// RecordWriter::WriteRecord.
template <class WritePayload>
void AppendRecord(std::string* out, std::size_t payload_bytes, WritePayload&& write) {
  const std::size_t start = out->size();
  out->resize(start + kRecordHeaderBytes + payload_bytes + kRecordFooterBytes);
  char* const header = &(*out)[start];
  char* const payload = header + kRecordHeaderBytes;
  uint64_t length = payload_bytes;
  for (int i = 0; i < 8; ++i) header[i] = static_cast<char>(length >> (8 * i));
  const uint32_t header_crc = crc32c::Mask(crc32c::Value(header, 8));
  for (int i = 0; i < 4; ++i) header[8 + i] = static_cast<char>(header_crc >> (8 * i));
  write(payload);
  const uint32_t payload_crc = crc32c::Mask(crc32c::Value(payload, payload_bytes));
  for (int i = 0; i < 4; ++i) payload[payload_bytes + i] = static_cast<char>(payload_crc >> (8 * i));
}

void AppendRecord(std::string* out, absl::string_view payload) {
  AppendRecord(out, payload.size(), [&](char* dst) { std::memcpy(dst, payload.data(), payload.size()); });
}

/// Appends the record of Event{wall_time, step, summary} to *out, the bytes
/// protobuf writes for it (proto3: a zero wall_time or step is left out).
void AppendSummaryEventRecord(std::string* out, double wall_time, int64_t step, absl::string_view summary) {
  uint64_t wall_bits;
  std::memcpy(&wall_bits, &wall_time, sizeof wall_bits);
  const auto step_bits = static_cast<uint64_t>(step);  // negative: ten bytes, as protobuf
  const std::size_t bytes = (wall_bits != 0 ? 1 + 8 : 0) + (step_bits != 0 ? 1 + VarintBytes(step_bits) : 0) + 1 +
                            VarintBytes(summary.size()) + summary.size();
  AppendRecord(out, bytes, [&](char* p) {
    if (wall_bits != 0) {
      *p++ = static_cast<char>(kWallTimeTag);
      for (int i = 0; i < 8; ++i) *p++ = static_cast<char>(wall_bits >> (8 * i));
    }
    if (step_bits != 0) {
      *p++ = static_cast<char>(kStepTag);
      p = WriteVarint(p, step_bits);
    }
    *p++ = static_cast<char>(kSummaryTag);
    p = WriteVarint(p, summary.size());
    std::memcpy(p, summary.data(), summary.size());
  });
}

}  // namespace

// -- Impl -------------------------------------------------------------------------

struct EventFileWriter::Impl {
  /// A queued event. kRecord and kPlainSummary: its TFRecord (header, Event,
  /// footer) is records[offset, offset + size); a kPlainSummary's Summary
  /// bytes, whose tags count as seen once it is written (B150), are
  /// records[summary_offset, summary_offset + summary_size). kProtoSummary:
  /// the Event before B150's metadata stripping (done as it is written to a
  /// file) is proto_summaries[offset].
  enum class Kind : uint8_t { kRecord, kPlainSummary, kProtoSummary };
  struct Pending {
    Kind kind;
    std::size_t offset;
    std::size_t size;
    std::size_t summary_offset;
    std::size_t summary_size;
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
    proto::Event event;
    event.set_wall_time(WallSeconds());
    event.set_file_version(kFileVersion);
    FOREMAN_RETURN_IF_ERROR(writer->WriteRecord(Serialize(event)));
    events_written = 1;
    return writer->Flush();
  }

  /// Queues Event{wall_time=now, step, summary}; INVALID_ARGUMENT when
  /// `summary` does not parse. Writes nothing.
  Status QueueSummary(absl::string_view summary, int64_t step) {
    if (IsPlainScalarSummary(summary)) {
      const std::size_t offset = records.size();
      AppendSummaryEventRecord(&records, WallSeconds(), step, summary);
      queue.push_back(Pending{Kind::kPlainSummary, offset, records.size() - offset,
                              records.size() - kRecordFooterBytes - summary.size(), summary.size()});
      return absl::OkStatus();
    }
    proto::Event event;
    event.set_wall_time(WallSeconds());
    event.set_step(step);
    if (!event.mutable_summary()->ParseFromArray(summary.data(), static_cast<int>(summary.size()))) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": AddSummary: not a serialized Summary"));
    }
    proto_summaries.push_back(std::move(event));
    queue.push_back(Pending{Kind::kProtoSummary, proto_summaries.size() - 1, 0, 0, 0});
    return absl::OkStatus();
  }

  /// Queues a serialized Event as is. Writes nothing.
  void QueueRecord(absl::string_view serialized_event) {
    const std::size_t offset = records.size();
    AppendRecord(&records, serialized_event);
    queue.push_back(Pending{Kind::kRecord, offset, records.size() - offset, 0, 0});
  }

  /// After events were queued: writes and flushes if the queue is full or a
  /// flush is due.
  Status WriteIfDue() {
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

  /// After a write that may have left a partial record at the end of the
  /// current file (`torn`): logs an error and moves on to a new file, where
  /// the queued events go. The records before the partial one stay readable
  /// (a reader sees the partial one as a cut tail, TensorBoard as the end of
  /// that file).
  Status ReplaceTornFile() {
    const std::string old_path = path;
    const Status why = *torn;
    if (Status s = OpenNewFile(); !s.ok()) {
      return absl::Status(s.code(), absl::StrCat("events file ", old_path, " may end in a partial record (",
                                                 why.ToString(), "), and opening a new one failed: ", s.message()));
    }
    torn.reset();
    FOREMAN_LOG_ERROR("The events file {} may end in a partial record after a failed write ({}); writing to {}.",
                      old_path, why.ToString(), path);
    return absl::OkStatus();
  }

  /// Writes every queued event and flushes the file. Events written before
  /// an error leave the queue; the rest stay. B152 is checked only when
  /// there are events to write (as TF's EventsWriter does).
  Status WriteQueue() {
    if (!queue.empty()) FOREMAN_RETURN_IF_ERROR(ReopenIfFileDisappeared());
    if (!queue.empty() && torn.has_value()) FOREMAN_RETURN_IF_ERROR(ReplaceTornFile());
    std::size_t written = 0;
    Status s;
    uint64_t before = file->Size();
    while (written < queue.size()) {
      before = file->Size();
      if (!(s = WritePending(queue[written])).ok()) break;
      ++written;
    }
    // A record's one append failed after part of it went in (a short
    // write): the failed event stays queued, and goes to a new file.
    if (!s.ok() && file->Size() != before) torn = s;
    if (written == queue.size()) {
      queue.clear();
      records.clear();
      proto_summaries.clear();
    } else {
      // The records and Events of the rest stay where they are.
      queue.erase(queue.begin(), queue.begin() + static_cast<std::ptrdiff_t>(written));
    }
    events_written += static_cast<int64_t>(written);
    if (s.ok()) {
      s = writer->Flush();
      // A failed flush may have handed the OS part of the buffered bytes.
      if (!s.ok()) torn = s;
    }
    if (s.ok() && written > 0) last_flush = options.clock->MonotonicNow();
    return s;
  }

  /// Writes one queued event. B150: summary metadata stays only on the first
  /// value of each tag in the file. (TF's writer.py only counts a tag once a
  /// value with metadata has come.)
  Status WritePending(const Pending& pending) {
    switch (pending.kind) {
      case Kind::kRecord:
        return file->Append(absl::string_view(records.data() + pending.offset, pending.size));
      case Kind::kPlainSummary: {
        FOREMAN_RETURN_IF_ERROR(file->Append(absl::string_view(records.data() + pending.offset, pending.size)));
        // No metadata to strip; the tags count as seen.
        ForEachPlainScalarTag(absl::string_view(records.data() + pending.summary_offset, pending.summary_size),
                              [this](absl::string_view tag) {
                                if (tags_seen.find(tag) == tags_seen.end()) tags_seen.emplace(tag);
                              });
        return absl::OkStatus();
      }
      case Kind::kProtoSummary:
        break;
    }
    proto::Event event = proto_summaries[pending.offset];
    std::set<std::string, std::less<>> new_tags;
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

  /// wall_time = now, as TF's EventsWriter computes it (whole microseconds /
  /// 1e6: correctly rounded, unlike Clock::WallSeconds()).
  double WallSeconds() const { return static_cast<double>(absl::ToUnixMicros(options.clock->WallNow())) / 1e6; }

  const EventFileWriterOptions options;
  const std::string logdir;
  const std::string hostname;
  std::string path;                     // the current event file
  int64_t file_secs = 0;                // the seconds in its name
  std::unique_ptr<WritableFile> file;
  std::optional<RecordWriter> writer;  // on `file`
  std::vector<Pending> queue;          // events not yet written, in order
  std::string records;                 // their records (see Pending)
  std::vector<proto::Event> proto_summaries;     // see Pending
  std::set<std::string, std::less<>> tags_seen;  // in the current file
  std::optional<absl::Duration> last_flush;
  int64_t events_written = 0;  // to the current file
  bool closed = false;
  Status close_status;
  // A write into the current file failed after some of its bytes went in
  // (a short append, or a flush of buffered bytes): the file may end in a
  // partial record. The next write moves to a new file rather than append
  // after it (a record after a partial one would be unreadable).
  std::optional<Status> torn;
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
  FOREMAN_RETURN_IF_ERROR(impl_->QueueSummary(serialized_summary, step));
  return impl_->WriteIfDue();
}

Status EventFileWriter::AddSummaries(absl::Span<const SummaryAtStep> summaries) {
  FOREMAN_RETURN_IF_ERROR(impl_->CheckOpen());
  Status parsed;
  std::size_t bad = 0;
  for (std::size_t i = 0; i < summaries.size(); ++i) {
    Status s = impl_->QueueSummary(summaries[i].serialized_summary, summaries[i].step);
    if (s.ok()) continue;
    if (bad++ == 0) {
      parsed = absl::Status(s.code(), absl::StrCat(s.message(), " (AddSummaries: summary ", i, " of ",
                                                   summaries.size(), ")"));
    }
  }
  if (bad > 1) {
    parsed = absl::Status(parsed.code(), absl::StrCat(parsed.message(), "; ", bad - 1, " more skipped"));
  }
  Status written = summaries.empty() ? absl::OkStatus() : impl_->WriteIfDue();
  if (parsed.ok()) return written;
  if (!written.ok()) {
    return absl::Status(parsed.code(), absl::StrCat(parsed.message(), "; then writing failed: ", written.ToString()));
  }
  return parsed;
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
  proto::Event event;
  event.set_wall_time(impl_->WallSeconds());
  if (step.has_value()) event.set_step(*step);
  proto::SessionLog* log = event.mutable_session_log();
  log->set_status(static_cast<proto::SessionLog::SessionStatus>(status));
  log->set_checkpoint_path(checkpoint_path);
  log->set_msg(msg);
  impl_->QueueRecord(Serialize(event));
  return impl_->WriteIfDue();
}

Status EventFileWriter::AddSerializedEvent(absl::string_view serialized_event) {
  FOREMAN_RETURN_IF_ERROR(impl_->CheckOpen());
  proto::Event event;
  if (!event.ParseFromArray(serialized_event.data(), static_cast<int>(serialized_event.size()))) {
    return absl::InvalidArgumentError(
        absl::StrCat(impl_->path, ": AddSerializedEvent: not a serialized Event"));
  }
  impl_->QueueRecord(serialized_event);
  return impl_->WriteIfDue();
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
