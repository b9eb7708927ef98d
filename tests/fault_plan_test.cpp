// Step and hook faults (FaultInjectionHook) through a real
// MonitoredTrainingSession with their documented outcomes, FaultPlan's JSON
// format (every error path, the round trip) and the fired-fault record
// (include/foreman/fault.hpp; docs/fault-injection.md).
#include <doctest/doctest.h>

#include <signal.h>

#include <cerrno>
#include <cmath>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "foreman/clock.hpp"
#include "foreman/fault.hpp"
#include "foreman/hooks.hpp"
#include "foreman/mem_env.hpp"
#include "foreman/monitored_session.hpp"
#include "support/test_util.hpp"
#include "support/training_graph.hpp"

namespace foreman {
namespace {

using testing::Int;
using testing::MakeGraph;
using testing::Model;
using testing::Open;
using testing::TempDir;

// -- plans ---------------------------------------------------------------------

constexpr char kExamplePlan[] = R"({"seed": 7, "faults": [
  {"id": "disk-full", "type": "env", "path": "*.data-*", "op": "append", "error": "ENOSPC", "nth": 1},
  {"id": "preempt", "type": "step", "status": "ABORTED", "at_step": 120},
  {"id": "nan", "type": "step", "nan_loss": true, "probability": 0.01, "repeat": true},
  {"id": "hook-throws", "type": "hook", "callback": "after_run", "at_step": 50},
  {"id": "slow", "type": "env", "op": "sync", "latency_ms": 20, "probability": 0.5},
  {"id": "oom-kill", "type": "process", "signal": "SIGKILL", "at_step": 300}]})";

TEST_CASE("ParseFaultPlan reads every kind of fault of the documented example") {
  auto plan = ParseFaultPlan(kExamplePlan, "plan.json");
  REQUIRE_MESSAGE(plan.ok(), plan.status().ToString());
  CHECK(plan->seed == 7);
  REQUIRE(plan->env.size() == 2);
  CHECK(plan->env[0].id == "disk-full");
  CHECK(plan->env[0].path_pattern == "*.data-*");
  CHECK(plan->env[0].op == EnvOp::kAppend);
  CHECK(plan->env[0].kind == EnvFault::Kind::kError);
  CHECK(plan->env[0].error == ENOSPC);
  CHECK(plan->env[0].nth == 1);
  CHECK(plan->env[1].kind == EnvFault::Kind::kLatency);  // latency_ms without a kind
  CHECK(plan->env[1].op == EnvOp::kSync);
  CHECK(plan->env[1].latency == absl::Milliseconds(20));
  CHECK(plan->env[1].probability == 0.5);
  REQUIRE(plan->steps.size() == 2);
  CHECK(plan->steps[0].kind == StepFault::Kind::kStatus);
  CHECK(plan->steps[0].code == absl::StatusCode::kAborted);
  CHECK(plan->steps[0].at_step == 120);
  CHECK_FALSE(plan->steps[0].repeat);
  CHECK(plan->steps[1].kind == StepFault::Kind::kNanLoss);
  CHECK(plan->steps[1].at_step == -1);
  CHECK(plan->steps[1].probability == 0.01);
  CHECK(plan->steps[1].repeat);
  CHECK(plan->steps[1].loss_tensor == "loss");
  REQUIRE(plan->hooks.size() == 1);
  CHECK(plan->hooks[0].callback == "after_run");
  CHECK(plan->hooks[0].at_step == 50);
  REQUIRE(plan->processes.size() == 1);
  CHECK(plan->processes[0].id == "oom-kill");
  CHECK(plan->processes[0].signal == SIGKILL);
  CHECK(plan->processes[0].at_step == 300);
}

TEST_CASE("FaultPlanToJson round-trips every field") {
  FaultPlan plan;
  plan.seed = 18446744073709551615ull;
  EnvFault torn;
  torn.id = "torn";
  torn.path_pattern = "/run/*";
  torn.op = EnvOp::kAppend;
  torn.kind = EnvFault::Kind::kTornWrite;
  torn.prefix_bytes = 3;
  torn.probability = 0.25;
  torn.repeat = true;
  EnvFault odd;
  odd.id = "odd-errno";
  odd.error = 200;  // no name: written as a number
  odd.nth = 4;
  plan.env = {torn, odd};
  StepFault unavailable;
  unavailable.id = "u";
  unavailable.code = absl::StatusCode::kUnavailable;
  unavailable.message = "ps lost";
  unavailable.at_step = 3;
  StepFault nan;
  nan.id = "nan";
  nan.kind = StepFault::Kind::kNanLoss;
  nan.loss_tensor = "total_loss";
  nan.probability = 0.125;
  plan.steps = {unavailable, nan};
  HookFault begin;
  begin.id = "b";
  begin.callback = "begin";
  HookFault end;
  end.id = "e";
  end.callback = "end";
  end.at_step = 9;
  end.repeat = true;
  plan.hooks = {begin, end};
  ProcessFault kill;
  kill.id = "kill";
  kill.signal = SIGKILL;
  kill.at_step = 40;
  ProcessFault term;
  term.id = "term";
  term.signal = SIGTERM;
  term.at_time = absl::Milliseconds(1500.5);
  term.repeat = true;
  plan.processes = {kill, term};

  const std::string text = FaultPlanToJson(plan);
  auto back = ParseFaultPlan(text, "round");
  REQUIRE_MESSAGE(back.ok(), back.status().ToString(), "\n", text);
  CHECK(FaultPlanToJson(*back) == text);
  CHECK(back->seed == plan.seed);
  REQUIRE(back->env.size() == 2);
  CHECK(back->env[0].kind == EnvFault::Kind::kTornWrite);
  CHECK(back->env[0].prefix_bytes == 3);
  CHECK(back->env[0].path_pattern == "/run/*");
  CHECK(back->env[0].probability == 0.25);
  CHECK(back->env[0].repeat);
  CHECK(back->env[1].error == 200);
  CHECK(back->env[1].nth == 4);
  CHECK(back->env[1].op == EnvOp::kAny);
  REQUIRE(back->steps.size() == 2);
  CHECK(back->steps[0].code == absl::StatusCode::kUnavailable);
  CHECK(back->steps[0].message == "ps lost");
  CHECK(back->steps[0].at_step == 3);
  CHECK(back->steps[1].loss_tensor == "total_loss");
  CHECK(back->steps[1].probability == 0.125);
  REQUIRE(back->hooks.size() == 2);
  CHECK(back->hooks[0].at_step == -1);
  CHECK(back->hooks[1].at_step == 9);
  CHECK(back->hooks[1].repeat);
  REQUIRE(back->processes.size() == 2);
  CHECK(back->processes[0].id == "kill");
  CHECK(back->processes[0].signal == SIGKILL);
  CHECK(back->processes[0].at_step == 40);
  CHECK(back->processes[0].at_time == absl::InfiniteDuration());
  CHECK_FALSE(back->processes[0].repeat);
  CHECK(back->processes[1].signal == SIGTERM);
  CHECK(back->processes[1].at_step == -1);
  CHECK(back->processes[1].at_time == absl::Milliseconds(1500.5));
  CHECK(back->processes[1].repeat);
}

