// The stock hooks that need no service actor (TF: basic_session_run_hooks.py;
// spec §9): SecondOrStepTimer (B95-B97), StopAtStepHook (B98-B101, decision
// 9), LoggingTensorHook (B117-B118), NanTensorHook (B119),
// GlobalStepWaiterHook (B120), FinalOpsHook (B121), FeedFnHook (B122) and
// ProfilerHook (B123). Everything here runs on the training thread. The
// numpy-style printer LoggingTensorHook uses is in array_printer.cpp, the
// Chrome-trace writer ProfilerHook uses in trace_writer.cpp.
#include <algorithm>
#include <cmath>
#include <limits>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "foreman/hooks.hpp"
#include "platform/log.hpp"
#include "runtime/hooks/global_step.hpp"

namespace foreman {

// -- Step multiples ----------------------------------------------------------------

namespace {
int64_t FloorDiv(int64_t a, int64_t b) {
  const int64_t q = a / b;
  return (a % b != 0 && (a < 0) != (b < 0)) ? q - 1 : q;
}
}  // namespace

int64_t StepMultiplesCrossed(int64_t from_step, int64_t to_step, int64_t every_steps) {
  if (every_steps <= 0 || to_step <= from_step) return 0;
  return FloorDiv(to_step, every_steps) - FloorDiv(from_step, every_steps);
}

int64_t NextStepMultiple(int64_t step, int64_t every_steps) {
  if (every_steps <= 0) return 0;
  return (FloorDiv(step, every_steps) + 1) * every_steps;
}

// -- SecondOrStepTimer ------------------------------------------------------------

StatusOr<SecondOrStepTimer> SecondOrStepTimer::Create(std::optional<double> every_secs,
                                                      std::optional<int64_t> every_steps, Clock* clock) {
  // B95, in TF's order of checks.
  if (!every_secs.has_value() && !every_steps.has_value()) {
    return absl::InvalidArgumentError("Either every_secs or every_steps should be provided.");
  }
  if (every_secs.has_value() && every_steps.has_value()) {
    return absl::InvalidArgumentError("Can not provide both every_secs and every_steps.");
  }
  return SecondOrStepTimer(every_secs, every_steps, clock == nullptr ? Clock::Real() : clock);
}

SecondOrStepTimer::SecondOrStepTimer(std::optional<double> every_secs, std::optional<int64_t> every_steps,
                                     Clock* clock)
    : every_secs_(every_secs), every_steps_(every_steps), clock_(clock) {}

bool SecondOrStepTimer::should_trigger_for_step(int64_t step) const {
  if (!last_step_.has_value()) return true;
  if (*last_step_ == step) return false;
  if (every_secs_.has_value() &&
      absl::ToDoubleSeconds(clock_->MonotonicNow() - last_time_) >= *every_secs_) {
    return true;
  }
  if (every_steps_.has_value() && step >= *last_step_ + *every_steps_) return true;
  return false;
}

std::optional<std::pair<double, int64_t>> SecondOrStepTimer::update_last_triggered_step(int64_t step) {
  const absl::Duration now = clock_->MonotonicNow();
  std::optional<std::pair<double, int64_t>> elapsed;
  if (last_step_.has_value()) elapsed.emplace(absl::ToDoubleSeconds(now - last_time_), step - *last_step_);
  last_time_ = now;
  last_step_ = step;
  return elapsed;
}

void SecondOrStepTimer::reset() {
  last_step_.reset();
  last_time_ = absl::ZeroDuration();
}

// -- StopAtStepHook ------------------------------------------------------------------

StatusOr<std::shared_ptr<StopAtStepHook>> StopAtStepHook::Create(const Options& options) {
  // B98, TF's messages (its ValueError).
  if (!options.num_steps.has_value() && !options.last_step.has_value()) {
    return absl::InvalidArgumentError("One of num_steps or last_step must be specified.");
  }
  if (options.num_steps.has_value() && options.last_step.has_value()) {
    return absl::InvalidArgumentError("Only one of num_steps or last_step can be specified.");
  }
  return std::shared_ptr<StopAtStepHook>(new StopAtStepHook(options.num_steps, options.last_step));
}

StopAtStepHook::StopAtStepHook(std::optional<int64_t> num_steps, std::optional<int64_t> last_step)
    : num_steps_(num_steps), last_step_(last_step) {}

Status StopAtStepHook::after_create_session(Session* session, Coordinator* coord) {
  FOREMAN_RETURN_IF_ERROR(internal::RequireGlobalStep(session, *this));
  FOREMAN_ASSIGN_OR_RETURN(const int64_t step, internal::RealGlobalStep(session, *this));
  if (!last_step_.has_value()) last_step_ = step + *num_steps_;  // B99: once
  if (step >= *last_step_) {
    // Decision 9: TF would train one more step here (B101).
    FOREMAN_LOG_INFO("StopAtStepHook: global_step {} is already at or past last_step {}; stopping before the "
                     "first step.",
                     step, *last_step_);
    if (coord != nullptr) FOREMAN_RETURN_IF_ERROR(coord->request_stop());
  }
  return absl::OkStatus();
}

StatusOr<SessionRunArgs> StopAtStepHook::before_run(SessionRunContext& /*ctx*/) {
  SessionRunArgs args;
  args.fetches = {"global_step"};
  return args;
}

Status StopAtStepHook::after_run(SessionRunContext& ctx, const SessionRunValues& values) {
  if (!last_step_.has_value()) {
    return absl::FailedPreconditionError("StopAtStepHook: after_run before after_create_session.");
  }
  FOREMAN_ASSIGN_OR_RETURN(const int64_t stale, internal::StaleGlobalStep(values, *this));
  // B100: only a run that may have reached last_step pays for the extra read.
  if (stale + 1 >= *last_step_) {
    FOREMAN_ASSIGN_OR_RETURN(const int64_t step, internal::RealGlobalStep(ctx.session(), *this));
    if (step >= *last_step_) ctx.request_stop();
  }
  return absl::OkStatus();
}

// -- LoggingTensorHook ------------------------------------------------------------------

StatusOr<std::shared_ptr<LoggingTensorHook>> LoggingTensorHook::Create(const Options& options_in) {
  Options options = options_in;
  // B117, TF's messages.
  const bool only_log_at_end = options.at_end && !options.every_n_iter.has_value() && !options.every_n_secs.has_value();
  if (!only_log_at_end && options.every_n_iter.has_value() == options.every_n_secs.has_value()) {
    return absl::InvalidArgumentError(
        "either at_end and/or exactly one of every_n_iter and every_n_secs must be provided.");
  }
  if (options.every_n_iter.has_value() && *options.every_n_iter <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("invalid every_n_iter=", *options.every_n_iter, "."));
  }
  if (options.sorted_tags) std::sort(options.tensors.begin(), options.tensors.end());
  std::optional<SecondOrStepTimer> timer;
  if (!only_log_at_end) {
    FOREMAN_ASSIGN_OR_RETURN(timer, SecondOrStepTimer::Create(options.every_n_secs, options.every_n_iter,
                                                              options.clock));
  }
  return std::shared_ptr<LoggingTensorHook>(new LoggingTensorHook(std::move(options), std::move(timer)));
}

