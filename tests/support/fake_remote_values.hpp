// An in-memory cluster for the runtime's cluster seam
// (cluster/remote_values.hpp): FakeRemoteValues is N fake ps shards, each a
// VariableStore under its own mutex, with the variables placed as TF1's
// replica_device_setter places them (PlaceVariablesOnPs) and updates applied
// with nn::ApplyGradients. A shard is uninitialized until Write; EndTraining
// makes later applies OUT_OF_RANGE; FailNext injects an error (UNAVAILABLE)
// into the next calls of one method; Restart empties every shard (a
// restarted ps process); SetPsWait sets what ps_wait() answers.
// Restart(s) empties shard s only (one ps task restarted).
//
// FakeCluster registers it under the session target scheme "fakeps://":
// "fakeps://CLUSTER/TASK" is task TASK's mirror (one SessionValues per task,
// shared by that task's sessions, as a worker Server's target) of cluster
// CLUSTER's shards.
#pragma once

#include <algorithm>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#define EIGEN_USE_THREADS
#include <unsupported/Eigen/CXX11/Tensor>

#include <doctest/doctest.h>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "compute/cpu_device.hpp"
#include "foreman/cluster.hpp"
#include "foreman/nn.hpp"
#include "foreman/variable_store.hpp"
#include "nn/optimizer.hpp"
#include "cluster/remote_values.hpp"
#include "runtime/session_target.hpp"

namespace foreman::testing {

class FakeRemoteValues : public internal::RemoteValues {
 public:
  // FailNext(kRead) fails Read and ReadForStep alike (both are reads);
  // calls() counts them apart.
  enum Method { kBind, kRead, kReadConsistent, kWrite, kApply, kReadForStep, kMethods };

  FakeRemoteValues(int num_ps, nn::OptimizerOptions optimizer)
      : optimizer_(optimizer), shards_(static_cast<std::size_t>(num_ps)), device_(1) {
    for (auto& shard : shards_) shard = std::make_unique<Shard>();
  }

  // -- RemoteValues ------------------------------------------------------------

  Status Bind(const std::vector<std::string>& names) override {
    std::lock_guard<std::mutex> l(mu_);
    ++calls_[kBind];
    FOREMAN_RETURN_IF_ERROR(TakeFailureLocked(kBind));
    if (bound_) {
      for (std::size_t i = 0; i < std::max(names.size(), names_.size()); ++i) {
        const std::string given = i < names.size() ? names[i] : "(none)";
        const std::string had = i < names_.size() ? names_[i] : "(none)";
        if (given != had) {
          return absl::InvalidArgumentError(absl::StrCat("fake ps: bound variable ", i, " is '", given,
                                                         "', another session bound '", had, "'"));
        }
      }
      return absl::OkStatus();
    }
    FOREMAN_ASSIGN_OR_RETURN(placement_, PlaceVariablesOnPs(names, static_cast<int>(shards_.size())));
    names_ = names;
    bound_ = true;
    cv_.notify_all();
    return absl::OkStatus();
  }

  Status Read(VariableStore& mirror) override { return ReadShards(kRead, mirror); }

  // Read less the optimizer slots (cluster/remote_values.hpp).
  Status ReadForStep(VariableStore& mirror) override { return ReadShards(kReadForStep, mirror); }

  StatusOr<std::vector<TaskState>> TaskStates() override {
    std::vector<TaskState> out;
    for (std::size_t s = 0; s < shards_.size(); ++s) {
      Shard& shard = *shards_[s];
      std::lock_guard<std::mutex> l(shard.mu);
      TaskState& task = out.emplace_back();
      task.where = absl::StrCat("fake ps ", s);
      task.job_id = shard.job_id;
      task.same_job = shard.job_id == "fake";
      task.initialized = shard.initialized;
      task.trained = shard.trained;
      if (shard.initialized && shard.vars.Contains("global_step")) {
        StatusOr<const Tensor*> step = static_cast<const VariableStore&>(shard.vars).Get("global_step");
        if (step.ok()) task.global_step = *(*step)->data<int64_t>();
      }
    }
    return out;
  }

  Status ReadShards(Method method, VariableStore& mirror) {
    FOREMAN_RETURN_IF_ERROR(Enter(method));
    bool uninitialized = false;
    for (std::size_t s = 0; s < shards_.size(); ++s) {
      Shard& shard = *shards_[s];
      std::lock_guard<std::mutex> l(shard.mu);
      if (!shard.initialized) uninitialized = true;
      FOREMAN_RETURN_IF_ERROR(CopyShardLocked(static_cast<int>(s), shard, mirror, method == kReadForStep));
    }
    if (uninitialized) {
      std::lock_guard<std::mutex> l(mu_);
      ++uninitialized_reads_;
      cv_.notify_all();
    }
    return absl::OkStatus();
  }

