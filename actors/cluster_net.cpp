// The cluster's network layer (cluster_net.hpp): the one translation unit
// that includes CAF's io and openssl headers.
#include "cluster_net.hpp"

#include <arpa/inet.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <caf/all.hpp>
#include <caf/io/all.hpp>
#include <caf/io/basp/header.hpp>
#include <caf/io/basp/instance.hpp>
#include <caf/io/network/default_multiplexer.hpp>
#include <caf/io/network/interfaces.hpp>
#include <caf/openssl/all.hpp>

#include "absl/strings/str_cat.h"
#include "actor_system.hpp"
#include "platform/log.hpp"

namespace foreman::internal {
namespace {

constexpr std::chrono::seconds kPublishTimeout{10};
constexpr std::chrono::milliseconds kMaxConnectTimeout = std::chrono::hours(24);

// The BASP header guard (cluster_net.hpp, "BASP header guard"). Process-wide,
// like libcaf_io: the largest max_message_bytes any ConfigureClusterNetwork
// call asked for (never lowered, so one system's bound cannot refuse another
// system's legitimate messages).
std::atomic<uint32_t> g_max_message_bytes{NetConfig{}.max_message_bytes};
std::atomic<uint64_t> g_refused_headers{0};

// What the multiplexer thread is doing when CAF calls basp::valid(): set by
// the instance::handle wrapper around its header check.
enum class HeaderContext { kOutside, kBeforeHandshake, kAfterHandshake };
thread_local HeaderContext t_header_context = HeaderContext::kOutside;

// CAF's definition of `mangled`: the next one after libforeman's in the
// lookup order (libcaf_io is a dependency of libforeman, so it is loaded).
template <typename Fn>
Fn RealCafFunction(const char* mangled) {
  void* fn = dlsym(RTLD_NEXT, mangled);
  if (fn == nullptr) {
    std::fprintf(stderr, "foreman: %s: libcaf_io's definition not found (%s)\n", mangled, dlerror());
    std::abort();
  }
  return reinterpret_cast<Fn>(fn);
}

constexpr const char* kValidSymbol = "_ZN3caf2io4basp5validERKNS1_6headerE";
constexpr const char* kHandleSymbol =
    "_ZN3caf2io4basp8instance6handleEPNS_14execution_unitERNS0_12new_data_msgERNS1_6headerEb";

constexpr const char* kTcpConnectSymbol =
    "_ZN3caf2io7network18new_tcp_connectionERKNSt7__cxx1112basic_stringIcSt11char_traitsIcESaIcEEEtNS_8optionalINS1_"
    "8protocol7networkEEE";

// The bounded TCP connect (cluster_net.hpp, ConnectActor): the deadlines of
// the ConnectActor calls in flight, per host:port, and every host:port a
// ConnectActor call ever asked for (a connect to one of those with no call
// in flight was queued in the middleman actor by a call that gave up).
struct ConnectWants {
  std::mutex mu;
  std::map<std::pair<std::string, uint16_t>, std::multiset<std::chrono::steady_clock::time_point>> live;
  std::set<std::pair<std::string, uint16_t>> known;
};
ConnectWants& Wants() {
  static ConnectWants* wants = new ConnectWants;  // never destroyed: used by CAF's threads until exit
  return *wants;
}

// A ConnectActor call's deadline, registered for its life.
class ConnectWant {
 public:
  ConnectWant(std::string host, uint16_t port, std::chrono::steady_clock::time_point deadline)
      : key_(std::move(host), port), deadline_(deadline) {
    ConnectWants& w = Wants();
    std::lock_guard<std::mutex> l(w.mu);
    w.live[key_].insert(deadline_);
    w.known.insert(key_);
  }
  ~ConnectWant() {
    ConnectWants& w = Wants();
    std::lock_guard<std::mutex> l(w.mu);
    auto it = w.live.find(key_);
    it->second.erase(it->second.find(deadline_));
    if (it->second.empty()) w.live.erase(it);
  }
  ConnectWant(const ConnectWant&) = delete;
  ConnectWant& operator=(const ConnectWant&) = delete;

