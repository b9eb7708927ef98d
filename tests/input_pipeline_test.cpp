// Tests for InputPipeline (include/foreman/input_pipeline.hpp): Next() is
// exactly Dataset::GetBatch, prefetched by the producer actor; re-seeks,
// the end of the data, timeouts on the pipeline's Clock, and shutdown.
#include <doctest/doctest.h>

#include <caf/all.hpp>

#include <chrono>
#include <condition_variable>
#include <future>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "foreman/clock.hpp"
#include "foreman/dataset.hpp"
#include "foreman/input_pipeline.hpp"
#include "foreman/mutex.hpp"
#include "support/test_util.hpp"

namespace foreman::data {
namespace {

using foreman::testing::Background;
using foreman::testing::kRealTimeout;

std::string Msg(const Status& s) { return std::string(s.message()); }

/// `n` images of 4x4; image i's pixels depend on i, label i % 10.
std::shared_ptr<const Dataset> MakeDataset(int64_t n, DatasetOptions o, int64_t rows = 4, int64_t cols = 4) {
  LabeledImages d;
  d.images = Tensor(DataType::kUInt8, TensorShape({n, rows, cols}));
  d.labels = Tensor(DataType::kUInt8, TensorShape({n}));
  for (int64_t i = 0; i < n * rows * cols; ++i) d.images.data<uint8_t>()[i] = static_cast<uint8_t>(i * 13 % 251);
  for (int64_t i = 0; i < n; ++i) d.labels.data<uint8_t>()[i] = static_cast<uint8_t>(i % 10);
  auto ds = Dataset::Create(std::move(d), o);
  REQUIRE_MESSAGE(ds.ok(), ds.status().ToString());
  return *ds;
}

DatasetOptions Options(int64_t batch_size, int64_t epochs = 0, uint64_t seed = 1) {
  DatasetOptions o;
  o.batch_size = batch_size;
  o.epochs = epochs;
  o.seed = seed;
  return o;
}

std::unique_ptr<InputPipeline> MakePipeline(std::shared_ptr<const Dataset> ds, InputPipelineOptions o = {}) {
  auto p = InputPipeline::Create(std::move(ds), std::move(o));
  REQUIRE_MESSAGE(p.ok(), p.status().ToString());
  return *std::move(p);
}

void CheckSameAsGetBatch(const Dataset& ds, const StatusOr<Batch>& got, const DatasetPosition& at) {
  StatusOr<Batch> want = ds.GetBatch(at);
  REQUIRE_MESSAGE(got.status() == want.status(), "at ", at.ToString(), ": ", got.status().ToString(), " vs ",
                  want.status().ToString());
  if (!want.ok()) return;
  CHECK(got->features.Equals(want->features));
  CHECK(got->labels.Equals(want->labels));
  CHECK(got->position == want->position);
  CHECK(got->next == want->next);
}

/// The producer's before_batch hook: records positions, and holds the
/// producer while closed (bounded, so a failed test cannot hang).
class ProducerGate {
 public:
  explicit ProducerGate(bool open = true) : open_(open) {}
  std::function<void(const DatasetPosition&)> Hook() {
    return [this](const DatasetPosition& p) {
      MutexLock l(mu_);
      seen_.push_back(p);
      cv_.notify_all();
      cv_.wait_for(l, std::chrono::seconds(20), [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return open_; });
    };
  }
  void Open() {
    {
      MutexLock l(mu_);
      open_ = true;
    }
    cv_.notify_all();
  }
  /// Waits (real time, bounded) until `n` batches were started.
  bool WaitSeen(size_t n) {
    MutexLock l(mu_);
    return cv_.wait_for(l, absl::ToChronoMilliseconds(kRealTimeout),
                        [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return seen_.size() >= n; });
  }
  std::vector<DatasetPosition> seen() {
    MutexLock l(mu_);
    return seen_;
  }

