// The cluster's network layer (actors/cluster_net.hpp): two actor systems in
// this process talking BASP (and TLS) over 127.0.0.1. Every wait is bounded.
#include "actors/cluster_net.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <caf/all.hpp>
#include <doctest/doctest.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "actors/messages.hpp"
#include "support/test_util.hpp"
#include "foreman/tensor.hpp"

namespace foreman {
namespace {

using internal::ConnectActor;
using internal::NetConfig;
using internal::PublishActor;
using internal::TensorMessage;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

const milliseconds kConnect{testing::ScaledMs(2000)};  // scaled: tests/support/test_util.hpp
constexpr auto kReply = std::chrono::seconds(5);

// An actor answering ping with pong. Spawned with an argument: CAF 0.17.6's
// init_fun_factory dereferences the null argument tuple of a function actor
// spawned with none (UBSan: reference binding to null pointer).
caf::behavior Ponger(caf::event_based_actor* /*self*/, const std::string& /*role*/) {
  return {[](caf::ping_atom) { return caf::pong_atom::value; }};
}

// A cluster node: its config and its system (config first: it must outlive
// the system). Actors the test publishes are stopped before the system ends.
struct Node {
  caf::actor_system_config cfg;
  std::unique_ptr<caf::actor_system> sys;
  std::vector<caf::actor> published;
  explicit Node(const NetConfig& net) {
    cfg.set("scheduler.max-threads", size_t{2});
    internal::ConfigureClusterNetwork(cfg, net);
    sys = std::make_unique<caf::actor_system>(cfg);
  }
  ~Node() {
    for (auto& a : published) caf::anon_send_exit(a, caf::exit_reason::user_shutdown);
    published.clear();
    sys.reset();
  }
  // Spawns an echo actor and publishes it on 127.0.0.1 (a free port).
  uint16_t PublishEcho(bool tls = false) {
    caf::actor echo = sys->spawn(
        [](caf::event_based_actor*, const std::string& /*role: see Ponger*/) -> caf::behavior {
          return {[](TensorMessage& m) { return std::move(m); }, [](caf::ping_atom) { return caf::pong_atom::value; }};
        },
        std::string("echo"));
    published.push_back(echo);
    auto port = PublishActor(*sys, echo, "127.0.0.1", 0, tls);
    REQUIRE_MESSAGE(port.ok(), port.status().ToString());
    REQUIRE(*port != 0);
    return *port;
  }
};

NetConfig Plain() { return NetConfig{}; }

// The echo of `m` through `remote`, or an error.
StatusOr<TensorMessage> Echo(caf::actor_system& sys, const caf::actor& remote, const TensorMessage& m) {
  caf::scoped_actor self{sys};
  StatusOr<TensorMessage> out = absl::UnknownError("no reply");
  self->request(remote, kReply, m)
      .receive([&](TensorMessage& back) { out = std::move(back); },
               [&](caf::error& e) { out = absl::UnavailableError(sys.render(e)); });
  return out;
}

bool Pong(caf::actor_system& sys, const caf::actor& remote) {
  caf::scoped_actor self{sys};
  bool ok = false;
  self->request(remote, kReply, caf::ping_atom::value).receive([&](caf::pong_atom) { ok = true; }, [](caf::error&) {});
  return ok;
}

Tensor Floats(int64_t n, float seed) {
  Tensor t(DataType::kFloat, TensorShape({n}));
  for (int64_t i = 0; i < n; ++i) t.data<float>()[i] = seed * static_cast<float>(i) + 0.25f;
  return t;
}

// Publishes an echo on one node, connects from another, echoes a tensor.
void CheckEchoWorks(Node& client, const caf::actor& remote, int64_t n) {
  const Tensor t = Floats(n, 1.5f);
  auto back = Echo(*client.sys, remote, internal::ToMessage("w", t).value());
  REQUIRE_MESSAGE(back.ok(), back.status().ToString());
  auto restored = internal::FromMessage(*back);
  REQUIRE_OK(restored);
  CHECK(restored->Equals(t));
  CHECK(std::memcmp(restored->raw_data(), t.raw_data(), t.TotalBytes()) == 0);
}

// -- raw sockets ----------------------------------------------------------------

int ListenLoopback(uint16_t* port) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  REQUIRE(fd >= 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  REQUIRE(::listen(fd, 64) == 0);
  socklen_t len = sizeof a;
  REQUIRE(::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0);
  *port = ntohs(a.sin_port);
  return fd;
}

int ConnectRaw(uint16_t port) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  REQUIRE(fd >= 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(port);
  REQUIRE(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  return fd;
}

void SendAll(int fd, const std::string& bytes) {
  size_t off = 0;
  while (off < bytes.size()) {
    ssize_t n = ::send(fd, bytes.data() + off, bytes.size() - off, MSG_NOSIGNAL);
    if (n <= 0) return;  // the node closed on us: fine
    off += static_cast<size_t>(n);
  }
}

// A TCP relay 127.0.0.1:port() -> 127.0.0.1:target for one connection, on
// its own thread. Freeze() stops relaying but keeps both sockets open (a
// frozen peer or a partition: no FIN); Cut() closes both (a dead peer).
class Relay {
 public:
  explicit Relay(uint16_t target) : target_(target) {
    listen_fd_ = ListenLoopback(&port_);
    thread_ = std::thread([this] { Run(); });
  }
  ~Relay() {
    stop_ = true;
    thread_.join();
    ::close(listen_fd_);
  }
  uint16_t port() const { return port_; }
  void Freeze() { frozen_ = true; }
  void Cut() { cut_ = true; }
  // Sends `bytes` to the target as if from the connected client, between
  // two of the client's reads (whole frames when the client is idle).
  void Inject(std::string bytes) {
    std::lock_guard<std::mutex> lock(mu_);
    inject_ += bytes;
  }

 private:
  void Run() {
    int a = -1, b = -1;
    char buf[65536];
    while (!stop_) {
      if (cut_ && a >= 0) {
        ::shutdown(a, SHUT_RDWR);
        ::shutdown(b, SHUT_RDWR);
        ::close(a);
        ::close(b);
        a = b = -1;
      }
      if (a < 0 && !cut_) {
        pollfd p{listen_fd_, POLLIN, 0};
        if (::poll(&p, 1, 20) > 0) {
          a = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
          if (a >= 0) b = ConnectRawNoCheck(target_);
        }
        continue;
      }
      if (a < 0 || frozen_) {
        std::this_thread::sleep_for(milliseconds(10));  // polling a flag, not synchronising
        continue;
      }
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (!inject_.empty()) ::send(b, inject_.data(), inject_.size(), MSG_NOSIGNAL);
        inject_.clear();
      }
      pollfd p[2] = {{a, POLLIN, 0}, {b, POLLIN, 0}};
      if (::poll(p, 2, 20) <= 0) continue;
      for (int i = 0; i < 2; ++i) {
        if (!(p[i].revents & (POLLIN | POLLHUP))) continue;
        ssize_t n = ::recv(p[i].fd, buf, sizeof buf, 0);
        if (n <= 0) {
          cut_ = true;
          break;
        }
        ::send(p[1 - i].fd, buf, static_cast<size_t>(n), MSG_NOSIGNAL);
      }
    }
    if (a >= 0) ::close(a);
    if (b >= 0) ::close(b);
  }
  static int ConnectRawNoCheck(uint16_t port) {
    int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = htons(port);
    ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
    return fd;
  }

  const uint16_t target_;
  uint16_t port_ = 0;
  int listen_fd_ = -1;
  std::atomic<bool> stop_{false}, frozen_{false}, cut_{false};
  std::mutex mu_;
  std::string inject_;  // guarded by mu_
  std::thread thread_;
};

// Waits (bounded) for a down_msg about `remote` on `self`.
std::optional<caf::down_msg> AwaitDown(caf::scoped_actor& self, std::chrono::milliseconds timeout) {
  std::optional<caf::down_msg> down;
  self->receive([&](caf::down_msg& d) { down = std::move(d); }, caf::after(timeout) >> [] {});
  return down;
}

// -- tests ---------------------------------------------------------------------------

TEST_CASE("an echo actor published on port 0 echoes a 1 MiB and a small tensor bit-exactly") {
  Node server(Plain()), client(Plain());
  const uint16_t port = server.PublishEcho();
  auto remote = ConnectActor(*client.sys, "127.0.0.1", port, false, kConnect);
  REQUIRE_MESSAGE(remote.ok(), remote.status().ToString());
  CheckEchoWorks(client, *remote, (1 << 20) / 4);
  CheckEchoWorks(client, *remote, 3);

  // A malformed tensor travels (it is only bytes) but is refused on receipt.
  TensorMessage bad = internal::ToMessage("b", Floats(4, 1.f)).value();
  bad.bytes.pop_back();
  auto back = Echo(*client.sys, *remote, bad);
  REQUIRE_OK(back);
  CHECK(absl::IsInvalidArgument(internal::FromMessage(*back).status()));
  bad = internal::ToMessage("b", Floats(4, 1.f)).value();
  bad.dtype = 42;
  back = Echo(*client.sys, *remote, bad);
  REQUIRE_OK(back);
  CHECK(absl::IsInvalidArgument(internal::FromMessage(*back).status()));
}

// CAF 0.17's BASP workers (its default: 1 to 4) copy every received payload
// into their own buffer before deserializing it (basp::worker::launch): a
// second user-space copy of each tensor. Without them the middleman's thread
// deserializes where it read, the one copy TransportCopyCounters counts; the
// echo above goes through that path.
TEST_CASE("a cluster node runs no BASP workers, so a received tensor is copied once") {
  caf::actor_system_config cfg;
  internal::ConfigureClusterNetwork(cfg, Plain());
  CHECK(caf::get_or(cfg, "middleman.workers", caf::defaults::middleman::workers) == 0);
}

TEST_CASE("PublishActor binds exactly to the host it is given and refuses an empty one") {
  Node server(Plain());
  caf::actor a = server.sys->spawn(Ponger, std::string("bind"));
  server.published.push_back(a);
  auto empty = PublishActor(*server.sys, a, "", 0, false);
  CHECK(absl::IsInvalidArgument(empty.status()));
  auto port = PublishActor(*server.sys, a, "127.0.0.1", 0, false);
  REQUIRE_OK(port);
  // Bound to 127.0.0.1 only: the same port on 127.0.0.2 (also loopback) is free.
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(0x7f000002);
  addr.sin_port = htons(*port);
  CHECK(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
  ::close(fd);
  // The same port again: UNAVAILABLE naming host:port.
  auto again = PublishActor(*server.sys, a, "127.0.0.1", *port, false);
  CHECK(absl::IsUnavailable(again.status()));
  CHECK(absl::StrContains(again.status().message(), absl::StrCat("127.0.0.1:", *port)));
  // TLS without the openssl manager.
  CHECK(absl::IsFailedPrecondition(PublishActor(*server.sys, a, "127.0.0.1", 0, true).status()));
}

TEST_CASE("connecting to a closed port is UNAVAILABLE at once; to a silent listener DEADLINE_EXCEEDED") {
  Node client(Plain());
  uint16_t closed_port = 0;
  ::close(ListenLoopback(&closed_port));  // a port nobody listens on now
  auto t0 = Clock::now();
  auto closed = ConnectActor(*client.sys, "127.0.0.1", closed_port, false, kConnect);
  CHECK(Clock::now() - t0 < milliseconds(testing::ScaledMs(1000)));
  CHECK(absl::IsUnavailable(closed.status()));
  CHECK(absl::StrContains(closed.status().message(), absl::StrCat("127.0.0.1:", closed_port)));

  // The kernel completes the TCP handshake from the backlog; nobody speaks.
  uint16_t silent_port = 0;
  const int silent = ListenLoopback(&silent_port);
  t0 = Clock::now();
  auto hung = ConnectActor(*client.sys, "127.0.0.1", silent_port, false, milliseconds(300));
  const auto took = Clock::now() - t0;
  ::close(silent);
  CHECK_MESSAGE(absl::IsDeadlineExceeded(hung.status()), hung.status().ToString());
  CHECK(absl::StrContains(hung.status().message(), absl::StrCat("127.0.0.1:", silent_port)));
  CHECK(absl::StrContains(hung.status().message(), "300 ms"));
  CHECK(took >= milliseconds(290));
  CHECK(took < milliseconds(testing::ScaledMs(1500)));
  // ~Node: the system shuts down with the handshake still pending (the
  // test binary's timeout would catch a hang).
}

TEST_CASE("ConnectActor: the largest timeout does not overflow into the past, and a 0 ms one still tries once") {
  Node server(Plain()), client(Plain());
  const uint16_t port = server.PublishEcho();
  auto longest = ConnectActor(*client.sys, "127.0.0.1", port, false, milliseconds::max());
  REQUIRE_MESSAGE(longest.ok(), longest.status().ToString());
  CHECK(Pong(*client.sys, *longest));
  uint16_t silent_port = 0;
  const int silent = ListenLoopback(&silent_port);
  auto none = ConnectActor(*client.sys, "127.0.0.1", silent_port, false, milliseconds(0));
  ::close(silent);
  CHECK_MESSAGE(absl::IsDeadlineExceeded(none.status()), none.status().ToString());
  CHECK_FALSE(absl::StrContains(none.status().message(), "0 attempt(s)"));
}

TEST_CASE("a monitor sees the peer's actor exit, and a dropped connection as peer lost") {
  Node server(Plain()), client(Plain());
  const uint16_t port = server.PublishEcho();
  caf::scoped_actor self{*client.sys};

  // The actor exits: a down_msg with its reason (not a lost peer). (Another
  // node: BASP keeps one route per node, and a second connection to the
  // same node would only be an alternative route.)
  {
    Node other(Plain());
    caf::actor doomed = other.sys->spawn(Ponger, std::string("doomed"));
    other.published.push_back(doomed);
    auto doomed_port = PublishActor(*other.sys, doomed, "127.0.0.1", 0, false);
    REQUIRE_OK(doomed_port);
    auto remote = ConnectActor(*client.sys, "127.0.0.1", *doomed_port, false, kConnect);
    REQUIRE_OK(remote);
    self->monitor(*remote);
    // A round trip after the monitor: BASP keeps order on a connection, so
    // the peer has registered the monitor (a monitor that reaches an actor
    // already gone yields exit_reason::unknown instead).
    REQUIRE(Pong(*client.sys, *remote));
    caf::anon_send_exit(doomed, caf::exit_reason::kill);
    auto down = AwaitDown(self, milliseconds(testing::ScaledMs(3000)));
    REQUIRE(down.has_value());
    CHECK_MESSAGE(down->reason == caf::exit_reason::kill, client.sys->render(down->reason));
    CHECK_FALSE(internal::IsPeerLost(*down));
  }

  // The publishing system shuts down (its actors exit, then its middleman
  // closes the connection): a down_msg, bounded.
  {
    auto closing = std::make_unique<Node>(Plain());
    const uint16_t closing_port = closing->PublishEcho();
    auto remote = ConnectActor(*client.sys, "127.0.0.1", closing_port, false, kConnect);
    REQUIRE_OK(remote);
    self->monitor(*remote);
    REQUIRE(Pong(*client.sys, *remote));
    closing.reset();
    auto down = AwaitDown(self, milliseconds(testing::ScaledMs(3000)));
    REQUIRE(down.has_value());
    MESSAGE("publishing system shut down -> down_msg ", client.sys->render(down->reason));
  }

  // The connection drops (a killed process: the kernel closes its sockets).
  Relay relay(port);
  auto remote = ConnectActor(*client.sys, "127.0.0.1", relay.port(), false, kConnect);
  REQUIRE_MESSAGE(remote.ok(), remote.status().ToString());
  CHECK(Pong(*client.sys, *remote));
  self->monitor(*remote);
  const auto t0 = Clock::now();
  relay.Cut();
  auto down = AwaitDown(self, milliseconds(testing::ScaledMs(3000)));
  REQUIRE(down.has_value());
  CHECK(internal::IsPeerLost(*down));
  MESSAGE("connection cut -> down_msg after ",
          std::chrono::duration_cast<milliseconds>(Clock::now() - t0).count(), " ms");
}

TEST_CASE("heartbeats: a frozen peer (no FIN) is dropped after the connection timeout") {
  // 100 / 500 ms times TimeScale() (3x under the sanitizers: a slowed
  // heartbeat thread must not drop the healthy link), still timeout = 5 x
  // interval.
  NetConfig net;
  net.heartbeat_ms = testing::ScaledMs(100);
  net.connection_timeout_ms = testing::ScaledMs(500);
  Node server(net), client(net);
  const uint16_t port = server.PublishEcho();
  Relay relay(port);
  auto remote = ConnectActor(*client.sys, "127.0.0.1", relay.port(), false, kConnect);
  REQUIRE_MESSAGE(remote.ok(), remote.status().ToString());
  caf::scoped_actor self{*client.sys};
  self->monitor(*remote);
  // Healthy for well over the timeout: the heartbeats keep the link.
  CHECK_FALSE(AwaitDown(self, milliseconds(testing::ScaledMs(1200))).has_value());
  CHECK(Pong(*client.sys, *remote));
  const auto t0 = Clock::now();
  relay.Freeze();  // both sockets stay open; nothing gets through
  auto down = AwaitDown(self, milliseconds(testing::ScaledMs(4000)));
  const auto took = Clock::now() - t0;
  REQUIRE(down.has_value());
  CHECK(internal::IsPeerLost(*down));
  CHECK(took >= milliseconds(testing::ScaledMs(400)));
  CHECK(took < milliseconds(testing::ScaledMs(2500)));
  MESSAGE("frozen peer dropped after ", std::chrono::duration_cast<milliseconds>(took).count(), " ms");
}

// A BASP header (32 bytes, network byte order): operation, 2 padding bytes,
// flags, payload_len, operation_data, source_actor, dest_actor.
std::string BaspHeader(uint8_t operation, uint32_t payload_len, uint64_t operation_data, uint64_t dest) {
  std::string h(32, '\0');
  h[0] = static_cast<char>(operation);
  for (int i = 0; i < 4; ++i) h[4 + i] = static_cast<char>(payload_len >> (24 - 8 * i));
  for (int i = 0; i < 8; ++i) h[8 + i] = static_cast<char>(operation_data >> (56 - 8 * i));
  for (int i = 0; i < 8; ++i) h[24 + i] = static_cast<char>(dest >> (56 - 8 * i));
  return h;
}

TEST_CASE("junk on the port: the node survives and its echo actor still answers") {
  Node server(Plain()), client(Plain());
  const uint16_t port = server.PublishEcho();
  std::mt19937 rng(13);
  std::string random(64 * 1024, '\0');
  for (auto& c : random) c = static_cast<char>(rng());
  std::vector<std::string> junk = {
      random,
      "GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n",
      std::string(64, '\xff'),
      // A truncated header (handshake cut short).
      BaspHeader(0x00, 60, 1, 0).substr(0, 17),
      // A malformed header claiming 4 GiB: a heartbeat may carry no payload,
      // so CAF refuses the header before reading any payload.
      BaspHeader(0x06, 0xffffffffu, 0, 0),
      // A valid-looking direct message claiming 64 MiB, then nothing: the
      // BASP header guard refuses it (no message before a handshake).
      BaspHeader(0x02, 64u << 20, 0, 1),
  };
  std::vector<int> open;
  for (const auto& bytes : junk) {
    int fd = ConnectRaw(port);
    SendAll(fd, bytes);
    open.push_back(fd);
  }
  for (int i = 0; i < 50; ++i) open.push_back(ConnectRaw(port));  // idle connections
  auto remote = ConnectActor(*client.sys, "127.0.0.1", port, false, kConnect);
  REQUIRE_MESSAGE(remote.ok(), remote.status().ToString());
  CheckEchoWorks(client, *remote, 1024);
  for (int fd : open) ::close(fd);
  CHECK(Pong(*client.sys, *remote));
}

// This process's peak resident set (VmHWM of /proc/self/status), in KiB.
int64_t PeakRssKib() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmHWM:", 0) == 0) return std::stoll(line.substr(6));
  }
  return -1;
}

// Reads (and drops) what the node sends on `fd` (its server handshake) until
// it closes the connection: true, or `timeout` passes: false.
bool ClosedByNode(int fd, milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  char buf[4096];
  for (;;) {
    const auto left = std::chrono::duration_cast<milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) return false;
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(left)) <= 0) continue;
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0) return true;  // EOF or reset: closed
  }
}

