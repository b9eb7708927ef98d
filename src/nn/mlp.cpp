// The MLP: TF1 variable naming, glorot_uniform initialization, and a fused
// forward / backward / update step on a compute::Device (compute.hpp); the
// same step split for a cluster into ComputeGradients (a worker's forward and
// backward) and ApplyGradients (a ps's update of the variables it holds),
// which share TrainStep's code and give bitwise its results.
//
// Layout: every matrix is row-major with the batch as rows. The matrix
// products are the device's GEMMs straight into the workspace; bias + ReLU
// (forward) and the ReLU mask (backward) are their epilogues, run on each
// output block while it is in cache on the CPU device (TF's fused
// MatMul+BiasAdd+Relu does the same). For a fixed device and thread count a
// step is bitwise reproducible.
//
// The device-resident path (a device without host memory, and the steps on
// DeviceExamples on any device): the variables live where
// VariableStore::DeviceData keeps them, the workspace is device memory
// (Impl::Block, grown and reused), and the step is the same sequence of
// device operations with its rates as device scalars (Impl::DeviceStepOps),
// so that it can be captured once per batch size and replayed; per step only
// the step block {learning rate, indices} goes in and 16 bytes of statistics
// come out. Its results are bitwise those of the host path on the same
// device kind (the device-scalar operations are the host ones' twins).
#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "compute/cpu_device.hpp"
#include "foreman/nn.hpp"
#include "nn/optimizer.hpp"
#include "platform/hash.hpp"
#include "runtime/variable_store_access.hpp"

namespace foreman::nn {

namespace {

std::string LayerName(std::size_t layer) {
  return layer == 0 ? std::string("dense") : absl::StrCat("dense_", layer);
}

struct Layer {
  int64_t in = 0;
  int64_t out = 0;
  std::string kernel;
  std::string bias;
  std::vector<std::string> kernel_slots;   // per SlotSuffixes
  std::vector<std::string> bias_slots;
};

std::vector<Layer> MakeLayers(const MlpSpec& spec, OptimizerKind kind) {
  std::vector<int64_t> dims = {spec.input_dim};
  dims.insert(dims.end(), spec.hidden.begin(), spec.hidden.end());
  dims.push_back(spec.num_classes);
  const std::vector<std::string> suffixes = internal::SlotSuffixes(kind);
  std::vector<Layer> layers(dims.size() - 1);
  for (std::size_t l = 0; l < layers.size(); ++l) {
    Layer& layer = layers[l];
    layer.in = dims[l];
    layer.out = dims[l + 1];
    layer.kernel = LayerName(l) + "/kernel";
    layer.bias = LayerName(l) + "/bias";
    for (const std::string& s : suffixes) {
      layer.kernel_slots.push_back(layer.kernel + "/" + s);
      layer.bias_slots.push_back(layer.bias + "/" + s);
    }
  }
  return layers;
}

/// The variable `name` as float32 of `shape`, or NOT_FOUND / INVALID_ARGUMENT
/// naming it.
template <class Store>
auto GetFloat(Store& vars, const std::string& name, const TensorShape& shape)
    -> StatusOr<decltype(&*vars.Get(name).value())> {
  FOREMAN_ASSIGN_OR_RETURN(auto* t, vars.Get(name));
  Status s = t->CheckDataType(DataType::kFloat);
  if (s.ok()) s = t->CheckShape(shape);
  if (!s.ok()) return Annotate(s, absl::StrCat("variable '", name, "'"));
  return t;
}

/// Checks features [B, input_dim] float32 (B >= 1) and labels [B] int32/int64
/// in [0, num_classes).
Status CheckBatch(const MlpSpec& spec, const Tensor& features, const Tensor& labels) {
  FOREMAN_RETURN_IF_ERROR(Annotate(features.CheckDataType(DataType::kFloat), "features"));
  if (features.shape().rank() != 2 || features.shape().dim(1) != spec.input_dim) {
    return absl::InvalidArgumentError(absl::StrCat("features: expected shape [batch,", spec.input_dim, "], got ",
                                                   features.shape().ToString()));
  }
  const int64_t rows = features.shape().dim(0);
  if (rows < 1) return absl::InvalidArgumentError("features: empty batch (0 rows)");
  if (labels.dtype() != DataType::kInt32 && labels.dtype() != DataType::kInt64) {
    return absl::InvalidArgumentError(
        absl::StrCat("labels: expected dtype int32 or int64, got ", DataTypeName(labels.dtype())));
  }
  FOREMAN_RETURN_IF_ERROR(Annotate(labels.CheckShape(TensorShape{rows}), "labels"));
  auto check = [&](const auto* data) -> Status {
    for (int64_t r = 0; r < rows; ++r) {
      if (data[r] < 0 || data[r] >= spec.num_classes) {
        return absl::InvalidArgumentError(absl::StrCat("labels[", r, "] = ", data[r],
                                                       " is outside the valid range of [0, ", spec.num_classes, ")"));
      }
    }
    return absl::OkStatus();
  };
  return labels.dtype() == DataType::kInt32 ? check(labels.data<int32_t>()) : check(labels.data<int64_t>());
}

/// The softmax cross-entropy operands for `rows` rows of `logits` and of
/// `labels` from row `label_offset`.
compute::SoftmaxXentArgs XentArgs(const float* logits, const Tensor& labels, int64_t label_offset, int64_t rows,
                                  int64_t classes) {
  compute::SoftmaxXentArgs args;
  args.logits = logits;
  args.rows = rows;
  args.classes = classes;
  if (labels.dtype() == DataType::kInt32) {
    args.label_type = compute::LabelType::kInt32;
    args.labels = labels.data<int32_t>() + label_offset;
  } else {
    args.label_type = compute::LabelType::kInt64;
    args.labels = labels.data<int64_t>() + label_offset;
  }
  return args;
}

/// ComputeGradients and ApplyGradients (a cluster's split step) run on
/// host-memory devices only.
Status CheckHostMemory(const compute::Device& device, const char* what) {
  if (device.host_memory()) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      what, " on device ", device.name(),
      ": a device without host memory runs whole steps only (Mlp::TrainStep, Mlp::Evaluate); a cluster's split "
      "step (ComputeGradients, ApplyGradients) runs on the CPU"));
}

/// The TrainStep by indices' and Evaluate's checks of `examples` and of the
/// indices (each in [0, N); their labels in [0, classes)).
Status CheckExamples(const MlpSpec& spec, const DeviceExamples& examples, const compute::Device& device) {
  if (!examples.device_alive()) {
    return absl::InvalidArgumentError(
        absl::StrCat("examples were on a device that no longer exists, not on the step's device ", device.name()));
  }
  if (&examples.device() != &device) {
    return absl::InvalidArgumentError(absl::StrCat("examples are on device ", examples.device().name(),
                                                   ", not on the step's device ", device.name()));
  }
  if (examples.feature_dim() != spec.input_dim) {
    return absl::InvalidArgumentError(absl::StrCat("examples have ", examples.feature_dim(),
                                                   " features each, the model's input_dim is ", spec.input_dim));
  }
  return absl::OkStatus();
}

Status CheckLabel(const MlpSpec& spec, int64_t position, uint8_t label) {
  if (label < spec.num_classes) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("labels[", position, "] = ", static_cast<int>(label),
                                                 " is outside the valid range of [0, ", spec.num_classes, ")"));
}

/// A float buffer that only grows (no allocation once it is large enough).
class Buffer {
 public:
  float* Reserve(int64_t n) {
    if (static_cast<std::size_t>(n) > data_.size()) data_.resize(static_cast<std::size_t>(n));
    return data_.data();
  }
  float* data() { return data_.data(); }

 private:
  std::vector<float> data_;
};

}  // namespace

Status ValidateMlpSpec(const MlpSpec& spec) {
  if (spec.input_dim < 1) {
    return absl::InvalidArgumentError(absl::StrCat("MlpSpec: input_dim must be >= 1, got ", spec.input_dim));
  }
  for (std::size_t i = 0; i < spec.hidden.size(); ++i) {
    if (spec.hidden[i] < 1) {
      return absl::InvalidArgumentError(absl::StrCat("MlpSpec: hidden[", i, "] must be >= 1, got ", spec.hidden[i]));
    }
  }
  if (spec.num_classes < 1) {
    return absl::InvalidArgumentError(absl::StrCat("MlpSpec: num_classes must be >= 1, got ", spec.num_classes));
  }
  return absl::OkStatus();
}

