// ps_shard actor: one parameter-server task's variables (issue 13, points
// 2-4; cluster.md rules 2, 3, 5, 6). TF1: the variables a
// replica_device_setter placed on /job:ps/task:K (PlaceVariablesOnPs), their
// optimizer slots (colocated with them), and, where the placement puts them,
// global_step (ps 0) and Adam's beta powers. The actor is sequential: every
// request sees and leaves the whole shard consistent (no torn reads of a
// variable, rule 3), and it never blocks on another actor.
//
// Every request is request/response and every message is serialisable
// (messages.hpp): the chief and the workers reach the shard through
// ConnectActor (cluster_net.hpp). Errors are caf::errors in Foreman's
// category (StatusToError; ErrorToStatus gets the Status back, on any node).
//
// Protocol:
//   (ps_init_atom, VariablesMessage vars)                  -> ok_atom
//       TF's init op, or the chief's restore: replaces the shard's variables
//       wholesale with `vars.tensors` (vars.global_step is ignored: the
//       step is the "global_step" tensor, int64 scalar, when the shard holds
//       it; a shard without it takes vars.global_step as the step its
//       synchronous accumulators start at). Valid also while frozen (a
//       restore under the chief's freeze).
//       Errors (the shard unchanged): FAILED_PRECONDITION for another
//       cluster job's init (vars.job_id != PsShardOptions::job_id, naming
//       both; the same for applies and the end of training, which also
//       leave the shard unchanged), and for an init op (vars.restore false)
//       on a shard that holds training: restored, or updated since its
//       last init op (issue 31 point 3: only a restore replaces a running
//       job's training; an init op's values no update followed may be
//       replaced, a half-done init retried); INVALID_ARGUMENT naming the tensor for
//       an empty or duplicate name, a bad tensor (FromMessage), a
//       global_step that is not an int64 scalar, a beta power that is not a
//       float32 scalar, only one of the two beta powers, or a slot
//       ("<var>/Adam" with <var> given) or beta power of another optimizer
//       than the shard's ("the sgd optimizer this ps task runs does not
//       have": the tasks were started with different --optimizer flags).
//   (ps_read_atom, std::vector<std::string> names)         -> VariablesMessage
//       Those variables (any order given, duplicates allowed), and in
//       global_step the shard's global_step, -1 when it does not hold it.
//       Errors: FAILED_PRECONDITION "ps task K is not initialized" before
//       the first init (TF's report_uninitialized_variables: a worker waits
//       for the chief); NOT_FOUND naming the first unknown name.
//   (ps_snap_atom)                                          -> VariablesMessage
//       Every variable of the shard (sorted by name) and its global_step as
//       for a read: what the chief's saver writes. FAILED_PRECONDITION
//       before the first init.
//   (ps_apply_atom, ApplyGradientsMessage update)            -> int64_t
//       Asynchronous training (TF1's default): for every gradient, TF1's
//       update of its variable with its slots (nn::internal::ApplyDense:
//       GradientDescent, Momentum with "<var>/Momentum", Adam with
//       "<var>/Adam" and "<var>/Adam_1" and lr = update.adam_step_size);
//       then, once per apply, beta1_power *= beta1 and beta2_power *= beta2
//       when the shard holds them (AdamOptimizer._finish), and global_step
//       += 1 when it holds it (apply_gradients(global_step=...), ps 0).
//       An apply with no gradients still does the last two (a worker must
//       step ps 0 even when none of its variables are there). Answers the
//       new global_step, -1 when the shard does not hold it.
//       Synchronous mode (replicas_to_aggregate = N > 0; TF's
//       SyncReplicasOptimizer, its ConditionalAccumulators on this shard):
//       an apply's gradients.step is the global step its gradients were
//       computed at. Older than the shard's step: dropped (counted in
//       stale_gradients and dropped_gradients) and answered at once with
//       the current global_step. The shard's step: kept and answered only
//       when the N-th apply of the step has arrived: then each variable's
//       mean (the float sum in arrival order / its count) is applied once as
//       above, the shard's step advances by one, and the N applies are
//       answered the new global_step (as TF's token queue releases the
//       workers). One apply per worker (gradients.worker) and step: a
//       worker's second apply of the step (its session recovered after the
//       first one's request timed out) replaces the first, which is answered
//       ABORTED and counted dropped, so an update always averages N
//       workers' gradients (TF's accumulator would count a retried worker
//       twice). Newer: INVALID_ARGUMENT. A re-init
//       answers the applies waiting ABORTED (counted dropped); a shard asked
//       to quit answers them UNAVAILABLE. The shard never times out a
//       step: with fewer than N workers alive, each worker's request times
//       out (UNAVAILABLE, PsRemoteValues' request_timeout_ms) and its
//       bounded recovery retries, then fails the run (rule 4).
//       Atomic: everything is validated before anything changes. Errors
//       (the shard unchanged, counted in refused_updates):
//       FAILED_PRECONDITION not initialized, or a missing slot (naming it);
//       NOT_FOUND naming an unknown variable; INVALID_ARGUMENT naming the
//       variable for a duplicate gradient, a bad tensor, a dtype other than
//       float32, a shape other than its variable's, a gradient of a
//       non-trainable variable (global_step, a beta power, a slot), or a
//       learning rate / step size that is negative or not finite (0 is
//       accepted, as TF's apply ops and nn::ApplyGradients take it).
//       The update arguments used in synchronous mode are the N-th apply's.
//       While frozen the apply is held (in arrival order, at most
//       kMaxHeldApplies; more are refused with UNAVAILABLE) and answered
//       when the shard thaws.
//   (ps_apply_read_atom, ApplyGradientsMessage update)       -> VariablesMessage
//       The same apply, answered instead with what the worker's next step
//       reads (issue 27 point 2: one round trip per step, not a read and an
//       apply): every variable of the shard but the optimizer slots, sorted
//       by name, and global_step as for a read, taken when the answer is
//       given: right after this update (asynchronous), after the aggregated
//       update (synchronous), or at once for a stale gradient that was
//       dropped. TF1's semantics hold: the worker's next step sees its own
//       update landed, and other workers' updates as far as they arrived
//       (an asynchronous read). Errors as for ps_apply_atom.
//
// Tensor bytes: a read's or snapshot's answer shares the variables' bytes
// (TensorBytes, no copy); the next update of a variable whose bytes are
// still shared (the answer not serialized yet) writes a copy of it
// (copy-on-write), so an answer never changes after it was given. A
// received apply's gradients are applied from the received bytes.
//   (ps_freeze_atom, int64_t timeout_ms)                      -> int64_t
//       Holds applies from now until (ps_thaw_atom), until the actor that
//       asked for the freeze ends (the shard monitors it: a chief killed
//       mid-checkpoint, whose connection drops, thaws it at once), or until
//       `timeout_ms` (> 0, at most kMaxFreezeMs; else INVALID_ARGUMENT) has
//       passed (a chief alive but stuck); the last two thaw with a WARNING
//       and count in freeze_timeouts. Freezing a frozen shard restarts its
//       timeout and makes its asker the one whose end thaws. Answers the
//       global_step (-1: not held). Reads, snapshots, inits and stats are
//       served while frozen. So one actor asks for the freeze, the reads
//       and the thaw (PsRemoteValues::ReadConsistent).
//   (ps_thaw_atom)                                            -> int64_t
//       Applies the held applies in arrival order (each answered as
//       usual), and answers how many there were. A no-op when not frozen.
//   (ps_stats_atom)                                           -> PsShardStatsMessage
//       The counters; per worker (gradients.worker of its applies): the
//       applies accepted from it and the ms since one last arrived (for
//       `foreman cluster status` and the chief's steps_per_sec/worker_K
//       summaries).
//   (ps_end_atom, int64_t chief_step[, std::string job_id[, std::string by]]) -> int64_t
//       End of training (cluster.md rule 7; the chief's Server::EndTraining,
//       ps 0 first, or EndClusterTraining with `by` "`foreman cluster
//       stop`"): from now on every apply is answered OUT_OF_RANGE
//       "ps task K: training ended by BY at global_step N" (BY: `by`, "the
//       chief" when not given or empty; N: the
//       shard's global_step when it holds it, else `chief_step`, ps 0's),
//       and so are, at once, the applies a freeze holds and those waiting
//       for a synchronous aggregated update (counted dropped). Nothing
//       changes the variables after it but an init (a restore); reads,
//       snapshots, freezes, thaws and stats are served as before. The end
//       is final for the shard's life (an init does not undo it).
//       Idempotent. Another job's end (job_id; without it: "") is
//       FAILED_PRECONDITION and changes nothing. Answers the global_step (-1: not held or not
//       initialized). Calls options.on_end_activity (if set) on the end and
//       on every request after it but ps_stats (applies refused, and the
//       reads, snapshots, freezes and thaws of the chief's final checkpoint
//       and evaluation).
//
//   (ps_evict_atom, std::string address)                    -> bool
//       Local only (the ps task's Server, at a SIGTERM: docs/cluster.md
//       "a ps task is evicted"): from now on every apply, those a freeze
//       holds and those waiting for a synchronous update are refused
//       UNAVAILABLE "ps task K (address) is stopping (evicted): ..."
//       (counted in refused_updates); reads, snapshots, freezes and thaws
//       are served as before, so the chief can take a checkpoint; the
//       thaw that ends a freeze with a read in it calls
//       options.on_evicted_read(true). Idempotent. Answers whether the
//       chief (worker 0) applied within silence_ms (1000 ms when 0); when
//       not, calls options.on_evicted_read(false): no chief to wait for.
//
// A cluster checkpoint (rule: all shards at one global_step): the chief
// freezes every shard (ps 0 answers the step), snapshots every shard, and
// thaws every shard; no shard changes between its freeze and its thaw, so
// the snapshots are one state of the cluster and ps 0's snapshot carries
// its global_step. As in TF1's asynchronous training (rule 3), one worker's
// update is several applies, one per shard, sent one after the other: one
// of them may be in the snapshot and another not yet (TF1's Saver, reading
// the ps tasks while workers train, has the same property).
//
// The updates run on a CPU device with a one-thread Eigen pool owned by the
// shard (compute::CpuDevice(1)): a shard uses one core, and the result does
// not depend on it (the kernels are elementwise).
#pragma once