// The BASP header guard (cluster_net.hpp): headers that CAF 0.17.6 accepts
// and would size its read buffer to (4 GiB per connection, before any
// handshake) close the connection at once, the node's peak RSS does not
// grow by the claim, and a real client still connects and echoes.
TEST_CASE("BASP header guard: a 4 GiB claim and a message before the handshake close the connection unallocated") {
  REQUIRE(internal::BaspHeaderGuardActive());
  Node server(Plain()), client(Plain());
  const uint16_t port = server.PublishEcho();
  const int64_t peak_before = PeakRssKib();
  REQUIRE(peak_before > 0);
  const uint64_t refused_before = internal::RefusedBaspHeaders();
  const std::vector<std::pair<const char*, std::string>> attacks = {
      {"a direct message claiming 4 GiB", BaspHeader(0x02, 0xffffffffu, 0, 1)},
      {"a client handshake claiming 4 GiB", BaspHeader(0x01, 0xffffffffu, 0, 0)},
      {"a client handshake claiming 64 KiB + 1", BaspHeader(0x01, internal::kMaxHandshakePayloadBytes + 1, 0, 0)},
      {"a direct message of 8 bytes before the handshake", BaspHeader(0x02, 8, 0, 1) + std::string(8, 'x')},
  };
  for (const auto& [what, bytes] : attacks) {
    int fd = ConnectRaw(port);
    SendAll(fd, bytes);
    CHECK_MESSAGE(ClosedByNode(fd, milliseconds(testing::ScaledMs(3000))), std::string(what), ": the node did not close the connection in 3 s");
    ::close(fd);
  }
  CHECK(internal::RefusedBaspHeaders() - refused_before == attacks.size());
  const int64_t grown_kib = PeakRssKib() - peak_before;
  CHECK_MESSAGE(grown_kib < 64 * 1024, "peak RSS grew by ", grown_kib, " KiB");
  auto remote = ConnectActor(*client.sys, "127.0.0.1", port, false, kConnect);
  REQUIRE_MESSAGE(remote.ok(), remote.status().ToString());
  CheckEchoWorks(client, *remote, 1 << 20);  // 4 MiB of floats after the handshake: allowed
}

