// Scaffold, SessionManager and the session creators
// (include/foreman/session_manager.hpp; spec §7-§8, decisions 7 and 8).
//
// TF's ops become functions over a Session: "initialized" means present in
// the session's VariableStore, so an init op creates variables from the
// graph's initializers and a restore creates them from the checkpoint.
// On a cluster session the chief's init op, init_fn and restore write what
// they changed to the ps tasks (internal::WriteThroughScope); the local init
// op and every read stay in the session's mirror.
// A chief (re)starting on ps tasks at or after its latest checkpoint
// re-attaches without restoring them (MaybeReattach, notes/cluster.md rule 5).
#include "foreman/session_manager.hpp"

#include <algorithm>
#include <cmath>
#include <map>
#include <mutex>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "foreman/bundle.hpp"
#include "formats/saver.hpp"
#include "foreman/mutex.hpp"
#include "platform/log.hpp"
#include "runtime/session_access.hpp"

namespace foreman {

/// How often a line a poll loop repeats unchanged is logged again.
constexpr absl::Duration kRepeatedLogInterval = absl::Seconds(10);

// SessionManager::repeated_logs_: per kind of line, the text last logged
// and when (the session config's clock). Shared by the sessions a manager
// makes (a MonitoredSession's recoveries reuse one manager).
struct SessionManager::RepeatedLogs {
  Mutex mu;
  std::map<std::string, std::pair<std::string, absl::Duration>> last ABSL_GUARDED_BY(mu);

  // True (and noted) when `text` is the first of `kind`, differs from the
  // last one logged, or kRepeatedLogInterval has passed since it was.
  bool ShouldLog(const std::string& kind, const std::string& text, absl::Duration now) {
    MutexLock l(mu);
    auto it = last.find(kind);
    if (it != last.end() && it->second.first == text && now - it->second.second < kRepeatedLogInterval) {
      return false;
    }
    last[kind] = {text, now};
    return true;
  }
};

namespace {

/// Creates or reassigns `name` in `vars` (TF's initializer assigns whether
/// or not the variable holds a value).
Status SetVariable(VariableStore& vars, const std::string& name, Tensor value, bool trainable) {
  if (vars.Contains(name)) return vars.Assign(name, value);
  return vars.Create(name, std::move(value), trainable);
}

/// Whether `def` is a task's own variable of a cluster session: a global
/// variable with device "/job:worker" (VariableDef::device).
bool TaskOwn(const VariableDef& def, bool cluster) { return cluster && !def.local && !def.device.empty(); }

/// Runs the initializers of the graph's global (local == false) or local
/// variables. On a cluster session the local init also initializes the
/// task's own "/job:worker" variables that hold no value (a worker never runs
/// the init op; the chief's init op or restore already set the chief's).
Status RunInitializers(Session& session, bool local) {
  const std::shared_ptr<Graph>& graph = session.graph();
  const bool cluster = internal::SessionAccess::remote_variables(session);
  return session.WithVariables([&graph, local, cluster](VariableStore& vars) -> Status {
    for (const VariableDef& def : graph->variables()) {
      const bool runs = local ? def.local || (TaskOwn(def, cluster) && !vars.Contains(def.name)) : !def.local;
      if (!runs) continue;
      if (!def.initializer) {
        return absl::FailedPreconditionError(
            absl::StrCat("variable '", def.name, "' has no initializer"));
      }
      StatusOr<Tensor> value =
          InvokeUserCode(absl::StrCat("initializer of variable '", def.name, "'"), def.initializer);
      if (!value.ok()) return value.status();
      FOREMAN_RETURN_IF_ERROR(SetVariable(vars, def.name, *std::move(value), def.trainable));
    }
    return absl::OkStatus();
  });
}

/// B79: "Variables not initialized: a, b" from a ready op's answer; nullopt
/// when ready. An error of the op is returned; a FAILED_PRECONDITION that
/// mentions "uninitialized" counts as not ready.
StatusOr<std::optional<std::string>> Ready(const ReadyOp& op, Session& session, const char* what) {
  if (!op) return std::optional<std::string>();
  StatusOr<std::vector<std::string>> names = InvokeUserCode(what, [&] { return op(session); });
  if (!names.ok()) {
    const Status& s = names.status();
    if (absl::IsFailedPrecondition(s)) {
      if (std::string(s.message()).find("uninitialized") != std::string::npos) {
        return std::optional<std::string>(std::string(s.message()));
      }
      FOREMAN_LOG_WARN("{} : error [{}]", what, s.ToString());
    }
    return s;
  }
  if (names->empty()) return std::optional<std::string>();
  return std::optional<std::string>("Variables not initialized: " + absl::StrJoin(*names, ", "));
}

const char* Described(bool given) { return given ? "given" : "None"; }

// -- the default saver shared by the Scaffolds of one graph (B91) -------------

/// TF's SAVERS collection: the first Scaffold of a graph that needs a
/// default saver creates it; later ones in the same graph share it (with its
/// retention list) for as long as the graph lives.
struct DefaultSavers {
  struct Entry {
    std::weak_ptr<Graph> graph;
    std::shared_ptr<Saver> saver;
  };
  Mutex mu;
  std::map<const Graph*, Entry> by_graph ABSL_GUARDED_BY(mu);

