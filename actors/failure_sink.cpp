#include "failure_sink.hpp"

#include <utility>

#include "platform/log.hpp"

namespace foreman::internal {

void FailureCell::SetCoordinator(Coordinator* coord) {
  MutexLock l(mu_);
  coord_ = coord;
  if (coord_ != nullptr && !first_error_.ok()) coord_->request_stop(first_error_).IgnoreError();
}

bool FailureCell::Report(const std::string& source, const Status& status) {
  if (status.ok()) return false;
  MutexLock l(mu_);
  const bool first = first_error_.ok();
  if (first) first_error_ = status;
  FOREMAN_LOG_ERROR("{} failed: {}", source, status.ToString());
  if (coord_ != nullptr) coord_->request_stop(status).IgnoreError();
  return first;
}

Status FailureCell::error() {
  MutexLock l(mu_);
  return first_error_;
}

namespace {

struct failure_sink_state {
  std::shared_ptr<FailureCell> cell;
  static const char* name;
};
const char* failure_sink_state::name = "failure_sink";

caf::behavior failure_sink(caf::stateful_actor<failure_sink_state>* self, std::shared_ptr<FailureCell> cell) {
  MakeQuiet(self, "failure_sink");
  self->state.cell = std::move(cell);
  return {
      [=](report_atom, const std::string& source, const StatusMessage& status) {
        self->state.cell->Report(source, FromMessage(status));
      },
      [=](flush_atom, const std::shared_ptr<Completion>& done) { done->Complete(absl::OkStatus()); },
  };
}

}  // namespace

caf::actor SpawnFailureSink(caf::local_actor* parent, std::shared_ptr<FailureCell> cell) {
  return parent->spawn(failure_sink, std::move(cell));
}

}  // namespace foreman::internal
