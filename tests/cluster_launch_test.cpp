// The cluster as launchers describe it (foreman/cluster.hpp):
// ClusterFromTfConfig (TF's TF_CONFIG), ExpandSlurmHostList (Slurm's host
// lists, as `scontrol show hostnames` expands them), ClusterFromSlurm and
// ClusterFromEnvironment. Examples from TF's and Slurm's documentation are
// marked with their source; the values are ours where the docs give none.
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#include <doctest/doctest.h>

#include "foreman/cluster.hpp"
#include "support/test_util.hpp"

namespace foreman {
namespace {

#define CHECK_CONTAINS(haystack, needle)                                                   \
  do {                                                                                     \
    const std::string h_ = (haystack);                                                     \
    CHECK_MESSAGE(h_.find(needle) != std::string::npos, "'", h_, "' lacks '", needle, "'"); \
  } while (0)

// The INVALID_ARGUMENT message of `s`.
template <class T>
std::string Invalid(const StatusOr<T>& s) {
  CHECK_MESSAGE(absl::IsInvalidArgument(s.status()), s.status().ToString());
  return std::string(s.status().message());
}

using Hosts = std::vector<std::string>;

// ---- TF_CONFIG ------------------------------------------------------------

TEST_CASE("TF_CONFIG without a chief: worker 0 is the chief (TF's own example)") {
  // tf.contrib.distribute.run_standard_tensorflow_server (TF 1.15 API docs):
  // 3 workers, 2 ps tasks, this process is worker 1.
  auto launch = ClusterFromTfConfig(
      R"({"cluster": {"worker": ["host1:2222", "host2:2222", "host3:2222"], "ps": ["host4:2222", "host5:2222"]},
          "task": {"type": "worker", "index": 1}})");
  REQUIRE_MESSAGE(launch.ok(), launch.status().ToString());
  CHECK(launch->spec.jobs().at("worker") == Hosts{"host1:2222", "host2:2222", "host3:2222"});
  CHECK(launch->spec.jobs().at("ps") == Hosts{"host4:2222", "host5:2222"});
  CHECK(launch->task.job_name == "worker");
  CHECK(launch->task.task_index == 1);
  CHECK_FALSE(launch->task.is_chief());
  CHECK(launch->described_as == "TF_CONFIG task worker 1");
}

TEST_CASE("TF_CONFIG with a chief: the chief is worker 0, TF's worker i is worker i + 1") {
  // The shape Kubeflow's TFJob operator writes for a job with Chief,
  // Worker and PS replica specs (one chief, two workers, one ps).
  const std::string cluster =
      R"("cluster": {"chief": ["job-chief-0.ns.svc:2222"], "worker": ["job-worker-0.ns.svc:2222",
          "job-worker-1.ns.svc:2222"], "ps": ["job-ps-0.ns.svc:2222"]}, "environment": "cloud")";
  auto chief = ClusterFromTfConfig("{" + cluster + R"(, "task": {"type": "chief", "index": 0}})");
  REQUIRE_MESSAGE(chief.ok(), chief.status().ToString());
  CHECK(chief->spec.jobs().at("worker") ==
        Hosts{"job-chief-0.ns.svc:2222", "job-worker-0.ns.svc:2222", "job-worker-1.ns.svc:2222"});
  CHECK(chief->spec.jobs().size() == 2);  // ps and worker only
  CHECK(chief->task.is_chief());
  CHECK(chief->described_as == "TF_CONFIG task chief 0");
  for (int i = 0; i < 2; ++i) {
    auto worker = ClusterFromTfConfig("{" + cluster + R"(, "task": {"type": "worker", "index": )" +
                                      std::to_string(i) + "}}");
    REQUIRE_MESSAGE(worker.ok(), worker.status().ToString());
    CHECK(worker->task.job_name == "worker");
    CHECK(worker->task.task_index == i + 1);
    CHECK(worker->spec.task_address("worker", i + 1)->host == "job-worker-" + std::to_string(i) + ".ns.svc");
  }
  auto ps = ClusterFromTfConfig("{" + cluster + R"(, "task": {"type": "ps", "index": 0}})");
  REQUIRE_MESSAGE(ps.ok(), ps.status().ToString());
  CHECK(ps->task.job_name == "ps");
  CHECK(ps->task.task_index == 0);
}

