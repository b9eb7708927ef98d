// The MLP training job: `foreman train`'s model and training program as a
// library object (TF: a canned estimator such as DNNClassifier, with its
// model_fn, input_fn and evaluation, run under MonitoredTrainingSession).
// It builds the graph (global_step, the MLP's variables and optimizer slots,
// the input position input_pipeline/epoch and input_pipeline/index, so that a
// checkpoint resumes the data stream), the step function, and the hooks:
// NanTensorHook on "loss", StopAtStepHook at max_steps, progress reporting,
// the test-set evaluation into <checkpoint_dir>/eval, and the device copies'
// lifetime. The caller owns the MonitoredTrainingSession and its loop.
//
// The step trains one batch on one of three paths: the session's input
// pipeline (CPU, the default), batches gathered on the session's device from
// a resident copy of the data (a device without host memory, a GPU; or any
// device with MlpJobInput::kGatherOnDevice), or, on a cluster session (TF1
// between-graph replication), gradients computed here and applied by the
// parameter servers (StepContext::ApplyGradients). The learning rate follows
// TF's exponential_decay at the step's global_step.
//
// Fetches the step answers:
//   train_op          one batch: forward, backward, update, global_step += 1
//   loss, accuracy    of that batch, before the update (float32 scalars)
//   summaries         loss, accuracy, learning_rate, the weights' histograms
//   eval_accuracy, eval_loss, eval_summaries, eval_global_step
//                     the whole test set with the weights after this run's
//                     update (no update of its own), and their global_step;
//                     fed "eval_from_global_step" (int64 S), only when this
//                     run's update reached global_step >= S (else
//                     eval_global_step is -1): a cluster chief's cadence
//   updated_global_step global_step after this run's update (int64; in a
//                     cluster the other workers' updates included)
// OUT_OF_RANGE after the last epoch ends training cleanly. Every hooked
// run trains (fetches "train_op"): NanTensorHook and the progress hook read
// its loss, so a hooked run without it is NOT_FOUND; fetch without training
// on run_step_fn's raw session (MonitoredStepContext::session, no hooks).
//
//   ```cpp
//   #include "foreman/mlp_job.hpp"
//   #include "foreman/monitored_session.hpp"
//   foreman::MlpJobOptions options;
//   options.settings.checkpoint_dir = "mlp_job_dir";
//   options.settings.hidden = "8";
//   options.settings.max_steps = 20;
//   options.settings.batch_size = 50;
//   options.settings.device = "cpu";
//   options.data = foreman_doc::ExampleImages();   // or data::LoadFashionMnist(env, dir)
//   FOREMAN_ASSIGN_OR_RETURN(auto job, foreman::MlpJob::Create(std::move(options)));
//   FOREMAN_ASSIGN_OR_RETURN(auto sess, foreman::MonitoredTrainingSession(job->SessionOptions()));
//   FOREMAN_RETURN_IF_ERROR(job->StartInput(*sess));
//   while (!sess->should_stop()) {
//     if (!sess->run({"train_op"}).ok()) break;  // close() returns the error
//   }
//   FOREMAN_RETURN_IF_ERROR(sess->close());
//   // The final evaluation is at the last step: max_steps (before the 15 epochs' end).
//   if (job->result().eval->global_step != job->total_steps()) return absl::InternalError("not at the end");
//   ```
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "foreman/clock.hpp"
#include "foreman/dataset.hpp"
#include "foreman/env.hpp"
#include "foreman/graph.hpp"
#include "foreman/hooks.hpp"
#include "foreman/mlp_job_settings.hpp"
#include "foreman/monitored_session.hpp"
#include "foreman/nn.hpp"
#include "foreman/status.hpp"
#include "foreman/stop.hpp"

