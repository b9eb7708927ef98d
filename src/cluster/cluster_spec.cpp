// ClusterSpec, ClusterTask, the ps placement and the cluster options
// (foreman/cluster.hpp). CAF-free: the network layer (actors/) consumes these
// values; the TLS file checks are in tls_preflight.cpp.
#include <arpa/inet.h>
#include <netinet/in.h>

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "foreman/cluster.hpp"
#include "cluster/task_address.hpp"
#include "nn/optimizer.hpp"

namespace foreman {
namespace {

constexpr char kGlobalStep[] = "global_step";
// A day: longer heartbeats detect nothing useful, and 3 x it stays far from
// int64 overflow.
constexpr int64_t kMaxHeartbeatMs = 86'400'000;

bool IsDigits(std::string_view s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](unsigned char c) { return std::isdigit(c); });
}

// "" when `name` is a valid job name, else why not.
std::string JobNameProblem(const std::string& name) {
  if (name.empty()) return "a job name must not be empty";
  if (!(name[0] >= 'a' && name[0] <= 'z') ||
      !std::all_of(name.begin(), name.end(),
                   [](char c) { return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_'; })) {
    return "a job name must match [a-z][a-z0-9_]*";
  }
  return "";
}

// "" when `host` (no brackets) is a valid host name or dotted IPv4 address.
std::string HostProblem(const std::string& host) {
  if (host.empty()) return "the host is empty";
  if (host.size() > 253) return "the host name is longer than 253 characters";
  // All digits and dots: it must be an IPv4 address (inet_pton takes only
  // the four-part dotted decimal form).
  if (std::all_of(host.begin(), host.end(), [](unsigned char c) { return std::isdigit(c) || c == '.'; })) {
    in_addr addr;
    if (inet_pton(AF_INET, host.c_str(), &addr) != 1) {
      return absl::StrCat("'", host, "' is not a valid IPv4 address (four numbers in [0, 255])");
    }
    return "";
  }
  for (const absl::string_view label : absl::StrSplit(host, '.')) {
    if (label.empty()) return absl::StrCat("host name '", host, "' has an empty label (two dots, or a dot at an end)");
    if (label.size() > 63) return absl::StrCat("host name '", host, "' has a label longer than 63 characters");
    for (const char c : label) {
      if (!std::isalnum(static_cast<unsigned char>(c)) && c != '-') {
        return absl::StrCat("host name '", host, "' has a character not allowed in a host name: '",
                            std::string(1, c), "' (letters, digits, '-' and '.' only)");
      }
    }
    if (label.front() == '-' || label.back() == '-') {
      return absl::StrCat("host name '", host, "' has a label that starts or ends with '-'");
    }
  }
  return "";
}

// Parses "host:port" / "[v6]:port"; on error returns false with `why`.
bool ParseEntry(const std::string& entry, TaskAddress* out, std::string* why) {
  std::string host;
  std::string port;
  if (entry.empty()) {
    *why = "the entry is empty";
    return false;
  }
  if (entry[0] == '[') {
    const std::size_t close = entry.find(']');
    if (close == std::string::npos) {
      *why = "an IPv6 address needs a closing ']' ([::1]:2222)";
      return false;
    }
    host = entry.substr(1, close - 1);
    if (close + 1 >= entry.size() || entry[close + 1] != ':') {
      *why = "expected ':port' after the bracketed IPv6 address ([::1]:2222)";
      return false;
    }
    port = entry.substr(close + 2);
    in6_addr addr;
    if (host.empty() || inet_pton(AF_INET6, host.c_str(), &addr) != 1) {
      *why = absl::StrCat("'", host, "' is not a valid IPv6 address");
      return false;
    }
  } else {
    const std::size_t colon = entry.rfind(':');
    if (colon == std::string::npos) {
      *why = "expected host:port";
      return false;
    }
    host = entry.substr(0, colon);
    port = entry.substr(colon + 1);
    if (host.find(':') != std::string::npos) {
      *why = "an IPv6 address must be in brackets: [::1]:2222";
      return false;
    }
    if (std::string problem = HostProblem(host); !problem.empty()) {
      *why = std::move(problem);
      return false;
    }
  }
  if (port.empty()) {
    *why = "the port is missing (host:port)";
    return false;
  }
  // At most 6 digits keeps the conversion from overflowing; 0 and > 65535 are
  // refused below with the range.
  if (!IsDigits(port) || port.size() > 5 || (port.size() > 1 && port[0] == '0')) {
    *why = absl::StrCat("port '", port, "' must be a decimal number in [1, 65535] without leading zeros");
    return false;
  }
  const int value = std::stoi(port);
  if (value < 1 || value > 65535) {
    *why = "port must be in [1, 65535]";
    return false;
  }
  out->host = std::move(host);
  out->port = value;
  return true;
}

std::string FlagName(const std::string& job) {
  std::string flag = absl::StrCat("--", job, "-hosts");
  std::replace(flag.begin(), flag.end(), '_', '-');
  return flag;
}

// How an error names an entry's source: the flag (FromFlags) or the job.
std::string SourceName(const std::string& job, bool from_flags) {
  return from_flags ? FlagName(job) : absl::StrCat("job '", job, "'");
}

std::string EntryName(const std::string& job, std::size_t index, const std::string& entry, bool from_flags) {
  return absl::StrCat(SourceName(job, from_flags), " entry ", index + 1, " (task ", index, ") '", entry, "'");
}

std::string AddressKey(const TaskAddress& a) { return absl::StrCat(absl::AsciiStrToLower(a.host), "|", a.port); }

}  // namespace

namespace cluster_internal {

bool ParseTaskAddress(const std::string& entry, TaskAddress* out, std::string* why) {
  return ParseEntry(entry, out, why);
}

std::string TaskAddressKey(const TaskAddress& address) { return AddressKey(address); }

}  // namespace cluster_internal

// Builds the spec; `from_flags` only changes how errors name the source.
class ClusterSpecBuilder {
 public:
  static StatusOr<ClusterSpec> Build(std::map<std::string, std::vector<std::string>> jobs, bool from_flags) {
    if (jobs.empty()) return absl::InvalidArgumentError("ClusterSpec: the cluster has no jobs");
    ClusterSpec spec;
    // address key -> where it was first seen, for the duplicate message.
    std::map<std::string, std::string> seen;
    for (const auto& [job, entries] : jobs) {
      if (std::string problem = JobNameProblem(job); !problem.empty()) {
        return absl::InvalidArgumentError(absl::StrCat("ClusterSpec: job '", job, "': ", problem));
      }
      if (entries.empty()) {
        return absl::InvalidArgumentError(
            absl::StrCat("ClusterSpec: ", SourceName(job, from_flags), " has no tasks (at least one host:port)"));
      }
      std::vector<TaskAddress> addresses;
      for (std::size_t i = 0; i < entries.size(); ++i) {
        TaskAddress address;
        std::string why;
        const std::string where = EntryName(job, i, entries[i], from_flags);
        if (!ParseEntry(entries[i], &address, &why)) return absl::InvalidArgumentError(absl::StrCat(where, ": ", why));
        auto [it, inserted] = seen.emplace(AddressKey(address), where);
        if (!inserted) {
          return absl::InvalidArgumentError(absl::StrCat(where, ": the same host:port as ", it->second,
                                                         " (each task needs its own address)"));
        }
        addresses.push_back(std::move(address));
      }
      spec.addresses_.emplace(job, std::move(addresses));
    }
    spec.jobs_ = std::move(jobs);
    return spec;
  }
};

StatusOr<ClusterSpec> ClusterSpec::Create(std::map<std::string, std::vector<std::string>> jobs) {
  return ClusterSpecBuilder::Build(std::move(jobs), /*from_flags=*/false);
}

StatusOr<ClusterSpec> ClusterSpec::FromFlags(const std::string& ps_hosts, const std::string& worker_hosts) {
  std::map<std::string, std::vector<std::string>> jobs;
  for (const auto& [job, flag] : {std::pair<std::string, const std::string*>{"ps", &ps_hosts},
                                  std::pair<std::string, const std::string*>{"worker", &worker_hosts}}) {
    if (flag->empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat(FlagName(job), " is empty: a cluster needs at least one ", job, " task (H:P[,H:P...])"));
    }
    jobs[job] = absl::StrSplit(*flag, ',');
  }
  return ClusterSpecBuilder::Build(std::move(jobs), /*from_flags=*/true);
}

