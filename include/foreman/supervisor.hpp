// Supervisor and managed_session: the older TF 1.x training wrapper, with its
// standard services. (TF: tf.compat.v1.train.Supervisor, with its defaults,
// services and stop order.)
//
//   ```cpp
//   foreman::SupervisorOptions opts;
//   opts.graph = graph;
//   opts.logdir = "train_dir";
//   FOREMAN_ASSIGN_OR_RETURN(auto sv, foreman::Supervisor::Create(std::move(opts)));
//   foreman::Status s = sv->managed_session("", config, [&](foreman::Session& sess) -> foreman::Status {
//     while (!sv->should_stop()) {
//       FOREMAN_ASSIGN_OR_RETURN(foreman::TensorMap out, sess.Run({"train_op", "global_step"}));
//       // "global_step" is read before the step: stop after step 100.
//       if (out.at("global_step").scalar<int64_t>().value() + 1 >= 100) {
//         FOREMAN_RETURN_IF_ERROR(sv->request_stop());
//       }
//     }
//     return foreman::Status();
//   });
//   ```
//   // s is what TF would re-raise from the `with` block: OK after a clean
//   // stop (OUT_OF_RANGE), else the first error. No automatic recovery
//   // (as TF): loop around managed_session to retry ABORTED / UNAVAILABLE.
//
// Standard services (chief with a logdir) run as LooperThreads of the
// supervisor's Coordinator, each firing at once and then every interval of
// the config's Clock: summaries (runs summary_op, writes at the current
// global step), global_step/sec, and checkpoints (through the runtime's
// checkpoint_saver actor, with a SessionLog CHECKPOINT each). Their reads of
// the variables hold the session's values mutex, i.e. happen between steps.
// As TF, and unlike CheckpointSaverHook, there is no final checkpoint at stop.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "foreman/coordinator.hpp"
#include "foreman/monitored_session.hpp"
#include "foreman/session.hpp"
#include "foreman/session_manager.hpp"
#include "foreman/status.hpp"

namespace foreman {

struct SupervisorOptions {
  /// Variables and step function (TF: graph). Required.
  std::shared_ptr<Graph> graph;
  /// Each op left empty gets TF's default; Defaultable::None() (for the
  /// saver and summary_op) disables it.
  ReadyOp ready_op;
  ReadyOp ready_for_local_init_op;
  bool is_chief = true;
  InitOp init_op;
  TensorMap init_feed_dict;
  SessionOp local_init_op;
  /// Checkpoints, event files; empty = none (a worker ignores it, as TF).
  std::string logdir;
  /// Default: the graph's summary fetches (none: no summary service).
  Defaultable<std::vector<std::string>> summary_op;
  /// Default: Saver (max_to_keep 5) when the graph has global variables.
  Defaultable<std::shared_ptr<Saver>> saver;
  /// None (0 or less) disables a service.
  std::optional<double> save_summaries_secs = 120;
  std::optional<double> save_model_secs = 600;
  double recovery_wait_secs = 30;
  double stop_grace_secs = 120;
  std::string checkpoint_basename = "model.ckpt";
  std::function<Status(Session&)> init_fn;
  /// Env, clock and threads of every session (TF passes `config` per call;
  /// managed_session's config argument overrides this one).
  SessionConfig config;
  RuntimeOptions runtime;
};

class Supervisor {
 public:
  /// Fills the defaults and finalizes the graph (as TF's constructor); a non-chief
  /// drops logdir, summaries and checkpoints. INVALID_ARGUMENT without a
  /// graph or with a bad recovery_wait_secs / stop_grace_secs. (TF's rule
  /// that a worker's variables need a device has no Foreman analogue.)
  static StatusOr<std::unique_ptr<Supervisor>> Create(SupervisorOptions options);
  /// Stops services and actors still running (errors logged).
  ~Supervisor();
  Supervisor(const Supervisor&) = delete;
  Supervisor& operator=(const Supervisor&) = delete;

  /// Clears the coordinator's stop; chief: prepare_session restoring
  /// from logdir (waiting for a checkpoint when asked), then, with
  /// start_standard_services, the standard services and a SessionLog START at
  /// the current step; worker: wait_for_session (max_wait). The session is
  /// owned by the caller and must outlive stop() (the chief's services read
  /// it until then).
  StatusOr<std::unique_ptr<Session>> prepare_or_wait_for_session(const std::string& master = "",
                                                                 std::optional<SessionConfig> config = std::nullopt,
                                                                 bool wait_for_checkpoint = false,
                                                                 absl::Duration max_wait = absl::Seconds(7200),
                                                                 bool start_standard_services = true);

  /// Starts the chief's services for `session` (idempotent per
  /// session). FAILED_PRECONDITION for a worker. `session` must outlive
  /// stop() (managed_session takes care of that for its own session).
  Status start_standard_services(Session* session);

  /// As TF: request_stop, join (stop_grace_secs), then — even when join
  /// failed — a SessionLog STOP without a step and, with
  /// close_summary_writer, the event file flushed and closed (a later
  /// session opens a new one). Returns join's status (the first error
  /// reported to the coordinator; OK after a clean stop).
  Status stop(bool close_summary_writer = true, bool ignore_live_threads = false);

  /// Every restart or removal of a service actor so far, over every session
  /// this Supervisor prepared (options.runtime.restart, restart_policy.hpp;
  /// empty under TF's default policy). Call from the thread that uses the
  /// Supervisor.
  std::vector<ServiceRestart> service_restarts() const;

  /// As TF: prepare_or_wait_for_session, then `block(session)`; an error
  /// the block returns (or throws) goes to request_stop (dropped when stop
  /// was already requested); then stop(), then the session is closed
  /// (its errors ignored). Returns what TF re-raises: OK when the block ended
  /// cleanly or with OUT_OF_RANGE, else the first error. No recovery.
  Status managed_session(const std::string& master, std::optional<SessionConfig> config,
                         const std::function<Status(Session&)>& block, bool start_standard_services = true,
                         bool close_summary_writer = true);
  Status managed_session(const std::function<Status(Session&)>& block) {
    return managed_session("", std::nullopt, block);
  }

  /// Writes a serialized Summary at `global_step` (default: the
  /// session's current one). FAILED_PRECONDITION "summary_computed() needs a
  /// summary writer" without a logdir (or on a worker).
  Status summary_computed(Session* session, const std::string& serialized_summary,
                          std::optional<int64_t> global_step = std::nullopt);

  /// Starts a LooperThread calling `target` every `interval`
  /// (back to back when std::nullopt), registered with the coordinator.
  StatusOr<LooperThread*> loop(std::optional<absl::Duration> interval, std::function<Status()> target,
                               std::string name = "Supervisor.loop");

  // Delegates to the supervisor's Coordinator (clean stop:
  // OUT_OF_RANGE, as Python's default).
  bool should_stop() const;
  Status request_stop(const Status& status = absl::OkStatus());
  bool wait_for_stop(std::optional<absl::Duration> timeout = std::nullopt);
  bool stop_on_exception(const std::function<Status()>& fn);
  Coordinator* coord();

  bool is_chief() const;
  /// "<logdir>/model.ckpt" (TF: save_path).
  std::string save_path() const;
  /// The effective options after the defaults (see SupervisorOptions).
  const SupervisorOptions& options() const;

 private:
  struct Impl;
  explicit Supervisor(std::unique_ptr<Impl> impl);
  Status StartServices(Session* session, std::shared_ptr<Session> keep_alive);
  std::unique_ptr<Impl> impl_;
};

}  // namespace foreman
