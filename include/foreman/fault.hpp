// Fault injection in the file system: FaultyEnv, an EnvWrapper
// (foreman/env.hpp) that makes chosen operations fail, write short, tear,
// slow down or crash, as a full disk, a failing fsync or a power cut would.
// (LevelDB/RocksDB: FaultInjectionTestEnv; FoundationDB's simulation: a seed
// reproduces a run.)
//
// Usage: hand the job a FaultyEnv wrapped around the Env it would use; the
// first append to a checkpoint data file then finds the disk full:
//   ```cpp
//   #include <cerrno>
//   #include <map>
//   #include "foreman/checkpoint.hpp"
//   #include "foreman/mem_env.hpp"
//   foreman::MemEnv disk;
//   foreman::FaultyEnv faulty(&disk, /*seed=*/42);
//   foreman::EnvFault full;
//   full.id = "disk-full";
//   full.path_pattern = "*.data-*";
//   full.op = foreman::EnvOp::kAppend;
//   full.kind = foreman::EnvFault::Kind::kError;
//   full.error = ENOSPC;
//   full.nth = 1;
//   FOREMAN_RETURN_IF_ERROR(faulty.AddFault(full));
//   FOREMAN_RETURN_IF_ERROR(faulty.RecursivelyCreateDir("/run"));
//   foreman::SaverOptions options;
//   options.env = &faulty;
//   FOREMAN_ASSIGN_OR_RETURN(auto saver, foreman::Saver::Create(options));
//   std::map<std::string, foreman::Tensor> tensors = {{"w", foreman::Tensor(foreman::DataType::kFloat, {2})}};
//   foreman::StatusOr<std::string> saved = saver->Save(tensors, "/run/model.ckpt", 1);
//   // RESOURCE_EXHAUSTED "write /run/model.ckpt-1.data-00000-of-00001.tempstate<N>:
//   // No space left on device (injected fault disk-full)" (<N>: BundleWriter's
//   // random temporary suffix; the file is renamed once complete)
//   if (saved.ok() || !absl::IsResourceExhausted(saved.status())) return absl::InternalError("no fault");
//   if (faulty.fired().size() != 1) return absl::InternalError("not recorded");
//   ```
//
// Error codes. An injected error carries the code the POSIX Env gives the
// same errno, so code under test cannot tell it from a real one: ENOSPC
// -> RESOURCE_EXHAUSTED, EACCES and EPERM -> PERMISSION_DENIED,
// ENOENT -> NOT_FOUND, EEXIST -> ALREADY_EXISTS, ENOTEMPTY ->
// FAILED_PRECONDITION, everything else (EIO, EROFS, ...) -> INTERNAL. The
// message is the POSIX Env's ("<syscall> <path>: <strerror>") followed by
// " (injected fault <id>)".
//
// Determinism. Every canonical path (FaultyEnv::CanonicalPath: the path
// without a writer's unique temporary suffix) has, per operation kind, an
// operation index: the n-th Append to "/run/a" since this FaultyEnv was
// created (through any of its handles to that file, or to its temporaries)
// is index n, 1-based, whichever thread makes it. A probabilistic fault fires
// at an operation when a draw keyed by (seed, fault id, canonical path,
// operation kind, operation index) -- a pure function, no shared random
// stream -- falls below its probability, so the same seed and faults select
// the same (canonical path, operation index) points however threads
// interleave, and whatever random or pid suffix a temporary got. With
// set_key_root(dir) the key is the canonical path under `dir` (an event file
// by its ordinal in its directory), so the points are the same wherever the
// run directory is. An `nth`
// fault counts the matching operations of all paths together, so it is
// reproducible when those operations are ordered (one writer; or a pattern
// that matches one file).
//
// Patterns. A glob matches the real path, temporary suffix included: a
// checkpoint's files are written as "<prefix>.index.tempstate<N>" and
// "<prefix>.data-00000-of-00001.tempstate<N>" and renamed when complete, so
// "*.index" matches no checkpoint write -- end such patterns in '*'
// ("*.index*", "*.data-*"). '[' in a path is a glob bracket: escape it
// ("\\[") to match it literally.
#pragma once

#include <csignal>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "foreman/clock.hpp"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "foreman/env.hpp"
#include "foreman/graph.hpp"
#include "foreman/hooks.hpp"

