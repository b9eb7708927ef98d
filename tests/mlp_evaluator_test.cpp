// The evaluator task's loop (RunMlpEvaluator, include/foreman/mlp_job.hpp;
// TF's run_evaluator over checkpoints_iterator) on a temporary directory:
// checkpoints of a short single-process MlpJob run are published into it one
// by one, and the loop, on a ManualClock (no test sleeps), evaluates each
// new one in order with the chief's values, only the newest of several,
// skips one deleted between its listing and its read, stops at the last
// step, times out with a bounded error naming the directory, stops on a
// StopRequest, and refuses checkpoints of another model.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "foreman/checkpoint.hpp"
#include "foreman/clock.hpp"
#include "foreman/env.hpp"
#include "foreman/mlp_job.hpp"
#include "foreman/monitored_session.hpp"
#include "foreman/stop.hpp"
#include "support/events.hpp"
#include "support/test_util.hpp"
#include "support/tiny_mnist.hpp"

namespace foreman {
namespace {

using testing::TempDir;

using testing::TinyData;

MlpJobSettings TinySettings(const std::string& dir) {
  MlpJobSettings s;
  s.checkpoint_dir = dir;
  s.data_dir = "tiny";
  s.hidden = "4";
  s.batch_size = 100;
  s.epochs = 2;
  s.threads = 1;
  s.seed = 5;
  s.device = "cpu";
  s.log_step_count_steps = 0;
  return s;
}

constexpr int64_t kPollMs = 100;
constexpr int64_t kTimeoutMs = 1000;

// The training run whose checkpoints the tests publish: 6 steps, a
// checkpoint every 2 (model.ckpt-2, -4, -6), the chief's evaluation at each
// of them in <dir>/eval. Trained once.
const std::string& TrainedDir() {
  static TempDir tmp("mlp_evaluator_train");  // removed at exit
  static const std::string dir = [] {
    MlpJobOptions o;
    o.settings = TinySettings(tmp.path());
    o.settings.max_steps = 6;
    o.settings.save_checkpoint_steps = 2;
    o.settings.eval_every_steps = 2;
    o.data = TinyData();
    auto job = MlpJob::Create(std::move(o));
    REQUIRE_MESSAGE(job.ok(), job.status().ToString());
    auto session = MonitoredTrainingSession((*job)->SessionOptions());
    REQUIRE_MESSAGE(session.ok(), session.status().ToString());
    REQUIRE((*job)->StartInput(**session).ok());
    while (!(*session)->should_stop()) {
      if (!(*session)->run({"train_op"}).ok()) break;
    }
    REQUIRE((*session)->close().ok());
    return tmp.path();
  }();
  return dir;
}

// Copies model.ckpt-<step> from the trained run into `dir` and makes it the
// latest (bundle first, then the state file, as Saver::Save commits).
void Publish(const std::string& dir, int64_t step) {
  std::filesystem::create_directories(dir);
  const std::string name = absl::StrCat("model.ckpt-", step);
  for (const char* suffix : {".index", ".data-00000-of-00001"}) {
    std::filesystem::copy_file(absl::StrCat(TrainedDir(), "/", name, suffix), absl::StrCat(dir, "/", name, suffix),
                               std::filesystem::copy_options::overwrite_existing);
  }
  CheckpointState state;
  state.model_checkpoint_path = name;
  REQUIRE(WriteCheckpointState(Env::Default(), dir, state).ok());
}

// The accuracy values the events of `dir` hold, by step, in order.
std::vector<std::pair<int64_t, float>> Accuracies(const std::string& dir) {
  std::vector<std::pair<int64_t, float>> out;
  for (const Event& e : testing::Events(dir)) {
    if (e.kind != Event::Kind::kSummary) continue;
    for (const SummaryValue& v : e.values) {
      if (v.tag == "accuracy") out.emplace_back(e.step, static_cast<float>(v.scalar));
    }
  }
  return out;
}

// RunMlpEvaluator on its own thread, on a ManualClock.
struct Evaluator {
  ManualClock clock;
  MlpEvaluatorOptions options;
  std::vector<std::string> warnings;  // written by the evaluator's thread, read after join
  StatusOr<MlpEvaluatorResult> result = absl::UnknownError("not run");
  std::atomic<bool> done{false};
  std::thread thread;

