// The floor under a cluster step's round trip (issue 27 point 3): two
// processes on 127.0.0.1 trade a request of REQUEST_BYTES for an answer of
// ANSWER_BYTES over one TCP connection (TCP_NODELAY), with nothing but the
// kernel's copies — no CAF, no serialization, no apply. cluster_bench.sh runs
// it with a step's gradient and variable bytes, pinned as the ps and the
// worker are, so that its line sits beside worker 0's apply time:
//
//   RUN cluster.tcp_roundtrip_us <median> us p10=<us> p90=<us> request_bytes=<n> answer_bytes=<n> reps=<n>
//
// Usage: tcp_roundtrip REQUEST_BYTES ANSWER_BYTES REPS [SERVER_CPU CLIENT_CPU]
// (a CPU of -1, or none given, leaves that side unpinned). Exits 2 on bad
// arguments, 1 on a socket error or when a side is still running after
// 60 s (SIGALRM); the client never leaves the answering process behind.
#include <arpa/inet.h>
#include <signal.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sched.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

pid_t g_server = 0;  // in the client: the answering process, until reaped

void StopServer() {
  if (g_server > 0) {
    ::kill(g_server, SIGKILL);
    ::waitpid(g_server, nullptr, 0);
    g_server = 0;
  }
}

[[noreturn]] void Die(const char* what) {
  std::fprintf(stderr, "tcp_roundtrip: %s: %s\n", what, std::strerror(errno));
  StopServer();
  std::exit(1);
}

// SIGALRM: only async-signal-safe calls.
void OnAlarm(int) {
  static const char kMsg[] = "tcp_roundtrip: still running after 60 s\n";
  (void)!::write(STDERR_FILENO, kMsg, sizeof kMsg - 1);
  if (g_server > 0) ::kill(g_server, SIGKILL);
  ::_exit(1);
}

void WriteAll(int fd, const char* p, size_t n) {
  while (n > 0) {
    const ssize_t k = ::write(fd, p, n);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) Die("write");
    p += k;
    n -= static_cast<size_t>(k);
  }
}

void ReadAll(int fd, char* p, size_t n) {
  while (n > 0) {
    const ssize_t k = ::read(fd, p, n);
    if (k < 0 && errno == EINTR) continue;
    if (k == 0) {
      errno = ECONNRESET;
      Die("read (peer closed)");
    }
    if (k < 0) Die("read");
    p += k;
    n -= static_cast<size_t>(k);
  }
}

void Pin(long cpu) {
  if (cpu < 0) return;
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(static_cast<int>(cpu), &set);
  if (sched_setaffinity(0, sizeof set, &set) != 0) Die("sched_setaffinity");
}

void NoDelay(int fd) {
  const int one = 1;
  if (setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one) != 0) Die("setsockopt TCP_NODELAY");
}

// A whole decimal number in [lo, hi], or exit 2 naming the argument.
long Arg(const char* text, const char* name, long lo, long hi) {
  char* end = nullptr;
  errno = 0;
  const long v = std::strtol(text, &end, 10);
  if (errno != 0 || end == text || *end != '\0' || v < lo || v > hi || text[0] == '+') {
    std::fprintf(stderr, "tcp_roundtrip: %s must be a whole number in [%ld, %ld], not '%s'\n", name, lo, hi, text);
    std::exit(2);
  }
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4 && argc != 6) {
    std::fprintf(stderr, "usage: tcp_roundtrip REQUEST_BYTES ANSWER_BYTES REPS [SERVER_CPU CLIENT_CPU]\n");
    return 2;
  }
  const auto request = static_cast<size_t>(Arg(argv[1], "REQUEST_BYTES", 1, 1L << 30));
  const auto answer = static_cast<size_t>(Arg(argv[2], "ANSWER_BYTES", 1, 1L << 30));
  const long reps = Arg(argv[3], "REPS", 1, 1000000);
  const long server_cpu = argc == 6 ? Arg(argv[4], "SERVER_CPU", -1, CPU_SETSIZE - 1) : -1;
  const long client_cpu = argc == 6 ? Arg(argv[5], "CLIENT_CPU", -1, CPU_SETSIZE - 1) : -1;

  const int listener = ::socket(AF_INET, SOCK_STREAM, 0);
  if (listener < 0) Die("socket");
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);  // 127.0.0.1 only
  addr.sin_port = 0;
  socklen_t len = sizeof addr;
  if (::bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) Die("bind 127.0.0.1");
  if (::getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len) != 0) Die("getsockname");
  if (::listen(listener, 1) != 0) Die("listen");

  ::signal(SIGALRM, OnAlarm);
  const pid_t server = ::fork();
  if (server < 0) Die("fork");
  if (server == 0) {  // the "ps": reads each request whole, answers it
    ::alarm(60);
    Pin(server_cpu);
    const int conn = ::accept(listener, nullptr, nullptr);
    if (conn < 0) Die("accept");
    NoDelay(conn);
    std::vector<char> in(request), out(answer, 1);
    for (long i = 0; i < reps; ++i) {
      ReadAll(conn, in.data(), request);
      WriteAll(conn, out.data(), answer);
    }
    ::_exit(0);
  }
  g_server = server;
  ::close(listener);
  ::alarm(60);
  Pin(client_cpu);
  const int conn = ::socket(AF_INET, SOCK_STREAM, 0);
  if (conn < 0) Die("socket");
  if (::connect(conn, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) Die("connect 127.0.0.1");
  NoDelay(conn);
  std::vector<char> out(request, 2), in(answer);
  std::vector<double> us;
  us.reserve(static_cast<size_t>(reps));
  for (long i = 0; i < reps; ++i) {
    const auto start = std::chrono::steady_clock::now();
    WriteAll(conn, out.data(), request);
    ReadAll(conn, in.data(), answer);
    us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count());
  }
  ::close(conn);
  int status = 0;
  const pid_t reaped = ::waitpid(server, &status, 0);
  g_server = 0;
  if (reaped != server || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    std::fprintf(stderr, "tcp_roundtrip: the answering process failed\n");
    return 1;
  }
  std::sort(us.begin(), us.end());
  auto at = [&](double q) { return us[static_cast<size_t>(q * static_cast<double>(us.size() - 1))]; };
  std::printf("RUN cluster.tcp_roundtrip_us %.0f us p10=%.0f p90=%.0f request_bytes=%zu answer_bytes=%zu reps=%ld\n",
              at(0.5), at(0.1), at(0.9), request, answer, reps);
  return 0;
}
