// Tests for the stock hooks of src/runtime/hooks/basic_hooks.cpp (spec §9: B95-B101,
// B117-B123; decision 9).
//
// The hooks are driven directly, in the order a MonitoredSession calls them
// (begin, after_create_session, then per run before_run -> Session::Run with
// the merged fetches -> after_run), by the small HookDriver below, on a raw
// Session of a small Graph. Time is a ManualClock; a test that needs a second
// thread waits for it (bounded, real time) to block in the clock, then moves
// time by hand.
#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdlib>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <variant>
#include <vector>

#include <doctest/doctest.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "foreman/coordinator.hpp"
#include "foreman/graph.hpp"
#include "foreman/hooks.hpp"
#include "foreman/mem_env.hpp"
#include "foreman/session.hpp"
#include "foreman/variable_store.hpp"
#include "support/test_util.hpp"
#include "support/log_capture.hpp"
#include "support/stop_at_step.hpp"

namespace foreman {
namespace {

using testing::LastStep;
using testing::NumSteps;

// The Options form of the hooks that used to be built by constructor; the
// arguments in the old constructors' order.
std::shared_ptr<NanTensorHook> MakeNanTensorHook(std::string loss_tensor, bool fail_on_nan_loss = true) {
  NanTensorHook::Options o;
  o.loss_tensor = std::move(loss_tensor);
  o.fail_on_nan_loss = fail_on_nan_loss;
  return NanTensorHook::Create(o).value();
}
std::shared_ptr<GlobalStepWaiterHook> MakeGlobalStepWaiterHook(int64_t wait_until_step, Clock* clock = Clock::Real(),
                                                               absl::Duration poll_interval = absl::Milliseconds(500),
                                                               std::optional<absl::Duration> max_wait = std::nullopt) {
  GlobalStepWaiterHook::Options o;
  o.wait_until_step = wait_until_step;
  o.clock = clock;
  o.poll_interval = poll_interval;
  o.max_wait = max_wait;
  return GlobalStepWaiterHook::Create(o).value();
}
std::shared_ptr<FinalOpsHook> MakeFinalOpsHook(std::vector<std::string> final_ops, TensorMap feeds = {}) {
  FinalOpsHook::Options o;
  o.final_ops = std::move(final_ops);
  o.final_ops_feed_dict = std::move(feeds);
  return FinalOpsHook::Create(o).value();
}
std::shared_ptr<FeedFnHook> MakeFeedFnHook(std::function<TensorMap()> feed_fn) {
  FeedFnHook::Options o;
  o.feed_fn = std::move(feed_fn);
  return FeedFnHook::Create(o).value();
}

using testing::Background;
using testing::kRealTimeout;

using testing::CapturedLog;

// -- a small graph ------------------------------------------------------------------

/// What the test graph's step does; tests change it between runs.
struct Model {
  int64_t increment = 1;               // added to global_step by "train_op"
  double loss = 0.5;                   // answered for "loss"
  int64_t reads = 0;                   // runs that asked for "counter"
  Status status;                       // returned by the step when not OK
};

/// A graph with global_step, a float vector "w" and a step that answers
/// "train_op" (increments global_step), "loss", "loss_f32", "loss_int",
/// "counter" (how many runs asked for it), "w", "name" (a string) and the
/// feed "x" squared as "x2". Traced runs record a "forward" span.
std::shared_ptr<Graph> MakeGraph(std::shared_ptr<Model> model, bool with_global_step = true) {
  auto graph = std::make_shared<Graph>();
  if (with_global_step) REQUIRE(graph->CreateGlobalStep().ok());
  REQUIRE(graph->AddVariable("w", *Tensor::FromVector<float>({1.0f, 2.5f, 3.0f}, TensorShape{3})).ok());
  REQUIRE(graph
              ->SetStep([model](StepContext& ctx) -> Status {
                if (!model->status.ok()) return model->status;
                {
                  auto span = ctx.Trace("forward");
                }
                if (ctx.requested("train_op")) {
                  StatusOr<int64_t> step = IncrementGlobalStep(ctx.variables(), model->increment);
                  if (!step.ok()) return step.status();
                  ctx.Set("train_op", Tensor::Scalar<int64_t>(*step));
                }
                if (ctx.requested("loss")) ctx.Set("loss", Tensor::Scalar<double>(model->loss));
                if (ctx.requested("loss_f32")) {
                  ctx.Set("loss_f32", Tensor::Scalar<float>(static_cast<float>(model->loss)));
                }
                if (ctx.requested("loss_int")) ctx.Set("loss_int", Tensor::Scalar<int64_t>(1));
                if (ctx.requested("counter")) ctx.Set("counter", Tensor::Scalar<int64_t>(++model->reads));
                if (ctx.requested("name")) ctx.Set("name", Tensor::Scalar<std::string>("it's"));
                if (ctx.requested("w")) {
                  StatusOr<Tensor*> w = ctx.variables().Get("w");
                  if (!w.ok()) return w.status();
                  ctx.Set("w", **w);
                }
                if (ctx.requested("x2")) {
                  const Tensor* x = ctx.feed("x");
                  if (x == nullptr) return absl::InvalidArgumentError("x2 needs the feed x");
                  StatusOr<double> v = x->scalar<double>();
                  if (!v.ok()) return v.status();
                  ctx.Set("x2", Tensor::Scalar<double>(*v * *v));
                }
                return absl::OkStatus();
              })
              .ok());
  return graph;
}

/// Gives every variable of the session's graph its initial value (what the
/// Scaffold's init op does).
void InitializeVariables(Session& session) {
  const std::shared_ptr<Graph>& graph = session.graph();
  REQUIRE(session
              .WithVariables([&graph](VariableStore& vars) -> Status {
                for (const VariableDef& def : graph->variables()) {
                  if (vars.Contains(def.name)) continue;
                  FOREMAN_ASSIGN_OR_RETURN(Tensor value, def.initializer());
                  FOREMAN_RETURN_IF_ERROR(vars.Create(def.name, std::move(value), def.trainable));
                }
                return absl::OkStatus();
              })
              .ok());
}

void SetStep(Session& session, int64_t step) {
  REQUIRE(session.WithVariables([step](VariableStore& vars) { return SetGlobalStep(vars, step); }).ok());
}

int64_t StepOf(Session& session) {
  StatusOr<int64_t> step = session.GlobalStep();
  REQUIRE(step.ok());
  return *step;
}

// -- driving hooks as a MonitoredSession would ---------------------------------------

/// One raw session plus the hook calls of a MonitoredSession around it,
/// without recovery: begin(), after_create_session(), run(), end().
class HookDriver {
 public:
  HookDriver(HookList hooks, std::shared_ptr<Model> model = std::make_shared<Model>(), bool with_global_step = true)
      : model_(std::move(model)), hooks_(std::move(hooks)), coord_(std::vector<absl::StatusCode>{}) {
    StatusOr<std::unique_ptr<Session>> session = Session::Create(MakeGraph(model_, with_global_step));
    REQUIRE(session.ok());
    session_ = *std::move(session);
    InitializeVariables(*session_);
  }

  Status Begin() {
    for (auto& hook : hooks_) FOREMAN_RETURN_IF_ERROR(hook->begin());
    return absl::OkStatus();
  }
  Status CreateSession() {
    for (auto& hook : hooks_) FOREMAN_RETURN_IF_ERROR(hook->after_create_session(session_.get(), &coord_));
    return absl::OkStatus();
  }
  Status BeginAndCreate() {
    FOREMAN_RETURN_IF_ERROR(Begin());
    return CreateSession();
  }

  /// B28-B35: before_run in order, one Session::Run with the merged fetches,
  /// feeds and options, after_run in order with each hook's own results.
  StatusOr<TensorMap> Run(const std::vector<std::string>& fetches, const TensorMap& feeds = {},
                          RunOptions options = {}) {
    SessionRunArgs original{fetches, feeds, options};
    SessionRunContext ctx(&original, session_.get());
    std::vector<SessionRunArgs> requests;
    std::set<std::string> merged(fetches.begin(), fetches.end());
    TensorMap merged_feeds = feeds;
    for (auto& hook : hooks_) {
      FOREMAN_ASSIGN_OR_RETURN(SessionRunArgs args, hook->before_run(ctx));
      merged.insert(args.fetches.begin(), args.fetches.end());
      for (const auto& [name, value] : args.feeds) merged_feeds[name] = value;
      options.trace_level = std::max(options.trace_level, args.options.trace_level);
      requests.push_back(std::move(args));
    }
    last_options_ = options;
    last_metadata_ = RunMetadata{};
    FOREMAN_ASSIGN_OR_RETURN(TensorMap out,
                             session_->Run(std::vector<std::string>(merged.begin(), merged.end()), merged_feeds,
                                           options, &last_metadata_));
    for (std::size_t i = 0; i < hooks_.size(); ++i) {
      TensorMap mine;
      for (const std::string& f : requests[i].fetches) mine[f] = out.at(f);
      SessionRunValues values;
      values.results = requests[i].fetches.empty() ? nullptr : &mine;
      values.options = &last_options_;
      values.run_metadata = &last_metadata_;
      FOREMAN_RETURN_IF_ERROR(hooks_[i]->after_run(ctx, values));
    }
    stop_ = stop_ || ctx.stop_requested();
    TensorMap caller;
    for (const std::string& f : fetches) caller[f] = out.at(f);
    return caller;
  }

