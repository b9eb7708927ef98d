// The runtime's allocation-free Session::Run, for MonitoredSession's hooked
// runs: fetch names sorted once per change of plan, results in slots kept
// between runs instead of a fresh std::map per step; and the runtime's own
// access to a cluster session's variables (cluster/remote_values.hpp): the
// chief's writes, the checkpoint's consistent read, the ready check's errors.
// Not a public API.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "foreman/session.hpp"
#include "foreman/status.hpp"
#include "foreman/tensor.hpp"
#include "foreman/variable_store.hpp"
#include "cluster/remote_values.hpp"

namespace foreman::internal {

class SessionAccess {
 public:
  /// Session::Run() with `fetches` already sorted and unique (REQUIRED, not
  /// checked): on OK, (*values)[i] answers fetches[i]. Both vectors are
  /// resized to fetches.size() and their tensors' storage is reused from the
  /// previous call (an int64 scalar global_step is written in place). Same
  /// answers and errors as Run(); NOT_FOUND names the first unanswered fetch
  /// in sorted order. Thread-safety as Run(); the vectors are the caller's.
  static Status RunInto(Session& session, const std::vector<std::string>& fetches, const TensorMap& feeds,
                        const RunOptions& options, RunMetadata* metadata, std::vector<Tensor>* values,
                        std::vector<unsigned char>* answered);

  /// Session::WithVariables for the chief's checkpoint copy: on a cluster
  /// session the mirror is refreshed with RemoteValues::ReadConsistent (one
  /// state of all ps tasks at one global_step) instead of Read; its errors
  /// (FAILED_PRECONDITION, UNAVAILABLE) are returned and `fn` does not run.
  /// Elsewhere exactly WithVariables. Never writes to the remote.
  static Status WithConsistentVariables(Session& session, const std::function<Status(VariableStore&)>& fn);

  /// Session::UninitializedVariables(include_local) with the error of the
  /// remote read (UNAVAILABLE) returned rather than logged (the default
  /// ready ops: a worker's or chief's ready check that cannot reach a ps task
  /// fails with it, which MonitoredSession recovers from). Costs one
  /// RemoteValues::Read on a cluster session.
  static StatusOr<std::vector<std::string>> UninitializedVariables(Session& session, bool include_local);

  /// Whether `session`'s variables live on parameter servers.
  static bool remote_variables(const Session& session);

  /// A cluster session's RemoteValues::TaskStates (under the values' lock);
  /// an empty list for a local session.
  static StatusOr<std::vector<RemoteValues::TaskState>> ps_task_states(Session& session);

  /// The session's compute device (SessionConfig.device), owned by it: the
  /// checkpoint snapshot's host buffers come from its AllocateHostTensor.
  static compute::Device& compute_device(Session& session);

  /// The ps-wait of a cluster session's target (RemoteValues::ps_wait);
  /// nullopt for a local session or a target without one. No remote call.
  static std::optional<RemoteValues::PsWait> ps_wait(const Session& session);

  /// The global_step the session last saw, from its mirror, without a
  /// remote read (a cluster session's step before its ps task was lost:
  /// the recovery's "steps lost"). nullopt when the mirror has none.
  static std::optional<int64_t> mirrored_global_step(Session& session);

  /// While set, Session::WithVariables on a cluster session writes the
  /// mirror to the remote (RemoteValues::Write, as `kind`) after `fn`
  /// returns OK, and returns Write's error: the chief's init op, init_fn
  /// (kInit) and restore (kRestore) (TF's init_op / Saver.restore run on
  /// the ps devices). nullopt (the default): off; a hook's WithVariables
  /// must never write (a write re-initialises the ps tasks and clobbers
  /// other workers' updates). No effect on a local session. Call only while
  /// no other thread uses `session` (the session manager, before the
  /// session is handed out); WriteThroughScope does.
  static void SetWriteThrough(Session& session, std::optional<RemoteValues::WriteKind> kind);
};

/// SetWriteThrough(session, kind) for its lifetime.
class WriteThroughScope {
 public:
  WriteThroughScope(Session& session, RemoteValues::WriteKind kind) : session_(session) {
    SessionAccess::SetWriteThrough(session_, kind);
  }
  ~WriteThroughScope() { SessionAccess::SetWriteThrough(session_, std::nullopt); }
  WriteThroughScope(const WriteThroughScope&) = delete;
  WriteThroughScope& operator=(const WriteThroughScope&) = delete;

 private:
  Session& session_;
};

}  // namespace foreman::internal
