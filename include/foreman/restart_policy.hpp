// Restart policies for a session's service actors, in Erlang/OTP's
// supervisor vocabulary (supervisor:start_link's restart type, strategy and
// intensity). Set RuntimeOptions::restart (monitored_session.hpp) to use one
// with MonitoredSession, MonitoredTrainingSession, SingularMonitoredSession
// or Supervisor.
//
// The services are named by kind: "summary_writer" (one per logdir),
// "checkpoint_saver" (one per checkpoint directory), "step_counter" and
// "input_pipeline" (the producer of each MonitoredSession::NewInputPipeline;
// a restarted one is re-seeked, so the batches served do not change). They
// are reached through stable handles, so a restarted service is transparent
// to the hooks that use it.
//
// The default policy is TensorFlow's behaviour: a failing service ends the
// run with its error (a permanent child, intensity 0: the first failure
// escalates). With restarts allowed, a summary writer whose event file
// fails (EIO) is restarted, opens a new event file in the same logdir, and
// training continues; the events it had queued are lost and reported:
//   ```cpp
//   #include "foreman/monitored_session.hpp"
//   foreman::MonitoredTrainingSessionOptions opts;
//   opts.graph = graph;
//   opts.checkpoint_dir = "train_dir";
//   opts.runtime.restart.services["summary_writer"] = foreman::RestartType::kPermanent;
//   opts.runtime.restart.max_restarts = 3;              // at most 3 restarts
//   opts.runtime.restart.period = absl::Seconds(60);    // within 60 s
//   FOREMAN_ASSIGN_OR_RETURN(auto sess, foreman::MonitoredTrainingSession(std::move(opts)));
//   FOREMAN_RETURN_IF_ERROR(sess->run({"train_op"}).status());
//   FOREMAN_RETURN_IF_ERROR(sess->close());
//   for (const foreman::ServiceRestart& r : sess->service_restarts()) {
//     if (r.events_lost > 0) return absl::InternalError("no fault was injected here");
//   }
//   ```
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "foreman/status.hpp"

namespace foreman {

/// When a service is restarted (OTP's child restart type).
enum class RestartType : int {
  /// Always restarted, whatever its exit reason (OTP: permanent).
  kPermanent = 0,
  /// Restarted only after an abnormal exit (an error, an exception, a kill);
  /// a normal exit removes it (OTP: transient).
  kTransient,
  /// Never restarted: any exit removes it and the run goes on without it
  /// (its handle's messages are then dropped or fail UNAVAILABLE; a summary
  /// writer's events are lost) (OTP: temporary).
  kTemporary,
};

/// Which services restart together (OTP's supervisor strategy). The order is
/// the services' start order in the session.
enum class RestartStrategy : int {
  kOneForOne = 0,  ///< only the service that exited
  kOneForAll,      ///< every service (the others are stopped first)
  kRestForOne,     ///< it and every service started after it
};

/// "permanent" | "transient" | "temporary"; "one_for_one" | "one_for_all" |
/// "rest_for_one" (static strings).
const char* RestartTypeName(RestartType type);
const char* RestartStrategyName(RestartStrategy strategy);

/// A session's restart policy. Plain data; copyable.
struct RestartPolicy {
  /// The restart type of every service not named in `services`.
  RestartType type = RestartType::kPermanent;
  /// Per service kind: "summary_writer", "checkpoint_saver", "step_counter",
  /// "input_pipeline".
  std::map<std::string, RestartType> services;
  RestartStrategy strategy = RestartStrategy::kOneForOne;
  /// Restart intensity (OTP: intensity, period): at most `max_restarts`
  /// restarts (of all services together) within `period` on the session's
  /// Clock. The failure that would exceed it escalates: the run fails with
  /// that service's error, exactly as without restarts. 0 (the default):
  /// TensorFlow's behaviour, the first failure ends the run.
  int max_restarts = 0;
  absl::Duration period = absl::Seconds(5);
  /// Back-off before the k-th consecutive restart of a service (k >= 1):
  /// min(max_backoff, initial_backoff * 2^(k-1)) times a jitter in
  /// [0.5, 1.5) drawn from `seed` (RestartBackoff). A real-time wait on the
  /// supervisor (a CAF timer, never blocking a thread); at most
  /// kMaxRestartBackoff. Zero: restart at once.
  absl::Duration initial_backoff = absl::ZeroDuration();
  absl::Duration max_backoff = absl::Seconds(1);
  uint64_t seed = 0;

