// The messages that will cross a node (a cluster's links between a chief,
// its workers and the parameter servers): plain data with a CAF inspect(),
// registered in every system Foreman builds (ConfigureActorSystemConfig), so
// that CAF can serialise them. No closures, no pointers, no absl types.
//
// Tensors travel as raw byte buffers (TensorBytes, tensor_bytes.hpp: shared
// and copy-on-write, written and read by CAF in one apply_raw each), never
// as std::vector<float>, which CAF serialises element by element. The bytes
// are the tensor's host layout (row-major, little-endian on every platform
// Foreman builds for).
//
// The local control messages of the supervision tree (a spawn request with
// its factory, a save ticket, a waiter's Completion) carry closures and
// shared pointers on purpose: they never leave their process, and their
// headers mark them CAF_ALLOW_UNSAFE_MESSAGE_TYPE.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <caf/meta/type_name.hpp>

#include "foreman/status.hpp"
#include "foreman/tensor.hpp"
#include "tensor_bytes.hpp"

namespace foreman::internal {

/// A Status: its code (absl::StatusCode's value), message and payloads
/// (type URL, value, type URL, value, ...: PayloadsOf). Stop requests and
/// service failures travel as this.
struct StatusMessage {
  int32_t code = 0;
  std::string message;
  std::vector<std::string> payloads;
};

/// `s`'s payloads flattened: type URL, value, type URL, value, ... (in
/// absl's order). Thread-safe.
std::vector<std::string> PayloadsOf(const Status& s);
/// Sets on `*s` (not OK) the payloads PayloadsOf() flattened; a trailing odd
/// element is ignored.
void SetPayloads(Status* s, const std::vector<std::string>& payloads);

/// One named tensor of a numeric dtype: variables, gradients, step results.
struct TensorMessage {
  std::string name;
  int32_t dtype = 0;             // foreman::DataType's value
  std::vector<int64_t> shape;    // dimensions, outermost first
  TensorBytes bytes;             // num_elements * element size bytes
};

/// Values of variables at one global step (a ps shard's answer to a read;
/// the chief's init or restore of a shard).
struct VariablesMessage {
  int64_t global_step = 0;
  std::vector<TensorMessage> tensors;
  /// An init's: the sender's cluster job id (ClusterOptions::job_id); the
  /// shard refuses another job's. Empty in a read's answer.
  std::string job_id;
  /// An init's: a restore from a checkpoint (true) or the init op (false:
  /// refused by a shard already initialized).
  bool restore = false;
};

/// A worker's gradients, computed at `step` (the global step it read).
struct GradientsMessage {
  int64_t step = 0;
  int32_t worker = 0;
  std::vector<TensorMessage> tensors;
};

/// A worker's asynchronous update for one ps shard (ps_shard.hpp): its
/// gradients of the shard's trainable variables (as `gradients.tensors`,
/// float32, shaped as their variables) and the update's arguments, as
/// apply_gradients() passes them to TF1's kernels.
struct ApplyGradientsMessage {
  GradientsMessage gradients;
  /// The learning rate of GradientDescent and Momentum (> 0, finite).
  float learning_rate = 0;
  /// Adam only: the step size lr_t the worker computed with
  /// nn::internal::AdamStepSize from the learning rate and the beta powers
  /// it read (TF's apply_adam computes it from the same values); > 0, finite.
  float adam_step_size = 0;
  /// The sender's cluster job id (ClusterOptions::job_id): a shard refuses
  /// another job's applies.
  std::string job_id;
};

/// A ps shard's counters (ps_shard.hpp; `foreman cluster status`).
struct PsShardStatsMessage {
  int32_t task_index = 0;
  /// The shard's cluster job id (PsShardOptions::job_id).
  std::string job_id;
  /// The shard's global_step; -1 when it does not hold global_step.
  int64_t global_step = -1;
  bool initialized = false;
  /// Restored from a checkpoint, or updated since its last init op.
  bool trained = false;
  bool frozen = false;
  /// The chief ended training on the shard (ps_end_atom).
  bool ended = false;
  /// Updates applied since the shard started (inits do not count; in
  /// synchronous mode one per aggregated update).
  int64_t applied_updates = 0;
  /// Applies refused (bad gradients, not initialized).
  int64_t refused_updates = 0;
  /// Synchronous mode: gradients of a step older than the shard's (dropped),
  /// and all gradients dropped (stale ones, those a re-init or the end of
  /// training discarded, and a worker's apply its newer one of the same
  /// step replaced).
  int64_t stale_gradients = 0;
  int64_t dropped_gradients = 0;
  /// Synchronous mode: the step being aggregated (-1 in asynchronous mode),
  /// how many applies of it wait for the aggregated update now, and from
  /// which worker tasks (in arrival order).
  int64_t sync_step = -1;
  int64_t waiting_replicas = 0;
  std::vector<int64_t> waiting_workers;
  /// Applies waiting for a thaw now; freezes that ended without a thaw (by
  /// their timeout, or at the end of the actor that asked for them).
  int64_t queued_updates = 0;
  int64_t freeze_timeouts = 0;
  /// Per worker task (index: the apply's gradients.worker, its
  /// /job:worker/task:K): applies the shard accepted from it (asynchronous:
  /// applied; synchronous: accumulated once per step, stale ones and ones
  /// replaced by a newer apply of the same step not counted), and how
  /// long ago (ms, steady clock of the ps) an apply from it last arrived,
  /// -1 if none ever did. Both sized to the highest worker index seen + 1
  /// (at most kMaxCountedWorkers); empty before the first apply.
  std::vector<int64_t> worker_applies;
  std::vector<int64_t> worker_last_apply_ms;
};

/// What one training step reports: the global step after it and its status.
struct StepResultMessage {
  int64_t global_step = 0;
  StatusMessage status;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, StatusMessage& x) {
  return f(caf::meta::type_name("foreman.StatusMessage"), x.code, x.message, x.payloads);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, TensorMessage& x) {
  return f(caf::meta::type_name("foreman.TensorMessage"), x.name, x.dtype, x.shape, x.bytes);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, VariablesMessage& x) {
  return f(caf::meta::type_name("foreman.VariablesMessage"), x.global_step, x.tensors, x.job_id, x.restore);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, GradientsMessage& x) {
  return f(caf::meta::type_name("foreman.GradientsMessage"), x.step, x.worker, x.tensors);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, StepResultMessage& x) {
  return f(caf::meta::type_name("foreman.StepResultMessage"), x.global_step, x.status);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, ApplyGradientsMessage& x) {
  return f(caf::meta::type_name("foreman.ApplyGradientsMessage"), x.gradients, x.learning_rate, x.adam_step_size,
           x.job_id);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, PsShardStatsMessage& x) {
  return f(caf::meta::type_name("foreman.PsShardStatsMessage"), x.task_index, x.global_step, x.initialized, x.frozen,
           x.applied_updates, x.refused_updates, x.stale_gradients, x.dropped_gradients, x.sync_step,
           x.waiting_replicas, x.queued_updates, x.freeze_timeouts, x.worker_applies, x.worker_last_apply_ms, x.waiting_workers,
           x.job_id, x.ended, x.trained);
}

StatusMessage ToMessage(const Status& status);
/// The Status back; an unknown code becomes UNKNOWN (a peer's bad input
/// never becomes a code Foreman treats specially).
Status FromMessage(const StatusMessage& message);

/// `tensor` with a copy of its bytes (counted: TransportCopyCounters).
/// INVALID_ARGUMENT for a string tensor (not a raw buffer).
StatusOr<TensorMessage> ToMessage(const std::string& name, const Tensor& tensor);
/// As ToMessage, over `tensor`'s own bytes (TensorBytes::Borrow: no copy):
/// the caller keeps `tensor` alive and unchanged until the message's bytes
/// are returned (TensorBytes::WaitUntilReturned).
StatusOr<TensorMessage> BorrowingMessage(const std::string& name, const Tensor& tensor);
/// INVALID_ARGUMENT naming the tensor when the dtype is unknown, a dimension
/// is negative, or the byte count does not match the shape (a peer's bad
/// input never reaches a tensor). OK: sets *dtype.
Status CheckTensorMessage(const TensorMessage& message, DataType* dtype);
/// The tensor of a checked message, its bytes copied (counted).
StatusOr<Tensor> FromMessage(const TensorMessage& message);
/// The same, taking the message's bytes without a copy when it holds the
/// only reference to a block (TensorBytes::TakeAsTensor); the result is a
/// block tensor either way. `message.bytes` is empty afterwards.
StatusOr<Tensor> FromMessage(TensorMessage&& message);

}  // namespace foreman::internal
