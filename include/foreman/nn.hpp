// A multilayer perceptron and TF1's optimizers, for `foreman train`.
// (TF: tf.layers.dense with ReLU, tf.losses.sparse_softmax_cross_entropy,
// tf.train.GradientDescentOptimizer / MomentumOptimizer / AdamOptimizer.)
//
// The model's state lives in a VariableStore under TF1's variable names, so a
// Foreman checkpoint of an MLP has the keys a TF1 program of the same model
// writes. An Mlp holds only scratch memory (its workspace): any store holding
// the variables AddMlpVariables declared can be trained by it. In a cluster,
// Mlp::ComputeGradients (a worker) and ApplyGradients (each parameter server,
// on the variables it holds) split TrainStep in two, with bitwise its results.
//
//   ```cpp
//   #include "foreman/nn.hpp"
//   #include "foreman/session.hpp"          // Session, StepContext
//   #include "foreman/session_manager.hpp"  // DefaultInitOp
//   foreman::nn::MlpSpec spec{4, {8}, 3};                          // 4 inputs, 8 hidden, 3 classes
//   foreman::nn::OptimizerOptions adam;                            // TF1's defaults
//   adam.kind = foreman::nn::OptimizerKind::kAdam;
//   auto model = std::make_shared<foreman::Graph>();
//   FOREMAN_RETURN_IF_ERROR(model->CreateGlobalStep());
//   FOREMAN_RETURN_IF_ERROR(foreman::nn::AddMlpVariables(*model, spec, adam, /*seed=*/42));
//   FOREMAN_ASSIGN_OR_RETURN(std::shared_ptr<foreman::nn::Mlp> mlp, foreman::nn::Mlp::Create(spec, adam));
//   FOREMAN_RETURN_IF_ERROR(model->SetStep([mlp](foreman::StepContext& ctx) -> foreman::Status {
//     const foreman::Tensor* features = ctx.feed("features");  // float32 [B, 4]
//     const foreman::Tensor* labels = ctx.feed("labels");      // int32 [B]
//     if (features == nullptr || labels == nullptr) return absl::InvalidArgumentError("feed features and labels");
//     FOREMAN_ASSIGN_OR_RETURN(foreman::nn::StepResult r,
//                              mlp->TrainStep(ctx.variables(), *features, *labels, ctx.compute()));
//     ctx.Set("loss", foreman::Tensor::Scalar<float>(r.loss));
//     return foreman::IncrementGlobalStep(ctx.variables()).status();
//   }));
//   FOREMAN_ASSIGN_OR_RETURN(auto sess, foreman::Session::Create(model));
//   FOREMAN_RETURN_IF_ERROR(foreman::DefaultInitOp()(*sess, {}));
//   foreman::TensorMap batch = {{"features", foreman::Tensor(foreman::DataType::kFloat, {2, 4})},
//                               {"labels", foreman::Tensor(foreman::DataType::kInt32, {2})}};
//   FOREMAN_RETURN_IF_ERROR(sess->Run({"train_op", "loss"}, batch).status());
//   ```
//
// The step runs through a compute::Device (compute.hpp), the session's
// (StepContext::compute()). Numerics are float32
// throughout. For a given seed, device and thread count a run is bitwise
// reproducible; a different thread count may change the rounding of the
// matrix products.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "foreman/compute.hpp"
#include "foreman/graph.hpp"
#include "foreman/optimizer.hpp"
#include "foreman/status.hpp"
#include "foreman/tensor.hpp"
#include "foreman/variable_store.hpp"