namespace foreman {

/// The operations a fault can match. A name operation matches on its one
/// path; RenameFile on `from` or `to` (the first that matches is the
/// operation's path).
enum class EnvOp : int {
  kAny = 0,        ///< every operation below
  kNewWritable,    ///< NewWritableFile
  kNewAppendable,  ///< NewAppendableFile
  kAppend,         ///< WritableFile::Append
  kFlush,          ///< WritableFile::Flush
  kSync,           ///< WritableFile::Sync (fdatasync)
  kClose,          ///< WritableFile::Close (not the destructor's implicit close)
  kRename,         ///< RenameFile
  kDelete,         ///< DeleteFile
  kCreateDir,      ///< CreateDir, RecursivelyCreateDir
  kDeleteDir,      ///< DeleteDir
  kSyncDir,        ///< SyncDir
  kRead,           ///< ReadFileToString, NewRandomAccessFile, RandomAccessFile::Read
  kStat,           ///< FileExists, GetFileSize, GetChildren, IsDirectory
  kLock,           ///< LockFile
};
/// Number of EnvOp values.
inline constexpr int kNumEnvOps = static_cast<int>(EnvOp::kLock) + 1;

/// "append", "sync", ... (lower case, as a plan file names them); "any" for
/// kAny, "unknown" for a value outside the enum. A static string, never
/// null. Thread-safe.
const char* EnvOpName(EnvOp op);

/// One file-system fault: plain data, so that a plan file can list them.
struct EnvFault {
  enum class Kind : int {
    /// The operation fails with `error` (default EIO) and does nothing; a
    /// failing Close still releases the file, as close(2) does.
    kError = 0,
    /// Append only: the first `prefix_bytes` of the data are appended, then
    /// it fails with `error` (default ENOSPC), as a write(2) that fills the
    /// disk. The file's Size() counts the prefix.
    kShortWrite,
    /// Append only: the append returns OK with all its data in the file, but
    /// only the first `prefix_bytes` (and everything before them) are made
    /// durable now; the rest is not, so a crash before the next successful
    /// Sync leaves the file ending in the torn prefix. Without a crash it is
    /// invisible.
    kTornWrite,
    /// The operation waits `latency` on the FaultyEnv's Clock, then runs.
    kLatency,
    /// FaultyEnv::Crash() runs instead of the operation (which fails as every
    /// operation after a crash does).
    kCrash,
  };

  /// Names the fault in the record of fired faults and keys its random
  /// draws; unique within a FaultyEnv, not empty.
  std::string id;
  /// fnmatch(3) glob (no flags: '*' matches '/' too; '[' opens a bracket,
  /// "\\[" matches a '[') on the full, real path as the caller passed it,
  /// temporary suffix included (a checkpoint write: end the pattern in '*');
  /// "*" or empty matches every path.
  std::string path_pattern;
  EnvOp op = EnvOp::kAny;
  Kind kind = Kind::kError;
  /// errno for kError and kShortWrite; 0 means the kind's default (EIO,
  /// ENOSPC).
  int error = 0;
  /// kShortWrite, kTornWrite: bytes of the append kept (durably, for a torn
  /// write). -1: half of the append, rounded down.
  int64_t prefix_bytes = -1;
  /// kLatency: the added delay, in [0, 1h] (a plan must not hang a job).
  absl::Duration latency = absl::ZeroDuration();
  /// Fire at the nth operation (1-based) this fault matches, counted over all
  /// paths; 0: use `probability` instead. When an earlier-armed fault decides
  /// the nth operation's outcome, this one stays pending and fires at the
  /// next matching operation that no earlier fault decides.
  int64_t nth = 0;
  /// With nth == 0: the chance, in [0, 1], that a matching operation fires
  /// (a draw below it at an operation an earlier fault decides is lost; the
  /// next matching operation draws again).
  double probability = 0;
  /// false: fires at most once. true: fires at every operation that triggers
  /// it -- with nth, at the nth and every later matching operation (a disk
  /// that stays full).
  bool repeat = false;
};

/// A fault that fired: which, where (the canonical path,
/// FaultyEnv::CanonicalPath: no pid or random temporary suffix), and that
/// path's operation index (per operation kind, 1-based). For a
/// FaultInjectionHook's faults: path "step", "hook:<callback>" or
/// "process" or "actor:<service>", op kAny, op_index the global_step.
struct FiredFault {
  std::string id;
  std::string path;
  EnvOp op = EnvOp::kAny;
  int64_t op_index = 0;
};

/// Payload type URL (absl::Status::SetPayload) that marks an error as caused
/// by an injected fault; the value is the fault's id.
inline constexpr char kInjectedFaultPayload[] = "foreman.InjectedFault";

/// The id of the injected fault that caused `s`, from its
/// kInjectedFaultPayload; std::nullopt when `s` is OK or carries none. (In
/// the spirit of TF's error payloads, e.g. NanLossDuringTrainingError's.)
/// Carried by: every error a FaultyEnv injects (kError, kShortWrite, and the
/// CANCELLED error of the operation a kCrash fault crashes; not the later
/// refusals until Recover(), which name no fault); a FaultInjectionHook's kStatus
/// step fault, hook fault (the thrown StatusError), actor kill (the
/// service's exit reason, as the run's error or a restart record's reason)
/// and dropped save (the save's DEADLINE_EXCEEDED).
/// The mark survives Annotate(), the actors' exit reasons and reports, and
/// the MonitoredSession's recovery and close. A kNanLoss step fault's NaN is
/// reported by whoever checks the loss (NanTensorHook: a
/// NanLossDuringTrainingError without this mark). Thread-safe.
///   ```cpp
///   #include "absl/strings/cord.h"
///   foreman::Status s = absl::InternalError("write failed");
///   s.SetPayload(foreman::kInjectedFaultPayload, absl::Cord("disk-full"));
///   if (foreman::InjectedFaultId(s) != "disk-full") return absl::InternalError("no mark");
///   ```
std::optional<std::string> InjectedFaultId(const Status& s);

/// An observer of fired faults (FaultyEnv::set_on_fire,
/// FaultInjectionHook::Options::on_fire): called once per firing,
/// synchronously, on the thread where the fault fires, after the fault is in
/// fired() and before it takes effect (before the injected error is
/// returned, the latency slept, the crash made, the exception thrown, the
/// NaN set or the signal raised), with no lock of the FaultyEnv or hook
/// held (it may call fired()). Several threads may call it at once: it must
/// be thread-safe. It must not do I/O through the FaultyEnv that calls it
/// (use its base(): e.g. WriteFiredFaults(env.base(), ...), which is how a
/// run persists its record before a process fault kills it).
using FaultObserver = std::function<void(const FiredFault&)>;

/// An EnvWrapper that injects EnvFaults (see the top of this header). Every
/// firing is logged at WARNING: "injected fault <id> fired at <op> <canonical
/// path> (operation <index>)".
///
/// Thread-safe: every Env method and every method below may be called from
/// any thread; a file object is used by one thread at a time, as any Env's.
/// Its files share its fault state and may outlive it (`base` may not).
class FaultyEnv : public EnvWrapper {
 public:
  /// `base` not owned, must outlive this Env and its files. `seed` keys the
  /// probabilistic draws. `clock` (not owned; nullptr: Clock::Real()) times
  /// kLatency faults.
  explicit FaultyEnv(Env* base, uint64_t seed = 0, Clock* clock = nullptr);
  ~FaultyEnv() override;
  FaultyEnv(const FaultyEnv&) = delete;
  FaultyEnv& operator=(const FaultyEnv&) = delete;

