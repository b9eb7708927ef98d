// --preset cluster's network partitions (chaos_cluster_net.hpp).
#include "fault/chaos_cluster_net.hpp"
#include "fault/chaos_run.hpp"

#include <chrono>
#include <filesystem>
#include <string>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "fault/chaos_checks.hpp"

namespace foreman::internal {
namespace {

namespace fs = std::filesystem;

// Runs `argv` (looked up on PATH) in the namespaces of `holder` (0: ours),
// output to /dev/null, for at most 5 s (its group killed past that); its exit
// code as the callers word it: 124 after the 5 s, 128 for a signal.
StatusOr<int> RunHelper(const std::vector<std::string>& argv, pid_t holder) {
  SpawnOptions o;
  o.argv = argv;
  o.join_namespaces_of = holder;
  o.stderr_to = ChildOutput::DevNull();
  FOREMAN_ASSIGN_OR_RETURN(Subprocess child, Subprocess::Spawn(o));
  FOREMAN_ASSIGN_OR_RETURN(FinishResult r, child.Finish(5000));
  if (r.timed_out) return 124;
  return r.exit.term_signal != 0 ? 128 : r.exit.exit_code;
}

// `ip args` in holder's namespaces.
Status Ip(pid_t holder, const std::vector<std::string>& args) {
  std::vector<std::string> argv = {"ip"};
  argv.insert(argv.end(), args.begin(), args.end());
  FOREMAN_ASSIGN_OR_RETURN(int rc, RunHelper(argv, holder));
  if (rc != 0) {
    return absl::InternalError(
        absl::StrCat("`ip ", absl::StrJoin(args, " "), "` in the namespaces of process ", holder, " exited ", rc));
  }
  return absl::OkStatus();
}

}  // namespace

std::string PartitionUnavailable(const std::vector<std::string>& train_flags) {
  for (const char* tls : {"--tls-cert", "--tls-key", "--tls-ca"}) {
    if (HasFlag(train_flags, tls)) {
      return absl::StrCat("the train flags set ", tls, " (a partitioned cluster runs --insecure on a veth pair)");
    }
  }
  auto rc = RunHelper({"unshare", "-rn", "ip", "link", "add", "fa", "type", "veth", "peer", "name", "fb"}, 0);
  if (!rc.ok()) return std::string(rc.status().message());
  if (*rc != 0) {
    return absl::StrCat("`unshare -rn ip link add fa type veth peer name fb` exited ", *rc,
                        ": needs unprivileged user namespaces, util-linux's unshare and iproute2's ip");
  }
  return "";
}

PartitionNet::~PartitionNet() {
  // b first: it lives in a's user namespace. Subprocess's destructor kills
  // the holder's group and reaps it.
  if (b_.pid() > 0) observer_.OnProcessGroup(4, 0);
  b_ = Subprocess();
  if (a_.pid() > 0) observer_.OnProcessGroup(3, 0);
  a_ = Subprocess();
}

StatusOr<Subprocess> PartitionNet::Holder(pid_t in, const std::vector<std::string>& args, int slot) {
  SpawnOptions o;
  o.argv = {"unshare"};
  o.argv.insert(o.argv.end(), args.begin(), args.end());
  o.join_namespaces_of = in;
  o.stderr_to = ChildOutput::DevNull();
  FOREMAN_ASSIGN_OR_RETURN(Subprocess holder, SpawnObserved(o, observer_, slot));
  std::error_code outer_ec;
  const std::string outer =
      fs::read_symlink(in > 0 ? absl::StrCat("/proc/", in, "/ns/net") : "/proc/self/ns/net", outer_ec).string();
  for (int i = 0; i < 250; ++i) {
    std::error_code ec;
    const fs::path mine = fs::read_symlink(absl::StrCat("/proc/", holder.pid(), "/ns/net"), ec);
    if (!ec && mine.string() != outer) return holder;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  observer_.OnProcessGroup(slot, 0);
  return absl::InternalError(
      absl::StrCat("`unshare ", absl::StrJoin(args, " "), "` made no network namespace in 5 s"));
}

Status PartitionNet::SetUp() {
  FOREMAN_ASSIGN_OR_RETURN(a_, Holder(0, {"-rn", "sleep", "3600"}, 3));
  FOREMAN_ASSIGN_OR_RETURN(b_, Holder(a_.pid(), {"-n", "sleep", "3600"}, 4));
  const pid_t a = a_.pid(), b = b_.pid();
  for (const auto& [in, args] : std::vector<std::pair<pid_t, std::vector<std::string>>>{
           {a, {"link", "set", "lo", "up"}},
           {a, {"link", "add", "fa", "type", "veth", "peer", "name", "fb"}},
           {a, {"link", "set", "fb", "netns", absl::StrCat(b)}},
           {a, {"addr", "add", absl::StrCat(kPartitionAddrA, "/24"), "dev", "fa"}},
           {a, {"link", "set", "fa", "up"}},
           {b, {"link", "set", "lo", "up"}},
           {b, {"addr", "add", absl::StrCat(kPartitionAddrB, "/24"), "dev", "fb"}},
           {b, {"link", "set", "fb", "up"}}}) {
    FOREMAN_RETURN_IF_ERROR(Ip(in, args));
  }
  return absl::OkStatus();
}

Status PartitionNet::Cut() const {
  FOREMAN_RETURN_IF_ERROR(
      Ip(a(), {"neigh", "replace", kPartitionAddrB, "lladdr", "02:00:00:00:13:02", "dev", "fa", "nud", "permanent"}));
  return Ip(b(), {"neigh", "replace", kPartitionAddrA, "lladdr", "02:00:00:00:13:01", "dev", "fb", "nud", "permanent"});
}

Status PartitionNet::Heal() const {
  FOREMAN_RETURN_IF_ERROR(Ip(a(), {"neigh", "del", kPartitionAddrB, "dev", "fa"}));
  return Ip(b(), {"neigh", "del", kPartitionAddrA, "dev", "fb"});
}

}  // namespace foreman::internal
