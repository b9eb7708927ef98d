#include "step_counter.hpp"

#include <utility>

#include "foreman/summary.hpp"
#include "log.hpp"

namespace foreman::internal {

namespace {

struct step_counter_state {
  std::string tag;
  caf::actor summary_writer;
  static const char* name;
};
const char* step_counter_state::name = "step_counter";

caf::behavior step_counter(caf::stateful_actor<step_counter_state>* self, std::string tag,
                           caf::actor summary_writer) {
  MakeQuiet(self, "step_counter");
  self->state.tag = std::move(tag);
  self->state.summary_writer = std::move(summary_writer);
  return {
      [=](record_atom, int64_t global_step, double steps_per_sec) {
        auto& st = self->state;
        FOREMAN_LOG_INFO("{}: {:g}", st.tag, steps_per_sec);
        if (st.summary_writer) {
          self->send(st.summary_writer, add_atom::value,
                     ScalarSummary(st.tag, static_cast<float>(steps_per_sec)), global_step);
        }
      },
  };
}

}  // namespace

caf::actor SpawnStepCounter(caf::local_actor* parent, std::string tag, caf::actor summary_writer) {
  return parent->spawn<caf::detached>(step_counter, std::move(tag), std::move(summary_writer));
}

void StepCounterHandle::Record(int64_t global_step, double steps_per_sec) {
  if (!link_->Send(record_atom::value, global_step, steps_per_sec)) {
    FOREMAN_LOG_DEBUG("{} is not running: global step rate at step {} dropped", link_->name(), global_step);
  }
}

}  // namespace foreman::internal