  static DefaultSavers& Get() {
    static DefaultSavers* const savers = new DefaultSavers();  // never destroyed
    return *savers;
  }

  StatusOr<std::shared_ptr<Saver>> For(const std::shared_ptr<Graph>& graph, const SessionConfig& config) {
    MutexLock l(mu);
    // Forget entries of graphs that are gone (a new graph may reuse the
    // address).
    for (auto it = by_graph.begin(); it != by_graph.end();) {
      it = it->second.graph.expired() ? by_graph.erase(it) : std::next(it);
    }
    auto it = by_graph.find(graph.get());
    if (it != by_graph.end()) return it->second.saver;
    FOREMAN_ASSIGN_OR_RETURN(std::unique_ptr<Saver> created, internal::NewDefaultSaver(config.env, config.clock));
    std::shared_ptr<Saver> saver(std::move(created));
    by_graph[graph.get()] = Entry{graph, saver};
    return saver;
  }
};

}  // namespace

// -- default ops (B92) --------------------------------------------------------

InitOp DefaultInitOp() {
  return [](Session& session, const TensorMap& /*feeds*/) { return RunInitializers(session, false); };
}

SessionOp DefaultLocalInitOp() {
  return [](Session& session) { return RunInitializers(session, true); };
}

ReadyOp DefaultReadyOp() {
  return [](Session& session) -> StatusOr<std::vector<std::string>> {
    // A ps task that cannot be reached: its UNAVAILABLE, not "uninitialized".
    return internal::SessionAccess::UninitializedVariables(session, /*include_local=*/true);
  };
}

ReadyOp DefaultReadyForLocalInitOp() {
  return [](Session& session) -> StatusOr<std::vector<std::string>> {
    FOREMAN_ASSIGN_OR_RETURN(std::vector<std::string> missing,
                             internal::SessionAccess::UninitializedVariables(session, /*include_local=*/false));
    // In a cluster the task's own variables are the local init op's.
    if (internal::SessionAccess::remote_variables(session)) {
      for (const VariableDef& def : session.graph()->variables()) {
        if (!TaskOwn(def, true)) continue;
        missing.erase(std::remove(missing.begin(), missing.end(), def.name), missing.end());
      }
    }
    return missing;
  };
}

// -- Scaffold -----------------------------------------------------------------

Scaffold::Scaffold(std::shared_ptr<Graph> graph, ScaffoldOptions options)
    : graph_(std::move(graph)), options_(std::move(options)) {
  if (options_.summary_op.has_value()) summary_op_ = *options_.summary_op;
}

Status Scaffold::finalize(const SessionConfig& config) {
  if (graph_ == nullptr) return absl::InvalidArgumentError("Scaffold: null graph");
  if (!finalized_) {
    // B91/B92: what was not given gets the default; given pieces are kept
    // and never shared (B94).
    if (!options_.init_op) options_.init_op = DefaultInitOp();
    if (!options_.ready_op) options_.ready_op = DefaultReadyOp();
    if (!options_.ready_for_local_init_op) options_.ready_for_local_init_op = DefaultReadyForLocalInitOp();
    if (!options_.local_init_op) options_.local_init_op = DefaultLocalInitOp();
    if (!options_.summary_op.has_value()) summary_op_ = graph_->summary_ops();
    if (options_.saver == nullptr) {
      FOREMAN_ASSIGN_OR_RETURN(options_.saver, DefaultSavers::Get().For(graph_, config));
    }
    finalized_ = true;
  }
  // B93: every session creation finalizes; a MonitoredSession's close may
  // have unfinalized the graph since (B22).
  graph_->Finalize();
  return absl::OkStatus();
}

const std::vector<std::string>& Scaffold::summary_op() const { return summary_op_; }

// -- SessionManager -----------------------------------------------------------

SessionManager::SessionManager(SessionManagerOptions options)
    : options_(std::move(options)), repeated_logs_(std::make_shared<RepeatedLogs>()) {}

StatusOr<std::unique_ptr<SessionManager>> SessionManager::Create(SessionManagerOptions options) {
  if (options.ready_for_local_init_op && !options.local_init_op) {
    // B78, TF's message.
    return absl::InvalidArgumentError(
        "If you pass a ready_for_local_init_op you must also pass a local_init_op");
  }
  if (options.graph == nullptr) return absl::InvalidArgumentError("SessionManager: null graph");
  if (options.recovery_wait < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat("SessionManager: negative recovery_wait ",
                                                   absl::FormatDuration(options.recovery_wait)));
  }
  return std::unique_ptr<SessionManager>(new SessionManager(std::move(options)));
}

