// `foreman train`: the main job. Trains an MLP on Fashion-MNIST under a
// MonitoredTrainingSession (checkpoints, summaries, step counting, recovery),
// with an input-pipeline actor prefetching batches, resume from the
// checkpoint directory, and graceful stop on SIGINT / SIGTERM.
//
// What a run leaves in --checkpoint-dir:
//   checkpoint, model.ckpt-<step>.{index,data-00000-of-00001}   TF V2 checkpoints
//   events.out.tfevents.*        loss, accuracy, learning_rate, histograms,
//                                global_step/sec, SessionLog START/CHECKPOINT
//   eval/events.out.tfevents.*   test-set loss and accuracy (TF Estimator's layout)
//   train_settings.txt           the settings of the run, for resuming it
//
// Resume: the data position (input_pipeline/epoch, input_pipeline/index) and
// the optimizer's slots are variables, so they are checkpointed with the
// weights; shuffling is a pure function of (seed, epoch). A run interrupted
// and resumed therefore ends with the same weights as an uninterrupted one
// (same seed and --threads).
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "command.hpp"
#include "foreman/checkpoint.hpp"
#include "foreman/dataset.hpp"
#include "foreman/env.hpp"
#include "foreman/graph.hpp"
#include "foreman/hooks.hpp"
#include "foreman/input_pipeline.hpp"
#include "foreman/monitored_session.hpp"
#include "foreman/nn.hpp"
#include "foreman/session.hpp"
#include "foreman/summary.hpp"
#include "foreman/variable_store.hpp"

namespace foreman::cli {
namespace {

constexpr char kSettingsFile[] = "train_settings.txt";
constexpr char kEpochVariable[] = "input_pipeline/epoch";
constexpr char kIndexVariable[] = "input_pipeline/index";
constexpr int kExitSecondSignal = 130;

// -- settings -----------------------------------------------------------------

struct TrainFlags {
  std::string checkpoint_dir = "foreman-train";
  std::string data_dir = data::kFashionMnistDir;
  std::optional<double> save_checkpoint_secs;
  std::optional<int64_t> save_checkpoint_steps;
  std::optional<int64_t> save_summaries_steps;
  std::optional<double> save_summaries_secs;
  int64_t log_step_count_steps = 100;
  double stop_grace_period_secs = 120;
  int64_t max_steps = 0;
  int64_t epochs = 10;
  int64_t batch_size = 128;
  std::optional<double> learning_rate;
  std::string optimizer = "adam";
  std::string hidden = "256";
  uint64_t seed = 0;
  int threads = 0;
  int64_t eval_every_steps = 500;
  int64_t prefetch_batches = 4;
};

// A run's stored settings: key = value lines. The model-defining ones must
// not change on resume; the others may (the new value is used and stored).
using Settings = std::map<std::string, std::string>;
const std::vector<std::string>& ModelDefiningKeys() {
  static const std::vector<std::string> keys = {"hidden", "optimizer", "seed"};
  return keys;
}

std::string SettingsPath(const std::string& dir) { return dir + "/" + kSettingsFile; }

StatusOr<std::optional<Settings>> ReadSettings(Env* env, const std::string& dir) {
  const std::string path = SettingsPath(dir);
  if (!env->FileExists(path).ok()) return std::optional<Settings>();
  FOREMAN_ASSIGN_OR_RETURN(std::string text, env->ReadFileToString(path));
  Settings settings;
  int line_number = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_number;
    line = absl::StripAsciiWhitespace(line);
    if (line.empty() || line[0] == '#') continue;
    std::vector<std::string> kv = absl::StrSplit(line, absl::MaxSplits('=', 1));
    if (kv.size() != 2) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ":", line_number, ": expected 'key = value', found '", line, "'"));
    }
    settings[std::string(absl::StripAsciiWhitespace(kv[0]))] = std::string(absl::StripAsciiWhitespace(kv[1]));
  }
  for (const std::string& key : ModelDefiningKeys()) {
    if (settings.count(key) == 0) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": missing '", key, "'"));
    }
  }
  return std::optional<Settings>(std::move(settings));
}

Status WriteSettings(Env* env, const std::string& dir, const Settings& settings) {
  std::string text =
      "# foreman train: the settings of the run in this directory (read when it resumes).\n"
      "# hidden, optimizer and seed define the model and its data order: they cannot change.\n";
  for (const auto& [key, value] : settings) absl::StrAppend(&text, key, " = ", value, "\n");
  // Written as the checkpoints are: a temporary file, synced, then renamed.
  const std::string path = SettingsPath(dir);
  const std::string tmp = path + ".tmp";
  FOREMAN_ASSIGN_OR_RETURN(auto file, env->NewWritableFile(tmp));
  FOREMAN_RETURN_IF_ERROR(file->Append(text));
  FOREMAN_RETURN_IF_ERROR(file->Sync());
  FOREMAN_RETURN_IF_ERROR(file->Close());
  FOREMAN_RETURN_IF_ERROR(env->RenameFile(tmp, path));
  return env->SyncDir(dir);
}

