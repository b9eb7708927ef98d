// --preset cluster's silent network partitions (chaos_cluster.hpp): one
// seed's two network namespaces joined by a veth pair, and the cut and heal
// of the link between them (tests/cluster_partition_test.sh does the same in
// bash). Every helper (`unshare`, `ip`) is an internal::Subprocess. Internal.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

#include "foreman/chaos.hpp"
#include "foreman/status.hpp"
#include "platform/subprocess.hpp"

namespace foreman::internal {

/// The addresses of the two namespaces: A holds the chief and the task not
/// cut, B the partitioned task.
inline constexpr const char* kPartitionAddrA = "10.213.0.1";
inline constexpr const char* kPartitionAddrB = "10.213.0.2";

/// "" when this run can cut a task's network (`unshare -rn` can make a veth
/// pair, and the train flags set no TLS flag), else why not.
std::string PartitionUnavailable(const std::vector<std::string>& train_flags);

/// One seed's two network namespaces, each held by a `sleep` child: A (a new
/// user + network namespace) and B (a network namespace inside A's user
/// namespace), joined by a veth pair fa (A, kPartitionAddrA) - fb (B,
/// kPartitionAddrB). The holders are observer slots 3 and 4; the destructor
/// kills both (the namespaces go with them). Not thread-safe.
class PartitionNet {
 public:
  explicit PartitionNet(ChaosObserver& observer) : observer_(observer) {}
  ~PartitionNet();
  PartitionNet(const PartitionNet&) = delete;
  PartitionNet& operator=(const PartitionNet&) = delete;

  /// Makes the namespaces and the link (errors: a helper that failed, named).
  Status SetUp();
  /// Silent both ways: each side's neighbour entry for the other becomes a
  /// MAC address nobody has (no RST, no ICMP, the links stay up).
  Status Cut() const;
  Status Heal() const;

  pid_t a() const { return a_.pid() > 0 ? a_.pid() : 0; }
  pid_t b() const { return b_.pid() > 0 ? b_.pid() : 0; }

 private:
  StatusOr<Subprocess> Holder(pid_t in, const std::vector<std::string>& args, int slot);

  ChaosObserver& observer_;
  Subprocess a_, b_;
};

}  // namespace foreman::internal