TEST_CASE("TF_CONFIG: the task index defaults to 0 and an evaluator is left out of the spec, said by has_evaluator") {
  auto launch = ClusterFromTfConfig(
      R"({"cluster": {"chief": ["127.0.0.1:1"], "ps": ["127.0.0.1:2"], "evaluator": ["127.0.0.1:3"]},
          "task": {"type": "chief"}, "rpc_layer": "grpc"})");
  REQUIRE_MESSAGE(launch.ok(), launch.status().ToString());
  CHECK(launch->task.is_chief());
  CHECK(launch->spec.jobs().count("evaluator") == 0);
  CHECK(launch->spec.jobs().at("worker") == Hosts{"127.0.0.1:1"});
  CHECK(launch->has_evaluator);
  auto without = ClusterFromTfConfig(
      R"({"cluster": {"chief": ["127.0.0.1:1"], "ps": ["127.0.0.1:2"]}, "task": {"type": "chief"}})");
  REQUIRE_MESSAGE(without.ok(), without.status().ToString());
  CHECK_FALSE(without->has_evaluator);
}

TEST_CASE("TF_CONFIG task.type evaluator is the task evaluator 0, outside the training cluster's spec") {
  auto launch = ClusterFromTfConfig(
      R"({"cluster": {"chief": ["127.0.0.1:1"], "worker": ["127.0.0.1:4"], "ps": ["127.0.0.1:2"],
                      "evaluator": ["127.0.0.1:3"]},
          "task": {"type": "evaluator", "index": 0}})");
  REQUIRE_MESSAGE(launch.ok(), launch.status().ToString());
  CHECK(launch->task.job_name == "evaluator");
  CHECK(launch->task.task_index == 0);
  CHECK_FALSE(launch->task.is_chief());
  CHECK(launch->has_evaluator);
  CHECK(launch->spec.jobs().count("evaluator") == 0);
  CHECK(launch->spec.jobs().at("worker") == Hosts{"127.0.0.1:1", "127.0.0.1:4"});
  CHECK(launch->described_as == "TF_CONFIG task evaluator 0");
  // Its index is checked as any task's: one evaluator at most, index 0.
  auto second = ClusterFromTfConfig(
      R"({"cluster": {"chief": ["127.0.0.1:1"], "ps": ["127.0.0.1:2"], "evaluator": ["127.0.0.1:3"]},
          "task": {"type": "evaluator", "index": 1}})");
  CHECK(absl::IsInvalidArgument(second.status()));
  CHECK_CONTAINS(std::string(second.status().message()), "TF_CONFIG: task.index: 1 is out of range for cluster.evaluator");
}