LoggingTensorHook::LoggingTensorHook(Options options, std::optional<SecondOrStepTimer> timer)
    : options_(std::move(options)), timer_(std::move(timer)) {}

Status LoggingTensorHook::begin() {
  if (timer_.has_value()) timer_->reset();
  iter_count_ = 0;
  return absl::OkStatus();
}

StatusOr<SessionRunArgs> LoggingTensorHook::before_run(SessionRunContext& /*ctx*/) {
  should_trigger_ = timer_.has_value() && timer_->should_trigger_for_step(iter_count_);
  SessionRunArgs args;
  if (should_trigger_) args.fetches = options_.tensors;
  return args;
}

Status LoggingTensorHook::after_run(SessionRunContext& /*ctx*/, const SessionRunValues& values) {
  if (should_trigger_) {
    static const TensorMap kNone;
    FOREMAN_RETURN_IF_ERROR(LogTensors(values.results == nullptr ? kNone : *values.results));
  }
  ++iter_count_;
  return absl::OkStatus();
}

Status LoggingTensorHook::end(Session* session) {
  if (!options_.at_end) return absl::OkStatus();
  TensorMap values;
  if (!options_.tensors.empty()) {
    FOREMAN_ASSIGN_OR_RETURN(values, session->Run(options_.tensors));
  }
  return LogTensors(values);
}