std::string FormatDouble(double v) { return absl::StrFormat("%.17g", v); }

// -- validated configuration ----------------------------------------------------

struct TrainConfig {
  TrainFlags flags;
  nn::MlpSpec spec;
  nn::OptimizerOptions optimizer;
  Settings settings;  // what is stored in the directory
};

StatusOr<std::vector<int64_t>> ParseHidden(const std::string& text) {
  std::vector<int64_t> dims;
  if (text.empty() || text == "none") return dims;
  for (absl::string_view part : absl::StrSplit(text, ',')) {
    int64_t d = 0;
    if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(part), &d) || d < 1 || d > (1 << 20)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--hidden: '", text, "' is not a comma-separated list of layer sizes in [1, 1048576] (or 'none')"));
    }
    dims.push_back(d);
  }
  return dims;
}

float DefaultLearningRate(nn::OptimizerKind kind) {
  switch (kind) {
    case nn::OptimizerKind::kSgd: return 0.1f;
    case nn::OptimizerKind::kMomentum: return 0.01f;
    case nn::OptimizerKind::kAdam: return 0.001f;
  }
  return 0.001f;
}

Status Usage(const std::string& message) { return absl::InvalidArgumentError(message); }

// Checks the flags on their own (INVALID_ARGUMENT naming the flag).
Status ValidateFlags(const TrainFlags& f) {
  if (f.checkpoint_dir.empty()) return Usage("--checkpoint-dir must not be empty");
  if (f.batch_size < 1) return Usage(absl::StrCat("--batch-size must be >= 1, got ", f.batch_size));
  if (f.epochs < 0) return Usage(absl::StrCat("--epochs must be >= 0 (0: no limit), got ", f.epochs));
  if (f.max_steps < 0) return Usage(absl::StrCat("--max-steps must be >= 0 (0: no limit), got ", f.max_steps));
  if (f.epochs == 0 && f.max_steps == 0) {
    return Usage("--epochs 0 and --max-steps 0 would train forever: set one of them");
  }
  if (f.learning_rate && !(*f.learning_rate > 0 && std::isfinite(*f.learning_rate))) {
    return Usage(absl::StrCat("--learning-rate must be a positive number, got ", *f.learning_rate));
  }
  if (f.threads < 0) return Usage(absl::StrCat("--threads must be >= 0 (0: one per CPU), got ", f.threads));
  if (f.eval_every_steps < 0) {
    return Usage(absl::StrCat("--eval-every-steps must be >= 0 (0: only at the end), got ", f.eval_every_steps));
  }
  if (f.log_step_count_steps < 0) {
    return Usage(absl::StrCat("--log-step-count-steps must be >= 0, got ", f.log_step_count_steps));
  }
  if (!(f.stop_grace_period_secs > 0)) {
    return Usage(absl::StrCat("--stop-grace-period-secs must be > 0, got ", f.stop_grace_period_secs));
  }
  if (f.prefetch_batches < 1 || f.prefetch_batches > 1024) {
    return Usage(absl::StrCat("--prefetch-batches must be in [1, 1024], got ", f.prefetch_batches));
  }
  return OkStatus();
}

// -- signals ----------------------------------------------------------------------

const char* SignalName(int sig) {
  switch (sig) {
    case SIGINT: return "SIGINT";
    case SIGTERM: return "SIGTERM";
    default: return "a signal";
  }
}

// SIGINT / SIGTERM are blocked in every thread and taken by one watcher
// thread with sigwait (no async-signal-safety concerns): the first asks
// training to stop at the next step boundary, a second exits at once (130),
// and a stop that takes longer than the grace period exits 1.
class SignalWatcher {
 public:
  // Must run before any other thread exists, so that they all inherit the mask.
  static void BlockSignals() {
    sigset_t set = Set();
    pthread_sigmask(SIG_BLOCK, &set, nullptr);
  }

  explicit SignalWatcher(double grace_secs) : grace_secs_(grace_secs) {
    thread_ = std::thread([this] { Watch(); });
  }
  ~SignalWatcher() {
    done_.store(true);
    pthread_kill(thread_.native_handle(), SIGUSR1);
    thread_.join();
  }
  bool stop_requested() const { return signal_.load() != 0; }
  int signal_number() const { return signal_.load(); }