namespace {

/// Cluster rule 5 (notes/cluster.md): whether the chief re-attaches to the
/// ps tasks instead of restoring `prefix` onto them. Yes when `session` is
/// a cluster session, every ps variable of the graph is initialized on the
/// ps tasks (one Read: a ps task that restarted holds none) and the ps
/// tasks' global_step is at or after the checkpoint's; then the task's own
/// "/job:worker" variables (its input position) are restored from `prefix`
/// into the session's mirror only, nothing is written to the ps tasks, and
/// `*reattached` is set. No when the graph or the checkpoint has no int64
/// global_step, or a ps task is uninitialized or behind: nothing changed,
/// the caller restores everything. Errors: the remote read's (UNAVAILABLE)
/// and the own variables' restore (Saver::Restore's).
Status MaybeReattach(Session& session, const Saver& saver, const std::string& prefix, Env* env, bool* reattached) {
  *reattached = false;
  if (!internal::SessionAccess::remote_variables(session)) return absl::OkStatus();
  int64_t checkpoint_step = 0;
  {
    StatusOr<std::unique_ptr<BundleReader>> reader = BundleReader::Open(env, prefix);
    if (!reader.ok()) return absl::OkStatus();  // the restore reports it
    StatusOr<Tensor> step = (*reader)->Lookup(kGlobalStepName);
    if (!step.ok() || step->dtype() != DataType::kInt64 || step->shape() != TensorShape{}) return absl::OkStatus();
    checkpoint_step = step->scalar<int64_t>().value();
  }
  const std::shared_ptr<Graph>& graph = session.graph();
  std::optional<int64_t> ps_step;
  // WithVariables refreshes the mirror from the ps tasks first (no write).
  FOREMAN_RETURN_IF_ERROR(session.WithVariables([&graph, &ps_step](VariableStore& vars) -> Status {
    for (const VariableDef& def : graph->variables()) {
      if (def.local || !def.device.empty()) continue;
      if (!vars.Contains(def.name)) return absl::OkStatus();  // a ps task is uninitialized
    }
    StatusOr<int64_t> step = GetGlobalStep(vars);
    if (step.ok()) ps_step = *step;
    return absl::OkStatus();
  }));
  if (!ps_step.has_value() || *ps_step < checkpoint_step) {
    if (ps_step.has_value()) {
      FOREMAN_LOG_INFO("The ps tasks are at global_step {}, behind the latest checkpoint's {} ({}): restoring",
                       *ps_step, checkpoint_step, prefix);
    }
    return absl::OkStatus();
  }
  // The task's own variables with the checkpoint's dtypes and shapes, as
  // RestoreGlobals (one missing: a placeholder, Saver::Restore's NOT_FOUND).
  VariableStore own;
  {
    FOREMAN_ASSIGN_OR_RETURN(std::unique_ptr<BundleReader> reader, BundleReader::Open(env, prefix));
    for (const VariableDef& def : graph->variables()) {
      if (!TaskOwn(def, true)) continue;
      StatusOr<BundleEntry> entry = reader->GetEntry(def.name);
      Tensor placeholder(DataType::kFloat, TensorShape{});
      if (entry.ok()) {
        FOREMAN_ASSIGN_OR_RETURN(placeholder, Tensor::Create(entry->dtype, entry->shape));
      }
      FOREMAN_RETURN_IF_ERROR(own.Create(def.name, std::move(placeholder), def.trainable));
    }
  }
  FOREMAN_RETURN_IF_ERROR(saver.Restore(prefix, &own));
  FOREMAN_RETURN_IF_ERROR(session.WithVariables([&own, &graph](VariableStore& vars) -> Status {
    for (const VariableDef& def : graph->variables()) {
      if (!TaskOwn(def, true)) continue;
      FOREMAN_ASSIGN_OR_RETURN(Tensor * value, own.Get(def.name));
      FOREMAN_RETURN_IF_ERROR(SetVariable(vars, def.name, std::move(*value), def.trainable));
    }
    return absl::OkStatus();
  }));
  FOREMAN_LOG_INFO("re-attached to the ps at global_step {} (latest checkpoint {}): not restoring {}", *ps_step,
                   checkpoint_step, prefix);
  *reattached = true;
  return absl::OkStatus();
}

/// Issue 31 point 3: a chief with no checkpoint to restore (none in its
/// checkpoint_dir: a new or emptied directory, a pod rescheduled without its
/// volume) on ps tasks that already hold its cluster job's training
/// re-attaches to them instead of running the init op, which would
/// re-initialise a running job (TF1 runs it). True: every ps task is of
/// this job and initialized, and one of them holds training (restored, or
/// updated since its init op); nothing is written, the task's own
/// variables are left to the local init op, and a WARNING names the
/// global_step. False: run the init op: a local session; no ps task
/// initialized; only init ops' values and no update since (nothing to
/// lose: the chief's own first init, half done, retried by its recovery);
/// a ps task of another job (whose refusal of the init names both job
/// ids). FAILED_PRECONDITION when some ps tasks of this job hold training
/// and others nothing (one restarted before the chief's first checkpoint):
/// there is nothing to restore the empty ones from, and an init op would
/// wipe the others. UNAVAILABLE: TaskStates'.
StatusOr<bool> ReattachWithoutCheckpoint(Session& session, const std::string& checkpoint_dir) {
  if (!internal::SessionAccess::remote_variables(session)) return false;
  FOREMAN_ASSIGN_OR_RETURN(std::vector<internal::RemoteValues::TaskState> tasks,
                           internal::SessionAccess::ps_task_states(session));
  const internal::RemoteValues::TaskState* trained = nullptr;  // the first that holds training
  const internal::RemoteValues::TaskState* empty = nullptr;    // the first uninitialized
  // global_step lives on one ps task (ps 0: PlaceVariablesOnPs places it
  // first); the others report -1. Unknown when that task is the empty one.
  int64_t global_step = -1;
  for (const internal::RemoteValues::TaskState& task : tasks) {
    if (!task.same_job) return false;
    if (!task.initialized) {
      if (empty == nullptr) empty = &task;
      continue;
    }
    if (task.trained && trained == nullptr) trained = &task;
    global_step = std::max(global_step, task.global_step);
  }
  if (trained == nullptr) return false;
  const std::string at_step = global_step >= 0 ? absl::StrCat(" (global_step ", global_step, ")") : std::string();
  const std::string where = checkpoint_dir.empty() ? std::string("(no checkpoint_dir)") : checkpoint_dir;
  if (empty != nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "cannot initialize the ps tasks: ", trained->where, " holds the variables of cluster job '", trained->job_id,
        "'", at_step, " but ", empty->where, " holds none, and there is no checkpoint to restore them from in ",
        where, "; an init op would re-initialise the first. Start the chief with the job's --checkpoint-dir, or "
        "restart every ps task to start the job over"));
  }
  FOREMAN_LOG_WARN(
      "No checkpoint to restore in {}, but the ps tasks hold the variables of cluster job '{}'{}: re-attaching to "
      "them, not running the init op (it would re-initialise the running job)",
      where, trained->job_id, at_step);
  return true;
}

