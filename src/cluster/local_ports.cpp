// See local_ports.hpp.
#include "cluster/local_ports.hpp"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>
#include <arpa/inet.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace foreman::internal {

// `n` distinct free TCP ports on 127.0.0.1 (bound together, then released:
// another process could take one before its task binds it; that task then
// exits 1 naming the address).
StatusOr<std::vector<int>> FreeLoopbackPorts(int n) {
  std::vector<int> fds;
  std::vector<int> ports;
  Status status;
  for (int i = 0; i < n && status.ok(); ++i) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
      status = absl::UnavailableError(absl::StrCat("socket(): ", std::strerror(errno)));
      break;
    }
    fds.push_back(fd);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = 0;
    socklen_t len = sizeof(a);
    if (bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 ||
        getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
      status = absl::UnavailableError(absl::StrCat("cannot pick a free port on 127.0.0.1: ", std::strerror(errno)));
      break;
    }
    ports.push_back(ntohs(a.sin_port));
  }
  for (int fd : fds) close(fd);
  if (!status.ok()) return status;
  return ports;
}

}  // namespace foreman::internal
