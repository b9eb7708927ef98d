#include "step_counter.hpp"

#include <utility>

#include "absl/strings/str_cat.h"
#include "foreman/summary.hpp"
#include "platform/log.hpp"

namespace foreman::internal {

namespace {

struct step_counter_state {
  std::string tag;
  std::shared_ptr<SummaryWriterService> summary_writer;
  std::shared_ptr<MessageFaults> faults;
  Clock* clock = nullptr;
  static const char* name;
};
const char* step_counter_state::name = "step_counter";

caf::behavior step_counter(caf::stateful_actor<step_counter_state>* self, std::string tag,
                           std::shared_ptr<SummaryWriterService> summary_writer, std::shared_ptr<MessageFaults> faults,
                           Clock* clock) {
  MakeQuiet(self, "step_counter");
  self->state.tag = std::move(tag);
  self->state.summary_writer = std::move(summary_writer);
  self->state.faults = std::move(faults);
  self->state.clock = clock;
  return {
      [=](record_atom, int64_t global_step, double steps_per_sec) {
        auto& st = self->state;
        if (st.faults != nullptr) {
          if (std::optional<MessageFaults::Action> a = st.faults->Next()) {
            if (a->drop) {
              FOREMAN_LOG_WARN("step_counter: the record of global_step {} dropped (injected actor fault {})",
                               global_step, a->fault_id);
              return;
            }
            if (st.clock != nullptr) st.clock->SleepFor(a->delay);
          }
        }
        FOREMAN_LOG_INFO("{}: {:g}", st.tag, steps_per_sec);
        if (st.summary_writer) {
          st.summary_writer->AddSummary(ScalarSummary(st.tag, static_cast<float>(steps_per_sec)), global_step);
        }
      },
      [=](flush_atom, const std::shared_ptr<Completion>& done) { done->Complete(absl::OkStatus()); },
      [=](kill_atom, const caf::error& reason) { self->quit(reason); },
  };
}

}  // namespace

caf::actor SpawnStepCounter(caf::local_actor* parent, std::string tag,
                            std::shared_ptr<SummaryWriterService> summary_writer,
                            std::shared_ptr<MessageFaults> faults, Clock* clock) {
  return parent->spawn<caf::detached>(step_counter, std::move(tag), std::move(summary_writer), std::move(faults),
                                      clock);
}

void StepCounterHandle::Record(int64_t global_step, double steps_per_sec) {
  if (!link_->Send(record_atom::value, global_step, steps_per_sec)) {
    FOREMAN_LOG_DEBUG("{} is not running: global step rate at step {} dropped", link_->name(), global_step);
  }
}

Status StepCounterHandle::Drain(absl::Duration timeout) {
  if (link_->removed()) return absl::OkStatus();
  auto done = std::make_shared<Completion>();
  if (!link_->Track(done)) return done->Wait(absl::ZeroDuration(), "");
  if (!link_->Send(flush_atom::value, done)) {
    // Exited between Track and Send: `done` then carries its exit status.
    if (done->IsDone()) return done->Wait(absl::ZeroDuration(), "");
    return link_->NotRunning();
  }
  return done->Wait(timeout, absl::StrCat("draining ", link_->name()));
}

}  // namespace foreman::internal