  // -- faults ----------------------------------------------------------------

  /// Arms `fault` for every later operation.
  /// When several faults trigger at one operation, each kLatency one adds
  /// its delay and the first armed of the others decides the outcome; the
  /// rest do not fire there.
  ///   INVALID_ARGUMENT     naming the fault and field: empty id, an id with
  ///                        a control character (below 0x20, or 0x7f), nth < 0,
  ///                        probability outside [0, 1], latency < 0 or > 1h
  ///                        (InfiniteDuration included),
  ///                        error < 0, prefix_bytes < -1, kShortWrite or
  ///                        kTornWrite on an op other than kAppend, an op or
  ///                        kind out of range
  ///   ALREADY_EXISTS       a fault with this id is armed
  ///   FAILED_PRECONDITION  kCrash or kTornWrite (which acts only through a
  ///                        crash) without a MemEnv under this Env
  /// State: per-kind operation counters are kept per distinct canonical path
  /// the Env has touched, and fired() grows by one per firing (a repeat
  /// fault: per firing operation). Checkpoint temporaries share their
  /// canonical path, so a job's checkpoints add one set of counters per
  /// saved step, not one per save attempt or process.
  Status AddFault(EnvFault fault);
  /// Disarms the fault `id` (no-op when none). Its fired record stays.
  void RemoveFault(const std::string& id);
  /// Disarms every fault.
  void ClearFaults();

  /// Every fault that fired, in the order they fired. (A run's supervisor
  /// persists this and hands it to MarkFired() of the restarted job's Env.)
  std::vector<FiredFault> fired() const;
  /// Records faults as having fired before (in an earlier process of the same
  /// run): a fault without `repeat` whose id is listed does not fire again.
  void MarkFired(const std::vector<FiredFault>& fired);

  /// Keys draws, operation indexes and FiredFault::path on the part of a
  /// path under `dir` (the job's run directory), so a plan takes the same
  /// course wherever that directory is (`foreman chaos`'s replay in another
  /// work directory); a TensorBoard event file there
  /// ("events.out.tfevents.<secs>.<host>...") is keyed by its ordinal among
  /// the event files of its directory that this Env has seen
  /// ("eval/events.out.tfevents.#0"), not by its creation second and host.
  /// `dir` itself keys as "."; paths outside it keep their CanonicalPath.
  /// Call before the first operation. Globs still match the real paths.
  /// Not TF's. Thread-safe.
  void set_key_root(const std::string& dir);