  Status End() {
    for (auto& hook : hooks_) FOREMAN_RETURN_IF_ERROR(hook->end(session_.get()));
    return absl::OkStatus();
  }

  /// The loop's stop condition (B37): a hook's request_stop or the
  /// coordinator's.
  bool should_stop() const { return stop_ || coord_.should_stop(); }

  Session& session() { return *session_; }
  Coordinator& coord() { return coord_; }
  Model& model() { return *model_; }
  const RunOptions& last_options() const { return last_options_; }

 private:
  std::shared_ptr<Model> model_;
  HookList hooks_;
  std::unique_ptr<Session> session_;
  Coordinator coord_;
  bool stop_ = false;
  RunOptions last_options_;
  RunMetadata last_metadata_;
};

/// A hook that records the options and results it sees.
class RecordingHook : public SessionRunHook {
 public:
  std::string name() const override { return "RecordingHook"; }
  Status after_run(SessionRunContext& /*ctx*/, const SessionRunValues& values) override {
    trace_levels.push_back(values.options->trace_level);
    return absl::OkStatus();
  }
  std::vector<int> trace_levels;
};

/// Advances `clock` by `step` each time a thread sleeps in it, until `done()`
/// (checked between advances); false when that takes over kRealTimeout.
bool AdvanceWhileSleeping(ManualClock& clock, absl::Duration step, const std::function<bool()>& done) {
  const auto give_up = std::chrono::steady_clock::now() + absl::ToChronoMilliseconds(kRealTimeout);
  while (!done()) {
    if (std::chrono::steady_clock::now() >= give_up) return false;
    if (clock.BlockUntilWaiters(1, absl::Milliseconds(10))) clock.Advance(step);
  }
  return true;
}

// -- a small JSON parser (for the Chrome trace files) -------------------------------

struct Json {
  using Object = std::map<std::string, Json>;
  using Array = std::vector<Json>;
  std::variant<std::nullptr_t, bool, double, std::string, Array, Object> value;

  bool is_object() const { return std::holds_alternative<Object>(value); }
  bool is_array() const { return std::holds_alternative<Array>(value); }
  bool is_string() const { return std::holds_alternative<std::string>(value); }
  bool is_number() const { return std::holds_alternative<double>(value); }
  const Object& object() const { return std::get<Object>(value); }
  const Array& array() const { return std::get<Array>(value); }
  const std::string& string() const { return std::get<std::string>(value); }
  double number() const { return std::get<double>(value); }
  bool has(const std::string& key) const { return is_object() && object().count(key) != 0; }
  const Json& operator[](const std::string& key) const { return object().at(key); }
};

/// RFC 8259, strictly: throws std::runtime_error naming the offset on any
/// deviation (trailing text included).
class JsonParser {
 public:
  static Json Parse(const std::string& text) {
    JsonParser p(text);
    Json v = p.Value();
    p.SkipSpace();
    if (p.pos_ != text.size()) p.Fail("trailing text");
    return v;
  }

 private:
  explicit JsonParser(const std::string& text) : s_(text) {}

  [[noreturn]] void Fail(const std::string& what) const {
    throw std::runtime_error(absl::StrCat("JSON: ", what, " at offset ", pos_));
  }
  void SkipSpace() {
    while (pos_ < s_.size() && (s_[pos_] == ' ' || s_[pos_] == '\n' || s_[pos_] == '\r' || s_[pos_] == '\t')) ++pos_;
  }
  char Peek() {
    SkipSpace();
    if (pos_ >= s_.size()) Fail("unexpected end");
    return s_[pos_];
  }
  void Expect(char c) {
    if (Peek() != c) Fail(absl::StrCat("expected '", std::string(1, c), "'"));
    ++pos_;
  }
  void Literal(const std::string& word) {
    if (s_.compare(pos_, word.size(), word) != 0) Fail("bad literal");
    pos_ += word.size();
  }

  Json Value() {
    const char c = Peek();
    if (c == '{') return Json{ObjectValue()};
    if (c == '[') return Json{ArrayValue()};
    if (c == '"') return Json{StringValue()};
    if (c == 't') return Literal("true"), Json{true};
    if (c == 'f') return Literal("false"), Json{false};
    if (c == 'n') return Literal("null"), Json{nullptr};
    return Json{NumberValue()};
  }
  Json::Object ObjectValue() {
    Expect('{');
    Json::Object out;
    if (Peek() == '}') return ++pos_, out;
    while (true) {
      if (Peek() != '"') Fail("expected a key");
      std::string key = StringValue();
      Expect(':');
      if (!out.emplace(key, Value()).second) Fail("duplicate key " + key);
      if (Peek() == ',') {
        ++pos_;
        continue;
      }
      Expect('}');
      return out;
    }
  }
  Json::Array ArrayValue() {
    Expect('[');
    Json::Array out;
    if (Peek() == ']') return ++pos_, out;
    while (true) {
      out.push_back(Value());
      if (Peek() == ',') {
        ++pos_;
        continue;
      }
      Expect(']');
      return out;
    }
  }
  std::string StringValue() {
    Expect('"');
    std::string out;
    while (true) {
      if (pos_ >= s_.size()) Fail("unterminated string");
      const unsigned char c = static_cast<unsigned char>(s_[pos_++]);
      if (c == '"') return out;
      if (c < 0x20) Fail("control character in string");
      if (c != '\\') {
        out.push_back(static_cast<char>(c));
        continue;
      }
      if (pos_ >= s_.size()) Fail("unterminated escape");
      const char e = s_[pos_++];
      switch (e) {
        case '"': out.push_back('"'); break;
        case '\\': out.push_back('\\'); break;
        case '/': out.push_back('/'); break;
        case 'b': out.push_back('\b'); break;
        case 'f': out.push_back('\f'); break;
        case 'n': out.push_back('\n'); break;
        case 'r': out.push_back('\r'); break;
        case 't': out.push_back('\t'); break;
        case 'u': {
          if (pos_ + 4 > s_.size()) Fail("short \\u escape");
          const unsigned long code = std::stoul(s_.substr(pos_, 4), nullptr, 16);
          pos_ += 4;
          if (code >= 0x80) Fail("test parser: only ASCII \\u escapes");
          out.push_back(static_cast<char>(code));
          break;
        }
        default: Fail("bad escape");
      }
    }
  }
  double NumberValue() {
    const std::size_t start = pos_;
    if (pos_ < s_.size() && s_[pos_] == '-') ++pos_;
    if (pos_ >= s_.size() || !std::isdigit(static_cast<unsigned char>(s_[pos_]))) Fail("bad number");
    if (s_[pos_] == '0') {
      ++pos_;
    } else {
      while (pos_ < s_.size() && std::isdigit(static_cast<unsigned char>(s_[pos_]))) ++pos_;
    }
    if (pos_ < s_.size() && s_[pos_] == '.') {
      ++pos_;
      if (pos_ >= s_.size() || !std::isdigit(static_cast<unsigned char>(s_[pos_]))) Fail("bad fraction");
      while (pos_ < s_.size() && std::isdigit(static_cast<unsigned char>(s_[pos_]))) ++pos_;
    }
    if (pos_ < s_.size() && (s_[pos_] == 'e' || s_[pos_] == 'E')) {
      ++pos_;
      if (pos_ < s_.size() && (s_[pos_] == '+' || s_[pos_] == '-')) ++pos_;
      if (pos_ >= s_.size() || !std::isdigit(static_cast<unsigned char>(s_[pos_]))) Fail("bad exponent");
      while (pos_ < s_.size() && std::isdigit(static_cast<unsigned char>(s_[pos_]))) ++pos_;
    }
    return std::stod(s_.substr(start, pos_ - start));
  }

