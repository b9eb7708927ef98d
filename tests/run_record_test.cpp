// The run record (RunRecordWriter in include/foreman/fault.hpp, its reader in
// src/fault/run_record.hpp) and what the chaos invariants make of it
// (ParseTrainLog in src/fault/chaos_checks.hpp).
#include <doctest/doctest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/strings/match.h"
#include "fault/chaos_checks.hpp"
#include "fault/run_record.hpp"
#include "foreman/fault.hpp"
#include "support/test_util.hpp"

namespace foreman {
namespace {

using internal::ParseRunRecord;
using internal::ParseTrainLog;
using internal::ReadRunRecord;
using internal::ReadRunRecordFile;
using json = nlohmann::json;
using testing::TempDir;

std::string ReadText(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

TEST_CASE("RunRecordWriter appends one flushed JSON object per line, in order; ReadRunRecord reads them back") {
  TempDir dir("run_record_test");
  {
    auto w = RunRecordWriter::Open(dir.path());
    REQUIRE(w.ok());
    (*w)->Restore(dir / "model.ckpt-40", 40);
    (*w)->Step(41);
    (*w)->Save(41, dir / "model.ckpt-41");
    // Flushed as it happens: readable while the writer is still open.
    auto so_far = ReadRunRecord(Env::Default(), dir.path());
    REQUIRE(so_far.ok());
    CHECK(so_far->size() == 3);
    (*w)->Recovery(absl::UnavailableError("ps lost"), 45, 41, 4);
    (*w)->InjectedStop("disk-1");
    (*w)->Exit("SIGTERM");
    CHECK((*w)->status().ok());
  }
  {  // a second process appends
    auto w = RunRecordWriter::Open(dir.path());
    REQUIRE(w.ok());
    (*w)->Exit("");
  }
  auto events = ReadRunRecord(Env::Default(), dir.path());
  REQUIRE(events.ok());
  REQUIRE(events->size() == 7);
  const std::vector<json>& e = *events;
  CHECK(e[0] == json::parse(R"({"event":"restore","checkpoint":"model.ckpt-40","global_step":40})"));
  CHECK(e[1] == json::parse(R"({"event":"step","global_step":41})"));
  CHECK(e[2] == json::parse(R"({"event":"save","global_step":41,"checkpoint":"model.ckpt-41","durable":true})"));
  CHECK(e[3] == json::parse(R"({"event":"recovery","cause":"UNAVAILABLE: ps lost","global_step_before":45,
                                 "restored_global_step":41,"steps_lost":4})"));
  CHECK(e[4] == json::parse(R"({"event":"injected_stop","fault":"disk-1"})"));
  CHECK(e[5] == json::parse(R"({"event":"exit","stopped_by_signal":"SIGTERM"})"));
  CHECK(e[6] == json::parse(R"({"event":"exit","stopped_by_signal":null})"));
  // One object per line, each line ending in '\n'.
  const std::string text = ReadText(dir / kRunRecordFile);
  CHECK(std::count(text.begin(), text.end(), '\n') == 7);
  CHECK(text.back() == '\n');
}

TEST_CASE("RunRecordWriter::OpenFile writes the file it is given; a failure is recorded with its stage and code") {
  TempDir dir("run_record_test");
  const std::string path = dir / "chief-0.jsonl";
  {
    auto w = RunRecordWriter::OpenFile(path);
    REQUIRE_MESSAGE(w.ok(), w.status().ToString());
    (*w)->Step(7);
    (*w)->Failed("training failed", absl::UnavailableError("ps 0 gone (waiting for the ps tasks)"));
    CHECK((*w)->status().ok());
  }
  CHECK(!std::filesystem::exists(dir / kRunRecordFile));  // the given file, not the directory's
  auto events = ReadRunRecordFile(Env::Default(), path);
  REQUIRE_MESSAGE(events.ok(), events.status().ToString());
  REQUIRE(events->size() == 2);
  CHECK((*events)[0] == json::parse(R"({"event":"step","global_step":7})"));
  CHECK((*events)[1] == json::parse(R"json({"event":"failed","what":"training failed","code":"UNAVAILABLE",
                                            "message":"ps 0 gone (waiting for the ps tasks)"})json"));
  auto bad = RunRecordWriter::OpenFile(dir / "missing/r.jsonl");
  REQUIRE(!bad.ok());
  CHECK(absl::IsInternal(bad.status()));
  CHECK_MESSAGE(absl::StrContains(bad.status().message(), "missing/r.jsonl"), bad.status());
  auto none = ReadRunRecordFile(Env::Default(), dir / "none.jsonl");
  REQUIRE(none.ok());
  CHECK(none->empty());
}

TEST_CASE("No record is no events; a directory that does not exist cannot be opened") {
  TempDir dir("run_record_test");
  auto none = ReadRunRecord(Env::Default(), dir.path());
  REQUIRE(none.ok());
  CHECK(none->empty());
  auto w = RunRecordWriter::Open(dir / "missing");
  REQUIRE(!w.ok());
  CHECK(absl::IsInternal(w.status()));
  CHECK(w.status().message().find("missing/run_record.jsonl") != std::string_view::npos);
}

TEST_CASE("A torn last line (a killed process) is skipped by the reader and cut off by the next writer") {
  const std::string two = "{\"event\":\"step\",\"global_step\":1}\n{\"event\":\"step\",\"global_step\":2}\n";
  bool torn = true;
  auto whole = ParseRunRecord(two, "r", &torn);
  REQUIRE(whole.ok());
  CHECK(whole->size() == 2);
  CHECK(!torn);
  auto cut = ParseRunRecord(two + "{\"event\":\"st", "r", &torn);
  REQUIRE(cut.ok());
  CHECK(cut->size() == 2);
  CHECK(torn);

  TempDir dir("run_record_test");
  std::ofstream(dir / kRunRecordFile) << two << "{\"event\":\"save\",\"glo";
  {
    auto w = RunRecordWriter::Open(dir.path());
    REQUIRE(w.ok());
    (*w)->Step(3);
  }
  CHECK(ReadText(dir / kRunRecordFile) == two + "{\"event\":\"step\",\"global_step\":3}\n");
  auto events = ReadRunRecord(Env::Default(), dir.path());
  REQUIRE(events.ok());
  CHECK(events->size() == 3);
}

TEST_CASE("A bad line before the last is DATA_LOSS naming the file and the line's number") {
  const std::string text =
      "{\"event\":\"step\",\"global_step\":1}\n{\"event\":\"st\n{\"event\":\"step\",\"global_step\":2}\n";
  auto bad = ParseRunRecord(text, "run/run_record.jsonl");
  REQUIRE(!bad.ok());
  CHECK(absl::IsDataLoss(bad.status()));
  CHECK(bad.status().message() == "run/run_record.jsonl:2: not a JSON object: {\"event\":\"st");
  // A terminated last line is no torn write either.
  auto last = ParseRunRecord("{\"event\":\"step\",\"global_step\":1}\nnope\n", "r");
  REQUIRE(!last.ok());
  CHECK(last.status().message() == "r:2: not a JSON object: nope");
  auto no_event = ParseRunRecord("{\"event\":\"step\"}\n[1]\n", "r");
  REQUIRE(!no_event.ok());
  CHECK(no_event.status().message() == "r:2: not a JSON object: [1]");
  auto unnamed = ParseRunRecord("{\"step\":1}\n", "r");
  REQUIRE(!unnamed.ok());
  CHECK(unnamed.status().message() == "r:1: no \"event\" string: {\"step\":1}");
}

std::vector<json> Events(const std::string& lines) {
  auto events = ParseRunRecord(lines, "r");
  REQUIRE(events.ok());
  return *events;
}

TEST_CASE("ParseTrainLog: a fresh start, steps +1, a recovery to the latest checkpoint, a graceful stop") {
  // As foreman train writes it: the save at session creation, steps, the
  // recovery's event after the first good step on the restored session.
  const internal::TrainLog log = ParseTrainLog(Events(R"({"event":"save","global_step":0}
{"event":"step","global_step":1}
{"event":"step","global_step":2}
{"event":"save","global_step":2}
{"event":"step","global_step":3}
{"event":"save","global_step":2}
{"event":"step","global_step":3}
{"event":"recovery","cause":"UNAVAILABLE: x","global_step_before":3,"restored_global_step":2,"steps_lost":1}
{"event":"step","global_step":4}
{"event":"exit","stopped_by_signal":"SIGTERM"}
)"),
                                               "service restart 1: checkpoint_saver restarted; reason\n");
  CHECK(!log.restored_step.has_value());
  CHECK(log.last_step == 4);
  CHECK(log.recoveries == 1);
  CHECK(log.recovery_steps_lost == 1);
  CHECK(log.stopped_by_signal);
  CHECK(log.stopped_by_fault.empty());
  CHECK(log.step_errors.empty());
  REQUIRE(log.service_restarts.size() == 1);
  CHECK(log.service_restarts[0] == "checkpoint_saver restarted; reason");
}

TEST_CASE("ParseTrainLog: a restore, a skipped step, a recovery to an older checkpoint, an injected stop") {
  const internal::TrainLog log = ParseTrainLog(Events(R"({"event":"save","global_step":20}
{"event":"restore","checkpoint":"model.ckpt-20","global_step":20}
{"event":"step","global_step":21}
{"event":"step","global_step":23}
{"event":"save","global_step":23}
{"event":"step","global_step":21}
{"event":"recovery","cause":"UNAVAILABLE: x","global_step_before":23,"restored_global_step":20,"steps_lost":3}
{"event":"injected_stop","fault":"disk-1"}
)"),
                                               "");
  REQUIRE(log.restored_step.has_value());
  CHECK(*log.restored_step == 20);
  CHECK(log.last_step == 21);
  CHECK(log.stopped_by_fault == "disk-1");
  CHECK(!log.stopped_by_signal);
  REQUIRE(log.step_errors.size() == 2);
  CHECK(log.step_errors[0] == "step 23 reported after step 21");
  CHECK(log.step_errors[1] == "a recovery restored step 20, but the latest checkpoint is step 23");
  // No record: the process did not start.
  CHECK(ParseTrainLog({}, "step 1: loss 2.3\n").last_step == -1);
}

}  // namespace
}  // namespace foreman