 private:
  const std::pair<std::string, uint16_t> key_;
  const std::chrono::steady_clock::time_point deadline_;
};

using TcpConnectFn = caf::expected<caf::io::network::native_socket> (*)(const std::string&, uint16_t,
                                                                        caf::optional<caf::io::network::protocol::network>);

}  // namespace

// libcaf_io's new_tcp_connection (its blocking connect(), run on the
// middleman actor's thread), bounded: see the interposed definition below.
caf::expected<caf::io::network::native_socket> BoundedTcpConnection(
    const std::string& host, uint16_t port, caf::optional<caf::io::network::protocol::network> preferred) {
  using caf::io::network::protocol;
  std::optional<std::chrono::steady_clock::time_point> deadline;
  {
    ConnectWants& w = Wants();
    std::lock_guard<std::mutex> l(w.mu);
    const std::pair<std::string, uint16_t> key{host, port};
    auto it = w.live.find(key);
    if (it != w.live.end()) {
      deadline = *it->second.rbegin();
    } else if (w.known.count(key) != 0) {
      return caf::make_error(caf::sec::cannot_connect_to_node, "connect abandoned: its caller gave up", host, port);
    }
  }
  if (!deadline) {
    static const auto real = RealCafFunction<TcpConnectFn>(kTcpConnectSymbol);
    return real(host, port, preferred);
  }
  auto address = caf::io::network::interfaces::native_address(host, preferred);
  if (!address) return caf::make_error(caf::sec::cannot_connect_to_node, "no such host", host, port);
  const bool v6 = address->second == protocol::ipv6;
  const int fd = ::socket(v6 ? AF_INET6 : AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return caf::make_error(caf::sec::cannot_connect_to_node, "socket failed", host, port);
  sockaddr_storage sa{};
  socklen_t len = 0;
  if (v6) {
    auto* in6 = reinterpret_cast<sockaddr_in6*>(&sa);
    in6->sin6_family = AF_INET6;
    in6->sin6_port = htons(port);
    inet_pton(AF_INET6, address->first.c_str(), &in6->sin6_addr);
    len = sizeof(sockaddr_in6);
  } else {
    auto* in4 = reinterpret_cast<sockaddr_in*>(&sa);
    in4->sin_family = AF_INET;
    in4->sin_port = htons(port);
    inet_pton(AF_INET, address->first.c_str(), &in4->sin_addr);
    len = sizeof(sockaddr_in);
  }
  int err = 0;
  if (::connect(fd, reinterpret_cast<const sockaddr*>(&sa), len) != 0) {
    err = errno;
    if (err == EINPROGRESS) {
      // A listener whose backlog is full drops the SYN: without this bound
      // the kernel retries it for about two minutes.
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(*deadline - std::chrono::steady_clock::now());
      pollfd p{fd, POLLOUT, 0};
      int ready = 0;
      do {
        ready = ::poll(&p, 1, static_cast<int>(std::clamp<int64_t>(left.count(), 0, 86'400'000)));
      } while (ready < 0 && errno == EINTR);
      if (ready <= 0) {
        ::close(fd);
        return caf::make_error(caf::sec::cannot_connect_to_node, "ip_connect timed out (no SYN-ACK: a full backlog?)",
                               host, port);
      }
      socklen_t n = sizeof(err);
      if (::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &n) != 0) err = errno;
    }
  }
  if (err != 0) {
    ::close(fd);
    if (v6) return BoundedTcpConnection(host, port, protocol::ipv4);  // CAF's IPv4 fallback
    return caf::make_error(caf::sec::cannot_connect_to_node, "ip_connect failed", host, port);
  }
  // Blocking again, as CAF's own definition returns it (its scribes set
  // their sockets' modes themselves).
  const int flags = ::fcntl(fd, F_GETFL, 0);
  if (flags >= 0) ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
  return fd;
}

namespace {

// The loaded object (its base address) that defines `fn`, or nullptr.
void* ObjectOf(void* fn) {
  Dl_info info{};
  if (fn == nullptr || dladdr(fn, &info) == 0) return nullptr;
  return info.dli_fbase;
}

// The guard's rule, on a header that CAF's own valid() accepted.
bool HeaderAllowed(caf::io::basp::message_type op, uint32_t payload_len, HeaderContext context) {
  using caf::io::basp::message_type;
  const bool handshake = op == message_type::server_handshake || op == message_type::client_handshake;
  if (handshake) return payload_len <= kMaxHandshakePayloadBytes;
  if (context == HeaderContext::kBeforeHandshake) return false;
  return payload_len <= g_max_message_bytes.load(std::memory_order_relaxed);
}

caf::io::middleman_actor MiddlemanActor(caf::actor_system& system, bool tls) {
  return tls ? system.openssl_manager().actor_handle() : system.middleman().actor_handle();
}

Status CheckModules(caf::actor_system& system, bool tls, const std::string& where) {
  if (!system.has_middleman()) {
    return absl::FailedPreconditionError(
        absl::StrCat(where, ": the actor system has no middleman (ConfigureClusterNetwork was not called)"));
  }
  if (tls && !system.has_openssl_manager()) {
    return absl::FailedPreconditionError(absl::StrCat(
        where, ": TLS asked but the actor system has no openssl manager (ConfigureClusterNetwork without TLS files)"));
  }
  return absl::OkStatus();
}

}  // namespace

uint64_t RefusedBaspHeaders() { return g_refused_headers.load(std::memory_order_relaxed); }

bool BaspHeaderGuardActive() {
  void* self = ObjectOf(reinterpret_cast<void*>(&BaspHeaderGuardActive));
  return self != nullptr && ObjectOf(dlsym(RTLD_DEFAULT, kValidSymbol)) == self &&
         ObjectOf(dlsym(RTLD_DEFAULT, kHandleSymbol)) == self;
}

void ConfigureClusterNetwork(caf::actor_system_config& config, const NetConfig& net) {
  ConfigureActorSystemConfig(config);
  uint32_t bound = g_max_message_bytes.load(std::memory_order_relaxed);
  while (net.max_message_bytes > bound &&
         !g_max_message_bytes.compare_exchange_weak(bound, net.max_message_bytes, std::memory_order_relaxed)) {
  }
  static const bool guard_active = BaspHeaderGuardActive();
  if (!guard_active) {
    FOREMAN_LOG_WARN(
        "the BASP header guard is not active in this process (libcaf_io's own definitions bind first: "
        "libforeman loaded with RTLD_LOCAL or after libcaf_io): a header claiming 4 GiB allocates 4 GiB");
  }
  config.load<caf::io::middleman>();
  // A shared queue whose idle workers wait on a condition variable, not
  // CAF's default work stealing, whose idle workers poll (50 us sleeps for
  // ~25 ms after each message): a cluster node is idle between a step's
  // few messages, and on 2 cores the polling took ~1 ms of CPU per step
  // from the training thread (tools/bench/cluster_bench.sh, 1 ps + 1
  // worker: 3.9 vs 4.9 ms of CPU per step).
  config.set("scheduler.policy", caf::atom("sharing"));
  // No BASP workers: with them (CAF 0.17's default, 1 to 4) the middleman's
  // thread copies each received payload into a worker's buffer
  // (basp::worker::launch) and a scheduler thread deserializes it from
  // there: a second user-space copy of every tensor received, uncounted by
  // TransportCopyCounters, and a thread hand-off. Without them the
  // middleman's thread deserializes the payload where it was read, which is
  // the one copy tensor_bytes.hpp counts (that copy replaces the worker's;
  // the thread also does the lookups a worker did, serially on a ps with
  // many workers: not measured, docs/benchmarks.md).
  config.set("middleman.workers", size_t{0});
  config.set("middleman.heartbeat-interval", caf::timespan{std::chrono::milliseconds(net.heartbeat_ms)});
  config.set("middleman.connection-timeout", caf::timespan{std::chrono::milliseconds(net.connection_timeout_ms)});
  // Checked by the connecting side only (basp::instance, server_handshake):
  // see the header.
  config.set("middleman.app-identifiers", std::vector<std::string>{net.app_id});
  if (net.tls()) {
    config.load<caf::openssl::manager>();  // after the middleman, which it uses
    config.openssl_certificate = net.tls_cert;
    config.openssl_key = net.tls_key;
    config.openssl_cafile = net.tls_ca;
  }
}

StatusOr<uint16_t> PublishActor(caf::actor_system& system, const caf::actor& actor, const std::string& host,
                                uint16_t port, bool tls) {
  const std::string where = absl::StrCat("publish on ", host, ":", port, tls ? " (TLS)" : "");
  // CAF binds an empty address to every interface: never by accident.
  if (host.empty()) return absl::InvalidArgumentError(absl::StrCat(where, ": empty host (use 0.0.0.0 for all)"));
  if (!actor) return absl::InvalidArgumentError(absl::StrCat(where, ": no actor"));
  FOREMAN_RETURN_IF_ERROR(CheckModules(system, tls, where));
  Status status;
  uint16_t bound = 0;
  caf::scoped_actor self{system};
  self->request(MiddlemanActor(system, tls), kPublishTimeout, caf::publish_atom::value, port,
                caf::actor_cast<caf::strong_actor_ptr>(actor), std::set<std::string>{}, host, /*reuse_addr=*/true)
      .receive([&](uint16_t actual) { bound = actual; },
               [&](caf::error& err) {
                 status = absl::UnavailableError(absl::StrCat(where, ": ", system.render(err)));
               });
  if (!status.ok()) return status;
  return bound;
}

Status ClosePort(caf::actor_system& system, uint16_t port, bool tls) {
  const std::string where = absl::StrCat("close port ", port, tls ? " (TLS)" : "");
  FOREMAN_RETURN_IF_ERROR(CheckModules(system, tls, where));
  Status status;
  caf::scoped_actor self{system};
  self->request(MiddlemanActor(system, tls), kPublishTimeout, caf::close_atom::value, port)
      .receive([] {},
               [&](caf::error& err) {
                 status = absl::UnavailableError(absl::StrCat(where, ": ", system.render(err)));
               });
  return status;
}

StatusOr<caf::actor> ConnectActor(caf::actor_system& system, const std::string& host, uint16_t port, bool tls,
                                  std::chrono::milliseconds timeout) {
  const std::string where = absl::StrCat("connect to ", tls ? "tls://" : "tcp://", host, ":", port);
  if (host.empty()) return absl::InvalidArgumentError(absl::StrCat(where, ": empty host"));
  FOREMAN_RETURN_IF_ERROR(CheckModules(system, tls, where));
  // The middleman actor connects (TCP), hands the connection to its BASP
  // broker and answers after the handshake; the request's timeout bounds the
  // wait (a handshake that never comes stays pending in the broker until the
  // peer closes, a heartbeat tick drops it, or the system stops).
  //
  // With heartbeats on, CAF 0.17.6's BASP broker drops an OUTGOING
  // connection whose server handshake has not arrived by its next heartbeat
  // tick (the connection's last_seen starts at the clock's epoch:
  // basp_broker.cpp, connect_atom handler), failing the connect with
  // sec::connection_timeout after at most one heartbeat interval. A
  // handshake that straddles a tick (a slow TLS handshake, a loaded node)
  // would fail spuriously: retry until `timeout` is spent.
  //
  // The wait is capped at kMaxConnectTimeout (now + milliseconds::max()
  // would overflow into the past), and the first attempt is always made,
  // with at least 1 ms.
  const auto wait = std::min(timeout, kMaxConnectTimeout);
  const auto deadline = std::chrono::steady_clock::now() + std::max(wait, std::chrono::milliseconds(1));
  // The TCP connect the middleman actor makes for this call is bounded by
  // `deadline` too, and one it makes after this call returned (a request
  // that waited in its mailbox) is not made (BoundedTcpConnection).
  const ConnectWant want(host, port, deadline);
  const std::string peer = absl::StrCat(host, ":", port);
  int attempts = 0;
  for (;;) {
    ++attempts;
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (attempts == 1) left = std::max(left, std::chrono::milliseconds(1));
    if (left.count() <= 0) {
      return absl::DeadlineExceededError(absl::StrCat(where, ": no handshake within ", wait.count(), " ms (",
                                                      attempts - 1, " attempt(s))"));
    }
    Status status;
    caf::actor remote;
    bool retry = false;
    caf::scoped_actor self{system};
    self->request(MiddlemanActor(system, tls), left, caf::connect_atom::value, host, port)
        .receive(
            [&](const caf::node_id&, caf::strong_actor_ptr& ptr, const std::set<std::string>&) {
              if (ptr == nullptr) {
                status = absl::UnavailableError(absl::StrCat(where, ": no actor is published there"));
              } else {
                remote = caf::actor_cast<caf::actor>(std::move(ptr));
              }
            },
            [&](caf::error& err) {
              if (err == caf::sec::request_timeout) {
                status = absl::DeadlineExceededError(
                    absl::StrCat(where, ": no handshake within ", wait.count(), " ms"));
              } else if (err == caf::sec::connection_timeout) {
                retry = true;  // dropped by a heartbeat tick (above)
              } else if (err == caf::sec::incompatible_application_ids) {
                status = absl::UnavailableError(absl::StrCat(
                    where, ": the server's application id is not ours (middleman.app-identifiers); refused here, "
                           "at the connecting side: ",
                    system.render(err)));
              } else if (err == caf::sec::disconnect_during_handshake) {
                status = absl::UnavailableError(absl::StrCat(
                    where, ": the peer closed the connection during the ", tls ? "TLS/" : "",
                    "BASP handshake (",
                    // A TLS connect to a plain task ends here or in the
                    // cannot_connect_to_node case below, depending on when
                    // the plain side closes on our ClientHello.
                    absl::StrCat("the peer at ", peer,
                                 tls ? " does not speak TLS (a plain task?), refused our certificate,"
                                     : " speaks TLS,",
                                 " or is not a CAF node: start every task with the same --tls-* flags"),
                    "): ", system.render(err)));
              } else if (tls && err == caf::sec::cannot_connect_to_node && err.context().empty()) {
                // The openssl middleman's connect: TCP connected (a refused
                // or timed out connect carries host and port), then no TLS
                // session (SSL_connect failed on the peer's first bytes).
                status = absl::UnavailableError(absl::StrCat(
                    where, ": the peer at ", peer,
                    " does not speak TLS (its first bytes are no TLS handshake: a plain task?): start every task "
                    "with the same --tls-* flags: ",
                    system.render(err)));
              } else {
                status = absl::UnavailableError(absl::StrCat(where, ": ", system.render(err)));
              }
            });
    if (retry) continue;
    if (!status.ok()) return status;
    return remote;
  }
}

bool IsPeerLost(const caf::down_msg& down) { return down.reason == caf::exit_reason::remote_link_unreachable; }

}  // namespace foreman::internal