std::vector<std::string> MlpVariableNames(const MlpSpec& spec, const OptimizerOptions& optimizer) {
  std::vector<std::string> names;
  for (const Layer& layer : MakeLayers(spec, optimizer.kind)) {
    names.push_back(layer.kernel);
    names.push_back(layer.bias);
    names.insert(names.end(), layer.kernel_slots.begin(), layer.kernel_slots.end());
    names.insert(names.end(), layer.bias_slots.begin(), layer.bias_slots.end());
  }
  if (optimizer.kind == OptimizerKind::kAdam) {
    names.push_back(internal::kBeta1PowerName);
    names.push_back(internal::kBeta2PowerName);
  }
  std::sort(names.begin(), names.end());
  return names;
}

StatusOr<Tensor> GlorotUniformKernel(int64_t fan_in, int64_t fan_out, uint64_t seed, int layer) {
  if (fan_in < 1 || fan_out < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("GlorotUniformKernel: dims must be >= 1, got [", fan_in, ",", fan_out, "]"));
  }
  FOREMAN_ASSIGN_OR_RETURN(Tensor kernel, Tensor::Create(DataType::kFloat, TensorShape{fan_in, fan_out}));
  // sqrt is correctly rounded (IEEE 754), so the limit is the same everywhere.
  const float limit = static_cast<float>(std::sqrt(6.0 / static_cast<double>(fan_in + fan_out)));
  // SplitMix64 (platform/hash.hpp): portable, and its mixing function is a
  // bijection, so distinct (seed, layer) keys start distinct streams.
  foreman::internal::SplitMix64Stream rng(foreman::internal::Mix64(seed ^ foreman::internal::Mix64(static_cast<uint64_t>(layer) + 1)));
  float* w = kernel.data<float>();
  for (int64_t i = 0; i < kernel.num_elements(); ++i) {
    // 24 random bits -> u in [-1, 1), exactly representable; one rounding
    // (a single multiply) gives w in [-limit, limit).
    const int32_t bits = static_cast<int32_t>(rng.Next() >> 40) - (1 << 23);
    const float u = static_cast<float>(bits) * (1.0f / static_cast<float>(1 << 23));
    w[i] = u * limit;
  }
  return kernel;
}

Status AddMlpVariables(Graph& graph, const MlpSpec& spec, const OptimizerOptions& optimizer, uint64_t seed) {
  FOREMAN_RETURN_IF_ERROR(ValidateMlpSpec(spec));
  FOREMAN_RETURN_IF_ERROR(ValidateOptimizerOptions(optimizer));
  if (graph.finalized()) return absl::FailedPreconditionError("Graph is finalized and cannot be modified.");
  const std::vector<Layer> layers = MakeLayers(spec, optimizer.kind);
  // TF1's creation order: the layers' variables, then the optimizer's.
  for (std::size_t l = 0; l < layers.size(); ++l) {
    const Layer& layer = layers[l];
    const int64_t in = layer.in, out = layer.out;
    const int index = static_cast<int>(l);
    FOREMAN_RETURN_IF_ERROR(graph.AddVariable(
        layer.kernel, Initializer([in, out, seed, index]() { return GlorotUniformKernel(in, out, seed, index); })));
    FOREMAN_RETURN_IF_ERROR(graph.AddVariable(layer.bias, Tensor(DataType::kFloat, TensorShape{out})));
  }
  if (optimizer.kind == OptimizerKind::kAdam) {
    FOREMAN_RETURN_IF_ERROR(
        graph.AddVariable(internal::kBeta1PowerName, Tensor::Scalar<float>(optimizer.beta1), /*trainable=*/false));
    FOREMAN_RETURN_IF_ERROR(
        graph.AddVariable(internal::kBeta2PowerName, Tensor::Scalar<float>(optimizer.beta2), /*trainable=*/false));
  }
  for (const Layer& layer : layers) {
    for (const std::string& slot : layer.kernel_slots) {
      FOREMAN_RETURN_IF_ERROR(
          graph.AddVariable(slot, Tensor(DataType::kFloat, TensorShape{layer.in, layer.out}), /*trainable=*/false));
    }
    for (const std::string& slot : layer.bias_slots) {
      FOREMAN_RETURN_IF_ERROR(graph.AddVariable(slot, Tensor(DataType::kFloat, TensorShape{layer.out}), /*trainable=*/false));
    }
  }
  return absl::OkStatus();
}

// -- Mlp ---------------------------------------------------------------------------

struct Mlp::Impl {
  MlpSpec spec;
  OptimizerOptions optimizer;
  std::vector<Layer> layers;

  // Workspace, per layer: outputs (post-ReLU, or logits for the last layer)
  // and loss gradients w.r.t. the pre-activations, [rows, out]; the
  // gradients of kernel and bias.
  std::vector<Buffer> outputs;
  std::vector<Buffer> deltas;
  std::vector<Buffer> kernel_grads;
  std::vector<Buffer> bias_grads;
  // Where Backward writes each layer's gradients (sized by Create, set per step).
  std::vector<float*> kgrads, bgrads;

  // The variables of one layer, resolved for one step.
  struct LayerVars {
    float* kernel = nullptr;
    float* bias = nullptr;
    float* kernel_slots[2] = {nullptr, nullptr};
    float* bias_slots[2] = {nullptr, nullptr};
  };

  // The trainable variables sorted by name (Gradients::grads_and_vars's
  // order), and each layer's kernel and bias index in it.
  std::vector<std::string> trainable;
  std::vector<TensorShape> trainable_shapes;
  std::vector<std::size_t> kernel_index, bias_index;

  // -- the device-resident path (a device without host memory, and the steps
  // on DeviceExamples on any device) ------------------------------------------
  // Workspace blocks in ws_device's memory, grown, never shrunk: the fixed
  // ones below, then per layer its output, delta, kernel and bias gradients.
  enum Fixed { kFeatures, kLabels, kStepBlock, kStats, kScalars, kEvalIndices, kNumFixed };
  struct DeviceBlock {
    void* ptr = nullptr;
    int64_t bytes = 0;
  };
  compute::Device* ws_device = nullptr;
  std::weak_ptr<const void> ws_lifetime;  // ws_device's (compute::Device::lifetime)
  std::vector<DeviceBlock> blocks;
  int64_t eval_indices_ready = 0;      // iota entries uploaded into kEvalIndices
  // The launched step (LaunchTrainStep / FinishTrainStep): its inputs (the
  // step block) and its statistics in page-locked memory of ws_device
  // (AllocateHostTensor), which its replay reads and writes; and the marker
  // its statistics have landed at.
  Tensor host_inputs;  // uint8 [bytes >= kIndicesOffset + rows * 4]
  Tensor host_stats;   // uint8 [sizeof(SoftmaxXentStats)]
  struct Pending {
    uint64_t marker = 0;
    int64_t rows = 0;
  };
  std::optional<Pending> pending;
  // Captured steps by (device, rows, every pointer they use), least recently
  // used evicted past kMaxCaptures.
  struct Captured {
    std::vector<uintptr_t> key;
    std::unique_ptr<compute::CapturedOps> ops;
    uint64_t used = 0;
  };
  static constexpr std::size_t kMaxCaptures = 4;
  std::vector<Captured> captures;
  uint64_t capture_clock = 0;

  ~Impl() { ReleaseDeviceWorkspace(); }

  void ReleaseDeviceWorkspace() {
    // A step in flight reads host_inputs and writes host_stats and the
    // blocks: it ends before they are freed (its result is dropped).
    if (pending.has_value() && ws_device != nullptr && !ws_lifetime.expired()) {
      (void)ws_device->WaitForMarker(pending->marker);
    }
    captures.clear();  // before the memory they use
    // A destroyed device freed its memory itself (compute::Device::lifetime).
    if (ws_device != nullptr && !ws_lifetime.expired()) {
      for (DeviceBlock& b : blocks) ws_device->Deallocate(b.ptr);
    }
    blocks.clear();
    ws_device = nullptr;
    ws_lifetime.reset();
    eval_indices_ready = 0;
    pending.reset();
    host_inputs = Tensor();
    host_stats = Tensor();
  }