  Status ReadConsistent(VariableStore& mirror) override {
    FOREMAN_RETURN_IF_ERROR(Enter(kReadConsistent));
    auto locks = LockAll();
    for (std::size_t s = 0; s < shards_.size(); ++s) {
      if (!shards_[s]->initialized) {
        return absl::FailedPreconditionError(absl::StrCat("fake ps ", s, " is not initialized"));
      }
    }
    for (std::size_t s = 0; s < shards_.size(); ++s) {
      FOREMAN_RETURN_IF_ERROR(CopyShardLocked(static_cast<int>(s), *shards_[s], mirror));
    }
    return absl::OkStatus();
  }

  // As a ps task: an init op (kInit) on a shard that holds training
  // (restored, or updated since its init op) is refused.
  Status Write(const VariableStore& mirror, WriteKind kind) override {
    FOREMAN_RETURN_IF_ERROR(Enter(kWrite));
    for (const std::string& name : names_) {
      if (!mirror.Contains(name)) {
        return absl::FailedPreconditionError(absl::StrCat("fake ps: Write without bound variable '", name, "'"));
      }
    }
    auto locks = LockAll();
    for (std::size_t s = 0; s < shards_.size(); ++s) {
      if (kind == WriteKind::kInit && shards_[s]->initialized && shards_[s]->trained) {
        return absl::FailedPreconditionError(absl::StrCat("fake ps ", s, " holds training: refused an init op"));
      }
    }
    for (std::size_t i = 0; i < names_.size(); ++i) {
      Shard& shard = *shards_[static_cast<std::size_t>(placement_[i])];
      const std::string& name = names_[i];
      FOREMAN_ASSIGN_OR_RETURN(const Tensor* value, mirror.Get(name));
      FOREMAN_ASSIGN_OR_RETURN(bool trainable, mirror.IsTrainable(name));
      if (shard.vars.Contains(name)) FOREMAN_RETURN_IF_ERROR(shard.vars.Delete(name));
      FOREMAN_RETURN_IF_ERROR(shard.vars.Create(name, *value, trainable));
    }
    for (auto& shard : shards_) {
      shard->initialized = true;
      shard->trained = kind == WriteKind::kRestore;
    }
    RecordLocked();
    return absl::OkStatus();
  }

  StatusOr<int64_t> Apply(const nn::Gradients& grads, int64_t computed_at_step) override {
    FOREMAN_RETURN_IF_ERROR(Enter(kApply));
    {
      std::lock_guard<std::mutex> l(mu_);
      if (ended_) return absl::OutOfRangeError("fake ps: training has ended (EndTraining)");
      applied_at_.push_back(computed_at_step);
    }
    // Atomic over all shards (a consistent read sees whole updates only, so
    // a checkpoint can be compared with history()).
    auto locks = LockAll();
    for (std::size_t s = 0; s < shards_.size(); ++s) {
      if (!shards_[s]->initialized) {
        return absl::FailedPreconditionError(absl::StrCat("fake ps ", s, " is not initialized"));
      }
    }
    for (std::size_t s = 0; s < shards_.size(); ++s) {
      Shard& shard = *shards_[s];
      nn::Gradients share;
      share.learning_rate = grads.learning_rate;
      share.adam_step_size = grads.adam_step_size;
      for (const auto& gv : grads.grads_and_vars) {
        if (shard.vars.Contains(gv.variable)) share.grads_and_vars.push_back(gv);
      }
      FOREMAN_RETURN_IF_ERROR(nn::ApplyGradients(optimizer_, shard.vars, share, device_));
      shard.trained = true;
    }
    int64_t step = 0;
    if (shards_[0]->vars.Contains(kGlobalStepName)) {
      FOREMAN_ASSIGN_OR_RETURN(step, IncrementGlobalStep(shards_[0]->vars));
    }
    RecordLocked();
    return step;
  }

  PsWait ps_wait() const override {
    std::lock_guard<std::mutex> l(mu_);
    return ps_wait_;
  }

  // -- the test's controls -------------------------------------------------------

  /// What ps_wait() answers (default: no wait). Set before the first session.
  void SetPsWait(PsWait wait) {
    std::lock_guard<std::mutex> l(mu_);
    ps_wait_ = wait;
  }
  /// Every shard loses its variables and is uninitialized (a restarted ps
  /// process); training may go on (EndTraining is undone).
  void Restart() {
    auto locks = LockAll();
    for (auto& shard : shards_) {
      for (const std::string& name : shard->vars.Names()) (void)shard->vars.Delete(name);
      shard->initialized = false;
      shard->trained = false;
    }
    std::lock_guard<std::mutex> l(mu_);
    ended_ = false;
  }