// The BASP header guard: libforeman's definitions of two functions of
// libcaf_io.so.0.17, which the dynamic linker binds libcaf_io's own calls to
// (both are called through its PLT: basp_broker.cpp calls instance::handle,
// instance.cpp calls valid; checked with objdump on Debian's 0.17.6), the
// way tls_error_queue.cpp fixes libssl's callers. Each calls CAF's definition.
namespace caf::io::basp {

// CAF's check of a received header, plus the guard's bounds on payload_len
// (HeaderAllowed). Refused: CAF closes the connection
// (malformed_basp_message) before it allocates the payload's buffer.
__attribute__((visibility("default"))) bool valid(const header& hdr) {
  static const auto real = foreman::internal::RealCafFunction<bool (*)(const header&)>(foreman::internal::kValidSymbol);
  if (!real(hdr)) return false;
  if (foreman::internal::HeaderAllowed(hdr.operation, hdr.payload_len, foreman::internal::t_header_context)) return true;
  foreman::internal::g_refused_headers.fetch_add(1, std::memory_order_relaxed);
  return false;
}

// CAF's handling of a connection's received bytes (a header, or the payload
// it announced), run on the multiplexer thread. Around a header, records
// whether the connection has done its handshake (a direct route exists for
// it: CAF adds one when it accepts a server or client handshake), for valid().
__attribute__((visibility("default"))) connection_state instance::handle(execution_unit* ctx, new_data_msg& dm,
                                                                          header& hdr, bool is_payload) {
  using Fn = connection_state (*)(instance*, execution_unit*, new_data_msg&, header&, bool);
  static const auto real = foreman::internal::RealCafFunction<Fn>(foreman::internal::kHandleSymbol);
  if (is_payload) return real(this, ctx, dm, hdr, is_payload);
  using foreman::internal::HeaderContext;
  foreman::internal::t_header_context =
      tbl().lookup_direct(dm.handle) ? HeaderContext::kAfterHandshake : HeaderContext::kBeforeHandshake;
  const connection_state state = real(this, ctx, dm, hdr, is_payload);
  foreman::internal::t_header_context = HeaderContext::kOutside;
  return state;
}

}  // namespace caf::io::basp

// libcaf_io's connect, called through its PLT by default_multiplexer::
// new_tcp_scribe (the plain middleman actor's connect) and by
// libcaf_openssl's middleman actor: bounded by the ConnectActor call that
// asked for it (cluster_net.hpp), CAF's own definition for any other caller.
namespace caf::io::network {

__attribute__((visibility("default"))) expected<native_socket> new_tcp_connection(const std::string& host,
                                                                                   uint16_t port,
                                                                                   optional<protocol::network> preferred) {
  return foreman::internal::BoundedTcpConnection(host, port, preferred);
}

}  // namespace caf::io::network