TEST_CASE("TF_CONFIG errors name the field and its position") {
  struct Case {
    const char* tf_config;
    const char* message;
  };
  const Case cases[] = {
      {R"({"cluster": {"ps": ["h:1"], "worker": ["h:2", 5]}, "task": {"type": "worker", "index": 0}})",
       R"(TF_CONFIG: cluster.worker[1]: expected "host:port", found 5)"},
      {R"({"cluster": {"ps": ["h:1"], "worker": ["h:2", "h:99999"]}, "task": {"type": "worker"}})",
       "TF_CONFIG: cluster.worker[1] 'h:99999': port must be in [1, 65535]"},
      {R"({"cluster": {"ps": ["h:1"], "worker": ["h:2", "H:1"]}, "task": {"type": "worker"}})",
       "TF_CONFIG: cluster.worker[1] 'H:1': the same host:port as cluster.ps[0]"},
      {R"({"cluster": {"ps": ["h:1"], "worker": "h:2"}, "task": {"type": "worker"}})",
       R"(TF_CONFIG: cluster.worker: expected an array of "host:port" strings, found "h:2")"},
      {R"({"cluster": {"ps": ["h:1"], "worker": []}, "task": {"type": "worker"}})",
       "TF_CONFIG: cluster.worker: has no tasks"},
      {R"({"cluster": {"ps": ["h:1"], "chief": ["h:2", "h:3"]}, "task": {"type": "chief"}})",
       "TF_CONFIG: cluster.chief: has 2 tasks; TF allows at most one chief"},
      {R"({"cluster": {"ps": ["h:1"], "master": ["h:2"]}, "task": {"type": "master"}})",
       "TF_CONFIG: cluster.master: job 'master' is not one Foreman runs (chief, worker, ps, evaluator)"},
      // TFConfigClusterResolver's example (TF API docs) has no ps: Foreman needs one.
      {R"({"cluster": {"worker": ["localhost:12345", "localhost:23456"]}, "task": {"type": "worker", "index": 0}})",
       "TF_CONFIG: cluster.ps: missing"},
      {R"({"cluster": {"ps": ["h:1"]}, "task": {"type": "ps"}})",
       "TF_CONFIG: cluster: has neither a chief nor a worker"},
      {R"({"cluster": {"ps": ["h:1"], "worker": ["h:2"]}, "task": {"type": "worker", "index": 2}})",
       "TF_CONFIG: task.index: 2 is out of range for cluster.worker: it has 1 task, valid indices are 0..0"},
      {R"({"cluster": {"ps": ["h:1"], "worker": ["h:2"]}, "task": {"type": "worker", "index": -1}})",
       "TF_CONFIG: task.index: expected a whole number >= 0, found -1"},
      {R"({"cluster": {"ps": ["h:1"], "worker": ["h:2"]}, "task": {"type": "worker", "index": "0"}})",
       R"(TF_CONFIG: task.index: expected a whole number >= 0, found "0")"},
      {R"({"cluster": {"ps": ["h:1"], "worker": ["h:2"]}, "task": {"type": "chief", "index": 0}})",
       "TF_CONFIG: task.type: 'chief' has no job in cluster (no cluster.chief)"},
      {R"({"cluster": {"ps": ["h:1"], "worker": ["h:2"]}, "task": {"type": "boss"}})",
       "TF_CONFIG: task.type: 'boss' is not a task type Foreman runs"},
      {R"({"cluster": {"ps": ["h:1"], "worker": ["h:2"]}, "task": {"index": 0}})", "TF_CONFIG: task.type: missing"},
      {R"({"cluster": {"ps": ["h:1"], "worker": ["h:2"]}})", "TF_CONFIG: task: missing"},
      {R"({"task": {"type": "ps"}})", "TF_CONFIG: cluster: missing"},
      {R"({"cluster": [], "task": {}})", "TF_CONFIG: cluster: expected an object, found an array of 0 elements"},
      {R"(["cluster"])", "TF_CONFIG: the value: expected a JSON object, found an array of 1 element"},
      {R"({"cluster": {"ps": ["h:1"]}, )", "TF_CONFIG: not valid JSON at byte 30"},
      {"", "TF_CONFIG: not valid JSON at byte 1"},
  };
  for (const Case& c : cases) {
    const std::string tf_config = c.tf_config;
    CAPTURE(tf_config);
    CHECK_CONTAINS(Invalid(ClusterFromTfConfig(c.tf_config)), c.message);
  }
}

// ---- Slurm host lists -----------------------------------------------------

TEST_CASE("ExpandSlurmHostList expands as scontrol show hostnames does") {
  struct Case {
    const char* list;
    Hosts hosts;
  };
  const Case cases[] = {
      // Slurm's sbatch/srun man pages (OUTPUT ENVIRONMENT VARIABLES) show
      // node lists of this form; a real srun step printed
      // SLURM_JOB_NODELIST=gnode[10,20,25,37].
      {"gnode[10,20,25,37]", {"gnode10", "gnode20", "gnode25", "gnode37"}},
      {"tux[1-3]", {"tux1", "tux2", "tux3"}},
      {"node[01-03,07],gpu-a[1-2]", {"node01", "node02", "node03", "node07", "gpu-a1", "gpu-a2"}},
      {"n[08-11]", {"n08", "n09", "n10", "n11"}},    // the width of lo, kept past 9
      {"n[8-11]", {"n8", "n9", "n10", "n11"}},       // no padding without a leading zero
      {"n[098-101]", {"n098", "n099", "n100", "n101"}},
      {"rack[1-2]-node[1-2]", {"rack1-node1", "rack1-node2", "rack2-node1", "rack2-node2"}},
      {"a[1-2].example.com", {"a1.example.com", "a2.example.com"}},  // text after a group
      {"login1,compute[5]", {"login1", "compute5"}},
      {"single", {"single"}},
      {"x[3],x[3]", {"x3", "x3"}},  // duplicates kept, in order
  };
  for (const Case& c : cases) {
    const std::string list = c.list;
    CAPTURE(list);
    auto hosts = ExpandSlurmHostList(c.list);
    REQUIRE_MESSAGE(hosts.ok(), hosts.status().ToString());
    CHECK(*hosts == c.hosts);
  }
}

