// InputPipeline: batches decoded ahead by an actor, so that the training
// loop never waits on decoding (TF: a tf.data prefetching input pipeline).
//
// A producer actor (detached: decoding is blocking CPU work, kept off CAF's
// shared scheduler) runs Dataset::GetBatch for the positions after the one
// the training loop asked for, up to `prefetch_batches` ahead (credit-based:
// one more for each batch taken). Next(position) serves the batch from that
// buffer when `position` is the one that follows the previous batch, and
// otherwise (the first call, or a restore moved the position) drops the
// buffer and re-seeks the producer. Either way its result is exactly
// dataset->GetBatch(position), so prefetching never changes what a run sees.
//
// InputPipeline::Create's producer is not supervised: when it dies, Next()
// is UNAVAILABLE for good. MonitoredSession::NewInputPipeline returns the
// same class with its producer in the session's supervision tree (service
// kind "input_pipeline": restart policies and actor faults apply, and a
// restart is invisible to Next()); monitored_session.hpp documents it.
//
// Usage:
//   ```cpp
//   FOREMAN_ASSIGN_OR_RETURN(auto pipeline, foreman::data::InputPipeline::Create(dataset, {}));
//   foreman::data::DatasetPosition pos = restored_position;
//   for (;;) {
//     auto batch = pipeline->Next(pos, absl::Seconds(60));
//     if (absl::IsOutOfRange(batch.status())) break;   // "End of sequence"
//     if (!batch.ok()) return batch.status();
//     // ... train on *batch ...
//     pos = batch->next;
//   }
//   ```
#pragma once

#include <cstdint>
#include <functional>
#include <memory>

#include "absl/time/time.h"
#include "foreman/clock.hpp"
#include "foreman/dataset.hpp"
#include "foreman/status.hpp"

namespace caf {
class actor_system;
}  // namespace caf

namespace foreman::data {

struct InputPipelineOptions {
  /// Batches decoded ahead; >= 1. Memory: prefetch_batches * batch_size *
  /// feature_dim * 4 bytes.
  int prefetch_batches = 4;
  /// The caller's actor system (not owned; it must outlive the pipeline), or
  /// nullptr: the producer lives in the process's one actor system, the one
  /// the sessions' services use (created on first use, gone when its last
  /// user is).
  caf::actor_system* actor_system = nullptr;
  /// Measures Next()'s timeout. Not owned.
  Clock* clock = Clock::Real();
  /// Called on the producer's thread before each batch is decoded, with its
  /// position (tests hold the producer here; tracing). Must not throw.
  std::function<void(const DatasetPosition&)> before_batch;
};

class InputPipeline {
 public:
  /// Starts the producer; it decodes nothing until the first Next().
  /// INVALID_ARGUMENT for prefetch_batches < 1 or a null dataset or clock;
  /// INTERNAL when the actor cannot be started.
  static StatusOr<std::unique_ptr<InputPipeline>> Create(std::shared_ptr<const Dataset> dataset,
                                                         InputPipelineOptions options);

  /// Stops the producer and waits for it (real time, bounded: a batch or
  /// less); no actor or thread outlives the pipeline, and the pipeline's reference on
  /// the process's actor system is released here.
  ~InputPipeline();
  InputPipeline(const InputPipeline&) = delete;
  InputPipeline& operator=(const InputPipeline&) = delete;

  /// Exactly dataset->GetBatch(position): the same values and the same errors
  /// (OUT_OF_RANGE "End of sequence" after the last epoch, INVALID_ARGUMENT
  /// for a bad position), served from the prefetch buffer when `position` is
  /// the `next` of the batch the previous call returned, else after a re-seek.
  ///   DEADLINE_EXCEEDED  no batch within `timeout` on options.clock (the
  ///                      message names the position); a later call for the
  ///                      same position picks up the batch when it arrives
  ///   UNAVAILABLE        the producer actor stopped (its reason included)
  /// Called by one thread at a time.
  StatusOr<Batch> Next(const DatasetPosition& position, absl::Duration timeout);

  struct Stats {
    int64_t batches = 0;  // batches Next() returned
    int64_t waits = 0;    // Next() calls that found their batch not yet decoded
    int64_t seeks = 0;    // Next() calls that (re)started the producer, the first one included
  };
  Stats stats() const;

  struct Impl;  // the producer actor's side

 private:
  explicit InputPipeline(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace foreman::data