namespace foreman::nn {

/// The layers: input_dim -> hidden[0] -> ... -> hidden[n-1] -> num_classes.
/// Hidden layers are dense + ReLU; the last layer is dense, giving logits.
struct MlpSpec {
  int64_t input_dim = 784;
  std::vector<int64_t> hidden;   // empty = softmax regression
  int64_t num_classes = 10;
};

enum class OptimizerKind { kSgd, kMomentum, kAdam };

/// "sgd" | "momentum" | "adam"; INVALID_ARGUMENT "unknown optimizer 'x'
/// (choices: sgd, momentum, adam)" otherwise.
StatusOr<OptimizerKind> ParseOptimizerKind(const std::string& name);
/// The name ParseOptimizerKind accepts.
std::string OptimizerKindName(OptimizerKind kind);

/// TF1: GradientDescentOptimizer(learning_rate), MomentumOptimizer(
/// learning_rate, momentum, use_nesterov), AdamOptimizer(learning_rate,
/// beta1, beta2, epsilon), with their defaults (momentum has no TF default;
/// 0.9 is the usual choice). Fields of other kinds are ignored.
struct OptimizerOptions {
  OptimizerKind kind = OptimizerKind::kAdam;
  float learning_rate = 0.001f;
  float momentum = 0.9f;
  bool use_nesterov = false;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float epsilon = 1e-8f;
};

/// INVALID_ARGUMENT naming the field: learning_rate <= 0 or not finite,
/// momentum < 0 (kMomentum), beta1/beta2 outside [0, 1) or epsilon <= 0 (kAdam).
Status ValidateOptimizerOptions(const OptimizerOptions& optimizer);

/// INVALID_ARGUMENT naming the field for a dim < 1.
Status ValidateMlpSpec(const MlpSpec& spec);

/// Variable names of TF1's tf.layers.dense: layer 0 is "dense", layer i > 0
/// "dense_<i>"; "<layer>/kernel" float32 [in, out] (glorot_uniform, TF's
/// default kernel initializer) and "<layer>/bias" float32 [out], zeros.
/// Optimizer variables under TF1's names: MomentumOptimizer's slot
/// "<var>/Momentum"; AdamOptimizer's slots "<var>/Adam" (m) and
/// "<var>/Adam_1" (v) and its non-slot float32 scalars "beta1_power" and
/// "beta2_power" (initially beta1 and beta2, multiplied by them after each
/// update); GradientDescentOptimizer none. Slots are float32 zeros shaped as
/// their variable. Only kernels and biases are trainable.
///
/// Every variable AddMlpVariables declares, sorted bytewise (the order of a
/// checkpoint's keys).
std::vector<std::string> MlpVariableNames(const MlpSpec& spec, const OptimizerOptions& optimizer);

/// Declares the variables above on `graph` (Graph::AddVariable). Kernels are
/// drawn from U[-limit, limit), limit = sqrt(6 / (in + out)) (TF's
/// glorot_uniform), by a portable generator (splitmix64, 24-bit floats) keyed
/// by `seed` and the layer: the same seed gives bitwise the same initial
/// weights with every compiler and standard library; layers draw from
/// independent streams. Errors: INVALID_ARGUMENT for a bad spec or optimizer
/// (Validate* above); Graph's ALREADY_EXISTS for a name already declared,
/// FAILED_PRECONDITION when the graph is finalized (nothing is declared then;
/// after ALREADY_EXISTS the variables before the clash stay declared).
Status AddMlpVariables(Graph& graph, const MlpSpec& spec, const OptimizerOptions& optimizer, uint64_t seed);

/// The initial kernel of dense layer `layer` (0-based, input layer first),
/// float32 [fan_in, fan_out]: what AddMlpVariables's initializer returns.
/// INVALID_ARGUMENT for dims < 1.
StatusOr<Tensor> GlorotUniformKernel(int64_t fan_in, int64_t fan_out, uint64_t seed, int layer);

struct StepResult {
  float loss = 0;       // mean softmax cross-entropy over the rows, before the update
  float accuracy = 0;   // fraction of rows whose argmax (first maximum) == label
};

/// A step's gradients (optimizer.hpp): filled by Mlp::ComputeGradients,
/// applied by ApplyGradients (or Tf1Optimizer through
/// StepContext::ApplyGradients).
using Gradients = foreman::Gradients;

/// Labelled examples held in a device's memory, copied there once (the
/// training data of a GPU session; TF: a dataset cached on the device), for
/// steps that gather their batches on the device (Mlp::TrainStep by
/// indices). Features stay uint8 and are converted when gathered, exactly as
/// data::Dataset converts them (pixel / 255.0f). Immutable after Upload;
/// its methods are thread-safe; not copyable.
class DeviceExamples {
 public:
  /// Copies `images` uint8 [N, d1, ...] (feature_dim = d1 * ...; rank >= 2)
  /// and `labels` uint8 [N] to `device` (not owned). N >= 1. The copies are
  /// freed with this object, or by the device if it is destroyed first
  /// (compute::Device::lifetime); then they must not be used any more
  /// (a step on them fails: examples of another device).
  ///   INVALID_ARGUMENT    other dtypes or shapes, N = 0 or N > 2^31 - 1
  ///   RESOURCE_EXHAUSTED  the device's memory ran out (naming it and the size)
  ///   the device's INTERNAL
  static StatusOr<std::unique_ptr<DeviceExamples>> Upload(const Tensor& images, const Tensor& labels,
                                                          compute::Device& device);
  ~DeviceExamples();
  DeviceExamples(const DeviceExamples&) = delete;
  DeviceExamples& operator=(const DeviceExamples&) = delete;