  /// host_inputs of at least `input_bytes` and host_stats, page-locked on
  /// `device` (the workspace's), allocated on first use and when the batch grows.
  Status ReserveHostBuffers(compute::Device& device, int64_t input_bytes) {
    if (static_cast<int64_t>(host_inputs.TotalBytes()) < input_bytes) {
      host_inputs = Tensor();
      FOREMAN_ASSIGN_OR_RETURN(host_inputs, device.AllocateHostTensor(DataType::kUInt8, TensorShape({input_bytes})));
    }
    if (host_stats.TotalBytes() != sizeof(compute::SoftmaxXentStats)) {
      FOREMAN_ASSIGN_OR_RETURN(host_stats,
                               device.AllocateHostTensor(DataType::kUInt8, TensorShape({static_cast<int64_t>(
                                                                               sizeof(compute::SoftmaxXentStats))})));
    }
    return Status();
  }

  /// Whether the workspace is `device`'s: the same object, still alive (not
  /// a new device at a reused address).
  bool WorkspaceOn(const compute::Device& device) const {
    return ws_device == &device && !ws_lifetime.expired() && ws_lifetime.lock() == device.lifetime().lock();
  }

  /// Block `slot` of at least `bytes` bytes on `device` (switching devices
  /// frees the previous device's workspace first).
  StatusOr<void*> Block(compute::Device& device, std::size_t slot, int64_t bytes) {
    if (!WorkspaceOn(device)) {
      ReleaseDeviceWorkspace();
      ws_device = &device;
      ws_lifetime = device.lifetime();
      blocks.assign(kNumFixed + 4 * layers.size(), DeviceBlock{});
    }
    DeviceBlock& b = blocks[slot];
    if (b.ptr == nullptr || b.bytes < bytes) {
      device.Deallocate(b.ptr);
      b = DeviceBlock{};
      if (slot == kEvalIndices) eval_indices_ready = 0;
      FOREMAN_ASSIGN_OR_RETURN(b.ptr, device.Allocate(bytes));
      b.bytes = bytes;
    }
    return b.ptr;
  }

  /// The device pointers of one step.
  struct DeviceStep {
    std::vector<float*> outputs, deltas, kgrads, bgrads;
    float* features = nullptr;
    void* labels = nullptr;
    unsigned char* step_block = nullptr;  // {float learning rate, pad, int32 indices[rows] at kIndicesOffset}
    compute::SoftmaxXentStats* stats = nullptr;
    float* step_size = nullptr;  // Adam's lr_t
  };
  static constexpr int64_t kIndicesOffset = 16;

  /// Reserves the workspace of a step of `rows` rows (labels of `label_bytes`
  /// each; `indices`: room for the step block's indices).
  StatusOr<DeviceStep> ReserveStep(compute::Device& device, int64_t rows, int64_t label_bytes, bool indices) {
    DeviceStep s;
    const std::size_t n = layers.size();
    s.outputs.resize(n);
    s.deltas.resize(n);
    s.kgrads.resize(n);
    s.bgrads.resize(n);
    for (std::size_t l = 0; l < n; ++l) {
      const Layer& layer = layers[l];
      const std::size_t base = kNumFixed + 4 * l;
      FOREMAN_ASSIGN_OR_RETURN(void* o, Block(device, base, rows * layer.out * 4));
      FOREMAN_ASSIGN_OR_RETURN(void* d, Block(device, base + 1, rows * layer.out * 4));
      FOREMAN_ASSIGN_OR_RETURN(void* k, Block(device, base + 2, layer.in * layer.out * 4));
      FOREMAN_ASSIGN_OR_RETURN(void* b, Block(device, base + 3, layer.out * 4));
      s.outputs[l] = static_cast<float*>(o);
      s.deltas[l] = static_cast<float*>(d);
      s.kgrads[l] = static_cast<float*>(k);
      s.bgrads[l] = static_cast<float*>(b);
    }
    FOREMAN_ASSIGN_OR_RETURN(void* f, Block(device, kFeatures, rows * spec.input_dim * 4));
    FOREMAN_ASSIGN_OR_RETURN(s.labels, Block(device, kLabels, rows * label_bytes));
    FOREMAN_ASSIGN_OR_RETURN(void* st, Block(device, kStepBlock, kIndicesOffset + (indices ? rows * 4 : 0)));
    FOREMAN_ASSIGN_OR_RETURN(void* stats, Block(device, kStats, sizeof(compute::SoftmaxXentStats)));
    FOREMAN_ASSIGN_OR_RETURN(void* sc, Block(device, kScalars, 64));
    s.features = static_cast<float*>(f);
    s.step_block = static_cast<unsigned char*>(st);
    s.stats = static_cast<compute::SoftmaxXentStats*>(stats);
    s.step_size = static_cast<float*>(sc);
    return s;
  }

  /// Every variable a step uses, in device memory.
  struct DeviceVars {
    std::vector<float*> kernels, biases;
    std::vector<std::array<float*, 2>> kernel_slots, bias_slots;
    float* beta1_power = nullptr;
    float* beta2_power = nullptr;
  };

  /// The variables in `device`'s memory (VariableStore::DeviceData): for a
  /// training step (`train`: slots and beta powers too, and the device
  /// copies become the newer ones), or kernels and biases only. Dtypes and
  /// shapes are checked every step on the host copies, without copying
  /// anything back.
  Status ResolveDeviceVars(VariableStore* mutable_vars, const VariableStore& vars, compute::Device& device,
                           bool train, DeviceVars* out) {
    std::vector<std::pair<const std::string*, TensorShape>> wanted;
    for (const Layer& layer : layers) {
      const TensorShape kshape{layer.in, layer.out}, bshape{layer.out};
      wanted.emplace_back(&layer.kernel, kshape);
      wanted.emplace_back(&layer.bias, bshape);
      if (!train) continue;
      for (std::size_t s = 0; s < layer.kernel_slots.size(); ++s) {
        wanted.emplace_back(&layer.kernel_slots[s], kshape);
        wanted.emplace_back(&layer.bias_slots[s], bshape);
      }
    }
    static const std::string kBeta1 = internal::kBeta1PowerName, kBeta2 = internal::kBeta2PowerName;
    if (train && optimizer.kind == OptimizerKind::kAdam) {
      wanted.emplace_back(&kBeta1, TensorShape{});
      wanted.emplace_back(&kBeta2, TensorShape{});
    }
    // Dtypes and shapes from the host copies as they are (current even when
    // the device holds newer elements: nothing is copied back), before
    // anything is allocated or copied.
    for (const auto& [name, shape] : wanted) {
      const Tensor* t = foreman::internal::VariableStoreAccess::HostTensor(vars, *name);
      if (t == nullptr) return absl::NotFoundError(absl::StrCat("variable '", *name, "' not found"));
      Status s = t->CheckDataType(DataType::kFloat);
      if (s.ok()) s = t->CheckShape(shape);
      if (!s.ok()) return Annotate(s, absl::StrCat("variable '", *name, "'"));
    }
    std::vector<const void*> ptrs(wanted.size());
    for (std::size_t i = 0; i < wanted.size(); ++i) {
      StatusOr<const void*> p = vars.DeviceData(*wanted[i].first, device);
      if (!p.ok()) return p.status();
      ptrs[i] = *p;
    }
    if (train) {
      // The step writes them: the device copies become the newer ones.
      for (std::size_t i = 0; i < wanted.size(); ++i) {
        FOREMAN_ASSIGN_OR_RETURN(void* p, mutable_vars->DeviceData(*wanted[i].first, device));
        ptrs[i] = p;
      }
    }
    auto at = [&](std::size_t i) { return static_cast<float*>(const_cast<void*>(ptrs[i])); };
    std::size_t i = 0;
    out->kernels.assign(layers.size(), nullptr);
    out->biases.assign(layers.size(), nullptr);
    out->kernel_slots.assign(layers.size(), {nullptr, nullptr});
    out->bias_slots.assign(layers.size(), {nullptr, nullptr});
    for (std::size_t l = 0; l < layers.size(); ++l) {
      out->kernels[l] = at(i++);
      out->biases[l] = at(i++);
      if (!train) continue;
      for (std::size_t s = 0; s < layers[l].kernel_slots.size(); ++s) {
        out->kernel_slots[l][s] = at(i++);
        out->bias_slots[l][s] = at(i++);
      }
    }
    if (train && optimizer.kind == OptimizerKind::kAdam) {
      out->beta1_power = at(i++);
      out->beta2_power = at(i++);
    }
    return absl::OkStatus();
  }

