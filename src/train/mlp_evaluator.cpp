// The MLP job's evaluator task (RunMlpEvaluator, include/foreman/mlp_job.hpp):
// TF's run_evaluator over checkpoints_iterator. The evaluation itself is the
// graph's (the step's eval_* fetches, mlp_step.cpp), as the chief's EvalHook
// runs it; only the waiting, the restore and the event file are this file's.
#include <algorithm>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "foreman/bundle.hpp"
#include "foreman/checkpoint.hpp"
#include "foreman/event_writer.hpp"
#include "foreman/graph.hpp"
#include "foreman/mlp_job.hpp"
#include "foreman/mutex.hpp"
#include "foreman/session.hpp"
#include "foreman/session_manager.hpp"
#include "foreman/tensor.hpp"
#include "train/mlp_model.hpp"

namespace foreman {
namespace {

using train_internal::EvalFetches;
using train_internal::EvalOf;

// The global step in a checkpoint's name ("model.ckpt-300"), if it has one.
std::optional<int64_t> StepInName(const std::string& prefix) {
  const std::size_t dash = prefix.rfind('-');
  if (dash == std::string::npos || dash + 1 == prefix.size()) return std::nullopt;
  const std::string digits = prefix.substr(dash + 1);
  for (char c : digits) {
    if (!absl::ascii_isdigit(static_cast<unsigned char>(c))) return std::nullopt;
  }
  return std::strtoll(digits.c_str(), nullptr, 10);
}

// Whether the bundle at `prefix` is there and verifies now.
bool Whole(Env* env, const std::string& prefix) {
  auto reader = BundleReader::Open(env, prefix);
  return reader.ok() && (*reader)->VerifyAll().ok();
}

// INVALID_ARGUMENT when the bundle at `prefix` lacks a global variable of
// `graph` or holds one with another dtype or shape (a restore would take the
// checkpoint's shapes and the evaluation would fail on them). OK when the
// bundle cannot be opened: the restore reports that.
Status CheckFits(Env* env, const std::string& prefix, const Graph& graph) {
  auto reader = BundleReader::Open(env, prefix);
  if (!reader.ok()) return absl::OkStatus();
  for (const VariableDef& def : graph.variables()) {
    if (def.local) continue;
    FOREMAN_ASSIGN_OR_RETURN(Tensor initial, def.initializer());
    auto entry = (*reader)->GetEntry(def.name);
    if (!entry.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("checkpoint ", prefix,
                                                     " does not fit the model: it has no variable '", def.name,
                                                     "' (give the training's model flags)"));
    }
    if (entry->dtype != initial.dtype() || entry->shape != initial.shape()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "checkpoint ", prefix, " does not fit the model: it holds '", def.name, "' as ", DataTypeName(entry->dtype),
          " ", entry->shape.ToString(), ", the model needs ", DataTypeName(initial.dtype()), " ",
          initial.shape().ToString(), " (give the training's model flags)"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

StatusOr<MlpEvaluatorResult> RunMlpEvaluator(MlpEvaluatorOptions o) {
  if (o.poll_interval_ms <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("the evaluator's poll interval must be > 0 ms, got ",
                                                   o.poll_interval_ms));
  }
  if (o.timeout_ms <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("the evaluator's timeout must be > 0 ms, got ", o.timeout_ms));
  }
  if (o.last_step < 0) {
    return absl::InvalidArgumentError(absl::StrCat("the evaluator's last step must be >= 0, got ", o.last_step));
  }
  if (o.settings.checkpoint_dir.empty()) {
    return absl::InvalidArgumentError("the evaluator needs the training's checkpoint directory (--checkpoint-dir)");
  }
  Env* env = o.env != nullptr ? o.env : Env::Default();
  Clock* clock = o.clock != nullptr ? o.clock : Clock::Real();
  const std::string dir = o.settings.checkpoint_dir;

  // The MLP's graph, whose step evaluates (its hooks are not used: no
  // MonitoredSession runs here, and nothing trains).
  MlpJobOptions job_options;
  job_options.settings = std::move(o.settings);
  job_options.data = std::move(o.data);
  job_options.device = o.device;
  job_options.input = MlpJobInput::kOnTrainingThread;
  job_options.env = env;
  job_options.clock = clock;
  FOREMAN_ASSIGN_OR_RETURN(std::unique_ptr<MlpJob> job, MlpJob::Create(std::move(job_options)));
  SessionManagerOptions manager_options;
  manager_options.graph = job->graph();
  FOREMAN_ASSIGN_OR_RETURN(std::unique_ptr<SessionManager> manager, SessionManager::Create(manager_options));
  SaverOptions saver_options;
  saver_options.env = env;
  saver_options.clock = clock;
  FOREMAN_ASSIGN_OR_RETURN(std::unique_ptr<Saver> saver_owned, Saver::Create(saver_options));
  std::shared_ptr<Saver> saver = std::move(saver_owned);
  SessionConfig config;
  config.device = o.device;
  config.env = env;
  config.clock = clock;
  config.intra_op_parallelism_threads = static_cast<int>(job->settings().threads);
  config.device_memory_limit_bytes = job->settings().device_memory_limit_mb * (int64_t{1} << 20);

  // A stop request wakes the wait.
  Mutex mu;
  std::condition_variable_any cv;
  struct Listening {
    StopRequest* stop = nullptr;
    int64_t id = 0;
    ~Listening() {
      if (stop != nullptr) stop->Unlisten(id);
    }
  } listening;
  if (o.stop != nullptr) {
    listening.id = o.stop->Listen([&mu, &cv](const Status&) {
      { MutexLock lock(mu); }
      cv.notify_all();
    });
    listening.stop = o.stop.get();
  }
  auto stop_requested = [&o] { return o.stop != nullptr && o.stop->stop_requested(); };

  MlpEvaluatorResult result;
  std::unique_ptr<EventFileWriter> writer;
  std::string last_prefix;
  std::optional<int64_t> last_step;
  std::string last_warning;
  bool finished = false;  // the last step was evaluated
  const absl::Duration timeout = absl::Milliseconds(o.timeout_ms);
  absl::Duration deadline = clock->MonotonicNow() + timeout;
  auto warn = [&](const std::string& warning) {
    if (o.on_warning) o.on_warning(warning);
  };
  while (!stop_requested()) {
    StatusOr<std::optional<std::string>> latest = LatestCheckpoint(env, dir);
    std::optional<std::string> prefix;
    if (latest.ok()) {
      prefix = *latest;
    } else if (absl::IsDataLoss(latest.status())) {
      // Bundles there, none whole (yet): the chief's next save may be.
      const std::string warning = absl::StrCat("no checkpoint of ", dir, " verifies yet: ", latest.status().message());
      if (warning != last_warning) warn(warning);
      last_warning = warning;
    } else {
      return latest.status();
    }
    const std::optional<int64_t> step = prefix ? StepInName(*prefix) : std::nullopt;
    const bool fresh = prefix.has_value() && *prefix != last_prefix &&
                       !(step.has_value() && last_step.has_value() && *step <= *last_step);
    if (fresh) {
      last_prefix = *prefix;
      if (step.has_value()) last_step = step;
      FOREMAN_RETURN_IF_ERROR(CheckFits(env, *prefix, *job->graph()));
      PrepareSessionOptions restore;
      restore.saver = saver;
      restore.checkpoint_filename_with_path = *prefix;
      restore.config = config;
      StatusOr<std::unique_ptr<Session>> session = manager->prepare_session("", std::move(restore));
      if (!session.ok()) {
        if (!Whole(env, *prefix)) {
          // Deleted by max_to_keep, or not whole, between the listing and the read.
          ++result.skipped;
          warn(absl::StrCat("checkpoint ", *prefix, " not found or not whole, skipping: ", session.status().message()));
          continue;
        }
        return session.status();
      }
      StatusOr<TensorMap> values = (*session)->Run(EvalFetches());
      (*session)->Close().IgnoreError();
      FOREMAN_RETURN_IF_ERROR(values.status());
      const MlpJobEval eval = EvalOf(*values);
      last_step = eval.global_step;
      if (writer == nullptr) {
        EventFileWriterOptions writer_options;
        writer_options.env = env;
        FOREMAN_ASSIGN_OR_RETURN(writer, EventFileWriter::Create(dir + "/eval", writer_options));
      }
      FOREMAN_RETURN_IF_ERROR(
          writer->AddSummary(values->at("eval_summaries").scalar<std::string>().value(), eval.global_step));
      FOREMAN_RETURN_IF_ERROR(writer->Flush());
      result.evals.push_back(eval);
      if (o.on_eval) o.on_eval(*prefix, eval);
      if (o.last_step > 0 && eval.global_step >= o.last_step) {
        finished = true;
        break;
      }
      deadline = clock->MonotonicNow() + timeout;
      continue;  // a newer one may have come during the evaluation
    }
    const absl::Duration now = clock->MonotonicNow();
    if (now >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          "no new checkpoint in ", dir, " within ", o.timeout_ms, " ms (",
          last_prefix.empty() ? std::string("none evaluated yet") : absl::StrCat("the last evaluated: ", last_prefix),
          ")"));
    }
    MutexLock lock(mu);
    clock->WaitUntil(mu, cv, std::min(now + absl::Milliseconds(o.poll_interval_ms), deadline), stop_requested);
  }
  result.stopped = !finished;
  if (writer != nullptr) FOREMAN_RETURN_IF_ERROR(writer->Close());
  return result;
}

}  // namespace foreman
