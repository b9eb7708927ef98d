// The cluster as launchers describe it in the environment: TF's TF_CONFIG
// and Slurm's SLURM_* variables (foreman/cluster.hpp, docs/cluster.md
// "Kubernetes" and "Slurm"). CAF-free and network-free: the result is a
// ClusterSpec like the flags' one.
#include <algorithm>
#include <cctype>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "cluster/task_address.hpp"
#include "foreman/cluster.hpp"

namespace foreman {
namespace {

using json = nlohmann::json;
using cluster_internal::ParseTaskAddress;
using cluster_internal::TaskAddressKey;

// Hosts a node list may expand to: far more than any cluster Foreman runs,
// small enough that "n[0-99999999]" cannot exhaust memory.
constexpr std::size_t kMaxHosts = 65536;

// A JSON value as an error shows it: scalars as JSON text cut at 60
// characters, containers by kind and size.
std::string Shown(const json& v) {
  if (v.is_object()) return absl::StrCat("an object of ", v.size(), v.size() == 1 ? " key" : " keys");
  if (v.is_array()) return absl::StrCat("an array of ", v.size(), v.size() == 1 ? " element" : " elements");
  std::string text = v.dump(-1, ' ', false, json::error_handler_t::replace);
  if (text.size() > 60) text = absl::StrCat(text.substr(0, 60), "...");
  return text;
}

Status TfError(const std::string& field, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat("TF_CONFIG: ", field, ": ", what));
}

// TF's job types that Foreman knows, in the order errors list them.
constexpr const char* kTfJobs[] = {"chief", "worker", "ps", "evaluator"};

bool IsTfJob(const std::string& name) {
  return std::any_of(std::begin(kTfJobs), std::end(kTfJobs), [&](const char* j) { return name == j; });
}

}  // namespace