  const std::string& s_;
  std::size_t pos_ = 0;
};

// =====================================================================================
// SecondOrStepTimer
// =====================================================================================

TEST_CASE("StepMultiplesCrossed counts the multiples in (from, to]; NextStepMultiple is the first past a step") {
  // One step at a time (one process): a multiple is crossed at the step on it.
  CHECK(StepMultiplesCrossed(499, 500, 500) == 1);
  CHECK(StepMultiplesCrossed(500, 501, 500) == 0);
  CHECK(StepMultiplesCrossed(0, 1, 1) == 1);
  // A cluster's jumps: the first step at or past the multiple, never skipped.
  CHECK(StepMultiplesCrossed(999, 1001, 500) == 1);  // issue 31: "% 500 == 0" missed 1000 here
  CHECK(StepMultiplesCrossed(1000, 1499, 500) == 0);
  CHECK(StepMultiplesCrossed(1499, 2003, 500) == 2);  // one run passed 1500 and 2000: one firing covers both
  CHECK(StepMultiplesCrossed(1500, 1500, 500) == 0);  // no step advanced
  CHECK(StepMultiplesCrossed(2000, 1200, 500) == 0);  // a rewind (a restore) crosses nothing
  // Negative steps divide by floor (a "start before step 0" of -1).
  CHECK(StepMultiplesCrossed(-1, 0, 7) == 1);
  CHECK(StepMultiplesCrossed(-8, -1, 7) == 1);
  // No cadence.
  CHECK(StepMultiplesCrossed(0, 1000, 0) == 0);
  CHECK(StepMultiplesCrossed(0, 1000, -5) == 0);

  CHECK(NextStepMultiple(0, 500) == 500);
  CHECK(NextStepMultiple(499, 500) == 500);
  CHECK(NextStepMultiple(500, 500) == 1000);
  CHECK(NextStepMultiple(1234, 500) == 1500);
  CHECK(NextStepMultiple(-1, 7) == 0);
  CHECK(NextStepMultiple(-8, 7) == -7);
  CHECK(NextStepMultiple(10, 0) == 0);
  // The pair agrees: a step at or past NextStepMultiple(c) crosses a multiple since c.
  for (int64_t c = -10; c < 40; ++c) {
    for (int64_t s = c; s < c + 25; ++s) {
      CHECK((s >= NextStepMultiple(c, 7)) == (StepMultiplesCrossed(c, s, 7) > 0));
    }
  }
}

TEST_CASE("B95 SecondOrStepTimer needs exactly one of every_secs and every_steps") {
  StatusOr<SecondOrStepTimer> neither = SecondOrStepTimer::Create(std::nullopt, std::nullopt);
  CHECK(absl::IsInvalidArgument(neither.status()));
  CHECK(neither.status().message() == "Either every_secs or every_steps should be provided.");
  StatusOr<SecondOrStepTimer> both = SecondOrStepTimer::Create(1.0, 10);
  CHECK(absl::IsInvalidArgument(both.status()));
  CHECK(both.status().message() == "Can not provide both every_secs and every_steps.");
  CHECK(SecondOrStepTimer::Create(1.0, std::nullopt).ok());
  CHECK(SecondOrStepTimer::Create(std::nullopt, 10).ok());
}

TEST_CASE("B96 SecondOrStepTimer triggers first, never twice for a step, then every N steps") {
  ManualClock clock;
  SecondOrStepTimer timer = *SecondOrStepTimer::Create(std::nullopt, 10, &clock);
  CHECK(timer.should_trigger_for_step(5));  // never triggered
  timer.update_last_triggered_step(5);
  CHECK_FALSE(timer.should_trigger_for_step(5));  // the last triggered step
  CHECK_FALSE(timer.should_trigger_for_step(14));
  clock.Advance(absl::Hours(1));  // time does not matter with every_steps
  CHECK_FALSE(timer.should_trigger_for_step(14));
  CHECK(timer.should_trigger_for_step(15));
  CHECK(timer.should_trigger_for_step(100));
}

TEST_CASE("B96 SecondOrStepTimer with every_secs triggers once the seconds have passed on the clock") {
  ManualClock clock;
  SecondOrStepTimer timer = *SecondOrStepTimer::Create(2.0, std::nullopt, &clock);
  CHECK(timer.should_trigger_for_step(0));
  timer.update_last_triggered_step(0);
  CHECK_FALSE(timer.should_trigger_for_step(1000));  // steps do not matter
  clock.Advance(absl::Milliseconds(1999));
  CHECK_FALSE(timer.should_trigger_for_step(1));
  clock.Advance(absl::Milliseconds(1));
  CHECK(timer.should_trigger_for_step(1));
  CHECK_FALSE(timer.should_trigger_for_step(0));  // never for the last triggered step
  // Wall-clock jumps do not count: seconds are monotonic.
  timer.update_last_triggered_step(1);
  clock.SetWallTime(clock.WallNow() + absl::Hours(5));
  CHECK_FALSE(timer.should_trigger_for_step(2));
}

TEST_CASE("B97 SecondOrStepTimer update returns the elapsed seconds and steps; reset forgets") {
  ManualClock clock;
  SecondOrStepTimer timer = *SecondOrStepTimer::Create(std::nullopt, 1, &clock);
  CHECK_FALSE(timer.last_triggered_step().has_value());
  CHECK_FALSE(timer.update_last_triggered_step(3).has_value());  // first trigger
  CHECK(timer.last_triggered_step() == 3);
  clock.Advance(absl::Milliseconds(1500));
  auto elapsed = timer.update_last_triggered_step(10);
  REQUIRE(elapsed.has_value());
  CHECK(elapsed->first == doctest::Approx(1.5));
  CHECK(elapsed->second == 7);
  CHECK(timer.last_triggered_step() == 10);
  timer.reset();
  CHECK_FALSE(timer.last_triggered_step().has_value());
  CHECK(timer.should_trigger_for_step(10));
  CHECK_FALSE(timer.update_last_triggered_step(11).has_value());
}

// =====================================================================================
// StopAtStepHook
// =====================================================================================

TEST_CASE("B98 StopAtStepHook needs exactly one of num_steps and last_step") {
  auto neither = StopAtStepHook::Create(StopAtStepHook::Options{});
  CHECK(absl::IsInvalidArgument(neither.status()));
  CHECK(neither.status().message() == "One of num_steps or last_step must be specified.");
  StopAtStepHook::Options both_set;
  both_set.num_steps = 5;
  both_set.last_step = 10;
  auto both = StopAtStepHook::Create(both_set);
  CHECK(absl::IsInvalidArgument(both.status()));
  CHECK(both.status().message() == "Only one of num_steps or last_step can be specified.");
  // Each field means what it names: last_step is the step to stop at.
  REQUIRE(StopAtStepHook::Create(LastStep(7)).ok());
  CHECK(StopAtStepHook::Create(LastStep(7)).value()->last_step() == 7);
  CHECK_FALSE(StopAtStepHook::Create(NumSteps(7)).value()->last_step().has_value());
}

// Issue 12 (8): every stock hook is built from its Options by Create(), which
// checks them.
TEST_CASE("every stock hook has Options and Create(), which refuses bad options") {
  NanTensorHook::Options nan;
  CHECK(absl::IsInvalidArgument(NanTensorHook::Create(nan).status()));
  nan.loss_tensor = "loss";
  CHECK(NanTensorHook::Create(nan).ok());

  GlobalStepWaiterHook::Options waiter;
  waiter.poll_interval = absl::ZeroDuration();
  CHECK(absl::IsInvalidArgument(GlobalStepWaiterHook::Create(waiter).status()));
  waiter.poll_interval = absl::Milliseconds(1);
  waiter.max_wait = absl::ZeroDuration();
  CHECK(absl::IsInvalidArgument(GlobalStepWaiterHook::Create(waiter).status()));
  waiter.max_wait = absl::Seconds(1);
  CHECK(GlobalStepWaiterHook::Create(waiter).ok());

  FinalOpsHook::Options final_ops;
  final_ops.final_ops = {"counter", ""};
  Status bad_op = FinalOpsHook::Create(final_ops).status();
  CHECK(absl::IsInvalidArgument(bad_op));
  CHECK(absl::StrContains(bad_op.message(), "final_ops[1]"));

  CHECK(absl::IsInvalidArgument(FeedFnHook::Create(FeedFnHook::Options{}).status()));

  // The nested Options of the hooks that had XxxHookOptions are those structs.
  CHECK(StepCounterHook::Create(StepCounterHook::Options{}).ok());
  LoggingTensorHook::Options logging;
  logging.tensors = {"x"};
  logging.at_end = true;
  CHECK(LoggingTensorHook::Create(logging).ok());
}

// The hooks Create() builds do their work (before issue 26 this case ran the
// deprecated positional factories and constructors, now removed).
TEST_CASE("the hooks Create() builds from Options are working hooks") {
  auto neither = StopAtStepHook::Create(StopAtStepHook::Options{});
  CHECK(absl::IsInvalidArgument(neither.status()));
  auto by_last = StopAtStepHook::Create(LastStep(5));
  REQUIRE(by_last.ok());
  CHECK((*by_last)->last_step() == 5);

  NanTensorHook::Options nan_options;
  nan_options.loss_tensor = "loss";
  auto nan = NanTensorHook::Create(nan_options);
  REQUIRE(nan.ok());
  HookDriver nan_driver({*nan});
  REQUIRE(nan_driver.BeginAndCreate().ok());
  nan_driver.model().loss = std::nan("");
  CHECK(IsNanLossDuringTraining(nan_driver.Run({"train_op"}).status()));

  FinalOpsHook::Options final_options;
  final_options.final_ops = {"counter"};
  auto final_ops = FinalOpsHook::Create(final_options);
  REQUIRE(final_ops.ok());
  CHECK((*final_ops)->name() == "FinalOpsHook");
  auto feed = FeedFnHook::Create(FeedFnHook::Options{[] { return TensorMap{}; }});
  REQUIRE(feed.ok());
  CHECK((*feed)->name() == "FeedFnHook");
  auto waiter = GlobalStepWaiterHook::Create(GlobalStepWaiterHook::Options{});
  REQUIRE(waiter.ok());
  CHECK((*waiter)->name() == "GlobalStepWaiterHook");
  CheckpointSaverHook::Options saver;
  saver.checkpoint_dir = "/tmp/unused";
  CHECK(saver.save_steps == std::nullopt);
}

TEST_CASE("B98 StopAtStepHook refuses a graph without a global step before any step") {
  auto hook = *StopAtStepHook::Create(NumSteps(5));
  HookDriver driver({hook}, std::make_shared<Model>(), /*with_global_step=*/false);
  REQUIRE(driver.Begin().ok());
  Status s = driver.CreateSession();
  CHECK(absl::IsFailedPrecondition(s));
  CHECK(s.message() == "Global step should be created to use StopAtStepHook.");
}

TEST_CASE("B124 a global step the run did not answer, or not as an integer scalar, is FAILED_PRECONDITION") {
  // TF's hooks raise RuntimeError ("Global step should be created to use ...")
  // for a missing global step; RuntimeError maps to FAILED_PRECONDITION, and so
  // does every other way the stock hooks find no usable global step.
  auto hook = *StopAtStepHook::Create(NumSteps(5));
  HookDriver driver({hook});
  REQUIRE(driver.BeginAndCreate().ok());
  SessionRunArgs original;
  SessionRunContext ctx(&original, &driver.session());
  SessionRunValues values;   // no results at all
  Status s = hook->after_run(ctx, values);
  CHECK(absl::IsFailedPrecondition(s));
  CHECK(s.message() == "StopAtStepHook: the run returned no value for the \"global_step\" fetch");
  TensorMap results = {{"global_step", Tensor::Scalar<double>(3.0)}};
  values.results = &results;
  s = hook->after_run(ctx, values);
  CHECK(absl::IsFailedPrecondition(s));
  CHECK(s.message() == "StopAtStepHook: the \"global_step\" fetch is float64[], not an int32/int64 scalar");
  results = {{"global_step", Tensor::Scalar<int32_t>(1)}};   // an int32 global step is one
  CHECK(hook->after_run(ctx, values).ok());
}

TEST_CASE("B124 a global_step variable that is gone when a hook re-reads it is FAILED_PRECONDITION") {
  auto hook = *StopAtStepHook::Create(NumSteps(1));
  HookDriver driver({hook});
  REQUIRE(driver.BeginAndCreate().ok());
  REQUIRE(driver.session().WithVariables([](VariableStore& vars) { return vars.Delete("global_step"); }).ok());
  SessionRunArgs original;
  SessionRunContext ctx(&original, &driver.session());
  TensorMap results = {{"global_step", Tensor::Scalar<int64_t>(0)}};   // stale 0: last_step 1 is due
  SessionRunValues values;
  values.results = &results;
  const Status s = hook->after_run(ctx, values);
  CHECK(absl::IsFailedPrecondition(s));
  CHECK(absl::StartsWith(s.message(), "StopAtStepHook: reading global_step: "));
}

TEST_CASE("B99 StopAtStepHook computes last_step from the first session's step, once") {
  auto hook = *StopAtStepHook::Create(NumSteps(3));
  HookDriver driver({hook});
  SetStep(driver.session(), 10);
  REQUIRE(driver.BeginAndCreate().ok());
  CHECK(hook->last_step() == 13);
  // A recovery: the restored session starts elsewhere; last_step stays.
  SetStep(driver.session(), 11);
  REQUIRE(driver.CreateSession().ok());
  CHECK(hook->last_step() == 13);
  int runs = 0;
  while (!driver.should_stop() && runs < 10) {
    REQUIRE(driver.Run({"train_op"}).ok());
    ++runs;
  }
  CHECK(runs == 2);  // 11 -> 13
  CHECK(StepOf(driver.session()) == 13);
}

TEST_CASE("B99 StopAtStepHook with last_step stops at that step") {
  auto hook = *StopAtStepHook::Create(LastStep(5));
  HookDriver driver({hook});
  REQUIRE(driver.BeginAndCreate().ok());
  CHECK(hook->last_step() == 5);
  int runs = 0;
  while (!driver.should_stop() && runs < 20) {
    REQUIRE(driver.Run({"train_op"}).ok());
    ++runs;
  }
  CHECK(runs == 5);
  CHECK(StepOf(driver.session()) == 5);
}

TEST_CASE("B100 StopAtStepHook requests stop after the run that reaches last_step, judged by the stale step") {
  // +3 per run, last_step 5. Run 1: stale 0, 0+1 < 5: no re-read (real 3).
  // Run 2: stale 3, 3+1 < 5: no re-read although the real step is now 6.
  // Run 3: stale 6 -> re-read 9 >= 5: stop. A hook that always re-read the
  // real step would stop after run 2: TF's schedule is the stale one.
  auto hook = *StopAtStepHook::Create(LastStep(5));
  auto model = std::make_shared<Model>();
  model->increment = 3;
  HookDriver driver({hook}, model);
  REQUIRE(driver.BeginAndCreate().ok());
  std::vector<int64_t> steps;
  while (!driver.should_stop() && steps.size() < 10) {
    REQUIRE(driver.Run({"train_op"}).ok());
    steps.push_back(StepOf(driver.session()));
  }
  CHECK(steps == std::vector<int64_t>{3, 6, 9});
}

TEST_CASE("B100 StopAtStepHook re-reads the real step: no stop when the stale guess is wrong") {
  // The step function does not train on "noop" runs: stale+1 >= last_step
  // asks for the real step, which is still below last_step.
  auto hook = *StopAtStepHook::Create(LastStep(2));
  HookDriver driver({hook});
  REQUIRE(driver.BeginAndCreate().ok());
  REQUIRE(driver.Run({"train_op"}).ok());  // 0 -> 1
  CHECK_FALSE(driver.should_stop());
  REQUIRE(driver.Run({"loss"}).ok());  // stale 1, 1+1 >= 2, real 1 < 2
  CHECK_FALSE(driver.should_stop());
  REQUIRE(driver.Run({"train_op"}).ok());  // 1 -> 2
  CHECK(driver.should_stop());
}

TEST_CASE("B101 decision 9: a session restored at or past last_step stops before the first step") {
  SUBCASE("past last_step") {
    auto hook = *StopAtStepHook::Create(LastStep(5));
    HookDriver driver({hook});
    SetStep(driver.session(), 7);
    CapturedLog log;
    REQUIRE(driver.BeginAndCreate().ok());
    CHECK(driver.coord().should_stop());  // TF would train one more step
    CHECK(driver.coord().status().ok());  // a clean stop
    CHECK(absl::StrContains(log.text(), "global_step 7 is already at or past last_step 5"));
  }
  SUBCASE("exactly at last_step") {
    auto hook = *StopAtStepHook::Create(LastStep(5));
    HookDriver driver({hook});
    SetStep(driver.session(), 5);
    REQUIRE(driver.BeginAndCreate().ok());
    CHECK(driver.coord().should_stop());
  }
  SUBCASE("num_steps 0") {
    auto hook = *StopAtStepHook::Create(NumSteps(0));
    HookDriver driver({hook});
    SetStep(driver.session(), 4);
    REQUIRE(driver.BeginAndCreate().ok());
    CHECK(hook->last_step() == 4);
    CHECK(driver.coord().should_stop());
  }
  SUBCASE("below last_step: no stop") {
    auto hook = *StopAtStepHook::Create(LastStep(5));
    HookDriver driver({hook});
    SetStep(driver.session(), 4);
    REQUIRE(driver.BeginAndCreate().ok());
    CHECK_FALSE(driver.should_stop());
  }
  SUBCASE("a recovered session past last_step stops too") {
    auto hook = *StopAtStepHook::Create(NumSteps(3));
    HookDriver driver({hook});
    REQUIRE(driver.BeginAndCreate().ok());
    CHECK_FALSE(driver.coord().should_stop());
    SetStep(driver.session(), 3);  // restored from a checkpoint written at 3
    REQUIRE(driver.CreateSession().ok());
    CHECK(hook->last_step() == 3);
    CHECK(driver.coord().should_stop());
  }
}

// =====================================================================================
// LoggingTensorHook
// =====================================================================================

TEST_CASE("B117 LoggingTensorHook options: at_end alone or exactly one of every_n_iter / every_n_secs") {
  const std::string kMessage = "either at_end and/or exactly one of every_n_iter and every_n_secs must be provided.";
  LoggingTensorHook::Options none;
  none.tensors = {"loss"};
  CHECK(LoggingTensorHook::Create(none).status().message() == kMessage);
  LoggingTensorHook::Options both = none;
  both.every_n_iter = 1;
  both.every_n_secs = 1.0;
  CHECK(absl::IsInvalidArgument(LoggingTensorHook::Create(both).status()));
  CHECK(LoggingTensorHook::Create(both).status().message() == kMessage);
  both.at_end = true;  // at_end does not excuse both
  CHECK(LoggingTensorHook::Create(both).status().message() == kMessage);
  LoggingTensorHook::Options zero = none;
  zero.every_n_iter = 0;
  CHECK(LoggingTensorHook::Create(zero).status().message() == "invalid every_n_iter=0.");
  zero.every_n_iter = -2;
  CHECK(LoggingTensorHook::Create(zero).status().message() == "invalid every_n_iter=-2.");
  LoggingTensorHook::Options at_end = none;
  at_end.at_end = true;
  CHECK(LoggingTensorHook::Create(at_end).ok());
  at_end.every_n_secs = 5.0;
  CHECK(LoggingTensorHook::Create(at_end).ok());
}

TEST_CASE("B117 LoggingTensorHook counts local iterations, triggering at iteration 0 first") {
  ManualClock clock;
  LoggingTensorHook::Options opts;
  opts.tensors = {"counter"};
  opts.every_n_iter = 2;
  opts.clock = &clock;
  auto hook = *LoggingTensorHook::Create(opts);
  HookDriver driver({hook});
  SetStep(driver.session(), 100);  // the global step does not matter
  REQUIRE(driver.BeginAndCreate().ok());
  CapturedLog log;
  for (int i = 0; i < 5; ++i) REQUIRE(driver.Run({"train_op"}).ok());
  CHECK(hook->iteration() == 5);
  // "counter" is fetched only when the hook logs: at iterations 0, 2, 4.
  CHECK(driver.model().reads == 3);
  CHECK(absl::StrContains(log.text(), "counter = 1\n"));
  CHECK(absl::StrContains(log.text(), "counter = 2 (0.000 sec)"));
  CHECK(absl::StrContains(log.text(), "counter = 3 (0.000 sec)"));
  // begin() starts counting again.
  REQUIRE(driver.Begin().ok());
  CHECK(hook->iteration() == 0);
}

TEST_CASE("B118 LoggingTensorHook line: tags in given order, seconds from the second line on") {
  ManualClock clock;
  LoggingTensorHook::Options opts;
  opts.tensors = {"loss", "counter", "w"};
  opts.every_n_secs = 1.0;
  opts.clock = &clock;
  auto hook = *LoggingTensorHook::Create(opts);
  HookDriver driver({hook});
  REQUIRE(driver.BeginAndCreate().ok());
  CapturedLog log;
  REQUIRE(driver.Run({"train_op"}).ok());
  CHECK(absl::StrContains(log.text(), "loss = 0.5, counter = 1, w = [1.  2.5 3. ]\n"));
  CHECK_FALSE(absl::StrContains(log.text(), "sec)"));
  clock.Advance(absl::Milliseconds(500));
  REQUIRE(driver.Run({"train_op"}).ok());  // not yet due
  CHECK(driver.model().reads == 1);
  clock.Advance(absl::Milliseconds(1250));
  driver.model().loss = 0.25;
  REQUIRE(driver.Run({"train_op"}).ok());
  CHECK(absl::StrContains(log.text(), "loss = 0.25, counter = 2, w = [1.  2.5 3. ] (1.750 sec)\n"));
}

TEST_CASE("B118 LoggingTensorHook sorts the tags of a dict") {
  LoggingTensorHook::Options opts;
  opts.tensors = {"loss", "counter"};
  opts.sorted_tags = true;
  opts.every_n_iter = 1;
  auto hook = *LoggingTensorHook::Create(opts);
  HookDriver driver({hook});
  REQUIRE(driver.BeginAndCreate().ok());
  CapturedLog log;
  REQUIRE(driver.Run({"train_op"}).ok());
  CHECK(absl::StrContains(log.text(), "counter = 1, loss = 0.5\n"));
}

TEST_CASE("B118 LoggingTensorHook formatter replaces the line; its exception becomes the status") {
  LoggingTensorHook::Options opts;
  opts.tensors = {"loss"};
  opts.every_n_iter = 1;
  int calls = 0;
  opts.formatter = [&calls](const TensorMap& values) -> std::string {
    if (++calls == 2) throw std::runtime_error("formatter broke");
    return absl::StrCat("custom ", values.at("loss").scalar<double>().value());
  };
  auto hook = *LoggingTensorHook::Create(opts);
  HookDriver driver({hook});
  REQUIRE(driver.BeginAndCreate().ok());
  CapturedLog log;
  REQUIRE(driver.Run({"train_op"}).ok());
  CHECK(absl::StrContains(log.text(), "custom 0.5"));
  CHECK_FALSE(absl::StrContains(log.text(), "loss = "));
  StatusOr<TensorMap> out = driver.Run({"train_op"});
  CHECK(absl::IsInternal(out.status()));
  CHECK(absl::StrContains(out.status().message(), "formatter broke"));
  CHECK(absl::StrContains(out.status().message(), "LoggingTensorHook"));
}

TEST_CASE("B118 LoggingTensorHook at_end runs the tensors once more in end()") {
  SUBCASE("at_end alone logs only at the end, without seconds") {
    LoggingTensorHook::Options opts;
    opts.tensors = {"counter"};
    opts.at_end = true;
    auto hook = *LoggingTensorHook::Create(opts);
    HookDriver driver({hook});
    REQUIRE(driver.BeginAndCreate().ok());
    CapturedLog log;
    for (int i = 0; i < 3; ++i) REQUIRE(driver.Run({"train_op"}).ok());
    CHECK(driver.model().reads == 0);
    CHECK(log.text().empty());
    REQUIRE(driver.End().ok());
    CHECK(driver.model().reads == 1);  // the side effect of the extra run
    CHECK(absl::StrContains(log.text(), "counter = 1\n"));
  }
  SUBCASE("with a schedule, the end line carries the seconds since the last line") {
    ManualClock clock;
    LoggingTensorHook::Options opts;
    opts.tensors = {"counter"};
    opts.every_n_iter = 10;
    opts.at_end = true;
    opts.clock = &clock;
    auto hook = *LoggingTensorHook::Create(opts);
    HookDriver driver({hook});
    REQUIRE(driver.BeginAndCreate().ok());
    CapturedLog log;
    REQUIRE(driver.Run({"train_op"}).ok());
    clock.Advance(absl::Seconds(2));
    REQUIRE(driver.Run({"train_op"}).ok());
    REQUIRE(driver.End().ok());
    CHECK(driver.model().reads == 2);
    CHECK(absl::StrContains(log.text(), "counter = 2 (2.000 sec)\n"));
  }
  SUBCASE("without at_end, end() runs nothing") {
    LoggingTensorHook::Options opts;
    opts.tensors = {"counter"};
    opts.every_n_iter = 10;
    auto hook = *LoggingTensorHook::Create(opts);
    HookDriver driver({hook});
    REQUIRE(driver.BeginAndCreate().ok());
    REQUIRE(driver.End().ok());
    CHECK(driver.model().reads == 0);
  }
}

TEST_CASE("B118 FormatTensorForLog prints values as numpy does") {
  // Every expected string here is numpy 1.24's str() of the same value
  // (np.set_printoptions(suppress=True), as LoggingTensorHook sets).
  // Scalars: numpy's str of a scalar (Python's repr of the number).
  CHECK(FormatTensorForLog(Tensor::Scalar<double>(0.5)) == "0.5");
  CHECK(FormatTensorForLog(Tensor::Scalar<double>(1.0)) == "1.0");
  CHECK(FormatTensorForLog(Tensor::Scalar<double>(-0.0)) == "-0.0");
  CHECK(FormatTensorForLog(Tensor::Scalar<double>(0.1)) == "0.1");
  CHECK(FormatTensorForLog(Tensor::Scalar<float>(0.1f)) == "0.1");  // float32's shortest digits
  CHECK(FormatTensorForLog(Tensor::Scalar<double>(123.25)) == "123.25");
  CHECK(FormatTensorForLog(Tensor::Scalar<double>(1e-5)) == "1e-05");
  CHECK(FormatTensorForLog(Tensor::Scalar<double>(0.0001)) == "0.0001");
  CHECK(FormatTensorForLog(Tensor::Scalar<double>(1e16)) == "1e+16");
  CHECK(FormatTensorForLog(Tensor::Scalar<double>(1.5e16)) == "1.5e+16");
  CHECK(FormatTensorForLog(Tensor::Scalar<double>(1e15)) == "1000000000000000.0");
  CHECK(FormatTensorForLog(Tensor::Scalar<double>(std::nan(""))) == "nan");
  CHECK(FormatTensorForLog(Tensor::Scalar<float>(-std::numeric_limits<float>::infinity())) == "-inf");
  CHECK(FormatTensorForLog(Tensor::Scalar<int64_t>(-42)) == "-42");
  CHECK(FormatTensorForLog(Tensor::Scalar<int32_t>(7)) == "7");
  CHECK(FormatTensorForLog(Tensor::Scalar<uint8_t>(200)) == "200");
  CHECK(FormatTensorForLog(Tensor::Scalar<std::string>("abc")) == "b'abc'");
  CHECK(FormatTensorForLog(Tensor::Scalar<std::string>("it's")) == "b\"it's\"");
  CHECK(FormatTensorForLog(Tensor::Scalar<std::string>(std::string("a\n\x01\\", 4))) == "b'a\\n\\x01\\\\'");
  // Arrays: a common width per array.
  const auto f32 = [](std::vector<float> v, TensorShape shape) { return *Tensor::FromVector<float>(v, shape); };
  const auto f64 = [](std::vector<double> v, TensorShape shape) { return *Tensor::FromVector<double>(v, shape); };
  CHECK(FormatTensorForLog(f32({1.0f, 2.5f, 3.0f}, {3})) == "[1.  2.5 3. ]");
  CHECK(FormatTensorForLog(f64({0.1, 1.0 / 3}, {2})) == "[0.1        0.33333333]");
  CHECK(FormatTensorForLog(f64({-1.5, 10.0}, {2})) == "[-1.5 10. ]");
  CHECK(FormatTensorForLog(f64({1e-9, 1.0}, {2})) == "[0. 1.]");  // suppress=True
  CHECK(FormatTensorForLog(f64({1e8, 2.5e9}, {2})) == "[1.0e+08 2.5e+09]");
  CHECK(FormatTensorForLog(f64({std::nan(""), -std::numeric_limits<double>::infinity()}, {2})) == "[ nan -inf]");
  CHECK(FormatTensorForLog(f64({1.5, std::nan("")}, {2})) == "[1.5 nan]");
  CHECK(FormatTensorForLog(*Tensor::FromVector<int64_t>({1, 10, -3}, {3})) == "[ 1 10 -3]");
  CHECK(FormatTensorForLog(*Tensor::FromVector<int32_t>({1, 2, 3, 4}, {2, 2})) == "[[1 2]\n [3 4]]");
  CHECK(FormatTensorForLog(*Tensor::FromVector<int32_t>({1, 2, 3, 4, 5, 6, 7, 8}, {2, 2, 2})) ==
        "[[[1 2]\n  [3 4]]\n\n [[5 6]\n  [7 8]]]");
  CHECK(FormatTensorForLog(*Tensor::FromVector<std::string>({"a", "bc"}, {2})) == "[b'a' b'bc']");
  CHECK(FormatTensorForLog(f32({83391432.0f, -100.0f}, {2})) == "[83391432.     -100.]");  // exact integer digits
  CHECK(FormatTensorForLog(f32({0.1f, 1.0f, 1e-4f}, {3})) == "[0.1    1.     0.0001]");
  CHECK(FormatTensorForLog(Tensor(DataType::kFloat, {0})) == "[]");
  // Lines wrap at 75 columns.
  std::vector<int64_t> thirty(30);
  for (std::size_t i = 0; i < thirty.size(); ++i) thirty[i] = static_cast<int64_t>(i);
  CHECK(FormatTensorForLog(*Tensor::FromVector<int64_t>(thirty, {30})) ==
        "[ 0  1  2  3  4  5  6  7  8  9 10 11 12 13 14 15 16 17 18 19 20 21 22 23\n 24 25 26 27 28 29]");
  std::vector<double> quarters(24);
  for (std::size_t i = 0; i < quarters.size(); ++i) quarters[i] = static_cast<double>(i) / 4;
  CHECK(FormatTensorForLog(f64(quarters, {2, 12})) ==
        "[[0.   0.25 0.5  0.75 1.   1.25 1.5  1.75 2.   2.25 2.5  2.75]\n"
        " [3.   3.25 3.5  3.75 4.   4.25 4.5  4.75 5.   5.25 5.5  5.75]]");
  // Over 1000 elements: three at each edge.
  std::vector<int64_t> big(2000);
  for (std::size_t i = 0; i < big.size(); ++i) big[i] = static_cast<int64_t>(i);
  CHECK(FormatTensorForLog(*Tensor::FromVector<int64_t>(big, {2000})) == "[   0    1    2 ... 1997 1998 1999]");
  CHECK(FormatTensorForLog(*Tensor::FromVector<int64_t>(big, {1000, 2})) ==
        "[[   0    1]\n [   2    3]\n [   4    5]\n ...\n [1994 1995]\n [1996 1997]\n [1998 1999]]");
}

// =====================================================================================
// NanTensorHook
// =====================================================================================

TEST_CASE("B119 NanTensorHook with fail_on_nan_loss fails the run with NanLossDuringTrainingError") {
  auto hook = MakeNanTensorHook("loss");
  HookDriver driver({hook});
  REQUIRE(driver.BeginAndCreate().ok());
  REQUIRE(driver.Run({"train_op"}).ok());
  driver.model().loss = std::nan("");
  CapturedLog log;
  StatusOr<TensorMap> out = driver.Run({"train_op"});
  CHECK(IsNanLossDuringTraining(out.status()));
  CHECK(absl::IsInternal(out.status()));
  CHECK(out.status().message() == "NaN loss during training.");
  CHECK(absl::StrContains(log.text(), "[error] Model diverged with loss = NaN."));
  CHECK_FALSE(driver.should_stop());  // an error, not a stop request
}

TEST_CASE("B119 NanTensorHook: Inf is not NaN") {
  auto hook = MakeNanTensorHook("loss_f32");
  HookDriver driver({hook});
  REQUIRE(driver.BeginAndCreate().ok());
  driver.model().loss = std::numeric_limits<double>::infinity();
  CapturedLog log;
  CHECK(driver.Run({"train_op"}).ok());
  CHECK_FALSE(driver.should_stop());
  CHECK(log.text().empty());
  driver.model().loss = std::nan("");  // float32 NaN is seen too
  CHECK(IsNanLossDuringTraining(driver.Run({"train_op"}).status()));
}

TEST_CASE("B119 NanTensorHook without fail_on_nan_loss warns and requests a clean stop") {
  auto hook = MakeNanTensorHook("loss", /*fail_on_nan_loss=*/false);
  HookDriver driver({hook});
  REQUIRE(driver.BeginAndCreate().ok());
  driver.model().loss = std::nan("");
  CapturedLog log;
  CHECK(driver.Run({"train_op"}).ok());
  CHECK(driver.should_stop());
  CHECK(absl::StrContains(log.text(), "[warning] Model diverged with loss = NaN."));
}

TEST_CASE("B119 NanTensorHook refuses a loss that is not one float") {
  auto hook = MakeNanTensorHook("loss_int");
  HookDriver driver({hook});
  REQUIRE(driver.BeginAndCreate().ok());
  StatusOr<TensorMap> out = driver.Run({"train_op"});
  CHECK(absl::IsInvalidArgument(out.status()));
  CHECK(absl::StrContains(out.status().message(), "\"loss_int\""));
  CHECK(absl::StrContains(out.status().message(), "int64[]"));
}

// =====================================================================================
// GlobalStepWaiterHook
// =====================================================================================

TEST_CASE("B120 GlobalStepWaiterHook with wait_until_step <= 0 starts at once") {
  ManualClock clock;
  auto hook = MakeGlobalStepWaiterHook(0, &clock);
  HookDriver driver({hook});
  REQUIRE(driver.BeginAndCreate().ok());
  CapturedLog log;
  CHECK(driver.Run({"train_op"}).ok());  // would block forever on the ManualClock otherwise
  CHECK_FALSE(absl::StrContains(log.text(), "Waiting"));
}

TEST_CASE("B120 GlobalStepWaiterHook polls on the clock until another worker reaches the step") {
  ManualClock clock;
  auto hook = MakeGlobalStepWaiterHook(5, &clock, absl::Milliseconds(500),
                                                     /*max_wait=*/absl::Hours(1));  // ends the thread on failure
  HookDriver driver({hook});
  REQUIRE(driver.BeginAndCreate().ok());
  SetStep(driver.session(), 2);
  CapturedLog log;
  SessionRunArgs original;
  SessionRunContext ctx(&original, &driver.session());
  Status result = absl::UnknownError("not returned");
  {
    Background worker([&] { result = hook->before_run(ctx).status(); });
    // Several polls below the step: the hook keeps waiting.
    CHECK(AdvanceWhileSleeping(clock, absl::Milliseconds(500),
                               [&] { return clock.MonotonicNow() >= absl::Seconds(2); }));
    CHECK_FALSE(worker.Done());
    SetStep(driver.session(), 4);  // the chief trains on
    CHECK(AdvanceWhileSleeping(clock, absl::Milliseconds(500),
                               [&] { return clock.MonotonicNow() >= absl::Seconds(4); }));
    CHECK_FALSE(worker.Done());
    SetStep(driver.session(), 5);
    CHECK(AdvanceWhileSleeping(clock, absl::Milliseconds(500), [&] { return worker.Done(); }));
    if (!worker.Done()) clock.Advance(absl::Hours(2));  // let the thread end
  }
  CHECK(result.ok());
  CHECK(absl::StrContains(log.text(), "Waiting for global step 5 before starting training."));
  // Only the first before_run waits: a later one returns at once.
  SetStep(driver.session(), 0);
  CHECK(driver.Run({"train_op"}).ok());
}

TEST_CASE("B120 GlobalStepWaiterHook logs its progress every 1000 steps") {
  ManualClock clock;
  auto hook = MakeGlobalStepWaiterHook(5000, &clock, absl::Milliseconds(500), absl::Hours(1));
  HookDriver driver({hook});
  REQUIRE(driver.BeginAndCreate().ok());
  SetStep(driver.session(), 1500);
  CapturedLog log;
  SessionRunArgs original;
  SessionRunContext ctx(&original, &driver.session());
  Status result = absl::UnknownError("not returned");
  {
    Background worker([&] { result = hook->before_run(ctx).status(); });
    REQUIRE(clock.BlockUntilWaiters(1, kRealTimeout));  // the first poll (1500) is done
    SetStep(driver.session(), 2000);                    // +500 since the logged 1500: no line
    CHECK(AdvanceWhileSleeping(clock, absl::Milliseconds(500),
                               [&] { return clock.MonotonicNow() >= absl::Seconds(2); }));
    SetStep(driver.session(), 2501);  // +1001: a line
    CHECK(AdvanceWhileSleeping(clock, absl::Milliseconds(500),
                               [&] { return absl::StrContains(log.text(), "Current step is 2501."); }));
    SetStep(driver.session(), 5000);
    CHECK(AdvanceWhileSleeping(clock, absl::Milliseconds(500), [&] { return worker.Done(); }));
    if (!worker.Done()) clock.Advance(absl::Hours(2));
  }
  CHECK(result.ok());
  const std::string text = log.text();
  CHECK(absl::StrContains(text, "Waiting for global step 5000 before starting training. Current step is 1500."));
  CHECK_FALSE(absl::StrContains(text, "Current step is 2000."));
  CHECK(absl::StrContains(text, "Current step is 2501."));
}

TEST_CASE("B120 GlobalStepWaiterHook max_wait bounds the wait with DEADLINE_EXCEEDED") {
  ManualClock clock;
  auto hook = MakeGlobalStepWaiterHook(5, &clock, absl::Milliseconds(500), absl::Seconds(2));
  HookDriver driver({hook});
  REQUIRE(driver.BeginAndCreate().ok());
  SessionRunArgs original;
  SessionRunContext ctx(&original, &driver.session());
  Status result = absl::UnknownError("not returned");
  {
    Background worker([&] { result = hook->before_run(ctx).status(); });
    CHECK(AdvanceWhileSleeping(clock, absl::Milliseconds(100), [&] { return worker.Done(); }));
  }
  CHECK(absl::IsDeadlineExceeded(result));
  CHECK(absl::StrContains(result.message(), "global_step is 0 after waiting 2s for step 5"));
  CHECK(clock.MonotonicNow() >= absl::Seconds(2));
}

TEST_CASE("B120 GlobalStepWaiterHook needs a global step") {
  auto hook = MakeGlobalStepWaiterHook(5);
  HookDriver driver({hook}, std::make_shared<Model>(), /*with_global_step=*/false);
  REQUIRE(driver.Begin().ok());
  Status s = driver.CreateSession();
  CHECK(absl::IsFailedPrecondition(s));
  CHECK(s.message() == "Global step should be created to use GlobalStepWaiterHook.");
}

// =====================================================================================
// FinalOpsHook, FeedFnHook
// =====================================================================================

TEST_CASE("B121 FinalOpsHook runs final_ops in end() with its feeds and keeps the values") {
  auto hook = MakeFinalOpsHook(std::vector<std::string>{"counter", "x2"},
                                             TensorMap{{"x", Tensor::Scalar<double>(3.0)}});
  HookDriver driver({hook});
  REQUIRE(driver.BeginAndCreate().ok());
  REQUIRE(driver.Run({"train_op"}).ok());
  CHECK(driver.model().reads == 0);  // nothing before end()
  CHECK(hook->final_ops_values().empty());
  REQUIRE(driver.End().ok());
  CHECK(driver.model().reads == 1);
  REQUIRE(hook->final_ops_values().size() == 2);
  CHECK(hook->final_ops_values().at("counter").scalar<int64_t>().value() == 1);
  CHECK(hook->final_ops_values().at("x2").scalar<double>().value() == 9.0);
}

TEST_CASE("B121 FinalOpsHook: OUT_OF_RANGE in end() is explained and returned") {
  auto hook = MakeFinalOpsHook(std::vector<std::string>{"counter"});
  HookDriver driver({hook});
  REQUIRE(driver.BeginAndCreate().ok());
  driver.model().status = absl::OutOfRangeError("End of sequence");
  CapturedLog log;
  Status s = driver.End();
  CHECK(absl::IsOutOfRange(s));
  CHECK(absl::StrContains(s.message(), "End of sequence"));
  CHECK(absl::StrContains(log.text(), "An OutOfRangeError or StopIteration exception is raised by the code in "
                                      "FinalOpsHook."));
  // Other errors are returned without the explanation.
  driver.model().status = absl::InternalError("boom");
  CapturedLog log2;
  CHECK(absl::IsInternal(driver.End()));
  CHECK_FALSE(absl::StrContains(log2.text(), "OutOfRangeError"));
}

TEST_CASE("B121 FinalOpsHook without final_ops runs nothing") {
  auto hook = MakeFinalOpsHook(std::vector<std::string>{});
  HookDriver driver({hook});
  REQUIRE(driver.BeginAndCreate().ok());
  driver.model().status = absl::InternalError("must not run");
  CHECK(driver.End().ok());
}

TEST_CASE("B122 FeedFnHook feeds feed_fn() on every run and fetches nothing") {
  double next = 1.0;
  auto hook = MakeFeedFnHook([&next] {
    TensorMap feeds{{"x", Tensor::Scalar<double>(next)}};
    next += 1.0;
    return feeds;
  });
  HookDriver driver({hook});
  REQUIRE(driver.BeginAndCreate().ok());
  SessionRunArgs original;
  SessionRunContext ctx(&original, &driver.session());
  StatusOr<SessionRunArgs> args = hook->before_run(ctx);
  REQUIRE(args.ok());
  CHECK(args->fetches.empty());  // B31: after_run then gets results == nullptr
  CHECK(args->feeds.at("x").scalar<double>().value() == 1.0);
  StatusOr<TensorMap> out = driver.Run({"x2"});
  REQUIRE(out.ok());
  CHECK(out->at("x2").scalar<double>().value() == 4.0);
  out = driver.Run({"x2"});
  REQUIRE(out.ok());
  CHECK(out->at("x2").scalar<double>().value() == 9.0);
}

TEST_CASE("B122 FeedFnHook: an exception from feed_fn becomes the run's status") {
  auto hook = MakeFeedFnHook([]() -> TensorMap { throw std::invalid_argument("no more data"); });
  HookDriver driver({hook});
  REQUIRE(driver.BeginAndCreate().ok());
  StatusOr<TensorMap> out = driver.Run({"train_op"});
  CHECK(absl::IsInvalidArgument(out.status()));
  CHECK(absl::StrContains(out.status().message(), "no more data"));
  CHECK(absl::StrContains(out.status().message(), "FeedFnHook"));
}

// =====================================================================================
// ProfilerHook
// =====================================================================================

TEST_CASE("B123 ChromeTraceJson is trace-event JSON with process and thread names") {
  RunMetadata md;
  md.step_stats.push_back({"step", "step", 1000, 500, 987654321987654321});
  md.step_stats.push_back({"for\"ward\n\\", "op", 1100, 200, 987654321987654321});
  md.step_stats.push_back({"backward", "op", 1300, 100, 42});
  const Json doc = JsonParser::Parse(ChromeTraceJson(md, 7));
  REQUIRE(doc.has("traceEvents"));
  const Json::Array& events = doc["traceEvents"].array();
  std::vector<const Json*> meta;
  std::vector<const Json*> spans;
  for (const Json& e : events) {
    REQUIRE(e["ph"].is_string());
    (e["ph"].string() == "M" ? meta : spans).push_back(&e);
  }
  REQUIRE(meta.size() == 3);  // the process and two threads
  CHECK((*meta[0])["name"].string() == "process_name");
  CHECK((*meta[0])["args"]["name"].string() == "Foreman step 7");
  CHECK((*meta[1])["name"].string() == "thread_name");
  CHECK((*meta[1])["tid"].number() == 0);
  CHECK((*meta[2])["tid"].number() == 1);
  REQUIRE(spans.size() == 3);
  const std::vector<std::string> names = {"step", "for\"ward\n\\", "backward"};
  const std::vector<double> tids = {0, 0, 1};  // renumbered by first appearance
  for (std::size_t i = 0; i < spans.size(); ++i) {
    const Json& e = *spans[i];
    CHECK(e["ph"].string() == "X");
    CHECK(e["name"].string() == names[i]);
    CHECK(e["ts"].number() == md.step_stats[i].start_us);
    CHECK(e["dur"].number() == md.step_stats[i].duration_us);
    CHECK(e["pid"].number() == 0);
    CHECK(e["tid"].number() == tids[i]);
    CHECK(e["cat"].string() == md.step_stats[i].category);
  }
  // No spans: still a valid file.
  CHECK(JsonParser::Parse(ChromeTraceJson(RunMetadata{}, 0))["traceEvents"].array().size() == 1);
}

TEST_CASE("B123 ProfilerHook never traces the first run, then writes timeline-<step>.json on schedule") {
  MemEnv env;
  ProfilerHook::Options opts;
  opts.save_steps = 2;
  opts.output_dir = "/logs/profile";
  opts.env = &env;
  auto hook = *ProfilerHook::Create(opts);
  auto recorder = std::make_shared<RecordingHook>();
  HookDriver driver({hook, recorder});
  REQUIRE(driver.BeginAndCreate().ok());
  CHECK(env.IsDirectory("/logs/profile").value_or(false));
  CapturedLog log;
  for (int i = 0; i < 6; ++i) REQUIRE(driver.Run({"train_op"}).ok());
  // Run 1 primes the timer with stale step 0; the predicted next step 2 is due
  // at run 2 (step 1 -> 2), then every 2 steps.
  CHECK(recorder->trace_levels ==
        std::vector<int>{RunOptions::kNoTrace, RunOptions::kFullTrace, RunOptions::kNoTrace, RunOptions::kFullTrace,
                         RunOptions::kNoTrace, RunOptions::kFullTrace});
  StatusOr<std::vector<std::string>> files = env.GetChildren("/logs/profile");
  REQUIRE(files.ok());
  CHECK(*files == std::vector<std::string>{"timeline-2.json", "timeline-4.json", "timeline-6.json"});
  CHECK(absl::StrContains(log.text(), "Saving timeline for 2 into '/logs/profile/timeline-2.json'."));

  StatusOr<std::string> text = env.ReadFileToString("/logs/profile/timeline-4.json");
  REQUIRE(text.ok());
  const Json doc = JsonParser::Parse(*text);
  std::set<std::string> names;
  for (const Json& e : doc["traceEvents"].array()) {
    if (e["ph"].string() == "X") {
      names.insert(e["name"].string());
      CHECK(e["dur"].number() >= 0);
    } else if (e["name"].string() == "process_name") {
      CHECK(e["args"]["name"].string() == "Foreman step 4");
    }
  }
  CHECK(names == std::set<std::string>{"step", "forward"});  // the session's span and the step's
}

TEST_CASE("B123 ProfilerHook with save_secs traces the first run due after the seconds") {
  MemEnv env;
  ManualClock clock;
  ProfilerHook::Options opts;
  opts.save_secs = 10.0;
  opts.output_dir = "/p";
  opts.env = &env;
  opts.clock = &clock;
  auto hook = *ProfilerHook::Create(opts);
  HookDriver driver({hook});
  REQUIRE(driver.BeginAndCreate().ok());
  REQUIRE(driver.Run({"train_op"}).ok());
  REQUIRE(driver.Run({"train_op"}).ok());
  CHECK(env.GetChildren("/p")->empty());
  clock.Advance(absl::Seconds(10));
  REQUIRE(driver.Run({"train_op"}).ok());  // 2 -> 3
  CHECK(driver.last_options().trace_level == RunOptions::kFullTrace);
  CHECK(*env.GetChildren("/p") == std::vector<std::string>{"timeline-3.json"});
}

TEST_CASE("B123 ProfilerHook options and global step") {
  ProfilerHook::Options opts;
  CHECK(absl::IsInvalidArgument(ProfilerHook::Create(opts).status()));
  opts.save_steps = 1;
  opts.save_secs = 1.0;
  CHECK(absl::IsInvalidArgument(ProfilerHook::Create(opts).status()));
  opts.save_secs.reset();
  MemEnv env;
  opts.env = &env;
  auto hook = *ProfilerHook::Create(opts);
  HookDriver driver({hook}, std::make_shared<Model>(), /*with_global_step=*/false);
  REQUIRE(driver.Begin().ok());
  const Status s = driver.CreateSession();
  CHECK(absl::IsFailedPrecondition(s));
  CHECK(s.message() == "Global step should be created to use ProfilerHook.");
}

TEST_CASE("B123 ProfilerHook returns the error of a timeline it cannot write") {
  MemEnv env;
  ProfilerHook::Options opts;
  opts.save_steps = 1;
  opts.output_dir = "/p";
  opts.env = &env;
  auto hook = *ProfilerHook::Create(opts);
  HookDriver driver({hook});
  REQUIRE(driver.BeginAndCreate().ok());
  REQUIRE(driver.Run({"train_op"}).ok());
  REQUIRE(env.DeleteDir("/p").ok());
  StatusOr<TensorMap> out = driver.Run({"train_op"});
  CHECK(absl::IsNotFound(out.status()));
  CHECK(absl::StrContains(out.status().message(), "timeline-2.json"));
}

}  // namespace
}  // namespace foreman