  /// The forward pass on device memory: outputs[l] for every layer.
  Status DeviceForward(const float* x, int64_t rows, const DeviceVars& v, const std::vector<float*>& outs,
                       compute::Device& device) {
    const float* in = x;
    for (std::size_t l = 0; l < layers.size(); ++l) {
      compute::GemmArgs g;  // as Forward
      g.a = in;
      g.b = v.kernels[l];
      g.c = outs[l];
      g.m = rows;
      g.k = layers[l].in;
      g.n = layers[l].out;
      g.epilogue = l + 1 < layers.size() ? compute::Epilogue::kBiasRelu : compute::Epilogue::kBias;
      g.bias = v.biases[l];
      FOREMAN_RETURN_IF_ERROR(device.Gemm(g));
      in = outs[l];
    }
    return absl::OkStatus();
  }

  /// One training step's operations on device memory, in TrainStep's order
  /// (but Adam's updates, all at the end in one ApplyAdamGroup: the same
  /// values, since the backward pass reads each variable before its update
  /// in either order) with the rates as device scalars (the learning rate
  /// at step_block[0]; Adam's lr_t computed on the device from the beta
  /// powers), so that the sequence can be captured and replayed with new
  /// values. Writes the batch's statistics to *s.stats.
  Status DeviceStepOps(const float* x, const void* labels, compute::LabelType label_type, int64_t rows,
                       const DeviceVars& v, const DeviceStep& s, compute::Device& device) {
    const auto* lr = reinterpret_cast<const float*>(s.step_block);
    const bool adam = optimizer.kind == OptimizerKind::kAdam;
    FOREMAN_RETURN_IF_ERROR(DeviceForward(x, rows, v, s.outputs, device));
    const std::size_t last = layers.size() - 1;
    compute::SoftmaxXentArgs xent;
    xent.logits = s.outputs[last];
    xent.labels = labels;
    xent.label_type = label_type;
    xent.rows = rows;
    xent.classes = spec.num_classes;
    FOREMAN_RETURN_IF_ERROR(
        device.SoftmaxXentToDevice(xent, 1.0f / static_cast<float>(rows), s.deltas[last], s.stats));
    const compute::DeviceScalar rate{lr};
    // Adam's updates are made at the end, all in one call (ApplyAdamGroup:
    // the step size, every variable, the beta powers), in the order the
    // other optimizers update them here: layer by layer from the last, its
    // kernel, then its bias. Each variable is updated after the backward
    // pass has read it either way.
    std::vector<compute::AdamVariable> adam_variables;
    auto update = [&](float* var, const float* grad, const std::array<float*, 2>& slots, int64_t n) -> Status {
      switch (optimizer.kind) {
        case OptimizerKind::kSgd: return device.ApplyGradientDescent(var, grad, n, rate);
        case OptimizerKind::kMomentum:
          return device.ApplyMomentum(var, slots[0], grad, n, rate, optimizer.momentum, optimizer.use_nesterov);
        case OptimizerKind::kAdam:
          adam_variables.push_back({var, slots[0], slots[1], grad, n});
          return absl::OkStatus();
      }
      return absl::InvalidArgumentError("invalid optimizer kind");
    };
    for (std::size_t l = layers.size(); l-- > 0;) {  // as Backward, then the layer's update
      const Layer& layer = layers[l];
      const float* in = l == 0 ? x : s.outputs[l - 1];
      compute::GemmArgs kg;
      kg.a = in;
      kg.b = s.deltas[l];
      kg.c = s.kgrads[l];
      kg.m = layer.in;
      kg.k = rows;
      kg.n = layer.out;
      kg.transpose_a = true;
      kg.column_sums = s.bgrads[l];  // the bias gradient in the same launch (bitwise ColumnSums)
      FOREMAN_RETURN_IF_ERROR(device.Gemm(kg));
      if (l > 0) {
        compute::GemmArgs db;
        db.a = s.deltas[l];
        db.b = v.kernels[l];
        db.c = s.deltas[l - 1];
        db.m = rows;
        db.k = layer.out;
        db.n = layers[l - 1].out;
        db.transpose_b = true;
        db.epilogue = compute::Epilogue::kReluGradMask;
        db.relu_output = s.outputs[l - 1];
        FOREMAN_RETURN_IF_ERROR(device.Gemm(db));
      }
      FOREMAN_RETURN_IF_ERROR(update(v.kernels[l], s.kgrads[l], v.kernel_slots[l], layer.in * layer.out));
      FOREMAN_RETURN_IF_ERROR(update(v.biases[l], s.bgrads[l], v.bias_slots[l], layer.out));
    }
    if (adam) {
      FOREMAN_RETURN_IF_ERROR(device.ApplyAdamGroup(adam_variables.data(), static_cast<int64_t>(adam_variables.size()),
                                                    rate, v.beta1_power, v.beta2_power, optimizer.beta1,
                                                    optimizer.beta2, optimizer.epsilon, s.step_size));
    }
    return absl::OkStatus();
  }

  /// Copies the learning rate into the step block (a step on host Tensors;
  /// the step by indices writes it with its indices into host_inputs).
  Status UploadLearningRate(compute::Device& device, const DeviceStep& s) {
    return device.CopyToDevice(s.step_block, &optimizer.learning_rate, sizeof(float));
  }

  /// The statistics of a step or an evaluation, copied back (the one wait).
  static StatusOr<StepResult> ReadStats(compute::Device& device, const compute::SoftmaxXentStats* stats,
                                        int64_t rows) {
    compute::SoftmaxXentStats host;
    FOREMAN_RETURN_IF_ERROR(device.CopyToHost(&host, stats, sizeof(host)));
    return ResultOf(host, rows);
  }
  static StepResult ResultOf(const compute::SoftmaxXentStats& stats, int64_t rows) {
    StepResult result;
    result.loss = static_cast<float>(stats.loss_sum / static_cast<double>(rows));
    result.accuracy = static_cast<float>(static_cast<double>(stats.correct) / static_cast<double>(rows));
    return result;
  }

  /// The captured step for `key`, capturing it with `record` on first use.
  template <class Record>
  StatusOr<compute::CapturedOps*> CapturedStep(compute::Device& device, std::vector<uintptr_t> key, Record&& record) {
    ++capture_clock;
    for (Captured& c : captures) {
      if (c.key == key) {
        c.used = capture_clock;
        return c.ops.get();
      }
    }
    FOREMAN_RETURN_IF_ERROR(device.BeginCapture());
    Status s = record();
    StatusOr<std::unique_ptr<compute::CapturedOps>> ops = device.EndCapture();
    FOREMAN_RETURN_IF_ERROR(s);
    if (!ops.ok()) return ops.status();
    if (captures.size() >= kMaxCaptures) {
      captures.erase(std::min_element(captures.begin(), captures.end(),
                                      [](const Captured& a, const Captured& b) { return a.used < b.used; }));
    }
    captures.push_back(Captured{std::move(key), std::move(*ops), capture_clock});
    return captures.back().ops.get();
  }

  /// TrainStep on host Tensors (checked) on a device without host memory:
  /// the batch is copied to the device, the step runs there eagerly.
  StatusOr<StepResult> TrainStepOnDevice(VariableStore& vars, const Tensor& features, const Tensor& labels,
                                         compute::Device& device) {
    DeviceVars v;
    FOREMAN_RETURN_IF_ERROR(ResolveDeviceVars(&vars, vars, device, /*train=*/true, &v));
    const int64_t rows = features.shape().dim(0);
    const int64_t label_bytes = static_cast<int64_t>(DataTypeSize(labels.dtype()));
    FOREMAN_ASSIGN_OR_RETURN(DeviceStep s, ReserveStep(device, rows, label_bytes, /*indices=*/false));
    FOREMAN_RETURN_IF_ERROR(UploadLearningRate(device, s));
    FOREMAN_RETURN_IF_ERROR(device.CopyToDevice(s.features, features.raw_data(), rows * spec.input_dim * 4));
    FOREMAN_RETURN_IF_ERROR(device.CopyToDevice(s.labels, labels.raw_data(), rows * label_bytes));
    const compute::LabelType type =
        labels.dtype() == DataType::kInt32 ? compute::LabelType::kInt32 : compute::LabelType::kInt64;
    FOREMAN_RETURN_IF_ERROR(DeviceStepOps(s.features, s.labels, type, rows, v, s, device));
    return ReadStats(device, s.stats, rows);
  }