TEST_CASE("FaultPlanToJson writes a process fault Create would refuse as given, and ParseFaultPlan refuses it") {
  ProcessFault sigint;
  sigint.id = "int";
  sigint.signal = SIGINT;
  sigint.at_step = 1;
  ProcessFault both;
  both.id = "both";
  both.at_step = 1;
  both.at_time = absl::Seconds(1);
  ProcessFault neither;
  neither.id = "neither";
  const std::pair<ProcessFault, const char*> cases[] = {
      {sigint, R"("signal" must be a string, got 2)"},
      {both, R"(needs exactly one of "at_step" (a global_step) or "at_time_ms")"},
      {neither, R"("at_step" must be an integer >= 0, got -1)"},
  };
  for (const auto& [fault, message] : cases) {
    CAPTURE(fault.id);
    FaultPlan plan;
    plan.processes = {fault};
    auto back = ParseFaultPlan(FaultPlanToJson(plan), "round");
    REQUIRE_FALSE(back.ok());
    CHECK_MESSAGE(absl::StrContains(back.status().message(), message), back.status().message());
    FaultInjectionHook::Options o;
    o.processes = {fault};
    CHECK(absl::IsInvalidArgument(FaultInjectionHook::Create(o).status()));
  }
}

TEST_CASE("ParseFaultPlan reads process faults: a signal at a global_step or a time") {
  auto plan = ParseFaultPlan(R"({"faults": [
    {"id": "oom-kill", "type": "process", "signal": "SIGKILL", "at_step": 120},
    {"id": "preempt", "type": "process", "signal": "SIGTERM", "at_time_ms": 2500, "repeat": true}]})",
                             "plan.json");
  REQUIRE_MESSAGE(plan.ok(), plan.status().ToString());
  REQUIRE(plan->processes.size() == 2);
  CHECK(plan->processes[0].id == "oom-kill");
  CHECK(plan->processes[0].signal == SIGKILL);
  CHECK(plan->processes[0].at_step == 120);
  CHECK(plan->processes[0].at_time == absl::InfiniteDuration());
  CHECK_FALSE(plan->processes[0].repeat);
  CHECK(plan->processes[1].signal == SIGTERM);
  CHECK(plan->processes[1].at_step == -1);
  CHECK(plan->processes[1].at_time == absl::Milliseconds(2500));
  CHECK(plan->processes[1].repeat);
  CHECK(plan->env.empty());
  CHECK(plan->steps.empty());
  CHECK(plan->hooks.empty());
}

TEST_CASE("ParseFaultPlan reads actor faults: kill (default kind), delay, drop, at_step or at_time_ms") {
  auto plan = ParseFaultPlan(R"({"faults": [
    {"id": "k", "type": "actor", "service": "summary_writer", "at_step": 5},
    {"id": "n", "type": "actor", "service": "step_counter", "kind": "kill", "at_time_ms": 1500, "exit_normally": true},
    {"id": "d", "type": "actor", "service": "checkpoint_saver", "kind": "delay", "at_step": 2, "delay_ms": 250,
     "count": 3, "repeat": true},
    {"id": "x", "type": "actor", "service": "summary_writer", "kind": "drop", "at_step": 9}]})",
                             "plan.json");
  REQUIRE_MESSAGE(plan.ok(), plan.status().ToString());
  REQUIRE(plan->actors.size() == 4);
  const auto& a = plan->actors;
  CHECK(a[0].kind == ActorFault::Kind::kKill);
  CHECK(a[0].service == "summary_writer");
  CHECK(a[0].at_step == 5);
  CHECK(a[0].at_time == absl::InfiniteDuration());
  CHECK_FALSE(a[0].exit_normally);
  CHECK(a[1].at_step == -1);
  CHECK(a[1].at_time == absl::Milliseconds(1500));
  CHECK(a[1].exit_normally);
  CHECK(a[2].kind == ActorFault::Kind::kDelay);
  CHECK(a[2].delay == absl::Milliseconds(250));
  CHECK(a[2].count == 3);
  CHECK(a[2].repeat);
  CHECK(a[3].kind == ActorFault::Kind::kDrop);
  CHECK(a[3].count == 1);
  // Every one is accepted by the hook as parsed.
  FaultInjectionHook::Options o;
  o.actors = plan->actors;
  CHECK(FaultInjectionHook::Create(o).ok());
  // And written back the same.
  const std::string text = FaultPlanToJson(*plan);
  auto back = ParseFaultPlan(text, "round");
  REQUIRE_MESSAGE(back.ok(), back.status().ToString(), "\n", text);
  CHECK(FaultPlanToJson(*back) == text);
  REQUIRE(back->actors.size() == 4);
  CHECK(back->actors[1].at_time == absl::Milliseconds(1500));
  CHECK(back->actors[2].delay == absl::Milliseconds(250));
  CHECK(back->actors[2].count == 3);
  CHECK(back->actors[3].kind == ActorFault::Kind::kDrop);
}

