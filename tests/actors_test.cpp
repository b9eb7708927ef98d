// Tests for the supervision tree (actors/, design.md §1) and the Runtime
// facade (src/runtime/runtime.hpp): spawning and ordered, bounded shutdown;
// failures of any child reaching the coordinator as a Status; the service
// actors' protocols (summary_writer, checkpoint_saver, step_counter).
//
// Every wait is bounded. Real-time waits only wait for actors to do real
// work; nothing here sleeps.
#include <doctest/doctest.h>

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/cord.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "actors/actor_system.hpp"
#include "actors/checkpoint_saver.hpp"
#include "actors/messages.hpp"
#include "actors/session_supervisor.hpp"
#include "foreman/checkpoint.hpp"
#include "foreman/coordinator.hpp"
#include "foreman/dataset.hpp"
#include "foreman/input_pipeline.hpp"
#include "foreman/event_reader.hpp"
#include "foreman/fault.hpp"
#include "foreman/mem_env.hpp"
#include "foreman/restart_policy.hpp"
#include "foreman/summary.hpp"
#include "runtime/runtime.hpp"
#include "support/gated_env.hpp"
#include "support/log_capture.hpp"
#include "support/test_util.hpp"

namespace foreman {
namespace {

using internal::ActorSystemsCreated;
using internal::Runtime;
using testing::CapturedLog;
using testing::GatedEnv;

constexpr absl::Duration kWait = absl::Seconds(20);

std::string Msg(const Status& s) { return std::string(s.message()); }

/// An actor system the test owns, as an application embedding Foreman would.
struct TestSystem {
  caf::actor_system_config cfg;
  std::unique_ptr<caf::actor_system> sys;
  TestSystem() {
    cfg.set("scheduler.max-threads", size_t{2});
    sys = std::make_unique<caf::actor_system>(cfg);
  }
  /// Waits (real time, bounded) until no actor of the system runs.
  bool AllDone(absl::Duration timeout = kWait) {
    const absl::Time deadline = absl::Now() + timeout;
    while (sys->registry().running() != 0) {
      if (absl::Now() > deadline) return false;
      std::this_thread::yield();
    }
    return true;
  }
};

SessionConfig Config(Env* env, Clock* clock = Clock::Real()) {
  SessionConfig config;
  config.env = env;
  config.clock = clock;
  return config;
}

std::unique_ptr<Runtime> MakeRuntime(caf::actor_system* sys, const SessionConfig& config) {
  auto runtime = Runtime::Create(sys, config);
  REQUIRE_MESSAGE(runtime.ok(), runtime.status().ToString());
  return *std::move(runtime);
}

std::map<std::string, Tensor> Snapshot(int64_t step, float w) {
  std::map<std::string, Tensor> vars;
  vars.emplace("global_step", Tensor::Scalar<int64_t>(step));
  vars.emplace("w", Tensor::Scalar<float>(w));
  return vars;
}

std::shared_ptr<Saver> MakeSaver(Env* env, int max_to_keep = 5) {
  SaverOptions options;
  options.env = env;
  options.max_to_keep = max_to_keep;
  auto saver = Saver::Create(options);
  REQUIRE(saver.ok());
  return std::shared_ptr<Saver>(*std::move(saver));
}

/// Every event of every event file in `dir`, in file order.
std::vector<Event> ReadEvents(Env* env, const std::string& dir) {
  auto files = ListEventFiles(env, dir);
  REQUIRE_MESSAGE(files.ok(), files.status().ToString());
  std::vector<Event> all;
  for (const std::string& f : *files) {
    auto events = ReadEventFile(env, f);
    REQUIRE_MESSAGE(events.ok(), events.status().ToString());
    all.insert(all.end(), events->begin(), events->end());
  }
  return all;
}

/// Redirects fd 2 into a file while it lives: what CAF (or anyone) printed.
class CapturedStderr {
 public:
  CapturedStderr() : dir_("stderr") {
    std::fflush(stderr);
    saved_ = ::dup(2);
    const int fd = ::open((dir_ / "err").c_str(), O_CREAT | O_WRONLY | O_TRUNC, 0600);
    REQUIRE(fd >= 0);
    ::dup2(fd, 2);
    ::close(fd);
  }
  ~CapturedStderr() { Restore(); }
  std::string Restore() {
    if (saved_ >= 0) {
      std::fflush(stderr);
      ::dup2(saved_, 2);
      ::close(saved_);
      saved_ = -1;
    }
    std::ifstream in(dir_ / "err");
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }

 private:
  testing::TempDir dir_;
  int saved_ = -1;
};

// -- lifecycle ------------------------------------------------------------------------

TEST_CASE("Runtime owns an actor system when given none; Shutdown stops it and is idempotent") {
  MemEnv env;
  SessionConfig config = Config(&env);
  config.actor_threads = 3;
  auto runtime = MakeRuntime(nullptr, config);
  auto writer = runtime->SummaryWriter("/logs");
  REQUIRE(writer.ok());
  CHECK(runtime->Shutdown(kWait).ok());
  CHECK(runtime->Shutdown(kWait).ok());  // The first result again.
  runtime.reset();                       // ~actor_system did not hang.
}

// CAF 0.17 keeps a reference to the system in the thread-local storage of
// the thread that constructs it or spawns from outside an actor, and
// ~actor_system waits for every such reference: a MonitoredSession closed on
// another thread than the one that created it would hang forever.
TEST_CASE("a Runtime created on one thread shuts down and is destroyed on another") {
  MemEnv env;
  auto runtime = MakeRuntime(nullptr, Config(&env));
  REQUIRE(runtime->SummaryWriter("/logs").ok());
  REQUIRE(runtime->CheckpointSaver("/ckpt", MakeSaver(&env), "model.ckpt").ok());
  auto done = std::make_shared<std::promise<Status>>();
  std::future<Status> result = done->get_future();
  std::thread closer([&runtime, done] {
    Status s = runtime->Shutdown(kWait);
    runtime.reset();  // ~actor_system
    done->set_value(s);
  });
  if (result.wait_for(std::chrono::seconds(20)) != std::future_status::ready) {
    closer.detach();  // Stuck in ~actor_system: let the test binary fail, not hang.
    FAIL("~actor_system hung on the closing thread");
  }
  closer.join();
  CHECK(result.get().ok());
}

// The names of this process's threads that CAF started (actor_system.hpp
// names them "fm-caf<serial>").
std::vector<std::string> CafThreadNames() {
  std::vector<std::string> names;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/task")) {
    std::ifstream in(entry.path() / "comm");
    std::string name;
    std::getline(in, name);
    if (absl::StartsWith(name, "fm-caf")) names.push_back(name);
  }
  return names;
}

TEST_CASE("one actor system per process: runtimes and input pipelines share it, and it goes with its last user") {
  MemEnv env;
  const int64_t before = ActorSystemsCreated();
  const std::string ours = absl::StrCat("fm-caf", before + 1);
  // A system an earlier test had to keep alive (a wedged actor) is not ours.
  const std::vector<std::string> kept = CafThreadNames();
  auto count_ours = [&] {
    const std::vector<std::string> names = CafThreadNames();
    return std::count(names.begin(), names.end(), ours);
  };
  {
    auto a = MakeRuntime(nullptr, Config(&env));
    auto b = MakeRuntime(nullptr, Config(&env));
    REQUIRE(a->SummaryWriter("/a").ok());
    REQUIRE(b->SummaryWriter("/b").ok());
    data::LabeledImages images;
    images.images = Tensor(DataType::kUInt8, TensorShape({8, 2, 2}));
    images.labels = Tensor(DataType::kUInt8, TensorShape({8}));
    data::DatasetOptions options;
    options.batch_size = 4;
    auto dataset = data::Dataset::Create(std::move(images), options);
    REQUIRE(dataset.ok());
    auto pipeline = data::InputPipeline::Create(*dataset, {});
    REQUIRE(pipeline.ok());
    auto batch = (*pipeline)->Next(data::DatasetPosition{}, absl::Seconds(20));
    CHECK(batch.ok());
    CHECK(ActorSystemsCreated() == before + 1);
    // Every thread CAF started since belongs to that one system. An earlier
    // system's threads may still be ending since `kept` was read, so they can
    // only be fewer now, never new: each other name is at most as often here
    // as it was in `kept`.
    const std::vector<std::string> names = CafThreadNames();
    CHECK(std::count(names.begin(), names.end(), ours) > 0);
    for (const std::string& name : names) {
      if (name == ours) continue;
      INFO("a CAF thread that is neither ours nor an earlier system's: ", name);
      CHECK(std::count(names.begin(), names.end(), name) <= std::count(kept.begin(), kept.end(), name));
    }
    CHECK(a->Shutdown(kWait).ok());
    CHECK(b->Shutdown(kWait).ok());
  }
  // The last user is gone, and so is the system with its threads (a thread
  // may still be ending its last instructions after ~actor_system: bounded).
  const absl::Time deadline = absl::Now() + kWait;
  while (count_ours() != 0 && absl::Now() < deadline) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  CHECK(count_ours() == 0);
  auto c = MakeRuntime(nullptr, Config(&env));
  CHECK(ActorSystemsCreated() == before + 2);
  CHECK(c->Shutdown(kWait).ok());
}

// The messages that will cross a node go through CAF's serialisation intact,
// and a peer's bad bytes never become a tensor.
template <class T>
T RoundTrip(const T& in) {
  caf::actor_system_config cfg;
  internal::ConfigureActorSystemConfig(cfg);
  std::vector<char> buf;
  {
    caf::binary_serializer sink(static_cast<caf::execution_unit*>(nullptr), buf);
    T copy = in;
    REQUIRE_FALSE(sink(copy));
  }
  T out;
  caf::binary_deserializer source(static_cast<caf::execution_unit*>(nullptr), buf);
  REQUIRE_FALSE(source(out));
  return out;
}

TEST_CASE("typed messages: Status and tensors round-trip through CAF's serialisation; bad peers are refused") {
  internal::StatusMessage s = RoundTrip(internal::ToMessage(absl::AbortedError("ps 0 restarted")));
  CHECK(internal::FromMessage(s) == absl::AbortedError("ps 0 restarted"));
  CHECK(internal::FromMessage(internal::StatusMessage{99, "?"}).code() == absl::StatusCode::kUnknown);
  // Payloads (an injected fault's id, TF's NaN-loss mark) travel too.
  Status marked = NanLossDuringTrainingError("NaN loss");
  marked.SetPayload("foreman.InjectedFault", absl::Cord("nan-at-4"));
  const Status marked_back = internal::FromMessage(RoundTrip(internal::ToMessage(marked)));
  CHECK(marked_back == marked);
  CHECK(IsNanLossDuringTraining(marked_back));

  Tensor w(DataType::kFloat, TensorShape({2, 3}));
  for (int i = 0; i < 6; ++i) w.data<float>()[i] = 0.5f * static_cast<float>(i) - 1.f;
  internal::GradientsMessage g;
  g.step = 41;
  g.worker = 2;
  g.tensors.push_back(internal::ToMessage("dense/kernel", w).value());
  g.tensors.push_back(internal::ToMessage("global_step", Tensor::Scalar<int64_t>(7)).value());
  internal::GradientsMessage back = RoundTrip(g);
  CHECK(back.step == 41);
  CHECK(back.worker == 2);
  REQUIRE(back.tensors.size() == 2);
  CHECK(back.tensors[0].bytes.size() == 6 * sizeof(float));
  auto restored = internal::FromMessage(back.tensors[0]);
  REQUIRE(restored.ok());
  CHECK(restored->Equals(w));
  CHECK(internal::FromMessage(back.tensors[1])->scalar<int64_t>().value() == 7);

  CHECK(absl::IsInvalidArgument(internal::ToMessage("s", Tensor::Scalar<std::string>("x")).status()));
  internal::TensorMessage bad = g.tensors[0];
  bad.bytes.pop_back();
  CHECK(absl::IsInvalidArgument(internal::FromMessage(bad).status()));
  bad = g.tensors[0];
  bad.shape = {-1, 3};
  CHECK(absl::IsInvalidArgument(internal::FromMessage(bad).status()));
  bad.shape = {int64_t{1} << 40, int64_t{1} << 40};
  CHECK(absl::IsInvalidArgument(internal::FromMessage(bad).status()));
  bad = g.tensors[0];
  bad.dtype = 42;
  CHECK(absl::IsInvalidArgument(internal::FromMessage(bad).status()));
}

// TensorBytes (actors/tensor_bytes.hpp, issue 27 point 2): tensors cross a
// node with one copy on each side, shared otherwise.
TEST_CASE("TensorBytes: one apply_raw each way, copy-on-write, borrowed views returned, blocks adopted by tensors") {
  using internal::TensorBytes;
  using internal::TransportCopyCounters;
  Tensor w(DataType::kFloat, TensorShape({64, 16}));
  for (int64_t i = 0; i < w.num_elements(); ++i) w.data<float>()[i] = static_cast<float>(i) * 0.25f;
  const std::size_t n = w.TotalBytes();

  // Serialized from the bytes and deserialized into a fresh block: n bytes
  // each way, and no other copy.
  internal::TensorMessage m = internal::BorrowingMessage("w", w).value();
  CHECK(m.bytes.borrowed());
  CHECK(m.bytes.data() == w.raw_data());
  const TransportCopyCounters c0 = TransportCopyCounters::Snapshot();
  std::vector<char> buf;
  {
    caf::binary_serializer sink(static_cast<caf::execution_unit*>(nullptr), buf);
    REQUIRE_FALSE(sink(m));
  }
  internal::TensorMessage back;
  {
    caf::binary_deserializer source(static_cast<caf::execution_unit*>(nullptr), buf);
    REQUIRE_FALSE(source(back));
  }
  const TransportCopyCounters c1 = TransportCopyCounters::Snapshot();
  CHECK(c1.serialized - c0.serialized == n);
  CHECK(c1.deserialized - c0.deserialized == n);
  CHECK(c1.copied == c0.copied);
  CHECK(back.bytes == m.bytes);
  CHECK_FALSE(back.bytes.borrowed());
  CHECK(back.bytes.unique());

  // The received block becomes the tensor's buffer: no copy.
  const char* received = back.bytes.data();
  StatusOr<Tensor> t = internal::FromMessage(std::move(back));
  REQUIRE(t.ok());
  CHECK(t->raw_data() == received);
  CHECK(t->Equals(w));
  CHECK(TransportCopyCounters::Snapshot().copied == c0.copied);

  // A length beyond what the payload still holds is refused before any
  // allocation (a peer's 1 MiB claim in a 1 KiB message).
  std::vector<char> lie;
  {
    caf::binary_serializer sink(static_cast<caf::execution_unit*>(nullptr), lie);
    internal::TensorMessage small = internal::ToMessage("w", Tensor::Scalar<float>(1)).value();
    REQUIRE_FALSE(sink(small));
  }
  // The message is name, dtype, shape, then the bytes' length (a varint)
  // and the 4 bytes: make the length claim 2^20 instead.
  lie.resize(lie.size() - 5);
  for (uint8_t b : {0x80, 0x80, 0x40}) lie.push_back(static_cast<char>(b));
  lie.resize(lie.size() + 1024, 0);
  {
    internal::TensorMessage out;
    const uint64_t allocated = TransportCopyCounters::Snapshot().allocated;
    caf::binary_deserializer source(static_cast<caf::execution_unit*>(nullptr), lie);
    CHECK(source(out));  // an error
    CHECK(TransportCopyCounters::Snapshot().allocated == allocated);
  }

  // Copies share; a write to a shared buffer writes a private copy.
  TensorBytes a = TensorBytes::Copy(w.raw_data(), n);
  TensorBytes b = a;
  CHECK(b.data() == a.data());
  CHECK_FALSE(a.unique());
  b.mutable_data()[0] = 42;
  CHECK(b.data() != a.data());
  CHECK(a.unique());
  CHECK(std::memcmp(a.data(), w.raw_data(), n) == 0);
  char* own = a.mutable_data();  // unique: written in place
  CHECK(own == a.data());

  // A borrowed view: returned once every copy is gone; Detach copies it.
  {
    TensorBytes view = TensorBytes::Borrow(w.raw_data(), n);
    auto held = std::make_unique<TensorBytes>(view);
    CHECK_FALSE(view.WaitUntilReturned(std::chrono::milliseconds(2)));
    std::thread dropper([&held] {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
      held.reset();
    });
    CHECK(view.WaitUntilReturned(std::chrono::seconds(10)));
    dropper.join();
    TensorBytes kept = view;
    kept.Detach();
    CHECK(kept.data() != w.raw_data());
    CHECK(kept == view);
    CHECK(view.unique());
  }

  // A block shared with a tensor: the tensor's copy-on-write check, and a
  // shared block is copied (not taken) into a tensor.
  Tensor block = TensorBytes::BlockCopyOf(w);
  CHECK(TensorBytes::IsUniqueBlockTensor(block));
  TensorBytes share = TensorBytes::ShareBlockOf(block);
  CHECK(share.data() == block.raw_data());
  CHECK_FALSE(TensorBytes::IsUniqueBlockTensor(block));
  TensorBytes again = share;
  Tensor copied = again.TakeAsTensor(DataType::kFloat, w.shape());
  CHECK(copied.raw_data() != block.raw_data());
  CHECK(copied.Equals(w));
  share = TensorBytes();
  CHECK(TensorBytes::IsUniqueBlockTensor(block));
}

TEST_CASE("Runtime rejects a negative actor_threads") {
  MemEnv env;
  SessionConfig config = Config(&env);
  config.actor_threads = -1;
  auto runtime = Runtime::Create(nullptr, config);
  REQUIRE_FALSE(runtime.ok());
  CHECK(runtime.status().code() == absl::StatusCode::kInvalidArgument);
}

TEST_CASE("Runtime in a caller's actor system leaves no actor running after Shutdown") {
  TestSystem ts;
  MemEnv env;
  auto runtime = MakeRuntime(ts.sys.get(), Config(&env));
  REQUIRE(runtime->SummaryWriter("/logs").ok());
  REQUIRE(runtime->CheckpointSaver("/ckpt", MakeSaver(&env), "model.ckpt").ok());
  REQUIRE(runtime->StepCounter("/logs", "global_step/sec").ok());
  // supervisor, failure_sink, 2 writers (/logs, /ckpt), saver, counter.
  CHECK(ts.sys->registry().running() == 6);
  CHECK(runtime->Shutdown(kWait).ok());
  CHECK(ts.AllDone());
  runtime.reset();
  ts.sys.reset();  // Would hang if a handle had survived.
}

TEST_CASE("service objects held past Shutdown keep no actor alive and fail without blocking") {
  MemEnv env;
  std::shared_ptr<internal::SummaryWriterService> writer;
  std::shared_ptr<internal::CheckpointService> saver;
  std::shared_ptr<internal::StepCounterService> counter;
  {
    auto runtime = MakeRuntime(nullptr, Config(&env));
    writer = *runtime->SummaryWriter("/logs");
    saver = *runtime->CheckpointSaver("/ckpt", MakeSaver(&env), "model.ckpt");
    counter = *runtime->StepCounter("", "global_step/sec");
    CHECK(runtime->Shutdown(kWait).ok());
    // New services are refused once shut down.
    auto late = runtime->SummaryWriter("/other");
    CHECK(late.status().code() == absl::StatusCode::kFailedPrecondition);
  }  // The owned actor system is destroyed here, with the services still held.
  writer->AddSummary(ScalarSummary("x", 1), 1);  // Dropped.
  counter->Record(5, 1.0);                       // Dropped.
  CHECK(writer->Flush(kWait).code() == absl::StatusCode::kUnavailable);
  auto ticket = saver->StartSave(Snapshot(1, 1), 1);
  CHECK(ticket->Wait(kWait).code() == absl::StatusCode::kUnavailable);
}

// -- failures reach the coordinator -----------------------------------------------------

TEST_CASE("a failing summary_writer's Status reaches the coordinator; the first error sticks across sessions") {
  MemEnv env;
  auto runtime = MakeRuntime(nullptr, Config(&env));
  Coordinator coord(std::vector<absl::StatusCode>{});
  runtime->SetCoordinator(&coord);
  auto writer = *runtime->SummaryWriter("/logs");
  writer->AddSummary("\xff\xff not a Summary", 3);  // EventFileWriter: INVALID_ARGUMENT.
  REQUIRE(coord.wait_for_stop(kWait));
  CHECK(coord.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(runtime->error().code() == absl::StatusCode::kInvalidArgument);
  // Flush answers with the writer's first error.
  CHECK(writer->Flush(kWait).code() == absl::StatusCode::kInvalidArgument);

  // A later session's coordinator is stopped with it at once.
  runtime->SetCoordinator(nullptr);
  Coordinator next(std::vector<absl::StatusCode>{});
  runtime->SetCoordinator(&next);
  CHECK(next.should_stop());
  CHECK(next.status().code() == absl::StatusCode::kInvalidArgument);
  runtime->SetCoordinator(nullptr);
  // Shutdown returns the first service error.
  CHECK(runtime->Shutdown(kWait).code() == absl::StatusCode::kInvalidArgument);
}

TEST_CASE("a child that throws: its Status reaches the coordinator, its open tickets fail, CAF prints nothing") {
  MemEnv mem;
  GatedEnv env(&mem);
  CapturedStderr err;
  {
    auto runtime = MakeRuntime(nullptr, Config(&env));
    Coordinator coord(std::vector<absl::StatusCode>{});
    runtime->SetCoordinator(&coord);
    auto saver = *runtime->CheckpointSaver("/ckpt", MakeSaver(&env), "model.ckpt");
    env.Throw(".data-");  // Saver::Save throws inside the checkpoint_saver's handler.
    auto first = saver->StartSave(Snapshot(1, 1), 1);
    auto second = saver->StartSave(Snapshot(2, 2), 2);  // Queued behind it.
    Status s1 = first->Wait(kWait);
    Status s2 = second->Wait(kWait);
    CHECK(s1.code() == absl::StatusCode::kInternal);
    CHECK_MESSAGE(absl::StrContains(Msg(s1), "injected exception"), s1.ToString());
    CHECK(s2.code() == absl::StatusCode::kInternal);  // The actor's exit status, not a hang.
    REQUIRE(coord.wait_for_stop(kWait));
    CHECK(coord.status().code() == absl::StatusCode::kInternal);
    CHECK_MESSAGE(absl::StrContains(Msg(coord.status()), "checkpoint_saver(/ckpt)"), coord.status().ToString());
    runtime->SetCoordinator(nullptr);
    CHECK(runtime->Shutdown(kWait).code() == absl::StatusCode::kInternal);
  }
  const std::string printed = err.Restore();
  CHECK_MESSAGE(!absl::StrContains(printed, "***"), printed);
  CHECK_MESSAGE(!absl::StrContains(printed, "unhandled"), printed);
}

// Pure protocol: the supervisor and a child of the test's own making.
// An error with a payload (as an injected fault's id is carried).
Status BadBytes() {
  Status s = absl::DataLossError("bad bytes");
  s.SetPayload("test.Mark", absl::Cord("quitter"));
  return s;
}

TEST_CASE("session_supervisor: a child that exits with an error is reported; shutdown stops every child") {
  TestSystem ts;
  auto cell = std::make_shared<internal::FailureCell>();
  Coordinator coord(std::vector<absl::StatusCode>{});
  cell->SetCoordinator(&coord);
  {
    caf::actor supervisor = internal::SpawnSessionSupervisor(*ts.sys, cell);
    // Children take a (dummy) argument: CAF 0.17's spawn of a function with
    // none dereferences a null shared_ptr<tuple<>> (UBSan reports it).
    auto spawn = [&](std::string name, std::function<caf::behavior(caf::event_based_actor*, int)> fn) {
      auto reply = std::make_shared<internal::SpawnReply>();
      internal::ChildSpec spec{std::move(name), [fn](caf::local_actor* parent, const caf::actor&) {
                                 return parent->spawn(fn, 0);
                               }};
      caf::anon_send(supervisor, internal::spawn_atom::value, spec, reply);
      REQUIRE(reply->done->Wait(kWait, "spawn").ok());
      return reply->actor;
    };
    using fail_atom = caf::atom_constant<caf::atom("fail")>;
    caf::actor quitter = spawn("quitter", [](caf::event_based_actor* self, int) -> caf::behavior {
      return {[=](fail_atom) { self->quit(internal::StatusToError(BadBytes())); }};
    });
    caf::actor idle = spawn("idle", [](caf::event_based_actor*, int) -> caf::behavior {
      return {[](int) {}};
    });
    CHECK(ts.sys->registry().running() == 4);  // supervisor, failure_sink, quitter, idle
    caf::anon_send(quitter, fail_atom::value);
    REQUIRE(coord.wait_for_stop(kWait));
    // Code, message and payload crossed the exit reason and the report.
    CHECK(coord.status() == BadBytes());
    CHECK(cell->error() == BadBytes());
    CHECK(coord.status().GetPayload("test.Mark").has_value());
    // Ordered shutdown: the supervisor stops the rest and then itself.
    caf::anon_send_exit(supervisor, caf::exit_reason::user_shutdown);
    quitter = nullptr;
    idle = nullptr;
    supervisor = nullptr;
  }
  CHECK(ts.AllDone());
  cell->SetCoordinator(nullptr);
}

// A service's address is its ChildLink: a restarted incarnation is reached
// through the same link, and the old one's exit no longer counts.
TEST_CASE("ChildLink is a stable address: after Rebind, sends reach the new incarnation") {
  TestSystem ts;
  {
    // An actor that completes the Completion it is sent with its own tag.
    auto make = [&](std::string tag) {
      return ts.sys->spawn(
          [](caf::event_based_actor*, std::string name) -> caf::behavior {
            return {[name](const std::shared_ptr<internal::Completion>& c) {
              c->Complete(absl::InternalError(name));
            }};
          },
          std::move(tag));
    };
    auto link = std::make_shared<internal::ChildLink>("service");
    internal::ChildLink::Attach(link, make("first"));
    auto ask = [&] {
      auto c = std::make_shared<internal::Completion>();
      link->Track(c);
      if (!link->Send(c)) return Status(absl::UnavailableError("not sent"));
      return c->Wait(kWait, "answer");
    };
    CHECK(ask().message() == "first");
    caf::actor old = link->handle();
    caf::anon_send_exit(old, caf::exit_reason::kill);
    const absl::Time deadline = absl::Now() + kWait;
    while (link->alive() && absl::Now() < deadline) std::this_thread::yield();
    CHECK_FALSE(link->alive());
    internal::ChildLink::Rebind(link, make("second"));
    old = nullptr;
    CHECK(link->alive());
    CHECK(link->incarnation() == 2);
    CHECK(ask().message() == "second");
    link->SendExit(caf::exit_reason::user_shutdown);
    CHECK(link->WaitExited(kWait));
    link->Detach();
    caf::actor third = make("third");
    internal::ChildLink::Rebind(link, third);  // after Detach: ignored
    CHECK_FALSE(link->alive());
    caf::anon_send_exit(third, caf::exit_reason::kill);
  }
  CHECK(ts.AllDone());
}

// A restart can rebind the link before the old incarnation's exit is seen
// there (the supervisor's down_msg may come first); what the old one took
// and never answered must not wait forever.
TEST_CASE("ChildLink: Rebind completes the previous incarnation's unanswered requests with UNAVAILABLE") {
  TestSystem ts;
  {
    auto silent = [&] {
      return ts.sys->spawn([](caf::event_based_actor*, int) -> caf::behavior {
        return {[](const std::shared_ptr<internal::Completion>&) {}};
      }, 0);
    };
    auto link = std::make_shared<internal::ChildLink>("service");
    caf::actor first = silent();
    internal::ChildLink::Attach(link, first);
    auto c = std::make_shared<internal::Completion>();
    REQUIRE(link->Track(c));
    REQUIRE(link->Send(c));
    caf::actor second = silent();
    internal::ChildLink::Rebind(link, second);
    const Status s = c->Wait(kWait, "answer");
    CHECK(absl::IsUnavailable(s));
    CHECK(s.message() == "service restarted");
    CHECK(link->incarnation() == 2);
    caf::anon_send_exit(first, caf::exit_reason::kill);
    caf::anon_send_exit(second, caf::exit_reason::kill);
    CHECK(link->WaitExited(kWait));
    link->Detach();
  }
  CHECK(ts.AllDone());
}

TEST_CASE("session_supervisor: a child killed from outside is reported as INTERNAL naming it") {
  TestSystem ts;
  auto cell = std::make_shared<internal::FailureCell>();
  {
    caf::actor supervisor = internal::SpawnSessionSupervisor(*ts.sys, cell);
    auto reply = std::make_shared<internal::SpawnReply>();
    internal::ChildSpec spec{"victim", [](caf::local_actor* parent, const caf::actor&) {
                               return parent->spawn([](int) -> caf::behavior { return {[](int) {}}; }, 0);
                             }};
    caf::anon_send(supervisor, internal::spawn_atom::value, spec, reply);
    REQUIRE(reply->done->Wait(kWait, "spawn").ok());
    caf::anon_send_exit(reply->actor, caf::exit_reason::kill);
    reply->actor = nullptr;
    const absl::Time deadline = absl::Now() + kWait;
    while (cell->error().ok() && absl::Now() < deadline) std::this_thread::yield();
    CHECK(cell->error().code() == absl::StatusCode::kInternal);
    CHECK_MESSAGE(absl::StrContains(Msg(cell->error()), "victim stopped"), cell->error().ToString());
    caf::anon_send_exit(supervisor, caf::exit_reason::user_shutdown);
  }
  CHECK(ts.AllDone());
}

// -- summary_writer -------------------------------------------------------------------------

TEST_CASE("B151 summary_writer: one writer and one event file per logdir; events in order; Flush writes them") {
  MemEnv env;
  auto runtime = MakeRuntime(nullptr, Config(&env));
  auto a = *runtime->SummaryWriter("/logs");
  auto b = *runtime->SummaryWriter("/logs/");
  CHECK(a.get() == b.get());
  CHECK(a->logdir() == "/logs");
  a->AddSessionLog(SessionLogStatus::kStart, 7);
  a->AddSummary(ScalarSummary("loss", 0.5f), 7);
  b->AddSummary(ScalarSummary("loss", 0.25f), 8);
  REQUIRE(a->Flush(kWait).ok());
  std::vector<Event> events = ReadEvents(&env, "/logs");
  REQUIRE(events.size() == 4);
  CHECK(events[0].kind == Event::Kind::kFileVersion);
  CHECK(events[1].session_status == SessionLogStatus::kStart);
  CHECK(events[1].step == 7);
  CHECK(events[2].values.at(0).scalar == doctest::Approx(0.5));
  CHECK(events[3].step == 8);
  CHECK(events[3].values.at(0).scalar == doctest::Approx(0.25));
  CHECK(runtime->Shutdown(kWait).ok());
  CHECK(ListEventFiles(&env, "/logs")->size() == 1);
}

TEST_CASE("summary_writer: Shutdown flushes and closes; an event file that cannot be created is an error at once") {
  MemEnv mem;
  GatedEnv env(&mem);
  auto runtime = MakeRuntime(nullptr, Config(&env));
  auto writer = *runtime->SummaryWriter("/logs");
  for (int i = 0; i < 3; ++i) writer->AddSummary(ScalarSummary("x", static_cast<float>(i)), i);
  env.Fail("tfevents", absl::PermissionDeniedError("no events for you"));
  auto other = runtime->SummaryWriter("/other");
  CHECK(other.status().code() == absl::StatusCode::kPermissionDenied);
  CHECK(runtime->Shutdown(kWait).ok());
  std::vector<Event> events = ReadEvents(&mem, "/logs");
  CHECK(events.size() == 4);  // file_version + 3, written by the close.
}

TEST_CASE("summary_writer: events from several threads, in batches, keep each sender's order; Flush sees them all") {
  MemEnv env;
  auto runtime = MakeRuntime(nullptr, Config(&env));
  auto writer = *runtime->SummaryWriter("/logs");
  constexpr int kThreads = 3;
  constexpr int kEach = 3000;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&writer, t] {
      const std::string tag = absl::StrCat("t", t);
      for (int i = 1; i <= kEach; ++i) {
        writer->AddSummary(ScalarSummary(tag, static_cast<float>(i)), i);
        // A session log now and then, in line with the summaries.
        if (i % 1000 == 0) writer->AddSessionLog(SessionLogStatus::kCheckpoint, i, absl::StrCat("/ckpt/", tag));
      }
    });
  }
  for (auto& th : threads) th.join();
  REQUIRE(writer->Flush(kWait).ok());
  std::vector<Event> events = ReadEvents(&env, "/logs");
  REQUIRE(events.size() == 1 + kThreads * (kEach + kEach / 1000));
  std::map<std::string, int64_t> last;  // per thread: the step of its last event
  for (std::size_t i = 1; i < events.size(); ++i) {
    const Event& e = events[i];
    const std::string sender =
        e.kind == Event::Kind::kSessionLog ? e.checkpoint_path.substr(std::string("/ckpt/").size()) : e.values.at(0).tag;
    int64_t& prev = last[sender];
    if (e.kind == Event::Kind::kSessionLog) {
      CHECK(e.step == prev);  // right after the summary of its step
    } else {
      CHECK(e.step == prev + 1);
      CHECK(e.values.at(0).scalar == static_cast<double>(e.step));
      prev = e.step;
    }
  }
  CHECK(last.size() == kThreads);
  for (const auto& [sender, step] : last) CHECK(step == kEach);
  CHECK(runtime->Shutdown(kWait).ok());
}