/// Restores the graph's global variables of `session` from `prefix` with
/// `saver`. They are created with the checkpoint's dtypes and shapes (a
/// session may hold none yet), then restored with Saver::Restore; a graph
/// variable missing from the checkpoint is Saver's NOT_FOUND naming it.
/// All-or-nothing: the session's values change only when every variable
/// was read and checked.
Status RestoreGlobals(Session& session, const Saver& saver, const std::string& prefix, Env* env, bool log) {
  if (log) FOREMAN_LOG_INFO("Restoring parameters from {}", prefix);
  StatusOr<std::unique_ptr<BundleReader>> reader = BundleReader::Open(env, prefix);
  if (absl::IsNotFound(reader.status())) {
    return absl::InvalidArgumentError(absl::StrCat("The passed save_path is not a valid checkpoint: ", prefix));
  }
  FOREMAN_RETURN_IF_ERROR(reader.status());

  const std::shared_ptr<Graph>& graph = session.graph();
  VariableStore restored;
  for (const VariableDef& def : graph->variables()) {
    if (def.local) continue;
    StatusOr<BundleEntry> entry = (*reader)->GetEntry(def.name);
    // Missing: a scalar placeholder, so that Saver::Restore reports it.
    Tensor placeholder;
    if (entry.ok()) {
      FOREMAN_ASSIGN_OR_RETURN(placeholder, Tensor::Create(entry->dtype, entry->shape));
    } else {
      placeholder = Tensor(DataType::kFloat, TensorShape{});
    }
    FOREMAN_RETURN_IF_ERROR(restored.Create(def.name, std::move(placeholder), def.trainable));
  }
  reader->reset();
  FOREMAN_RETURN_IF_ERROR(saver.Restore(prefix, &restored));

  // TF's Saver.restore assigns the variables where they live: on a cluster
  // session the restored values are written to the ps tasks.
  internal::WriteThroughScope write_through(session, internal::RemoteValues::WriteKind::kRestore);
  return session.WithVariables([&restored, &graph](VariableStore& vars) -> Status {
    // A value the session already holds must keep its dtype and shape;
    // checked for all before anything is assigned.
    for (const std::string& name : restored.Names()) {
      if (!vars.Contains(name)) continue;
      FOREMAN_ASSIGN_OR_RETURN(const Tensor* current, static_cast<const VariableStore&>(vars).Get(name));
      FOREMAN_ASSIGN_OR_RETURN(const Tensor* value, static_cast<const VariableStore&>(restored).Get(name));
      if (current->dtype() != value->dtype() || current->shape() != value->shape()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "Restoring variable '", name, "': the session holds ", DataTypeName(current->dtype()),
            current->shape().ToString(), ", the checkpoint has ", DataTypeName(value->dtype()),
            value->shape().ToString()));
      }
    }
    for (const VariableDef& def : graph->variables()) {
      if (def.local) continue;
      FOREMAN_ASSIGN_OR_RETURN(Tensor * value, restored.Get(def.name));
      FOREMAN_RETURN_IF_ERROR(SetVariable(vars, def.name, std::move(*value), def.trainable));
    }
    return absl::OkStatus();
  });
}

}  // namespace