Status LoggingTensorHook::LogTensors(const TensorMap& values) {
  // TF updates the timer even for at_end alone (its NeverTriggerTimer then
  // reports no elapsed time).
  std::optional<std::pair<double, int64_t>> elapsed;
  if (timer_.has_value()) elapsed = timer_->update_last_triggered_step(iter_count_);
  if (options_.formatter) {
    StatusOr<std::string> line = InvokeUserCode("hook LoggingTensorHook formatter",
                                                [&]() -> StatusOr<std::string> { return options_.formatter(values); });
    if (!line.ok()) return line.status();
    FOREMAN_LOG_INFO("{}", *line);
    return absl::OkStatus();
  }
  std::vector<std::string> stats;
  for (const std::string& tag : options_.tensors) {
    const auto it = values.find(tag);
    if (it == values.end()) {
      return absl::InternalError(absl::StrCat("LoggingTensorHook: the run returned no value for \"", tag, "\"."));
    }
    stats.push_back(absl::StrCat(tag, " = ", FormatTensorForLog(it->second)));
  }
  if (elapsed.has_value()) {
    FOREMAN_LOG_INFO("{} ({:.3f} sec)", absl::StrJoin(stats, ", "), elapsed->first);
  } else {
    FOREMAN_LOG_INFO("{}", absl::StrJoin(stats, ", "));
  }
  return absl::OkStatus();
}

// -- NanTensorHook ---------------------------------------------------------------------

StatusOr<std::shared_ptr<NanTensorHook>> NanTensorHook::Create(const Options& options) {
  if (options.loss_tensor.empty()) return absl::InvalidArgumentError("NanTensorHook: options.loss_tensor is empty.");
  return std::shared_ptr<NanTensorHook>(new NanTensorHook(options));
}

StatusOr<SessionRunArgs> NanTensorHook::before_run(SessionRunContext& /*ctx*/) {
  SessionRunArgs args;
  args.fetches = {loss_tensor_};
  return args;
}

Status NanTensorHook::after_run(SessionRunContext& ctx, const SessionRunValues& values) {
  const TensorMap* results = values.results;
  const auto it = results == nullptr ? TensorMap::const_iterator() : results->find(loss_tensor_);
  if (results == nullptr || it == results->end()) {
    return absl::InternalError(absl::StrCat("NanTensorHook: the run returned no value for \"", loss_tensor_, "\"."));
  }
  const Tensor& loss = it->second;
  bool is_nan = false;
  if (loss.num_elements() == 1 && loss.dtype() == DataType::kFloat) {
    is_nan = std::isnan(*loss.data<float>());
  } else if (loss.num_elements() == 1 && loss.dtype() == DataType::kDouble) {
    is_nan = std::isnan(*loss.data<double>());
  } else {
    return absl::InvalidArgumentError(absl::StrCat("NanTensorHook: the loss \"", loss_tensor_,
                                                   "\" must be a float32 or float64 tensor of one element, got ",
                                                   DataTypeName(loss.dtype()), loss.shape().ToString(), "."));
  }
  if (!is_nan) return absl::OkStatus();  // B119: Inf is not divergence
  constexpr char kFailureMessage[] = "Model diverged with loss = NaN.";
  if (fail_on_nan_loss_) {
    FOREMAN_LOG_ERROR("{}", kFailureMessage);
    return NanLossDuringTrainingError("NaN loss during training.");
  }
  FOREMAN_LOG_WARN("{}", kFailureMessage);
  ctx.request_stop();
  return absl::OkStatus();
}