TEST_CASE("ParseFaultPlan rejects bad input naming the source, the fault, the field and what was expected") {
  struct Case {
    const char* json;
    const char* message;
  };
  const Case cases[] = {
      {R"({"seed": 1,})", "plan.json: not valid JSON at byte 12: "},
      {R"([1])", "plan.json: a plan must be a JSON object, got an array of size 1"},
      {R"({"seed": -1})", R"(plan.json: "seed" must be an integer >= 0, got -1)"},
      {R"({"seed": "7"})", R"(plan.json: "seed" must be an integer >= 0, got "7")"},
      {R"({"sead": 7})", R"(plan.json: unknown field "sead")"},
      {R"({"faults": {}})", R"(plan.json: "faults" must be an array of faults, got an object of size 0)"},
      {R"({"faults": [3]})", "plan.json: faults[0]: a fault must be an object, got 3"},
      {R"({"faults": [{"type": "step"}]})", R"(plan.json: faults[0]: missing "id")"},
      {R"({"faults": [{"id": "", "type": "step"}]})", R"(plan.json: faults[0]: "id" must be a non-empty string)"},
      {R"({"faults": [{"id": "a", "type": "step", "status": "ABORTED", "at_step": 1},
                      {"id": "two\nlines", "type": "step"}]})",
       R"(plan.json: faults[1]: "id" must be a string without control characters (newline, tab, ...: ids are logged as they are), got "two\nlines")"},
      {R"({"faults": [{"id": "tab\there", "type": "step"}]})",
       R"(plan.json: faults[0]: "id" must be a string without control characters)"},
      {R"({"faults": [{"id": "esc\u001b[31m", "type": "step"}]})", R"(got "esc\u001b[31m")"},
      {R"({"faults": [{"id": "a"}]})", R"(plan.json: faults[0] ("a"): missing "type")"},
      {R"({"faults": [{"id": "a", "type": "disk"}]})",
       R"(plan.json: faults[0] ("a"): "type" must be one of env, step, hook, process, actor, got "disk")"},
      {R"({"faults": [{"id": "a", "type": "step", "status": "ABORTED", "at_step": 1},
                      {"id": "a", "type": "step", "status": "ABORTED", "at_step": 2}]})",
       R"(plan.json: faults[1] ("a"): duplicate id)"},
      {R"({"faults": [{"id": "x", "type": "step", "status": "ABORTED", "at_step": 1},
                      {"id": "y", "type": "step", "status": "ABORTED", "at_step": 1},
                      {"id": "nan", "type": "step", "nan_loss": true, "probability": "high"}]})",
       R"(plan.json: faults[2] ("nan"): "probability" must be a number in [0, 1], got "high")"},
      {R"({"faults": [{"id": "p", "type": "step", "nan_loss": true, "probability": 1.5}]})",
       R"(faults[0] ("p"): "probability" must be a number in [0, 1], got 1.5)"},
      {R"({"faults": [{"id": "t", "type": "step", "status": "ABORTED", "at_step": 1, "reapeat": true}]})",
       R"(plan.json: faults[0] ("t"): unknown field "reapeat")"},
      {R"({"faults": [{"id": "s", "type": "step", "status": "PREEMPTED", "at_step": 1}]})",
       R"(faults[0] ("s"): "status" must be a status code name other than OK (ABORTED, UNAVAILABLE, INTERNAL, ...), got "PREEMPTED")"},
      {R"({"faults": [{"id": "s", "type": "step", "status": "OK", "at_step": 1}]})",
       R"("status" must be a status code name other than OK)"},
      {R"({"faults": [{"id": "s", "type": "step", "status": "ABORTED", "nan_loss": true, "at_step": 1}]})",
       R"(faults[0] ("s"): needs exactly one of "status" (a status code name) or "nan_loss": true)"},
      {R"({"faults": [{"id": "s", "type": "step", "at_step": 1}]})", R"(needs exactly one of "status")"},
      {R"({"faults": [{"id": "s", "type": "step", "status": "ABORTED"}]})",
       R"(faults[0] ("s"): needs exactly one of "at_step" (a global_step) or "probability")"},
      {R"({"faults": [{"id": "s", "type": "step", "status": "ABORTED", "at_step": 1, "probability": 0.5}]})",
       R"(needs exactly one of "at_step")"},
      {R"({"faults": [{"id": "s", "type": "step", "status": "ABORTED", "at_step": -3}]})",
       R"("at_step" must be an integer >= 0, got -3)"},
      {R"({"faults": [{"id": "s", "type": "step", "nan_loss": "yes", "at_step": 1}]})",
       R"("nan_loss" must be true or false, got "yes")"},
      {R"({"faults": [{"id": "s", "type": "step", "nan_loss": true, "loss_tensor": "", "at_step": 1}]})",
       R"("loss_tensor" must be a fetch name (not empty), got "")"},
      {R"({"faults": [{"id": "d", "type": "env", "op": "write", "nth": 1}]})",
       R"(faults[0] ("d"): "op" must be one of any, new_writable, new_appendable, append)"},
      {R"({"faults": [{"id": "d", "type": "env", "error": "ENOSPACE", "nth": 1}]})",
       R"(faults[0] ("d"): "error" must be an errno name (EIO, ENOSPC, EROFS, EACCES, ...) or a positive number, got "ENOSPACE")"},
      {R"({"faults": [{"id": "d", "type": "env", "error": -5, "nth": 1}]})", R"("error" must be an errno name)"},
      {R"({"faults": [{"id": "d", "type": "env", "kind": "melt", "nth": 1}]})",
       R"("kind" must be one of error, short_write, torn_write, latency, crash, got "melt")"},
      {R"({"faults": [{"id": "d", "type": "env", "latency_ms": -1, "nth": 1}]})",
       R"("latency_ms" must be a number of milliseconds in [0, 3600000] (an hour), got -1)"},
      // Found by the breaker: a number beyond a double threw out of the parser.
      {R"({"faults": [{"id": "d", "type": "env", "latency_ms": 1e400, "nth": 1}]})",
       "plan.json: not a usable JSON plan: "},
      {R"({"faults": [{"id": "d", "type": "env", "latency_ms": 3600001, "nth": 1}]})",
       R"("latency_ms" must be a number of milliseconds in [0, 3600000] (an hour), got 3600001)"},
      // A key given twice: nlohmann would keep the last silently.
      {R"({"faults": [{"id": "d", "type": "env", "nth": 1, "nth": 2}]})",
       R"(plan.json: the key "nth" appears twice in one object)"},
      {R"({"seed": 1, "seed": 2})", R"(plan.json: the key "seed" appears twice in one object)"},
      // A field the kind ignores is an error, not a no-op.
      {R"({"faults": [{"id": "d", "type": "env", "kind": "latency", "latency_ms": 5, "error": "EIO", "nth": 1}]})",
       R"(faults[0] ("d"): "error" applies only to kind error or short_write, not latency)"},
      {R"({"faults": [{"id": "d", "type": "env", "kind": "error", "prefix_bytes": 4, "nth": 1}]})",
       R"(faults[0] ("d"): "prefix_bytes" applies only to kind short_write or torn_write, not error)"},
      {R"({"faults": [{"id": "d", "type": "env", "kind": "crash", "latency_ms": 5, "nth": 1}]})",
       R"(faults[0] ("d"): "latency_ms" applies only to kind latency, not crash)"},
      {R"({"faults": [{"id": "s", "type": "step", "status": "ABORTED", "loss_tensor": "loss", "at_step": 1}]})",
       R"(faults[0] ("s"): "loss_tensor" applies only to a nan_loss fault)"},
      {R"({"faults": [{"id": "s", "type": "step", "nan_loss": true, "message": "x", "at_step": 1}]})",
       R"(faults[0] ("s"): "message" applies only to a "status" fault)"},
      // A long value is cut in the message.
      {R"({"faults": [{"id": "d", "type": "env", "path": "0123456789012345678901234567890123456789012345678901234567890123456789012345678901234567890123456789", "nth": 1, "repeat": "0123456789012345678901234567890123456789012345678901234567890123456789012345678901234567890123456789"}]})",
       R"("repeat" must be true or false, got "0123456789012345678901234567890123456789012345678901234567890123456789012345678... (102 bytes))"},
      {R"({"faults": [{"id": "d", "type": "env", "nth": 0}]})", R"("nth" must be an integer >= 1, got 0)"},
      {R"({"faults": [{"id": "d", "type": "env", "prefix_bytes": -2, "nth": 1}]})",
       R"("prefix_bytes" must be an integer >= -1, got -2)"},
      {R"({"faults": [{"id": "d", "type": "env", "op": "sync"}]})",
       R"(faults[0] ("d"): needs exactly one of "nth" (fire at the n-th matching operation) or "probability")"},
      {R"({"faults": [{"id": "d", "type": "env", "path": 3, "nth": 1}]})", R"("path" must be a string, got 3)"},
      {R"({"faults": [{"id": "h", "type": "hook"}]})", R"(faults[0] ("h"): missing "callback")"},
      {R"({"faults": [{"id": "h", "type": "hook", "callback": "after_step"}]})",
       R"("callback" must be one of begin, after_create_session, before_run, after_run, end, got "after_step")"},
      {R"({"faults": [{"id": "h", "type": "hook", "callback": "begin", "at_step": 2}]})",
       R"("at_step" must be absent for callback begin (it runs before any session), got 2)"},
      {R"({"faults": [{"id": "h", "type": "hook", "callback": "end", "repeat": 1}]})",
       R"("repeat" must be true or false, got 1)"},
      {R"({"faults": [{"id": "k", "type": "process", "at_step": 3}]})",
       R"(faults[0] ("k"): missing "signal" (SIGKILL or SIGTERM))"},
      {R"({"faults": [{"id": "k", "type": "process", "signal": "SIGINT", "at_step": 3}]})",
       R"(faults[0] ("k"): "signal" must be "SIGKILL" or "SIGTERM", got "SIGINT")"},
      {R"({"faults": [{"id": "k", "type": "process", "signal": 9, "at_step": 3}]})",
       R"(faults[0] ("k"): "signal" must be a string, got 9)"},
      {R"({"faults": [{"id": "k", "type": "process", "signal": "SIGKILL"}]})",
       R"(faults[0] ("k"): needs exactly one of "at_step" (a global_step) or "at_time_ms" (since the session started))"},
      {R"({"faults": [{"id": "k", "type": "process", "signal": "SIGKILL", "at_step": 3, "at_time_ms": 5}]})",
       R"(faults[0] ("k"): needs exactly one of "at_step")"},
      {R"({"faults": [{"id": "k", "type": "process", "signal": "SIGTERM", "at_time_ms": -1}]})",
       R"("at_time_ms" must be a number of milliseconds in [0, 2592000000] (30 days), got -1)"},
      {R"({"faults": [{"id": "k", "type": "process", "signal": "SIGTERM", "at_time_ms": 2592000001}]})",
       R"("at_time_ms" must be a number of milliseconds in [0, 2592000000] (30 days), got 2592000001)"},
      {R"({"faults": [{"id": "k", "type": "process", "signal": "SIGTERM", "at_step": -2}]})",
       R"("at_step" must be an integer >= 0, got -2)"},
      {R"({"faults": [{"id": "k", "type": "process", "signal": "SIGKILL", "at_step": 1, "nth": 1}]})",
       R"(faults[0] ("k"): unknown field "nth")"},
      {R"({"faults": [{"id": "k", "type": "actor", "at_step": 1}]})",
       R"(faults[0] ("k"): missing "service" (summary_writer, checkpoint_saver, step_counter or input_pipeline))"},
      {R"({"faults": [{"id": "k", "type": "actor", "service": "ps", "at_step": 1}]})",
       R"("service" must be one of summary_writer, checkpoint_saver, step_counter, input_pipeline, got "ps")"},
      {R"({"faults": [{"id": "k", "type": "actor", "service": "step_counter", "kind": "crash", "at_step": 1}]})",
       R"("kind" must be one of kill, delay, drop, got "crash")"},
      {R"({"faults": [{"id": "k", "type": "actor", "service": "step_counter"}]})",
       R"(faults[0] ("k"): needs exactly one of "at_step" (a global_step) or "at_time_ms" (on the session's Clock))"},
      {R"({"faults": [{"id": "k", "type": "actor", "service": "step_counter", "at_step": 1, "at_time_ms": 5}]})",
       R"(needs exactly one of "at_step")"},
      {R"({"faults": [{"id": "k", "type": "actor", "service": "step_counter", "at_time_ms": -5}]})",
       R"("at_time_ms" must be a number of milliseconds >= 0 (since the services started), got -5)"},
      {R"({"faults": [{"id": "k", "type": "actor", "service": "summary_writer", "kind": "delay", "at_step": 1}]})",
       R"(faults[0] ("k"): missing "delay_ms" (how long each message waits, in milliseconds))"},
      {R"({"faults": [{"id": "k", "type": "actor", "service": "summary_writer", "kind": "delay", "at_step": 1,
                       "delay_ms": 4000000}]})",
       R"("delay_ms" must be a number of milliseconds in [0, 3600000] (an hour), got 4000000)"},
      {R"({"faults": [{"id": "k", "type": "actor", "service": "summary_writer", "at_step": 1, "delay_ms": 5}]})",
       R"(faults[0] ("k"): "delay_ms" applies only to kind delay, not kill)"},
      {R"({"faults": [{"id": "k", "type": "actor", "service": "summary_writer", "at_step": 1, "count": 2}]})",
       R"("count" applies only to kinds delay and drop, not kill)"},
      {R"({"faults": [{"id": "k", "type": "actor", "service": "summary_writer", "kind": "drop", "at_step": 1,
                       "count": 0}]})",
       R"("count" must be an integer >= 1, got 0)"},
      {R"({"faults": [{"id": "k", "type": "actor", "service": "summary_writer", "kind": "drop", "at_step": 1,
                       "exit_normally": true}]})",
       R"("exit_normally" applies only to kind kill, not drop)"},
      {R"({"faults": [{"id": "k", "type": "actor", "service": "summary_writer", "at_step": 1, "signal": 9}]})",
       R"(faults[0] ("k"): unknown field "signal")"},
  };
  for (const Case& c : cases) {
    CAPTURE(c.json);
    auto plan = ParseFaultPlan(c.json, "plan.json");
    REQUIRE_FALSE(plan.ok());
    CHECK(absl::IsInvalidArgument(plan.status()));
    CHECK_MESSAGE(absl::StrContains(plan.status().message(), c.message), plan.status().message());
    CHECK(absl::StartsWith(plan.status().message(), "plan.json: "));
  }
}

