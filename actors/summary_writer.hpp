// summary_writer actor: one per logdir; owns that directory's
// foreman::EventFileWriter (TF: FileWriterCache.get(logdir), B151: every hook
// writing to one directory shares one event file). Spawned detached: its
// handlers write files.
//
// Protocol:
//   (add_atom, std::string serialized_summary, int64_t step)    no reply
//       EventFileWriter::AddSummary.
//   (session_log_atom, SessionLogRecord log)                       no reply
//       EventFileWriter::AddSessionLog.
//   (flush_atom, std::shared_ptr<Completion> done)
//       Writes and flushes everything received before (B149); completes
//       `done` with the writer's first error, else Flush()'s status.
//   (close_atom, std::shared_ptr<Completion> done)
//       Close(); completes `done` like flush. Later adds are dropped with one
//       warning (TF: "closed FileWriter", B149). The actor keeps running
//       until the supervisor stops it.
// Errors: the first error of any write is sent to the coordinator as
// (report_atom, "summary_writer(<logdir>)", status); later ones are logged.
//
// Flushing on time: no timer. EventFileWriter checks flush_secs on the Clock
// on every Add* (and writes at max_queue events), and Flush / close flush
// everything, so events reach the file at the next add after flush_secs, at
// end() (B116) and at shutdown. A Clock-driven ticker thread would flush an
// idle writer sooner, but it would be one more waiter on a test's
// ManualClock (breaking BlockUntilWaiters counts everywhere), and TF's writer
// thread also flushes only after writing an event (B148). CAF timers are not
// used (design.md §6: timing decisions ask the Clock).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "atoms.hpp"
#include "foreman/event_writer.hpp"
#include "runtime/services.hpp"

namespace foreman::internal {

/// A SessionLog event as a message.
struct SessionLogRecord {
  SessionLogStatus status = SessionLogStatus::kUnspecified;
  std::optional<int64_t> step;
  std::string checkpoint_path;
  std::string msg;
};

/// Spawns the writer (detached) as a child of `parent`; failures go to
/// `coordinator`.
caf::actor SpawnSummaryWriter(caf::local_actor* parent, std::shared_ptr<EventFileWriter> writer,
                              caf::actor coordinator, std::string logdir);

/// The service facade the training thread uses (services.hpp).
class SummaryWriterHandle : public SummaryWriterService {
 public:
  SummaryWriterHandle(std::string logdir, std::shared_ptr<ChildLink> link);
  void AddSummary(std::string serialized_summary, int64_t step) override;
  void AddSessionLog(SessionLogStatus status, std::optional<int64_t> step, std::string checkpoint_path = "",
                     std::string msg = "") override;
  Status Flush(absl::Duration timeout) override;
  const std::string& logdir() const override { return logdir_; }

  /// Flush and close the file (Runtime::Shutdown).
  Status Close(absl::Duration timeout);
  const std::shared_ptr<ChildLink>& link() const { return link_; }

 private:
  std::string logdir_;
  std::shared_ptr<ChildLink> link_;
};

}  // namespace foreman::internal

CAF_ALLOW_UNSAFE_MESSAGE_TYPE(foreman::internal::SessionLogRecord)