StatusOr<SessionManager::Restored> SessionManager::RestoreCheckpoint(
    const std::string& master, const std::shared_ptr<Saver>& saver, const std::string& checkpoint_dir,
    const std::string& checkpoint_filename_with_path, bool wait_for_checkpoint, absl::Duration max_wait,
    const SessionConfig& config) {
  if (!checkpoint_dir.empty() && !checkpoint_filename_with_path.empty()) {
    // B82, TF's message.
    return absl::InvalidArgumentError("Can not provide both checkpoint_dir and checkpoint_filename_with_path.");
  }
  Restored out;
  FOREMAN_ASSIGN_OR_RETURN(out.session, Session::Create(options_.graph, master, config));
  // B83: no saver or no location: nothing to restore.
  if (saver == nullptr || (checkpoint_dir.empty() && checkpoint_filename_with_path.empty())) return out;

  if (!checkpoint_filename_with_path.empty()) {
    FOREMAN_RETURN_IF_ERROR(RestoreGlobals(*out.session, *saver, checkpoint_filename_with_path, config.env,
                                           repeated_logs_->ShouldLog("restore", checkpoint_filename_with_path,
                                                                     config.clock->MonotonicNow())));
    out.restored = true;
    return out;
  }

  // B83: wait up to max_wait for a checkpoint, sleeping recovery_wait
  // between checks. TF adds up its sleeps; the clock measures the same
  // (and bounds the wait even when the clock is moved on meanwhile).
  // Decision 7: LatestCheckpoint falls back to the newest checkpoint that
  // verifies, and is DATA_LOSS when files exist and none does.
  const absl::Duration start = config.clock->MonotonicNow();
  std::optional<std::string> prefix;
  for (;;) {
    FOREMAN_ASSIGN_OR_RETURN(prefix, LatestCheckpoint(config.env, checkpoint_dir));
    if (prefix.has_value()) break;
    if (!wait_for_checkpoint || options_.recovery_wait <= absl::ZeroDuration() ||
        config.clock->MonotonicNow() - start >= max_wait) {
      return out;
    }
    FOREMAN_LOG_INFO("Waiting for checkpoint to be available.");
    config.clock->SleepFor(options_.recovery_wait);
  }
  // Cluster rule 5: a chief (re)starting on ps tasks that hold a state at
  // or after the latest checkpoint keeps it (TF1 restores and rewinds).
  bool reattached = false;
  FOREMAN_RETURN_IF_ERROR(MaybeReattach(*out.session, *saver, *prefix, config.env, &reattached));
  if (!reattached) {
    FOREMAN_RETURN_IF_ERROR(RestoreGlobals(*out.session, *saver, *prefix, config.env,
                                           repeated_logs_->ShouldLog("restore", *prefix, config.clock->MonotonicNow())));
  }
  out.restored = true;

  // B84: max_to_keep continues across restarts. Paths are resolved against
  // the directory (decision 8); files that are gone are dropped. The saved
  // timestamps carry keep_checkpoint_every_n_hours over too (B142).
  StatusOr<std::optional<CheckpointState>> state = ReadCheckpointState(config.env, checkpoint_dir);
  if (state.ok() && state->has_value()) {
    saver->RecoverLastCheckpoints(checkpoint_dir, **state);
  } else {
    FOREMAN_LOG_WARN("Not recovering the retention list of {}: {}", checkpoint_dir,
                     state.ok() ? std::string("no checkpoint state file") : state.status().ToString());
  }
  return out;
}