TEST_CASE("ExpandSlurmHostList errors name the variable and the 1-based position") {
  struct Case {
    const char* list;
    const char* message;
  };
  const Case cases[] = {
      {"node[01-03", "SLURM_JOB_NODELIST: position 5: unclosed '['"},
      {"a,node[1-2", "SLURM_JOB_NODELIST: position 7: unclosed '['"},
      {"node1]", "SLURM_JOB_NODELIST: position 6: ']' without a '['"},
      {"n[1-[2]]", "SLURM_JOB_NODELIST: position 5: '[' inside '[...]'"},
      {"a,,b", "SLURM_JOB_NODELIST: position 3: an empty host name"},
      {"a,", "SLURM_JOB_NODELIST: position 3: an empty host name"},
      {"n[]", "SLURM_JOB_NODELIST: position 3: an empty number or range"},
      {"n[1,]", "SLURM_JOB_NODELIST: position 5: an empty number or range"},
      {"n[3-1]", "SLURM_JOB_NODELIST: position 3: range '3-1' runs backwards"},
      {"n[a-b]", "SLURM_JOB_NODELIST: position 3: 'a-b' is not a number or a range"},
      {"n[1-2-3]", "SLURM_JOB_NODELIST: position 3: '1-2-3' is not a number"},
      {"n[0-99999]", "SLURM_JOB_NODELIST: position 3: range '0-99999' has more than 65536 hosts"},
      {"a[0-999]b[0-999]", "SLURM_JOB_NODELIST: position 1: expands to more than 65536 hosts"},
      {"", "SLURM_JOB_NODELIST: is empty"},
  };
  for (const Case& c : cases) {
    const std::string list = c.list;
    CAPTURE(list);
    CHECK_CONTAINS(Invalid(ExpandSlurmHostList(c.list)), c.message);
  }
  CHECK_CONTAINS(Invalid(ExpandSlurmHostList("x[", "SLURM_STEP_NODELIST")), "SLURM_STEP_NODELIST: position 2");
}

// ---- Slurm clusters -------------------------------------------------------

SlurmLaunch Step(const std::string& procid, const std::string& ntasks, const std::string& nodelist,
                 const std::string& tasks_per_node = "") {
  SlurmLaunch s;
  s.procid = procid;
  s.ntasks = ntasks;
  s.nodelist = nodelist;
  s.tasks_per_node = tasks_per_node;
  return s;
}

TEST_CASE("ClusterFromSlurm: ps ranks first, then the chief and the workers; port = base + rank") {
  // The srun step above: SLURM_NTASKS=4, SLURM_TASKS_PER_NODE=1(x4).
  for (int rank = 0; rank < 4; ++rank) {
    auto launch = ClusterFromSlurm(Step(std::to_string(rank), "4", "gnode[10,20,25,37]", "1(x4)"));
    REQUIRE_MESSAGE(launch.ok(), launch.status().ToString());
    CHECK(launch->spec.jobs().at("ps") == Hosts{"gnode10:2222"});
    CHECK(launch->spec.jobs().at("worker") == Hosts{"gnode20:2223", "gnode25:2224", "gnode37:2225"});
    CHECK(launch->task.job_name == (rank == 0 ? "ps" : "worker"));
    CHECK(launch->task.task_index == (rank == 0 ? 0 : rank - 1));
    CHECK(launch->task.is_chief() == (rank == 1));
    CHECK(launch->described_as == "SLURM_PROCID " + std::to_string(rank) + " of SLURM_NTASKS 4");
  }
}

TEST_CASE("ClusterFromSlurm: block distribution over SLURM_TASKS_PER_NODE, two ps tasks, another base port") {
  // sbatch's man page gives SLURM_TASKS_PER_NODE as e.g. "2(x3),1": two
  // tasks on each of the first three nodes, then one.
  SlurmLaunch s = Step("6", "7", "n[1-4]", "2(x3),1");
  s.base_port = 3000;
  s.num_ps_tasks = 2;
  auto launch = ClusterFromSlurm(s);
  REQUIRE_MESSAGE(launch.ok(), launch.status().ToString());
  CHECK(launch->spec.jobs().at("ps") == Hosts{"n1:3000", "n1:3001"});
  CHECK(launch->spec.jobs().at("worker") == Hosts{"n2:3002", "n2:3003", "n3:3004", "n3:3005", "n4:3006"});
  CHECK(launch->task.job_name == "worker");
  CHECK(launch->task.task_index == 4);
  // One node: every task on it, without SLURM_TASKS_PER_NODE.
  auto one = ClusterFromSlurm(Step("0", "3", "localhost"));
  REQUIRE_MESSAGE(one.ok(), one.status().ToString());
  CHECK(one->spec.jobs().at("worker") == Hosts{"localhost:2223", "localhost:2224"});
  // As many nodes as tasks: one each.
  auto each = ClusterFromSlurm(Step("1", "2", "a,b"));
  REQUIRE_MESSAGE(each.ok(), each.status().ToString());
  CHECK(each->spec.jobs().at("worker") == Hosts{"b:2223"});
}