 private:
  static sigset_t Set() {
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGUSR1);
    return set;
  }

  void Watch() {
    const sigset_t set = Set();
    int sig = 0;
    while (!done_.load()) {
      if (sigwait(&set, &sig) != 0 || done_.load()) return;
      if (sig == SIGUSR1) continue;
      signal_.store(sig);
      std::fprintf(stderr,
                   "\nforeman train: %s received: stopping at the next step boundary and saving a final "
                   "checkpoint (a second signal exits at once)\n",
                   SignalName(sig));
      std::fflush(stderr);
      break;
    }
    if (done_.load()) return;
    // Second phase: a second signal, or the grace period running out.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(grace_secs_);
    while (!done_.load()) {
      const auto left = deadline - std::chrono::steady_clock::now();
      if (left <= std::chrono::steady_clock::duration::zero()) {
        std::fprintf(stderr,
                     "foreman train: did not stop within --stop-grace-period-secs=%g; exiting without a final "
                     "checkpoint\n",
                     grace_secs_);
        std::fflush(stderr);
        _exit(kExitFailed);
      }
      const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(left).count();
      timespec ts{static_cast<time_t>(ns / 1000000000), static_cast<long>(ns % 1000000000)};
      sig = sigtimedwait(&set, nullptr, &ts);
      if (done_.load()) return;
      if (sig == SIGINT || sig == SIGTERM) {
        std::fprintf(stderr, "foreman train: second signal (%s): exiting now, without a final checkpoint\n",
                     SignalName(sig));
        std::fflush(stderr);
        _exit(kExitSecondSignal);
      }
    }
  }

  const double grace_secs_;
  std::atomic<bool> done_{false};
  std::atomic<int> signal_{0};
  std::thread thread_;
};

// Requests a stop after the run during which a signal arrived.
class SignalStopHook : public SessionRunHook {
 public:
  explicit SignalStopHook(const SignalWatcher* watcher) : watcher_(watcher) {}
  std::string name() const override { return "SignalStopHook"; }
  Status after_create_session(Session*, Coordinator* coord) override {
    if (watcher_->stop_requested()) coord->request_stop();
    return OkStatus();
  }
  Status after_run(SessionRunContext& ctx, const SessionRunValues&) override {
    if (watcher_->stop_requested()) ctx.request_stop();
    return OkStatus();
  }

 private:
  const SignalWatcher* watcher_;
};

// -- progress -----------------------------------------------------------------------

std::string FormatDuration(double secs) {
  if (!std::isfinite(secs) || secs < 0) return "?";
  const int64_t s = static_cast<int64_t>(secs + 0.5);
  if (s >= 3600) return absl::StrFormat("%dh%02dm", s / 3600, (s / 60) % 60);
  if (s >= 60) return absl::StrFormat("%dm%02ds", s / 60, s % 60);
  return absl::StrFormat("%ds", s);
}

// The last evaluation the step computed, for the progress output.
struct EvalRecord {
  std::mutex mu;
  int64_t step = -1;
  float accuracy = 0;
  float loss = 0;
  int64_t printed_step = -1;
};

// Shows step, steps/s, loss and ETA: a redrawn bar on a terminal, a plain
// line every `every_steps` otherwise. Reads "loss" and the (pre-run)
// "global_step" each run: both are computed by the step anyway.
class ProgressHook : public SessionRunHook {
 public:
  ProgressHook(int64_t total_steps, int64_t every_steps, bool tty, std::shared_ptr<EvalRecord> eval)
      : total_(total_steps), every_(std::max<int64_t>(every_steps, 1)), tty_(tty), eval_(std::move(eval)) {}
  std::string name() const override { return "ProgressHook"; }

  Status after_create_session(Session* session, Coordinator*) override {
    FOREMAN_ASSIGN_OR_RETURN(int64_t step, session->GlobalStep());
    if (!start_step_) start_step_ = step;
    step_ = step;
    start_ = std::chrono::steady_clock::now();
    rate_start_step_ = step;
    return OkStatus();
  }
  StatusOr<SessionRunArgs> before_run(SessionRunContext&) override {
    SessionRunArgs args;
    args.fetches = {"loss", "accuracy", kGlobalStepName};
    return args;
  }
  Status after_run(SessionRunContext&, const SessionRunValues& values) override {
    if (values.results == nullptr) return OkStatus();
    auto loss = values.results->find("loss");
    auto acc = values.results->find("accuracy");
    auto step = values.results->find(kGlobalStepName);
    if (loss == values.results->end() || step == values.results->end()) return OkStatus();
    step_ = step->second.data<int64_t>()[0] + 1;
    loss_ = loss->second.data<float>()[0];
    if (acc != values.results->end()) accuracy_ = acc->second.data<float>()[0];
    const auto now = std::chrono::steady_clock::now();
    const double elapsed = std::chrono::duration<double>(now - start_).count();
    if (elapsed > 0) rate_ = static_cast<double>(step_ - rate_start_step_) / elapsed;
    PrintEval();
    if (tty_) {
      if (now - last_draw_ >= std::chrono::milliseconds(100) || step_ == total_) {
        last_draw_ = now;
        Draw();
      }
    } else if (step_ % every_ == 0) {
      std::fprintf(stderr, "step %lld%s: loss %.4f, batch accuracy %.4f, %.1f steps/s, ETA %s\n",
                   static_cast<long long>(step_), TotalSuffix().c_str(), loss_, accuracy_, rate_, Eta().c_str());
    }
    return OkStatus();
  }
  Status end(Session*) override {
    PrintEval();
    if (tty_ && drew_) std::fprintf(stderr, "\n");
    return OkStatus();
  }