StatusOr<std::optional<std::string>> SessionManager::TryRunLocalInitOp(Session& session) {
  if (!options_.local_init_op) return std::optional<std::string>();
  FOREMAN_ASSIGN_OR_RETURN(std::optional<std::string> not_ready,
                           Ready(options_.ready_for_local_init_op, session, "Model not ready for local init"));
  if (not_ready.has_value()) return not_ready;
  FOREMAN_LOG_INFO("Running local_init_op.");
  FOREMAN_RETURN_IF_ERROR(
      InvokeUserCode("local_init_op", [&] { return options_.local_init_op(session); }));
  FOREMAN_LOG_INFO("Done running local_init_op.");
  return std::optional<std::string>();
}

StatusOr<std::optional<std::string>> SessionManager::ModelReady(Session& session) {
  return Ready(options_.ready_op, session, "Model not ready");
}

StatusOr<std::unique_ptr<Session>> SessionManager::prepare_session(const std::string& master,
                                                                   PrepareSessionOptions options) {
  FOREMAN_ASSIGN_OR_RETURN(
      Restored r, RestoreCheckpoint(master, options.saver, options.checkpoint_dir,
                                    options.checkpoint_filename_with_path, options.wait_for_checkpoint,
                                    options.max_wait, options.config));
  Session& session = *r.session;
  // B85: a restored model runs neither init_op nor init_fn.
  if (!r.restored) {
    if (!options.init_op && !options.init_fn && !options_.local_init_op) {
      return absl::FailedPreconditionError(
          "Model is not initialized and no init_op or init_fn or local_init_op was given");
    }
    FOREMAN_ASSIGN_OR_RETURN(const bool reattached, ReattachWithoutCheckpoint(session, options.checkpoint_dir));
    if (!reattached) {
      // TF's init_op and init_fn run on the ps devices: on a cluster session
      // what they set is written to the ps tasks.
      internal::WriteThroughScope write_through(session, internal::RemoteValues::WriteKind::kInit);
      if (options.init_op) {
        FOREMAN_RETURN_IF_ERROR(
            InvokeUserCode("init_op", [&] { return options.init_op(session, options.init_feed_dict); }));
      }
      if (options.init_fn) {
        FOREMAN_RETURN_IF_ERROR(InvokeUserCode("init_fn", [&] { return options.init_fn(session); }));
      }
    }
  }

  // B86, TF's messages.
  FOREMAN_ASSIGN_OR_RETURN(std::optional<std::string> not_ready_local, TryRunLocalInitOp(session));
  if (not_ready_local.has_value()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "Init operations did not make model ready for local_init.  Init op: ",
        Described(static_cast<bool>(options.init_op)), ", init fn: ", Described(static_cast<bool>(options.init_fn)),
        ", error: ", *not_ready_local));
  }
  FOREMAN_ASSIGN_OR_RETURN(std::optional<std::string> not_ready, ModelReady(session));
  if (not_ready.has_value()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "Init operations did not make model ready.  Init op: ", Described(static_cast<bool>(options.init_op)),
        ", init fn: ", Described(static_cast<bool>(options.init_fn)),
        ", local_init_op: ", Described(static_cast<bool>(options_.local_init_op)), ", error: ", *not_ready));
  }
  return std::move(r.session);
}