  /// Calls `on_fire` at every later firing (see FaultObserver: on the
  /// operation's thread, before the fault takes effect); an empty function
  /// removes it. Replaces the previous observer; a firing already under
  /// way may still call the previous one. Thread-safe.
  void set_on_fire(FaultObserver on_fire);

  // -- crash -----------------------------------------------------------------

  /// "Crash now": a power cut. The MemEnv under this Env (directly, or under
  /// a chain of EnvWrappers) drops everything not durable (see
  /// foreman/mem_env.hpp), and from then on every operation of this Env and
  /// of its files fails CANCELLED ("simulated crash ...") and changes
  /// nothing, until Recover(). CANCELLED: the POSIX Env never returns it,
  /// and it is not a preemption code (ABORTED, UNAVAILABLE), so a session
  /// does not try to recover in a process that is meant to be dead; the
  /// job ends and its supervisor restarts it. Waits for operations already
  /// in the base to return.
  ///   FAILED_PRECONDITION  no MemEnv under this Env: crashes are only
  ///                        supported over a MemEnv (nothing is changed)
  Status Crash();
  /// The restart after a crash: operations reach the base again. Files
  /// opened before the crash stay failed (FAILED_PRECONDITION from MemEnv).
  void Recover();
  /// True between Crash() (or a kCrash fault) and Recover().
  bool crashed() const;

  /// The path that keys draws, operation indexes and FiredFault::path:
  /// `path` without a writer's unique temporary suffix at its end, which
  /// would otherwise differ in every run --
  ///   ".tempstate<digits>"      BundleWriter's checkpoint temporaries (a
  ///                             random number);
  ///   ".tmp<digits>-<digits>"   WriteFileAtomic's (e.g. the state file's
  ///                             "checkpoint.tmp<pid>-<n>").
  /// Any other path is returned unchanged. Thread-safe.
  static std::string CanonicalPath(const std::string& path);

  // -- Env -------------------------------------------------------------------

  StatusOr<std::string> ReadFileToString(const std::string& path) override;
  StatusOr<std::unique_ptr<RandomAccessFile>> NewRandomAccessFile(const std::string& path) override;
  StatusOr<std::unique_ptr<WritableFile>> NewWritableFile(const std::string& path) override;
  StatusOr<std::unique_ptr<WritableFile>> NewAppendableFile(const std::string& path) override;
  Status RenameFile(const std::string& from, const std::string& to) override;
  Status DeleteFile(const std::string& path) override;
  Status FileExists(const std::string& path) override;
  StatusOr<uint64_t> GetFileSize(const std::string& path) override;
  StatusOr<std::vector<std::string>> GetChildren(const std::string& dir) override;
  StatusOr<bool> IsDirectory(const std::string& path) override;
  Status CreateDir(const std::string& dir) override;
  Status RecursivelyCreateDir(const std::string& dir) override;
  Status DeleteDir(const std::string& dir) override;
  Status SyncDir(const std::string& dir) override;
  StatusOr<std::unique_ptr<FileLock>> LockFile(const std::string& path) override;

  /// Shared with the files; public only so that they can name it.
  struct State;