#include <cstdint>
#include <functional>

#include <caf/fwd.hpp>

#include "foreman/nn.hpp"
#include "foreman/status.hpp"

namespace foreman::internal {

/// At most this many applies are held while a shard is frozen.
inline constexpr int kMaxHeldApplies = 1024;
/// The longest freeze a shard accepts (ms).
inline constexpr int64_t kMaxFreezeMs = 600'000;
/// Applies are counted per worker (PsShardStatsMessage::worker_applies) for
/// worker indices in [0, kMaxCountedWorkers); others are applied but not
/// counted per worker.
inline constexpr int kMaxCountedWorkers = 4096;

struct PsShardOptions {
  /// The ps task's index (/job:ps/task:K), >= 0: named in errors and stats.
  int task_index = 0;
  /// The optimizer every apply runs (kind, momentum, use_nesterov, beta1,
  /// beta2, epsilon; learning_rate is unused: each apply carries its own).
  nn::OptimizerOptions optimizer;
  /// 0: asynchronous training (TF1's default). N > 0: synchronous, as TF's
  /// SyncReplicasOptimizer(replicas_to_aggregate=N) (--replicas-to-aggregate).
  int replicas_to_aggregate = 0;
  /// Local only (the ps task's Server: Join): called on the shard's thread
  /// when training ends (ps_end_atom) and on each apply refused after that.
  /// Must not block; may be empty.
  std::function<void()> on_end_activity;
  /// The cluster job this shard serves (ClusterOptions::job_id): an init,
  /// apply or end of training whose job_id differs (empty counts as an id)
  /// is refused with FAILED_PRECONDITION naming both ids, the shard
  /// unchanged. Empty here and in the messages: tests of the shard alone.
  std::string job_id;
  /// > 0: every silence_ms / 2 (at least 100 ms) the shard looks at when
  /// the chief's (worker 0's) last apply arrived and logs, once each, the
  /// chief falling silent for more than silence_ms after it had applied,
  /// and its return (PeerSilenceLog). 0: no watch (tests of the shard).
  int64_t silence_ms = 0;
  /// Local only (the ps task's Server: an eviction): called on the shard's
  /// thread with true when, after (ps_evict_atom), a thaw ends a freeze
  /// during which the shard was read (the chief's consistent read for its
  /// checkpoint), with false at (ps_evict_atom) when no chief applied
  /// within silence_ms (nothing to wait for). Must not block; may be empty.
  std::function<void(bool chief_read)> on_evicted_read;
};

/// Spawns a ps shard (not initialized) in `system`. INVALID_ARGUMENT naming
/// the field for a negative task_index or a bad optimizer
/// (nn::ValidateOptimizerOptions). The caller owns the handle: send it an
/// exit before `system` is destroyed. Thread-safe. TF: a ps task's
/// tf.train.Server holding its share of the variables.
StatusOr<caf::actor> SpawnPsShard(caf::actor_system& system, PsShardOptions options);

}  // namespace foreman::internal