  int64_t num_examples() const { return num_examples_; }
  int64_t feature_dim() const { return feature_dim_; }
  compute::Device& device() const { return *device_; }
  /// Whether the device holding the copies still exists.
  bool device_alive() const { return !device_lifetime_.expired(); }
  /// Device memory: uint8 [num_examples, feature_dim] and uint8 [num_examples].
  const uint8_t* images() const { return images_; }
  const uint8_t* labels() const { return labels_; }

 private:
  DeviceExamples(compute::Device* device, int64_t num_examples, int64_t feature_dim, uint8_t* images,
                 uint8_t* labels, std::vector<uint8_t> host_labels);
  friend class Mlp;  // checks a batch's labels against host_labels_
  compute::Device* device_;
  std::weak_ptr<const void> device_lifetime_;  // a destroyed device freed the copies itself
  int64_t num_examples_;
  int64_t feature_dim_;
  uint8_t* images_;
  uint8_t* labels_;
  std::vector<uint8_t> host_labels_;  // the labels, kept on the host too for the range checks
};

/// Trains and evaluates an MLP on variables in a VariableStore. Holds the
/// workspace (grown to the largest batch seen, then reused: no allocation
/// per step). Not thread-safe: one per training thread.
///
/// On a device without host memory (a GPU), and for the steps on
/// DeviceExamples on any device, the workspace is that device's memory
/// (Device::Allocate) and the captured steps are that device's. The Mlp
/// frees them in ReleaseDevice(), in its destructor, or when it is next used
/// with another device for such a step. It may outlive that device (a
/// graph's step kept across sessions): a destroyed device freed its memory
/// itself (compute::Device::lifetime), and the next step allocates anew.
/// Such a device runs TrainStep, Evaluate and the steps on DeviceExamples;
/// ComputeGradients and ApplyGradients (a cluster's split step) run on a
/// host-memory device only: FAILED_PRECONDITION naming the device otherwise.
class Mlp {
 public:
  /// INVALID_ARGUMENT for a bad spec or optimizer (ValidateMlpSpec,
  /// ValidateOptimizerOptions).
  static StatusOr<std::unique_ptr<Mlp>> Create(MlpSpec spec, OptimizerOptions optimizer);
  ~Mlp();
  Mlp(const Mlp&) = delete;
  Mlp& operator=(const Mlp&) = delete;

