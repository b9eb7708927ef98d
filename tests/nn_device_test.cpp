// The MLP on a device without host memory (nn.hpp: DeviceExamples, the
// TrainStep by indices, Evaluate on DeviceExamples, the device-resident
// variables), checked on FakeDevice (tests/support/fake_device.hpp) against
// the CPU device it wraps: CpuDevice(1 thread, baseline kernels), whatever
// FOREMAN_MAX_ISA says. Every comparison is bitwise.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "compute/cpu_device.hpp"
#include "foreman/dataset.hpp"
#include "foreman/graph.hpp"
#include "foreman/nn.hpp"
#include "support/fake_device.hpp"

namespace foreman::nn {
namespace {

using testing::FakeDevice;

#define REQUIRE_OK(expr)                          \
  do {                                            \
    const ::foreman::Status _s = (expr);          \
    REQUIRE_MESSAGE(_s.ok(), _s.ToString());      \
  } while (0)

template <class T>
T Value(StatusOr<T> v) {
  REQUIRE_MESSAGE(v.ok(), v.status().ToString());
  return *std::move(v);
}

std::unique_ptr<VariableStore> NewStore(const MlpSpec& spec, const OptimizerOptions& opt, uint64_t seed) {
  Graph graph;
  REQUIRE_OK(AddMlpVariables(graph, spec, opt, seed));
  auto vars = std::make_unique<VariableStore>();
  for (const VariableDef& def : graph.variables()) {
    REQUIRE_OK(vars->Create(def.name, Value(def.initializer()), def.trainable));
  }
  return vars;
}

/// N images of 4x4 pixels with labels in [0, classes): pseudo-random, fixed.
data::LabeledImages MakeImages(int64_t n, int classes, uint32_t seed) {
  data::LabeledImages d;
  d.images = Tensor(DataType::kUInt8, TensorShape{n, 4, 4});
  d.labels = Tensor(DataType::kUInt8, TensorShape{n});
  uint32_t x = seed * 2654435761u + 1;
  auto next = [&x] {
    x = x * 1664525u + 1013904223u;
    return x >> 24;
  };
  auto* img = reinterpret_cast<uint8_t*>(d.images.raw_data());
  auto* lab = reinterpret_cast<uint8_t*>(d.labels.raw_data());
  for (int64_t i = 0; i < n; ++i) {
    lab[i] = static_cast<uint8_t>(next() % static_cast<uint32_t>(classes));
    // Pixels that depend on the label a little, so that training moves.
    for (int p = 0; p < 16; ++p) img[i * 16 + p] = static_cast<uint8_t>((next() + (p % 3 == lab[i]) * 128) & 0xff);
  }
  return d;
}

void CheckSameBits(const VariableStore& expected, const VariableStore& actual) {
  for (const std::string& name : expected.Names()) {
    CAPTURE(name);
    const Tensor* e = Value(expected.Get(name));
    const Tensor* a = Value(actual.Get(name));
    REQUIRE(e->TotalBytes() == a->TotalBytes());
    CHECK(std::memcmp(e->raw_data(), a->raw_data(), e->TotalBytes()) == 0);
  }
}

bool SameBits(float a, float b) { return std::memcmp(&a, &b, sizeof(float)) == 0; }

constexpr int kClasses = 3;
const MlpSpec kSpec{16, {8, 6}, kClasses};

OptimizerOptions Optimizer(OptimizerKind kind, bool nesterov = false) {
  OptimizerOptions o;
  o.kind = kind;
  o.learning_rate = kind == OptimizerKind::kAdam ? 0.01f : 0.1f;
  o.use_nesterov = nesterov;
  return o;
}

/// Two epochs of 100 examples in batches of 32 (the last of each epoch holds
/// 4), with a learning rate that changes every step.
struct Schedule {
  static constexpr int64_t kExamples = 100;
  static constexpr int64_t kBatch = 32;
  std::shared_ptr<const data::Dataset> dataset;
  data::LabeledImages images = MakeImages(kExamples, kClasses, 7);
  Schedule() {
    data::DatasetOptions o;
    o.batch_size = kBatch;
    o.seed = 11;
    dataset = Value(data::Dataset::Create(images, o));
  }
  float Rate(const OptimizerOptions& opt, int step) const {
    return opt.learning_rate * std::pow(0.9f, static_cast<float>(step));
  }
};

struct StepLog {
  std::vector<StepResult> results;
};

void CheckSameResults(const StepLog& expected, const StepLog& actual) {
  REQUIRE(expected.results.size() == actual.results.size());
  for (std::size_t i = 0; i < expected.results.size(); ++i) {
    CAPTURE(i);
    CHECK(SameBits(expected.results[i].loss, actual.results[i].loss));
    CHECK(SameBits(expected.results[i].accuracy, actual.results[i].accuracy));
  }
}

/// Runs the schedule: on Tensors from the dataset when `examples` is null,
/// else by indices on `examples`.
StepLog Train(const Schedule& sched, const OptimizerOptions& opt, VariableStore& vars, compute::Device& device,
              const DeviceExamples* examples, Mlp* reuse = nullptr) {
  std::unique_ptr<Mlp> owned;
  Mlp* mlp = reuse;
  if (mlp == nullptr) {
    owned = Value(Mlp::Create(kSpec, opt));
    mlp = owned.get();
  }
  StepLog log;
  data::DatasetPosition pos;
  int step = 0;
  while (pos.epoch < 2) {
    REQUIRE_OK(mlp->set_learning_rate(sched.Rate(opt, step)));
    data::Batch batch = Value(sched.dataset->GetBatch(pos));
    const int64_t rows = batch.labels.shape().dim(0);
    if (examples == nullptr) {
      log.results.push_back(Value(mlp->TrainStep(vars, batch.features, batch.labels, device)));
    } else {
      const std::vector<int32_t>& order = *sched.dataset->Order(pos.epoch);
      log.results.push_back(Value(mlp->TrainStep(vars, *examples, order.data() + pos.index, rows, device)));
    }
    pos = batch.next;
    ++step;
  }
  return log;
}

struct Case {
  const char* name;
  OptimizerKind kind;
  bool nesterov;
};

TEST_CASE("TrainStep by indices on a device without host memory equals TrainStep on the gathered Tensors on the CPU") {
  const Case cases[] = {{"sgd", OptimizerKind::kSgd, false},
                        {"momentum", OptimizerKind::kMomentum, false},
                        {"nesterov", OptimizerKind::kMomentum, true},
                        {"adam", OptimizerKind::kAdam, false}};
  Schedule sched;
  for (const Case& c : cases) {
    CAPTURE(c.name);
    const OptimizerOptions opt = Optimizer(c.kind, c.nesterov);

    // The reference: the CPU device on the Tensors data::Dataset gathers.
    compute::CpuDevice cpu(1, compute::CpuIsa::kBaseline);
    auto ref_vars = NewStore(kSpec, opt, 3);
    const StepLog ref = Train(sched, opt, *ref_vars, cpu, nullptr);
    REQUIRE(ref.results.size() == 8);  // 4 batches per epoch, the last of 4 rows
    CHECK(ref.results.back().loss != ref.results.front().loss);

    SUBCASE("captured on the fake device") {
      FakeDevice fake;
      auto vars = NewStore(kSpec, opt, 3);
      {
        auto examples = Value(DeviceExamples::Upload(sched.images.images, sched.images.labels, fake));
        auto mlp = Value(Mlp::Create(kSpec, opt));
        const StepLog log = Train(sched, opt, *vars, fake, examples.get(), mlp.get());
        CheckSameResults(ref, log);
        // Captured once per batch size (32, then 4), replayed every step.
        CHECK(fake.captures() == 2);
        CHECK(fake.replays() == 8);
        CheckSameBits(*ref_vars, *vars);  // copies the device values back
        REQUIRE_OK(vars->ReleaseDevice(fake));
      }
      // The Mlp's workspace, the examples and the variables' copies are freed.
      CHECK(fake.live_blocks() == 0);
      CHECK(fake.bad_deallocations() == 0);
    }
    SUBCASE("eager on a fake device that cannot capture") {
      FakeDevice fake(FakeDevice::Options{"/fake:1", 0, /*capture=*/false});
      auto vars = NewStore(kSpec, opt, 3);
      auto examples = Value(DeviceExamples::Upload(sched.images.images, sched.images.labels, fake));
      CheckSameResults(ref, Train(sched, opt, *vars, fake, examples.get()));
      CHECK(fake.replays() == 0);
      CheckSameBits(*ref_vars, *vars);
    }
    SUBCASE("on Tensors on the fake device") {
      FakeDevice fake;
      auto vars = NewStore(kSpec, opt, 3);
      CheckSameResults(ref, Train(sched, opt, *vars, fake, nullptr));
      CheckSameBits(*ref_vars, *vars);
    }
    SUBCASE("by indices on the CPU device") {
      compute::CpuDevice cpu2(1, compute::CpuIsa::kBaseline);
      auto vars = NewStore(kSpec, opt, 3);
      auto examples = Value(DeviceExamples::Upload(sched.images.images, sched.images.labels, cpu2));
      CheckSameResults(ref, Train(sched, opt, *vars, cpu2, examples.get()));
      CheckSameBits(*ref_vars, *vars);
    }
  }
}

TEST_CASE("an Mlp outlives its device after ReleaseDevice and trains on the next one") {
  Schedule sched;
  const OptimizerOptions opt = Optimizer(OptimizerKind::kMomentum);
  const std::vector<int32_t>& order = *sched.dataset->Order(0);
  compute::CpuDevice cpu(1, compute::CpuIsa::kBaseline);
  auto ref_vars = NewStore(kSpec, opt, 3);
  auto ref_mlp = Value(Mlp::Create(kSpec, opt));
  auto vars = NewStore(kSpec, opt, 3);
  auto mlp = Value(Mlp::Create(kSpec, opt));
  for (int session = 0; session < 2; ++session) {
    CAPTURE(session);
    auto fake = std::make_unique<FakeDevice>();
    auto examples = Value(DeviceExamples::Upload(sched.images.images, sched.images.labels, *fake));
    auto ref_examples = Value(DeviceExamples::Upload(sched.images.images, sched.images.labels, cpu));
    for (int i = 0; i < 2; ++i) {
      const int32_t* idx = order.data() + 32 * (2 * session + i);
      const int64_t rows = 2 * session + i == 3 ? 4 : 32;
      const StepResult r = Value(mlp->TrainStep(*vars, *examples, idx, rows, *fake));
      const StepResult e = Value(ref_mlp->TrainStep(*ref_vars, *ref_examples, idx, rows, cpu));
      CHECK(SameBits(r.loss, e.loss));
    }
    CHECK(fake->captures() == (session == 0 ? 1 : 2));
    mlp->ReleaseDevice(*fake);  // what a session's end does before its device goes
    REQUIRE_OK(vars->ReleaseDevice(*fake));
    examples.reset();
    CHECK(fake->live_blocks() == 0);
    CHECK(fake->bad_deallocations() == 0);
  }
  CheckSameBits(*ref_vars, *vars);
}

TEST_CASE("an Mlp and DeviceExamples outlive a destroyed device without ReleaseDevice; a new device at any address is new") {
  Schedule sched;
  const OptimizerOptions opt = Optimizer(OptimizerKind::kAdam);
  const std::vector<int32_t>& order = *sched.dataset->Order(0);
  compute::CpuDevice cpu(1, compute::CpuIsa::kBaseline);
  auto ref_vars = NewStore(kSpec, opt, 3);
  auto ref_mlp = Value(Mlp::Create(kSpec, opt));
  auto ref_examples = Value(DeviceExamples::Upload(sched.images.images, sched.images.labels, cpu));
  auto vars = NewStore(kSpec, opt, 3);
  auto mlp = Value(Mlp::Create(kSpec, opt));
  std::unique_ptr<DeviceExamples> stale;
  for (int session = 0; session < 3; ++session) {
    CAPTURE(session);
    // Each device may land where the previous one was: the Mlp must tell
    // them apart by their lifetime, not by address, and must not free into
    // a device that is gone (it freed its memory itself).
    auto fake = std::make_unique<FakeDevice>();
    auto examples = Value(DeviceExamples::Upload(sched.images.images, sched.images.labels, *fake));
    const int32_t* idx = order.data() + 32 * session;
    const StepResult r = Value(mlp->TrainStep(*vars, *examples, idx, 32, *fake));
    const StepResult e = Value(ref_mlp->TrainStep(*ref_vars, *ref_examples, idx, 32, cpu));
    CHECK(SameBits(r.loss, e.loss));
    REQUIRE_OK(vars->ReleaseDevice(*fake));  // the session's own release (Session::Close)
    stale = std::move(examples);             // outlives its device
    fake.reset();                            // no mlp->ReleaseDevice: the device just goes
    CHECK_FALSE(stale->device_alive());
  }
  CheckSameBits(*ref_vars, *vars);
  FakeDevice next;
  Status s = mlp->TrainStep(*vars, *stale, order.data(), 32, next).status();
  CHECK(s.code() == absl::StatusCode::kInvalidArgument);
  CHECK(std::string(s.message()).find("no longer exists") != std::string::npos);
  stale.reset();  // frees nothing: its device is gone
  mlp.reset();    // likewise for the workspace of the last device
  CHECK(next.live_blocks() == 0);
}

TEST_CASE("a CPU device frees what it allocated when it is destroyed; Deallocate of a foreign pointer is ignored") {
  auto cpu = std::make_unique<compute::CpuDevice>(1, compute::CpuIsa::kBaseline);
  std::weak_ptr<const void> lifetime = cpu->lifetime();
  void* kept = Value(cpu->Allocate(1 << 20));
  void* freed = Value(cpu->Allocate(64));
  cpu->Deallocate(freed);
  compute::CpuDevice other(1, compute::CpuIsa::kBaseline);
  other.Deallocate(kept);  // not other's: ignored (kept stays valid)
  static_cast<char*>(kept)[0] = 1;
  CHECK_FALSE(lifetime.expired());
  cpu.reset();  // frees `kept` (LeakSanitizer would report it otherwise)
  CHECK(lifetime.expired());
}

TEST_CASE("a device-resident step copies only its step block in and its statistics out") {
  Schedule sched;
  const OptimizerOptions opt = Optimizer(OptimizerKind::kAdam);
  FakeDevice fake;
  auto vars = NewStore(kSpec, opt, 3);
  auto examples = Value(DeviceExamples::Upload(sched.images.images, sched.images.labels, fake));
  auto mlp = Value(Mlp::Create(kSpec, opt));
  const std::vector<int32_t>& order = *sched.dataset->Order(0);
  REQUIRE(mlp->TrainStep(*vars, *examples, order.data(), 32, fake).ok());  // uploads the variables
  const int64_t in = fake.copies_to_device(), out = fake.copies_to_host(), blocks = fake.live_blocks();
  const int64_t bytes_out = fake.bytes_to_host();
  const int64_t async_in = fake.async_copies_to_device(), async_out = fake.async_copies_to_host();
  const int64_t host_tensors = fake.host_tensors();
  for (int i = 1; i <= 3; ++i) {
    REQUIRE(mlp->TrainStep(*vars, *examples, order.data() + 32 * i, i < 3 ? 32 : 4, fake).ok());
  }
  // Each step: its block of inputs copied in and its statistics out, both by
  // the step's own operations from and into page-locked memory; no other copy.
  CHECK(fake.async_copies_to_device() == async_in + 3);
  CHECK(fake.async_copies_to_host() == async_out + 3);
  CHECK(fake.copies_to_device() == in);
  CHECK(fake.copies_to_host() == out);
  CHECK(fake.bytes_to_host() == bytes_out);
  CHECK(fake.host_tensors() == host_tensors);  // its page-locked buffers are reused
  CHECK(fake.live_blocks() == blocks);         // and so is the workspace
  // A host read copies the newer device value back; the next step uploads nothing.
  const Tensor* kernel = Value(static_cast<const VariableStore&>(*vars).Get("dense/kernel"));
  CHECK(kernel->num_elements() == 16 * 8);
  CHECK(fake.copies_to_host() == out + 1);
  REQUIRE(mlp->TrainStep(*vars, *examples, order.data(), 32, fake).ok());
  CHECK(fake.copies_to_device() == in);
  // A host write (Assign) is uploaded by the next step, once.
  REQUIRE_OK(vars->Assign("dense/bias", Tensor(DataType::kFloat, TensorShape{8})));
  REQUIRE(mlp->TrainStep(*vars, *examples, order.data(), 32, fake).ok());
  CHECK(fake.copies_to_device() == in + 1);
  REQUIRE_OK(vars->ReleaseDevice(fake));
}

TEST_CASE("int64 labels and wrongly shaped variables on a device without host memory") {
  Schedule sched;
  const OptimizerOptions opt = Optimizer(OptimizerKind::kSgd);
  data::Batch batch = Value(sched.dataset->GetBatch({}));
  Tensor labels64(DataType::kInt64, batch.labels.shape());
  for (int64_t i = 0; i < labels64.num_elements(); ++i) labels64.data<int64_t>()[i] = batch.labels.data<int32_t>()[i];
  compute::CpuDevice cpu(1, compute::CpuIsa::kBaseline);
  auto ref_vars = NewStore(kSpec, opt, 3);
  const StepResult ref = Value(Value(Mlp::Create(kSpec, opt))->TrainStep(*ref_vars, batch.features, labels64, cpu));
  FakeDevice fake;
  auto vars = NewStore(kSpec, opt, 3);
  auto mlp = Value(Mlp::Create(kSpec, opt));
  const StepResult r = Value(mlp->TrainStep(*vars, batch.features, labels64, fake));
  CHECK(SameBits(r.loss, ref.loss));
  CheckSameBits(*ref_vars, *vars);

  auto bad = NewStore(kSpec, opt, 3);
  REQUIRE_OK(bad->Delete("dense_1/kernel"));
  REQUIRE_OK(bad->Create("dense_1/kernel", Tensor(DataType::kFloat, TensorShape{6, 8})));
  const int64_t ops = fake.operations(), uploads = fake.copies_to_device();
  Status s = mlp->TrainStep(*bad, batch.features, batch.labels, fake).status();
  CHECK(s.code() == absl::StatusCode::kInvalidArgument);
  CHECK(std::string(s.message()).find("dense_1/kernel") != std::string::npos);
  // Checked before anything runs: no variable allocated or uploaded, no math.
  CHECK(fake.copies_to_device() - uploads == 0);
  CHECK(fake.operations() - ops == 0);
  auto missing = NewStore(kSpec, opt, 3);
  REQUIRE_OK(missing->Delete("dense_1/bias"));
  s = mlp->TrainStep(*missing, batch.features, batch.labels, fake).status();
  CHECK(s.code() == absl::StatusCode::kNotFound);
  CHECK(std::string(s.message()).find("dense_1/bias") != std::string::npos);
  CHECK(fake.copies_to_device() - uploads == 0);
  REQUIRE_OK(vars->ReleaseDevice(fake));
  REQUIRE_OK(bad->ReleaseDevice(fake));
  REQUIRE_OK(missing->ReleaseDevice(fake));
}

TEST_CASE("Evaluate on DeviceExamples equals Evaluate on the Tensors, in chunks") {
  const OptimizerOptions opt = Optimizer(OptimizerKind::kSgd);
  data::LabeledImages test = MakeImages(Mlp::kEvalChunkRows + 300, kClasses, 9);
  data::DatasetOptions o;
  o.shuffle = false;
  auto ds = Value(data::Dataset::Create(test, o));
  data::Batch all = Value(ds->Slice(0, ds->num_examples()));

  compute::CpuDevice cpu(1, compute::CpuIsa::kBaseline);
  auto vars = NewStore(kSpec, opt, 5);
  auto mlp = Value(Mlp::Create(kSpec, opt));
  const StepResult ref = Value(mlp->Evaluate(*vars, all.features, all.labels, cpu));

  FakeDevice fake;
  auto examples = Value(DeviceExamples::Upload(test.images, test.labels, fake));
  auto fake_mlp = Value(Mlp::Create(kSpec, opt));
  for (int i = 0; i < 2; ++i) {  // the second reuses the workspace
    const StepResult r = Value(fake_mlp->Evaluate(*vars, *examples, fake));
    CHECK(SameBits(r.loss, ref.loss));
    CHECK(SameBits(r.accuracy, ref.accuracy));
  }
  const StepResult on_tensors = Value(fake_mlp->Evaluate(*vars, all.features, all.labels, fake));
  CHECK(SameBits(on_tensors.loss, ref.loss));
  CHECK(SameBits(on_tensors.accuracy, ref.accuracy));
  compute::CpuDevice cpu2(1, compute::CpuIsa::kBaseline);
  auto cpu_examples = Value(DeviceExamples::Upload(test.images, test.labels, cpu2));
  const StepResult on_cpu = Value(mlp->Evaluate(*vars, *cpu_examples, cpu2));
  CHECK(SameBits(on_cpu.loss, ref.loss));
  REQUIRE_OK(vars->ReleaseDevice(fake));
}

TEST_CASE("bad indices, examples and devices are INVALID_ARGUMENT or FAILED_PRECONDITION naming them") {
  Schedule sched;
  const OptimizerOptions opt = Optimizer(OptimizerKind::kMomentum);
  FakeDevice fake;
  auto vars = NewStore(kSpec, opt, 3);
  auto examples = Value(DeviceExamples::Upload(sched.images.images, sched.images.labels, fake));
  auto mlp = Value(Mlp::Create(kSpec, opt));
  const int64_t ops = fake.operations();
  const int32_t bad[3] = {0, 100, 1};
  Status s = mlp->TrainStep(*vars, *examples, bad, 3, fake).status();
  CHECK(s.code() == absl::StatusCode::kInvalidArgument);
  CHECK(std::string(s.message()).find("indices[1] = 100") != std::string::npos);
  const int32_t negative[1] = {-1};
  CHECK(mlp->TrainStep(*vars, *examples, negative, 1, fake).status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(mlp->TrainStep(*vars, *examples, bad, 0, fake).status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(fake.operations() == ops);  // nothing ran

  FakeDevice other(FakeDevice::Options{"/fake:9", 0, true});
  s = mlp->TrainStep(*vars, *examples, bad, 1, other).status();
  CHECK(s.code() == absl::StatusCode::kInvalidArgument);
  CHECK(std::string(s.message()).find("/fake:9") != std::string::npos);

  // Labels outside the model's classes.
  data::LabeledImages wide = MakeImages(10, 5, 1);
  auto wide_examples = Value(DeviceExamples::Upload(wide.images, wide.labels, fake));
  std::vector<int32_t> all(10);
  for (int i = 0; i < 10; ++i) all[static_cast<std::size_t>(i)] = i;
  s = mlp->TrainStep(*vars, *wide_examples, all.data(), 10, fake).status();
  CHECK(s.code() == absl::StatusCode::kInvalidArgument);
  CHECK(std::string(s.message()).find("outside the valid range of [0, 3)") != std::string::npos);

  // The split step of a cluster runs on host memory only.
  data::Batch batch = Value(sched.dataset->GetBatch({}));
  Gradients grads;
  s = mlp->ComputeGradients(*vars, batch.features, batch.labels, fake, &grads).status();
  CHECK(s.code() == absl::StatusCode::kFailedPrecondition);
  CHECK(std::string(s.message()).find("/fake:0") != std::string::npos);
  CHECK(ApplyGradients(opt, *vars, grads, fake).code() == absl::StatusCode::kFailedPrecondition);

  // Upload's own checks, and the device's memory limit.
  CHECK(DeviceExamples::Upload(sched.images.labels, sched.images.labels, fake).status().code() ==
        absl::StatusCode::kInvalidArgument);
  CHECK(DeviceExamples::Upload(sched.images.images, wide.labels, fake).status().code() ==
        absl::StatusCode::kInvalidArgument);
  FakeDevice small(FakeDevice::Options{"/fake:5", 1000, true});
  s = DeviceExamples::Upload(sched.images.images, sched.images.labels, small).status();
  CHECK(s.code() == absl::StatusCode::kResourceExhausted);
  CHECK(std::string(s.message()).find("/fake:5") != std::string::npos);
  CHECK(std::string(s.message()).find("1600 bytes") != std::string::npos);
  CHECK(small.live_blocks() == 0);
  REQUIRE_OK(vars->ReleaseDevice(fake));

  // The step's workspace beyond the limit (the examples and variables take
  // 3388 of its 3500 bytes): the device's RESOURCE_EXHAUSTED.
  FakeDevice tight(FakeDevice::Options{"/fake:6", 3500, true});
  auto tight_examples = Value(DeviceExamples::Upload(sched.images.images, sched.images.labels, tight));
  s = mlp->TrainStep(*vars, *tight_examples, bad, 1, tight).status();
  CHECK(s.code() == absl::StatusCode::kResourceExhausted);
  CHECK(std::string(s.message()).find("/fake:6") != std::string::npos);
  CHECK(std::string(s.message()).find("512 bytes") != std::string::npos);  // dense/kernel's gradient
  REQUIRE_OK(vars->ReleaseDevice(tight));
  mlp->ReleaseDevice(tight);
}

TEST_CASE("a device error in the middle of a step is returned; later host reads work or report it") {
  Schedule sched;
  const OptimizerOptions opt = Optimizer(OptimizerKind::kAdam);
  const std::vector<int32_t>& order = *sched.dataset->Order(0);
  for (bool sticky : {false, true}) {
    CAPTURE(sticky);
    FakeDevice fake;
    auto vars = NewStore(kSpec, opt, 3);
    auto examples = Value(DeviceExamples::Upload(sched.images.images, sched.images.labels, fake));
    auto mlp = Value(Mlp::Create(kSpec, opt));
    REQUIRE(mlp->TrainStep(*vars, *examples, order.data(), 32, fake).ok());
    fake.InjectFailure(5, absl::InternalError("/fake:0: kernel Gemm failed"), sticky);  // inside the replay
    Status s = mlp->TrainStep(*vars, *examples, order.data() + 32, 32, fake).status();
    CHECK(s.code() == absl::StatusCode::kInternal);
    CHECK(std::string(s.message()).find("kernel Gemm failed") != std::string::npos);
    CHECK(fake.replays() == 2);  // it failed inside the replay
    StatusOr<const Tensor*> kernel = static_cast<const VariableStore&>(*vars).Get("dense/kernel");
    if (!sticky) {
      CHECK(kernel.ok());
      CHECK(mlp->TrainStep(*vars, *examples, order.data() + 64, 32, fake).ok());
    } else {
      CHECK(kernel.status().code() == absl::StatusCode::kInternal);
      CHECK(std::string(kernel.status().message()).find("dense/kernel") != std::string::npos);
      CHECK(vars->ReleaseDevice(fake).code() == absl::StatusCode::kInternal);
      fake.ClearFailure();
    }
    REQUIRE_OK(vars->ReleaseDevice(fake));
  }
}

}  // namespace
}  // namespace foreman::nn
