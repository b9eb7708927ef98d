#include "foreman/session.hpp"

#include <doctest/doctest.h>

#define EIGEN_USE_THREADS
#include <unsupported/Eigen/CXX11/Tensor>

#include <atomic>
#include <stdexcept>
#include <thread>

#include "foreman/cuda.hpp"

namespace foreman {
namespace {

// w += 1 and global_step += 1 on "train_op"; "w" and "loss" on request.
std::shared_ptr<Graph> CounterGraph(std::atomic<int>* loss_computations = nullptr) {
  auto graph = std::make_shared<Graph>();
  REQUIRE(graph->CreateGlobalStep().ok());
  REQUIRE(graph->AddVariable("w", Tensor::Scalar<float>(0.0f)).ok());
  REQUIRE(graph
              ->SetStep([loss_computations](StepContext& ctx) -> Status {
                FOREMAN_ASSIGN_OR_RETURN(Tensor * w, ctx.variables().Get("w"));
                if (ctx.requested("train_op")) {
                  w->data<float>()[0] += 1.0f;
                  FOREMAN_RETURN_IF_ERROR(IncrementGlobalStep(ctx.variables()).status());
                }
                if (ctx.requested("w")) ctx.Set("w", *w);
                if (ctx.requested("loss")) {
                  if (loss_computations != nullptr) ++*loss_computations;
                  ctx.Set("loss", Tensor::Scalar<float>(10.0f - w->data<float>()[0]));
                }
                if (const Tensor* x = ctx.feed("x")) ctx.Set("x_echo", *x);
                ctx.Set("never_requested", Tensor::Scalar<float>(1.0f));
                return absl::OkStatus();
              })
              .ok());
  return graph;
}

Status InitAll(Session& session) {
  return session.WithVariables([&](VariableStore& vars) -> Status {
    for (const VariableDef& def : session.graph()->variables()) {
      FOREMAN_ASSIGN_OR_RETURN(Tensor value, def.initializer());
      FOREMAN_RETURN_IF_ERROR(vars.Create(def.name, std::move(value), def.trainable));
    }
    return absl::OkStatus();
  });
}

TEST_CASE("Session::Run computes only the requested fetches and returns exactly those") {
  std::atomic<int> loss_computations{0};
  auto sess = Session::Create(CounterGraph(&loss_computations));
  REQUIRE(sess.ok());
  REQUIRE(InitAll(**sess).ok());
  auto out = (*sess)->Run({"train_op_is_not_a_result", "w"}, {});
  CHECK(out.status().code() == absl::StatusCode::kNotFound);
  CHECK(out.status().message().find("'train_op_is_not_a_result'") != absl::string_view::npos);

  auto w = (*sess)->Run({"w"});
  REQUIRE(w.ok());
  CHECK(w->size() == 1);
  CHECK(loss_computations == 0);
  auto loss = (*sess)->Run({"loss", "loss"});
  REQUIRE(loss.ok());
  CHECK(loss->size() == 1);
  CHECK(loss_computations == 1);
  CHECK(loss->at("loss").scalar<float>().value() == 10.0f);
}

TEST_CASE("B126 the built-in global_step fetch is the value before the step") {
  auto graph = std::make_shared<Graph>();
  REQUIRE(graph->CreateGlobalStep().ok());
  REQUIRE(graph->SetStep([](StepContext& ctx) -> Status {
                  if (ctx.requested("train_op")) {
                    FOREMAN_RETURN_IF_ERROR(IncrementGlobalStep(ctx.variables()).status());
                    ctx.Set("train_op", Tensor::Scalar<int64_t>(1));
                  }
                  return absl::OkStatus();
                })
              .ok());
  auto sess = Session::Create(graph);
  REQUIRE(sess.ok());
  REQUIRE(InitAll(**sess).ok());
  for (int64_t before = 0; before < 3; ++before) {
    auto run = (*sess)->Run({"train_op", "global_step"});
    REQUIRE(run.ok());
    CHECK(run->at("global_step").scalar<int64_t>().value() == before);
    CHECK(*(*sess)->GlobalStep() == before + 1);
  }
  // Without an update the read equals the real step.
  auto read = (*sess)->Run({"global_step"});
  REQUIRE(read.ok());
  CHECK(read->at("global_step").scalar<int64_t>().value() == 3);
}

TEST_CASE("train_op is answered by the Session when the step does not set it (TF: None for an op)") {
  auto sess = Session::Create(CounterGraph());  // trains on train_op, never sets it
  REQUIRE(sess.ok());
  REQUIRE(InitAll(**sess).ok());
  auto out = (*sess)->Run({"train_op", "loss"});
  REQUIRE(out.ok());
  CHECK(out->size() == 2);
  CHECK(out->at("train_op").dtype() == DataType::kInvalid);
  CHECK(out->at("loss").scalar<float>().value() == 9.0f);
  CHECK(*(*sess)->GlobalStep() == 1);
  // A variable the step does not answer is its value after the step.
  auto gs = (*sess)->Run({"train_op", "w"});
  REQUIRE(gs.ok());
  CHECK(gs->at("w").scalar<float>().value() == 2.0f);
}

TEST_CASE("A step that sets train_op itself keeps its own answer") {
  auto graph = std::make_shared<Graph>();
  REQUIRE(graph->CreateGlobalStep().ok());
  REQUIRE(graph->SetStep([](StepContext& ctx) -> Status {
                  if (ctx.requested("train_op")) ctx.Set("train_op", Tensor::Scalar<int64_t>(7));
                  return absl::OkStatus();
                })
              .ok());
  auto sess = Session::Create(graph);
  REQUIRE(sess.ok());
  REQUIRE(InitAll(**sess).ok());
  auto out = (*sess)->Run({"train_op"});
  REQUIRE(out.ok());
  CHECK(out->at("train_op").scalar<int64_t>().value() == 7);
}

TEST_CASE("With declared fetches an unknown fetch is NOT_FOUND before the step runs, changing nothing") {
  std::atomic<int> loss_computations{0};
  auto graph = CounterGraph(&loss_computations);
  REQUIRE(graph->AddFetch("loss").ok());
  REQUIRE(graph->AddFetch("loss").ok());  // duplicates are ignored
  CHECK(graph->fetches() == std::vector<std::string>{"loss"});
  CHECK(graph->AddFetch("").code() == absl::StatusCode::kInvalidArgument);
  auto sess = Session::Create(graph);
  REQUIRE(sess.ok());
  REQUIRE(InitAll(**sess).ok());
  CHECK(graph->AddFetch("late").code() == absl::StatusCode::kFailedPrecondition);

  auto bad = (*sess)->Run({"train_op", "los"});
  CHECK(bad.status().code() == absl::StatusCode::kNotFound);
  CHECK(bad.status().message().find("'los'") != absl::string_view::npos);
  CHECK(bad.status().message().find("did not run") != absl::string_view::npos);
  CHECK(*(*sess)->GlobalStep() == 0);  // the step did not run: nothing changed
  CHECK(loss_computations == 0);

  // Declared, runtime and variable fetches are all known.
  auto good = (*sess)->Run({"train_op", "loss", "global_step", "w"});
  REQUIRE(good.ok());
  CHECK(*(*sess)->GlobalStep() == 1);
}

TEST_CASE("With declared fetches an uninitialized variable fetch fails before the step; local variables answer") {
  auto graph = CounterGraph();
  REQUIRE(graph->AddLocalVariable("lv", Tensor::Scalar<float>(4.0f)).ok());
  REQUIRE(graph->AddFetch("loss").ok());
  auto sess = Session::Create(graph);
  REQUIRE(sess.ok());
  REQUIRE(InitAll(**sess).ok());  // initializes every variable: take lv's value away again
  REQUIRE((*sess)->WithVariables([](VariableStore& vars) { return vars.Delete("lv"); }).ok());
  auto bad = (*sess)->Run({"train_op", "lv"});
  CHECK(bad.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK(bad.status().message().find("uninitialized value lv") != absl::string_view::npos);
  CHECK(*(*sess)->GlobalStep() == 0);  // nothing changed
  REQUIRE((*sess)->WithVariables([](VariableStore& vars) {
                    return vars.Create("lv", Tensor::Scalar<float>(4.0f), /*trainable=*/false);
                  }).ok());
  auto good = (*sess)->Run({"train_op", "lv"});
  REQUIRE(good.ok());
  CHECK(good->at("lv").scalar<float>().value() == 4.0f);
  CHECK(*(*sess)->GlobalStep() == 1);
}

TEST_CASE("Without declared fetches an unanswered fetch is still NOT_FOUND after the step") {
  auto sess = Session::Create(CounterGraph());
  REQUIRE(sess.ok());
  REQUIRE(InitAll(**sess).ok());
  auto out = (*sess)->Run({"train_op", "nothing_answers_this"});
  CHECK(out.status().code() == absl::StatusCode::kNotFound);
  CHECK(*(*sess)->GlobalStep() == 1);  // today's behaviour: the step ran
}

TEST_CASE("Session feeds reach the step; unrequested answers are dropped") {
  auto sess = Session::Create(CounterGraph());
  REQUIRE(sess.ok());
  REQUIRE(InitAll(**sess).ok());
  auto out = (*sess)->Run({"x_echo"}, {{"x", Tensor::Scalar<int32_t>(7)}});
  REQUIRE(out.ok());
  CHECK(out->at("x_echo").scalar<int32_t>().value() == 7);
  CHECK(out->count("never_requested") == 0);
}

TEST_CASE("Session turns a step's exception into a Status and keeps a step's own error") {
  auto graph = std::make_shared<Graph>();
  int mode = 0;
  REQUIRE(graph->SetStep([&mode](StepContext&) -> Status {
                  if (mode == 0) throw std::runtime_error("disk on fire");
                  if (mode == 1) throw StatusError(absl::AbortedError("preempted"));
                  return absl::OutOfRangeError("End of sequence");
                })
              .ok());
  auto sess = Session::Create(graph);
  REQUIRE(sess.ok());
  auto r0 = (*sess)->Run({});
  CHECK(r0.status().code() == absl::StatusCode::kInternal);
  CHECK(r0.status().message().find("disk on fire") != absl::string_view::npos);
  CHECK(r0.status().message().find("step function") != absl::string_view::npos);
  mode = 1;
  CHECK((*sess)->Run({}).status() == absl::AbortedError("preempted"));
  mode = 2;
  CHECK((*sess)->Run({}).status().code() == absl::StatusCode::kOutOfRange);
}

TEST_CASE("A closed session refuses Run with TF's message") {
  auto sess = Session::Create(CounterGraph());
  REQUIRE(sess.ok());
  REQUIRE((*sess)->Close().ok());
  REQUIRE((*sess)->Close().ok());  // idempotent
  CHECK((*sess)->closed());
  auto out = (*sess)->Run({"w"});
  CHECK(out.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK(out.status().message() == "Attempted to use a closed Session.");
}

TEST_CASE("Session::Create validates graph, target and config, and finalizes the graph (B19)") {
  CHECK(Session::Create(nullptr).status().code() == absl::StatusCode::kInvalidArgument);
  auto no_step = std::make_shared<Graph>();
  CHECK(Session::Create(no_step).status().code() == absl::StatusCode::kInvalidArgument);
  auto graph = CounterGraph();
  CHECK(Session::Create(graph, "grpc://localhost:2222").status().code() == absl::StatusCode::kUnimplemented);
  CHECK(Session::Create(graph, "inproc://").status().code() == absl::StatusCode::kInvalidArgument);
  SessionConfig bad;
  bad.intra_op_parallelism_threads = -1;
  CHECK(Session::Create(graph, "", bad).status().code() == absl::StatusCode::kInvalidArgument);
  SessionConfig not_a_device;
  not_a_device.device = "/tpu:0";
  Status s = Session::Create(graph, "", not_a_device).status();
  CHECK(s.code() == absl::StatusCode::kInvalidArgument);
  CHECK(s.message().find("/tpu:0") != absl::string_view::npos);
  CHECK_FALSE(graph->finalized());
  REQUIRE(Session::Create(graph).ok());
  CHECK(graph->finalized());
}

TEST_CASE("SessionConfig.device /gpu:N is refused without a CUDA device, naming it") {
  SessionConfig config;
  config.device = "/gpu:0";
  auto sess = Session::Create(CounterGraph(), "", config);
  auto count = cuda::DeviceCount();
  REQUIRE_FALSE(sess.ok());
  CHECK(sess.status().message().find("/gpu:0") != absl::string_view::npos);
  // With a GPU: UNIMPLEMENTED until the CUDA training step exists.
  CHECK(sess.status().code() == (count.ok() && *count > 0 ? absl::StatusCode::kUnimplemented
                                                           : absl::StatusCode::kFailedPrecondition));
  config.device = "/cpu:0";
  CHECK(Session::Create(CounterGraph(), "", config).ok());
}

TEST_CASE("intra_op_parallelism_threads sizes the step's Eigen device") {
  SessionConfig config;
  config.intra_op_parallelism_threads = 3;
  auto graph = std::make_shared<Graph>();
  int seen = 0;
  float sum = 0;
  REQUIRE(graph->SetStep([&](StepContext& ctx) -> Status {
                  seen = ctx.intra_op_threads();
                  Eigen::Tensor<float, 1> a(1000), out(1000);
                  a.setConstant(1.0f);
                  out.device(ctx.eigen_device()) = a * 2.0f;
                  Eigen::Tensor<float, 0> total = out.sum();
                  sum = total();
                  return absl::OkStatus();
                })
              .ok());
  auto sess = Session::Create(graph, "", config);
  REQUIRE(sess.ok());
  REQUIRE((*sess)->Run({}).ok());
  CHECK(seen == 3);
  CHECK(sum == 2000.0f);
}

TEST_CASE("inproc:// sessions share values until ResetInprocTarget; local sessions do not") {
  const std::string target = "inproc://session_test_share";
  ResetInprocTarget(target);
  auto graph = CounterGraph();
  auto chief = Session::Create(graph, target);
  auto worker = Session::Create(graph, target);
  auto local = Session::Create(graph, "");
  REQUIRE(chief.ok());
  REQUIRE(worker.ok());
  REQUIRE(local.ok());
  CHECK((*worker)->UninitializedVariables() == std::vector<std::string>{"global_step", "w"});
  REQUIRE(InitAll(**chief).ok());
  CHECK((*worker)->UninitializedVariables().empty());
  CHECK((*local)->UninitializedVariables().size() == 2);

  // Steps of both run concurrently and are serialised: no update is lost.
  auto train = [](Session* s) {
    for (int i = 0; i < 200; ++i) REQUIRE(s->Run({"w"}).ok());
  };
  std::thread t([&] {
    for (int i = 0; i < 200; ++i) {
      auto r = (*worker)->Run({"w"});
      (void)r;
    }
  });
  train(chief->get());
  t.join();

  CHECK(ResetInprocTarget(target));
  CHECK_FALSE(ResetInprocTarget(target));
  CHECK_FALSE(ResetInprocTarget("not-inproc"));
  auto fresh = Session::Create(graph, target);
  REQUIRE(fresh.ok());
  CHECK((*fresh)->UninitializedVariables().size() == 2);
  // The old sessions still hold their (now private) values.
  CHECK((*chief)->UninitializedVariables().empty());
  ResetInprocTarget(target);
}

TEST_CASE("Concurrent train steps on a shared inproc target lose no update") {
  const std::string target = "inproc://session_test_concurrent";
  ResetInprocTarget(target);
  auto graph = std::make_shared<Graph>();
  REQUIRE(graph->CreateGlobalStep().ok());
  REQUIRE(graph->SetStep([](StepContext& ctx) { return IncrementGlobalStep(ctx.variables()).status(); }).ok());
  auto a = Session::Create(graph, target);
  auto b = Session::Create(graph, target);
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  REQUIRE(InitAll(**a).ok());
  std::thread t([&] {
    for (int i = 0; i < 500; ++i) CHECK((*b)->Run({}).ok());
  });
  for (int i = 0; i < 500; ++i) CHECK((*a)->Run({}).ok());
  t.join();
  CHECK(*(*a)->GlobalStep() == 1000);
  ResetInprocTarget(target);
}

TEST_CASE("Snapshot copies the global variables only; UninitializedVariables names the missing") {
  auto graph = CounterGraph();
  REQUIRE(graph->AddLocalVariable("cursor", Tensor::Scalar<int64_t>(5)).ok());
  auto sess = Session::Create(graph);
  REQUIRE(sess.ok());
  CHECK((*sess)->UninitializedVariables(true) == std::vector<std::string>{"cursor", "global_step", "w"});
  REQUIRE(InitAll(**sess).ok());
  auto snapshot = (*sess)->Snapshot();
  CHECK(snapshot.size() == 2);
  CHECK(snapshot.count("cursor") == 0);
  // A deep copy: later steps do not change it.
  REQUIRE((*sess)->Run({"w"}).ok());
  CHECK(snapshot.at("global_step").scalar<int64_t>().value() == 0);
  CHECK((*sess)->GlobalStep().ok());
}

TEST_CASE("Tracing records a step span and the step's own spans; none without kFullTrace") {
  ManualClock clock;
  SessionConfig config;
  config.clock = &clock;
  auto graph = std::make_shared<Graph>();
  REQUIRE(graph->SetStep([&clock](StepContext& ctx) -> Status {
                  auto span = ctx.Trace("forward");
                  clock.Advance(absl::Milliseconds(3));
                  return absl::OkStatus();
                })
              .ok());
  auto sess = Session::Create(graph, "", config);
  REQUIRE(sess.ok());
  RunMetadata none;
  REQUIRE((*sess)->Run({}, {}, {}, &none).ok());
  CHECK(none.step_stats.empty());
  RunOptions options;
  options.trace_level = RunOptions::kFullTrace;
  RunMetadata md;
  REQUIRE((*sess)->Run({}, {}, options, &md).ok());
  REQUIRE(md.step_stats.size() == 2);
  CHECK(md.step_stats[0].name == "forward");
  CHECK(md.step_stats[0].duration_us == 3000);
  CHECK(md.step_stats[1].name == "step");
  CHECK(md.step_stats[1].duration_us == 3000);
  CHECK(md.step_stats[1].start_us <= md.step_stats[0].start_us);
}

TEST_CASE("RunOptions.timeout_in_ms turns a slow step into DEADLINE_EXCEEDED") {
  ManualClock clock;
  SessionConfig config;
  config.clock = &clock;
  auto graph = std::make_shared<Graph>();
  REQUIRE(graph->SetStep([&clock](StepContext&) {
                  clock.Advance(absl::Milliseconds(50));
                  return absl::OkStatus();
                })
              .ok());
  auto sess = Session::Create(graph, "", config);
  REQUIRE(sess.ok());
  RunOptions options;
  options.timeout_in_ms = 100;
  CHECK((*sess)->Run({}, {}, options).ok());
  options.timeout_in_ms = 10;
  CHECK((*sess)->Run({}, {}, options).status().code() == absl::StatusCode::kDeadlineExceeded);
}

}  // namespace
}  // namespace foreman