StatusOr<SessionManager::Recovered> SessionManager::recover_session(
    const std::string& master, std::shared_ptr<Saver> saver, const std::string& checkpoint_dir,
    const std::string& checkpoint_filename_with_path, bool wait_for_checkpoint, absl::Duration max_wait,
    const SessionConfig& config) {
  FOREMAN_ASSIGN_OR_RETURN(Restored r, RestoreCheckpoint(master, saver, checkpoint_dir,
                                                         checkpoint_filename_with_path,
                                                         wait_for_checkpoint, max_wait, config));
  Recovered out;
  out.session = std::move(r.session);
  // B87: local init is always attempted; failures are logged, not returned.
  FOREMAN_ASSIGN_OR_RETURN(std::optional<std::string> not_ready_local, TryRunLocalInitOp(*out.session));
  if (!r.restored) return out;
  const std::string& restoring_file = checkpoint_dir.empty() ? checkpoint_filename_with_path : checkpoint_dir;
  if (not_ready_local.has_value()) {
    FOREMAN_LOG_INFO("Restoring model from {} did not make model ready for local init: {}", restoring_file,
                     *not_ready_local);
    return out;
  }
  FOREMAN_ASSIGN_OR_RETURN(std::optional<std::string> not_ready, ModelReady(*out.session));
  if (not_ready.has_value()) {
    FOREMAN_LOG_INFO("Restoring model from {} did not make model ready: {}", restoring_file, *not_ready);
    return out;
  }
  FOREMAN_LOG_INFO("Restored model from {}", restoring_file);
  out.initialized = true;
  return out;
}

StatusOr<std::unique_ptr<Session>> SessionManager::wait_for_session(const std::string& master,
                                                                    const SessionConfig& config,
                                                                    std::optional<absl::Duration> max_wait) {
  Clock* const clock = config.clock;
  const absl::Duration limit = max_wait.value_or(absl::InfiniteDuration());
  const absl::Duration start = clock->MonotonicNow();
  for (;;) {
    ready_polls_.fetch_add(1, std::memory_order_relaxed);
    FOREMAN_ASSIGN_OR_RETURN(std::unique_ptr<Session> session, Session::Create(options_.graph, master, config));
    // B88: local init where possible; a worker never runs init_op.
    FOREMAN_ASSIGN_OR_RETURN(std::optional<std::string> not_ready_local, TryRunLocalInitOp(*session));
    std::optional<std::string> not_ready;
    if (!not_ready_local.has_value()) {
      FOREMAN_ASSIGN_OR_RETURN(not_ready, ModelReady(*session));
      if (!not_ready.has_value()) return session;
    }
    session->Close().IgnoreError();  // TF's _safe_close
    session.reset();

    const absl::Duration remaining =
        std::max(absl::ZeroDuration(), limit - (clock->MonotonicNow() - start));
    if (remaining - options_.recovery_wait < absl::ZeroDuration()) {
      return absl::DeadlineExceededError(absl::StrCat(
          "Session was not ready after waiting ",
          static_cast<int64_t>(std::floor(absl::ToDoubleSeconds(limit))), " secs."));
    }
    const std::string why = absl::StrCat(not_ready_local.value_or("None"), ", ready: ", not_ready.value_or("None"));
    if (repeated_logs_->ShouldLog("ready", why, clock->MonotonicNow())) {
      FOREMAN_LOG_INFO("Waiting for model to be ready.  Ready_for_local_init_op:  {}", why);
    }
    clock->SleepFor(options_.recovery_wait);
  }
}

