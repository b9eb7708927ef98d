#include "summary_writer.hpp"

#include <algorithm>
#include <deque>
#include <utility>

#include "absl/strings/str_cat.h"
#include "platform/log.hpp"

namespace foreman::internal {

// -- SummaryQueue ---------------------------------------------------------------

bool SummaryQueue::AddSummary(absl::string_view serialized_summary, int64_t step) {
  MutexLock l(mu_);
  if (closed_) {
    lost_.Add(step);
    return false;
  }
  SummaryBatch::Entry entry;
  entry.offset = batch_.bytes.size();
  entry.size = serialized_summary.size();
  entry.step = step;
  batch_.bytes.append(serialized_summary.data(), serialized_summary.size());
  batch_.entries.push_back(entry);
  return !std::exchange(drain_pending_, true);
}

bool SummaryQueue::AddSessionLog(SessionLogRecord log) {
  MutexLock l(mu_);
  if (closed_) {
    lost_.Add(log.step.value_or(-1));
    return false;
  }
  SummaryBatch::Entry entry;
  entry.log = static_cast<int>(batch_.logs.size());
  batch_.logs.push_back(std::move(log));
  batch_.entries.push_back(entry);
  return !std::exchange(drain_pending_, true);
}

void SummaryQueue::TakeAll(SummaryBatch* batch) {
  batch->clear();
  MutexLock l(mu_);
  std::swap(*batch, batch_);
  drain_pending_ = false;
}

std::size_t SummaryQueue::CloseLocked() {
  const std::size_t n = batch_.entries.size();
  for (const SummaryBatch::Entry& e : batch_.entries) {
    lost_.Add(e.log < 0 ? e.step : batch_.logs[static_cast<std::size_t>(e.log)].step.value_or(-1));
  }
  batch_.clear();
  closed_ = true;
  return n;
}

std::size_t SummaryQueue::Close() {
  MutexLock l(mu_);
  return CloseLocked();
}

std::size_t SummaryQueue::Close(uint64_t epoch) {
  MutexLock l(mu_);
  if (epoch != epoch_) return 0;
  return CloseLocked();
}

void SummaryQueue::RecordLost(const std::vector<int64_t>& steps) {
  MutexLock l(mu_);
  for (int64_t step : steps) lost_.Add(step);
}

uint64_t SummaryQueue::epoch() {
  MutexLock l(mu_);
  return epoch_;
}

LostEvents SummaryQueue::Reopen() {
  MutexLock l(mu_);
  ++epoch_;
  closed_ = false;
  drain_pending_ = false;
  return std::exchange(lost_, LostEvents{});
}

LostEvents SummaryQueue::lost() {
  MutexLock l(mu_);
  return lost_;
}

namespace {

struct summary_writer_state {
  SummaryWriterArgs args;
  std::shared_ptr<EventFileWriter> writer;  // null until created (a restart)
  std::shared_ptr<SummaryQueue> queue;
  caf::actor failure_sink;
  std::string source;  // "summary_writer(<logdir>)"
  Status first_error;
  bool failed = false;  // exit_on_error: quitting with first_error
  // Steps of the events handed to the writer and not yet written to its
  // file (oldest first; -1: no step), and the writer's events_written() when
  // last looked at: what a failure loses besides the queue.
  std::deque<int64_t> unwritten;
  int64_t written = 0;
  bool closed = false;
  bool warned_closed = false;
  SummaryBatch batch;                                   // the one being written
  std::vector<EventFileWriter::SummaryAtStep> summaries;  // a run of it
  static const char* name;
};
const char* summary_writer_state::name = "summary_writer";

// Drops from `unwritten` what the writer has written since last time.
void Confirm(summary_writer_state& st) {
  const int64_t now = st.writer->events_written();
  int64_t n = now - st.written;
  st.written = now;
  while (n-- > 0 && !st.unwritten.empty()) st.unwritten.pop_front();
}

void Check(caf::stateful_actor<summary_writer_state>* self, const Status& s) {
  auto& st = self->state;
  if (st.args.exit_on_error && st.writer) Confirm(st);
  if (s.ok()) return;
  if (st.args.exit_on_error) {
    // The supervisor's restart policy decides (session_supervisor.hpp): the
    // events this incarnation held are lost, and counted.
    if (!st.failed) {
      st.failed = true;
      st.first_error = s;
      // One more try (Close writes what the writer still holds): whatever
      // it cannot write now is lost. (Left to ~EventFileWriter, the retry
      // would happen anyway, after the report.)
      if (st.writer) {
        Status closed = st.writer->Close();
        if (!closed.ok()) FOREMAN_LOG_DEBUG("{}: closing after {}: {}", st.source, s.ToString(), closed.ToString());
        const int64_t now = st.writer->events_written();
        for (int64_t n = now - st.written; n > 0 && !st.unwritten.empty(); --n) st.unwritten.pop_front();
        st.written = now;
      }
      st.queue->RecordLost(std::vector<int64_t>(st.unwritten.begin(), st.unwritten.end()));
      st.unwritten.clear();
    }
    return;
  }
  if (st.first_error.ok()) {
    st.first_error = s;
    self->send(st.failure_sink, report_atom::value, st.source, ToMessage(s));
  } else {
    FOREMAN_LOG_ERROR("{}: {}", st.source, s.ToString());
  }
}

/// Writes the summaries collected in st.summaries (in one AddSummaries).
void WriteSummaries(caf::stateful_actor<summary_writer_state>* self) {
  auto& st = self->state;
  if (st.summaries.empty()) return;
  if (st.args.exit_on_error) {
    for (const auto& s : st.summaries) st.unwritten.push_back(s.step);
  }
  Check(self, st.writer->AddSummaries(st.summaries));
  st.summaries.clear();
}

/// Takes the queue and hands its events to the writer, in order: each run
/// of summaries in one AddSummaries. After close they are dropped with one
/// warning (B149).
// Steps of batch entries [from, end).
std::vector<int64_t> BatchSteps(const SummaryBatch& batch, std::size_t from) {
  std::vector<int64_t> steps;
  for (std::size_t i = from; i < batch.entries.size(); ++i) {
    const SummaryBatch::Entry& e = batch.entries[i];
    steps.push_back(e.log < 0 ? e.step : batch.logs[static_cast<std::size_t>(e.log)].step.value_or(-1));
  }
  return steps;
}

// exit_on_error: the first error ends this incarnation with it.
bool QuitIfFailed(caf::stateful_actor<summary_writer_state>* self) {
  if (!self->state.failed) return false;
  self->quit(StatusToError(self->state.first_error));
  return true;
}

// A restarted incarnation opens a new event file in the logdir.
bool EnsureWriter(caf::stateful_actor<summary_writer_state>* self) {
  auto& st = self->state;
  if (st.writer) return true;
  StatusOr<std::unique_ptr<EventFileWriter>> w = EventFileWriter::Create(st.args.logdir, st.args.options);
  if (!w.ok()) {
    self->quit(StatusToError(w.status()));
    return false;
  }
  st.writer = std::move(w).value();
  st.written = st.writer->events_written();
  FOREMAN_LOG_INFO("{}: writing to a new event file {}", st.source, st.writer->path());
  return true;
}

void Drain(caf::stateful_actor<summary_writer_state>* self) {
  auto& st = self->state;
  if (st.failed || !EnsureWriter(self)) return;
  st.queue->TakeAll(&st.batch);
  if (st.batch.empty()) return;
  if (st.args.faults != nullptr && !st.closed) {
    if (std::optional<MessageFaults::Action> a = st.args.faults->Next()) {
      if (a->drop) {
        std::vector<int64_t> steps = BatchSteps(st.batch, 0);
        FOREMAN_LOG_WARN("{}: {} event(s) dropped (injected actor fault {})", st.source, steps.size(), a->fault_id);
        st.queue->RecordLost(steps);
        return;
      }
      st.args.options.clock->SleepFor(a->delay);
    }
  }
  if (st.closed) {
    if (!st.warned_closed) {
      st.warned_closed = true;
      FOREMAN_LOG_WARN("{}: an event was written after the writer was closed; dropped.", st.source);
    }
    return;
  }
  for (std::size_t i = 0; i < st.batch.entries.size(); ++i) {
    const SummaryBatch::Entry& e = st.batch.entries[i];
    if (e.log < 0) {
      st.summaries.push_back({absl::string_view(st.batch.bytes.data() + e.offset, e.size), e.step});
      continue;
    }
    WriteSummaries(self);
    if (st.failed) {  // this entry and the rest were never handed on
      st.queue->RecordLost(BatchSteps(st.batch, i));
      return;
    }
    const SessionLogRecord& log = st.batch.logs[static_cast<std::size_t>(e.log)];
    if (st.args.exit_on_error) st.unwritten.push_back(log.step.value_or(-1));
    Check(self, st.writer->AddSessionLog(log.status, log.step, log.checkpoint_path, log.msg));
    if (st.failed) {
      st.queue->RecordLost(BatchSteps(st.batch, i + 1));
      return;
    }
  }
  WriteSummaries(self);
}

caf::behavior summary_writer(caf::stateful_actor<summary_writer_state>* self, SummaryWriterArgs args) {
  auto& st = self->state;
  st.args = std::move(args);
  st.writer = std::move(st.args.writer);
  if (st.writer) st.written = st.writer->events_written();
  st.queue = st.args.queue;
  st.failure_sink = st.args.failure_sink;
  st.source = absl::StrCat("summary_writer(", st.args.logdir, ")");
  MakeQuiet(self, st.source);
  // Once this actor is gone, what is queued cannot be written, nor what is
  // added later (a drain sent meanwhile was lost with the actor), until a
  // restarted incarnation reopens the queue.
  self->attach_functor([q = st.queue, epoch = st.queue->epoch()] { q->Close(epoch); });
  // A restarted incarnation opens its file at the first drain, which the
  // supervisor sends once this incarnation is bound to the link.
  // Finishes a flush or close: the first error (exit_on_error: quit with it).
  auto answer = [self](const std::shared_ptr<Completion>& done, const Status& s) {
    done->Complete(self->state.first_error.ok() ? s : self->state.first_error);
    QuitIfFailed(self);
  };
  return {
      [=](drain_atom) {
        Drain(self);
        QuitIfFailed(self);
      },
      [=](flush_atom, const std::shared_ptr<Completion>& done) {
        Drain(self);
        if (!self->state.writer) return;  // quit: `done` completes with the exit reason
        Status s = self->state.closed || self->state.failed ? absl::OkStatus() : self->state.writer->Flush();
        Check(self, s);
        answer(done, s);
      },
      [=](close_atom, const std::shared_ptr<Completion>& done) {
        Drain(self);
        if (!self->state.writer) return;
        Status s = self->state.failed ? absl::OkStatus() : self->state.writer->Close();
        if (!self->state.closed) Check(self, s);
        self->state.closed = true;
        answer(done, s);
      },
      [=](kill_atom, const caf::error& reason) { self->quit(reason); },
  };
}

}  // namespace

caf::actor SpawnSummaryWriter(caf::local_actor* parent, SummaryWriterArgs args) {
  return parent->spawn<caf::detached>(summary_writer, std::move(args));
}

// -- SummaryWriterHandle -------------------------------------------------------

SummaryWriterHandle::SummaryWriterHandle(std::string logdir, std::shared_ptr<SummaryQueue> queue,
                                         std::shared_ptr<ChildLink> link, bool restartable)
    : logdir_(std::move(logdir)), queue_(std::move(queue)), link_(std::move(link)), restartable_(restartable) {}

void SummaryWriterHandle::RequestDrain() {
  if (link_->Send(drain_atom::value)) return;
  // Between two incarnations: the restarted one is sent a drain once bound
  // (and if the restart escalates instead, the run is failing anyway).
  if (restartable_ && !link_->removed()) return;
  const std::size_t dropped = queue_->Close();
  FOREMAN_LOG_DEBUG("{} is not running: {} event(s) dropped", link_->name(), dropped);
}

void SummaryWriterHandle::AddSummary(absl::string_view serialized_summary, int64_t step) {
  if (queue_->AddSummary(serialized_summary, step)) RequestDrain();
}

void SummaryWriterHandle::AddSessionLog(SessionLogStatus status, std::optional<int64_t> step,
                                        std::string checkpoint_path, std::string msg) {
  if (queue_->AddSessionLog(SessionLogRecord{status, step, std::move(checkpoint_path), std::move(msg)})) {
    RequestDrain();
  }
}

Status SummaryWriterHandle::Ask(const flush_or_close& op, absl::Duration timeout) {
  auto done = std::make_shared<Completion>();
  if (!link_->Track(done)) return done->Wait(absl::ZeroDuration(), "");
  const bool sent = op.close ? link_->Send(close_atom::value, done) : link_->Send(flush_atom::value, done);
  if (!sent) {
    // Exited between Track and Send: `done` then carries its exit status.
    if (done->IsDone()) return done->Wait(absl::ZeroDuration(), "");
    return link_->NotRunning();
  }
  return done->Wait(timeout, absl::StrCat(op.close ? "closing " : "flushing ", link_->name()));
}

Status SummaryWriterHandle::AskAcrossRestarts(const flush_or_close& op, absl::Duration timeout) {
  if (!restartable_) {
    if (!op.close && link_->removed()) return absl::OkStatus();
    return Ask(op, timeout);
  }
  const absl::Time deadline = absl::Now() + timeout;
  auto remaining = [&] { return std::max(absl::ZeroDuration(), deadline - absl::Now()); };
  for (;;) {
    if (link_->removed()) return absl::OkStatus();  // the policy let it go: nothing to flush
    const int incarnation = link_->incarnation();
    Status s;
    if (link_->alive()) {
      s = Ask(op, remaining());
    } else {  // between incarnations: its exit status, if any
      s = link_->exit_status();
      if (s.ok()) s = link_->NotRunning();
    }
    // Under a restart policy a write error ends the incarnation (what it
    // held is lost and listed in service_restarts()): wait for the
    // supervisor's decision, and ask the next incarnation. A timeout is
    // the caller's.
    if (s.ok() || s.code() == absl::StatusCode::kDeadlineExceeded) return s;
    switch (link_->WaitDecided(incarnation, remaining())) {
      case ChildLink::Fate::kRestarted:
        continue;
      case ChildLink::Fate::kGone:
        if (link_->removed()) return absl::OkStatus();
        return s;  // escalated (the run fails with the writer's error) or shut down
      case ChildLink::Fate::kPending:
        return absl::DeadlineExceededError(absl::StrCat(op.close ? "closing " : "flushing ", link_->name(),
                                                        ": not restarted within ", absl::FormatDuration(timeout),
                                                        " after: ", s.ToString()));
    }
  }
}

Status SummaryWriterHandle::Flush(absl::Duration timeout) { return AskAcrossRestarts({false}, timeout); }

Status SummaryWriterHandle::Close(absl::Duration timeout) { return AskAcrossRestarts({true}, timeout); }

}  // namespace foreman::internal
