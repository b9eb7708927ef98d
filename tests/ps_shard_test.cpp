// The parameter-server shard actor (actors/ps_shard.hpp): init, read,
// asynchronous applies bitwise against nn::internal::ApplyDense, global_step
// and beta powers only where held, atomic refusal of bad gradients, the
// freeze / snapshot / thaw protocol, its timeout and its freezer's end, and the protocol across
// 127.0.0.1 (cluster_net.hpp). Every wait is bounded.
#include "actors/ps_shard.hpp"

#include <doctest/doctest.h>

#include <atomic>
#include <caf/all.hpp>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#define EIGEN_USE_THREADS
#include <unsupported/Eigen/CXX11/Tensor>

#include "absl/strings/match.h"
#include "actors/actor_system.hpp"
#include "actors/atoms.hpp"
#include "actors/status_error.hpp"
#include "actors/cluster_net.hpp"
#include "actors/messages.hpp"
#include "foreman/mutex.hpp"
#include "foreman/nn.hpp"
#include "nn/optimizer.hpp"
#include "support/test_util.hpp"

namespace foreman {
namespace {

using internal::ApplyGradientsMessage;
using internal::PsShardOptions;
using internal::PsShardStatsMessage;
using internal::TensorMessage;
using internal::VariablesMessage;
using nn::OptimizerKind;
using nn::OptimizerOptions;

constexpr auto kReply = std::chrono::seconds(10);

// An actor system (config first: it must outlive the system); the shards it
// spawned are stopped before it ends.
struct Node {
  caf::actor_system_config cfg;
  std::unique_ptr<caf::actor_system> sys;
  std::vector<caf::actor> actors;
  explicit Node(const internal::NetConfig* net = nullptr) {
    cfg.set("scheduler.max-threads", size_t{2});
    if (net != nullptr) {
      internal::ConfigureClusterNetwork(cfg, *net);
    } else {
      internal::ConfigureActorSystemConfig(cfg);
    }
    sys = std::make_unique<caf::actor_system>(cfg);
  }
  ~Node() {
    for (auto& a : actors) caf::anon_send_exit(a, caf::exit_reason::user_shutdown);
    actors.clear();
    sys.reset();
  }
  caf::actor Shard(int task_index, OptimizerOptions optimizer) {
    StatusOr<caf::actor> a = internal::SpawnPsShard(*sys, PsShardOptions{task_index, optimizer});
    REQUIRE_MESSAGE(a.ok(), a.status().ToString());
    actors.push_back(*a);
    return *a;
  }
};

// The answer of type T to `xs` from `actor`, or the error it answered.
// AskFrom: asked by `self` (a freeze lasts while its asker lives).
template <class T, class... Ts>
StatusOr<T> AskFrom(caf::scoped_actor& self, const caf::actor& actor, Ts&&... xs) {
  StatusOr<T> out = absl::UnknownError("no reply");
  self->request(actor, kReply, std::forward<Ts>(xs)...)
      .receive([&](T& v) { out = std::move(v); },
               [&](caf::error& e) { out = internal::ErrorToStatus(e, "ps shard"); });
  return out;
}
template <class T, class... Ts>
StatusOr<T> Ask(caf::actor_system& sys, const caf::actor& actor, Ts&&... xs) {
  caf::scoped_actor self{sys};
  return AskFrom<T>(self, actor, std::forward<Ts>(xs)...);
}

Status Init(caf::actor_system& sys, const caf::actor& shard, const VariablesMessage& vars) {
  StatusOr<caf::ok_atom> r = Ask<caf::ok_atom>(sys, shard, internal::ps_init_atom::value, vars);
  return r.status();
}
StatusOr<VariablesMessage> Read(caf::actor_system& sys, const caf::actor& shard, std::vector<std::string> names) {
  return Ask<VariablesMessage>(sys, shard, internal::ps_read_atom::value, std::move(names));
}
StatusOr<VariablesMessage> Snapshot(caf::actor_system& sys, const caf::actor& shard) {
  return Ask<VariablesMessage>(sys, shard, internal::ps_snap_atom::value);
}
StatusOr<int64_t> Apply(caf::actor_system& sys, const caf::actor& shard, const ApplyGradientsMessage& update) {
  return Ask<int64_t>(sys, shard, internal::ps_apply_atom::value, update);
}
PsShardStatsMessage Stats(caf::actor_system& sys, const caf::actor& shard) {
  StatusOr<PsShardStatsMessage> s = Ask<PsShardStatsMessage>(sys, shard, internal::ps_stats_atom::value);
  REQUIRE_MESSAGE(s.ok(), s.status().ToString());
  return *s;
}

TensorMessage Floats(const std::string& name, std::vector<int64_t> shape, const std::vector<float>& values) {
  StatusOr<Tensor> t = Tensor::FromVector(values, TensorShape(std::move(shape)));
  REQUIRE_OK(t);
  StatusOr<TensorMessage> m = internal::ToMessage(name, *t);
  REQUIRE_OK(m);
  return *m;
}
TensorMessage GlobalStep(int64_t value) {
  StatusOr<TensorMessage> m = internal::ToMessage("global_step", Tensor::Scalar<int64_t>(value));
  REQUIRE_OK(m);
  return *m;
}
std::vector<float> Random(int64_t n, std::mt19937& rng, float lo = -1, float hi = 1) {
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(static_cast<std::size_t>(n));
  for (float& x : v) x = d(rng);
  return v;
}
std::vector<float> ValuesOf(const TensorMessage& m) {
  std::vector<float> v(m.bytes.size() / sizeof(float));
  std::memcpy(v.data(), m.bytes.data(), m.bytes.size());
  return v;
}
const TensorMessage* Find(const VariablesMessage& vars, const std::string& name) {
  for (const TensorMessage& t : vars.tensors) {
    if (t.name == name) return &t;
  }
  return nullptr;
}
ApplyGradientsMessage Update(std::vector<TensorMessage> grads, float lr, float adam_step_size = 0) {
  ApplyGradientsMessage u;
  u.gradients.tensors = std::move(grads);
  u.learning_rate = lr;
  u.adam_step_size = adam_step_size;
  return u;
}
OptimizerOptions Sgd() {
  OptimizerOptions o;
  o.kind = OptimizerKind::kSgd;
  return o;
}

TEST_CASE("a shard refuses reads, snapshots and applies before its init: FAILED_PRECONDITION") {
  Node node;
  caf::actor shard = node.Shard(3, Sgd());
  StatusOr<VariablesMessage> r = Read(*node.sys, shard, {"w"});
  REQUIRE(r.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK(r.status().message() == "ps task 3 is not initialized");
  CHECK(Snapshot(*node.sys, shard).status().code() == absl::StatusCode::kFailedPrecondition);
  StatusOr<int64_t> a = Apply(*node.sys, shard, Update({Floats("w", {1}, {1})}, 0.1f));
  CHECK(a.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK(a.status().message() == "ps task 3 is not initialized");
  PsShardStatsMessage s = Stats(*node.sys, shard);
  CHECK(!s.initialized);
  CHECK(s.task_index == 3);
  CHECK(s.refused_updates == 1);
  CHECK(s.applied_updates == 0);
}

// Issue 31 point 3: a shard serves one cluster job; another job's init,
// apply and end of training are FAILED_PRECONDITION naming both ids, and
// change nothing.
TEST_CASE("a shard of cluster job A refuses job B's init, apply and end of training, unchanged") {
  Node node;
  PsShardOptions options{0, Sgd()};
  options.job_id = "job-a";
  StatusOr<caf::actor> a = internal::SpawnPsShard(*node.sys, options);
  REQUIRE_MESSAGE(a.ok(), a.status().ToString());
  node.actors.push_back(*a);
  const caf::actor shard = *a;
  VariablesMessage vars;
  vars.tensors.push_back(GlobalStep(5));
  vars.tensors.push_back(Floats("w", {2}, {1, 2}));
  vars.job_id = "job-a";
  REQUIRE_OK(Init(*node.sys, shard, vars));
  const std::string both = "ps task 0 serves cluster job 'job-a' and refused ";

  VariablesMessage other = vars;
  other.job_id = "job-b";
  other.tensors[0] = GlobalStep(0);
  other.tensors[1] = Floats("w", {2}, {9, 9});
  Status init = Init(*node.sys, shard, other);
  REQUIRE(init.code() == absl::StatusCode::kFailedPrecondition);
  CHECK_MESSAGE(absl::StrContains(init.message(), both + "the init (or restore) of cluster job 'job-b'"),
                init.ToString());

  ApplyGradientsMessage u = Update({Floats("w", {2}, {1, 1})}, 0.5f);
  u.job_id = "job-b";
  StatusOr<int64_t> applied = Apply(*node.sys, shard, u);
  REQUIRE(applied.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK_MESSAGE(absl::StrContains(applied.status().message(), both + "an apply of cluster job 'job-b'"),
                applied.status().ToString());
  // Without a job id (an older sender): refused too.
  u.job_id.clear();
  CHECK(Apply(*node.sys, shard, u).status().code() == absl::StatusCode::kFailedPrecondition);

  StatusOr<int64_t> ended =
      Ask<int64_t>(*node.sys, shard, internal::ps_end_atom::value, int64_t{-1}, std::string("job-b"));
  REQUIRE(ended.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK(absl::StrContains(ended.status().message(), both + "the end of training of cluster job 'job-b'"));
  CHECK(Ask<int64_t>(*node.sys, shard, internal::ps_end_atom::value, int64_t{-1}).status().code() ==
        absl::StatusCode::kFailedPrecondition);

  // Untouched: job A's values and step, no apply counted per worker, and
  // job A's own apply still lands (training did not end).
  StatusOr<VariablesMessage> r = Read(*node.sys, shard, {"w"});
  REQUIRE_OK(r);
  CHECK(r->global_step == 5);
  CHECK(ValuesOf(r->tensors[0]) == std::vector<float>{1, 2});
  PsShardStatsMessage s = Stats(*node.sys, shard);
  CHECK(s.job_id == "job-a");
  CHECK(s.refused_updates == 2);
  CHECK(s.worker_last_apply_ms.empty());
  CHECK(!s.ended);
  u.job_id = "job-a";
  StatusOr<int64_t> ok = Apply(*node.sys, shard, u);
  REQUIRE_MESSAGE(ok.ok(), ok.status().ToString());
  CHECK(*ok == 6);
}

TEST_CASE("issue 31 point 3: an init op is refused once the shard was updated since its init, or restored") {
  Node node;
  StatusOr<caf::actor> a = internal::SpawnPsShard(*node.sys, PsShardOptions{0, Sgd()});
  REQUIRE_MESSAGE(a.ok(), a.status().ToString());
  node.actors.push_back(*a);
  const caf::actor shard = *a;
  VariablesMessage vars;
  vars.tensors.push_back(GlobalStep(0));
  vars.tensors.push_back(Floats("w", {2}, {1, 2}));
  REQUIRE_OK(Init(*node.sys, shard, vars));
  CHECK_FALSE(Stats(*node.sys, shard).trained);
  REQUIRE_OK(Init(*node.sys, shard, vars));  // nothing trained yet: nothing to lose
  REQUIRE_OK(Apply(*node.sys, shard, Update({Floats("w", {2}, {1, 1})}, 0.5f)));
  CHECK(Stats(*node.sys, shard).trained);
  Status again = Init(*node.sys, shard, vars);
  CHECK(again.code() == absl::StatusCode::kFailedPrecondition);
  CHECK_MESSAGE(absl::StrContains(again.message(), "(global_step 1) and refused an init op"), again.ToString());
  StatusOr<VariablesMessage> w = Read(*node.sys, shard, {"w"});
  REQUIRE_OK(w);
  CHECK(w->global_step == 1);
  CHECK(w->tensors[0].bytes == Floats("w", {2}, {0.5f, 1.5f}).bytes);  // the update kept
  // A restore is taken, and counts as training.
  VariablesMessage restore = vars;
  restore.restore = true;
  REQUIRE_OK(Init(*node.sys, shard, restore));
  CHECK(Stats(*node.sys, shard).trained);
  CHECK(Init(*node.sys, shard, vars).code() == absl::StatusCode::kFailedPrecondition);
}

TEST_CASE("SpawnPsShard refuses a negative task index and a bad optimizer") {
  Node node;
  CHECK(internal::SpawnPsShard(*node.sys, PsShardOptions{-1, Sgd()}).status().code() ==
        absl::StatusCode::kInvalidArgument);
  OptimizerOptions adam;
  adam.beta1 = 1.5f;
  StatusOr<caf::actor> a = internal::SpawnPsShard(*node.sys, PsShardOptions{0, adam});
  REQUIRE(a.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(absl::StrContains(a.status().message(), "beta1"));
}

TEST_CASE("init then read returns the values bit-exactly; unknown names are NOT_FOUND; a bad init changes nothing") {
  Node node;
  caf::actor shard = node.Shard(0, Sgd());
  std::mt19937 rng(7);
  VariablesMessage vars;
  vars.tensors.push_back(GlobalStep(41));
  std::vector<float> w = Random(12, rng);
  uint32_t nan_bits = 0x7fc01234;  // a NaN with a payload: bytes travel untouched
  std::memcpy(&w[5], &nan_bits, sizeof nan_bits);
  w[6] = -0.0f;
  vars.tensors.push_back(Floats("dense/kernel", {3, 4}, w));
  vars.tensors.push_back(Floats("dense/bias", {4}, Random(4, rng)));
  REQUIRE_OK(Init(*node.sys, shard, vars));
  // An init op's values no update followed may be replaced by an init op
  // (the chief's recovery retrying its half-done first init).
  REQUIRE_OK(Init(*node.sys, shard, vars));

  StatusOr<VariablesMessage> r = Read(*node.sys, shard, {"dense/bias", "dense/kernel"});
  REQUIRE_MESSAGE(r.ok(), r.status().ToString());
  CHECK(r->global_step == 41);
  REQUIRE(r->tensors.size() == 2);
  CHECK(r->tensors[0].name == "dense/bias");
  CHECK(r->tensors[0].bytes == vars.tensors[2].bytes);
  CHECK(r->tensors[1].bytes == vars.tensors[1].bytes);
  CHECK(r->tensors[1].shape == std::vector<int64_t>{3, 4});
  CHECK(r->tensors[1].dtype == static_cast<int32_t>(DataType::kFloat));

  StatusOr<VariablesMessage> missing = Read(*node.sys, shard, {"dense/bias", "dense_1/kernel"});
  REQUIRE(missing.status().code() == absl::StatusCode::kNotFound);
  CHECK(absl::StrContains(missing.status().message(), "'dense_1/kernel'"));

  // Bad restores: each refused, naming the tensor, the old values kept.
  VariablesMessage dup;
  dup.restore = true;
  dup.tensors = {Floats("a", {1}, {1}), Floats("a", {1}, {2})};
  Status s = Init(*node.sys, shard, dup);
  CHECK(s.code() == absl::StatusCode::kInvalidArgument);
  CHECK(absl::StrContains(s.message(), "'a' given twice"));
  VariablesMessage float_step;
  float_step.restore = true;
  float_step.tensors = {Floats("global_step", {}, {1})};
  s = Init(*node.sys, shard, float_step);
  CHECK(s.code() == absl::StatusCode::kInvalidArgument);
  CHECK(absl::StrContains(s.message(), "global_step must be an int64 scalar"));
  VariablesMessage truncated;
  truncated.restore = true;
  truncated.tensors = {Floats("b", {2}, {1, 2})};
  truncated.tensors[0].bytes.pop_back();
  s = Init(*node.sys, shard, truncated);
  CHECK(s.code() == absl::StatusCode::kInvalidArgument);
  CHECK(absl::StrContains(s.message(), "'b'"));
  VariablesMessage one_power;
  one_power.restore = true;
  one_power.tensors = {Floats("beta1_power", {}, {0.9f})};
  s = Init(*node.sys, shard, one_power);
  CHECK(s.code() == absl::StatusCode::kInvalidArgument);
  CHECK(absl::StrContains(s.message(), "beta1_power without beta2_power"));

  StatusOr<VariablesMessage> snap = Snapshot(*node.sys, shard);
  REQUIRE_OK(snap);
  CHECK(snap->global_step == 41);
  REQUIRE(snap->tensors.size() == 3);  // sorted by name
  CHECK(snap->tensors[0].name == "dense/bias");
  CHECK(snap->tensors[1].bytes == vars.tensors[1].bytes);
  CHECK(snap->tensors[2].name == "global_step");

  // Once it holds training (restored, or updated since its init op) an
  // init op is refused (issue 31 point 3), naming the shard's global_step,
  // nothing changed.
  VariablesMessage restored_41 = vars;
  restored_41.restore = true;
  REQUIRE_OK(Init(*node.sys, shard, restored_41));
  VariablesMessage init_again;
  init_again.tensors = {Floats("other", {2}, {1, 2})};
  s = Init(*node.sys, shard, init_again);
  CHECK(s.code() == absl::StatusCode::kFailedPrecondition);
  CHECK_MESSAGE(absl::StrContains(s.message(), "ps task 0 already holds the variables of cluster job"), s.ToString());
  CHECK_MESSAGE(absl::StrContains(s.message(), "(global_step 41) and refused an init op"), s.ToString());
  snap = Snapshot(*node.sys, shard);
  REQUIRE_OK(snap);
  CHECK(snap->global_step == 41);
  CHECK(snap->tensors.size() == 3);

  // A restore replaces the variables wholesale.
  VariablesMessage restore;
  restore.restore = true;
  restore.tensors = {Floats("other", {2}, {1, 2})};
  REQUIRE_OK(Init(*node.sys, shard, restore));
  snap = Snapshot(*node.sys, shard);
  REQUIRE_OK(snap);
  CHECK(snap->global_step == -1);
  REQUIRE(snap->tensors.size() == 1);
  CHECK(snap->tensors[0].name == "other");
  // A shard without global_step (not the ps task of global_step) refuses an
  // init op too, without printing a global_step it does not hold.
  s = Init(*node.sys, shard, init_again);
  CHECK(s.code() == absl::StatusCode::kFailedPrecondition);
  CHECK_MESSAGE(absl::StrContains(s.message(), "' and refused an init op"), s.ToString());
  CHECK_MESSAGE(!absl::StrContains(s.message(), "global_step"), s.ToString());
}

// The shard's variables: global_step, w [3, 5], b [5] and their slots (and
// the beta powers for Adam), random; returns the message and fills `local`.
VariablesMessage ShardVariables(OptimizerKind kind, std::mt19937& rng, std::map<std::string, std::vector<float>>* local,
                                const OptimizerOptions& opt) {
  VariablesMessage vars;
  vars.tensors.push_back(GlobalStep(0));
  auto add = [&](const std::string& name, std::vector<int64_t> shape, std::vector<float> v) {
    (*local)[name] = v;
    vars.tensors.push_back(Floats(name, std::move(shape), v));
  };
  for (auto [name, shape] : {std::pair<std::string, std::vector<int64_t>>{"w", {3, 5}}, {"b", {5}}}) {
    const int64_t n = name == "w" ? 15 : 5;
    add(name, shape, Random(n, rng));
    for (const std::string& suffix : nn::internal::SlotSuffixes(kind)) {
      // Adam's v must be >= 0; the slots start as after some updates.
      add(name + "/" + suffix, shape, Random(n, rng, suffix == "Adam_1" ? 0.0f : -0.5f, 0.5f));
    }
  }
  if (kind == OptimizerKind::kAdam) {
    add(nn::internal::kBeta1PowerName, {}, {opt.beta1});
    add(nn::internal::kBeta2PowerName, {}, {opt.beta2});
  }
  return vars;
}

TEST_CASE("init refuses the slots or beta powers of another optimizer than the shard's, naming it (every task "
          "needs the same --optimizer)") {
  Node node;
  OptimizerOptions adam;
  adam.kind = nn::OptimizerKind::kAdam;
  OptimizerOptions momentum;
  momentum.kind = nn::OptimizerKind::kMomentum;
  caf::actor sgd_shard = node.Shard(0, Sgd());
  caf::actor momentum_shard = node.Shard(1, momentum);
  caf::actor adam_shard = node.Shard(2, adam);
  VariablesMessage adams;  // what an Adam chief writes
  adams.tensors = {Floats("w", {2}, {1, 2}), Floats("w/Adam", {2}, {0, 0}), Floats("w/Adam_1", {2}, {0, 0}),
                   Floats("beta1_power", {}, {0.9f}), Floats("beta2_power", {}, {0.999f})};
  Status s = Init(*node.sys, sgd_shard, adams);
  CHECK(s.code() == absl::StatusCode::kInvalidArgument);
  CHECK_MESSAGE(absl::StrContains(s.message(), "ps task 0: the chief's variables include 'beta1_power', which the "
                                               "sgd optimizer this ps task runs does not have: give every task of "
                                               "the cluster the same --optimizer"),
                s.message());
  s = Init(*node.sys, momentum_shard, adams);
  CHECK(s.code() == absl::StatusCode::kInvalidArgument);
  CHECK(absl::StrContains(s.message(), "which the momentum optimizer this ps task runs does not have"));
  CHECK_OK(Init(*node.sys, adam_shard, adams));
  // Nothing changed on a refused init: the shard is still not initialized.
  CHECK(Read(*node.sys, sgd_shard, {"w"}).status().code() == absl::StatusCode::kFailedPrecondition);
  // A variable that merely ends like a slot, with no primary, is not one.
  VariablesMessage plain;
  plain.tensors = {Floats("layer/Momentum", {1}, {3})};
  CHECK_OK(Init(*node.sys, sgd_shard, plain));
}

TEST_CASE("applies give bitwise the values of nn::internal::ApplyDense on a local copy (SGD, Momentum, Adam)") {
  Eigen::ThreadPool pool(2);
  Eigen::ThreadPoolDevice device(&pool, 2);
  struct Case {
    const char* name;
    OptimizerKind kind;
    bool nesterov;
  };
  for (const Case c : {Case{"sgd", OptimizerKind::kSgd, false}, Case{"momentum", OptimizerKind::kMomentum, false},
                       Case{"nesterov", OptimizerKind::kMomentum, true}, Case{"adam", OptimizerKind::kAdam, false}}) {
    CAPTURE(std::string(c.name));
    Node node;
    OptimizerOptions opt;
    opt.kind = c.kind;
    opt.use_nesterov = c.nesterov;
    opt.momentum = 0.8f;
    caf::actor shard = node.Shard(0, opt);
    std::mt19937 rng(11);
    std::map<std::string, std::vector<float>> local;
    REQUIRE_OK(Init(*node.sys, shard, ShardVariables(c.kind, rng, &local, opt)));
    const std::vector<std::string> suffixes = nn::internal::SlotSuffixes(c.kind);
    const float lr = 0.05f;
    for (int step = 1; step <= 3; ++step) {
      float step_size = 0;
      if (c.kind == OptimizerKind::kAdam) {
        step_size = nn::internal::AdamStepSize(lr, local["beta1_power"][0], local["beta2_power"][0]);
      }
      std::vector<TensorMessage> grads;
      for (const std::string name : {"w", "b"}) {
        std::vector<float>& var = local[name];
        std::vector<float> g = Random(static_cast<int64_t>(var.size()), rng);
        grads.push_back(Floats(name, name == std::string("w") ? std::vector<int64_t>{3, 5} : std::vector<int64_t>{5},
                               g));
        float* s0 = suffixes.size() > 0 ? local[name + "/" + suffixes[0]].data() : nullptr;
        float* s1 = suffixes.size() > 1 ? local[name + "/" + suffixes[1]].data() : nullptr;
        nn::internal::ApplyDense(opt, c.kind == OptimizerKind::kAdam ? step_size : lr, var.data(), g.data(), s0, s1,
                                 static_cast<int64_t>(var.size()), device);
      }
      if (c.kind == OptimizerKind::kAdam) {
        local["beta1_power"][0] = local["beta1_power"][0] * opt.beta1;
        local["beta2_power"][0] = local["beta2_power"][0] * opt.beta2;
      }
      StatusOr<int64_t> gs = Apply(*node.sys, shard, Update(std::move(grads), lr, step_size));
      REQUIRE_MESSAGE(gs.ok(), gs.status().ToString());
      CHECK(*gs == step);
    }
    StatusOr<VariablesMessage> snap = Snapshot(*node.sys, shard);
    REQUIRE_OK(snap);
    CHECK(snap->global_step == 3);
    CHECK(snap->tensors.size() == local.size() + 1);
    for (const auto& [name, values] : local) {
      CAPTURE(name);
      const TensorMessage* t = Find(*snap, name);
      REQUIRE(t != nullptr);
      REQUIRE(t->bytes.size() == values.size() * sizeof(float));
      CHECK(std::memcmp(t->bytes.data(), values.data(), t->bytes.size()) == 0);
    }
    PsShardStatsMessage s = Stats(*node.sys, shard);
    CHECK(s.applied_updates == 3);
    CHECK(s.global_step == 3);
  }
}

TEST_CASE("global_step and the beta powers change once per apply, only on the shard that holds them") {
  Node node;
  OptimizerOptions adam;
  adam.kind = OptimizerKind::kAdam;
  caf::actor ps0 = node.Shard(0, adam);
  caf::actor ps1 = node.Shard(1, adam);
  VariablesMessage v0;
  v0.tensors = {GlobalStep(10), Floats("w0", {2}, {1, 2}), Floats("w0/Adam", {2}, {0, 0}),
                Floats("w0/Adam_1", {2}, {0, 0}), Floats("beta1_power", {}, {0.9f}),
                Floats("beta2_power", {}, {0.999f})};
  VariablesMessage v1;
  v1.tensors = {Floats("w1", {2}, {3, 4}), Floats("w1/Adam", {2}, {0, 0}), Floats("w1/Adam_1", {2}, {0, 0})};
  REQUIRE_OK(Init(*node.sys, ps0, v0));
  REQUIRE_OK(Init(*node.sys, ps1, v1));
  float b1 = 0.9f, b2 = 0.999f;
  for (int i = 1; i <= 3; ++i) {
    const float step_size = nn::internal::AdamStepSize(0.01f, b1, b2);
    StatusOr<int64_t> g0 = Apply(*node.sys, ps0, Update({Floats("w0", {2}, {0.5f, -0.5f})}, 0.01f, step_size));
    StatusOr<int64_t> g1 = Apply(*node.sys, ps1, Update({Floats("w1", {2}, {0.5f, -0.5f})}, 0.01f, step_size));
    REQUIRE_OK(g0);
    REQUIRE_OK(g1);
    CHECK(*g0 == 10 + i);
    CHECK(*g1 == -1);
    b1 = b1 * 0.9f;
    b2 = b2 * 0.999f;
  }
  // A worker with no gradient for ps 0 still steps it.
  StatusOr<int64_t> g0 = Apply(*node.sys, ps0, Update({}, 0.01f, 0.01f));
  REQUIRE_OK(g0);
  CHECK(*g0 == 14);
  b1 = b1 * 0.9f;
  b2 = b2 * 0.999f;

  StatusOr<VariablesMessage> r0 = Read(*node.sys, ps0, {"beta1_power", "beta2_power"});
  REQUIRE_OK(r0);
  CHECK(r0->global_step == 14);
  CHECK(ValuesOf(r0->tensors[0])[0] == b1);  // bitwise: the same float products
  CHECK(ValuesOf(r0->tensors[1])[0] == b2);
  StatusOr<VariablesMessage> r1 = Read(*node.sys, ps1, {"w1"});
  REQUIRE_OK(r1);
  CHECK(r1->global_step == -1);
  CHECK(Read(*node.sys, ps1, {"beta1_power"}).status().code() == absl::StatusCode::kNotFound);
  CHECK(Stats(*node.sys, ps0).applied_updates == 4);
  CHECK(Stats(*node.sys, ps1).applied_updates == 3);
  CHECK(Stats(*node.sys, ps1).global_step == -1);
}

TEST_CASE("applies are counted per worker (gradients.worker), with the ms since each worker's last apply") {
  Node node;
  caf::actor ps0 = node.Shard(0, Sgd());
  VariablesMessage v0;
  v0.tensors = {GlobalStep(0), Floats("w", {2}, {1, 2})};
  REQUIRE_OK(Init(*node.sys, ps0, v0));
  CHECK(Stats(*node.sys, ps0).worker_applies.empty());  // nothing heard yet
  CHECK(Stats(*node.sys, ps0).worker_last_apply_ms.empty());
  auto from = [](int32_t worker, std::vector<float> g) {
    const int64_t n = static_cast<int64_t>(g.size());
    ApplyGradientsMessage u = Update({Floats("w", {n}, std::move(g))}, 0.1f);
    u.gradients.worker = worker;
    return u;
  };
  REQUIRE_OK(Apply(*node.sys, ps0, from(0, {0.5f, 0.5f})));
  REQUIRE_OK(Apply(*node.sys, ps0, from(3, {0.5f, 0.5f})));
  REQUIRE_OK(Apply(*node.sys, ps0, from(0, {0.5f, 0.5f})));
  // Refused (a bad shape): heard from, not counted.
  CHECK(Apply(*node.sys, ps0, from(0, {0.5f})).status().code() == absl::StatusCode::kInvalidArgument);
  // Indices outside [0, kMaxCountedWorkers): applied, not counted per worker.
  REQUIRE_OK(Apply(*node.sys, ps0, from(-1, {0.5f, 0.5f})));
  REQUIRE_OK(Apply(*node.sys, ps0, from(internal::kMaxCountedWorkers, {0.5f, 0.5f})));
  PsShardStatsMessage st = Stats(*node.sys, ps0);
  CHECK(st.applied_updates == 5);
  CHECK(st.refused_updates == 1);
  CHECK(st.worker_applies == std::vector<int64_t>{2, 0, 0, 1});
  REQUIRE(st.worker_last_apply_ms.size() == 4);
  CHECK(st.worker_last_apply_ms[1] == -1);  // never heard from
  CHECK(st.worker_last_apply_ms[2] == -1);
  for (int k : {0, 3}) {
    CAPTURE(k);
    CHECK(st.worker_last_apply_ms[k] >= 0);
    CHECK(st.worker_last_apply_ms[k] < 10'000);  // this test's applies, just now (a bound, not a speed target)
  }
}

TEST_CASE("a bad gradient is refused, naming the variable, and leaves the shard unchanged") {
  Node node;
  OptimizerOptions opt;
  opt.kind = OptimizerKind::kMomentum;
  caf::actor shard = node.Shard(0, opt);
  VariablesMessage vars;
  vars.tensors = {GlobalStep(5), Floats("w", {2, 2}, {1, 2, 3, 4}), Floats("w/Momentum", {2, 2}, {0, 0, 0, 0}),
                  Floats("b", {2}, {1, 2}), Floats("b/Momentum", {2}, {0, 0}), Floats("c", {2}, {1, 2})};
  REQUIRE_OK(Init(*node.sys, shard, vars));
  StatusOr<VariablesMessage> before = Snapshot(*node.sys, shard);
  REQUIRE_OK(before);

  const TensorMessage good = Floats("b", {2}, {1, 1});  // valid: it must not be applied either
  StatusOr<TensorMessage> ints = internal::ToMessage("w", *Tensor::FromVector<int32_t>({1, 1, 1, 1}, TensorShape{2, 2}));
  REQUIRE_OK(ints);
  TensorMessage short_bytes = Floats("w", {2, 2}, {1, 1, 1, 1});
  short_bytes.bytes.resize(3);
  struct Bad {
    const char* what;
    ApplyGradientsMessage update;
    absl::StatusCode code;
    const char* names;
  };
  const std::vector<Bad> bads = {
      {"wrong shape", Update({good, Floats("w", {4}, {1, 1, 1, 1})}, 0.1f), absl::StatusCode::kInvalidArgument,
       "the gradient of 'w' has shape"},
      {"wrong dtype", Update({good, *ints}, 0.1f), absl::StatusCode::kInvalidArgument, "the gradient of 'w' is int32"},
      {"truncated bytes", Update({good, short_bytes}, 0.1f), absl::StatusCode::kInvalidArgument, "'w'"},
      {"unknown name", Update({good, Floats("v", {2}, {1, 1})}, 0.1f), absl::StatusCode::kNotFound, "'v'"},
      {"global_step", Update({good, GlobalStep(1)}, 0.1f), absl::StatusCode::kInvalidArgument,
       "'global_step' is not trainable"},
      {"a slot", Update({good, Floats("w/Momentum", {2, 2}, {1, 1, 1, 1})}, 0.1f),
       absl::StatusCode::kInvalidArgument, "'w/Momentum' is not trainable"},
      {"twice", Update({good, good}, 0.1f), absl::StatusCode::kInvalidArgument, "two gradients for variable 'b'"},
      {"missing slot", Update({good, Floats("c", {2}, {1, 1})}, 0.1f), absl::StatusCode::kFailedPrecondition,
       "'c/Momentum'"},
      {"bad learning rate", Update({good}, -1.0f), absl::StatusCode::kInvalidArgument, "learning_rate"},
  };
  for (const Bad& bad : bads) {
    CAPTURE(std::string(bad.what));
    StatusOr<int64_t> r = Apply(*node.sys, shard, bad.update);
    REQUIRE(!r.ok());
    CHECK(r.status().code() == bad.code);
    CHECK_MESSAGE(absl::StrContains(r.status().message(), bad.names), r.status().ToString());
    CHECK(absl::StrContains(r.status().message(), "ps task 0"));
  }
  StatusOr<VariablesMessage> after = Snapshot(*node.sys, shard);
  REQUIRE_OK(after);
  CHECK(after->global_step == 5);
  REQUIRE(after->tensors.size() == before->tensors.size());
  for (std::size_t i = 0; i < after->tensors.size(); ++i) {
    CAPTURE(after->tensors[i].name);
    CHECK(after->tensors[i].bytes == before->tensors[i].bytes);
  }
  PsShardStatsMessage s = Stats(*node.sys, shard);
  CHECK(s.refused_updates == static_cast<int64_t>(bads.size()));
  CHECK(s.applied_updates == 0);
}

// A worker that applies ones (SGD, lr 1) to w0 on ps 0, then w1 on ps 1, in
// turn, until stopped or `max_updates`; counts its completed pairs.
struct ThirdParty {
  caf::actor_system& sys;
  caf::actor ps0, ps1;
  std::mutex mu;
  std::condition_variable cv;
  int64_t pairs = 0;
  Status error;
  std::atomic<bool> stop{false};
  std::thread thread;

  ThirdParty(caf::actor_system& s, caf::actor a, caf::actor b) : sys(s), ps0(std::move(a)), ps1(std::move(b)) {
    thread = std::thread([this] { Run(); });
  }
  ~ThirdParty() { Stop(); }
  void Stop() {
    stop = true;
    if (thread.joinable()) thread.join();
  }
  void Run() {
    for (int i = 0; i < 100000 && !stop; ++i) {
      StatusOr<int64_t> a = Apply(sys, ps0, Update({Floats("w0", {2}, {1, 1})}, 1.0f));
      StatusOr<int64_t> b = a.ok() ? Apply(sys, ps1, Update({Floats("w1", {2}, {1, 1})}, 1.0f)) : a;
      std::lock_guard<std::mutex> l(mu);
      if (!b.ok()) {
        error = b.status();
        break;
      }
      ++pairs;
      cv.notify_all();
    }
    cv.notify_all();
  }
  // Waits (bounded) until `n` more pairs are done than now.
  bool WaitMore(int64_t n) {
    std::unique_lock<std::mutex> l(mu);
    const int64_t target = pairs + n;
    return cv.wait_for(l, std::chrono::seconds(10), [&] { return pairs >= target || !error.ok(); }) && error.ok();
  }
};

TEST_CASE("freeze / snapshot / thaw: one consistent global_step across two shards while a worker keeps applying") {
  Node node;
  caf::actor ps0 = node.Shard(0, Sgd());
  caf::actor ps1 = node.Shard(1, Sgd());
  VariablesMessage v0, v1;
  v0.tensors = {GlobalStep(0), Floats("w0", {2}, {0, 0})};
  v1.tensors = {Floats("w1", {2}, {0, 0})};
  REQUIRE_OK(Init(*node.sys, ps0, v0));
  REQUIRE_OK(Init(*node.sys, ps1, v1));
  ThirdParty worker(*node.sys, ps0, ps1);
  caf::scoped_actor freezer{*node.sys};  // the chief's consistent read: one asker freezes, reads, thaws
  for (int round = 0; round < 3; ++round) {
    CAPTURE(round);
    REQUIRE(worker.WaitMore(3));
    // The chief's checkpoint.
    StatusOr<int64_t> step = AskFrom<int64_t>(freezer, ps0, internal::ps_freeze_atom::value, int64_t{5000});
    REQUIRE_OK(step);
    StatusOr<int64_t> step1 = AskFrom<int64_t>(freezer, ps1, internal::ps_freeze_atom::value, int64_t{5000});
    REQUIRE_OK(step1);
    CHECK(*step1 == -1);
    StatusOr<VariablesMessage> s0 = Snapshot(*node.sys, ps0);
    StatusOr<VariablesMessage> s1 = Snapshot(*node.sys, ps1);
    PsShardStatsMessage stats1 = Stats(*node.sys, ps1);
    REQUIRE_OK(s0);
    REQUIRE_OK(s1);
    // ps 0: its values and its global_step are one state (the freeze's).
    CHECK(s0->global_step == *step);
    const float g = static_cast<float>(*step);
    CHECK(ValuesOf(*Find(*s0, "w0")) == std::vector<float>{-g, -g});
    // ps 1 did not move since its freeze, and is within the one update the
    // worker may have in flight between its two applies (TF1's async).
    const float a1 = static_cast<float>(stats1.applied_updates);
    CHECK(ValuesOf(*Find(*s1, "w1")) == std::vector<float>{-a1, -a1});
    CHECK((a1 == g || a1 == g - 1));
    CHECK(stats1.frozen);
    // Frozen: a second snapshot is the same state, whatever the worker sends.
    StatusOr<VariablesMessage> again0 = Snapshot(*node.sys, ps0);
    StatusOr<VariablesMessage> again1 = Snapshot(*node.sys, ps1);
    REQUIRE_OK(again0);
    REQUIRE_OK(again1);
    CHECK(again0->global_step == *step);
    CHECK(Find(*again0, "w0")->bytes == Find(*s0, "w0")->bytes);
    CHECK(Find(*again1, "w1")->bytes == Find(*s1, "w1")->bytes);
    StatusOr<int64_t> held0 = Ask<int64_t>(*node.sys, ps0, internal::ps_thaw_atom::value);
    StatusOr<int64_t> held1 = Ask<int64_t>(*node.sys, ps1, internal::ps_thaw_atom::value);
    REQUIRE_OK(held0);
    REQUIRE_OK(held1);
    // One worker: at most one apply held on each (ps 1's after ps 0 thawed).
    CHECK(*held0 <= 1);
    CHECK(*held1 <= 1);
    CHECK(!Stats(*node.sys, ps0).frozen);
  }
  REQUIRE(worker.WaitMore(3));  // thawed: training goes on
  worker.Stop();
  REQUIRE_OK(worker.error);
  StatusOr<VariablesMessage> s0 = Snapshot(*node.sys, ps0);
  StatusOr<VariablesMessage> s1 = Snapshot(*node.sys, ps1);
  REQUIRE_OK(s0);
  REQUIRE_OK(s1);
  CHECK(s0->global_step == worker.pairs);
  CHECK(ValuesOf(*Find(*s1, "w1"))[0] == -static_cast<float>(worker.pairs));
  CHECK(Stats(*node.sys, ps0).freeze_timeouts == 0);
}

TEST_CASE("a freeze without a thaw ends at its timeout, and the held applies are then applied") {
  Node node;
  caf::actor shard = node.Shard(0, Sgd());
  VariablesMessage vars;
  vars.tensors = {GlobalStep(0), Floats("w", {1}, {0})};
  REQUIRE_OK(Init(*node.sys, shard, vars));
  caf::scoped_actor freezer{*node.sys};
  CHECK(AskFrom<int64_t>(freezer, shard, internal::ps_freeze_atom::value, int64_t{0}).status().code() ==
        absl::StatusCode::kInvalidArgument);
  // Thawing a shard that is not frozen is a no-op.
  StatusOr<int64_t> none = Ask<int64_t>(*node.sys, shard, internal::ps_thaw_atom::value);
  REQUIRE_OK(none);
  CHECK(*none == 0);

  const auto start = std::chrono::steady_clock::now();
  StatusOr<int64_t> frozen_at = AskFrom<int64_t>(freezer, shard, internal::ps_freeze_atom::value, int64_t{300});
  REQUIRE_OK(frozen_at);
  CHECK(*frozen_at == 0);
  StatusOr<int64_t> applied = absl::UnknownError("not run");
  std::thread apply([&] { applied = Apply(*node.sys, shard, Update({Floats("w", {1}, {1})}, 1.0f)); });
  apply.join();  // Apply waits at most kReply
  const auto waited = std::chrono::steady_clock::now() - start;
  REQUIRE_MESSAGE(applied.ok(), applied.status().ToString());
  CHECK(*applied == 1);
  CHECK(waited >= std::chrono::milliseconds(300));  // held until the timeout
  PsShardStatsMessage s = Stats(*node.sys, shard);
  CHECK(!s.frozen);
  CHECK(s.freeze_timeouts == 1);
  CHECK(s.applied_updates == 1);
  CHECK(s.queued_updates == 0);
  CHECK(s.sync_step == -1);  // asynchronous

  // An explicit thaw cancels the timeout of that freeze.
  REQUIRE_OK(AskFrom<int64_t>(freezer, shard, internal::ps_freeze_atom::value, int64_t{50}));
  REQUIRE_OK(Ask<int64_t>(*node.sys, shard, internal::ps_thaw_atom::value));
  // Frozen again for long: the old freeze's timeout must not thaw this one.
  REQUIRE_OK(AskFrom<int64_t>(freezer, shard, internal::ps_freeze_atom::value, int64_t{60000}));
  caf::scoped_actor self{*node.sys};
  bool replied = false;
  self->request(shard, std::chrono::milliseconds(200), internal::ps_apply_atom::value,
                Update({Floats("w", {1}, {1})}, 1.0f))
      .receive([&](int64_t) { replied = true; }, [&](caf::error&) {});
  CHECK(!replied);  // still held 200 ms later, well after the first freeze's 50 ms
  s = Stats(*node.sys, shard);
  CHECK(s.frozen);
  CHECK(s.freeze_timeouts == 1);
  CHECK(s.queued_updates == 1);
}

// A sender in the same process passes its gradient's own bytes (a borrowed
// view, PsRemoteValues::Apply); a frozen shard that holds the apply must copy
// them and let the view go at once: the sender's request may time out and
// its buffer be reused before the thaw.
TEST_CASE("a frozen shard copies a held apply's borrowed gradient, so the sender's buffer is free before the thaw") {
  Node node;
  caf::actor shard = node.Shard(0, Sgd());
  VariablesMessage vars;
  vars.tensors = {GlobalStep(0), Floats("w", {4}, {1, 2, 3, 4})};
  REQUIRE_OK(Init(*node.sys, shard, vars));
  caf::scoped_actor freezer{*node.sys};
  REQUIRE_OK(AskFrom<int64_t>(freezer, shard, internal::ps_freeze_atom::value, int64_t{60000}));
  Tensor grad = *Tensor::FromVector<float>({1, 1, 1, 1}, TensorShape{4});
  ApplyGradientsMessage update = Update({}, 0.5f);
  update.gradients.tensors.push_back(internal::BorrowingMessage("w", grad).value());
  caf::scoped_actor worker{*node.sys};
  auto held = worker->request(shard, kReply, internal::ps_apply_atom::value, update);
  // Held by the freeze, and the view already returned.
  CHECK(update.gradients.tensors[0].bytes.WaitUntilReturned(std::chrono::seconds(10)));
  CHECK(Stats(*node.sys, shard).queued_updates == 1);
  std::fill(grad.data<float>(), grad.data<float>() + 4, 1000.0f);  // the sender reuses its buffer
  REQUIRE_OK(AskFrom<int64_t>(freezer, shard, internal::ps_thaw_atom::value));
  StatusOr<int64_t> applied = absl::UnknownError("no answer");
  held.receive([&](int64_t step) { applied = step; },
               [&](caf::error& e) { applied = internal::ErrorToStatus(e, "ps shard"); });
  REQUIRE_MESSAGE(applied.ok(), applied.status().ToString());
  StatusOr<VariablesMessage> w = Read(*node.sys, shard, {"w"});
  REQUIRE_OK(w);
  CHECK(ValuesOf(w->tensors[0]) == std::vector<float>{0.5f, 1.5f, 2.5f, 3.5f});  // w - 0.5 * 1, not * 1000
}

TEST_CASE("a freeze ends when the actor that asked for it ends, and the held applies are then applied") {
  // The chief killed mid-checkpoint: its consistent read's actor is gone
  // (locally it ends; across the network its proxy is killed when the
  // connection drops), so the workers' applies must not wait for the
  // freeze's timeout (60 s here; their own request timeout is shorter).
  Node node;
  caf::actor shard = node.Shard(0, Sgd());
  VariablesMessage vars;
  vars.tensors = {GlobalStep(0), Floats("w", {1}, {0})};
  REQUIRE_OK(Init(*node.sys, shard, vars));
  caf::scoped_actor worker{*node.sys};
  std::optional<caf::scoped_actor> freezer;
  freezer.emplace(*node.sys);
  REQUIRE_OK(AskFrom<int64_t>(*freezer, shard, internal::ps_freeze_atom::value, int64_t{60000}));
  // A second actor freezes it again (it replaces `freezer` as the one
  // whose end thaws) and ends without a thaw.
  {
    caf::scoped_actor other{*node.sys};
    REQUIRE_OK(AskFrom<int64_t>(other, shard, internal::ps_freeze_atom::value, int64_t{60000}));
  }
  StatusOr<int64_t> applied = absl::UnknownError("not run");
  auto held = worker->request(shard, kReply, internal::ps_apply_atom::value, Update({Floats("w", {1}, {1})}, 1.0f));
  // The shard has thawed at `other`'s end: the apply is answered at once.
  held.receive([&](int64_t step) { applied = step; },
               [&](caf::error& e) { applied = internal::ErrorToStatus(e, "ps shard"); });
  REQUIRE_MESSAGE(applied.ok(), applied.status().ToString());
  CHECK(*applied == 1);
  PsShardStatsMessage s = Stats(*node.sys, shard);
  CHECK(!s.frozen);
  CHECK(s.freeze_timeouts == 1);

  // The first freezer, replaced, ends while the shard is frozen by a third:
  // nothing thaws; the third's end does.
  caf::scoped_actor third{*node.sys};
  REQUIRE_OK(AskFrom<int64_t>(third, shard, internal::ps_freeze_atom::value, int64_t{60000}));
  freezer.reset();
  bool replied = false;
  worker
      ->request(shard, std::chrono::milliseconds(200), internal::ps_apply_atom::value,
                Update({Floats("w", {1}, {1})}, 1.0f))
      .receive([&](int64_t) { replied = true; }, [&](caf::error&) {});
  CHECK(!replied);  // held: the shard's freezer is `third`, alive
  CHECK(Stats(*node.sys, shard).frozen);
  // The thawed shard answers the held apply (its asker timed out: the answer
  // is dropped); an explicit thaw then leaves `third`'s end a no-op.
  StatusOr<int64_t> thawed = AskFrom<int64_t>(third, shard, internal::ps_thaw_atom::value);
  REQUIRE_OK(thawed);
  CHECK(*thawed == 1);
  s = Stats(*node.sys, shard);
  CHECK(!s.frozen);
  CHECK(s.applied_updates == 2);
  CHECK(s.freeze_timeouts == 1);
}

TEST_CASE("a freeze across 127.0.0.1 ends when the freezing node goes away") {
  internal::NetConfig net;
  Node server(&net);
  caf::actor local = server.Shard(0, Sgd());
  StatusOr<uint16_t> port = internal::PublishActor(*server.sys, local, "127.0.0.1", 0, false);
  REQUIRE_MESSAGE(port.ok(), port.status().ToString());
  VariablesMessage vars;
  vars.tensors = {GlobalStep(0), Floats("w", {1}, {0})};
  REQUIRE_OK(Init(*server.sys, local, vars));
  {
    Node chief(&net);
    StatusOr<caf::actor> shard =
        internal::ConnectActor(*chief.sys, "127.0.0.1", *port, false, std::chrono::milliseconds(5000));
    REQUIRE_MESSAGE(shard.ok(), shard.status().ToString());
    caf::scoped_actor freezer{*chief.sys};
    REQUIRE_OK(AskFrom<int64_t>(freezer, *shard, internal::ps_freeze_atom::value, int64_t{60000}));
    REQUIRE(Stats(*server.sys, local).frozen);
    // The chief's node ends without a thaw (its actor system, and with it
    // the connection, go away).
  }
  const auto start = std::chrono::steady_clock::now();
  StatusOr<int64_t> applied = Apply(*server.sys, local, Update({Floats("w", {1}, {1})}, 1.0f));
  REQUIRE_MESSAGE(applied.ok(), applied.status().ToString());
  CHECK(*applied == 1);
  CHECK(std::chrono::steady_clock::now() - start < kReply);  // not the freeze's 60 s
  PsShardStatsMessage s = Stats(*server.sys, local);
  CHECK(!s.frozen);
  CHECK(s.freeze_timeouts == 1);
}

TEST_CASE("a frozen shard holds at most kMaxHeldApplies applies, and answers the held ones when asked to quit") {
  Node node;
  caf::actor shard = node.Shard(0, Sgd());
  VariablesMessage vars;
  vars.tensors = {GlobalStep(0), Floats("w", {1}, {0})};
  REQUIRE_OK(Init(*node.sys, shard, vars));
  caf::scoped_actor freezer{*node.sys};
  REQUIRE_OK(AskFrom<int64_t>(freezer, shard, internal::ps_freeze_atom::value, int64_t{60000}));
  caf::scoped_actor self{*node.sys};
  const ApplyGradientsMessage one = Update({Floats("w", {1}, {1})}, 1.0f);
  std::vector<caf::response_handle<caf::blocking_actor, caf::message, true>> held;
  for (int i = 0; i < internal::kMaxHeldApplies; ++i) {
    held.push_back(self->request(shard, kReply, internal::ps_apply_atom::value, one));
  }
  Status over = absl::UnknownError("no answer");
  self->request(shard, kReply, internal::ps_apply_atom::value, one)
      .receive([&](int64_t) { over = absl::OkStatus(); },
               [&](caf::error& e) { over = internal::ErrorToStatus(e, "ps shard"); });
  CHECK(over.code() == absl::StatusCode::kUnavailable);
  CHECK_MESSAGE(absl::StrContains(over.message(), "is frozen for a checkpoint"), over.ToString());
  PsShardStatsMessage s = Stats(*node.sys, shard);
  CHECK(s.queued_updates == internal::kMaxHeldApplies);
  CHECK(s.refused_updates == 1);

  caf::anon_send_exit(shard, caf::exit_reason::user_shutdown);
  int unavailable = 0;
  for (auto& h : held) {
    h.receive([&](int64_t) {},
              [&](caf::error& e) {
                Status st = internal::ErrorToStatus(e, "ps shard");
                if (st.code() == absl::StatusCode::kUnavailable &&
                    absl::StrContains(st.message(), "stopped while frozen")) {
                  ++unavailable;
                }
              });
  }
  CHECK(unavailable == internal::kMaxHeldApplies);
}

// The answer to a pending apply, as a Status or the step.
StatusOr<int64_t> Await(caf::response_handle<caf::blocking_actor, caf::message, true>& h) {
  StatusOr<int64_t> out = absl::UnknownError("no answer");
  h.receive([&](int64_t step) { out = step; }, [&](caf::error& e) { out = internal::ErrorToStatus(e, "ps shard"); });
  return out;
}

TEST_CASE("training ended (ps_end_atom): held and later applies are OUT_OF_RANGE, reads still served and are activity") {
  Node node;
  std::atomic<int> activity{0};
  PsShardOptions options{0, Sgd()};
  options.on_end_activity = [&activity] { ++activity; };
  StatusOr<caf::actor> made = internal::SpawnPsShard(*node.sys, options);
  REQUIRE_OK(made);
  caf::actor shard = *made;
  node.actors.push_back(shard);
  VariablesMessage vars;
  vars.tensors = {GlobalStep(5), Floats("w", {2}, {1, 2})};
  REQUIRE_OK(Init(*node.sys, shard, vars));
  caf::scoped_actor freezer{*node.sys};
  REQUIRE_OK(AskFrom<int64_t>(freezer, shard, internal::ps_freeze_atom::value, int64_t{60000}));
  caf::scoped_actor self{*node.sys};
  auto held = self->request(shard, kReply, internal::ps_apply_atom::value, Update({Floats("w", {2}, {1, 1})}, 1.0f));
  REQUIRE(Stats(*node.sys, shard).queued_updates == 1);  // the apply is held before the end
  CHECK(activity.load() == 0);

  StatusOr<int64_t> ended = Ask<int64_t>(*node.sys, shard, internal::ps_end_atom::value, int64_t{-1});
  REQUIRE_MESSAGE(ended.ok(), ended.status().ToString());
  CHECK(*ended == 5);
  StatusOr<int64_t> h = Await(held);
  CHECK(h.status().code() == absl::StatusCode::kOutOfRange);
  CHECK_MESSAGE(h.status().message() == "ps task 0: training ended by the chief at global_step 5", h.status());
  StatusOr<int64_t> later = Apply(*node.sys, shard, Update({Floats("w", {2}, {1, 1})}, 1.0f));
  CHECK(later.status().code() == absl::StatusCode::kOutOfRange);
  CHECK(activity.load() == 2);  // the end and the later apply (the held one was answered by the end)
  // Idempotent; reads, snapshots and thaws still served; nothing changed.
  CHECK(Ask<int64_t>(*node.sys, shard, internal::ps_end_atom::value, int64_t{-1}).value() == 5);
  CHECK(Ask<int64_t>(*node.sys, shard, internal::ps_thaw_atom::value).value() == 0);
  StatusOr<VariablesMessage> r = Read(*node.sys, shard, {"w", "global_step"});
  REQUIRE_OK(r);
  CHECK(ValuesOf(r->tensors[0]) == std::vector<float>{1, 2});
  CHECK(r->global_step == 5);
  CHECK_OK(Snapshot(*node.sys, shard));
  PsShardStatsMessage s = Stats(*node.sys, shard);
  CHECK(s.applied_updates == 0);
  CHECK(s.queued_updates == 0);
  // The thaw, the read and the snapshot (a chief's final checkpoint and
  // evaluation) are activity after the end, so the ps task's Join waits for
  // them to stop; the second end and the stats are not.
  CHECK(activity.load() == 5);
}

TEST_CASE("an evicted shard (ps_evict_atom) refuses applies UNAVAILABLE, serves the chief's checkpoint read, and "
          "says so at its thaw; with no chief applying it says at once there is nothing to wait for") {
  Node node;
  std::vector<bool> said;  // on_evicted_read's calls, on the shard's thread (read after the asks below)
  Mutex mu;
  PsShardOptions options{0, Sgd()};
  options.silence_ms = 60'000;
  options.on_evicted_read = [&](bool chief_read) {
    MutexLock l(mu);
    said.push_back(chief_read);
  };
  StatusOr<caf::actor> made = internal::SpawnPsShard(*node.sys, options);
  REQUIRE_OK(made);
  caf::actor shard = *made;
  node.actors.push_back(shard);
  VariablesMessage vars;
  vars.tensors = {GlobalStep(5), Floats("w", {2}, {1, 2})};
  REQUIRE_OK(Init(*node.sys, shard, vars));
  ApplyGradientsMessage from_chief = Update({Floats("w", {2}, {1, 1})}, 1.0f);
  from_chief.gradients.worker = 0;
  REQUIRE(Apply(*node.sys, shard, from_chief).value() == 6);
  caf::scoped_actor freezer{*node.sys};
  REQUIRE_OK(AskFrom<int64_t>(freezer, shard, internal::ps_freeze_atom::value, int64_t{60000}));
  caf::scoped_actor self{*node.sys};
  auto held = self->request(shard, kReply, internal::ps_apply_atom::value, from_chief);
  REQUIRE(Stats(*node.sys, shard).queued_updates == 1);

  StatusOr<bool> chief_there = Ask<bool>(*node.sys, shard, internal::ps_evict_atom::value, std::string("127.0.0.1:1"));
  REQUIRE_OK(chief_there);
  CHECK(*chief_there);  // worker 0 applied just now
  StatusOr<int64_t> h = Await(held);
  CHECK(h.status().code() == absl::StatusCode::kUnavailable);
  CHECK_MESSAGE(absl::StartsWith(h.status().message(), "ps task 0 (127.0.0.1:1) is stopping (evicted): it accepts no updates"),
                h.status());
  StatusOr<int64_t> later = Apply(*node.sys, shard, from_chief);
  CHECK(later.status().code() == absl::StatusCode::kUnavailable);
  // The chief's consistent read: still served, and done at the thaw.
  StatusOr<VariablesMessage> r = AskFrom<VariablesMessage>(freezer, shard, internal::ps_read_atom::value,
                                                           std::vector<std::string>{"w", "global_step"});
  REQUIRE_OK(r);
  CHECK(r->global_step == 6);
  {
    MutexLock l(mu);
    CHECK(said.empty());  // not before the thaw
  }
  CHECK(AskFrom<int64_t>(freezer, shard, internal::ps_thaw_atom::value).value() == 0);
  CHECK(Stats(*node.sys, shard).refused_updates == 2);
  // A second eviction changes nothing; a thaw without a freeze says nothing.
  CHECK(Ask<bool>(*node.sys, shard, internal::ps_evict_atom::value, std::string("127.0.0.1:1")).ok());
  CHECK(Ask<int64_t>(*node.sys, shard, internal::ps_thaw_atom::value).value() == 0);
  {
    MutexLock l(mu);
    CHECK(said == std::vector<bool>{true});
  }

  // No chief applying: nothing to wait for.
  StatusOr<caf::actor> lone = internal::SpawnPsShard(*node.sys, options);
  REQUIRE_OK(lone);
  node.actors.push_back(*lone);
  REQUIRE_OK(Init(*node.sys, *lone, vars));
  StatusOr<bool> none = Ask<bool>(*node.sys, *lone, internal::ps_evict_atom::value, std::string("127.0.0.1:2"));
  REQUIRE_OK(none);
  CHECK_FALSE(*none);
  MutexLock l(mu);
  CHECK(said == std::vector<bool>{true, false});
}

TEST_CASE("training ended: a synchronous apply waiting for its replicas is answered OUT_OF_RANGE; a shard "
          "without global_step names the chief's step") {
  Node node;
  PsShardOptions options{1, Sgd()};
  options.replicas_to_aggregate = 2;
  StatusOr<caf::actor> made = internal::SpawnPsShard(*node.sys, options);
  REQUIRE_OK(made);
  caf::actor shard = *made;
  node.actors.push_back(shard);
  VariablesMessage vars;
  vars.global_step = 7;
  vars.tensors = {Floats("w", {1}, {0})};
  REQUIRE_OK(Init(*node.sys, shard, vars));
  caf::scoped_actor self{*node.sys};
  ApplyGradientsMessage one = Update({Floats("w", {1}, {1})}, 1.0f);
  one.gradients.step = 7;
  auto waiting = self->request(shard, kReply, internal::ps_apply_atom::value, one);
  REQUIRE(Stats(*node.sys, shard).waiting_replicas == 1);
  StatusOr<int64_t> ended = Ask<int64_t>(*node.sys, shard, internal::ps_end_atom::value, int64_t{9});
  REQUIRE_OK(ended);
  CHECK(*ended == -1);  // the shard holds no global_step
  StatusOr<int64_t> w = Await(waiting);
  CHECK(w.status().code() == absl::StatusCode::kOutOfRange);
  CHECK_MESSAGE(w.status().message() == "ps task 1: training ended by the chief at global_step 9", w.status());
  PsShardStatsMessage s = Stats(*node.sys, shard);
  CHECK(s.waiting_replicas == 0);
  CHECK(s.dropped_gradients == 1);
  CHECK(ValuesOf(Read(*node.sys, shard, {"w"}).value().tensors[0]) == std::vector<float>{0});
}

ApplyGradientsMessage AtStep(int64_t step, int32_t worker, std::vector<TensorMessage> grads, float lr) {
  ApplyGradientsMessage u = Update(std::move(grads), lr);
  u.gradients.step = step;
  u.gradients.worker = worker;
  return u;
}

// Issue 27 point 2: ps_apply_read_atom is ps_apply_atom answered with the
// step's values (every variable but the slots) taken right after the
// update; an answer shares the variables' bytes and never changes after it
// was given (copy-on-write: the next update writes a copy).
TEST_CASE("ps_apply_read: the apply, answered with the non-slot variables after it; answers never change later") {
  Node node;
  OptimizerOptions opt;
  opt.kind = OptimizerKind::kAdam;
  caf::actor shard = node.Shard(0, opt);
  std::mt19937 rng(11);
  VariablesMessage vars;
  vars.tensors = {GlobalStep(5),
                  Floats("beta1_power", {}, {0.9f}),
                  Floats("beta2_power", {}, {0.999f}),
                  Floats("w", {2, 3}, Random(6, rng)),
                  Floats("w/Adam", {2, 3}, std::vector<float>(6, 0.0f)),
                  Floats("w/Adam_1", {2, 3}, std::vector<float>(6, 0.0f))};
  REQUIRE_OK(Init(*node.sys, shard, vars));
  StatusOr<VariablesMessage> before = Read(*node.sys, shard, {"w", "w/Adam"});
  REQUIRE_OK(before);
  const std::vector<float> w_before = ValuesOf(before->tensors[0]);

  StatusOr<VariablesMessage> answer = Ask<VariablesMessage>(
      *node.sys, shard, internal::ps_apply_read_atom::value, Update({Floats("w", {2, 3}, Random(6, rng))}, 0, 0.01f));
  REQUIRE_MESSAGE(answer.ok(), answer.status().ToString());
  CHECK(answer->global_step == 6);
  std::vector<std::string> names;
  for (const TensorMessage& t : answer->tensors) names.push_back(t.name);
  CHECK(names == std::vector<std::string>{"beta1_power", "beta2_power", "global_step", "w"});
  StatusOr<VariablesMessage> after = Read(*node.sys, shard, {"beta1_power", "beta2_power", "global_step", "w"});
  REQUIRE_OK(after);
  for (std::size_t i = 0; i < names.size(); ++i) CHECK(answer->tensors[i].bytes == after->tensors[i].bytes);
  CHECK(ValuesOf(answer->tensors[3]) != w_before);
  // The read taken before the update still holds the values before it.
  CHECK(ValuesOf(before->tensors[0]) == w_before);
  CHECK(ValuesOf(before->tensors[1]) == std::vector<float>(6, 0.0f));

  // Another update: the earlier answer is unchanged too, every tensor of it
  // (the beta powers and global_step are written by every update).
  std::vector<internal::TensorBytes> answered;
  for (const TensorMessage& t : answer->tensors) {
    answered.push_back(internal::TensorBytes::Copy(t.bytes.data(), t.bytes.size()));
  }
  const std::vector<float> w_answered = ValuesOf(answer->tensors[3]);
  REQUIRE_OK(Apply(*node.sys, shard, Update({Floats("w", {2, 3}, Random(6, rng))}, 0, 0.01f)));
  for (std::size_t i = 0; i < answered.size(); ++i) CHECK(answer->tensors[i].bytes == answered[i]);
  CHECK(ValuesOf(Read(*node.sys, shard, {"w"})->tensors[0]) != w_answered);

  // Errors as for ps_apply_atom, the shard unchanged.
  StatusOr<VariablesMessage> refused = Ask<VariablesMessage>(
      *node.sys, shard, internal::ps_apply_read_atom::value, Update({Floats("w", {3}, {1, 2, 3})}, 0, 0.01f));
  CHECK(refused.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(Stats(*node.sys, shard).global_step == 7);
}

TEST_CASE("synchronous mode: 2 replicas per update, the mean applied once, stale gradients dropped and counted") {
  Eigen::ThreadPool pool(1);
  Eigen::ThreadPoolDevice device(&pool, 1);
  Node node;
  OptimizerOptions opt;
  opt.kind = OptimizerKind::kMomentum;
  PsShardOptions options{0, opt, /*replicas_to_aggregate=*/2};
  StatusOr<caf::actor> made = internal::SpawnPsShard(*node.sys, options);
  REQUIRE_OK(made);
  node.actors.push_back(*made);
  caf::actor ps0 = *made;
  options.task_index = 1;
  made = internal::SpawnPsShard(*node.sys, options);
  REQUIRE_OK(made);
  node.actors.push_back(*made);
  caf::actor ps1 = *made;
  options.replicas_to_aggregate = -1;
  CHECK(internal::SpawnPsShard(*node.sys, options).status().code() == absl::StatusCode::kInvalidArgument);

  std::mt19937 rng(5);
  std::vector<float> w = Random(6, rng), accum(6, 0.0f), v = Random(6, rng), vaccum(6, 0.0f);
  VariablesMessage v0, v1;
  v0.tensors = {GlobalStep(0), Floats("w", {2, 3}, w), Floats("w/Momentum", {2, 3}, accum)};
  v1.global_step = 0;  // ps 1 has no global_step: the chief tells it the step
  v1.tensors = {Floats("v", {6}, v), Floats("v/Momentum", {6}, vaccum)};
  REQUIRE_OK(Init(*node.sys, ps0, v0));
  REQUIRE_OK(Init(*node.sys, ps1, v1));
  const int kSteps = 3;
  for (int step = 0; step < kSteps; ++step) {
    CAPTURE(step);
    std::vector<float> g1 = Random(6, rng), g2 = Random(6, rng), h1 = Random(6, rng), h2 = Random(6, rng);
    // Replica 1 from one sender: its applies arrive before its stats request.
    caf::scoped_actor replica1{*node.sys};
    auto first0 = replica1->request(ps0, kReply, internal::ps_apply_atom::value,
                                    AtStep(step, 1, {Floats("w", {2, 3}, g1)}, 0.1f));
    auto first1 = replica1->request(ps1, kReply, internal::ps_apply_atom::value,
                                    AtStep(step, 1, {Floats("v", {6}, h1)}, 0.1f));
    PsShardStatsMessage waiting;
    replica1->request(ps0, kReply, internal::ps_stats_atom::value)
        .receive([&](PsShardStatsMessage& m) { waiting = m; }, [&](caf::error&) {});
    CHECK(waiting.applied_updates == step);  // one replica is not enough
    CHECK(waiting.global_step == step);
    CHECK(waiting.sync_step == step);
    CHECK(waiting.waiting_replicas == 1);
    StatusOr<int64_t> second0 = Apply(*node.sys, ps0, AtStep(step, 2, {Floats("w", {2, 3}, g2)}, 0.1f));
    StatusOr<int64_t> second1 = Apply(*node.sys, ps1, AtStep(step, 2, {Floats("v", {6}, h2)}, 0.1f));
    REQUIRE_MESSAGE(second0.ok(), second0.status().ToString());
    REQUIRE_OK(second1);
    CHECK(*second0 == step + 1);
    CHECK(*second1 == -1);
    int64_t a0 = -2, a1 = -2;
    first0.receive([&](int64_t v) { a0 = v; }, [&](caf::error&) {});
    first1.receive([&](int64_t v) { a1 = v; }, [&](caf::error&) {});
    CHECK(a0 == step + 1);  // both replicas answered by the one update
    CHECK(a1 == -1);
    std::vector<float> mean_g(6), mean_h(6);
    for (int i = 0; i < 6; ++i) {
      mean_g[i] = (g1[i] + g2[i]) / 2.0f;
      mean_h[i] = (h1[i] + h2[i]) / 2.0f;
    }
    nn::internal::ApplyDense(opt, 0.1f, w.data(), mean_g.data(), accum.data(), nullptr, 6, device);
    nn::internal::ApplyDense(opt, 0.1f, v.data(), mean_h.data(), vaccum.data(), nullptr, 6, device);
  }
  // A straggler's gradients of step 1: dropped, answered at once, counted.
  StatusOr<VariablesMessage> before = Snapshot(*node.sys, ps0);
  REQUIRE_OK(before);
  StatusOr<int64_t> stale = Apply(*node.sys, ps0, AtStep(1, 2, {Floats("w", {2, 3}, Random(6, rng))}, 0.1f));
  REQUIRE_OK(stale);
  CHECK(*stale == kSteps);
  StatusOr<int64_t> stale1 = Apply(*node.sys, ps1, AtStep(2, 2, {Floats("v", {6}, Random(6, rng))}, 0.1f));
  REQUIRE_OK(stale1);
  // A step the shard has not reached: refused.
  StatusOr<int64_t> future = Apply(*node.sys, ps0, AtStep(kSteps + 1, 1, {Floats("w", {2, 3}, w)}, 0.1f));
  CHECK(future.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(absl::StrContains(future.status().message(), "gradients of step 4"));

  StatusOr<VariablesMessage> s0 = Snapshot(*node.sys, ps0);
  StatusOr<VariablesMessage> s1 = Snapshot(*node.sys, ps1);
  REQUIRE_OK(s0);
  REQUIRE_OK(s1);
  CHECK(s0->global_step == kSteps);
  CHECK(Find(*s0, "w")->bytes == Find(*before, "w")->bytes);  // the stale gradients changed nothing
  CHECK(ValuesOf(*Find(*s0, "w")) == w);                       // bitwise: the float means, applied once
  CHECK(ValuesOf(*Find(*s0, "w/Momentum")) == accum);
  CHECK(ValuesOf(*Find(*s1, "v")) == v);
  CHECK(ValuesOf(*Find(*s1, "v/Momentum")) == vaccum);
  PsShardStatsMessage st0 = Stats(*node.sys, ps0);
  CHECK(st0.applied_updates == kSteps);
  CHECK(st0.sync_step == kSteps);
  CHECK(st0.waiting_replicas == 0);
  CHECK(st0.stale_gradients == 1);
  CHECK(st0.dropped_gradients == 1);
  CHECK(st0.refused_updates == 1);
  CHECK(Stats(*node.sys, ps1).stale_gradients == 1);
  // Per worker: the gradients accumulated (the stale and the refused ones not counted).
  CHECK(st0.worker_applies == std::vector<int64_t>{0, kSteps, kSteps});
  REQUIRE(st0.worker_last_apply_ms.size() == 3);
  CHECK(st0.worker_last_apply_ms[0] == -1);
  CHECK(st0.worker_last_apply_ms[1] >= 0);
  CHECK(st0.worker_last_apply_ms[2] >= 0);

  // A restore while a replica waits: the waiting apply is answered ABORTED
  // (one sender: the apply arrives before the init).
  caf::scoped_actor self{*node.sys};
  auto apply = self->request(ps0, kReply, internal::ps_apply_atom::value,
                             AtStep(kSteps, 1, {Floats("w", {2, 3}, w)}, 0.1f));
  v0.restore = true;
  auto init = self->request(ps0, kReply, internal::ps_init_atom::value, v0);
  Status applied = absl::UnknownError("no answer"), restored = absl::UnknownError("no answer");
  init.receive([&](caf::ok_atom) { restored = absl::OkStatus(); },
               [&](caf::error& e) { restored = internal::ErrorToStatus(e, "ps shard"); });
  apply.receive([&](int64_t) { applied = absl::OkStatus(); },
                [&](caf::error& e) { applied = internal::ErrorToStatus(e, "ps shard"); });
  CHECK_OK(restored);
  CHECK(applied.code() == absl::StatusCode::kAborted);
  CHECK_MESSAGE(absl::StrContains(applied.message(), "initialized again"), applied.ToString());
  CHECK(Stats(*node.sys, ps0).dropped_gradients == 2);
}

TEST_CASE("synchronous mode: a worker's second apply of a step replaces its first (ABORTED, counted dropped); "
          "the update is the mean of N workers' gradients") {
  Eigen::ThreadPool pool(1);
  Eigen::ThreadPoolDevice device(&pool, 1);
  Node node;
  PsShardOptions options{0, Sgd(), /*replicas_to_aggregate=*/2};
  StatusOr<caf::actor> made = internal::SpawnPsShard(*node.sys, options);
  REQUIRE_OK(made);
  node.actors.push_back(*made);
  caf::actor shard = *made;
  std::vector<float> w = {1, 2, 3};
  VariablesMessage vars;
  vars.tensors = {GlobalStep(4), Floats("w", {3}, w)};
  REQUIRE_OK(Init(*node.sys, shard, vars));
  // Worker 1 twice (one sender: in order), then worker 2.
  caf::scoped_actor self{*node.sys};
  auto first = self->request(shard, kReply, internal::ps_apply_atom::value,
                             AtStep(4, 1, {Floats("w", {3}, {100, 100, 100})}, 1.0f));
  auto again = self->request(shard, kReply, internal::ps_apply_atom::value,
                             AtStep(4, 1, {Floats("w", {3}, {0.5f, 1, 2})}, 1.0f));
  StatusOr<int64_t> r1 = Await(first);
  CHECK(r1.status().code() == absl::StatusCode::kAborted);
  CHECK_MESSAGE(r1.status().message() == "ps task 0: worker 1's apply of step 4 was replaced by its newer apply of the "
                                         "same step",
                r1.status());
  PsShardStatsMessage s = Stats(*node.sys, shard);
  CHECK(s.waiting_replicas == 1);  // worker 1 counts once
  CHECK(s.applied_updates == 0);
  CHECK(s.dropped_gradients == 1);
  CHECK(s.stale_gradients == 0);
  StatusOr<int64_t> r2 = Apply(*node.sys, shard, AtStep(4, 2, {Floats("w", {3}, {1.5f, 3, -2})}, 1.0f));
  REQUIRE_MESSAGE(r2.ok(), r2.status().ToString());
  CHECK(*r2 == 5);
  CHECK(Await(again).value_or(-1) == 5);
  // SGD, lr 1: w - mean(worker 1's second, worker 2's); the first is gone.
  std::vector<float> mean = {(0.5f + 1.5f) / 2.0f, (1.0f + 3.0f) / 2.0f, (2.0f - 2.0f) / 2.0f};
  nn::internal::ApplyDense(Sgd(), 1.0f, w.data(), mean.data(), nullptr, nullptr, 3, device);
  CHECK(ValuesOf(Read(*node.sys, shard, {"w"}).value().tensors[0]) == w);
  s = Stats(*node.sys, shard);
  CHECK(s.applied_updates == 1);
  CHECK(s.waiting_replicas == 0);
  CHECK(s.dropped_gradients == 1);
}

TEST_CASE("the protocol crosses 127.0.0.1: init, read, apply, snapshot, stats and errors") {
  internal::NetConfig net;
  Node server(&net);
  Node client(&net);
  OptimizerOptions opt;
  opt.kind = OptimizerKind::kMomentum;
  caf::actor local = server.Shard(0, opt);
  StatusOr<uint16_t> port = internal::PublishActor(*server.sys, local, "127.0.0.1", 0, false);
  REQUIRE_MESSAGE(port.ok(), port.status().ToString());
  StatusOr<caf::actor> shard = internal::ConnectActor(*client.sys, "127.0.0.1", *port, false,
                                                      std::chrono::milliseconds(5000));
  REQUIRE_MESSAGE(shard.ok(), shard.status().ToString());

  // An error crosses as Foreman's Status (code and message).
  StatusOr<VariablesMessage> early = Read(*client.sys, *shard, {"w"});
  CHECK(early.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK(early.status().message() == "ps task 0 is not initialized");

  std::mt19937 rng(3);
  std::vector<float> w = Random(64, rng), g = Random(64, rng);
  VariablesMessage vars;
  vars.tensors = {GlobalStep(7), Floats("w", {8, 8}, w), Floats("w/Momentum", {8, 8}, std::vector<float>(64, 0))};
  REQUIRE_OK(Init(*client.sys, *shard, vars));
  StatusOr<VariablesMessage> r = Read(*client.sys, *shard, {"w"});
  REQUIRE_OK(r);
  CHECK(r->global_step == 7);
  CHECK(r->tensors[0].bytes == vars.tensors[1].bytes);

  StatusOr<int64_t> step = Apply(*client.sys, *shard, Update({Floats("w", {8, 8}, g)}, 0.1f));
  REQUIRE_MESSAGE(step.ok(), step.status().ToString());
  CHECK(*step == 8);
  Eigen::ThreadPool pool(1);
  Eigen::ThreadPoolDevice device(&pool, 1);
  std::vector<float> accum(64, 0);
  nn::internal::ApplyDense(opt, 0.1f, w.data(), g.data(), accum.data(), nullptr, 64, device);
  StatusOr<VariablesMessage> snap = Snapshot(*client.sys, *shard);
  REQUIRE_OK(snap);
  CHECK(snap->global_step == 8);
  CHECK(ValuesOf(*Find(*snap, "w")) == w);
  CHECK(ValuesOf(*Find(*snap, "w/Momentum")) == accum);

  StatusOr<int64_t> bad = Apply(*client.sys, *shard, Update({Floats("w", {64}, g)}, 0.1f));
  CHECK(bad.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(absl::StrContains(bad.status().message(), "'w'"));

  caf::scoped_actor freezer{*client.sys};
  REQUIRE_OK(AskFrom<int64_t>(freezer, *shard, internal::ps_freeze_atom::value, int64_t{5000}));
  PsShardStatsMessage s = Stats(*client.sys, *shard);
  CHECK(s.frozen);
  CHECK(s.global_step == 8);
  CHECK(s.applied_updates == 1);
  CHECK(s.refused_updates == 1);
  REQUIRE_OK(Ask<int64_t>(*client.sys, *shard, internal::ps_thaw_atom::value));
}

}  // namespace
}  // namespace foreman
