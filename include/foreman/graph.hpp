// Graph: what a model is made of, before any session holds values for it.
// (TF: tf.Graph with its GLOBAL_VARIABLES / LOCAL_VARIABLES / GLOBAL_STEP
// collections, and the ops a session.run() can fetch.)
//
// Foreman has no op graph. A Graph declares the model's variables (name,
// initial value, trainable) and holds the step function, which computes
// whatever fetch names it is asked for. A Session (session.hpp) holds the
// values: a new session's variables are *uninitialized* until the init op
// (Scaffold) assigns their initial values or a checkpoint restores them.
//
//   ```cpp
//   #include "foreman/graph.hpp"
//   #include "foreman/session.hpp"  // StepContext
//   // Minimises loss = w² by gradient descent (learning rate 0.1).
//   auto graph = std::make_shared<foreman::Graph>();
//   FOREMAN_RETURN_IF_ERROR(graph->CreateGlobalStep());
//   FOREMAN_RETURN_IF_ERROR(graph->AddVariable("w", foreman::Tensor::Scalar<float>(5.0f)));
//   FOREMAN_RETURN_IF_ERROR(graph->AddFetch("loss"));  // optional: then a misspelt fetch
//                                                      // fails before the step runs
//   FOREMAN_RETURN_IF_ERROR(graph->SetStep([](foreman::StepContext& ctx) -> foreman::Status {
//     FOREMAN_ASSIGN_OR_RETURN(foreman::Tensor * w, ctx.variables().Get("w"));
//     float& value = w->data<float>()[0];
//     if (ctx.requested("loss")) ctx.Set("loss", foreman::Tensor::Scalar<float>(value * value));
//     if (ctx.requested("train_op")) {  // the Session answers the fetch itself
//       value -= 0.1f * 2 * value;
//       FOREMAN_RETURN_IF_ERROR(foreman::IncrementGlobalStep(ctx.variables()).status());
//     }
//     return foreman::Status();
//   }));
//   ```
//
// This step updates its variables itself, which only a local or inproc://
// session allows. On a cluster target (tcp://, tls://) a step computes
// gradients and calls StepContext::ApplyGradients (nn.hpp's Mlp, the ps
// tasks apply them); a cluster run that changes variables() in place fails
// with FAILED_PRECONDITION naming the variable (session.hpp).
//
// A graph is built on one thread; Finalize() (called by every session
// creation, as TF's sessions finalize theirs) makes it read-only, after which
// it may be shared by any number of sessions and threads. Share it by
// std::shared_ptr.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "foreman/status.hpp"
#include "foreman/tensor.hpp"

namespace foreman {

class StepContext;
/// The step function: reads ctx.feeds(), reads and updates ctx.variables(),
/// answers the fetches in ctx.requested() it knows (a fetch it does not
/// answer comes back NOT_FOUND naming it). Increments global_step itself when
/// it applies an update (TF: optimizer.minimize(global_step=...)).
/// OUT_OF_RANGE ends training cleanly (end of input); ABORTED / UNAVAILABLE
/// trigger recovery in a MonitoredSession; anything else stops training.
/// Exceptions it throws become a Status (status.hpp).
using StepFn = std::function<Status(StepContext& ctx)>;

/// Builds a variable's initial value (TF: the initializer of a Variable).
/// Called by the init op once per session that initializes the variable.
using Initializer = std::function<StatusOr<Tensor>()>;

struct VariableDef {
  std::string name;
  Initializer initializer;
  bool trainable = true;
  /// TF's LOCAL_VARIABLES: initialized by the local init op in *every*
  /// session (also after a restore, and in workers), never checkpointed.
  bool local = false;
  /// TF: the variable's device. "" (the default): in a cluster,
  /// replica_device_setter's placement puts it on a ps task, shared by every
  /// worker. "/job:worker": each worker keeps its own copy (a worker's input
  /// position); the chief's is what its checkpoints carry. In a cluster such
  /// a variable is initialized by the chief's init op or restore (the
  /// chief's copy) and, in a task whose copy holds no value yet, by the
  /// default local init op (DefaultLocalInitOp: a worker never runs the init
  /// op); the default ready_for_local_init_op does not wait for it. Ignored
  /// outside a cluster. Set with Graph::SetVariableDevice.
  std::string device;
};

class Graph {
 public:
  Graph() = default;
  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;

