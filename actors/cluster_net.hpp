// The cluster's network layer (issue 13, points 4, 5, 8): CAF's middleman
// (BASP over TCP, caf_io) and its TLS module (caf_openssl), configured and
// used so that nothing blocks without a bound and every failure is a Status
// naming host:port. Internal: only actors/ includes this header, and
// actors/cluster_net.cpp is the one translation unit that includes CAF's io
// and openssl headers.
//
// Tensors cross a node as messages.hpp's TensorMessage: its payload is a
// std::string, which CAF 0.17's binary serializer writes as a length and ONE
// apply_raw of the bytes (serializer_impl.hpp, apply_impl(std::string&)),
// never element by element as it would a std::vector<float>. ToMessage()
// / FromMessage() (messages.hpp) convert from/to foreman::Tensor and validate
// on receipt (dtype known, num_elements * dtype size == bytes).
//
// Peer loss: CAF 0.17 has no node_down_msg. Monitor at least one actor of
// each peer (ConnectActor's result): when the connection drops (a killed
// process at once; a frozen or partitioned one after connection_timeout_ms,
// only when heartbeats are on at both ends) the monitor gets a down_msg whose
// reason is exit_reason::remote_link_unreachable (IsPeerLost). A monitor
// that reaches the peer after its actor is gone gets exit_reason::unknown.
//
// Plain BASP is unauthenticated and trusts the length in a header. Measured
// on CAF 0.17.6 alone: a 32-byte header that passes basp::valid() (e.g. a
// direct_message with dest_actor != 0) claiming a 4 GiB payload makes the
// node allocate and zero-fill a 4 GiB read buffer for that connection,
// before any handshake (RSS 14 MiB -> 4.1 GiB; freed when the connection
// closes); under a memory limit std::bad_alloc on the multiplexer thread
// aborts the process; N connections: N x 4 GiB. CAF also hands a
// direct_message received before any handshake to its actor.
//
// BASP header guard (this file's .cpp, by symbol interposition like
// tls_error_queue.cpp): every header CAF receives is checked before CAF
// allocates its payload, and one that breaks these rules makes CAF close
// the connection (malformed_basp_message), counted by RefusedBaspHeaders():
//  - before the connection's handshake only a server or client handshake is
//    accepted (a message, monitor or down before it is refused: it never
//    reaches an actor);
//  - a handshake's payload is at most kMaxHandshakePayloadBytes (Foreman's
//    are under 200 bytes: node id, app id, no interface names);
//  - after the handshake a payload is at most NetConfig::max_message_bytes.
// So before the handshake a connection costs at most 64 KiB. What is NOT
// stopped without TLS: the handshake is unauthenticated (the server sends
// its app id to anyone), so a client that completes it can still make the
// node allocate up to max_message_bytes per connection, and message its
// published actors. Mutual TLS stops both (the TLS handshake comes first);
// without TLS, bind only to loopback. Headers that fail CAF's own
// basp::valid() (a heartbeat with a payload, garbage) were already refused
// before any allocation.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

#include <caf/fwd.hpp>

#include "foreman/status.hpp"

namespace foreman::internal {

/// The largest payload a BASP server or client handshake may announce
/// (bytes); see "BASP header guard" above.
inline constexpr uint32_t kMaxHandshakePayloadBytes = 64 * 1024;

/// How a cluster node talks to its peers. The same values must be used on
/// every node of a cluster (a node whose connection timeout is shorter than
/// a peer's heartbeat interval drops healthy links): caf-0.17.md §6.
struct NetConfig {
  /// middleman.heartbeat-interval: a BASP heartbeat is sent to every
  /// connected node this often (ms; 0 or less: off, CAF's default).
  int heartbeat_ms = 200;
  /// middleman.connection-timeout: a node not heard from for this long is
  /// dropped, and monitors of its actors see remote_link_unreachable (ms;
  /// 0 or less: never; should be >= 3 * heartbeat_ms; checked only at
  /// heartbeat ticks, so detection takes timeout + up to one interval).
  int connection_timeout_ms = 1000;
  /// PEM files: the node's certificate (chain), its private key, and the CA
  /// bundle its peers' certificates must chain to. TLS (mutual) is on when
  /// all three are set; otherwise none may be set.
  std::string tls_cert, tls_key, tls_ca;
  /// middleman.app-identifiers: this node's application id, sent in its
  /// server handshake and the only one it accepts from a server.
  std::string app_id = "foreman";
  /// The largest payload (bytes) a peer may announce in one BASP message
  /// after its handshake; a larger announcement closes the connection
  /// before anything is allocated (BASP header guard, above). The largest
  /// legitimate message is a ps shard's whole state (the chief's init, a
  /// consistent read: every variable and slot of the shard, serialized),
  /// so a shard above 1 GiB needs a larger value. Process-wide: the largest
  /// value of any ConfigureClusterNetwork call in the process applies.
  uint32_t max_message_bytes = uint32_t{1} << 30;