int ClusterSpec::num_tasks(const std::string& job) const {
  auto it = jobs_.find(job);
  return it == jobs_.end() ? 0 : static_cast<int>(it->second.size());
}

StatusOr<TaskAddress> ClusterSpec::task_address(const std::string& job, int task_index) const {
  auto it = addresses_.find(job);
  if (it == addresses_.end()) return absl::InvalidArgumentError(absl::StrCat("ClusterSpec: no job '", job, "'"));
  const int n = static_cast<int>(it->second.size());
  if (task_index < 0 || task_index >= n) {
    return absl::InvalidArgumentError(absl::StrCat("ClusterSpec: task index ", task_index, " of job '", job,
                                                   "' is out of range: valid indices are 0..", n - 1));
  }
  return it->second[static_cast<std::size_t>(task_index)];
}

std::string ClusterSpec::ToString() const {
  std::vector<std::string> parts;
  for (const auto& [job, entries] : jobs_) parts.push_back(absl::StrCat(FlagName(job), " ", absl::StrJoin(entries, ",")));
  return absl::StrJoin(parts, " ");
}

Status ValidateClusterTask(const ClusterSpec& spec, const ClusterTask& task) {
  if (spec.num_tasks(task.job_name) == 0) {
    std::vector<std::string> names;
    for (const auto& [job, entries] : spec.jobs()) names.push_back(job);
    return absl::InvalidArgumentError(absl::StrCat("--job-name '", task.job_name,
                                                   "' is not a job of the cluster (jobs: ", absl::StrJoin(names, ", "),
                                                   ")"));
  }
  const int n = spec.num_tasks(task.job_name);
  if (task.task_index < 0 || task.task_index >= n) {
    return absl::InvalidArgumentError(absl::StrCat("--task-index ", task.task_index, " is out of range for job '",
                                                   task.job_name, "': it has ", n, n == 1 ? " task" : " tasks",
                                                   ", valid indices are 0..", n - 1));
  }
  return absl::OkStatus();
}

