#include "summary_writer.hpp"

#include <utility>

#include "absl/strings/str_cat.h"
#include "platform/log.hpp"

namespace foreman::internal {

// -- SummaryQueue ---------------------------------------------------------------

bool SummaryQueue::AddSummary(absl::string_view serialized_summary, int64_t step) {
  MutexLock l(mu_);
  if (closed_) return false;
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
  if (closed_) return false;
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

std::size_t SummaryQueue::Close() {
  MutexLock l(mu_);
  const std::size_t n = batch_.entries.size();
  batch_.clear();
  closed_ = true;
  return n;
}

namespace {

struct summary_writer_state {
  std::shared_ptr<EventFileWriter> writer;
  std::shared_ptr<SummaryQueue> queue;
  caf::actor coordinator;
  std::string source;  // "summary_writer(<logdir>)"
  Status first_error;
  bool closed = false;
  bool warned_closed = false;
  SummaryBatch batch;                                   // the one being written
  std::vector<EventFileWriter::SummaryAtStep> summaries;  // a run of it
  static const char* name;
};
const char* summary_writer_state::name = "summary_writer";

void Check(caf::stateful_actor<summary_writer_state>* self, const Status& s) {
  auto& st = self->state;
  if (s.ok()) return;
  if (st.first_error.ok()) {
    st.first_error = s;
    self->send(st.coordinator, report_atom::value, st.source, ToMessage(s));
  } else {
    FOREMAN_LOG_ERROR("{}: {}", st.source, s.ToString());
  }
}

/// Writes the summaries collected in st.summaries (in one AddSummaries).
void WriteSummaries(caf::stateful_actor<summary_writer_state>* self) {
  auto& st = self->state;
  if (st.summaries.empty()) return;
  Check(self, st.writer->AddSummaries(st.summaries));
  st.summaries.clear();
}

/// Takes the queue and hands its events to the writer, in order: each run
/// of summaries in one AddSummaries. After close they are dropped with one
/// warning (B149).
void Drain(caf::stateful_actor<summary_writer_state>* self) {
  auto& st = self->state;
  st.queue->TakeAll(&st.batch);
  if (st.batch.empty()) return;
  if (st.closed) {
    if (!st.warned_closed) {
      st.warned_closed = true;
      FOREMAN_LOG_WARN("{}: an event was written after the writer was closed; dropped.", st.source);
    }
    return;
  }
  for (const SummaryBatch::Entry& e : st.batch.entries) {
    if (e.log < 0) {
      st.summaries.push_back({absl::string_view(st.batch.bytes.data() + e.offset, e.size), e.step});
      continue;
    }
    WriteSummaries(self);
    const SessionLogRecord& log = st.batch.logs[static_cast<std::size_t>(e.log)];
    Check(self, st.writer->AddSessionLog(log.status, log.step, log.checkpoint_path, log.msg));
  }
  WriteSummaries(self);
}

caf::behavior summary_writer(caf::stateful_actor<summary_writer_state>* self,
                             std::shared_ptr<EventFileWriter> writer, std::shared_ptr<SummaryQueue> queue,
                             caf::actor coordinator, std::string logdir) {
  auto& st = self->state;
  st.writer = std::move(writer);
  st.queue = std::move(queue);
  st.coordinator = std::move(coordinator);
  st.source = absl::StrCat("summary_writer(", logdir, ")");
  MakeQuiet(self, st.source);
  // Once this actor is gone, what is queued cannot be written, nor what is
  // added later (a drain sent meanwhile was lost with the actor).
  self->attach_functor([q = st.queue] { q->Close(); });
  return {
      [=](drain_atom) { Drain(self); },
      [=](flush_atom, const std::shared_ptr<Completion>& done) {
        Drain(self);
        Status s = self->state.closed ? absl::OkStatus() : self->state.writer->Flush();
        Check(self, s);
        done->Complete(self->state.first_error.ok() ? s : self->state.first_error);
      },
      [=](close_atom, const std::shared_ptr<Completion>& done) {
        Drain(self);
        Status s = self->state.writer->Close();
        if (!self->state.closed) Check(self, s);
        self->state.closed = true;
        done->Complete(self->state.first_error.ok() ? s : self->state.first_error);
      },
  };
}

}  // namespace

caf::actor SpawnSummaryWriter(caf::local_actor* parent, std::shared_ptr<EventFileWriter> writer,
                              std::shared_ptr<SummaryQueue> queue, caf::actor coordinator, std::string logdir) {
  return parent->spawn<caf::detached>(summary_writer, std::move(writer), std::move(queue), std::move(coordinator),
                                      std::move(logdir));
}

// -- SummaryWriterHandle -------------------------------------------------------

SummaryWriterHandle::SummaryWriterHandle(std::string logdir, std::shared_ptr<SummaryQueue> queue,
                                         std::shared_ptr<ChildLink> link)
    : logdir_(std::move(logdir)), queue_(std::move(queue)), link_(std::move(link)) {}

void SummaryWriterHandle::RequestDrain() {
  if (link_->Send(drain_atom::value)) return;
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

Status SummaryWriterHandle::Flush(absl::Duration timeout) {
  auto done = std::make_shared<Completion>();
  if (!link_->Track(done)) return done->Wait(absl::ZeroDuration(), "");
  if (!link_->Send(flush_atom::value, done)) {
    return absl::UnavailableError(absl::StrCat(link_->name(), " is not running"));
  }
  return done->Wait(timeout, absl::StrCat("flushing ", link_->name()));
}

Status SummaryWriterHandle::Close(absl::Duration timeout) {
  auto done = std::make_shared<Completion>();
  if (!link_->Track(done)) return done->Wait(absl::ZeroDuration(), "");
  if (!link_->Send(close_atom::value, done)) {
    return absl::UnavailableError(absl::StrCat(link_->name(), " is not running"));
  }
  return done->Wait(timeout, absl::StrCat("closing ", link_->name()));
}

}  // namespace foreman::internal
