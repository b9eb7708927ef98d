// ClusterSpec, ClusterTask, PlaceVariablesOnPs, ValidateClusterOptions and
// the TLS preflight CheckTlsFiles (foreman/cluster.hpp).
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include <doctest/doctest.h>

#include "foreman/cluster.hpp"
#include "cluster/peer_silence.hpp"
#include "foreman/graph.hpp"
#include "foreman/nn.hpp"
#include "support/test_util.hpp"

namespace foreman {
namespace {

// The message of a status that must be INVALID_ARGUMENT.
template <class S>
std::string InvalidMessage(const S& s) {
  const Status status = [&] {
    if constexpr (std::is_same_v<S, Status>) {
      return s;
    } else {
      return s.status();
    }
  }();
  CHECK_MESSAGE(status.code() == absl::StatusCode::kInvalidArgument, status.ToString());
  return std::string(status.message());
}

#define CHECK_CONTAINS(haystack, needle)                                                   \
  do {                                                                                     \
    const std::string h_ = (haystack);                                                     \
    CHECK_MESSAGE(h_.find(needle) != std::string::npos, "'", h_, "' lacks '", needle, "'"); \
  } while (0)

TEST_CASE("FromFlags parses TF1's --ps-hosts and --worker-hosts") {
  auto spec = ClusterSpec::FromFlags("127.0.0.1:2222", "localhost:2223,[::1]:2224,node-1.example.com:65535");
  REQUIRE_MESSAGE(spec.ok(), spec.status().ToString());
  CHECK(spec->num_tasks("ps") == 1);
  CHECK(spec->num_tasks("worker") == 3);
  CHECK(spec->num_tasks("chief") == 0);
  CHECK(spec->jobs().at("worker") ==
        std::vector<std::string>{"localhost:2223", "[::1]:2224", "node-1.example.com:65535"});
  auto a = spec->task_address("worker", 1);
  REQUIRE_OK(a);
  CHECK(a->host == "::1");
  CHECK(a->port == 2224);
  CHECK(spec->task_address("ps", 0)->host == "127.0.0.1");
  CHECK(spec->task_address("worker", 2)->port == 65535);
  CHECK(spec->ToString() ==
        "--ps-hosts 127.0.0.1:2222 --worker-hosts localhost:2223,[::1]:2224,node-1.example.com:65535");
  CHECK_CONTAINS(InvalidMessage(spec->task_address("worker", 3)), "valid indices are 0..2");
  CHECK_CONTAINS(InvalidMessage(spec->task_address("worker", -1)), "valid indices are 0..2");
  CHECK_CONTAINS(InvalidMessage(spec->task_address("evaluator", 0)), "no job 'evaluator'");

  // ToString round-trips through FromFlags.
  auto again = ClusterSpec::FromFlags("127.0.0.1:2222", "localhost:2223,[::1]:2224,node-1.example.com:65535");
  REQUIRE_OK(again);
  CHECK(again->jobs() == spec->jobs());
}

TEST_CASE("FromFlags refuses every bad entry, naming the flag, the entry and its position") {
  struct Case {
    std::string ps, workers, message;
  };
  const std::vector<Case> cases = {
      {"", "127.0.0.1:1", "--ps-hosts is empty: a cluster needs at least one ps task"},
      {"127.0.0.1:1", "", "--worker-hosts is empty: a cluster needs at least one worker task"},
      {"127.0.0.1:1", "127.0.0.1:2,127.0.0.1:99999",
       "--worker-hosts entry 2 (task 1) '127.0.0.1:99999': port must be in [1, 65535]"},
      {"127.0.0.1:0", "127.0.0.1:2", "--ps-hosts entry 1 (task 0) '127.0.0.1:0': port must be in [1, 65535]"},
      {"127.0.0.1:1", "127.0.0.1:2,,127.0.0.1:3", "--worker-hosts entry 2 (task 1) '': the entry is empty"},
      {"127.0.0.1:1,", "127.0.0.1:2", "--ps-hosts entry 2 (task 1) '': the entry is empty"},
      {"127.0.0.1", "127.0.0.1:2", "--ps-hosts entry 1 (task 0) '127.0.0.1': expected host:port"},
      {"127.0.0.1:", "127.0.0.1:2", "'127.0.0.1:': the port is missing"},
      {":2222", "127.0.0.1:2", "':2222': the host is empty"},
      {"127.0.0.1:http", "127.0.0.1:2", "port 'http' must be a decimal number in [1, 65535]"},
      {"127.0.0.1:-5", "127.0.0.1:2", "port '-5' must be a decimal number"},
      {"127.0.0.1:12345678", "127.0.0.1:2", "port '12345678' must be a decimal number in [1, 65535]"},
      {"256.0.0.1:1", "127.0.0.1:2", "'256.0.0.1' is not a valid IPv4 address"},
      {"127.0.1:1", "127.0.0.1:2", "'127.0.1' is not a valid IPv4 address"},
      {"::1:2222", "127.0.0.1:2", "an IPv6 address must be in brackets: [::1]:2222"},
      {"[::1:2222", "127.0.0.1:2", "needs a closing ']'"},
      {"[::1]2222", "127.0.0.1:2", "expected ':port' after the bracketed IPv6 address"},
      {"[::g]:2222", "127.0.0.1:2", "'::g' is not a valid IPv6 address"},
      {"[]:2222", "127.0.0.1:2", "'' is not a valid IPv6 address"},
      {"bad_host:1", "127.0.0.1:2", "has a character not allowed in a host name: '_'"},
      {"127.0.0.1:1", "127.0.0.1:2, 127.0.0.1:3",
       "--worker-hosts entry 2 (task 1) ' 127.0.0.1:3': host name ' 127.0.0.1' has a character not allowed"},
      {"-host:1", "127.0.0.1:2", "starts or ends with '-'"},
      {"a..b:1", "127.0.0.1:2", "has an empty label"},
      {"127.0.0.1:1", "127.0.0.1:2,127.0.0.1:1",
       "--worker-hosts entry 2 (task 1) '127.0.0.1:1': the same host:port as --ps-hosts entry 1 (task 0) "
       "'127.0.0.1:1'"},
      {"127.0.0.1:1", "LOCALHOST:2,localhost:2", "--worker-hosts entry 2 (task 1) 'localhost:2': the same host:port as"},
  };
  for (const Case& c : cases) {
    CAPTURE(c.ps);
    CAPTURE(c.workers);
    auto spec = ClusterSpec::FromFlags(c.ps, c.workers);
    REQUIRE_FALSE(spec.ok());
    CHECK_CONTAINS(InvalidMessage(spec), c.message);
  }
}

TEST_CASE("Create checks job names and names the job in its errors") {
  auto spec = ClusterSpec::Create({{"chief", {"127.0.0.1:1"}}, {"worker", {"127.0.0.1:2"}}, {"ps_2", {"[::1]:3"}}});
  REQUIRE_MESSAGE(spec.ok(), spec.status().ToString());
  CHECK(spec->ToString() == "--chief-hosts 127.0.0.1:1 --ps-2-hosts [::1]:3 --worker-hosts 127.0.0.1:2");
  // Create does not require ps and worker jobs (FromFlags does).
  CHECK_OK(ClusterSpec::Create({{"worker", {"127.0.0.1:2"}}}));

  CHECK_CONTAINS(InvalidMessage(ClusterSpec::Create({})), "the cluster has no jobs");
  CHECK_CONTAINS(InvalidMessage(ClusterSpec::Create({{"Worker", {"127.0.0.1:1"}}})),
                 "job 'Worker': a job name must match [a-z][a-z0-9_]*");
  CHECK_CONTAINS(InvalidMessage(ClusterSpec::Create({{"1ps", {"127.0.0.1:1"}}})), "must match [a-z][a-z0-9_]*");
  CHECK_CONTAINS(InvalidMessage(ClusterSpec::Create({{"ps-1", {"127.0.0.1:1"}}})), "must match [a-z][a-z0-9_]*");
  CHECK_CONTAINS(InvalidMessage(ClusterSpec::Create({{"", {"127.0.0.1:1"}}})), "must not be empty");
  CHECK_CONTAINS(InvalidMessage(ClusterSpec::Create({{"ps", {}}})), "job 'ps' has no tasks");
  CHECK_CONTAINS(InvalidMessage(ClusterSpec::Create({{"worker", {"127.0.0.1:1", "127.0.0.1:70000"}}})),
                 "job 'worker' entry 2 (task 1) '127.0.0.1:70000': port must be in [1, 65535]");
  // Leading zeros are refused however many (a port is never written so).
  for (const char* entry : {"127.0.0.1:02222", "127.0.0.1:000001", "127.0.0.1:0000001", "127.0.0.1:00"}) {
    CHECK_CONTAINS(InvalidMessage(ClusterSpec::Create({{"worker", {entry}}})), "without leading zeros");
  }
}

TEST_CASE("ClusterTask: validation against the spec and is_chief") {
  auto spec = ClusterSpec::FromFlags("127.0.0.1:1", "127.0.0.1:2,127.0.0.1:3");
  REQUIRE_OK(spec);
  CHECK_OK(ValidateClusterTask(*spec, {"ps", 0}));
  CHECK_OK(ValidateClusterTask(*spec, {"worker", 1}));
  CHECK(InvalidMessage(ValidateClusterTask(*spec, {"evaluator", 0})) ==
        "--job-name 'evaluator' is not a job of the cluster (jobs: ps, worker)");
  CHECK(InvalidMessage(ValidateClusterTask(*spec, {"worker", 2})) ==
        "--task-index 2 is out of range for job 'worker': it has 2 tasks, valid indices are 0..1");
  CHECK(InvalidMessage(ValidateClusterTask(*spec, {"ps", 1})) ==
        "--task-index 1 is out of range for job 'ps': it has 1 task, valid indices are 0..0");
  CHECK_CONTAINS(InvalidMessage(ValidateClusterTask(*spec, {"ps", -1})), "--task-index -1 is out of range");

  CHECK(ClusterTask{"worker", 0}.is_chief());
  CHECK_FALSE(ClusterTask{"worker", 1}.is_chief());
  CHECK_FALSE(ClusterTask{"ps", 0}.is_chief());
  CHECK_FALSE(ClusterTask{"chief", 0}.is_chief());
}

// name -> ps task, from PlaceVariablesOnPs.
std::map<std::string, int> Placement(const std::vector<std::string>& names, int num_ps) {
  auto tasks = PlaceVariablesOnPs(names, num_ps);
  REQUIRE_MESSAGE(tasks.ok(), tasks.status().ToString());
  REQUIRE(tasks->size() == names.size());
  std::map<std::string, int> out;
  for (std::size_t i = 0; i < names.size(); ++i) out[names[i]] = (*tasks)[i];
  return out;
}

TEST_CASE("PlaceVariablesOnPs: TF's round-robin by creation order, global_step first") {
  // TF: with replica_device_setter(ps_tasks=3), v_i lands on task i mod 3.
  CHECK(*PlaceVariablesOnPs({"global_step", "a", "b", "c", "d"}, 3) == std::vector<int>{0, 1, 2, 0, 1});
  CHECK(*PlaceVariablesOnPs({"a", "b", "c"}, 1) == std::vector<int>{0, 0, 0});
  CHECK(*PlaceVariablesOnPs({"a", "b"}, 5) == std::vector<int>{0, 1});
  // global_step created later still goes to ps 0, and takes the first turn.
  CHECK(*PlaceVariablesOnPs({"dense/kernel", "dense/bias", "global_step"}, 2) == std::vector<int>{1, 0, 0});
  CHECK(PlaceVariablesOnPs({}, 2)->empty());
}

TEST_CASE("PlaceVariablesOnPs: the MLP's real variables, slots and beta powers (Adam, 2 ps)") {
  const nn::MlpSpec mlp{784, {8}, 10};
  nn::OptimizerOptions adam;
  adam.kind = nn::OptimizerKind::kAdam;
  Graph graph;
  REQUIRE_OK(graph.CreateGlobalStep());
  REQUIRE_OK(nn::AddMlpVariables(graph, mlp, adam, 1));
  std::vector<std::string> creation_order;
  for (const VariableDef& def : graph.variables()) creation_order.push_back(def.name);
  // The graph holds exactly the MLP's variables plus global_step.
  std::vector<std::string> expected_names = nn::MlpVariableNames(mlp, adam);
  expected_names.push_back("global_step");
  std::vector<std::string> sorted = creation_order;
  std::sort(sorted.begin(), sorted.end());
  std::sort(expected_names.begin(), expected_names.end());
  REQUIRE(sorted == expected_names);

  const std::map<std::string, int> got = Placement(creation_order, 2);
  const std::map<std::string, int> want = {
      {"global_step", 0},
      {"dense/kernel", 1},
      {"dense/bias", 0},
      {"dense_1/kernel", 1},
      {"dense_1/bias", 0},
      // with min(var_list, key=name) = "dense/bias" ('/' < '_' < 'k')
      {"beta1_power", 0},
      {"beta2_power", 0},
      {"dense/kernel/Adam", 1},
      {"dense/kernel/Adam_1", 1},
      {"dense/bias/Adam", 0},
      {"dense/bias/Adam_1", 0},
      {"dense_1/kernel/Adam", 1},
      {"dense_1/kernel/Adam_1", 1},
      {"dense_1/bias/Adam", 0},
      {"dense_1/bias/Adam_1", 0},
  };
  CHECK(got == want);

  // The same variables in sorted order (MlpVariableNames' order) place the
  // slots and beta powers the same way relative to their variables.
  const std::map<std::string, int> sorted_placement = Placement(nn::MlpVariableNames(mlp, adam), 3);
  for (const auto& [name, task] : sorted_placement) {
    for (const char* suffix : {"/Adam_1", "/Adam"}) {
      const std::string s(suffix);
      if (name.size() > s.size() && name.compare(name.size() - s.size(), s.size(), s) == 0) {
        CHECK_MESSAGE(task == sorted_placement.at(name.substr(0, name.size() - s.size())), name);
        break;
      }
    }
  }
  CHECK(sorted_placement.at("beta1_power") == sorted_placement.at("dense/bias"));
}

TEST_CASE("PlaceVariablesOnPs: Momentum slots go with their variable and take no turn") {
  const nn::MlpSpec mlp{4, {3, 2}, 2};
  nn::OptimizerOptions momentum;
  momentum.kind = nn::OptimizerKind::kMomentum;
  Graph graph;
  REQUIRE_OK(graph.CreateGlobalStep());
  REQUIRE_OK(nn::AddMlpVariables(graph, mlp, momentum, 1));
  std::vector<std::string> names;
  for (const VariableDef& def : graph.variables()) names.push_back(def.name);
  const std::map<std::string, int> got = Placement(names, 2);
  // 7 primaries round-robin: global_step, dense/kernel, dense/bias, dense_1/kernel, ...
  CHECK(got.at("global_step") == 0);
  CHECK(got.at("dense/kernel") == 1);
  CHECK(got.at("dense/bias") == 0);
  CHECK(got.at("dense_1/kernel") == 1);
  CHECK(got.at("dense_1/bias") == 0);
  CHECK(got.at("dense_2/kernel") == 1);
  CHECK(got.at("dense_2/bias") == 0);
  for (const char* var : {"dense/kernel", "dense/bias", "dense_1/kernel", "dense_1/bias", "dense_2/kernel",
                          "dense_2/bias"}) {
    CHECK(got.at(std::string(var) + "/Momentum") == got.at(var));
  }
}

TEST_CASE("PlaceVariablesOnPs: bad input") {
  CHECK_CONTAINS(InvalidMessage(PlaceVariablesOnPs({"a"}, 0)), "num_ps_tasks must be >= 1, got 0");
  CHECK_CONTAINS(InvalidMessage(PlaceVariablesOnPs({"a", "a"}, 1)), "variable 'a' is listed twice");
  CHECK_CONTAINS(InvalidMessage(PlaceVariablesOnPs({"a", ""}, 1)), "name 1 is empty");
  CHECK_CONTAINS(InvalidMessage(PlaceVariablesOnPs({"a", "w/Adam"}, 1)),
                 "slot variable 'w/Adam' has no primary variable 'w' in the list");
  CHECK_CONTAINS(InvalidMessage(PlaceVariablesOnPs({"global_step", "beta1_power"}, 2)),
                 "'beta1_power' needs a trainable variable");
  // A slot of a slot or of a beta power is refused whatever the list order
  // (TF creates slots only for trainable variables).
  for (const std::vector<std::string>& names : {std::vector<std::string>{"a", "a/Adam", "a/Adam/Adam"},
                                                std::vector<std::string>{"a/Adam/Adam", "a/Adam", "a"}}) {
    CHECK_CONTAINS(InvalidMessage(PlaceVariablesOnPs(names, 2)),
                   "slot variable 'a/Adam/Adam' belongs to 'a/Adam', which is itself a slot");
  }
  CHECK_CONTAINS(InvalidMessage(PlaceVariablesOnPs({"a", "beta1_power", "beta1_power/Adam"}, 2)),
                 "slot variable 'beta1_power/Adam' belongs to 'beta1_power', which is itself an Adam beta power");
}

TEST_CASE("ValidateClusterOptions: defaults, intervals, TLS flags and loopback") {
  auto loopback = ClusterSpec::FromFlags("127.0.0.1:1", "localhost:2,[::1]:3,127.8.9.10:4");
  REQUIRE_OK(loopback);
  const ClusterTask chief{"worker", 0};
  const ClusterOptions defaults;
  CHECK(defaults.heartbeat_ms == 200);
  CHECK(defaults.connection_timeout_ms == 1000);
  CHECK(defaults.ps_wait_secs == 300);
  CHECK_FALSE(defaults.insecure);
  CHECK_FALSE(defaults.tls_enabled());
  CHECK_OK(ValidateClusterOptions(*loopback, chief, defaults));

  // The task is checked too.
  CHECK_CONTAINS(InvalidMessage(ValidateClusterOptions(*loopback, {"worker", 4}, defaults)), "--task-index 4");

  ClusterOptions o;
  o.heartbeat_ms = 0;
  CHECK(InvalidMessage(ValidateClusterOptions(*loopback, chief, o)) == "--heartbeat-ms must be > 0, got 0");
  o = {};
  o.connection_timeout_ms = -1;
  CHECK(InvalidMessage(ValidateClusterOptions(*loopback, chief, o)) == "--connection-timeout-ms must be > 0, got -1");
  o = {};
  o.heartbeat_ms = 500;
  o.connection_timeout_ms = 1499;
  CHECK_CONTAINS(InvalidMessage(ValidateClusterOptions(*loopback, chief, o)),
                 "--connection-timeout-ms 1499 must be at least 3 x --heartbeat-ms (500 ms -> at least 1500 ms)");
  o.connection_timeout_ms = 1500;  // exactly 3x is enough
  CHECK_OK(ValidateClusterOptions(*loopback, chief, o));
  o = {};
  o.heartbeat_ms = INT64_MAX;
  o.connection_timeout_ms = INT64_MAX;
  CHECK(InvalidMessage(ValidateClusterOptions(*loopback, chief, o)) ==
        "--heartbeat-ms 9223372036854775807 is too large (at most 86400000 ms, one day)");
  o.heartbeat_ms = 86'400'000;  // the largest: 3 x it does not overflow
  o.connection_timeout_ms = 3 * o.heartbeat_ms - 1;
  CHECK_CONTAINS(InvalidMessage(ValidateClusterOptions(*loopback, chief, o)), "(86400000 ms -> at least 259200000 ms)");
  o = {};
  o.ps_wait_secs = 0;
  CHECK(InvalidMessage(ValidateClusterOptions(*loopback, chief, o)) == "--ps-wait-secs must be > 0, got 0");

  o = {};
  o.tls_cert = "node.pem";
  CHECK(InvalidMessage(ValidateClusterOptions(*loopback, chief, o)) ==
        "TLS needs all three of --tls-cert, --tls-key and --tls-ca; missing: --tls-key, --tls-ca");
  o.tls_key = "node.key";
  CHECK(InvalidMessage(ValidateClusterOptions(*loopback, chief, o)) ==
        "TLS needs all three of --tls-cert, --tls-key and --tls-ca; missing: --tls-ca");
  o = {};
  o.tls_ca = "ca.pem";
  CHECK_CONTAINS(InvalidMessage(ValidateClusterOptions(*loopback, chief, o)), "missing: --tls-cert, --tls-key");

  // Off loopback: refused without TLS, unless --insecure.
  auto remote = ClusterSpec::FromFlags("127.0.0.1:1", "127.0.0.1:2,10.0.0.2:2222");
  REQUIRE_OK(remote);
  const std::string msg = InvalidMessage(ValidateClusterOptions(*remote, chief, ClusterOptions{}));
  CHECK_CONTAINS(msg, "task worker:1 '10.0.0.2:2222' is not a loopback address");
  CHECK_CONTAINS(msg, "no authentication");
  CHECK_CONTAINS(msg, "Pass --tls-cert, --tls-key and --tls-ca");
  CHECK_CONTAINS(msg, "--insecure");
  o = {};
  o.insecure = true;
  CHECK_OK(ValidateClusterOptions(*remote, chief, o));
  o = {};
  o.tls_cert = "a";
  o.tls_key = "b";
  o.tls_ca = "c";  // the files are CheckTlsFiles' business
  CHECK(o.tls_enabled());
  CHECK_OK(ValidateClusterOptions(*remote, chief, o));
  auto named = ClusterSpec::FromFlags("ps0.example.com:2222", "127.0.0.1:2");
  REQUIRE_OK(named);
  CHECK_CONTAINS(InvalidMessage(ValidateClusterOptions(*named, chief, ClusterOptions{})),
                 "task ps:0 'ps0.example.com:2222' is not a loopback address");
}

TEST_CASE("IsLoopbackHost") {
  for (const char* host : {"127.0.0.1", "127.255.0.9", "localhost", "LocalHost", "::1", "::ffff:127.0.0.1"}) {
    CHECK_MESSAGE(IsLoopbackHost(host), host);
  }
  for (const char* host : {"128.0.0.1", "10.0.0.1", "0.0.0.0", "::", "::2", "fe80::1", "localhost.example.com",
                           "example.com", "::ffff:10.0.0.1", ""}) {
    CHECK_FALSE_MESSAGE(IsLoopbackHost(host), host);
  }
}

// -- the TLS preflight --------------------------------------------------------

// The test PKI, made once per process by tools/scripts/gen-tls-certs.sh
// (doctest reruns a TEST_CASE for each SUBCASE): ca.pem, node0/node1 signed
// by it, rogue (another CA's), old (expired). nullptr when openssl is missing.
const testing::TempDir* TestPki() {
  static const testing::TempDir* pki = []() -> const testing::TempDir* {
    if (std::system("command -v openssl >/dev/null 2>&1") != 0) return nullptr;
    const char* testdata = std::getenv("FOREMAN_TESTDATA");
    REQUIRE_MESSAGE(testdata != nullptr, "FOREMAN_TESTDATA is not set (meson test sets it)");
    static testing::TempDir dir("cluster_tls");
    const std::string script = std::string(testdata) + "/../../tools/scripts/gen-tls-certs.sh";
    const std::string cmd = "'" + script + "' --rogue rogue --expired old '" + dir.path() + "' node0 node1";
    const int rc = std::system(cmd.c_str());
    REQUIRE_MESSAGE(rc == 0, cmd, " failed: ", rc);
    return &dir;
  }();
  return pki;
}

void WriteFile(const std::string& path, const std::string& data) {
  std::ofstream f(path, std::ios::binary);
  f << data;
  REQUIRE(f.good());
}

std::string ReadAll(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

TEST_CASE("CheckTlsFiles: good files pass; every bad file is named with the reason") {
  const testing::TempDir* pki = TestPki();
  if (pki == nullptr) {
    MESSAGE("SKIPPED: the openssl command is not installed (Debian: apt-get install openssl)");
    return;
  }
  const std::string d = pki->path();
  const std::string cert = d + "/node0.pem", key = d + "/node0.key", ca = d + "/ca.pem";
  Status ok = CheckTlsFiles(cert, key, ca);
  CHECK_MESSAGE(ok.ok(), ok.ToString());
  CHECK_OK(CheckTlsFiles(d + "/node1.pem", d + "/node1.key", ca));
  // A chain file: the certificate followed by its CA is accepted too.
  WriteFile(d + "/chain.pem", ReadAll(cert) + ReadAll(ca));
  CHECK_OK(CheckTlsFiles(d + "/chain.pem", key, ca));

  SUBCASE("missing files, named by flag and path, with the system's reason") {
    CHECK(InvalidMessage(CheckTlsFiles(d + "/nope.pem", key, ca)) ==
          "--tls-cert '" + d + "/nope.pem': cannot open: No such file or directory");
    CHECK(InvalidMessage(CheckTlsFiles(cert, d + "/nope.key", ca)) ==
          "--tls-key '" + d + "/nope.key': cannot open: No such file or directory");
    CHECK(InvalidMessage(CheckTlsFiles(cert, key, d + "/nope.pem")) ==
          "--tls-ca '" + d + "/nope.pem': cannot open: No such file or directory");
    CHECK(InvalidMessage(CheckTlsFiles(cert, key, "")) == "--tls-ca is empty: give the path of a PEM file");
    const std::string not_regular = "': not a regular file (a directory, pipe or device): the TLS module reads it "
                                    "again on every connection";
    CHECK(InvalidMessage(CheckTlsFiles(cert, d, ca)) == "--tls-key '" + d + not_regular);
    // A pipe would pass a read here and be empty when CAF reads it again
    // (it then aborts the process); a FIFO without a writer must not hang.
    const std::string fifo = d + "/fifo.key";
    std::filesystem::remove(fifo);
    REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
    CHECK(InvalidMessage(CheckTlsFiles(cert, fifo, ca)) == "--tls-key '" + fifo + not_regular);
    CHECK(InvalidMessage(CheckTlsFiles(cert, key, "/dev/null")) == "--tls-ca '/dev/null" + not_regular);
  }
  SUBCASE("an unreadable file") {
    if (::geteuid() == 0) {
      MESSAGE("SKIPPED the unreadable-file check: root reads files whatever their mode");
    } else {
      const std::string locked = d + "/locked.key";
      WriteFile(locked, ReadAll(key));
      REQUIRE(::chmod(locked.c_str(), 0) == 0);
      CHECK(InvalidMessage(CheckTlsFiles(cert, locked, ca)) ==
            "--tls-key '" + locked + "': cannot open: Permission denied");
    }
  }
  SUBCASE("garbage instead of PEM") {
    WriteFile(d + "/garbage", "this is not a PEM file\n\x01\x02\x03");
    CHECK_CONTAINS(InvalidMessage(CheckTlsFiles(d + "/garbage", key, ca)),
                   "--tls-cert '" + d + "/garbage': no PEM certificate found");
    CHECK_CONTAINS(InvalidMessage(CheckTlsFiles(cert, d + "/garbage", ca)),
                   "--tls-key '" + d + "/garbage': no PEM private key found");
    CHECK_CONTAINS(InvalidMessage(CheckTlsFiles(cert, key, d + "/garbage")),
                   "--tls-ca '" + d + "/garbage': no PEM certificate found");
    WriteFile(d + "/empty", "");
    CHECK_CONTAINS(InvalidMessage(CheckTlsFiles(d + "/empty", key, ca)), "no PEM certificate found");
    // A certificate given as the key, a key given as the certificate.
    CHECK_CONTAINS(InvalidMessage(CheckTlsFiles(cert, cert, ca)), "no PEM private key found");
    CHECK_CONTAINS(InvalidMessage(CheckTlsFiles(key, key, ca)), "no PEM certificate found");
    // A truncated certificate.
    const std::string pem = ReadAll(cert);
    WriteFile(d + "/truncated.pem", pem.substr(0, pem.size() / 2));
    CHECK_CONTAINS(InvalidMessage(CheckTlsFiles(d + "/truncated.pem", key, ca)), "no PEM certificate found");
    // A CA bundle with a corrupt block between good ones: refused (libssl
    // would stop there and drop the certificates after it).
    WriteFile(d + "/bad-bundle.pem", ReadAll(ca) + "-----BEGIN CERTIFICATE-----\nMIIB!!!!notbase64@@@\n"
                                                    "-----END CERTIFICATE-----\n" + ReadAll(ca));
    CHECK_CONTAINS(InvalidMessage(CheckTlsFiles(cert, key, d + "/bad-bundle.pem")),
                   "--tls-ca '" + d + "/bad-bundle.pem': certificate block 2 cannot be parsed");
  }
  SUBCASE("an encrypted key is refused: no passphrase support yet") {
    const std::string cmd = "openssl pkey -in '" + key + "' -aes256 -passout pass:secret -out '" + d +
                            "/encrypted.key' 2>/dev/null";
    REQUIRE(std::system(cmd.c_str()) == 0);
    const std::string msg = InvalidMessage(CheckTlsFiles(cert, d + "/encrypted.key", ca));
    CHECK_CONTAINS(msg, "--tls-key '" + d + "/encrypted.key': the private key is encrypted");
    CHECK_CONTAINS(msg, "no passphrase support yet");
  }
  SUBCASE("the key of another certificate") {
    CHECK(InvalidMessage(CheckTlsFiles(cert, d + "/node1.key", ca)) ==
          "--tls-key '" + d + "/node1.key' does not match the certificate --tls-cert '" + cert +
              "' (it is the key of another certificate)");
  }
  SUBCASE("a certificate signed by another CA") {
    const std::string msg = InvalidMessage(CheckTlsFiles(d + "/rogue.pem", d + "/rogue.key", ca));
    CHECK_CONTAINS(msg, "--tls-cert '" + d + "/rogue.pem' does not verify against --tls-ca '" + ca + "'");
    CHECK_CONTAINS(msg, "unable to get local issuer certificate");
    // ... which verifies against its own CA.
    CHECK_OK(CheckTlsFiles(d + "/rogue.pem", d + "/rogue.key", d + "/rogue-ca.pem"));
    // A CA file holding both CAs accepts both.
    WriteFile(d + "/both.pem", ReadAll(ca) + ReadAll(d + "/rogue-ca.pem"));
    CHECK_OK(CheckTlsFiles(d + "/rogue.pem", d + "/rogue.key", d + "/both.pem"));
    CHECK_OK(CheckTlsFiles(cert, key, d + "/both.pem"));
  }
  SUBCASE("an expired certificate") {
    const std::string msg = InvalidMessage(CheckTlsFiles(d + "/old.pem", d + "/old.key", ca));
    CHECK_CONTAINS(msg, "--tls-cert '" + d + "/old.pem': the certificate expired on ");
    CHECK_CONTAINS(msg, "GMT");
  }
}

// Issue 31 point 3: tasks started from one spec agree on a job id without
// configuration; another spec gets another id.
TEST_CASE("DefaultClusterJobId: the same spec the same id, another spec another; --cluster-job-id is checked") {
  auto a = ClusterSpec::FromFlags("127.0.0.1:2222", "127.0.0.1:2223,127.0.0.1:2224");
  auto a2 = ClusterSpec::FromFlags("127.0.0.1:2222", "127.0.0.1:2223,127.0.0.1:2224");
  auto b = ClusterSpec::FromFlags("127.0.0.1:2222", "127.0.0.1:2225");
  REQUIRE_OK(a);
  REQUIRE_OK(a2);
  REQUIRE_OK(b);
  const std::string id = DefaultClusterJobId(*a);
  CHECK(id.size() == 17);
  CHECK(id.rfind("spec-", 0) == 0);
  CHECK(id == DefaultClusterJobId(*a2));
  CHECK(id != DefaultClusterJobId(*b));
  ClusterOptions options;
  options.job_id = "job-a.1_x";
  CHECK_OK(ValidateClusterOptions(*a, ClusterTask{"worker", 0}, options));
  for (const std::string& bad : std::vector<std::string>{"a b", std::string(65, 'x'), "a/b"}) {
    options.job_id = bad;
    Status s = ValidateClusterOptions(*a, ClusterTask{"worker", 0}, options);
    CHECK(s.code() == absl::StatusCode::kInvalidArgument);
    CHECK(s.message().find("--cluster-job-id") != std::string::npos);
  }
}

// Issue 31 point 4: one line for a loss, one for the return, at most one
// per task per min_line_interval_ms however fast it flaps.
TEST_CASE("PeerSilenceLog logs a silent task once, its return once, and rate-limits flapping") {
  internal::PeerSilenceLog log("ps task 0", /*silence_ms=*/1000, /*min_line_interval_ms=*/1000);
  // Never updated: nothing to lose.
  CHECK(!log.Observe(1, -1, 0).has_value());
  CHECK(!log.Observe(1, 100, 100).has_value());
  std::optional<std::string> lost = log.Observe(1, 1200, 1300);
  REQUIRE(lost.has_value());
  CHECK(*lost == "ps task 0: worker 1 (/job:worker/task:1) lost: no update from it for 1200 ms (more than "
                 "--connection-timeout-ms=1000; killed, stopped or cut off?)");
  for (int64_t t = 1400; t < 5000; t += 100) CHECK(!log.Observe(1, t - 100, t).has_value());
  std::optional<std::string> back = log.Observe(1, 0, 5000);
  REQUIRE(back.has_value());
  CHECK(*back == "ps task 0: worker 1 (/job:worker/task:1) returned: updating again after 4900 ms without an update");
  // Flapping every 200 ms for 10 s: at most one loss a second, each
  // followed by its return.
  int losses = 0, returns = 0;
  for (int64_t t = 5200; t < 15200; t += 200) {
    const bool silent = (t / 200) % 2 == 0;
    std::optional<std::string> line = log.Observe(1, silent ? 1500 : 0, t);
    if (line.has_value()) ++(line->find(" lost: ") != std::string::npos ? losses : returns);
  }
  CHECK(losses <= 10);
  CHECK(losses >= 2);
  CHECK(returns >= losses - 1);
  CHECK(returns <= losses);
  // A return soon after its loss (a chief restarted within the interval, the
  // run ending right after): logged at once, not left for a later look.
  internal::PeerSilenceLog quick("ps task 0", /*silence_ms=*/1000, /*min_line_interval_ms=*/1000);
  CHECK(!quick.Observe(0, 0, 0).has_value());
  REQUIRE(quick.Observe(0, 1100, 1100).has_value());
  std::optional<std::string> soon = quick.Observe(0, 0, 1300);
  REQUIRE(soon.has_value());
  CHECK(soon->find("the chief (/job:worker/task:0) returned") != std::string::npos);
  // The chief's name.
  internal::PeerSilenceLog w("/job:worker/task:1", 1000);
  CHECK(!w.Observe(0, 0, 0).has_value());
  std::optional<std::string> chief = w.Observe(0, 1001, 2000);
  REQUIRE(chief.has_value());
  CHECK(chief->find("/job:worker/task:1: the chief (/job:worker/task:0) lost") == 0);
}

}  // namespace
}  // namespace foreman
