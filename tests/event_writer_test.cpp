// Tests for EventFileWriter (spec §14, B145-B154; bug report H-31) and for
// reading event files back (event_reader.hpp).

#include "foreman/event_writer.hpp"

#include <doctest/doctest.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <spdlog/sinks/ostream_sink.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "foreman/clock.hpp"
#include "foreman/crc32c.hpp"
#include "foreman/event_reader.hpp"
#include "foreman/fault.hpp"
#include "foreman/mem_env.hpp"
#include "foreman/summary.hpp"
#include "foreman/tensor.hpp"
#include "support/test_util.hpp"
#include "platform/log.hpp"
#include "support/log_capture.hpp"
#include "summary.pb.h"

namespace foreman {
namespace {

constexpr char kLogdir[] = "/logs/run";

using foreman::testing::CapturedLog;

/// A MemEnv, a ManualClock at 1700000000.25 s and options using both.
struct Fixture {
  Fixture() {
    options.env = &env;
    options.clock = &clock;
    options.hostname = "testhost";
  }
  std::unique_ptr<EventFileWriter> Create() {
    auto writer = EventFileWriter::Create(kLogdir, options);
    REQUIRE(writer.ok());
    return *std::move(writer);
  }
  MemEnv env;
  ManualClock clock{absl::FromUnixMillis(1700000000250)};
  EventFileWriterOptions options;
};

/// The records now in `path`, as protos.
std::vector<proto::Event> EventsOnDisk(Env* env, const std::string& path) {
  auto reader = RecordReader::Open(env, path);
  REQUIRE(reader.ok());
  std::vector<proto::Event> events;
  std::string record;
  Status s;
  while ((s = (*reader)->ReadRecord(&record)).ok()) {
    REQUIRE(events.emplace_back().ParseFromString(record));
  }
  REQUIRE_MESSAGE(absl::IsOutOfRange(s), s.ToString());
  return events;
}

/// Names of the fields set in `message`.
std::vector<std::string> SetFields(const google::protobuf::Message& message) {
  std::vector<const google::protobuf::FieldDescriptor*> fields;
  message.GetReflection()->ListFields(message, &fields);
  std::vector<std::string> names;
  for (const auto* f : fields) names.push_back(f->name());
  return names;
}

/// True when `path` is <dir>events.out.tfevents.<10 digits>.<tail> (the
/// regex "events\.out\.tfevents\.\d{10}\.<tail>"; std::regex trips GCC 12's
/// -Wmaybe-uninitialized under sanitizers).
bool IsEventFileName(const std::string& path, const std::string& dir, const std::string& tail) {
  const std::string prefix = dir + "events.out.tfevents.";
  if (path.size() != prefix.size() + 10 + 1 + tail.size() || !absl::StartsWith(path, prefix)) return false;
  const auto digits = path.begin() + static_cast<std::ptrdiff_t>(prefix.size());
  return std::all_of(digits, digits + 10, [](unsigned char c) { return std::isdigit(c) != 0; }) &&
         path.compare(prefix.size() + 10, std::string::npos, "." + tail) == 0;
}

using foreman::testing::TempDir;

// -- the file: name and first record -------------------------------------------------

TEST_CASE("B145: Create makes the logdir and names the file events.out.tfevents.<secs>.<host><suffix>") {
  Fixture f;
  f.options.filename_suffix = ".v2";
  auto writer = f.Create();
  CHECK(*f.env.IsDirectory(kLogdir));
  CHECK(IsEventFileName(writer->path(), "/logs/run/", "testhost.v2"));
  CHECK(writer->path() == "/logs/run/events.out.tfevents.1700000000.testhost.v2");
  CHECK(f.env.FileExists(writer->path()).ok());
}

TEST_CASE("B145: the seconds in the file name are zero-padded to 10 digits") {
  Fixture f;
  f.clock.SetWallTime(absl::FromUnixSeconds(12345));
  CHECK(f.Create()->path() == "/logs/run/events.out.tfevents.0000012345.testhost");
}

TEST_CASE("B145: a second writer in the same second takes the next second's name, never truncating") {
  Fixture f;
  auto first = f.Create();
  REQUIRE(first->AddSummary(ScalarSummary("loss", 1), 1).ok());
  auto second = f.Create();  // same clock second, host and suffix
  auto third = f.Create();
  CHECK(first->path() == "/logs/run/events.out.tfevents.1700000000.testhost");
  CHECK(second->path() == "/logs/run/events.out.tfevents.1700000001.testhost");
  CHECK(third->path() == "/logs/run/events.out.tfevents.1700000002.testhost");
  REQUIRE(second->AddSummary(ScalarSummary("acc", 2), 5).ok());
  REQUIRE(first->AddSessionLog(SessionLogStatus::kStop, std::nullopt).ok());
  REQUIRE(first->Close().ok());
  REQUIRE(second->Close().ok());
  REQUIRE(third->Close().ok());

  const auto one = EventsOnDisk(&f.env, first->path());
  REQUIRE(one.size() == 3);
  CHECK(one[0].file_version() == "brain.Event:2");
  CHECK(one[1].summary().value(0).tag() == "loss");
  CHECK(one[2].session_log().status() == proto::SessionLog::STOP);
  const auto two = EventsOnDisk(&f.env, second->path());
  REQUIRE(two.size() == 2);
  CHECK(two[0].file_version() == "brain.Event:2");
  CHECK(two[1].summary().value(0).tag() == "acc");
  CHECK(two[1].step() == 5);
  CHECK(EventsOnDisk(&f.env, third->path()).size() == 1);
  // A later clock second that is taken is skipped too.
  f.clock.Advance(absl::Seconds(1));
  CHECK(f.Create()->path() == "/logs/run/events.out.tfevents.1700000003.testhost");
}

TEST_CASE("B145: any existing file with the name is kept; ALREADY_EXISTS when 1000 seconds of names are taken") {
  Fixture f;
  REQUIRE(f.env.RecursivelyCreateDir(kLogdir).ok());
  for (int i = 0; i < 1000; ++i) {
    REQUIRE(WriteStringToFile(&f.env, absl::StrCat("/logs/run/events.out.tfevents.", 1700000000 + i, ".testhost"),
                              "keep")
                .ok());
  }
  const auto s = EventFileWriter::Create(kLogdir, f.options).status();
  CHECK(absl::IsAlreadyExists(s));
  CHECK_MESSAGE(absl::StrContains(s.message(), kLogdir), s.message());
  CHECK(*f.env.ReadFileToString("/logs/run/events.out.tfevents.1700000000.testhost") == "keep");
  CHECK(*f.env.ReadFileToString("/logs/run/events.out.tfevents.1700000999.testhost") == "keep");
  f.clock.Advance(absl::Seconds(1));  // 1700000001 + 999 is free
  CHECK(f.Create()->path() == "/logs/run/events.out.tfevents.1700001000.testhost");
}

TEST_CASE("B145: writers created at once in several threads get distinct files") {
  Fixture f;
  constexpr int kThreads = 8;
  std::vector<std::unique_ptr<EventFileWriter>> writers(kThreads);
  std::vector<Status> statuses(kThreads);
  {
    std::vector<std::thread> threads;
    for (int i = 0; i < kThreads; ++i) {
      threads.emplace_back([&, i] {
        auto w = EventFileWriter::Create(kLogdir, f.options);
        statuses[i] = w.status();
        if (w.ok()) writers[i] = *std::move(w);
      });
    }
    for (auto& t : threads) t.join();
  }
  std::set<std::string> paths;
  for (int i = 0; i < kThreads; ++i) {
    REQUIRE_MESSAGE(statuses[i].ok(), statuses[i].ToString());
    paths.insert(writers[i]->path());
    REQUIRE(writers[i]->AddSummary(ScalarSummary("w", static_cast<float>(i)), i).ok());
    REQUIRE(writers[i]->Close().ok());
  }
  CHECK(paths.size() == kThreads);
  for (int i = 0; i < kThreads; ++i) {
    const auto events = EventsOnDisk(&f.env, writers[i]->path());
    REQUIRE(events.size() == 2);
    CHECK(events[1].step() == i);
  }
}

TEST_CASE("B145: without a host name option the file name has gethostname()'s") {
  Fixture f;
  f.options.hostname.clear();
  char host[256] = {};
  REQUIRE(gethostname(host, sizeof host - 1) == 0);
  CHECK(f.Create()->path() == absl::StrCat("/logs/run/events.out.tfevents.1700000000.", host));
}

TEST_CASE("B146, H-31: the first record is only wall_time and file_version brain.Event:2, and flushed") {
  Fixture f;
  auto writer = f.Create();
  CHECK(writer->events_written() == 1);

  // Decode the first TFRecord by hand, checking both CRCs.
  auto bytes = f.env.ReadFileToString(writer->path());
  REQUIRE(bytes.ok());
  REQUIRE(bytes->size() >= kRecordHeaderBytes);
  uint64_t length = 0;
  for (int i = 7; i >= 0; --i) length = length << 8 | static_cast<unsigned char>((*bytes)[i]);
  const auto fixed32 = [&](std::size_t at) {
    uint32_t v = 0;
    for (int i = 3; i >= 0; --i) v = v << 8 | static_cast<unsigned char>((*bytes)[at + i]);
    return v;
  };
  REQUIRE(bytes->size() == kRecordHeaderBytes + length + kRecordFooterBytes);  // nothing else yet
  CHECK(fixed32(8) == crc32c::Mask(crc32c::Value(bytes->data(), 8)));
  const std::string payload = bytes->substr(kRecordHeaderBytes, length);
  CHECK(fixed32(kRecordHeaderBytes + length) == crc32c::Mask(crc32c::Value(payload.data(), payload.size())));

  proto::Event event;
  REQUIRE(event.ParseFromString(payload));
  CHECK(SetFields(event) == std::vector<std::string>{"wall_time", "file_version"});
  CHECK(event.GetReflection()->GetUnknownFields(event).empty());
  CHECK(event.wall_time() == 1700000000.25);
  CHECK(event.file_version() == "brain.Event:2");
}

// -- the flush schedule --------------------------------------------------------------

TEST_CASE("B148: the first event after Create is written and flushed at once") {
  Fixture f;
  f.options.max_queue = 5;
  auto writer = f.Create();
  REQUIRE(writer->FlushIfDue().ok());  // nothing queued: the deadline stays due
  REQUIRE(writer->Flush().ok());
  REQUIRE(writer->AddSummary(ScalarSummary("loss", 1), 1).ok());
  const auto events = EventsOnDisk(&f.env, writer->path());
  REQUIRE(events.size() == 2);
  CHECK(events[1].step() == 1);
  CHECK(writer->events_written() == 2);
  // The second is not due: flush_secs (120) have not passed, max_queue not reached.
  REQUIRE(writer->AddSummary(ScalarSummary("loss", 2), 2).ok());
  REQUIRE(writer->FlushIfDue().ok());
  CHECK(EventsOnDisk(&f.env, writer->path()).size() == 2);
}

TEST_CASE("B148: after the first, queued events reach the file when max_queue of them are pending") {
  Fixture f;
  f.options.max_queue = 3;
  auto writer = f.Create();
  REQUIRE(writer->AddSummary(ScalarSummary("loss", 0), 0).ok());  // the first: flushed at once
  CHECK(EventsOnDisk(&f.env, writer->path()).size() == 2);
  REQUIRE(writer->AddSummary(ScalarSummary("loss", 1), 1).ok());
  REQUIRE(writer->AddSummary(ScalarSummary("loss", 2), 2).ok());
  CHECK(EventsOnDisk(&f.env, writer->path()).size() == 2);
  CHECK(writer->events_written() == 2);
  REQUIRE(writer->AddSessionLog(SessionLogStatus::kCheckpoint, 2, "/ckpt").ok());
  const auto events = EventsOnDisk(&f.env, writer->path());
  REQUIRE(events.size() == 5);
  CHECK(events[2].step() == 1);
  CHECK(events[3].summary().value(0).simple_value() == 2.0f);
  CHECK(events[4].has_session_log());
  CHECK(writer->events_written() == 5);
  REQUIRE(writer->AddSummary(ScalarSummary("loss", 3), 3).ok());
  CHECK(EventsOnDisk(&f.env, writer->path()).size() == 5);
}

TEST_CASE("B148: after the first, queued events reach the file once flush_secs have passed (FlushIfDue and Add check)") {
  Fixture f;
  f.options.flush_secs = 5;
  auto writer = f.Create();
  REQUIRE(writer->AddSummary(ScalarSummary("loss", 0), 0).ok());  // the first: flushed at once
  CHECK(EventsOnDisk(&f.env, writer->path()).size() == 2);
  REQUIRE(writer->AddSummary(ScalarSummary("loss", 1), 1).ok());
  f.clock.Advance(absl::Milliseconds(4999));
  REQUIRE(writer->FlushIfDue().ok());
  CHECK(EventsOnDisk(&f.env, writer->path()).size() == 2);
  f.clock.Advance(absl::Milliseconds(1));
  REQUIRE(writer->FlushIfDue().ok());
  CHECK(EventsOnDisk(&f.env, writer->path()).size() == 3);

  // The interval restarts at that flush; an Add after it flushes everything.
  REQUIRE(writer->AddSummary(ScalarSummary("loss", 2), 2).ok());
  f.clock.Advance(absl::Seconds(4));
  REQUIRE(writer->AddSummary(ScalarSummary("loss", 3), 3).ok());
  CHECK(EventsOnDisk(&f.env, writer->path()).size() == 3);
  f.clock.Advance(absl::Seconds(1));
  REQUIRE(writer->AddSummary(ScalarSummary("loss", 4), 4).ok());
  CHECK(EventsOnDisk(&f.env, writer->path()).size() == 6);
  CHECK(writer->events_written() == 6);
}

TEST_CASE("B149: Flush writes every queued event; Close flushes, is idempotent, and Add after it fails") {
  Fixture f;
  auto writer = f.Create();
  REQUIRE(writer->AddSummary(ScalarSummary("loss", 1), 1).ok());
  REQUIRE(writer->Flush().ok());
  CHECK(EventsOnDisk(&f.env, writer->path()).size() == 2);
  REQUIRE(writer->AddSummary(ScalarSummary("loss", 2), 2).ok());
  REQUIRE(writer->AddSessionLog(SessionLogStatus::kStop, std::nullopt).ok());
  CHECK(EventsOnDisk(&f.env, writer->path()).size() == 2);
  REQUIRE(writer->Close().ok());
  CHECK(EventsOnDisk(&f.env, writer->path()).size() == 4);
  CHECK(writer->events_written() == 4);
  CHECK(writer->Close().ok());
  CHECK(writer->Flush().ok());
  CHECK(writer->FlushIfDue().ok());

  const Status s = writer->AddSummary(ScalarSummary("loss", 3), 3);
  CHECK(absl::IsFailedPrecondition(s));
  CHECK(absl::StrContains(s.message(), writer->path()));
  CHECK(absl::IsFailedPrecondition(writer->AddSessionLog(SessionLogStatus::kStart, 1)));
  CHECK(absl::IsFailedPrecondition(writer->AddSerializedEvent("")));
  CHECK(EventsOnDisk(&f.env, writer->path()).size() == 4);
}

TEST_CASE("the destructor flushes and closes") {
  Fixture f;
  std::string path;
  {
    auto writer = f.Create();
    path = writer->path();
    REQUIRE(writer->AddSummary(ScalarSummary("loss", 1), 1).ok());
  }
  CHECK(EventsOnDisk(&f.env, path).size() == 2);
}

TEST_CASE("a write error is returned by the Add that flushes, and by every Close") {
  Fixture f;
  f.options.max_queue = 1;
  auto writer = f.Create();
  f.env.SetCrashAfterOperations(0);
  const Status s = writer->AddSummary(ScalarSummary("loss", 1), 1);
  CHECK(absl::IsUnavailable(s));
  CHECK(writer->events_written() == 1);
  const Status closed = writer->Close();
  CHECK_FALSE(closed.ok());
  CHECK(writer->Close() == closed);
}

/// Fixture's options over a FaultyEnv on its MemEnv with `fault` armed on
/// the event files' appends.
struct FaultyFixture : Fixture {
  explicit FaultyFixture(EnvFault fault) : faulty(&env) {
    fault.path_pattern = "*tfevents*";
    fault.op = EnvOp::kAppend;
    REQUIRE(faulty.AddFault(fault).ok());
    options.env = &faulty;
  }
  FaultyEnv faulty;
};

TEST_CASE("a short write of an event's record: the events before it stay readable, it and the later ones go to a "
          "new file, each once") {
  EnvFault fault;
  fault.id = "short";
  fault.kind = EnvFault::Kind::kShortWrite;
  fault.prefix_bytes = 7;
  fault.nth = 3;  // appends: the file_version record, event 1, event 2
  FaultyFixture f(fault);
  f.options.max_queue = 1;
  CapturedLog log;
  auto writer = f.Create();
  REQUIRE(writer->AddSummary(ScalarSummary("loss", 1), 1).ok());
  const std::string old_path = writer->path();
  const Status failed = writer->AddSummary(ScalarSummary("loss", 2), 2);
  REQUIRE_FALSE(failed.ok());
  CHECK(f.env.GetFileSize(old_path).value() > 0);
  f.clock.Advance(absl::Seconds(1));
  REQUIRE(writer->AddSummary(ScalarSummary("loss", 3), 3).ok());  // event 2 first, in the new file
  REQUIRE(writer->Close().ok());

  CHECK(writer->path() != old_path);
  CHECK_MESSAGE(absl::StrContains(log.text(), "The events file " + old_path + " may end in a partial record"),
                log.text());
  CHECK_MESSAGE(absl::StrContains(log.text(), "writing to " + writer->path()), log.text());
  // The old file: its events, then the 7 bytes of the cut record (a cut
  // tail: DATA_LOSS without allow_truncated_tail, the end with it).
  CHECK(absl::IsDataLoss(ReadEventFile(&f.env, old_path).status()));
  auto old_events = ReadEventFile(&f.env, old_path, /*allow_truncated_tail=*/true);
  REQUIRE_MESSAGE(old_events.ok(), old_events.status().ToString());
  REQUIRE(old_events->size() == 2);  // file_version, step 1
  CHECK((*old_events)[1].step == 1);
  auto new_events = ReadEventFile(&f.env, writer->path());
  REQUIRE_MESSAGE(new_events.ok(), new_events.status().ToString());
  REQUIRE(new_events->size() == 3);  // file_version, step 2, step 3
  CHECK((*new_events)[1].step == 2);
  CHECK((*new_events)[2].step == 3);
}

TEST_CASE("an EIO on an event's append writes none of its record: the retry writes it once, in the same file") {
  // Text summaries go through RecordWriter (a scalar's record is framed at
  // Add). The 3rd append of the file fails: before, that was event 1's data
  // after its header had gone in, and the retry wrote the whole record
  // again after the orphan header; now each record is one append.
  EnvFault fault;
  fault.id = "eio";
  fault.kind = EnvFault::Kind::kError;
  fault.nth = 3;
  FaultyFixture f(fault);
  f.options.max_queue = 1;
  auto writer = f.Create();
  const std::string path = writer->path();
  REQUIRE(writer->AddSummary(TextSummary("t", "a"), 1).ok());
  REQUIRE_FALSE(writer->AddSummary(TextSummary("t", "b"), 2).ok());
  REQUIRE(writer->Flush().ok());
  REQUIRE(writer->AddSummary(TextSummary("t", "c"), 3).ok());
  REQUIRE(writer->Close().ok());
  CHECK(writer->path() == path);
  auto events = ReadEventFile(&f.env, path);
  REQUIRE_MESSAGE(events.ok(), events.status().ToString());
  REQUIRE(events->size() == 4);
  CHECK((*events)[1].step == 1);
  CHECK((*events)[2].step == 2);
  CHECK((*events)[3].step == 3);
}

TEST_CASE("B152: when the event file disappears, the next flush logs an error and writes to a new file") {
  Fixture f;
  CapturedLog log;
  auto writer = f.Create();
  REQUIRE(writer->AddSummary(TextSummary("t", "a"), 1).ok());  // flushed: the first event
  const std::string old_path = writer->path();
  REQUIRE(f.env.DeleteFile(old_path).ok());
  f.clock.Advance(absl::Seconds(2));
  REQUIRE(writer->AddSummary(TextSummary("t", "b"), 2).ok());
  REQUIRE(writer->AddSessionLog(SessionLogStatus::kStop, std::nullopt).ok());
  CHECK(writer->path() == old_path);  // not noticed before a flush
  REQUIRE(writer->Flush().ok());

  CHECK(writer->path() == "/logs/run/events.out.tfevents.1700000002.testhost");
  CHECK(absl::IsNotFound(f.env.FileExists(old_path)));
  CHECK_MESSAGE(absl::StrContains(log.text(), old_path), log.text());
  CHECK_MESSAGE(absl::StrContains(log.text(), "disappeared"), log.text());
  CHECK_MESSAGE(absl::StrContains(log.text(), writer->path()), log.text());
  CHECK(writer->events_written() == 3);
  const auto events = EventsOnDisk(&f.env, writer->path());
  REQUIRE(events.size() == 3);
  CHECK(events[0].file_version() == "brain.Event:2");
  CHECK(events[0].wall_time() == 1700000002.25);
  CHECK(events[1].step() == 2);
  CHECK(events[1].summary().value(0).tensor().string_val(0) == "b");
  // B150 starts afresh in the new file: "t" keeps its metadata there.
  CHECK(events[1].summary().value(0).metadata().plugin_data().plugin_name() == "text");
  CHECK(events[2].session_log().status() == proto::SessionLog::STOP);

  // Later events keep going to the new file.
  REQUIRE(writer->AddSummary(ScalarSummary("loss", 3), 3).ok());
  REQUIRE(writer->Close().ok());
  CHECK(EventsOnDisk(&f.env, writer->path()).size() == 4);
}

TEST_CASE("B152: a file lost in the second it was made is replaced by a later name, not the same one") {
  Fixture f;
  CapturedLog log;
  auto writer = f.Create();
  const std::string old_path = writer->path();
  REQUIRE(f.env.DeleteFile(old_path).ok());
  REQUIRE(writer->AddSummary(ScalarSummary("loss", 1), 1).ok());  // the first event: flushed at once
  CHECK(writer->path() == "/logs/run/events.out.tfevents.1700000001.testhost");
  const auto events = EventsOnDisk(&f.env, writer->path());
  REQUIRE(events.size() == 2);
  CHECK(events[0].file_version() == "brain.Event:2");
  CHECK(events[1].step() == 1);
  CHECK(absl::IsNotFound(f.env.FileExists(old_path)));
}

TEST_CASE("B152: an empty queue does not reopen; a new file that cannot be made is an error naming the lost one") {
  Fixture f;
  auto writer = f.Create();
  const std::string old_path = writer->path();
  REQUIRE(f.env.DeleteFile(old_path).ok());
  REQUIRE(writer->Flush().ok());  // nothing to write
  CHECK(writer->path() == old_path);

  REQUIRE(f.env.DeleteDir(kLogdir).ok());
  REQUIRE(WriteStringToFile(&f.env, kLogdir, "not a directory").ok());
  CapturedLog log;
  const Status s = writer->AddSummary(ScalarSummary("loss", 1), 1);  // the first event: flushed at once
  CHECK_FALSE(s.ok());
  CHECK_MESSAGE(absl::StrContains(s.message(), old_path), s.message());
  CHECK_MESSAGE(absl::StrContains(log.text(), old_path), log.text());
  CHECK_FALSE(writer->Flush().ok());  // still queued, still failing
  CHECK(writer->path() == old_path);
}

// -- what events hold --------------------------------------------------------------------

TEST_CASE("B150: an event gets wall_time from the clock and the given step") {
  Fixture f;
  auto writer = f.Create();
  f.clock.Advance(absl::Milliseconds(1500));
  REQUIRE(writer->AddSummary(ScalarSummary("loss", 0.5f), 42).ok());
  REQUIRE(writer->Close().ok());
  const auto events = EventsOnDisk(&f.env, writer->path());
  REQUIRE(events.size() == 2);
  CHECK(events[1].wall_time() == 1700000001.75);
  CHECK(events[1].step() == 42);
  REQUIRE(events[1].summary().value_size() == 1);
  CHECK(events[1].summary().value(0).tag() == "loss");
  CHECK(events[1].summary().value(0).simple_value() == 0.5f);
}

TEST_CASE("B150: summary metadata is kept only on the first value of each tag in a file") {
  Fixture f;
  auto writer = f.Create();
  const std::string first_summary =
      MergeSummaries({TextSummary("a", "1"), ScalarSummary("s", 1), TextSummary("a", "2")});
  REQUIRE(writer->AddSummary(first_summary, 1).ok());
  REQUIRE(writer->AddSummary(MergeSummaries({TextSummary("b", "1"), TextSummary("a", "3")}), 2).ok());
  REQUIRE(writer->Close().ok());
  const auto events = EventsOnDisk(&f.env, writer->path());
  REQUIRE(events.size() == 3);
  const proto::Summary& first = events[1].summary();
  REQUIRE(first.value_size() == 3);
  CHECK(first.value(0).metadata().plugin_data().plugin_name() == "text");
  CHECK_FALSE(first.value(1).has_metadata());
  CHECK_FALSE(first.value(2).has_metadata());
  CHECK(first.value(2).tensor().string_val(0) == "2");  // the value itself is kept
  const proto::Summary& second = events[2].summary();
  REQUIRE(second.value_size() == 2);
  CHECK(second.value(0).metadata().plugin_data().plugin_name() == "text");
  CHECK_FALSE(second.value(1).has_metadata());

  // A new file starts afresh.
  f.clock.Advance(absl::Seconds(1));
  auto next = f.Create();
  REQUIRE(next->AddSummary(TextSummary("a", "4"), 3).ok());
  REQUIRE(next->Close().ok());
  CHECK(EventsOnDisk(&f.env, next->path())[1].summary().value(0).has_metadata());
}

TEST_CASE("B153, B154: START carries the step, STOP none, CHECKPOINT its checkpoint_path") {
  Fixture f;
  auto writer = f.Create();
  REQUIRE(writer->AddSessionLog(SessionLogStatus::kStart, 101).ok());
  REQUIRE(writer->AddSessionLog(SessionLogStatus::kCheckpoint, 200, "/ckpt/model.ckpt-200", "saved").ok());
  REQUIRE(writer->AddSessionLog(SessionLogStatus::kStop, std::nullopt).ok());
  REQUIRE(writer->Close().ok());
  const auto events = EventsOnDisk(&f.env, writer->path());
  REQUIRE(events.size() == 4);

  CHECK(events[1].step() == 101);
  CHECK(events[1].session_log().status() == proto::SessionLog::START);
  CHECK(events[2].step() == 200);
  CHECK(events[2].session_log().status() == proto::SessionLog::CHECKPOINT);
  CHECK(events[2].session_log().checkpoint_path() == "/ckpt/model.ckpt-200");
  CHECK(events[2].session_log().msg() == "saved");
  CHECK(events[3].session_log().status() == proto::SessionLog::STOP);
  CHECK(SetFields(events[3]) == std::vector<std::string>{"wall_time", "session_log"});  // no step
}

TEST_CASE("B154, B106: START and CHECKPOINT without a step are INVALID_ARGUMENT and nothing is queued") {
  Fixture f;
  auto writer = f.Create();
  const Status start = writer->AddSessionLog(SessionLogStatus::kStart, std::nullopt);
  CHECK(absl::IsInvalidArgument(start));
  CHECK_MESSAGE(absl::StrContains(start.message(), "SessionLog START must carry the step it starts from (B154)"),
                start.message());
  const Status checkpoint = writer->AddSessionLog(SessionLogStatus::kCheckpoint, std::nullopt, "/ckpt/m-1");
  CHECK(absl::IsInvalidArgument(checkpoint));
  CHECK_MESSAGE(absl::StrContains(checkpoint.message(), "CHECKPOINT"), checkpoint.message());
  CHECK(writer->AddSessionLog(SessionLogStatus::kStop, std::nullopt).ok());
  CHECK(writer->AddSessionLog(SessionLogStatus::kUnspecified, std::nullopt).ok());
  REQUIRE(writer->Close().ok());
  const auto events = EventsOnDisk(&f.env, writer->path());
  REQUIRE(events.size() == 3);
  CHECK(events[1].session_log().status() == proto::SessionLog::STOP);
}

TEST_CASE("AddSerializedEvent writes the event's bytes as they are") {
  Fixture f;
  auto writer = f.Create();
  proto::Event event;
  event.set_wall_time(123.5);
  event.set_step(7);
  event.mutable_log_message()->set_message("hello");
  const std::string serialized = event.SerializeAsString();
  REQUIRE(writer->AddSerializedEvent(serialized).ok());
  REQUIRE(writer->Close().ok());
  auto reader = RecordReader::Open(&f.env, writer->path());
  REQUIRE(reader.ok());
  std::string record;
  REQUIRE((*reader)->ReadRecord(&record).ok());
  REQUIRE((*reader)->ReadRecord(&record).ok());
  CHECK(record == serialized);
}

TEST_CASE("bytes that are not a Summary or an Event are INVALID_ARGUMENT and nothing is queued") {
  Fixture f;
  auto writer = f.Create();
  const std::string garbage = "\xff\xff\xff";
  CHECK(absl::IsInvalidArgument(writer->AddSummary(garbage, 1)));
  CHECK(absl::IsInvalidArgument(writer->AddSerializedEvent(garbage)));
  REQUIRE(writer->Close().ok());
  CHECK(EventsOnDisk(&f.env, writer->path()).size() == 1);
}

/// The raw records (Event bytes) now in `path`.
std::vector<std::string> RecordsOnDisk(Env* env, const std::string& path) {
  auto reader = RecordReader::Open(env, path);
  REQUIRE(reader.ok());
  std::vector<std::string> records;
  std::string record;
  Status s;
  while ((s = (*reader)->ReadRecord(&record)).ok()) records.push_back(record);
  REQUIRE_MESSAGE(absl::IsOutOfRange(s), s.ToString());
  return records;
}

/// A Summary with one Value {tag, simple_value} encoded by hand: tag first
/// or not, the tag's length in its shortest varint or a two-byte one.
std::string HandValue(const std::string& tag, float value, bool tag_first = true, bool long_length = false) {
  std::string tag_field = "\x0a";
  if (long_length) {
    tag_field += static_cast<char>(0x80 | tag.size());
    tag_field += '\0';
  } else {
    tag_field += static_cast<char>(tag.size());
  }
  tag_field += tag;
  std::string value_field = "\x15" + std::string(reinterpret_cast<const char*>(&value), 4);
  const std::string body = tag_first ? tag_field + value_field : value_field + tag_field;
  return "\x0a" + std::string(1, static_cast<char>(body.size())) + body;
}

// The writer puts a Summary in the shape protobuf writes for scalars into the
// Event as it is, without protobuf; other summaries go through protobuf.
// Either way each record must be exactly what protobuf writes for
// Event{wall_time, step, summary parsed from the bytes given}.
TEST_CASE("B150: every summary event's record is protobuf's serialisation of the Event, bit for bit") {
  const float nan = std::nanf("");
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<std::string> summaries = {
      ScalarSummary("loss", 0.25f),
      ScalarSummary("accuracy", 1.0f / 3),
      ScalarSummary("z", 0.0f),  // a zero simple_value is still written (oneof)
      ScalarSummary("neg0", -0.0f),
      ScalarSummary("nan", nan),
      ScalarSummary("inf", inf),
      ScalarSummary("-inf", -inf),
      ScalarSummary("tiny", std::numeric_limits<float>::denorm_min()),
      ScalarSummary("max", std::numeric_limits<float>::max()),
      ScalarSummary(std::string(118, 't'), 1.0f),  // value length 127: one varint byte
      ScalarSummary(std::string(119, 't'), 2.0f),  // 128: two
      ScalarSummary(std::string(300, 'l'), 3.0f),  // a long tag
      ScalarSummary(std::string("nul\0tag", 7), 4.0f),
      ScalarSummary("gr\xc3\xbc\xc3\x9f" "e", 5.0f),  // UTF-8 beyond ASCII: protobuf's path
      MergeSummaries({ScalarSummary("a", 1), ScalarSummary("b", 2), ScalarSummary("a", 3)}),
      "",                                    // an empty Summary
      HandValue("order", 6.0f, /*tag_first=*/false),  // fields out of protobuf's order
      HandValue("long", 7.0f, true, /*long_length=*/true),  // a longer varint than needed
      TextSummary("text", "metadata"),
      *HistogramSummary("h", *Tensor::FromVector<float>({1, 2, 3}, {3})),
  };
  const std::vector<int64_t> steps = {0,   1,   -1, 127, 128, std::numeric_limits<int64_t>::max(),
                                      std::numeric_limits<int64_t>::min()};
  // Wall times: the fixture's, and 0 (proto3 leaves a zero wall_time out).
  for (const absl::Time wall : {absl::FromUnixMillis(1700000000250), absl::UnixEpoch()}) {
    CAPTURE(wall);
    Fixture f;
    f.clock.SetWallTime(wall);
    f.options.max_queue = 1000;
    auto writer = f.Create();
    std::vector<std::string> expected;
    for (std::size_t i = 0; i < summaries.size(); ++i) {
      for (int64_t step : steps) {
        proto::Event event;
        event.set_wall_time(static_cast<double>(absl::ToUnixMicros(wall)) / 1e6);
        event.set_step(step);
        REQUIRE(event.mutable_summary()->ParseFromString(summaries[i]));
        // B150: only the first value of a tag keeps metadata (only the text
        // and histogram summaries have any; their first is at steps[0]).
        if (step != steps.front()) {
          for (auto& v : *event.mutable_summary()->mutable_value()) v.clear_metadata();
        }
        expected.push_back(event.SerializeAsString());
        REQUIRE(writer->AddSummary(summaries[i], step).ok());
      }
    }
    REQUIRE(writer->Close().ok());
    const std::vector<std::string> records = RecordsOnDisk(&f.env, writer->path());
    REQUIRE(records.size() == expected.size() + 1);
    for (std::size_t i = 0; i < expected.size(); ++i) {
      CAPTURE(i);
      CHECK(records[i + 1] == expected[i]);
      proto::Event back;  // and it parses back to the same Event
      REQUIRE(back.ParseFromString(records[i + 1]));
      CHECK(back.SerializeAsString() == expected[i]);
    }
  }
}

TEST_CASE("B150: the tags of plain scalar summaries count as seen: a later value of the tag loses its metadata") {
  Fixture f;
  auto writer = f.Create();
  REQUIRE(writer->AddSummary(ScalarSummary("a", 1), 1).ok());
  REQUIRE(writer->AddSummary(MergeSummaries({TextSummary("a", "x"), TextSummary("b", "y")}), 2).ok());
  REQUIRE(writer->Close().ok());
  const auto events = EventsOnDisk(&f.env, writer->path());
  REQUIRE(events.size() == 3);
  CHECK_FALSE(events[2].summary().value(0).has_metadata());
  CHECK(events[2].summary().value(1).metadata().plugin_data().plugin_name() == "text");
}

TEST_CASE("AddSummaries: the events AddSummary would queue; one write when max_queue is reached; bad ones skipped") {
  Fixture f;
  f.options.max_queue = 3;
  auto writer = f.Create();
  REQUIRE(writer->AddSummary(ScalarSummary("first", 0), 0).ok());  // B148: written at once
  const std::vector<std::string> summaries = {ScalarSummary("a", 1), ScalarSummary("b", 2)};
  std::vector<EventFileWriter::SummaryAtStep> batch = {{summaries[0], 1}, {summaries[1], 2}};
  REQUIRE(writer->AddSummaries(batch).ok());
  CHECK(EventsOnDisk(&f.env, writer->path()).size() == 2);  // 2 < max_queue: still queued
  const std::string garbage = "\xff\xff";
  batch = {{garbage, 3}, {summaries[0], 4}, {garbage, 5}, {summaries[1], 6}};
  const Status s = writer->AddSummaries(batch);
  CHECK(absl::IsInvalidArgument(s));
  CHECK_MESSAGE(absl::StrContains(s.message(), "summary 0 of 4"), s.message());
  CHECK_MESSAGE(absl::StrContains(s.message(), "1 more skipped"), s.message());
  // 4 queued >= max_queue: all written by the call.
  auto events = EventsOnDisk(&f.env, writer->path());
  REQUIRE(events.size() == 6);
  std::vector<int64_t> steps;
  for (const auto& e : events) steps.push_back(e.step());
  CHECK(steps == std::vector<int64_t>{0, 0, 1, 2, 4, 6});
  CHECK(events[5].summary().value(0).tag() == "b");
  REQUIRE(writer->Close().ok());
  CHECK(absl::IsFailedPrecondition(writer->AddSummaries(batch)));
}

TEST_CASE("Create rejects bad options and reports Env errors naming the path") {
  Fixture f;
  for (int max_queue : {0, -1}) {
    f.options.max_queue = max_queue;
    CHECK(absl::IsInvalidArgument(EventFileWriter::Create(kLogdir, f.options).status()));
  }
  f.options.max_queue = 10;
  for (double flush_secs : {0.0, -1.0, std::nan(""), HUGE_VAL}) {
    f.options.flush_secs = flush_secs;
    CHECK(absl::IsInvalidArgument(EventFileWriter::Create(kLogdir, f.options).status()));
  }
  f.options.flush_secs = 1;
  REQUIRE(WriteStringToFile(&f.env, "/file", "x").ok());
  const auto s = EventFileWriter::Create("/file/run", f.options).status();
  CHECK_FALSE(s.ok());
  CHECK_MESSAGE(absl::StrContains(s.message(), "/file"), s.message());
}

// -- reading back ------------------------------------------------------------------------

TEST_CASE("with the real Env, an event file is flushed at creation and reads back with ReadEventFile") {
  TempDir dir;
  ManualClock clock(absl::FromUnixMillis(1700000000500));
  EventFileWriterOptions options;
  options.clock = &clock;
  options.hostname = "realhost";
  options.filename_suffix = ".x";
  const std::string logdir = dir.path() + "/train/logs";
  auto writer = EventFileWriter::Create(logdir, options);
  REQUIRE(writer.ok());
  auto early = ReadEventFile(Env::Default(), (*writer)->path());  // flushed, though not closed
  REQUIRE(early.ok());
  REQUIRE(early->size() == 1);

  auto histogram = HistogramSummary("w", *Tensor::FromVector<float>({0, 1, 1, 2, -3}, {5}));
  REQUIRE(histogram.ok());
  REQUIRE((*writer)->AddSessionLog(SessionLogStatus::kStart, 1).ok());
  clock.Advance(absl::Seconds(1));
  const std::string summary_bytes =
      MergeSummaries({ScalarSummary("loss", 0.25f), *histogram, TextSummary("t", "hi")});
  REQUIRE((*writer)->AddSummary(summary_bytes, 2).ok());
  REQUIRE((*writer)->AddSessionLog(SessionLogStatus::kStop, std::nullopt).ok());
  REQUIRE((*writer)->Close().ok());

  auto files = ListEventFiles(Env::Default(), logdir);
  REQUIRE(files.ok());
  CHECK(*files == std::vector<std::string>{logdir + "/events.out.tfevents.1700000000.realhost.x"});
  auto events = ReadEventFile(Env::Default(), files->at(0));
  REQUIRE(events.ok());
  REQUIRE(events->size() == 4);
  const Event& version = (*events)[0];
  CHECK(version.kind == Event::Kind::kFileVersion);
  CHECK(version.file_version == "brain.Event:2");
  CHECK(version.wall_time == 1700000000.5);
  CHECK((*events)[1].kind == Event::Kind::kSessionLog);
  CHECK((*events)[1].session_status == SessionLogStatus::kStart);
  CHECK((*events)[1].step == 1);

  const Event& summary = (*events)[2];
  CHECK(summary.kind == Event::Kind::kSummary);
  CHECK(summary.step == 2);
  CHECK(summary.wall_time == 1700000001.5);
  REQUIRE(summary.values.size() == 3);
  CHECK(summary.values[0].kind == SummaryValue::Kind::kScalar);
  CHECK(summary.values[0].tag == "loss");
  CHECK(summary.values[0].scalar == 0.25);
  const SummaryValue& h = summary.values[1];
  CHECK(h.kind == SummaryValue::Kind::kHistogram);
  CHECK(h.histogram.num == 5);
  CHECK(h.histogram.min == -3);
  CHECK(h.histogram.max == 2);
  CHECK(h.histogram.sum == 1);
  CHECK(h.histogram.sum_squares == 15);
  CHECK(h.histogram.bucket == std::vector<double>{0, 1, 0, 1, 0, 2, 0, 1, 0});
  CHECK(h.histogram.bucket_limit.size() == 9);
  CHECK(summary.values[2].kind == SummaryValue::Kind::kText);
  CHECK(summary.values[2].plugin_name == "text");
  CHECK(summary.values[2].text == "hi");

  CHECK((*events)[3].session_status == SessionLogStatus::kStop);
  CHECK((*events)[3].step == 0);
}

/// One serialized Summary value built by `fill`, parsed back by ParseEvent.
template <class Fill>
SummaryValue ParsedValue(Fill fill) {
  proto::Event event;
  proto::Summary::Value* v = event.mutable_summary()->add_value();
  v->set_tag("v");
  fill(v);
  auto parsed = ParseEvent(event.SerializeAsString());
  REQUIRE(parsed.ok());
  REQUIRE(parsed->values.size() == 1);
  return parsed->values[0];
}

TEST_CASE("ParseEvent reads numeric scalar tensors (TF2 scalars) as kTensor from any encoding") {
  const SummaryValue content = ParsedValue([](proto::Summary::Value* v) {
    v->mutable_metadata()->mutable_plugin_data()->set_plugin_name("scalars");
    const float x = 0.75f;
    v->mutable_tensor()->set_dtype(proto::DT_FLOAT);
    v->mutable_tensor()->set_tensor_content(std::string(reinterpret_cast<const char*>(&x), sizeof x));
  });
  CHECK(content.kind == SummaryValue::Kind::kTensor);
  CHECK(content.plugin_name == "scalars");
  CHECK(content.scalar == 0.75);

  CHECK(ParsedValue([](proto::Summary::Value* v) {
          v->mutable_tensor()->set_dtype(proto::DT_DOUBLE);
          v->mutable_tensor()->add_double_val(-2.5);
        }).scalar == -2.5);
  CHECK(ParsedValue([](proto::Summary::Value* v) {
          v->mutable_tensor()->set_dtype(proto::DT_INT64);
          v->mutable_tensor()->add_int64_val(int64_t{1} << 40);
        }).scalar == static_cast<double>(int64_t{1} << 40));
  CHECK(ParsedValue([](proto::Summary::Value* v) {
          v->mutable_tensor()->set_dtype(proto::DT_INT32);
          v->mutable_tensor()->add_int_val(-7);
        }).scalar == -7);
  const SummaryValue zero =
      ParsedValue([](proto::Summary::Value* v) { v->mutable_tensor()->set_dtype(proto::DT_FLOAT); });
  CHECK(zero.kind == SummaryValue::Kind::kTensor);
  CHECK(zero.scalar == 0);
}

TEST_CASE("ParseEvent: any string tensor is kText; non-scalar tensors and empty values are kOther") {
  const SummaryValue text = ParsedValue([](proto::Summary::Value* v) {
    v->mutable_tensor()->set_dtype(proto::DT_STRING);
    v->mutable_tensor()->add_string_val("plain");
  });
  CHECK(text.kind == SummaryValue::Kind::kText);
  CHECK(text.plugin_name.empty());
  CHECK(text.text == "plain");
  const SummaryValue vector = ParsedValue([](proto::Summary::Value* v) {
    v->mutable_tensor()->set_dtype(proto::DT_FLOAT);
    v->mutable_tensor()->mutable_tensor_shape()->add_dim()->set_size(2);
    v->mutable_tensor()->add_float_val(1);
    v->mutable_tensor()->add_float_val(2);
  });
  CHECK(vector.kind == SummaryValue::Kind::kOther);
  CHECK(ParsedValue([](proto::Summary::Value*) {}).kind == SummaryValue::Kind::kOther);
}

TEST_CASE("ParseEvent: log messages, graphs, unknown payloads, empty events and bytes that are no Event") {
  proto::Event event;
  event.set_step(3);
  event.mutable_log_message()->set_message("note");
  auto parsed = ParseEvent(event.SerializeAsString());
  REQUIRE(parsed.ok());
  CHECK(parsed->kind == Event::Kind::kLogMessage);
  CHECK(parsed->message == "note");
  CHECK(parsed->step == 3);

  event.set_graph_def("g");
  CHECK(ParseEvent(event.SerializeAsString())->kind == Event::Kind::kGraph);
  // Field 8 (TF's tagged_run_metadata) is not declared here.
  CHECK(ParseEvent(std::string("\x42\x00", 2))->kind == Event::Kind::kOther);
  CHECK(ParseEvent("")->kind == Event::Kind::kNone);
  CHECK(absl::IsInvalidArgument(ParseEvent("\xff\xff\xff").status()));
}

TEST_CASE("ReadEventFile names file and offset of a record that is not an Event, and of a corrupt one") {
  MemEnv env;
  {
    auto file = env.NewWritableFile("/ev");
    REQUIRE(file.ok());
    RecordWriter writer(file->get());
    REQUIRE(writer.WriteRecord(proto::Event().SerializeAsString()).ok());
    REQUIRE(writer.WriteRecord("\xff\xff\xff").ok());
    REQUIRE((*file)->Close().ok());
  }
  const auto s = ReadEventFile(&env, "/ev").status();
  CHECK(absl::IsInvalidArgument(s));
  CHECK(s.message() == "/ev: record at offset 16 is not an Event");

  std::string bytes = *env.ReadFileToString("/ev");
  bytes.back() ^= 1;
  REQUIRE(WriteStringToFile(&env, "/ev", bytes).ok());
  const auto corrupt = ReadEventFile(&env, "/ev").status();
  CHECK(absl::IsDataLoss(corrupt));
  CHECK(absl::StartsWith(corrupt.message(), "/ev: corrupted record at offset 16: "));
}

TEST_CASE("ReadEventFile with allow_truncated_tail ignores a cut last record") {
  Fixture f;
  auto writer = f.Create();
  REQUIRE(writer->AddSummary(ScalarSummary("loss", 1), 1).ok());
  REQUIRE(writer->Close().ok());
  const std::string bytes = *f.env.ReadFileToString(writer->path());
  REQUIRE(WriteStringToFile(&f.env, writer->path(), bytes.substr(0, bytes.size() - 2)).ok());
  CHECK(absl::IsDataLoss(ReadEventFile(&f.env, writer->path()).status()));
  auto events = ReadEventFile(&f.env, writer->path(), /*allow_truncated_tail=*/true);
  REQUIRE(events.ok());
  REQUIRE(events->size() == 1);
  CHECK((*events)[0].kind == Event::Kind::kFileVersion);
}

TEST_CASE("ListEventFiles lists the names containing tfevents, sorted; NOT_FOUND for a missing directory") {
  MemEnv env;
  REQUIRE(env.RecursivelyCreateDir("/d").ok());
  for (const char* name :
       {"events.out.tfevents.2.h", "checkpoint", "events.out.tfevents.1.h", "x.tfevents.v2"}) {
    REQUIRE(WriteStringToFile(&env, JoinPath("/d", name), "").ok());
  }
  auto files = ListEventFiles(&env, "/d");
  REQUIRE(files.ok());
  CHECK(*files == std::vector<std::string>{"/d/events.out.tfevents.1.h", "/d/events.out.tfevents.2.h",
                                           "/d/x.tfevents.v2"});
  CHECK(absl::IsNotFound(ListEventFiles(&env, "/missing").status()));
}

}  // namespace
}  // namespace foreman

