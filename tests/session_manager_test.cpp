// Tests for Scaffold, SessionManager, ChiefSessionCreator and
// WorkerSessionCreator (include/foreman/session_manager.hpp): spec §7-§8
// (B24-B26, B78-B94), decisions 7 and 8, and the scenarios H-01, H-02, H-21,
// H-26 (the parts without MonitoredTrainingSession).
//
// Checkpoints live in a MemEnv; time is a ManualClock. A test that waits for
// a worker polls in the background and steps the clock only once the worker
// is asleep in it (a ready op that counts its calls tells which poll ran).
#include "foreman/session_manager.hpp"

#include <algorithm>
#include <atomic>
#include <map>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <doctest/doctest.h>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "foreman/bundle.hpp"
#include "foreman/checkpoint.hpp"
#include "foreman/clock.hpp"
#include "foreman/mem_env.hpp"
#include "support/test_util.hpp"
#include "support/log_capture.hpp"

namespace foreman {
namespace {

using testing::Background;
using testing::kRealTimeout;

using testing::CapturedLog;

std::string Msg(const Status& s) { return std::string(s.message()); }
bool Contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

/// Counts calls; a test waits for a count.
class Counter {
 public:
  void Increment() {
    std::lock_guard<std::mutex> l(mu_);
    ++n_;
    cv_.notify_all();
  }
  int value() {
    std::lock_guard<std::mutex> l(mu_);
    return n_;
  }
  bool WaitAtLeast(int n) {
    std::unique_lock<std::mutex> l(mu_);
    return cv_.wait_for(l, absl::ToChronoMilliseconds(kRealTimeout), [this, n] { return n_ >= n; });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int n_ = 0;
};

/// Waits until `bg` is done or a thread sleeps in `clock`.
void WaitSleepingOrDone(ManualClock& clock, Background& bg) {
  for (int i = 0; i < 1000; ++i) {
    if (bg.Done() || clock.BlockUntilWaiters(1, absl::Milliseconds(10))) return;
  }
  FAIL("neither asleep in the clock nor done");
}

/// A model: global_step, w = float32[2] {1, 2}, and a local variable. The
/// step "train_op" adds 1 to w and to global_step.
std::shared_ptr<Graph> MakeGraph() {
  auto g = std::make_shared<Graph>();
  REQUIRE(g->CreateGlobalStep().ok());
  REQUIRE(g->AddVariable("w", *Tensor::FromVector<float>({1, 2}, {2})).ok());
  REQUIRE(g->AddLocalVariable("local_counter", Tensor::Scalar<int64_t>(7)).ok());
  REQUIRE(g->SetStep([](StepContext& ctx) -> Status {
               if (ctx.requested("train_op")) {
                 FOREMAN_ASSIGN_OR_RETURN(Tensor * w, ctx.variables().Get("w"));
                 for (int i = 0; i < 2; ++i) w->data<float>()[i] += 1;
                 FOREMAN_RETURN_IF_ERROR(IncrementGlobalStep(ctx.variables()).status());
                 ctx.Set("train_op", Tensor::Scalar<int64_t>(0));
               }
               return absl::OkStatus();
             })
              .ok());
  return g;
}

/// A MemEnv with /ckpt, a ManualClock, and a config using both.
struct Fixture {
  Fixture() {
    REQUIRE(env.RecursivelyCreateDir("/ckpt").ok());
    config.env = &env;
    config.clock = &clock;
  }

  std::shared_ptr<Saver> NewSaver(int max_to_keep = 5) {
    SaverOptions o;
    o.max_to_keep = max_to_keep;
    o.env = &env;
    o.clock = &clock;
    auto s = Saver::Create(o);
    REQUIRE_MESSAGE(s.ok(), s.status().ToString());
    return std::shared_ptr<Saver>(*std::move(s));
  }

  /// A checkpoint of MakeGraph()'s variables with global_step = step and
  /// w = {step, step}, saved by `saver` (a fresh one when null).
  std::string SaveCheckpoint(int64_t step, std::shared_ptr<Saver> saver = nullptr,
                             const std::string& dir = "/ckpt") {
    if (saver == nullptr) saver = NewSaver();
    std::map<std::string, Tensor> tensors;
    tensors["global_step"] = Tensor::Scalar<int64_t>(step);
    tensors["w"] = *Tensor::FromVector<float>({float(step), float(step)}, {2});
    auto p = saver->Save(tensors, dir + "/model.ckpt", step);
    REQUIRE_MESSAGE(p.ok(), p.status().ToString());
    return *p;
  }

  /// Flips a byte in the middle of the bundle's data file.
  void CorruptData(const std::string& prefix) {
    const std::string path = BundleDataPath(prefix);
    auto contents = env.ReadFileToString(path);
    REQUIRE(contents.ok());
    std::string bytes = *contents;
    REQUIRE(!bytes.empty());
    bytes[bytes.size() / 2] ^= 0x5a;
    auto file = env.NewWritableFile(path);
    REQUIRE(file.ok());
    REQUIRE((*file)->Append(bytes).ok());
    REQUIRE((*file)->Close().ok());
  }