  /// Evaluate on host Tensors (checked) on a device without host memory:
  /// each chunk is copied to the device; the statistics stay there until the end.
  StatusOr<StepResult> EvaluateOnDevice(const VariableStore& vars, const Tensor& features, const Tensor& labels,
                                        compute::Device& device) {
    DeviceVars v;
    FOREMAN_RETURN_IF_ERROR(ResolveDeviceVars(nullptr, vars, device, /*train=*/false, &v));
    const int64_t rows = features.shape().dim(0);
    const int64_t label_bytes = static_cast<int64_t>(DataTypeSize(labels.dtype()));
    const int64_t chunk = std::min(kEvalChunkRows, rows);
    FOREMAN_ASSIGN_OR_RETURN(DeviceStep s, ReserveStep(device, chunk, label_bytes, /*indices=*/false));
    const compute::SoftmaxXentStats zero;
    FOREMAN_RETURN_IF_ERROR(device.CopyToDevice(s.stats, &zero, sizeof(zero)));
    const compute::LabelType type =
        labels.dtype() == DataType::kInt32 ? compute::LabelType::kInt32 : compute::LabelType::kInt64;
    for (int64_t begin = 0; begin < rows; begin += kEvalChunkRows) {
      const int64_t n = std::min(kEvalChunkRows, rows - begin);
      FOREMAN_RETURN_IF_ERROR(device.CopyToDevice(
          s.features, features.data<float>() + begin * spec.input_dim, n * spec.input_dim * 4));
      FOREMAN_RETURN_IF_ERROR(device.CopyToDevice(s.labels, labels.raw_data() + begin * label_bytes, n * label_bytes));
      FOREMAN_RETURN_IF_ERROR(DeviceForward(s.features, n, v, s.outputs, device));
      compute::SoftmaxXentArgs xent;
      xent.logits = s.outputs[layers.size() - 1];
      xent.labels = s.labels;
      xent.label_type = type;
      xent.rows = n;
      xent.classes = spec.num_classes;
      FOREMAN_RETURN_IF_ERROR(device.SoftmaxXentForwardToDevice(xent, s.stats));
    }
    return ReadStats(device, s.stats, rows);
  }

  /// Forward pass of `rows` rows of `x`: fills outputs[l] for every layer.
  Status Forward(const float* x, int64_t rows, const std::vector<const float*>& kernels,
                 const std::vector<const float*>& biases, compute::Device& device) {
    const float* in = x;
    for (std::size_t l = 0; l < layers.size(); ++l) {
      const Layer& layer = layers[l];
      float* out = outputs[l].Reserve(rows * layer.out);
      compute::GemmArgs g;  // z [rows, out] = a [rows, in] . w [in, out] + bias, ReLU but for the logits
      g.a = in;
      g.b = kernels[l];
      g.c = out;
      g.m = rows;
      g.k = layer.in;
      g.n = layer.out;
      g.epilogue = l + 1 < layers.size() ? compute::Epilogue::kBiasRelu : compute::Epilogue::kBias;
      g.bias = biases[l];
      FOREMAN_RETURN_IF_ERROR(device.Gemm(g));
      in = out;
    }
    return absl::OkStatus();
  }

  /// Forward, then the softmax cross-entropy (TF's SparseXentEigenImpl, in
  /// float): the loss summed over the rows and the correct argmaxes into
  /// `stats`, d(mean loss)/d(logits) into deltas[last].
  Status ForwardAndLoss(const float* x, int64_t rows, const Tensor& labels, const std::vector<const float*>& kernels,
                        const std::vector<const float*>& biases, compute::Device& device,
                        compute::SoftmaxXentStats* stats) {
    FOREMAN_RETURN_IF_ERROR(Forward(x, rows, kernels, biases, device));
    const std::size_t last = layers.size() - 1;
    const compute::SoftmaxXentArgs xent = XentArgs(outputs[last].data(), labels, 0, rows, spec.num_classes);
    return device.SoftmaxXent(xent, stats, 1.0f / static_cast<float>(rows),
                              deltas[last].Reserve(rows * spec.num_classes));
  }

  /// Backward from deltas[last], top layer first: layer l's kernel gradient
  /// into kgrads[l] ([in, out]) and its bias gradient into bgrads[l] ([out]),
  /// then after_layer(l). Layer l's kernel is not read after after_layer(l),
  /// so TrainStep updates it there, while its gradient is warm in cache.
  template <class AfterLayer>
  Status Backward(const float* x, int64_t rows, const std::vector<const float*>& kernels, compute::Device& device,
                  AfterLayer&& after_layer) {
    for (std::size_t l = layers.size(); l-- > 0;) {
      const Layer& layer = layers[l];
      const float* in = l == 0 ? x : outputs[l - 1].data();
      const float* delta = deltas[l].data();

      // kernel gradient [in, out] = in [rows, in]^T . delta [rows, out]
      compute::GemmArgs kg;
      kg.a = in;
      kg.b = delta;
      kg.c = kgrads[l];
      kg.m = layer.in;
      kg.k = rows;
      kg.n = layer.out;
      kg.transpose_a = true;
      FOREMAN_RETURN_IF_ERROR(device.Gemm(kg));

      FOREMAN_RETURN_IF_ERROR(device.ColumnSums(delta, rows, layer.out, bgrads[l]));

      if (l > 0) {
        // delta below [rows, below.out] = delta [rows, out] . kernel [in, out]^T,
        // masked where the ReLU below was off (below.out == in).
        const Layer& below = layers[l - 1];
        compute::GemmArgs db;
        db.a = delta;
        db.b = kernels[l];
        db.c = deltas[l - 1].Reserve(rows * below.out);
        db.m = rows;
        db.k = layer.out;
        db.n = below.out;
        db.transpose_b = true;
        db.epilogue = compute::Epilogue::kReluGradMask;
        db.relu_output = outputs[l - 1].data();
        FOREMAN_RETURN_IF_ERROR(device.Gemm(db));
      }
      FOREMAN_RETURN_IF_ERROR(after_layer(l));
    }
    return absl::OkStatus();
  }
};