TEST_CASE("ParseFaultPlan: deeply nested values are errors with short messages, never a stack overflow") {
  // Found by the breaker: the error message dumped the value recursively.
  const int depth = 200000;
  const std::string deep = std::string(depth, '[') + std::string(depth, ']');
  for (const std::string& text : {deep, R"({"seed": )" + deep + "}", R"({"faults": [)" + deep + "]}",
                                  R"({"faults": [{"id": "a", "type": "env", "nth": )" + deep + "}]}"}) {
    CAPTURE(text.substr(0, 40));
    auto plan = ParseFaultPlan(text, "deep.json");
    REQUIRE_FALSE(plan.ok());
    CHECK(absl::IsInvalidArgument(plan.status()));
    CHECK(absl::StartsWith(plan.status().message(), "deep.json: "));
    CHECK(plan.status().message().size() < 400);
  }
}

TEST_CASE("FaultPlanToJson and the record write text that is not UTF-8 as U+FFFD instead of throwing") {
  FaultPlan plan;
  StepFault s;
  s.id = "caf\xe9";
  s.code = absl::StatusCode::kAborted;
  s.at_step = 1;
  plan.steps.push_back(s);
  const std::string text = FaultPlanToJson(plan);
  CHECK(absl::StrContains(text, "caf\xef\xbf\xbd"));
  CHECK(ParseFaultPlan(text, "x").ok());
  MemEnv env;
  REQUIRE(env.RecursivelyCreateDir("/run").ok());
  REQUIRE(WriteFiredFaults(&env, "/run", {FiredFault{"id", "/run/caf\xe9/checkpoint", EnvOp::kSync, 1}}).ok());
  auto back = ReadFiredFaults(&env, "/run");
  REQUIRE_MESSAGE(back.ok(), back.status().ToString());
  REQUIRE(back->size() == 1);
  CHECK((*back)[0].id == "id");
  CHECK((*back)[0].path == "/run/caf\xef\xbf\xbd/checkpoint");
}