  /// True when all three TLS files are set.
  bool tls() const { return !tls_cert.empty() && !tls_key.empty() && !tls_ca.empty(); }
};

/// Prepares `config` (before the caf::actor_system is built from it) for a
/// cluster node: registers Foreman's message types and error category
/// (ConfigureActorSystemConfig), loads caf::io::middleman, and, when
/// net.tls(), caf::openssl::manager after it with openssl.certificate,
/// openssl.key and openssl.cafile set (TLS with a peer certificate required
/// in both directions; CAF does no hostname check: any certificate of the CA
/// is accepted). Sets middleman.heartbeat-interval,
/// middleman.connection-timeout, middleman.app-identifiers and
/// scheduler.policy "sharing" (idle scheduler threads wait instead of
/// polling: less CPU taken from a node's training thread).
///
/// Application ids: the CONNECTING side refuses. A server sends its ids in
/// its handshake; a client whose app-identifiers share none of them closes
/// the connection (CAF's basp::instance, sec::incompatible_application_ids)
/// and its ConnectActor fails; the server only sees a connection closed
/// after its handshake and keeps serving.
///
/// Precondition: when TLS is on, the three files exist, are readable, and
/// the key matches the certificate (the libssl preflight checks this): CAF
/// 0.17 aborts the process or hangs a connect on a bad file (caf-0.17.md
/// §7). Part of the TLS configuration half set (one or two of the three
/// files) is not checked here either: the caller refuses it. Not
/// thread-safe on one config. TF: tf.train.Server's protocol ("grpc" vs
/// "grpc+verbs") is the nearest TF has.
void ConfigureClusterNetwork(caf::actor_system_config& config, const NetConfig& net);

/// Publishes `actor` on `host`:`port` (through CAF's middleman, or the
/// openssl manager's when `tls`), binding exactly to `host`: "0.0.0.0" is
/// the only way to listen on every interface. Port 0 picks a free port.
/// Returns the bound port. INVALID_ARGUMENT for an empty host or a null
/// actor; FAILED_PRECONDITION when the system lacks the middleman (or the
/// openssl manager for `tls`); UNAVAILABLE naming host:port and CAF's reason
/// when it cannot listen (port taken, address not local). Bounded (10 s).
/// The middleman keeps a reference on a published actor until it exits:
/// send it an exit before the system is destroyed. Thread-safe; call from
/// outside an actor. TF: tf.train.Server's listening address.
StatusOr<uint16_t> PublishActor(caf::actor_system& system, const caf::actor& actor, const std::string& host,
                                uint16_t port, bool tls);

/// Closes `port`, published by PublishActor in `system` (through the
/// openssl manager's middleman actor when `tls`): the listening socket goes
/// and no new connection is accepted there; connections already made stay.
/// For a system that outlives what it published (a foreman::Server in the
/// caller's actor system); a system being destroyed closes its ports
/// itself. UNAVAILABLE naming the port when the middleman does not answer
/// within 10 s; FAILED_PRECONDITION when the system lacks the module.
/// Thread-safe; call from outside an actor.
Status ClosePort(caf::actor_system& system, uint16_t port, bool tls);

/// The actor published on `host`:`port` (a proxy in `system`), connected
/// through the (openssl, when `tls`) middleman actor with a request timeout:
/// never blocks longer than `timeout` (caf::io::remote_actor can hang
/// forever), capped at 24 h; one attempt is always made (with at least 1 ms,
/// so a timeout <= 0 still tries once). Errors, each naming host:port:
///  - UNAVAILABLE: nothing listens there (connection refused); the peer
///    closed the connection during the handshake (a TLS peer refusing our
///    certificate or a plain client, another application id, a non-CAF
///    server) — the message names the handshake; a plain client of a TLS
///    peer or a TLS client of a plain one: the message says which ("does
///    not speak TLS" / "speaks TLS") and "start every task with the same
///    --tls-* flags"; no actor published there.
///  - DEADLINE_EXCEEDED: no handshake within `timeout` (a peer that accepts
///    and never speaks); the message gives the timeout.
///  - FAILED_PRECONDITION: the system lacks the needed module.
/// The TCP connect runs inside CAF's middleman actor, on its thread: this
/// process interposes libcaf_io's new_tcp_connection (as the BASP header
/// guard does valid()) with a non-blocking connect bounded by this call's
/// deadline (a listener whose backlog is full drops the SYN, and CAF's
/// blocking connect() would hold the middleman for the kernel's ~2 min of
/// retries), and a connect request that waited in the middleman's mailbox
/// until every ConnectActor call for that host:port had returned is not
/// made ("connect abandoned"). Connects of host:ports no ConnectActor call
/// ever asked for keep CAF's own behaviour.
/// A connect already pending to the same host:port is joined, not repeated.
/// Thread-safe; call from outside an actor (it waits on a scoped actor).
/// TF: the gRPC channel a worker opens to a ps task.
StatusOr<caf::actor> ConnectActor(caf::actor_system& system, const std::string& host, uint16_t port, bool tls,
                                  std::chrono::milliseconds timeout);

/// True when `down` (a monitor's down_msg) says the actor's node became
/// unreachable (connection closed or timed out: exit_reason::
/// remote_link_unreachable), as opposed to the actor itself exiting.
bool IsPeerLost(const caf::down_msg& down);

/// True when the BASP header guard (above) is in force in this process:
/// libcaf_io's calls bind to libforeman's definitions, which needs
/// libforeman earlier in the global lookup order than libcaf_io (always for
/// a program linked against libforeman before caf_io; never when libforeman
/// is dlopen()ed with RTLD_LOCAL). ConfigureClusterNetwork logs a warning
/// once when it is not. Thread-safe.
bool BaspHeaderGuardActive();

/// How many BASP headers the guard (above) refused in this process since it
/// started, for tests and diagnostics. Thread-safe.
uint64_t RefusedBaspHeaders();

}  // namespace foreman::internal