 private:
  std::shared_ptr<State> state_;
};

/// The draw of a probabilistic fault, in [0, 1): a pure function of its
/// arguments (FNV-1a of the strings, SplitMix64 mixing), the same on every
/// platform. Exposed so that a plan's points can be listed without running
/// it. Thread-safe.
double FaultDraw(uint64_t seed, const std::string& fault_id, const std::string& path, EnvOp op,
                 int64_t op_index);

// -- step and hook faults ------------------------------------------------------

/// One fault in the training step: plain data, so that a plan file can list
/// them. What each outcome does in a MonitoredSession: see Kind.
struct StepFault {
  enum class Kind : int {
    /// The run returns `code` with `message` (before the step runs, so the
    /// step does not change the variables): ABORTED and UNAVAILABLE make a
    /// MonitoredSession recover from the last checkpoint; any other code
    /// ends the run with it.
    kStatus = 0,
    /// The fetched `loss_tensor` of the run becomes a float32 NaN scalar
    /// (needs FaultInjectionHook::WrapStep on the graph's step); a
    /// NanTensorHook then fails the run (or stops it).
    kNanLoss,
  };
  /// Names the fault in the record of fired faults and keys its draws; unique
  /// within a hook, not empty.
  std::string id;
  Kind kind = Kind::kStatus;
  /// kStatus: the code (not OK) and the message of the injected error.
  absl::StatusCode code = absl::StatusCode::kAborted;
  std::string message;
  /// The global_step (before the step) the fault fires at; -1: use
  /// `probability` at every step.
  int64_t at_step = -1;
  /// With at_step == -1: the chance, in [0, 1], that a step fires it.
  double probability = 0;
  /// false: fires at most once per run (the record carries it across
  /// restarts); true: at every step that triggers it.
  bool repeat = false;
  /// kNanLoss: the fetch name of the loss.
  std::string loss_tensor = "loss";
};

/// A hook callback that throws (a std::runtime_error "injected hook fault
/// <id> at global_step <n>"); the session reports it as "hook
/// FaultInjectionHook::<callback>: ..." (INTERNAL) and ends the run.
struct HookFault {
  /// As StepFault::id.
  std::string id;
  /// "begin", "after_create_session", "before_run", "after_run" or "end".
  std::string callback;
  /// The global_step the callback runs at (before_run, after_run: the step's
  /// global_step before it ran; after_create_session, end: the session's);
  /// -1: the first call. Must be -1 for "begin" (no session yet).
  int64_t at_step = -1;
  /// false: throws at most once per run; true: at every call that matches.
  bool repeat = false;
};

/// A signal to the job's own process -- a preemption or an OOM kill, as a
/// cluster manager delivers them -- for a supervisor that restarts the job
/// (`foreman train`, `foreman chaos`): plain data, so that a plan file can
/// list it. A FaultInjectionHook fires it in before_run: the firing is
/// recorded first (fired(), then Options::on_fire, which persists the
/// record), then the signal is raised (Options::raise_signal; by default
/// kill(getpid(), signal)). SIGKILL ends the process at once (no final
/// checkpoint; a shell reports exit 137); SIGTERM asks for a graceful stop,
/// which the process must handle (`foreman train` stops at the next step
/// boundary after a final checkpoint; a process that does not handle
/// SIGTERM dies of it).
struct ProcessFault {
  /// As StepFault::id.
  std::string id;
  /// SIGKILL or SIGTERM (no other).
  int signal = SIGKILL;
  /// The global_step (before the step) of the run it fires at; -1: use
  /// `at_time`. Exactly one of the two is set.
  int64_t at_step = -1;
  /// With at_step == -1: fires at the first run that starts at or after this
  /// time since the hook's first session of this process was created
  /// (after_create_session), on the hook's Clock; in [0, 30 days].
  /// InfiniteDuration: not set.
  absl::Duration at_time = absl::InfiniteDuration();
  /// false: fires at most once per run (the record carries it across
  /// restarts). true: fires again in every restarted process that reaches
  /// the point (at most once per process: the first signal ends it).
  bool repeat = false;
};

/// "SIGKILL", "SIGTERM", or "signal <n>" for another number. Thread-safe.
std::string SignalName(int signal);

/// A fault in one of the session's service actors (the checkpoint saver, the
/// summary writers, the step counter, the producers of the session's input
/// pipelines): plain data, like StepFault. It fires
/// in FaultInjectionHook::before_run, at the run that starts at global_step
/// `at_step`, or at the first run that starts once `at_time` has passed on
/// the session's Clock since the hook got the services (AttachServices, at
/// session creation); it acts on every running service of kind `service`.
/// Outcomes (restart_policy.hpp says what the supervisor does then):
///   kKill   the actor quits with exit reason INTERNAL "injected actor fault
///           <id>" (`exit_normally`: a normal exit, OTP's exit(normal), to
///           exercise transient services). Under TF's default policy the run
///           then fails with that error, reported by the service's name
///           (e.g. "summary_writer(/logs)"); under a restart policy the
///           service is restarted or removed. before_run returns once the
///           supervisor has decided (the run's error set, the removal
///           recorded, the restart made -- or, with a back-off
///           (RestartPolicy::initial_backoff > 0), scheduled: the restart
///           then comes after the back-off, at a step that depends on
///           time), so a plan ends or changes the run at the same step in
///           every replay; after 5 s real time it goes on with a WARNING.
///           A request the killed service can no longer take fails with
///           the fault's id as payload (InjectedFaultId), even after a
///           normal exit.
///   kDelay  each of the service's next `count` work messages (a summary
///           writer's batch of events, a save, a step-rate record, an input
///           pipeline's batch decode) waits `delay` on the session's Clock
///           before it is handled.
///   kDrop   its next `count` work messages are dropped: a summary writer's
///           batch of events is lost (a WARNING names how many), a save's
///           ticket fails DEADLINE_EXCEEDED "the save of step <n> was
///           dropped (injected actor fault <id>)" at once (what waiting for
///           a lost save would end with; not a preemption, so the
///           CheckpointSaverHook ends the run with it), a step-rate record
///           is not written, an input pipeline's batch is lost (a WARNING
///           names its position): the Next() waiting for it is
///           DEADLINE_EXCEEDED after its timeout, and the next call
///           re-requests it (MonitoredSession::NewInputPipeline).
/// A fault whose service is not running when it fires does nothing (it is
/// still recorded).
struct ActorFault {
  enum class Kind : int { kKill = 0, kDelay, kDrop };
  /// As StepFault::id.
  std::string id;
  /// "summary_writer", "checkpoint_saver", "step_counter" or
  /// "input_pipeline".
  std::string service;
  Kind kind = Kind::kKill;
  /// Exactly one of: the global_step (before the step) it fires at, or the
  /// time on the Clock since the services started (-1 / negative: unset).
  int64_t at_step = -1;
  absl::Duration at_time = absl::InfiniteDuration();
  /// kDelay: how long each message waits (>= 0).
  absl::Duration delay = absl::ZeroDuration();
  /// kDelay, kDrop: how many messages (>= 1).
  int64_t count = 1;
  /// kKill: exit normally instead of with an error.
  bool exit_normally = false;
  /// false: fires at most once per run; true: at every run that triggers it
  /// (with at_time: every run from then on).
  bool repeat = false;
};

/// A SessionRunHook that injects StepFaults and HookFaults, and records the
/// ones that fired (FiredFault: path "step" or "hook:<callback>", op kAny,
/// op_index = the global_step). A probabilistic step fault fires at the run
/// that starts at global_step n when FaultDraw(seed, id, "step", EnvOp::kAny,
/// StepDrawIndex(n, attempt)) < probability, where attempt (1-based) counts
/// the sessions of this hook (after_create_session calls; a recovery creates
/// one) that ran step n, the current one included: the same seed selects the
/// same (step, attempt) points in every run and process, and the retry of a
/// step after a recovery draws again, so a repeating probabilistic
/// preemption can be survived. State: one [first, last] step range per
/// session.
///
/// Usage: build it, pass it among the session's hooks, and wrap the graph's
/// step when the plan has kNanLoss faults:
///   ```cpp
///   foreman::FaultInjectionHook::Options fo;
///   foreman::StepFault preempt;
///   preempt.id = "preempt";
///   preempt.code = absl::StatusCode::kAborted;
///   preempt.at_step = 120;
///   fo.steps.push_back(preempt);
///   FOREMAN_ASSIGN_OR_RETURN(auto faults, foreman::FaultInjectionHook::Create(fo));
///   foreman::HookList hooks = {faults};
///   ```
///
/// Process faults (ProcessFault) fire in before_run, recorded as path
/// "process", op kAny, op_index the global_step.
///
/// Every firing is logged at WARNING: "injected fault <id> fired at
/// global_step <n> (<what>)".
///
/// Thread-safety: the callbacks run on the training thread; fired(),
/// MarkFired() and the wrapped step may run on any thread.
class FaultInjectionHook : public SessionRunHook, public internal::ServiceUser {
 public:
  struct Options {
    std::vector<StepFault> steps;
    std::vector<HookFault> hooks;
    /// Keys the probabilistic draws.
    uint64_t seed = 0;
    /// After `seed`, so that {steps, hooks, seed} still initializes the
    /// first three.
    std::vector<ProcessFault> processes;
    /// Called at every firing, before the fault takes effect (see
    /// FaultObserver); empty: none.
    FaultObserver on_fire;
    /// Raises a ProcessFault's signal; empty: kill(getpid(), signal). Called
    /// on the training thread after on_fire; when it returns (a test's
    /// function, or a SIGTERM the process handles), the run goes on.
    std::function<void(int signal)> raise_signal;
    /// Times ProcessFault::at_time (not owned; nullptr: Clock::Real()).
    Clock* clock = nullptr;
    /// Faults in the service actors; need a session that hands the hook its
    /// services (MonitoredSession and MonitoredTrainingSession do).
    std::vector<ActorFault> actors;
  };
  /// INVALID_ARGUMENT naming the fault and field: an empty or duplicate id
  /// (across steps, hooks, processes and actors), an id with a control
  /// character (below 0x20, or 0x7f: ids are logged), kStatus with code OK,
  /// at_step < -1, probability outside [0, 1], an empty loss_tensor, an
  /// unknown callback, "begin" with at_step != -1, a kind out of range; a
  /// process fault with a signal other than SIGKILL or SIGTERM, or without
  /// exactly one of at_step >= 0 and at_time in [0, 30 days]; an actor fault
  /// with an unknown service, not exactly one of at_step (>= 0) and at_time
  /// (>= 0), a negative delay or a count < 1.
  static StatusOr<std::shared_ptr<FaultInjectionHook>> Create(const Options& options);
  ~FaultInjectionHook() override;