// -- GlobalStepWaiterHook --------------------------------------------------------------

StatusOr<std::shared_ptr<GlobalStepWaiterHook>> GlobalStepWaiterHook::Create(const Options& options) {
  if (options.poll_interval <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat("GlobalStepWaiterHook: options.poll_interval must be > 0, got ",
                                                   absl::FormatDuration(options.poll_interval), "."));
  }
  if (options.max_wait.has_value() && *options.max_wait <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat("GlobalStepWaiterHook: options.max_wait must be > 0, got ",
                                                   absl::FormatDuration(*options.max_wait), "."));
  }
  return std::shared_ptr<GlobalStepWaiterHook>(new GlobalStepWaiterHook(options));
}

Status GlobalStepWaiterHook::begin() {
  worker_is_started_ = false;
  return absl::OkStatus();
}

Status GlobalStepWaiterHook::after_create_session(Session* session, Coordinator* /*coord*/) {
  return internal::RequireGlobalStep(session, *this);
}

StatusOr<SessionRunArgs> GlobalStepWaiterHook::before_run(SessionRunContext& ctx) {
  if (worker_is_started_) return SessionRunArgs{};
  if (wait_until_step_ <= 0) {
    worker_is_started_ = true;
    return SessionRunArgs{};
  }
  FOREMAN_LOG_INFO("Waiting for global step {} before starting training.", wait_until_step_);
  const absl::Duration start = clock_->MonotonicNow();
  int64_t last_logged_step = 0;
  while (true) {
    FOREMAN_ASSIGN_OR_RETURN(const int64_t current_step, internal::RealGlobalStep(ctx.session(), *this));
    if (current_step >= wait_until_step_) {
      worker_is_started_ = true;
      return SessionRunArgs{};
    }
    if (current_step - last_logged_step > 1000) {
      FOREMAN_LOG_INFO("Waiting for global step {} before starting training. Current step is {}.",
                       wait_until_step_, current_step);
      last_logged_step = current_step;
    }
    absl::Duration sleep = poll_interval_;
    if (max_wait_.has_value()) {
      const absl::Duration left = start + *max_wait_ - clock_->MonotonicNow();
      if (left <= absl::ZeroDuration()) {
        return absl::DeadlineExceededError(
            absl::StrCat("GlobalStepWaiterHook: global_step is ", current_step, " after waiting ",
                         absl::FormatDuration(*max_wait_), " for step ", wait_until_step_, "."));
      }
      sleep = std::min(sleep, left);
    }
    clock_->SleepFor(sleep);
  }
}

// -- FinalOpsHook ------------------------------------------------------------------------

StatusOr<std::shared_ptr<FinalOpsHook>> FinalOpsHook::Create(const Options& options) {
  for (std::size_t i = 0; i < options.final_ops.size(); ++i) {
    if (options.final_ops[i].empty()) {
      return absl::InvalidArgumentError(absl::StrCat("FinalOpsHook: options.final_ops[", i, "] is empty."));
    }
  }
  return std::shared_ptr<FinalOpsHook>(new FinalOpsHook(options));
}

Status FinalOpsHook::end(Session* session) {
  if (final_ops_.empty()) return absl::OkStatus();
  StatusOr<TensorMap> values = session->Run(final_ops_, feeds_);
  if (!values.ok()) {
    if (absl::IsOutOfRange(values.status())) {
      FOREMAN_LOG_WARN(
          "An OutOfRangeError or StopIteration exception is raised by the code in FinalOpsHook. This typically "
          "means the Ops running by the FinalOpsHook have a dependency back to some input source, which should "
          "not happen. For example, for metrics in tf.estimator.Estimator, all metrics functions return two "
          "Ops: `value_op` and  `update_op`. Estimator.evaluate calls the `update_op` for each batch, but only "
          "calls the `value_op` once at the end of the evaluation. And only `value_op` should be passed to "
          "FinalOpsHook. If `update_op` is passed to FinalOpsHook, this might cause the OutOfRangeError or "
          "StopIteration exception.");
    }
    return values.status();
  }
  values_ = *std::move(values);
  return absl::OkStatus();
}