  /// One step of training, in place on `vars`: forward, backward (TF's
  /// sparse_softmax_cross_entropy_with_logits, log-sum-exp shifted, mean over
  /// the batch), then one update of the optimizer:
  ///   SGD      var -= lr * g                               (apply_gradient_descent)
  ///   Momentum accum = accum * momentum + g; var -= lr * accum;
  ///            nesterov: var -= g * lr + accum * momentum * lr   (apply_momentum)
  ///   Adam     lr_t = lr * sqrt(1 - beta2_power) / (1 - beta1_power);
  ///            m += (g - m) * (1 - beta1); v += (g² - v) * (1 - beta2);
  ///            var -= m * lr_t / (sqrt(v) + epsilon);      (apply_adam)
  ///            then beta1_power *= beta1, beta2_power *= beta2 (AdamOptimizer._finish)
  /// `features` float32 [B, input_dim], B >= 1; `labels` int32 or int64 [B]
  /// in [0, num_classes). Does not touch global_step. A NaN or Inf loss is
  /// returned as a value (NanTensorHook decides), the update still applied.
  /// Errors (nothing is updated):
  ///   NOT_FOUND         a variable of MlpVariableNames is missing (named)
  ///   INVALID_ARGUMENT  a variable with the wrong dtype or shape (named);
  ///                     features or labels with the wrong dtype or shape;
  ///                     "labels[i] = v is out of range [0, C)"
  ///   the device's own errors (compute.hpp)
  /// On the CPU the device's operations run on the Tensors in place. On a
  /// device without host memory (a GPU) the variables are used where the
  /// store keeps them on that device (VariableStore::DeviceData), the batch
  /// is copied there, and the loss and accuracy are copied back (the one
  /// wait for the device per step).
  StatusOr<StepResult> TrainStep(VariableStore& vars, const Tensor& features, const Tensor& labels,
                                 compute::Device& device);
  /// One step on the batch gathered on the device from `examples` (on
  /// examples.device(), which must be `device`): rows = `rows` examples whose
  /// indices are `indices` (host int32 [rows], each in [0, N), checked).
  /// Bitwise the same as TrainStep on the Tensors data::Dataset gathers for
  /// those indices, on the same device. On a device that supports_capture()
  /// the step's operations are captured once per batch size (and variable
  /// addresses) and replayed (a CUDA graph): the per-step values (indices,
  /// learning rate) are written to page-locked memory, which the replay
  /// copies to the device first; its last operation copies the loss and
  /// accuracy back, and the call waits for them (LaunchTrainStep, then
  /// FinishTrainStep). Errors as TrainStep ("labels[r] = v
  /// is outside ..." for row r's example), and INVALID_ARGUMENT for rows < 1,
  /// a null `indices`, "indices[r] = v is outside the examples' range
  /// [0, N)", or examples of another device or feature dimension.
  StatusOr<StepResult> TrainStep(VariableStore& vars, const DeviceExamples& examples, const int32_t* indices,
                                 int64_t rows, compute::Device& device);

  /// The TrainStep above in two halves, so that an asynchronous device
  /// (Device::asynchronous(): CUDA) computes a step while the host does
  /// other work (the session's hooks, the next run's bookkeeping).
  /// LaunchTrainStep checks everything TrainStep checks (same errors, and
  /// nothing is queued after one), writes the learning rate and `indices`
  /// into a page-locked buffer of this Mlp, and queues the step: one replay
  /// of the captured step (which copies that buffer to the device first and
  /// the statistics into a second page-locked buffer last), or the same
  /// operations eagerly on a device that cannot capture; then it returns
  /// without waiting. `indices` may be reused on return. FAILED_PRECONDITION
  /// when a step launched before on `device` was not finished: the two
  /// buffers hold one step's values at a time.
  Status LaunchTrainStep(VariableStore& vars, const DeviceExamples& examples, const int32_t* indices, int64_t rows,
                         compute::Device& device);
  /// Waits for the step LaunchTrainStep queued (Device::WaitForMarker) and
  /// returns its loss and accuracy: bitwise TrainStep's for the same step.
  /// The device's asynchronous failures surface here (its errors).
  /// FAILED_PRECONDITION when no step is pending (none was launched, it was
  /// finished already, or its device was released or destroyed since).
  StatusOr<StepResult> FinishTrainStep();
  /// Whether a launched step waits for FinishTrainStep (on a device that
  /// still exists).
  bool train_step_pending() const;

  /// TrainStep without its update (TF1: optimizer.compute_gradients): the
  /// same forward and backward, giving bitwise the gradients TrainStep
  /// applies. Reads only the kernels, biases and, for Adam, beta1_power and
  /// beta2_power (a worker's copy needs no slots); `vars` is not modified.
  /// Fills `*grads` (caller-owned): grads_and_vars, learning_rate and, for
  /// Adam, adam_step_size from the beta powers in `vars`. Once `*grads` holds
  /// this model's gradients, a call reuses its tensors and allocates nothing.
  /// Returns the loss and accuracy before the update, as TrainStep.
  /// Errors as TrainStep (slots are not looked up), INVALID_ARGUMENT for
  /// a null `grads`, FAILED_PRECONDITION on a device without host memory;
  /// `*grads` is unchanged after a bad argument and unspecified after a
  /// device error.
  StatusOr<StepResult> ComputeGradients(const VariableStore& vars, const Tensor& features, const Tensor& labels,
                                        compute::Device& device, Gradients* grads);

