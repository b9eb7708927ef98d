// The MLP job's insides (include/foreman/mlp_job.hpp): what the step function
// needs (MlpModel, living as long as the graph), the step on its three paths
// (mlp_step.cpp), and the hooks the job installs (mlp_hooks.cpp): progress,
// the test-set evaluation, and the device copies' lifetime.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "foreman/clock.hpp"
#include "foreman/dataset.hpp"
#include "foreman/env.hpp"
#include "foreman/event_writer.hpp"
#include "foreman/hooks.hpp"
#include "foreman/input_pipeline.hpp"
#include "foreman/mlp_job.hpp"
#include "foreman/mutex.hpp"
#include "foreman/nn.hpp"
#include "foreman/session.hpp"

namespace foreman::train_internal {

inline constexpr char kEpochVariable[] = "input_pipeline/epoch";
inline constexpr char kIndexVariable[] = "input_pipeline/index";
// A training run's global_step after its update (int64 scalar; in a
// cluster ps 0's answer, the other workers' updates included): what the
// progress and the cadences count.
inline constexpr char kUpdatedGlobalStep[] = "updated_global_step";
// Fed with the eval_* fetches (int64 scalar S): the run evaluates only when
// its update reached global_step >= S, else answers eval_global_step -1.
inline constexpr char kEvalFromGlobalStep[] = "eval_from_global_step";

// The fetches of one test-set evaluation (the step's Evaluate), and what
// they answered: the EvalHook's and the evaluator task's (mlp_evaluator.cpp).
inline const std::vector<std::string>& EvalFetches() {
  static const std::vector<std::string> fetches = {"eval_global_step", "eval_accuracy", "eval_loss",
                                                   "eval_summaries"};
  return fetches;
}
inline MlpJobEval EvalOf(const TensorMap& values) {
  MlpJobEval r;
  r.global_step = values.at("eval_global_step").data<int64_t>()[0];
  r.accuracy = values.at("eval_accuracy").data<float>()[0];
  r.loss = values.at("eval_loss").data<float>()[0];
  return r;
}

// The last evaluation the step computed, for the progress hook.
struct EvalRecord {
  Mutex mu;
  int64_t step ABSL_GUARDED_BY(mu) = -1;
  float accuracy ABSL_GUARDED_BY(mu) = 0;
  float loss ABSL_GUARDED_BY(mu) = 0;
};

// What the step function needs; lives as long as the graph. Used by one
// training thread at a time (the session runs one step at a time).
struct MlpModel {
  nn::MlpSpec spec;
  nn::OptimizerOptions optimizer;
  // TF's tf.train.exponential_decay (staircase=False):
  //   learning_rate * decay_rate ^ (global_step / decay_steps)
  double learning_rate = 0.001;
  int64_t decay_steps = 0;  // 0: constant
  double decay_rate = 1.0;
  float current_learning_rate = 0;
  bool warned_zero_rate = false;  // the decayed rate reached 0 (said once)
  std::shared_ptr<MlpJobObserver> observer;
  Clock* clock = nullptr;
  int64_t examples = 0;  // trained on by this process
  int64_t steps = 0;     // train_op runs of this process (in a cluster: this worker's own steps)
  std::optional<absl::Duration> first_step;  // when the first of them started (clock's monotonic time)
  nn::Gradients grads;   // a cluster worker's step: its gradients, reused
  bool ended_by_chief = false;  // a cluster worker's update was refused: the chief ended training
  std::string end_of_training;  // that refusal's message
  std::unique_ptr<nn::Mlp> mlp;
  MlpJobInput input = MlpJobInput::kInputPipeline;
  std::unique_ptr<data::InputPipeline> pipeline;  // kInputPipeline's, from StartInput
  absl::Duration batch_timeout = absl::Seconds(60);
  std::shared_ptr<const data::Dataset> train_set;
  // The gathered path: the data sets copied to the device once (uint8),
  // batches gathered there in the order train_set->Order(epoch) gives --
  // the order the pipeline reads.
  bool gather = false;
  data::LabeledImages train_images;  // uploaded at a session's first step (kept for a recovery's new session)
  data::LabeledImages test_images;
  std::unique_ptr<nn::DeviceExamples> device_train;
  std::unique_ptr<nn::DeviceExamples> device_test;
  // The pipelined step on an asynchronous device (mlp_step.cpp,
  // docs/gpu.md "Statistics one step late"): run N finishes step N - 1 and
  // launches step N. The step StopAtStepHook ends at (0: none), whose run
  // reads its own statistics; the session the step in flight belongs to
  // (its device and variables); and the statistics a run read for its own
  // step, which the next run reports as its step N - 1's.
  int64_t last_step = 0;
  std::weak_ptr<const void> pipeline_device;
  const VariableStore* pipeline_vars = nullptr;
  std::optional<nn::StepResult> own_statistics;
  data::Batch test;  // the whole test set, in file order (the host path's evaluation)
  std::vector<std::string> histogram_variables;
  // Page-locked buffers (the resident device's AllocateHostTensor) the
  // histograms of device-resident variables are copied into, in one batch,
  // reused between summaries (mlp_step.cpp HistogramValues).
  std::map<std::string, Tensor> histogram_buffers;
  std::shared_ptr<EvalRecord> eval;
  // A cluster's chief: more scalars for its "summaries" (steps_per_sec/worker_K).
  std::function<std::vector<std::string>()> extra_summaries;
};

// The step function (mlp_step.cpp; fetches as in mlp_job.hpp).
Status MlpStep(MlpModel& m, StepContext& ctx);

// Reports step, loss, accuracy and steps/s to the observer after each run
// that trained, and a new evaluation before it and at the end. Reads "loss",
// "accuracy" and kUpdatedGlobalStep each run (the step computes them
// anyway): in a cluster the cluster's global_step after this run's update,
// and the rate is that of the cluster's global_step.
class ProgressHook : public SessionRunHook {
 public:
  ProgressHook(int64_t total_steps, std::shared_ptr<MlpJobObserver> observer, std::shared_ptr<EvalRecord> eval,
               Clock* clock)
      : total_(total_steps), observer_(std::move(observer)), eval_(std::move(eval)), clock_(clock) {}
  std::string name() const override { return "ProgressHook"; }
  Status after_create_session(Session* session, Coordinator*) override;
  StatusOr<SessionRunArgs> before_run(SessionRunContext&) override;
  Status after_run(SessionRunContext&, const SessionRunValues& values) override;
  Status end(Session*) override;