  /// Later applies are OUT_OF_RANGE (Server::EndTraining); reads still work.
  void EndTraining() {
    std::lock_guard<std::mutex> l(mu_);
    ended_ = true;
  }
  /// Shard `s` restarted (a ps task killed and started again): it holds
  /// nothing and is uninitialized until the next Write.
  void Restart(int s) {
    Shard& shard = *shards_.at(static_cast<std::size_t>(s));
    std::lock_guard<std::mutex> l(shard.mu);
    for (const std::string& name : shard.vars.Names()) REQUIRE(shard.vars.Delete(name).ok());
    shard.initialized = false;
    shard.trained = false;
  }
  /// Shard `s` reports cluster job `job_id` in TaskStates (this process's
  /// job is "fake"): a ps task of another job.
  void SetJobId(int s, std::string job_id) {
    Shard& shard = *shards_.at(static_cast<std::size_t>(s));
    std::lock_guard<std::mutex> l(shard.mu);
    shard.job_id = std::move(job_id);
  }
  /// The next `count` calls of `method` return `status` (before touching
  /// anything).
  void FailNext(Method method, Status status, int count = 1) {
    std::lock_guard<std::mutex> l(mu_);
    failures_[method] = {std::move(status), count};
  }
  int calls(Method method) const {
    std::lock_guard<std::mutex> l(mu_);
    return calls_[method];
  }
  std::vector<std::string> bound_names() const {
    std::lock_guard<std::mutex> l(mu_);
    return names_;
  }
  std::vector<int> placement() const {
    std::lock_guard<std::mutex> l(mu_);
    return placement_;
  }
  /// The computed_at_step of every Apply, in arrival order.
  std::vector<int64_t> applied_at() const {
    std::lock_guard<std::mutex> l(mu_);
    return applied_at_;
  }
  /// Waits (real time, bounded) until a Read found an uninitialized shard.
  bool AwaitUninitializedRead(absl::Duration timeout) {
    std::unique_lock<std::mutex> l(mu_);
    return cv_.wait_for(l, absl::ToChronoNanoseconds(timeout), [this] { return uninitialized_reads_ > 0; });
  }
  /// The remote value of `name` now (a copy).
  StatusOr<Tensor> Value(const std::string& name) {
    auto locks = LockAll();
    for (auto& shard : shards_) {
      if (shard->vars.Contains(name)) {
        FOREMAN_ASSIGN_OR_RETURN(const Tensor* value, std::as_const(shard->vars).Get(name));
        return *value;
      }
    }
    return absl::NotFoundError(absl::StrCat("fake ps: no variable '", name, "'"));
  }
  /// Which shard holds `name` (-1: none).
  int ShardOf(const std::string& name) {
    auto locks = LockAll();
    for (std::size_t s = 0; s < shards_.size(); ++s) {
      if (shards_[s]->vars.Contains(name)) return static_cast<int>(s);
    }
    return -1;
  }
  /// Every variable's value after each Write or Apply, keyed by the
  /// global_step it left (a later state of the same step replaces it).
  std::map<int64_t, std::map<std::string, Tensor>> history() {
    auto locks = LockAll();
    return history_;
  }

 private:
  struct Shard {
    std::mutex mu;
    VariableStore vars;
    bool initialized = false;
    bool trained = false;  // restored, or updated since its init op
    std::string job_id = "fake";  // TaskStates' (SetJobId)
  };
  struct Failure {
    Status status;
    int count = 0;
  };

  Status TakeFailureLocked(Method method) {
    Failure& f = failures_[method];
    if (f.count == 0) return absl::OkStatus();
    --f.count;
    return f.status;
  }
  // Counts the call and returns an injected failure; FAILED_PRECONDITION
  // before Bind.
  Status Enter(Method method) {
    std::lock_guard<std::mutex> l(mu_);
    ++calls_[method];
    FOREMAN_RETURN_IF_ERROR(TakeFailureLocked(method));
    if (method == kReadForStep) FOREMAN_RETURN_IF_ERROR(TakeFailureLocked(kRead));
    if (!bound_) return absl::FailedPreconditionError("fake ps: used before Bind");
    return absl::OkStatus();
  }
  std::vector<std::unique_lock<std::mutex>> LockAll() {
    std::vector<std::unique_lock<std::mutex>> locks;
    for (auto& shard : shards_) locks.emplace_back(shard->mu);  // in index order
    return locks;
  }
  // Shard `s`'s bound variables into `mirror`: its values when initialized,
  // else erased (skip_slots: an initialized shard's optimizer slots are
  // left as they are). Reuses the mirror's tensor when dtype and shape match.
  Status CopyShardLocked(int s, Shard& shard, VariableStore& mirror, bool skip_slots = false) {
    for (std::size_t i = 0; i < names_.size(); ++i) {
      if (placement_[i] != s) continue;
      const std::string& name = names_[i];
      if (!shard.initialized || !shard.vars.Contains(name)) {
        if (mirror.Contains(name)) FOREMAN_RETURN_IF_ERROR(mirror.Delete(name));
        continue;
      }
      if (skip_slots && nn::internal::IsSlotName(name)) continue;
      FOREMAN_ASSIGN_OR_RETURN(const Tensor* value, std::as_const(shard.vars).Get(name));
      if (mirror.Contains(name)) {
        FOREMAN_ASSIGN_OR_RETURN(Tensor * held, mirror.Get(name));
        if (held->dtype() == value->dtype() && held->shape() == value->shape()) {
          *held = *value;
          continue;
        }
        FOREMAN_RETURN_IF_ERROR(mirror.Delete(name));
      }
      FOREMAN_ASSIGN_OR_RETURN(bool trainable, shard.vars.IsTrainable(name));
      FOREMAN_RETURN_IF_ERROR(mirror.Create(name, *value, trainable));
    }
    return absl::OkStatus();
  }
  // With every shard locked.
  void RecordLocked() {
    std::map<std::string, Tensor> state;
    int64_t step = 0;
    for (auto& shard : shards_) {
      for (auto& [name, value] : shard->vars.Snapshot()) state.emplace(name, std::move(value));
    }
    if (auto it = state.find(kGlobalStepName); it != state.end()) step = it->second.scalar<int64_t>().value();
    history_[step] = std::move(state);
  }

