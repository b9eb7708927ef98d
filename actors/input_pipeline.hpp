// input_pipeline actor: the producer behind foreman::data::InputPipeline
// (include/foreman/input_pipeline.hpp), spawned detached into the process's
// actor system (or the caller's) -- or, for MonitoredSession::NewInputPipeline,
// as a service child of the session_supervisor (kind "input_pipeline",
// restarted by the session's RestartPolicy behind its ChildLink). It decodes
// batches ahead of the training loop into a PrefetchBuffer, which the
// consumer thread reads.
//
// Protocol (fire-and-forget, from the consumer thread to the producer):
//   (seek_atom, uint64 generation, int64 epoch, int64 index, int64 count)
//       start generation `generation` at {epoch, index} with `count` credits
//   (credit_atom, uint64 generation, int64 count)
//       `count` more batches of that generation (ignored for an old one)
//   (produce_atom)  the producer to itself: decode one batch
//   (kill_atom, caf::error reason)  an injected actor fault: quit with it
// A supervised producer asks its MessageFaults before each decode (a
// delay waits on the session's Clock; a drop discards the decoded batch,
// records the fault in the PrefetchBuffer (the consumer's timeout names it)
// and stalls the generation until the consumer re-seeks), and quits with
// the error when user code (GetBatch, before_batch) throws.
// The producer decodes one batch per message, so a seek or an exit waits for
// one batch at most, and pushes each into the PrefetchBuffer, which drops
// batches of an old generation. A failed GetBatch (OUT_OF_RANGE at the end)
// is pushed too, and ends the generation: GetBatch is deterministic, so
// there is nothing after it to decode.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>

#include "foreman/mutex.hpp"
#include "foreman/dataset.hpp"
#include "foreman/input_pipeline.hpp"
#include "foreman/clock.hpp"
#include "foreman/status.hpp"

namespace caf {
class actor;
class local_actor;
}  // namespace caf

namespace foreman::internal {
class ChildLink;
class MessageFaults;
}  // namespace foreman::internal

namespace foreman::data::internal_pipeline {

/// What the producer has decoded and the consumer not yet taken.
struct PrefetchBuffer {
  struct Item {
    DatasetPosition position;
    StatusOr<Batch> result;
  };

  Mutex mu;
  std::condition_variable_any cv;
  uint64_t generation ABSL_GUARDED_BY(mu) = 0;  // the consumer's latest seek
  std::deque<Item> items ABSL_GUARDED_BY(mu);  // of `generation`, in order
  bool producer_gone ABSL_GUARDED_BY(mu) = false;  // for good
  Status producer_status ABSL_GUARDED_BY(mu);  // why it is gone
  // Supervised: bumped each time the supervisor binds a restarted producer;
  // the consumer re-seeks when it differs from the one it last saw.
  int64_t incarnation ABSL_GUARDED_BY(mu) = 0;
  // Supervised: the pipeline is destroyed; a producer restarted meanwhile
  // is stopped at once (its link is retired: the supervisor forgets it).
  bool destroyed ABSL_GUARDED_BY(mu) = false;
  // Supervised: the injected actor fault that dropped the batch at
  // `dropped_at` in generation `dropped_generation` (empty: none), so that
  // the consumer's timeout waiting for that batch names it.
  std::string dropped_by ABSL_GUARDED_BY(mu);
  uint64_t dropped_generation ABSL_GUARDED_BY(mu) = 0;
  DatasetPosition dropped_at ABSL_GUARDED_BY(mu);

  uint64_t current_generation() {
    MutexLock l(mu);
    return generation;
  }
  void Push(uint64_t gen, DatasetPosition position, StatusOr<Batch> result) {
    {
      MutexLock l(mu);
      if (gen != generation) return;  // The consumer has re-seeked since.
      items.push_back(Item{position, std::move(result)});
    }
    cv.notify_all();
  }
  /// The first reason wins.
  void ProducerGone(Status why) {
    {
      MutexLock l(mu);
      if (producer_gone) return;
      producer_gone = true;
      producer_status = std::move(why);
    }
    cv.notify_all();
  }
  /// False when the pipeline is destroyed: the new producer must stop.
  bool ProducerRestarted() {
    {
      MutexLock l(mu);
      if (destroyed) return false;
      ++incarnation;
    }
    cv.notify_all();
    return true;
  }
  /// The producer dropped the batch at `position` of generation `gen`
  /// (injected actor fault `fault_id`): nothing more comes in `gen`.
  void Dropped(uint64_t gen, DatasetPosition position, std::string fault_id) {
    MutexLock l(mu);
    dropped_by = std::move(fault_id);
    dropped_generation = gen;
    dropped_at = position;
  }
  void Destroyed(Status why) {
    {
      MutexLock l(mu);
      destroyed = true;
    }
    ProducerGone(std::move(why));
  }
};

struct ProducerArgs {
  std::shared_ptr<const Dataset> dataset;
  std::shared_ptr<PrefetchBuffer> buffer;
  std::function<void(const DatasetPosition&)> before_batch;
  // Supervised producers only (null otherwise).
  std::shared_ptr<internal::MessageFaults> faults;
  Clock* clock = nullptr;  // waits the injected delays
  bool supervised = false;  // user code that throws kills the producer
};

/// Spawns a supervised producer (detached) as a child of `parent` (the
/// session_supervisor; a restart calls it again with the same args).
caf::actor SpawnProducer(caf::local_actor* parent, ProducerArgs args);

/// The session-owned InputPipeline (MonitoredSession::NewInputPipeline) on
/// the producer behind `link`, which the supervisor binds and rebinds, and
/// the runtime detaches at Shutdown. `buffer` is the one in the producer's
/// args; the runtime marks it gone (ProducerGone) when the producer is down
/// for good.
std::unique_ptr<InputPipeline> MakeSupervisedPipeline(std::shared_ptr<const Dataset> dataset,
                                                      InputPipelineOptions options,
                                                      std::shared_ptr<PrefetchBuffer> buffer,
                                                      std::shared_ptr<internal::ChildLink> link);

}  // namespace foreman::data::internal_pipeline