  /// Loss and accuracy over all N rows of `features`, no update, computed in
  /// chunks of at most kEvalChunkRows rows (bounded memory). Only kernels and
  /// biases are read. Errors as TrainStep.
  StatusOr<StepResult> Evaluate(const VariableStore& vars, const Tensor& features, const Tensor& labels,
                                compute::Device& device);
  /// Loss and accuracy over every example of `examples` in order, gathered
  /// on the device in chunks of kEvalChunkRows; bitwise Evaluate on the same
  /// examples as Tensors. Errors as the TrainStep by indices.
  StatusOr<StepResult> Evaluate(const VariableStore& vars, const DeviceExamples& examples, compute::Device& device);

  static constexpr int64_t kEvalChunkRows = 1024;

  /// Frees the workspace and captured steps this Mlp holds in `device`'s
  /// memory (a no-op when it holds none there), dropping a launched step's
  /// statistics not yet finished; the next step there allocates anew. Call before that device is destroyed when the Mlp
  /// outlives it.
  void ReleaseDevice(const compute::Device& device);

  const MlpSpec& spec() const;
  const OptimizerOptions& optimizer() const;
  /// The learning rate of the following steps (TF: a learning-rate tensor,
  /// such as tf.train.exponential_decay's, read by each apply op).
  /// 0 is accepted (a decayed rate underflows to 0 in float32; TF's apply ops
  /// take it): the variables then stay as they are while the optimizer's
  /// slots (momentum accumulators; Adam's m, v and beta powers) still update, as in
  /// TF. INVALID_ARGUMENT unless >= 0 and finite; the rate is unchanged then.
  Status set_learning_rate(float learning_rate);

 private:
  struct Impl;
  explicit Mlp(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

/// Applies `grads` to the variables `shard` holds (TF1: apply_gradients on
/// one parameter server's share): for each entry, TF1's update of
/// `optimizer.kind` (as in Mlp::TrainStep) on the variable with its slots
/// from `shard`, with grads.learning_rate (SGD, Momentum) or
/// grads.adam_step_size (Adam) as the rate; `optimizer.learning_rate` is not
/// read. The result is bitwise what TrainStep gives for the same gradients,
/// however the variables are split between stores. For Adam, when `shard`
/// holds beta1_power and beta2_power they are multiplied by beta1 and beta2
/// once per call (AdamOptimizer._finish), after the updates.
/// In one process adam_step_size comes from the beta powers the update
/// would read itself. In an asynchronous cluster it comes from the powers the
/// worker read at the start of its step (TF1's apply_adam reads them on the
/// ps at apply time): an update may use a step size one or more updates old.
/// Errors (checked before anything is updated; nothing is updated then):
///   NOT_FOUND         a gradient's variable is not in `shard` (each parameter
///                     server is sent only its share); a slot of an updated
///                     variable, or one of the beta powers when the other is
///                     held (each named)
///   INVALID_ARGUMENT  a gradient that is not float32 or not shaped as its
///                     variable; a variable or slot that is not float32 of
///                     the variable's shape; a variable listed twice; a
///                     learning_rate or (Adam) adam_step_size that is negative
///                     or not finite; bad optimizer options
///                     (ValidateOptimizerOptions, learning_rate aside)
///   FAILED_PRECONDITION `device` has no host memory (a GPU: the split step
///                     runs on the CPU)
///   the device's own errors (compute.hpp)
/// Not thread-safe for one `shard`: callers serialise updates to a store.
Status ApplyGradients(const OptimizerOptions& optimizer, VariableStore& shard, const Gradients& grads,
                      compute::Device& device);

/// The Optimizer (optimizer.hpp) of `options`: TF1's GradientDescentOptimizer,
/// MomentumOptimizer or AdamOptimizer update, as ApplyGradients above — what
/// a step hands StepContext::ApplyGradients. Holds a copy of the options
/// (checked by each ApplyGradients call, learning_rate aside); immutable,
/// so thread-safe.
class Tf1Optimizer final : public Optimizer {
 public:
  explicit Tf1Optimizer(const OptimizerOptions& options) : options_(options) {}
  const OptimizerOptions& options() const { return options_; }
  /// nn::ApplyGradients(options(), vars, grads, device), with its errors.
  Status ApplyGradients(const Gradients& grads, VariableStore& vars, compute::Device& device) const override;

 private:
  OptimizerOptions options_;
};

}  // namespace foreman::nn
