// Tests for foreman::FileWriter (file_writer.hpp), the asynchronous writer:
// what reaches the event file, read back with the public event reader.

#include "foreman/file_writer.hpp"

#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "foreman/clock.hpp"
#include "foreman/event_reader.hpp"
#include "foreman/mem_env.hpp"
#include "foreman/summary.hpp"
#include "support/test_util.hpp"

namespace foreman {
namespace {

using foreman::testing::TempDir;

constexpr absl::Duration kTimeout = absl::Seconds(30);

std::unique_ptr<FileWriter> MustCreate(const std::string& logdir, const FileWriterOptions& options = {}) {
  auto writer = FileWriter::Create(logdir, options);
  REQUIRE_MESSAGE(writer.ok(), writer.status().ToString());
  return *std::move(writer);
}

// The events of the one event file in `logdir` (of `env`).
std::vector<Event> EventsOf(const std::string& logdir, Env* env = Env::Default()) {
  auto files = ListEventFiles(env, logdir);
  REQUIRE_MESSAGE(files.ok(), files.status().ToString());
  REQUIRE(files->size() == 1);
  auto events = ReadEventFile(env, files->front());
  REQUIRE_MESSAGE(events.ok(), events.status().ToString());
  return *std::move(events);
}

// (step, tag, value) of each summary value, in file order.
struct Scalar {
  int64_t step;
  std::string tag;
  double value;
};
std::vector<Scalar> Scalars(const std::vector<Event>& events) {
  std::vector<Scalar> out;
  for (const Event& e : events) {
    if (e.kind != Event::Kind::kSummary) continue;
    for (const SummaryValue& v : e.values) out.push_back({e.step, v.tag, v.scalar});
  }
  return out;
}

TEST_CASE("summaries added before Flush are in the event file, in order, with their steps") {
  TempDir dir("file_writer");
  const std::string logdir = dir / "run";  // created by Create
  auto writer = MustCreate(logdir);
  CHECK(writer->logdir() == logdir);
  // More than max_queue (10): several batches reach the file.
  constexpr int kCount = 25;
  for (int i = 0; i < kCount; ++i) {
    writer->AddSummary(ScalarSummary(i % 2 == 0 ? "loss" : "accuracy", static_cast<float>(i)), 100 + i);
  }
  writer->AddSessionLog(SessionLogStatus::kCheckpoint, 124, "model.ckpt-124");
  REQUIRE(writer->Flush(kTimeout).ok());

  // Read while the writer is still open: Flush put everything in the file.
  const std::vector<Event> events = EventsOf(logdir);
  REQUIRE(events.size() == kCount + 2);
  CHECK(events.front().kind == Event::Kind::kFileVersion);
  CHECK(events.front().file_version == "brain.Event:2");
  const std::vector<Scalar> scalars = Scalars(events);
  REQUIRE(scalars.size() == kCount);
  for (int i = 0; i < kCount; ++i) {
    CAPTURE(i);
    CHECK(scalars[i].step == 100 + i);
    CHECK(scalars[i].tag == (i % 2 == 0 ? "loss" : "accuracy"));
    CHECK(scalars[i].value == doctest::Approx(i));
  }
  const Event& last = events.back();
  CHECK(last.kind == Event::Kind::kSessionLog);
  CHECK(last.session_status == SessionLogStatus::kCheckpoint);
  CHECK(last.step == 124);
  CHECK(last.checkpoint_path == "model.ckpt-124");
  CHECK(writer->Close(kTimeout).ok());
}

TEST_CASE("after Close: Flush is UNAVAILABLE naming the logdir, adds are dropped, Close returns its first result") {
  TempDir dir("file_writer");
  auto writer = MustCreate(dir.path());
  writer->AddSummary(ScalarSummary("loss", 1.0f), 1);
  writer->AddSummary(ScalarSummary("loss", 2.0f), 2);
  // Close flushes what was added (no Flush before it).
  REQUIRE(writer->Close(kTimeout).ok());

  Status flushed = writer->Flush(kTimeout);
  CHECK(flushed.code() == absl::StatusCode::kUnavailable);
  CHECK_MESSAGE(absl::StrContains(flushed.message(), dir.path()), flushed.ToString());

  writer->AddSummary(ScalarSummary("loss", 3.0f), 3);
  writer->AddSessionLog(SessionLogStatus::kStop, std::nullopt);
  CHECK(writer->Close(kTimeout).ok());
  writer.reset();

  const std::vector<Scalar> scalars = Scalars(EventsOf(dir.path()));
  REQUIRE(scalars.size() == 2);
  CHECK(scalars[0].step == 1);
  CHECK(scalars[1].step == 2);
  CHECK(EventsOf(dir.path()).size() == 3);  // file_version + 2; nothing after Close
}

TEST_CASE("the destructor closes: what was added reaches the file") {
  TempDir dir("file_writer");
  {
    auto writer = MustCreate(dir.path());
    for (int i = 0; i < 3; ++i) writer->AddSummary(ScalarSummary("loss", 0.5f), i);
  }
  const std::vector<Scalar> scalars = Scalars(EventsOf(dir.path()));
  REQUIRE(scalars.size() == 3);
  CHECK(scalars[2].step == 2);
}

TEST_CASE("null options mean the defaults: Env::Default() and Clock::Real()") {
  TempDir dir("file_writer");
  FileWriterOptions o;
  o.env = nullptr;
  o.clock = nullptr;
  auto writer = MustCreate(dir.path(), o);
  writer->AddSummary(ScalarSummary("loss", 0.5f), 7);
  REQUIRE(writer->Close(absl::Seconds(60)).ok());
  const std::vector<Scalar> scalars = Scalars(EventsOf(dir.path()));
  REQUIRE(scalars.size() == 1);
  CHECK(scalars[0].step == 7);
}

TEST_CASE("a logdir that cannot be created: the Env's error, naming the logdir") {
  TempDir dir("file_writer");
  const std::string file = dir / "a_file";
  std::ofstream(file) << "not a directory\n";
  const std::string logdir = file + "/run";
  auto writer = FileWriter::Create(logdir);
  REQUIRE_FALSE(writer.ok());
  CHECK(writer.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK_MESSAGE(absl::StrContains(writer.status().message(), absl::StrCat("FileWriter(", logdir, ")")),
                writer.status().ToString());

  auto empty = FileWriter::Create("");
  REQUIRE_FALSE(empty.ok());
  CHECK(empty.status().code() == absl::StatusCode::kInvalidArgument);
}

TEST_CASE("AddSummary from two threads, then Flush: every summary, each thread's in its order") {
  TempDir dir("file_writer");
  auto writer = MustCreate(dir.path());
  constexpr int kPerThread = 500;
  auto add = [&](const std::string& tag) {
    for (int i = 0; i < kPerThread; ++i) writer->AddSummary(ScalarSummary(tag, static_cast<float>(i)), i);
  };
  std::thread a(add, "a");
  std::thread b(add, "b");
  a.join();
  b.join();
  REQUIRE(writer->Flush(kTimeout).ok());

  std::vector<int64_t> steps_a, steps_b;
  for (const Scalar& s : Scalars(EventsOf(dir.path()))) {
    REQUIRE((s.tag == "a" || s.tag == "b"));
    (s.tag == "a" ? steps_a : steps_b).push_back(s.step);
  }
  std::vector<int64_t> expected(kPerThread);
  for (int i = 0; i < kPerThread; ++i) expected[i] = i;
  CHECK(steps_a == expected);
  CHECK(steps_b == expected);
  CHECK(writer->Close(kTimeout).ok());
}

TEST_CASE("a summary that does not parse: the others are written, Flush and Close return INVALID_ARGUMENT") {
  TempDir dir("file_writer");
  auto writer = MustCreate(dir.path());
  writer->AddSummary(ScalarSummary("loss", 1.0f), 1);
  writer->AddSummary("\xff\xff not a summary", 2);
  writer->AddSummary(ScalarSummary("loss", 3.0f), 3);
  Status flushed = writer->Flush(kTimeout);
  CHECK_MESSAGE(flushed.code() == absl::StatusCode::kInvalidArgument, flushed.ToString());
  // Sticky: the next Flush and Close report it too.
  CHECK(writer->Flush(kTimeout).code() == absl::StatusCode::kInvalidArgument);
  CHECK(writer->Close(kTimeout).code() == absl::StatusCode::kInvalidArgument);
  const std::vector<Scalar> scalars = Scalars(EventsOf(dir.path()));
  REQUIRE(scalars.size() == 2);
  CHECK(scalars[0].step == 1);
  CHECK(scalars[1].step == 3);
}

TEST_CASE("options: the file goes through options.env, wall times come from options.clock") {
  MemEnv env;
  ManualClock clock(absl::FromUnixSeconds(1800000000));
  FileWriterOptions options;
  options.env = &env;
  options.clock = &clock;
  auto writer = MustCreate("/mem/run", options);
  writer->AddSummary(ScalarSummary("loss", 1.0f), 7);
  REQUIRE(writer->Flush(kTimeout).ok());
  const std::vector<Event> events = EventsOf("/mem/run", &env);
  REQUIRE(events.size() == 2);
  CHECK(events[1].step == 7);
  CHECK(events[1].wall_time == doctest::Approx(1800000000.0));
  CHECK(writer->Close(kTimeout).ok());
  CHECK_FALSE(std::filesystem::exists("/mem/run"));
}

}  // namespace
}  // namespace foreman