  int64_t steps_trained() const { return step_ - start_step_.value_or(step_); }
  double steps_per_sec() const { return rate_; }

 private:
  void ReportEval();

  const int64_t total_;
  const std::shared_ptr<MlpJobObserver> observer_;
  const std::shared_ptr<EvalRecord> eval_;
  Clock* const clock_;
  std::optional<int64_t> start_step_;
  int64_t step_ = 0;
  int64_t rate_start_step_ = 0;
  int64_t reported_eval_step_ = -1;
  float loss_ = 0;
  float accuracy_ = 0;
  double rate_ = 0;
  absl::Duration start_;
};

// The test-set evaluation, into <checkpoint_dir>/eval (TF Estimator's
// layout): every `every_steps` global steps, at the multiples (500, 1000,
// ...), and once more at the end, at the final global_step, unless that step
// was just evaluated; the end's values are the run's reported test accuracy.
// In a cluster the other workers' updates carry global_step forward between
// two of the chief's runs: the chief evaluates at its first run whose update
// reaches or passes each multiple (StepMultiplesCrossed > 0), once for all
// the multiples that run passed, at the step it reached (docs/train.md
// "Evaluation").
// The step function evaluates after the run's update, so a run whose
// pre-run global_step is N-1 yields the evaluation at N. (TF's
// SummarySaverHook fires on the first run, whose post-update step is 1, and
// every N steps from there: 1, 501, ...; and it writes nothing at the end.)
// A run that trained nothing (a finished run started again) reports but
// writes no second event at a step already evaluated. The event file is
// created at the first evaluation. Each session (the first, and each one a
// recovery creates) starts from a restored global_step C: before the first
// evaluation it writes, a SessionLog START at C+1 (B154, as the
// SummarySaverHook's B114), so TensorBoard discards the evaluations a killed
// or failed run wrote after its last checkpoint, which this run writes again.
class EvalHook : public SessionRunHook {
 public:
  // `cluster`: the session is a cluster worker's (global_step may advance
  // by more than one per run).
  EvalHook(std::string output_dir, int64_t every_steps, Env* env, bool cluster = false)
      : output_dir_(std::move(output_dir)), every_(every_steps), env_(env), cluster_(cluster) {}
  std::string name() const override { return "EvalHook"; }
  Status after_create_session(Session* session, Coordinator*) override;
  StatusOr<SessionRunArgs> before_run(SessionRunContext& ctx) override;
  Status after_run(SessionRunContext&, const SessionRunValues& values) override;
  Status end(Session* session) override;

  // The last evaluation (the final one after end()).
  const std::optional<MlpJobEval>& last() const { return last_; }

 private:
  Status Record(const TensorMap& values, bool write = true);

  const std::string output_dir_;
  const int64_t every_;
  Env* const env_;
  const bool cluster_;
  int64_t covered_ = 0;  // the last evaluated step, or the session's first: its multiples are done
  std::optional<int64_t> start_step_;
  std::optional<int64_t> restart_at_;  // a START not yet written: the last session's restored step + 1
  std::optional<MlpJobEval> last_;
  std::unique_ptr<EventFileWriter> writer_;
};

// Frees the device copies of the data at the end of a gathering session
// (after EvalHook's final evaluation: the last hook's end()), while its
// device lives. The Mlp's workspace stays until the Mlp's next step or its
// end: a device that goes first frees its memory itself
// (compute::Device::lifetime), as it does the data's after a failed run
// (whose close() skips end()).
class DeviceExamplesHook : public SessionRunHook {
 public:
  explicit DeviceExamplesHook(std::shared_ptr<MlpModel> model) : model_(std::move(model)) {}
  std::string name() const override { return "DeviceExamplesHook"; }
  Status end(Session*) override {
    model_->device_train.reset();
    model_->device_test.reset();
    model_->histogram_buffers.clear();
    return absl::OkStatus();
  }

 private:
  std::shared_ptr<MlpModel> model_;
};

// Finishes the step a pipelined run left in flight (mlp_step.cpp) in its
// end(), and fails it as NanTensorHook would on a NaN loss: first among the
// chief's hooks (MlpJob::SessionOptions puts it in chief_only_hooks), so that
// a NaN in a last step no run read fails the session before the
// CheckpointSaverHook's final save (B12's order, B39, B119).
class PendingStepHook : public SessionRunHook {
 public:
  explicit PendingStepHook(std::shared_ptr<MlpModel> model) : model_(std::move(model)) {}
  std::string name() const override { return "PendingStepHook"; }
  Status end(Session*) override;

 private:
  std::shared_ptr<MlpModel> model_;
};

// NanTensorHook's failure (fail_on_nan_loss): logs "Model diverged with loss
// = NaN." and returns NanLossDuringTrainingError("NaN loss during training.").
Status NanLossFailure();

}  // namespace foreman::train_internal