  int64_t steps_trained() const { return step_ - start_step_.value_or(step_); }
  double steps_per_sec() const { return rate_; }

 private:
  std::string TotalSuffix() const { return total_ > 0 ? absl::StrCat("/", total_) : ""; }
  std::string Eta() const {
    if (total_ <= 0 || rate_ <= 0) return "?";
    return FormatDuration(static_cast<double>(total_ - step_) / rate_);
  }
  void Draw() {
    constexpr int kWidth = 24;
    std::string bar;
    if (total_ > 0) {
      const int filled = static_cast<int>(kWidth * std::min<double>(1.0, static_cast<double>(step_) / total_));
      bar = absl::StrCat("[", std::string(filled, '#'), std::string(kWidth - filled, '.'), "] ");
    }
    std::fprintf(stderr, "\r\033[K%sstep %lld%s  %.1f steps/s  loss %.4f  ETA %s", bar.c_str(),
                 static_cast<long long>(step_), TotalSuffix().c_str(), rate_, loss_, Eta().c_str());
    std::fflush(stderr);
    drew_ = true;
  }
  void PrintEval() {
    std::lock_guard<std::mutex> lock(eval_->mu);
    if (eval_->step < 0 || eval_->step == eval_->printed_step) return;
    eval_->printed_step = eval_->step;
    std::fprintf(stderr, "%seval at step %lld: test accuracy %.4f, test loss %.4f\n", tty_ && drew_ ? "\r\033[K" : "",
                 static_cast<long long>(eval_->step), eval_->accuracy, eval_->loss);
  }

  const int64_t total_;
  const int64_t every_;
  const bool tty_;
  std::shared_ptr<EvalRecord> eval_;
  std::optional<int64_t> start_step_;
  int64_t step_ = 0;
  int64_t rate_start_step_ = 0;
  float loss_ = 0;
  float accuracy_ = 0;
  double rate_ = 0;
  bool drew_ = false;
  std::chrono::steady_clock::time_point start_;
  std::chrono::steady_clock::time_point last_draw_;
};

// -- the model ------------------------------------------------------------------------

// What the step function needs; lives as long as the graph.
struct Model {
  nn::MlpSpec spec;
  nn::OptimizerOptions optimizer;
  std::unique_ptr<nn::Mlp> mlp;
  std::unique_ptr<data::InputPipeline> pipeline;
  data::Batch test;  // the whole test set, in file order
  std::vector<std::string> histogram_variables;
  std::shared_ptr<EvalRecord> eval;
  absl::Duration batch_timeout = absl::Seconds(60);
};

StatusOr<int64_t> ReadInt64(const VariableStore& vars, const std::string& name) {
  FOREMAN_ASSIGN_OR_RETURN(const Tensor* t, vars.Get(name));
  return t->scalar<int64_t>();
}

Status WriteInt64(VariableStore& vars, const std::string& name, int64_t value) {
  FOREMAN_ASSIGN_OR_RETURN(Tensor * t, vars.Get(name));
  FOREMAN_RETURN_IF_ERROR(t->CheckType<int64_t>());
  t->data<int64_t>()[0] = value;
  return OkStatus();
}

// Fetches the step answers:
//   train_op          one batch: forward, backward, optimizer update, global_step += 1
//   loss, accuracy    of that batch, before the update (float32 scalars)
//   summaries         loss, accuracy, learning_rate, weight histograms
//   eval_accuracy, eval_loss, eval_summaries   the whole test set (no update)
// OUT_OF_RANGE (end of the last epoch) ends training cleanly.
Status Step(Model& m, StepContext& ctx) {
  VariableStore& vars = ctx.variables();
  if (ctx.requested("eval_accuracy") || ctx.requested("eval_loss") || ctx.requested("eval_summaries")) {
    auto span = ctx.Trace("evaluate");
    FOREMAN_ASSIGN_OR_RETURN(nn::StepResult r, m.mlp->Evaluate(vars, m.test.features, m.test.labels, ctx.device()));
    FOREMAN_ASSIGN_OR_RETURN(int64_t step, GetGlobalStep(vars));
    ctx.Set("eval_accuracy", Tensor::Scalar<float>(r.accuracy));
    ctx.Set("eval_loss", Tensor::Scalar<float>(r.loss));
    ctx.Set("eval_summaries", Tensor::Scalar<std::string>(MergeSummaries(
                                  {ScalarSummary("accuracy", r.accuracy), ScalarSummary("loss", r.loss)})));
    std::lock_guard<std::mutex> lock(m.eval->mu);
    m.eval->step = step;
    m.eval->accuracy = r.accuracy;
    m.eval->loss = r.loss;
  }
  std::vector<std::string> summaries;
  if (ctx.requested("train_op")) {
    FOREMAN_ASSIGN_OR_RETURN(int64_t epoch, ReadInt64(vars, kEpochVariable));
    FOREMAN_ASSIGN_OR_RETURN(int64_t index, ReadInt64(vars, kIndexVariable));
    data::Batch batch;
    {
      auto span = ctx.Trace("input");
      FOREMAN_ASSIGN_OR_RETURN(batch, m.pipeline->Next(data::DatasetPosition{epoch, index}, m.batch_timeout));
    }
    nn::StepResult r;
    {
      auto span = ctx.Trace("train");
      FOREMAN_ASSIGN_OR_RETURN(r, m.mlp->TrainStep(vars, batch.features, batch.labels, ctx.device()));
    }
    FOREMAN_RETURN_IF_ERROR(WriteInt64(vars, kEpochVariable, batch.next.epoch));
    FOREMAN_RETURN_IF_ERROR(WriteInt64(vars, kIndexVariable, batch.next.index));
    FOREMAN_RETURN_IF_ERROR(IncrementGlobalStep(vars).status());
    ctx.Set("train_op", Tensor::Scalar<int64_t>(1));
    ctx.Set("loss", Tensor::Scalar<float>(r.loss));
    ctx.Set("accuracy", Tensor::Scalar<float>(r.accuracy));
    summaries = {ScalarSummary("loss", r.loss), ScalarSummary("accuracy", r.accuracy)};
  }
  if (ctx.requested("summaries")) {
    summaries.push_back(ScalarSummary("learning_rate", m.optimizer.learning_rate));
    for (const std::string& name : m.histogram_variables) {
      FOREMAN_ASSIGN_OR_RETURN(const Tensor* t, static_cast<const VariableStore&>(vars).Get(name));
      FOREMAN_ASSIGN_OR_RETURN(std::string h, HistogramSummary(name, *t));
      summaries.push_back(std::move(h));
    }
    ctx.Set("summaries", Tensor::Scalar<std::string>(MergeSummaries(summaries)));
  }
  return OkStatus();
}

