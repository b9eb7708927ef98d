// `foreman train`: the main job. Trains an MLP on Fashion-MNIST under a
// MonitoredTrainingSession (checkpoints, summaries, step counting, recovery),
// with an input-pipeline actor prefetching batches, resume from the
// checkpoint directory, and graceful stop on SIGINT / SIGTERM / SIGHUP.
// docs/train.md is the user's guide; train_settings.{hpp,cpp} hold the flags
// and the settings file.
//
// What a run leaves in --checkpoint-dir:
//   checkpoint, model.ckpt-<step>.{index,data-00000-of-00001}   TF V2 checkpoints
//   events.out.tfevents.*        loss, accuracy, learning_rate, histograms,
//                                global_step/sec, SessionLog START/CHECKPOINT
//   eval/events.out.tfevents.*   test-set loss and accuracy (TF Estimator's layout)
//   train_settings.txt           the settings of the run, for resuming it
//   train.log                    the log
//   fault_record.json            with --fault-plan: the injected faults that fired
//
// Resume: the data position (input_pipeline/epoch, input_pipeline/index) and
// the optimizer's slots are variables, so they are checkpointed with the
// weights; shuffling is a pure function of (seed, epoch). A run interrupted
// and resumed therefore ends with the same weights as an uninterrupted one
// (same seed, --threads and --device; docs/train.md "Devices").
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
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
#include "cluster_task.hpp"
#include "command.hpp"
#include "train_settings.hpp"
#include "foreman/bundle.hpp"
#include "foreman/checkpoint.hpp"
#include "foreman/compute.hpp"
#include "foreman/cuda.hpp"
#include "foreman/dataset.hpp"
#include "foreman/env.hpp"
#include "foreman/event_writer.hpp"
#include "foreman/fault.hpp"
#include "foreman/graph.hpp"
#include "foreman/hooks.hpp"
#include "foreman/input_pipeline.hpp"
#include "foreman/logging.hpp"
#include "foreman/monitored_session.hpp"
#include "foreman/nn.hpp"
#include "foreman/server.hpp"
#include "foreman/session.hpp"
#include "foreman/stop.hpp"
#include "foreman/summary.hpp"
#include "foreman/variable_store.hpp"

namespace foreman::cli {
namespace {

constexpr char kEpochVariable[] = "input_pipeline/epoch";
constexpr char kIndexVariable[] = "input_pipeline/index";
constexpr int kExitSecondSignal = 130;

// -- signals ----------------------------------------------------------------------

const char* SignalName(int sig) {
  switch (sig) {
    case SIGINT: return "SIGINT";
    case SIGTERM: return "SIGTERM";
    case SIGHUP: return "SIGHUP";
    default: return "a signal";
  }
}

// -- a refused start leaves nothing behind -------------------------------------------

// Where the job is (preparing, or training), for the messages after a signal
// and after the grace period, and what a start refused before training must
// remove. LockCheckpointDirectory creates the directory (and missing
// ancestors) and <dir>/.foreman.lock; a refused start (bad flags or data, an
// incompatible directory, a signal while the data loads) removes what this
// process created, while it still holds the lock: the lock file when it did
// not exist before, then the directories it created, deepest first, each
// only if empty. A busy directory is refused before anything is created.
// Shared by the main thread, the signal watcher and the StopRequest's
// watchdog; thread-safe.
class RunPhase {
 public:
  // Before the lock is taken: what does not exist yet.
  void RecordBeforeLock(Env* env, const std::string& dir) {
    std::lock_guard<std::mutex> lock(mu_);
    env_ = env;
    dir_ = dir;
    const std::string lock_file = dir + "/" + kLockFile;
    lock_file_ = env->FileExists(lock_file).ok() ? "" : lock_file;
    created_dirs_.clear();
    for (std::string p = dir; !p.empty() && !env->FileExists(p).ok();) {
      created_dirs_.push_back(p);  // deepest first
      std::string parent = Dirname(p);
      if (parent == p) break;
      p = std::move(parent);
    }
  }

  // The lock is this process's: the lock file may be removed on a refusal.
  void Locked() {
    std::lock_guard<std::mutex> lock(mu_);
    locked_ = true;
  }

  // The main thread, once nothing can refuse the start any more: true when
  // training starts; false when a signal came first (the job then ends).
  // Under the same mutex as the signal's message, so that the message says
  // what the job will do.
  bool StartTraining(const StopRequest& stop) {
    std::lock_guard<std::mutex> lock(mu_);
    if (stop.stop_requested() || undone_) return false;
    training_ = true;
    return true;
  }

  // Runs `f(training)` under the mutex (the first signal's message and stop).
  template <class F>
  void WithPhase(F&& f) {
    std::lock_guard<std::mutex> lock(mu_);
    f(training_);
  }

  bool training() {
    std::lock_guard<std::mutex> lock(mu_);
    return training_;
  }

  // A ps task ("ps task 0") serves and never trains: a signal's message
  // says what it does instead.
  void ServeAsPs(std::string who) {
    std::lock_guard<std::mutex> lock(mu_);
    ps_task_ = std::move(who);
  }
  std::string ps_task() {
    std::lock_guard<std::mutex> lock(mu_);
    return ps_task_;
  }

  std::string dir() {
    std::lock_guard<std::mutex> lock(mu_);
    return dir_;
  }

  // Removes what this process created; nothing once training started. The
  // caller holds the directory's lock. Idempotent.
  void Undo() {
    std::lock_guard<std::mutex> lock(mu_);
    if (training_ || undone_ || env_ == nullptr) return;
    undone_ = true;
    if (locked_ && !lock_file_.empty()) env_->DeleteFile(lock_file_).IgnoreError();
    for (const std::string& d : created_dirs_) {
      if (!env_->DeleteDir(d).ok()) break;  // not empty (not only ours), or gone
    }
  }

  // LockCheckpointDirectory's lock file (checkpoint.hpp).
  static constexpr char kLockFile[] = ".foreman.lock";

 private:
  std::mutex mu_;
  Env* env_ = nullptr;
  std::string dir_;
  bool locked_ = false;
  bool training_ = false;
  bool undone_ = false;
  std::string lock_file_;                  // empty: it existed before
  std::vector<std::string> created_dirs_;  // deepest first
  std::string ps_task_;                    // ServeAsPs: "ps task K"
};

// SIGINT, SIGTERM and SIGHUP are blocked in every thread and taken by one
// watcher thread with sigwait (so no async-signal-safety concerns). The first
// goes to the run's StopRequest, which the session obeys at the next step
// boundary (or, before the session exists, RunTrain sees at its next check);
// the StopRequest also enforces --stop-grace-period-secs (see
// GraceExpired). A second signal exits at once (130).
class SignalWatcher {
 public:
  // Before any other thread exists, so that they all inherit the mask.
  static void BlockSignals() {
    sigset_t set = Set();
    pthread_sigmask(SIG_BLOCK, &set, nullptr);
  }

  SignalWatcher(std::shared_ptr<StopRequest> stop, std::shared_ptr<RunPhase> phase)
      : stop_(std::move(stop)), phase_(std::move(phase)) {
    thread_ = std::thread([this] { Watch(); });
  }
  ~SignalWatcher() {
    done_.store(true);
    pthread_kill(thread_.native_handle(), SIGUSR1);
    thread_.join();
  }
  SignalWatcher(const SignalWatcher&) = delete;
  SignalWatcher& operator=(const SignalWatcher&) = delete;

  bool signalled() const { return signal_.load() != 0; }
  int signal_number() const { return signal_.load(); }

 private:
  static sigset_t Set() {
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGHUP);
    sigaddset(&set, SIGUSR1);  // wakes the watcher (the destructor)
    return set;
  }

  void Watch() {
    const sigset_t set = Set();
    int sig = 0;
    bool first = true;
    while (!done_.load()) {
      if (sigwait(&set, &sig) != 0 || done_.load()) return;
      if (sig == SIGUSR1) continue;
      if (first) {
        first = false;
        signal_.store(sig);
        if (const std::string ps = phase_->ps_task(); !ps.empty()) {
          std::fprintf(stderr,
                       "\nforeman train: %s received: %s stops serving now and exits 1; its variables are lost "
                       "(the chief restores them from its latest checkpoint when a ps task serves this address "
                       "again) and the workers' steps fail until then (a second signal exits at once)\n",
                       SignalName(sig), ps.c_str());
          std::fflush(stderr);
          stop_->request_stop();
          continue;
        }
        phase_->WithPhase([&](bool training) {
          if (training) {
            std::fprintf(stderr,
                         "\nforeman train: %s received: stopping at the next step boundary and saving a final "
                         "checkpoint (a second signal exits at once)\n",
                         SignalName(sig));
          } else {
            // No session yet: there is no checkpoint to save.
            std::fprintf(stderr,
                         "\nforeman train: %s received before training started: stopping without training "
                         "(a second signal exits at once)\n",
                         SignalName(sig));
          }
          std::fflush(stderr);
          stop_->request_stop();
        });
        continue;
      }
      if (!phase_->training()) phase_->Undo();  // the main thread holds the lock
      std::fprintf(stderr, "foreman train: second signal (%s): exiting now, %s\n", SignalName(sig),
                   !phase_->ps_task().empty() ? "a ps task"
                   : !phase_->training()      ? "before training started"
                   : stop_->completed() ? "after the final checkpoint"
                                        : "without a final checkpoint");
      std::fflush(stderr);
      _exit(kExitSecondSignal);
    }
  }