namespace foreman {

/// What the settings define, checked before any data is loaded.
struct MlpJobPlan {
  /// The layers; input_dim is 784 until MlpJob::Create takes the data's.
  nn::MlpSpec spec;
  /// The optimizer, its learning_rate the initial rate.
  nn::OptimizerOptions optimizer;
  /// The initial learning rate (settings or DefaultLearningRate).
  double learning_rate = 0;
};

/// Plans the job: resolves settings.threads (0: one per CPU this process may
/// run on, as TF counts them: sched_getaffinity), parses the layers and the
/// optimizer, and checks the session's schedules
/// (PlanMonitoredTrainingSession). INVALID_ARGUMENT for a model whose
/// variables and optimizer slots would exceed 16 GiB ("--hidden <text>: the
/// model and its optimizer slots would take <x> GiB (at most 16 GiB)") and
/// for schedules MonitoredTrainingSession refuses. REQUIRES:
/// ValidateMlpJobSettings(settings) is OK. Thread-safe.
StatusOr<MlpJobPlan> PlanMlpJob(MlpJobSettings& settings);

/// The session device for settings.device (SessionConfig.device).
struct MlpJobDevice {
  /// "/cpu:0" or "/gpu:N".
  std::string device;
  /// For "auto": what was chosen and why, one sentence ("--device auto: no
  /// usable GPU (...); training on the CPU"); empty otherwise.
  std::string note;
};

/// Resolves settings.device before the data loads: "cpu" is the CPU;
/// "gpu:N" must be usable (a session is made there on an empty graph, under
/// settings.device_memory_limit_mb): its FAILED_PRECONDITION (no CUDA in
/// this build, no driver, no such device), UNIMPLEMENTED or
/// RESOURCE_EXHAUSTED otherwise; "auto" is GPU 0 when a session can be made
/// there, else the CPU (never an error). `env` goes to the probe's
/// SessionConfig (nullptr: Env::Default()). Thread-safe.
StatusOr<MlpJobDevice> ResolveMlpJobDevice(const MlpJobSettings& settings, Env* env = nullptr);

/// Where the training step's batches come from.
enum class MlpJobInput {
  /// The session's input pipeline (MonitoredSession::NewInputPipeline, a
  /// supervised service prefetching settings.prefetch_batches batches):
  /// foreman train on the CPU. Needs StartInput(session).
  kInputPipeline,
  /// Dataset::GetBatch on the training thread, no prefetching (as a plain
  /// loop; what a benchmark against another framework's loop compares).
  kOnTrainingThread,
  /// The data copied once to the session's device (nn::DeviceExamples,
  /// uint8) and each batch gathered there in the order the pipeline reads
  /// (Dataset::Order at the saved position): the path of a device without
  /// host memory, which always takes it; on the CPU it gives bitwise the
  /// pipeline's weights. Not on a cluster session.
  kGatherOnDevice,
};

/// One trained step, for an observer.
struct MlpJobProgress {
  int64_t global_step = 0;  ///< after the step
  int64_t total_steps = 0;  ///< MlpJob::total_steps() (0: no limit known)
  float loss = 0;           ///< the batch's, before the update
  float accuracy = 0;       ///< the batch's, before the update
  double steps_per_sec = 0; ///< since the latest session was created
};

/// One test-set evaluation (float32 accuracy in [0, 1], mean cross-entropy).
struct MlpJobEval {
  int64_t global_step = 0;
  float accuracy = 0;
  float loss = 0;
};

/// Where the job's progress and warnings go (the library prints nothing);
/// foreman train's prints its progress bar and lines on stderr. Called on
/// the training thread, one call at a time. The defaults do nothing.
class MlpJobObserver {
 public:
  virtual ~MlpJobObserver() = default;
  /// After every run that trained a step.
  virtual void OnStep(const MlpJobProgress& progress);
  /// An evaluation made during a run (every eval_every_steps), before that
  /// run's OnStep. The final one, made at the session's end, is
  /// MlpJobResult::eval.
  virtual void OnEval(const MlpJobEval& eval);
  /// A warning, one English sentence without a trailing newline: the
  /// learning rate decayed to 0 (said once).
  virtual void OnWarning(const std::string& warning);
  /// The session's end (the progress hook's end()), once per session.
  virtual void OnEnd();
};

/// This process's task in a cluster session (TF1 between-graph replication).
struct MlpJobClusterTask {
  /// The worker's index: its data order is shuffled with settings.seed +
  /// task_index, and the input position variables are the worker's own
  /// (Graph::SetVariableDevice "/job:worker"); the chief's checkpoints carry
  /// worker 0's.
  int task_index = 0;
  /// The chief (worker 0) writes the checkpoints and the evaluation; the
  /// others write nothing (no checkpoint_dir in SessionOptions).
  bool is_chief = true;
  /// The cluster has an evaluator task (RunMlpEvaluator): it is the one
  /// writer of <checkpoint_dir>/eval, and the chief evaluates nothing (no
  /// evaluation hook; MlpJobResult::eval stays nullopt), as TF's chief in a
  /// distributed train_and_evaluate.
  bool has_evaluator = false;
};

struct MlpJobOptions {
  /// Checked by Create with ValidateMlpJobSettings (its INVALID_ARGUMENT,
  /// naming the field by its flag); threads 0 is resolved by Create.
  MlpJobSettings settings;
  /// The training and test sets (moved in): data::LoadFashionMnist's, or
  /// any images of the same layout (labels < 10).
  data::FashionMnist data;
  /// The session's device, resolved (ResolveMlpJobDevice): "/cpu:0" or
  /// "/gpu:N".
  std::string device = "/cpu:0";
  MlpJobInput input = MlpJobInput::kInputPipeline;
  /// The evaluation's event files and the session's file system (nullptr:
  /// Env::Default()); not owned.
  Env* env = nullptr;
  /// The progress rate's time source (nullptr: Clock::Real()); not owned.
  Clock* clock = nullptr;
  /// Progress and warnings (null: none).
  std::shared_ptr<MlpJobObserver> observer;
  /// Set for a task of a cluster; the session's master, the chief-only
  /// hooks and the workers' waits are the caller's (SessionOptions).
  std::optional<MlpJobClusterTask> cluster;
  /// More serialized Summary protos for the "summaries" fetch at each
  /// summary step (a cluster chief's per-worker step rates); called on the
  /// training thread.
  std::function<std::vector<std::string>()> extra_summaries;
  /// Hooks that run before the job's own (fault injection); and a wrapper
  /// of the step function (given the job's, returns the graph's step).
  std::vector<std::shared_ptr<SessionRunHook>> first_hooks;
  std::function<StepFn(StepFn)> wrap_step;
};

/// What the job did, for a report (MlpJob::result()).
struct MlpJobResult {
  /// The last evaluation: after close(), the final one (at the final
  /// global_step); nullopt before any.
  std::optional<MlpJobEval> eval;
  /// Examples in the test set.
  int64_t test_examples = 0;
  /// Global steps the sessions of this job advanced from their first
  /// restored step, and the rate of the latest session (the progress).
  int64_t steps_trained = 0;
  double steps_per_sec = 0;
  /// train_op runs of this process (in a cluster: this worker's own), the
  /// examples they trained on, and their rate since the first of them.
  int64_t local_steps = 0;
  int64_t examples = 0;
  double local_steps_per_sec = 0;
  /// The input pipeline's batches and how many of them the step waited for.
  int64_t pipeline_batches = 0;
  int64_t pipeline_waits = 0;
  /// A cluster worker's update was refused because the chief ended training
  /// (StepContext::ApplyGradients' OUT_OF_RANGE): the run ended there.
  /// Also set when `foreman cluster stop` (EndClusterTraining) ended it.
  bool ended_by_chief = false;
  /// Then the refusal's message, naming the ps task, who ended training
  /// ("the chief" or "`foreman cluster stop`") and the global_step.
  std::string end_of_training;
};

/// `--epochs` in a cluster (`foreman train`'s rule for it): the cluster's
/// global steps for `epochs` passes over `train_examples` examples in
/// batches of `batch_size`, ceil(epochs x train_examples / batch_size),
/// whichever workers' batches they are (asynchronous training: one global
/// step per worker batch; with replicas_to_aggregate R each global step
/// averages R batches). 0 when any argument is <= 0. Pure, thread-safe.
int64_t ClusterStepsForEpochs(int64_t epochs, int64_t train_examples, int64_t batch_size);

/// The job. Its sessions share its graph and hooks (shared pointers): a
/// session may outlive the MlpJob. One session at a time, on the thread
/// that runs it; SessionOptions and result() are not called during a run.
class MlpJob {
 public:
  /// Builds the data sets (the training set shuffled per epoch with the
  /// seed, batch_size, epochs; the test set in file order), the model, the
  /// graph and the hooks. Errors, each message naming what was built:
  ///   INVALID_ARGUMENT  "bad training data in <data_dir>: ...", "bad test
  ///                     data in <data_dir>: ...", "bad model: ...";
  ///                     kGatherOnDevice with a cluster task;
  ///                     ValidateMlpJobSettings's; PlanMlpJob's
  ///   other codes       "building the model: ...", "test data: ...",
  ///                     "hooks: ..." (internal errors)
  static StatusOr<std::unique_ptr<MlpJob>> Create(MlpJobOptions options);
  ~MlpJob();
  MlpJob(const MlpJob&) = delete;
  MlpJob& operator=(const MlpJob&) = delete;

