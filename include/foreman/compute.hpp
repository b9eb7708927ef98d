// The compute-device seam: the operations one training step
// of the MLP (nn.hpp) needs, at that level — a GEMM with a bias / ReLU
// epilogue, the bias gradient, softmax cross-entropy forward and backward,
// TF1's optimizer updates, copies between host and device memory — so that
// each device (the CPU's Eigen code, CUDA) implements them without knowing
// the model.
//
// A Session owns one Device, chosen by SessionConfig.device at
// Session::Create (StepContext::compute()); nn::Mlp runs through it.
//
//   ```cpp
//   #include "foreman/compute.hpp"
//   #include "foreman/session.hpp"  // Graph, Session, StepContext
//   auto g = std::make_shared<foreman::Graph>();
//   FOREMAN_RETURN_IF_ERROR(g->SetStep([](foreman::StepContext& ctx) -> foreman::Status {
//     foreman::compute::Device& dev = ctx.compute();  // the session's device: "/cpu:0"
//     float x[2 * 3] = {1, 2, 3, 4, 5, 6}, w[3 * 2] = {1, 0, 0, 1, 1, 1}, b[2] = {0, -100}, h[2 * 2];
//     foreman::compute::GemmArgs gemm;                // h[m,n] = ReLU(x[m,k]·w[k,n] + b[n])
//     gemm.a = x; gemm.b = w; gemm.c = h; gemm.m = 2; gemm.k = 3; gemm.n = 2;
//     gemm.epilogue = foreman::compute::Epilogue::kBiasRelu; gemm.bias = b;
//     return dev.Gemm(gemm);                          // h = {4, 0, 10, 0}
//   }));
//   FOREMAN_ASSIGN_OR_RETURN(auto sess, foreman::Session::Create(g));
//   FOREMAN_RETURN_IF_ERROR(sess->Run({}).status());
//   ```
//
// Conventions for every operation:
//   - Data are float32 (labels int32 or int64), matrices row-major and dense
//     (the row stride is the number of columns); shapes and counts are in
//     elements, byte counts in bytes.
//   - Pointers are device memory of this Device: from Allocate(), or, when
//     host_memory() is true (the CPU device), any host memory — a Tensor's
//     data<float>() is used in place, without a copy. Nothing is owned.
//   - Outputs must not overlap inputs unless an operation says otherwise
//     (the optimizer updates work in place on var and their slots).
//   - Operations run in the order they are called; each may return before
//     its work is done on a device that queues work, but the copies to the
//     host and every operation that returns a host value complete first.
//     The CPU device finishes every operation before it returns.
//   - Errors: INVALID_ARGUMENT for a negative size, a null pointer where data
//     is needed or a missing epilogue operand (nothing is written then);
//     RESOURCE_EXHAUSTED when device memory runs out; a device's own failure
//     is INTERNAL naming the device — never UNAVAILABLE or ABORTED, which
//     would start a session's recovery.
//   - Thread-safety: a Device may be used by one thread at a time (a
//     session's steps are serialised); its operations may use its own
//     threads inside (the CPU device's intra-op pool).
//
// Bitwise reproducibility: for a given device, thread count and instruction
// set (CpuInstructionSet()) the results are a function of the inputs;
// different thread counts may round GEMMs differently (they sum in other
// orders), and so may another instruction set (FMA, wider blocks). The
// elementwise operations do not depend on the thread count.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "foreman/status.hpp"
#include "foreman/tensor.hpp"