  const nn::OptimizerOptions optimizer_;
  mutable std::mutex mu_;  // everything below but the shards and history_
  std::condition_variable cv_;
  bool bound_ = false;
  std::vector<std::string> names_;
  std::vector<int> placement_;
  bool ended_ = false;
  PsWait ps_wait_;
  int calls_[kMethods] = {};
  Failure failures_[kMethods];
  int uninitialized_reads_ = 0;
  std::vector<int64_t> applied_at_;
  std::vector<std::unique_ptr<Shard>> shards_;
  std::map<int64_t, std::map<std::string, Tensor>> history_;  // under every shard's mutex
  compute::CpuDevice device_;  // one intra-op thread
};

/// A fake cluster registered for this object's lifetime: sessions on
/// target("chief") / target("worker1") share its shards, each task with its
/// own mirror. The "fakeps://" scheme is registered once per process.
class FakeCluster {
 public:
  FakeCluster(std::string name, int num_ps, nn::OptimizerOptions optimizer)
      : name_(std::move(name)), remote_(std::make_shared<FakeRemoteValues>(num_ps, optimizer)) {
    RegisterScheme();
    std::lock_guard<std::mutex> l(Registry().mu);
    REQUIRE_MESSAGE(Registry().clusters.count(name_) == 0, "fake cluster ", name_, " exists");
    Registry().clusters[name_] = this;
  }
  ~FakeCluster() {
    std::lock_guard<std::mutex> l(Registry().mu);
    Registry().clusters.erase(name_);
  }
  FakeCluster(const FakeCluster&) = delete;
  FakeCluster& operator=(const FakeCluster&) = delete;

  std::string target(const std::string& task) const { return "fakeps://" + name_ + "/" + task; }
  FakeRemoteValues& ps() { return *remote_; }

 private:
  struct Clusters {
    std::mutex mu;
    std::map<std::string, FakeCluster*> clusters;
  };
  static Clusters& Registry() {
    static Clusters* const clusters = new Clusters();  // never destroyed
    return *clusters;
  }
  static void RegisterScheme() {
    static const Status registered = internal::RegisterSessionTarget(
        "fakeps://", "\"fakeps://CLUSTER/TASK\"",
        [](const std::string& target) -> StatusOr<std::shared_ptr<internal::SessionValues>> {
          const std::string rest = target.substr(std::string("fakeps://").size());
          const std::size_t slash = rest.find('/');
          if (slash == std::string::npos || slash == 0 || slash + 1 == rest.size()) {
            return absl::InvalidArgumentError("fake target '" + target + "' is not \"fakeps://CLUSTER/TASK\"");
          }
          std::lock_guard<std::mutex> l(Registry().mu);
          auto it = Registry().clusters.find(rest.substr(0, slash));
          if (it == Registry().clusters.end()) return absl::UnavailableError("no fake cluster for '" + target + "'");
          FakeCluster& cluster = *it->second;
          std::shared_ptr<internal::SessionValues>& values = cluster.tasks_[rest.substr(slash + 1)];
          if (values == nullptr) {
            values = std::make_shared<internal::SessionValues>();
            values->remote = cluster.remote_;
          }
          return values;
        });
    REQUIRE_MESSAGE(registered.ok(), registered.ToString());
  }

  const std::string name_;
  std::shared_ptr<FakeRemoteValues> remote_;
  std::map<std::string, std::shared_ptr<internal::SessionValues>> tasks_;  // under Registry().mu
};

}  // namespace foreman::testing
