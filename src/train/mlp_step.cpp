// The MLP job's step function (mlp_model.hpp): one batch on the path the
// session and the job's input select, the learning-rate schedule, the
// summaries and the test-set evaluation.
#include <algorithm>
#include <cmath>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "foreman/compute.hpp"
#include "foreman/summary.hpp"
#include "foreman/variable_store.hpp"
#include "platform/log.hpp"
#include "runtime/variable_store_access.hpp"
#include "train/mlp_model.hpp"

namespace foreman::train_internal {
namespace {

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

// The data sets on `device` (the session's), uploaded at the first step
// that needs them. RESOURCE_EXHAUSTED (naming the device and the size) when
// they do not fit.
Status EnsureExamplesOn(MlpModel& m, compute::Device& device) {
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

// TF's exponential_decay at `global_step`; the observer hears once when the
// float32 rate underflows to 0 (TF's would too: the steps go on without
// changing the weights).
Status SetLearningRate(MlpModel& m, int64_t global_step) {
  double lr = m.learning_rate;
  if (m.decay_steps > 0) {
    lr *= std::pow(m.decay_rate, static_cast<double>(global_step) / static_cast<double>(m.decay_steps));
  }
  m.current_learning_rate = static_cast<float>(lr);
  if (m.current_learning_rate == 0 && !m.warned_zero_rate) {
    m.warned_zero_rate = true;
    if (m.observer != nullptr) {
      m.observer->OnWarning(absl::StrFormat(
          "the learning rate decayed to 0 at global_step %d (%g x %g^(global_step / %d) underflows float32): the "
          "following steps leave the weights unchanged; see --learning-rate-decay-steps and "
          "--learning-rate-decay-rate",
          global_step, m.learning_rate, m.decay_rate, m.decay_steps));
    }
  }
  return m.mlp->set_learning_rate(m.current_learning_rate);
}

// The step by indices on an asynchronous device (a GPU), pipelined one deep:
// run N finishes step N - 1 (waiting for it if it still runs), fails as
// NanTensorHook would if its loss is NaN -- before launching anything, so
// global_step, the variables and the checkpoints stay step N - 1's --, then
// launches step N and returns step N - 1's statistics at once, while step N
// runs. A run with no step before it in this session (the first, and the
// one after a run that read its own) reports that run's; a run that has no
// step N - 1 to report, and the `last` one (StopAtStepHook's step, the last
// batch of the last epoch), wait for their own step. docs/gpu.md.
StatusOr<nn::StepResult> PipelinedStep(MlpModel& m, VariableStore& vars, compute::Device& device,
                                       const int32_t* indices, int64_t rows, bool last) {
  // (An expired pipeline_device locks to null; a live device's lifetime never does.)
  const bool same_session = m.pipeline_vars == &vars && m.pipeline_device.lock() == device.lifetime().lock();
  std::optional<nn::StepResult> previous;
  if (same_session && m.mlp->train_step_pending()) {
    FOREMAN_ASSIGN_OR_RETURN(nn::StepResult p, m.mlp->FinishTrainStep());
    if (std::isnan(p.loss)) return NanLossFailure();  // B119: Inf is not divergence
    previous = p;
  } else if (same_session) {
    previous = m.own_statistics;
  } else if (m.mlp->train_step_pending()) {
    // A step an earlier session launched (on a device still alive): it
    // belongs to that session's variables, which a recovery replaced.
    (void)m.mlp->FinishTrainStep();
  }
  m.pipeline_vars = &vars;
  m.pipeline_device = device.lifetime();
  m.own_statistics.reset();
  FOREMAN_RETURN_IF_ERROR(m.mlp->LaunchTrainStep(vars, *m.device_train, indices, rows, device));
  if (previous.has_value() && !last) return *previous;
  FOREMAN_ASSIGN_OR_RETURN(nn::StepResult own, m.mlp->FinishTrainStep());
  m.own_statistics = own;
  return own;
}

// The values of m.histogram_variables, in that order. Those a device holds
// newer than the host (a GPU's) come in one CopyToHostBatch into page-locked
// buffers the model keeps between summaries, not one synchronous pageable
// copy per variable (VariableStore::Get's); the store's host copies stay as
// they are, as a checkpoint's snapshot leaves them. The others are the
// store's host tensors. Valid until the next call or the next step.
StatusOr<std::vector<const Tensor*>> HistogramValues(MlpModel& m, const VariableStore& vars) {
  std::vector<const Tensor*> values;
  values.reserve(m.histogram_variables.size());
  compute::Device* resident = vars.resident_device();
  std::vector<compute::HostCopy> copies;
  for (const std::string& name : m.histogram_variables) {
    const void* device_value =
        resident != nullptr ? internal::VariableStoreAccess::DeviceNewerData(vars, name) : nullptr;
    if (device_value == nullptr) {
      FOREMAN_ASSIGN_OR_RETURN(const Tensor* t, vars.Get(name));
      values.push_back(t);
      continue;
    }
    const Tensor* host = internal::VariableStoreAccess::HostTensor(vars, name);
    Tensor& held = m.histogram_buffers[name];
    if (held.dtype() != host->dtype() || held.shape() != host->shape() || held.TotalBytes() == 0) {
      StatusOr<Tensor> fresh = resident->AllocateHostTensor(host->dtype(), host->shape());
      if (!fresh.ok()) {
        return Annotate(fresh.status(), absl::StrCat("a host buffer for the histogram of '", name, "' from ",
                                                     resident->name()));
      }
      held = *std::move(fresh);
    }
    copies.push_back(compute::HostCopy{held.raw_data(), device_value, static_cast<int64_t>(held.TotalBytes())});
    values.push_back(&held);
  }
  if (!copies.empty()) {
    if (Status s = resident->CopyToHostBatch(copies.data(), static_cast<int64_t>(copies.size())); !s.ok()) {
      return Annotate(s, absl::StrCat("copying the histograms' variables from ", resident->name()));
    }
  }
  return values;
}

// Whether this run asks for the test-set evaluation (MlpStep), and whether
// it will evaluate once its update has made `global_step_after`: fed
// kEvalFromGlobalStep, only when that step is reached.
bool EvaluationRequested(const StepContext& ctx) {
  return ctx.requested("eval_accuracy") || ctx.requested("eval_loss") || ctx.requested("eval_summaries") ||
         ctx.requested("eval_global_step");
}
StatusOr<bool> EvaluatesAt(const StepContext& ctx, int64_t global_step_after) {
  const Tensor* from = ctx.feed(kEvalFromGlobalStep);
  if (from == nullptr) return true;
  FOREMAN_RETURN_IF_ERROR(from->CheckType<int64_t>());
  return global_step_after >= from->data<int64_t>()[0];
}

// One batch: forward, backward, update (here, or by the ps tasks), the data
// position and global_step advanced.
Status Train(MlpModel& m, StepContext& ctx, std::vector<std::string>& summaries) {
  VariableStore& vars = ctx.variables();
  if (!m.first_step) m.first_step = m.clock->MonotonicNow();
  FOREMAN_ASSIGN_OR_RETURN(int64_t epoch, ReadInt64(vars, kEpochVariable));
  FOREMAN_ASSIGN_OR_RETURN(int64_t index, ReadInt64(vars, kIndexVariable));
  compute::Device& device = ctx.compute();
  const bool on_device = m.gather || !device.host_memory();
  data::Batch batch;
  // The gathered path: the batch's indices in epoch `epoch`'s order,
  // gathered on the device (Dataset::GetBatch's bookkeeping: the last batch
  // of an epoch is the remainder, then {epoch + 1, 0}).
  std::shared_ptr<const std::vector<int32_t>> order;
  int64_t rows = 0;
  bool last_batch = false;  // of the last epoch (the gathered path)
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
    last_batch = options.epochs > 0 && batch.next.epoch >= options.epochs;
  } else if (m.input == MlpJobInput::kOnTrainingThread) {
    auto span = ctx.Trace("input");
    FOREMAN_ASSIGN_OR_RETURN(batch, m.train_set->GetBatch(data::DatasetPosition{epoch, index}));
    rows = batch.labels.num_elements();
  } else {
    auto span = ctx.Trace("input");
    if (m.pipeline == nullptr) {
      return absl::FailedPreconditionError(
          "MlpJob: no input pipeline: call StartInput(session) before the first run (or use another MlpJobInput)");
    }
    FOREMAN_ASSIGN_OR_RETURN(batch, m.pipeline->Next(data::DatasetPosition{epoch, index}, m.batch_timeout));
    rows = batch.labels.num_elements();
  }
  FOREMAN_ASSIGN_OR_RETURN(int64_t global_step, GetGlobalStep(vars));
  FOREMAN_RETURN_IF_ERROR(SetLearningRate(m, global_step));
  nn::StepResult r;
  if (ctx.remote_variables()) {
    // A cluster worker: the variables live on the ps tasks, which apply the
    // gradients with their optimizer and count global_step (TF1:
    // compute_gradients here, apply_gradients on the ps devices).
    auto span = ctx.Trace("train");
    FOREMAN_ASSIGN_OR_RETURN(r, m.mlp->ComputeGradients(vars, batch.features, batch.labels, ctx.compute(), &m.grads));
    if (Status applied = ctx.ApplyGradients(m.grads, nn::Tf1Optimizer(m.optimizer)); !applied.ok()) {
      // OUT_OF_RANGE: the chief ended training; the batch was not used (the
      // position stays), and the run ends as at the end of input.
      if (absl::IsOutOfRange(applied)) {
        m.ended_by_chief = true;
        m.end_of_training = std::string(applied.message());
      }
      return applied;
    }
  } else if (on_device) {
    // A GPU: the step on the batch gathered there (a replayed CUDA graph),
    // pipelined on an asynchronous device.
    auto span = ctx.Trace("train");
    if (device.asynchronous()) {
      // A run that evaluates reads its own step's statistics too, so that a
      // NaN fails it before its evaluation of the diverged weights is
      // written (EvalHook's after_run comes after NanTensorHook's, as on
      // the CPU). In a cluster the update's global_step is not known here:
      // every run that asks for an evaluation reads its own.
      bool last = last_batch || (m.last_step > 0 && global_step + 1 >= m.last_step);
      if (!last && EvaluationRequested(ctx)) {
        if (ctx.remote_variables()) {
          last = true;
        } else {
          FOREMAN_ASSIGN_OR_RETURN(last, EvaluatesAt(ctx, global_step + 1));
        }
      }
      FOREMAN_ASSIGN_OR_RETURN(r, PipelinedStep(m, vars, device, order->data() + index, rows, last));
    } else {
      FOREMAN_ASSIGN_OR_RETURN(r, m.mlp->TrainStep(vars, *m.device_train, order->data() + index, rows, device));
    }
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
  if (ctx.requested(kUpdatedGlobalStep)) {
    // In a cluster: ps 0's answer to this update, other workers' updates included.
    FOREMAN_ASSIGN_OR_RETURN(int64_t updated, GetGlobalStep(vars));
    ctx.Set(kUpdatedGlobalStep, Tensor::Scalar<int64_t>(updated));
  }
  ctx.Set("train_op", Tensor::Scalar<int64_t>(1));
  ctx.Set("loss", Tensor::Scalar<float>(r.loss));
  ctx.Set("accuracy", Tensor::Scalar<float>(r.accuracy));
  summaries = {ScalarSummary("loss", r.loss), ScalarSummary("accuracy", r.accuracy)};
  return absl::OkStatus();
}

// The whole test set with the variables as they are (after this run's update).
Status Evaluate(MlpModel& m, StepContext& ctx) {
  VariableStore& vars = ctx.variables();
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
  MutexLock lock(m.eval->mu);
  m.eval->step = step;
  m.eval->accuracy = r.accuracy;
  m.eval->loss = r.loss;
  return absl::OkStatus();
}

}  // namespace

Status NanLossFailure() {
  FOREMAN_LOG_ERROR("Model diverged with loss = NaN.");
  return NanLossDuringTrainingError("NaN loss during training.");
}

Status MlpStep(MlpModel& m, StepContext& ctx) {
  std::vector<std::string> summaries;
  if (ctx.requested("train_op")) FOREMAN_RETURN_IF_ERROR(Train(m, ctx, summaries));
  // After the update: the summary is written at the post-run global_step.
  if (EvaluationRequested(ctx)) {
    // Fed kEvalFromGlobalStep: only when this run's update reached that step
    // (in a cluster the other workers' updates may carry global_step past it
    // between two of this worker's runs); otherwise eval_global_step -1.
    FOREMAN_ASSIGN_OR_RETURN(int64_t step, GetGlobalStep(ctx.variables()));
    FOREMAN_ASSIGN_OR_RETURN(bool evaluate, EvaluatesAt(ctx, step));
    if (evaluate) {
      FOREMAN_RETURN_IF_ERROR(Evaluate(m, ctx));
    } else {
      ctx.Set("eval_global_step", Tensor::Scalar<int64_t>(-1));
      ctx.Set("eval_accuracy", Tensor::Scalar<float>(0));
      ctx.Set("eval_loss", Tensor::Scalar<float>(0));
      ctx.Set("eval_summaries", Tensor::Scalar<std::string>(std::string()));
    }
  }
  if (ctx.requested("summaries")) {
    summaries.push_back(ScalarSummary("learning_rate", m.current_learning_rate));
    if (m.extra_summaries) {
      for (std::string& s : m.extra_summaries()) summaries.push_back(std::move(s));
    }
    auto span = ctx.Trace("histograms");
    FOREMAN_ASSIGN_OR_RETURN(std::vector<const Tensor*> values, HistogramValues(m, ctx.variables()));
    for (std::size_t i = 0; i < values.size(); ++i) {
      FOREMAN_ASSIGN_OR_RETURN(std::string h, HistogramSummary(m.histogram_variables[i], *values[i]));
      summaries.push_back(std::move(h));
    }
    ctx.Set("summaries", Tensor::Scalar<std::string>(MergeSummaries(summaries)));
  }
  return absl::OkStatus();
}

}  // namespace foreman::train_internal