StatusOr<ClusterLaunch> ClusterFromTfConfig(const std::string& tf_config) {
  json doc;
  try {
    doc = json::parse(tf_config);
  } catch (const json::parse_error& e) {
    return absl::InvalidArgumentError(absl::StrCat("TF_CONFIG: not valid JSON at byte ", e.byte, ": ", e.what()));
  } catch (const json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("TF_CONFIG: not usable JSON: ", e.what()));
  }
  if (!doc.is_object()) return TfError("the value", absl::StrCat("expected a JSON object, found ", Shown(doc)));
  if (!doc.contains("cluster")) return TfError("cluster", "missing (the cluster's jobs and their \"host:port\" lists)");
  if (!doc.contains("task")) return TfError("task", "missing (this process's {\"type\": ..., \"index\": ...})");
  const json& cluster = doc["cluster"];
  const json& task = doc["task"];
  if (!cluster.is_object()) return TfError("cluster", absl::StrCat("expected an object, found ", Shown(cluster)));
  if (!task.is_object()) return TfError("task", absl::StrCat("expected an object, found ", Shown(task)));

  // Every job's entries, checked, with every address seen once.
  std::map<std::string, std::vector<std::string>> jobs;
  std::map<std::string, std::string> seen;  // address key -> field
  for (const auto& [name, entries] : cluster.items()) {
    const std::string field = absl::StrCat("cluster.", name);
    if (!IsTfJob(name)) {
      return TfError(field, absl::StrCat("job '", name, "' is not one Foreman runs (", absl::StrJoin(kTfJobs, ", "),
                                         ")"));
    }
    if (!entries.is_array()) {
      return TfError(field, absl::StrCat("expected an array of \"host:port\" strings, found ", Shown(entries)));
    }
    if (entries.empty()) return TfError(field, "has no tasks (at least one \"host:port\")");
    if ((name == "chief" || name == "evaluator") && entries.size() > 1) {
      return TfError(field, absl::StrCat("has ", entries.size(), " tasks; TF allows at most one ", name));
    }
    std::vector<std::string>& list = jobs[name];
    for (std::size_t i = 0; i < entries.size(); ++i) {
      const std::string where = absl::StrCat(field, "[", i, "]");
      if (!entries[i].is_string()) {
        return TfError(where, absl::StrCat("expected \"host:port\", found ", Shown(entries[i])));
      }
      const std::string entry = entries[i].get<std::string>();
      TaskAddress address;
      std::string why;
      if (!ParseTaskAddress(entry, &address, &why)) return TfError(absl::StrCat(where, " '", entry, "'"), why);
      auto [it, inserted] = seen.emplace(TaskAddressKey(address), where);
      if (!inserted) {
        return TfError(absl::StrCat(where, " '", entry, "'"),
                       absl::StrCat("the same host:port as ", it->second, " (each task needs its own address)"));
      }
      list.push_back(entry);
    }
  }
  if (jobs.count("ps") == 0) {
    return TfError("cluster.ps", "missing: Foreman keeps the variables on ps tasks (at least one)");
  }
  const bool has_chief = jobs.count("chief") > 0;
  if (!has_chief && jobs.count("worker") == 0) {
    return TfError("cluster", "has neither a chief nor a worker: nothing would train");
  }

  // The task.
  if (!task.contains("type")) return TfError("task.type", "missing (chief, worker, ps or evaluator)");
  if (!task["type"].is_string()) {
    return TfError("task.type", absl::StrCat("expected a string, found ", Shown(task["type"])));
  }
  const std::string type = task["type"].get<std::string>();
  int64_t index = 0;  // TF's default when "index" is left out
  if (task.contains("index")) {
    const json& i = task["index"];
    if (!i.is_number_integer() || (i.is_number_integer() && !i.is_number_unsigned() && i.get<int64_t>() < 0)) {
      return TfError("task.index", absl::StrCat("expected a whole number >= 0, found ", Shown(i)));
    }
    if (i.is_number_unsigned() && i.get<uint64_t>() > static_cast<uint64_t>(INT32_MAX)) {
      return TfError("task.index", absl::StrCat(Shown(i), " is out of range"));
    }
    index = i.get<int64_t>();
  }
  if (!IsTfJob(type)) {
    return TfError("task.type", absl::StrCat("'", type, "' is not a task type Foreman runs (",
                                             absl::StrJoin(kTfJobs, ", "), ")"));
  }
  if (jobs.count(type) == 0) {
    return TfError("task.type", absl::StrCat("'", type, "' has no job in cluster (no cluster.", type, ")"));
  }
  const int64_t n = static_cast<int64_t>(jobs[type].size());
  if (index >= n) {
    return TfError("task.index", absl::StrCat(index, " is out of range for cluster.", type, ": it has ", n,
                                              n == 1 ? " task" : " tasks", ", valid indices are 0..", n - 1));
  }
  // Foreman's jobs: the chief first among the workers.
  std::vector<std::string> workers;
  if (has_chief) workers.push_back(jobs["chief"][0]);
  for (const std::string& w : jobs["worker"]) workers.push_back(w);
  FOREMAN_ASSIGN_OR_RETURN(ClusterSpec spec, ClusterSpec::Create({{"ps", jobs["ps"]}, {"worker", workers}}));
  ClusterTask ours;
  if (type == "evaluator") {
    ours = ClusterTask{"evaluator", 0};  // not in the spec: TF's evaluator is outside the training cluster
  } else if (type == "ps") {
    ours = ClusterTask{"ps", static_cast<int>(index)};
  } else if (type == "chief") {
    ours = ClusterTask{"worker", 0};
  } else {
    ours = ClusterTask{"worker", static_cast<int>(index) + (has_chief ? 1 : 0)};
  }
  ClusterLaunch launch{std::move(spec), std::move(ours), absl::StrCat("TF_CONFIG task ", type, " ", index)};
  launch.has_evaluator = jobs.count("evaluator") > 0;
  return launch;
}

namespace {

Status ListError(const std::string& variable, std::size_t position, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat(variable, ": position ", position, ": ", what));
}

