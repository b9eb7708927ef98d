#include "checkpoint_saver.hpp"

#include <utility>

#include "foreman/mutex.hpp"
#include "absl/strings/str_cat.h"
#include "platform/log.hpp"
#include "summary_writer.hpp"

namespace foreman::internal {

namespace {

struct checkpoint_saver_state {
  CheckpointSaverArgs args;
  std::string save_path;  // "<dir>/<basename>"
  std::string source;     // "checkpoint_saver(<dir>)"
  static const char* name;
};
const char* checkpoint_saver_state::name = "checkpoint_saver";

caf::behavior checkpoint_saver(caf::stateful_actor<checkpoint_saver_state>* self, CheckpointSaverArgs args) {
  auto& st = self->state;
  st.args = std::move(args);
  st.save_path = absl::StrCat(st.args.directory, "/", st.args.basename);
  st.source = absl::StrCat("checkpoint_saver(", st.args.directory, ")");
  MakeQuiet(self, st.source);
  return {
      [=](save_atom, const std::shared_ptr<SaveRequest>& request) {
        auto& st = self->state;
        SaveTicket& ticket = *request->ticket;
        const absl::Duration start = st.args.clock->MonotonicNow();
        StatusOr<std::string> prefix = st.args.saver->Save(request->snapshot, st.save_path, ticket.step);
        request->snapshot.clear();  // The copy is no longer needed; free it now.
        const absl::Duration took = st.args.clock->MonotonicNow() - start;
        if (!prefix.ok()) {
          Status s = Annotate(prefix.status(), absl::StrCat("saving the checkpoint of step ", ticket.step));
          if (st.args.cell != nullptr) {
            st.args.cell->Report(st.source, s);
          } else {
            self->send(st.args.coordinator, report_atom::value, st.source, ToMessage(s));
          }
          ticket.Complete(std::move(s), "", took);
          return;
        }
        if (st.args.summary_writer) {
          st.args.summary_writer->AddSessionLog(SessionLogStatus::kCheckpoint, ticket.step, st.save_path, "");
        }
        if (st.args.observers != nullptr) st.args.observers->Notify(ticket.step, *prefix);
        ticket.Complete(absl::OkStatus(), *std::move(prefix), took);
      },
  };
}

}  // namespace

caf::actor SpawnCheckpointSaver(caf::local_actor* parent, CheckpointSaverArgs args) {
  return parent->spawn<caf::detached>(checkpoint_saver, std::move(args));
}

// -- CheckpointHandle ------------------------------------------------------------

CheckpointHandle::CheckpointHandle(std::string directory, std::string basename, std::shared_ptr<Saver> saver,
                                   std::shared_ptr<ChildLink> link)
    : directory_(std::move(directory)),
      basename_(std::move(basename)),
      saver_(std::move(saver)),
      link_(std::move(link)) {}

std::shared_ptr<SaveTicket> CheckpointHandle::StartSave(std::map<std::string, Tensor> snapshot, int64_t step) {
  auto ticket = std::make_shared<SaveTicket>();
  ticket->step = step;
  {
    MutexLock l(mu_);
    last_ = ticket;
  }
  if (!link_->Track(ticket)) return ticket;  // Completed with the actor's exit status.
  auto request = std::make_shared<SaveRequest>();
  request->snapshot = std::move(snapshot);
  request->ticket = ticket;
  if (!link_->Send(save_atom::value, std::move(request))) {
    ticket->Complete(absl::UnavailableError(absl::StrCat(link_->name(), " is not running")), "",
                     absl::ZeroDuration());
  }
  return ticket;
}

std::shared_ptr<SaveTicket> CheckpointHandle::last_ticket() {
  MutexLock l(mu_);
  return last_;
}

}  // namespace foreman::internal