Mlp::Mlp(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Mlp::~Mlp() = default;

void Mlp::ReleaseDevice(const compute::Device& device) {
  if (impl_->ws_device == &device) impl_->ReleaseDeviceWorkspace();
}

const MlpSpec& Mlp::spec() const { return impl_->spec; }
const OptimizerOptions& Mlp::optimizer() const { return impl_->optimizer; }

Status Mlp::set_learning_rate(float learning_rate) {
  // 0 is a rate a schedule reaches: tf.train.exponential_decay's float32
  // underflows to 0 after enough steps (the default 0.8 per 1000 steps of
  // `foreman train` at about step 435 000), and TF's apply ops take it. The
  // other fields were validated by Create. Written as !(x >= 0): NaN too.
  if (!(learning_rate >= 0) || !std::isfinite(learning_rate)) {
    return absl::InvalidArgumentError(absl::StrCat("optimizer ", OptimizerKindName(impl_->optimizer.kind),
                                                   ": learning_rate must be >= 0 and finite, got ", learning_rate));
  }
  impl_->optimizer.learning_rate = learning_rate;
  return absl::OkStatus();
}

StatusOr<std::unique_ptr<Mlp>> Mlp::Create(MlpSpec spec, OptimizerOptions optimizer) {
  FOREMAN_RETURN_IF_ERROR(ValidateMlpSpec(spec));
  FOREMAN_RETURN_IF_ERROR(ValidateOptimizerOptions(optimizer));
  auto impl = std::make_unique<Impl>();
  impl->layers = MakeLayers(spec, optimizer.kind);
  impl->spec = std::move(spec);
  impl->optimizer = optimizer;
  const std::size_t n = impl->layers.size();
  impl->outputs.resize(n);
  impl->deltas.resize(n);
  impl->kernel_grads.resize(n);
  impl->bias_grads.resize(n);
  impl->kgrads.resize(n);
  impl->bgrads.resize(n);
  for (const Layer& layer : impl->layers) {
    impl->trainable.push_back(layer.kernel);
    impl->trainable.push_back(layer.bias);
  }
  std::sort(impl->trainable.begin(), impl->trainable.end());
  auto index_of = [&](const std::string& name) {
    return static_cast<std::size_t>(std::find(impl->trainable.begin(), impl->trainable.end(), name) -
                                    impl->trainable.begin());
  };
  impl->trainable_shapes.resize(impl->trainable.size());
  for (const Layer& layer : impl->layers) {
    impl->kernel_index.push_back(index_of(layer.kernel));
    impl->bias_index.push_back(index_of(layer.bias));
    impl->trainable_shapes[impl->kernel_index.back()] = TensorShape{layer.in, layer.out};
    impl->trainable_shapes[impl->bias_index.back()] = TensorShape{layer.out};
  }
  return std::unique_ptr<Mlp>(new Mlp(std::move(impl)));
}

StatusOr<StepResult> Mlp::TrainStep(VariableStore& vars, const Tensor& features, const Tensor& labels,
                                    compute::Device& device) {
  Impl& m = *impl_;
  FOREMAN_RETURN_IF_ERROR(CheckBatch(m.spec, features, labels));
  if (!device.host_memory()) return m.TrainStepOnDevice(vars, features, labels, device);
  const OptimizerOptions& opt = m.optimizer;
  const std::size_t num_layers = m.layers.size();

  // Resolve and check every variable before touching any.
  std::vector<Impl::LayerVars> lv(num_layers);
  std::vector<const float*> kernels(num_layers), biases(num_layers);
  for (std::size_t l = 0; l < num_layers; ++l) {
    const Layer& layer = m.layers[l];
    const TensorShape kshape{layer.in, layer.out}, bshape{layer.out};
    FOREMAN_ASSIGN_OR_RETURN(Tensor* k, GetFloat(vars, layer.kernel, kshape));
    FOREMAN_ASSIGN_OR_RETURN(Tensor* b, GetFloat(vars, layer.bias, bshape));
    lv[l].kernel = k->data<float>();
    lv[l].bias = b->data<float>();
    kernels[l] = lv[l].kernel;
    biases[l] = lv[l].bias;
    for (std::size_t s = 0; s < layer.kernel_slots.size(); ++s) {
      FOREMAN_ASSIGN_OR_RETURN(Tensor* ks, GetFloat(vars, layer.kernel_slots[s], kshape));
      FOREMAN_ASSIGN_OR_RETURN(Tensor* bs, GetFloat(vars, layer.bias_slots[s], bshape));
      lv[l].kernel_slots[s] = ks->data<float>();
      lv[l].bias_slots[s] = bs->data<float>();
    }
  }
  float lr = opt.learning_rate;
  float* beta1_power = nullptr;
  float* beta2_power = nullptr;
  if (opt.kind == OptimizerKind::kAdam) {
    FOREMAN_ASSIGN_OR_RETURN(Tensor* b1, GetFloat(vars, internal::kBeta1PowerName, TensorShape{}));
    FOREMAN_ASSIGN_OR_RETURN(Tensor* b2, GetFloat(vars, internal::kBeta2PowerName, TensorShape{}));
    beta1_power = b1->data<float>();
    beta2_power = b2->data<float>();
    lr = internal::AdamStepSize(opt.learning_rate, *beta1_power, *beta2_power);
  }

  const int64_t rows = features.shape().dim(0);
  const float* x = features.data<float>();
  compute::SoftmaxXentStats stats;
  FOREMAN_RETURN_IF_ERROR(m.ForwardAndLoss(x, rows, labels, kernels, biases, device, &stats));

  // Backward, updating each layer as soon as its kernel is no longer read.
  for (std::size_t l = 0; l < num_layers; ++l) {
    m.kgrads[l] = m.kernel_grads[l].Reserve(m.layers[l].in * m.layers[l].out);
    m.bgrads[l] = m.bias_grads[l].Reserve(m.layers[l].out);
  }
  FOREMAN_RETURN_IF_ERROR(m.Backward(x, rows, kernels, device, [&](std::size_t l) -> Status {
    const Layer& layer = m.layers[l];
    FOREMAN_RETURN_IF_ERROR(internal::ApplyDense(opt, lr, lv[l].kernel, m.kgrads[l], lv[l].kernel_slots[0],
                                                 lv[l].kernel_slots[1], layer.in * layer.out, device));
    return internal::ApplyDense(opt, lr, lv[l].bias, m.bgrads[l], lv[l].bias_slots[0], lv[l].bias_slots[1], layer.out,
                                device);
  }));
  if (opt.kind == OptimizerKind::kAdam) {
    // AdamOptimizer._finish: beta*_power.assign(beta*_power * beta*).
    *beta1_power = *beta1_power * opt.beta1;
    *beta2_power = *beta2_power * opt.beta2;
  }

  StepResult result;
  result.loss = static_cast<float>(stats.loss_sum / static_cast<double>(rows));
  result.accuracy = static_cast<float>(static_cast<double>(stats.correct) / static_cast<double>(rows));
  return result;
}

StatusOr<StepResult> Mlp::ComputeGradients(const VariableStore& vars, const Tensor& features, const Tensor& labels,
                                           compute::Device& device, Gradients* grads) {
  Impl& m = *impl_;
  if (grads == nullptr) return absl::InvalidArgumentError("Mlp::ComputeGradients: grads is null");
  FOREMAN_RETURN_IF_ERROR(CheckHostMemory(device, "Mlp::ComputeGradients"));
  FOREMAN_RETURN_IF_ERROR(CheckBatch(m.spec, features, labels));
  const OptimizerOptions& opt = m.optimizer;
  const std::size_t num_layers = m.layers.size();

  std::vector<const float*> kernels(num_layers), biases(num_layers);
  for (std::size_t l = 0; l < num_layers; ++l) {
    const Layer& layer = m.layers[l];
    FOREMAN_ASSIGN_OR_RETURN(const Tensor* k, GetFloat(vars, layer.kernel, m.trainable_shapes[m.kernel_index[l]]));
    FOREMAN_ASSIGN_OR_RETURN(const Tensor* b, GetFloat(vars, layer.bias, m.trainable_shapes[m.bias_index[l]]));
    kernels[l] = k->data<float>();
    biases[l] = b->data<float>();
  }
  float adam_step_size = 0;
  if (opt.kind == OptimizerKind::kAdam) {
    FOREMAN_ASSIGN_OR_RETURN(const Tensor* b1, GetFloat(vars, internal::kBeta1PowerName, TensorShape{}));
    FOREMAN_ASSIGN_OR_RETURN(const Tensor* b2, GetFloat(vars, internal::kBeta2PowerName, TensorShape{}));
    adam_step_size = internal::AdamStepSize(opt.learning_rate, *b1->data<float>(), *b2->data<float>());
  }

  // Size `grads` for this model unless it already is (then nothing is allocated).
  std::vector<Gradients::GradAndVar>& gv = grads->grads_and_vars;
  bool sized = gv.size() == m.trainable.size();
  for (std::size_t i = 0; sized && i < gv.size(); ++i) {
    sized = gv[i].variable == m.trainable[i] && gv[i].grad.dtype() == DataType::kFloat &&
            gv[i].grad.shape() == m.trainable_shapes[i];
  }
  if (!sized) {
    gv.resize(m.trainable.size());
    for (std::size_t i = 0; i < gv.size(); ++i) {
      gv[i].variable = m.trainable[i];
      FOREMAN_ASSIGN_OR_RETURN(gv[i].grad, Tensor::Create(DataType::kFloat, m.trainable_shapes[i]));
    }
  }
  grads->learning_rate = opt.learning_rate;
  grads->adam_step_size = adam_step_size;

  const int64_t rows = features.shape().dim(0);
  const float* x = features.data<float>();
  compute::SoftmaxXentStats stats;
  FOREMAN_RETURN_IF_ERROR(m.ForwardAndLoss(x, rows, labels, kernels, biases, device, &stats));
  for (std::size_t l = 0; l < num_layers; ++l) {
    m.kgrads[l] = gv[m.kernel_index[l]].grad.data<float>();
    m.bgrads[l] = gv[m.bias_index[l]].grad.data<float>();
  }
  FOREMAN_RETURN_IF_ERROR(m.Backward(x, rows, kernels, device, [](std::size_t) -> Status { return absl::OkStatus(); }));

  StepResult result;
  result.loss = static_cast<float>(stats.loss_sum / static_cast<double>(rows));
  result.accuracy = static_cast<float>(static_cast<double>(stats.correct) / static_cast<double>(rows));
  return result;
}

Status Tf1Optimizer::ApplyGradients(const Gradients& grads, VariableStore& vars, compute::Device& device) const {
  return nn::ApplyGradients(options_, vars, grads, device);
}

Status ApplyGradients(const OptimizerOptions& optimizer, VariableStore& shard, const Gradients& grads,
                      compute::Device& device) {
  FOREMAN_RETURN_IF_ERROR(CheckHostMemory(device, "ApplyGradients"));
  OptimizerOptions checked = optimizer;
  checked.learning_rate = 1;  // not read: the rates come with the gradients
  FOREMAN_RETURN_IF_ERROR(ValidateOptimizerOptions(checked));
  const bool adam = optimizer.kind == OptimizerKind::kAdam;
  auto check_rate = [](const char* what, float rate) -> Status {
    if (rate >= 0 && std::isfinite(rate)) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrCat("ApplyGradients: ", what, " must be >= 0 and finite, got ", rate));
  };
  FOREMAN_RETURN_IF_ERROR(check_rate("learning_rate", grads.learning_rate));
  if (adam) FOREMAN_RETURN_IF_ERROR(check_rate("adam_step_size", grads.adam_step_size));
  const float lr = adam ? grads.adam_step_size : grads.learning_rate;

  // Resolve and check everything before updating anything.
  struct Update {
    float* var = nullptr;
    const float* grad = nullptr;
    float* slots[2] = {nullptr, nullptr};
    int64_t n = 0;
  };
  const std::vector<std::string> suffixes = internal::SlotSuffixes(optimizer.kind);
  std::vector<Update> updates(grads.grads_and_vars.size());
  for (std::size_t i = 0; i < updates.size(); ++i) {
    const Gradients::GradAndVar& g = grads.grads_and_vars[i];
    if (!shard.Contains(g.variable)) {
      return absl::NotFoundError(
          absl::StrCat("ApplyGradients: gradient for variable '", g.variable, "', which this store does not hold"));
    }
    Tensor* var = shard.Get(g.variable).value();
    FOREMAN_RETURN_IF_ERROR(Annotate(var->CheckDataType(DataType::kFloat), absl::StrCat("variable '", g.variable, "'")));
    Status s = g.grad.CheckDataType(DataType::kFloat);
    if (s.ok()) s = g.grad.CheckShape(var->shape());
    FOREMAN_RETURN_IF_ERROR(Annotate(s, absl::StrCat("ApplyGradients: gradient for variable '", g.variable, "'")));
    Update& u = updates[i];
    u.var = var->data<float>();
    u.grad = g.grad.data<float>();
    u.n = var->num_elements();
    for (std::size_t j = 0; j < i; ++j) {
      // By name: two zero-element variables share a null data pointer.
      if (grads.grads_and_vars[j].variable == g.variable) {
        return absl::InvalidArgumentError(
            absl::StrCat("ApplyGradients: variable '", g.variable, "' has more than one gradient"));
      }
    }
    for (std::size_t k = 0; k < suffixes.size(); ++k) {
      FOREMAN_ASSIGN_OR_RETURN(Tensor* slot, GetFloat(shard, absl::StrCat(g.variable, "/", suffixes[k]), var->shape()));
      u.slots[k] = slot->data<float>();
    }
  }
  float* beta1_power = nullptr;
  float* beta2_power = nullptr;
  if (adam) {
    const bool has1 = shard.Contains(internal::kBeta1PowerName);
    const bool has2 = shard.Contains(internal::kBeta2PowerName);
    if (has1 != has2) {
      return absl::NotFoundError(absl::StrCat("ApplyGradients: the store holds '",
                                              has1 ? internal::kBeta1PowerName : internal::kBeta2PowerName,
                                              "' but not '",
                                              has1 ? internal::kBeta2PowerName : internal::kBeta1PowerName, "'"));
    }
    if (has1) {
      FOREMAN_ASSIGN_OR_RETURN(Tensor* b1, GetFloat(shard, internal::kBeta1PowerName, TensorShape{}));
      FOREMAN_ASSIGN_OR_RETURN(Tensor* b2, GetFloat(shard, internal::kBeta2PowerName, TensorShape{}));
      beta1_power = b1->data<float>();
      beta2_power = b2->data<float>();
    }
  }

  for (const Update& u : updates) {
    FOREMAN_RETURN_IF_ERROR(internal::ApplyDense(optimizer, lr, u.var, u.grad, u.slots[0], u.slots[1], u.n, device));
  }
  if (beta1_power != nullptr) {
    // AdamOptimizer._finish, as TrainStep.
    *beta1_power = *beta1_power * optimizer.beta1;
    *beta2_power = *beta2_power * optimizer.beta2;
  }
  return absl::OkStatus();
}