// One bracket group's numbers, as text with their width ("08", "09", "10").
StatusOr<std::vector<std::string>> ExpandGroup(const std::string& body, std::size_t body_start,
                                               const std::string& variable) {
  std::vector<std::string> out;
  std::size_t i = 0;
  while (true) {
    const std::size_t end = std::min(body.find(',', i), body.size());
    const std::string item = body.substr(i, end - i);
    const std::size_t pos = body_start + i + 1;  // 1-based position of the item
    if (item.empty()) return ListError(variable, pos, "an empty number or range in '[...]'");
    const std::size_t dash = item.find('-');
    const std::string lo = item.substr(0, dash);
    const std::string hi = dash == std::string::npos ? lo : item.substr(dash + 1);
    auto digits = [](const std::string& s) {
      return !s.empty() && s.size() <= 9 &&
             std::all_of(s.begin(), s.end(), [](unsigned char c) { return std::isdigit(c); });
    };
    if (!digits(lo) || !digits(hi)) {
      return ListError(variable, pos,
                       absl::StrCat("'", item, "' is not a number or a range lo-hi of numbers (at most 9 digits)"));
    }
    const int64_t a = std::strtoll(lo.c_str(), nullptr, 10);
    const int64_t b = std::strtoll(hi.c_str(), nullptr, 10);
    if (a > b) return ListError(variable, pos, absl::StrCat("range '", item, "' runs backwards"));
    if (static_cast<std::size_t>(b - a) + out.size() >= kMaxHosts) {
      return ListError(variable, pos, absl::StrCat("range '", item, "' has more than ", kMaxHosts, " hosts"));
    }
    for (int64_t v = a; v <= b; ++v) {
      std::string text = std::to_string(v);
      if (text.size() < lo.size()) text.insert(0, lo.size() - text.size(), '0');
      out.push_back(std::move(text));
    }
    if (end == body.size()) break;
    i = end + 1;
  }
  return out;
}

}  // namespace

StatusOr<std::vector<std::string>> ExpandSlurmHostList(const std::string& host_list, const std::string& variable) {
  if (host_list.empty()) return absl::InvalidArgumentError(absl::StrCat(variable, ": is empty"));
  std::vector<std::string> hosts;
  std::size_t i = 0;
  while (i <= host_list.size()) {
    // One entry: text and bracket groups up to a comma outside brackets.
    const std::size_t entry_start = i;
    std::vector<std::string> partial = {""};
    while (i < host_list.size() && host_list[i] != ',') {
      const char c = host_list[i];
      if (c == ']') return ListError(variable, i + 1, "']' without a '['");
      if (c != '[') {
        for (std::string& p : partial) p.push_back(c);
        ++i;
        continue;
      }
      const std::size_t close = host_list.find_first_of("[]", i + 1);
      if (close == std::string::npos || host_list[close] == '[') {
        if (close != std::string::npos) return ListError(variable, close + 1, "'[' inside '[...]'");
        return ListError(variable, i + 1, "unclosed '['");
      }
      FOREMAN_ASSIGN_OR_RETURN(std::vector<std::string> numbers,
                               ExpandGroup(host_list.substr(i + 1, close - i - 1), i + 1, variable));
      if (partial.size() * numbers.size() + hosts.size() > kMaxHosts) {
        return ListError(variable, entry_start + 1, absl::StrCat("expands to more than ", kMaxHosts, " hosts"));
      }
      std::vector<std::string> next;
      next.reserve(partial.size() * numbers.size());
      for (const std::string& p : partial) {
        for (const std::string& n : numbers) next.push_back(p + n);
      }
      partial = std::move(next);
      i = close + 1;
    }
    if (i == entry_start) return ListError(variable, i + 1, "an empty host name (two commas, or one at an end)");
    for (std::string& p : partial) hosts.push_back(std::move(p));
    ++i;  // past the comma (or the end)
  }
  return hosts;
}

namespace {

Status SlurmError(const std::string& variable, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat(variable, ": ", what));
}

// "2(x3),1" -> {2, 2, 2, 1}.
StatusOr<std::vector<int64_t>> ParseTasksPerNode(const std::string& text, const std::string& variable) {
  std::vector<int64_t> counts;
  std::size_t i = 0;
  while (true) {
    const std::size_t end = std::min(text.find(',', i), text.size());
    const std::string item = text.substr(i, end - i);
    const std::size_t paren = item.find('(');
    int64_t per = 0;
    int64_t times = 1;
    bool ok = absl::SimpleAtoi(item.substr(0, paren), &per) && per >= 1;
    if (ok && paren != std::string::npos) {
      ok = item.size() > paren + 3 && item.compare(paren, 2, "(x") == 0 && item.back() == ')' &&
           absl::SimpleAtoi(item.substr(paren + 2, item.size() - paren - 3), &times) && times >= 1;
    }
    if (!ok || static_cast<std::size_t>(times) + counts.size() > kMaxHosts) {
      return ListError(variable, i + 1, absl::StrCat("'", item, "' is not N or N(xM) with N, M >= 1"));
    }
    counts.insert(counts.end(), static_cast<std::size_t>(times), per);
    if (end == text.size()) break;
    i = end + 1;
  }
  return counts;
}

}  // namespace