// After the handshake a payload may announce at most max_message_bytes
// (1 GiB): a peer that completed the handshake and then claims 4 GiB has its
// connection closed (its node sees the link lost), nothing allocated.
TEST_CASE("BASP header guard: after the handshake a claim above max_message_bytes closes the connection") {
  NetConfig quiet;  // no heartbeats: nothing but the test's frames on the link
  quiet.heartbeat_ms = 0;
  quiet.connection_timeout_ms = 0;
  Node server(quiet), client(quiet);
  const uint16_t port = server.PublishEcho();
  Relay relay(port);
  auto remote = ConnectActor(*client.sys, "127.0.0.1", relay.port(), false, kConnect);
  REQUIRE_MESSAGE(remote.ok(), remote.status().ToString());
  CheckEchoWorks(client, *remote, 1 << 20);  // the link works; then it is idle
  caf::scoped_actor self{*client.sys};
  self->monitor(*remote);
  const int64_t peak_before = PeakRssKib();
  const uint64_t refused_before = internal::RefusedBaspHeaders();
  relay.Inject(BaspHeader(0x02, 0xffffffffu, 0, 1));
  auto down = AwaitDown(self, milliseconds(testing::ScaledMs(3000)));
  REQUIRE_MESSAGE(down.has_value(), "the server kept the connection after a 4 GiB claim");
  CHECK(internal::IsPeerLost(*down));
  CHECK(internal::RefusedBaspHeaders() - refused_before == 1);
  const int64_t grown_kib = PeakRssKib() - peak_before;
  CHECK_MESSAGE(grown_kib < 64 * 1024, "peak RSS grew by ", grown_kib, " KiB");
}