// -- checkpoint_saver -----------------------------------------------------------------------

TEST_CASE("B106 checkpoint_saver: saves off the caller's thread; CHECKPOINT event without the step suffix") {
  MemEnv env;
  auto runtime = MakeRuntime(nullptr, Config(&env));
  auto saver_obj = MakeSaver(&env);
  auto saver = *runtime->CheckpointSaver("/ckpt", saver_obj, "model.ckpt");
  CHECK(saver->directory() == "/ckpt");
  CHECK(saver->saver() == saver_obj);
  // The same directory again: the same actor; with another saver: refused.
  CHECK(runtime->CheckpointSaver("/ckpt", saver_obj, "model.ckpt")->get() == saver.get());
  CHECK(runtime->CheckpointSaver("/ckpt", MakeSaver(&env), "model.ckpt").status().code() ==
        absl::StatusCode::kFailedPrecondition);

  auto t0 = saver->StartSave(Snapshot(0, 1), 0);
  auto t5 = saver->StartSave(Snapshot(5, 2), 5);
  REQUIRE(t0->Wait(kWait).ok());
  REQUIRE(t5->Wait(kWait).ok());
  CHECK(t5->prefix == "/ckpt/model.ckpt-5");
  CHECK(*ListCheckpointPrefixes(&env, "/ckpt") == std::vector<std::string>{"/ckpt/model.ckpt-0", "/ckpt/model.ckpt-5"});
  auto state = ReadCheckpointState(&env, "/ckpt");
  REQUIRE(state.ok());
  REQUIRE(state->has_value());
  CHECK(ResolveCheckpointPath("/ckpt", (*state)->model_checkpoint_path) == "/ckpt/model.ckpt-5");
  CHECK(runtime->WaitForPendingSaves(kWait).ok());

  // The directory is locked while the saver lives.
  CHECK(LockCheckpointDirectory(&env, "/ckpt").status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK(runtime->Shutdown(kWait).ok());
  CHECK(LockCheckpointDirectory(&env, "/ckpt").ok());

  std::vector<Event> events = ReadEvents(&env, "/ckpt");
  std::vector<int64_t> steps;
  for (const Event& e : events) {
    if (e.kind != Event::Kind::kSessionLog) continue;
    CHECK(e.session_status == SessionLogStatus::kCheckpoint);
    CHECK(e.checkpoint_path == "/ckpt/model.ckpt");
    steps.push_back(e.step);
  }
  CHECK(steps == std::vector<int64_t>{0, 5});
}

TEST_CASE("checkpoint_saver: the snapshot's buffers come back with the completed ticket, not before") {
  MemEnv mem;
  GatedEnv env(&mem);
  auto runtime = MakeRuntime(nullptr, Config(&env));
  auto saver = *runtime->CheckpointSaver("/ckpt", MakeSaver(&env), "model.ckpt");
  std::map<std::string, Tensor> snapshot = Snapshot(7, 2.5f);
  const char* w_bytes = snapshot.at("w").raw_data();
  const char* step_bytes = snapshot.at("global_step").raw_data();
  env.Hold(".data-");
  auto ticket = saver->StartSave(std::move(snapshot), 7);
  REQUIRE(env.WaitUntilHeld(1, kWait));
  // In flight: the actor still owns them.
  CHECK_FALSE(ticket->IsDone());
  CHECK(ticket->TakeBuffers().empty());
  env.Release();
  REQUIRE(ticket->Wait(kWait).ok());
  std::map<std::string, Tensor> back = ticket->TakeBuffers();
  REQUIRE(back.size() == 2);
  CHECK(back.at("w").raw_data() == w_bytes);  // the same allocations, not copies
  CHECK(back.at("global_step").raw_data() == step_bytes);
  CHECK(*back.at("w").scalar<float>() == 2.5f);
  CHECK(ticket->TakeBuffers().empty());  // handed out once

  // A failed save hands them back too.
  env.Fail(".data-", absl::ResourceExhaustedError("disk full"));
  std::map<std::string, Tensor> again = std::move(back);
  const char* again_bytes = again.at("w").raw_data();
  auto failed = saver->StartSave(std::move(again), 8);
  CHECK(failed->Wait(kWait).code() == absl::StatusCode::kResourceExhausted);
  CHECK(failed->TakeBuffers().at("w").raw_data() == again_bytes);
  runtime->Shutdown(kWait).IgnoreError();
}

TEST_CASE("checkpoint_saver: another owner of the directory's lock is FAILED_PRECONDITION at creation") {
  MemEnv env;
  auto lock = LockCheckpointDirectory(&env, "/ckpt");
  REQUIRE(lock.ok());
  auto runtime = MakeRuntime(nullptr, Config(&env));
  auto saver = runtime->CheckpointSaver("/ckpt", MakeSaver(&env), "model.ckpt");
  CHECK(saver.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK(runtime->Shutdown(kWait).ok());
}

TEST_CASE("checkpoint_saver: a failed save completes its ticket with the error and reaches the coordinator") {
  MemEnv mem;
  GatedEnv env(&mem);
  auto runtime = MakeRuntime(nullptr, Config(&env));
  Coordinator coord(std::vector<absl::StatusCode>{});
  runtime->SetCoordinator(&coord);
  auto saver = *runtime->CheckpointSaver("/ckpt", MakeSaver(&env), "model.ckpt");
  env.Fail(".data-", absl::ResourceExhaustedError("disk full"));
  auto ticket = saver->StartSave(Snapshot(3, 1), 3);
  Status s = ticket->Wait(kWait);
  CHECK(s.code() == absl::StatusCode::kResourceExhausted);
  CHECK_MESSAGE(absl::StrContains(Msg(s), "step 3"), s.ToString());
  REQUIRE(coord.wait_for_stop(kWait));
  CHECK(coord.status().code() == absl::StatusCode::kResourceExhausted);
  runtime->SetCoordinator(nullptr);
  CHECK(runtime->Shutdown(kWait).code() == absl::StatusCode::kResourceExhausted);
  // No CHECKPOINT event for a save that failed.
  for (const Event& e : ReadEvents(&mem, "/ckpt")) CHECK(e.kind != Event::Kind::kSessionLog);
}

// -- restart policies: requests across a service's restart --------------------------------

std::unique_ptr<Runtime> MakeRuntime(const RestartPolicy& policy, const SessionConfig& config) {
  RuntimeOptions options;
  options.restart = policy;
  auto runtime = Runtime::Create(options, config);
  REQUIRE_MESSAGE(runtime.ok(), runtime.status().ToString());
  return *std::move(runtime);
}

// Polls (real time, bounded) until `pred` holds.
bool Within(absl::Duration timeout, const std::function<bool()>& pred) {
  const absl::Time deadline = absl::Now() + timeout;
  while (!pred()) {
    if (absl::Now() > deadline) return false;
    std::this_thread::yield();
  }
  return true;
}

// At most 3 restarts in 60 s, each after `backoff` (times the jitter).
RestartPolicy BackingOff(absl::Duration backoff) {
  RestartPolicy policy;
  policy.max_restarts = 3;
  policy.period = absl::Seconds(60);
  policy.initial_backoff = backoff;
  policy.max_backoff = backoff;
  return policy;
}

// The runtime's checkpoint saver in /ckpt of `env`, and its handle.
std::pair<std::shared_ptr<internal::CheckpointService>, std::shared_ptr<internal::CheckpointHandle>> BackedOffSaver(
    Runtime& runtime, MemEnv* env) {
  auto service = *runtime.CheckpointSaver("/ckpt", MakeSaver(env), "model.ckpt");
  auto handle = std::dynamic_pointer_cast<internal::CheckpointHandle>(service);
  REQUIRE(handle != nullptr);
  return {service, handle};
}

TEST_CASE("restart policy: a save started while the checkpoint_saver is down (its back-off) is parked and lands "
          "on the restarted incarnation") {
  MemEnv env;
  // Back-off: 2 s times a jitter in [0.5, 1.5): the saver stays down >= 1 s.
  RestartPolicy policy = BackingOff(absl::Seconds(2));
  policy.services["checkpoint_saver"] = RestartType::kPermanent;
  auto runtime = MakeRuntime(policy, Config(&env));
  auto [service, handle] = BackedOffSaver(*runtime, &env);
  REQUIRE(service->StartSave(Snapshot(1, 1), 1)->Wait(kWait).ok());
  REQUIRE(runtime->service_faults()->Kill("checkpoint_saver", "kill", /*normal_exit=*/false, /*applied=*/nullptr) == 1);
  REQUIRE(Within(kWait, [&] { return !handle->link()->alive(); }));
  auto ticket = service->StartSave(Snapshot(5, 2), 5);
  // Parked, not failed at once (before: "... stopped: injected actor fault").
  CHECK_FALSE(ticket->IsDone());
  Status s = ticket->Wait(kWait);
  CHECK_MESSAGE(s.ok(), s.ToString());
  CHECK(ticket->prefix == "/ckpt/model.ckpt-5");
  CHECK(handle->link()->incarnation() == 2);
  REQUIRE(Within(kWait, [&] { return runtime->restarts().size() == 1; }));
  const ServiceRestart r = runtime->restarts()[0];
  CHECK(r.restarted);
  CHECK(r.backoff >= absl::Seconds(1));
  CHECK(r.saves_lost.empty());  // nothing was in flight at the kill
  CHECK(*ListCheckpointPrefixes(&env, "/ckpt") == std::vector<std::string>{"/ckpt/model.ckpt-1", "/ckpt/model.ckpt-5"});
  CHECK(runtime->error().ok());
  CHECK(runtime->Shutdown(kWait).ok());
}

TEST_CASE("restart policy: a kill's applied completion completes once a restart is scheduled, not after its "
          "back-off") {
  MemEnv env;
  // Back-off: 60 s times a jitter in [0.5, 1.5), capped at 60 s: >= 30 s.
  RestartPolicy policy = BackingOff(absl::Seconds(60));
  policy.type = RestartType::kPermanent;
  auto runtime = MakeRuntime(policy, Config(&env));
  auto [service, handle] = BackedOffSaver(*runtime, &env);
  std::vector<std::shared_ptr<internal::Completion>> applied;
  REQUIRE(runtime->service_faults()->Kill("checkpoint_saver", "kill", /*normal_exit=*/false, &applied) == 1);
  REQUIRE(applied.size() == 1);
  // FaultInjectionHook waits 5 s for this; the restart itself is >= 30 s away.
  CHECK(applied[0]->Wait(absl::Seconds(5), "").ok());
  CHECK(applied[0]->IsDone());
  CHECK_FALSE(handle->link()->alive());
  CHECK(handle->link()->incarnation() == 1);  // not restarted yet
  CHECK(runtime->restarts().empty());
  CHECK(runtime->error().ok());
  (void)runtime->Shutdown(kWait);  // drops the pending restart
}

TEST_CASE("restart policy: a save for a removed (temporary) checkpoint_saver fails at once, FAILED_PRECONDITION "
          "naming it and carrying the kill's fault id") {
  MemEnv env;
  RestartPolicy policy = BackingOff(absl::Seconds(1));
  policy.services["checkpoint_saver"] = RestartType::kTemporary;
  auto runtime = MakeRuntime(policy, Config(&env));
  auto service = *runtime->CheckpointSaver("/ckpt", MakeSaver(&env), "model.ckpt");
  REQUIRE(runtime->service_faults()->Kill("checkpoint_saver", "kill", /*normal_exit=*/false, /*applied=*/nullptr) == 1);
  REQUIRE(Within(kWait, [&] { return runtime->restarts().size() == 1; }));
  CHECK_FALSE(runtime->restarts()[0].restarted);
  auto ticket = service->StartSave(Snapshot(5, 2), 5);
  REQUIRE(ticket->IsDone());
  const Status s = ticket->Wait(absl::ZeroDuration());
  // Not UNAVAILABLE: a preemption code would make a MonitoredSession
  // recover again and again from a save nothing will take.
  CHECK(s.code() == absl::StatusCode::kFailedPrecondition);
  CHECK_MESSAGE(absl::StrContains(Msg(s), "checkpoint_saver(/ckpt) is not running: removed by the session's "
                                          "restart policy after INTERNAL: injected actor fault kill"),
                s.ToString());
  CHECK(InjectedFaultId(s) == "kill");
  CHECK(runtime->Shutdown(kWait).code() == absl::StatusCode::kFailedPrecondition);  // that save failed
}

TEST_CASE("restart policy: a save for a checkpoint_saver removed after a normal exit (transient) carries the "
          "kill's fault id") {
  MemEnv env;
  RestartPolicy policy;
  policy.type = RestartType::kTransient;
  policy.max_restarts = 3;
  policy.period = absl::Seconds(60);
  auto runtime = MakeRuntime(policy, Config(&env));
  auto service = *runtime->CheckpointSaver("/ckpt", MakeSaver(&env), "model.ckpt");
  REQUIRE(runtime->service_faults()->Kill("checkpoint_saver", "bye", /*normal_exit=*/true, /*applied=*/nullptr) == 1);
  REQUIRE(Within(kWait, [&] { return runtime->restarts().size() == 1; }));
  CHECK_FALSE(runtime->restarts()[0].restarted);
  auto ticket = service->StartSave(Snapshot(5, 2), 5);
  REQUIRE(Within(kWait, [&] { return ticket->IsDone(); }));
  const Status s = ticket->Wait(absl::ZeroDuration());
  CHECK(s.code() == absl::StatusCode::kFailedPrecondition);
  CHECK_MESSAGE(absl::StrContains(Msg(s), "removed by the session's restart policy after a normal exit"), s.ToString());
  CHECK(InjectedFaultId(s) == "bye");
  CHECK(runtime->Shutdown(kWait).code() == absl::StatusCode::kFailedPrecondition);
}

TEST_CASE("TF's default policy: a summary_writer killed with a normal exit fails its Flush FAILED_PRECONDITION "
          "\"not running\", carrying the kill's fault id") {
  MemEnv env;
  auto runtime = MakeRuntime(nullptr, Config(&env));
  auto writer = *runtime->SummaryWriter("/logs");
  std::vector<std::shared_ptr<internal::Completion>> applied;
  REQUIRE(runtime->service_faults()->Kill("summary_writer", "quiet", /*normal_exit=*/true, &applied) == 1);
  for (const auto& done : applied) CHECK(done->Wait(kWait, "").ok());
  const Status s = writer->Flush(kWait);
  CHECK(s.code() == absl::StatusCode::kFailedPrecondition);
  CHECK_MESSAGE(absl::StrContains(Msg(s), "summary_writer(/logs) is not running"), s.ToString());
  CHECK(InjectedFaultId(s) == "quiet");
  CHECK(runtime->error().ok());  // a normal exit is not the run's failure
  (void)runtime->Shutdown(kWait);
}

// The event file's first event append (its file_version record is append
// 1) fails once with EIO: the writer meets it at the flush.
EnvFault FirstEventEio() {
  EnvFault f;
  f.id = "eio";
  f.path_pattern = "*events.out.tfevents*";
  f.op = EnvOp::kAppend;
  f.error = EIO;
  f.nth = 2;
  return f;
}

TEST_CASE("restart policy: a Flush that meets the write error ending the summary writer's incarnation succeeds on "
          "the restarted one; Close too") {
  MemEnv mem;
  FaultyEnv env(&mem, 1);
  REQUIRE(env.AddFault(FirstEventEio()).ok());
  RestartPolicy policy;
  policy.services["summary_writer"] = RestartType::kPermanent;
  policy.max_restarts = 3;
  policy.period = absl::Seconds(60);
  auto runtime = MakeRuntime(policy, Config(&env));
  auto writer = *runtime->SummaryWriter("/logs");
  writer->AddSummary(ScalarSummary("loss", 1.0f), 1);
  Status flushed = writer->Flush(kWait);  // before: INTERNAL ... Input/output error
  CHECK_MESSAGE(flushed.ok(), flushed.ToString());
  CHECK(env.fired().size() == 1);
  REQUIRE(Within(kWait, [&] { return runtime->restarts().size() == 1; }));
  CHECK(runtime->restarts()[0].restarted);
  writer->AddSummary(ScalarSummary("loss", 2.0f), 2);
  CHECK(writer->Flush(kWait).ok());
  CHECK(ListEventFiles(&mem, "/logs")->size() == 2);
  CHECK(runtime->error().ok());
  CHECK(runtime->Shutdown(kWait).ok());
}

TEST_CASE("restart policy: a Flush that meets the write error returns it when the writer is not restarted "
          "(intensity 0: escalated)") {
  MemEnv mem;
  FaultyEnv env(&mem, 1);
  REQUIRE(env.AddFault(FirstEventEio()).ok());
  RestartPolicy policy;
  policy.services["summary_writer"] = RestartType::kPermanent;
  policy.max_restarts = 0;  // every failure escalates
  auto runtime = MakeRuntime(policy, Config(&env));
  auto writer = *runtime->SummaryWriter("/logs");
  writer->AddSummary(ScalarSummary("loss", 1.0f), 1);
  const Status flushed = writer->Flush(kWait);
  CHECK_FALSE(flushed.ok());
  CHECK_MESSAGE(absl::StrContains(Msg(flushed), "Input/output error (injected fault eio)"), flushed.ToString());
  CHECK(runtime->restarts().empty());
  CHECK_FALSE(runtime->Shutdown(kWait).ok());
}

TEST_CASE("WaitForPendingSaves and Shutdown are bounded while a save hangs, and finish once it completes") {
  TestSystem ts;
  MemEnv mem;
  GatedEnv env(&mem);
  {
    auto runtime = MakeRuntime(ts.sys.get(), Config(&env));
    auto saver = *runtime->CheckpointSaver("/ckpt", MakeSaver(&env), "model.ckpt");
    env.Hold(".data-");
    auto ticket = saver->StartSave(Snapshot(4, 1), 4);
    REQUIRE(env.WaitUntilHeld(1, kWait));
    CHECK_FALSE(ticket->IsDone());
    Status wait = runtime->WaitForPendingSaves(absl::Milliseconds(50));
    CHECK(wait.code() == absl::StatusCode::kDeadlineExceeded);
    CHECK_MESSAGE(absl::StrContains(Msg(wait), "step 4"), wait.ToString());
    Status down = runtime->Shutdown(absl::Milliseconds(100));
    CHECK(down.code() == absl::StatusCode::kDeadlineExceeded);
    CHECK_MESSAGE(absl::StrContains(Msg(down), "checkpoint_saver(/ckpt)"), down.ToString());
    env.Release();
    CHECK(ticket->Wait(kWait).ok());
  }
  CHECK(ts.AllDone());  // The saver finished its save and then stopped.
  CHECK(*ListCheckpointPrefixes(&mem, "/ckpt") == std::vector<std::string>{"/ckpt/model.ckpt-4"});
}

TEST_CASE("Shutdown waits for a pending save before closing the event files (its CHECKPOINT event is written)") {
  MemEnv mem;
  GatedEnv env(&mem);
  auto runtime = MakeRuntime(nullptr, Config(&env));
  auto saver = *runtime->CheckpointSaver("/ckpt", MakeSaver(&env), "model.ckpt");
  env.Hold(".data-");
  auto ticket = saver->StartSave(Snapshot(9, 1), 9);
  REQUIRE(env.WaitUntilHeld(1, kWait));
  std::thread releaser([&] { env.Release(); });
  CHECK(runtime->Shutdown(kWait).ok());
  releaser.join();
  CHECK(ticket->IsDone());
  bool found = false;
  for (const Event& e : ReadEvents(&mem, "/ckpt")) {
    if (e.kind == Event::Kind::kSessionLog && e.step == 9) found = true;
  }
  CHECK(found);
}

// -- step_counter ---------------------------------------------------------------------------------

TEST_CASE("B110 step_counter: logs 'global_step/sec: <v>' and writes the summary at the step") {
  MemEnv env;
  CapturedLog log;
  {
    auto runtime = MakeRuntime(nullptr, Config(&env));
    auto counter = *runtime->StepCounter("/logs", "global_step/sec");
    auto log_only = *runtime->StepCounter("", "global_step/sec");
    counter->Record(101, 12.5);
    log_only->Record(7, 3.0);
    CHECK(runtime->Shutdown(kWait).ok());
  }
  const std::string text = log.text();
  CHECK_MESSAGE(absl::StrContains(text, "global_step/sec: 12.5"), text);
  CHECK_MESSAGE(absl::StrContains(text, "global_step/sec: 3"), text);
  std::vector<Event> events = ReadEvents(&env, "/logs");
  REQUIRE(events.size() == 2);
  CHECK(events[1].step == 101);
  REQUIRE(events[1].values.size() == 1);
  CHECK(events[1].values[0].tag == "global_step/sec");
  CHECK(events[1].values[0].kind == SummaryValue::Kind::kScalar);
  CHECK(events[1].values[0].scalar == doctest::Approx(12.5));
}

}  // namespace
}  // namespace foreman