TEST_CASE("ReadFaultPlan reads through an Env and names the file in its errors") {
  MemEnv env;
  REQUIRE(env.RecursivelyCreateDir("/p").ok());
  REQUIRE(WriteStringToFile(&env, "/p/plan.json", kExamplePlan).ok());
  auto plan = ReadFaultPlan(&env, "/p/plan.json");
  REQUIRE_MESSAGE(plan.ok(), plan.status().ToString());
  CHECK(plan->env.size() == 2);
  REQUIRE(WriteStringToFile(&env, "/p/bad.json", R"({"faults": [{"id": "x"}]})").ok());
  auto bad = ReadFaultPlan(&env, "/p/bad.json");
  CHECK(bad.status().message() == R"(/p/bad.json: faults[0] ("x"): missing "type" (env, step, hook, process or actor))");
  CHECK(absl::IsNotFound(ReadFaultPlan(&env, "/p/none.json").status()));
}

// -- the fired-fault record -------------------------------------------------------

TEST_CASE("the fired-fault record: missing is empty, written atomically, read back, corrupt is DATA_LOSS") {
  MemEnv disk;
  REQUIRE(disk.RecursivelyCreateDir("/run").ok());
  auto none = ReadFiredFaults(&disk, "/run");
  REQUIRE(none.ok());
  CHECK(none->empty());

  const std::vector<FiredFault> fired = {{"disk-full", "/run/model.ckpt-5.data-00000-of-00001", EnvOp::kAppend, 2},
                                         {"preempt", "step", EnvOp::kAny, 120}};
  REQUIRE(WriteFiredFaults(&disk, "/run", fired).ok());
  auto back = ReadFiredFaults(&disk, "/run");
  REQUIRE_MESSAGE(back.ok(), back.status().ToString());
  REQUIRE(back->size() == 2);
  CHECK((*back)[0].id == "disk-full");
  CHECK((*back)[0].path == fired[0].path);
  CHECK((*back)[0].op == EnvOp::kAppend);
  CHECK((*back)[0].op_index == 2);
  CHECK((*back)[1].id == "preempt");
  CHECK((*back)[1].op == EnvOp::kAny);
  CHECK((*back)[1].op_index == 120);

  // A write whose rename fails leaves the old record whole, and no temp file.
  FaultyEnv faulty(&disk);
  EnvFault no_rename;
  no_rename.id = "no-rename";
  no_rename.path_pattern = "*fault_record.json";
  no_rename.op = EnvOp::kRename;
  no_rename.nth = 1;
  REQUIRE(faulty.AddFault(no_rename).ok());
  CHECK_FALSE(WriteFiredFaults(&faulty, "/run", {}).ok());
  auto kept = ReadFiredFaults(&disk, "/run");
  REQUIRE(kept.ok());
  CHECK(kept->size() == 2);
  CHECK(*disk.GetChildren("/run") == std::vector<std::string>{"fault_record.json"});

  // Durable: a crash right after the write keeps it (MemEnv drops what was not synced).
  REQUIRE(WriteFiredFaults(&disk, "/run", {fired[1]}).ok());
  disk.Crash();
  auto after_crash = ReadFiredFaults(&disk, "/run");
  REQUIRE_MESSAGE(after_crash.ok(), after_crash.status().ToString());
  CHECK(after_crash->size() == 1);

  for (const char* text : {"{", R"({"fired": 3})", R"({"fired": [{"id": "a"}]})",
                           R"({"fired": [{"id": "a", "path": "p", "op": "melt", "op_index": 1}]})",
                           // Found by the breaker: a number beyond a double threw; one beyond int64 became -1.
                           R"({"fired": [{"id": "a", "path": "p", "op": "sync", "op_index": 1e999}]})",
                           R"({"fired": [{"id": "a", "path": "p", "op": "sync", "op_index": 18446744073709551615}]})",
                           R"({"fired": [{"id": "a", "path": "p", "op": "sync", "op_index": -1}]})"}) {
    CAPTURE(text);
    REQUIRE(WriteStringToFile(&disk, "/run/fault_record.json", text).ok());
    auto corrupt = ReadFiredFaults(&disk, "/run");
    CHECK(absl::IsDataLoss(corrupt.status()));
    CHECK(absl::StartsWith(corrupt.status().message(), "/run/fault_record.json: not a valid fault record"));
  }
}

// -- FaultInjectionHook ---------------------------------------------------------------

// MakeGraph's model, plus a "loss" fetch (0.5), its step wrapped by `hook`.
std::shared_ptr<Graph> LossGraph(const std::shared_ptr<Model>& model, const FaultInjectionHook& hook) {
  auto graph = MakeGraph(model);
  StepFn inner = graph->step();
  REQUIRE(graph
              ->SetStep(hook.WrapStep([inner](StepContext& ctx) -> Status {
                if (ctx.requested("loss")) ctx.Set("loss", Tensor::Scalar<float>(0.5f));
                return inner(ctx);
              }))
              .ok());
  return graph;
}

std::shared_ptr<FaultInjectionHook> MakeHook(std::vector<StepFault> steps, std::vector<HookFault> hooks = {},
                                             uint64_t seed = 0) {
  auto hook = FaultInjectionHook::Create({std::move(steps), std::move(hooks), seed});
  REQUIRE_MESSAGE(hook.ok(), hook.status().ToString());
  return *hook;
}

StepFault StatusAt(std::string id, absl::StatusCode code, int64_t at_step) {
  StepFault f;
  f.id = std::move(id);
  f.code = code;
  f.at_step = at_step;
  f.message = "injected";
  return f;
}

MonitoredTrainingSessionOptions Options(std::shared_ptr<Graph> graph, const std::string& dir, ManualClock* clock,
                                        HookList hooks, int64_t last_step) {
  MonitoredTrainingSessionOptions o;
  o.graph = std::move(graph);
  o.checkpoint_dir = dir;
  o.config.clock = clock;
  o.stop_grace_period_secs = 0;
  o.recovery.initial_backoff = absl::ZeroDuration();
  o.save_summaries_steps = std::nullopt;
  o.log_step_count_steps = std::nullopt;
  auto stop = StopAtStepHook::Create({std::nullopt, last_step});
  REQUIRE(stop.ok());
  hooks.push_back(*stop);
  o.hooks = std::move(hooks);
  return o;
}

// Runs until the session stops; returns the last run's status.
Status Train(MonitoredSession& sess, std::vector<std::string> fetches = {"train_op"}) {
  Status last;
  for (int i = 0; i < 1000 && !sess.should_stop(); ++i) last = sess.run(fetches).status();
  return last;
}

