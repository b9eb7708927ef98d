// InputPipeline (include/foreman/input_pipeline.hpp): the producer actor
// (protocol: input_pipeline.hpp) and the consumer's side.
#include "foreman/mutex.hpp"
#include "foreman/input_pipeline.hpp"

#include <deque>
#include <thread>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "actor_system.hpp"
#include "input_pipeline.hpp"
#include "atoms.hpp"
#include "child_link.hpp"
#include "fault/injected_fault.hpp"
#include "platform/log.hpp"

namespace foreman::data {

namespace {

using internal::ChildLink;
using internal::credit_atom;
using internal::kill_atom;
using internal::MessageFaults;
using internal::produce_atom;
using internal::seek_atom;
using internal_pipeline::PrefetchBuffer;
using internal_pipeline::ProducerArgs;

// How long the destructor waits for the producer to finish its batch.
constexpr absl::Duration kStopTimeout = absl::Seconds(30);
constexpr char kProducerName[] = "input_pipeline";

struct producer_state {
  ProducerArgs args;
  uint64_t generation = 0;
  DatasetPosition next;     // of the next batch to decode
  int64_t credits = 0;      // batches still wanted in this generation
  bool ended = false;       // GetBatch failed: nothing more in this generation
  bool scheduled = false;   // a produce_atom is in the mailbox
  static const char* name;
};
const char* producer_state::name = "input_pipeline";

void Schedule(caf::stateful_actor<producer_state>* self) {
  auto& st = self->state;
  if (st.scheduled || st.ended || st.credits <= 0) return;
  st.scheduled = true;
  self->send(self, produce_atom::value);
}

caf::behavior producer(caf::stateful_actor<producer_state>* self, ProducerArgs args) {
  self->state.args = std::move(args);
  internal::MakeQuiet(self, kProducerName);
  return {
      [=](seek_atom, uint64_t generation, int64_t epoch, int64_t index, int64_t count) {
        auto& st = self->state;
        st.generation = generation;
        st.next = DatasetPosition{epoch, index};
        st.credits = count;
        st.ended = false;
        Schedule(self);
      },
      [=](credit_atom, uint64_t generation, int64_t count) {
        auto& st = self->state;
        if (generation != st.generation) return;
        st.credits += count;
        Schedule(self);
      },
      [=](produce_atom) {
        auto& st = self->state;
        st.scheduled = false;
        if (st.ended || st.credits <= 0) return;
        // A seek for a newer generation is already on its way: skip the work.
        if (st.args.buffer->current_generation() != st.generation) return;
        const DatasetPosition position = st.next;
        if (st.args.faults != nullptr) {
          if (std::optional<MessageFaults::Action> a = st.args.faults->Next()) {
            if (a->drop) {
              // Lost: nothing is pushed, and the generation stalls (what
              // follows would not be contiguous) until the consumer, whose
              // Next() timed out (naming the fault), re-seeks.
              st.args.buffer->Dropped(st.generation, position, a->fault_id);
              FOREMAN_LOG_WARN("input_pipeline: the batch at {} dropped (injected actor fault {})",
                               position.ToString(), a->fault_id);
              --st.credits;
              st.ended = true;
              return;
            }
            if (st.args.clock != nullptr) st.args.clock->SleepFor(a->delay);
          }
        }
        bool threw = true;
        StatusOr<Batch> batch = InvokeUserCode("input pipeline producer", [&]() -> StatusOr<Batch> {
          if (st.args.before_batch) st.args.before_batch(position);
          StatusOr<Batch> b = st.args.dataset->GetBatch(position);
          threw = false;
          return b;
        });
        if (threw && st.args.supervised) {
          // The producer dies with it; the session's RestartPolicy decides.
          self->quit(internal::StatusToError(batch.status()));
          return;
        }
        --st.credits;
        if (batch.ok()) {
          st.next = batch->next;
        } else {
          st.ended = true;
        }
        st.args.buffer->Push(st.generation, position, std::move(batch));
        Schedule(self);
      },
      [=](kill_atom, const caf::error& reason) { self->quit(reason); },
  };
}

}  // namespace

struct InputPipeline::Impl {
  std::shared_ptr<const Dataset> dataset;
  InputPipelineOptions options;
  std::shared_ptr<PrefetchBuffer> buffer = std::make_shared<PrefetchBuffer>();
  // Declared before the link: released after it.
  internal::ActorSystemRef process_system;
  std::shared_ptr<ChildLink> producer = std::make_shared<ChildLink>(kProducerName);
  // A session's service (MonitoredSession::NewInputPipeline): the link is the
  // runtime's, the supervisor restarts the producer behind it.
  bool supervised = false;