TEST_CASE("ClusterFromSlurm errors name the variable") {
  struct Case {
    SlurmLaunch slurm;
    const char* message;
  };
  SlurmLaunch high_port = Step("0", "3", "h");
  high_port.base_port = 65534;
  SlurmLaunch no_ps = Step("0", "3", "h");
  no_ps.num_ps_tasks = 0;
  const Case cases[] = {
      {Step("", "3", "h"), "SLURM_PROCID: is not set"},
      {Step("0", "", "h"), "SLURM_NTASKS: is not set"},
      {Step("3", "3", "h"), "SLURM_PROCID: '3' is not a rank in [0, SLURM_NTASKS=3)"},
      {Step("x", "3", "h"), "SLURM_PROCID: 'x' is not a rank"},
      {Step("0", "many", "h"), "SLURM_NTASKS: 'many' is not a number of tasks"},
      {Step("0", "1", "h"), "SLURM_NTASKS: 1 tasks cannot hold 1 ps task(s) and a chief"},
      {Step("0", "3", ""), "SLURM_JOB_NODELIST: is not set"},
      {Step("0", "3", "n[1-2"), "SLURM_JOB_NODELIST: position 2: unclosed '['"},
      {Step("0", "3", "a,b"), "SLURM_TASKS_PER_NODE: is not set, and SLURM_NTASKS=3 tasks on 2 nodes"},
      {Step("0", "3", "a,b", "2(x2)"), "SLURM_TASKS_PER_NODE: '2(x2)' adds up to 4 tasks, but SLURM_NTASKS is 3"},
      {Step("0", "3", "a,b", "3"), "SLURM_TASKS_PER_NODE: '3' gives tasks for 1 nodes, but SLURM_JOB_NODELIST has 2"},
      {Step("0", "3", "a,b", "2,x"), "SLURM_TASKS_PER_NODE: position 3: 'x' is not N or N(xM)"},
      {Step("0", "3", "a,b", "2(3),1"), "SLURM_TASKS_PER_NODE: position 1: '2(3)' is not N or N(xM)"},
      {Step("0", "3", "bad_host"), "SLURM_JOB_NODELIST: host 'bad_host' (node 0)"},
      {high_port, "the Slurm base port 65534 + rank must be in [1, 65535]"},
      {no_ps, "the number of Slurm ps tasks must be >= 1, got 0"},
  };
  for (const Case& c : cases) {
    const std::string message = c.message;
    CAPTURE(message);
    CHECK_CONTAINS(Invalid(ClusterFromSlurm(c.slurm)), c.message);
  }
}

// ---- The environment ------------------------------------------------------

// Sets (or, for nullptr, unsets) the variables for one test case and
// restores them after.
class ScopedEnv {
 public:
  ScopedEnv(std::initializer_list<std::pair<const char*, const char*>> vars) {
    for (const auto& [name, value] : vars) {
      const char* old = std::getenv(name);
      saved_.push_back({name, old == nullptr ? std::nullopt : std::optional<std::string>(old)});
      if (value == nullptr) {
        unsetenv(name);
      } else {
        setenv(name, value, 1);
      }
    }
  }
  ~ScopedEnv() {
    for (const auto& [name, value] : saved_) {
      if (value.has_value()) {
        setenv(name.c_str(), value->c_str(), 1);
      } else {
        unsetenv(name.c_str());
      }
    }
  }

 private:
  std::vector<std::pair<std::string, std::optional<std::string>>> saved_;
};

constexpr const char* kSlurmVariables[] = {"SLURM_PROCID", "SLURM_NTASKS", "SLURM_JOB_NODELIST",
                                           "SLURM_STEP_NODELIST", "SLURM_TASKS_PER_NODE",
                                           "SLURM_STEP_TASKS_PER_NODE"};

