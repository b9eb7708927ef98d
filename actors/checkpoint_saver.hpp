// checkpoint_saver actor: one per checkpoint directory (design.md §5,
// decision 11). It holds the directory's lock (LockCheckpointDirectory)
// while it lives and writes checkpoints off the training thread. Spawned
// detached: Saver::Save writes and fsyncs files.
//
// Protocol:
//   (save_atom, std::shared_ptr<SaveRequest> request)            no reply
//       Saver::Save(request->snapshot, "<dir>/<basename>", ticket->step),
//       then, on success, a SessionLog CHECKPOINT at that step with
//       checkpoint_path "<dir>/<basename>" (B106: without the step suffix)
//       to the summary writer of <dir> (queued through its handle), and
//       only then completes the ticket
//       (so whoever saw the ticket done also finds the event queued before
//       any later flush); the session's SaveObservers are told before the
//       ticket completes too. Requests are handled in order, one at a time.
//       The snapshot's tensors go back with the completed ticket
//       (SaveTicket::buffers), failed save or not, for the next save to
//       copy into.
//       An injected actor fault (MessageFaults) may delay it, or drop it:
//       the ticket then completes with DEADLINE_EXCEEDED "the save of step <n> was
//       dropped (injected actor fault <id>)" (the CheckpointSaverHook ends
//       the run with it) and nothing is written.
//   (kill_atom, caf::error reason)
//       Quits with `reason` (an injected actor fault).
// Errors: a failed save completes its ticket with the error and is sent to
// the failure_sink as (report_atom, "checkpoint_saver(<dir>)", status) --
// unless args.exit_on_error (a restart policy that may restart the saver):
// then the actor quits with the error, and its link completes the ticket
// with it, marked lost (SaveTicket::lost). When the actor dies with saves
// queued, the runtime completes their tickets with an error (ChildLink),
// marked lost when the policy may restart it. A save requested while a
// restartable saver is down is parked for the next incarnation.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "atoms.hpp"
#include "child_link.hpp"
#include "failure_sink.hpp"
#include "foreman/mutex.hpp"
#include "foreman/checkpoint.hpp"
#include "foreman/clock.hpp"
#include "foreman/env.hpp"
#include "foreman/tensor.hpp"
#include "runtime/services.hpp"

namespace foreman::internal {

/// One save as a message: the variables copied at the step boundary and
/// the ticket the training thread waits on.
struct SaveRequest {
  std::map<std::string, Tensor> snapshot;
  std::shared_ptr<SaveTicket> ticket;
};

struct CheckpointSaverArgs {
  std::string directory;
  std::string basename;
  std::shared_ptr<Saver> saver;
  std::shared_ptr<FileLock> lock;
  std::shared_ptr<SummaryWriterService> summary_writer;  // of `directory`; may be null (no event)
  caf::actor failure_sink;
  /// When set, a failed save is recorded here (Report) before its ticket is
  /// completed, so that whoever sees the failed ticket also sees the
  /// runtime's error() (a service failure is never taken for a preemption
  /// the session could recover from). Else it is sent to `failure_sink`.
  std::shared_ptr<FailureCell> cell;
  Clock* clock = nullptr;     // measures SaveTicket::write_time
  /// Told of each durable save (may be null).
  std::shared_ptr<SaveObservers> observers;
  /// Injected delays (on `clock`) and drops of save requests (may be null).
  std::shared_ptr<MessageFaults> faults;
  /// A failed save ends the incarnation with its error (exit reason), for
  /// the supervisor's restart policy, instead of being reported (TF's
  /// default: reported, the actor runs on, the run fails with it). Set when
  /// the policy may restart checkpoint savers.
  bool exit_on_error = false;
};

/// Spawns the saver (detached) as a child of `parent`.
caf::actor SpawnCheckpointSaver(caf::local_actor* parent, CheckpointSaverArgs args);

/// The service facade the training thread uses (services.hpp).
class CheckpointHandle : public CheckpointService {
 public:
  CheckpointHandle(std::string directory, std::string basename, std::shared_ptr<Saver> saver,
                   std::shared_ptr<ChildLink> link);
  std::shared_ptr<SaveTicket> StartSave(std::map<std::string, Tensor> snapshot, int64_t step) override;
  const std::string& directory() const override { return directory_; }
  const std::shared_ptr<Saver>& saver() const override { return saver_; }
  const std::string& basename() const { return basename_; }

  /// The newest ticket handed out (null before the first save): saves run
  /// in order, so it is done when every earlier one is.
  std::shared_ptr<SaveTicket> last_ticket();
  const std::shared_ptr<ChildLink>& link() const { return link_; }

 private:
  std::string directory_;
  std::string basename_;
  std::shared_ptr<Saver> saver_;
  std::shared_ptr<ChildLink> link_;
  Mutex mu_;
  std::shared_ptr<SaveTicket> last_ ABSL_GUARDED_BY(mu_);
};

}  // namespace foreman::internal

CAF_ALLOW_UNSAFE_MESSAGE_TYPE(std::shared_ptr<foreman::internal::SaveRequest>)