StatusOr<StepResult> Mlp::Evaluate(const VariableStore& vars, const Tensor& features, const Tensor& labels,
                                   compute::Device& device) {
  Impl& m = *impl_;
  FOREMAN_RETURN_IF_ERROR(CheckBatch(m.spec, features, labels));
  if (!device.host_memory()) return m.EvaluateOnDevice(vars, features, labels, device);
  const std::size_t num_layers = m.layers.size();
  std::vector<const float*> kernels(num_layers), biases(num_layers);
  for (std::size_t l = 0; l < num_layers; ++l) {
    const Layer& layer = m.layers[l];
    FOREMAN_ASSIGN_OR_RETURN(const Tensor* k, GetFloat(vars, layer.kernel, TensorShape{layer.in, layer.out}));
    FOREMAN_ASSIGN_OR_RETURN(const Tensor* b, GetFloat(vars, layer.bias, TensorShape{layer.out}));
    kernels[l] = k->data<float>();
    biases[l] = b->data<float>();
  }
  const int64_t rows = features.shape().dim(0);
  compute::SoftmaxXentStats stats;
  for (int64_t begin = 0; begin < rows; begin += kEvalChunkRows) {
    const int64_t n = std::min(kEvalChunkRows, rows - begin);
    FOREMAN_RETURN_IF_ERROR(m.Forward(features.data<float>() + begin * m.spec.input_dim, n, kernels, biases, device));
    FOREMAN_RETURN_IF_ERROR(device.SoftmaxXentForward(
        XentArgs(m.outputs[num_layers - 1].data(), labels, begin, n, m.spec.num_classes), &stats));
  }
  StepResult result;
  result.loss = static_cast<float>(stats.loss_sum / static_cast<double>(rows));
  result.accuracy = static_cast<float>(static_cast<double>(stats.correct) / static_cast<double>(rows));
  return result;
}

StatusOr<StepResult> Mlp::TrainStep(VariableStore& vars, const DeviceExamples& examples, const int32_t* indices,
                                    int64_t rows, compute::Device& device) {
  FOREMAN_RETURN_IF_ERROR(LaunchTrainStep(vars, examples, indices, rows, device));
  return FinishTrainStep();
}