TEST_CASE("ClusterFromEnvironment: TF_CONFIG first, then an srun step of more than one task, else none") {
  ScopedEnv clear({{"TF_CONFIG", nullptr}, {kSlurmVariables[0], nullptr}, {kSlurmVariables[1], nullptr},
                   {kSlurmVariables[2], nullptr}, {kSlurmVariables[3], nullptr}, {kSlurmVariables[4], nullptr},
                   {kSlurmVariables[5], nullptr}});
  const SlurmLaunch rule;
  {
    auto none = ClusterFromEnvironment(ClusterEnvironment::kAuto, rule);
    REQUIRE_OK(none);
    CHECK_FALSE(none->has_value());
    auto must = ClusterFromEnvironment(ClusterEnvironment::kTfConfig, rule);
    CHECK(absl::IsFailedPrecondition(must.status()));
    auto slurm = ClusterFromEnvironment(ClusterEnvironment::kSlurm, rule);
    CHECK(absl::IsFailedPrecondition(slurm.status()));
    CHECK_CONTAINS(std::string(slurm.status().message()),
                   "SLURM_PROCID, SLURM_NTASKS, SLURM_JOB_NODELIST are not set");
  }
  {
    ScopedEnv slurm({{"SLURM_PROCID", "1"}, {"SLURM_NTASKS", "2"}, {"SLURM_JOB_NODELIST", "n[1-2]"},
                     {"SLURM_STEP_NODELIST", "m[1-2]"}});
    auto launch = ClusterFromEnvironment(ClusterEnvironment::kAuto, rule);
    REQUIRE_MESSAGE(launch.ok(), launch.status().ToString());
    REQUIRE(launch->has_value());
    // srun's step node list wins over the job's allocation.
    CHECK((*launch)->spec.jobs().at("worker") == Hosts{"m2:2223"});
    CHECK((*launch)->task.is_chief());
    {
      ScopedEnv tf({{"TF_CONFIG", R"({"cluster": {"ps": ["p:1"], "chief": ["c:1"]}, "task": {"type": "ps"}})"}});
      auto tf_launch = ClusterFromEnvironment(ClusterEnvironment::kAuto, rule);
      REQUIRE_MESSAGE(tf_launch.ok(), tf_launch.status().ToString());
      REQUIRE(tf_launch->has_value());
      CHECK((*tf_launch)->task.job_name == "ps");
      auto forced = ClusterFromEnvironment(ClusterEnvironment::kSlurm, rule);
      REQUIRE_MESSAGE(forced.ok(), forced.status().ToString());
      CHECK((*forced)->task.is_chief());
      auto off = ClusterFromEnvironment(ClusterEnvironment::kNone, rule);
      REQUIRE_OK(off);
      CHECK_FALSE(off->has_value());
    }
    {
      ScopedEnv single({{"SLURM_NTASKS", "1"}, {"SLURM_PROCID", "0"}});
      auto launch1 = ClusterFromEnvironment(ClusterEnvironment::kAuto, rule);
      REQUIRE_OK(launch1);
      CHECK_FALSE(launch1->has_value());  // a one-task step is a single-process run
    }
    {
      // A batch script outside srun: SLURM_PROCID=0 and the allocation's
      // SLURM_NTASKS, but no step node list. Not a cluster under kAuto;
      // kSlurm reads SLURM_JOB_NODELIST.
      ScopedEnv batch({{"SLURM_STEP_NODELIST", nullptr}, {"SLURM_PROCID", "0"}});
      auto launch0 = ClusterFromEnvironment(ClusterEnvironment::kAuto, rule);
      REQUIRE_OK(launch0);
      CHECK_FALSE(launch0->has_value());
      auto forced = ClusterFromEnvironment(ClusterEnvironment::kSlurm, rule);
      REQUIRE_MESSAGE(forced.ok(), forced.status().ToString());
      REQUIRE(forced->has_value());
      CHECK((*forced)->spec.jobs().at("ps") == Hosts{"n1:2222"});
      CHECK((*forced)->task.job_name == "ps");
    }
    {
      ScopedEnv bad({{"SLURM_STEP_NODELIST", "m[1-2"}});
      CHECK_CONTAINS(Invalid(ClusterFromEnvironment(ClusterEnvironment::kAuto, rule)),
                     "SLURM_STEP_NODELIST: position 2: unclosed '['");
    }
  }
  {
    ScopedEnv bad({{"TF_CONFIG", "{"}});
    CHECK_CONTAINS(Invalid(ClusterFromEnvironment(ClusterEnvironment::kAuto, rule)), "TF_CONFIG: not valid JSON");
  }
}

}  // namespace
}  // namespace foreman