  /// The restart type of service kind `service`.
  RestartType TypeOf(absl::string_view service) const;
  /// True for the default: every failure escalates (TF).
  bool IsTensorFlowDefault() const { return max_restarts == 0 && services.empty() && type == RestartType::kPermanent; }
};

/// The longest back-off a policy may ask for.
inline constexpr absl::Duration kMaxRestartBackoff = absl::Seconds(60);

/// INVALID_ARGUMENT naming the field: an unknown service kind in
/// `services`, max_restarts < 0, period <= 0 with max_restarts > 0, a
/// negative back-off, initial_backoff > max_backoff, max_backoff >
/// kMaxRestartBackoff, a type or strategy out of range. Thread-safe.
Status ValidateRestartPolicy(const RestartPolicy& policy);

/// Parses a policy's text form: comma-separated parts, each one of
///   one_for_one | one_for_all | rest_for_one     the strategy
///   permanent | transient | temporary            the type of every service not named
///   <service>=permanent|transient|temporary      one service kind's type
///                                                (summary_writer, checkpoint_saver,
///                                                step_counter, input_pipeline)
///   max_restarts=<n>, period_secs=<s>            the restart intensity
///   initial_backoff_ms=<n>, max_backoff_ms=<n>   the back-off
///   seed=<n>                                     the back-off's jitter
/// e.g. "one_for_one,max_restarts=3,period_secs=60,summary_writer=permanent".
/// Unset fields keep RestartPolicy's defaults (TF's). Strict: no whitespace
/// anywhere, integers decimal digits only, period_secs a positive decimal
/// with at most 3 decimals (millisecond resolution, no exponent).
/// INVALID_ARGUMENT for an empty (or blank) text, and naming the part (and
/// its 1-based position) that does not parse, is given twice, names an
/// unknown service or a bad type for a known one, or sets
/// initial_backoff_ms above max_backoff_ms; ValidateRestartPolicy's other
/// refusals name the text. The messages name the text as the command-line
/// flag that takes it (`foreman train --restart-policy`) does:
///   --restart-policy "bogus": part 1 "bogus": expected a strategy (...)
/// Thread-safe.
StatusOr<RestartPolicy> ParseRestartPolicy(const std::string& text);

/// `policy` in ParseRestartPolicy's syntax, every field given (strategy,
/// type, each named service, max_restarts, period_secs, initial_backoff_ms,
/// max_backoff_ms, seed), for a run's header. period_secs is printed with
/// six significant digits: the text parses back to an equal policy when
/// `policy` is valid and its period is a whole number of milliseconds below
/// 1000000 s with at most six significant digits (60, 0.5, 86400).
/// Thread-safe.
std::string RestartPolicyText(const RestartPolicy& policy);

/// The back-off before the `restart`-th (>= 1) consecutive restart of
/// `service` (its full name, e.g. "summary_writer(/logs)"): a pure function
/// of the policy, the name and `restart` (the jitter is FaultDraw(seed,
/// "restart", service, EnvOp::kAny, restart)), so a seed reproduces it.
/// Thread-safe.
absl::Duration RestartBackoff(const RestartPolicy& policy, const std::string& service, int64_t restart);

/// One restart (or removal) the session's supervisor performed.
struct ServiceRestart {
  /// The service's full name, e.g. "summary_writer(/logs)".
  std::string service;
  /// Why it exited: OK for a normal exit, else its error (for an injected
  /// kill, INTERNAL "injected actor fault <id>"); for a service stopped with
  /// a failed sibling (by_strategy), OK when restarted, CANCELLED "stopped by
  /// the restart strategy (<strategy>) when <sibling> failed" when removed.
  Status reason;
  /// True when it was restarted; false when it was removed (temporary, or
  /// transient after a normal exit). A temporary service stopped with a
  /// failed sibling is removed, never restarted (OTP).
  bool restarted = false;
  /// True when it was stopped only because a sibling failed (one_for_all,
  /// rest_for_one), then restarted or (temporary) removed.
  bool by_strategy = false;
  /// The back-off waited before the restart.
  absl::Duration backoff;
  /// Summary writers: events queued or buffered in the old incarnation and
  /// never written (-1 for other services), and their steps (a SessionLog
  /// without a step counts as -1), in the order they were added.
  int64_t events_lost = -1;
  std::vector<int64_t> steps_lost;
  /// Checkpoint savers: the global steps of the saves lost with the old
  /// incarnation (the save whose own error ended it, or saves queued when it
  /// exited), oldest first; their tickets failed, the run went on, and the
  /// next save goes to the new incarnation. Empty for other services.
  std::vector<int64_t> saves_lost;
};

}  // namespace foreman
