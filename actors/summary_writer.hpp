// summary_writer actor: one per logdir; owns that directory's
// foreman::EventFileWriter (TF: FileWriterCache.get(logdir), B151: every hook
// writing to one directory shares one event file). Spawned detached: its
// handlers write files.
//
// Events do not travel one message each: SummaryWriterHandle (any thread)
// appends them to the writer's SummaryQueue and sends one drain message when
// none is pending; the actor takes everything queued by then at once and
// hands the summaries to EventFileWriter::AddSummaries, which writes and
// flushes once per batch where max_queue or flush_secs call for it (the file
// holds the same events in the same order; those of one batch, all queued
// before the actor took it, reach the file together, one write() for many).
// Every sender (hooks, step_counter,
// checkpoint_saver) goes through the handle, so the file keeps the order in
// which events were added, and a caller's Flush() sees all it added before.
//
// Protocol:
//   (drain_atom)                                                   no reply
//       Takes the queue: AddSummaries / AddSessionLog in order.
//   (flush_atom, std::shared_ptr<Completion> done)
//       Takes the queue, then writes and flushes everything (B149);
//       completes `done` with the writer's first error, else Flush()'s
//       status.
//   (close_atom, std::shared_ptr<Completion> done)
//       Takes the queue, then Close(); completes `done` like flush. Events
//       queued later are dropped with one warning (TF: "closed FileWriter",
//       B149). The actor keeps running until the supervisor stops it; when
//       it exits, what is queued is dropped, and so is what is added later.
// Errors: the first error of any write is sent to the failure_sink as
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

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "atoms.hpp"
#include "child_link.hpp"
#include "foreman/event_writer.hpp"
#include "foreman/mutex.hpp"
#include "runtime/services.hpp"

namespace foreman::internal {

/// A SessionLog event as a message.
struct SessionLogRecord {
  SessionLogStatus status = SessionLogStatus::kUnspecified;
  std::optional<int64_t> step;
  std::string checkpoint_path;
  std::string msg;
};

/// Events added and not yet taken by the actor, in order.
struct SummaryBatch {
  /// A summary (bytes[offset, offset + size) at `step`) or, when `log` >= 0,
  /// logs[log].
  struct Entry {
    std::size_t offset = 0;
    std::size_t size = 0;
    int64_t step = 0;
    int log = -1;
  };
  std::string bytes;  // the serialized summaries, back to back
  std::vector<Entry> entries;
  std::vector<SessionLogRecord> logs;