TEST_CASE("ABORTED at step 7: the session recovers from the last checkpoint and trains to the end, firing once") {
  TempDir dir;
  ManualClock clock;
  auto model = std::make_shared<Model>();
  auto hook = MakeHook({StatusAt("preempt", absl::StatusCode::kAborted, 7)});
  auto o = Options(MakeGraph(model), dir.path(), &clock, {hook}, 12);
  o.save_checkpoint_steps = int64_t{5};
  auto sess = Open(o);
  CHECK(Train(*sess).ok());
  CHECK(sess->recoveries() == 1);
  CHECK(sess->steps_lost() == 2);  // 5 and 6, after the checkpoint at 5
  CHECK(model->train_calls == 14);  // 0..11, and 5, 6 again
  CHECK(sess->close().ok());
  CHECK(testing::Checkpoints(dir.path()).back() == "model.ckpt-12");
  const auto fired = hook->fired();
  REQUIRE(fired.size() == 1);
  CHECK(fired[0].id == "preempt");
  CHECK(fired[0].path == "step");
  CHECK(fired[0].op_index == 7);
}

TEST_CASE("a repeating ABORTED at step 3 recovers until max_recoveries are spent, then the run returns it") {
  TempDir dir;
  ManualClock clock;
  auto model = std::make_shared<Model>();
  StepFault f = StatusAt("preempt", absl::StatusCode::kAborted, 3);
  f.repeat = true;
  auto hook = MakeHook({f});
  auto o = Options(MakeGraph(model), dir.path(), &clock, {hook}, 12);
  o.save_checkpoint_steps = int64_t{2};
  o.recovery.max_recoveries = 2;
  auto sess = Open(o);
  const Status last = Train(*sess);
  CHECK(absl::IsAborted(last));
  CHECK(absl::StrContains(last.message(), "injected step fault preempt at global_step 3"));
  CHECK(InjectedFaultId(last) == std::optional<std::string>("preempt"));  // through the recoveries
  CHECK(sess->recoveries() == 2);
  CHECK(hook->fired().size() == 3);  // the first error and one per recovery
  sess->close().IgnoreError();
}

TEST_CASE("a repeating p=0.5 ABORTED is survived: a retried step draws again, and two runs fire alike") {
  auto run = []() {
    TempDir dir;
    ManualClock clock;
    auto model = std::make_shared<Model>();
    StepFault f = StatusAt("flaky", absl::StatusCode::kAborted, -1);
    f.probability = 0.5;
    f.repeat = true;
    auto hook = MakeHook({f}, {}, /*seed=*/7);
    auto o = Options(MakeGraph(model), dir.path(), &clock, {hook}, 12);
    o.save_checkpoint_steps = int64_t{1};
    o.recovery.max_recoveries = 200;
    auto sess = Open(o);
    const Status last = Train(*sess);
    CHECK_MESSAGE(last.ok(), last.ToString());
    CHECK(sess->recoveries() > 0);
    CHECK(sess->close().ok());
    CHECK(testing::Checkpoints(dir.path()).back() == "model.ckpt-12");
    std::vector<int64_t> steps;
    for (const FiredFault& fired : hook->fired()) steps.push_back(fired.op_index);
    return steps;
  };
  const std::vector<int64_t> first = run();
  CHECK(!first.empty());
  CHECK(first == run());
}

TEST_CASE("INTERNAL at step 3 ends the run with INTERNAL naming the fault") {
  TempDir dir;
  ManualClock clock;
  auto model = std::make_shared<Model>();
  auto hook = MakeHook({StatusAt("boom", absl::StatusCode::kInternal, 3)});
  auto sess = Open(Options(MakeGraph(model), dir.path(), &clock, {hook}, 12));
  const Status last = Train(*sess);
  CHECK(absl::IsInternal(last));
  CHECK_MESSAGE(absl::StrContains(last.message(), "injected step fault boom at global_step 3: injected"),
                last.ToString());
  CHECK(model->train_calls == 3);  // steps 0, 1, 2; step 3 never ran
  CHECK(sess->recoveries() == 0);
  CHECK(InjectedFaultId(last) == std::optional<std::string>("boom"));
  const Status closed = sess->close();
  CHECK(absl::IsInternal(closed));
  CHECK(InjectedFaultId(closed) == std::optional<std::string>("boom"));
}

TEST_CASE("OUT_OF_RANGE at step 3 is a clean end: close() saves the final checkpoint at step 3") {
  TempDir dir;
  ManualClock clock;
  auto model = std::make_shared<Model>();
  auto hook = MakeHook({StatusAt("eof", absl::StatusCode::kOutOfRange, 3)});
  auto sess = Open(Options(MakeGraph(model), dir.path(), &clock, {hook}, 12));
  CHECK(absl::IsOutOfRange(Train(*sess)));
  CHECK(sess->close().ok());
  CHECK(testing::Checkpoints(dir.path()).back() == "model.ckpt-3");
}

TEST_CASE("a NaN loss at step 4: NanTensorHook fails the run, or stops it without fail_on_nan_loss") {
  for (bool fail : {true, false}) {
    CAPTURE(fail);
    TempDir dir;
    ManualClock clock;
    auto model = std::make_shared<Model>();
    StepFault nan;
    nan.id = "nan";
    nan.kind = StepFault::Kind::kNanLoss;
    nan.at_step = 4;
    auto hook = MakeHook({nan});
    auto nan_hook = NanTensorHook::Create({"loss", fail});
    REQUIRE(nan_hook.ok());
    auto sess = Open(Options(LossGraph(model, *hook), dir.path(), &clock, {hook, *nan_hook}, 12));
    const Status last = Train(*sess);
    if (fail) {
      CHECK(IsNanLossDuringTraining(last));
      CHECK_FALSE(InjectedFaultId(last).has_value());  // NanTensorHook's error: the fired record names the fault
      CHECK(absl::IsInternal(sess->close()));
    } else {
      CHECK(last.ok());
      CHECK(sess->close().ok());
    }
    CHECK(model->train_calls == 5);  // step 4 ran; its loss was NaN
    REQUIRE(hook->fired().size() == 1);
    CHECK(hook->fired()[0].op_index == 4);
  }
}

TEST_CASE("a hook that throws in after_run at step 3 ends the run naming the hook and callback") {
  TempDir dir;
  ManualClock clock;
  auto model = std::make_shared<Model>();
  HookFault throws;
  throws.id = "hook-throws";
  throws.callback = "after_run";
  throws.at_step = 3;
  auto hook = MakeHook({}, {throws});
  auto sess = Open(Options(MakeGraph(model), dir.path(), &clock, {hook}, 12));
  const Status last = Train(*sess);
  CHECK_FALSE(last.ok());
  CHECK_MESSAGE(
      absl::StartsWith(last.message(), "hook FaultInjectionHook::after_run: injected hook fault hook-throws at "
                                       "global_step 3"),
      last.ToString());
  CHECK(InjectedFaultId(last) == std::optional<std::string>("hook-throws"));
  CHECK(model->train_calls == 4);
  const Status closed = sess->close();
  CHECK_FALSE(closed.ok());
  CHECK(InjectedFaultId(closed) == std::optional<std::string>("hook-throws"));
  REQUIRE(hook->fired().size() == 1);
  CHECK(hook->fired()[0].path == "hook:after_run");
  CHECK(hook->fired()[0].op_index == 3);
}

