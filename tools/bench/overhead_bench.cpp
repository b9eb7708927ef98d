// Runtime overhead per step (issue 6, part 2): a step function that only
// increments global_step, called
//   BM_BareStep                    directly in a loop (the baseline),
//   BM_SessionRun                  through the raw Session::Run,
//   BM_MonitoredSessionNoHooks     through MonitoredSession::run without hooks,
//   BM_MonitoredTrainingSession    through MonitoredTrainingSession::run with a
//                                  checkpoint_dir, so TF's default hooks are
//                                  really there (StepCounterHook,
//                                  SummarySaverHook, CheckpointSaverHook).
// The caller fetches "train_op" in every case, as a training loop does.
// Overhead = time per step minus BM_BareStep's, from the same invocation.
//
//   overhead_bench [--benchmark_repetitions=5 --benchmark_enable_random_interleaving=true ...]
#include <benchmark/benchmark.h>

#define EIGEN_USE_THREADS
#include <unsupported/Eigen/CXX11/Tensor>
#include <unsupported/Eigen/CXX11/ThreadPool>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "bench_util.hpp"
#include "foreman/graph.hpp"
#include "foreman/hooks.hpp"
#include "foreman/monitored_session.hpp"
#include "foreman/session.hpp"
#include "foreman/session_manager.hpp"
#include "foreman/variable_store.hpp"

namespace {

using foreman::Status;

// The step under test: increments global_step, answers "train_op".
foreman::StepFn IncrementStep() {
  return [](foreman::StepContext& ctx) -> Status {
    if (ctx.requested("train_op")) {
      FOREMAN_ASSIGN_OR_RETURN(int64_t step, foreman::IncrementGlobalStep(ctx.variables()));
      ctx.Set("train_op", foreman::Tensor::Scalar<int64_t>(step));
    }
    return absl::OkStatus();
  };
}

std::shared_ptr<foreman::Graph> IncrementGraph() {
  auto graph = std::make_shared<foreman::Graph>();
  (void)graph->CreateGlobalStep();
  (void)graph->SetStep(IncrementStep());
  return graph;
}

foreman::SessionConfig OneThread() {
  foreman::SessionConfig config;
  config.intra_op_parallelism_threads = 1;
  return config;
}

const std::vector<std::string> kFetches = {"train_op"};

void Fail(benchmark::State& state, const Status& s) { state.SkipWithError(s.ToString().c_str()); }

void BM_BareStep(benchmark::State& state) {
  foreman::VariableStore vars;
  (void)foreman::CreateGlobalStep(vars);
  const foreman::StepFn step = IncrementStep();
  const std::vector<std::string> requested = kFetches;
  const foreman::TensorMap feeds;
  foreman::TensorMap results;
  Eigen::ThreadPool pool(1);
  Eigen::ThreadPoolDevice device(&pool, 1);
  for (auto _ : state) {
    results.clear();
    foreman::StepContext ctx(&vars, &requested, &feeds, &results, &device, nullptr, foreman::Clock::Real());
    Status s = step(ctx);
    if (!s.ok()) {
      Fail(state, s);
      break;
    }
    benchmark::DoNotOptimize(results);
  }
  state.SetItemsProcessed(state.iterations());
}

void BM_SessionRun(benchmark::State& state) {
  auto session = foreman::Session::Create(IncrementGraph(), "", OneThread());
  if (!session.ok()) return Fail(state, session.status());
  Status init = (*session)->WithVariables([](foreman::VariableStore& vars) { return foreman::CreateGlobalStep(vars); });
  if (!init.ok()) return Fail(state, init);
  for (auto _ : state) {
    auto out = (*session)->Run(kFetches);
    if (!out.ok()) {
      Fail(state, out.status());
      break;
    }
    benchmark::DoNotOptimize(*out);
  }
  state.SetItemsProcessed(state.iterations());
}

// The timed loop of the monitored sessions: one run() per iteration, then close().
template <class Monitored>
void RunAndClose(benchmark::State& state, Monitored& session) {
  for (auto _ : state) {
    auto out = session.run(kFetches);
    if (!out.ok()) {
      Fail(state, out.status());
      break;
    }
    benchmark::DoNotOptimize(*out);
  }
  state.SetItemsProcessed(state.iterations());
  Status closed = session.close();
  if (!closed.ok()) Fail(state, closed);
}

void BM_MonitoredSessionNoHooks(benchmark::State& state) {
  foreman::MonitoredSessionOptions options;
  options.session_creator = std::make_shared<foreman::ChiefSessionCreator>(
      std::make_shared<foreman::Scaffold>(IncrementGraph()), "", OneThread());
  auto session = foreman::MonitoredSession::Create(std::move(options));
  if (!session.ok()) return Fail(state, session.status());
  RunAndClose(state, **session);
}

void BM_MonitoredTrainingSession(benchmark::State& state) {
  foreman_bench::ScratchDir dir("", "foreman_overhead");
  foreman::MonitoredTrainingSessionOptions options;
  options.graph = IncrementGraph();
  options.checkpoint_dir = dir.path();  // default hooks: step counter, summaries, checkpoints
  options.config = OneThread();
  auto session = foreman::MonitoredTrainingSession(std::move(options));
  if (!session.ok()) return Fail(state, session.status());
  RunAndClose(state, **session);
}

double Min(const std::vector<double>& v) { return v.empty() ? 0 : *std::min_element(v.begin(), v.end()); }
double Max(const std::vector<double>& v) { return v.empty() ? 0 : *std::max_element(v.begin(), v.end()); }

#define FOREMAN_OVERHEAD_BENCHMARK(fn) BENCHMARK(fn)->UseRealTime()->ComputeStatistics("min", Min)->ComputeStatistics("max", Max)

FOREMAN_OVERHEAD_BENCHMARK(BM_BareStep);
FOREMAN_OVERHEAD_BENCHMARK(BM_SessionRun);
FOREMAN_OVERHEAD_BENCHMARK(BM_MonitoredSessionNoHooks);
FOREMAN_OVERHEAD_BENCHMARK(BM_MonitoredTrainingSession);

}  // namespace

BENCHMARK_MAIN();