namespace foreman::compute {

/// What a GEMM does to each output element after the product.
enum class Epilogue {
  kNone,          // C = op(A)·op(B)
  kBias,          // C = op(A)·op(B) + bias (bias [n], broadcast over rows)
  kBiasRelu,      // C = max(op(A)·op(B) + bias, 0)  (TF's fused MatMul+BiasAdd+Relu)
  kReluGradMask,  // C = op(A)·op(B) where relu_output > 0, else 0 (ReluGrad
                  // given the ReLU's output [m, n], which is > 0 exactly where
                  // its input is)
};

/// C = op(A)·op(B) with an epilogue. op(A) is [m, k]: A is stored [m, k], or
/// [k, m] when transpose_a. op(B) is [k, n]: B is stored [k, n], or [n, k]
/// when transpose_b. C is [m, n] and is overwritten (not accumulated into).
/// k = 0 gives the epilogue of zeros. All row-major float32, device memory.
///
/// With `column_sums` not null (device memory [n], overwritten; Epilogue
/// kNone only) the same call also writes the column sums of op(B),
/// column_sums[j] = sum over k of op(B)[k, j] in k order from 0: bitwise
/// what ColumnSums gives for op(B) on the same device. A training step takes
/// a layer's bias gradient this way from the GEMM of its kernel gradient
/// (op(A) = inputs^T, op(B) = the layer's delta), one launch instead of two.
/// column_sums must not overlap a, b or c.
struct GemmArgs {
  const float* a = nullptr;
  const float* b = nullptr;
  float* c = nullptr;
  int64_t m = 0;
  int64_t n = 0;
  int64_t k = 0;
  bool transpose_a = false;
  bool transpose_b = false;
  Epilogue epilogue = Epilogue::kNone;
  const float* bias = nullptr;         // [n], for kBias and kBiasRelu
  const float* relu_output = nullptr;  // [m, n], for kReluGradMask; may not be c
  float* column_sums = nullptr;        // [n] or null: op(B)'s column sums (above)
};

/// Labels of a softmax cross-entropy: one class index per row.
enum class LabelType { kInt32, kInt64 };

/// TF's sparse_softmax_cross_entropy_with_logits over `rows` rows of
/// `logits` [rows, classes] with `labels` [rows] (LabelType; each in
/// [0, classes) — the caller checks, the device does not). Device memory.
struct SoftmaxXentArgs {
  const float* logits = nullptr;
  const void* labels = nullptr;
  LabelType label_type = LabelType::kInt32;
  int64_t rows = 0;
  int64_t classes = 0;
};

/// What the forward pass accumulates on the host.
struct SoftmaxXentStats {
  /// Sum over the rows of log(sum_c exp(z_c - max z)) - (z_label - max z),
  /// each row's loss computed in float (TF's shifted log-sum-exp) and summed
  /// in double. The mean loss is loss_sum / rows.
  double loss_sum = 0;
  /// Rows whose argmax (the first maximum) equals the label.
  int64_t correct = 0;
};

/// TF1's optimizer hyper-parameters, as its apply_* kernels take them.
struct MomentumParams {
  float learning_rate = 0;
  float momentum = 0;
  bool use_nesterov = false;
};
struct AdamParams {
  /// The step size lr_t = lr * sqrt(1 - beta2_power) / (1 - beta1_power),
  /// computed in float by the caller (the beta powers are host scalars).
  float step_size = 0;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float epsilon = 1e-8f;
};

/// A float32 scalar in device memory that an operation reads when it
/// executes, not when it is called: a rate that changes every step (a decayed
/// learning rate, Adam's step size) for a captured step (Device::BeginCapture)
/// that is replayed with the current value. On a host-memory device (the
/// CPU) any float's address.
struct DeviceScalar {
  const float* ptr = nullptr;
};

/// One variable of Device::ApplyAdamGroup: ApplyAdam's var, m, v (its
/// slots), grad and element count n (>= 0), device memory.
struct AdamVariable {
  float* var = nullptr;
  float* m = nullptr;
  float* v = nullptr;
  const float* grad = nullptr;
  int64_t n = 0;
};

/// Examples gathered on the device (the training data kept in device memory,
/// nn::DeviceExamples): for r in [0, rows)
///   features[r, d] = float(images[indices[r], d]) / 255.0f   (a division, as data::Dataset)
///   labels[r]      = int32(example_labels[indices[r]])
/// images uint8 [num_examples, feature_dim], example_labels uint8
/// [num_examples], indices int32 [rows] each in [0, num_examples) (the caller
/// checks, the device does not); features float32 [rows, feature_dim],
/// labels int32 [rows]. All device memory.
struct GatherArgs {
  const uint8_t* images = nullptr;
  const uint8_t* example_labels = nullptr;
  int64_t num_examples = 0;
  int64_t feature_dim = 0;
  const int32_t* indices = nullptr;
  int64_t rows = 0;
  float* features = nullptr;
  int32_t* labels = nullptr;
};

/// A sequence of operations recorded by Device::BeginCapture / EndCapture
/// (on CUDA, an instantiated CUDA graph). Owned by the caller; must not
/// outlive the Device that recorded it.
class CapturedOps {
 public:
  virtual ~CapturedOps() = default;
  /// Runs the recorded operations again, in order, on the same pointers,
  /// reading their device memory (inputs, DeviceScalars) anew. Returns like
  /// the operations would (without waiting for the device); errors as theirs.
  virtual Status Replay() = 0;
};

/// One range of a Device::CopyToHostBatch.
struct HostCopy {
  void* host_dst = nullptr;
  const void* device_src = nullptr;
  int64_t bytes = 0;
};

/// The instruction set the CPU device's kernels use in this process:
/// "baseline" (x86-64), "avx2" (AVX2 and FMA) or "avx512" (AVX-512 F, VL,
/// BW, DQ) — the best this CPU supports, at most the environment variable
/// FOREMAN_MAX_ISA (baseline|avx2|avx512, case-insensitive; unset or empty
/// means no cap). INVALID_ARGUMENT naming the variable, its value and the
/// allowed values when it holds anything else (Session::Create refuses such
/// a value the same way). Thread-safe; the first call may load the kernels'
/// shared module from libforeman's directory.
StatusOr<std::string> CpuInstructionSet();

/// One compute device. Obtained from the session (StepContext::compute());
/// the session owns it and it lives as long as the session.
class Device {
 public:
  virtual ~Device() = default;