TEST_CASE("another application id: the connecting side refuses, the server keeps serving") {
  NetConfig other;
  other.app_id = "not-foreman";
  Node server(other), client(Plain()), friend_node(other);
  const uint16_t port = server.PublishEcho();
  auto t0 = Clock::now();
  auto refused = ConnectActor(*client.sys, "127.0.0.1", port, false, kConnect);
  CHECK(Clock::now() - t0 < kConnect);
  CHECK(absl::IsUnavailable(refused.status()));
  CHECK(absl::StrContains(refused.status().message(), absl::StrCat("127.0.0.1:", port)));
  CHECK(absl::StrContains(refused.status().message(), "application id"));
  CHECK(absl::StrContains(refused.status().message(), "refused here, at the connecting side"));
  MESSAGE("wrong app id: ", refused.status().ToString());
  auto ok = ConnectActor(*friend_node.sys, "127.0.0.1", port, false, kConnect);
  REQUIRE_MESSAGE(ok.ok(), ok.status().ToString());
  CHECK(Pong(*friend_node.sys, *ok));
}

// -- TLS ------------------------------------------------------------------------

// The test PKI of tools/scripts/gen-tls-certs.sh: ca.pem, node1 and node2
// signed by it, rogue (signed by rogue-ca.pem, another CA).
struct Pki {
  std::filesystem::path dir;
  Pki() {
    dir = std::filesystem::temp_directory_path() / absl::StrCat("foreman_cluster_net_", ::getpid());
    std::filesystem::create_directories(dir);
    const char* testdata = std::getenv("FOREMAN_TESTDATA");
    REQUIRE_MESSAGE(testdata != nullptr, "FOREMAN_TESTDATA is not set (meson test sets it)");
    const std::string cmd = absl::StrCat("'", testdata, "/../../tools/scripts/gen-tls-certs.sh' --rogue rogue '",
                                         dir.string(), "' node1 node2");
    const int rc = std::system(cmd.c_str());
    REQUIRE_MESSAGE(rc == 0, cmd, " failed: ", rc);
  }
  ~Pki() { std::filesystem::remove_all(dir); }
  NetConfig Net(const std::string& name, const std::string& ca) const {
    NetConfig net;
    net.tls_cert = (dir / (name + ".pem")).string();
    net.tls_key = (dir / (name + ".key")).string();
    net.tls_ca = (dir / (ca + ".pem")).string();
    return net;
  }
};

