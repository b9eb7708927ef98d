// RunLocalCluster (foreman/local_cluster.hpp) with a stand-in for the
// foreman executable: a shell script that prints its task and flags and
// exits (the chief 3), or hangs (worker 1, with --stuck). `foreman cluster
// local` over the real `foreman train`: tests/cluster_cli_test.sh.
#include "foreman/local_cluster.hpp"

#include <sys/stat.h>

#include <chrono>
#include <fstream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <doctest/doctest.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "support/test_util.hpp"

namespace foreman {
namespace {

using foreman::testing::TempDir;

// argv: train <flags...> --ps-hosts P --worker-hosts W --job-name J --task-index K
constexpr char kFakeForeman[] = R"(#!/bin/sh
[ "$1" = train ] || exit 90
shift
job= index= flags= hosts= stuck= stubborn=
while [ $# -gt 0 ]; do
  case $1 in
    --job-name) job=$2; shift 2 ;;
    --task-index) index=$2; shift 2 ;;
    --ps-hosts|--worker-hosts) hosts="$hosts $1=$2"; shift 2 ;;
    --stuck) stuck=1; flags="$flags $1"; shift ;;
    --stubborn) stubborn=1; flags="$flags $1"; shift ;;
    *) flags="$flags $1"; shift ;;
  esac
done
echo "out $job $index:$flags;$hosts"
printf 'err %s %s' "$job" "$index" >&2
ready="$(dirname "$0")/stubborn_ready"
case $job$index in
  worker0) # With --stubborn the chief exits only once worker 1 ignores
           # SIGTERM (at most 10 s), so the SIGTERM cannot come before the trap.
           if [ -n "$stubborn" ]; then
             i=0; while [ ! -e "$ready" ] && [ $i -lt 100 ]; do sleep 0.1; i=$((i+1)); done
           fi
           exit 3 ;;
  worker1) [ -n "$stuck" ] && exec sleep 30
           # Ignores SIGTERM, and its child (which inherits that) holds the pipes.
           if [ -n "$stubborn" ]; then trap '' TERM; : > "$ready"; sleep 30; fi ;;
esac
exit 0
)";

struct Recorded {
  std::vector<std::string> lines;     // "task|out or err|line"
  std::vector<std::string> messages;
};

LocalClusterOptions FakeOptions(const TempDir& dir, Recorded& rec) {
  const std::string program = dir / "fake_foreman.sh";
  {
    std::ofstream f(program);
    f << kFakeForeman;
  }
  REQUIRE(::chmod(program.c_str(), 0755) == 0);
  LocalClusterOptions o;
  o.program = program;
  o.num_ps = 1;
  o.num_workers = 2;
  o.on_task_line = [&rec](std::string_view task, bool is_stderr, std::string_view line) {
    rec.lines.push_back(absl::StrCat(std::string(task), "|", is_stderr ? "err" : "out", "|", std::string(line)));
  };
  o.on_message = [&rec](std::string_view m) { rec.messages.emplace_back(m); };
  return o;
}

bool Has(const std::vector<std::string>& v, const std::string& s) {
  for (const std::string& x : v) {
    if (x == s) return true;
  }
  return false;
}

TEST_CASE("RunLocalCluster: ps tasks then workers, each line handed on, the chief's exit code") {
  TempDir dir;
  Recorded rec;
  LocalClusterOptions o = FakeOptions(dir, rec);
  o.train_flags = {"--train-steps", "5"};
  StatusOr<LocalClusterResult> r = RunLocalCluster(o);
  REQUIRE_MESSAGE(r.ok(), r.status().ToString());
  CHECK(r->exit_code == 3);
  CHECK(r->task_exit_codes ==
        std::vector<std::pair<std::string, int>>{{"ps 0", 0}, {"worker 0", 3}, {"worker 1", 0}});
  REQUIRE(!rec.messages.empty());
  const std::string& first = rec.messages.front();
  CHECK_MESSAGE(absl::StartsWith(first, "1 ps task(s) at 127.0.0.1:"), first);
  CHECK_MESSAGE(absl::EndsWith(first, " (worker 0 is the chief)"), first);
  CHECK(Has(rec.messages, "the chief exited 3; waiting up to 30s for the others"));
  CHECK(rec.messages.back() == "exit codes: ps 0 0, worker 0 3, worker 1 0");
  // Every task got the train flags first, then its own cluster flags (the
  // chief, alone, --signal-ends-training: the user's Ctrl-C to `cluster
  // local` ends the whole job); a last line without '\n' still comes through.
  REQUIRE(rec.lines.size() == 6);
  for (const char* task : {"ps 0", "worker 0", "worker 1"}) {
    const std::string flags = std::string(task) == "worker 0" ? "--train-steps 5 --signal-ends-training" : "--train-steps 5";
    bool found = false;
    for (const std::string& l : rec.lines) {
      if (!absl::StartsWith(l, absl::StrCat(task, "|out|out ", task, ": ", flags, "; --ps-hosts=127.0.0.1:"))) {
        continue;
      }
      found = true;
      CHECK_MESSAGE(absl::StrContains(l, " --worker-hosts=127.0.0.1:"), l);
    }
    CHECK_MESSAGE(found, task);
    CHECK(Has(rec.lines, absl::StrCat(task, "|err|err ", task)));
  }
}