TEST_CASE("a fault marked fired (an earlier process's record) does not fire again unless it repeats") {
  for (bool repeat : {false, true}) {
    CAPTURE(repeat);
    TempDir dir;
    ManualClock clock;
    auto model = std::make_shared<Model>();
    StepFault f = StatusAt("boom", absl::StatusCode::kInternal, 3);
    f.repeat = repeat;
    auto hook = MakeHook({f});
    hook->MarkFired({{"boom", "step", EnvOp::kAny, 3}});
    auto sess = Open(Options(MakeGraph(model), dir.path(), &clock, {hook}, 6));
    const Status last = Train(*sess);
    CHECK(last.ok() == !repeat);
    CHECK(hook->fired().size() == (repeat ? 1u : 0u));
    sess->close().IgnoreError();
  }
}

TEST_CASE("probabilistic step faults fire at the keyed draws' steps, whatever the faults' order") {
  auto run = [](bool reversed) {
    StepFault a;
    a.id = "nan-a";
    a.kind = StepFault::Kind::kNanLoss;
    a.probability = 0.3;
    a.repeat = true;
    StepFault b = a;
    b.id = "nan-b";
    b.probability = 0.2;
    std::vector<StepFault> steps = reversed ? std::vector<StepFault>{b, a} : std::vector<StepFault>{a, b};
    auto hook = MakeHook(steps, {}, /*seed=*/11);
    auto model = std::make_shared<Model>();
    ManualClock clock;
    TempDir dir;
    auto sess = Open(Options(LossGraph(model, *hook), dir.path(), &clock, {hook}, 40));
    std::vector<int64_t> nan_steps;
    for (int64_t step = 0; !sess->should_stop(); ++step) {
      auto out = sess->run({"loss", "train_op"});
      REQUIRE_MESSAGE(out.ok(), out.status().ToString());
      if (std::isnan(out->at("loss").scalar<float>().value())) nan_steps.push_back(step);
    }
    CHECK(sess->close().ok());
    std::map<std::string, std::vector<int64_t>> by_id;
    for (const FiredFault& f : hook->fired()) by_id[f.id].push_back(f.op_index);
    return std::make_pair(by_id, nan_steps);
  };
  const auto forward_run = run(false);
  const auto backward_run = run(true);
  const auto& forward = forward_run.first;
  CHECK(forward == backward_run.first);
  CHECK(forward_run.second == backward_run.second);
  CHECK(!forward_run.second.empty());  // the NaNs reached the caller's fetch
  for (const auto& id_p : std::map<std::string, double>{{"nan-a", 0.3}, {"nan-b", 0.2}}) {
    const std::string id = id_p.first;
    const double p = id_p.second;
    std::vector<int64_t> expected;
    for (int64_t n = 0; n < 40; ++n) {
      if (FaultDraw(11, id, "step", EnvOp::kAny, FaultInjectionHook::StepDrawIndex(n, 1)) < p) expected.push_back(n);
    }
    CAPTURE(id);
    CHECK(!expected.empty());
    CHECK(expected.size() < 40);
    CHECK(forward.count(id) == 1);
    if (forward.count(id) == 1) CHECK(forward.at(id) == expected);
  }
}

// -- process faults and on_fire --------------------------------------------------------

ProcessFault SignalAt(std::string id, int signal, int64_t at_step) {
  ProcessFault f;
  f.id = std::move(id);
  f.signal = signal;
  f.at_step = at_step;
  return f;
}

// What a test's raise_signal saw: the signal, the run's global_step (from
// the observer's last firing) and how many firings on_fire had reported.
struct Raised {
  int signal = 0;
  std::size_t fired_before = 0;   // hook->fired() at the raise
  std::size_t observed_before = 0;  // on_fire calls before the raise
};

TEST_CASE("a process fault at step 3: recorded, then on_fire, then the signal raised, once; the run goes on") {
  for (int signal : {SIGKILL, SIGTERM}) {
    CAPTURE(signal);
    TempDir dir;
    ManualClock clock;
    auto model = std::make_shared<Model>();
    std::vector<FiredFault> observed;
    std::vector<Raised> raised;
    std::shared_ptr<FaultInjectionHook> hook;
    FaultInjectionHook::Options o;
    o.processes = {SignalAt("kill", signal, 3)};
    o.on_fire = [&](const FiredFault& f) { observed.push_back(f); };
    o.raise_signal = [&](int sig) { raised.push_back(Raised{sig, hook->fired().size(), observed.size()}); };
    auto created = FaultInjectionHook::Create(o);
    REQUIRE_MESSAGE(created.ok(), created.status().ToString());
    hook = *created;
    auto sess = Open(Options(MakeGraph(model), dir.path(), &clock, {hook}, 6));
    CHECK(Train(*sess).ok());
    CHECK(sess->close().ok());
    CHECK(model->train_calls == 6);  // the raise returned: step 3 ran, no recovery
    REQUIRE(raised.size() == 1);
    CHECK(raised[0].signal == signal);
    CHECK(raised[0].fired_before == 1);
    CHECK(raised[0].observed_before == 1);
    REQUIRE(observed.size() == 1);
    CHECK(observed[0].id == "kill");
    CHECK(observed[0].path == "process");
    CHECK(observed[0].op == EnvOp::kAny);
    CHECK(observed[0].op_index == 3);
    const auto fired = hook->fired();
    REQUIRE(fired.size() == 1);
    CHECK(fired[0].path == "process");
    CHECK(fired[0].op_index == 3);
  }
}

TEST_CASE("a process fault at_time fires at the first run at or after that time since the session started") {
  TempDir dir;
  ManualClock clock;
  clock.Advance(absl::Seconds(100));  // the session starts at 100 s, not 0
  auto model = std::make_shared<Model>();
  std::vector<int> raised;
  FaultInjectionHook::Options o;
  ProcessFault term;
  term.id = "term";
  term.signal = SIGTERM;
  term.at_time = absl::Seconds(10);
  o.processes = {term};
  o.clock = &clock;
  o.raise_signal = [&](int sig) { raised.push_back(sig); };
  auto hook = FaultInjectionHook::Create(o);
  REQUIRE(hook.ok());
  auto sess = Open(Options(MakeGraph(model), dir.path(), &clock, {*hook}, 10));
  for (int i = 0; i < 4; ++i) REQUIRE(sess->run({"train_op"}).ok());
  clock.Advance(absl::Seconds(9));
  REQUIRE(sess->run({"train_op"}).ok());  // 9 s: not yet
  CHECK(raised.empty());
  clock.Advance(absl::Seconds(1));
  REQUIRE(sess->run({"train_op"}).ok());  // the run at global_step 5, 10 s after the start
  clock.Advance(absl::Seconds(10));
  CHECK(Train(*sess).ok());  // due again at every later run, but fired once
  CHECK(sess->close().ok());
  CHECK(raised == std::vector<int>{SIGTERM});
  const auto fired = (*hook)->fired();
  REQUIRE(fired.size() == 1);
  CHECK(fired[0].op_index == 5);
}