// -- the command ---------------------------------------------------------------------

struct Outcome {
  int exit_code = kExitOk;
};

int Fail(int code, const std::string& what, const Status& s) {
  std::fprintf(stderr, "foreman train: %s: %s\n", what.c_str(), std::string(s.message()).c_str());
  return code;
}

// Merges the flags with the directory's stored settings: flags not given on
// the command line take the stored values; a model-defining flag given with
// a different value is an error (exit 2).
Status MergeStoredSettings(const Settings& stored, const CLI::App& cmd, TrainFlags& f, const std::string& dir) {
  auto given = [&](const std::string& flag) { return cmd.count(flag) > 0; };
  auto get = [&](const std::string& key) -> std::optional<std::string> {
    auto it = stored.find(key);
    if (it == stored.end()) return std::nullopt;
    return it->second;
  };
  struct Fixed {
    const char* key;
    const char* flag;
    std::string* value;
  };
  std::string seed_text = std::to_string(f.seed);
  for (Fixed fixed : {Fixed{"hidden", "--hidden", &f.hidden}, Fixed{"optimizer", "--optimizer", &f.optimizer},
                      Fixed{"seed", "--seed", &seed_text}}) {
    const std::string stored_value = *get(fixed.key);
    if (given(fixed.flag) && *fixed.value != stored_value) {
      return absl::FailedPreconditionError(absl::StrCat(
          dir, " holds a run with ", fixed.flag, " ", stored_value, " (", SettingsPath(dir), "), not ", *fixed.value,
          ": use another --checkpoint-dir, or the same ", fixed.flag, " to resume it"));
    }
    *fixed.value = stored_value;
  }
  if (!absl::SimpleAtoi(seed_text, &f.seed)) {
    return absl::InvalidArgumentError(absl::StrCat(SettingsPath(dir), ": seed '", seed_text, "' is not a number"));
  }
  auto adopt_int = [&](const char* key, const char* flag, int64_t* value) -> Status {
    auto s = get(key);
    if (!s || given(flag)) return OkStatus();
    if (!absl::SimpleAtoi(*s, value)) {
      return absl::InvalidArgumentError(absl::StrCat(SettingsPath(dir), ": ", key, " '", *s, "' is not a number"));
    }
    return OkStatus();
  };
  FOREMAN_RETURN_IF_ERROR(adopt_int("batch_size", "--batch-size", &f.batch_size));
  FOREMAN_RETURN_IF_ERROR(adopt_int("epochs", "--epochs", &f.epochs));
  FOREMAN_RETURN_IF_ERROR(adopt_int("max_steps", "--max-steps", &f.max_steps));
  int64_t threads = f.threads;
  FOREMAN_RETURN_IF_ERROR(adopt_int("threads", "--threads", &threads));
  f.threads = static_cast<int>(threads);
  if (auto lr = get("learning_rate"); lr && !given("--learning-rate")) {
    double v = 0;
    if (!absl::SimpleAtod(*lr, &v)) {
      return absl::InvalidArgumentError(
          absl::StrCat(SettingsPath(dir), ": learning_rate '", *lr, "' is not a number"));
    }
    f.learning_rate = v;
  }
  return OkStatus();
}