TEST_CASE("RunLocalCluster: a task left running after the chief's grace gets a SIGTERM") {
  TempDir dir;
  Recorded rec;
  LocalClusterOptions o = FakeOptions(dir, rec);
  o.train_flags = {"--stuck"};
  o.end_grace_secs = 0;
  const auto start = std::chrono::steady_clock::now();
  StatusOr<LocalClusterResult> r = RunLocalCluster(o);
  REQUIRE_MESSAGE(r.ok(), r.status().ToString());
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(20));  // not the sleep's 30 s
  CHECK(r->exit_code == 3);
  REQUIRE(r->task_exit_codes.size() == 3);
  // ps 0 exits by itself, but may not have ended (or been reaped) yet when
  // the grace (0 s) ends: then it is named and gets the SIGTERM too.
  const int ps_code = r->task_exit_codes[0].second;
  CHECK((ps_code == 0 || ps_code == 128 + 15));
  CHECK(r->task_exit_codes[1] == std::pair<std::string, int>{"worker 0", 3});
  CHECK(r->task_exit_codes[2] == std::pair<std::string, int>{"worker 1", 128 + 15});
  CHECK(Has(rec.messages, "the chief exited 3; waiting up to 0s for the others"));
  CHECK((Has(rec.messages, "still running after the chief's exit: worker 1; sending SIGTERM") ||
         Has(rec.messages, "still running after the chief's exit: ps 0, worker 1; sending SIGTERM")));
  CHECK(rec.messages.back() == absl::StrCat("exit codes: ps 0 ", ps_code, ", worker 0 3, worker 1 143"));
}

TEST_CASE("RunLocalCluster: a task that ignores the SIGTERM gets a SIGKILL 5 s later, its whole group") {
  TempDir dir;
  Recorded rec;
  LocalClusterOptions o = FakeOptions(dir, rec);
  o.train_flags = {"--stubborn"};
  o.end_grace_secs = 0;
  const auto start = std::chrono::steady_clock::now();
  StatusOr<LocalClusterResult> r = RunLocalCluster(o);
  REQUIRE_MESSAGE(r.ok(), r.status().ToString());
  // The SIGKILL comes 5 s after the SIGTERM; a kill of the task alone would
  // leave its `sleep 30` holding the pipes, and the run would last 30 s.
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(20));
  REQUIRE(r->task_exit_codes.size() == 3);
  CHECK(r->task_exit_codes[2] == std::pair<std::string, int>{"worker 1", 128 + 9});
  CHECK(Has(rec.messages, "still running after the chief's exit: worker 1; sending SIGKILL"));
}

TEST_CASE("RunLocalCluster: options out of range are INVALID_ARGUMENT naming the field; nothing starts") {
  Recorded rec;
  LocalClusterOptions o;
  o.on_message = [&rec](std::string_view m) { rec.messages.emplace_back(m); };
  auto refused = [&](const LocalClusterOptions& bad, const char* field) {
    StatusOr<LocalClusterResult> r = RunLocalCluster(bad);
    CHECK(r.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK_MESSAGE(absl::StrContains(r.status().message(), field), r.status());
  };
  LocalClusterOptions bad = o;
  bad.num_ps = 0;
  refused(bad, "num_ps");
  bad = o;
  bad.num_workers = 65;
  refused(bad, "num_workers");
  bad = o;
  bad.end_grace_secs = -1;
  refused(bad, "end_grace_secs");
  bad = o;
  bad.program.clear();
  refused(bad, "program");
  CHECK(rec.messages.empty());
}

}  // namespace
}  // namespace foreman