TEST_CASE("a process fault in an earlier process's record does not fire again; with repeat once per process") {
  for (bool repeat : {false, true}) {
    CAPTURE(repeat);
    TempDir dir;
    ManualClock clock;
    auto model = std::make_shared<Model>();
    int raised = 0;
    FaultInjectionHook::Options o;
    ProcessFault kill = SignalAt("kill", SIGKILL, 2);
    kill.repeat = repeat;
    ProcessFault early = SignalAt("early", SIGTERM, -1);
    early.at_time = absl::ZeroDuration();  // due at every run
    early.repeat = true;
    o.processes = {kill, early};
    o.clock = &clock;
    o.raise_signal = [&](int) { ++raised; };
    auto hook = FaultInjectionHook::Create(o);
    REQUIRE(hook.ok());
    (*hook)->MarkFired({{"kill", "process", EnvOp::kAny, 2}, {"early", "process", EnvOp::kAny, 0}});
    auto sess = Open(Options(MakeGraph(model), dir.path(), &clock, {*hook}, 5));
    CHECK(Train(*sess).ok());
    CHECK(sess->close().ok());
    // "early" repeats: once in this process (at step 0), not at every run.
    CHECK(raised == (repeat ? 2 : 1));
    std::vector<std::string> ids;
    for (const FiredFault& f : (*hook)->fired()) ids.push_back(f.id);
    CHECK(ids == (repeat ? std::vector<std::string>{"early", "kill"} : std::vector<std::string>{"early"}));
  }
}

TEST_CASE("on_fire sees step and hook faults before they take effect, and may call fired()") {
  TempDir dir;
  ManualClock clock;
  auto model = std::make_shared<Model>();
  std::vector<std::pair<std::string, int64_t>> observed;  // (id, train_calls when observed)
  std::shared_ptr<FaultInjectionHook> hook;
  FaultInjectionHook::Options o;
  o.steps = {StatusAt("preempt", absl::StatusCode::kAborted, 2)};
  HookFault throws;
  throws.id = "throws";
  throws.callback = "after_run";
  throws.at_step = 4;
  o.hooks = {throws};
  o.on_fire = [&](const FiredFault& f) {
    CHECK(hook->fired().back().id == f.id);  // no lock held; already recorded
    observed.emplace_back(f.id, model->train_calls);
  };
  auto created = FaultInjectionHook::Create(o);
  REQUIRE(created.ok());
  hook = *created;
  auto opts = Options(MakeGraph(model), dir.path(), &clock, {hook}, 8);
  opts.save_checkpoint_steps = int64_t{1};
  auto sess = Open(opts);
  const Status last = Train(*sess);
  CHECK(absl::IsInternal(last));
  sess->close().IgnoreError();
  REQUIRE(observed.size() == 2);
  CHECK(observed[0].first == "preempt");
  CHECK(observed[0].second == 2);  // steps 0 and 1 ran; step 2 did not (the error is returned after)
  CHECK(observed[1].first == "throws");
  CHECK(observed[1].second == 5);  // after step 4 ran (0, 1, 2 again, 3, 4)
}

TEST_CASE("FaultInjectionHook::Create rejects bad faults naming the fault and field") {
  StepFault ok = StatusAt("a", absl::StatusCode::kAborted, 1);
  StepFault no_id = ok;
  no_id.id = "";
  StepFault ok_code = ok;
  ok_code.id = "c";
  ok_code.code = absl::StatusCode::kOk;
  StepFault p = ok;
  p.id = "p";
  p.probability = 2;
  HookFault cb;
  cb.id = "h";
  cb.callback = "after_step";
  HookFault begin;
  begin.id = "b";
  begin.callback = "begin";
  begin.at_step = 3;
  HookFault dup;
  dup.id = "a";
  dup.callback = "end";
  ProcessFault both = SignalAt("both", SIGKILL, 3);
  both.at_time = absl::Seconds(1);
  ProcessFault late = SignalAt("late", SIGTERM, -1);
  late.at_time = absl::Hours(24 * 31);
  ProcessFault negative = SignalAt("neg", SIGTERM, -1);
  negative.at_time = absl::Seconds(-1);
  StepFault newline = ok;
  newline.id = "a\nb";
  HookFault tab;
  tab.id = "h\tt";
  tab.callback = "end";
  struct Case {
    FaultInjectionHook::Options options;
    const char* message;
  };
  const Case cases[] = {
      {{{no_id}, {}, 0}, "steps[0]: empty id"},
      {{{ok, ok_code}, {}, 0}, "steps[1] (\"c\"): code must not be OK"},
      {{{p}, {}, 0}, "steps[0] (\"p\"): probability must be in [0, 1]"},
      {{{}, {cb}, 0}, "hooks[0] (\"h\"): callback must be begin"},
      {{{}, {begin}, 0}, "hooks[0] (\"b\"): at_step must be -1 for begin"},
      {{{ok}, {dup}, 0}, "hooks[0] (\"a\"): duplicate id"},
      {{{}, {}, 0, {SignalAt("i", SIGINT, 1)}}, "processes[0] (\"i\"): signal must be SIGKILL or SIGTERM, got signal 2"},
      {{{}, {}, 0, {SignalAt("n", SIGKILL, -1)}}, "processes[0] (\"n\"): needs exactly one of at_step >= 0 or at_time"},
      {{{}, {}, 0, {both}}, "processes[0] (\"both\"): needs exactly one of at_step >= 0 or at_time"},
      {{{}, {}, 0, {late}}, "processes[0] (\"late\"): at_time must be in [0, 30 days]"},
      {{{}, {}, 0, {negative}}, "processes[0] (\"neg\"): at_time must be in [0, 30 days]"},
      {{{}, {}, 0, {SignalAt("s", SIGKILL, -3)}}, "processes[0] (\"s\"): at_step must be >= -1"},
      {{{ok}, {}, 0, {SignalAt("a", SIGKILL, 1)}}, "processes[0] (\"a\"): duplicate id"},
      // Control characters in an id (logged and recorded raw) are refused.
      {{{newline}, {}, 0}, "FaultInjectionHook: steps[0]: id \"a\\nb\" has a control character (0x0a) at byte 1"},
      {{{}, {tab}, 0}, "hooks[0]: id \"h\\tt\" has a control character (0x09) at byte 1"},
      {{{}, {}, 0, {SignalAt("k\r", SIGKILL, 1)}}, "processes[0]: id \"k\\r\" has a control character (0x0d)"},
  };
  for (const Case& c : cases) {
    CAPTURE(c.message);
    auto hook = FaultInjectionHook::Create(c.options);
    REQUIRE_FALSE(hook.ok());
    CHECK(absl::IsInvalidArgument(hook.status()));
    CHECK_MESSAGE(absl::StrContains(hook.status().message(), c.message), hook.status().message());
  }
}

}  // namespace
}  // namespace foreman