  /// The canonical name: "/cpu:0", "/gpu:N".
  virtual const std::string& name() const = 0;

  /// True when device memory is host memory (the CPU device): host pointers,
  /// such as a Tensor's data, may be passed to every operation as they are.
  virtual bool host_memory() const = 0;

  /// `bytes` of device memory, aligned to at least 64 bytes, uninitialized;
  /// release it with Deallocate on this Device. bytes = 0 gives a valid
  /// pointer too. RESOURCE_EXHAUSTED naming the device and the size when
  /// memory runs out; INVALID_ARGUMENT for bytes < 0.
  virtual StatusOr<void*> Allocate(int64_t bytes) = 0;
  /// Frees what Allocate returned (null is ignored). A device frees all the
  /// memory it allocated when it is destroyed.
  virtual void Deallocate(void* ptr) = 0;

  /// Expires when this device is destroyed. Holders of its memory that may
  /// outlive it (nn::Mlp's workspace, nn::DeviceExamples, kept across a
  /// session's recoveries) keep it: once expired they free nothing (the
  /// device did), and it tells a new device at a reused address from the old
  /// one. Thread-safe.
  std::weak_ptr<const void> lifetime() const { return lifetime_; }

  /// Copies `bytes` from host memory to device memory (the restore of a
  /// checkpoint, a batch of features) and from device memory to host memory
  /// (the checkpoint snapshot). The host buffer may be reused on return.
  /// On an asynchronous device (asynchronous()), CopyToDevice runs after the
  /// operations called before it but need not wait for them (CUDA: through
  /// a page-locked staging buffer); CopyToHost returns once they and the
  /// copy have finished, with their asynchronous failure if one failed.
  virtual Status CopyToDevice(void* device_dst, const void* host_src, int64_t bytes) = 0;
  virtual Status CopyToHost(void* host_dst, const void* device_src, int64_t bytes) = 0;

  /// C = op(A)·op(B) with an epilogue (GemmArgs).
  virtual Status Gemm(const GemmArgs& args) = 0;

  /// The bias gradient: column sums of `delta` [rows, cols] into `out`
  /// [cols] (overwritten), summed over the rows in order.
  virtual Status ColumnSums(const float* delta, int64_t rows, int64_t cols, float* out) = 0;

  /// The forward pass: adds the rows' losses (to loss_sum) and correct
  /// argmaxes to `*stats` (host memory, not null), so that batches taken in
  /// chunks sum as one. The CPU adds the losses in row order; the CUDA device
  /// adds a call's rows in a fixed tree order (the same bits every run) and
  /// then that sum to loss_sum, so that there chunks sum as one to within a
  /// double's rounding, not bitwise.
  virtual Status SoftmaxXentForward(const SoftmaxXentArgs& args, SoftmaxXentStats* stats) = 0;
  /// The backward pass: grad [rows, classes] = (softmax(logits) -
  /// onehot(labels)) * scale; scale = 1 / batch gives the gradient of the
  /// mean loss.
  virtual Status SoftmaxXentBackward(const SoftmaxXentArgs& args, float scale, float* grad) = 0;
  /// Both passes at once (a training step): adds to `*stats` (host memory,
  /// not null) as SoftmaxXentForward and writes `grad` [rows, classes] as
  /// SoftmaxXentBackward, computing each exponential once; bitwise the same
  /// results as the two calls. The default makes the two calls.
  virtual Status SoftmaxXent(const SoftmaxXentArgs& args, SoftmaxXentStats* stats, float scale, float* grad) {
    FOREMAN_RETURN_IF_ERROR(SoftmaxXentForward(args, stats));
    return SoftmaxXentBackward(args, scale, grad);
  }

