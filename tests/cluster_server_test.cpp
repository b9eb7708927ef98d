// foreman::Server and its RemoteValues over the ps shards
// (actors/cluster_server.hpp): Create's errors, the tcp:// / tls:// targets,
// Bind / Write / Read / ReadConsistent / Apply against real ps Servers in
// this process (each Server has its own actor system: BASP over 127.0.0.1),
// the end of training, and a ps task that goes away. Every wait is bounded.
#include "actors/cluster_server.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include <caf/all.hpp>
#include <doctest/doctest.h>

#define EIGEN_USE_THREADS
#include <unsupported/Eigen/CXX11/Tensor>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "actors/actor_system.hpp"
#include "actors/atoms.hpp"
#include "actors/cluster_net.hpp"
#include "actors/messages.hpp"
#include "compute/cpu_device.hpp"
#include "foreman/cluster_status.hpp"
#include "foreman/nn.hpp"
#include "foreman/server.hpp"
#include "foreman/stop.hpp"
#include "foreman/summary.hpp"
#include "runtime/session_target.hpp"
#include "cluster/worker_step_rates.hpp"
#include "support/test_util.hpp"

namespace foreman {
namespace {

// The chief's init op (a restore is WriteKind::kRestore).
constexpr internal::RemoteValues::WriteKind kInit = internal::RemoteValues::WriteKind::kInit;

using internal::RemoteValues;
using internal::ServerRemoteValues;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

using foreman::testing::ScaledMs;

// Every real-time setting and bound below is scaled by TimeScale()
// (tests/support/test_util.hpp: 3x under the sanitizers, times
// $FOREMAN_TEST_TIME_SCALE on a loaded machine).
const int64_t kRequestTimeoutMs = ScaledMs(1500);
const int64_t kConnectionTimeoutMs = ScaledMs(200);

// `n` distinct free ports on 127.0.0.1 (bound together, then released: as
// cluster_net_test's publish on port 0, but ClusterSpec takes no port 0).
std::vector<int> FreePorts(int n) {
  std::vector<int> fds, ports;
  for (int i = 0; i < n; ++i) {
    int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    REQUIRE(fd >= 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
    socklen_t len = sizeof a;
    REQUIRE(::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0);
    fds.push_back(fd);
    ports.push_back(ntohs(a.sin_port));
  }
  for (int fd : fds) ::close(fd);
  return ports;
}

// A listening socket on 127.0.0.1 (a port that is taken); its port.
struct Listener {
  int fd = -1;
  int port = 0;
  Listener() {
    fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    REQUIRE(fd >= 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
    REQUIRE(::listen(fd, 8) == 0);
    socklen_t len = sizeof a;
    REQUIRE(::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0);
    port = ntohs(a.sin_port);
  }
  ~Listener() { ::close(fd); }
};

// True when something accepts TCP connections on 127.0.0.1:port.
bool Listening(int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  REQUIRE(fd >= 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<uint16_t>(port));
  const bool ok = ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
  ::close(fd);
  return ok;
}

std::string Hosts(const std::vector<int>& ports) {
  std::vector<std::string> out;
  for (int p : ports) out.push_back(absl::StrCat("127.0.0.1:", p));
  return absl::StrJoin(out, ",");
}

ServerOptions Options(nn::OptimizerKind kind = nn::OptimizerKind::kMomentum) {
  ServerOptions o;
  o.cluster.heartbeat_ms = 50;
  o.cluster.connection_timeout_ms = kConnectionTimeoutMs;
  o.optimizer.kind = kind;
  o.request_timeout_ms = kRequestTimeoutMs;
  return o;
}

// A cluster of `ps` ps tasks and `workers` workers on free loopback ports,
// with every Server of `start` created.
struct Cluster {
  std::vector<int> ps_ports, worker_ports;
  std::optional<ClusterSpec> spec;
  std::vector<std::unique_ptr<Server>> ps, workers;
  Cluster(int n_ps, int n_workers, const ServerOptions& options = Options(), bool start = true) {
    std::vector<int> ports = FreePorts(n_ps + n_workers);
    ps_ports.assign(ports.begin(), ports.begin() + n_ps);
    worker_ports.assign(ports.begin() + n_ps, ports.end());
    StatusOr<ClusterSpec> s = ClusterSpec::FromFlags(Hosts(ps_ports), Hosts(worker_ports));
    REQUIRE_MESSAGE(s.ok(), s.status().ToString());
    spec = *s;
    if (!start) return;
    for (int k = 0; k < n_ps; ++k) ps.push_back(Start({"ps", k}, options));
    for (int k = 0; k < n_workers; ++k) workers.push_back(Start({"worker", k}, options));
  }
  std::unique_ptr<Server> Start(const ClusterTask& task, const ServerOptions& options) {
    StatusOr<std::unique_ptr<Server>> s = Server::Create(*spec, task, options);
    REQUIRE_MESSAGE(s.ok(), s.status().ToString());
    return *std::move(s);
  }
  std::shared_ptr<RemoteValues> Remote(int worker = 0) {
    std::shared_ptr<RemoteValues> rv = ServerRemoteValues(*workers[worker]);
    REQUIRE(rv != nullptr);
    return rv;
  }
};

Tensor Floats(std::vector<int64_t> shape, float seed) {
  Tensor t(DataType::kFloat, TensorShape(shape));
  for (int64_t i = 0; i < t.num_elements(); ++i) t.data<float>()[i] = seed + 0.37f * static_cast<float>(i * i % 11);
  return t;
}

// TF1's names in creation order: global_step first, two dense layers, their
// Momentum slots.
const std::vector<std::string> kNames = {"global_step",        "dense/kernel",          "dense/bias",
                                         "dense_1/kernel",     "dense_1/bias",          "dense/kernel/Momentum",
                                         "dense/bias/Momentum", "dense_1/kernel/Momentum", "dense_1/bias/Momentum"};

void Fill(VariableStore& vars, int64_t step) {
  REQUIRE_OK(vars.Create("global_step", Tensor::Scalar<int64_t>(step), false));
  REQUIRE_OK(vars.Create("dense/kernel", Floats({3, 4}, 0.5f)));
  REQUIRE_OK(vars.Create("dense/bias", Floats({4}, -0.25f)));
  REQUIRE_OK(vars.Create("dense_1/kernel", Floats({4, 2}, 1.5f)));
  REQUIRE_OK(vars.Create("dense_1/bias", Floats({2}, 0.125f)));
  for (const char* v : {"dense/kernel", "dense/bias", "dense_1/kernel", "dense_1/bias"}) {
    const Tensor* t = vars.Get(v).value();
    REQUIRE_OK(vars.Create(absl::StrCat(v, "/Momentum"), Floats(t->shape().dims(), 0.01f), false));
  }
}

// Every variable of `a` is in `b`, bitwise equal.
void CheckSame(const VariableStore& a, const VariableStore& b, const std::vector<std::string>& names) {
  for (const std::string& name : names) {
    StatusOr<const Tensor*> x = a.Get(name);
    StatusOr<const Tensor*> y = b.Get(name);
    REQUIRE_MESSAGE(x.ok(), name);
    REQUIRE_MESSAGE(y.ok(), name);
    REQUIRE_MESSAGE((*x)->TotalBytes() == (*y)->TotalBytes(), name);
    CHECK_MESSAGE(((*x)->dtype() == (*y)->dtype() && (*x)->shape() == (*y)->shape() &&
                   std::memcmp((*x)->raw_data(), (*y)->raw_data(), (*x)->TotalBytes()) == 0),
                  name);
  }
}

nn::Gradients Grads(float lr, float seed) {
  nn::Gradients g;
  g.learning_rate = lr;
  // Sorted by name, as Mlp::ComputeGradients gives them.
  g.grads_and_vars.push_back({"dense/bias", Floats({4}, seed)});
  g.grads_and_vars.push_back({"dense/kernel", Floats({3, 4}, seed * 2)});
  g.grads_and_vars.push_back({"dense_1/bias", Floats({2}, -seed)});
  g.grads_and_vars.push_back({"dense_1/kernel", Floats({4, 2}, seed / 3)});
  return g;
}

// A client node talking to a Server's published actor directly.
struct Client {
  caf::actor_system_config cfg;
  std::unique_ptr<caf::actor_system> sys;
  Client() {
    cfg.set("scheduler.max-threads", size_t{1});
    internal::NetConfig net;
    net.heartbeat_ms = 50;
    net.connection_timeout_ms = kConnectionTimeoutMs;
    internal::ConfigureClusterNetwork(cfg, net);
    sys = std::make_unique<caf::actor_system>(cfg);
  }
  caf::actor Connect(int port) {
    StatusOr<caf::actor> a = internal::ConnectActor(*sys, "127.0.0.1", static_cast<uint16_t>(port), false,
                                                    milliseconds(ScaledMs(2000)));
    REQUIRE_MESSAGE(a.ok(), a.status().ToString());
    return *a;
  }
  internal::PsShardStatsMessage Stats(const caf::actor& shard) {
    caf::scoped_actor self{*sys};
    internal::PsShardStatsMessage out;
    bool ok = false;
    self->request(shard, milliseconds(ScaledMs(5000)), internal::ps_stats_atom::value)
        .receive([&](internal::PsShardStatsMessage& s) { out = s, ok = true; }, [](caf::error&) {});
    REQUIRE(ok);
    return out;
  }
};

TEST_CASE("Server::Create refuses a bad task, bad options and a missing TLS file before listening") {
  Cluster c(1, 1, Options(), /*start=*/false);
  StatusOr<std::unique_ptr<Server>> bad_task = Server::Create(*c.spec, {"worker", 5}, Options());
  CHECK(bad_task.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK_MESSAGE(absl::StrContains(bad_task.status().message(), "--task-index 5"), bad_task.status());

  ServerOptions no_timeout = Options();
  no_timeout.request_timeout_ms = 0;
  StatusOr<std::unique_ptr<Server>> bad = Server::Create(*c.spec, {"worker", 0}, no_timeout);
  CHECK(bad.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK_MESSAGE(absl::StrContains(bad.status().message(), "request_timeout_ms"), bad.status());

  ServerOptions bad_optimizer = Options();
  bad_optimizer.optimizer.momentum = -1;
  CHECK(Server::Create(*c.spec, {"ps", 0}, bad_optimizer).status().code() == absl::StatusCode::kInvalidArgument);

  const std::string missing = (std::filesystem::temp_directory_path() / "foreman_no_such_dir" / "node.pem").string();
  ServerOptions tls = Options();
  tls.cluster.tls_cert = missing;
  tls.cluster.tls_key = missing + ".key";
  tls.cluster.tls_ca = missing + ".ca";
  StatusOr<std::unique_ptr<Server>> no_file = Server::Create(*c.spec, {"ps", 0}, tls);
  CHECK(no_file.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK_MESSAGE(absl::StrContains(no_file.status().message(), missing), no_file.status());
  CHECK_MESSAGE(absl::StrContains(no_file.status().message(), "--tls-cert"), no_file.status());
  CHECK_FALSE(Listening(c.ps_ports[0]));  // nothing listened
}

TEST_CASE("Server::Create: a taken port is UNAVAILABLE naming it; a second Server of one task ALREADY_EXISTS") {
  Listener taken;
  std::vector<int> ports = FreePorts(1);
  StatusOr<ClusterSpec> spec = ClusterSpec::FromFlags(absl::StrCat("127.0.0.1:", taken.port),
                                                      absl::StrCat("127.0.0.1:", ports[0]));
  REQUIRE_OK(spec);
  StatusOr<std::unique_ptr<Server>> ps = Server::Create(*spec, {"ps", 0}, Options());
  CHECK(ps.status().code() == absl::StatusCode::kUnavailable);
  CHECK_MESSAGE(absl::StrContains(ps.status().message(), absl::StrCat("127.0.0.1:", taken.port)), ps.status());
  MESSAGE("port taken: ", ps.status().ToString());

  StatusOr<std::unique_ptr<Server>> worker = Server::Create(*spec, {"worker", 0}, Options());
  REQUIRE_MESSAGE(worker.ok(), worker.status().ToString());
  StatusOr<std::unique_ptr<Server>> again = Server::Create(*spec, {"worker", 0}, Options());
  CHECK(again.status().code() == absl::StatusCode::kAlreadyExists);
  CHECK_MESSAGE(absl::StrContains(again.status().message(), (*worker)->target()), again.status());
  CHECK(Listening(ports[0]));  // the first worker Server still serves
}

TEST_CASE("tcp:// targets: a worker Server's SessionValues (remote = its RemoteValues); clear errors otherwise") {
  Cluster c(1, 2);
  const std::string target = c.workers[0]->target();
  CHECK(target == absl::StrCat("tcp://127.0.0.1:", c.worker_ports[0]));
  CHECK(c.workers[0]->task().task_index == 0);
  CHECK(c.workers[0]->cluster().num_tasks("ps") == 1);
  StatusOr<std::shared_ptr<internal::SessionValues>> values = internal::ResolveSessionTarget(target);
  REQUIRE_MESSAGE(values.ok(), values.status().ToString());
  CHECK((*values)->remote == c.Remote(0));
  CHECK(*internal::ResolveSessionTarget(target) == *values);  // one SessionValues per Server
  CHECK(*internal::ResolveSessionTarget(c.workers[1]->target()) != *values);
  CHECK(ServerRemoteValues(*c.ps[0]) == nullptr);

  Status ps_target = internal::ResolveSessionTarget(c.ps[0]->target()).status();
  CHECK(ps_target.code() == absl::StatusCode::kFailedPrecondition);
  CHECK_MESSAGE(absl::StrContains(ps_target.message(), "ps task 0"), ps_target);
  Status tls = internal::ResolveSessionTarget(absl::StrCat("tls://127.0.0.1:", c.worker_ports[0])).status();
  CHECK(tls.code() == absl::StatusCode::kFailedPrecondition);
  CHECK_MESSAGE(absl::StrContains(tls.message(), target), tls);
  Status none = internal::ResolveSessionTarget("tcp://127.0.0.1:1").status();
  CHECK(none.code() == absl::StatusCode::kFailedPrecondition);
  CHECK(none.message() ==
        "no foreman::Server in this process serves tcp://127.0.0.1:1: create one (Server::Create) first");

  // The worker's published actor answers a ping with its role and address.
  {
    Client client;
    caf::actor task = client.Connect(c.worker_ports[1]);
    caf::scoped_actor self{*client.sys};
    std::string job, address;
    int32_t index = -1;
    self->request(task, milliseconds(ScaledMs(5000)), caf::ping_atom::value)
        .receive([&](caf::pong_atom, std::string& j, int32_t i, std::string& a) { job = j, index = i, address = a; },
                 [](caf::error&) {});
    CHECK(job == "worker");
    CHECK(index == 1);
    CHECK(address == absl::StrCat("127.0.0.1:", c.worker_ports[1]));
  }

  // Destroyed: the target is gone; the RemoteValues still held is UNAVAILABLE.
  std::shared_ptr<RemoteValues> rv = c.Remote(0);
  REQUIRE_OK(rv->Bind({"w"}));
  c.workers[0].reset();
  CHECK(internal::ResolveSessionTarget(target).status().code() == absl::StatusCode::kFailedPrecondition);
  VariableStore mirror;
  Status after = rv->Read(mirror);
  CHECK(after.code() == absl::StatusCode::kUnavailable);
  CHECK_MESSAGE(absl::StrContains(after.message(), target), after);
  CHECK_FALSE(Listening(c.worker_ports[0]));
}

TEST_CASE("RemoteValues over 2 ps tasks: Read before init erases, Write / Read round trip, placement respected") {
  Cluster c(2, 1);
  std::shared_ptr<RemoteValues> rv = c.Remote();
  VariableStore mirror;
  CHECK(rv->Read(mirror).code() == absl::StatusCode::kFailedPrecondition);  // before Bind
  REQUIRE_OK(rv->Bind(kNames));
  CHECK_OK(rv->Bind(kNames));
  std::vector<std::string> other = kNames;
  other[2] = "dense/other";
  Status differs = rv->Bind(other);
  CHECK(differs.code() == absl::StatusCode::kInvalidArgument);
  CHECK_MESSAGE(absl::StrContains(differs.message(), "position 2"), differs);

  // Not initialized: the bound variables are erased, the worker's own kept.
  Fill(mirror, 100);
  REQUIRE_OK(mirror.Create("input/position", Tensor::Scalar<int64_t>(7), false));
  REQUIRE_OK(rv->Read(mirror));
  CHECK(mirror.Names() == std::vector<std::string>{"input/position"});
  CHECK(rv->ReadConsistent(mirror).code() == absl::StatusCode::kFailedPrecondition);

  // Write needs every bound variable.
  VariableStore partial;
  REQUIRE_OK(partial.Create("global_step", Tensor::Scalar<int64_t>(1), false));
  Status missing = rv->Write(partial, kInit);
  CHECK(missing.code() == absl::StatusCode::kFailedPrecondition);
  CHECK_MESSAGE(absl::StrContains(missing.message(), "dense/kernel"), missing);

  VariableStore source;
  Fill(source, 100);
  REQUIRE_OK(rv->Write(source, kInit));
  REQUIRE_OK(rv->Read(mirror));
  CHECK(mirror.size() == kNames.size() + 1);
  CheckSame(source, mirror, kNames);
  CHECK(mirror.IsTrainable("dense/kernel").value());
  CHECK_FALSE(mirror.IsTrainable("global_step").value());
  CHECK_FALSE(mirror.IsTrainable("dense/kernel/Momentum").value());

  // A read copies nothing beyond CAF's (de)serialization (issue 27 point
  // 2): the ps shares its variables' bytes with the answer, and the
  // received bytes become the mirror's tensors.
  const internal::TransportCopyCounters before = internal::TransportCopyCounters::Snapshot();
  REQUIRE_OK(rv->Read(mirror));
  const internal::TransportCopyCounters after = internal::TransportCopyCounters::Snapshot();
  CheckSame(source, mirror, kNames);
  CHECK(after.copied == before.copied);
  CHECK(after.deserialized > before.deserialized);

  // Placement (PlaceVariablesOnPs): global_step and dense/bias, dense_1/bias
  // (with their slots) on ps 0; dense/kernel, dense_1/kernel on ps 1.
  Client client;
  internal::PsShardStatsMessage s0 = client.Stats(client.Connect(c.ps_ports[0]));
  internal::PsShardStatsMessage s1 = client.Stats(client.Connect(c.ps_ports[1]));
  CHECK(s0.global_step == 100);
  CHECK(s1.global_step == -1);
  caf::scoped_actor self{*client.sys};
  std::vector<std::string> on_ps1;
  self->request(client.Connect(c.ps_ports[1]), milliseconds(ScaledMs(5000)), internal::ps_snap_atom::value)
      .receive(
          [&](internal::VariablesMessage& v) {
            for (auto& t : v.tensors) on_ps1.push_back(t.name);
          },
          [](caf::error&) {});
  CHECK(on_ps1 == std::vector<std::string>{"dense/kernel", "dense/kernel/Momentum", "dense_1/kernel",
                                           "dense_1/kernel/Momentum"});
}

TEST_CASE("Apply: bitwise nn::ApplyGradients on a local copy, global_step + 1; ReadConsistent; thawed after") {
  const ServerOptions options = Options(nn::OptimizerKind::kMomentum);
  Cluster c(2, 1, options);
  std::shared_ptr<RemoteValues> rv = c.Remote();
  REQUIRE_OK(rv->Bind(kNames));
  VariableStore local;
  Fill(local, 100);
  REQUIRE_OK(rv->Write(local, kInit));

  compute::CpuDevice device(1);  // one intra-op thread
  for (int step = 0; step < 3; ++step) {
    const nn::Gradients g = Grads(0.05f, 0.3f + static_cast<float>(step));
    StatusOr<int64_t> gs = rv->Apply(g, 100 + step);
    REQUIRE_MESSAGE(gs.ok(), gs.status().ToString());
    CHECK(*gs == 101 + step);
    REQUIRE_OK(nn::ApplyGradients(options.optimizer, local, g, device));
  }
  VariableStore mirror;
  REQUIRE_OK(rv->Read(mirror));
  std::vector<std::string> trained(kNames.begin() + 1, kNames.end());
  CheckSame(local, mirror, trained);
  CHECK(*mirror.Get("global_step").value()->data<int64_t>() == 103);

  VariableStore consistent;
  REQUIRE_OK(rv->ReadConsistent(consistent));
  CheckSame(mirror, consistent, kNames);
  // Every shard was thawed: the next apply is answered at once.
  const auto t0 = Clock::now();
  StatusOr<int64_t> gs = rv->Apply(Grads(0.05f, 1.0f), 103);
  CHECK(gs.value_or(-1) == 104);
  CHECK(Clock::now() - t0 < milliseconds(kRequestTimeoutMs));

  // A shard's own refusal comes back unchanged; a gradient of an unbound variable is NOT_FOUND.
  nn::Gradients bad = Grads(0.05f, 1.0f);
  bad.grads_and_vars[1].grad = Floats({2, 2}, 1.0f);
  Status refused = rv->Apply(bad, 104).status();
  CHECK(refused.code() == absl::StatusCode::kInvalidArgument);
  CHECK_MESSAGE(absl::StrContains(refused.message(), "ps task 1: the gradient of 'dense/kernel' has shape"), refused);
  nn::Gradients unknown = Grads(0.05f, 1.0f);
  unknown.grads_and_vars.push_back({"zzz", Floats({1}, 1.0f)});
  CHECK(rv->Apply(unknown, 104).status().code() == absl::StatusCode::kNotFound);
}

// Issue 27 point 2: a step's update and the next step's read in one round
// trip. ApplyAndRead leaves in the mirror what a ReadForStep right after the
// apply reads; the next ReadForStep of that mirror asks nothing; any other
// call in between (here Write, as a chief's restore) makes it read again,
// and an update after that restore answers the restored values plus it.
TEST_CASE("ApplyAndRead over 2 ps tasks: the mirror as a ReadForStep after the apply; one round trip; a restore in between reads") {
  const ServerOptions options = Options(nn::OptimizerKind::kMomentum);
  Cluster c(2, 1, options);
  std::shared_ptr<RemoteValues> rv = c.Remote();
  REQUIRE_OK(rv->Bind(kNames));
  VariableStore local;
  Fill(local, 100);
  REQUIRE_OK(rv->Write(local, kInit));
  const std::vector<std::string> step_names = {"global_step", "dense/kernel", "dense/bias", "dense_1/kernel",
                                               "dense_1/bias"};
  compute::CpuDevice device(1);
  VariableStore mirror;
  REQUIRE_OK(rv->Read(mirror));
  for (int step = 0; step < 3; ++step) {
    const nn::Gradients g = Grads(0.05f, 0.3f + static_cast<float>(step));
    StatusOr<int64_t> gs = rv->ApplyAndRead(g, 100 + step, mirror);
    REQUIRE_MESSAGE(gs.ok(), gs.status().ToString());
    CHECK(*gs == 101 + step);
    REQUIRE_OK(nn::ApplyGradients(options.optimizer, local, g, device));
    REQUIRE_OK(SetGlobalStep(local, 101 + step));
    CheckSame(local, mirror, step_names);
    // The next step's read is the answer: nothing is received.
    const uint64_t received = internal::TransportCopyCounters::Snapshot().deserialized;
    REQUIRE_OK(rv->ReadForStep(mirror));
    CHECK(internal::TransportCopyCounters::Snapshot().deserialized == received);
    CheckSame(local, mirror, step_names);
  }
  // Only once: a second ReadForStep reads.
  uint64_t received = internal::TransportCopyCounters::Snapshot().deserialized;
  REQUIRE_OK(rv->ReadForStep(mirror));
  CHECK(internal::TransportCopyCounters::Snapshot().deserialized > received);

  // A restore between the answer and the next step (the chief's Write):
  // the next ReadForStep reads the restored values, and the next fused
  // answer carries the restored values with the update applied.
  REQUIRE_OK(rv->ApplyAndRead(Grads(0.05f, 2.0f), 103, mirror));
  VariableStore restored;
  Fill(restored, 50);
  REQUIRE_OK(rv->Write(restored, RemoteValues::WriteKind::kRestore));
  received = internal::TransportCopyCounters::Snapshot().deserialized;
  REQUIRE_OK(rv->ReadForStep(mirror));
  CHECK(internal::TransportCopyCounters::Snapshot().deserialized > received);
  CheckSame(restored, mirror, step_names);
  const nn::Gradients g = Grads(0.05f, 4.0f);
  StatusOr<int64_t> gs = rv->ApplyAndRead(g, 50, mirror);
  REQUIRE_MESSAGE(gs.ok(), gs.status().ToString());
  CHECK(*gs == 51);
  REQUIRE_OK(nn::ApplyGradients(options.optimizer, restored, g, device));
  REQUIRE_OK(SetGlobalStep(restored, 51));
  CheckSame(restored, mirror, step_names);

  // A refused update: the error unchanged, and the next ReadForStep reads.
  nn::Gradients bad = Grads(0.05f, 1.0f);
  bad.grads_and_vars[1].grad = Floats({2, 2}, 1.0f);
  CHECK(rv->ApplyAndRead(bad, 51, mirror).status().code() == absl::StatusCode::kInvalidArgument);
  received = internal::TransportCopyCounters::Snapshot().deserialized;
  REQUIRE_OK(rv->ReadForStep(mirror));
  CHECK(internal::TransportCopyCounters::Snapshot().deserialized > received);
}

TEST_CASE("ReadForStep over 2 ps tasks: every bound variable but the slots; the slots left; erased before init") {
  const ServerOptions options = Options(nn::OptimizerKind::kMomentum);
  Cluster c(2, 1, options);
  std::shared_ptr<RemoteValues> rv = c.Remote();
  REQUIRE_OK(rv->Bind(kNames));

  // Not initialized: every bound variable is erased, slots included; the
  // worker's own is kept.
  VariableStore mirror;
  Fill(mirror, 100);
  REQUIRE_OK(mirror.Create("input/position", Tensor::Scalar<int64_t>(7), false));
  REQUIRE_OK(rv->ReadForStep(mirror));
  CHECK(mirror.Names() == std::vector<std::string>{"input/position"});

  VariableStore local;
  Fill(local, 100);
  REQUIRE_OK(rv->Write(local, kInit));
  // Never read in full: the slots stay absent, everything else arrives.
  REQUIRE_OK(rv->ReadForStep(mirror));
  CHECK(mirror.size() == 5 + 1);
  CheckSame(local, mirror, {"global_step", "dense/kernel", "dense/bias", "dense_1/kernel", "dense_1/bias"});
  CHECK_FALSE(mirror.Contains("dense/kernel/Momentum"));

  // After an update: the values and global_step are the new ones, each
  // slot keeps the value of the last full read; Read then brings them.
  VariableStore before;
  Fill(before, 100);
  REQUIRE_OK(rv->Read(mirror));
  compute::CpuDevice device(1);  // one intra-op thread
  const nn::Gradients g = Grads(0.05f, 0.7f);
  REQUIRE_OK(rv->Apply(g, 100));
  REQUIRE_OK(nn::ApplyGradients(options.optimizer, local, g, device));
  REQUIRE_OK(rv->ReadForStep(mirror));
  CHECK(*mirror.Get("global_step").value()->data<int64_t>() == 101);
  CheckSame(local, mirror, {"dense/kernel", "dense/bias", "dense_1/kernel", "dense_1/bias"});
  const std::vector<std::string> slots(kNames.begin() + 5, kNames.end());
  CheckSame(before, mirror, slots);
  REQUIRE_OK(rv->Read(mirror));
  CheckSame(local, mirror, slots);
  CHECK(std::memcmp(local.Get("dense/kernel/Momentum").value()->raw_data(),
                    before.Get("dense/kernel/Momentum").value()->raw_data(),
                    before.Get("dense/kernel/Momentum").value()->TotalBytes()) != 0);  // the slot did change
}

TEST_CASE("synchronous training (replicas_to_aggregate 2): two workers' applies to both shards, one update") {
  ServerOptions options = Options(nn::OptimizerKind::kSgd);
  options.replicas_to_aggregate = 2;
  Cluster c(2, 2, options);
  std::shared_ptr<RemoteValues> chief = c.Remote(0), other = c.Remote(1);
  std::vector<std::string> names(kNames.begin(), kNames.begin() + 5);  // no slots with SGD
  REQUIRE_OK(chief->Bind(names));
  REQUIRE_OK(other->Bind(names));
  VariableStore local;
  Fill(local, 10);
  REQUIRE_OK(chief->Write(local, kInit));
  const nn::Gradients g = Grads(0.5f, 0.75f);
  // Each worker sends to both shards, then waits: neither shard answers
  // before both workers' applies arrived.
  StatusOr<int64_t> from_other = absl::UnknownError("not run");
  std::thread t([&] { from_other = other->Apply(g, 10); });
  StatusOr<int64_t> from_chief = chief->Apply(g, 10);
  t.join();
  REQUIRE_MESSAGE(from_chief.ok(), from_chief.status().ToString());
  REQUIRE_MESSAGE(from_other.ok(), from_other.status().ToString());
  CHECK(*from_chief == 11);
  CHECK(*from_other == 11);
  // The mean of two equal gradients is the gradient: one local update.
  compute::CpuDevice device(1);  // one intra-op thread
  REQUIRE_OK(nn::ApplyGradients(options.optimizer, local, g, device));
  VariableStore mirror;
  REQUIRE_OK(other->Read(mirror));
  CheckSame(local, mirror, std::vector<std::string>(names.begin() + 1, names.end()));
  // A stale apply (computed at step 10, now 11) is dropped and answered at once.
  CHECK(chief->Apply(g, 10).value_or(-1) == 11);
}

TEST_CASE("an apply without an answer in time is UNAVAILABLE naming the ps task and the wait; the link is kept") {
  ServerOptions options = Options(nn::OptimizerKind::kSgd);
  options.replicas_to_aggregate = 2;
  options.request_timeout_ms = 300;
  Cluster c(1, 2, options);
  std::shared_ptr<RemoteValues> chief = c.Remote(0), other = c.Remote(1);
  std::vector<std::string> names(kNames.begin(), kNames.begin() + 5);
  REQUIRE_OK(chief->Bind(names));
  REQUIRE_OK(other->Bind(names));
  VariableStore local;
  Fill(local, 10);
  REQUIRE_OK(chief->Write(local, kInit));
  // Only one of the two replicas applies: no aggregated update, no answer.
  const auto t0 = Clock::now();
  Status alone = chief->Apply(Grads(0.5f, 1.0f), 10).status();
  CHECK(alone.code() == absl::StatusCode::kUnavailable);
  CHECK_MESSAGE(absl::StrContains(alone.message(), absl::StrCat("ps task 0 (127.0.0.1:", c.ps_ports[0],
                                                                "): no answer within 300 ms")),
                alone);
  CHECK_MESSAGE(absl::StrContains(alone.message(), "synchronous mode"), alone);
  CHECK(Clock::now() - t0 < milliseconds(ScaledMs(1500)));
  // The second replica completes the step (the first one's gradients were
  // kept by the shard); the chief's link still works.
  CHECK(other->Apply(Grads(0.5f, 1.0f), 10).value_or(-1) == 11);
  VariableStore mirror;
  REQUIRE_OK(chief->Read(mirror));
  CHECK(*mirror.Get("global_step").value()->data<int64_t>() == 11);
}

// The elementwise float mean of two workers' gradients, as a shard
// computes it ((a + b) / 2, in float).
nn::Gradients MeanOf(const nn::Gradients& a, const nn::Gradients& b) {
  nn::Gradients m = a;
  for (std::size_t i = 0; i < m.grads_and_vars.size(); ++i) {
    float* x = m.grads_and_vars[i].grad.data<float>();
    const float* y = b.grads_and_vars[i].grad.data<float>();
    for (int64_t j = 0; j < m.grads_and_vars[i].grad.num_elements(); ++j) x[j] = (x[j] + y[j]) / 2.0f;
  }
  return m;
}

TEST_CASE("synchronous training over 2 ps tasks: each update is the mean of exactly 2 workers' gradients of "
          "one step; a stale apply is dropped and counted; a worker's retry replaces its timed-out apply") {
  ServerOptions options = Options(nn::OptimizerKind::kSgd);
  options.replicas_to_aggregate = 2;
  // Worker 0 gives up on an apply after 300 ms (the timeouts below); the ps
  // tasks and worker 1 wait longer (a loaded machine).
  Cluster c(2, 2, options, /*start=*/false);
  for (int k = 0; k < 2; ++k) c.ps.push_back(c.Start({"ps", k}, options));
  ServerOptions quick = options;
  quick.request_timeout_ms = 300;
  c.workers.push_back(c.Start({"worker", 0}, quick));
  c.workers.push_back(c.Start({"worker", 1}, options));
  std::shared_ptr<RemoteValues> w0 = c.Remote(0), w1 = c.Remote(1);
  std::vector<std::string> names(kNames.begin(), kNames.begin() + 5);  // no slots with SGD
  REQUIRE_OK(w0->Bind(names));
  REQUIRE_OK(w1->Bind(names));
  VariableStore local;
  Fill(local, 0);
  REQUIRE_OK(w0->Write(local, kInit));
  compute::CpuDevice device(1);  // one intra-op thread
  const std::vector<std::string> trained(names.begin() + 1, names.end());
  Client client;
  const caf::actor ps0 = client.Connect(c.ps_ports[0]), ps1 = client.Connect(c.ps_ports[1]);
  // Until both shards hold one waiting apply (at most 5 s).
  auto one_waiting = [&] {
    const auto deadline = Clock::now() + milliseconds(ScaledMs(5000));
    while (Clock::now() < deadline) {
      if (client.Stats(ps0).waiting_replicas == 1 && client.Stats(ps1).waiting_replicas == 1) return true;
      std::this_thread::sleep_for(milliseconds(5));
    }
    return false;
  };

  // Three steps, each worker with its own gradients: worker 1's apply
  // waits on both shards, then worker 0's completes the step.
  for (int64_t step = 0; step < 3; ++step) {
    const nn::Gradients g0 = Grads(0.5f, 0.25f + static_cast<float>(step));
    const nn::Gradients g1 = Grads(0.5f, -1.5f + 0.5f * static_cast<float>(step));
    StatusOr<int64_t> from_w1 = absl::UnknownError("not run");
    std::thread t([&] { from_w1 = w1->Apply(g1, step); });
    CHECK(one_waiting());
    StatusOr<int64_t> from_w0 = w0->Apply(g0, step);
    t.join();
    REQUIRE_MESSAGE(from_w0.ok(), from_w0.status().ToString());
    REQUIRE_MESSAGE(from_w1.ok(), from_w1.status().ToString());
    CHECK(*from_w0 == step + 1);
    CHECK(*from_w1 == step + 1);
    REQUIRE_OK(nn::ApplyGradients(options.optimizer, local, MeanOf(g0, g1), device));
    VariableStore mirror;
    REQUIRE_OK(w1->Read(mirror));
    CheckSame(local, mirror, trained);  // bitwise: the mean of those two, applied once
    CHECK(*mirror.Get("global_step").value()->data<int64_t>() == step + 1);
  }
  for (const caf::actor& shard : {ps0, ps1}) {
    internal::PsShardStatsMessage s = client.Stats(shard);
    CHECK(s.applied_updates == 3);  // one per aggregated step
    CHECK(s.sync_step == 3);
    CHECK(s.waiting_replicas == 0);
    CHECK(s.stale_gradients == 0);
  }

  // A stale gradient (computed at step 1; the shards are at 3): answered at
  // once with the current step, dropped on both shards, nothing changed.
  CHECK(w0->Apply(Grads(0.5f, 9.0f), 1).value_or(-1) == 3);
  for (const caf::actor& shard : {ps0, ps1}) {
    internal::PsShardStatsMessage s = client.Stats(shard);
    CHECK(s.stale_gradients == 1);
    CHECK(s.dropped_gradients == 1);
    CHECK(s.applied_updates == 3);
    CHECK(s.waiting_replicas == 0);
  }
  VariableStore after_stale;
  REQUIRE_OK(w1->Read(after_stale));
  CheckSame(local, after_stale, trained);

  // Worker 0 alone: its apply of step 3 times out (UNAVAILABLE); its retry
  // of step 3 (a recovered session runs the step again) replaces it rather
  // than counting as a second replica: still no update without worker 1.
  Status alone = w0->Apply(Grads(0.5f, 4.0f), 3).status();
  CHECK_MESSAGE(alone.code() == absl::StatusCode::kUnavailable, alone);
  // cluster.md rule 4: the failure names the wait and the missing worker.
  CHECK_MESSAGE(absl::StrContains(alone.message(), "in synchronous mode an apply waits for 2 workers' applies"), alone);
  CHECK_MESSAGE(absl::StrContains(alone.message(), "holds 1 of the 2 applies of step 3 (from workers 0); missing: "
                                                   "/job:worker/task:1"),
                alone);
  const nn::Gradients retry = Grads(0.5f, 2.0f);
  Status again = w0->Apply(retry, 3).status();
  CHECK_MESSAGE(again.code() == absl::StatusCode::kUnavailable, again);
  for (const caf::actor& shard : {ps0, ps1}) {
    internal::PsShardStatsMessage s = client.Stats(shard);
    CHECK(s.applied_updates == 3);
    CHECK(s.waiting_replicas == 1);
    CHECK(s.dropped_gradients == 2);  // the stale one and the replaced one
  }
  // Worker 1 completes step 3: the mean of worker 0's retry and worker 1's.
  const nn::Gradients g1 = Grads(0.5f, 0.125f);
  StatusOr<int64_t> completed = w1->Apply(g1, 3);
  CHECK_MESSAGE(completed.value_or(-1) == 4, completed.status());
  REQUIRE_OK(nn::ApplyGradients(options.optimizer, local, MeanOf(retry, g1), device));
  VariableStore mirror;
  REQUIRE_OK(w0->Read(mirror));
  CheckSame(local, mirror, trained);
  CHECK(*mirror.Get("global_step").value()->data<int64_t>() == 4);
  for (const caf::actor& shard : {ps0, ps1}) CHECK(client.Stats(shard).applied_updates == 4);
}

TEST_CASE("EndTraining: the chief only; later applies OUT_OF_RANGE, reads served; the ps Servers' Join returns") {
  Cluster c(2, 2);
  std::shared_ptr<RemoteValues> rv = c.Remote(1);
  REQUIRE_OK(rv->Bind(kNames));
  VariableStore source;
  Fill(source, 41);
  REQUIRE_OK(rv->Write(source, kInit));
  REQUIRE_OK(rv->Apply(Grads(0.1f, 1.0f), 41));

  CHECK(c.ps[0]->Join(absl::Milliseconds(50)).code() == absl::StatusCode::kDeadlineExceeded);
  StatusOr<int64_t> not_chief = c.workers[1]->EndTraining();
  CHECK(not_chief.status().code() == absl::StatusCode::kFailedPrecondition);
  const auto t_end = Clock::now();
  StatusOr<int64_t> ended = c.workers[0]->EndTraining();
  REQUIRE_MESSAGE(ended.ok(), ended.status().ToString());
  CHECK(*ended == 42);

  Status after = rv->Apply(Grads(0.1f, 1.0f), 42).status();
  CHECK(after.code() == absl::StatusCode::kOutOfRange);
  CHECK_MESSAGE(absl::StrContains(after.message(), "training ended by the chief at global_step 42"), after);
  VariableStore mirror;
  REQUIRE_OK(rv->ReadConsistent(mirror));
  CHECK(*mirror.Get("global_step").value()->data<int64_t>() == 42);

  // Join: after connection_timeout_ms (200 ms, scaled) without a request. Reads
  // after the end (a chief's final checkpoint and evaluation), one every
  // 100 ms for 500 ms, keep the ps tasks serving until they stop.
  const auto t_reads = Clock::now();
  std::thread reader([&rv] {
    for (int i = 0; i < 6; ++i) {
      VariableStore m;
      CHECK_OK(rv->ReadConsistent(m));
      if (i < 5) std::this_thread::sleep_for(milliseconds(100));
    }
  });
  for (auto& ps : c.ps) {
    const auto t0 = Clock::now();
    Status joined = ps->Join(absl::Milliseconds(ScaledMs(5000)));
    CHECK_MESSAGE(joined.ok(), joined);
    CHECK(Clock::now() - t0 < milliseconds(ScaledMs(2000)));
    CHECK(Clock::now() - t_end >= milliseconds(kConnectionTimeoutMs));
    CHECK(Clock::now() - t_reads >= milliseconds(500 + kConnectionTimeoutMs));
  }
  reader.join();
  // A worker's Join waits for Stop.
  CHECK(c.workers[1]->Join(absl::Milliseconds(20)).code() == absl::StatusCode::kDeadlineExceeded);
  c.workers[1]->Stop();
  c.workers[1]->Stop();  // idempotent
  CHECK_OK(c.workers[1]->Join(absl::Milliseconds(ScaledMs(5000))));
}

TEST_CASE("EndTrainingHook: a stop request leaves training running (a preemption) unless asked to end it") {
  Cluster c(1, 2);
  std::shared_ptr<RemoteValues> rv = c.Remote(1);
  REQUIRE_OK(rv->Bind(kNames));
  VariableStore source;
  Fill(source, 9);
  REQUIRE_OK(rv->Write(source, kInit));
  auto stop = std::make_shared<StopRequest>();
  // A stop request (an eviction): end() leaves the ps taking updates.
  stop->request_stop();
  EndTrainingHookOptions evicted_options;
  evicted_options.stop = stop;
  EndTrainingHook evicted(c.workers[0].get(), evicted_options);
  Status e = evicted.end(nullptr);
  CHECK_MESSAGE(e.ok(), e);
  CHECK(evicted.left_training_running());
  CHECK_FALSE(evicted.final_step().has_value());
  StatusOr<int64_t> applied = rv->Apply(Grads(0.1f, 1.0f), 9);
  CHECK_MESSAGE(applied.value_or(-1) == 10, applied.status());
  CHECK(c.ps[0]->Join(absl::Milliseconds(50)).code() == absl::StatusCode::kDeadlineExceeded);
  // end_training_on_stop_request: the same request ends training.
  EndTrainingHookOptions ending_options;
  ending_options.stop = stop;
  ending_options.end_training_on_stop_request = true;
  EndTrainingHook ending(c.workers[0].get(), ending_options);
  Status ended = ending.end(nullptr);
  CHECK_MESSAGE(ended.ok(), ended);
  CHECK_FALSE(ending.left_training_running());
  CHECK(ending.final_step().value_or(-1) == 10);
  CHECK(rv->Apply(Grads(0.1f, 1.0f), 10).status().code() == absl::StatusCode::kOutOfRange);
  stop->Complete();
}

TEST_CASE("EndTrainingHook: without a stop request (the last step), end() ends training") {
  Cluster c(1, 2);
  std::shared_ptr<RemoteValues> rv = c.Remote(1);
  REQUIRE_OK(rv->Bind(kNames));
  VariableStore source;
  Fill(source, 5);
  REQUIRE_OK(rv->Write(source, kInit));
  EndTrainingHookOptions o;
  o.stop = std::make_shared<StopRequest>();
  EndTrainingHook hook(c.workers[0].get(), o);
  Status ended = hook.end(nullptr);
  CHECK_MESSAGE(ended.ok(), ended);
  CHECK(hook.final_step().value_or(-1) == 5);
  CHECK_FALSE(hook.left_training_running());
  CHECK(rv->Apply(Grads(0.1f, 1.0f), 5).status().code() == absl::StatusCode::kOutOfRange);
}

TEST_CASE("a ps task that goes away: Read and Apply UNAVAILABLE naming it, within the timeout; a new one is used") {
  Cluster c(2, 1);
  std::shared_ptr<RemoteValues> rv = c.Remote();
  REQUIRE_OK(rv->Bind(kNames));
  VariableStore source;
  Fill(source, 7);
  REQUIRE_OK(rv->Write(source, kInit));
  c.ps[1].reset();
  const std::string ps1 = absl::StrCat("ps task 1 (127.0.0.1:", c.ps_ports[1], ")");
  VariableStore mirror;
  auto t0 = Clock::now();
  Status read = rv->Read(mirror);
  CHECK(read.code() == absl::StatusCode::kUnavailable);
  CHECK_MESSAGE(absl::StrContains(read.message(), ps1), read);
  CHECK(Clock::now() - t0 < milliseconds(kRequestTimeoutMs + 500));
  MESSAGE("read: ", read.ToString());
  t0 = Clock::now();
  Status apply = rv->Apply(Grads(0.1f, 1.0f), 7).status();
  CHECK(apply.code() == absl::StatusCode::kUnavailable);
  CHECK_MESSAGE(absl::StrContains(apply.message(), ps1), apply);
  CHECK(Clock::now() - t0 < milliseconds(kRequestTimeoutMs + 500));
  MESSAGE("apply: ", apply.ToString());

  // EndTraining ends the reachable ps tasks and names the lost one.
  {
    StatusOr<int64_t> ended = c.workers[0]->EndTraining();
    CHECK(ended.status().code() == absl::StatusCode::kUnavailable);
    CHECK_MESSAGE(absl::StrContains(ended.status().message(), ps1), ended.status());
  }

  // A new ps task 1 (a restarted process): reconnected, not initialized yet.
  c.ps[1] = c.Start({"ps", 1}, Options());
  REQUIRE_OK(rv->Read(mirror));
  CHECK(mirror.Contains("global_step"));    // ps 0's
  CHECK_FALSE(mirror.Contains("dense/kernel"));  // ps 1's, erased
  REQUIRE_OK(rv->Write(source, RemoteValues::WriteKind::kRestore));  // the chief's restore
  REQUIRE_OK(rv->Read(mirror));
  CheckSame(source, mirror, kNames);
  // ps 0 had ended (above): its answer comes first.
  CHECK(rv->Apply(Grads(0.1f, 1.0f), 7).status().code() == absl::StatusCode::kOutOfRange);
}

// The test PKI of tools/scripts/gen-tls-certs.sh (as cluster_net_test's).
struct Pki {
  std::filesystem::path dir;
  Pki() {
    dir = std::filesystem::temp_directory_path() / absl::StrCat("foreman_cluster_server_", ::getpid());
    std::filesystem::create_directories(dir);
    const char* testdata = std::getenv("FOREMAN_TESTDATA");
    REQUIRE_MESSAGE(testdata != nullptr, "FOREMAN_TESTDATA is not set (meson test sets it)");
    const std::string cmd =
        absl::StrCat("'", testdata, "/../../tools/scripts/gen-tls-certs.sh' '", dir.string(), "' node1");
    const int rc = std::system(cmd.c_str());
    REQUIRE_MESSAGE(rc == 0, cmd, " failed: ", rc);
  }
  ~Pki() { std::filesystem::remove_all(dir); }
  // connection_timeout_ms also bounds each connect's handshake (Server's
  // set_connect_timeout): a mutual-TLS handshake with RSA-2048 keys took
  // over 600 ms (200 ms scaled) under ThreadSanitizer on a loaded 2-core CI
  // machine, and the first Write failed with "no handshake within 600 ms".
  // No TLS test here measures the connection timeout itself.
  ServerOptions Options() const {
    ServerOptions o = foreman::Options();
    o.cluster.connection_timeout_ms = ScaledMs(2000);
    o.cluster.tls_cert = (dir / "node1.pem").string();
    o.cluster.tls_key = (dir / "node1.key").string();
    o.cluster.tls_ca = (dir / "ca.pem").string();
    return o;
  }
};

// The ps tasks behind `rv` initialised at global_step `step` (Bind, Write
// with kInit), one Apply (global_step + 1), and a consistent read that
// shows it.
void InitApplyAndRead(const std::shared_ptr<RemoteValues>& rv, int64_t step) {
  REQUIRE(rv != nullptr);
  REQUIRE_OK(rv->Bind(kNames));
  VariableStore source;
  Fill(source, step);
  REQUIRE_OK(rv->Write(source, kInit));
  CHECK(rv->Apply(Grads(0.1f, 1.0f), step).value_or(-1) == step + 1);
  VariableStore mirror;
  REQUIRE_OK(rv->ReadConsistent(mirror));
  CHECK(*mirror.Get("global_step").value()->data<int64_t>() == step + 1);
}

TEST_CASE("mutual TLS: a tls:// target, and Write / Apply / Read across TLS links") {
  Pki pki;
  Cluster c(1, 1, pki.Options());
  const std::string target = c.workers[0]->target();
  CHECK(target == absl::StrCat("tls://127.0.0.1:", c.worker_ports[0]));
  StatusOr<std::shared_ptr<internal::SessionValues>> values = internal::ResolveSessionTarget(target);
  REQUIRE_MESSAGE(values.ok(), values.status().ToString());
  CHECK(internal::ResolveSessionTarget(absl::StrCat("tcp://127.0.0.1:", c.worker_ports[0])).status().code() ==
        absl::StatusCode::kFailedPrecondition);
  InitApplyAndRead((*values)->remote, 3);
}

// An application's own actor system, configured for a cluster with
// ConfigureClusterNetwork (server.hpp) as a user builds one.
struct UserSystem {
  caf::actor_system_config config;
  std::unique_ptr<caf::actor_system> system;
  explicit UserSystem(const ClusterOptions& options) {
    config.set("scheduler.max-threads", size_t{2});
    REQUIRE_OK(ConfigureClusterNetwork(config, options));
    system = std::make_unique<caf::actor_system>(config);
  }
};

// Waits (bounded) until nothing accepts connections on 127.0.0.1:port.
bool StopsListening(int port) {
  const auto deadline = Clock::now() + milliseconds(ScaledMs(3000));
  while (Listening(port)) {
    if (Clock::now() > deadline) return false;
    std::this_thread::sleep_for(milliseconds(10));
  }
  return true;
}

// One training round trip through a cluster of 1 ps + 1 chief whose tasks
// each run in `user` (when given) or in a system of their own: init, an
// apply, a consistent read, EndTraining, the ps's Join; then both Stop and
// their ports are closed.
void TrainOnce(UserSystem* ps_system, UserSystem* chief_system, const ServerOptions& options) {
  Cluster c(1, 1, options, /*start=*/false);
  const int64_t systems_before = internal::ActorSystemsCreated();
  auto create = [&](UserSystem* user, const ClusterTask& task) {
    StatusOr<std::unique_ptr<Server>> s = user != nullptr ? Server::Create(*user->system, *c.spec, task, options)
                                                          : Server::Create(*c.spec, task, options);
    REQUIRE_MESSAGE(s.ok(), s.status().ToString());
    return *std::move(s);
  };
  std::unique_ptr<Server> ps = create(ps_system, {"ps", 0});
  std::unique_ptr<Server> chief = create(chief_system, {"worker", 0});
  // Only a Server without a system of the caller's builds one.
  CHECK(internal::ActorSystemsCreated() - systems_before == (ps_system == nullptr) + (chief_system == nullptr));
  InitApplyAndRead(ServerRemoteValues(*chief), 41);
  StatusOr<int64_t> ended = chief->EndTraining();
  CHECK_MESSAGE(ended.value_or(-1) == 42, ended.status());
  CHECK_OK(ps->Join(absl::Milliseconds(ScaledMs(5000))));
  CHECK(Listening(c.ps_ports[0]));
  CHECK(Listening(c.worker_ports[0]));
  chief->Stop();
  ps->Stop();
  CHECK(StopsListening(c.ps_ports[0]));
  CHECK(StopsListening(c.worker_ports[0]));
}

TEST_CASE("Server::Create(system, ...): tasks in the caller's actor system train; Stop closes their ports; the "
          "system runs on") {
  UserSystem user(Options().cluster);
  SUBCASE("the ps in the caller's system, the chief in its own") { TrainOnce(&user, nullptr, Options()); }
  SUBCASE("the chief in the caller's system, the ps in its own") { TrainOnce(nullptr, &user, Options()); }
  SUBCASE("both in one system of the caller's") { TrainOnce(&user, &user, Options()); }
  SUBCASE("mutual TLS: the ps in the caller's system") {
    Pki pki;
    UserSystem tls_user(pki.Options().cluster);
    TrainOnce(&tls_user, nullptr, pki.Options());
  }
  // The caller's system still works, and a new Server may take a closed
  // port again in it.
  caf::scoped_actor self{*user.system};
  // (An unused int: CAF 0.17 binds a null reference for a spawn without
  // arguments, which UBSan reports.)
  caf::actor echo = user.system->spawn([](int) -> caf::behavior { return {[](int x) { return x + 1; }}; }, 0);
  int answer = 0;
  self->request(echo, milliseconds(ScaledMs(5000)), 41).receive([&](int x) { answer = x; }, [](caf::error&) {});
  CHECK(answer == 42);
  self->send_exit(echo, caf::exit_reason::user_shutdown);
  Cluster again(1, 1, Options(), /*start=*/false);
  for (int round = 0; round < 2; ++round) {
    StatusOr<std::unique_ptr<Server>> ps = Server::Create(*user.system, *again.spec, {"ps", 0}, Options());
    REQUIRE_MESSAGE(ps.ok(), "round ", round, ": ", ps.status());
    CHECK(Listening(again.ps_ports[0]));
    ps->reset();
    CHECK(StopsListening(again.ps_ports[0]));
  }
}

TEST_CASE("Server::Create(system, ...) refuses a system not configured for the options; ConfigureClusterNetwork "
          "refuses bad options and leaves the config untouched") {
  Cluster c(1, 1, Options(), /*start=*/false);
  auto refused = [&](caf::actor_system& system, const ServerOptions& options, const std::string& why) {
    StatusOr<std::unique_ptr<Server>> s = Server::Create(system, *c.spec, {"ps", 0}, options);
    CHECK(s.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK_MESSAGE(absl::StrContains(s.status().message(), why), s.status());
    CHECK_MESSAGE(absl::StrContains(s.status().message(), "ConfigureClusterNetwork(config, options.cluster)"),
                  s.status());
    CHECK_FALSE(Listening(c.ps_ports[0]));
  };
  {
    caf::actor_system_config plain_config;
    caf::actor_system plain{plain_config};
    refused(plain, Options(), "the actor system has no middleman");
  }
  UserSystem user(Options().cluster);
  ServerOptions other = Options();
  other.cluster.heartbeat_ms = 60;
  refused(*user.system, other, "middleman.heartbeat-interval is 50 ms, options.cluster.heartbeat_ms 60");
  other = Options();
  other.cluster.connection_timeout_ms += 1;
  refused(*user.system, other, "middleman.connection-timeout");
  Pki pki;
  refused(*user.system, pki.Options(), "asks for TLS but the actor system has no openssl manager");
  {
    ServerOptions tls = pki.Options();
    UserSystem tls_user(tls.cluster);
    // The same CA at another path: it verifies, but it is not the file the
    // system's openssl manager loaded.
    const std::filesystem::path copy = pki.dir / "ca-copy.pem";
    std::filesystem::copy_file(tls.cluster.tls_ca, copy);
    tls.cluster.tls_ca = copy.string();
    refused(*tls_user.system, tls, "openssl cafile (tls_ca)");
  }
  {
    caf::actor_system_config config;
    REQUIRE_OK(ConfigureClusterNetwork(config, Options().cluster));
    config.set("middleman.app-identifiers", std::vector<std::string>{"someone-else"});
    caf::actor_system system{config};
    refused(system, Options(), "app-identifiers [someone-else] lack \"foreman\"");
  }

  // ConfigureClusterNetwork: the application's own ids stay.
  {
    caf::actor_system_config config;
    config.set("middleman.app-identifiers", std::vector<std::string>{"my-app"});
    REQUIRE_OK(ConfigureClusterNetwork(config, Options().cluster));
    const auto ids = caf::get_or(config, "middleman.app-identifiers", std::vector<std::string>{});
    CHECK(ids == std::vector<std::string>{"my-app", "foreman"});
  }
  // Bad options: INVALID_ARGUMENT, nothing loaded.
  for (int bad = 0; bad < 3; ++bad) {
    ClusterOptions options = Options().cluster;
    std::string why;
    if (bad == 0) options.heartbeat_ms = 0, why = "--heartbeat-ms must be > 0";
    if (bad == 1) options.tls_cert = pki.Options().cluster.tls_cert, why = "missing: --tls-key, --tls-ca";
    if (bad == 2) {
      options = pki.Options().cluster;
      options.tls_key = (pki.dir / "absent.key").string();
      why = "absent.key";
    }
    caf::actor_system_config config;
    Status s = ConfigureClusterNetwork(config, options);
    CHECK_MESSAGE(s.code() == absl::StatusCode::kInvalidArgument, s);
    CHECK_MESSAGE(absl::StrContains(s.message(), why), s);
    caf::actor_system system{config};
    CHECK_FALSE(system.has_middleman());
  }
}

TEST_CASE("QueryClusterStatus (foreman cluster status): a worker lists every task, a ps only itself") {
  Cluster c(1, 2);
  std::shared_ptr<RemoteValues> rv = c.Remote(0);
  REQUIRE_OK(rv->Bind(kNames));
  VariableStore local;
  Fill(local, 7);
  REQUIRE_OK(rv->Write(local, kInit));
  REQUIRE_OK(rv->Apply(Grads(0.05f, 0.3f), 7));
  REQUIRE_OK(rv->Apply(Grads(0.05f, 0.4f), 8));
  c.workers[1].reset();  // worker 1 is gone: unreachable
  ClusterOptions o;
  o.heartbeat_ms = 50;
  o.connection_timeout_ms = kConnectionTimeoutMs;
  const std::string chief = absl::StrCat("127.0.0.1:", c.worker_ports[0]);
  const std::string ps = absl::StrCat("127.0.0.1:", c.ps_ports[0]);

  StatusOr<std::vector<ClusterTaskReport>> r = QueryClusterStatus("tcp://" + chief, o, 2000);
  REQUIRE_MESSAGE(r.ok(), r.status().ToString());
  REQUIRE(r->size() == 3);
  const ClusterTaskReport& w0 = (*r)[0];
  CHECK(w0.reachable);
  CHECK(w0.job_name == "worker");
  CHECK(w0.task_index == 0);
  CHECK(w0.address == chief);
  CHECK(w0.worker_steps == 2);  // its two accepted Applies
  // When it last heard from ps 0 (its last Apply's answer): known, recent.
  REQUIRE(w0.ps_last_answer_ms.size() == 1);
  CHECK(w0.ps_last_answer_ms[0] >= 0);
  CHECK(w0.ps_last_answer_ms[0] < 10'000);
  const ClusterTaskReport& p0 = (*r)[1];
  CHECK(p0.reachable);
  CHECK(p0.job_name == "ps");
  CHECK(p0.task_index == 0);
  CHECK(p0.address == ps);
  CHECK(p0.initialized);
  CHECK(p0.global_step == 9);
  CHECK(p0.applied_updates == 2);
  CHECK(p0.worker_applies == std::vector<int64_t>{2});  // worker 0's, none from worker 1
  REQUIRE(p0.worker_last_apply_ms.size() == 1);
  CHECK(p0.worker_last_apply_ms[0] >= 0);
  CHECK(p0.worker_last_apply_ms[0] < 10'000);
  const ClusterTaskReport& w1 = (*r)[2];
  CHECK_FALSE(w1.reachable);
  CHECK(w1.job_name == "worker");
  CHECK(w1.task_index == 1);
  CHECK_MESSAGE(absl::StrContains(w1.error, absl::StrCat(c.worker_ports[1])), w1.error);

  // A ps asked directly knows only itself.
  r = QueryClusterStatus("tcp://" + ps, o, 2000);
  REQUIRE_MESSAGE(r.ok(), r.status().ToString());
  REQUIRE(r->size() == 1);
  CHECK((*r)[0].reachable);
  CHECK((*r)[0].global_step == 9);

  // Nothing listens: one report, unreachable.
  r = QueryClusterStatus(absl::StrCat("tcp://127.0.0.1:", c.worker_ports[1]), o, 2000);
  REQUIRE_MESSAGE(r.ok(), r.status().ToString());
  REQUIRE(r->size() == 1);
  CHECK_FALSE((*r)[0].reachable);

  // Bad input: nothing asked.
  CHECK(QueryClusterStatus(chief, o, 2000).status().code() == absl::StatusCode::kInvalidArgument);
  // The library's messages name the option first, then the CLI's flag.
  Status no_tls = QueryClusterStatus("tls://" + chief, o, 2000).status();
  CHECK(no_tls.code() == absl::StatusCode::kInvalidArgument);
  CHECK_MESSAGE(absl::StrContains(no_tls.message(), "give ClusterOptions' tls_cert, tls_key and tls_ca"), no_tls);
  Status zero = QueryClusterStatus("tcp://" + chief, o, 0).status();
  CHECK(zero.code() == absl::StatusCode::kInvalidArgument);
  CHECK(zero.message() == "QueryClusterStatus: timeout_ms (--timeout-ms) must be > 0, got 0");
  CHECK(QueryClusterStatus("tcp://127.0.0.1:99999", o, 2000).status().code() ==
        absl::StatusCode::kInvalidArgument);
}

TEST_CASE("per-worker steps/s: two workers' applies read from ps 0 become two rates (steps_per_sec/worker_K)") {
  Cluster c(2, 3);
  std::shared_ptr<RemoteValues> chief = c.Remote(0), other = c.Remote(1);
  REQUIRE_OK(chief->Bind(kNames));
  REQUIRE_OK(other->Bind(kNames));
  VariableStore local;
  Fill(local, 0);
  REQUIRE_OK(chief->Write(local, kInit));
  double now = 100.0;  // a fake clock (seconds)
  internal::WorkerStepRates rates([&c] { return internal::WorkerAppliesOnPs0(*c.workers[0]); }, 3,
                                  [&now] { return now; });
  StatusOr<std::vector<double>> primed = rates.Sample();
  REQUIRE_MESSAGE(primed.ok(), primed.status().ToString());
  CHECK(primed->empty());  // the first read primes
  for (int i = 0; i < 6; ++i) REQUIRE(chief->Apply(Grads(0.05f, 0.3f), i).ok());
  for (int i = 0; i < 3; ++i) REQUIRE(other->Apply(Grads(0.05f, 0.3f), i).ok());
  StatusOr<std::vector<int64_t>> counts = internal::WorkerAppliesOnPs0(*c.workers[1]);
  REQUIRE_MESSAGE(counts.ok(), counts.status().ToString());
  CHECK(*counts == std::vector<int64_t>{6, 3});  // worker 2 never applied: not in ps 0's counts
  now += 2.0;
  StatusOr<std::vector<double>> r = rates.Sample();
  REQUIRE_MESSAGE(r.ok(), r.status().ToString());
  CHECK(*r == std::vector<double>{3.0, 1.5, 0.0});  // per second over the 2 s; worker 2 at 0
  REQUIRE_OK(chief->Apply(Grads(0.05f, 0.3f), 9));
  now += 0.5;
  std::vector<std::string> summaries = rates.Summaries();
  REQUIRE(summaries.size() == 3);
  CHECK(summaries[0] == ScalarSummary("steps_per_sec/worker_0", 2.0f));
  CHECK(summaries[1] == ScalarSummary("steps_per_sec/worker_1", 0.0f));
  CHECK(summaries[2] == ScalarSummary("steps_per_sec/worker_2", 0.0f));
  // Worker 2 never asked a ps task anything: "never" (-1) for both; ps 0
  // never heard from it (its counts stop at worker 1).
  ClusterOptions o;
  o.heartbeat_ms = 50;
  o.connection_timeout_ms = kConnectionTimeoutMs;
  StatusOr<std::vector<ClusterTaskReport>> st =
      QueryClusterStatus(absl::StrCat("tcp://127.0.0.1:", c.worker_ports[2]), o, 2000);
  REQUIRE_MESSAGE(st.ok(), st.status().ToString());
  REQUIRE(st->size() == 5);  // worker 2, ps 0, ps 1, worker 0, worker 1
  CHECK((*st)[0].ps_last_answer_ms == std::vector<int64_t>{-1, -1});
  CHECK((*st)[1].worker_applies == std::vector<int64_t>{7, 3});
  CHECK((*st)[1].worker_last_apply_ms.size() == 2);
  CHECK((*st)[3].ps_last_answer_ms.size() == 2);  // worker 0 heard from both
  CHECK((*st)[3].ps_last_answer_ms[0] >= 0);
  CHECK((*st)[3].ps_last_answer_ms[1] >= 0);
  // ps 0 gone: an error naming it; no summaries (a WARNING); a ps task's Server has no such counts.
  c.ps[0].reset();
  now += 1.0;
  StatusOr<std::vector<int64_t>> gone = internal::WorkerAppliesOnPs0(*c.workers[0]);
  CHECK(gone.status().code() == absl::StatusCode::kUnavailable);
  CHECK_MESSAGE(absl::StrContains(gone.status().message(), "ps task 0"), gone.status());
  CHECK(rates.Summaries().empty());
  CHECK(internal::WorkerAppliesOnPs0(*c.ps[1]).status().code() == absl::StatusCode::kFailedPrecondition);
}

TEST_CASE("QueryClusterStatus: a port where nothing listens is one unreachable report naming host:port") {
  const int port = FreePorts(1)[0];  // released: nothing listens there
  const std::string address = absl::StrCat("127.0.0.1:", port);
  ClusterOptions o;
  o.heartbeat_ms = 50;
  o.connection_timeout_ms = kConnectionTimeoutMs;
  const auto start = Clock::now();
  StatusOr<std::vector<ClusterTaskReport>> r = QueryClusterStatus("tcp://" + address, o, 2000);
  REQUIRE_MESSAGE(r.ok(), r.status().ToString());  // an unreachable task is a report, not an error
  CHECK(Clock::now() - start < milliseconds(ScaledMs(10000)));
  REQUIRE(r->size() == 1);
  const ClusterTaskReport& asked = (*r)[0];
  CHECK_FALSE(asked.reachable);
  CHECK(asked.address == address);
  CHECK(asked.job_name.empty());
  CHECK(asked.task_index == -1);
  CHECK(asked.worker_steps == -1);
  CHECK_MESSAGE(absl::StrContains(asked.error, address), asked.error);
}

TEST_CASE("WorkerStepRateSummaries: the chief's function primes, then gives one scalar per worker task") {
  Cluster c(1, 2);
  std::shared_ptr<RemoteValues> chief = c.Remote(0);
  REQUIRE_OK(chief->Bind(kNames));
  VariableStore local;
  Fill(local, 0);
  REQUIRE_OK(chief->Write(local, kInit));
  std::function<std::vector<std::string>()> summaries = WorkerStepRateSummaries(c.workers[0].get(), 2);
  CHECK(summaries().empty());  // the first call primes
  for (int i = 0; i < 3; ++i) REQUIRE(chief->Apply(Grads(0.05f, 0.3f), i).ok());
  std::vector<std::string> s = summaries();
  REQUIRE(s.size() == 2);
  for (int k = 0; k < 2; ++k) {
    CHECK_MESSAGE(absl::StrContains(s[k], absl::StrCat("steps_per_sec/worker_", k)), k);
  }
  CHECK(s[0] != ScalarSummary("steps_per_sec/worker_0", 0.0f));  // worker 0 applied 3 steps
  CHECK(s[1] == ScalarSummary("steps_per_sec/worker_1", 0.0f));  // worker 1 none
  // A ps task's Server has no per-worker counts: none (a WARNING), not a crash.
  CHECK(WorkerStepRateSummaries(c.ps[0].get(), 2)().empty());
  // ps 0 gone: the read fails, none.
  c.ps[0].reset();
  CHECK(summaries().empty());
}

// Applies in a loop on another thread while something connects to the ps's
// port and closes at once (sending nothing); how many applies succeed in the
// `window` after that, and the first error.
std::pair<int, std::string> AppliesAfterConnectAndClose(RemoteValues& rv, int ps_port, milliseconds window) {
  std::atomic<bool> done{false};
  std::atomic<int> applied{0};
  std::string failed;  // written by the trainer before it returns, read after join
  std::thread trainer([&] {
    for (int64_t step = 4; !done.load(); ++step) {
      StatusOr<int64_t> gs = rv.Apply(Grads(0.01f, 1.0f), step);
      if (!gs.ok()) {
        failed = gs.status().ToString();
        return;
      }
      applied.fetch_add(1);
    }
  });
  const auto deadline = Clock::now() + milliseconds(ScaledMs(2000));
  while (applied.load() < 20 && Clock::now() < deadline) std::this_thread::sleep_for(milliseconds(5));
  const int before = applied.load();
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<uint16_t>(ps_port));
  const bool connected = connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0;
  close(fd);
  std::this_thread::sleep_for(window);
  const int after = applied.load() - before;
  done = true;
  trainer.join();
  if (!connected) return {-1, "cannot connect to the ps's port"};
  return {after, failed};
}

TEST_CASE("a connect-and-close on a plain ps's port does not stall its worker's applies") {
  Cluster c(1, 1);
  std::shared_ptr<RemoteValues> rv = c.Remote();
  REQUIRE_OK(rv->Bind(kNames));
  VariableStore source;
  Fill(source, 3);
  REQUIRE_OK(rv->Write(source, kInit));
  auto [applied, error] = AppliesAfterConnectAndClose(*rv, c.ps_ports[0], milliseconds(500));
  CHECK_MESSAGE(applied >= 10, applied, " applies in 500 ms after the connect-and-close; ", error);
  CHECK_MESSAGE(error.empty(), error);
}

// With mutual TLS, CAF 0.17.6's openssl module left the failed handshake's
// error on the multiplexer thread's OpenSSL error queue, and a connection
// that reached the ps while a worker's applies flowed stalled that worker's
// link: 1 apply in 500 ms after it (about 1700 before), then UNAVAILABLE
// "no answer within request_timeout_ms" while the link stayed up. Fixed by
// actors/tls_error_queue.cpp (which clears the queue before each TLS call).
TEST_CASE("mutual TLS: a connect-and-close on a ps's port does not stall its worker's applies") {
  Pki pki;
  Cluster c(1, 1, pki.Options());
  std::shared_ptr<RemoteValues> rv = c.Remote();
  REQUIRE_OK(rv->Bind(kNames));
  VariableStore source;
  Fill(source, 3);
  REQUIRE_OK(rv->Write(source, kInit));
  auto [applied, error] = AppliesAfterConnectAndClose(*rv, c.ps_ports[0], milliseconds(500));
  CHECK_MESSAGE(applied >= 10, applied, " applies in 500 ms after the connect-and-close; ", error);
  CHECK_MESSAGE(error.empty(), error);
}

}  // namespace
}  // namespace foreman
