// The `gpu` suite: the CUDA compute::Device ("/gpu:0") operation by operation
// against the CPU device on its baseline kernels (bitwise where the math is
// shared, src/compute/kernel_math.hpp — Adam's var against the shared math
// with the IEEE sqrt, the CPU's being Eigen's fast approximation; the GEMM
// bitwise against the k-ordered fmaf sum and within 1e-5 of the CPU's; the
// softmax within CUDA's expf/logf accuracy), a captured step replayed against the same step run eagerly,
// copies into page-locked host tensors, asynchronous copies and markers,
// memory limits, device indices and a sticky error. Exits 77 (meson's "skipped") without a CUDA device.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "compute/cpu_device.hpp"
#include "compute/cuda_device.hpp"
#include "compute/device_factory.hpp"
#include "compute/kernel_math.hpp"
#include "foreman/compute.hpp"
#include "foreman/cuda.hpp"
#include "support/async_contract.hpp"
#include "support/device_buffers.hpp"
#include "support/random_floats.hpp"

namespace foreman::compute {
namespace {

using testing::Random;

template <class T>
bool SameBits(const std::vector<T>& got, const std::vector<T>& want, const char* what) {
  if (got.size() != want.size()) {
    FAIL_CHECK(std::string(what) << ": " << got.size() << " elements, want " << want.size());
    return false;
  }
  for (std::size_t i = 0; i < got.size(); ++i) {
    if (std::memcmp(&got[i], &want[i], sizeof(T)) != 0) {
      FAIL_CHECK(std::string(what) << "[" << i << "]: " << got[i] << " != " << want[i]);
      return false;
    }
  }
  return true;
}

std::unique_ptr<Device> Gpu(int64_t memory_limit_bytes = 0) {
  auto d = CreateCudaDevice(0, memory_limit_bytes);
  REQUIRE_MESSAGE(d.ok(), d.status().ToString());
  return std::move(*d);
}

/// Device buffers released with the arena; a failed device call fails the test.
class Arena : public testing::DeviceBuffers {
 public:
  explicit Arena(Device& d)
      : DeviceBuffers(d, [](const std::string& what, const Status& s) {
          FAIL(what << ": " << s.ToString());
        }) {}
};

// -- operations against the CPU ------------------------------------------------

struct GemmCase {
  int64_t m, n, k;
  bool ta, tb;
  Epilogue e;
};

TEST_CASE("Gemm: every layout and epilogue is the k-ordered fmaf sum, within 1e-5 of the CPU device") {
  auto gpu = Gpu();
  CpuDevice cpu(1, CpuIsa::kBaseline);
  Arena arena(*gpu);
  const GemmCase cases[] = {
      {130, 257, 785, false, false, Epilogue::kBiasRelu},     // layer 1 forward
      {130, 10, 256, false, false, Epilogue::kBias},          // layer 2 forward
      {300, 70, 130, true, false, Epilogue::kNone},           // a kernel gradient (TN)
      {784, 256, 128, true, false, Epilogue::kNone},          // the MLP's at batch 128 (and its bias's)
      {130, 256, 10, false, true, Epilogue::kReluGradMask},  // the backward through ReLU (NT)
      {33, 17, 65, true, true, Epilogue::kNone},
      {5, 7, 0, false, false, Epilogue::kBiasRelu},  // k = 0: the epilogue of zeros
      // Enough 64 x 64 tiles for two blocks per multiprocessor (an H200 has
      // 132): GemmKernel<4>; the shapes above run GemmKernel<1>.
      {2048, 1024, 33, false, false, Epilogue::kBiasRelu},
      {1030, 2050, 19, true, true, Epilogue::kReluGradMask},
  };
  uint32_t seed = 100;
  for (const GemmCase& t : cases) {
    CAPTURE(t.m);
    CAPTURE(t.n);
    CAPTURE(t.k);
    CAPTURE(t.ta);
    CAPTURE(t.tb);
    const std::vector<float> a = Random(t.m * t.k, seed++), b = Random(t.k * t.n, seed++);
    const std::vector<float> bias = Random(t.n, seed++), act = Random(t.m * t.n, seed++);
    GemmArgs g;
    g.m = t.m;
    g.n = t.n;
    g.k = t.k;
    g.transpose_a = t.ta;
    g.transpose_b = t.tb;
    g.epilogue = t.e;
    std::vector<float> want(t.m * t.n);
    g.a = a.data();
    g.b = b.data();
    g.bias = bias.data();
    g.relu_output = act.data();
    g.c = want.data();
    REQUIRE(cpu.Gemm(g).ok());
    g.a = arena.Put(a);
    g.b = arena.Put(b);
    g.bias = arena.Put(bias);
    g.relu_output = arena.Put(act);
    float* c = arena.Zeros<float>(t.m * t.n);
    g.c = c;
    const Status s = gpu->Gemm(g);
    REQUIRE_MESSAGE(s.ok(), s.ToString());
    const std::vector<float> got = arena.Get(c, t.m * t.n);

    std::vector<float> fmaf_sum(t.m * t.n);
    bool close = true;
    for (int64_t r = 0; r < t.m; ++r) {
      for (int64_t col = 0; col < t.n; ++col) {
        float acc = 0.0f;
        double magnitude = 0;
        for (int64_t kk = 0; kk < t.k; ++kk) {
          const float av = t.ta ? a[kk * t.m + r] : a[r * t.k + kk];
          const float bv = t.tb ? b[col * t.k + kk] : b[kk * t.n + col];
          acc = math::GemmFma(acc, av, bv);
          magnitude += std::fabs(static_cast<double>(av) * bv);
        }
        float v = acc;
        if (t.e == Epilogue::kBias) v = math::EpilogueBias(acc, bias[col]);
        if (t.e == Epilogue::kBiasRelu) v = math::EpilogueBiasRelu(acc, bias[col]);
        if (t.e == Epilogue::kReluGradMask) v = math::EpilogueReluGradMask(acc, act[r * t.n + col]);
        fmaf_sum[r * t.n + col] = v;
        const double bias_mag = t.e == Epilogue::kBias || t.e == Epilogue::kBiasRelu ? std::fabs(bias[col]) : 0.0;
        const double diff = std::fabs(static_cast<double>(got[r * t.n + col]) - want[r * t.n + col]);
        if (close && diff > 1e-5 * (magnitude + bias_mag) + 1e-30) {
          FAIL_CHECK("c[" << r << "," << col << "] = " << got[r * t.n + col] << ", the CPU's " << want[r * t.n + col]);
          close = false;
        }
      }
    }
    SameBits(got, fmaf_sum, "c vs the k-ordered fmaf sum");

    if (t.e == Epilogue::kNone) {
      // With column_sums: op(B)'s column sums in the same launch, bitwise
      // ColumnSums' (the bias gradient in a training step), C unchanged.
      std::vector<float> op_b(t.k * t.n);
      for (int64_t kk = 0; kk < t.k; ++kk) {
        for (int64_t col = 0; col < t.n; ++col) op_b[kk * t.n + col] = t.tb ? b[col * t.k + kk] : b[kk * t.n + col];
      }
      std::vector<float> want_sums(t.n);
      REQUIRE(cpu.ColumnSums(op_b.data(), t.k, t.n, want_sums.data()).ok());
      float* c2 = arena.Zeros<float>(t.m * t.n);
      float* sums = arena.Zeros<float>(t.n);
      g.c = c2;
      g.column_sums = sums;
      const Status s2 = gpu->Gemm(g);
      REQUIRE_MESSAGE(s2.ok(), s2.ToString());
      SameBits(arena.Get(c2, t.m * t.n), got, "c with column_sums");
      SameBits(arena.Get(sums, t.n), want_sums, "column_sums vs ColumnSums");
    }
  }
}

TEST_CASE("ColumnSums is bitwise the CPU device's") {
  auto gpu = Gpu();
  CpuDevice cpu(1, CpuIsa::kBaseline);
  Arena arena(*gpu);
  const int64_t rows = 1000, cols = 257;
  const std::vector<float> delta = Random(rows * cols, 7);
  std::vector<float> want(cols);
  REQUIRE(cpu.ColumnSums(delta.data(), rows, cols, want.data()).ok());
  float* out = arena.Zeros<float>(cols);
  REQUIRE(gpu->ColumnSums(arena.Put(delta), rows, cols, out).ok());
  SameBits(arena.Get(out, cols), want, "column sums");
}

void CheckGradClose(const std::vector<float>& got, const std::vector<float>& want, float scale) {
  REQUIRE(got.size() == want.size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    if (std::fabs(got[i] - want[i]) > 1e-6f * scale + 1e-5f * std::fabs(want[i])) {
      FAIL_CHECK("grad[" << i << "] = " << got[i] << ", the CPU's " << want[i]);
      return;
    }
  }
}

TEST_CASE("softmax cross-entropy: the CPU's within expf/logf accuracy; its device forms bitwise its host forms") {
  auto gpu = Gpu();
  CpuDevice cpu(1, CpuIsa::kBaseline);
  Arena arena(*gpu);
  const int64_t rows = 1000, classes = 10;  // several chunks of the statistics kernel
  const std::vector<float> logits = Random(rows * classes, 11, -6.0f, 6.0f);
  std::vector<int32_t> labels32(rows);
  std::vector<int64_t> labels64(rows);
  std::mt19937 rng(12);
  for (int64_t r = 0; r < rows; ++r) labels64[r] = labels32[r] = static_cast<int32_t>(rng() % classes);
  const float scale = 1.0f / static_cast<float>(rows);
  SoftmaxXentArgs host_args;
  host_args.logits = logits.data();
  host_args.labels = labels32.data();
  host_args.rows = rows;
  host_args.classes = classes;
  SoftmaxXentStats want;
  want.loss_sum = 1.5;
  want.correct = 2;
  std::vector<float> want_grad(rows * classes);
  REQUIRE(cpu.SoftmaxXent(host_args, &want, scale, want_grad.data()).ok());

  SoftmaxXentArgs args = host_args;
  args.logits = arena.Put(logits);
  for (LabelType type : {LabelType::kInt32, LabelType::kInt64}) {
    CAPTURE(static_cast<int>(type));
    args.label_type = type;
    args.labels = type == LabelType::kInt32 ? static_cast<const void*>(arena.Put(labels32))
                                            : static_cast<const void*>(arena.Put(labels64));
    SoftmaxXentStats stats;
    stats.loss_sum = 1.5;
    stats.correct = 2;
    float* grad = arena.Zeros<float>(rows * classes);
    const Status s = gpu->SoftmaxXent(args, &stats, scale, grad);
    REQUIRE_MESSAGE(s.ok(), s.ToString());
    CHECK(stats.correct == want.correct);
    CHECK(std::fabs(stats.loss_sum - want.loss_sum) <= 1e-5 * std::fabs(want.loss_sum));
    const std::vector<float> host_grad = arena.Get(grad, rows * classes);
    CheckGradClose(host_grad, want_grad, scale);

    // The forward alone adds the same values; the backward alone writes the same gradient.
    SoftmaxXentStats forward;
    forward.loss_sum = 1.5;
    forward.correct = 2;
    REQUIRE(gpu->SoftmaxXentForward(args, &forward).ok());
    CHECK(std::memcmp(&forward, &stats, sizeof(stats)) == 0);
    float* grad2 = arena.Zeros<float>(rows * classes);
    REQUIRE(gpu->SoftmaxXentBackward(args, scale, grad2).ok());
    SameBits(arena.Get(grad2, rows * classes), host_grad, "SoftmaxXentBackward's grad");

    // Statistics left on the device: overwritten by SoftmaxXentToDevice
    // (from 0), added to by SoftmaxXentForwardToDevice, chunks summing as one.
    SoftmaxXentStats from_zero;
    REQUIRE(gpu->SoftmaxXentForward(args, &from_zero).ok());
    auto* dstats = arena.Zeros<SoftmaxXentStats>(1);
    const SoftmaxXentStats junk{123.0, 45};
    REQUIRE(gpu->CopyToDevice(dstats, &junk, sizeof(junk)).ok());
    float* grad3 = arena.Zeros<float>(rows * classes);
    REQUIRE(gpu->SoftmaxXentToDevice(args, scale, grad3, dstats).ok());
    SoftmaxXentStats on_device = arena.Get(dstats, 1)[0];
    CHECK(std::memcmp(&on_device, &from_zero, sizeof(on_device)) == 0);
    SameBits(arena.Get(grad3, rows * classes), host_grad, "SoftmaxXentToDevice's grad");

    auto* chunked = arena.Zeros<SoftmaxXentStats>(1);
    SoftmaxXentArgs first = args, second = args;
    first.rows = 300;
    second.rows = rows - 300;
    second.logits = args.logits + 300 * classes;
    second.labels = type == LabelType::kInt32 ? static_cast<const void*>(static_cast<const int32_t*>(args.labels) + 300)
                                              : static_cast<const void*>(static_cast<const int64_t*>(args.labels) + 300);
    REQUIRE(gpu->SoftmaxXentForwardToDevice(first, chunked).ok());
    REQUIRE(gpu->SoftmaxXentForwardToDevice(second, chunked).ok());
    SoftmaxXentStats summed = arena.Get(chunked, 1)[0];
    // Each call sums its rows in the kernel's tree: chunks sum as one to
    // within a double's rounding (not bitwise), the correct count exactly.
    CHECK(summed.correct == from_zero.correct);
    CHECK(std::fabs(summed.loss_sum - from_zero.loss_sum) <= 1e-12 * std::fabs(from_zero.loss_sum));
    // The same call twice: the same bits (a fixed order, no atomics).
    SoftmaxXentStats again;
    REQUIRE(gpu->SoftmaxXentForward(args, &again).ok());
    CHECK(std::memcmp(&again, &from_zero, sizeof(again)) == 0);
  }
}

TEST_CASE("ApplyAdamGroup is bitwise AdamStepSize, each ApplyAdam and AdamFinish on the device, eager and captured") {
  // One kernel for all the variables (two launches for more than 8; empty
  // variables; one over the block cap: a grid-stride loop), against the same
  // device's separate operations.
  auto gpu = Gpu();
  Arena arena(*gpu);
  const std::vector<int64_t> sizes = {200704, 256, 0, 2560, 10, 3000001, 7, 1, 0, 1037, 33};  // 9 not empty
  const float lr = 0.0371f, b1 = 0.9f, b2 = 0.999f, eps = 1e-8f;
  float* dlr = arena.Put(std::vector<float>{lr});
  for (bool captured : {false, true}) {
    CAPTURE(captured);
    std::vector<AdamVariable> group, alone;
    uint32_t seed = 300;
    for (int64_t n : sizes) {
      const std::vector<float> var = Random(n, seed++), m = Random(n, seed++, 0.0f, 0.5f);
      const std::vector<float> v = Random(n, seed++, 0.0f, 0.01f), grad = Random(n, seed++, -3.0f, 3.0f);
      const float* dgrad = n > 0 ? arena.Put(grad) : nullptr;
      group.push_back({n > 0 ? arena.Put(var) : nullptr, n > 0 ? arena.Put(m) : nullptr,
                       n > 0 ? arena.Put(v) : nullptr, dgrad, n});
      alone.push_back({n > 0 ? arena.Put(var) : nullptr, n > 0 ? arena.Put(m) : nullptr,
                       n > 0 ? arena.Put(v) : nullptr, dgrad, n});
    }
    float* gs = arena.Put(std::vector<float>{b1 * b1, b2 * b2, -1.0f});  // beta1_power, beta2_power, step_size
    float* as = arena.Put(std::vector<float>{b1 * b1, b2 * b2, -2.0f});
    auto run_group = [&] {
      return gpu->ApplyAdamGroup(group.data(), static_cast<int64_t>(group.size()), DeviceScalar{dlr}, gs, gs + 1, b1,
                                 b2, eps, gs + 2);
    };
    if (captured) {
      REQUIRE(gpu->BeginCapture().ok());
      const Status s = run_group();
      auto ops = gpu->EndCapture();
      REQUIRE_MESSAGE(s.ok(), s.ToString());
      REQUIRE_MESSAGE(ops.ok(), ops.status().ToString());
      REQUIRE((*ops)->Replay().ok());
      REQUIRE((*ops)->Replay().ok());  // twice: the powers advance at each replay
    } else {
      const Status s = run_group();
      REQUIRE_MESSAGE(s.ok(), s.ToString());
      REQUIRE(run_group().ok());
    }
    for (int step = 0; step < 2; ++step) {
      REQUIRE(gpu->AdamStepSize(DeviceScalar{dlr}, DeviceScalar{as}, DeviceScalar{as + 1}, as + 2).ok());
      for (const AdamVariable& x : alone) {
        REQUIRE(gpu->ApplyAdam(x.var, x.m, x.v, x.grad, x.n, DeviceScalar{as + 2}, b1, b2, eps).ok());
      }
      REQUIRE(gpu->AdamFinish(as, as + 1, b1, b2).ok());
    }
    SameBits(arena.Get(gs, 3), arena.Get(as, 3), "beta1_power, beta2_power, step_size");
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      CAPTURE(i);
      if (sizes[i] == 0) continue;
      SameBits(arena.Get(group[i].var, sizes[i]), arena.Get(alone[i].var, sizes[i]), "var");
      SameBits(arena.Get(group[i].m, sizes[i]), arena.Get(alone[i].m, sizes[i]), "m");
      SameBits(arena.Get(group[i].v, sizes[i]), arena.Get(alone[i].v, sizes[i]), "v");
    }
  }
}

TEST_CASE("the optimizer updates and Adam's scalars are bitwise the CPU device's") {
  auto gpu = Gpu();
  CpuDevice cpu(1, CpuIsa::kBaseline);
  Arena arena(*gpu);
  const int64_t n = 100003;
  const std::vector<float> grad = Random(n, 1, -3.0f, 3.0f), var0 = Random(n, 2);
  const std::vector<float> slot0 = Random(n, 3, 0.0f, 0.5f), slot1 = Random(n, 4, 0.0f, 0.01f);
  const float* dgrad = arena.Put(grad);
  const float lr = 0.0371f;
  float* dlr = arena.Put(std::vector<float>{lr});

  for (bool scalar : {false, true}) {
    CAPTURE(scalar);
    {
      std::vector<float> want = var0;
      REQUIRE(cpu.ApplyGradientDescent(want.data(), grad.data(), n, lr).ok());
      float* v = arena.Put(var0);
      REQUIRE((scalar ? gpu->ApplyGradientDescent(v, dgrad, n, DeviceScalar{dlr})
                      : gpu->ApplyGradientDescent(v, dgrad, n, lr))
                  .ok());
      SameBits(arena.Get(v, n), want, "ApplyGradientDescent var");
    }
    for (bool nesterov : {false, true}) {
      CAPTURE(nesterov);
      MomentumParams p;
      p.learning_rate = lr;
      p.momentum = 0.9f;
      p.use_nesterov = nesterov;
      std::vector<float> want_var = var0, want_accum = slot0;
      REQUIRE(cpu.ApplyMomentum(want_var.data(), want_accum.data(), grad.data(), n, p).ok());
      float* v = arena.Put(var0);
      float* accum = arena.Put(slot0);
      REQUIRE((scalar ? gpu->ApplyMomentum(v, accum, dgrad, n, DeviceScalar{dlr}, 0.9f, nesterov)
                      : gpu->ApplyMomentum(v, accum, dgrad, n, p))
                  .ok());
      SameBits(arena.Get(v, n), want_var, "ApplyMomentum var");
      SameBits(arena.Get(accum, n), want_accum, "ApplyMomentum accum");
    }
    {
      AdamParams p;
      p.step_size = lr;
      std::vector<float> want_var = var0, want_m = slot0, want_v = slot1;
      REQUIRE(cpu.ApplyAdam(want_var.data(), want_m.data(), want_v.data(), grad.data(), n, p).ok());
      float* v = arena.Put(var0);
      float* m = arena.Put(slot0);
      float* vv = arena.Put(slot1);
      REQUIRE((scalar ? gpu->ApplyAdam(v, m, vv, dgrad, n, DeviceScalar{dlr}, p.beta1, p.beta2, p.epsilon)
                      : gpu->ApplyAdam(v, m, vv, dgrad, n, p))
                  .ok());
      // var: bitwise the shared math with the IEEE sqrt (math::Adam on the
      // host); the CPU's vectorized sqrt is Eigen's fast approximation, so
      // against the CPU within one ulp plus 1e-6 of the update.
      std::vector<float> ieee_var = var0, ieee_m = slot0, ieee_v = slot1;
      for (int64_t i = 0; i < n; ++i) {
        math::Adam(&ieee_var[i], &ieee_m[i], &ieee_v[i], grad[i], lr, p.beta1, p.beta2, p.epsilon);
      }
      const std::vector<float> got_var = arena.Get(v, n);
      SameBits(got_var, ieee_var, "ApplyAdam var (IEEE sqrt)");
      for (int64_t i = 0; i < n; ++i) {
        const float update = std::fabs(var0[i] - ieee_var[i]);
        const float ulp = std::nextafter(std::fabs(want_var[i]), INFINITY) - std::fabs(want_var[i]);
        if (std::fabs(got_var[i] - want_var[i]) > ulp + 1e-6f * update) {
          FAIL_CHECK("ApplyAdam var[" << i << "] = " << got_var[i] << ", the CPU's " << want_var[i]);
          break;
        }
      }
      SameBits(arena.Get(m, n), want_m, "ApplyAdam m");
      SameBits(arena.Get(vv, n), want_v, "ApplyAdam v");
    }
  }

  // Adam's scalars over many steps.
  float b1p = 0.9f, b2p = 0.999f;
  float* d = arena.Put(std::vector<float>{0.9f, 0.999f, 0.0f});  // beta1_power, beta2_power, step_size
  for (int step = 0; step < 100; ++step) {
    float want_step = 0;
    REQUIRE(cpu.AdamStepSize(DeviceScalar{&lr}, DeviceScalar{&b1p}, DeviceScalar{&b2p}, &want_step).ok());
    REQUIRE(cpu.AdamFinish(&b1p, &b2p, 0.9f, 0.999f).ok());
    REQUIRE(gpu->AdamStepSize(DeviceScalar{dlr}, DeviceScalar{d}, DeviceScalar{d + 1}, d + 2).ok());
    REQUIRE(gpu->AdamFinish(d, d + 1, 0.9f, 0.999f).ok());
    const std::vector<float> got = arena.Get(d, 3);
    REQUIRE(SameBits(got, std::vector<float>{b1p, b2p, want_step}, "beta1_power, beta2_power, step_size"));
  }
}

TEST_CASE("GatherExamples is bitwise the CPU device's") {
  auto gpu = Gpu();
  CpuDevice cpu(1, CpuIsa::kBaseline);
  Arena arena(*gpu);
  const int64_t examples = 1000, dim = 784, rows = 300;
  std::mt19937 rng(5);
  std::vector<uint8_t> images(examples * dim), example_labels(examples);
  for (auto& p : images) p = static_cast<uint8_t>(rng());
  for (auto& l : example_labels) l = static_cast<uint8_t>(rng() % 10);
  std::vector<int32_t> indices(rows);
  for (auto& i : indices) i = static_cast<int32_t>(rng() % examples);
  GatherArgs a;
  a.images = images.data();
  a.example_labels = example_labels.data();
  a.num_examples = examples;
  a.feature_dim = dim;
  a.indices = indices.data();
  a.rows = rows;
  std::vector<float> want(rows * dim);
  std::vector<int32_t> want_labels(rows);
  a.features = want.data();
  a.labels = want_labels.data();
  REQUIRE(cpu.GatherExamples(a).ok());
  a.images = arena.Put(images);
  a.example_labels = arena.Put(example_labels);
  a.indices = arena.Put(indices);
  float* features = arena.Zeros<float>(rows * dim);
  int32_t* labels = arena.Zeros<int32_t>(rows);
  a.features = features;
  a.labels = labels;
  REQUIRE(gpu->GatherExamples(a).ok());
  SameBits(arena.Get(features, rows * dim), want, "features");
  SameBits(arena.Get(labels, rows), want_labels, "labels");
}

// -- a captured step -------------------------------------------------------------

/// An MLP 784-64-10 step's buffers on the device (Adam).
struct StepBuffers {
  static constexpr int64_t kIn = 784, kHidden = 64, kClasses = 10, kExamples = 500, kMaxRows = 96;
  uint8_t* images;
  uint8_t* example_labels;
  float* block;  // {learning rate, indices as int32...}
  float *w1, *b1, *w2, *b2;
  float *m[4], *v[4];
  float* powers;  // beta1_power, beta2_power, step_size
  float *x, *h, *logits, *dlogits, *dh, *g[4];
  int32_t* labels;
  SoftmaxXentStats* stats;
};

StepBuffers MakeStep(Arena& arena) {
  using S = StepBuffers;
  StepBuffers s{};
  std::mt19937 rng(9);
  std::vector<uint8_t> images(S::kExamples * S::kIn), labels(S::kExamples);
  for (auto& p : images) p = static_cast<uint8_t>(rng());
  for (auto& l : labels) l = static_cast<uint8_t>(rng() % S::kClasses);
  s.images = arena.Put(images);
  s.example_labels = arena.Put(labels);
  s.block = arena.Zeros<float>(1 + S::kMaxRows);
  s.w1 = arena.Put(Random(S::kIn * S::kHidden, 1, -0.05f, 0.05f));
  s.b1 = arena.Put(Random(S::kHidden, 2, -0.01f, 0.01f));
  s.w2 = arena.Put(Random(S::kHidden * S::kClasses, 3, -0.2f, 0.2f));
  s.b2 = arena.Put(Random(S::kClasses, 4, -0.01f, 0.01f));
  const int64_t sizes[4] = {S::kIn * S::kHidden, S::kHidden, S::kHidden * S::kClasses, S::kClasses};
  for (int i = 0; i < 4; ++i) {
    s.m[i] = arena.Zeros<float>(sizes[i]);
    s.v[i] = arena.Zeros<float>(sizes[i]);
    s.g[i] = arena.Zeros<float>(sizes[i]);
  }
  s.powers = arena.Put(std::vector<float>{0.9f, 0.999f, 0.0f});
  s.x = arena.Zeros<float>(S::kMaxRows * S::kIn);
  s.h = arena.Zeros<float>(S::kMaxRows * S::kHidden);
  s.logits = arena.Zeros<float>(S::kMaxRows * S::kClasses);
  s.dlogits = arena.Zeros<float>(S::kMaxRows * S::kClasses);
  s.dh = arena.Zeros<float>(S::kMaxRows * S::kHidden);
  s.labels = arena.Zeros<int32_t>(S::kMaxRows);
  s.stats = arena.Zeros<SoftmaxXentStats>(1);
  return s;
}

/// One training step over `rows` gathered rows: forward, backward, Adam.
Status RunStep(Device& d, const StepBuffers& s, int64_t rows) {
  using S = StepBuffers;
  GatherArgs ga;
  ga.images = s.images;
  ga.example_labels = s.example_labels;
  ga.num_examples = S::kExamples;
  ga.feature_dim = S::kIn;
  ga.indices = reinterpret_cast<const int32_t*>(s.block + 1);
  ga.rows = rows;
  ga.features = s.x;
  ga.labels = s.labels;
  FOREMAN_RETURN_IF_ERROR(d.GatherExamples(ga));
  auto gemm = [&](const float* a, const float* b, float* c, int64_t m, int64_t n, int64_t k, bool ta, bool tb,
                  Epilogue e, const float* bias, const float* act) {
    GemmArgs g;
    g.a = a;
    g.b = b;
    g.c = c;
    g.m = m;
    g.n = n;
    g.k = k;
    g.transpose_a = ta;
    g.transpose_b = tb;
    g.epilogue = e;
    g.bias = bias;
    g.relu_output = act;
    return d.Gemm(g);
  };
  FOREMAN_RETURN_IF_ERROR(gemm(s.x, s.w1, s.h, rows, S::kHidden, S::kIn, false, false, Epilogue::kBiasRelu, s.b1, nullptr));
  FOREMAN_RETURN_IF_ERROR(
      gemm(s.h, s.w2, s.logits, rows, S::kClasses, S::kHidden, false, false, Epilogue::kBias, s.b2, nullptr));
  SoftmaxXentArgs xa;
  xa.logits = s.logits;
  xa.labels = s.labels;
  xa.rows = rows;
  xa.classes = S::kClasses;
  FOREMAN_RETURN_IF_ERROR(d.SoftmaxXentToDevice(xa, 1.0f / static_cast<float>(rows), s.dlogits, s.stats));
  FOREMAN_RETURN_IF_ERROR(
      gemm(s.h, s.dlogits, s.g[2], S::kHidden, S::kClasses, rows, true, false, Epilogue::kNone, nullptr, nullptr));
  FOREMAN_RETURN_IF_ERROR(d.ColumnSums(s.dlogits, rows, S::kClasses, s.g[3]));
  FOREMAN_RETURN_IF_ERROR(
      gemm(s.dlogits, s.w2, s.dh, rows, S::kHidden, S::kClasses, false, true, Epilogue::kReluGradMask, nullptr, s.h));
  FOREMAN_RETURN_IF_ERROR(gemm(s.x, s.dh, s.g[0], S::kIn, S::kHidden, rows, true, false, Epilogue::kNone, nullptr, nullptr));
  FOREMAN_RETURN_IF_ERROR(d.ColumnSums(s.dh, rows, S::kHidden, s.g[1]));
  FOREMAN_RETURN_IF_ERROR(
      d.AdamStepSize(DeviceScalar{s.block}, DeviceScalar{s.powers}, DeviceScalar{s.powers + 1}, s.powers + 2));
  float* vars[4] = {s.w1, s.b1, s.w2, s.b2};
  const int64_t sizes[4] = {S::kIn * S::kHidden, S::kHidden, S::kHidden * S::kClasses, S::kClasses};
  for (int i = 0; i < 4; ++i) {
    FOREMAN_RETURN_IF_ERROR(
        d.ApplyAdam(vars[i], s.m[i], s.v[i], s.g[i], sizes[i], DeviceScalar{s.powers + 2}, 0.9f, 0.999f, 1e-8f));
  }
  return d.AdamFinish(s.powers, s.powers + 1, 0.9f, 0.999f);
}

/// The step block of step `step`: a decaying learning rate and its rows.
std::vector<float> Block(int step, int64_t rows) {
  std::vector<float> block(1 + StepBuffers::kMaxRows);
  block[0] = 0.01f / static_cast<float>(1 + step);
  std::mt19937 rng(static_cast<uint32_t>(1000 + step));
  for (int64_t r = 0; r < rows; ++r) {
    const auto index = static_cast<int32_t>(rng() % StepBuffers::kExamples);
    std::memcpy(&block[1 + r], &index, sizeof(index));
  }
  return block;
}

TEST_CASE("a captured step replayed is bitwise the same step run eagerly, reading its rates at replay") {
  auto gpu = Gpu();
  REQUIRE(gpu->supports_capture());
  Arena arena(*gpu);
  const StepBuffers eager = MakeStep(arena), captured = MakeStep(arena);
  const int64_t rows = 96;
  std::unique_ptr<CapturedOps> graph;
  for (int step = 0; step < 4; ++step) {
    CAPTURE(step);
    const std::vector<float> block = Block(step, rows);
    const int64_t block_bytes = static_cast<int64_t>(block.size() * sizeof(float));
    REQUIRE(gpu->CopyToDevice(eager.block, block.data(), block_bytes).ok());
    const Status e = RunStep(*gpu, eager, rows);
    REQUIRE_MESSAGE(e.ok(), e.ToString());
    REQUIRE(gpu->CopyToDevice(captured.block, block.data(), block_bytes).ok());
    if (graph == nullptr) {
      REQUIRE(gpu->BeginCapture().ok());
      const Status c = RunStep(*gpu, captured, rows);
      REQUIRE_MESSAGE(c.ok(), c.ToString());
      auto ops = gpu->EndCapture();
      REQUIRE_MESSAGE(ops.ok(), ops.status().ToString());
      graph = std::move(*ops);
      // Recorded, not run: the variables are still the initial ones.
      if (step == 0) CHECK(arena.Get(captured.powers, 3)[0] == 0.9f);
    }
    REQUIRE(graph->Replay().ok());
    REQUIRE(gpu->Synchronize().ok());
    const std::pair<const float*, const float*> pairs[] = {
        {eager.w1, captured.w1}, {eager.b1, captured.b1}, {eager.w2, captured.w2}, {eager.b2, captured.b2},
        {eager.m[0], captured.m[0]}, {eager.v[0], captured.v[0]}, {eager.powers, captured.powers}};
    const int64_t sizes[] = {784 * 64, 64, 640, 10, 784 * 64, 784 * 64, 3};
    for (int i = 0; i < 7; ++i) {
      CAPTURE(i);
      SameBits(arena.Get(pairs[i].second, sizes[i]), arena.Get(pairs[i].first, sizes[i]), "captured vs eager");
    }
    const SoftmaxXentStats se = arena.Get(eager.stats, 1)[0], sc = arena.Get(captured.stats, 1)[0];
    CHECK(std::memcmp(&se, &sc, sizeof(se)) == 0);
    CHECK(std::isfinite(se.loss_sum));
    CHECK(se.loss_sum > 0);
  }
  // The step changed the weights (so the comparison above compared something).
  CHECK(arena.Get(eager.powers, 3)[0] != 0.9f);
}

TEST_CASE("capture: ops that give the host a value or wait are refused and spoil the capture") {
  auto gpu = Gpu();
  Arena arena(*gpu);
  float* p = arena.Zeros<float>(16);
  float host[16] = {};
  CHECK(gpu->EndCapture().status().code() == absl::StatusCode::kFailedPrecondition);
  using Op = std::function<Status()>;
  SoftmaxXentArgs xa;
  xa.logits = p;
  xa.labels = p;
  xa.rows = 1;
  xa.classes = 2;
  SoftmaxXentStats stats;
  HostCopy copy{host, p, 64};
  const std::pair<const char*, Op> refused[] = {
      {"Allocate", [&] { return gpu->Allocate(64).status(); }},
      {"CopyToHost", [&] { return gpu->CopyToHost(host, p, 64); }},
      {"CopyToDevice", [&] { return gpu->CopyToDevice(p, host, 64); }},
      {"CopyToHostBatch", [&] { return gpu->CopyToHostBatch(&copy, 1); }},
      {"SoftmaxXentForward", [&] { return gpu->SoftmaxXentForward(xa, &stats); }},
      {"SoftmaxXent", [&] { return gpu->SoftmaxXent(xa, &stats, 1.0f, p + 8); }},
      {"Synchronize", [&] { return gpu->Synchronize(); }},
  };
  for (const auto& [what, op] : refused) {
    CAPTURE(what);
    REQUIRE(gpu->BeginCapture().ok());
    CHECK(gpu->BeginCapture().code() == absl::StatusCode::kFailedPrecondition);  // already capturing
    CHECK(gpu->ColumnSums(p, 2, 2, p + 4).ok());
    const Status s = op();
    CHECK(s.code() == absl::StatusCode::kFailedPrecondition);
    CHECK(s.message().find(std::string("/gpu:0 ") + what) != absl::string_view::npos);
    auto ended = gpu->EndCapture();
    CHECK(ended.status().code() == absl::StatusCode::kFailedPrecondition);
    CHECK(ended.status().message() == s.message());
    // The device works on afterwards.
    REQUIRE(gpu->ColumnSums(p, 2, 2, p + 4).ok());
    REQUIRE(gpu->CopyToHost(host, p, 64).ok());
  }
  // An invalid argument during a capture is its error too.
  REQUIRE(gpu->BeginCapture().ok());
  CHECK(gpu->ColumnSums(p, -1, 2, p + 4).code() == absl::StatusCode::kInvalidArgument);
  CHECK(gpu->EndCapture().status().code() == absl::StatusCode::kInvalidArgument);
}

// -- copies, memory, devices, errors ---------------------------------------------

TEST_CASE("CopyToHostBatch lands every range in page-locked host tensors, after the work before it") {
  auto gpu = Gpu();
  Arena arena(*gpu);
  const std::vector<float> a = Random(100000, 1), b = Random(37 * 5, 2);
  float* da = arena.Put(a);
  float* db = arena.Put(b);
  auto ta = gpu->AllocateHostTensor(DataType::kFloat, TensorShape{100000});
  auto tb = gpu->AllocateHostTensor(DataType::kFloat, TensorShape{37, 5});
  REQUIRE(ta.ok());
  REQUIRE(tb.ok());
  CHECK(reinterpret_cast<uintptr_t>(ta->data<float>()) % 64 == 0);
  CHECK(tb->data<float>()[0] == 0.0f);  // zero-filled, as Tensor::Create's
  for (int round = 0; round < 2; ++round) {
    CAPTURE(round);
    // Queued work the batch must wait for: a gradient step on both.
    const std::vector<float> ga = Random(100000, 10 + round), gb = Random(37 * 5, 20 + round);
    REQUIRE(gpu->ApplyGradientDescent(da, arena.Put(ga), 100000, 0.5f).ok());
    REQUIRE(gpu->ApplyGradientDescent(db, arena.Put(gb), 37 * 5, 0.5f).ok());
    const HostCopy copies[] = {{ta->data<float>(), da, 100000 * 4}, {tb->data<float>(), db, 37 * 5 * 4}};
    const Status s = gpu->CopyToHostBatch(copies, 2);
    REQUIRE_MESSAGE(s.ok(), s.ToString());
    SameBits(std::vector<float>(ta->data<float>(), ta->data<float>() + 100000), arena.Get(da, 100000), "a");
    SameBits(std::vector<float>(tb->data<float>(), tb->data<float>() + 37 * 5), arena.Get(db, 37 * 5), "b");
  }
  const HostCopy bad{nullptr, da, 4};
  CHECK(gpu->CopyToHostBatch(&bad, 1).code() == absl::StatusCode::kInvalidArgument);
  // Pageable memory (its copy could not be asynchronous), or a range that
  // runs past a page-locked tensor's buffer, is refused as on the fake device.
  std::vector<float> pageable(4);
  const HostCopy unpinned{pageable.data(), da, 16};
  const Status s = gpu->CopyToHostBatch(&unpinned, 1);
  CHECK(s.code() == absl::StatusCode::kInvalidArgument);
  CHECK(s.message().find("CopyToHostBatch: copies[0].host_dst (16 bytes at 0x") != absl::string_view::npos);
  CHECK(s.message().find("is not page-locked host memory") != absl::string_view::npos);
  REQUIRE(gpu->Synchronize().ok());  // not a device failure: the device works on
}

// The same check as the fake device's (fake_device_test): more steps in
// flight than the ring of 4 marker events, the oldest waited for first.
TEST_CASE("asynchronous copies and markers: ten steps in flight, a wait for each lands its output") {
  auto gpu = Gpu();
  testing::CheckAsyncCopiesAndMarkers(*gpu);
}

TEST_CASE("memory: the limit and the device's own size give RESOURCE_EXHAUSTED naming /gpu:0 and the bytes") {
  auto gpu = Gpu(1 << 20);
  auto first = gpu->Allocate(512 * 1024);
  REQUIRE(first.ok());
  auto second = gpu->Allocate(768 * 1024);
  REQUIRE_FALSE(second.ok());
  CHECK(second.status().code() == absl::StatusCode::kResourceExhausted);
  CHECK(second.status().message().find("/gpu:0") != absl::string_view::npos);
  CHECK(second.status().message().find("786432 bytes") != absl::string_view::npos);
  gpu->Deallocate(*first);
  auto third = gpu->Allocate(768 * 1024);
  REQUIRE(third.ok());
  gpu->Deallocate(*third);
  CHECK(gpu->Allocate(-1).status().code() == absl::StatusCode::kInvalidArgument);

  auto unlimited = Gpu();
  const int64_t huge = int64_t{1} << 50;  // 1 PiB: more than any device has
  auto too_big = unlimited->Allocate(huge);
  REQUIRE_FALSE(too_big.ok());
  CHECK(too_big.status().code() == absl::StatusCode::kResourceExhausted);
  CHECK(too_big.status().message().find("/gpu:0") != absl::string_view::npos);
  CHECK(too_big.status().message().find(std::to_string(huge)) != absl::string_view::npos);
  // Not sticky: the device works on.
  auto fine = unlimited->Allocate(1024);
  REQUIRE(fine.ok());
  unlimited->Deallocate(*fine);
  auto zero = unlimited->Allocate(0);
  REQUIRE(zero.ok());
  CHECK(*zero != nullptr);
  unlimited->Deallocate(*zero);

  // Through the factory, as SessionConfig.device_memory_limit_bytes.
  auto limited = CreateDevice("/gpu:0", 1, 4096);
  REQUIRE(limited.ok());
  CHECK((*limited)->Allocate(8192).status().code() == absl::StatusCode::kResourceExhausted);
}

TEST_CASE("a device index out of range is FAILED_PRECONDITION naming it") {
  auto count = cuda::DeviceCount();
  REQUIRE(count.ok());
  for (int index : {*count, *count + 5, -1}) {
    CAPTURE(index);
    Status s = CreateCudaDevice(index, 0).status();
    CHECK(s.code() == absl::StatusCode::kFailedPrecondition);
    CHECK(s.message().find("/gpu:" + std::to_string(index)) != absl::string_view::npos);
  }
  Status s = CreateDevice("/gpu:" + std::to_string(*count), 1).status();
  CHECK(s.code() == absl::StatusCode::kFailedPrecondition);
  CHECK(CreateCudaDevice(0, -1).status().code() == absl::StatusCode::kInvalidArgument);
}

// Last: it leaves this process's CUDA context unusable.
TEST_CASE("a sticky error is INTERNAL naming the device and the call, and every later op fails at once") {
  auto gpu = Gpu();
  Arena arena(*gpu);
  float* p = arena.Zeros<float>(16);
  const Status fault = LaunchFaultingKernelForTesting(*gpu);
  CHECK(fault.code() == absl::StatusCode::kInternal);
  const std::string msg(fault.message());
  CHECK(msg.find("/gpu:0") != std::string::npos);
  CHECK(msg.find("cudaErrorIllegalAddress") != std::string::npos);
  float host[16];
  const Status later[] = {gpu->ColumnSums(p, 2, 2, p + 4), gpu->CopyToHost(host, p, 64), gpu->Synchronize(),
                          gpu->Allocate(64).status(), gpu->BeginCapture(),
                          gpu->ApplyGradientDescent(p, p + 8, 4, 0.1f)};
  for (const Status& s : later) {
    CHECK(s.code() == absl::StatusCode::kInternal);
    CHECK(s.message() == fault.message());
  }
  CpuDevice cpu(1);
  CHECK(LaunchFaultingKernelForTesting(cpu).code() == absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace foreman::compute

int main(int argc, char** argv) {
  auto n = foreman::cuda::DeviceCount();
  if (!n.ok() || *n == 0) {
    std::printf("skipped: %s\n", n.ok() ? "no CUDA device" : std::string(n.status().message()).c_str());
    return 77;
  }
  doctest::Context context(argc, argv);
  return context.run();
}