  /// TF1's dense updates of `n` elements of `var` with gradient `grad`, in
  /// place (training_ops.cc, their operation order):
  ///   ApplyGradientDescent  var -= grad * lr
  ///   ApplyMomentum         accum = accum * momentum + grad;
  ///                         var -= accum * lr, or with Nesterov
  ///                         var -= grad * lr + accum * momentum * lr
  ///   ApplyAdam             m += (grad - m) * (1 - beta1);
  ///                         v += (grad² - v) * (1 - beta2);
  ///                         var -= m * step_size / (sqrt(v) + epsilon)
  virtual Status ApplyGradientDescent(float* var, const float* grad, int64_t n, float learning_rate) = 0;
  virtual Status ApplyMomentum(float* var, float* accum, const float* grad, int64_t n,
                               const MomentumParams& params) = 0;
  virtual Status ApplyAdam(float* var, float* m, float* v, const float* grad, int64_t n,
                           const AdamParams& params) = 0;

  // -- A step whose state stays on the device (a GPU's training loop) -------
  // The same updates with the rate in device memory (DeviceScalar), read
  // when the update executes; bitwise the results of the forms above for the
  // same rate value.
  virtual Status ApplyGradientDescent(float* var, const float* grad, int64_t n, DeviceScalar learning_rate) = 0;
  virtual Status ApplyMomentum(float* var, float* accum, const float* grad, int64_t n, DeviceScalar learning_rate,
                               float momentum, bool use_nesterov) = 0;
  virtual Status ApplyAdam(float* var, float* m, float* v, const float* grad, int64_t n, DeviceScalar step_size,
                           float beta1, float beta2, float epsilon) = 0;
  /// Adam's scalars on the device, all float32 device memory: AdamStepSize
  /// writes *step_size = *learning_rate * sqrt(1 - *beta2_power) / (1 -
  /// *beta1_power), computed in float exactly as nn's host code does;
  /// AdamFinish multiplies *beta1_power by beta1 and *beta2_power by beta2
  /// (AdamOptimizer._finish).
  virtual Status AdamStepSize(DeviceScalar learning_rate, DeviceScalar beta1_power, DeviceScalar beta2_power,
                              float* step_size) = 0;
  virtual Status AdamFinish(float* beta1_power, float* beta2_power, float beta1, float beta2) = 0;
  /// A step's whole Adam update in one call (a multi-tensor apply), in TF's
  /// order (AdamOptimizer: the apply ops, then _finish):
  ///   AdamStepSize(learning_rate, beta1_power, beta2_power, step_size);
  ///   ApplyAdam(var, m, v, grad, n, DeviceScalar{step_size}, beta1, beta2,
  ///             epsilon) for each of the `count` variables, in order;
  ///   AdamFinish(beta1_power, beta2_power, beta1, beta2)
  /// with bitwise their results (*step_size included). `variables` is host
  /// memory, read during the call; the rest is device memory, float32.
  /// INVALID_ARGUMENT for count < 0, a null pointer (variables with
  /// count > 0; a scalar; a variable's pointer where its n > 0) or n < 0,
  /// naming the variable's index. The default makes the calls above; the
  /// CUDA device launches one kernel for all the variables (each thread
  /// computes the step size, as AdamStepSize does) and one for AdamFinish:
  /// two graph nodes a step instead of count + 2.
  virtual Status ApplyAdamGroup(const AdamVariable* variables, int64_t count, DeviceScalar learning_rate,
                                float* beta1_power, float* beta2_power, float beta1, float beta2, float epsilon,
                                float* step_size) {
    FOREMAN_RETURN_IF_ERROR(CheckAdamGroup(variables, count, learning_rate, beta1_power, beta2_power, step_size));
    FOREMAN_RETURN_IF_ERROR(
        AdamStepSize(learning_rate, DeviceScalar{beta1_power}, DeviceScalar{beta2_power}, step_size));
    for (int64_t i = 0; i < count; ++i) {
      const AdamVariable& x = variables[i];
      FOREMAN_RETURN_IF_ERROR(ApplyAdam(x.var, x.m, x.v, x.grad, x.n, DeviceScalar{step_size}, beta1, beta2, epsilon));
    }
    return AdamFinish(beta1_power, beta2_power, beta1, beta2);
  }

