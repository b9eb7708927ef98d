// The session-target registry, with the two schemes of one process: "" (a
// local session's own values) and "inproc://NAME" (values shared by name
// until ResetInprocTarget, like a TF server's).
#include "runtime/session_target.hpp"

#include <algorithm>
#include <map>
#include <utility>

#include "absl/strings/match.h"
#include "foreman/session.hpp"

namespace foreman::internal {
namespace {

constexpr char kInprocScheme[] = "inproc://";

// inproc:// targets live like a TF server: until ResetInprocTarget().
std::mutex& InprocMutex() {
  static std::mutex* mu = new std::mutex;
  return *mu;
}
std::map<std::string, std::shared_ptr<SessionValues>>& InprocTargets() {
  static auto* targets = new std::map<std::string, std::shared_ptr<SessionValues>>;
  return *targets;
}

StatusOr<std::shared_ptr<SessionValues>> LocalValues(const std::string& /*target*/) {
  return std::make_shared<SessionValues>();
}

StatusOr<std::shared_ptr<SessionValues>> InprocValues(const std::string& target) {
  const std::string name = target.substr(sizeof(kInprocScheme) - 1);
  if (name.empty()) return absl::InvalidArgumentError("inproc target '" + target + "' has no name");
  std::lock_guard<std::mutex> lock(InprocMutex());
  auto& values = InprocTargets()[name];
  if (!values) values = std::make_shared<SessionValues>();
  return values;
}

struct Entry {
  std::string usage;
  SessionTargetFactory factory;
};

struct Registry {
  Mutex mu;
  std::map<std::string, Entry> schemes ABSL_GUARDED_BY(mu);
};

// Built on first use with the default schemes, so a registration from
// another translation unit's static initializer finds them already there.
Registry& GetRegistry() {
  static Registry* registry = [] {
    auto* r = new Registry;
    MutexLock lock(r->mu);
    r->schemes[""] = Entry{"\"\" (local)", LocalValues};
    r->schemes[kInprocScheme] = Entry{"\"inproc://NAME\"", InprocValues};
    return r;
  }();
  return *registry;
}

}  // namespace

Status RegisterSessionTarget(const std::string& scheme, const std::string& usage, SessionTargetFactory factory) {
  if (!factory) return absl::InvalidArgumentError("RegisterSessionTarget('" + scheme + "'): null factory");
  Registry& r = GetRegistry();
  MutexLock lock(r.mu);
  if (r.schemes.count(scheme) != 0) {
    return absl::AlreadyExistsError("session target scheme '" + scheme + "' is already registered");
  }
  r.schemes[scheme] = Entry{usage.empty() ? "\"" + scheme + "...\"" : usage, std::move(factory)};
  return absl::OkStatus();
}

bool UnregisterSessionTarget(const std::string& scheme) {
  Registry& r = GetRegistry();
  MutexLock lock(r.mu);
  return r.schemes.erase(scheme) > 0;
}

StatusOr<std::shared_ptr<SessionValues>> ResolveSessionTarget(const std::string& target) {
  SessionTargetFactory factory;
  std::vector<std::string> usages;
  {
    Registry& r = GetRegistry();
    MutexLock lock(r.mu);
    std::size_t best = 0;
    for (const auto& [scheme, entry] : r.schemes) {
      usages.push_back(entry.usage);
      const bool match = target.empty() ? scheme.empty() : !scheme.empty() && absl::StartsWith(target, scheme);
      if (match && (!factory || scheme.size() > best)) {
        factory = entry.factory;
        best = scheme.size();
      }
    }
  }
  if (factory) {
    FOREMAN_ASSIGN_OR_RETURN(std::shared_ptr<SessionValues> values, factory(target));
    if (values == nullptr) {
      return absl::InternalError("session target '" + target + "': its scheme's factory returned no values");
    }
    return values;
  }
  if (usages.empty()) {
    return absl::UnimplementedError("session target '" + target + "' is not supported: no target schemes are registered");
  }
  std::string choices;
  for (std::size_t i = 0; i < usages.size(); ++i) {
    if (i > 0) choices += i + 1 == usages.size() ? " or " : ", ";
    choices += usages[i];
  }
  return absl::UnimplementedError("session target '" + target + "' is not supported: use " + choices);
}

std::vector<std::string> RegisteredSessionTargetSchemes() {
  Registry& r = GetRegistry();
  MutexLock lock(r.mu);
  std::vector<std::string> schemes;
  for (const auto& entry : r.schemes) schemes.push_back(entry.first);
  return schemes;
}

}  // namespace foreman::internal

namespace foreman {

bool ResetInprocTarget(const std::string& target) {
  if (!absl::StartsWith(target, internal::kInprocScheme)) return false;
  std::lock_guard<std::mutex> lock(internal::InprocMutex());
  return internal::InprocTargets().erase(target.substr(sizeof(internal::kInprocScheme) - 1)) > 0;
}

}  // namespace foreman
