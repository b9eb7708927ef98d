// The math the CUDA kernels share with the host (src/compute/kernel_math.hpp),
// checked on the CPU: the elementwise updates (but Adam's var, see there),
// Adam's scalars, the gather's conversion and the softmax cross-entropy row
// are bitwise the CPU device's baseline kernels (what a GPU step reproduces);
// the GEMM's fmaf dot product is within 1e-5 of a double-precision
// reference and its epilogues are the CPU's.
#include "compute/kernel_math.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "compute/cpu_device.hpp"
#include "foreman/compute.hpp"
#include "support/random_floats.hpp"

namespace foreman::compute {
namespace {

using testing::Random;

/// Bitwise equality of float arrays; the first difference is reported.
void CheckBitwise(const std::vector<float>& got, const std::vector<float>& want, const char* what) {
  REQUIRE(got.size() == want.size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    if (std::memcmp(&got[i], &want[i], sizeof(float)) != 0) {
      FAIL_CHECK(std::string(what) << "[" << i << "]: " << got[i] << " != " << want[i]);
      return;
    }
  }
}

// 1037 elements: not a multiple of the CPU's vector width, so Eigen's
// scalar tail is compared too.
constexpr int64_t kN = 1037;

TEST_CASE("the optimizer updates are bitwise the CPU device's baseline kernels") {
  CpuDevice cpu(1, CpuIsa::kBaseline);
  REQUIRE(cpu.isa() == CpuIsa::kBaseline);
  const std::vector<float> grad = Random(kN, 1, -3.0f, 3.0f);
  const std::vector<float> var0 = Random(kN, 2);
  const std::vector<float> slot0 = Random(kN, 3, 0.0f, 0.5f);
  const std::vector<float> slot1 = Random(kN, 4, 0.0f, 0.01f);

  SUBCASE("ApplyGradientDescent") {
    std::vector<float> want = var0, got = var0;
    REQUIRE(cpu.ApplyGradientDescent(want.data(), grad.data(), kN, 0.0731f).ok());
    for (int64_t i = 0; i < kN; ++i) got[i] = math::GradientDescent(got[i], grad[i], 0.0731f);
    CheckBitwise(got, want, "var");
  }
  for (bool nesterov : {false, true}) {
    CAPTURE(nesterov);
    std::vector<float> want_var = var0, want_accum = slot0, got_var = var0, got_accum = slot0;
    MomentumParams p;
    p.learning_rate = 0.0173f;
    p.momentum = 0.91f;
    p.use_nesterov = nesterov;
    REQUIRE(cpu.ApplyMomentum(want_var.data(), want_accum.data(), grad.data(), kN, p).ok());
    for (int64_t i = 0; i < kN; ++i) {
      math::Momentum(&got_var[i], &got_accum[i], grad[i], p.learning_rate, p.momentum, nesterov);
    }
    CheckBitwise(got_var, want_var, "var");
    CheckBitwise(got_accum, want_accum, "accum");
  }
  SUBCASE("ApplyAdam, several steps") {
    // m and v are bitwise the CPU's. var is not quite: the CPU's vectorized
    // sqrt is Eigen's fast one (EIGEN_FAST_MATH: _mm_rsqrt_ps and a Newton
    // step, 1-2 bits short of IEEE, and vendor-specific), while the kernels
    // take the IEEE square root (sqrtf on the GPU, std::sqrt here, as TF's
    // scalar and CUDA kernels do). So var is within one ulp of itself plus
    // 1e-6 of the update of the CPU's, and bitwise math::Adam with std::sqrt.
    std::vector<float> want_var = var0, want_m = slot0, want_v = slot1;
    std::vector<float> got_var = var0, got_m = slot0, got_v = slot1;
    for (int step = 0; step < 3; ++step) {
      CAPTURE(step);
      const std::vector<float> g = Random(kN, 10 + step, -2.0f, 2.0f);
      AdamParams p;
      p.step_size = 0.001f * static_cast<float>(step + 1);
      std::vector<float> ieee_var = want_var;
      REQUIRE(cpu.ApplyAdam(want_var.data(), want_m.data(), want_v.data(), g.data(), kN, p).ok());
      for (int64_t i = 0; i < kN; ++i) {
        math::Adam(&got_var[i], &got_m[i], &got_v[i], g[i], p.step_size, p.beta1, p.beta2, p.epsilon);
        const float update = (got_m[i] * p.step_size) / (std::sqrt(got_v[i]) + p.epsilon);
        ieee_var[i] = ieee_var[i] - update;  // the IEEE reference, written out
        const float ulp = std::nextafter(std::fabs(want_var[i]), INFINITY) - std::fabs(want_var[i]);
        if (std::fabs(got_var[i] - want_var[i]) > ulp + 1e-6f * std::fabs(update)) {
          FAIL_CHECK("var[" << i << "] = " << got_var[i] << ", the CPU's " << want_var[i]);
          break;
        }
      }
      CheckBitwise(got_var, ieee_var, "var (IEEE sqrt)");
      CheckBitwise(got_m, want_m, "m");
      CheckBitwise(got_v, want_v, "v");
      got_var = want_var;  // each step from the CPU's variables
    }
  }
}

TEST_CASE("Adam's step size and beta powers are bitwise the CPU device's") {
  CpuDevice cpu(1, CpuIsa::kBaseline);
  float b1p = 0.9f, b2p = 0.999f;
  float host_b1p = b1p, host_b2p = b2p;
  for (int step = 0; step < 50; ++step) {
    const float lr = 0.001f + 0.0001f * static_cast<float>(step);
    float want = 0;
    REQUIRE(cpu.AdamStepSize(DeviceScalar{&lr}, DeviceScalar{&b1p}, DeviceScalar{&b2p}, &want).ok());
    const float got = math::AdamStepSize(lr, host_b1p, host_b2p);
    REQUIRE(std::memcmp(&got, &want, sizeof(float)) == 0);
    REQUIRE(cpu.AdamFinish(&b1p, &b2p, 0.9f, 0.999f).ok());
    host_b1p = host_b1p * 0.9f;
    host_b2p = host_b2p * 0.999f;
    REQUIRE(std::memcmp(&host_b1p, &b1p, sizeof(float)) == 0);
    REQUIRE(std::memcmp(&host_b2p, &b2p, sizeof(float)) == 0);
  }
}

TEST_CASE("the gather's pixel conversion is bitwise the CPU device's for every byte") {
  CpuDevice cpu(1, CpuIsa::kBaseline);
  std::vector<uint8_t> images(256), labels = {7};
  for (int i = 0; i < 256; ++i) images[i] = static_cast<uint8_t>(i);
  const int32_t index = 0;
  std::vector<float> want(256);
  int32_t label = -1;
  GatherArgs a;
  a.images = images.data();
  a.example_labels = labels.data();
  a.num_examples = 1;
  a.feature_dim = 256;
  a.indices = &index;
  a.rows = 1;
  a.features = want.data();
  a.labels = &label;
  REQUIRE(cpu.GatherExamples(a).ok());
  CHECK(label == 7);
  std::vector<float> got(256);
  for (int i = 0; i < 256; ++i) got[i] = math::PixelToFeature(static_cast<uint8_t>(i));
  CheckBitwise(got, want, "features");
  CHECK(got[255] == 1.0f);
}

TEST_CASE("the softmax cross-entropy row is bitwise the CPU device's (loss, correct count, gradient)") {
  CpuDevice cpu(1, CpuIsa::kBaseline);
  const int64_t rows = 77, classes = 10;
  std::vector<float> logits = Random(rows * classes, 21, -8.0f, 8.0f);
  // A row with a tie (the first maximum wins) and a row of equal logits.
  logits[3 * classes + 2] = logits[3 * classes + 7] = 20.0f;
  for (int64_t c = 0; c < classes; ++c) logits[5 * classes + c] = 0.25f;
  std::vector<int32_t> labels(rows);
  std::mt19937 rng(22);
  for (auto& l : labels) l = static_cast<int32_t>(rng() % classes);
  labels[3] = 7;  // the second of the tied maxima: not correct
  labels[5] = 0;  // the first of equal logits: correct
  SoftmaxXentArgs args;
  args.logits = logits.data();
  args.labels = labels.data();
  args.rows = rows;
  args.classes = classes;
  const float scale = 1.0f / static_cast<float>(rows);

  SoftmaxXentStats want_stats;
  want_stats.loss_sum = 1.25;  // adds to what is there
  want_stats.correct = 3;
  std::vector<float> want_grad(rows * classes);
  REQUIRE(cpu.SoftmaxXent(args, &want_stats, scale, want_grad.data()).ok());

  double loss_sum = 1.25;
  int64_t correct = 3;
  std::vector<float> got_grad(rows * classes);
  double forward_sum = 1.25;
  for (int64_t r = 0; r < rows; ++r) {
    float loss = 0, forward_loss = 0;
    bool ok = false, forward_ok = false;
    math::SoftmaxXentRow(logits.data() + r * classes, classes, labels[r], scale, got_grad.data() + r * classes,
                         &loss, &ok);
    math::SoftmaxXentRow(logits.data() + r * classes, classes, labels[r], 0.0f, nullptr, &forward_loss, &forward_ok);
    REQUIRE(std::memcmp(&loss, &forward_loss, sizeof(float)) == 0);  // with or without the gradient
    REQUIRE(ok == forward_ok);
    if (r == 3) CHECK_FALSE(ok);
    if (r == 5) CHECK(ok);
    loss_sum += static_cast<double>(loss);
    forward_sum += static_cast<double>(forward_loss);
    correct += ok ? 1 : 0;
  }
  CHECK(std::memcmp(&loss_sum, &want_stats.loss_sum, sizeof(double)) == 0);
  CHECK(std::memcmp(&forward_sum, &want_stats.loss_sum, sizeof(double)) == 0);
  CHECK(correct == want_stats.correct);
  CheckBitwise(got_grad, want_grad, "grad");
}

TEST_CASE("the GEMM's fmaf dot product is within 1e-5 of double precision; its epilogues are the CPU's") {
  // The GPU sums each output as acc = GemmFma(acc, a[k], b[k]) in k order
  // from 0. Error relative to sum |a_k·b_k| (the dot product's condition).
  for (int64_t k : {1, 10, 128, 256, 784, 8192}) {
    CAPTURE(k);
    const std::vector<float> a = Random(k, 30 + static_cast<uint32_t>(k));
    const std::vector<float> b = Random(k, 31 + static_cast<uint32_t>(k), -0.1f, 0.1f);
    float acc = 0.0f;
    double exact = 0, magnitude = 0;
    for (int64_t i = 0; i < k; ++i) {
      acc = math::GemmFma(acc, a[i], b[i]);
      exact += static_cast<double>(a[i]) * static_cast<double>(b[i]);
      magnitude += std::fabs(static_cast<double>(a[i]) * static_cast<double>(b[i]));
    }
    CHECK(std::fabs(static_cast<double>(acc) - exact) <= 1e-5 * magnitude);
  }
  // One FMA rounds once: 1 + 2^-24 · (1 + 2^-23) is not 1 (a multiply, then
  // an add, would round the product's low bits away first).
  const float tiny = std::ldexp(1.0f, -24), just_over_one = 1.0f + std::ldexp(1.0f, -23);
  CHECK(math::GemmFma(1.0f, tiny, just_over_one) > 1.0f);

  // The epilogues against the CPU device's fused GEMM with k = 1 (one exact
  // product, so only the epilogue's rounding and semantics remain).
  CpuDevice cpu(1, CpuIsa::kBaseline);
  const int64_t m = 3, n = 37;
  const std::vector<float> a = Random(m, 40), b = Random(n, 41), bias = Random(n, 42), act = Random(m * n, 43);
  for (Epilogue e : {Epilogue::kNone, Epilogue::kBias, Epilogue::kBiasRelu, Epilogue::kReluGradMask}) {
    CAPTURE(static_cast<int>(e));
    std::vector<float> want(m * n), got(m * n);
    GemmArgs g;
    g.a = a.data();
    g.b = b.data();
    g.c = want.data();
    g.m = m;
    g.n = n;
    g.k = 1;
    g.epilogue = e;
    g.bias = bias.data();
    g.relu_output = act.data();
    REQUIRE(cpu.Gemm(g).ok());
    for (int64_t r = 0; r < m; ++r) {
      for (int64_t c = 0; c < n; ++c) {
        const float v = math::GemmFma(0.0f, a[r], b[c]);
        float out = v;
        if (e == Epilogue::kBias) out = math::EpilogueBias(v, bias[c]);
        if (e == Epilogue::kBiasRelu) out = math::EpilogueBiasRelu(v, bias[c]);
        if (e == Epilogue::kReluGradMask) out = math::EpilogueReluGradMask(v, act[r * n + c]);
        got[r * n + c] = out;
      }
    }
    CheckBitwise(got, want, "c");
  }
  CHECK(math::Relu(-2.0f) == 0.0f);
  CHECK(std::signbit(math::Relu(-0.0f)));  // std::max(x, 0)'s: -0 passes through
  CHECK(std::isnan(math::Relu(std::numeric_limits<float>::quiet_NaN())));
}


/// GemmKernel<P, kPipelined>'s blocks on the host, each block's threads
/// phase by phase in the kernel's order: pipelined, every thread fetches
/// step 0, then per step stages, (barrier) fetches the next step, sums,
/// (barrier); otherwise fetches, stages, (barrier) sums, (barrier).
template <int P, bool kPipelined>
void RunGemmBlocks(const GemmArgs& g) {
  namespace G = math::gemm;
  constexpr int kTile = G::kTileOf<P>;
  constexpr int kFetch = G::kFetchOf<P>;
  const int64_t rows = G::RowsWithSums(g);
  const int64_t blocks_y = (rows + kTile - 1) / kTile, blocks_x = (g.n + kTile - 1) / kTile;
  for (int64_t by = 0; by < blocks_y; ++by) {
    for (int64_t bx = 0; bx < blocks_x; ++bx) {
      static G::SharedTile<P> as, bs;
      std::vector<std::array<std::array<float, P>, P>> acc(G::kThreads);
      for (auto& x : acc) {
        for (auto& row : x) row.fill(0.0f);
      }
      // Each thread's registers, poisoned until fetched.
      std::vector<std::array<float, kFetch>> fa(G::kThreads), fb(G::kThreads);
      for (auto& x : fa) x.fill(std::nanf(""));
      for (auto& x : fb) x.fill(std::nanf(""));
      auto fetch = [&](int64_t row0, int64_t col0, int64_t k0) {
        for (int tid = 0; tid < G::kThreads; ++tid) {
          float a[kFetch], b[kFetch];
          G::FetchTiles<P>(g, row0, col0, k0, tid, a, b);
          std::copy(a, a + kFetch, fa[tid].begin());
          std::copy(b, b + kFetch, fb[tid].begin());
        }
      };
      const int64_t row0 = by * kTile, col0 = bx * kTile;
      if (kPipelined && g.k > 0) fetch(row0, col0, 0);
      for (int64_t k0 = 0; k0 < g.k; k0 += G::kDepth) {
        if (!kPipelined) fetch(row0, col0, k0);
        for (auto& row : as) std::fill(std::begin(row), std::end(row), std::nanf(""));  // unstaged: poison
        for (auto& row : bs) std::fill(std::begin(row), std::end(row), std::nanf(""));
        for (int tid = 0; tid < G::kThreads; ++tid) {
          float a[kFetch], b[kFetch];
          std::copy(fa[tid].begin(), fa[tid].end(), a);
          std::copy(fb[tid].begin(), fb[tid].end(), b);
          G::StageTiles<P>(g, tid, a, b, as, bs);
        }
        if (kPipelined && k0 + G::kDepth < g.k) fetch(row0, col0, k0 + G::kDepth);
        const int depth = static_cast<int>(std::min<int64_t>(G::kDepth, g.k - k0));
        for (int tid = 0; tid < G::kThreads; ++tid) {
          float sums[P][P];
          for (int i = 0; i < P; ++i) {
            for (int j = 0; j < P; ++j) sums[i][j] = acc[tid][i][j];
          }
          G::AccumulateTiles<P>(tid, depth, as, bs, sums);
          for (int i = 0; i < P; ++i) {
            for (int j = 0; j < P; ++j) acc[tid][i][j] = sums[i][j];
          }
        }
      }
      for (int tid = 0; tid < G::kThreads; ++tid) {
        float sums[P][P];
        for (int i = 0; i < P; ++i) {
          for (int j = 0; j < P; ++j) sums[i][j] = acc[tid][i][j];
        }
        G::StoreOutputs<P>(g, row0, col0, tid, sums);
      }
    }
  }
}

/// Every variant of GemmKernel: P = 4 and 1, pipelined and not, each into
/// its own copy of c (and of column_sums); all must be bitwise equal.
struct GemmRuns {
  std::vector<std::vector<float>> c, sums;
};
GemmRuns RunAllGemmKernels(GemmArgs g, int64_t c_size) {
  GemmRuns out;
  for (int variant = 0; variant < 4; ++variant) {
    out.c.emplace_back(c_size, std::nanf(""));
    out.sums.emplace_back(g.n, std::nanf(""));
    g.c = out.c.back().data();
    if (g.column_sums != nullptr) g.column_sums = out.sums.back().data();
    switch (variant) {
      case 0: RunGemmBlocks<4, true>(g); break;
      case 1: RunGemmBlocks<1, true>(g); break;
      case 2: RunGemmBlocks<4, false>(g); break;
      default: RunGemmBlocks<1, false>(g); break;
    }
  }
  return out;
}

TEST_CASE("the GPU GEMM's tiles, run block by block on the host, give each output's k-ordered fmaf sum, within 1e-5 of the CPU's") {
  // What GemmKernel<4> and <1> do, with their __syncthreads() phases in
  // sequence: every layout, partial tiles in m, n and k, every epilogue.
  struct Case {
    int64_t m, n, k;
    bool ta, tb;
    Epilogue e;
  };
  const Case cases[] = {{70, 130, 33, false, false, Epilogue::kBiasRelu}, {65, 10, 100, false, false, Epilogue::kBias},
                        {129, 64, 17, true, false, Epilogue::kNone},      {40, 77, 10, false, true, Epilogue::kReluGradMask},
                        {33, 17, 65, true, true, Epilogue::kNone},        {5, 7, 0, false, false, Epilogue::kBiasRelu},
                        {64, 64, 16, false, false, Epilogue::kNone},
                        // The MLP's step at batch 128: forward, kernel gradients, ReLU's backward.
                        {128, 256, 784, false, false, Epilogue::kBiasRelu}, {128, 10, 256, false, false, Epilogue::kBias},
                        {784, 256, 128, true, false, Epilogue::kNone},      {256, 10, 128, true, false, Epilogue::kNone},
                        {128, 256, 10, false, true, Epilogue::kReluGradMask}};
  CpuDevice cpu(1, CpuIsa::kBaseline);
  uint32_t seed = 50;
  for (const Case& t : cases) {
    CAPTURE(t.m);
    CAPTURE(t.n);
    CAPTURE(t.k);
    CAPTURE(t.ta);
    CAPTURE(t.tb);
    const std::vector<float> a = Random(t.m * t.k, seed++), b = Random(t.k * t.n, seed++);
    const std::vector<float> bias = Random(t.n, seed++), act = Random(t.m * t.n, seed++);
    std::vector<float> want(t.m * t.n);
    GemmArgs g;
    g.a = a.data();
    g.b = b.data();
    g.m = t.m;
    g.n = t.n;
    g.k = t.k;
    g.transpose_a = t.ta;
    g.transpose_b = t.tb;
    g.epilogue = t.e;
    g.bias = bias.data();
    g.relu_output = act.data();
    const GemmRuns runs = RunAllGemmKernels(g, t.m * t.n);
    for (int64_t r = 0; r < t.m; ++r) {
      for (int64_t c = 0; c < t.n; ++c) {
        float sum = 0.0f;
        for (int64_t kk = 0; kk < t.k; ++kk) {
          sum = math::GemmFma(sum, t.ta ? a[kk * t.m + r] : a[r * t.k + kk], t.tb ? b[c * t.k + kk] : b[kk * t.n + c]);
        }
        float v = sum;
        if (t.e == Epilogue::kBias) v = math::EpilogueBias(sum, bias[c]);
        if (t.e == Epilogue::kBiasRelu) v = math::EpilogueBiasRelu(sum, bias[c]);
        if (t.e == Epilogue::kReluGradMask) v = math::EpilogueReluGradMask(sum, act[r * t.n + c]);
        want[r * t.n + c] = v;
      }
    }
    // Every output written (no NaN left), each its fmaf chain.
    CheckBitwise(runs.c[0], want, "c (P = 4, pipelined)");
    CheckBitwise(runs.c[1], want, "c (P = 1, pipelined)");
    CheckBitwise(runs.c[2], want, "c (P = 4)");
    CheckBitwise(runs.c[3], want, "c (P = 1)");
    // And within 1e-5 of the CPU device's GEMM, relative to the sum of the
    // products' magnitudes (plus the bias's).
    std::vector<float> cpu_c(t.m * t.n);
    g.c = cpu_c.data();
    REQUIRE(cpu.Gemm(g).ok());
    for (int64_t r = 0; r < t.m; ++r) {
      for (int64_t c = 0; c < t.n; ++c) {
        double magnitude = 0;
        for (int64_t kk = 0; kk < t.k; ++kk) {
          magnitude += std::fabs(static_cast<double>(t.ta ? a[kk * t.m + r] : a[r * t.k + kk]) *
                                 (t.tb ? b[c * t.k + kk] : b[kk * t.n + c]));
        }
        if (t.e == Epilogue::kBias || t.e == Epilogue::kBiasRelu) magnitude += std::fabs(bias[c]);
        const double diff = std::fabs(static_cast<double>(want[r * t.n + c]) - cpu_c[r * t.n + c]);
        if (diff > 1e-5 * magnitude) {
          FAIL_CHECK("c[" << r << "," << c << "] = " << want[r * t.n + c] << ", the CPU's " << cpu_c[r * t.n + c]);
          r = t.m;
          break;
        }
      }
    }
  }
}

TEST_CASE("the GPU GEMM's row of ones writes op(B)'s column sums bitwise as ColumnSums and leaves C unchanged") {
  // GemmArgs::column_sums: the bias gradient in the kernel gradient's launch
  // (the MLP's step at batch 128 first), in every kernel variant, on the host
  // simulation of the GPU's blocks and on the CPU device.
  struct Case {
    int64_t m, n, k;
    bool ta, tb;
  };
  const Case cases[] = {{784, 256, 128, true, false}, {256, 10, 128, true, false}, {70, 33, 1000, true, false},
                        {64, 64, 16, false, false},   {63, 17, 37, false, true},   {5, 3, 1, true, true},
                        {0, 20, 50, true, false},     {10, 5, 0, true, false}};
  CpuDevice cpu(1, CpuIsa::kBaseline);
  CpuDevice best(1);
  uint32_t seed = 90;
  for (const Case& t : cases) {
    CAPTURE(t.m);
    CAPTURE(t.n);
    CAPTURE(t.k);
    CAPTURE(t.tb);
    const std::vector<float> a = Random(t.m * t.k, seed++), b = Random(t.k * t.n, seed++);
    // op(B) as stored [k, n]: what ColumnSums is given.
    std::vector<float> op_b(t.k * t.n);
    for (int64_t kk = 0; kk < t.k; ++kk) {
      for (int64_t c = 0; c < t.n; ++c) op_b[kk * t.n + c] = t.tb ? b[c * t.k + kk] : b[kk * t.n + c];
    }
    std::vector<float> want_sums(t.n, std::nanf(""));
    REQUIRE(cpu.ColumnSums(op_b.data(), t.k, t.n, want_sums.data()).ok());
    GemmArgs g;
    g.a = t.m > 0 ? a.data() : nullptr;
    g.b = b.data();
    g.m = t.m;
    g.n = t.n;
    g.k = t.k;
    g.transpose_a = t.ta;
    g.transpose_b = t.tb;
    const GemmRuns plain = RunAllGemmKernels(g, t.m * t.n);
    std::vector<float> sums_arg(t.n);
    g.column_sums = sums_arg.data();
    const GemmRuns with = RunAllGemmKernels(g, t.m * t.n);
    for (std::size_t v = 0; v < with.c.size(); ++v) {
      CAPTURE(v);
      CheckBitwise(with.sums[v], want_sums, "column_sums");
      CheckBitwise(with.c[v], plain.c[0], "c");
    }
    for (CpuDevice* dev : {&cpu, &best}) {
      std::vector<float> c0(t.m * t.n, std::nanf("")), c1(t.m * t.n, std::nanf("")), sums(t.n, std::nanf(""));
      GemmArgs h = g;
      h.column_sums = nullptr;
      h.c = c0.data();
      REQUIRE(dev->Gemm(h).ok());
      h.c = c1.data();
      h.column_sums = sums.data();
      REQUIRE(dev->Gemm(h).ok());
      CheckBitwise(sums, want_sums, "the CPU device's column_sums");
      CheckBitwise(c1, c0, "the CPU device's c");
    }
  }
  // Only with the epilogue kNone: a bias would not belong to the sums.
  std::vector<float> a(12, 1.0f), b(12, 1.0f), c(9), bias(3), sums(3);
  GemmArgs g;
  g.a = a.data();
  g.b = b.data();
  g.c = c.data();
  g.m = g.n = 3;
  g.k = 4;
  g.epilogue = Epilogue::kBias;
  g.bias = bias.data();
  g.column_sums = sums.data();
  const Status s = cpu.Gemm(g);
  CHECK(s.code() == absl::StatusCode::kInvalidArgument);
  CHECK(std::string(s.message()).find("column_sums") != std::string::npos);
}

/// XentStatsKernel's block on the host, phase by phase: every thread's
/// rows, then each tree level after the last. Returns the block's loss sum
/// and correct count (thread 0's, which the kernel adds to its output).
std::pair<double, long long> RunXentStatsBlock(const SoftmaxXentArgs& args, float scale, float* grad) {
  namespace X = math::xent_stats;
  std::vector<double> losses(X::kThreads, std::nan(""));
  std::vector<long long> corrects(X::kThreads, -1);
  for (int tid = 0; tid < X::kThreads; ++tid) X::ThreadRows(args, scale, grad, tid, losses.data(), corrects.data());
  for (int half = X::kThreads / 2; half > 0; half /= 2) {
    for (int tid = 0; tid < X::kThreads; ++tid) X::TreeLevel(tid, half, losses.data(), corrects.data());
  }
  return {losses[0], corrects[0]};
}

TEST_CASE("the GPU statistics kernel, run thread by thread on the host: every row once, its gradient bitwise, the "
          "loss sum in a fixed tree within 1e-12 of the serial sum") {
  // XentStatsKernel's phases (math::xent_stats): rows fewer than, equal to
  // and several times the block's threads, a partial last round.
  namespace X = math::xent_stats;
  CpuDevice cpu(1, CpuIsa::kBaseline);
  for (const int64_t rows : {int64_t{1}, int64_t{128}, int64_t{X::kThreads}, int64_t{3 * X::kThreads + 77}}) {
    CAPTURE(rows);
    const int64_t classes = 10;
    const std::vector<float> logits = Random(rows * classes, static_cast<uint32_t>(rows), -6.0f, 6.0f);
    std::vector<int64_t> labels(rows);
    std::mt19937 rng(static_cast<uint32_t>(rows) + 1);
    for (auto& l : labels) l = static_cast<int64_t>(rng() % classes);
    SoftmaxXentArgs args;
    args.logits = logits.data();
    args.labels = labels.data();
    args.label_type = LabelType::kInt64;
    args.rows = rows;
    args.classes = classes;
    const float scale = 1.0f / static_cast<float>(rows);
    std::vector<float> grad(rows * classes, std::nanf(""));
    const auto [loss_sum, correct] = RunXentStatsBlock(args, scale, grad.data());
    SoftmaxXentStats want;
    std::vector<float> want_grad(rows * classes);
    REQUIRE(cpu.SoftmaxXent(args, &want, scale, want_grad.data()).ok());
    CHECK(correct == want.correct);
    CHECK(std::fabs(loss_sum - want.loss_sum) <= 1e-12 * want.loss_sum);
    CheckBitwise(grad, want_grad, "grad");  // every row's, written once (no NaN left)
    // Without a gradient: the same sums (nothing to write).
    const auto [loss_sum2, correct2] = RunXentStatsBlock(args, scale, nullptr);
    CHECK(std::memcmp(&loss_sum2, &loss_sum, sizeof(double)) == 0);
    CHECK(correct2 == correct);
  }
}

TEST_CASE("the GPU's one-kernel Adam update gives every element of every variable to exactly one thread") {
  // AdamGroupKernel's indices (math::adam_group) for each block and thread
  // of the planned grid: small and empty variables, and one larger than the
  // block cap allows in one pass (grid-stride).
  namespace A = math::adam_group;
  constexpr int kThreads = 256;
  constexpr int64_t kMaxBlocks = 16;
  const std::vector<std::vector<int64_t>> groups = {
      {200704, 256, 2560, 10}, {0, 5, 0}, {1}, {kThreads * kMaxBlocks * 3 + 7, 0, 513}, {0, 0, 0, 0, 0, 0, 0, 1}};
  for (const std::vector<int64_t>& sizes : groups) {
    CAPTURE(sizes.size());
    REQUIRE(sizes.size() <= static_cast<std::size_t>(A::kMaxVariables));
    std::vector<AdamVariable> vars(sizes.size());
    for (std::size_t j = 0; j < sizes.size(); ++j) vars[j].n = sizes[j];
    int64_t block_start[A::kMaxVariables + 1];
    const int count = static_cast<int>(sizes.size());
    const int64_t blocks = A::PlanBlocks(vars.data(), count, kThreads, kMaxBlocks, block_start);
    std::vector<std::vector<int>> seen(sizes.size());
    for (std::size_t j = 0; j < sizes.size(); ++j) {
      seen[j].assign(static_cast<std::size_t>(sizes[j]), 0);
      const int64_t own = block_start[j + 1] - block_start[j];
      CHECK(own == (sizes[j] == 0 ? 0 : std::min<int64_t>(kMaxBlocks, (sizes[j] + kThreads - 1) / kThreads)));
    }
    for (int64_t b = 0; b < blocks; ++b) {
      const int j = A::VariableOfBlock(block_start, count, b);
      REQUIRE(b >= block_start[j]);
      REQUIRE(b < block_start[j + 1]);
      const int64_t first = block_start[j], own = block_start[j + 1] - first;
      for (int t = 0; t < kThreads; ++t) {
        for (int64_t i = (b - first) * kThreads + t; i < sizes[j]; i += own * kThreads) ++seen[j][i];
      }
    }
    for (std::size_t j = 0; j < sizes.size(); ++j) {
      CAPTURE(j);
      CHECK(std::all_of(seen[j].begin(), seen[j].end(), [](int c) { return c == 1; }));
    }
  }
}

}  // namespace
}  // namespace foreman::compute