  /// SoftmaxXent with its statistics left in device memory: `*device_stats`
  /// (device memory, 16 bytes) is overwritten with this batch's loss_sum and
  /// correct, computed as SoftmaxXentForward's (bitwise the same values);
  /// nothing waits for the device. Read them with CopyToHost when needed.
  virtual Status SoftmaxXentToDevice(const SoftmaxXentArgs& args, float scale, float* grad,
                                     SoftmaxXentStats* device_stats) = 0;
  /// SoftmaxXentForward into device memory: adds this chunk's loss_sum and
  /// correct to `*device_stats` (device memory), so that an evaluation in
  /// chunks sums as one, bitwise as SoftmaxXentForward would over the same
  /// chunks.
  virtual Status SoftmaxXentForwardToDevice(const SoftmaxXentArgs& args, SoftmaxXentStats* device_stats) = 0;

  /// Gathers a batch from examples in device memory (GatherArgs).
  virtual Status GatherExamples(const GatherArgs& args) = 0;

  /// A host tensor to receive copies from this device: page-locked memory
  /// on CUDA (copies into it run at full speed; it is released with the
  /// Tensor, whose copies are ordinary), Tensor::Create's elsewhere.
  /// Errors as Tensor::Create.
  virtual StatusOr<Tensor> AllocateHostTensor(DataType dtype, TensorShape shape) {
    return Tensor::Create(dtype, std::move(shape));
  }
  /// Copies `count` ranges to host memory as one batch (a checkpoint's
  /// snapshot of the variables the device holds) after every operation
  /// called so far, and returns when all have landed. On CUDA they run on a
  /// separate copy stream that the training stream waits for, so the step's
  /// operations are delayed only by the copies; each `host_dst` range must
  /// then lie in page-locked memory (a tensor from AllocateHostTensor), and
  /// other memory is INVALID_ARGUMENT naming the copy. The default copies
  /// each range with CopyToHost.
  virtual Status CopyToHostBatch(const HostCopy* copies, int64_t count) {
    for (int64_t i = 0; i < count; ++i) {
      FOREMAN_RETURN_IF_ERROR(CopyToHost(copies[i].host_dst, copies[i].device_src, copies[i].bytes));
    }
    return Status();
  }

  // -- Pipelining: work queued without waiting for it ------------------------
  /// True when operations may still be running after their call returned
  /// (CUDA: they are queued on a stream and run in call order), so that a
  /// caller can overlap its own host work with them and wait only where it
  /// needs a result (RecordMarker / WaitForMarker). The CPU device: false
  /// (every operation has finished when it returns).
  virtual bool asynchronous() const { return false; }
  /// Copies `bytes` from page-locked host memory (a tensor from
  /// AllocateHostTensor) to device memory after every operation called so
  /// far, without waiting: the copy reads `host_src` when it runs, so the
  /// caller must not change those bytes until a marker recorded after this
  /// call has been waited for (WaitForMarker). May be captured: a replay's
  /// copy reads the host buffer as it is when the replay runs, which is how a
  /// captured step takes per-step inputs (its batch indices, its learning
  /// rate). INVALID_ARGUMENT naming the copy when, on CUDA or the fake test
  /// device, `host_src` is not page-locked; otherwise CopyToDevice's errors.
  /// The default is CopyToDevice (a synchronous device).
  virtual Status CopyToDeviceAsync(void* device_dst, const void* host_src, int64_t bytes) {
    return CopyToDevice(device_dst, host_src, bytes);
  }
  /// The other way: `bytes` from device memory into page-locked host memory
  /// after every operation called so far, without waiting; the bytes are
  /// there once a marker recorded after this call has been waited for. May
  /// be captured (a step's statistics: the replay writes them). Errors as
  /// CopyToDeviceAsync. The default is CopyToHost.
  virtual Status CopyToHostAsync(void* host_dst, const void* device_src, int64_t bytes) {
    return CopyToHost(host_dst, device_src, bytes);
  }
  /// Marks the operations called so far: WaitForMarker(marker) returns once
  /// they have all finished. Markers increase by one per call, from 1.
  /// FAILED_PRECONDITION while capturing (a marker is the host's, not the
  /// recording's); the device's own failure is INTERNAL.
  virtual StatusOr<uint64_t> RecordMarker() { return ++markers_; }
  /// Waits until the operations before `marker` have finished, and returns
  /// their asynchronous failure if one failed (INTERNAL naming the device and,
  /// on CUDA, the call or kernel; a sticky error stays). A marker older than
  /// the newest few is already complete once a newer one is; 0 returns at
  /// once. INVALID_ARGUMENT for a marker not yet recorded;
  /// FAILED_PRECONDITION while capturing. The default returns at once.
  virtual Status WaitForMarker(uint64_t marker) {
    if (marker > markers_) return MarkerNotRecorded(marker, markers_);
    return Status();
  }

