// The "host:port" check behind ClusterSpec::Create (cluster_spec.cpp), shared
// with the launchers' environments (cluster_launch.cpp), and the network part
// of ValidateClusterOptions, shared with ConfigureClusterNetwork
// (server.hpp). Internal.
#pragma once

#include <string>

#include "foreman/cluster.hpp"

namespace foreman::cluster_internal {

// Parses `entry` ("host:port" or "[v6]:port") into *out; on a bad entry
// returns false with *why saying what is wrong (without the entry itself).
bool ParseTaskAddress(const std::string& entry, TaskAddress* out, std::string* why);

// The key two entries share when they name the same address (host without
// case, port).
std::string TaskAddressKey(const TaskAddress& address);

// ValidateClusterOptions' checks that need no spec: heartbeat_ms,
// connection_timeout_ms, ps_wait_secs, and the three TLS files all or none
// (INVALID_ARGUMENT naming the flag).
Status ValidateNetworkOptions(const ClusterOptions& options);

}  // namespace foreman::cluster_internal
