// The runtime's cluster seam (cluster/remote_values.hpp) on an in-memory
// cluster (support/fake_remote_values.hpp): what a Session binds, reads and
// writes; a worker waiting for the chief (B88); chief and worker training
// one model through ComputeGradients + StepContext::ApplyGradients; the
// chief's checkpoint of one consistent ps state; OUT_OF_RANGE at the end of
// training (B41, cluster.md rule 7) and recovery from UNAVAILABLE (B46, B47,
// B49); StepContext::ApplyGradients on a local session.
#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "foreman/bundle.hpp"
#include "foreman/checkpoint.hpp"
#include "foreman/graph.hpp"
#include "foreman/hooks.hpp"
#include "foreman/monitored_session.hpp"
#include "foreman/nn.hpp"
#include "foreman/session.hpp"
#include "foreman/session_manager.hpp"
#include "foreman/variable_store.hpp"
#include "runtime/session_access.hpp"
#include "support/fake_remote_values.hpp"
#include "support/test_util.hpp"

namespace foreman {
namespace {

using testing::FakeCluster;
using testing::FakeRemoteValues;
using testing::TempDir;

constexpr auto kWait = std::chrono::seconds(20);

nn::OptimizerOptions Adam() {
  nn::OptimizerOptions o;
  o.kind = nn::OptimizerKind::kAdam;
  o.learning_rate = 0.01f;
  return o;
}

const nn::MlpSpec kSpec{4, {6}, 3};
constexpr int64_t kBatch = 8;

// A fixed batch: features float32 [8, 4], labels int32 [8] in [0, 3).
struct Batch {
  Tensor features;
  Tensor labels;
  Batch() {
    std::vector<float> x;
    std::vector<int32_t> y;
    for (int64_t i = 0; i < kBatch; ++i) {
      for (int64_t j = 0; j < kSpec.input_dim; ++j) x.push_back(std::sin(0.7f * static_cast<float>(i * 5 + j)));
      y.push_back(static_cast<int32_t>(i % 3));
    }
    features = Tensor::FromVector<float>(x, TensorShape({kBatch, kSpec.input_dim})).value();
    labels = Tensor::FromVector<int32_t>(y, TensorShape({kBatch})).value();
  }
};

// What a task's step saw.
struct StepLog {
  std::atomic<int> steps{0};
  std::atomic<bool> remote{false};
  std::atomic<int64_t> position{0};  // input_position after the last step
  // Called with the global_step the step starts from, before its update.
  std::function<void(int64_t)> on_step;
};

// One task's graph, as every worker of a TF1 cluster builds it: global_step
// first, the MLP's variables (Adam: slots and beta powers), the task's own
// "input_position" (device "/job:worker", +1 per step) and a local variable.
// The train_op computes the gradients and applies them with
// ctx.ApplyGradients; local = true updates with TrainStep instead.
std::shared_ptr<Graph> MlpGraph(const nn::OptimizerOptions& optimizer, std::shared_ptr<StepLog> log,
                                bool train_step = false) {
  auto graph = std::make_shared<Graph>();
  REQUIRE_OK(graph->CreateGlobalStep());
  REQUIRE_OK(nn::AddMlpVariables(*graph, kSpec, optimizer, /*seed=*/7));
  REQUIRE_OK(graph->AddVariable("input_position", Tensor::Scalar<int64_t>(0), /*trainable=*/false));
  REQUIRE_OK(graph->SetVariableDevice("input_position", "/job:worker"));
  REQUIRE_OK(graph->AddLocalVariable("local_batches", Tensor::Scalar<int64_t>(0)));
  std::shared_ptr<nn::Mlp> mlp = nn::Mlp::Create(kSpec, optimizer).value();
  auto batch = std::make_shared<Batch>();
  auto grads = std::make_shared<nn::Gradients>();
  REQUIRE_OK(graph->SetStep([=](StepContext& ctx) -> Status {
    if (!ctx.requested("train_op")) return absl::OkStatus();
    log->remote = ctx.remote_variables();
    FOREMAN_ASSIGN_OR_RETURN(int64_t step, GetGlobalStep(ctx.variables()));
    if (log->on_step) log->on_step(step);
    nn::StepResult result;
    if (train_step) {
      FOREMAN_ASSIGN_OR_RETURN(result, mlp->TrainStep(ctx.variables(), batch->features, batch->labels, ctx.compute()));
      FOREMAN_RETURN_IF_ERROR(IncrementGlobalStep(ctx.variables()).status());
    } else {
      FOREMAN_ASSIGN_OR_RETURN(result, mlp->ComputeGradients(ctx.variables(), batch->features, batch->labels,
                                                             ctx.compute(), grads.get()));
      FOREMAN_RETURN_IF_ERROR(ctx.ApplyGradients(*grads, nn::Tf1Optimizer(optimizer)));
    }
    for (const char* own : {"input_position", "local_batches"}) {
      FOREMAN_ASSIGN_OR_RETURN(Tensor * t, ctx.variables().Get(own));
      *t->data<int64_t>() += 1;
    }
    log->position = (*ctx.variables().Get("input_position"))->scalar<int64_t>().value();
    ++log->steps;
    ctx.Set("loss", Tensor::Scalar<float>(result.loss));
    return absl::OkStatus();
  }));
  return graph;
}

SessionConfig OneThread() {
  SessionConfig config;
  config.intra_op_parallelism_threads = 1;
  return config;
}

// A task's MonitoredTrainingSession options: no summaries or step counter;
// a checkpoint every `save_steps` steps into `dir` (none when empty), each
// save waited for (a listener makes it synchronous).
MonitoredTrainingSessionOptions TaskOptions(std::shared_ptr<Graph> graph, const std::string& master, bool is_chief,
                                            const std::string& dir = "", int64_t save_steps = 0) {
  MonitoredTrainingSessionOptions o;
  o.graph = std::move(graph);
  o.master = master;
  o.is_chief = is_chief;
  o.checkpoint_dir = dir;
  o.config = OneThread();
  o.stop_grace_period_secs = 0;
  o.save_checkpoint_secs = std::nullopt;
  o.save_checkpoint_steps = save_steps > 0 ? Defaultable<int64_t>(save_steps) : Defaultable<int64_t>::None();
  if (save_steps > 0) o.checkpoint_listeners.push_back(std::make_shared<CheckpointSaverListener>());
  o.save_summaries_steps = std::nullopt;
  o.save_summaries_secs = std::nullopt;
  o.log_step_count_steps = std::nullopt;
  o.recovery_wait_secs = 0.01;
  o.max_wait_secs = 20;
  o.recovery.initial_backoff = absl::ZeroDuration();
  return o;
}

std::unique_ptr<MonitoredSession> OpenSession(MonitoredTrainingSessionOptions o) {
  auto sess = MonitoredTrainingSession(std::move(o));
  REQUIRE_MESSAGE(sess.ok(), sess.status().ToString());
  return std::move(sess).value();
}

// Runs train_op `n` times (stops early when the session says so).
Status Train(MonitoredSession& sess, int n) {
  for (int i = 0; i < n && !sess.should_stop(); ++i) {
    StatusOr<TensorMap> out = sess.run({"train_op", "loss"});
    if (!out.ok()) return out.status();
  }
  return absl::OkStatus();
}

int64_t Int(const StatusOr<Tensor>& t) {
  REQUIRE_MESSAGE(t.ok(), t.status().ToString());
  return t->scalar<int64_t>().value();
}

// -- Graph::SetVariableDevice ------------------------------------------------------

TEST_CASE("SetVariableDevice takes \"\" and \"/job:worker\" only, for a declared variable of an open graph") {
  Graph graph;
  REQUIRE_OK(graph.AddVariable("v", Tensor::Scalar<float>(0.f)));
  CHECK(graph.variables()[0].device.empty());  // the default: a ps task
  REQUIRE_OK(graph.SetVariableDevice("v", "/job:worker"));
  CHECK(graph.variables()[0].device == "/job:worker");
  REQUIRE_OK(graph.SetVariableDevice("v", ""));
  CHECK(graph.variables()[0].device.empty());

  Status bad = graph.SetVariableDevice("v", "/job:ps/task:0");
  CHECK(absl::IsInvalidArgument(bad));
  CHECK(absl::StrContains(bad.message(), "'v'"));
  CHECK(absl::StrContains(bad.message(), "/job:ps/task:0"));
  Status missing = graph.SetVariableDevice("w", "/job:worker");
  CHECK(absl::IsNotFound(missing));
  CHECK(absl::StrContains(missing.message(), "'w'"));
  graph.Finalize();
  CHECK(absl::IsFailedPrecondition(graph.SetVariableDevice("v", "/job:worker")));  // B21
}

// -- Bind --------------------------------------------------------------------------

TEST_CASE("Session::Create binds the global variables without a device, in declaration order") {
  FakeCluster cluster("bind", 2, Adam());
  auto graph = std::make_shared<Graph>();
  REQUIRE_OK(graph->AddVariable("b", Tensor::Scalar<float>(0.f)));
  REQUIRE_OK(graph->CreateGlobalStep());
  REQUIRE_OK(graph->AddLocalVariable("local", Tensor::Scalar<float>(0.f)));
  REQUIRE_OK(graph->AddVariable("position", Tensor::Scalar<int64_t>(0), false));
  REQUIRE_OK(graph->SetVariableDevice("position", "/job:worker"));
  REQUIRE_OK(graph->AddVariable("a", Tensor::Scalar<float>(0.f)));
  REQUIRE_OK(graph->SetStep([](StepContext&) { return absl::OkStatus(); }));

  auto session = Session::Create(graph, cluster.target("chief"));
  REQUIRE_MESSAGE(session.ok(), session.status().ToString());
  CHECK(cluster.ps().bound_names() == std::vector<std::string>{"b", "global_step", "a"});
  CHECK(cluster.ps().calls(FakeRemoteValues::kBind) == 1);
  // global_step on ps 0, the rest round-robin (PlaceVariablesOnPs).
  CHECK(cluster.ps().placement() == std::vector<int>{1, 0, 0});

  // Another task binding a different list: Bind's INVALID_ARGUMENT, unchanged.
  auto other = std::make_shared<Graph>();
  REQUIRE_OK(other->AddVariable("b", Tensor::Scalar<float>(0.f)));
  REQUIRE_OK(other->SetStep([](StepContext&) { return absl::OkStatus(); }));
  auto refused = Session::Create(other, cluster.target("worker1"));
  CHECK(absl::IsInvalidArgument(refused.status()));
  CHECK(absl::StrContains(refused.status().message(), "global_step"));

  // A local session binds nothing and reads nothing.
  auto local = Session::Create(graph, "");
  REQUIRE_OK(local);
  CHECK(cluster.ps().calls(FakeRemoteValues::kBind) == 2);
  CHECK(cluster.ps().calls(FakeRemoteValues::kRead) == 0);
}

// -- reads and writes --------------------------------------------------------------

// The chief's session, prepared by its session manager with the default
// init op (which writes the ps once).
std::unique_ptr<Session> InitializedChief(FakeCluster& cluster, std::shared_ptr<Graph> graph) {
  SessionManagerOptions manager_options;
  manager_options.graph = graph;
  manager_options.local_init_op = DefaultLocalInitOp();
  auto manager = SessionManager::Create(manager_options);
  REQUIRE_OK(manager);
  PrepareSessionOptions prepare;
  prepare.init_op = DefaultInitOp();
  prepare.config = OneThread();
  auto chief = (*manager)->prepare_session(cluster.target("chief"), prepare);
  REQUIRE_MESSAGE(chief.ok(), chief.status().ToString());
  return std::move(chief).value();
}

TEST_CASE("reads refresh the mirror first; only the chief's init op and restore write to the ps") {
  FakeCluster cluster("rw", 2, Adam());
  auto log = std::make_shared<StepLog>();
  auto graph = MlpGraph(Adam(), log);
  auto session = Session::Create(graph, cluster.target("chief"), OneThread());
  REQUIRE_OK(session);
  Session& s = **session;

  // Uninitialized shards: every remote variable is uninitialized, the
  // task's own is too until its init; the ready op reads (B79).
  std::vector<std::string> missing = s.UninitializedVariables();
  CHECK(std::find(missing.begin(), missing.end(), "global_step") != missing.end());
  CHECK(std::find(missing.begin(), missing.end(), "dense/kernel") != missing.end());
  CHECK(cluster.ps().calls(FakeRemoteValues::kRead) == 1);

  // The default init op under the chief's session manager writes once.
  std::unique_ptr<Session> chief = InitializedChief(cluster, graph);
  CHECK(cluster.ps().calls(FakeRemoteValues::kWrite) == 1);
  CHECK(Int(cluster.ps().Value("global_step")) == 0);
  CHECK(cluster.ps().ShardOf("input_position") == -1);  // the task's own stays in its mirror
  CHECK(cluster.ps().ShardOf("local_batches") == -1);

  // A hook's WithVariables reads and never writes, even when it changes
  // the mirror: the next read replaces the change with the ps's value.
  const int reads = cluster.ps().calls(FakeRemoteValues::kRead);
  REQUIRE_OK(chief->WithVariables([](VariableStore& vars) { return SetGlobalStep(vars, 41); }));
  CHECK(cluster.ps().calls(FakeRemoteValues::kRead) == reads + 1);
  CHECK(cluster.ps().calls(FakeRemoteValues::kWrite) == 1);
  CHECK(Int(cluster.ps().Value("global_step")) == 0);
  CHECK(*chief->GlobalStep() == 0);  // GlobalStep reads first
  CHECK(cluster.ps().calls(FakeRemoteValues::kRead) == reads + 2);
  CHECK(chief->Snapshot().count("dense/kernel") == 1);
  CHECK(cluster.ps().calls(FakeRemoteValues::kRead) == reads + 3);

  // A run reads, then its update goes to the ps and its global_step comes back.
  REQUIRE_OK(chief->Run({"train_op"}));
  CHECK(log->remote);
  CHECK(cluster.ps().calls(FakeRemoteValues::kApply) == 1);
  CHECK(cluster.ps().applied_at() == std::vector<int64_t>{0});
  CHECK(Int(cluster.ps().Value("global_step")) == 1);

  // UNAVAILABLE from a read comes out of each reader unchanged.
  const Status down = absl::UnavailableError("fake ps 1 at 127.0.0.1:1 is unreachable");
  cluster.ps().FailNext(FakeRemoteValues::kRead, down, 3);
  CHECK(chief->Run({"train_op"}).status() == down);
  CHECK(chief->GlobalStep().status() == down);
  CHECK(chief->WithVariables([](VariableStore&) { return absl::OkStatus(); }) == down);
  CHECK(log->steps == 1);  // no step ran on a failed read
  cluster.ps().FailNext(FakeRemoteValues::kApply, down);
  CHECK(chief->Run({"train_op"}).status() == down);
  cluster.ps().FailNext(FakeRemoteValues::kRead, down);
  CHECK(DefaultReadyOp()(*chief).status() == down);  // the ready check: UNAVAILABLE, not "uninitialized"
  // The public UninitializedVariables has no error: the ps tasks' variables
  // are reported, the task's own by its mirror.
  cluster.ps().FailNext(FakeRemoteValues::kRead, down);
  missing = chief->UninitializedVariables(/*include_local=*/true);
  CHECK(std::find(missing.begin(), missing.end(), "global_step") != missing.end());
  CHECK(std::find(missing.begin(), missing.end(), "dense/kernel") != missing.end());
  CHECK(std::find(missing.begin(), missing.end(), "input_position") == missing.end());
  CHECK(chief->UninitializedVariables(true).empty());  // reachable again
}

// Issue 30 bug 4: graph.hpp's local way of writing a step (update
// variables() in place, increment global_step) on a cluster never trained,
// silently: the next read overwrote the change.

TEST_CASE("issue 30: a cluster step that updates variables() in place fails with FAILED_PRECONDITION naming it") {
  SUBCASE("TrainStep and IncrementGlobalStep: global_step named, every run") {
    FakeCluster cluster("in_place_step", 2, Adam());
    auto log = std::make_shared<StepLog>();
    std::unique_ptr<Session> chief = InitializedChief(cluster, MlpGraph(Adam(), log, /*train_step=*/true));
    for (int run = 0; run < 2; ++run) {
      StatusOr<TensorMap> out = chief->Run({"train_op"});
      CHECK(absl::IsFailedPrecondition(out.status()));
      CHECK_MESSAGE(absl::StrContains(out.status().message(), "variable 'global_step' in place (from 0 to 1)"),
                    out.status().ToString());
      CHECK(absl::StrContains(out.status().message(), "StepContext::ApplyGradients"));
    }
    CHECK(cluster.ps().calls(FakeRemoteValues::kApply) == 0);
  }
  SUBCASE("a weight changed without global_step: named at the first run") {
    FakeCluster cluster("in_place_weight", 1, Adam());
    auto graph = std::make_shared<Graph>();
    REQUIRE_OK(graph->CreateGlobalStep());
    REQUIRE_OK(graph->AddVariable("w", Tensor::Scalar<float>(1.0f)));
    REQUIRE_OK(graph->AddLocalVariable("local_count", Tensor::Scalar<int64_t>(0)));
    auto bump = std::make_shared<std::atomic<bool>>(false);
    REQUIRE_OK(graph->SetStep([bump](StepContext& ctx) -> Status {
      FOREMAN_ASSIGN_OR_RETURN(Tensor * local, ctx.variables().Get("local_count"));
      *local->data<int64_t>() += 1;  // a local variable is the worker's own: allowed
      if (bump->load()) {
        FOREMAN_ASSIGN_OR_RETURN(Tensor * w, ctx.variables().Get("w"));
        *w->data<float>() += 1.0f;
      }
      return absl::OkStatus();
    }));
    std::unique_ptr<Session> chief = InitializedChief(cluster, graph);
    SUBCASE("changed at the first run") {
      bump->store(true);
      StatusOr<TensorMap> out = chief->Run({"train_op"});
      CHECK(absl::IsFailedPrecondition(out.status()));
      CHECK_MESSAGE(absl::StrContains(out.status().message(), "variable 'w' in place"), out.status().ToString());
    }
    SUBCASE("a step that changes only its own local variable runs") {
      REQUIRE_OK(chief->Run({"train_op"}).status());
      REQUIRE_OK(chief->Run({"train_op"}).status());
    }
  }
}

TEST_CASE("a run reads all but the optimizer slots (ReadForStep); a run fetching a slot reads them all") {
  FakeCluster cluster("step_reads", 2, Adam());
  auto graph = MlpGraph(Adam(), std::make_shared<StepLog>());
  std::unique_ptr<Session> chief = InitializedChief(cluster, graph);
  Session& s = *chief;
  const auto same = [&](const Tensor& t, const std::string& name) {
    StatusOr<Tensor> remote = cluster.ps().Value(name);
    REQUIRE_MESSAGE(remote.ok(), name);
    return t.TotalBytes() == remote->TotalBytes() &&
           std::memcmp(t.raw_data(), remote->raw_data(), t.TotalBytes()) == 0;
  };

  const int reads = cluster.ps().calls(FakeRemoteValues::kRead);
  REQUIRE_OK(s.Run({"train_op"}).status());
  // The step's read, and the one of RemoteValues' default ApplyAndRead
  // (Apply, then ReadForStep: the fake has no fused answer).
  CHECK(cluster.ps().calls(FakeRemoteValues::kReadForStep) == 2);
  CHECK(cluster.ps().calls(FakeRemoteValues::kRead) == reads);
  CHECK(Int(cluster.ps().Value("global_step")) == 1);

  // A variable's fetch: the step's read; its value is the ps's after the update.
  StatusOr<TensorMap> kernel = s.Run({"dense/kernel"});
  REQUIRE_OK(kernel.status());
  CHECK(cluster.ps().calls(FakeRemoteValues::kReadForStep) == 3);
  CHECK(cluster.ps().calls(FakeRemoteValues::kRead) == reads);
  CHECK(same(kernel->at("dense/kernel"), "dense/kernel"));

  // A slot's fetch: a full read, the slot as the ps's update left it.
  StatusOr<TensorMap> slot = s.Run({"dense/kernel/Adam"});
  REQUIRE_OK(slot.status());
  CHECK(cluster.ps().calls(FakeRemoteValues::kRead) == reads + 1);
  CHECK(cluster.ps().calls(FakeRemoteValues::kReadForStep) == 3);
  CHECK(same(slot->at("dense/kernel/Adam"), "dense/kernel/Adam"));
  StatusOr<Tensor> initial = cluster.ps().Value("dense/kernel/Adam");
  REQUIRE_OK(initial);

  // The fake's ReadForStep leaves the mirror's slots: a second update
  // changes the ps's slot, the step's read does not bring it, a full read does.
  REQUIRE_OK(s.Run({"train_op"}).status());
  CHECK_FALSE(same(*initial, "dense/kernel/Adam"));
  VariableStore mirror;
  REQUIRE_OK(mirror.Create("dense/kernel/Adam", *initial, false));
  REQUIRE_OK(cluster.ps().ReadForStep(mirror));
  CHECK(std::memcmp(mirror.Get("dense/kernel/Adam").value()->raw_data(), initial->raw_data(),
                    initial->TotalBytes()) == 0);
  CHECK(same(*mirror.Get("dense/kernel").value(), "dense/kernel"));
  REQUIRE_OK(cluster.ps().Read(mirror));
  CHECK(same(*mirror.Get("dense/kernel/Adam").value(), "dense/kernel/Adam"));
}

// -- a worker waits for the chief, then both train ---------------------------------

TEST_CASE("B88 a worker waits until the chief initialised the ps; chief and worker end at the sum of their steps") {
  FakeCluster cluster("train", 2, Adam());
  auto chief_log = std::make_shared<StepLog>();
  auto worker_log = std::make_shared<StepLog>();
  TempDir dir("remote_session");

  // The worker polls the ready op until the chief's init op wrote the ps.
  auto worker_open = std::async(std::launch::async, [&] {
    return OpenSession(TaskOptions(MlpGraph(Adam(), worker_log), cluster.target("worker1"), /*is_chief=*/false));
  });
  REQUIRE(cluster.ps().AwaitUninitializedRead(absl::Seconds(20)));
  CHECK(worker_open.wait_for(std::chrono::milliseconds(0)) == std::future_status::timeout);
  CHECK(cluster.ps().calls(FakeRemoteValues::kWrite) == 0);

  auto chief = OpenSession(TaskOptions(MlpGraph(Adam(), chief_log), cluster.target("chief"), true, dir.path(), 4));
  REQUIRE(worker_open.wait_for(kWait) == std::future_status::ready);
  std::unique_ptr<MonitoredSession> worker = worker_open.get();
  CHECK(cluster.ps().calls(FakeRemoteValues::kWrite) == 1);  // the chief's init op only
  const Tensor initial_kernel = cluster.ps().Value("dense/kernel").value();

  constexpr int kChiefSteps = 9;
  constexpr int kWorkerSteps = 14;
  auto worker_trained = std::async(std::launch::async, [&] { return Train(*worker, kWorkerSteps); });
  REQUIRE_OK(Train(*chief, kChiefSteps));
  REQUIRE(worker_trained.wait_for(kWait) == std::future_status::ready);
  REQUIRE_OK(worker_trained.get());
  CHECK(chief_log->remote);
  CHECK(worker_log->remote);
  CHECK(chief_log->steps == kChiefSteps);
  CHECK(worker_log->steps == kWorkerSteps);
  CHECK(Int(cluster.ps().Value("global_step")) == kChiefSteps + kWorkerSteps);
  CHECK(cluster.ps().applied_at().size() == kChiefSteps + kWorkerSteps);
  CHECK_FALSE(cluster.ps().Value("dense/kernel")->Equals(initial_kernel));
  // Each task's "/job:worker" variable is its own.
  CHECK(worker_log->position == kWorkerSteps);
  CHECK(chief_log->position == kChiefSteps);
  REQUIRE_OK(worker->close());
  REQUIRE_OK(chief->close());  // the final checkpoint
  CHECK(cluster.ps().calls(FakeRemoteValues::kWrite) == 1);  // no hook wrote
  CHECK(cluster.ps().calls(FakeRemoteValues::kReadConsistent) >= 1);

  // Every checkpoint the chief kept is one state of the ps (the state the
  // update to its global_step left) plus the chief's own input_position;
  // never the local variable (TF's LOCAL_VARIABLES are not saved).
  auto history = cluster.ps().history();
  auto prefixes = ListCheckpointPrefixes(Env::Default(), dir.path());
  REQUIRE_OK(prefixes);
  REQUIRE_FALSE(prefixes->empty());
  bool saw_final = false;
  for (const std::string& prefix : *prefixes) {
    CAPTURE(prefix);
    auto reader = BundleReader::Open(Env::Default(), prefix);
    REQUIRE_MESSAGE(reader.ok(), reader.status().ToString());
    const int64_t step = Int((*reader)->Lookup("global_step"));
    REQUIRE(history.count(step) == 1);
    for (const auto& entry : history.at(step)) {
      const std::string& name = entry.first;
      CAPTURE(name);
      auto saved = (*reader)->Lookup(name);
      REQUIRE_OK(saved);
      CHECK(saved->Equals(entry.second));
    }
    CHECK(Int((*reader)->Lookup("input_position")) <= kChiefSteps);
    CHECK_FALSE((*reader)->Contains("local_batches"));
    CHECK((*reader)->entries().size() == history.at(step).size() + 1);
    if (step == kChiefSteps + kWorkerSteps) {
      saw_final = true;
      CHECK(Int((*reader)->Lookup("input_position")) == kChiefSteps);
    }
  }
  CHECK(saw_final);
}

// -- the end of training -------------------------------------------------------------

TEST_CASE("B41 OUT_OF_RANGE from Apply (the chief ended training) ends a MonitoredTrainingSession cleanly") {
  FakeCluster cluster("end", 1, Adam());
  TempDir dir("remote_session");
  auto chief_log = std::make_shared<StepLog>();
  auto worker_log = std::make_shared<StepLog>();
  auto chief = OpenSession(TaskOptions(MlpGraph(Adam(), chief_log), cluster.target("chief"), true, dir.path(), 100));
  auto worker = OpenSession(TaskOptions(MlpGraph(Adam(), worker_log), cluster.target("worker1"), false));
  REQUIRE_OK(Train(*chief, 2));
  REQUIRE_OK(Train(*worker, 3));
  cluster.ps().EndTraining();

  auto ended = worker->run({"train_op"});
  CHECK(absl::IsOutOfRange(ended.status()));
  CHECK(worker->should_stop());
  CHECK_OK(worker->close());
  CHECK(absl::IsOutOfRange(chief->run({"train_op"}).status()));
  CHECK(chief->should_stop());
  REQUIRE_OK(chief->close());  // end(): the final checkpoint, read from the ended ps
  CHECK(Int(cluster.ps().Value("global_step")) == 5);
  auto latest = LatestCheckpoint(Env::Default(), dir.path());
  REQUIRE_OK(latest);
  REQUIRE(latest->has_value());
  auto reader = BundleReader::Open(Env::Default(), **latest);
  REQUIRE_OK(reader);
  CHECK(Int((*reader)->Lookup("global_step")) == 5);
  CHECK(Int((*reader)->Lookup("input_position")) == 2);
}

// -- recovery ---------------------------------------------------------------------------

TEST_CASE("B47 B49 UNAVAILABLE: the chief recovers; it restores a restarted ps, re-attaches to a surviving one") {
  FakeCluster cluster("recover", 2, Adam());
  TempDir dir("remote_session");
  auto log = std::make_shared<StepLog>();
  auto armed = std::make_shared<std::atomic<bool>>(false);
  bool ps_restarts = false;
  std::vector<int64_t> expected;  // every Apply's computed_at_step
  SUBCASE("ps 1 restarted: the chief restores the ps from its checkpoint, losing the steps after it") {
    ps_restarts = true;
    log->on_step = [&cluster, armed](int64_t step) {
      // Step 7's update cannot reach ps 1, which comes back empty.
      if (step == 7 && !armed->exchange(true)) {
        cluster.ps().Restart(1);
        cluster.ps().FailNext(FakeRemoteValues::kApply, absl::UnavailableError("fake ps 1 is down"));
      }
    };
    // Steps 0..6 were applied, then training went on from the checkpoint's
    // step (5, saved before the failure).
    for (int64_t s = 0; s <= 6; ++s) expected.push_back(s);
    for (int64_t s = 5; s < 12; ++s) expected.push_back(s);
  }
  SUBCASE("a read failed, the ps kept its state: the chief re-attaches without rewinding (cluster.md rule 5)") {
    log->on_step = [&cluster, armed](int64_t step) {
      // The run after the first one from step 7 cannot read the ps.
      if (step == 7 && !armed->exchange(true)) {
        cluster.ps().FailNext(FakeRemoteValues::kRead, absl::UnavailableError("fake ps 1 is down"));
      }
    };
    for (int64_t s = 0; s < 12; ++s) expected.push_back(s);
  }
  auto options = TaskOptions(MlpGraph(Adam(), log), cluster.target("chief"), true, dir.path(), 5);
  std::atomic<int> recovered{0};
  options.recovery.on_recovered = [&recovered](const RecoveryReport&) { ++recovered; };
  auto stop = StopAtStepHook::Create({std::nullopt, 12});
  REQUIRE_OK(stop);
  options.hooks.push_back(*stop);
  auto chief = OpenSession(std::move(options));
  while (!chief->should_stop()) REQUIRE_OK(chief->run({"train_op"}).status());
  REQUIRE_OK(chief->close());

  CHECK(recovered == 1);
  // The init op, then the restore (none on a re-attach).
  CHECK(cluster.ps().calls(FakeRemoteValues::kWrite) == (ps_restarts ? 2 : 1));
  CHECK(Int(cluster.ps().Value("global_step")) == 12);
  CHECK(cluster.ps().applied_at() == expected);
  // The chief's own input position is always the checkpoint's (5) after a
  // recovery, then one per step: 7 steps from 5 after a restore, 4 from 8
  // after a re-attach.
  CHECK(log->position == (ps_restarts ? 5 + 7 : 5 + 4));
}

// -- a chief restart (cluster.md rule 5) --------------------------------------------------

// The chief of cluster `cluster` trains `steps` steps with a checkpoint
// every 5 into `dir`, and closes (its final checkpoint at the last step).
void ChiefTrains(FakeCluster& cluster, const std::string& task, const std::string& dir, int steps) {
  auto chief = OpenSession(TaskOptions(MlpGraph(Adam(), std::make_shared<StepLog>()), cluster.target(task), true,
                                       dir, 5));
  REQUIRE_OK(Train(*chief, steps));
  REQUIRE_OK(chief->close());
}

// The checkpoint at `prefix`'s value of `name`.
Tensor Saved(const std::string& prefix, const std::string& name) {
  auto reader = BundleReader::Open(Env::Default(), prefix);
  REQUIRE_MESSAGE(reader.ok(), reader.status().ToString());
  auto value = (*reader)->Lookup(name);
  REQUIRE_MESSAGE(value.ok(), value.status().ToString());
  return *value;
}

TEST_CASE("rule 5 a restarted chief re-attaches to a ps past its checkpoint: no write, its own position restored") {
  FakeCluster cluster("reattach", 2, Adam());
  TempDir dir("remote_session");
  ChiefTrains(cluster, "chief", dir.path(), 7);  // checkpoints up to model.ckpt-7
  // The chief is gone; worker 1 trains on (TF1: only the ps serves it).
  auto worker_log = std::make_shared<StepLog>();
  auto worker = OpenSession(TaskOptions(MlpGraph(Adam(), worker_log), cluster.target("worker1"), false));
  REQUIRE_OK(Train(*worker, 4));
  CHECK(worker_log->steps == 4);
  const Tensor kernel = cluster.ps().Value("dense/kernel").value();
  const Tensor slot = cluster.ps().Value("dense/kernel/Adam").value();
  REQUIRE(Int(cluster.ps().Value("global_step")) == 11);
  auto latest = LatestCheckpoint(Env::Default(), dir.path());
  REQUIRE_OK(latest);
  REQUIRE(latest->has_value());
  REQUIRE(Int(Saved(**latest, "global_step")) == 7);
  REQUIRE_FALSE(Saved(**latest, "dense/kernel").Equals(kernel));

  // The chief restarts (a new process: a new mirror) on the same directory.
  auto log = std::make_shared<StepLog>();
  auto first_step = std::make_shared<std::atomic<int64_t>>(-1);
  log->on_step = [first_step](int64_t step) {
    int64_t none = -1;
    first_step->compare_exchange_strong(none, step);
  };
  auto chief = OpenSession(TaskOptions(MlpGraph(Adam(), log), cluster.target("chief-restarted"), true, dir.path(), 5));
  CHECK(cluster.ps().calls(FakeRemoteValues::kWrite) == 1);  // the first chief's init op only
  CHECK(Int(cluster.ps().Value("global_step")) == 11);
  CHECK(cluster.ps().Value("dense/kernel")->Equals(kernel));
  CHECK(cluster.ps().Value("dense/kernel/Adam")->Equals(slot));

  // Both train on from global_step 11: nothing rewound. The chief's own
  // input position goes on from the checkpoint's 7 (the ps does not hold it).
  const std::size_t applied_before = cluster.ps().applied_at().size();
  REQUIRE_OK(Train(*chief, 2));
  CHECK(*first_step == 11);
  CHECK(log->position == 9);
  REQUIRE_OK(Train(*worker, 1));
  CHECK(Int(cluster.ps().Value("global_step")) == 14);
  const std::vector<int64_t> applied = cluster.ps().applied_at();
  REQUIRE(applied.size() == applied_before + 3);
  for (std::size_t i = 1; i < applied.size(); ++i) CHECK(applied[i] >= applied[i - 1]);
  REQUIRE_OK(worker->close());
  REQUIRE_OK(chief->close());
  CHECK(cluster.ps().calls(FakeRemoteValues::kWrite) == 1);
}

TEST_CASE("issue 31 point 3: ps tasks holding only an init op's values, no update since, are initialised again") {
  // The chief's first init, half done (one ps timed out) and retried by its
  // recovery, or a chief restarted before its first step: nothing to lose.
  FakeCluster cluster("init_again", 2, Adam());
  auto graph = MlpGraph(Adam(), std::make_shared<StepLog>());
  std::unique_ptr<Session> first = InitializedChief(cluster, graph);
  REQUIRE(cluster.ps().calls(FakeRemoteValues::kWrite) == 1);
  cluster.ps().Restart(1);  // one shard lost its init
  std::unique_ptr<Session> second = InitializedChief(cluster, graph);
  CHECK(cluster.ps().calls(FakeRemoteValues::kWrite) == 2);
  CHECK(Int(cluster.ps().Value("global_step")) == 0);
  CHECK(cluster.ps().Value("dense/kernel").ok());
}

TEST_CASE("issue 31 point 3: a chief with no checkpoint re-attaches to its job's initialized ps; an init op is refused") {
  FakeCluster cluster("no_checkpoint", 2, Adam());
  TempDir first_dir("remote_session");
  ChiefTrains(cluster, "chief", first_dir.path(), 7);
  const Tensor kernel = cluster.ps().Value("dense/kernel").value();
  REQUIRE(Int(cluster.ps().Value("global_step")) == 7);
  REQUIRE(cluster.ps().calls(FakeRemoteValues::kWrite) == 1);

  // The chief restarts with an empty directory (its volume lost): TF1 would
  // run the init op and wipe the job's 7 steps; it re-attaches instead.
  TempDir empty_dir("remote_session");
  auto log = std::make_shared<StepLog>();
  auto first_step = std::make_shared<std::atomic<int64_t>>(-1);
  log->on_step = [first_step](int64_t step) {
    int64_t none = -1;
    first_step->compare_exchange_strong(none, step);
  };
  auto chief = OpenSession(TaskOptions(MlpGraph(Adam(), log), cluster.target("chief-restarted"), true,
                                       empty_dir.path(), 100));
  CHECK(cluster.ps().calls(FakeRemoteValues::kWrite) == 1);  // no init op reached the ps
  CHECK(Int(cluster.ps().Value("global_step")) == 7);
  CHECK(cluster.ps().Value("dense/kernel")->Equals(kernel));
  REQUIRE_OK(Train(*chief, 2));
  CHECK(*first_step == 7);   // trains on from the ps's step
  CHECK(log->position == 2);  // its own input position: the local init's, from 0
  REQUIRE_OK(chief->close());
  CHECK(Int(cluster.ps().Value("global_step")) == 9);

  // The ps itself refuses an init op once initialized (a chief that raced
  // past the check): only a restore replaces a running job's variables.
  {
    auto session = Session::Create(MlpGraph(Adam(), std::make_shared<StepLog>()), cluster.target("racer"),
                                   OneThread());
    REQUIRE_OK(session);
    internal::WriteThroughScope init(**session, internal::RemoteValues::WriteKind::kInit);
    const Status refused = (*session)->WithVariables([](VariableStore&) { return absl::OkStatus(); });
    CHECK(refused.code() == absl::StatusCode::kFailedPrecondition);
    CHECK(cluster.ps().calls(FakeRemoteValues::kWrite) == 2);
    CHECK(Int(cluster.ps().Value("global_step")) == 9);
  }

  // One shard restarted (empty), the other holding the job's state, and no
  // checkpoint: nothing to restore the first from, and an init op would wipe
  // the second. FAILED_PRECONDITION naming both; nothing written.
  cluster.ps().Restart(1);
  TempDir another_empty("remote_session");
  auto options = TaskOptions(MlpGraph(Adam(), std::make_shared<StepLog>()), cluster.target("chief-3"), true,
                             another_empty.path(), 100);
  auto refused = MonitoredTrainingSession(std::move(options));
  REQUIRE(refused.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK_MESSAGE(absl::StrContains(refused.status().message(), "fake ps 0 holds the variables of cluster job 'fake' "
                                                              "(global_step 9) but fake ps 1 holds none"),
                refused.status());
  CHECK_MESSAGE(absl::StrContains(refused.status().message(), another_empty.path()), refused.status());
  CHECK(cluster.ps().calls(FakeRemoteValues::kWrite) == 2);
  CHECK(Int(cluster.ps().Value("global_step")) == 9);
}

TEST_CASE("issue 31 point 3: with ps 0 (global_step's) restarted and no checkpoint, the refusal names the step held") {
  // global_step is placed first, on ps 0 (PlaceVariablesOnPs): when ps 0 is
  // the restarted one, the initialized shard holds no global_step; the
  // message must not print the empty shard's -1 as the job's step.
  FakeCluster cluster("ps0_restarted", 2, Adam());
  TempDir first_dir("remote_session");
  ChiefTrains(cluster, "chief", first_dir.path(), 6);
  REQUIRE(Int(cluster.ps().Value("global_step")) == 6);
  cluster.ps().Restart(0);
  TempDir empty_dir("remote_session");
  auto options = TaskOptions(MlpGraph(Adam(), std::make_shared<StepLog>()), cluster.target("chief-2"), true,
                             empty_dir.path(), 100);
  auto refused = MonitoredTrainingSession(std::move(options));
  REQUIRE(refused.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK_MESSAGE(absl::StrContains(refused.status().message(),
                                  "fake ps 1 holds the variables of cluster job 'fake' but fake ps 0 holds none"),
                refused.status());
  CHECK_MESSAGE(!absl::StrContains(refused.status().message(), "-1"), refused.status());
  CHECK(cluster.ps().calls(FakeRemoteValues::kWrite) == 1);  // the first chief's init op only
}

TEST_CASE("issue 31 point 3: a chief with no checkpoint does not re-attach to an initialized ps of another job") {
  // The re-attach is for the chief's own job only: on a ps task of another
  // cluster job the init op runs, and that ps task refuses it.
  FakeCluster cluster("other_job", 2, Adam());
  TempDir first_dir("remote_session");
  ChiefTrains(cluster, "chief", first_dir.path(), 4);
  cluster.ps().SetJobId(0, "another-job");
  TempDir empty_dir("remote_session");
  auto options = TaskOptions(MlpGraph(Adam(), std::make_shared<StepLog>()), cluster.target("chief-2"), true,
                             empty_dir.path(), 100);
  auto refused = MonitoredTrainingSession(std::move(options));
  REQUIRE_MESSAGE(refused.status().code() == absl::StatusCode::kFailedPrecondition, refused.status());
  CHECK_MESSAGE(absl::StrContains(refused.status().message(), "refused an init op"), refused.status());
  CHECK(cluster.ps().calls(FakeRemoteValues::kWrite) == 2);  // the init op reached the ps, which refused it
  CHECK(Int(cluster.ps().Value("global_step")) == 4);
}

TEST_CASE("rule 5 a restarted chief restores a ps that is uninitialized or behind its latest checkpoint, as TF1") {
  TempDir dir("remote_session");
  {
    FakeCluster first("restore-first", 2, Adam());
    ChiefTrains(first, "chief", dir.path(), 7);  // model.ckpt-7
  }
  auto latest = LatestCheckpoint(Env::Default(), dir.path());
  REQUIRE_OK(latest);
  REQUIRE(latest->has_value());
  const std::string prefix = **latest;
  REQUIRE(Int(Saved(prefix, "global_step")) == 7);

  bool behind = false;
  SUBCASE("uninitialized: a new ps") {}
  SUBCASE("behind: a ps that another run initialised and trained 2 steps") { behind = true; }
  FakeCluster cluster("restore", 2, Adam());
  if (behind) {
    TempDir other("remote_session");
    ChiefTrains(cluster, "other-chief", other.path(), 2);
    REQUIRE(Int(cluster.ps().Value("global_step")) == 2);
  }
  const int writes = cluster.ps().calls(FakeRemoteValues::kWrite);
  auto log = std::make_shared<StepLog>();
  auto chief = OpenSession(TaskOptions(MlpGraph(Adam(), log), cluster.target("chief"), true, dir.path(), 100));
  CHECK(cluster.ps().calls(FakeRemoteValues::kWrite) == writes + 1);  // the restore
  CHECK(Int(cluster.ps().Value("global_step")) == 7);
  for (const char* name : {"dense/kernel", "dense/kernel/Adam", "dense/bias"}) {
    CAPTURE(name);
    CHECK(cluster.ps().Value(name)->Equals(Saved(prefix, name)));
  }
  REQUIRE_OK(Train(*chief, 1));
  CHECK(cluster.ps().applied_at().back() == 7);
  CHECK(log->position == 8);  // the checkpoint's 7, then one step
  REQUIRE_OK(chief->close());
}

// Issue 13: a ps task restarted (uninitialized) and unreachable for 25 reads,
// more than the 2 recoveries the options allow: one recovery waits for it
// (RemoteValues::ps_wait), the chief restores every shard from its latest
// checkpoint and reports the steps lost since.
TEST_CASE("issue 13: while a ps is unreachable one recovery waits for it, then the chief restores all shards") {
  FakeCluster cluster("pswait", 2, Adam());
  cluster.ps().SetPsWait({absl::Seconds(20), absl::Milliseconds(1)});
  TempDir dir("remote_session");
  auto log = std::make_shared<StepLog>();
  auto armed = std::make_shared<std::atomic<bool>>(false);
  log->on_step = [&cluster, armed](int64_t step) {
    // During step 7 the ps restarts: its apply and the next 25 reads fail.
    if (step == 7 && !armed->exchange(true)) {
      cluster.ps().Restart();
      cluster.ps().FailNext(FakeRemoteValues::kApply, absl::UnavailableError("fake ps 1 is down"));
      cluster.ps().FailNext(FakeRemoteValues::kRead, absl::UnavailableError("fake ps 1 is down"), 25);
    }
  };
  auto options = TaskOptions(MlpGraph(Adam(), log), cluster.target("chief"), true, dir.path(), 5);
  options.recovery.max_recoveries = 2;
  std::vector<RecoveryReport> reports;
  options.recovery.on_recovered = [&reports](const RecoveryReport& r) { reports.push_back(r); };
  auto stop = StopAtStepHook::Create({std::nullopt, 12});
  REQUIRE_OK(stop);
  options.hooks.push_back(*stop);
  auto chief = OpenSession(std::move(options));
  while (!chief->should_stop()) REQUIRE_OK(chief->run({"train_op"}).status());
  REQUIRE_OK(chief->close());

  CHECK(cluster.ps().calls(FakeRemoteValues::kRead) > 25);  // every failing read was retried
  CHECK(chief->recoveries() == 1);
  REQUIRE(reports.size() == 1);
  CHECK(reports[0].recoveries == 1);
  // The chief had seen global_step 7 when the ps was lost, and restored
  // the checkpoint of step 5: 2 steps lost.
  CHECK(reports[0].global_step_before == 7);
  CHECK(reports[0].restored_global_step == 5);
  CHECK(reports[0].steps_lost == 2);
  CHECK(chief->steps_lost() == 2);
  CHECK(Int(cluster.ps().Value("global_step")) == 12);
  CHECK(cluster.ps().ShardOf("global_step") == 0);  // every shard restored
  CHECK_OK(cluster.ps().Value("dense/kernel"));
}

TEST_CASE("issue 13: past the ps wait the run fails with UNAVAILABLE naming the ps task and the wait") {
  FakeCluster cluster("pswait_gone", 1, Adam());
  cluster.ps().SetPsWait({absl::Milliseconds(100), absl::Milliseconds(5)});
  TempDir dir("remote_session");
  auto log = std::make_shared<StepLog>();
  auto armed = std::make_shared<std::atomic<bool>>(false);
  log->on_step = [&cluster, armed](int64_t step) {
    if (step == 3 && !armed->exchange(true)) {
      cluster.ps().FailNext(FakeRemoteValues::kRead, absl::UnavailableError("fake ps 0 is down"), 1 << 30);
    }
  };
  auto options = TaskOptions(MlpGraph(Adam(), log), cluster.target("chief"), true, dir.path(), 2);
  options.recovery.max_recoveries = 1000;  // the wait, not the budget, ends it
  auto chief = OpenSession(std::move(options));
  const auto start = std::chrono::steady_clock::now();
  Status s = absl::OkStatus();
  for (int i = 0; i < 100 && s.ok(); ++i) s = chief->run({"train_op"}).status();
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  CHECK(absl::IsUnavailable(s));
  CHECK_MESSAGE(absl::StrContains(s.message(), "fake ps 0 is down"), s.ToString());
  CHECK_MESSAGE(absl::StrContains(s.message(), "still unreachable after"), s.ToString());
  CHECK_MESSAGE(absl::StrContains(s.message(), "--ps-wait-secs is 0.1 s"), s.ToString());
  CHECK(chief->recoveries() == 1);  // one recovery, however many attempts
  CHECK(cluster.ps().calls(FakeRemoteValues::kRead) > 5);
  CHECK(secs < 10);  // bounded by the wait (0.1 s), with room for a slow machine
  CHECK(absl::IsUnavailable(chief->close()));
}

TEST_CASE("issue 13: a stop requested while waiting for a ps ends the wait with UNAVAILABLE saying so") {
  FakeCluster cluster("pswait_stop", 1, Adam());
  cluster.ps().SetPsWait({absl::Seconds(60), absl::Milliseconds(5)});
  TempDir dir("remote_session");
  auto log = std::make_shared<StepLog>();
  auto armed = std::make_shared<std::atomic<bool>>(false);
  log->on_step = [&cluster, armed](int64_t step) {
    if (step == 3 && !armed->exchange(true)) {
      cluster.ps().FailNext(FakeRemoteValues::kRead, absl::UnavailableError("fake ps 0 is down"), 1 << 30);
    }
  };
  auto chief = OpenSession(TaskOptions(MlpGraph(Adam(), log), cluster.target("chief"), true, dir.path(), 2));
  std::shared_ptr<StopRequest> stop = chief->stop_request();
  // Stops once the wait is under way (several failed reads), bounded.
  auto stopper = std::async(std::launch::async, [&cluster, stop] {
    const auto until = std::chrono::steady_clock::now() + kWait;
    while (cluster.ps().calls(FakeRemoteValues::kRead) < 15 && std::chrono::steady_clock::now() < until) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    stop->request_stop();
  });
  const auto start = std::chrono::steady_clock::now();
  Status s = absl::OkStatus();
  for (int i = 0; i < 100 && s.ok() && !chief->should_stop(); ++i) s = chief->run({"train_op"}).status();
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  stopper.get();
  CHECK(absl::IsUnavailable(s));
  CHECK_MESSAGE(absl::StrContains(s.message(), "a stop was requested after"), s.ToString());
  CHECK(chief->recoveries() == 1);
  CHECK(secs < 30);  // not the 60 s wait
  chief->close().IgnoreError();
}

// -- a local session -----------------------------------------------------------------------

TEST_CASE("ApplyGradients on a local session is bitwise TrainStep, and increments global_step") {
  for (nn::OptimizerKind kind : {nn::OptimizerKind::kSgd, nn::OptimizerKind::kMomentum, nn::OptimizerKind::kAdam}) {
    CAPTURE(nn::OptimizerKindName(kind));
    nn::OptimizerOptions optimizer = Adam();
    optimizer.kind = kind;
    auto applied_log = std::make_shared<StepLog>();
    auto trained_log = std::make_shared<StepLog>();
    auto applied = Session::Create(MlpGraph(optimizer, applied_log), "", OneThread());
    auto trained = Session::Create(MlpGraph(optimizer, trained_log, /*train_step=*/true), "", OneThread());
    REQUIRE_OK(applied);
    REQUIRE_OK(trained);
    for (Session* s : {applied->get(), trained->get()}) {
      REQUIRE_OK(DefaultInitOp()(*s, {}));
      REQUIRE_OK(DefaultLocalInitOp()(*s));
      for (int i = 0; i < 3; ++i) REQUIRE_OK(s->Run({"train_op"}).status());
    }
    CHECK_FALSE(applied_log->remote);
    CHECK(*(*applied)->GlobalStep() == 3);
    const auto a = (*applied)->Snapshot();
    const auto b = (*trained)->Snapshot();
    REQUIRE(a.size() == b.size());
    for (const auto& entry : a) {
      const std::string& name = entry.first;
      CAPTURE(name);
      REQUIRE(b.count(name) == 1);
      CHECK(entry.second.Equals(b.at(name)));
    }
  }
}

}  // namespace
}  // namespace foreman