 private:
  Mutex mu_;
  std::condition_variable_any cv_;
  bool open_ ABSL_GUARDED_BY(mu_);
  std::vector<DatasetPosition> seen_ ABSL_GUARDED_BY(mu_);
};

TEST_CASE("InputPipeline::Create rejects prefetch_batches < 1 and a null dataset") {
  InputPipelineOptions o;
  o.prefetch_batches = 0;
  auto p = InputPipeline::Create(MakeDataset(4, Options(2)), o);
  REQUIRE(absl::IsInvalidArgument(p.status()));
  CHECK(absl::StrContains(Msg(p.status()), "prefetch_batches must be >= 1, got 0"));
  CHECK(absl::IsInvalidArgument(InputPipeline::Create(nullptr, {}).status()));
}

TEST_CASE("Next returns exactly GetBatch's batches, one seek for a sequential run") {
  auto ds = MakeDataset(37, Options(5));
  InputPipelineOptions o;
  o.prefetch_batches = 3;
  auto pipeline = MakePipeline(ds, o);
  DatasetPosition p;
  for (int i = 0; i < 30; ++i) {  // about four epochs
    auto b = pipeline->Next(p, kRealTimeout);
    CheckSameAsGetBatch(*ds, b, p);
    p = b->next;
  }
  CHECK(p.epoch == 3);
  const InputPipeline::Stats s = pipeline->stats();
  CHECK(s.batches == 30);
  CHECK(s.seeks == 1);
  CHECK(s.waits <= 30);
}

TEST_CASE("the producer decodes prefetch_batches ahead, so a sequential Next does not wait") {
  auto ds = MakeDataset(40, Options(4));
  ProducerGate gate;
  InputPipelineOptions o;
  o.prefetch_batches = 3;
  o.before_batch = gate.Hook();
  auto pipeline = MakePipeline(ds, o);
  CHECK(gate.seen().empty());  // nothing before the first Next
  auto first = pipeline->Next({0, 0}, kRealTimeout);
  REQUIRE(first.ok());
  // Three credits from the seek, one more for the batch taken.
  REQUIRE(gate.WaitSeen(4));
  const std::vector<DatasetPosition> seen = gate.seen();
  CHECK(seen == std::vector<DatasetPosition>{{0, 0}, {0, 4}, {0, 8}, {0, 12}});
  // {0, 12} has started, so {0, 4} and {0, 8} are decoded.
  const int64_t waits = pipeline->stats().waits;
  for (int64_t index = 4; index <= 8; index += 4) {
    auto b = pipeline->Next({0, index}, kRealTimeout);
    CheckSameAsGetBatch(*ds, b, {0, index});
  }
  CHECK(pipeline->stats().waits == waits);  // both were ready
  CHECK(pipeline->stats().seeks == 1);
}

TEST_CASE("Next at another position (a checkpoint restore) drops the buffer and re-seeks") {
  auto ds = MakeDataset(30, Options(4, 0, 9));
  auto pipeline = MakePipeline(ds);
  DatasetPosition p;
  std::vector<DatasetPosition> positions;
  for (int i = 0; i < 12; ++i) {
    positions.push_back(p);
    auto b = pipeline->Next(p, kRealTimeout);
    REQUIRE(b.ok());
    p = b->next;
  }
  // Back to an earlier position, then on from there.
  p = positions[3];
  for (int i = 0; i < 6; ++i) {
    auto b = pipeline->Next(p, kRealTimeout);
    CheckSameAsGetBatch(*ds, b, p);
    CHECK(b->position == positions[3 + static_cast<size_t>(i)]);
    p = b->next;
  }
  CHECK(pipeline->stats().seeks == 2);
  // Forward, to a position that is not a batch boundary.
  auto odd = pipeline->Next({5, 3}, kRealTimeout);
  CheckSameAsGetBatch(*ds, odd, {5, 3});
  CheckSameAsGetBatch(*ds, pipeline->Next(odd->next, kRealTimeout), odd->next);
  CHECK(pipeline->stats().seeks == 3);
  CHECK(pipeline->stats().batches == 20);
}

TEST_CASE("Next gives GetBatch's errors: OUT_OF_RANGE at the end (again when asked again), INVALID_ARGUMENT") {
  auto ds = MakeDataset(10, Options(4, 2));
  auto pipeline = MakePipeline(ds);
  DatasetPosition p;
  int batches = 0;
  StatusOr<Batch> b = pipeline->Next(p, kRealTimeout);
  while (b.ok()) {
    ++batches;
    p = b->next;
    b = pipeline->Next(p, kRealTimeout);
  }
  CHECK(batches == 6);
  CHECK(p == DatasetPosition{2, 0});
  REQUIRE(absl::IsOutOfRange(b.status()));
  CHECK(Msg(b.status()) == "End of sequence");
  CheckSameAsGetBatch(*ds, pipeline->Next(p, kRealTimeout), p);
  CHECK(pipeline->stats().seeks == 1);

  CheckSameAsGetBatch(*ds, pipeline->Next({0, 10}, kRealTimeout), {0, 10});
  CheckSameAsGetBatch(*ds, pipeline->Next({-1, 0}, kRealTimeout), {-1, 0});
  // And a valid position works again afterwards.
  CheckSameAsGetBatch(*ds, pipeline->Next({1, 8}, kRealTimeout), {1, 8});
}

TEST_CASE("Next is DEADLINE_EXCEEDED after `timeout` on the pipeline's clock; the batch comes later") {
  auto ds = MakeDataset(12, Options(4));
  ManualClock clock;
  ProducerGate gate(/*open=*/false);
  InputPipelineOptions o;
  o.clock = &clock;
  o.before_batch = gate.Hook();
  auto pipeline = MakePipeline(ds, o);
  StatusOr<Batch> result = absl::UnknownError("not run");
  {
    Background next([&] { result = pipeline->Next({0, 4}, absl::Seconds(5)); }, &clock);
    REQUIRE(clock.BlockUntilWaiters(1, kRealTimeout));
    clock.Advance(absl::Seconds(4));
    CHECK_FALSE(next.WaitDone(absl::Milliseconds(1)));
    CHECK(clock.BlockUntilWaiters(1, kRealTimeout));
    clock.Advance(absl::Seconds(1));
    REQUIRE(next.WaitDone());
  }
  REQUIRE(absl::IsDeadlineExceeded(result.status()));
  CHECK(absl::StrContains(Msg(result.status()), "epoch 0, index 4"));
  CHECK(pipeline->stats().waits == 1);
  gate.Open();
  // The same position again: the batch the producer was decoding, no new seek.
  CheckSameAsGetBatch(*ds, pipeline->Next({0, 4}, kRealTimeout), {0, 4});
  CHECK(pipeline->stats().seeks == 1);
}

TEST_CASE("Next waits for the batch being decoded (stats.waits)") {
  auto ds = MakeDataset(12, Options(4));
  ManualClock clock;
  ProducerGate gate(/*open=*/false);
  InputPipelineOptions o;
  o.clock = &clock;
  o.before_batch = gate.Hook();
  auto pipeline = MakePipeline(ds, o);
  StatusOr<Batch> result = absl::UnknownError("not run");
  {
    Background next([&] { result = pipeline->Next({0, 0}, absl::Seconds(5)); }, &clock);
    REQUIRE(clock.BlockUntilWaiters(1, kRealTimeout));
    gate.Open();
    REQUIRE(next.WaitDone());
  }
  CheckSameAsGetBatch(*ds, result, {0, 0});
  CHECK(pipeline->stats().waits == 1);
}

TEST_CASE("destroying the pipeline while the producer decodes stops it (bounded)") {
  auto ds = MakeDataset(4096, Options(512), 28, 28);
  InputPipelineOptions o;
  o.prefetch_batches = 16;
  auto pipeline = MakePipeline(ds, o);
  REQUIRE(pipeline->Next({0, 0}, kRealTimeout).ok());  // 16 more on their way
  Background destroy([&] { pipeline.reset(); });
  CHECK(destroy.WaitDone());
}

TEST_CASE("a pipeline created on one thread is destroyed on another (owned actor system)") {
  auto ds = MakeDataset(20, Options(4));
  auto pipeline = MakePipeline(ds);
  REQUIRE(pipeline->Next({0, 0}, kRealTimeout).ok());
  Background destroy([&] { pipeline.reset(); });  // ~actor_system there
  CHECK(destroy.WaitDone());
}

TEST_CASE("a pipeline in the caller's actor system leaves no actor behind") {
  caf::actor_system_config cfg;
  cfg.set("scheduler.max-threads", size_t{2});
  auto sys = std::make_unique<caf::actor_system>(cfg);
  auto ds = MakeDataset(25, Options(4, 1));
  {
    InputPipelineOptions o;
    o.actor_system = sys.get();
    auto pipeline = MakePipeline(ds, o);
    DatasetPosition p;
    StatusOr<Batch> b = pipeline->Next(p, kRealTimeout);
    for (int i = 0; b.ok() && i < 100; ++i) {
      CheckSameAsGetBatch(*ds, b, p);
      p = b->next;
      b = pipeline->Next(p, kRealTimeout);
    }
    CHECK(absl::IsOutOfRange(b.status()));
    CHECK(pipeline->stats().batches == 7);
  }
  const absl::Time deadline = absl::Now() + kRealTimeout;
  while (sys->registry().running() != 0 && absl::Now() < deadline) std::this_thread::yield();
  CHECK(sys->registry().running() == 0);
  // On the thread that built it (CAF 0.17 keeps a reference to the system in
  // that thread's storage); a leaked handle would hang here.
  sys.reset();
}

}  // namespace
}  // namespace foreman::data
