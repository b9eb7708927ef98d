// Supervisor and managed_session: the older TF 1.x training wrapper, with its
// standard services. (TF: tf.compat.v1.train.Supervisor; spec §15,
// B155-B162, bug reports H-08.)
//
//   foreman::SupervisorOptions opts;
//   opts.graph = graph;
//   opts.logdir = "/tmp/run";
//   FOREMAN_ASSIGN_OR_RETURN(auto sv, foreman::Supervisor::Create(std::move(opts)));
//   foreman::Status s = sv->managed_session("", config, [&](foreman::Session& sess) -> foreman::Status {
//     while (!sv->should_stop()) FOREMAN_RETURN_IF_ERROR(sess.Run({"train_op"}).status());
//     return foreman::OkStatus();
//   });
//   // s is what TF would re-raise from the `with` block: OK after a clean
//   // stop (OUT_OF_RANGE), else the first error. No automatic recovery
//   // (B160): loop around managed_session to retry ABORTED / UNAVAILABLE.
//
// Standard services (chief with a logdir, B158) run as LooperThreads of the
// supervisor's Coordinator, each firing at once and then every interval of
// the config's Clock: summaries (runs summary_op, writes at the current
// global step), global_step/sec, and checkpoints (through the runtime's
// checkpoint_saver actor, with a SessionLog CHECKPOINT each). Their reads of
// the variables hold the session's values mutex, i.e. happen between steps.
// Unlike CheckpointSaverHook there is no final checkpoint at stop (B159).
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
  /// B155: each op left empty gets TF's default; Defaultable::None() (for the
  /// saver and summary_op) disables it.
  ReadyOp ready_op;
  ReadyOp ready_for_local_init_op;
  bool is_chief = true;
  InitOp init_op;
  TensorMap init_feed_dict;
  SessionOp local_init_op;
  /// Checkpoints, event files; empty = none (B156 for workers too).
  std::string logdir;
  /// Default: the graph's summary fetches (none: no summary service).
  Defaultable<std::vector<std::string>> summary_op;
  /// Default: Saver (max_to_keep 5) when the graph has global variables.
  Defaultable<std::shared_ptr<Saver>> saver;
  /// None (0 or less) disables a service (B158).
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
  /// B155-B156: fills the defaults and finalizes the graph; a non-chief
  /// drops logdir, summaries and checkpoints. INVALID_ARGUMENT without a
  /// graph or with a bad recovery_wait_secs / stop_grace_secs. (B156's
  /// "every variable needs a device" has no Foreman analogue.)
  static StatusOr<std::unique_ptr<Supervisor>> Create(SupervisorOptions options);
  /// Stops services and actors still running (errors logged).
  ~Supervisor();
  Supervisor(const Supervisor&) = delete;
  Supervisor& operator=(const Supervisor&) = delete;

  /// B157: clears the coordinator's stop; chief: prepare_session restoring
  /// from logdir (waiting for a checkpoint when asked), then, with
  /// start_standard_services, the services of B158 and a SessionLog START at
  /// the current step; worker: wait_for_session (max_wait). The session is
  /// owned by the caller.
  StatusOr<std::unique_ptr<Session>> prepare_or_wait_for_session(const std::string& master = "",
                                                                 std::optional<SessionConfig> config = std::nullopt,
                                                                 bool wait_for_checkpoint = false,
                                                                 absl::Duration max_wait = absl::Seconds(7200),
                                                                 bool start_standard_services = true);

  /// B158: starts the chief's services for `session` (idempotent per
  /// session). FAILED_PRECONDITION for a worker. `session` must outlive
  /// stop() (managed_session takes care of that for its own session).
  Status start_standard_services(Session* session);

  /// B159: request_stop, join (stop_grace_secs), then — even when join
  /// failed — a SessionLog STOP without a step and, with
  /// close_summary_writer, the event file flushed and closed (a later
  /// session opens a new one). Returns join's status (the first error
  /// reported to the coordinator; OK after a clean stop).
  Status stop(bool close_summary_writer = true, bool ignore_live_threads = false);

  /// B160-B161: prepare_or_wait_for_session, then `block(session)`; an error
  /// the block returns (or throws) goes to request_stop (dropped when stop
  /// was already requested, B161); then stop(), then the session is closed
  /// (its errors ignored). Returns what TF re-raises: OK when the block ended
  /// cleanly or with OUT_OF_RANGE, else the first error. No recovery.
  Status managed_session(const std::string& master, std::optional<SessionConfig> config,
                         const std::function<Status(Session&)>& block, bool start_standard_services = true,
                         bool close_summary_writer = true);
  Status managed_session(const std::function<Status(Session&)>& block) {
    return managed_session("", std::nullopt, block);
  }

  /// B162: writes a serialized Summary at `global_step` (default: the
  /// session's current one). FAILED_PRECONDITION "summary_computed() needs a
  /// summary writer" without a logdir (or on a worker).
  Status summary_computed(Session* session, const std::string& serialized_summary,
                          std::optional<int64_t> global_step = std::nullopt);

  /// B162 / B68: starts a LooperThread calling `target` every `interval`
  /// (back to back when std::nullopt), registered with the coordinator.
  StatusOr<LooperThread*> loop(std::optional<absl::Duration> interval, std::function<Status()> target,
                               std::string name = "Supervisor.loop");

  // B162: delegates to the supervisor's Coordinator (clean stop:
  // OUT_OF_RANGE, as Python's default).
  bool should_stop() const;
  Status request_stop(const Status& status = absl::OkStatus());
  bool wait_for_stop(std::optional<absl::Duration> timeout = std::nullopt);
  bool stop_on_exception(const std::function<Status()>& fn);
  Coordinator* coord();

  bool is_chief() const;
  /// "<logdir>/model.ckpt" (TF: save_path).
  std::string save_path() const;
  /// The effective options after B155's defaults.
  const SupervisorOptions& options() const;

 private:
  struct Impl;
  explicit Supervisor(std::unique_ptr<Impl> impl);
  Status StartServices(Session* session, std::shared_ptr<Session> keep_alive);
  std::unique_ptr<Impl> impl_;
};

}  // namespace foreman