  // The consumer's side, guarded by buffer->mu (stats() reads them from any
  // thread; Next() runs on one thread at a time).
  bool seeked = false;
  DatasetPosition expected;  // position of the batch at the buffer's head
  int64_t seen_incarnation = 0;  // the buffer's incarnation at the last seek
  bool reseek = false;  // supervised: the last Next() timed out, re-request
  Stats stats;

  static std::unique_ptr<InputPipeline> MakeSupervised(std::shared_ptr<const Dataset> dataset,
                                                       InputPipelineOptions options,
                                                       std::shared_ptr<PrefetchBuffer> buffer,
                                                       std::shared_ptr<ChildLink> link) {
    auto impl = std::make_unique<Impl>();
    impl->dataset = std::move(dataset);
    impl->options = std::move(options);
    impl->options.before_batch = nullptr;
    impl->buffer = std::move(buffer);
    impl->producer = std::move(link);
    impl->supervised = true;
    return std::unique_ptr<InputPipeline>(new InputPipeline(std::move(impl)));
  }

  ~Impl() {
    if (supervised) {
      // The supervisor forgets the producer's exit (no failure, no restart).
      producer->Retire();
      buffer->Destroyed(absl::FailedPreconditionError("input pipeline: the pipeline is destroyed"));
      if (producer->SendExit(caf::exit_reason::user_shutdown) && !producer->WaitExited(kStopTimeout)) {
        FOREMAN_LOG_ERROR("The input pipeline's producer is still decoding after {}; the session's close() "
                          "reports it", absl::FormatDuration(kStopTimeout));
      }
      return;  // The runtime detaches the link at close() (it owns the actor system).
    }
    // SendExit is false when the actor is gone or was never started.
    if (producer->SendExit(caf::exit_reason::user_shutdown) && !producer->WaitExited(kStopTimeout)) {
      FOREMAN_LOG_ERROR("The input pipeline's producer is still decoding after {}",
                        absl::FormatDuration(kStopTimeout));
      if (process_system != nullptr) {
        // ~actor_system would wait for it forever: keep it.
        FOREMAN_LOG_ERROR("Keeping the actor system alive so that the process can go on");
        internal::LeakActorSystem(process_system);
      }
    }
    producer->Detach();
    process_system.reset();
  }
};

InputPipeline::InputPipeline(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

InputPipeline::~InputPipeline() = default;

StatusOr<std::unique_ptr<InputPipeline>> InputPipeline::Create(std::shared_ptr<const Dataset> dataset,
                                                               InputPipelineOptions options) {
  if (dataset == nullptr) return absl::InvalidArgumentError("InputPipeline: no dataset");
  if (options.clock == nullptr) return absl::InvalidArgumentError("InputPipeline: no clock");
  if (options.prefetch_batches < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("InputPipeline: prefetch_batches must be >= 1, got ", options.prefetch_batches));
  }
  auto impl = std::make_unique<Impl>();
  impl->dataset = dataset;
  impl->options = options;
  ProducerArgs args{std::move(dataset), impl->buffer, std::move(options.before_batch)};
  impl->options.before_batch = nullptr;
  caf::actor_system* system = impl->options.actor_system;
  if (system == nullptr) {
    // The process's one actor system, shared with the sessions' services.
    auto process_system = internal::AcquireProcessActorSystem(0);
    if (!process_system.ok()) return process_system.status();
    impl->process_system = *std::move(process_system);
    system = impl->process_system.get();
  }
  // Spawned from a thread that ends at once (actors/actor_system.hpp).
  Status status = internal::RunOnShortLivedThread([&] {
    caf::actor actor = system->spawn<caf::detached>(producer, std::move(args));
    std::weak_ptr<PrefetchBuffer> weak = impl->buffer;
    actor->attach_functor([weak](const caf::error& reason) {
      if (auto buffer = weak.lock()) {
        buffer->ProducerGone(internal::ErrorToStatus(reason, kProducerName));
      }
    });
    ChildLink::Attach(impl->producer, std::move(actor));
    return absl::OkStatus();
  });
  if (!status.ok()) return status;  // ~Impl: nothing runs, or the actor stops.
  return std::unique_ptr<InputPipeline>(new InputPipeline(std::move(impl)));
}

StatusOr<Batch> InputPipeline::Next(const DatasetPosition& position, absl::Duration timeout) {
  Impl& im = *impl_;
  PrefetchBuffer& buf = *im.buffer;
  Clock* clock = im.options.clock;
  const absl::Duration deadline = clock->MonotonicNow() + timeout;
  MutexLock lock(buf.mu);
  auto gone = [&buf]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(buf.mu) {
    // A supervised producer's status is already this pipeline's message
    // (FAILED_PRECONDITION, not a preemption code: see NewInputPipeline).
    if (absl::IsFailedPrecondition(buf.producer_status) &&
        absl::StartsWith(buf.producer_status.message(), "input pipeline: ")) {
      return buf.producer_status;
    }
    return absl::UnavailableError(
        absl::StrCat("input pipeline: the producer stopped: ", buf.producer_status.ToString()));
  };
  // A supervised producer that is down for good fails at once, buffered
  // batches or not, so the outcome does not depend on how far it had got.
  if (im.supervised && buf.producer_gone) return gone();
  // Called with `lock` held; unlocks it around the send and takes it again
  // (clang's analysis cannot follow a scoped lock into a lambda).
  auto seek = [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
    const uint64_t generation = ++buf.generation;
    buf.items.clear();
    im.seeked = true;
    im.expected = position;
    im.seen_incarnation = buf.incarnation;
    ++im.stats.seeks;
    lock.unlock();
    im.producer->Send(seek_atom::value, generation, position.epoch, position.index,
                      static_cast<int64_t>(im.options.prefetch_batches));
    lock.lock();
  };
  // The first call, a restore that moved the position, a restarted producer
  // (it knows nothing), or a retry after a timeout (a dropped batch): what
  // is buffered is for another place, or nothing is coming.
  if (!im.seeked || position != im.expected || im.reseek || buf.incarnation != im.seen_incarnation) seek();
  im.reseek = false;
  if (buf.items.empty() && !buf.producer_gone) ++im.stats.waits;
  for (;;) {
    const bool ready = clock->WaitUntil(buf.mu, buf.cv, deadline, [&buf, &im]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(buf.mu) {
      return !buf.items.empty() || buf.producer_gone || buf.incarnation != im.seen_incarnation;
    });
    if (!ready) {
      im.reseek = im.supervised;
      Status late = absl::DeadlineExceededError(absl::StrCat("input pipeline: no batch for ", position.ToString(),
                                                             " within ", absl::FormatDuration(timeout)));
      if (!buf.dropped_by.empty() && buf.dropped_generation == buf.generation && buf.dropped_at == position) {
        // The batch was lost to an injected fault: say so, and carry its
        // payload, as every injected error does (foreman train: exit 3).
        late = WithInjectedFault(absl::DeadlineExceededError(absl::StrCat(
                                     late.message(), " (dropped by injected actor fault ", buf.dropped_by, ")")),
                                 buf.dropped_by);
      }
      return late;
    }
    if (buf.producer_gone && (im.supervised || buf.items.empty())) return gone();
    if (buf.incarnation != im.seen_incarnation) {
      seek();  // restarted: the new producer starts at this position
      continue;
    }
    break;
  }
  PrefetchBuffer::Item& head = buf.items.front();
  if (head.position != position) {
    return absl::InternalError(absl::StrCat("input pipeline: the buffered batch is at ", head.position.ToString(),
                                            ", not at ", position.ToString()));
  }
  // An error stays at the head: asking again gives it again, as GetBatch would.
  if (!head.result.ok()) return head.result.status();
  Batch batch = *std::move(head.result);
  buf.items.pop_front();
  im.expected = batch.next;
  ++im.stats.batches;
  const uint64_t generation = buf.generation;
  lock.unlock();
  im.producer->Send(credit_atom::value, generation, int64_t{1});
  return batch;
}

std::unique_ptr<InputPipeline> internal_pipeline::MakeSupervisedPipeline(std::shared_ptr<const Dataset> dataset,
                                                                        InputPipelineOptions options,
                                                                        std::shared_ptr<PrefetchBuffer> buffer,
                                                                        std::shared_ptr<internal::ChildLink> link) {
  return InputPipeline::Impl::MakeSupervised(std::move(dataset), std::move(options), std::move(buffer),
                                             std::move(link));
}

caf::actor internal_pipeline::SpawnProducer(caf::local_actor* parent, ProducerArgs args) {
  return parent->spawn<caf::detached>(producer, std::move(args));
}

InputPipeline::Stats InputPipeline::stats() const {
  MutexLock l(impl_->buffer->mu);
  return impl_->stats;
}

}  // namespace foreman::data