  /// Whether BeginCapture works here (CUDA: yes, as a CUDA graph).
  virtual bool supports_capture() const { return false; }
  /// Records instead of running: the operations called until EndCapture
  /// check their arguments and are recorded, not executed. While capturing,
  /// an operation that must give the host a value, read host memory or wait
  /// for the device (Allocate, AllocateHostTensor, CopyToDevice, CopyToHost,
  /// CopyToHostBatch, SoftmaxXentForward, SoftmaxXent with host stats,
  /// Synchronize) is FAILED_PRECONDITION and spoils the capture: a replay's
  /// inputs are copied to the device before Replay. UNIMPLEMENTED unless supports_capture(); FAILED_PRECONDITION
  /// when already capturing.
  virtual Status BeginCapture() {
    return Status(absl::StatusCode::kUnimplemented, name() + ": this device cannot capture operations");
  }
  /// Ends the capture and returns the recording. FAILED_PRECONDITION when not
  /// capturing; when an operation failed during the capture, its error
  /// (the capture is dropped). A device's own failure is INTERNAL.
  virtual StatusOr<std::unique_ptr<CapturedOps>> EndCapture() {
    return Status(absl::StatusCode::kFailedPrecondition, name() + ": not capturing");
  }
  /// Waits until every operation called so far has finished; the device's
  /// asynchronous failures surface here (INTERNAL naming the device and, on
  /// CUDA, the call or kernel). The CPU device returns at once.
  virtual Status Synchronize() { return Status(); }

 protected:
  /// ApplyAdamGroup's argument checks (its INVALID_ARGUMENTs).
  Status CheckAdamGroup(const AdamVariable* variables, int64_t count, DeviceScalar learning_rate,
                        const float* beta1_power, const float* beta2_power, const float* step_size) const {
    auto invalid = [this](const std::string& what) {
      return Status(absl::StatusCode::kInvalidArgument, name() + " ApplyAdamGroup: " + what);
    };
    if (count < 0) return invalid("count must be >= 0, got " + std::to_string(count));
    if (count > 0 && variables == nullptr) return invalid("variables is null");
    if (learning_rate.ptr == nullptr) return invalid("learning_rate is null");
    if (beta1_power == nullptr) return invalid("beta1_power is null");
    if (beta2_power == nullptr) return invalid("beta2_power is null");
    if (step_size == nullptr) return invalid("step_size is null");
    for (int64_t i = 0; i < count; ++i) {
      const AdamVariable& x = variables[i];
      const std::string which = "variables[" + std::to_string(i) + "]";
      if (x.n < 0) return invalid(which + ".n must be >= 0, got " + std::to_string(x.n));
      if (x.n > 0 && (x.var == nullptr || x.m == nullptr || x.v == nullptr || x.grad == nullptr)) {
        return invalid(which + " has a null var, m, v or grad");
      }
    }
    return Status();
  }

  /// WaitForMarker's INVALID_ARGUMENT for a marker after `newest`.
  Status MarkerNotRecorded(uint64_t marker, uint64_t newest) const {
    return Status(absl::StatusCode::kInvalidArgument, name() + " WaitForMarker: marker " + std::to_string(marker) +
                                                          " was not recorded (the newest is " +
                                                          std::to_string(newest) + ")");
  }

 private:
  std::shared_ptr<const void> lifetime_ = std::make_shared<const char>(0);
  uint64_t markers_ = 0;  // the default RecordMarker's count
};

}  // namespace foreman::compute
