// The MLP training job (include/foreman/mlp_job.hpp): the plan, the device,
// and the job that builds the data sets, the model, the graph and the hooks
// (the step and the hooks themselves: mlp_step.cpp, mlp_hooks.cpp).
#include "foreman/mlp_job.hpp"

#include <sched.h>

#include <algorithm>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "foreman/cuda.hpp"
#include "foreman/restart_policy.hpp"
#include "foreman/session.hpp"
#include "train/mlp_model.hpp"

namespace foreman {

using train_internal::DeviceExamplesHook;
using train_internal::PendingStepHook;
using train_internal::EvalHook;
using train_internal::EvalRecord;
using train_internal::kEpochVariable;
using train_internal::kIndexVariable;
using train_internal::MlpModel;
using train_internal::ProgressHook;

namespace {

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

// The schedules and threads of `settings` on `options`.
void SetSchedules(const MlpJobSettings& f, MonitoredTrainingSessionOptions& mts) {
  mts.checkpoint_dir = f.checkpoint_dir;
  if (f.save_checkpoint_secs) mts.save_checkpoint_secs = *f.save_checkpoint_secs;
  if (f.save_checkpoint_steps) mts.save_checkpoint_steps = *f.save_checkpoint_steps;
  if (f.save_summaries_steps) mts.save_summaries_steps = *f.save_summaries_steps;
  if (f.save_summaries_secs) mts.save_summaries_secs = *f.save_summaries_secs;
  mts.log_step_count_steps = f.log_step_count_steps;
  mts.stop_grace_period_secs = f.stop_grace_period_secs;
  mts.config.intra_op_parallelism_threads = static_cast<int>(f.threads);
  mts.config.device_memory_limit_bytes = f.device_memory_limit_mb * (int64_t{1} << 20);
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

Status In(const std::string& what, const Status& s) {
  return s.ok() ? s : Status(s.code(), absl::StrCat(what, ": ", s.message()));
}

}  // namespace

int64_t ClusterStepsForEpochs(int64_t epochs, int64_t train_examples, int64_t batch_size) {
  if (epochs <= 0 || train_examples <= 0 || batch_size <= 0) return 0;
  // ceil(epochs * train_examples / batch_size), without overflowing the product.
  const int64_t whole = train_examples / batch_size;
  const int64_t rest = train_examples % batch_size;  // epochs * rest < epochs * batch_size
  return epochs * whole + (epochs * rest + batch_size - 1) / batch_size;
}

void MlpJobObserver::OnStep(const MlpJobProgress&) {}
void MlpJobObserver::OnEval(const MlpJobEval&) {}
void MlpJobObserver::OnWarning(const std::string&) {}
void MlpJobObserver::OnEnd() {}

StatusOr<MlpJobPlan> PlanMlpJob(MlpJobSettings& f) {
  if (f.threads == 0) f.threads = UsableCpus();
  MlpJobPlan plan;
  FOREMAN_ASSIGN_OR_RETURN(plan.spec.hidden, ParseHiddenLayers(f.hidden));
  FOREMAN_ASSIGN_OR_RETURN(plan.optimizer.kind, nn::ParseOptimizerKind(f.optimizer));
  plan.learning_rate = f.learning_rate ? *f.learning_rate : DefaultLearningRate(plan.optimizer.kind);
  plan.optimizer.learning_rate = static_cast<float>(plan.learning_rate);
  constexpr double kMaxModelBytes = 16.0 * (1 << 30);
  if (ModelBytes(plan.spec, plan.optimizer.kind) > kMaxModelBytes) {
    return absl::InvalidArgumentError(
        absl::StrFormat("--hidden %s: the model and its optimizer slots would take %.1f GiB (at most 16 GiB)",
                        f.hidden, ModelBytes(plan.spec, plan.optimizer.kind) / (1 << 30)));
  }
  MonitoredTrainingSessionOptions mts;
  SetSchedules(f, mts);
  mts.graph = std::make_shared<Graph>();  // the plan checks only the schedules
  FOREMAN_RETURN_IF_ERROR(PlanMonitoredTrainingSession(mts).status());
  return plan;
}

StatusOr<MlpJobDevice> ResolveMlpJobDevice(const MlpJobSettings& settings, Env* env) {
  if (env == nullptr) env = Env::Default();
  FOREMAN_ASSIGN_OR_RETURN(const std::string parsed, ParseDeviceSetting(settings.device));
  const int64_t limit = settings.device_memory_limit_mb * (int64_t{1} << 20);
  MlpJobDevice choice;
  if (parsed == "/cpu:0") {
    choice.device = parsed;
  } else if (parsed.empty()) {
    // auto: the CPU unless GPU 0 is usable.
    choice.device = "/cpu:0";
    StatusOr<int> count = cuda::DeviceCount();
    if (!count.ok() || *count == 0) {
      choice.note = absl::StrCat("--device auto: no usable GPU (",
                                 count.ok() ? "no CUDA device" : std::string(count.status().message()),
                                 "); training on the CPU");
    } else if (Status s = ProbeDevice("/gpu:0", limit, env); !s.ok()) {
      choice.note = absl::StrCat("--device auto: GPU 0 cannot be used (", s.message(), "); training on the CPU");
    } else {
      choice.device = "/gpu:0";
      auto info = cuda::GetDeviceInfo(0);
      choice.note = absl::StrCat("--device auto: training on /gpu:0", info.ok() ? absl::StrCat(" (", info->name, ")") : "");
    }
  } else {
    FOREMAN_RETURN_IF_ERROR(ProbeDevice(parsed, limit, env));
    choice.device = parsed;
  }
  return choice;
}

struct MlpJob::Impl {
  MlpJobSettings settings;
  MlpJobPlan plan;
  std::string device;
  std::optional<MlpJobClusterTask> cluster;
  Env* env = nullptr;
  int64_t test_examples = 0;
  int64_t total_steps = 0;
  std::shared_ptr<MlpModel> model;
  std::shared_ptr<Graph> graph;
  std::shared_ptr<ProgressHook> progress;
  std::shared_ptr<EvalHook> eval;  // null without a checkpoint_dir, and on a cluster's other workers
  std::vector<std::shared_ptr<SessionRunHook>> hooks;
  std::shared_ptr<PendingStepHook> pending_step;  // the gathered path's (null otherwise)
  RestartPolicy restart;
};

MlpJob::MlpJob(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
MlpJob::~MlpJob() = default;

StatusOr<std::unique_ptr<MlpJob>> MlpJob::Create(MlpJobOptions options) {
  // The caller's settings may not have come through the CLI's checks.
  FOREMAN_RETURN_IF_ERROR(ValidateMlpJobSettings(options.settings));
  auto impl = std::make_unique<Impl>();
  impl->settings = std::move(options.settings);
  const MlpJobSettings& f = impl->settings;
  FOREMAN_ASSIGN_OR_RETURN(impl->plan, PlanMlpJob(impl->settings));
  if (!f.restart_policy.empty()) {
    FOREMAN_ASSIGN_OR_RETURN(impl->restart, ParseRestartPolicy(f.restart_policy));
  }
  impl->device = options.device;
  impl->cluster = options.cluster;
  impl->env = options.env != nullptr ? options.env : Env::Default();
  const bool gather = options.input == MlpJobInput::kGatherOnDevice || options.device != "/cpu:0";
  if (gather && options.cluster) {
    return absl::InvalidArgumentError(absl::StrCat(
        "MlpJob: batches gathered on the device (", options.device,
        ") need a local session; a cluster task trains on the CPU from the input pipeline or the training thread"));
  }

  // The data: the training set in the job's order (each worker of a
  // cluster reads its own: worker k shuffles with seed + k; worker 0, whose
  // position the checkpoints carry, with the seed, so that a
  // single-process resume continues its order), the test set in file order.
  data::DatasetOptions train_options;
  train_options.batch_size = f.batch_size;
  // A cluster's --epochs is a number of the cluster's global steps (below):
  // each worker reads its data on, and StopAtStepHook ends every worker there.
  train_options.epochs = options.cluster ? 0 : f.epochs;
  train_options.shuffle = true;
  train_options.seed = static_cast<uint64_t>(f.seed) + (options.cluster ? options.cluster->task_index : 0);
  impl->test_examples = options.data.test.labels.num_elements();
  auto model = std::make_shared<MlpModel>();
  if (gather) {
    // Copied to the device at the first step (nn::DeviceExamples::Upload).
    model->train_images = options.data.train;
    model->test_images = options.data.test;
  }
  auto train_set = data::Dataset::Create(std::move(options.data.train), train_options);
  if (!train_set.ok()) return In(absl::StrCat("bad training data in ", f.data_dir), train_set.status());
  data::DatasetOptions test_options;
  test_options.shuffle = false;
  auto test_set = data::Dataset::Create(std::move(options.data.test), test_options);
  if (!test_set.ok()) return In(absl::StrCat("bad test data in ", f.data_dir), test_set.status());
  impl->plan.spec.input_dim = (*train_set)->feature_dim();
  const nn::MlpSpec& spec = impl->plan.spec;
  const nn::OptimizerOptions& optimizer = impl->plan.optimizer;

  // The model.
  model->spec = spec;
  model->optimizer = optimizer;
  model->learning_rate = impl->plan.learning_rate;
  model->current_learning_rate = optimizer.learning_rate;
  model->decay_steps = f.learning_rate_decay_steps;
  model->decay_rate = f.learning_rate_decay_rate;
  model->observer = options.observer;
  model->clock = options.clock != nullptr ? options.clock : Clock::Real();
  model->eval = std::make_shared<EvalRecord>();
  model->input = options.input;
  model->train_set = *train_set;
  model->gather = gather;
  model->extra_summaries = std::move(options.extra_summaries);
  auto mlp = nn::Mlp::Create(spec, optimizer);
  if (!mlp.ok()) return In("bad model", mlp.status());
  model->mlp = std::move(*mlp);
  auto test = (*test_set)->Slice(0, impl->test_examples);
  if (!test.ok()) return In("test data", test.status());
  model->test = std::move(*test);
  for (const std::string& name : nn::MlpVariableNames(spec, optimizer)) {
    if (absl::EndsWith(name, "/kernel") || absl::EndsWith(name, "/bias")) model->histogram_variables.push_back(name);
  }

  // The graph: global_step, the MLP, the data position.
  auto graph = std::make_shared<Graph>();
  Status built = graph->CreateGlobalStep();
  if (built.ok()) built = nn::AddMlpVariables(*graph, spec, optimizer, static_cast<uint64_t>(f.seed));
  if (built.ok()) built = graph->AddVariable(kEpochVariable, Tensor::Scalar<int64_t>(0), /*trainable=*/false);
  if (built.ok()) built = graph->AddVariable(kIndexVariable, Tensor::Scalar<int64_t>(0), /*trainable=*/false);
  if (options.cluster) {
    // Each worker keeps its own data position; the chief's checkpoints carry worker 0's.
    if (built.ok()) built = graph->SetVariableDevice(kEpochVariable, "/job:worker");
    if (built.ok()) built = graph->SetVariableDevice(kIndexVariable, "/job:worker");
  }
  if (built.ok()) built = graph->AddSummaryOp("summaries");
  StepFn step = [model](StepContext& ctx) { return train_internal::MlpStep(*model, ctx); };
  if (options.wrap_step) step = options.wrap_step(std::move(step));
  if (built.ok()) built = graph->SetStep(std::move(step));
  if (!built.ok()) return In("building the model", built);

  // The hooks, after MonitoredTrainingSession's default ones (step counter,
  // summaries, checkpoints).
  const int64_t steps_by_epochs =
      f.epochs <= 0   ? 0
      : options.cluster ? ClusterStepsForEpochs(f.epochs, (*train_set)->num_examples(), f.batch_size)
                        : f.epochs * (*train_set)->batches_per_epoch();
  impl->total_steps = steps_by_epochs;
  if (f.max_steps > 0) impl->total_steps = impl->total_steps > 0 ? std::min(impl->total_steps, f.max_steps) : f.max_steps;
  impl->progress = std::make_shared<ProgressHook>(impl->total_steps, options.observer, model->eval, model->clock);
  NanTensorHook::Options nan;
  nan.loss_tensor = "loss";
  auto nan_hook = NanTensorHook::Create(nan);
  if (!nan_hook.ok()) return In("hooks", nan_hook.status());
  impl->hooks = std::move(options.first_hooks);
  impl->hooks.push_back(*nan_hook);
  impl->hooks.push_back(impl->progress);
  // One process ends at the last epoch by its input's end (OUT_OF_RANGE); a
  // cluster task at the cluster's global step for --epochs as at --max-steps.
  const int64_t last_step = options.cluster ? impl->total_steps : f.max_steps;
  if (last_step > 0) {
    StopAtStepHook::Options stop_options;
    stop_options.last_step = last_step;
    auto stop = StopAtStepHook::Create(stop_options);
    if (!stop.ok()) return In("bad flags", stop.status());
    impl->hooks.push_back(*stop);
  }
  // Last: its end() runs after the CheckpointSaverHook's final save. Only
  // where the directory is this process's (its events go to <dir>/eval).
  // A cluster with an evaluator task: that task is eval/'s one writer.
  const bool is_chief = !options.cluster || options.cluster->is_chief;
  const bool evaluator_elsewhere = options.cluster && options.cluster->has_evaluator;
  if (is_chief && !evaluator_elsewhere && !f.checkpoint_dir.empty()) {
    impl->eval = std::make_shared<EvalHook>(f.checkpoint_dir + "/eval", f.eval_every_steps, impl->env,
                                            options.cluster.has_value());
    impl->hooks.push_back(impl->eval);
  }
  // After EvalHook: its end() evaluates on the device copy of the test set.
  if (gather) impl->hooks.push_back(std::make_shared<DeviceExamplesHook>(model));
  // A pipelined step's last statistics, before the final checkpoint (SessionOptions).
  if (gather) impl->pending_step = std::make_shared<PendingStepHook>(model);
  model->last_step = options.cluster ? 0 : last_step;
  impl->model = std::move(model);
  impl->graph = std::move(graph);
  return std::unique_ptr<MlpJob>(new MlpJob(std::move(impl)));
}

MonitoredTrainingSessionOptions MlpJob::SessionOptions() const {
  const Impl& j = *impl_;
  MonitoredTrainingSessionOptions mts;
  SetSchedules(j.settings, mts);
  mts.config.device = j.device;
  mts.config.env = j.env;
  mts.graph = j.graph;
  mts.hooks = j.hooks;
  mts.runtime.restart = j.restart;
  if (j.cluster) {
    mts.is_chief = j.cluster->is_chief;
    // A cluster's other workers write nothing: the chief's directory is not theirs.
    if (!mts.is_chief) mts.checkpoint_dir.clear();
  }
  if (j.pending_step != nullptr) {
    // Before the CheckpointSaverHook's end() (B12: chief_only_hooks first).
    if (mts.is_chief) {
      mts.chief_only_hooks.push_back(j.pending_step);
    } else {
      mts.hooks.insert(mts.hooks.begin(), j.pending_step);
    }
  }
  return mts;
}

Status MlpJob::StartInput(MonitoredSession& session) {
  MlpModel& m = *impl_->model;
  if (m.input != MlpJobInput::kInputPipeline || m.gather) return absl::OkStatus();
  m.pipeline.reset();  // an earlier session's
  data::InputPipelineOptions options;
  options.prefetch_batches = static_cast<int>(impl_->settings.prefetch_batches);
  FOREMAN_ASSIGN_OR_RETURN(m.pipeline, session.NewInputPipeline(m.train_set, options));
  return absl::OkStatus();
}

const MlpJobSettings& MlpJob::settings() const { return impl_->settings; }
const MlpJobPlan& MlpJob::plan() const { return impl_->plan; }
const std::shared_ptr<Graph>& MlpJob::graph() const { return impl_->graph; }
int64_t MlpJob::total_steps() const { return impl_->total_steps; }
bool MlpJob::gathers_on_device() const { return impl_->model->gather; }

MlpJobResult MlpJob::result() const {
  const MlpModel& m = *impl_->model;
  MlpJobResult r;
  if (impl_->eval != nullptr) r.eval = impl_->eval->last();
  r.test_examples = impl_->test_examples;
  r.steps_trained = impl_->progress->steps_trained();
  r.steps_per_sec = impl_->progress->steps_per_sec();
  r.local_steps = m.steps;
  r.examples = m.examples;
  if (m.first_step) {
    const double secs = absl::ToDoubleSeconds(m.clock->MonotonicNow() - *m.first_step);
    r.local_steps_per_sec = secs > 0 ? static_cast<double>(m.steps) / secs : 0.0;
  }
  if (m.pipeline != nullptr) {
    const data::InputPipeline::Stats stats = m.pipeline->stats();
    r.pipeline_batches = stats.batches;
    r.pipeline_waits = stats.waits;
  }
  r.ended_by_chief = m.ended_by_chief;
  r.end_of_training = m.end_of_training;
  return r;
}

}  // namespace foreman
