// Device residency on a device without host memory (tests/support/
// fake_device.hpp): VariableStore's device copies (DeviceData, copies back,
// ReleaseDevice), a Session on such a device (targets, Close / ~Session,
// fetches, the memory limit), and checkpoints (internal::SnapshotInto's
// one batched copy; round trips between a device session and a CPU one).
#include <doctest/doctest.h>

#include <cstdint>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "compute/device_factory.hpp"
#include "foreman/bundle.hpp"
#include "foreman/checkpoint.hpp"
#include "foreman/compute.hpp"
#include "foreman/graph.hpp"
#include "foreman/hooks.hpp"
#include "foreman/monitored_session.hpp"
#include "foreman/session.hpp"
#include "foreman/variable_store.hpp"
#include "runtime/services.hpp"
#include "runtime/variable_store_access.hpp"
#include "support/checkpoint_checks.hpp"
#include "support/fake_device.hpp"
#include "support/test_util.hpp"

namespace foreman {
namespace {

using testing::FakeDevice;
using testing::ReadCheckpoint;
using testing::TempDir;

std::string Message(const Status& s) { return std::string(s.message()); }

Tensor Floats(std::vector<float> values) {
  const auto n = static_cast<int64_t>(values.size());
  return Tensor::FromVector<float>(values, TensorShape{n}).value();
}

std::vector<float> Values(const Tensor& t) {
  return std::vector<float>(t.data<float>(), t.data<float>() + t.num_elements());
}

// The floats at a device pointer of the fake device (its blocks are host heap
// memory, so a test may look without a counted copy).
std::vector<float> DeviceFloats(const void* p, int64_t n) {
  const auto* f = static_cast<const float*>(p);
  return std::vector<float>(f, f + n);
}

// Writes `values` into the device copy through device operations only:
// var -= grad * 1 with grad = var - values, all in device memory.
Status WriteOnDevice(compute::Device& dev, void* var, const std::vector<float>& current,
                     const std::vector<float>& values) {
  const auto n = static_cast<int64_t>(values.size());
  std::vector<float> host(values.size() + 1);
  for (std::size_t i = 0; i < values.size(); ++i) host[i] = current[i] - values[i];
  host[values.size()] = 1.0f;
  FOREMAN_ASSIGN_OR_RETURN(void* buf, dev.Allocate((n + 1) * 4));
  Status s = dev.CopyToDevice(buf, host.data(), (n + 1) * 4);
  if (s.ok()) {
    s = dev.ApplyGradientDescent(static_cast<float*>(var), static_cast<const float*>(buf), n,
                                 compute::DeviceScalar{static_cast<const float*>(buf) + n});
  }
  dev.Deallocate(buf);
  return s;
}

// -- VariableStore ------------------------------------------------------------------

TEST_CASE("DeviceData uploads a variable once; the device copy is the variable's buffer there") {
  FakeDevice dev;
  VariableStore vars;
  REQUIRE(vars.Create("w", Floats({1, 2, 3, 4})).ok());
  auto p = vars.DeviceData("w", dev);
  REQUIRE_MESSAGE(p.ok(), p.status().ToString());
  CHECK(dev.Contains(*p, 16));
  CHECK(dev.copies_to_device() == 1);
  CHECK(DeviceFloats(*p, 4) == std::vector<float>{1, 2, 3, 4});
  CHECK(vars.resident_device() == &dev);
  auto again = vars.DeviceData("w", dev);
  REQUIRE(again.ok());
  CHECK(*again == *p);
  CHECK(dev.copies_to_device() == 1);
  auto read_only = std::as_const(vars).DeviceData("w", dev);
  REQUIRE(read_only.ok());
  CHECK(*read_only == *p);
  CHECK(dev.copies_to_device() == 1);
  CHECK(dev.copies_to_host() == 0);
}

TEST_CASE("a mutable DeviceData makes Get and Snapshot copy the device value back, once") {
  FakeDevice dev;
  VariableStore vars;
  REQUIRE(vars.Create("w", Floats({1, 2, 3, 4})).ok());
  REQUIRE(vars.Create("b", Floats({9})).ok());
  void* w = vars.DeviceData("w", dev).value();
  REQUIRE(WriteOnDevice(dev, w, {1, 2, 3, 4}, {5, 6, 7, 8}).ok());
  const int64_t to_host = dev.copies_to_host();
  auto got = std::as_const(vars).Get("w");
  REQUIRE(got.ok());
  CHECK(Values(**got) == std::vector<float>{5, 6, 7, 8});
  CHECK(dev.copies_to_host() == to_host + 1);
  // The host copy is current now: neither Get nor Snapshot copies again.
  REQUIRE(std::as_const(vars).Get("w").ok());
  auto snap = vars.Snapshot();
  CHECK(Values(snap.at("w")) == std::vector<float>{5, 6, 7, 8});
  CHECK(Values(snap.at("b")) == std::vector<float>{9});  // never on the device
  CHECK(dev.copies_to_host() == to_host + 1);
  // The next mutable DeviceData needs no upload (the device copy is current)
  // and makes the device newer again: Snapshot copies back once more.
  const int64_t to_device = dev.copies_to_device();
  REQUIRE(vars.DeviceData("w", dev).ok());
  CHECK(dev.copies_to_device() == to_device);
  REQUIRE(WriteOnDevice(dev, w, {5, 6, 7, 8}, {-1, -2, -3, -4}).ok());
  auto snap2 = vars.SnapshotOrError();
  REQUIRE(snap2.ok());
  CHECK(Values(snap2->at("w")) == std::vector<float>{-1, -2, -3, -4});
  CHECK(dev.copies_to_host() == to_host + 2);
}

TEST_CASE("a non-const Get makes the host copy the newer one: the next DeviceData uploads it") {
  FakeDevice dev;
  VariableStore vars;
  REQUIRE(vars.Create("w", Floats({1, 2})).ok());
  void* w = vars.DeviceData("w", dev).value();
  auto t = vars.Get("w");
  REQUIRE(t.ok());
  (*t)->data<float>()[1] = 20;
  REQUIRE(vars.DeviceData("w", dev).ok());
  CHECK(dev.copies_to_device() == 2);
  CHECK(DeviceFloats(w, 2) == std::vector<float>{1, 20});
}

TEST_CASE("Assign replaces a newer device value without copying it back; the next DeviceData uploads") {
  FakeDevice dev;
  VariableStore vars;
  REQUIRE(vars.Create("w", Floats({1, 2})).ok());
  void* w = vars.DeviceData("w", dev).value();
  REQUIRE(WriteOnDevice(dev, w, {1, 2}, {3, 4}).ok());
  const int64_t to_host = dev.copies_to_host();
  REQUIRE(vars.Assign("w", Floats({7, 8})).ok());
  CHECK(dev.copies_to_host() == to_host);
  CHECK(Values(*std::as_const(vars).Get("w").value()) == std::vector<float>{7, 8});
  CHECK(dev.copies_to_host() == to_host);  // the assigned host value is the value
  const int64_t to_device = dev.copies_to_device();
  REQUIRE(vars.DeviceData("w", dev).ok());
  CHECK(dev.copies_to_device() == to_device + 1);
  CHECK(DeviceFloats(w, 2) == std::vector<float>{7, 8});
  // A mismatched Assign changes nothing.
  CHECK(vars.Assign("w", Floats({1})).code() == absl::StatusCode::kInvalidArgument);
}

TEST_CASE("a const DeviceData keeps the host copy current: reads copy nothing back") {
  FakeDevice dev;
  VariableStore vars;
  REQUIRE(vars.Create("w", Floats({1, 2})).ok());
  auto p = std::as_const(vars).DeviceData("w", dev);
  REQUIRE(p.ok());
  CHECK(dev.copies_to_device() == 1);
  REQUIRE(std::as_const(vars).Get("w").ok());
  REQUIRE(vars.SnapshotOrError().ok());
  CHECK(dev.copies_to_host() == 0);
  REQUIRE(vars.ReleaseDevice(dev).ok());
  CHECK(dev.copies_to_host() == 0);
  CHECK(dev.live_blocks() == 0);
}

TEST_CASE("Delete frees the variable's device block") {
  FakeDevice dev;
  VariableStore vars;
  REQUIRE(vars.Create("w", Floats({1, 2, 3, 4})).ok());
  REQUIRE(vars.Create("b", Floats({1})).ok());
  REQUIRE(vars.DeviceData("w", dev).ok());
  REQUIRE(vars.DeviceData("b", dev).ok());
  CHECK(dev.live_blocks() == 2);
  REQUIRE(vars.Delete("w").ok());
  CHECK(dev.live_blocks() == 1);
  CHECK(dev.allocated_bytes() == 4);
  CHECK(dev.copies_to_host() == 0);  // a deleted value is not copied back
  CHECK(dev.bad_deallocations() == 0);
  REQUIRE(vars.Delete("b").ok());
  CHECK(dev.live_blocks() == 0);
}

TEST_CASE("ReleaseDevice copies the newer values back and frees every device copy") {
  FakeDevice dev;
  VariableStore vars;
  REQUIRE(vars.Create("w", Floats({1, 2})).ok());
  REQUIRE(vars.Create("r", Floats({5})).ok());
  REQUIRE(vars.Create("host_only", Floats({0})).ok());
  void* w = vars.DeviceData("w", dev).value();
  REQUIRE(std::as_const(vars).DeviceData("r", dev).ok());
  REQUIRE(WriteOnDevice(dev, w, {1, 2}, {10, 20}).ok());
  REQUIRE(vars.ReleaseDevice(dev).ok());
  CHECK(dev.live_blocks() == 0);
  CHECK(dev.copies_to_host() == 1);  // only w was newer on the device
  CHECK(vars.resident_device() == nullptr);
  CHECK(Values(*std::as_const(vars).Get("w").value()) == std::vector<float>{10, 20});
  CHECK(Values(*std::as_const(vars).Get("r").value()) == std::vector<float>{5});
  CHECK(dev.copies_to_host() == 1);
  // Releasing again, or a device holding nothing, is a no-op.
  CHECK(vars.ReleaseDevice(dev).ok());
  FakeDevice other(FakeDevice::Options{"/fake:1", 0, true});
  CHECK(vars.ReleaseDevice(other).ok());
  // The next DeviceData starts over: allocates and uploads the host value.
  void* w2 = vars.DeviceData("w", dev).value();
  CHECK(DeviceFloats(w2, 2) == std::vector<float>{10, 20});
}

TEST_CASE("DeviceData with a second device first releases the first one's copies") {
  FakeDevice first;
  FakeDevice second(FakeDevice::Options{"/fake:1", 0, true});
  VariableStore vars;
  REQUIRE(vars.Create("w", Floats({1, 2})).ok());
  void* w = vars.DeviceData("w", first).value();
  REQUIRE(WriteOnDevice(first, w, {1, 2}, {3, 4}).ok());
  auto w2 = vars.DeviceData("w", second);
  REQUIRE(w2.ok());
  CHECK(first.live_blocks() == 0);
  CHECK(first.copies_to_host() == 1);
  CHECK(vars.resident_device() == &second);
  CHECK(second.Contains(*w2, 8));
  CHECK(DeviceFloats(*w2, 2) == std::vector<float>{3, 4});
  // The CPU (host memory) also takes the variables back first.
  std::unique_ptr<compute::Device> cpu = compute::CreateDevice("/cpu:0", 1).value();
  auto host = vars.DeviceData("w", *cpu);
  REQUIRE(host.ok());
  CHECK(second.live_blocks() == 0);
  CHECK(vars.resident_device() == nullptr);
  CHECK(*host == vars.Get("w").value()->raw_data());
}

TEST_CASE("DeviceData refuses a string variable and a missing one, naming them") {
  FakeDevice dev;
  VariableStore vars;
  REQUIRE(vars.Create("names", Tensor::Scalar<std::string>("x")).ok());
  auto s = vars.DeviceData("names", dev);
  CHECK(s.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(absl::StrContains(Message(s.status()), "'names'"));
  CHECK(absl::StrContains(Message(s.status()), "/fake:0"));
  auto missing = vars.DeviceData("nope", dev);
  CHECK(missing.status().code() == absl::StatusCode::kNotFound);
  CHECK(absl::StrContains(Message(missing.status()), "'nope'"));
  CHECK(dev.live_blocks() == 0);
}

TEST_CASE("DeviceData beyond the device's memory: RESOURCE_EXHAUSTED, the variable stays on the host") {
  FakeDevice dev(FakeDevice::Options{"/fake:0", 8, true});
  VariableStore vars;
  REQUIRE(vars.Create("w", Floats({1, 2, 3, 4})).ok());
  auto p = vars.DeviceData("w", dev);
  CHECK(p.status().code() == absl::StatusCode::kResourceExhausted);
  CHECK(absl::StrContains(Message(p.status()), "/fake:0"));
  CHECK(Values(*vars.Get("w").value()) == std::vector<float>{1, 2, 3, 4});
  CHECK(dev.copies_to_host() == 0);
}

TEST_CASE("a failed copy back is the device's error naming the variable; the device value is kept") {
  FakeDevice dev;
  VariableStore vars;
  REQUIRE(vars.Create("w", Floats({1, 2})).ok());
  void* w = vars.DeviceData("w", dev).value();
  REQUIRE(WriteOnDevice(dev, w, {1, 2}, {3, 4}).ok());

  dev.FailNextOperation(absl::InternalError("/fake:0: injected copy failure"));
  auto got = std::as_const(vars).Get("w");
  CHECK(got.status().code() == absl::StatusCode::kInternal);
  CHECK(absl::StrContains(Message(got.status()), "'w'"));
  CHECK(absl::StrContains(Message(got.status()), "injected copy failure"));

  dev.FailNextOperation(absl::InternalError("injected"));
  auto snap = vars.SnapshotOrError();
  CHECK(snap.status().code() == absl::StatusCode::kInternal);
  CHECK(absl::StrContains(Message(snap.status()), "'w'"));

  dev.FailNextOperation(absl::InternalError("injected"));
  CHECK(vars.Snapshot().count("w") == 0);  // left out (and logged)

  dev.FailNextOperation(absl::InternalError("injected"));
  auto mut = vars.Get("w");
  CHECK(mut.status().code() == absl::StatusCode::kInternal);

  // The device copy is still the newer value: the next read gets it.
  auto again = std::as_const(vars).Get("w");
  REQUIRE(again.ok());
  CHECK(Values(**again) == std::vector<float>{3, 4});
}

TEST_CASE("a failed copy in ReleaseDevice names the variable and still frees the device's copies") {
  FakeDevice dev;
  VariableStore vars;
  REQUIRE(vars.Create("w", Floats({1, 2})).ok());
  void* w = vars.DeviceData("w", dev).value();
  REQUIRE(WriteOnDevice(dev, w, {1, 2}, {3, 4}).ok());
  dev.InjectFailure(0, absl::InternalError("/fake:0: sticky"), /*sticky=*/true);
  Status s = vars.ReleaseDevice(dev);
  CHECK(s.code() == absl::StatusCode::kInternal);
  CHECK(absl::StrContains(Message(s), "'w'"));
  CHECK(absl::StrContains(Message(s), "/fake:0"));
  CHECK(dev.live_blocks() == 0);
  CHECK(vars.resident_device() == nullptr);
  CHECK(Values(*vars.Get("w").value()) == std::vector<float>{1, 2});  // the last host copy
}

TEST_CASE("a device destroyed before ReleaseDevice: its newer values are reported lost, never read from freed memory") {
  VariableStore vars;
  REQUIRE(vars.Create("w", Floats({1, 2})).ok());
  REQUIRE(vars.Create("r", Floats({5})).ok());
  {
    auto dev = std::make_unique<FakeDevice>();
    void* w = vars.DeviceData("w", *dev).value();
    REQUIRE(std::as_const(vars).DeviceData("r", *dev).ok());
    REQUIRE(WriteOnDevice(*dev, w, {1, 2}, {3, 4}).ok());
  }  // destroyed without ReleaseDevice: it freed its blocks itself
  // The first read reports what was lost, naming the variable and the device.
  Status s = std::as_const(vars).Get("w").status();
  CHECK(s.code() == absl::StatusCode::kFailedPrecondition);
  CHECK(absl::StrContains(Message(s), "'w'"));
  CHECK(absl::StrContains(Message(s), "/fake:0"));
  CHECK(absl::StrContains(Message(s), "ReleaseDevice"));
  CHECK_FALSE(absl::StrContains(Message(s), "'r'"));  // r's device copy was not newer
  CHECK(vars.resident_device() == nullptr);
  // Then the last host values are the values (as after a failed ReleaseDevice).
  CHECK(Values(*std::as_const(vars).Get("w").value()) == std::vector<float>{1, 2});
  CHECK(Values(*std::as_const(vars).Get("r").value()) == std::vector<float>{5});
  // A new device (perhaps at the old one's address) gets fresh copies.
  FakeDevice next;
  auto w2 = vars.DeviceData("w", next);
  REQUIRE_MESSAGE(w2.ok(), w2.status().ToString());
  CHECK(next.Contains(*w2, 8));
  CHECK(DeviceFloats(*w2, 2) == std::vector<float>{1, 2});
  REQUIRE(vars.ReleaseDevice(next).ok());
  CHECK(next.live_blocks() == 0);
}

TEST_CASE("a device destroyed before ReleaseDevice: DeviceData on the next device reports the loss once") {
  VariableStore vars;
  REQUIRE(vars.Create("w", Floats({1, 2})).ok());
  auto dev = std::make_unique<FakeDevice>();
  void* w = vars.DeviceData("w", *dev).value();
  REQUIRE(WriteOnDevice(*dev, w, {1, 2}, {3, 4}).ok());
  dev.reset();
  FakeDevice next(FakeDevice::Options{"/fake:1", 0, true});
  Status s = vars.DeviceData("w", next).status();
  CHECK(s.code() == absl::StatusCode::kFailedPrecondition);
  CHECK(absl::StrContains(Message(s), "'w'"));
  CHECK(absl::StrContains(Message(s), "/fake:0"));
  CHECK(next.live_blocks() == 0);
  auto w2 = vars.DeviceData("w", next);
  REQUIRE(w2.ok());
  CHECK(DeviceFloats(*w2, 2) == std::vector<float>{1, 2});
  REQUIRE(vars.ReleaseDevice(next).ok());
  CHECK(next.live_blocks() == 0);
}

TEST_CASE("SetGlobalStep on a device-resident global_step makes the host copy the newer one") {
  FakeDevice dev;
  VariableStore vars;
  REQUIRE(CreateGlobalStep(vars).ok());
  void* p = vars.DeviceData(kGlobalStepName, dev).value();
  REQUIRE(SetGlobalStep(vars, 5).ok());
  REQUIRE(vars.DeviceData(kGlobalStepName, dev).ok());  // uploads the new value
  int64_t on_device = 0;
  std::memcpy(&on_device, p, sizeof on_device);
  CHECK(on_device == 5);
  REQUIRE(IncrementGlobalStep(vars).ok());
  REQUIRE(vars.DeviceData(kGlobalStepName, dev).ok());
  std::memcpy(&on_device, p, sizeof on_device);
  CHECK(on_device == 6);
}

TEST_CASE("VariableStoreAccess: the device-newer copy without copying it back") {
  FakeDevice dev;
  VariableStore vars;
  REQUIRE(vars.Create("w", Floats({1, 2})).ok());
  REQUIRE(vars.Create("r", Floats({3})).ok());
  using internal::VariableStoreAccess;
  CHECK(VariableStoreAccess::DeviceNewerData(vars, "w") == nullptr);
  void* w = vars.DeviceData("w", dev).value();
  REQUIRE(std::as_const(vars).DeviceData("r", dev).ok());
  CHECK(VariableStoreAccess::DeviceNewerData(vars, "w") == w);
  CHECK(VariableStoreAccess::DeviceNewerData(vars, "r") == nullptr);
  CHECK(VariableStoreAccess::DeviceNewerData(vars, "missing") == nullptr);
  REQUIRE(WriteOnDevice(dev, w, {1, 2}, {3, 4}).ok());
  const Tensor* host = VariableStoreAccess::HostTensor(vars, "w");
  REQUIRE(host != nullptr);
  CHECK(Values(*host) == std::vector<float>{1, 2});  // stale, untouched
  CHECK(dev.copies_to_host() == 0);
  CHECK(VariableStoreAccess::HostTensor(vars, "missing") == nullptr);
}

// -- Session --------------------------------------------------------------------------

// Registers FakeDeviceFactory for "/fake:N" for the test's lifetime.
struct FakeFactoryScope {
  FakeDevice* last = nullptr;
  FakeFactoryScope() { compute::SetFakeDeviceFactoryForTesting(testing::FakeDeviceFactory(&last)); }
  ~FakeFactoryScope() { compute::SetFakeDeviceFactoryForTesting(nullptr); }
};

constexpr float kLearningRate = 0.5f;
const std::vector<float> kGrad = {0.5f, -1.0f, 2.0f, 0.25f};

// global_step and "w" float32[4] = {1, 2, 3, 4}; the step (train_op) runs
// w -= grad * lr on the session's device with grad and lr in device memory,
// then global_step += 1 on the host.
// `before` (when set) runs first with the global step; its error fails the step.
std::shared_ptr<Graph> DeviceGraph(std::function<Status(int64_t)> before = nullptr) {
  auto graph = std::make_shared<Graph>();
  REQUIRE(graph->CreateGlobalStep().ok());
  REQUIRE(graph->AddVariable("w", []() -> StatusOr<Tensor> { return Floats({1, 2, 3, 4}); }).ok());
  REQUIRE(graph
              ->SetStep([before](StepContext& ctx) -> Status {
                if (!ctx.requested(kTrainOpName)) return absl::OkStatus();
                if (before) {
                  FOREMAN_ASSIGN_OR_RETURN(int64_t step, GetGlobalStep(ctx.variables()));
                  FOREMAN_RETURN_IF_ERROR(before(step));
                }
                compute::Device& dev = ctx.compute();
                FOREMAN_ASSIGN_OR_RETURN(void* w, ctx.variables().DeviceData("w", dev));
                std::vector<float> host = kGrad;
                host.push_back(kLearningRate);
                FOREMAN_ASSIGN_OR_RETURN(void* buf, dev.Allocate(5 * 4));
                Status s = dev.CopyToDevice(buf, host.data(), 5 * 4);
                const auto* g = static_cast<const float*>(buf);
                if (s.ok()) s = dev.ApplyGradientDescent(static_cast<float*>(w), g, 4, compute::DeviceScalar{g + 4});
                dev.Deallocate(buf);
                FOREMAN_RETURN_IF_ERROR(s);
                return IncrementGlobalStep(ctx.variables()).status();
              })
              .ok());
  return graph;
}

// w after `steps` steps from `start` (exact: the products are powers of two).
std::vector<float> After(std::vector<float> start, int steps) {
  for (int s = 0; s < steps; ++s) {
    for (std::size_t i = 0; i < start.size(); ++i) start[i] -= kGrad[i] * kLearningRate;
  }
  return start;
}

SessionConfig FakeConfig(int64_t memory_limit_bytes = 0) {
  SessionConfig config;
  config.device = "/fake:0";
  config.intra_op_parallelism_threads = 1;
  config.device_memory_limit_bytes = memory_limit_bytes;
  return config;
}

std::unique_ptr<Session> InitializedSession(const SessionConfig& config) {
  auto sess = Session::Create(DeviceGraph(), "", config);
  REQUIRE_MESSAGE(sess.ok(), sess.status().ToString());
  auto graph = (*sess)->graph();
  REQUIRE((*sess)
              ->WithVariables([&graph](VariableStore& vars) -> Status {
                for (const VariableDef& def : graph->variables()) {
                  FOREMAN_ASSIGN_OR_RETURN(Tensor value, def.initializer());
                  FOREMAN_RETURN_IF_ERROR(vars.Create(def.name, std::move(value), def.trainable));
                }
                return absl::OkStatus();
              })
              .ok());
  return std::move(sess).value();
}

// The device copy of "w" as the device holds it (no counted copy).
std::vector<float> DeviceW(Session& sess) {
  std::vector<float> out;
  REQUIRE(sess.WithVariables([&](VariableStore& vars) -> Status {
                const void* p = internal::VariableStoreAccess::DeviceNewerData(vars, "w");
                if (p == nullptr) return absl::FailedPreconditionError("w is not newer on the device");
                out = DeviceFloats(p, 4);
                return absl::OkStatus();
              })
              .ok());
  return out;
}

TEST_CASE("Session: a device without host memory only on the local target, checked at Create") {
  FakeFactoryScope factory;
  auto sess = Session::Create(DeviceGraph(), "inproc://device_residency", FakeConfig());
  CHECK(sess.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK(absl::StrContains(Message(sess.status()), "inproc://device_residency"));
  CHECK(absl::StrContains(Message(sess.status()), "/fake:0"));
  ResetInprocTarget("inproc://device_residency");
  // The CPU is fine there, and the fake device on "".
  SessionConfig cpu;
  cpu.intra_op_parallelism_threads = 1;
  CHECK(Session::Create(DeviceGraph(), "inproc://device_residency", cpu).ok());
  ResetInprocTarget("inproc://device_residency");
  CHECK(Session::Create(DeviceGraph(), "", FakeConfig()).ok());
}

TEST_CASE("Session: device_memory_limit_bytes reaches the device; a negative one is INVALID_ARGUMENT") {
  FakeFactoryScope factory;
  auto bad = Session::Create(DeviceGraph(), "", FakeConfig(-1));
  CHECK(bad.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(absl::StrContains(Message(bad.status()), "device_memory_limit_bytes"));

  auto sess = InitializedSession(FakeConfig(/*memory_limit_bytes=*/8));  // w needs 16 bytes
  auto run = sess->Run({kTrainOpName});
  CHECK(run.status().code() == absl::StatusCode::kResourceExhausted);
  CHECK(absl::StrContains(Message(run.status()), "/fake:0"));

  auto roomy = InitializedSession(FakeConfig(/*memory_limit_bytes=*/64));
  CHECK(roomy->Run({kTrainOpName}).ok());
  CHECK(factory.last->peak_allocated_bytes() <= 64);
}

TEST_CASE("Session: fetches, WithVariables and GlobalStep see the device's values") {
  FakeFactoryScope factory;
  auto sess = InitializedSession(FakeConfig());
  FakeDevice& dev = *factory.last;
  REQUIRE(sess->Run({kTrainOpName}).ok());
  auto out = sess->Run({kTrainOpName, "w"});
  REQUIRE_MESSAGE(out.ok(), out.status().ToString());
  CHECK(Values(out->at("w")) == After({1, 2, 3, 4}, 2));
  CHECK(dev.copies_to_device() == 1 + 2);  // w once, each step's grad and rate
  REQUIRE(sess->Run({kTrainOpName}).ok());
  CHECK(sess->GlobalStep().value() == 3);
  std::vector<float> seen;
  REQUIRE(sess->WithVariables([&seen](VariableStore& vars) -> Status {
                FOREMAN_ASSIGN_OR_RETURN(const Tensor* w, std::as_const(vars).Get("w"));
                seen = Values(*w);
                return absl::OkStatus();
              })
              .ok());
  CHECK(seen == After({1, 2, 3, 4}, 3));
  CHECK(Values(sess->Snapshot().at("w")) == After({1, 2, 3, 4}, 3));
}

TEST_CASE("Session: a failed copy back of a fetched variable is the run's error, naming it") {
  FakeFactoryScope factory;
  auto sess = InitializedSession(FakeConfig());
  REQUIRE(sess->Run({kTrainOpName}).ok());
  factory.last->FailNextOperation(absl::InternalError("/fake:0: injected copy failure"));
  auto out = sess->Run({"w"});  // no step: the fetch's copy back is the next operation
  CHECK(out.status().code() == absl::StatusCode::kInternal);
  CHECK(absl::StrContains(Message(out.status()), "'w'"));
  auto again = sess->Run({"w"});
  REQUIRE(again.ok());
  CHECK(Values(again->at("w")) == After({1, 2, 3, 4}, 1));
}

TEST_CASE("Session::Close copies the device's values back and frees them while the device lives") {
  FakeFactoryScope factory;
  auto sess = InitializedSession(FakeConfig());
  FakeDevice& dev = *factory.last;
  REQUIRE(sess->Run({kTrainOpName}).ok());
  REQUIRE(sess->Run({kTrainOpName}).ok());
  CHECK(dev.live_blocks() == 1);
  REQUIRE(sess->Close().ok());
  CHECK(dev.live_blocks() == 0);
  CHECK(dev.bad_deallocations() == 0);
  const int64_t to_host = dev.copies_to_host();
  CHECK(Values(sess->Snapshot().at("w")) == After({1, 2, 3, 4}, 2));
  CHECK(dev.copies_to_host() == to_host);  // already on the host
  CHECK(sess->Close().ok());              // idempotent
}

TEST_CASE("Session::Close after a sticky device error: the device's INTERNAL, the copies freed") {
  FakeFactoryScope factory;
  auto sess = InitializedSession(FakeConfig());
  FakeDevice& dev = *factory.last;
  REQUIRE(sess->Run({kTrainOpName}).ok());
  dev.InjectFailure(0, absl::InternalError("/fake:0: sticky"), /*sticky=*/true);
  auto run = sess->Run({kTrainOpName});
  CHECK(run.status().code() == absl::StatusCode::kInternal);
  Status closed = sess->Close();
  CHECK(closed.code() == absl::StatusCode::kInternal);
  CHECK(absl::StrContains(Message(closed), "'w'"));
  CHECK(dev.live_blocks() == 0);
  CHECK(dev.bad_deallocations() == 0);
}

// A device owned by the session that forwards to a FakeDevice the test owns,
// so that the FakeDevice can be inspected after the session (and this
// device) are gone: a Deallocate after ~Session would call through a
// destroyed object (AddressSanitizer reports it; a release build aborts on
// the pure virtual call).
class ForwardingDevice final : public compute::Device {
 public:
  explicit ForwardingDevice(FakeDevice* d) : d_(d) {}
  const std::string& name() const override { return d_->name(); }
  bool host_memory() const override { return false; }
  StatusOr<void*> Allocate(int64_t bytes) override { return d_->Allocate(bytes); }
  void Deallocate(void* ptr) override { d_->Deallocate(ptr); }
  Status CopyToDevice(void* dst, const void* src, int64_t bytes) override { return d_->CopyToDevice(dst, src, bytes); }
  Status CopyToHost(void* dst, const void* src, int64_t bytes) override { return d_->CopyToHost(dst, src, bytes); }
  Status Gemm(const compute::GemmArgs& a) override { return d_->Gemm(a); }
  Status ColumnSums(const float* d, int64_t r, int64_t c, float* o) override { return d_->ColumnSums(d, r, c, o); }
  Status SoftmaxXentForward(const compute::SoftmaxXentArgs& a, compute::SoftmaxXentStats* s) override {
    return d_->SoftmaxXentForward(a, s);
  }
  Status SoftmaxXentBackward(const compute::SoftmaxXentArgs& a, float scale, float* g) override {
    return d_->SoftmaxXentBackward(a, scale, g);
  }
  Status ApplyGradientDescent(float* v, const float* g, int64_t n, float lr) override {
    return d_->ApplyGradientDescent(v, g, n, lr);
  }
  Status ApplyMomentum(float* v, float* a, const float* g, int64_t n, const compute::MomentumParams& p) override {
    return d_->ApplyMomentum(v, a, g, n, p);
  }
  Status ApplyAdam(float* v, float* m, float* s, const float* g, int64_t n, const compute::AdamParams& p) override {
    return d_->ApplyAdam(v, m, s, g, n, p);
  }
  Status ApplyGradientDescent(float* v, const float* g, int64_t n, compute::DeviceScalar lr) override {
    return d_->ApplyGradientDescent(v, g, n, lr);
  }
  Status ApplyMomentum(float* v, float* a, const float* g, int64_t n, compute::DeviceScalar lr, float m,
                       bool nesterov) override {
    return d_->ApplyMomentum(v, a, g, n, lr, m, nesterov);
  }
  Status ApplyAdam(float* v, float* m, float* s, const float* g, int64_t n, compute::DeviceScalar step, float b1,
                   float b2, float eps) override {
    return d_->ApplyAdam(v, m, s, g, n, step, b1, b2, eps);
  }
  Status AdamStepSize(compute::DeviceScalar lr, compute::DeviceScalar b1p, compute::DeviceScalar b2p,
                      float* out) override {
    return d_->AdamStepSize(lr, b1p, b2p, out);
  }
  Status AdamFinish(float* b1p, float* b2p, float b1, float b2) override { return d_->AdamFinish(b1p, b2p, b1, b2); }
  Status SoftmaxXentToDevice(const compute::SoftmaxXentArgs& a, float scale, float* g,
                             compute::SoftmaxXentStats* s) override {
    return d_->SoftmaxXentToDevice(a, scale, g, s);
  }
  Status SoftmaxXentForwardToDevice(const compute::SoftmaxXentArgs& a, compute::SoftmaxXentStats* s) override {
    return d_->SoftmaxXentForwardToDevice(a, s);
  }
  Status GatherExamples(const compute::GatherArgs& a) override { return d_->GatherExamples(a); }
  Status CopyToHostBatch(const compute::HostCopy* c, int64_t n) override { return d_->CopyToHostBatch(c, n); }

 private:
  FakeDevice* d_;
};

TEST_CASE("~Session without Close frees the device's copies before the device is destroyed") {
  FakeDevice dev;
  compute::SetFakeDeviceFactoryForTesting(
      [&dev](const std::string&, int64_t) -> StatusOr<std::unique_ptr<compute::Device>> {
        return std::unique_ptr<compute::Device>(std::make_unique<ForwardingDevice>(&dev));
      });
  {
    auto sess = InitializedSession(FakeConfig());
    REQUIRE(sess->Run({kTrainOpName}).ok());
    CHECK(dev.live_blocks() == 1);
  }
  CHECK(dev.live_blocks() == 0);
  CHECK(dev.bad_deallocations() == 0);
  CHECK(dev.copies_to_host() == 0);  // values dying with the session are not copied back
  // A sticky device error does not stop the copies from being freed.
  {
    auto sess = InitializedSession(FakeConfig());
    REQUIRE(sess->Run({kTrainOpName}).ok());
    dev.InjectFailure(0, absl::InternalError("/fake:0: sticky"), /*sticky=*/true);
  }
  compute::SetFakeDeviceFactoryForTesting(nullptr);
  CHECK(dev.live_blocks() == 0);
  CHECK(dev.bad_deallocations() == 0);
}

// -- Checkpoints ------------------------------------------------------------------------

TEST_CASE("SnapshotInto copies the device-newer variables in one batch into reused buffers") {
  FakeFactoryScope factory;
  auto sess = InitializedSession(FakeConfig());
  FakeDevice& dev = *factory.last;
  std::map<std::string, Tensor> snapshot;
  // Before any step nothing is on the device: copied from the host.
  auto first = internal::SnapshotInto(*sess, &snapshot);
  REQUIRE_MESSAGE(first.ok(), first.status().ToString());
  CHECK(*first == 0);
  CHECK(Values(snapshot.at("w")) == std::vector<float>{1, 2, 3, 4});
  CHECK(snapshot.at(kGlobalStepName).scalar<int64_t>().value() == 0);
  CHECK(dev.host_batches() == 0);

  REQUIRE(sess->Run({kTrainOpName}).ok());
  REQUIRE(sess->Run({kTrainOpName}).ok());
  const char* w_buffer = snapshot.at("w").raw_data();
  const int64_t to_host = dev.copies_to_host();
  auto second = internal::SnapshotInto(*sess, &snapshot);
  REQUIRE_MESSAGE(second.ok(), second.status().ToString());
  CHECK(*second == 2);  // both buffers reused
  CHECK(snapshot.at("w").raw_data() == w_buffer);
  CHECK(dev.host_batches() == 1);
  CHECK(dev.copies_to_host() == to_host);
  CHECK(Values(snapshot.at("w")) == DeviceW(*sess));
  CHECK(Values(snapshot.at("w")) == After({1, 2, 3, 4}, 2));
  CHECK(snapshot.at(kGlobalStepName).scalar<int64_t>().value() == 2);
  // The store's host copy was not refreshed: the device's is still newer.
  REQUIRE(sess->WithVariables([](VariableStore& vars) -> Status {
                CHECK(internal::VariableStoreAccess::DeviceNewerData(vars, "w") != nullptr);
                CHECK(Values(*internal::VariableStoreAccess::HostTensor(vars, "w")) ==
                      std::vector<float>{1, 2, 3, 4});
                return absl::OkStatus();
              })
              .ok());
  // Names no longer variables are dropped.
  snapshot.emplace("zzz_gone", Floats({1}));
  REQUIRE(internal::SnapshotInto(*sess, &snapshot).ok());
  CHECK(snapshot.count("zzz_gone") == 0);
  CHECK(snapshot.size() == 2);
  // Strings stay on the host; an empty variable on the device has no bytes to copy.
  REQUIRE(sess->WithVariables([&dev](VariableStore& vars) -> Status {
                FOREMAN_RETURN_IF_ERROR(vars.Create("notes", Tensor::Scalar<std::string>("hello")));
                FOREMAN_RETURN_IF_ERROR(vars.Create("empty", Tensor(DataType::kFloat, TensorShape{0})));
                return vars.DeviceData("empty", dev).status();
              })
              .ok());
  const int64_t batches = dev.host_batches();
  auto third = internal::SnapshotInto(*sess, &snapshot);
  REQUIRE_MESSAGE(third.ok(), third.status().ToString());
  CHECK(*third == 2);
  CHECK(snapshot.at("notes").scalar<std::string>().value() == "hello");
  CHECK(snapshot.at("empty").shape() == TensorShape({0}));
  CHECK(Values(snapshot.at("w")) == After({1, 2, 3, 4}, 2));
  CHECK(dev.host_batches() == batches + 1);  // w, in one batch still
}

TEST_CASE("SnapshotInto: a failed device copy is the device's INTERNAL naming the variable") {
  FakeFactoryScope factory;
  auto sess = InitializedSession(FakeConfig());
  REQUIRE(sess->Run({kTrainOpName}).ok());
  // A first save allocates the buffers (AllocateHostTensor is an operation
  // of the fake device too); the failure hits the second save's batch copy.
  std::map<std::string, Tensor> snapshot;
  REQUIRE(internal::SnapshotInto(*sess, &snapshot).ok());
  REQUIRE(sess->Run({kTrainOpName}).ok());
  factory.last->FailNextOperation(absl::InternalError("/fake:0: injected copy failure"));
  auto s = internal::SnapshotInto(*sess, &snapshot);
  CHECK(s.status().code() == absl::StatusCode::kInternal);
  CHECK(absl::StrContains(Message(s.status()), "'w'"));
  CHECK(absl::StrContains(Message(s.status()), "/fake:0"));
  CHECK(absl::StrContains(Message(s.status()), "injected copy failure"));
}

// MonitoredTrainingSession options: checkpoints every `save_steps` steps into
// `dir`, no other periodic service, stop at `last_step`.
MonitoredTrainingSessionOptions TrainingOptions(const std::string& dir, const SessionConfig& config,
                                                int64_t save_steps, int64_t last_step) {
  MonitoredTrainingSessionOptions o;
  o.graph = DeviceGraph();
  o.checkpoint_dir = dir;
  o.config = config;
  o.stop_grace_period_secs = 0;
  o.save_checkpoint_secs = std::nullopt;
  o.save_checkpoint_steps = save_steps;
  o.save_summaries_steps = std::nullopt;
  o.save_summaries_secs = std::nullopt;
  o.log_step_count_steps = std::nullopt;
  auto stop = StopAtStepHook::Create({std::nullopt, last_step});
  REQUIRE(stop.ok());
  o.hooks = {*stop};
  return o;
}

// The raw session under a MonitoredSession (MonitoredStepContext::session()).
Session* RawSession(MonitoredSession& sess) {
  Session* raw = nullptr;
  REQUIRE(sess.run_step_fn([&raw](MonitoredStepContext& ctx) -> Status {
                raw = ctx.session();
                return absl::OkStatus();
              })
              .ok());
  REQUIRE(raw != nullptr);
  return raw;
}

TEST_CASE("a device session's checkpoint holds the device values and restores bitwise into a CPU session") {
  FakeFactoryScope factory;
  TempDir dir;
  std::vector<float> device_w;
  {
    auto sess = MonitoredTrainingSession(TrainingOptions(dir.path(), FakeConfig(), 2, 3));
    REQUIRE_MESSAGE(sess.ok(), sess.status().ToString());
    Session* raw = RawSession(**sess);
    while (!(*sess)->should_stop()) REQUIRE((*sess)->run({kTrainOpName}).ok());
    device_w = DeviceW(*raw);
    CHECK(factory.last->host_batches() >= 1);  // the save of step 2 copied from the device
    REQUIRE((*sess)->close().ok());            // the final checkpoint (step 3)
  }
  CHECK(device_w == After({1, 2, 3, 4}, 3));
  auto latest = LatestCheckpoint(Env::Default(), dir.path());
  REQUIRE(latest.ok());
  REQUIRE(latest->has_value());
  auto saved = ReadCheckpoint(**latest);
  CHECK(saved.at(kGlobalStepName).scalar<int64_t>().value() == 3);
  CHECK(Values(saved.at("w")) == device_w);
  auto step2 = ReadCheckpoint(dir / "model.ckpt-2");
  CHECK(Values(step2.at("w")) == After({1, 2, 3, 4}, 2));

  // The CPU session restores it: bitwise the device's values.
  SessionConfig cpu;
  cpu.intra_op_parallelism_threads = 1;
  auto restored = MonitoredTrainingSession(TrainingOptions(dir.path(), cpu, 100, 100));
  REQUIRE_MESSAGE(restored.ok(), restored.status().ToString());
  Session& raw = *RawSession(**restored);
  CHECK(raw.GlobalStep().value() == 3);
  auto snap = raw.Snapshot();
  CHECK(snap.at("w").Equals(saved.at("w")));
  CHECK(std::memcmp(snap.at("w").raw_data(), device_w.data(), 16) == 0);
  // And trains on from there on the CPU.
  REQUIRE((*restored)->run({kTrainOpName}).ok());
  CHECK(Values(raw.Snapshot().at("w")) == After({1, 2, 3, 4}, 4));
  REQUIRE((*restored)->close().ok());
}

TEST_CASE("a CPU checkpoint restored into a device session is what its next step uses") {
  FakeFactoryScope factory;
  TempDir dir;
  SessionConfig cpu;
  cpu.intra_op_parallelism_threads = 1;
  {
    auto sess = MonitoredTrainingSession(TrainingOptions(dir.path(), cpu, 100, 2));
    REQUIRE_MESSAGE(sess.ok(), sess.status().ToString());
    while (!(*sess)->should_stop()) REQUIRE((*sess)->run({kTrainOpName}).ok());
    REQUIRE((*sess)->close().ok());
  }
  auto sess = MonitoredTrainingSession(TrainingOptions(dir.path(), FakeConfig(), 100, 100));
  REQUIRE_MESSAGE(sess.ok(), sess.status().ToString());
  REQUIRE((*sess)->run({kTrainOpName}).ok());
  CHECK(DeviceW(*RawSession(**sess)) == After({1, 2, 3, 4}, 3));
  CHECK(RawSession(**sess)->GlobalStep().value() == 3);
  REQUIRE((*sess)->close().ok());
}

TEST_CASE("a restore into a session whose device holds newer values refreshes the device copy") {
  FakeFactoryScope factory;
  TempDir dir;
  auto saver = Saver::Create(SaverOptions{}).value();
  std::map<std::string, Tensor> ckpt;
  ckpt.emplace("w", Floats({10, 20, 30, 40}));
  ckpt.emplace(kGlobalStepName, Tensor::Scalar<int64_t>(7));
  auto prefix = saver->Save(ckpt, dir / "model.ckpt", 7);
  REQUIRE(prefix.ok());

  auto sess = InitializedSession(FakeConfig());
  REQUIRE(sess->Run({kTrainOpName}).ok());
  REQUIRE(sess->Run({kTrainOpName}).ok());  // the device holds w after two steps
  REQUIRE(sess->WithVariables([&](VariableStore& vars) { return saver->Restore(*prefix, &vars); }).ok());
  REQUIRE(sess->Run({kTrainOpName}).ok());
  CHECK(DeviceW(*sess) == After({10, 20, 30, 40}, 1));
  CHECK(sess->GlobalStep().value() == 8);
}

// Makes the device's next operation fail just before the save of `step`
// copies the variables (CheckpointSaverListener::before_save).
class FailSaveOfStep : public CheckpointSaverListener {
 public:
  FailSaveOfStep(int64_t step, FakeDevice** device) : step_(step), device_(device) {}
  Status before_save(Session* /*session*/, int64_t global_step) override {
    if (global_step == step_) (*device_)->FailNextOperation(absl::InternalError("/fake:0: injected copy failure"));
    return absl::OkStatus();
  }

 private:
  int64_t step_;
  FakeDevice** device_;
};

TEST_CASE("a failed device copy fails that save; the previous checkpoint stays intact") {
  FakeFactoryScope factory;
  TempDir dir;
  auto o = TrainingOptions(dir.path(), FakeConfig(), 2, 100);
  o.checkpoint_listeners = {std::make_shared<FailSaveOfStep>(4, &factory.last)};
  auto sess = MonitoredTrainingSession(o);
  REQUIRE_MESSAGE(sess.ok(), sess.status().ToString());
  REQUIRE((*sess)->run({kTrainOpName}).ok());
  REQUIRE((*sess)->run({kTrainOpName}).ok());  // saves step 2
  REQUIRE((*sess)->run({kTrainOpName}).ok());
  auto failed = (*sess)->run({kTrainOpName});  // step 4: its save fails
  CHECK(failed.status().code() == absl::StatusCode::kInternal);
  CHECK(absl::StrContains(Message(failed.status()), "'w'"));
  CHECK(absl::StrContains(Message(failed.status()), "injected copy failure"));
  CHECK((*sess)->close().code() == absl::StatusCode::kInternal);
  auto latest = LatestCheckpoint(Env::Default(), dir.path());
  REQUIRE(latest.ok());
  REQUIRE(latest->has_value());
  CHECK(**latest == dir / "model.ckpt-2");
  auto step2 = ReadCheckpoint(**latest);
  CHECK(Values(step2.at("w")) == After({1, 2, 3, 4}, 2));
  CHECK(step2.at(kGlobalStepName).scalar<int64_t>().value() == 2);
  auto prefixes = ListCheckpointPrefixes(Env::Default(), dir.path());
  REQUIRE(prefixes.ok());
  CHECK(*prefixes == std::vector<std::string>{dir / "model.ckpt-0", dir / "model.ckpt-2"});
}

TEST_CASE("a recovery closes the device session and goes on from the checkpoint on a new device") {
  FakeDevice* last = nullptr;
  int made = 0;
  compute::DeviceFactoryForTesting inner = testing::FakeDeviceFactory(&last);
  compute::SetFakeDeviceFactoryForTesting(
      [&](const std::string& device, int64_t limit) -> StatusOr<std::unique_ptr<compute::Device>> {
        ++made;
        return inner(device, limit);
      });
  TempDir dir;
  auto o = TrainingOptions(dir.path(), FakeConfig(), 2, 6);
  bool preempted = false;
  o.graph = DeviceGraph([&preempted](int64_t step) -> Status {
    if (step == 3 && !preempted) {
      preempted = true;
      return absl::UnavailableError("injected preemption");
    }
    return absl::OkStatus();
  });
  o.recovery.initial_backoff = absl::Milliseconds(1);
  o.recovery.max_backoff = absl::Milliseconds(1);
  {
    auto sess = MonitoredTrainingSession(o);
    REQUIRE_MESSAGE(sess.ok(), sess.status().ToString());
    while (!(*sess)->should_stop()) {
      auto r = (*sess)->run({kTrainOpName});
      REQUIRE_MESSAGE(r.ok(), r.status().ToString());
    }
    REQUIRE((*sess)->close().ok());
  }
  compute::SetFakeDeviceFactoryForTesting(nullptr);
  CHECK(preempted);
  CHECK(made == 2);  // the recovery's new session has its own device
  auto latest = LatestCheckpoint(Env::Default(), dir.path());
  REQUIRE(latest.ok());
  REQUIRE(latest->has_value());
  auto saved = ReadCheckpoint(**latest);
  CHECK(saved.at(kGlobalStepName).scalar<int64_t>().value() == 6);
  CHECK(Values(saved.at("w")) == After({1, 2, 3, 4}, 6));
}

}  // namespace
}  // namespace foreman