TEST_CASE("mutual TLS: same-CA nodes talk; a rogue-CA client and a plain client are refused") {
  Pki pki;
  Node server(pki.Net("node1", "ca"));
  const uint16_t port = server.PublishEcho(/*tls=*/true);
  {
    Node rogue(pki.Net("rogue", "rogue-ca"));
    auto t0 = Clock::now();
    auto refused = ConnectActor(*rogue.sys, "127.0.0.1", port, true, kConnect);
    CHECK(Clock::now() - t0 < kConnect + milliseconds(testing::ScaledMs(500)));
    CHECK(absl::IsUnavailable(refused.status()));
    CHECK(absl::StrContains(refused.status().message(), "handshake"));
    MESSAGE("rogue CA: ", refused.status().ToString());
  }
  {
    Node plain(Plain());
    auto t0 = Clock::now();
    auto refused = ConnectActor(*plain.sys, "127.0.0.1", port, false, milliseconds(1000));
    CHECK(Clock::now() - t0 < milliseconds(testing::ScaledMs(2000)));
    CHECK_FALSE(refused.ok());
    CHECK((absl::IsUnavailable(refused.status()) || absl::IsDeadlineExceeded(refused.status())));
    MESSAGE("plain client on a TLS port: ", refused.status().ToString());
  }
  Node client(pki.Net("node2", "ca"));
  {
    Node plain_server(Plain());
    const uint16_t plain_port = plain_server.PublishEcho();
    auto t0 = Clock::now();
    auto refused = ConnectActor(*client.sys, "127.0.0.1", plain_port, true, milliseconds(1000));
    CHECK(Clock::now() - t0 < milliseconds(testing::ScaledMs(2000)));
    CHECK_FALSE(refused.ok());
    MESSAGE("TLS client on a plain port: ", refused.status().ToString());
  }
  auto remote = ConnectActor(*client.sys, "127.0.0.1", port, true, kConnect);
  REQUIRE_MESSAGE(remote.ok(), remote.status().ToString());
  CheckEchoWorks(client, *remote, (1 << 20) / 4);
  CheckEchoWorks(client, *remote, 3);
}

}  // namespace
}  // namespace foreman