  std::string name() const override { return "FaultInjectionHook"; }
  Status begin() override;
  Status after_create_session(Session* session, Coordinator* coord) override;
  /// Reads the global step (Session::GlobalStep()); raises a firing
  /// ProcessFault's signal (then goes on, if the process lives); returns a
  /// firing kStatus fault's error ("injected step fault <id> at global_step
  /// <n>: <message>"). Also fires the ActorFaults that are due (recorded as
  /// path "actor:<service>", op kAny, op_index = the global_step).
  StatusOr<SessionRunArgs> before_run(SessionRunContext& ctx) override;
  /// Keeps the services' fault seam (internal::Services::service_faults)
  /// and starts the at_time clock.
  void AttachServices(internal::Services* services) override;
  Status after_run(SessionRunContext& ctx, const SessionRunValues& values) override;
  Status end(Session* session) override;

  /// `step` with the kNanLoss faults in it: after `step` returns OK, when a
  /// kNanLoss fault fires at the global_step the step started at and the
  /// run fetches its loss_tensor, that fetch is set to a float32 NaN scalar.
  /// Install it with Graph::SetStep(hook->WrapStep(graph->step())) before
  /// the graph is finalized. The returned function shares this hook's state
  /// (it may outlive the hook).
  StepFn WrapStep(StepFn step) const;