// TF1's facts behind this (tensorflow/python, 1.15):
//  - training/device_setter.py: replica_device_setter's default ps_strategy
//    is _RoundRobinStrategy, which hands task k = (calls so far) mod
//    ps_tasks to each op in STANDARD_PS_OPS (Variable, VariableV2,
//    VarHandleOp, ...) as the device function sees it;
//  - framework/ops.py: Graph.colocate_with saves and clears the device
//    function stack ("colocate_with resets the device function stack, since
//    ... colocation is intended to be stronger than device functions"), so a
//    variable created under colocate_with never reaches the strategy;
//  - training/slot_creator.py: create_slot / create_zeros_slot create each
//    slot under colocate_vars_with(primary) -> colocate_with(primary);
//  - training/adam.py: _create_slots does first_var = min(var_list,
//    key=lambda x: x.name) and creates beta1_power and beta2_power with
//    _create_non_slot_variable(..., colocate_with=first_var).
StatusOr<std::vector<int>> PlaceVariablesOnPs(const std::vector<std::string>& names, int num_ps_tasks) {
  if (num_ps_tasks < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("PlaceVariablesOnPs: num_ps_tasks must be >= 1, got ", num_ps_tasks));
  }
  std::map<std::string, std::size_t> index;
  for (std::size_t i = 0; i < names.size(); ++i) {
    if (names[i].empty()) return absl::InvalidArgumentError(absl::StrCat("PlaceVariablesOnPs: name ", i, " is empty"));
    if (!index.emplace(names[i], i).second) {
      return absl::InvalidArgumentError(absl::StrCat("PlaceVariablesOnPs: variable '", names[i], "' is listed twice"));
    }
  }
  const auto is_beta_power = [](const std::string& n) { return nn::internal::IsBetaPowerName(n); };
  // A slot's primary, or "" for a name that is not a slot.
  const auto slot_primary = [](const std::string& n) -> std::string {
    std::string primary;
    return nn::internal::IsSlotName(n, &primary) ? primary : "";
  };

  // Primaries in placement order: global_step first, then creation order.
  std::vector<std::size_t> primaries;
  if (auto it = index.find(kGlobalStep); it != index.end()) primaries.push_back(it->second);
  for (std::size_t i = 0; i < names.size(); ++i) {
    if (names[i] == kGlobalStep || is_beta_power(names[i]) || !slot_primary(names[i]).empty()) continue;
    primaries.push_back(i);
  }
  std::vector<int> task(names.size(), -1);
  for (std::size_t k = 0; k < primaries.size(); ++k) task[primaries[k]] = static_cast<int>(k % num_ps_tasks);

  // Slots follow their primary (a slot of a slot does not exist in TF).
  for (std::size_t i = 0; i < names.size(); ++i) {
    const std::string primary = slot_primary(names[i]);
    if (primary.empty()) continue;
    // TF creates slots for trainable variables only: never for a slot or a
    // beta power (either would also make the result depend on list order).
    if (!slot_primary(primary).empty() || is_beta_power(primary)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "PlaceVariablesOnPs: slot variable '", names[i], "' belongs to '", primary, "', which is itself ",
          is_beta_power(primary) ? "an Adam beta power" : "a slot", ": TF creates slots only for trainable variables"));
    }
    auto it = index.find(primary);
    if (it == index.end() || task[it->second] < 0) {
      return absl::InvalidArgumentError(absl::StrCat("PlaceVariablesOnPs: slot variable '", names[i],
                                                     "' has no primary variable '", primary, "' in the list"));
    }
    task[i] = task[it->second];
  }
  // Beta powers follow the first trainable primary by name.
  const std::string* first_trainable = nullptr;
  for (const std::size_t p : primaries) {
    if (names[p] == kGlobalStep) continue;
    if (first_trainable == nullptr || names[p] < *first_trainable) first_trainable = &names[p];
  }
  for (std::size_t i = 0; i < names.size(); ++i) {
    if (!is_beta_power(names[i])) continue;
    if (first_trainable == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("PlaceVariablesOnPs: '", names[i],
                                                     "' needs a trainable variable to live with, and the list has none"));
    }
    task[i] = task[index.at(*first_trainable)];
  }
  return task;
}

