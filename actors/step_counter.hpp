// step_counter actor: reports the training speed the StepCounterHook
// measured on the training thread (B110). Spawned detached: it logs and
// hands summaries to a writer.
//
// Protocol:
//   (record_atom, int64_t global_step, double steps_per_sec)       no reply
//       Logs "<tag>: <steps_per_sec>" at INFO (TF: "global_step/sec: %g")
//       and, when the counter has an output directory, sends the Summary
//       {tag, simple_value = steps_per_sec} at `global_step` to that
//       directory's summary writer (its handle's queue, so in order with
//       what the hooks add there).
//       An injected actor fault (MessageFaults) may drop or delay it.
//   (kill_atom, caf::error reason)
//       Quits with `reason` (an injected actor fault).
//   (flush_atom, std::shared_ptr<Completion> done)
//       Completes `done` once every earlier record has been handed on
//       (Runtime::Shutdown drains the counters before it closes the writers).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "atoms.hpp"
#include "child_link.hpp"
#include "runtime/services.hpp"

namespace foreman::internal {

/// Spawns the counter (detached) as a child of `parent`. `summary_writer`
/// may be null (log only).
/// `faults` (may be null): injected delays (on `clock`) and drops of records.
caf::actor SpawnStepCounter(caf::local_actor* parent, std::string tag,
                            std::shared_ptr<SummaryWriterService> summary_writer,
                            std::shared_ptr<MessageFaults> faults = nullptr, Clock* clock = nullptr);

/// The service facade the training thread uses (services.hpp).
class StepCounterHandle : public StepCounterService {
 public:
  explicit StepCounterHandle(std::shared_ptr<ChildLink> link) : link_(std::move(link)) {}
  void Record(int64_t global_step, double steps_per_sec) override;
  /// Waits until every earlier Record() has reached the summary writer.
  Status Drain(absl::Duration timeout);
  const std::shared_ptr<ChildLink>& link() const { return link_; }

 private:
  std::shared_ptr<ChildLink> link_;
};

}  // namespace foreman::internal