  explicit Evaluator(const std::string& dir, int64_t last_step = 6) {
    options.settings = TinySettings(dir);
    options.data = TinyData();
    options.last_step = last_step;
    options.poll_interval_ms = kPollMs;
    options.timeout_ms = kTimeoutMs;
    options.clock = &clock;
    options.on_warning = [this](const std::string& w) { warnings.push_back(w); };
  }
  void Start() {
    thread = std::thread([this] {
      result = RunMlpEvaluator(std::move(options));
      done.store(true);
    });
  }
  // Waits (bounded, real time) until the loop waits for a new checkpoint.
  void UntilWaiting() {
    REQUIRE_MESSAGE(clock.BlockUntilWaiters(1, absl::Seconds(60 * testing::TimeScale())),
                    "the evaluator did not come to wait for a checkpoint");
  }
  // One poll interval later.
  void NextPoll() { clock.Advance(absl::Milliseconds(kPollMs)); }
  void Join() {
    if (thread.joinable()) thread.join();
  }
  ~Evaluator() {
    // A failed REQUIRE: let a waiting loop time out, then join.
    for (int i = 0; i < 1000 && thread.joinable() && !done.load(); ++i) {
      clock.BlockUntilWaiters(1, absl::Seconds(5));
      clock.Advance(absl::Milliseconds(kPollMs));
    }
    Join();
  }
};

// Whether `done()` holds within `bound` of real time (checked every 5 ms).
template <class F>
bool WaitFor(F done, absl::Duration bound) {
  const absl::Time end = absl::Now() + bound;
  while (!done()) {
    if (absl::Now() >= end) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return true;
}

std::vector<int64_t> Steps(const MlpEvaluatorResult& r) {
  std::vector<int64_t> steps;
  for (const MlpJobEval& e : r.evals) steps.push_back(e.global_step);
  return steps;
}

TEST_CASE("the evaluator waits for the first checkpoint, evaluates each new one in order with the chief's values, "
          "and ends after the last step's") {
  TempDir tmp;
  const std::string dir = tmp / "run";
  TrainedDir();
  Evaluator ev(dir);
  ev.Start();
  ev.UntilWaiting();  // no directory yet: nothing to evaluate
  Publish(dir, 2);
  ev.NextPoll();
  ev.UntilWaiting();
  Publish(dir, 4);
  ev.NextPoll();
  ev.UntilWaiting();
  Publish(dir, 6);
  ev.NextPoll();
  ev.Join();
  REQUIRE_MESSAGE(ev.result.ok(), ev.result.status().ToString());
  CHECK(Steps(*ev.result) == std::vector<int64_t>{2, 4, 6});
  CHECK_FALSE(ev.result->stopped);
  CHECK(ev.result->skipped == 0);
  // Written into <dir>/eval at each checkpoint's global_step, with the
  // values the chief's own evaluation of the same weights wrote.
  const auto written = Accuracies(dir + "/eval");
  const auto chiefs = Accuracies(TrainedDir() + "/eval");
  REQUIRE(written.size() == 3);
  for (const auto& [step, accuracy] : written) {
    bool found = false;
    for (const auto& [chief_step, chief_accuracy] : chiefs) {
      if (chief_step != step) continue;
      found = true;
      CHECK(accuracy == doctest::Approx(chief_accuracy).epsilon(1e-6));
    }
    CHECK_MESSAGE(found, "the chief did not evaluate step ", step);
  }
  CHECK(written[0].first == 2);
  CHECK(written[2].first == 6);
  CHECK(testing::SummarySteps(testing::Events(dir + "/eval"), "loss") == std::vector<int64_t>{2, 4, 6});
  for (std::size_t i = 0; i < ev.result->evals.size(); ++i) {
    CHECK(ev.result->evals[i].accuracy == doctest::Approx(written[i].second).epsilon(1e-6));
  }
}

TEST_CASE("checkpoints_iterator's rule: of two checkpoints that came during one wait only the newest is evaluated") {
  TempDir tmp;
  const std::string dir = tmp / "run";
  TrainedDir();
  Publish(dir, 2);
  Evaluator ev(dir);
  ev.Start();
  ev.UntilWaiting();  // evaluated 2
  Publish(dir, 4);
  Publish(dir, 6);
  ev.NextPoll();
  ev.Join();
  REQUIRE_MESSAGE(ev.result.ok(), ev.result.status().ToString());
  CHECK(Steps(*ev.result) == std::vector<int64_t>{2, 6});
  CHECK(testing::SummarySteps(testing::Events(dir + "/eval"), "accuracy") == std::vector<int64_t>{2, 6});
}

// Deletes model.ckpt-4 from under the evaluator at the first open of its
// index after LatestCheckpoint's verification (the restore's): as a chief's
// max_to_keep deletes it between the listing and the read.
class VanishingEnv : public EnvWrapper {
 public:
  VanishingEnv(Env* base, std::string prefix) : EnvWrapper(base), prefix_(std::move(prefix)) {}
  StatusOr<std::unique_ptr<RandomAccessFile>> NewRandomAccessFile(const std::string& path) override {
    Vanish(path);
    return EnvWrapper::NewRandomAccessFile(path);
  }
  StatusOr<std::string> ReadFileToString(const std::string& path) override {
    Vanish(path);
    return EnvWrapper::ReadFileToString(path);
  }
  int index_opens() const { return index_opens_.load(); }

 private:
  void Vanish(const std::string& path) {
    if (path != prefix_ + ".index") return;
    // The first open is LatestCheckpoint's verification; the next the restore's.
    if (index_opens_.fetch_add(1) != 1) return;
    base()->DeleteFile(prefix_ + ".index").IgnoreError();
    base()->DeleteFile(prefix_ + ".data-00000-of-00001").IgnoreError();
  }
  const std::string prefix_;
  std::atomic<int> index_opens_{0};
};

TEST_CASE("a checkpoint deleted between its listing and its read is skipped with a warning, not fatal") {
  TempDir tmp;
  const std::string dir = tmp / "run";
  TrainedDir();
  VanishingEnv env(Env::Default(), dir + "/model.ckpt-4");
  Publish(dir, 2);
  Evaluator ev(dir);
  ev.options.env = &env;
  ev.Start();
  ev.UntilWaiting();  // evaluated 2
  Publish(dir, 4);
  ev.NextPoll();
  ev.UntilWaiting();  // 4 vanished: skipped; LatestCheckpoint falls back to 2, already evaluated
  Publish(dir, 6);
  ev.NextPoll();
  ev.Join();
  REQUIRE_MESSAGE(ev.result.ok(), ev.result.status().ToString());
  CHECK(env.index_opens() >= 2);
  CHECK(Steps(*ev.result) == std::vector<int64_t>{2, 6});
  CHECK(ev.result->skipped == 1);
  bool warned = false;
  for (const std::string& w : ev.warnings) {
    warned = warned || absl::StrContains(w, "model.ckpt-4 not found or not whole, skipping");
  }
  CHECK_MESSAGE(warned, "no warning about model.ckpt-4; warnings: ", ev.warnings.size());
}

TEST_CASE("no new checkpoint within the timeout is DEADLINE_EXCEEDED naming the directory and the wait") {
  TempDir tmp;
  const std::string dir = tmp / "run";
  TrainedDir();
  Publish(dir, 2);
  Evaluator ev(dir);
  ev.Start();
  // Poll after poll: still waiting one poll before the timeout, ended at it.
  for (int64_t polls = 0; polls < kTimeoutMs / kPollMs; ++polls) {
    ev.UntilWaiting();
    CHECK_FALSE(ev.done.load());
    ev.NextPoll();
  }
  REQUIRE_MESSAGE(WaitFor([&] { return ev.done.load(); }, absl::Seconds(60 * testing::TimeScale())),
                  "the evaluator did not end at its timeout");
  ev.Join();
  REQUIRE(absl::IsDeadlineExceeded(ev.result.status()));
  const std::string message(ev.result.status().message());
  CHECK_MESSAGE(absl::StrContains(message, absl::StrCat("no new checkpoint in ", dir, " within 1000 ms")), message);
  CHECK_MESSAGE(absl::StrContains(message, "model.ckpt-2"), message);
  // What it evaluated before the wait is written.
  CHECK(testing::SummarySteps(testing::Events(dir + "/eval"), "accuracy") == std::vector<int64_t>{2});
}

TEST_CASE("a stop request ends the wait at once: OK, stopped, nothing more evaluated") {
  TempDir tmp;
  const std::string dir = tmp / "run";
  TrainedDir();
  Publish(dir, 2);
  Evaluator ev(dir);
  StopRequestOptions stop_options;
  stop_options.clock = &ev.clock;
  auto stop = std::make_shared<StopRequest>(stop_options);
  ev.options.stop = stop;
  ev.Start();
  ev.UntilWaiting();
  stop->request_stop();
  // Joined without advancing the clock: the request itself woke the wait.
  ev.Join();
  stop->Complete();
  REQUIRE_MESSAGE(ev.result.ok(), ev.result.status().ToString());
  CHECK(ev.result->stopped);
  CHECK(Steps(*ev.result) == std::vector<int64_t>{2});
}

TEST_CASE("a checkpoint of another model is INVALID_ARGUMENT naming it; bad options are refused") {
  TempDir tmp;
  const std::string dir = tmp / "run";
  TrainedDir();
  Publish(dir, 2);
  Evaluator ev(dir);
  ev.options.settings.hidden = "5";
  ev.Start();
  ev.Join();
  REQUIRE(absl::IsInvalidArgument(ev.result.status()));
  CHECK_MESSAGE(absl::StrContains(ev.result.status().message(), "model.ckpt-2 does not fit the model"),
                ev.result.status().ToString());

  MlpEvaluatorOptions bad;
  bad.settings = TinySettings(dir);
  bad.timeout_ms = 0;
  auto refused = RunMlpEvaluator(std::move(bad));
  REQUIRE(absl::IsInvalidArgument(refused.status()));
  CHECK(absl::StrContains(refused.status().message(), "timeout must be > 0 ms, got 0"));
}

}  // namespace
}  // namespace foreman
