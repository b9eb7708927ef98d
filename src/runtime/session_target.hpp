// The session-target registry (TF's `master` strings): a
// scheme prefix -> a factory yielding the values the sessions of that target
// share. Session::Create resolves every target here and knows no scheme
// itself; "" (local) and "inproc://NAME" are registered when the library
// loads, and other code of the library (the cluster actors, later tcp:// and
// tls://) registers its schemes without touching session.cpp.
//
//   FOREMAN_RETURN_IF_ERROR(internal::RegisterSessionTarget(
//       "tcp://", "\"tcp://HOST:PORT\"", [](const std::string& target) { ... }));
//
// Thread-safety: every function may be called from any thread; the registry
// is guarded by one mutex, which is not held while a factory runs.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "foreman/mutex.hpp"
#include "foreman/status.hpp"
#include "foreman/variable_store.hpp"
#include "cluster/remote_values.hpp"

namespace foreman::internal {

/// The variable values of one set of sessions: a local session's own, or a
/// target's shared ones. Every read or write of `vars` holds `mu` (a step
/// runs under it, which serialises the steps of sessions sharing values).
struct SessionValues {
  Mutex mu;
  VariableStore vars ABSL_GUARDED_BY(mu);
  /// Null for "" and inproc://. For a cluster target (tcp://, tls://):
  /// where the variables live; `vars` is then the mirror Session refreshes
  /// from it (remote_values.hpp). Set by the factory, never changed after.
  std::shared_ptr<RemoteValues> remote;
};

/// Yields the values for `target` (the whole string, scheme included), never
/// null on success. Its errors reach Session::Create's caller unchanged
/// (INVALID_ARGUMENT for a malformed target of its scheme, say). Called
/// without the registry's lock, possibly from several threads at once.
using SessionTargetFactory = std::function<StatusOr<std::shared_ptr<SessionValues>>(const std::string& target)>;

/// Registers `scheme` ("inproc://", "tcp://"; "" means exactly the empty
/// target). `usage` is how error messages show the form ("\"inproc://NAME\"").
///   INVALID_ARGUMENT  a null factory
///   ALREADY_EXISTS    `scheme` is registered (names it)
Status RegisterSessionTarget(const std::string& scheme, const std::string& usage, SessionTargetFactory factory);

/// Removes `scheme` (tests); returns whether it was registered. Sessions
/// already created keep their values.
bool UnregisterSessionTarget(const std::string& scheme);

/// The values for `target`: "" goes to the "" scheme; otherwise the longest
/// registered non-empty scheme that prefixes `target`.
///   UNIMPLEMENTED  no registered scheme matches: "session target 'x' is not
///                  supported: use \"\" (local) or \"inproc://NAME\"", listing
///                  every registered usage
///   the factory's own errors
StatusOr<std::shared_ptr<SessionValues>> ResolveSessionTarget(const std::string& target);

/// The registered schemes, sorted ("" first).
std::vector<std::string> RegisteredSessionTargetSchemes();

}  // namespace foreman::internal
