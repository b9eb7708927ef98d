// input_pipeline actor: the producer behind foreman::data::InputPipeline
// (include/foreman/input_pipeline.hpp), spawned detached into the process's
// actor system (or the caller's). It decodes batches ahead of the training
// loop into a PrefetchBuffer, which the consumer thread reads.
//
// Protocol (fire-and-forget, from the consumer thread to the producer):
//   (seek_atom, uint64 generation, int64 epoch, int64 index, int64 count)
//       start generation `generation` at {epoch, index} with `count` credits
//   (credit_atom, uint64 generation, int64 count)
//       `count` more batches of that generation (ignored for an old one)
//   (produce_atom)  the producer to itself: decode one batch
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

#include "foreman/mutex.hpp"
#include "foreman/dataset.hpp"
#include "foreman/status.hpp"

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
  bool producer_gone ABSL_GUARDED_BY(mu) = false;
  Status producer_status ABSL_GUARDED_BY(mu);  // why it is gone

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
  void ProducerGone(Status why) {
    {
      MutexLock l(mu);
      producer_gone = true;
      producer_status = std::move(why);
    }
    cv.notify_all();
  }
};

struct ProducerArgs {
  std::shared_ptr<const Dataset> dataset;
  std::shared_ptr<PrefetchBuffer> buffer;
  std::function<void(const DatasetPosition&)> before_batch;
};

}  // namespace foreman::data::internal_pipeline