StatusOr<ClusterLaunch> ClusterFromSlurm(const SlurmLaunch& slurm) {
  int64_t ntasks = 0;
  int64_t procid = 0;
  if (slurm.ntasks.empty()) return SlurmError("SLURM_NTASKS", "is not set");
  if (!absl::SimpleAtoi(slurm.ntasks, &ntasks) || ntasks < 1 || ntasks > static_cast<int64_t>(kMaxHosts)) {
    return SlurmError("SLURM_NTASKS", absl::StrCat("'", slurm.ntasks, "' is not a number of tasks in [1, ",
                                                   kMaxHosts, "]"));
  }
  if (slurm.procid.empty()) return SlurmError("SLURM_PROCID", "is not set");
  if (!absl::SimpleAtoi(slurm.procid, &procid) || procid < 0 || procid >= ntasks) {
    return SlurmError("SLURM_PROCID", absl::StrCat("'", slurm.procid, "' is not a rank in [0, SLURM_NTASKS=",
                                                   ntasks, ")"));
  }
  if (slurm.num_ps_tasks < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("the number of Slurm ps tasks must be >= 1, got ", slurm.num_ps_tasks));
  }
  if (ntasks < slurm.num_ps_tasks + 1) {
    return SlurmError("SLURM_NTASKS", absl::StrCat(ntasks, " tasks cannot hold ", slurm.num_ps_tasks,
                                                   " ps task(s) and a chief (srun needs at least ",
                                                   slurm.num_ps_tasks + 1, ")"));
  }
  if (slurm.base_port < 1 || slurm.base_port + ntasks - 1 > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("the Slurm base port ", slurm.base_port, " + rank must be in [1, ",
                                                   "65535] for all SLURM_NTASKS=", ntasks, " tasks"));
  }
  if (slurm.nodelist.empty()) return SlurmError(slurm.nodelist_variable, "is not set");
  FOREMAN_ASSIGN_OR_RETURN(std::vector<std::string> nodes,
                           ExpandSlurmHostList(slurm.nodelist, slurm.nodelist_variable));
  // Each rank's node, by block distribution.
  std::vector<int64_t> per_node;
  if (!slurm.tasks_per_node.empty()) {
    FOREMAN_ASSIGN_OR_RETURN(per_node, ParseTasksPerNode(slurm.tasks_per_node, slurm.tasks_per_node_variable));
    if (per_node.size() != nodes.size()) {
      return SlurmError(slurm.tasks_per_node_variable,
                        absl::StrCat("'", slurm.tasks_per_node, "' gives tasks for ", per_node.size(),
                                     " nodes, but ", slurm.nodelist_variable, " has ", nodes.size()));
    }
  } else if (nodes.size() == 1) {
    per_node = {ntasks};
  } else if (static_cast<int64_t>(nodes.size()) == ntasks) {
    per_node.assign(nodes.size(), 1);
  } else {
    return SlurmError(slurm.tasks_per_node_variable,
                      absl::StrCat("is not set, and SLURM_NTASKS=", ntasks, " tasks on ", nodes.size(),
                                   " nodes leaves each task's node unknown"));
  }
  int64_t total = 0;
  for (int64_t c : per_node) total += c;
  if (total != ntasks) {
    return SlurmError(slurm.tasks_per_node_variable, absl::StrCat("'", slurm.tasks_per_node, "' adds up to ", total,
                                                                  " tasks, but SLURM_NTASKS is ", ntasks));
  }
  std::vector<std::string> entries;
  for (std::size_t node = 0; node < nodes.size(); ++node) {
    for (int64_t k = 0; k < per_node[node]; ++k) {
      const int64_t rank = static_cast<int64_t>(entries.size());
      const std::string entry = absl::StrCat(nodes[node], ":", slurm.base_port + rank);
      TaskAddress address;
      std::string why;
      if (!ParseTaskAddress(entry, &address, &why)) {
        return SlurmError(slurm.nodelist_variable, absl::StrCat("host '", nodes[node], "' (node ", node, "): ", why));
      }
      entries.push_back(entry);
    }
  }
  const auto ps_end = entries.begin() + slurm.num_ps_tasks;
  FOREMAN_ASSIGN_OR_RETURN(ClusterSpec spec, ClusterSpec::Create({{"ps", std::vector<std::string>(entries.begin(), ps_end)},
                                                                  {"worker", std::vector<std::string>(ps_end, entries.end())}}));
  ClusterTask task = procid < slurm.num_ps_tasks
                         ? ClusterTask{"ps", static_cast<int>(procid)}
                         : ClusterTask{"worker", static_cast<int>(procid - slurm.num_ps_tasks)};
  return ClusterLaunch{std::move(spec), std::move(task),
                       absl::StrCat("SLURM_PROCID ", procid, " of SLURM_NTASKS ", ntasks)};
}

