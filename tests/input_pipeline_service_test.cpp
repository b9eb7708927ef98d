// The session-owned input pipeline (MonitoredSession::NewInputPipeline): its
// producer is a service of the session's supervision tree, kind
// "input_pipeline", under the session's RestartPolicy and ActorFaults.
// TF's default (a killed or throwing producer ends the run), permanent
// (restarted, and Next() still returns exactly Dataset::GetBatch across the
// restart), temporary (removed), intensity exceeded (escalates), delay and
// drop, and the pipeline's lifetime against close(). The training loop's
// steps come from the test model; the test thread plays the input side and
// calls Next() between steps. No sleeps: a ManualClock for the session,
// bounded polls for what the actors do.
#include <doctest/doctest.h>

#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "foreman/clock.hpp"
#include "foreman/dataset.hpp"
#include "foreman/fault.hpp"
#include "foreman/hooks.hpp"
#include "foreman/input_pipeline.hpp"
#include "foreman/monitored_session.hpp"
#include "foreman/restart_policy.hpp"
#include "support/log_capture.hpp"
#include "support/test_util.hpp"
#include "support/training_graph.hpp"

namespace foreman {
namespace {

using data::Batch;
using data::Dataset;
using data::DatasetPosition;
using data::InputPipeline;
using testing::Background;
using testing::kRealTimeout;
using testing::Open;
using testing::TempDir;

/// `n` images of 4x4 in batches of 4, shuffled with seed 1, endless.
std::shared_ptr<const Dataset> MakeDataset(int64_t n = 64) {
  data::LabeledImages d;
  d.images = Tensor(DataType::kUInt8, TensorShape({n, 4, 4}));
  d.labels = Tensor(DataType::kUInt8, TensorShape({n}));
  for (int64_t i = 0; i < n * 16; ++i) d.images.data<uint8_t>()[i] = static_cast<uint8_t>(i * 13 % 251);
  for (int64_t i = 0; i < n; ++i) d.labels.data<uint8_t>()[i] = static_cast<uint8_t>(i % 10);
  data::DatasetOptions o;
  o.batch_size = 4;
  o.seed = 1;
  auto ds = Dataset::Create(std::move(d), o);
  REQUIRE_MESSAGE(ds.ok(), ds.status().ToString());
  return *ds;
}

void CheckSameAsGetBatch(const Dataset& ds, const StatusOr<Batch>& got, const DatasetPosition& at) {
  StatusOr<Batch> want = ds.GetBatch(at);
  REQUIRE_MESSAGE(got.ok(), "at ", at.ToString(), ": ", got.status().ToString());
  REQUIRE(want.ok());
  CHECK(got->features.Equals(want->features));
  CHECK(got->labels.Equals(want->labels));
  CHECK(got->position == want->position);
  CHECK(got->next == want->next);
}

MonitoredTrainingSessionOptions Options(const std::string& dir, ManualClock* clock, HookList hooks,
                                        int64_t last_step = 40) {
  return testing::QuietOptions(dir, clock, std::move(hooks), last_step);
}

std::unique_ptr<InputPipeline> Pipeline(MonitoredSession& sess, std::shared_ptr<const Dataset> ds,
                                        data::InputPipelineOptions o = {}) {
  auto p = sess.NewInputPipeline(std::move(ds), std::move(o));
  REQUIRE_MESSAGE(p.ok(), p.status().ToString());
  return *std::move(p);
}

std::shared_ptr<FaultInjectionHook> ActorHook(std::vector<ActorFault> faults) {
  FaultInjectionHook::Options o;
  o.actors = std::move(faults);
  auto hook = FaultInjectionHook::Create(o);
  REQUIRE_MESSAGE(hook.ok(), hook.status().ToString());
  return *hook;
}

ActorFault Fault(std::string id, ActorFault::Kind kind, int64_t at_step) {
  ActorFault f;
  f.id = std::move(id);
  f.service = "input_pipeline";
  f.kind = kind;
  f.at_step = at_step;
  return f;
}

RestartPolicy Restarting(RestartType type, int max_restarts = 3) {
  RestartPolicy p;
  p.services["input_pipeline"] = type;
  p.max_restarts = max_restarts;
  p.period = absl::Seconds(60);
  return p;
}

/// What the input side saw: one Next() before each step, until one fails or
/// the session stops, and one more after the last step.
struct Served {
  std::vector<DatasetPosition> positions;  // of the batches served, in order
  Status failed;                           // the first failing Next()
  int steps = 0;
};

/// Runs the session's steps; after each, takes the next batch (the first
/// before any step), checking it against GetBatch. A Next() timeout is
/// measured on the session's ManualClock, which nobody advances here: a
/// batch that never comes is caught by the test's meson timeout.
Served Train(MonitoredSession& sess, InputPipeline& pipe, const Dataset& ds, int max_steps) {
  Served out;
  DatasetPosition pos;
  for (int i = 0; i < max_steps && !sess.should_stop(); ++i) {
    StatusOr<Batch> b = pipe.Next(pos, absl::Hours(1));
    if (!b.ok()) {
      out.failed = b.status();
      break;
    }
    CheckSameAsGetBatch(ds, b, pos);
    out.positions.push_back(pos);
    pos = b->next;
    if (!sess.run({"train_op"}).ok()) break;
    ++out.steps;
  }
  if (out.failed.ok()) {
    // The input side asks once more (a killed producer's run may have
    // stopped first); a batch it gets is not counted.
    StatusOr<Batch> b = pipe.Next(pos, absl::Hours(1));
    if (!b.ok()) out.failed = b.status();
  }
  return out;
}

/// The positions GetBatch walks from the start.
std::vector<DatasetPosition> Walk(const Dataset& ds, std::size_t n) {
  std::vector<DatasetPosition> out;
  DatasetPosition pos;
  for (std::size_t i = 0; i < n; ++i) {
    out.push_back(pos);
    auto b = ds.GetBatch(pos);
    REQUIRE(b.ok());
    pos = b->next;
  }
  return out;
}

// -- TF's default policy ---------------------------------------------------------------------

TEST_CASE("default policy (TF): a killed producer ends the run naming the fault; Next() is FAILED_PRECONDITION") {
  TempDir dir;
  ManualClock clock;
  auto ds = MakeDataset();
  auto hook = ActorHook({Fault("kill-ip", ActorFault::Kind::kKill, 3)});
  auto sess = Open(Options(dir.path(), &clock, {hook}));
  auto pipe = Pipeline(*sess, ds);
  const Served served = Train(*sess, *pipe, *ds, 20);
  // The kill fires in the 4th run's before_run (global_step 3) and the hook
  // waits until the supervisor has applied the policy: the 4th step still
  // runs (its batch was taken before), the next Next() fails.
  CHECK(served.positions == Walk(*ds, 4));
  CHECK(absl::IsFailedPrecondition(served.failed));
  CHECK_MESSAGE(absl::StrContains(served.failed.message(),
                                  "input pipeline: the producer input_pipeline(1) stopped and is not restarted"),
                served.failed.ToString());
  CHECK_MESSAGE(absl::EndsWith(served.failed.message(), "injected actor fault kill-ip"), served.failed.ToString());
  CHECK(InjectedFaultId(served.failed) == std::optional<std::string>("kill-ip"));  // the kill's payload, kept
  CHECK(sess->should_stop());
  const Status closed = sess->close();
  CHECK(absl::IsInternal(closed));
  CHECK_MESSAGE(absl::StrContains(closed.message(), "injected actor fault kill-ip"), closed.ToString());
  CHECK(sess->service_restarts().empty());
  const auto fired = hook->fired();
  REQUIRE(fired.size() == 1);
  CHECK(fired[0].path == "actor:input_pipeline");
  CHECK(fired[0].op_index == 3);
}

TEST_CASE("default policy (TF): user code that throws in the producer ends the run with its error") {
  TempDir dir;
  ManualClock clock;
  auto ds = MakeDataset();
  auto sess = Open(Options(dir.path(), &clock, {}));
  data::InputPipelineOptions o;
  o.prefetch_batches = 1;
  const DatasetPosition bad = Walk(*ds, 3)[2];
  o.before_batch = [bad](const DatasetPosition& p) {
    if (p == bad) throw std::runtime_error("decoder exploded");
  };
  auto pipe = Pipeline(*sess, ds, o);
  const Served served = Train(*sess, *pipe, *ds, 20);
  CHECK(served.positions == Walk(*ds, 2));
  CHECK(absl::IsFailedPrecondition(served.failed));
  CHECK_MESSAGE(absl::StrContains(served.failed.message(), "decoder exploded"), served.failed.ToString());
  const Status closed = sess->close();
  CHECK(absl::IsInternal(closed));
  CHECK_MESSAGE(absl::StrContains(closed.message(), "decoder exploded"), closed.ToString());
}

// -- restart policies ------------------------------------------------------------------------

TEST_CASE("permanent: a killed producer is restarted; Next() serves exactly GetBatch across the restart") {
  TempDir dir;
  ManualClock clock;
  auto ds = MakeDataset();
  auto hook = ActorHook({Fault("kill-ip", ActorFault::Kind::kKill, 3)});
  auto o = Options(dir.path(), &clock, {hook}, 12);
  o.runtime.restart = Restarting(RestartType::kPermanent);
  auto sess = Open(o);
  auto pipe = Pipeline(*sess, ds);
  const Served served = Train(*sess, *pipe, *ds, 30);
  CHECK(served.failed.ok());
  CHECK(served.steps == 12);
  CHECK(served.positions == Walk(*ds, 12));  // every batch, in order, none twice
  CHECK(sess->close().ok());
  const auto r = sess->service_restarts();
  REQUIRE(r.size() == 1);
  CHECK(r[0].service == "input_pipeline(1)");
  CHECK(r[0].restarted);
  CHECK(r[0].reason.message() == "injected actor fault kill-ip");
  CHECK(pipe->stats().seeks == 2);  // the first Next(), and once after the restart
  CHECK(pipe->stats().batches == 13);  // and the one after the last step
}

TEST_CASE("temporary: a killed producer is removed; Next() is FAILED_PRECONDITION saying so; the run ends OK") {
  TempDir dir;
  ManualClock clock;
  auto ds = MakeDataset();
  auto o = Options(dir.path(), &clock, {ActorHook({Fault("kill-ip", ActorFault::Kind::kKill, 2)})}, 12);
  o.runtime.restart = Restarting(RestartType::kTemporary);
  auto sess = Open(o);
  auto pipe = Pipeline(*sess, ds);
  const Served served = Train(*sess, *pipe, *ds, 30);
  CHECK(served.positions == Walk(*ds, 3));
  CHECK(absl::IsFailedPrecondition(served.failed));
  CHECK_MESSAGE(absl::StrContains(served.failed.message(),
                                  "the producer input_pipeline(1) was removed by the restart policy (temporary) after "
                                  "INTERNAL: injected actor fault kill-ip"),
                served.failed.ToString());
  CHECK_FALSE(sess->should_stop());  // the run goes on without it
  CHECK(sess->close().ok());
  const auto r = sess->service_restarts();
  REQUIRE(r.size() == 1);
  CHECK_FALSE(r[0].restarted);
}

TEST_CASE("intensity exceeded: the second kill within the period escalates; the run fails with it") {
  TempDir dir;
  ManualClock clock;
  auto ds = MakeDataset();
  auto hook = ActorHook({Fault("kill-1", ActorFault::Kind::kKill, 2), Fault("kill-2", ActorFault::Kind::kKill, 5)});
  auto o = Options(dir.path(), &clock, {hook}, 12);
  o.runtime.restart = Restarting(RestartType::kPermanent, /*max_restarts=*/1);
  auto sess = Open(o);
  auto pipe = Pipeline(*sess, ds);
  const Served served = Train(*sess, *pipe, *ds, 30);
  CHECK(served.positions == Walk(*ds, 6));
  CHECK(absl::IsFailedPrecondition(served.failed));
  CHECK_MESSAGE(absl::StrContains(served.failed.message(), "stopped and is not restarted: INTERNAL: injected actor "
                                                           "fault kill-2"),
                served.failed.ToString());
  const Status closed = sess->close();
  CHECK(absl::IsInternal(closed));
  CHECK_MESSAGE(absl::StrContains(closed.message(), "injected actor fault kill-2"), closed.ToString());
  const auto r = sess->service_restarts();
  REQUIRE(r.size() == 1);
  CHECK(r[0].reason.message() == "injected actor fault kill-1");
}

// -- delay and drop ----------------------------------------------------------------------

TEST_CASE("delay: the producer's next decode waits the delay on the session's Clock, then serves GetBatch") {
  TempDir dir;
  ManualClock clock;
  auto ds = MakeDataset();
  ActorFault f = Fault("slow", ActorFault::Kind::kDelay, 0);
  f.delay = absl::Seconds(5);
  auto sess = Open(Options(dir.path(), &clock, {ActorHook({f})}));
  Mutex mu;
  std::vector<absl::Duration> decoded_at;  // the Clock's time at each decode
  data::InputPipelineOptions o;
  o.prefetch_batches = 1;
  o.before_batch = [&](const DatasetPosition&) {
    MutexLock l(mu);
    decoded_at.push_back(clock.MonotonicNow());
  };
  auto pipe = Pipeline(*sess, ds, o);
  const absl::Duration start = clock.MonotonicNow();
  REQUIRE(sess->run({"train_op"}).ok());  // global_step 0: the delay is armed; nothing decoded yet
  StatusOr<Batch> got = absl::UnknownError("not run");
  {
    Background next([&] { got = pipe->Next(DatasetPosition{}, absl::Seconds(60)); }, &clock);
    // The producer sleeps in the clock, Next() waits in it.
    REQUIRE(clock.BlockUntilWaiters(2, kRealTimeout));
    CHECK_FALSE(next.Done());
    clock.Advance(absl::Seconds(5));
    REQUIRE(next.WaitDone());
  }
  CheckSameAsGetBatch(*ds, got, DatasetPosition{});
  {
    MutexLock l(mu);
    REQUIRE_FALSE(decoded_at.empty());
    CHECK(decoded_at[0] == start + absl::Seconds(5));
  }
  CHECK(sess->close().ok());
}

TEST_CASE("drop: the next batch is lost; Next() is DEADLINE_EXCEEDED naming the fault, and a retry re-requests it") {
  TempDir dir;
  ManualClock clock;
  testing::CapturedLog log;
  auto ds = MakeDataset();
  auto sess = Open(Options(dir.path(), &clock, {ActorHook({Fault("drop", ActorFault::Kind::kDrop, 0)})}));
  auto pipe = Pipeline(*sess, ds);
  REQUIRE(sess->run({"train_op"}).ok());  // global_step 0: the drop is armed
  StatusOr<Batch> got = absl::UnknownError("not run");
  {
    Background next([&] { got = pipe->Next(DatasetPosition{}, absl::Seconds(1)); }, &clock);
    // Advance only once the batch is gone, so the retry meets no drop.
    const absl::Time deadline = absl::Now() + kRealTimeout;
    while (!absl::StrContains(log.text(), "dropped (injected actor fault drop)") && absl::Now() < deadline) {
      std::this_thread::yield();
    }
    REQUIRE(clock.BlockUntilWaiters(1, kRealTimeout));
    clock.Advance(absl::Seconds(1));
    REQUIRE(next.WaitDone());
  }
  CHECK(absl::IsDeadlineExceeded(got.status()));
  // The timeout names the fault and carries its payload (foreman train: exit 3).
  CHECK(got.status().message() == "input pipeline: no batch for " + DatasetPosition{}.ToString() +
                                      " within 1s (dropped by injected actor fault drop)");
  CHECK(InjectedFaultId(got.status()) == std::optional<std::string>("drop"));
  CHECK_MESSAGE(absl::StrContains(log.text(), "input_pipeline: the batch at " + DatasetPosition{}.ToString() +
                                                  " dropped (injected actor fault drop)"),
                log.text());
  const Served served = Train(*sess, *pipe, *ds, 5);  // from the start again: the retry
  CHECK(served.failed.ok());
  CHECK(served.positions == Walk(*ds, 5));
  CHECK(pipe->stats().seeks == 2);
  CHECK(sess->close().ok());
}

// -- lifetime ----------------------------------------------------------------------------------

TEST_CASE("a pipeline used after close() fails FAILED_PRECONDITION at once; destroying it after the session is safe") {
  TempDir dir;
  ManualClock clock;
  auto ds = MakeDataset();
  std::unique_ptr<InputPipeline> pipe;
  {
    auto sess = Open(Options(dir.path(), &clock, {}));
    pipe = Pipeline(*sess, ds);
    CheckSameAsGetBatch(*ds, pipe->Next(DatasetPosition{}, absl::Hours(1)), DatasetPosition{});
    CHECK(sess->close().ok());
    auto later = sess->NewInputPipeline(ds);
    CHECK(absl::IsFailedPrecondition(later.status()));
  }  // the session, and its actor system reference, are gone
  const StatusOr<Batch> b = pipe->Next(Walk(*ds, 2)[1], absl::Hours(1));
  CHECK(absl::IsFailedPrecondition(b.status()));
  CHECK_MESSAGE(absl::StrContains(b.status().message(), "input pipeline: the session is closed (close())"),
                b.status().ToString());
  pipe.reset();  // returns: its link was detached at close()
}

TEST_CASE("a pipeline destroyed while the session runs is forgotten by the supervisor: no failure, no restart") {
  TempDir dir;
  ManualClock clock;
  auto ds = MakeDataset();
  auto o = Options(dir.path(), &clock, {}, 6);
  o.runtime.restart = Restarting(RestartType::kPermanent);
  auto sess = Open(o);
  auto pipe = Pipeline(*sess, ds);
  CheckSameAsGetBatch(*ds, pipe->Next(DatasetPosition{}, absl::Hours(1)), DatasetPosition{});
  pipe.reset();
  auto second = Pipeline(*sess, ds);  // a new one is input_pipeline(2)
  const Served served = Train(*sess, *second, *ds, 6);
  CHECK(served.failed.ok());
  CHECK(sess->close().ok());
  CHECK(sess->service_restarts().empty());
}

TEST_CASE("NewInputPipeline refuses bad options naming them") {
  TempDir dir;
  ManualClock clock;
  auto sess = Open(Options(dir.path(), &clock, {}));
  CHECK(absl::IsInvalidArgument(sess->NewInputPipeline(nullptr).status()));
  data::InputPipelineOptions o;
  o.prefetch_batches = 0;
  auto p = sess->NewInputPipeline(MakeDataset(), o);
  CHECK(absl::IsInvalidArgument(p.status()));
  CHECK(absl::StrContains(p.status().message(), "prefetch_batches must be >= 1, got 0"));
  ManualClock other;
  o = {};
  o.clock = &other;
  p = sess->NewInputPipeline(MakeDataset(), o);
  CHECK(absl::IsInvalidArgument(p.status()));
  CHECK(absl::StrContains(p.status().message(), "options.clock must be left at its default"));
  CHECK(sess->close().ok());
}

TEST_CASE("ValidateRestartPolicy and FaultInjectionHook accept the input_pipeline service") {
  CHECK(ValidateRestartPolicy(Restarting(RestartType::kTransient)).ok());
  FaultInjectionHook::Options o;
  o.actors = {Fault("k", ActorFault::Kind::kKill, 1)};
  CHECK(FaultInjectionHook::Create(o).ok());
}

}  // namespace
}  // namespace foreman