  /// MonitoredTrainingSession's options for this job: the graph; the
  /// settings' checkpoint_dir (none for a cluster's non-chief task),
  /// schedules, log_step_count_steps, stop_grace_period_secs, threads,
  /// device and memory limit; config.env; is_chief; runtime.restart from
  /// settings.restart_policy; and the hooks, in order: first_hooks,
  /// NanTensorHook("loss"), the progress hook, StopAtStepHook(max_steps)
  /// when max_steps > 0 (a cluster task: at total_steps() when > 0), the
  /// evaluation hook (last among those that write, so that its end()
  /// evaluates the final checkpoint's weights; only with a checkpoint_dir), and when gathering the hook that frees the device's
  /// copies of the data at end(). When gathering, also chief_only_hooks = {
  /// the hook whose end() finishes a step still running on an asynchronous
  /// device and fails on its NaN loss before the final checkpoint } (the
  /// caller adds its own chief_only_hooks to it, not in its place; a
  /// non-chief gets it first in hooks). The caller adds what is not the job's: a
  /// RunDirectory (AttachTo), runtime.stop, listeners, a cluster's master.
  /// A caller that passes its own runtime.stop makes that StopRequest's
  /// grace_period the settings' stop_grace_period_secs, or resets
  /// stop_grace_period_secs (a different value is INVALID_ARGUMENT at
  /// creation; see MonitoredSessionOptions::stop_grace_period_secs).
  /// Each call returns the same hooks.
  MonitoredTrainingSessionOptions SessionOptions() const;