namespace {

std::string Env(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr ? std::string() : std::string(v);
}

}  // namespace

StatusOr<std::optional<ClusterLaunch>> ClusterFromEnvironment(ClusterEnvironment which, const SlurmLaunch& slurm) {
  if (which == ClusterEnvironment::kNone) return std::optional<ClusterLaunch>();
  if (which != ClusterEnvironment::kSlurm) {
    const std::string tf_config = Env("TF_CONFIG");
    if (!tf_config.empty()) {
      FOREMAN_ASSIGN_OR_RETURN(ClusterLaunch launch, ClusterFromTfConfig(tf_config));
      return std::optional<ClusterLaunch>(std::move(launch));
    }
    if (which == ClusterEnvironment::kTfConfig) {
      return absl::FailedPreconditionError("TF_CONFIG is not set (or empty)");
    }
  }
  SlurmLaunch s = slurm;
  s.procid = Env("SLURM_PROCID");
  s.ntasks = Env("SLURM_NTASKS");
  s.nodelist = Env("SLURM_STEP_NODELIST");
  s.nodelist_variable = "SLURM_STEP_NODELIST";
  if (s.nodelist.empty()) {
    s.nodelist = Env("SLURM_JOB_NODELIST");
    s.nodelist_variable = "SLURM_JOB_NODELIST";
  }
  s.tasks_per_node = Env("SLURM_STEP_TASKS_PER_NODE");
  s.tasks_per_node_variable = "SLURM_STEP_TASKS_PER_NODE";
  if (s.tasks_per_node.empty()) {
    s.tasks_per_node = Env("SLURM_TASKS_PER_NODE");
    s.tasks_per_node_variable = "SLURM_TASKS_PER_NODE";
  }
  const bool all_set = !s.procid.empty() && !s.ntasks.empty() && !s.nodelist.empty();
  // srun sets SLURM_STEP_NODELIST in each task of a step; a batch script
  // itself has SLURM_PROCID=0 and the allocation's SLURM_NTASKS but no step
  // variables, and a `foreman train` run there is not one of N tasks.
  const bool in_step = !Env("SLURM_STEP_NODELIST").empty();
  if (which == ClusterEnvironment::kSlurm) {
    if (!all_set) {
      std::vector<std::string> missing;
      if (s.procid.empty()) missing.push_back("SLURM_PROCID");
      if (s.ntasks.empty()) missing.push_back("SLURM_NTASKS");
      if (s.nodelist.empty()) missing.push_back("SLURM_JOB_NODELIST");
      return absl::FailedPreconditionError(absl::StrCat("not a Slurm step: ", absl::StrJoin(missing, ", "),
                                                        missing.size() == 1 ? " is" : " are", " not set"));
    }
  } else if (!all_set || !in_step || s.ntasks == "1") {
    return std::optional<ClusterLaunch>();
  }
  FOREMAN_ASSIGN_OR_RETURN(ClusterLaunch launch, ClusterFromSlurm(s));
  return std::optional<ClusterLaunch>(std::move(launch));
}

}  // namespace foreman