  /// The op_index key of a step fault's draw: global_step * 2^20 + attempt
  /// (modulo 2^64). Thread-safe.
  static int64_t StepDrawIndex(int64_t global_step, int64_t attempt);

  /// Every fault that fired, in order (grows by one per firing). Thread-safe.
  std::vector<FiredFault> fired() const;
  /// Records faults as fired in an earlier process of the run (e.g. from
  /// ReadFiredFaults): a fault without `repeat` whose id is listed does not
  /// fire again. Thread-safe.
  void MarkFired(const std::vector<FiredFault>& fired);

  /// Shared with the wrapped step; public only so that it can be named.
  struct State;

 private:
  explicit FaultInjectionHook(std::shared_ptr<State> state);
  Status FireActorFaults(int64_t global_step);
  std::shared_ptr<State> state_;
};

// -- plans -------------------------------------------------------------------

/// A seed and the faults to inject with it: the same plan and seed inject the
/// same faults at the same points. Built in code or read from a JSON plan
/// file (the format: ParseFaultPlan).
struct FaultPlan {
  uint64_t seed = 0;
  std::vector<EnvFault> env;
  std::vector<StepFault> steps;
  std::vector<HookFault> hooks;
  std::vector<ProcessFault> processes;
  std::vector<ActorFault> actors;
};

/// Parses a JSON plan: {"seed": <integer >= 0, default 0>, "faults": [...]},
/// each fault an object with "id" (non-empty, unique, no control character:
/// no byte below 0x20, no 0x7f) and "type":
///   "env":  "path" (glob, default every path), "op" (an EnvOpName, default
///           "any"), "kind" ("error", "short_write", "torn_write", "latency",
///           "crash"; default "latency" when latency_ms is given, else
///           "error"), "error" (an errno name such as "EIO", "ENOSPC",
///           "EROFS", "EACCES", or a positive number), "prefix_bytes"
///           (>= -1), "latency_ms" (milliseconds >= 0), "repeat" (bool), and
///           exactly one of "nth" (>= 1) or "probability" ([0, 1]).
///   "step": exactly one of "status" (a code name: "ABORTED",
///           "UNAVAILABLE", "INTERNAL", ...; not "OK") with an optional
///           "message", or "nan_loss": true with an optional "loss_tensor";
///           exactly one of "at_step" (a global_step >= 0) or "probability";
///           "repeat".
///   "hook": "callback" (as HookFault::callback), "at_step" (>= 0; absent
///           for "begin"), "repeat".
///   "process": "signal" ("SIGKILL" or "SIGTERM"), exactly one of "at_step"
///           (a global_step >= 0) or "at_time_ms" (milliseconds in
///           [0, 2592000000], 30 days), "repeat".
///   "actor": "service" ("summary_writer", "checkpoint_saver",
///           "step_counter", "input_pipeline"), "kind" ("kill", "delay", "drop"; default
///           "kill"), exactly one of "at_step" (>= 0) or "at_time_ms"
///           (milliseconds >= 0 on the session's Clock), "delay_ms" (kind
///           delay only, required, [0, 3600000]), "count" (delay and drop
///           only, >= 1, default 1), "exit_normally" (kill only), "repeat".
/// `source_name` (e.g. the file name) starts every error message. Ranges
/// are checked here; AddFault / FaultInjectionHook::Create check the rest.
///   INVALID_ARGUMENT  "<source>: <where>: <what was expected>, got <value>":
///                     a JSON syntax error (with nlohmann's byte position), a
///                     missing or mistyped field, an unknown field, an
///                     unknown type / op / kind / errno / status / callback
///                     / service name, a field that does not apply to the
///                     kind, a probability outside [0, 1], a duplicate id.
/// Thread-safe.
StatusOr<FaultPlan> ParseFaultPlan(absl::string_view json_text, absl::string_view source_name);

/// Reads `path` with `env` (not owned) and parses it (source_name = path).
///   the Env's error for the read; ParseFaultPlan's errors.
StatusOr<FaultPlan> ReadFaultPlan(Env* env, const std::string& path);

/// The plan as JSON in the plan file format; ParseFaultPlan of it gives an
/// equal plan (errors that have no name are written as numbers). A
/// ProcessFault that FaultInjectionHook::Create would refuse (a signal other
/// than SIGKILL / SIGTERM, written as its number; both at_step and at_time;
/// neither, written as "at_step": -1) is written as given, and
/// ParseFaultPlan refuses it too. Thread-safe.
std::string FaultPlanToJson(const FaultPlan& plan);

// -- the fired-fault record -----------------------------------------------------

/// The record's file name inside a run directory: "fault_record.json".
inline constexpr char kFaultRecordFile[] = "fault_record.json";

/// Writes `fired` to <run_dir>/fault_record.json atomically (WriteFileAtomic:
/// a crash leaves the old record or the new one). `run_dir` must exist.
/// `env` not owned.
///   the Env's error (the old record is then untouched).
Status WriteFiredFaults(Env* env, const std::string& run_dir, const std::vector<FiredFault>& fired);

/// Reads <run_dir>/fault_record.json: empty when the file does not exist.
///   DATA_LOSS  naming the file: not a valid record
///   the Env's other errors.
StatusOr<std::vector<FiredFault>> ReadFiredFaults(Env* env, const std::string& run_dir);


// -- the run record ----------------------------------------------------------------

/// The run record's file name inside a run directory: "run_record.jsonl".
inline constexpr char kRunRecordFile[] = "run_record.jsonl";

/// What a training process of a run did, appended to
/// <run_dir>/run_record.jsonl as it happens: one JSON object per line, each
/// line written whole and flushed (not fsynced), so a killed process leaves
/// a readable prefix (at most its last line torn). Every process of the run
/// appends to the same file. The objects, by "event":
///   {"event":"restore","checkpoint":"model.ckpt-40","global_step":40}
///       the process started from that checkpoint (its basename)
///   {"event":"step","global_step":N}          a step completed at global_step N
///   {"event":"save","global_step":N,"checkpoint":"model.ckpt-N","durable":true}
///       the checkpoint of step N is durable (CheckpointSaverListener::after_save)
///   {"event":"recovery","cause":"UNAVAILABLE: ...","global_step_before":B,
///    "restored_global_step":R,"steps_lost":L}
///       an in-process recovery (RecoveryOptions::on_recovered's RecoveryReport;
///       written after the first good step on the restored session)
///   {"event":"injected_stop","fault":"id"}    an injected fault ended the process
///   {"event":"exit","stopped_by_signal":"SIGTERM"|null}
///       the process ended training cleanly (after a signal's graceful stop or not)
///   {"event":"failed","what":"training failed","code":"UNAVAILABLE","message":"..."}
///       the process ended with an error (`what`: the stage; `code`: the
///       status code's TF name, as absl::StatusCodeToString gives it)
/// `foreman train --fault-plan` writes it, and `foreman train --run-record
/// FILE` (also a cluster's workers); foreman chaos reads it (its invariants
/// read no log text). Not TF's. Thread-safe: each call appends
/// one line under a lock. Writes through the POSIX file system (never a
/// FaultyEnv); a write that fails is dropped and kept in status().
class RunRecordWriter {
 public:
  /// Opens <run_dir>/run_record.jsonl for appending (creating it). `run_dir`
  /// must exist. Errors: INTERNAL naming the file and errno's text.
  static StatusOr<std::unique_ptr<RunRecordWriter>> Open(const std::string& run_dir);
  /// Opens the record file `path` itself for appending (creating it; its
  /// directory must exist). Errors: INTERNAL naming the file and errno's text.
  static StatusOr<std::unique_ptr<RunRecordWriter>> OpenFile(const std::string& path);
  ~RunRecordWriter();
  RunRecordWriter(const RunRecordWriter&) = delete;
  RunRecordWriter& operator=(const RunRecordWriter&) = delete;

  /// `checkpoint`: a checkpoint prefix (its basename is recorded).
  void Restore(const std::string& checkpoint, int64_t global_step);
  void Step(int64_t global_step);
  void Save(int64_t global_step, const std::string& checkpoint);
  void Recovery(const Status& cause, int64_t global_step_before, int64_t restored_global_step, int64_t steps_lost);
  void InjectedStop(const std::string& fault_id);
  /// `stopped_by_signal`: the signal's name ("SIGTERM"), empty when none.
  void Exit(const std::string& stopped_by_signal);
  /// `what`: the stage that failed ("training failed"); `error` not OK.
  void Failed(const std::string& what, const Status& error);
  /// OK, or the first write's error.
  Status status() const;

 private:
  struct Impl;
  explicit RunRecordWriter(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace foreman