int RunTrain(const CLI::App& cmd, TrainFlags f) {
  SignalWatcher::BlockSignals();
  Env* env = Env::Default();
  const std::string& dir = f.checkpoint_dir;

  // 1. Flags, and the directory's stored settings.
  if (Status s = ValidateFlags(f); !s.ok()) return Fail(kExitUsage, "bad flags", s);
  auto stored = ReadSettings(env, dir);
  if (!stored.ok()) return Fail(kExitUsage, "cannot resume", stored.status());
  if (stored->has_value()) {
    if (Status s = MergeStoredSettings(**stored, cmd, f, dir); !s.ok()) return Fail(kExitUsage, "cannot resume", s);
    if (Status s = ValidateFlags(f); !s.ok()) return Fail(kExitUsage, "bad stored settings", s);
  } else if (env->FileExists(dir + "/checkpoint").ok()) {
    return Fail(kExitUsage, "cannot resume",
                absl::FailedPreconditionError(absl::StrCat(
                    dir, " holds checkpoints that foreman train did not write (no ", kSettingsFile,
                    "): use another --checkpoint-dir")));
  }
  TrainConfig config;
  auto hidden = ParseHidden(f.hidden);
  if (!hidden.ok()) return Fail(kExitUsage, "bad flags", hidden.status());
  auto kind = nn::ParseOptimizerKind(f.optimizer);
  if (!kind.ok()) return Fail(kExitUsage, "bad flags", Usage(absl::StrCat("--optimizer: ", kind.status().message())));
  config.spec.hidden = *hidden;
  config.optimizer.kind = *kind;
  config.optimizer.learning_rate =
      f.learning_rate ? static_cast<float>(*f.learning_rate) : DefaultLearningRate(*kind);
  if (f.threads == 0) f.threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));

  MonitoredTrainingSessionOptions mts;
  mts.checkpoint_dir = dir;
  if (f.save_checkpoint_secs) mts.save_checkpoint_secs = *f.save_checkpoint_secs;
  if (f.save_checkpoint_steps) mts.save_checkpoint_steps = *f.save_checkpoint_steps;
  if (f.save_summaries_steps) mts.save_summaries_steps = *f.save_summaries_steps;
  if (f.save_summaries_secs) mts.save_summaries_secs = *f.save_summaries_secs;
  mts.log_step_count_steps = f.log_step_count_steps;
  mts.stop_grace_period_secs = f.stop_grace_period_secs;
  mts.config.intra_op_parallelism_threads = f.threads;
  if (auto plan = PlanMonitoredTrainingSession(mts); !plan.ok()) return Fail(kExitUsage, "bad flags", plan.status());

  // 2. The directory is ours (a second `foreman train` on it is refused).
  //    The lock is taken again by the session's checkpoint saver below.
  {
    auto lock = LockCheckpointDirectory(env, dir);
    if (!lock.ok()) return Fail(kExitUsage, "checkpoint directory in use", lock.status());
  }

  // 3. Data.
  auto mnist = data::LoadFashionMnist(env, f.data_dir);
  if (!mnist.ok()) return Fail(kExitUsage, "cannot load the data", mnist.status());
  data::DatasetOptions train_options;
  train_options.batch_size = f.batch_size;
  train_options.epochs = f.epochs;
  train_options.shuffle = true;
  train_options.seed = f.seed;
  const int64_t test_examples = mnist->test.labels.num_elements();
  auto train_set = data::Dataset::Create(std::move(mnist->train), train_options);
  if (!train_set.ok()) return Fail(kExitUsage, "bad training data", train_set.status());
  data::DatasetOptions test_options;
  test_options.shuffle = false;
  auto test_set = data::Dataset::Create(std::move(mnist->test), test_options);
  if (!test_set.ok()) return Fail(kExitUsage, "bad test data", test_set.status());
  config.spec.input_dim = (*train_set)->feature_dim();
  if ((*test_set)->feature_dim() != config.spec.input_dim) {
    return Fail(kExitUsage, "bad data",
                absl::InvalidArgumentError(absl::StrCat("training images have ", config.spec.input_dim,
                                                        " pixels, test images ", (*test_set)->feature_dim())));
  }

  // 4. The model.
  auto model = std::make_shared<Model>();
  model->spec = config.spec;
  model->optimizer = config.optimizer;
  model->eval = std::make_shared<EvalRecord>();
  auto mlp = nn::Mlp::Create(config.spec, config.optimizer);
  if (!mlp.ok()) return Fail(kExitUsage, "bad model", mlp.status());
  model->mlp = std::move(*mlp);
  auto test = (*test_set)->Slice(0, test_examples);
  if (!test.ok()) return Fail(kExitFailed, "test data", test.status());
  model->test = std::move(*test);
  data::InputPipelineOptions pipeline_options;
  pipeline_options.prefetch_batches = static_cast<int>(f.prefetch_batches);
  auto pipeline = data::InputPipeline::Create(*train_set, pipeline_options);
  if (!pipeline.ok()) return Fail(kExitFailed, "input pipeline", pipeline.status());
  model->pipeline = std::move(*pipeline);
  for (const std::string& name : nn::MlpVariableNames(config.spec, config.optimizer)) {
    if (absl::EndsWith(name, "/kernel") || absl::EndsWith(name, "/bias")) model->histogram_variables.push_back(name);
  }

  auto graph = std::make_shared<Graph>();
  Status built = graph->CreateGlobalStep();
  if (built.ok()) built = nn::AddMlpVariables(*graph, config.spec, config.optimizer, f.seed);
  if (built.ok()) built = graph->AddVariable(kEpochVariable, Tensor::Scalar<int64_t>(0), /*trainable=*/false);
  if (built.ok()) built = graph->AddVariable(kIndexVariable, Tensor::Scalar<int64_t>(0), /*trainable=*/false);
  if (built.ok()) built = graph->AddSummaryOp("summaries");
  if (built.ok()) built = graph->SetStep([model](StepContext& ctx) { return Step(*model, ctx); });
  if (!built.ok()) return Fail(kExitFailed, "building the model", built);

  // 5. Hooks. The signal watcher starts only now: the threads above (the
  //    pipeline's) and below inherit the blocked mask either way.
  SignalWatcher watcher(f.stop_grace_period_secs);
  const int64_t steps_by_epochs = f.epochs > 0 ? f.epochs * (*train_set)->batches_per_epoch() : 0;
  int64_t total_steps = steps_by_epochs;
  if (f.max_steps > 0) total_steps = total_steps > 0 ? std::min(total_steps, f.max_steps) : f.max_steps;
  const bool tty = isatty(STDERR_FILENO) != 0;
  auto progress = std::make_shared<ProgressHook>(total_steps, f.log_step_count_steps > 0 ? f.log_step_count_steps : 100,
                                                 tty, model->eval);
  auto final_eval = std::make_shared<FinalOpsHook>(std::vector<std::string>{"eval_accuracy", "eval_loss"});
  mts.hooks = {std::make_shared<SignalStopHook>(&watcher), std::make_shared<NanTensorHook>("loss"), progress};
  if (f.max_steps > 0) {
    auto stop = StopAtStepHook::Create(std::nullopt, f.max_steps);
    if (!stop.ok()) return Fail(kExitUsage, "bad flags", stop.status());
    mts.hooks.push_back(*stop);
  }
  if (f.eval_every_steps > 0) {
    SummarySaverHookOptions eval_options;
    eval_options.save_steps = f.eval_every_steps;
    eval_options.output_dir = dir + "/eval";
    eval_options.summary_op = {"eval_summaries"};
    auto eval_hook = SummarySaverHook::Create(eval_options);
    if (!eval_hook.ok()) return Fail(kExitUsage, "bad flags", eval_hook.status());
    mts.hooks.push_back(*eval_hook);
  }
  mts.hooks.push_back(final_eval);
  mts.graph = graph;

  // 6. The settings go into the directory before the first checkpoint.
  {
    Settings& s = config.settings;
    s["hidden"] = config.spec.hidden.empty() ? "none" : absl::StrJoin(config.spec.hidden, ",");
    s["optimizer"] = nn::OptimizerKindName(config.optimizer.kind);
    s["seed"] = std::to_string(f.seed);
    s["batch_size"] = std::to_string(f.batch_size);
    s["epochs"] = std::to_string(f.epochs);
    s["max_steps"] = std::to_string(f.max_steps);
    s["threads"] = std::to_string(f.threads);
    s["learning_rate"] = FormatDouble(config.optimizer.learning_rate);
    Status made = env->RecursivelyCreateDir(dir);
    if (made.ok()) made = WriteSettings(env, dir, s);
    if (!made.ok()) return Fail(kExitUsage, "cannot write to the checkpoint directory", made);
  }

  std::fprintf(stderr,
               "foreman train: MLP 784-%s-10, %s (learning rate %g), batch %lld, %s, seed %llu, %d threads; "
               "checkpoints in %s\n",
               config.settings["hidden"].c_str(), config.settings["optimizer"].c_str(),
               config.optimizer.learning_rate, static_cast<long long>(f.batch_size),
               total_steps > 0 ? absl::StrCat(total_steps, " steps").c_str() : "until stopped",
               static_cast<unsigned long long>(f.seed), f.threads, dir.c_str());

  // 7. Train.
  const auto started = std::chrono::steady_clock::now();
  auto session = MonitoredTrainingSession(std::move(mts));
  if (!session.ok()) {
    const auto code = session.status().code();
    const bool bad_input = code == absl::StatusCode::kInvalidArgument || code == absl::StatusCode::kNotFound ||
                           code == absl::StatusCode::kFailedPrecondition;
    return Fail(bad_input ? kExitUsage : kExitFailed, "cannot start training", session.status());
  }
  const std::vector<std::string> fetches = {"train_op"};
  while (!(*session)->should_stop()) {
    if (!(*session)->run(fetches).ok()) break;  // close() returns the error
  }
  const Status closed = (*session)->close();
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  if (!closed.ok()) return Fail(kExitFailed, "training failed", closed);

  // 8. Report.
  auto latest = LatestCheckpoint(env, dir);
  const std::string latest_text = latest.ok() && latest->has_value() ? **latest : "(none)";
  const TensorMap& final_values = final_eval->final_ops_values();
  auto acc = final_values.find("eval_accuracy");
  auto loss = final_values.find("eval_loss");
  if (acc != final_values.end() && loss != final_values.end()) {
    std::printf("test accuracy: %.4f (test loss %.4f, %lld examples)\n", acc->second.data<float>()[0],
                loss->second.data<float>()[0], static_cast<long long>(test_examples));
  }
  if (progress->steps_trained() > 0) {
    std::printf("trained %lld steps in %.1f s (%.1f steps/s, %.0f examples/s)\n",
                static_cast<long long>(progress->steps_trained()), wall, progress->steps_per_sec(),
                progress->steps_per_sec() * static_cast<double>(f.batch_size));
  } else {
    std::printf("nothing to train: the restored run already reached its end (--max-steps %lld, --epochs %lld)\n",
                static_cast<long long>(f.max_steps), static_cast<long long>(f.epochs));
  }
  std::printf("checkpoints: %s (latest: %s)\n", dir.c_str(), latest_text.c_str());
  std::printf("events: %s (training), %s/eval (test set)\n", dir.c_str(), dir.c_str());
  if (watcher.stop_requested()) {
    std::printf("stopped by %s after its final checkpoint\n", SignalName(watcher.signal_number()));
  }
  std::fflush(stdout);
  return kExitOk;
}

}  // namespace