  /// With kInputPipeline: the session's input pipeline
  /// (session.NewInputPipeline, settings.prefetch_batches ahead), once per
  /// session, after it is created and before its first run (it replaces an
  /// earlier session's); a training step without it is FAILED_PRECONDITION.
  /// A no-op for the other inputs. NewInputPipeline's errors. Not
  /// thread-safe.
  Status StartInput(MonitoredSession& session);

  const MlpJobSettings& settings() const;
  const MlpJobPlan& plan() const;  ///< spec.input_dim is the data's
  const std::shared_ptr<Graph>& graph() const;
  /// The last global_step the run may reach: min(max_steps, the epochs'
  /// steps) over those that are set; 0: no limit. The epochs' steps: one
  /// process, epochs x batches per epoch (the last batch of an epoch is
  /// its remainder); a cluster task, ClusterStepsForEpochs (the cluster's
  /// global steps, shared by all workers, each of which stops there by a
  /// StopAtStepHook as at max_steps).
  int64_t total_steps() const;
  /// Whether batches are gathered on the device (kGatherOnDevice, or a
  /// device other than the CPU).
  bool gathers_on_device() const;
  /// What the job did so far. Not concurrently with a run.
  MlpJobResult result() const;

 private:
  struct Impl;
  explicit MlpJob(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

/// RunMlpEvaluator's options.
struct MlpEvaluatorOptions {
  /// The model flags (hidden, optimizer, seed, threads, ...) must be the
  /// training's, so that its checkpoints restore; checkpoint_dir is the
  /// training's directory, read only (no lock taken) except for
  /// <checkpoint_dir>/eval, which the evaluator writes. Checked with
  /// ValidateMlpJobSettings, as MlpJob::Create does.
  MlpJobSettings settings;
  /// The test set (and the training set, which is not read), moved in.
  data::FashionMnist data;
  /// The evaluation session's device, resolved: "/cpu:0" or "/gpu:N".
  std::string device = "/cpu:0";
  /// The training's last global_step (TF: max_steps): the loop ends after
  /// evaluating a checkpoint at global_step >= last_step. 0: no such end
  /// (only the timeout or a stop ends it).
  int64_t last_step = 0;
  /// Between two looks for a new checkpoint, in ms (> 0).
  int64_t poll_interval_ms = 1000;
  /// The longest wait for a new checkpoint, in ms (> 0; TF's `timeout` of
  /// checkpoints_iterator), from the start or from the last evaluation.
  int64_t timeout_ms = 600'000;
  /// Checkpoints are read and the event file written through it (nullptr:
  /// Env::Default()); the waits are timed on `clock` (nullptr:
  /// Clock::Real()). Not owned.
  Env* env = nullptr;
  Clock* clock = nullptr;
  /// A request on it ends the wait (null: none). Not owned beyond the call.
  std::shared_ptr<StopRequest> stop;
  /// After each evaluation (its checkpoint's prefix), and for each
  /// checkpoint skipped (a warning, one English sentence), on the calling
  /// thread. Empty: nothing is said.
  std::function<void(const std::string& prefix, const MlpJobEval& eval)> on_eval;
  std::function<void(const std::string& warning)> on_warning;
};

/// What RunMlpEvaluator did.
struct MlpEvaluatorResult {
  /// Every evaluation written, in order (increasing global_step).
  std::vector<MlpJobEval> evals;
  /// Checkpoints listed but gone or not whole when read, skipped.
  int64_t skipped = 0;
  /// The loop ended on a stop request (after any evaluation in progress).
  bool stopped = false;
};

/// TF's evaluator task (tf.estimator's _TrainingExecutor.run_evaluator over
/// tf.train.checkpoints_iterator): waits for a checkpoint of
/// settings.checkpoint_dir newer than the last one evaluated (looking every
/// poll_interval_ms, LatestCheckpoint: the newest that verifies), restores
/// it into a local session of the MLP's graph (no cluster; SessionManager's
/// prepare_session on the exact prefix), evaluates the whole test set as
/// the chief's evaluation does (the graph's eval_* fetches, no training) and
/// writes its "accuracy" and "loss" into <checkpoint_dir>/eval at the
/// checkpoint's global_step. Only the newest checkpoint is evaluated when
/// several appeared during one evaluation (checkpoints_iterator's rule). A
/// checkpoint that is gone or does not verify when read (max_to_keep
/// deleted it) is skipped with a warning ("checkpoint <prefix> not found or
/// not whole, skipping: ..."), as TF logs and skips it. Ends:
///   OK                 after evaluating a checkpoint at global_step >=
///                      last_step; or on a stop request (result.stopped)
///   DEADLINE_EXCEEDED  no new checkpoint within timeout_ms: "no new
///                      checkpoint in <dir> within <N> ms (...)"
///   INVALID_ARGUMENT   bad settings or options (naming them), a
///                      checkpoint that does not fit the model (the
///                      restore's message: wrong --hidden, --optimizer)
///   other codes        MlpJob::Create's, the event file's, the session's
/// Blocks the calling thread; thread-safe (no state shared between calls;
/// two calls on one directory would both write its eval/).
StatusOr<MlpEvaluatorResult> RunMlpEvaluator(MlpEvaluatorOptions options);

}  // namespace foreman