  MemEnv env;
  ManualClock clock;
  SessionConfig config;
};

std::unique_ptr<SessionManager> NewManager(std::shared_ptr<Graph> graph, absl::Duration recovery_wait = absl::Seconds(30),
                                           bool with_local_init = true) {
  SessionManagerOptions o;
  o.graph = std::move(graph);
  o.ready_op = DefaultReadyOp();
  if (with_local_init) {
    o.local_init_op = DefaultLocalInitOp();
    o.ready_for_local_init_op = DefaultReadyForLocalInitOp();
  }
  o.recovery_wait = recovery_wait;
  auto m = SessionManager::Create(std::move(o));
  REQUIRE_MESSAGE(m.ok(), m.status().ToString());
  return *std::move(m);
}

int64_t Step(Session& s) {
  auto step = s.GlobalStep();
  REQUIRE_MESSAGE(step.ok(), step.status().ToString());
  return *step;
}

float W0(Session& s) {
  float w = -1;
  REQUIRE(s.WithVariables([&w](VariableStore& vars) -> Status {
               FOREMAN_ASSIGN_OR_RETURN(const Tensor* t, static_cast<const VariableStore&>(vars).Get("w"));
               w = t->data<float>()[0];
               return absl::OkStatus();
             })
              .ok());
  return w;
}

int64_t LocalCounter(Session& s) {
  int64_t v = -1;
  REQUIRE(s.WithVariables([&v](VariableStore& vars) -> Status {
               FOREMAN_ASSIGN_OR_RETURN(const Tensor* t, static_cast<const VariableStore&>(vars).Get("local_counter"));
               FOREMAN_ASSIGN_OR_RETURN(v, t->scalar<int64_t>());
               return absl::OkStatus();
             })
              .ok());
  return v;
}

Status SetGlobalStepIn(Session& s, int64_t step) {
  return s.WithVariables([step](VariableStore& vars) { return SetGlobalStep(vars, step); });
}

void Train(Session& s, int steps) {
  for (int i = 0; i < steps; ++i) REQUIRE(s.Run({"train_op"}).ok());
}

/// Drops an inproc:// target's values at the end of a test.
struct InprocTarget {
  explicit InprocTarget(std::string name) : target(std::move(name)) { ResetInprocTarget(target); }
  ~InprocTarget() { ResetInprocTarget(target); }
  std::string target;
};

/// An InitOp that counts its runs around the default one.
InitOp CountingInitOp(std::shared_ptr<int> runs) {
  return [runs](Session& s, const TensorMap& feeds) {
    ++*runs;
    return DefaultInitOp()(s, feeds);
  };
}

// -- Scaffold (B90-B94) -------------------------------------------------------

TEST_CASE("B90 before finalize a Scaffold has only the pieces given to it") {
  auto graph = MakeGraph();
  ScaffoldOptions o;
  o.ready_op = [](Session&) -> StatusOr<std::vector<std::string>> { return std::vector<std::string>{}; };
  Scaffold scaffold(graph, o);
  CHECK_FALSE(scaffold.finalized());
  CHECK_FALSE(scaffold.init_op());
  CHECK_FALSE(scaffold.init_fn());
  CHECK(scaffold.ready_op());
  CHECK_FALSE(scaffold.ready_for_local_init_op());
  CHECK_FALSE(scaffold.local_init_op());
  CHECK(scaffold.saver() == nullptr);
  CHECK(scaffold.summary_op().empty());
  CHECK_FALSE(graph->finalized());
}

TEST_CASE("B91 B92 finalize fills the defaults: init, ready, ready-for-local-init, local init, summaries, saver") {
  Fixture f;
  auto graph = MakeGraph();
  REQUIRE(graph->AddSummaryOp("loss_summary").ok());
  Scaffold scaffold(graph);
  REQUIRE(scaffold.finalize(f.config).ok());
  CHECK(scaffold.finalized());
  REQUIRE(scaffold.init_op());
  REQUIRE(scaffold.ready_op());
  REQUIRE(scaffold.ready_for_local_init_op());
  REQUIRE(scaffold.local_init_op());
  REQUIRE(scaffold.saver() != nullptr);
  CHECK(scaffold.summary_op() == std::vector<std::string>{"loss_summary"});

  auto session = Session::Create(graph, "", f.config);
  REQUIRE(session.ok());
  Session& s = **session;
  // ready_op: every uninitialized variable; ready_for_local_init_op: the
  // global ones only.
  CHECK(*scaffold.ready_op()(s) == std::vector<std::string>{"global_step", "local_counter", "w"});
  CHECK(*scaffold.ready_for_local_init_op()(s) == std::vector<std::string>{"global_step", "w"});
  // init_op: the global variables' initializers, not the local ones.
  REQUIRE(scaffold.init_op()(s, {}).ok());
  CHECK(*scaffold.ready_for_local_init_op()(s) == std::vector<std::string>{});
  CHECK(*scaffold.ready_op()(s) == std::vector<std::string>{"local_counter"});
  CHECK(W0(s) == 1.0f);
  // local_init_op: the local ones.
  REQUIRE(scaffold.local_init_op()(s).ok());
  CHECK(scaffold.ready_op()(s)->empty());
  CHECK(LocalCounter(s) == 7);
}

TEST_CASE("B92 the default saver keeps 5 checkpoints") {
  Fixture f;
  Scaffold scaffold(MakeGraph());
  REQUIRE(scaffold.finalize(f.config).ok());
  for (int step = 1; step <= 7; ++step) f.SaveCheckpoint(step, scaffold.saver());
  CHECK(scaffold.saver()->last_checkpoints().size() == 5);
  CHECK(f.env.FileExists("/ckpt/model.ckpt-2.index").code() == absl::StatusCode::kNotFound);
  CHECK(f.env.FileExists("/ckpt/model.ckpt-3.index").ok());
}

TEST_CASE("B92 the graph has no summary fetches: summary_op is empty (TF: None)") {
  Fixture f;
  Scaffold scaffold(MakeGraph());
  REQUIRE(scaffold.finalize(f.config).ok());
  CHECK(scaffold.summary_op().empty());
}

TEST_CASE("B91 two Scaffolds of one graph share the default saver; B94 a given saver is not shared") {
  Fixture f;
  auto graph = MakeGraph();
  ScaffoldOptions given;
  given.saver = f.NewSaver();
  Scaffold explicit_saver(graph, given);
  Scaffold a(graph);
  Scaffold b(graph);
  Scaffold other_graph(MakeGraph());
  REQUIRE(explicit_saver.finalize(f.config).ok());
  REQUIRE(a.finalize(f.config).ok());
  REQUIRE(b.finalize(f.config).ok());
  REQUIRE(other_graph.finalize(f.config).ok());
  CHECK(explicit_saver.saver() == given.saver);
  CHECK(a.saver() != given.saver);
  CHECK(a.saver() == b.saver());
  CHECK(a.saver() != other_graph.saver());
}

TEST_CASE("B93 finalize finalizes the graph, is idempotent, and runs again on every session creation") {
  Fixture f;
  auto graph = MakeGraph();
  auto scaffold = std::make_shared<Scaffold>(graph);
  REQUIRE(scaffold->finalize(f.config).ok());
  CHECK(graph->finalized());
  auto saver = scaffold->saver();
  REQUIRE(scaffold->finalize(f.config).ok());
  CHECK(scaffold->saver() == saver);  // nothing rebuilt
  CHECK(graph->AddVariable("late", Tensor::Scalar<float>(0)).code() == absl::StatusCode::kFailedPrecondition);

  graph->Unfinalize();  // as a MonitoredSession's close does (B22)
  ChiefSessionCreator chief(scaffold, "", f.config);
  REQUIRE(chief.create_session().ok());
  CHECK(graph->finalized());
}

TEST_CASE("B94 init_fn is called as init_fn(scaffold, session); a copy keeps the given pieces (copy_from_scaffold)") {
  Fixture f;
  auto graph = MakeGraph();
  auto calls = std::make_shared<std::vector<const Scaffold*>>();
  ScaffoldOptions o;
  o.init_fn = [calls](const Scaffold& scaffold, Session& session) -> Status {
    calls->push_back(&scaffold);
    return SetGlobalStepIn(session, 42);
  };
  o.saver = f.NewSaver();
  auto original = std::make_shared<Scaffold>(graph, o);
  auto copy = std::make_shared<Scaffold>(*original);  // TF: Scaffold(copy_from_scaffold=original)
  CHECK(copy->saver() == o.saver);

  ChiefSessionCreator chief(copy, "", f.config);
  auto session = chief.create_session();
  REQUIRE_MESSAGE(session.ok(), session.status().ToString());
  REQUIRE(calls->size() == 1);
  CHECK((*calls)[0] == copy.get());  // the scaffold in use, with the original user function
  CHECK(Step(**session) == 42);      // init_fn ran after init_op
}

// -- SessionManager (B78-B89) -------------------------------------------------

TEST_CASE("B78 ready_for_local_init_op without local_init_op is INVALID_ARGUMENT") {
  SessionManagerOptions o;
  o.graph = MakeGraph();
  o.ready_for_local_init_op = DefaultReadyForLocalInitOp();
  auto m = SessionManager::Create(o);
  CHECK(m.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(Contains(Msg(m.status()), "ready_for_local_init_op"));
  o.graph = nullptr;
  o.ready_for_local_init_op = nullptr;
  CHECK(SessionManager::Create(o).status().code() == absl::StatusCode::kInvalidArgument);
}

TEST_CASE("B79 no ready_op: always ready; a non-empty answer lists the variables") {
  Fixture f;
  SUBCASE("no ready_op") {
    SessionManagerOptions o;
    o.graph = MakeGraph();
    auto m = SessionManager::Create(o);
    REQUIRE(m.ok());
    PrepareSessionOptions p;
    p.init_fn = [](Session&) { return absl::OkStatus(); };  // initializes nothing
    p.config = f.config;
    CHECK((*m)->prepare_session("", p).ok());
  }
  SUBCASE("not ready") {
    auto m = NewManager(MakeGraph(), absl::Seconds(30), /*with_local_init=*/false);
    PrepareSessionOptions p;
    p.init_fn = [](Session&) { return absl::OkStatus(); };
    p.config = f.config;
    auto s = m->prepare_session("", p);
    CHECK(s.status().code() == absl::StatusCode::kFailedPrecondition);
    CHECK(Contains(Msg(s.status()), "error: Variables not initialized: global_step, local_counter, w"));
  }
}

TEST_CASE("B79 a ready op's FAILED_PRECONDITION about uninitialized values means not ready; another is returned") {
  Fixture f;
  SessionManagerOptions o;
  o.graph = MakeGraph();
  std::string error;
  o.ready_op = [&error](Session&) -> StatusOr<std::vector<std::string>> {
    return absl::FailedPreconditionError(error);
  };
  auto m = SessionManager::Create(o);
  REQUIRE(m.ok());
  PrepareSessionOptions p;
  p.init_op = DefaultInitOp();
  p.config = f.config;

  error = "Attempting to use uninitialized value w";
  auto s = (*m)->prepare_session("", p);
  CHECK(s.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK(Contains(Msg(s.status()), "Init operations did not make model ready."));
  CHECK(Contains(Msg(s.status()), "error: Attempting to use uninitialized value w"));

  error = "device is gone";
  CapturedLog log;
  s = (*m)->prepare_session("", p);
  CHECK(s.status() == absl::FailedPreconditionError("device is gone"));
  CHECK(Contains(log.text(), "Model not ready : error ["));
}

TEST_CASE("B80 local init runs only when ready_for_local_init_op passes") {
  Fixture f;
  auto m = NewManager(MakeGraph());
  PrepareSessionOptions p;
  p.config = f.config;
  SUBCASE("globals initialized first: local init runs") {
    p.init_op = DefaultInitOp();
    auto s = m->prepare_session("", p);
    REQUIRE_MESSAGE(s.ok(), s.status().ToString());
    CHECK(LocalCounter(**s) == 7);
  }
  SUBCASE("globals left uninitialized: local init refused") {
    p.init_fn = [](Session&) { return absl::OkStatus(); };
    auto s = m->prepare_session("", p);
    CHECK(s.status().code() == absl::StatusCode::kFailedPrecondition);
    CHECK(Contains(Msg(s.status()), "Init operations did not make model ready for local_init.  "
                                    "Init op: None, init fn: given, error: Variables not initialized: global_step, w"));
  }
}

TEST_CASE("B81 B83 without a saver or a checkpoint location nothing is restored: init_op runs") {
  Fixture f;
  f.SaveCheckpoint(30);
  auto m = NewManager(MakeGraph());
  auto runs = std::make_shared<int>(0);
  PrepareSessionOptions p;
  p.init_op = CountingInitOp(runs);
  p.config = f.config;
  SUBCASE("no saver") { p.checkpoint_dir = "/ckpt"; }
  SUBCASE("no location") { p.saver = f.NewSaver(); }
  auto s = m->prepare_session("", p);
  REQUIRE_MESSAGE(s.ok(), s.status().ToString());
  CHECK(*runs == 1);
  CHECK(Step(**s) == 0);
}

TEST_CASE("B82 both checkpoint_dir and checkpoint_filename_with_path is INVALID_ARGUMENT") {
  Fixture f;
  auto m = NewManager(MakeGraph());
  PrepareSessionOptions p;
  p.init_op = DefaultInitOp();
  p.saver = f.NewSaver();
  p.checkpoint_dir = "/ckpt";
  p.checkpoint_filename_with_path = "/ckpt/model.ckpt-1";
  p.config = f.config;
  CHECK(m->prepare_session("", p).status() ==
        absl::InvalidArgumentError("Can not provide both checkpoint_dir and checkpoint_filename_with_path."));
}

TEST_CASE("B83 checkpoint_dir restores the latest checkpoint; B85 neither init_op nor init_fn runs") {
  Fixture f;
  f.SaveCheckpoint(10);
  const std::string latest = f.SaveCheckpoint(20);
  auto m = NewManager(MakeGraph());
  auto runs = std::make_shared<int>(0);
  bool init_fn_ran = false;
  PrepareSessionOptions p;
  p.init_op = CountingInitOp(runs);
  p.init_fn = [&init_fn_ran](Session&) {
    init_fn_ran = true;
    return absl::OkStatus();
  };
  p.saver = f.NewSaver();
  p.checkpoint_dir = "/ckpt";
  p.config = f.config;
  CapturedLog log;
  auto s = m->prepare_session("", p);
  REQUIRE_MESSAGE(s.ok(), s.status().ToString());
  CHECK(Step(**s) == 20);
  CHECK(W0(**s) == 20.0f);
  CHECK(LocalCounter(**s) == 7);  // local init still ran (B86)
  CHECK(*runs == 0);
  CHECK_FALSE(init_fn_ran);
  CHECK(Contains(log.text(), "Restoring parameters from " + latest));
}

TEST_CASE("B83 checkpoint_filename_with_path restores exactly that prefix") {
  Fixture f;
  const std::string older = f.SaveCheckpoint(10);
  f.SaveCheckpoint(20);
  auto m = NewManager(MakeGraph());
  PrepareSessionOptions p;
  p.init_op = DefaultInitOp();
  p.saver = f.NewSaver();
  p.checkpoint_filename_with_path = older;
  p.config = f.config;
  auto s = m->prepare_session("", p);
  REQUIRE_MESSAGE(s.ok(), s.status().ToString());
  CHECK(Step(**s) == 10);

  p.checkpoint_filename_with_path = "/ckpt/model.ckpt-99";  // no waiting, no fallback
  CHECK(m->prepare_session("", p).status() ==
        absl::InvalidArgumentError("The passed save_path is not a valid checkpoint: /ckpt/model.ckpt-99"));
}

TEST_CASE("B83 wait_for_checkpoint polls every recovery_wait of the clock until a checkpoint appears") {
  Fixture f;
  auto m = NewManager(MakeGraph(), absl::Seconds(30));
  PrepareSessionOptions p;
  p.init_op = DefaultInitOp();
  p.saver = f.NewSaver();
  p.checkpoint_dir = "/ckpt";
  p.wait_for_checkpoint = true;
  p.max_wait = absl::Seconds(120);
  p.config = f.config;
  CapturedLog log;
  StatusOr<std::unique_ptr<Session>> result = absl::UnknownError("not returned");
  Background bg([&] { result = m->prepare_session("", p); }, &f.clock);
  REQUIRE(f.clock.BlockUntilWaiters(1, kRealTimeout));
  CHECK(Contains(log.text(), "Waiting for checkpoint to be available."));
  f.SaveCheckpoint(5);
  f.clock.Advance(absl::Seconds(30));
  REQUIRE(bg.WaitDone());
  REQUIRE_MESSAGE(result.ok(), result.status().ToString());
  CHECK(Step(**result) == 5);
}

TEST_CASE("B83 wait_for_checkpoint gives up after max_wait of the clock and initializes") {
  Fixture f;
  auto m = NewManager(MakeGraph(), absl::Seconds(30));
  auto runs = std::make_shared<int>(0);
  PrepareSessionOptions p;
  p.init_op = CountingInitOp(runs);
  p.saver = f.NewSaver();
  p.checkpoint_dir = "/ckpt";
  p.wait_for_checkpoint = true;
  p.max_wait = absl::Seconds(60);
  p.config = f.config;
  StatusOr<std::unique_ptr<Session>> result = absl::UnknownError("not returned");
  absl::Duration returned_at;
  Background bg(
      [&] {
        result = m->prepare_session("", p);
        returned_at = f.clock.MonotonicNow();
      },
      &f.clock);
  REQUIRE(f.clock.BlockUntilWaiters(1, kRealTimeout));
  CHECK_FALSE(bg.Done());
  f.clock.Advance(absl::Seconds(59));  // short of max_wait: still waiting
  CHECK_FALSE(bg.WaitDone(absl::Milliseconds(20)));
  for (int i = 0; i < 100 && !bg.Done(); ++i) {
    WaitSleepingOrDone(f.clock, bg);
    if (!bg.Done()) f.clock.Advance(absl::Seconds(1));
  }
  REQUIRE(bg.WaitDone());
  REQUIRE_MESSAGE(result.ok(), result.status().ToString());
  CHECK(*runs == 1);
  CHECK(returned_at >= absl::Seconds(60));
}

TEST_CASE("B84 restoring from checkpoint_dir rebuilds the saver's retention list from the state file") {
  Fixture f;
  auto first = f.NewSaver(3);
  const std::string p10 = f.SaveCheckpoint(10, first);
  const std::string p20 = f.SaveCheckpoint(20, first);
  const std::string p30 = f.SaveCheckpoint(30, first);
  REQUIRE(f.env.DeleteFile(BundleIndexPath(p10)).ok());  // a listed checkpoint whose files are gone

  auto m = NewManager(MakeGraph());
  PrepareSessionOptions p;
  p.init_op = DefaultInitOp();
  p.saver = f.NewSaver(3);
  p.checkpoint_dir = "/ckpt";
  p.config = f.config;
  CHECK(p.saver->last_checkpoints().empty());
  REQUIRE(m->prepare_session("", p).ok());
  CHECK(p.saver->last_checkpoints() == std::vector<std::string>{p20, p30});

  // An exact prefix does not touch the list (TF recovers it for
  // checkpoint_dir only).
  auto other = f.NewSaver(3);
  p.saver = other;
  p.checkpoint_dir.clear();
  p.checkpoint_filename_with_path = p30;
  REQUIRE(m->prepare_session("", p).ok());
  CHECK(other->last_checkpoints().empty());
}

TEST_CASE("B85 nothing restored and no init_op, init_fn or local_init_op is FAILED_PRECONDITION") {
  Fixture f;
  auto m = NewManager(MakeGraph(), absl::Seconds(30), /*with_local_init=*/false);
  PrepareSessionOptions p;
  p.config = f.config;
  CHECK(m->prepare_session("", p).status() ==
        absl::FailedPreconditionError("Model is not initialized and no init_op or init_fn or local_init_op was given"));
}

TEST_CASE("B85 init_op runs with init_feed_dict, then init_fn") {
  Fixture f;
  auto m = NewManager(MakeGraph());
  std::vector<std::string> order;
  PrepareSessionOptions p;
  p.init_feed_dict["lr"] = Tensor::Scalar<float>(0.5f);
  p.init_op = [&order](Session& s, const TensorMap& feeds) -> Status {
    order.push_back("init_op:" + std::to_string(feeds.count("lr")));
    return DefaultInitOp()(s, feeds);
  };
  p.init_fn = [&order](Session&) {
    order.push_back("init_fn");
    return absl::OkStatus();
  };
  p.config = f.config;
  REQUIRE(m->prepare_session("", p).ok());
  CHECK(order == std::vector<std::string>{"init_op:1", "init_fn"});
}

TEST_CASE("B86 init operations that leave the model not ready fail with TF's message") {
  Fixture f;
  PrepareSessionOptions p;
  p.config = f.config;
  // Initializes the globals but then drops w again after local init: the
  // ready check (all variables) fails, the local-init check passed.
  p.init_op = DefaultInitOp();
  SessionManagerOptions o;
  o.graph = MakeGraph();
  o.ready_op = DefaultReadyOp();
  o.local_init_op = [](Session& s) {
    return s.WithVariables([](VariableStore& vars) { return vars.Delete("w"); });
  };
  o.ready_for_local_init_op = DefaultReadyForLocalInitOp();
  auto m2 = SessionManager::Create(o);
  REQUIRE(m2.ok());
  auto s = (*m2)->prepare_session("", p);
  CHECK(s.status() == absl::FailedPreconditionError(
                          "Init operations did not make model ready.  Init op: given, init fn: None, "
                          "local_init_op: given, error: Variables not initialized: local_counter, w"));
}

TEST_CASE("B87 recover_session: false when nothing is restored (local init still tried), true after a restore") {
  Fixture f;
  auto m = NewManager(MakeGraph());
  auto saver = f.NewSaver();
  SUBCASE("nothing to restore") {
    auto r = m->recover_session("", saver, "/ckpt", "", false, absl::Seconds(0), f.config);
    REQUIRE(r.ok());
    CHECK_FALSE(r->initialized);
    REQUIRE(r->session != nullptr);
    // Local init was attempted and refused (globals uninitialized).
    CHECK(r->session->UninitializedVariables(true) ==
          std::vector<std::string>{"global_step", "local_counter", "w"});
  }
  SUBCASE("restored") {
    f.SaveCheckpoint(12);
    CapturedLog log;
    auto r = m->recover_session("", saver, "/ckpt", "", false, absl::Seconds(0), f.config);
    REQUIRE(r.ok());
    CHECK(r->initialized);
    CHECK(Step(*r->session) == 12);
    CHECK(LocalCounter(*r->session) == 7);
    CHECK(Contains(log.text(), "Restored model from /ckpt"));
  }
  SUBCASE("restored but not ready: logged, not an error") {
    f.SaveCheckpoint(12);
    SessionManagerOptions o;
    o.graph = MakeGraph();
    o.ready_op = [](Session&) -> StatusOr<std::vector<std::string>> { return std::vector<std::string>{"table"}; };
    auto m2 = SessionManager::Create(o);
    REQUIRE(m2.ok());
    CapturedLog log;
    auto r = (*m2)->recover_session("", saver, "/ckpt", "", false, absl::Seconds(0), f.config);
    REQUIRE(r.ok());
    CHECK_FALSE(r->initialized);
    CHECK(Contains(log.text(), "Restoring model from /ckpt did not make model ready: Variables not initialized: table"));
  }
}

TEST_CASE("B88 wait_for_session returns at once when the model is ready, without initializing globals itself") {
  Fixture f;
  InprocTarget target("inproc://b88_ready");
  auto graph = MakeGraph();
  {
    auto chief = NewManager(graph);
    PrepareSessionOptions p;
    p.init_op = DefaultInitOp();
    p.config = f.config;
    REQUIRE(chief->prepare_session(target.target, p).ok());
  }
  auto worker = NewManager(graph);
  auto s = worker->wait_for_session(target.target, f.config, absl::Seconds(60));
  REQUIRE_MESSAGE(s.ok(), s.status().ToString());
  CHECK(worker->ready_polls() == 1);
  CHECK(f.clock.MonotonicNow() == absl::ZeroDuration());
}

TEST_CASE("B88 a worker alone never initializes the model: it logs each failed poll and gives up with TF's message") {
  Fixture f;
  InprocTarget target("inproc://b88_alone");
  auto polls = std::make_shared<Counter>();
  SessionManagerOptions o;
  o.graph = MakeGraph();
  o.ready_op = DefaultReadyOp();
  o.local_init_op = DefaultLocalInitOp();
  o.ready_for_local_init_op = [polls](Session& s) {
    polls->Increment();
    return DefaultReadyForLocalInitOp()(s);
  };
  auto worker = SessionManager::Create(o);
  REQUIRE(worker.ok());
  CapturedLog log;
  StatusOr<std::unique_ptr<Session>> result = absl::UnknownError("not returned");
  Background bg([&] { result = (*worker)->wait_for_session(target.target, f.config, absl::Seconds(60)); },
                &f.clock);
  for (int k = 1; k <= 10; ++k) {
    REQUIRE(polls->WaitAtLeast(k));
    WaitSleepingOrDone(f.clock, bg);
    if (bg.Done()) break;
    f.clock.Advance(absl::Seconds(30));
  }
  REQUIRE(bg.WaitDone());
  CHECK(result.status() == absl::DeadlineExceededError("Session was not ready after waiting 60 secs."));
  CHECK((*worker)->ready_polls() == 3);  // at 0, 30 and 60 s
  CHECK(Contains(log.text(), "Waiting for model to be ready.  Ready_for_local_init_op:  "
                             "Variables not initialized: global_step, w, ready: None"));
  // Nothing initialized the shared values.
  auto probe = Session::Create(o.graph, target.target, f.config);
  REQUIRE(probe.ok());
  CHECK((*probe)->UninitializedVariables().size() == 2);
}

// -- H-01, H-02, B89: worker polling ------------------------------------------

/// A Scaffold whose ready_for_local_init_op counts its calls (one per poll).
std::shared_ptr<Scaffold> CountingScaffold(std::shared_ptr<Graph> graph, std::shared_ptr<Counter> polls) {
  ScaffoldOptions o;
  o.ready_for_local_init_op = [polls](Session& s) {
    polls->Increment();
    return DefaultReadyForLocalInitOp()(s);
  };
  return std::make_shared<Scaffold>(std::move(graph), o);
}

void H01(absl::Duration recovery_wait) {
  Fixture f;
  InprocTarget target("inproc://h01");
  auto polls = std::make_shared<Counter>();
  // Two graphs: the chief and the worker are separate programs sharing only
  // the target's values.
  WorkerSessionCreator worker(CountingScaffold(MakeGraph(), polls), target.target, f.config,
                              absl::Minutes(30), recovery_wait);
  CapturedLog log;
  StatusOr<std::unique_ptr<Session>> result = absl::UnknownError("not returned");
  Background bg([&] { result = worker.create_session(); }, &f.clock);
  // The first poll happens at once and fails: the chief has not started.
  REQUIRE(polls->WaitAtLeast(1));
  WaitSleepingOrDone(f.clock, bg);
  REQUIRE_FALSE(bg.Done());
  CHECK(Contains(log.text(), "Waiting for model to be ready."));

  f.clock.Advance(absl::Seconds(1));  // the chief starts at t = 1 s and runs 10 steps
  ChiefSessionCreator chief(std::make_shared<Scaffold>(MakeGraph()), target.target, f.config);
  auto chief_session = chief.create_session();
  REQUIRE_MESSAGE(chief_session.ok(), chief_session.status().ToString());
  Train(**chief_session, 10);
  CHECK(polls->value() == 1);  // the worker still sleeps

  // The next poll comes one recovery_wait after the first, and succeeds.
  f.clock.Advance(recovery_wait - absl::Seconds(1));
  REQUIRE(bg.WaitDone());
  REQUIRE_MESSAGE(result.ok(), result.status().ToString());
  CHECK(polls->value() == 2);
  CHECK(worker.session_manager()->ready_polls() == 2);
  CHECK(f.clock.MonotonicNow() == recovery_wait);
  CHECK(Step(**result) == 10);  // the values the chief trained
}

TEST_CASE("H-01 B89 a worker that polls before the chief is ready waits the full 30 s interval") { H01(absl::Seconds(30)); }

TEST_CASE("H-01 recovery_wait is configurable: the worker waits exactly the interval") { H01(absl::Seconds(2)); }

TEST_CASE("H-01 B89 max_wait below recovery_wait fails after the first check without sleeping") {
  Fixture f;
  InprocTarget target("inproc://h01_short");
  WorkerSessionCreator worker(std::make_shared<Scaffold>(MakeGraph()), target.target, f.config,
                              /*max_wait=*/absl::Seconds(10), /*recovery_wait=*/absl::Seconds(30));
  StatusOr<std::unique_ptr<Session>> result = absl::UnknownError("not returned");
  Background bg([&] { result = worker.create_session(); }, &f.clock);
  const bool done = bg.WaitDone();
  if (!done) f.clock.Advance(absl::Hours(1));  // unblock a wrong implementation
  CHECK(done);
  CHECK(result.status() == absl::DeadlineExceededError("Session was not ready after waiting 10 secs."));
  CHECK(worker.session_manager()->ready_polls() == 1);
  CHECK(f.clock.MonotonicNow() == absl::ZeroDuration());
}

TEST_CASE("H-02 a worker whose peer never makes the model ready gives up after max_wait (2 s)") {
  Fixture f;
  InprocTarget target("inproc://h02");
  auto polls = std::make_shared<Counter>();
  WorkerSessionCreator worker(CountingScaffold(MakeGraph(), polls), target.target, f.config,
                              /*max_wait=*/absl::Seconds(2), /*recovery_wait=*/absl::Milliseconds(500));
  StatusOr<std::unique_ptr<Session>> result = absl::UnknownError("not returned");
  absl::Duration returned_at;
  Background bg(
      [&] {
        result = worker.create_session();
        returned_at = f.clock.MonotonicNow();
      },
      &f.clock);
  for (int k = 1; k <= 10; ++k) {
    REQUIRE(polls->WaitAtLeast(k));
    WaitSleepingOrDone(f.clock, bg);
    if (bg.Done()) break;
    f.clock.Advance(absl::Milliseconds(500));
  }
  REQUIRE(bg.WaitDone());
  CHECK(result.status() == absl::DeadlineExceededError("Session was not ready after waiting 2 secs."));
  CHECK(polls->value() == 5);  // 0, 0.5, 1, 1.5, 2 s
  CHECK(returned_at == absl::Seconds(2));
}

// -- creators (B24-B26) -------------------------------------------------------

TEST_CASE("B24 ChiefSessionCreator prepares with the scaffold's saver, init_op, init_feed_dict and init_fn") {
  Fixture f;
  auto seen_feeds = std::make_shared<int>(0);
  ScaffoldOptions o;
  o.init_feed_dict["x"] = Tensor::Scalar<float>(1);
  o.init_op = [seen_feeds](Session& s, const TensorMap& feeds) {
    *seen_feeds = static_cast<int>(feeds.size());
    return DefaultInitOp()(s, feeds);
  };
  o.init_fn = [](const Scaffold&, Session& s) { return SetGlobalStepIn(s, 3); };
  o.saver = f.NewSaver();
  auto scaffold = std::make_shared<Scaffold>(MakeGraph(), o);
  SUBCASE("initialized") {
    ChiefSessionCreator chief(scaffold, "", f.config, "/ckpt");
    auto s = chief.create_session();
    REQUIRE_MESSAGE(s.ok(), s.status().ToString());
    CHECK(*seen_feeds == 1);
    CHECK(Step(**s) == 3);
  }
  SUBCASE("restored with the scaffold's saver (B84 seeds it)") {
    const std::string p = f.SaveCheckpoint(8);
    ChiefSessionCreator chief(scaffold, "", f.config, "/ckpt");
    auto s = chief.create_session();
    REQUIRE_MESSAGE(s.ok(), s.status().ToString());
    CHECK(*seen_feeds == 0);
    CHECK(Step(**s) == 8);
    CHECK(o.saver->last_checkpoints() == std::vector<std::string>{p});
  }
  SUBCASE("checkpoint_filename_with_path") {
    const std::string p = f.SaveCheckpoint(8);
    f.SaveCheckpoint(9);
    ChiefSessionCreator chief(scaffold, "", f.config, "", p);
    auto s = chief.create_session();
    REQUIRE_MESSAGE(s.ok(), s.status().ToString());
    CHECK(Step(**s) == 8);
  }
}

TEST_CASE("B25 WorkerSessionCreator's default max_wait is 30 minutes") {
  Fixture f;
  InprocTarget target("inproc://b25");
  auto polls = std::make_shared<Counter>();
  WorkerSessionCreator worker(CountingScaffold(MakeGraph(), polls), target.target, f.config);
  StatusOr<std::unique_ptr<Session>> result = absl::UnknownError("not returned");
  Background bg([&] { result = worker.create_session(); }, &f.clock);
  for (int k = 1; k <= 100; ++k) {
    REQUIRE(polls->WaitAtLeast(k));
    WaitSleepingOrDone(f.clock, bg);
    if (bg.Done()) break;
    f.clock.Advance(absl::Seconds(30));
  }
  REQUIRE(bg.WaitDone());
  CHECK(result.status() == absl::DeadlineExceededError("Session was not ready after waiting 1800 secs."));
  CHECK(f.clock.MonotonicNow() == absl::Seconds(1800));
  CHECK(polls->value() == 61);
}

TEST_CASE("B26 the creators build their SessionManager once, from the scaffold's ops") {
  Fixture f;
  InprocTarget target("inproc://b26");
  auto ready_calls = std::make_shared<int>(0);
  ScaffoldOptions o;
  o.ready_op = [ready_calls](Session& s) {
    ++*ready_calls;
    return DefaultReadyOp()(s);
  };
  auto scaffold = std::make_shared<Scaffold>(MakeGraph(), o);
  ChiefSessionCreator chief(scaffold, target.target, f.config);
  REQUIRE(chief.create_session().ok());
  CHECK(*ready_calls == 1);

  WorkerSessionCreator worker(scaffold, target.target, f.config);
  CHECK(worker.session_manager() == nullptr);
  REQUIRE(worker.create_session().ok());
  const SessionManager* first = worker.session_manager();
  REQUIRE(first != nullptr);
  REQUIRE(worker.create_session().ok());
  CHECK(worker.session_manager() == first);
  CHECK(*ready_calls == 3);
}

// -- restore details, decisions 7 and 8 ---------------------------------------

TEST_CASE("Restore: a graph variable missing from the checkpoint is NOT_FOUND naming it") {
  Fixture f;
  auto saver = f.NewSaver();
  std::map<std::string, Tensor> tensors;
  tensors["global_step"] = Tensor::Scalar<int64_t>(4);
  REQUIRE(saver->Save(tensors, "/ckpt/model.ckpt", 4).ok());
  ChiefSessionCreator chief(std::make_shared<Scaffold>(MakeGraph()), "", f.config, "/ckpt");
  auto s = chief.create_session();
  CHECK(s.status().code() == absl::StatusCode::kNotFound);
  CHECK(Contains(Msg(s.status()), "'w'"));
}

TEST_CASE("Restore: variables take the checkpoint's dtype and shape; extra checkpoint entries are ignored") {
  Fixture f;
  auto saver = f.NewSaver();
  std::map<std::string, Tensor> tensors;
  tensors["global_step"] = Tensor::Scalar<int64_t>(4);
  tensors["w"] = *Tensor::FromVector<float>({1, 2, 3}, {3});  // the graph's initializer has [2]
  tensors["optimizer/slot"] = Tensor::Scalar<float>(1);
  REQUIRE(saver->Save(tensors, "/ckpt/model.ckpt", 4).ok());
  ChiefSessionCreator chief(std::make_shared<Scaffold>(MakeGraph()), "", f.config, "/ckpt");
  auto s = chief.create_session();
  REQUIRE_MESSAGE(s.ok(), s.status().ToString());
  auto snapshot = (*s)->Snapshot();
  CHECK(snapshot.count("optimizer/slot") == 0);
  CHECK(snapshot.at("w").shape() == TensorShape{3});
}

TEST_CASE("Decision 7: a corrupt latest checkpoint falls back to the newest one that verifies") {
  Fixture f;
  auto saver = f.NewSaver();
  f.SaveCheckpoint(10, saver);
  f.CorruptData(f.SaveCheckpoint(20, saver));
  CapturedLog log;
  ChiefSessionCreator chief(std::make_shared<Scaffold>(MakeGraph()), "", f.config, "/ckpt");
  auto s = chief.create_session();
  REQUIRE_MESSAGE(s.ok(), s.status().ToString());
  CHECK(Step(**s) == 10);
  CHECK(Contains(log.text(), "Restoring parameters from /ckpt/model.ckpt-10"));
}

TEST_CASE("Decision 7: checkpoint files exist and none verifies: DATA_LOSS, never a fresh start") {
  Fixture f;
  auto runs = std::make_shared<int>(0);
  ScaffoldOptions o;
  o.init_op = CountingInitOp(runs);
  f.CorruptData(f.SaveCheckpoint(10));
  ChiefSessionCreator chief(std::make_shared<Scaffold>(MakeGraph(), o), "", f.config, "/ckpt");
  CHECK(chief.create_session().status().code() == absl::StatusCode::kDataLoss);
  CHECK(*runs == 0);
}

TEST_CASE("Decision 8: a moved checkpoint directory still restores, and its retention list follows it") {
  Fixture f;
  auto saver = f.NewSaver(2);
  f.SaveCheckpoint(10, saver);
  f.SaveCheckpoint(20, saver);
  REQUIRE(f.env.RecursivelyCreateDir("/moved").ok());
  auto names = f.env.GetChildren("/ckpt");
  REQUIRE(names.ok());
  for (const std::string& name : *names) REQUIRE(f.env.RenameFile("/ckpt/" + name, "/moved/" + name).ok());

  auto second = f.NewSaver(2);
  ScaffoldOptions o;
  o.saver = second;
  ChiefSessionCreator chief(std::make_shared<Scaffold>(MakeGraph(), o), "", f.config, "/moved");
  auto s = chief.create_session();
  REQUIRE_MESSAGE(s.ok(), s.status().ToString());
  CHECK(Step(**s) == 20);
  CHECK(second->last_checkpoints() == std::vector<std::string>{"/moved/model.ckpt-10", "/moved/model.ckpt-20"});
}

// -- H-21, H-26 ----------------------------------------------------------------

TEST_CASE("B142 keep_checkpoint_every_n_hours spans restarts when the chief restores from checkpoint_dir") {
  Fixture f;
  SaverOptions so;
  so.max_to_keep = 1;
  so.keep_checkpoint_every_n_hours = 1;
  so.env = &f.env;
  so.clock = &f.clock;
  {  // run 1: its Saver's first keep time is t0 + 1 h; model.ckpt-1 is saved after it
    auto run1 = Saver::Create(so);
    REQUIRE(run1.ok());
    f.clock.Advance(absl::Seconds(3700));
    f.SaveCheckpoint(1, std::shared_ptr<Saver>(*std::move(run1)));
  }
  f.clock.Advance(absl::Seconds(100));
  ScaffoldOptions o;
  auto run2 = Saver::Create(so);
  REQUIRE(run2.ok());
  o.saver = std::shared_ptr<Saver>(*std::move(run2));
  ChiefSessionCreator chief(std::make_shared<Scaffold>(MakeGraph(), o), "", f.config, "/ckpt");
  auto s = chief.create_session();
  REQUIRE_MESSAGE(s.ok(), s.status().ToString());
  REQUIRE(Step(**s) == 1);
  f.clock.Advance(absl::Seconds(100));
  f.SaveCheckpoint(2, o.saver);   // model.ckpt-1 leaves the window: run 1's schedule keeps it
  CHECK(f.env.FileExists("/ckpt/model.ckpt-1.index").ok());
}

TEST_CASE("H-21 retention spans restarts when the chief restores from checkpoint_dir") {
  Fixture f;
  {  // run 1
    ScaffoldOptions o;
    o.saver = f.NewSaver(2);
    ChiefSessionCreator chief(std::make_shared<Scaffold>(MakeGraph(), o), "", f.config, "/ckpt");
    auto s = chief.create_session();
    REQUIRE(s.ok());
    for (int step : {10, 20, 30}) {
      REQUIRE(SetGlobalStepIn(**s, step).ok());
      REQUIRE(o.saver->Save((*s)->Snapshot(), "/ckpt/model.ckpt", step).ok());
    }
  }
  CHECK(f.env.FileExists("/ckpt/model.ckpt-10.index").code() == absl::StatusCode::kNotFound);
  {  // run 2: restores 30, saves 30 (as after_create_session does), 40, 50
    ScaffoldOptions o;
    o.saver = f.NewSaver(2);
    ChiefSessionCreator chief(std::make_shared<Scaffold>(MakeGraph(), o), "", f.config, "/ckpt");
    auto s = chief.create_session();
    REQUIRE_MESSAGE(s.ok(), s.status().ToString());
    REQUIRE(Step(**s) == 30);
    for (int step : {30, 40, 50}) {
      REQUIRE(SetGlobalStepIn(**s, step).ok());
      REQUIRE(o.saver->Save((*s)->Snapshot(), "/ckpt/model.ckpt", step).ok());
    }
  }
  auto names = f.env.GetChildren("/ckpt");
  REQUIRE(names.ok());
  std::vector<std::string> indexes;
  for (const std::string& n : *names) {
    if (n.size() > 6 && n.substr(n.size() - 6) == ".index") indexes.push_back(n);
  }
  std::sort(indexes.begin(), indexes.end());
  CHECK(indexes == std::vector<std::string>{"model.ckpt-40.index", "model.ckpt-50.index"});
  auto state = ReadCheckpointState(&f.env, "/ckpt");
  REQUIRE(state.ok());
  REQUIRE(state->has_value());
  CHECK((*state)->all_model_checkpoint_paths == std::vector<std::string>{"model.ckpt-40", "model.ckpt-50"});
  CHECK((*state)->model_checkpoint_path == "model.ckpt-50");
}

TEST_CASE("H-26 restore happens only when the chief is given checkpoint_dir") {
  Fixture f;
  f.SaveCheckpoint(25);  // written by some saving hook in an earlier run
  auto runs = std::make_shared<int>(0);
  ScaffoldOptions o;
  o.init_op = CountingInitOp(runs);
  SUBCASE("no checkpoint_dir: starts from scratch") {
    ChiefSessionCreator chief(std::make_shared<Scaffold>(MakeGraph(), o), "", f.config);
    auto s = chief.create_session();
    REQUIRE(s.ok());
    CHECK(Step(**s) == 0);
    CHECK(*runs == 1);
  }
  SUBCASE("checkpoint_dir: resumes, init_op not run") {
    ChiefSessionCreator chief(std::make_shared<Scaffold>(MakeGraph(), o), "", f.config, "/ckpt");
    auto s = chief.create_session();
    REQUIRE(s.ok());
    CHECK(Step(**s) == 25);
    CHECK(*runs == 0);
  }
}

}  // namespace
}  // namespace foreman