// -- session creators (B24-B26) ----------------------------------------------

namespace {

StatusOr<SessionManager*> LazySessionManager(const Scaffold& scaffold, std::unique_ptr<SessionManager>& manager,
                                             absl::Duration recovery_wait) {
  if (manager == nullptr) {
    SessionManagerOptions options;
    options.local_init_op = scaffold.local_init_op();
    options.ready_op = scaffold.ready_op();
    options.ready_for_local_init_op = scaffold.ready_for_local_init_op();
    options.graph = scaffold.graph();
    options.recovery_wait = recovery_wait;
    FOREMAN_ASSIGN_OR_RETURN(manager, SessionManager::Create(std::move(options)));
  }
  return manager.get();
}

}  // namespace

const std::string& SessionCreator::master() const {
  static const std::string* const kUnknown = new std::string;
  return *kUnknown;
}

ChiefSessionCreator::ChiefSessionCreator(std::shared_ptr<Scaffold> scaffold, std::string master,
                                         SessionConfig config, std::string checkpoint_dir,
                                         std::string checkpoint_filename_with_path)
    : scaffold_(std::move(scaffold)),
      master_(std::move(master)),
      config_(config),
      checkpoint_dir_(std::move(checkpoint_dir)),
      checkpoint_filename_with_path_(std::move(checkpoint_filename_with_path)) {}

StatusOr<std::unique_ptr<Session>> ChiefSessionCreator::create_session() {
  if (scaffold_ == nullptr) return absl::InvalidArgumentError("ChiefSessionCreator: null scaffold");
  FOREMAN_RETURN_IF_ERROR(scaffold_->finalize(config_));
  // B26: recovery_wait stays at TF's 30 s for the chief.
  FOREMAN_ASSIGN_OR_RETURN(SessionManager * manager,
                           LazySessionManager(*scaffold_, session_manager_, absl::Seconds(30)));
  PrepareSessionOptions options;
  options.saver = scaffold_->saver();
  options.checkpoint_dir = checkpoint_dir_;
  options.checkpoint_filename_with_path = checkpoint_filename_with_path_;
  options.config = config_;
  options.init_op = scaffold_->init_op();
  options.init_feed_dict = scaffold_->init_feed_dict();
  if (scaffold_->init_fn()) {
    // B94: the user's init_fn is called as init_fn(scaffold, session).
    options.init_fn = [scaffold = scaffold_](Session& session) { return scaffold->init_fn()(*scaffold, session); };
  }
  return manager->prepare_session(master_, std::move(options));
}

WorkerSessionCreator::WorkerSessionCreator(std::shared_ptr<Scaffold> scaffold, std::string master,
                                           SessionConfig config, absl::Duration max_wait,
                                           absl::Duration recovery_wait)
    : scaffold_(std::move(scaffold)),
      master_(std::move(master)),
      config_(config),
      max_wait_(max_wait),
      recovery_wait_(recovery_wait) {}

StatusOr<std::unique_ptr<Session>> WorkerSessionCreator::create_session() {
  if (scaffold_ == nullptr) return absl::InvalidArgumentError("WorkerSessionCreator: null scaffold");
  FOREMAN_RETURN_IF_ERROR(scaffold_->finalize(config_));
  FOREMAN_ASSIGN_OR_RETURN(SessionManager * manager, LazySessionManager(*scaffold_, session_manager_, recovery_wait_));
  return manager->wait_for_session(master_, config_, max_wait_);
}

}  // namespace foreman
