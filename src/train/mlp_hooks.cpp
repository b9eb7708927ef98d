// The MLP job's hooks (mlp_model.hpp): progress reporting and the test-set
// evaluation into <checkpoint_dir>/eval.
#include <algorithm>
#include <cmath>
#include <string>

#include "foreman/session.hpp"
#include "foreman/variable_store.hpp"
#include "train/mlp_model.hpp"

namespace foreman::train_internal {

// -- ProgressHook --------------------------------------------------------------------

Status ProgressHook::after_create_session(Session* session, Coordinator*) {
  FOREMAN_ASSIGN_OR_RETURN(int64_t step, session->GlobalStep());
  if (!start_step_) start_step_ = step;
  step_ = step;
  start_ = clock_->MonotonicNow();
  rate_start_step_ = step;
  return absl::OkStatus();
}

StatusOr<SessionRunArgs> ProgressHook::before_run(SessionRunContext&) {
  SessionRunArgs args;
  args.fetches = {"loss", "accuracy", kUpdatedGlobalStep};
  return args;
}

Status ProgressHook::after_run(SessionRunContext&, const SessionRunValues& values) {
  if (values.results == nullptr) return absl::OkStatus();
  auto loss = values.results->find("loss");
  auto acc = values.results->find("accuracy");
  auto step = values.results->find(kUpdatedGlobalStep);
  if (loss == values.results->end() || step == values.results->end()) return absl::OkStatus();
  step_ = step->second.data<int64_t>()[0];
  loss_ = loss->second.data<float>()[0];
  if (acc != values.results->end()) accuracy_ = acc->second.data<float>()[0];
  const double elapsed = absl::ToDoubleSeconds(clock_->MonotonicNow() - start_);
  if (elapsed > 0) rate_ = static_cast<double>(step_ - rate_start_step_) / elapsed;
  ReportEval();
  if (observer_ != nullptr) {
    MlpJobProgress progress;
    progress.global_step = step_;
    progress.total_steps = total_;
    progress.loss = loss_;
    progress.accuracy = accuracy_;
    progress.steps_per_sec = rate_;
    observer_->OnStep(progress);
  }
  return absl::OkStatus();
}

Status ProgressHook::end(Session*) {
  ReportEval();
  if (observer_ != nullptr) observer_->OnEnd();
  return absl::OkStatus();
}

void ProgressHook::ReportEval() {
  MlpJobEval eval;
  {
    MutexLock lock(eval_->mu);
    if (eval_->step < 0 || eval_->step == reported_eval_step_) return;
    reported_eval_step_ = eval_->step;
    eval.global_step = eval_->step;
    eval.accuracy = eval_->accuracy;
    eval.loss = eval_->loss;
  }
  if (observer_ != nullptr) observer_->OnEval(eval);
}

// -- EvalHook ------------------------------------------------------------------------

Status EvalHook::after_create_session(Session* session, Coordinator*) {
  FOREMAN_ASSIGN_OR_RETURN(int64_t step, session->GlobalStep());
  if (!start_step_) start_step_ = step;
  restart_at_ = step + 1;
  covered_ = step;  // a recovery that rewound global_step evaluates its multiples again
  return absl::OkStatus();
}

StatusOr<SessionRunArgs> EvalHook::before_run(SessionRunContext& ctx) {
  SessionRunArgs args;
  if (every_ <= 0) return args;
  // The first multiple not yet evaluated: this run evaluates if its update
  // reaches it (StepMultiplesCrossed(covered_, updated step) > 0).
  const int64_t from = NextStepMultiple(covered_, every_);
  if (!cluster_) {
    // One process: each run adds exactly one, so only the run that reaches
    // `from` asks (no feed, no evaluation request on the other runs).
    FOREMAN_ASSIGN_OR_RETURN(int64_t step, ctx.session()->GlobalStep());
    if (step + 1 < from) return args;
  }
  // A cluster: every run asks, and the step evaluates only when the update
  // (the other workers' included) reached `from` -- no read of the ps here.
  args.fetches = EvalFetches();
  args.feeds.emplace(kEvalFromGlobalStep, Tensor::Scalar<int64_t>(from));
  return args;
}

Status EvalHook::after_run(SessionRunContext&, const SessionRunValues& values) {
  if (values.results == nullptr) return absl::OkStatus();
  auto step = values.results->find("eval_global_step");
  if (step == values.results->end() || step->second.data<int64_t>()[0] < 0) return absl::OkStatus();
  covered_ = std::max(covered_, step->second.data<int64_t>()[0]);
  return Record(*values.results);
}

Status EvalHook::end(Session* session) {
  FOREMAN_ASSIGN_OR_RETURN(int64_t step, session->GlobalStep());
  if (!last_ || last_->global_step != step) {
    FOREMAN_ASSIGN_OR_RETURN(TensorMap values, session->Run(EvalFetches()));
    const bool trained = start_step_.has_value() && step != *start_step_;
    FOREMAN_RETURN_IF_ERROR(Record(values, /*write=*/trained));
  }
  if (writer_ != nullptr) return writer_->Close();
  return absl::OkStatus();
}

Status EvalHook::Record(const TensorMap& values, bool write) {
  const MlpJobEval r = EvalOf(values);
  last_ = r;
  if (!write) return absl::OkStatus();
  if (writer_ == nullptr) {
    EventFileWriterOptions options;
    options.env = env_;
    FOREMAN_ASSIGN_OR_RETURN(writer_, EventFileWriter::Create(output_dir_, options));
  }
  if (restart_at_.has_value()) {
    FOREMAN_RETURN_IF_ERROR(writer_->AddSessionLog(SessionLogStatus::kStart, *restart_at_));
    restart_at_.reset();
  }
  FOREMAN_RETURN_IF_ERROR(writer_->AddSummary(values.at("eval_summaries").scalar<std::string>().value(), r.global_step));
  return writer_->Flush();
}

Status PendingStepHook::end(Session*) {
  MlpModel& m = *model_;
  if (!m.mlp->train_step_pending()) return absl::OkStatus();
  FOREMAN_ASSIGN_OR_RETURN(nn::StepResult r, m.mlp->FinishTrainStep());
  if (std::isnan(r.loss)) return NanLossFailure();  // B119: Inf is not divergence
  return absl::OkStatus();
}

}  // namespace foreman::train_internal