void AddTrainCommand(CLI::App& app, int* exit_code) {
  auto flags = std::make_shared<TrainFlags>();
  CLI::App* cmd = app.add_subcommand(
      "train",
      "Train an MLP on Fashion-MNIST under a MonitoredTrainingSession: checkpoints, TensorBoard summaries, "
      "resume from --checkpoint-dir, graceful stop on SIGINT/SIGTERM.\n"
      "Exit codes: 0 done (or stopped by a signal after the final checkpoint), 1 training failed, "
      "2 bad flags/data or an incompatible or busy --checkpoint-dir, 130 a second signal.");
  TrainFlags& f = *flags;
  // MonitoredTrainingSession's arguments (TF's names and defaults).
  cmd->add_option("--checkpoint-dir", f.checkpoint_dir, "Checkpoints, events and the run's settings")
      ->capture_default_str();
  cmd->add_option("--save-checkpoint-secs", f.save_checkpoint_secs,
                  "Save every N seconds (TF default 600 when neither this nor --save-checkpoint-steps is set)");
  cmd->add_option("--save-checkpoint-steps", f.save_checkpoint_steps, "Save every N global steps");
  cmd->add_option("--save-summaries-steps", f.save_summaries_steps,
                  "Write summaries every N global steps (TF default 100)");
  cmd->add_option("--save-summaries-secs", f.save_summaries_secs, "Write summaries every N seconds");
  cmd->add_option("--log-step-count-steps", f.log_step_count_steps,
                  "global_step/sec every N steps; also the interval of plain progress lines (0: no step counter)")
      ->capture_default_str();
  cmd->add_option("--stop-grace-period-secs", f.stop_grace_period_secs,
                  "After a signal, how long the final checkpoint may take")
      ->capture_default_str();
  // The job's own.
  cmd->add_option("--max-steps", f.max_steps, "Stop at this global_step (0: no limit)")->capture_default_str();
  cmd->add_option("--epochs", f.epochs, "Passes over the training data (0: no limit)")->capture_default_str();
  cmd->add_option("--batch-size", f.batch_size, "Examples per step")->capture_default_str();
  cmd->add_option("--learning-rate", f.learning_rate,
                  "Default: 0.001 for adam, 0.01 for momentum (0.9), 0.1 for sgd");
  cmd->add_option("--optimizer", f.optimizer, "sgd | momentum | adam")->capture_default_str();
  cmd->add_option("--hidden", f.hidden, "Hidden layer sizes, comma-separated ('none': softmax regression)")
      ->capture_default_str();
  cmd->add_option("--seed", f.seed, "Initial weights and data order")->capture_default_str();
  cmd->add_option("--threads", f.threads, "Intra-op threads (0: one per CPU)")->capture_default_str();
  cmd->add_option("--data-dir", f.data_dir, "Fashion-MNIST's gzip IDX files (Debian: dataset-fashion-mnist)")
      ->capture_default_str();
  cmd->add_option("--eval-every-steps", f.eval_every_steps,
                  "Test-set accuracy every N global steps into <checkpoint-dir>/eval (0: only at the end)")
      ->capture_default_str();
  cmd->add_option("--prefetch-batches", f.prefetch_batches, "Batches the input pipeline prepares ahead")
      ->capture_default_str();
  cmd->callback([cmd, flags, exit_code] { *exit_code = RunTrain(*cmd, *flags); });
}

}  // namespace foreman::cli