bool IsLoopbackHost(const std::string& host) {
  if (absl::EqualsIgnoreCase(host, "localhost")) return true;
  in_addr v4;
  if (inet_pton(AF_INET, host.c_str(), &v4) == 1) return (ntohl(v4.s_addr) >> 24) == 127;
  in6_addr v6;
  if (inet_pton(AF_INET6, host.c_str(), &v6) == 1) {
    if (IN6_IS_ADDR_LOOPBACK(&v6)) return true;
    return IN6_IS_ADDR_V4MAPPED(&v6) && v6.s6_addr[12] == 127;
  }
  return false;
}

std::string DefaultClusterJobId(const ClusterSpec& spec) {
  uint64_t h = 14695981039346656037ULL;  // FNV-1a, 64 bits
  for (const char c : spec.ToString()) {
    h ^= static_cast<unsigned char>(c);
    h *= 1099511628211ULL;
  }
  static constexpr char kHex[] = "0123456789abcdef";
  std::string id = "spec-";
  for (int shift = 44; shift >= 0; shift -= 4) id.push_back(kHex[(h >> shift) & 0xf]);
  return id;
}

namespace cluster_internal {

Status ValidateNetworkOptions(const ClusterOptions& options) {
  if (options.heartbeat_ms <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("--heartbeat-ms must be > 0, got ", options.heartbeat_ms));
  }
  if (options.connection_timeout_ms <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--connection-timeout-ms must be > 0, got ", options.connection_timeout_ms));
  }
  if (options.heartbeat_ms > kMaxHeartbeatMs) {
    return absl::InvalidArgumentError(absl::StrCat("--heartbeat-ms ", options.heartbeat_ms, " is too large (at most ",
                                                   kMaxHeartbeatMs, " ms, one day)"));
  }
  if (options.connection_timeout_ms < 3 * options.heartbeat_ms) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--connection-timeout-ms ", options.connection_timeout_ms, " must be at least 3 x --heartbeat-ms (",
        options.heartbeat_ms, " ms -> at least ", 3 * options.heartbeat_ms,
        " ms): a shorter timeout drops healthy peers whose heartbeats arrive a little late; give every node the "
        "same values"));
  }
  if (options.ps_wait_secs <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("--ps-wait-secs must be > 0, got ", options.ps_wait_secs));
  }
  const std::pair<const char*, const std::string*> tls[] = {
      {"--tls-cert", &options.tls_cert}, {"--tls-key", &options.tls_key}, {"--tls-ca", &options.tls_ca}};
  std::vector<std::string> missing;
  for (const auto& [flag, path] : tls) {
    if (path->empty()) missing.push_back(flag);
  }
  if (!missing.empty() && missing.size() < 3) {
    return absl::InvalidArgumentError(absl::StrCat(
        "TLS needs all three of --tls-cert, --tls-key and --tls-ca; missing: ", absl::StrJoin(missing, ", ")));
  }
  return absl::OkStatus();
}

}  // namespace cluster_internal

Status ValidateClusterOptions(const ClusterSpec& spec, const ClusterTask& task, const ClusterOptions& options) {
  FOREMAN_RETURN_IF_ERROR(ValidateClusterTask(spec, task));
  if (!options.job_id.empty()) {
    const bool good_chars = std::all_of(options.job_id.begin(), options.job_id.end(), [](char c) {
      return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '_' ||
             c == '-';
    });
    if (options.job_id.size() > 64 || !good_chars) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--cluster-job-id '", absl::CHexEscape(options.job_id),
          "': a job id is 1 to 64 letters, digits, '.', '_' or '-' (leave it out for the id derived from the "
          "cluster spec)"));
    }
  }
  FOREMAN_RETURN_IF_ERROR(cluster_internal::ValidateNetworkOptions(options));
  if (!options.tls_enabled() && !options.insecure) {
    for (const auto& [job, entries] : spec.jobs()) {
      for (int i = 0; i < static_cast<int>(entries.size()); ++i) {
        const TaskAddress address = spec.task_address(job, i).value();
        if (IsLoopbackHost(address.host)) continue;
        return absl::InvalidArgumentError(absl::StrCat(
            "task ", job, ":", i, " '", entries[static_cast<std::size_t>(i)],
            "' is not a loopback address, and without TLS only loopback addresses (127.0.0.0/8, ::1, localhost) "
            "are allowed: plain connections have no authentication, so anyone who can reach a port can message "
            "the cluster's actors. Pass --tls-cert, --tls-key and --tls-ca for mutual TLS, or --insecure to "
            "accept this on a network you trust"));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace foreman