  /// Declares a global variable whose initial value is `initial_value`.
  ///   INVALID_ARGUMENT  malformed name (VariableStore::ValidateName) or a
  ///                     kInvalid tensor
  ///   ALREADY_EXISTS    the name is declared
  ///   FAILED_PRECONDITION "Graph is finalized and cannot be modified." (TF's message)
  Status AddVariable(const std::string& name, Tensor initial_value, bool trainable = true);
  /// Same, with an initializer run when a session initializes it (e.g. a
  /// seeded random draw).
  Status AddVariable(const std::string& name, Initializer initializer, bool trainable = true);
  /// Declares a local variable (VariableDef::local); errors as AddVariable.
  Status AddLocalVariable(const std::string& name, Tensor initial_value);

  /// Sets VariableDef::device of the declared variable `name`: "" or
  /// "/job:worker" (anything else INVALID_ARGUMENT naming it); NOT_FOUND for
  /// an undeclared name; FAILED_PRECONDITION when finalized.
  Status SetVariableDevice(const std::string& name, const std::string& device);

  /// Declares `global_step`, an int64 scalar, non-trainable, initial 0 (TF:
  /// create_global_step).
  /// ALREADY_EXISTS "global_step already exists."; FAILED_PRECONDITION when
  /// finalized.
  Status CreateGlobalStep();
  /// Whether a global variable named `global_step` is declared (its
  /// dtype is checked when read: GetGlobalStep).
  bool has_global_step() const;

  /// Sets the step function (FAILED_PRECONDITION when finalized).
  Status SetStep(StepFn step);
  const StepFn& step() const { return step_; }

  /// TF's SUMMARIES collection: a fetch name the step answers with a
  /// serialized Summary (a kString scalar). The default Scaffold's summary_op
  /// merges them (TF: merge_all); none means no summary op.
  /// FAILED_PRECONDITION when finalized; duplicates are ignored.
  Status AddSummaryOp(const std::string& fetch);
  const std::vector<std::string>& summary_ops() const { return summary_ops_; }

  /// Declares a fetch name the step function answers (TF: a tensor or op of
  /// the graph that session.run() may fetch). Once a graph declares at least
  /// one, Session::Run checks every requested fetch *before* the step runs
  /// and answers NOT_FOUND, with nothing changed, for one that is none of:
  /// declared here, a summary op, a variable, "global_step" or "train_op".
  /// A graph that declares none is not checked up front: a fetch the step
  /// does not produce is NOT_FOUND after the step has run.
  /// INVALID_ARGUMENT for an empty name; FAILED_PRECONDITION when finalized;
  /// duplicates are ignored.
  Status AddFetch(const std::string& fetch);
  /// The declared fetches, in declaration order.
  const std::vector<std::string>& fetches() const { return fetches_; }

  /// Every declared variable, in declaration order.
  const std::vector<VariableDef>& variables() const { return variables_; }
  /// Names of the global (checkpointed) variables, sorted.
  std::vector<std::string> GlobalVariableNames() const;
  /// Names of the local variables, sorted.
  std::vector<std::string> LocalVariableNames() const;

  /// Makes the graph read-only (idempotent). Thread-safe.
  void Finalize();
  bool finalized() const;
  /// Undoes Finalize(); a MonitoredSession calls it at close() when the
  /// graph was not finalized before the session was created.
  void Unfinalize();

 private:
  std::vector<VariableDef> variables_;
  std::vector<std::string> summary_ops_;
  std::vector<std::string> fetches_;
  StepFn step_;
  std::atomic<bool> finalized_{false};
};

}  // namespace foreman