  const std::shared_ptr<StopRequest> stop_;
  const std::shared_ptr<RunPhase> phase_;
  std::atomic<bool> done_{false};
  std::atomic<int> signal_{0};
  std::thread thread_;
};

// The run's stop grace period ran out before the final checkpoint was saved
// (on the StopRequest's watchdog thread): a process cannot interrupt a save
// stuck in the file system, so it exits; the checkpoints saved before are
// intact (the commit protocol never leaves a half-written one listed).
// Before training started (the data still loading, say) there is no
// checkpoint: the job removes what it created and says so.
void GraceExpired(absl::Duration grace, RunPhase& phase) {
  if (!phase.training()) {
    phase.Undo();  // the main thread holds the lock
    std::fprintf(stderr,
                 "foreman train: training had not started within --stop-grace-period-secs=%g of the signal "
                 "(still loading the data or building the model); exiting without training, nothing written to "
                 "%s\n",
                 absl::ToDoubleSeconds(grace), phase.dir().c_str());
    std::fflush(stderr);
    _exit(kExitFailed);
  }
  std::fprintf(stderr,
               "foreman train: the final checkpoint was not saved within --stop-grace-period-secs=%g; "
               "exiting (the checkpoints saved before are intact)\n",
               absl::ToDoubleSeconds(grace));
  std::fflush(stderr);
  _exit(kExitFailed);
}

// A test-only pause where `foreman train` used to release the directory lock
// before the session took it again: with FOREMAN_TEST_PAUSE_BEFORE_SESSION=P
// the job creates P.paused and waits (at most 60 s) until P is removed, so a
// test can try to take the lock from another process at that moment.
void TestPauseBeforeSession() {
  const char* path = std::getenv("FOREMAN_TEST_PAUSE_BEFORE_SESSION");
  if (path == nullptr || *path == '\0') return;
  const std::string paused = absl::StrCat(path, ".paused");
  if (FILE* f = std::fopen(paused.c_str(), "w")) std::fclose(f);
  for (int i = 0; i < 1200 && access(path, F_OK) == 0; ++i) usleep(50 * 1000);
}

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
    return absl::OkStatus();
  }
  StatusOr<SessionRunArgs> before_run(SessionRunContext&) override {
    SessionRunArgs args;
    args.fetches = {"loss", "accuracy", kGlobalStepName};
    return args;
  }
  Status after_run(SessionRunContext&, const SessionRunValues& values) override {
    if (values.results == nullptr) return absl::OkStatus();
    auto loss = values.results->find("loss");
    auto acc = values.results->find("accuracy");
    auto step = values.results->find(kGlobalStepName);
    if (loss == values.results->end() || step == values.results->end()) return absl::OkStatus();
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
    return absl::OkStatus();
  }
  Status end(Session*) override {
    PrintEval();
    if (tty_ && drew_) std::fprintf(stderr, "\n");
    return absl::OkStatus();
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

// The test-set evaluation, into <checkpoint-dir>/eval (TF Estimator's
// layout): every `every_steps` global steps, at the multiples (500, 1000,
// ...), and once more at the end, at the final global_step, unless that step
// was just evaluated; the end's values are the run's reported test accuracy.
// The step function evaluates after the run's update, so a run whose
// pre-run global_step is N-1 yields the evaluation at N. (TF's
// SummarySaverHook fires on the first run, whose post-update step is 1, and
// every N steps from there: 1, 501, ...; and it writes nothing at the end.)
// A run that trained nothing (a finished run started again) reports but
// writes no second event at a step already evaluated. The event file is
// created at the first evaluation.
class EvalHook : public SessionRunHook {
 public:
  EvalHook(std::string output_dir, int64_t every_steps, Env* env)
      : output_dir_(std::move(output_dir)), every_(every_steps), env_(env) {}
  std::string name() const override { return "EvalHook"; }

  Status after_create_session(Session* session, Coordinator*) override {
    FOREMAN_ASSIGN_OR_RETURN(int64_t step, session->GlobalStep());
    if (!start_step_) start_step_ = step;
    return absl::OkStatus();
  }
  StatusOr<SessionRunArgs> before_run(SessionRunContext& ctx) override {
    SessionRunArgs args;
    if (every_ <= 0) return args;
    FOREMAN_ASSIGN_OR_RETURN(int64_t step, ctx.session()->GlobalStep());
    if ((step + 1) % every_ == 0) args.fetches = {"eval_global_step", "eval_accuracy", "eval_loss", "eval_summaries"};
    return args;
  }
  Status after_run(SessionRunContext&, const SessionRunValues& values) override {
    if (values.results == nullptr || values.results->count("eval_global_step") == 0) return absl::OkStatus();
    return Record(*values.results);
  }
  Status end(Session* session) override {
    FOREMAN_ASSIGN_OR_RETURN(int64_t step, session->GlobalStep());
    if (!last_ || last_->step != step) {
      FOREMAN_ASSIGN_OR_RETURN(TensorMap values,
                               session->Run({"eval_global_step", "eval_accuracy", "eval_loss", "eval_summaries"}));
      const bool trained = start_step_.has_value() && step != *start_step_;
      FOREMAN_RETURN_IF_ERROR(Record(values, /*write=*/trained));
    }
    if (writer_ != nullptr) return writer_->Close();
    return absl::OkStatus();
  }

  // The last evaluation (the final one after end()).
  struct Result {
    int64_t step = 0;
    float accuracy = 0;
    float loss = 0;
  };
  const std::optional<Result>& last() const { return last_; }

 private:
  Status Record(const TensorMap& values, bool write = true) {
    Result r;
    r.step = values.at("eval_global_step").data<int64_t>()[0];
    r.accuracy = values.at("eval_accuracy").data<float>()[0];
    r.loss = values.at("eval_loss").data<float>()[0];
    last_ = r;
    if (!write) return absl::OkStatus();
    if (writer_ == nullptr) {
      EventFileWriterOptions options;
      options.env = env_;
      FOREMAN_ASSIGN_OR_RETURN(writer_, EventFileWriter::Create(output_dir_, options));
    }
    FOREMAN_RETURN_IF_ERROR(
        writer_->AddSummary(values.at("eval_summaries").scalar<std::string>().value(), r.step));
    return writer_->Flush();
  }

  const std::string output_dir_;
  const int64_t every_;
  Env* const env_;
  std::optional<int64_t> start_step_;
  std::optional<Result> last_;
  std::unique_ptr<EventFileWriter> writer_;
};

// -- the model ------------------------------------------------------------------------

// What the step function needs; lives as long as the graph.
struct Model {
  nn::MlpSpec spec;
  nn::OptimizerOptions optimizer;
  // TF's tf.train.exponential_decay (staircase=False):
  //   learning_rate * decay_rate ^ (global_step / decay_steps)
  double learning_rate = 0.001;
  int64_t decay_steps = 0;  // 0: constant
  double decay_rate = 1.0;
  float current_learning_rate = 0;
  bool warned_zero_rate = false;  // the decayed rate reached 0 (said once)
  bool tty = false;               // stderr is a terminal (a progress bar to erase)
  int64_t examples = 0;  // trained on by this process
  int64_t steps = 0;     // train_op runs of this process (in a cluster: this worker's own steps)
  std::optional<std::chrono::steady_clock::time_point> first_step;  // when the first of them started
  nn::Gradients grads;   // a cluster worker's step: its gradients, reused
  bool ended_by_chief = false;  // a cluster worker's update was refused: the chief ended training
  std::unique_ptr<nn::Mlp> mlp;
  std::unique_ptr<data::InputPipeline> pipeline;  // the CPU path's (null on a GPU)
  // The GPU path (a session device without host memory): the data sets
  // copied to the device once (uint8), batches gathered there in the order
  // train_set->Order(epoch) gives -- the order the CPU's pipeline reads.
  std::shared_ptr<const data::Dataset> train_set;
  data::LabeledImages train_images;  // uploaded at a session's first step (kept for a recovery's new session)
  data::LabeledImages test_images;
  std::unique_ptr<nn::DeviceExamples> device_train;
  std::unique_ptr<nn::DeviceExamples> device_test;
  // Gather the batches on the device even on the CPU (a test's knob,
  // FOREMAN_TEST_GATHER_ON_DEVICE=1: the GPU path's bookkeeping, run on the
  // CPU device, must give bitwise the pipeline's results).
  bool gather = false;
  data::Batch test;  // the whole test set, in file order
  std::vector<std::string> histogram_variables;
  std::shared_ptr<EvalRecord> eval;
  absl::Duration batch_timeout = absl::Seconds(60);
  // A cluster's chief: more scalars for its "summaries" (steps_per_sec/worker_K).
  std::function<std::vector<std::string>()> extra_summaries;
};

StatusOr<int64_t> ReadInt64(const VariableStore& vars, const std::string& name) {
  FOREMAN_ASSIGN_OR_RETURN(const Tensor* t, vars.Get(name));
  return t->scalar<int64_t>();
}

Status WriteInt64(VariableStore& vars, const std::string& name, int64_t value) {
  FOREMAN_ASSIGN_OR_RETURN(Tensor * t, vars.Get(name));
  FOREMAN_RETURN_IF_ERROR(t->CheckType<int64_t>());
  t->data<int64_t>()[0] = value;
  return absl::OkStatus();
}

// The data sets on `device` (the session's, without host memory), uploaded
// at the first step that needs them. RESOURCE_EXHAUSTED (naming the device
// and the size) when they do not fit.
Status EnsureExamplesOn(Model& m, compute::Device& device) {
  // The copies of a session's device; after a recovery a new device (maybe
  // at the same address: DeviceExamples knows whether its device lives).
  if (m.device_train != nullptr && m.device_train->device_alive() && &m.device_train->device() == &device) {
    return absl::OkStatus();
  }
  m.device_train.reset();  // frees nothing on a device that is gone (it did)
  m.device_test.reset();
  auto train = nn::DeviceExamples::Upload(m.train_images.images, m.train_images.labels, device);
  if (!train.ok()) {
    return Status(train.status().code(), absl::StrCat("uploading the training set (",
                                                      m.train_images.images.num_elements() >> 20, " MiB) to ",
                                                      device.name(), ": ", train.status().message()));
  }
  auto test = nn::DeviceExamples::Upload(m.test_images.images, m.test_images.labels, device);
  if (!test.ok()) {
    return Status(test.status().code(), absl::StrCat("uploading the test set (", m.test_images.images.num_elements() >> 20,
                                                     " MiB) to ", device.name(), ": ", test.status().message()));
  }
  m.device_train = std::move(*train);
  m.device_test = std::move(*test);
  return absl::OkStatus();
}

// Frees the device copies of the data at the end of a GPU session (after
// EvalHook's final evaluation: the last hook's end()), while its device
// lives. The Mlp's workspace stays until the Mlp's next step or its end: a
// device that goes first frees its memory itself (compute::Device::lifetime),
// as it does the data's after a failed run (whose close() skips end()).
class DeviceExamplesHook : public SessionRunHook {
 public:
  explicit DeviceExamplesHook(std::shared_ptr<Model> model) : model_(std::move(model)) {}
  std::string name() const override { return "DeviceExamplesHook"; }
  Status end(Session*) override {
    model_->device_train.reset();
    model_->device_test.reset();
    return absl::OkStatus();
  }

 private:
  std::shared_ptr<Model> model_;
};

// Fetches the step answers:
//   train_op          one batch: forward, backward, optimizer update, global_step += 1
//   loss, accuracy    of that batch, before the update (float32 scalars)
//   summaries         loss, accuracy, learning_rate, weight histograms
//   eval_accuracy, eval_loss, eval_summaries   the whole test set, with the
//                     weights after this run's update (no update of its own)
//   eval_global_step  the global_step those weights are at (int64 scalar)
// OUT_OF_RANGE (end of the last epoch) ends training cleanly.
Status Step(Model& m, StepContext& ctx) {
  VariableStore& vars = ctx.variables();
  std::vector<std::string> summaries;
  if (ctx.requested("train_op")) {
    if (!m.first_step) m.first_step = std::chrono::steady_clock::now();
    FOREMAN_ASSIGN_OR_RETURN(int64_t epoch, ReadInt64(vars, kEpochVariable));
    FOREMAN_ASSIGN_OR_RETURN(int64_t index, ReadInt64(vars, kIndexVariable));
    compute::Device& device = ctx.compute();
    const bool on_device = m.gather || !device.host_memory();
    data::Batch batch;
    // The GPU path: the batch's indices in epoch `epoch`'s order, gathered
    // on the device (Dataset::GetBatch's bookkeeping: the last batch of an
    // epoch is the remainder, then {epoch + 1, 0}).
    std::shared_ptr<const std::vector<int32_t>> order;
    int64_t rows = 0;
    if (on_device) {
      auto span = ctx.Trace("input");
      FOREMAN_RETURN_IF_ERROR(EnsureExamplesOn(m, device));
      const int64_t n = m.train_set->num_examples();
      const data::DatasetOptions& options = m.train_set->options();
      if (options.epochs > 0 && epoch >= options.epochs) return absl::OutOfRangeError("End of sequence");
      if (epoch < 0 || index < 0 || index >= n) {
        return absl::InvalidArgumentError(absl::StrCat("bad data position ", data::DatasetPosition{epoch, index}.ToString(),
                                                       " (", kEpochVariable, ", ", kIndexVariable, ") for ", n,
                                                       " examples"));
      }
      order = m.train_set->Order(epoch);
      rows = std::min(options.batch_size, n - index);
      batch.position = {epoch, index};
      batch.next = index + rows == n ? data::DatasetPosition{epoch + 1, 0} : data::DatasetPosition{epoch, index + rows};
    } else {
      auto span = ctx.Trace("input");
      FOREMAN_ASSIGN_OR_RETURN(batch, m.pipeline->Next(data::DatasetPosition{epoch, index}, m.batch_timeout));
      rows = batch.labels.num_elements();
    }
    FOREMAN_ASSIGN_OR_RETURN(int64_t global_step, GetGlobalStep(vars));
    double lr = m.learning_rate;
    if (m.decay_steps > 0) {
      lr *= std::pow(m.decay_rate, static_cast<double>(global_step) / static_cast<double>(m.decay_steps));
    }
    m.current_learning_rate = static_cast<float>(lr);
    if (m.current_learning_rate == 0 && !m.warned_zero_rate) {
      // The schedule's float32 rate underflows (TF's would too); the steps go
      // on, as TF's do, without changing the weights.
      m.warned_zero_rate = true;
      std::fprintf(stderr,
                   "%sforeman train: warning: the learning rate decayed to 0 at global_step %lld (%g x %g^(global_step "
                   "/ %lld) underflows float32): the following steps leave the weights unchanged; see "
                   "--learning-rate-decay-steps and --learning-rate-decay-rate\n",
                   m.tty ? "\r\033[K" : "", static_cast<long long>(global_step), m.learning_rate, m.decay_rate,
                   static_cast<long long>(m.decay_steps));
    }
    FOREMAN_RETURN_IF_ERROR(m.mlp->set_learning_rate(m.current_learning_rate));
    nn::StepResult r;
    if (ctx.remote_variables()) {
      // A cluster worker: the variables live on the ps tasks, which apply
      // the gradients with their optimizer and count global_step (TF1:
      // compute_gradients here, apply_gradients on the ps devices).
      auto span = ctx.Trace("train");
      FOREMAN_ASSIGN_OR_RETURN(
          r, m.mlp->ComputeGradients(vars, batch.features, batch.labels, ctx.compute(), &m.grads));
      if (Status applied = ctx.ApplyGradients(m.grads, m.optimizer); !applied.ok()) {
        // OUT_OF_RANGE: the chief ended training; the batch was not used
        // (the position stays), and the run ends as at the end of input.
        if (absl::IsOutOfRange(applied)) m.ended_by_chief = true;
        return applied;
      }
    } else if (on_device) {
      // A GPU: the step on the batch gathered there (a replayed CUDA graph).
      auto span = ctx.Trace("train");
      FOREMAN_ASSIGN_OR_RETURN(r, m.mlp->TrainStep(vars, *m.device_train, order->data() + index, rows, device));
    } else {
      // One process: TrainStep (the measured fast path) updates in place.
      auto span = ctx.Trace("train");
      FOREMAN_ASSIGN_OR_RETURN(r, m.mlp->TrainStep(vars, batch.features, batch.labels, device));
    }
    m.examples += rows;
    ++m.steps;
    FOREMAN_RETURN_IF_ERROR(WriteInt64(vars, kEpochVariable, batch.next.epoch));
    FOREMAN_RETURN_IF_ERROR(WriteInt64(vars, kIndexVariable, batch.next.index));
    if (!ctx.remote_variables()) FOREMAN_RETURN_IF_ERROR(IncrementGlobalStep(vars).status());
    ctx.Set("train_op", Tensor::Scalar<int64_t>(1));
    ctx.Set("loss", Tensor::Scalar<float>(r.loss));
    ctx.Set("accuracy", Tensor::Scalar<float>(r.accuracy));
    summaries = {ScalarSummary("loss", r.loss), ScalarSummary("accuracy", r.accuracy)};
  }
  // After the update: the summary is written at the post-run global_step.
  if (ctx.requested("eval_accuracy") || ctx.requested("eval_loss") || ctx.requested("eval_summaries") ||
      ctx.requested("eval_global_step")) {
    auto span = ctx.Trace("evaluate");
    nn::StepResult r;
    if (m.gather || !ctx.compute().host_memory()) {
      FOREMAN_RETURN_IF_ERROR(EnsureExamplesOn(m, ctx.compute()));
      FOREMAN_ASSIGN_OR_RETURN(r, m.mlp->Evaluate(vars, *m.device_test, ctx.compute()));
    } else {
      FOREMAN_ASSIGN_OR_RETURN(r, m.mlp->Evaluate(vars, m.test.features, m.test.labels, ctx.compute()));
    }
    FOREMAN_ASSIGN_OR_RETURN(int64_t step, GetGlobalStep(vars));
    ctx.Set("eval_global_step", Tensor::Scalar<int64_t>(step));
    ctx.Set("eval_accuracy", Tensor::Scalar<float>(r.accuracy));
    ctx.Set("eval_loss", Tensor::Scalar<float>(r.loss));
    ctx.Set("eval_summaries", Tensor::Scalar<std::string>(MergeSummaries(
                                  {ScalarSummary("accuracy", r.accuracy), ScalarSummary("loss", r.loss)})));
    std::lock_guard<std::mutex> lock(m.eval->mu);
    m.eval->step = step;
    m.eval->accuracy = r.accuracy;
    m.eval->loss = r.loss;
  }
  if (ctx.requested("summaries")) {
    summaries.push_back(ScalarSummary("learning_rate", m.current_learning_rate));
    if (m.extra_summaries) {
      for (std::string& s : m.extra_summaries()) summaries.push_back(std::move(s));
    }
    for (const std::string& name : m.histogram_variables) {
      FOREMAN_ASSIGN_OR_RETURN(const Tensor* t, static_cast<const VariableStore&>(vars).Get(name));
      FOREMAN_ASSIGN_OR_RETURN(std::string h, HistogramSummary(name, *t));
      summaries.push_back(std::move(h));
    }
    ctx.Set("summaries", Tensor::Scalar<std::string>(MergeSummaries(summaries)));
  }
  return absl::OkStatus();
}

// -- the command ---------------------------------------------------------------------

int Fail(int code, const std::string& what, const Status& s) {
  std::fprintf(stderr, "foreman train: %s: %s\n", what.c_str(), std::string(s.message()).c_str());
  return code;
}

// -- --fault-plan -------------------------------------------------------------------
//
// The plan's env faults wrap the job's Env (a FaultyEnv over the POSIX Env),
// its step, hook and process faults go into a FaultInjectionHook. Every
// firing is appended to <checkpoint-dir>/fault_record.json (through the
// POSIX Env, never the FaultyEnv) before the fault takes effect, so a
// process fault is on disk before its signal; the next process of the run
// reads the record and MarkFired()s it, so a fault without `repeat` fires
// once per run, not once per process.

// The record of the run: the earlier processes' firings and this one's.
// OnFire is a FaultObserver: called on the firing thread (the training
// thread, the saver's, the summary writer's); thread-safe.
class FaultRecorder {
 public:
  FaultRecorder(Env* base, std::string dir) : base_(base), dir_(std::move(dir)) {}

  // The earlier processes' record (before any fault can fire).
  void Load(std::vector<FiredFault> earlier) {
    std::lock_guard<std::mutex> lock(mu_);
    record_ = std::move(earlier);
  }

  void OnFire(const FiredFault& f) {
    std::lock_guard<std::mutex> lock(mu_);
    record_.push_back(f);
    if (Status s = WriteFiredFaults(base_, dir_, record_); !s.ok()) {
      // Nothing can be undone here: say what a restart may do.
      std::fprintf(stderr,
                   "foreman train: warning: cannot record the injected fault %s in %s/%s (%s): a restarted run "
                   "may inject it again\n",
                   f.id.c_str(), dir_.c_str(), kFaultRecordFile, std::string(s.message()).c_str());
    }
  }

 private:
  Env* const base_;
  const std::string dir_;
  std::mutex mu_;
  std::vector<FiredFault> record_;
};

// Raises a process fault's signal on this process (the training thread, in
// the FaultInjectionHook's before_run). SIGKILL ends it here. SIGTERM goes
// to the SignalWatcher, which requests the run's stop: wait (at most 10 s)
// until it has, so that the session stops at the end of this very step --
// the same step in every run of the plan, not whenever the watcher thread
// gets to it.
void RaiseProcessFault(int sig, StopRequest& stop) {
  if (sig != SIGTERM) {
    kill(getpid(), sig);
    return;
  }
  std::mutex mu;
  std::condition_variable cv;
  bool requested = false;
  const int64_t listener = stop.Listen([&](const Status&) {
    std::lock_guard<std::mutex> lock(mu);
    requested = true;
    cv.notify_all();
  });
  kill(getpid(), sig);
  {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait_for(lock, std::chrono::seconds(10), [&] { return requested; });
  }
  stop.Unlisten(listener);
}

// With --fault-plan: every checkpoint is durable before training goes on
// (CheckpointSaverHook: with a listener the training thread waits at the
// boundary that started a save until it is durable), as TF's synchronous
// saves are. Without it a SIGKILL at step k finds the save scheduled just
// before k committed or not, depending on the saver thread's timing, and a
// failed save ends the run a few steps later or sooner: the same plan
// would lose different steps in different runs.
class DurableSavesListener : public CheckpointSaverListener {};

// The id of the injected fault `s` reports: its InjectedFaultId (an env,
// step, hook or actor fault's mark), or a kNanLoss fault fired in this
// process behind a NanLossDuringTrainingError (NanTensorHook's, which does
// not know of faults).
std::optional<std::string> InjectedFaultIn(const Status& s, const std::vector<FiredFault>& fired,
                                           const std::vector<StepFault>& steps) {
  if (std::optional<std::string> id = InjectedFaultId(s)) return id;
  if (!IsNanLossDuringTraining(s)) return std::nullopt;
  for (const FiredFault& f : fired) {
    for (const StepFault& step : steps) {
      if (step.id == f.id && step.kind == StepFault::Kind::kNanLoss) return f.id;
    }
  }
  return std::nullopt;
}

// CPUs this process may run on (taskset, cgroups' cpusets), as TF counts them.
int UsableCpus() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
  return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

// Bytes of the model's variables: weights and biases, and the optimizer's slots.
double ModelBytes(const nn::MlpSpec& spec, nn::OptimizerKind kind) {
  double params = 0;
  int64_t in = spec.input_dim;
  for (int64_t out : spec.hidden) {
    params += static_cast<double>(in + 1) * static_cast<double>(out);
    in = out;
  }
  params += static_cast<double>(in + 1) * static_cast<double>(spec.num_classes);
  const int copies = kind == nn::OptimizerKind::kAdam ? 3 : kind == nn::OptimizerKind::kMomentum ? 2 : 1;
  return params * copies * sizeof(float);
}

// A directory without a settings file may still hold checkpoints (a settings
// file deleted, another program's run): foreman train did not write them.
StatusOr<bool> HoldsCheckpoints(Env* env, const std::string& dir) {
  if (Status exists = env->FileExists(dir + "/checkpoint"); exists.ok()) {
    return true;
  } else if (!absl::IsNotFound(exists)) {
    return exists;
  }
  auto children = env->GetChildren(dir);
  if (!children.ok()) return absl::IsNotFound(children.status()) ? StatusOr<bool>(false) : children.status();
  for (const std::string& name : *children) {
    if (absl::StartsWith(name, "model.ckpt-")) return true;
  }
  return false;
}

// The checkpoint a resumed run will restore (`prefix`) must hold this
// model's variables with these dtypes and shapes (a hand-edited or replaced
// settings file would otherwise fail in the middle of training).
// FAILED_PRECONDITION naming the checkpoint, the variable and both shapes.
Status CheckCheckpointMatches(Env* env, const std::string& prefix, const Graph& graph) {
  auto reader = BundleReader::Open(env, prefix);
  if (!reader.ok()) return absl::OkStatus();   // verified just before; the restore reports what changed since
  for (const VariableDef& def : graph.variables()) {
    if (def.local) continue;
    auto initial = def.initializer();
    if (!initial.ok()) return initial.status();
    auto entry = (*reader)->GetEntry(def.name);
    if (!entry.ok()) {
      return absl::FailedPreconditionError(absl::StrCat(prefix, " has no variable '", def.name,
                                                        "' of this model: it holds another run; use another "
                                                        "--checkpoint-dir"));
    }
    if (entry->dtype != initial->dtype() || entry->shape != initial->shape()) {
      return absl::FailedPreconditionError(absl::StrCat(
          prefix, " holds '", def.name, "' as ", DataTypeName(entry->dtype), " ", entry->shape.ToString(),
          ", this model needs ", DataTypeName(initial->dtype()), " ", initial->shape().ToString(), " (",
          kTrainSettingsFile, " does not describe these checkpoints); use another --checkpoint-dir"));
    }
  }
  return absl::OkStatus();
}

std::string Architecture(const nn::MlpSpec& spec) {
  std::vector<int64_t> dims = {spec.input_dim};
  dims.insert(dims.end(), spec.hidden.begin(), spec.hidden.end());
  dims.push_back(spec.num_classes);
  return absl::StrJoin(dims, "-");
}

// -- the job, step by step ------------------------------------------------------------
//
// RunTrain runs these in order; each returns the exit code when the job ends
// there (std::nullopt: go on).

using ExitCode = std::optional<int>;

// What the steps build, in their order.
struct TrainJob {
  TrainFlags f;
  Env* env = Env::Default();  // the FaultyEnv with --fault-plan (once the record is read)
  // --fault-plan.
  FaultPlan plan;
  std::unique_ptr<FaultyEnv> faulty;
  std::shared_ptr<FaultInjectionHook> fault_hook;
  std::shared_ptr<FaultRecorder> recorder;
  std::shared_ptr<StopRequest> stop;
  std::shared_ptr<RunPhase> phase;
  std::shared_ptr<FileLock> lock;  // held from the first check to the end of the run
  bool resuming = false;
  std::optional<std::string> restore_from;  // the checkpoint a resumed run restores
  nn::MlpSpec spec;
  nn::OptimizerOptions optimizer;
  double learning_rate = 0;
  // The session's device (ResolveDevice): "/cpu:0" or "/gpu:N".
  std::string device = "/cpu:0";
  bool on_gpu() const { return device != "/cpu:0"; }
  // Batches gathered on the device (a GPU, or the test knob on the CPU).
  bool gather = false;
  data::LabeledImages train_images;  // on a GPU: the data to upload (LoadData)
  data::LabeledImages test_images;
  std::shared_ptr<const data::Dataset> train_set;
  std::shared_ptr<const data::Dataset> test_set;
  int64_t test_examples = 0;
  std::shared_ptr<Model> model;
  std::shared_ptr<Graph> graph;
  int64_t total_steps = 0;
  bool tty = false;
  std::shared_ptr<ProgressHook> progress;
  std::shared_ptr<EvalHook> eval;  // null on a cluster's non-chief worker
  MonitoredTrainingSessionOptions mts;
  // A cluster task (--job-name ...); nullopt for a single-process run.
  std::optional<ClusterRun> cluster;
  std::unique_ptr<Server> server;                  // a worker's, from StartServer to the end
  std::shared_ptr<EndTrainingHook> end_training;   // the chief's

  // The chief or a single process: owns --checkpoint-dir. A cluster's other
  // workers never take its lock or write there.
  bool owns_directory() const { return !cluster || cluster->task.is_chief(); }
  // "worker 1: " in a cluster, "" otherwise (for the report's lines).
  std::string task_prefix() const {
    return cluster ? absl::StrCat(cluster->task.job_name, " ", cluster->task.task_index, ": ") : "";
  }

  // Fail(), unless `s` reports a fault injected in this process: then
  // "stopped by injected fault <id>: <status>" and kExitInjectedFault, so
  // that a supervisor (foreman chaos) can tell it from a real failure.
  int Exit(int code, const std::string& what, const Status& s) const {
    if (faulty != nullptr && !s.ok()) {
      std::vector<FiredFault> fired = faulty->fired();
      const std::vector<FiredFault> hook_fired = fault_hook->fired();
      fired.insert(fired.end(), hook_fired.begin(), hook_fired.end());
      if (auto id = InjectedFaultIn(s, fired, plan.steps)) {
        std::fprintf(stderr, "foreman train: %s: %s\nforeman train: stopped by injected fault %s: %s\n", what.c_str(),
                     std::string(s.message()).c_str(), id->c_str(),
                     s.ToString(absl::StatusToStringMode::kWithNoExtraData).c_str());
        return kExitInjectedFault;
      }
    }
    return Fail(code, what, s);
  }
};

// A resumed run's checkpoint, found once (each warning about a bad
// checkpoint is printed once), before the data loads. A run with a state
// file but no checkpoint left to restore (all gone, or none verifies) is
// refused rather than trained again from step 0 (spec decision 7); a run
// stopped before its first checkpoint (no state file) starts at step 0.
ExitCode FindCheckpointToRestore(TrainJob& job) {
  const std::string& dir = job.f.checkpoint_dir;
  const std::string fresh =
      absl::StrCat("; to start fresh on purpose, remove ", dir, " or use another --checkpoint-dir");
  auto latest = LatestCheckpoint(job.env, dir);
  if (!latest.ok()) {
    // DATA_LOSS: checkpoints exist and none verifies (each was named in a warning).
    if (!absl::IsDataLoss(latest.status())) return job.Exit(kExitUsage, "cannot resume", latest.status());
    return job.Exit(kExitUsage, "cannot resume",
                Status(latest.status().code(), absl::StrCat(latest.status().message(), fresh)));
  }
  job.restore_from = *latest;
  if (job.restore_from.has_value()) return std::nullopt;
  const std::string state_path = JoinPath(dir, kCheckpointStateFilename);
  if (absl::IsNotFound(job.env->FileExists(state_path))) return std::nullopt;
  std::string missing;
  auto state = ReadCheckpointState(job.env, dir);
  if (state.ok() && state->has_value()) {
    std::vector<std::string> files;
    for (const std::string& path : (*state)->all_model_checkpoint_paths) {
      files.push_back(BundleIndexPath(ResolveCheckpointPath(dir, path)));
    }
    const std::string latest_index = BundleIndexPath(ResolveCheckpointPath(dir, (*state)->model_checkpoint_path));
    if (std::find(files.begin(), files.end(), latest_index) == files.end()) files.push_back(latest_index);
    missing = absl::StrCat("the checkpoints its state file ", state_path, " names are gone (missing: ",
                           absl::StrJoin(files, ", "), ")");
  } else {
    missing = absl::StrCat("its state file ", state_path, " cannot be read (",
                           state.ok() ? std::string("empty") : std::string(state.status().message()),
                           ") and no checkpoint is left");
  }
  return job.Exit(kExitUsage, "cannot resume",
              absl::FailedPreconditionError(absl::StrCat(dir, " holds a run (", kTrainSettingsFile, ") but ", missing,
                                                         ": resuming would train again from step 0", fresh)));
}

// 1a. --fault-plan, read and checked before anything is written: a bad plan
//     is exit 2 with ParseFaultPlan's message. The faults are armed, but
//     nothing goes through them before the record is read (1b).
ExitCode PrepareFaults(TrainJob& job) {
  const TrainFlags& f = job.f;
  if (f.fault_plan.empty()) return std::nullopt;
  auto plan = ReadFaultPlan(Env::Default(), f.fault_plan);
  if (!plan.ok()) return Fail(kExitUsage, "bad fault plan", plan.status());
  job.plan = *std::move(plan);
  job.faulty = std::make_unique<FaultyEnv>(Env::Default(), job.plan.seed);
  for (const EnvFault& e : job.plan.env) {
    if (e.kind == EnvFault::Kind::kCrash || e.kind == EnvFault::Kind::kTornWrite) {
      return Fail(kExitUsage, "bad fault plan",
                  absl::InvalidArgumentError(absl::StrCat(
                      f.fault_plan, ": fault \"", e.id, "\": kind ",
                      e.kind == EnvFault::Kind::kCrash ? "crash" : "torn_write",
                      " simulates a power cut, which needs an in-memory file system; foreman train writes to the "
                      "real disk: use a process fault instead ({\"type\": \"process\", \"signal\": \"SIGKILL\", "
                      "\"at_step\": N} kills the job without a final checkpoint)")));
    }
    if (e.op == EnvOp::kLock) {
      // The lock is taken before the record of fired faults (which lives in
      // the locked directory) is read, so through the real Env: such a
      // fault would silently never fire.
      return Fail(kExitUsage, "bad fault plan",
                  absl::InvalidArgumentError(absl::StrCat(
                      f.fault_plan, ": fault \"", e.id,
                      "\": op lock: foreman train takes its directory's lock before any fault applies, so this fault "
                      "would never fire (a lock held by another process is exit 2 already)")));
    }
    if (Status s = job.faulty->AddFault(e); !s.ok()) {
      return Fail(kExitUsage, "bad fault plan", Status(s.code(), absl::StrCat(f.fault_plan, ": ", s.message())));
    }
  }
  // A NaN-loss fault acts on a fetch the runs request: foreman train's is
  // "loss" (another name would silently never fire).
  for (const StepFault& s : job.plan.steps) {
    if (s.kind == StepFault::Kind::kNanLoss && s.loss_tensor != "loss") {
      return Fail(kExitUsage, "bad fault plan",
                  absl::InvalidArgumentError(absl::StrCat(f.fault_plan, ": fault \"", s.id, "\": \"loss_tensor\" must be "
                                                          "\"loss\" (the fetch foreman train's runs request), got \"",
                                                          s.loss_tensor, "\"")));
    }
  }
  job.recorder = std::make_shared<FaultRecorder>(Env::Default(), f.checkpoint_dir);
  job.faulty->set_on_fire([recorder = job.recorder](const FiredFault& fired) { recorder->OnFire(fired); });
  FaultInjectionHook::Options options;
  options.steps = job.plan.steps;
  options.hooks = job.plan.hooks;
  options.processes = job.plan.processes;
  options.actors = job.plan.actors;
  options.seed = job.plan.seed;
  options.on_fire = [recorder = job.recorder](const FiredFault& fired) { recorder->OnFire(fired); };
  options.raise_signal = [stop = job.stop](int sig) { RaiseProcessFault(sig, *stop); };
  auto hook = FaultInjectionHook::Create(options);
  if (!hook.ok()) {
    return Fail(kExitUsage, "bad fault plan",
                Status(hook.status().code(), absl::StrCat(f.fault_plan, ": ", hook.status().message())));
  }
  job.fault_hook = *std::move(hook);
  return std::nullopt;
}

// 1b. With the lock held: the run's record of fired faults (a corrupt one
//     is exit 2 naming it), MarkFired on the Env and the hook; from here on
//     the job's Env is the FaultyEnv.
ExitCode LoadFaultRecord(TrainJob& job) {
  if (job.faulty == nullptr) return std::nullopt;
  auto record = ReadFiredFaults(Env::Default(), job.f.checkpoint_dir);
  if (!record.ok()) {
    return Fail(kExitUsage, "bad fault record",
                Status(record.status().code(),
                       absl::StrCat(record.status().message(), " (remove it to inject every fault of the plan again)")));
  }
  job.faulty->MarkFired(*record);
  job.fault_hook->MarkFired(*record);
  job.recorder->Load(*std::move(record));
  job.env = job.faulty.get();
  return std::nullopt;
}

// 1-2. Flags, the directory's lock (a second `foreman train` is refused
//      before it reads or writes anything, and the lock is held until the
//      run ends), and the directory's stored settings.
ExitCode OpenDirectory(const CLI::App& cmd, TrainJob& job) {
  TrainFlags& f = job.f;
  const std::string& dir = f.checkpoint_dir;
  if (Status s = ValidateTrainFlags(f); !s.ok()) return job.Exit(kExitUsage, "bad flags", s);
  // A cluster's non-chief worker: the chief's directory is not its own (no
  // lock, no settings, no restore: the chief initialises or restores the ps).
  if (!job.owns_directory()) return std::nullopt;
  if (ExitCode code = PrepareFaults(job)) return code;
  job.phase->RecordBeforeLock(job.env, dir);
  auto lock = LockCheckpointDirectory(job.env, dir);
  if (!lock.ok()) {
    // The lock's contract: FAILED_PRECONDITION means another holder.
    return job.Exit(kExitUsage,
                absl::IsFailedPrecondition(lock.status()) ? "checkpoint directory in use"
                                                          : "cannot use the checkpoint directory",
                lock.status());
  }
  job.lock = std::move(*lock);
  job.phase->Locked();
  if (ExitCode code = LoadFaultRecord(job)) return code;

  auto stored = ReadTrainSettings(job.env, dir);
  if (!stored.ok()) return job.Exit(kExitUsage, "cannot resume", stored.status());
  job.resuming = stored->has_value();
  if (job.resuming) {
    std::vector<std::string> notes;
    if (Status s = ResolveTrainFlags(**stored, cmd, dir, f, &notes); !s.ok()) return job.Exit(kExitUsage, "cannot resume", s);
    if (Status s = ValidateTrainFlags(f); !s.ok()) {
      return job.Exit(kExitUsage, absl::StrCat("bad settings (flags and ", dir, "/", kTrainSettingsFile, ")"), s);
    }
    for (const std::string& note : notes) std::fprintf(stderr, "foreman train: note: %s\n", note.c_str());
    return FindCheckpointToRestore(job);
  } else {
    auto foreign = HoldsCheckpoints(job.env, dir);
    if (!foreign.ok()) return job.Exit(kExitUsage, "cannot use the checkpoint directory", foreign.status());
    if (*foreign) {
      return job.Exit(kExitUsage, "cannot resume",
                  absl::FailedPreconditionError(absl::StrCat(dir, " holds checkpoints that foreman train did not "
                                                             "write (no ", kTrainSettingsFile,
                                                             "): use another --checkpoint-dir")));
    }
  }
  return std::nullopt;
}

// 3. The model's shape and the session's schedules, checked before the data
//    loads.
ExitCode PlanModel(TrainJob& job) {
  TrainFlags& f = job.f;
  if (f.threads == 0) f.threads = UsableCpus();
  job.spec.hidden = *ParseHidden(f.hidden);
  job.optimizer.kind = *nn::ParseOptimizerKind(f.optimizer);
  job.learning_rate = f.learning_rate ? *f.learning_rate : DefaultLearningRate(job.optimizer.kind);
  job.optimizer.learning_rate = static_cast<float>(job.learning_rate);
  constexpr double kMaxModelBytes = 16.0 * (1 << 30);
  if (ModelBytes(job.spec, job.optimizer.kind) > kMaxModelBytes) {
    return job.Exit(kExitUsage, "bad flags",
                absl::InvalidArgumentError(absl::StrFormat(
                    "--hidden %s: the model and its optimizer slots would take %.1f GiB (at most 16 GiB)", f.hidden,
                    ModelBytes(job.spec, job.optimizer.kind) / (1 << 30))));
  }
  MonitoredTrainingSessionOptions& mts = job.mts;
  mts.checkpoint_dir = f.checkpoint_dir;
  if (f.save_checkpoint_secs) mts.save_checkpoint_secs = *f.save_checkpoint_secs;
  if (f.save_checkpoint_steps) mts.save_checkpoint_steps = *f.save_checkpoint_steps;
  if (f.save_summaries_steps) mts.save_summaries_steps = *f.save_summaries_steps;
  if (f.save_summaries_secs) mts.save_summaries_secs = *f.save_summaries_secs;
  mts.log_step_count_steps = f.log_step_count_steps;
  mts.stop_grace_period_secs = f.stop_grace_period_secs;
  mts.config.intra_op_parallelism_threads = static_cast<int>(f.threads);
  mts.graph = std::make_shared<Graph>();  // the real one comes below; the plan checks only the schedules
  if (auto plan = PlanMonitoredTrainingSession(mts); !plan.ok()) return job.Exit(kExitUsage, "bad flags", plan.status());
  return std::nullopt;
}

// Whether a session can be made on `device` (SessionConfig.device): the
// checks Session::Create makes (CUDA built, a driver, the device, its
// memory under the limit), on an empty graph.
Status ProbeDevice(const std::string& device, int64_t memory_limit_bytes, Env* env) {
  auto graph = std::make_shared<Graph>();
  FOREMAN_RETURN_IF_ERROR(graph->SetStep([](StepContext&) { return absl::OkStatus(); }));
  SessionConfig config;
  config.intra_op_parallelism_threads = 1;
  config.device = device;
  config.device_memory_limit_bytes = memory_limit_bytes;
  config.env = env;
  return Session::Create(std::move(graph), "", config).status();
}

// 3b. --device, resolved before the data loads: gpu:N that cannot be used is
//     exit 2 with the session's error (FAILED_PRECONDITION: no CUDA in this
//     build, no driver, no such device; RESOURCE_EXHAUSTED: the memory
//     limit), and nothing is left in the directory; auto takes GPU 0 when a
//     session can be made there and says which on stderr. A cluster task
//     trains on the CPU (only a local session may use a GPU).
ExitCode ResolveDevice(TrainJob& job) {
  const TrainFlags& f = job.f;
  const std::string parsed = *ParseDeviceFlag(f.device);  // validated
  const int64_t limit = f.device_memory_limit_mb * (int64_t{1} << 20);
  job.mts.config.device_memory_limit_bytes = limit;
  if (parsed == "/cpu:0") {
    job.device = parsed;
  } else if (job.cluster) {
    if (!parsed.empty()) {
      return job.Exit(kExitUsage, "bad flags",
                      absl::InvalidArgumentError(absl::StrCat("--device ", f.device,
                                                              ": a cluster task trains on the CPU (only a "
                                                              "single-process run may use a GPU)")));
    }
    job.device = "/cpu:0";
  } else if (parsed.empty()) {
    // auto: the CPU unless GPU 0 is usable.
    job.device = "/cpu:0";
    StatusOr<int> count = cuda::DeviceCount();
    if (!count.ok() || *count == 0) {
      std::fprintf(stderr, "foreman train: --device auto: no usable GPU (%s); training on the CPU\n",
                   count.ok() ? "no CUDA device" : std::string(count.status().message()).c_str());
    } else if (Status s = ProbeDevice("/gpu:0", limit, job.env); !s.ok()) {
      std::fprintf(stderr, "foreman train: --device auto: GPU 0 cannot be used (%s); training on the CPU\n",
                   std::string(s.message()).c_str());
    } else {
      job.device = "/gpu:0";
      auto info = cuda::GetDeviceInfo(0);
      std::fprintf(stderr, "foreman train: --device auto: training on /gpu:0%s\n",
                   info.ok() ? absl::StrCat(" (", info->name, ")").c_str() : "");
    }
  } else {
    if (Status s = ProbeDevice(parsed, limit, job.env); !s.ok()) {
      return job.Exit(kExitUsage, absl::StrCat("cannot use --device ", f.device), s);
    }
    job.device = parsed;
  }
  job.mts.config.device = job.device;
  const char* knob = std::getenv("FOREMAN_TEST_GATHER_ON_DEVICE");
  job.gather = job.on_gpu() || (knob != nullptr && std::string(knob) == "1" && !job.cluster);
  return std::nullopt;
}

// 4. The data.
ExitCode LoadData(TrainJob& job) {
  const TrainFlags& f = job.f;
  auto mnist = data::LoadFashionMnist(job.env, f.data_dir);
  if (!mnist.ok()) return job.Exit(kExitUsage, "cannot load the data", mnist.status());
  data::DatasetOptions train_options;
  train_options.batch_size = f.batch_size;
  train_options.epochs = f.epochs;
  train_options.shuffle = true;
  // Each worker of a cluster reads its own order: worker k shuffles with
  // --seed + k (worker 0, whose position the checkpoints carry, with --seed,
  // so a single-process resume continues its order).
  train_options.seed = static_cast<uint64_t>(f.seed) + (job.cluster ? job.cluster->task.task_index : 0);
  job.test_examples = mnist->test.labels.num_elements();
  if (job.gather) {
    // Copied to the device at the first step (nn::DeviceExamples::Upload).
    job.train_images = mnist->train;
    job.test_images = mnist->test;
  }
  auto train_set = data::Dataset::Create(std::move(mnist->train), train_options);
  if (!train_set.ok()) return job.Exit(kExitUsage, absl::StrCat("bad training data in ", f.data_dir), train_set.status());
  data::DatasetOptions test_options;
  test_options.shuffle = false;
  auto test_set = data::Dataset::Create(std::move(mnist->test), test_options);
  if (!test_set.ok()) return job.Exit(kExitUsage, absl::StrCat("bad test data in ", f.data_dir), test_set.status());
  job.train_set = *std::move(train_set);
  job.test_set = *std::move(test_set);
  job.spec.input_dim = job.train_set->feature_dim();
  return std::nullopt;
}

// 5. The model and its graph; a resumed run's checkpoint must fit it.
ExitCode BuildModel(TrainJob& job) {
  const TrainFlags& f = job.f;
  auto model = std::make_shared<Model>();
  model->spec = job.spec;
  model->optimizer = job.optimizer;
  model->learning_rate = job.learning_rate;
  model->current_learning_rate = job.optimizer.learning_rate;
  model->decay_steps = f.learning_rate_decay_steps;
  model->decay_rate = f.learning_rate_decay_rate;
  model->eval = std::make_shared<EvalRecord>();
  model->train_set = job.train_set;
  model->gather = job.gather;
  model->train_images = std::move(job.train_images);
  model->test_images = std::move(job.test_images);
  auto mlp = nn::Mlp::Create(job.spec, job.optimizer);
  if (!mlp.ok()) return job.Exit(kExitUsage, "bad model", mlp.status());
  model->mlp = std::move(*mlp);
  auto test = job.test_set->Slice(0, job.test_examples);
  if (!test.ok()) return job.Exit(kExitFailed, "test data", test.status());
  model->test = std::move(*test);
  for (const std::string& name : nn::MlpVariableNames(job.spec, job.optimizer)) {
    if (absl::EndsWith(name, "/kernel") || absl::EndsWith(name, "/bias")) model->histogram_variables.push_back(name);
  }
  auto graph = std::make_shared<Graph>();
  Status built = graph->CreateGlobalStep();
  if (built.ok()) built = nn::AddMlpVariables(*graph, job.spec, job.optimizer, static_cast<uint64_t>(f.seed));
  if (built.ok()) built = graph->AddVariable(kEpochVariable, Tensor::Scalar<int64_t>(0), /*trainable=*/false);
  if (built.ok()) built = graph->AddVariable(kIndexVariable, Tensor::Scalar<int64_t>(0), /*trainable=*/false);
  if (job.cluster) {
    // Each worker keeps its own data position; the chief's checkpoints carry worker 0's.
    if (built.ok()) built = graph->SetVariableDevice(kEpochVariable, "/job:worker");
    if (built.ok()) built = graph->SetVariableDevice(kIndexVariable, "/job:worker");
  }
  if (built.ok()) built = graph->AddSummaryOp("summaries");
  StepFn step = [model](StepContext& ctx) { return Step(*model, ctx); };
  if (job.fault_hook != nullptr) step = job.fault_hook->WrapStep(std::move(step));  // NaN-loss faults
  if (built.ok()) built = graph->SetStep(std::move(step));
  if (!built.ok()) return job.Exit(kExitFailed, "building the model", built);
  if (job.restore_from.has_value()) {
    if (Status s = CheckCheckpointMatches(job.env, *job.restore_from, *graph); !s.ok()) {
      return job.Exit(kExitUsage, "cannot resume", s);
    }
  }
  job.model = std::move(model);
  job.graph = std::move(graph);
  return std::nullopt;
}

// 6. Hooks, after the default ones (step counter, summaries, checkpoints);
//    the run's stop request and the held lock go to the session.
ExitCode AddHooks(TrainJob& job) {
  const TrainFlags& f = job.f;
  const int64_t steps_by_epochs = f.epochs > 0 ? f.epochs * job.train_set->batches_per_epoch() : 0;
  job.total_steps = steps_by_epochs;
  if (f.max_steps > 0) job.total_steps = job.total_steps > 0 ? std::min(job.total_steps, f.max_steps) : f.max_steps;
  job.tty = isatty(STDERR_FILENO) != 0;
  job.model->tty = job.tty;
  job.progress = std::make_shared<ProgressHook>(
      job.total_steps, f.log_step_count_steps > 0 ? f.log_step_count_steps : 100, job.tty, job.model->eval);
  NanTensorHook::Options nan;
  nan.loss_tensor = "loss";
  auto nan_hook = NanTensorHook::Create(nan);
  if (!nan_hook.ok()) return job.Exit(kExitFailed, "hooks", nan_hook.status());
  MonitoredTrainingSessionOptions& mts = job.mts;
  mts.hooks = {*nan_hook, job.progress};
  // First among the job's hooks: a step or process fault fires before the others run.
  if (job.fault_hook != nullptr) mts.hooks.insert(mts.hooks.begin(), job.fault_hook);
  if (f.max_steps > 0) {
    StopAtStepHook::Options stop_options;
    stop_options.last_step = f.max_steps;
    auto stop = StopAtStepHook::Create(stop_options);
    if (!stop.ok()) return job.Exit(kExitUsage, "bad flags", stop.status());
    mts.hooks.push_back(*stop);
  }
  // Last: its end() runs after the CheckpointSaverHook's final save. Only
  // where the directory is this process's (its events go to <dir>/eval).
  if (job.owns_directory()) {
    job.eval = std::make_shared<EvalHook>(f.checkpoint_dir + "/eval", f.eval_every_steps, job.env);
    mts.hooks.push_back(job.eval);
  }
  // After EvalHook: its end() evaluates on the device copy of the test set.
  if (job.gather) mts.hooks.push_back(std::make_shared<DeviceExamplesHook>(job.model));
  mts.graph = job.graph;
  mts.config.env = job.env;
  if (job.fault_hook != nullptr) mts.checkpoint_listeners.push_back(std::make_shared<DurableSavesListener>());
  mts.runtime.stop = job.stop;
  if (job.owns_directory()) {
    mts.runtime.held_lock = job.lock;
    mts.runtime.held_lock_directory = f.checkpoint_dir;
  }
  if (job.cluster) {
    mts.is_chief = job.cluster->task.is_chief();
    if (!mts.is_chief) {
      // WorkerSessionCreator: polls for the chief's session every heartbeat,
      // for at most --ps-wait-secs. No directory: it writes nothing.
      mts.checkpoint_dir.clear();
      mts.recovery_wait_secs = static_cast<double>(job.cluster->options.heartbeat_ms) / 1000.0;
      mts.max_wait_secs = static_cast<double>(job.cluster->options.ps_wait_secs);
    }
    // mts.master and the chief's EndTrainingHook come with the Server (StartServer).
  }
  if (!f.restart_policy.empty()) mts.runtime.restart = *ParseRestartPolicy(f.restart_policy);  // validated
  return std::nullopt;
}

// 6b. A cluster worker: its Server (tf.train.Server), whose target is the
//     session's master; the chief ends training from a hook placed first
//     among its chief-only hooks (their end() runs before the
//     CheckpointSaverHook's final save).
ExitCode StartServer(TrainJob& job) {
  if (!job.cluster) return std::nullopt;
  ServerOptions options;
  options.cluster = job.cluster->options;
  options.optimizer = job.optimizer;
  options.replicas_to_aggregate = job.cluster->replicas_to_aggregate;
  options.request_timeout_ms = job.cluster->operation_timeout_ms;
  auto server = Server::Create(job.cluster->spec, job.cluster->task, options);
  if (!server.ok()) {
    return job.Exit(absl::IsInvalidArgument(server.status()) ? kExitUsage : kExitFailed, "cannot start the worker",
                    server.status());
  }
  job.server = *std::move(server);
  job.mts.master = job.server->target();
  if (job.cluster->task.is_chief()) {
    job.end_training = std::make_shared<EndTrainingHook>(job.server.get());
    job.mts.chief_only_hooks.insert(job.mts.chief_only_hooks.begin(), job.end_training);
    job.model->extra_summaries =
        WorkerStepRateSummaries(job.server.get(), job.cluster->spec.num_tasks("worker"));
  }
  return std::nullopt;
}

// 7. The settings go into the directory before the first checkpoint; the
//    whole log into <dir>/train.log (on a terminal the progress bar owns
//    stderr, so only warnings and errors are printed there).
ExitCode WriteRunFiles(TrainJob& job) {
  const TrainFlags& f = job.f;
  const std::string& dir = f.checkpoint_dir;
  if (!job.owns_directory()) {
    // A cluster's other workers: the log on stderr only, nothing in the chief's directory.
    LogOptions log;
    log.stderr_level = job.tty ? LogLevel::kWarning : LogLevel::kInfo;
    if (Status s = ConfigureLogging(log); !s.ok()) return job.Exit(kExitUsage, "cannot configure the log", s);
    std::fprintf(stderr,
                 "foreman train: worker %d of %d (%s): MLP %s, %s (learning rate %g), batch %lld, data seed %lld, "
                 "%lld threads; the chief (worker 0) writes the checkpoints\n",
                 job.cluster->task.task_index, job.cluster->spec.num_tasks("worker"),
                 job.server->target().c_str(), Architecture(job.spec).c_str(),
                 nn::OptimizerKindName(job.optimizer.kind).c_str(), job.learning_rate,
                 static_cast<long long>(f.batch_size), static_cast<long long>(f.seed + job.cluster->task.task_index),
                 static_cast<long long>(f.threads));
    return std::nullopt;
  }
  if (Status s = WriteTrainSettings(job.env, dir, TrainSettings(f)); !s.ok()) {
    return job.Exit(kExitUsage, "cannot write to the checkpoint directory", s);
  }
  LogOptions log;
  log.file_path = dir + "/train.log";
  log.stderr_level = job.tty ? LogLevel::kWarning : LogLevel::kInfo;
  if (Status s = ConfigureLogging(log); !s.ok()) return job.Exit(kExitUsage, "cannot write the log", s);
  std::fprintf(stderr,
               "foreman train: MLP %s, %s (learning rate %g), batch %lld, %s, seed %lld, %s; "
               "checkpoints in %s\n",
               Architecture(job.spec).c_str(), nn::OptimizerKindName(job.optimizer.kind).c_str(), job.learning_rate,
               static_cast<long long>(f.batch_size),
               job.total_steps > 0 ? absl::StrCat(job.total_steps, " steps").c_str() : "until stopped",
               static_cast<long long>(f.seed),
               job.on_gpu() ? job.device.c_str() : absl::StrCat(f.threads, " threads").c_str(), dir.c_str());
  if (job.cluster) {
    std::fprintf(stderr, "foreman train: the chief (worker 0 of %d, %s) of the cluster %s\n",
                 job.cluster->spec.num_tasks("worker"), job.server->target().c_str(),
                 job.cluster->spec.ToString().c_str());
    if (job.cluster->replicas_to_aggregate > 0) {
      std::fprintf(stderr,
                   "foreman train: synchronous training: each update averages %d of the %d workers' gradients of "
                   "one global_step (--replicas-to-aggregate, --total-num-replicas); stale ones are dropped\n",
                   job.cluster->replicas_to_aggregate, job.cluster->total_num_replicas);
    }
  }
  if (!f.restart_policy.empty()) {
    std::fprintf(stderr, "foreman train: restart policy %s\n",
                 RestartPolicyText(*ParseRestartPolicy(f.restart_policy)).c_str());
  }
  return std::nullopt;
}

// Under --restart-policy: one line per restart or removal the session's
// supervisor performed, on stdout (foreman chaos reads them), with every
// summary step and checkpoint save it lost; the reason last (free text).
void PrintServiceRestarts(const std::vector<ServiceRestart>& restarts) {
  int n = 0;
  for (const ServiceRestart& r : restarts) {
    std::string line = absl::StrCat("service restart ", ++n, ": ", r.service, r.restarted ? " restarted" : " removed");
    if (r.events_lost >= 0) {
      absl::StrAppend(&line, "; summary steps lost: [", absl::StrJoin(r.steps_lost, ", "), "]");
    }
    if (!r.saves_lost.empty()) absl::StrAppend(&line, "; checkpoint saves lost: [", absl::StrJoin(r.saves_lost, ", "), "]");
    if (r.by_strategy && r.restarted) {
      absl::StrAppend(&line, "; stopped with a failed sibling (the restart strategy)");
    } else {
      absl::StrAppend(&line, "; after: ",
                      r.reason.ok() ? "a normal exit" : r.reason.ToString(absl::StatusToStringMode::kWithNoExtraData));
    }
    std::printf("%s\n", line.c_str());
  }
  if (n > 0) std::fflush(stdout);
}

// 9. The report on stdout.
int Report(const TrainJob& job, const SignalWatcher& watcher, double wall) {
  const TrainFlags& f = job.f;
  const std::string& dir = f.checkpoint_dir;
  if (job.eval != nullptr) {
    if (const auto& eval = job.eval->last()) {
      std::printf("test accuracy: %.4f (test loss %.4f, %lld examples, global_step %lld)\n", eval->accuracy,
                  eval->loss, static_cast<long long>(job.test_examples), static_cast<long long>(eval->step));
    }
  }
  // In a cluster global_step counts every worker's updates: a worker
  // reports its own steps, and its rate from its first step (not from the
  // wait for the chief).
  const int64_t trained = job.cluster ? job.model->steps : job.progress->steps_trained();
  double rate = job.progress->steps_per_sec();
  if (job.cluster) {
    const double secs = job.model->first_step
                            ? std::chrono::duration<double>(std::chrono::steady_clock::now() - *job.model->first_step).count()
                            : 0.0;
    rate = secs > 0 ? static_cast<double>(trained) / secs : 0.0;
  }
  if (trained > 0) {
    std::printf("%strained %lld steps in %.1f s (%.1f steps/s, %.0f examples/s)\n", job.task_prefix().c_str(),
                static_cast<long long>(trained), wall, rate,
                wall > 0 ? static_cast<double>(job.model->examples) / wall : 0.0);
  } else if (job.cluster) {
    std::printf("%strained no step\n", job.task_prefix().c_str());
  } else if (!watcher.signalled()) {
    std::printf("nothing to train: the restored run already reached its end (--max-steps %lld, --epochs %lld)\n",
                static_cast<long long>(f.max_steps), static_cast<long long>(f.epochs));
  }
  const data::InputPipeline::Stats pipeline_stats =
      job.model->pipeline != nullptr ? job.model->pipeline->stats() : data::InputPipeline::Stats{};
  if (pipeline_stats.batches > 0) {
    std::printf("input pipeline: %lld batches, the step waited for %lld of them\n",
                static_cast<long long>(pipeline_stats.batches), static_cast<long long>(pipeline_stats.waits));
  }
  if (job.end_training != nullptr && job.end_training->final_step()) {
    std::printf("training ended at global_step %lld\n", static_cast<long long>(*job.end_training->final_step()));
  }
  if (job.model->ended_by_chief) {
    std::printf("%sthe chief ended training (its update was refused: OUT_OF_RANGE); exiting\n",
                job.task_prefix().c_str());
  }
  if (job.owns_directory()) {
    auto latest = LatestCheckpoint(job.env, dir);
    const std::string latest_text = latest.ok() && latest->has_value() ? **latest : "(none)";
    std::printf("checkpoints: %s (latest: %s)\n", dir.c_str(), latest_text.c_str());
    std::printf("events: %s (training), %s/eval (test set)\n", dir.c_str(), dir.c_str());
  }
  if (watcher.signalled()) {
    std::printf("stopped by %s after its final checkpoint\n", SignalName(watcher.signal_number()));
  }
  if (std::fflush(stdout) != 0 || std::ferror(stdout)) {
    std::fprintf(stderr, "foreman train: cannot write the report to stdout: %s\n", std::strerror(errno));
    return kExitFailed;
  }
  return kExitOk;
}

int RunTrain(const CLI::App& cmd, TrainFlags f) {
  SignalWatcher::BlockSignals();
  TrainJob job;
  job.f = std::move(f);
  // The run's one stop: signals (from now on, also while the data loads)
  // and the session both use it; it also enforces the grace period.
  StopRequestOptions stop_options;
  stop_options.grace_period = absl::Seconds(job.f.stop_grace_period_secs);
  job.phase = std::make_shared<RunPhase>();
  stop_options.on_grace_expired = [phase = job.phase](absl::Duration grace) { GraceExpired(grace, *phase); };
  job.stop = std::make_shared<StopRequest>(std::move(stop_options));
  SignalWatcher watcher(job.stop, job.phase);
  auto stopped_early = [&]() -> ExitCode {
    if (!job.stop->stop_requested()) return std::nullopt;
    std::printf("stopped by %s before training started; nothing was changed in %s\n",
                SignalName(watcher.signal_number()), job.f.checkpoint_dir.c_str());
    job.stop->Complete();
    return kExitOk;
  };

  // 0. The cluster flags, checked before anything starts. A ps task only
  //    serves: the optimizer flags, then Server::Create and a bounded Join.
  auto cluster = CheckClusterFlags(cmd, job.f);
  if (!cluster.ok()) return Fail(kExitUsage, "bad cluster flags", cluster.status());
  job.cluster = *std::move(cluster);
  if (job.cluster && job.cluster->task.job_name == "ps") {
    if (Status s = ValidateTrainFlags(job.f); !s.ok()) return Fail(kExitUsage, "bad flags", s);
    if (ExitCode code = PlanModel(job)) return *code;
    ServerOptions options;
    options.cluster = job.cluster->options;
    options.optimizer = job.optimizer;
    options.replicas_to_aggregate = job.cluster->replicas_to_aggregate;
    job.phase->ServeAsPs(absl::StrCat("ps task ", job.cluster->task.task_index));
    return RunParameterServer(*job.cluster, options, absl::Seconds(job.f.cluster.ps_join_timeout_secs), *job.stop);
  }

  // Until training starts, a refusal (or a signal) leaves nothing behind:
  // RunPhase::Undo, while the lock is still held.
  ExitCode refused = OpenDirectory(cmd, job);
  if (!refused) refused = PlanModel(job);
  if (!refused) refused = ResolveDevice(job);
  if (!refused) refused = LoadData(job);
  if (!refused) refused = stopped_early();
  if (!refused) refused = BuildModel(job);
  if (!refused) refused = AddHooks(job);
  if (!refused) refused = StartServer(job);
  if (!refused && !job.phase->StartTraining(*job.stop)) refused = stopped_early();
  if (refused) {
    job.phase->Undo();
    return *refused;
  }
  if (ExitCode code = WriteRunFiles(job)) return *code;

  // 8. Train. The directory stays locked (the session's checkpoint saver
  //    uses the lock taken in step 1).
  TestPauseBeforeSession();
  const auto started = std::chrono::steady_clock::now();
  auto session = MonitoredTrainingSession(std::move(job.mts));
  if (!session.ok()) {
    const auto code = session.status().code();
    const bool bad_input = code == absl::StatusCode::kInvalidArgument || code == absl::StatusCode::kNotFound ||
                           code == absl::StatusCode::kFailedPrecondition ||
                           (job.on_gpu() && code == absl::StatusCode::kResourceExhausted);
    return job.Exit(bad_input ? kExitUsage : kExitFailed, "cannot start training", session.status());
  }
  // The input pipeline is one of the session's services (its producer actor
  // inherits the blocked signals): the session's restart policy and actor
  // faults ("input_pipeline") cover it. It starts before the first step.
  // A GPU session gathers its batches on the device: no pipeline.
  if (!job.gather) {
    data::InputPipelineOptions pipeline_options;
    pipeline_options.prefetch_batches = static_cast<int>(job.f.prefetch_batches);
    auto pipeline = (*session)->NewInputPipeline(job.train_set, pipeline_options);
    if (!pipeline.ok()) {
      (*session)->request_stop(pipeline.status());
      (*session)->close().IgnoreError();
      return job.Exit(kExitFailed, "input pipeline", pipeline.status());
    }
    job.model->pipeline = std::move(*pipeline);
  }
  const std::vector<std::string> fetches = {"train_op"};
  while (!(*session)->should_stop()) {
    if (!(*session)->run(fetches).ok()) break;  // close() returns the error (OK after a clean stop)
  }
  const Status closed = (*session)->close();
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  PrintServiceRestarts((*session)->service_restarts());
  if (const int64_t n = (*session)->recoveries(); n > 0) {
    // A lost ps task (or another preemption): what MonitoredSession recovered.
    std::fprintf(stderr, "recoveries: %lld (global steps lost: %lld)\n", static_cast<long long>(n),
                 static_cast<long long>((*session)->steps_lost()));
  }
  if (!closed.ok()) {
    // Out of device memory (the data's upload or the first step, under
    // --device-memory-limit-mb) is a setting to change, not a failure to retry.
    if (job.on_gpu() && absl::IsResourceExhausted(closed)) {
      return job.Exit(kExitUsage, absl::StrCat("out of memory on ", job.device), closed);
    }
    return job.Exit(kExitFailed, "training failed", closed);
  }
  return Report(job, watcher, wall);
}

}  // namespace

void AddTrainCommand(CLI::App& app, int* exit_code) {
  auto flags = std::make_shared<TrainFlags>();
  CLI::App* cmd = app.add_subcommand(
      "train",
      "Train an MLP on Fashion-MNIST under a MonitoredTrainingSession: checkpoints, TensorBoard summaries, "
      "resume from --checkpoint-dir (flags not given take the run's stored values), graceful stop on "
      "SIGINT/SIGTERM/SIGHUP.\n"
      "Exit codes: 0 done (or stopped by a signal after the final checkpoint), 1 training failed, "
      "2 bad flags/data/fault plan or an incompatible or busy --checkpoint-dir (do not restart), "
      "3 an injected fault (--fault-plan) ended the run, 130 a second signal.");
  AddTrainFlags(*cmd, *flags);
  cmd->callback([cmd, flags, exit_code] {
    try {
      *exit_code = RunTrain(*cmd, *flags);
    } catch (const std::bad_alloc&) {
      std::fprintf(stderr, "foreman train: out of memory (try a smaller --hidden or --batch-size)\n");
      *exit_code = kExitFailed;
    }
  });
}

}  // namespace foreman::cli
