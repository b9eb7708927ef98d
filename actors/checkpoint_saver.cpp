#include "checkpoint_saver.hpp"

#include <pthread.h>
#include <sched.h>

#include <utility>

#include "foreman/mutex.hpp"
#include "absl/strings/str_cat.h"
#include "fault/injected_fault.hpp"
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
  // This detached actor's own thread: SCHED_BATCH, same share of the CPU but
  // no wakeup preemption. Otherwise the save request's wakeup lets the saver
  // (crc32c + write of the whole state, CPU-bound for milliseconds) take the
  // core of the training thread before its run() returns: on a loaded
  // 2-core machine a 10 MB save's stall went from ~0.8 ms (the copy) to
  // 5-10 ms. Best effort: a refusal leaves the default policy.
  {
    sched_param param{};
    param.sched_priority = 0;
    if (int err = pthread_setschedparam(pthread_self(), SCHED_BATCH, &param); err != 0) {
      FOREMAN_LOG_DEBUG("{}: SCHED_BATCH refused (error {}); keeping the default policy", st.source, err);
    }
  }
  return {
      [=](save_atom, const std::shared_ptr<SaveRequest>& request) {
        auto& st = self->state;
        SaveTicket& ticket = *request->ticket;
        if (st.args.faults != nullptr) {
          if (std::optional<MessageFaults::Action> a = st.args.faults->Next()) {
            if (a->drop) {
              ticket.Complete(WithInjectedFault(absl::DeadlineExceededError(absl::StrCat(
                                                    "the save of step ", ticket.step,
                                                    " was dropped (injected actor fault ", a->fault_id, ")")),
                                                a->fault_id),
                              "", absl::ZeroDuration(), std::move(request->snapshot));
              return;
            }
            st.args.clock->SleepFor(a->delay);
          }
        }
        const absl::Duration start = st.args.clock->MonotonicNow();
        StatusOr<std::string> prefix = st.args.saver->Save(request->snapshot, st.save_path, ticket.step);
        const absl::Duration took = st.args.clock->MonotonicNow() - start;
        // The copy goes back with the ticket: the next save copies into these
        // buffers, whose pages are already touched (no page faults on the
        // training thread, no first kernel read of fresh pages in the write).
        std::map<std::string, Tensor> buffers = std::move(request->snapshot);
        request->snapshot.clear();
        if (!prefix.ok()) {
          Status s = Annotate(prefix.status(), absl::StrCat("saving the checkpoint of step ", ticket.step));
          if (st.args.exit_on_error) {
            // The restart policy decides: this incarnation ends with the
            // error; its link completes the ticket with it, marked lost, once
            // the link sees the exit (so that the next save, started after
            // the ticket completes, is parked for the next incarnation rather
            // than sent to this one). Its buffers go with it.
            self->quit(StatusToError(s));
            return;
          }
          if (st.args.cell != nullptr) {
            st.args.cell->Report(st.source, s);
          } else {
            self->send(st.args.failure_sink, report_atom::value, st.source, ToMessage(s));
          }
          ticket.Complete(std::move(s), "", took, std::move(buffers));
          return;
        }
        if (st.args.summary_writer) {
          st.args.summary_writer->AddSessionLog(SessionLogStatus::kCheckpoint, ticket.step, st.save_path, "");
        }
        if (st.args.observers != nullptr) st.args.observers->Notify(ticket.step, *prefix);
        ticket.Complete(absl::OkStatus(), *std::move(prefix), took, std::move(buffers));
      },
      [=](kill_atom, const caf::error& reason) { self->quit(reason); },
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
  auto request = std::make_shared<SaveRequest>();
  request->snapshot = std::move(snapshot);
  request->ticket = ticket;
  // Parked while a restartable saver is down (ChildLink::SendTracked);
  // completed at once with an error when it is gone for good.
  link_->SendTracked(ticket, save_atom::value, std::move(request));
  return ticket;
}

std::shared_ptr<SaveTicket> CheckpointHandle::last_ticket() {
  MutexLock l(mu_);
  return last_;
}

}  // namespace foreman::internal