Status Mlp::LaunchTrainStep(VariableStore& vars, const DeviceExamples& examples, const int32_t* indices, int64_t rows,
                            compute::Device& device) {
  Impl& m = *impl_;
  FOREMAN_RETURN_IF_ERROR(CheckExamples(m.spec, examples, device));
  if (rows < 1) return absl::InvalidArgumentError(absl::StrCat("Mlp::TrainStep: rows must be >= 1, got ", rows));
  if (indices == nullptr) return absl::InvalidArgumentError("Mlp::TrainStep: indices is null");
  for (int64_t r = 0; r < rows; ++r) {
    if (indices[r] < 0 || indices[r] >= examples.num_examples()) {
      return absl::InvalidArgumentError(absl::StrCat("indices[", r, "] = ", indices[r],
                                                     " is outside the examples' range [0, ",
                                                     examples.num_examples(), ")"));
    }
    FOREMAN_RETURN_IF_ERROR(CheckLabel(m.spec, r, examples.host_labels_[static_cast<std::size_t>(indices[r])]));
  }
  if (m.pending.has_value() && m.WorkspaceOn(device)) {
    return absl::FailedPreconditionError(absl::StrCat("Mlp::LaunchTrainStep: the step launched before on ",
                                                      device.name(), " was not finished (FinishTrainStep)"));
  }
  Impl::DeviceVars v;
  FOREMAN_RETURN_IF_ERROR(m.ResolveDeviceVars(&vars, vars, device, /*train=*/true, &v));
  // On another device than the workspace's, this frees that one (and drops
  // a step launched there).
  FOREMAN_ASSIGN_OR_RETURN(Impl::DeviceStep s, m.ReserveStep(device, rows, 4, /*indices=*/true));
  const int64_t input_bytes = Impl::kIndicesOffset + rows * 4;
  FOREMAN_RETURN_IF_ERROR(m.ReserveHostBuffers(device, input_bytes));
  // No step is in flight (the last one was finished): its copy has read these bytes.
  char* inputs = m.host_inputs.raw_data();
  std::memcpy(inputs, &m.optimizer.learning_rate, sizeof(float));
  std::memcpy(inputs + Impl::kIndicesOffset, indices, static_cast<std::size_t>(rows) * 4);
  char* stats = m.host_stats.raw_data();

  const auto* device_indices = reinterpret_cast<const int32_t*>(s.step_block + Impl::kIndicesOffset);
  auto record = [&]() -> Status {
    // The step's inputs, read from page-locked memory when the step runs.
    FOREMAN_RETURN_IF_ERROR(device.CopyToDeviceAsync(s.step_block, inputs, input_bytes));
    compute::GatherArgs g;
    g.images = examples.images();
    g.example_labels = examples.labels();
    g.num_examples = examples.num_examples();
    g.feature_dim = examples.feature_dim();
    g.indices = device_indices;
    g.rows = rows;
    g.features = s.features;
    g.labels = static_cast<int32_t*>(s.labels);
    FOREMAN_RETURN_IF_ERROR(device.GatherExamples(g));
    FOREMAN_RETURN_IF_ERROR(m.DeviceStepOps(s.features, s.labels, compute::LabelType::kInt32, rows, v, s, device));
    // Its statistics, in page-locked memory once the step is done.
    return device.CopyToHostAsync(stats, s.stats, sizeof(compute::SoftmaxXentStats));
  };
  if (!device.supports_capture()) {
    FOREMAN_RETURN_IF_ERROR(record());
  } else {
    // Everything the recorded operations read or write, by address.
    std::vector<uintptr_t> key = {reinterpret_cast<uintptr_t>(&device), static_cast<uintptr_t>(rows),
                                  reinterpret_cast<uintptr_t>(examples.images()),
                                  reinterpret_cast<uintptr_t>(examples.labels()),
                                  static_cast<uintptr_t>(examples.num_examples()), reinterpret_cast<uintptr_t>(inputs),
                                  reinterpret_cast<uintptr_t>(stats)};
    for (const Impl::DeviceBlock& b : m.blocks) key.push_back(reinterpret_cast<uintptr_t>(b.ptr));
    for (std::size_t l = 0; l < m.layers.size(); ++l) {
      key.push_back(reinterpret_cast<uintptr_t>(v.kernels[l]));
      key.push_back(reinterpret_cast<uintptr_t>(v.biases[l]));
      for (float* p : v.kernel_slots[l]) key.push_back(reinterpret_cast<uintptr_t>(p));
      for (float* p : v.bias_slots[l]) key.push_back(reinterpret_cast<uintptr_t>(p));
    }
    key.push_back(reinterpret_cast<uintptr_t>(v.beta1_power));
    key.push_back(reinterpret_cast<uintptr_t>(v.beta2_power));
    FOREMAN_ASSIGN_OR_RETURN(compute::CapturedOps * ops, m.CapturedStep(device, std::move(key), record));
    FOREMAN_RETURN_IF_ERROR(ops->Replay());
  }
  FOREMAN_ASSIGN_OR_RETURN(uint64_t marker, device.RecordMarker());
  m.pending = Impl::Pending{marker, rows};
  return absl::OkStatus();
}

bool Mlp::train_step_pending() const {
  const Impl& m = *impl_;
  return m.pending.has_value() && m.ws_device != nullptr && !m.ws_lifetime.expired();
}

StatusOr<StepResult> Mlp::FinishTrainStep() {
  Impl& m = *impl_;
  if (!train_step_pending()) {
    return absl::FailedPreconditionError("Mlp::FinishTrainStep: no launched step is pending (LaunchTrainStep)");
  }
  const Impl::Pending p = *m.pending;
  m.pending.reset();
  FOREMAN_RETURN_IF_ERROR(m.ws_device->WaitForMarker(p.marker));
  compute::SoftmaxXentStats host;
  std::memcpy(&host, m.host_stats.raw_data(), sizeof(host));
  return Impl::ResultOf(host, p.rows);
}

StatusOr<StepResult> Mlp::Evaluate(const VariableStore& vars, const DeviceExamples& examples,
                                   compute::Device& device) {
  Impl& m = *impl_;
  FOREMAN_RETURN_IF_ERROR(CheckExamples(m.spec, examples, device));
  const int64_t rows = examples.num_examples();
  for (int64_t r = 0; r < rows; ++r) {
    FOREMAN_RETURN_IF_ERROR(CheckLabel(m.spec, r, examples.host_labels_[static_cast<std::size_t>(r)]));
  }
  Impl::DeviceVars v;
  FOREMAN_RETURN_IF_ERROR(m.ResolveDeviceVars(nullptr, vars, device, /*train=*/false, &v));
  const int64_t chunk = std::min(kEvalChunkRows, rows);
  FOREMAN_ASSIGN_OR_RETURN(Impl::DeviceStep s, m.ReserveStep(device, chunk, 4, /*indices=*/false));
  // Each chunk gathers examples [begin, begin + n) as indices 0..n-1 of the
  // arrays offset by begin: one iota uploaded once.
  FOREMAN_ASSIGN_OR_RETURN(void* iota_mem, m.Block(device, Impl::kEvalIndices, chunk * 4));
  auto* iota = static_cast<int32_t*>(iota_mem);
  if (m.eval_indices_ready < chunk) {
    std::vector<int32_t> host(static_cast<std::size_t>(chunk));
    for (int64_t i = 0; i < chunk; ++i) host[static_cast<std::size_t>(i)] = static_cast<int32_t>(i);
    FOREMAN_RETURN_IF_ERROR(device.CopyToDevice(iota, host.data(), chunk * 4));
    m.eval_indices_ready = chunk;
  }
  const compute::SoftmaxXentStats zero;
  FOREMAN_RETURN_IF_ERROR(device.CopyToDevice(s.stats, &zero, sizeof(zero)));
  for (int64_t begin = 0; begin < rows; begin += kEvalChunkRows) {
    const int64_t n = std::min(kEvalChunkRows, rows - begin);
    compute::GatherArgs g;
    g.images = examples.images() + begin * examples.feature_dim();
    g.example_labels = examples.labels() + begin;
    g.num_examples = n;
    g.feature_dim = examples.feature_dim();
    g.indices = iota;
    g.rows = n;
    g.features = s.features;
    g.labels = static_cast<int32_t*>(s.labels);
    FOREMAN_RETURN_IF_ERROR(device.GatherExamples(g));
    FOREMAN_RETURN_IF_ERROR(m.DeviceForward(s.features, n, v, s.outputs, device));
    compute::SoftmaxXentArgs xent;
    xent.logits = s.outputs[m.layers.size() - 1];
    xent.labels = s.labels;
    xent.label_type = compute::LabelType::kInt32;
    xent.rows = n;
    xent.classes = m.spec.num_classes;
    FOREMAN_RETURN_IF_ERROR(device.SoftmaxXentForwardToDevice(xent, s.stats));
  }
  return Impl::ReadStats(device, s.stats, rows);
}

}  // namespace foreman::nn