namespace foreman {
namespace {

Event SummaryAt(int64_t step) {
  Event e;
  e.kind = Event::Kind::kSummary;
  e.step = step;
  return e;
}

Event StartAt(int64_t step) {
  Event e;
  e.kind = Event::Kind::kSessionLog;
  e.session_status = SessionLogStatus::kStart;
  e.step = step;
  return e;
}

TEST_CASE("B154: EventsKeptAfterPurge drops the earlier events at or after a START's step, in reading order") {
  // Run 1: summaries at 1..4; a restart from step 2 (START at 3); run 2
  // replays 3, 4; a restart from step 1 (START at 2) drops all but step 1.
  const std::vector<Event> events = {SummaryAt(1), SummaryAt(2), SummaryAt(3), SummaryAt(4), StartAt(3),
                                     SummaryAt(3), SummaryAt(4), StartAt(2),   SummaryAt(2)};
  CHECK(EventsKeptAfterPurge(std::vector<Event>(events.begin(), events.begin() + 7)) ==
        std::vector<std::size_t>{0, 1, 4, 5, 6});
  CHECK(EventsKeptAfterPurge(events) == std::vector<std::size_t>{0, 7, 8});
  // Other session logs purge nothing; an empty input keeps nothing.
  Event stop = StartAt(1);
  stop.session_status = SessionLogStatus::kStop;
  CHECK(EventsKeptAfterPurge({SummaryAt(5), stop}) == std::vector<std::size_t>{0, 1});
  CHECK(EventsKeptAfterPurge({}).empty());
}

}  // namespace
}  // namespace foreman
