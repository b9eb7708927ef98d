#include "summary_writer.hpp"

#include <utility>

#include "absl/strings/str_cat.h"
#include "platform/log.hpp"

namespace foreman::internal {

namespace {

struct summary_writer_state {
  std::shared_ptr<EventFileWriter> writer;
  caf::actor coordinator;
  std::string source;  // "summary_writer(<logdir>)"
  Status first_error;
  bool closed = false;
  bool warned_closed = false;
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

// An add after close is a silent no-op apart from one warning (B149).
bool Closed(caf::stateful_actor<summary_writer_state>* self) {
  auto& st = self->state;
  if (!st.closed) return false;
  if (!st.warned_closed) {
    st.warned_closed = true;
    FOREMAN_LOG_WARN("{}: an event was written after the writer was closed; dropped.", st.source);
  }
  return true;
}

caf::behavior summary_writer(caf::stateful_actor<summary_writer_state>* self,
                             std::shared_ptr<EventFileWriter> writer, caf::actor coordinator,
                             std::string logdir) {
  auto& st = self->state;
  st.writer = std::move(writer);
  st.coordinator = std::move(coordinator);
  st.source = absl::StrCat("summary_writer(", logdir, ")");
  MakeQuiet(self, st.source);
  return {
      [=](add_atom, const std::string& serialized_summary, int64_t step) {
        if (Closed(self)) return;
        Check(self, self->state.writer->AddSummary(serialized_summary, step));
      },
      [=](session_log_atom, const SessionLogRecord& log) {
        if (Closed(self)) return;
        Check(self, self->state.writer->AddSessionLog(log.status, log.step, log.checkpoint_path, log.msg));
      },
      [=](flush_atom, const std::shared_ptr<Completion>& done) {
        Status s = self->state.closed ? absl::OkStatus() : self->state.writer->Flush();
        Check(self, s);
        done->Complete(self->state.first_error.ok() ? s : self->state.first_error);
      },
      [=](close_atom, const std::shared_ptr<Completion>& done) {
        Status s = self->state.writer->Close();
        if (!self->state.closed) Check(self, s);
        self->state.closed = true;
        done->Complete(self->state.first_error.ok() ? s : self->state.first_error);
      },
  };
}

}  // namespace

caf::actor SpawnSummaryWriter(caf::local_actor* parent, std::shared_ptr<EventFileWriter> writer,
                              caf::actor coordinator, std::string logdir) {
  return parent->spawn<caf::detached>(summary_writer, std::move(writer), std::move(coordinator),
                                      std::move(logdir));
}

// -- SummaryWriterHandle -------------------------------------------------------

SummaryWriterHandle::SummaryWriterHandle(std::string logdir, std::shared_ptr<ChildLink> link)
    : logdir_(std::move(logdir)), link_(std::move(link)) {}

void SummaryWriterHandle::AddSummary(std::string serialized_summary, int64_t step) {
  if (!link_->Send(add_atom::value, std::move(serialized_summary), step)) {
    FOREMAN_LOG_DEBUG("{} is not running: summary at step {} dropped", link_->name(), step);
  }
}

void SummaryWriterHandle::AddSessionLog(SessionLogStatus status, std::optional<int64_t> step,
                                        std::string checkpoint_path, std::string msg) {
  SessionLogRecord log{status, step, std::move(checkpoint_path), std::move(msg)};
  if (!link_->Send(session_log_atom::value, std::move(log))) {
    FOREMAN_LOG_DEBUG("{} is not running: session log dropped", link_->name());
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