  bool empty() const { return entries.empty(); }
  /// Keeps the capacity: a batch is reused.
  void clear() {
    bytes.clear();
    entries.clear();
    logs.clear();
  }
};

/// Events that never reached an event file: how many, and their steps in
/// the order they were added (-1: a SessionLog without a step), at most
/// kMaxSteps of them.
struct LostEvents {
  static constexpr std::size_t kMaxSteps = 10000;
  int64_t events = 0;
  std::vector<int64_t> steps;
  void Add(int64_t step) {
    ++events;
    if (steps.size() < kMaxSteps) steps.push_back(step);
  }
};

/// The queue between a logdir's handle (any thread) and its actor, which
/// outlives the actor's incarnations (restart_policy.hpp): each
/// incarnation's epoch is the queue's epoch when it started. Thread-safe.
class SummaryQueue {
 public:
  /// Appends; true when the caller must send (drain_atom) to the actor: no
  /// drain is pending since the actor last took the queue. Once Close()d,
  /// drops the event and returns false.
  bool AddSummary(absl::string_view serialized_summary, int64_t step) ABSL_LOCKS_EXCLUDED(mu_);
  bool AddSessionLog(SessionLogRecord log) ABSL_LOCKS_EXCLUDED(mu_);
  /// Swaps everything queued into *batch (cleared first; its buffers become
  /// the queue's), so that the next add asks for a drain again.
  void TakeAll(SummaryBatch* batch) ABSL_LOCKS_EXCLUDED(mu_);
  /// The actor is gone: drops what is queued and every later add (each
  /// counted in lost()); returns how many events were queued. With `epoch`,
  /// only when the queue is still in that epoch (a late exit of an old
  /// incarnation does not close its successor's queue).
  std::size_t Close() ABSL_LOCKS_EXCLUDED(mu_);
  std::size_t Close(uint64_t epoch) ABSL_LOCKS_EXCLUDED(mu_);
  /// Counts events an incarnation took and could not write.
  void RecordLost(const std::vector<int64_t>& steps) ABSL_LOCKS_EXCLUDED(mu_);
  uint64_t epoch() ABSL_LOCKS_EXCLUDED(mu_);
  /// For a restarted actor: a new epoch, open again, no drain pending (the
  /// new incarnation drains at start); returns and resets what was lost.
  LostEvents Reopen() ABSL_LOCKS_EXCLUDED(mu_);
  /// What was lost since the last Reopen (or creation).
  LostEvents lost() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  std::size_t CloseLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  Mutex mu_;
  SummaryBatch batch_ ABSL_GUARDED_BY(mu_);
  bool drain_pending_ ABSL_GUARDED_BY(mu_) = false;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t epoch_ ABSL_GUARDED_BY(mu_) = 0;
  LostEvents lost_ ABSL_GUARDED_BY(mu_);
};

/// What a summary_writer incarnation needs besides its queue.
struct SummaryWriterArgs {
  /// The open writer (the first incarnation: the Runtime creates it, so that
  /// SummaryWriter() returns EventFileWriter::Create's error), or null: the
  /// actor creates a new event file in `logdir` with `options` when it starts
  /// (a restart) and quits with Create's error when that fails.
  std::shared_ptr<EventFileWriter> writer;
  EventFileWriterOptions options;
  std::string logdir;
  std::shared_ptr<SummaryQueue> queue;
  caf::actor failure_sink;
  /// A write error quits the actor with it (for the supervisor's restart
  /// policy) instead of being reported to `failure_sink` (TF's default: the
  /// actor keeps running and the run fails with the report).
  bool exit_on_error = false;
  std::shared_ptr<MessageFaults> faults;  // may be null
};

/// Spawns the writer (detached) as a child of `parent`, taking its events
/// from args.queue; failures go to args.failure_sink (or quit it, see
/// SummaryWriterArgs::exit_on_error).
caf::actor SpawnSummaryWriter(caf::local_actor* parent, SummaryWriterArgs args);

/// The service facade the training thread, step_counter and
/// checkpoint_saver use (services.hpp). Thread-safe.
class SummaryWriterHandle : public SummaryWriterService {
 public:
  /// `queue`: the one the actor behind `link` drains. `restartable`: a
  /// restart policy may bring the actor back (events added while it is down
  /// stay queued for the next incarnation, unless the service is removed).
  SummaryWriterHandle(std::string logdir, std::shared_ptr<SummaryQueue> queue, std::shared_ptr<ChildLink> link,
                      bool restartable = false);
  void AddSummary(absl::string_view serialized_summary, int64_t step) override;
  void AddSessionLog(SessionLogStatus status, std::optional<int64_t> step, std::string checkpoint_path = "",
                     std::string msg = "") override;
  /// Under a restart policy (`restartable`), a flush that meets the write
  /// error that ends the writer's incarnation is retried on the restarted
  /// one (the events lost are in service_restarts()): OK once it succeeds
  /// there, OK when the policy removes the writer, the error when the
  /// supervisor escalates. Waits (real time) at most `timeout` in all,
  /// back-off included.
  Status Flush(absl::Duration timeout) override;
  const std::string& logdir() const override { return logdir_; }

  /// Flush and close the file (Runtime::Shutdown); across restarts as Flush.
  Status Close(absl::Duration timeout);
  const std::shared_ptr<ChildLink>& link() const { return link_; }

 private:
  /// Sends drain_atom; when the actor is gone for good, closes the queue.
  void RequestDrain();
  struct flush_or_close {
    bool close = false;
  };
  /// One flush or close of the current incarnation.
  Status Ask(const flush_or_close& op, absl::Duration timeout);
  /// Ask(), and when `restartable_` and the incarnation failed (its write
  /// error ended it), again on the restarted incarnation; OK when the policy
  /// removed the writer; the error when it escalated. Bounded by `timeout`
  /// (real time) in all.
  Status AskAcrossRestarts(const flush_or_close& op, absl::Duration timeout);

  std::string logdir_;
  std::shared_ptr<SummaryQueue> queue_;
  std::shared_ptr<ChildLink> link_;
  bool restartable_ = false;
};

}  // namespace foreman::internal