// -- FeedFnHook ---------------------------------------------------------------------------

StatusOr<std::shared_ptr<FeedFnHook>> FeedFnHook::Create(const Options& options) {
  if (!options.feed_fn) return absl::InvalidArgumentError("FeedFnHook: options.feed_fn is empty.");
  return std::shared_ptr<FeedFnHook>(new FeedFnHook(options));
}

StatusOr<SessionRunArgs> FeedFnHook::before_run(SessionRunContext& /*ctx*/) {
  if (!feed_fn_) return absl::InvalidArgumentError("FeedFnHook: feed_fn is empty.");
  StatusOr<TensorMap> feeds =
      InvokeUserCode("FeedFnHook feed_fn", [this]() -> StatusOr<TensorMap> { return feed_fn_(); });
  if (!feeds.ok()) return feeds.status();
  SessionRunArgs args;
  args.feeds = *std::move(feeds);
  return args;
}

// -- ProfilerHook ------------------------------------------------------------------------

StatusOr<std::shared_ptr<ProfilerHook>> ProfilerHook::Create(const Options& options_in) {
  Options options = options_in;
  if (options.env == nullptr) options.env = Env::Default();
  if (options.clock == nullptr) options.clock = Clock::Real();
  FOREMAN_ASSIGN_OR_RETURN(SecondOrStepTimer timer,
                           SecondOrStepTimer::Create(options.save_secs, options.save_steps, options.clock));
  return std::shared_ptr<ProfilerHook>(new ProfilerHook(std::move(options), std::move(timer)));
}

ProfilerHook::ProfilerHook(Options options, SecondOrStepTimer timer)
    : options_(std::move(options)), timer_(std::move(timer)) {}

Status ProfilerHook::begin() {
  next_step_.reset();
  // TF's SummaryWriterCache.get(output_dir) creates the directory.
  if (!options_.output_dir.empty()) {
    FOREMAN_RETURN_IF_ERROR(options_.env->RecursivelyCreateDir(options_.output_dir));
  }
  return absl::OkStatus();
}

Status ProfilerHook::after_create_session(Session* session, Coordinator* /*coord*/) {
  return internal::RequireGlobalStep(session, *this);
}

StatusOr<SessionRunArgs> ProfilerHook::before_run(SessionRunContext& /*ctx*/) {
  request_summary_ = next_step_.has_value() && timer_.should_trigger_for_step(*next_step_);
  SessionRunArgs args;
  args.fetches = {"global_step"};
  if (request_summary_) args.options.trace_level = RunOptions::kFullTrace;
  return args;
}

Status ProfilerHook::after_run(SessionRunContext& ctx, const SessionRunValues& values) {
  FOREMAN_ASSIGN_OR_RETURN(const int64_t stale_global_step, internal::StaleGlobalStep(values, *this));
  // The first run only primes the timer: nothing is traced until N steps or
  // seconds have passed.
  if (!next_step_.has_value()) timer_.update_last_triggered_step(stale_global_step);
  int64_t global_step = stale_global_step + 1;
  if (request_summary_) {
    FOREMAN_ASSIGN_OR_RETURN(global_step, internal::RealGlobalStep(ctx.session(), *this));
    timer_.update_last_triggered_step(global_step);
    const std::string path = JoinPath(options_.output_dir, absl::StrCat("timeline-", global_step, ".json"));
    FOREMAN_LOG_INFO("Saving timeline for {} into '{}'.", global_step, path);
    static const RunMetadata kEmpty;
    const RunMetadata& metadata = values.run_metadata == nullptr ? kEmpty : *values.run_metadata;
    FOREMAN_RETURN_IF_ERROR(
        Annotate(WriteStringToFile(options_.env, path, ChromeTraceJson(metadata, global_step)), "ProfilerHook"));
  }
  next_step_ = global_step + 1;
  return absl::OkStatus();
}

}  // namespace foreman
