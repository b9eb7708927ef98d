// The compute-device seam (foreman/compute.hpp): every CpuDevice operation
// against a plain scalar loop on small shapes, and SessionConfig.device's
// parsing and error codes.
#include "foreman/compute.hpp"

#include <doctest/doctest.h>

#define EIGEN_USE_THREADS
#include <unsupported/Eigen/CXX11/Tensor>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "compute/cpu_device.hpp"
#include "compute/device_factory.hpp"
#include "foreman/cuda.hpp"
#include "foreman/nn.hpp"
#include "foreman/session.hpp"
#include "support/random_floats.hpp"

namespace foreman::compute {
namespace {

using testing::Random;

/// op(A)·op(B) in double, row-major, shapes as GemmArgs.
std::vector<double> ReferenceProduct(const std::vector<float>& a, const std::vector<float>& b, int64_t m, int64_t n,
                                     int64_t k, bool ta, bool tb) {
  std::vector<double> c(static_cast<std::size_t>(m * n), 0.0);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double sum = 0;
      for (int64_t p = 0; p < k; ++p) {
        const float av = ta ? a[p * m + i] : a[i * k + p];
        const float bv = tb ? b[j * k + p] : b[p * n + j];
        sum += static_cast<double>(av) * static_cast<double>(bv);
      }
      c[i * n + j] = sum;
    }
  }
  return c;
}

const char* EpilogueName(Epilogue e) {
  switch (e) {
    case Epilogue::kNone: return "none";
    case Epilogue::kBias: return "bias";
    case Epilogue::kBiasRelu: return "bias+relu";
    case Epilogue::kReluGradMask: return "relu-grad-mask";
  }
  return "?";
}

/// Random operands of one Gemm [m, k]·[k, n] (seeds 1-4), the "ReLU outputs"
/// clamped at 0 so that about half are 0, as after a ReLU.
struct GemmInputs {
  GemmInputs(int64_t rows, int64_t cols, int64_t depth)
      : m(rows), n(cols), k(depth), a(Random(m * k, 1)), b(Random(k * n, 2)), bias(Random(n, 3)), relu(Random(m * n, 4)) {
    for (float& x : relu) x = std::max(x, 0.0f);
  }
  /// The arguments that write `c` [m, n].
  GemmArgs Args(bool ta, bool tb, Epilogue e, float* c) const {
    GemmArgs g;
    g.a = a.data();
    g.b = b.data();
    g.c = c;
    g.m = m;
    g.n = n;
    g.k = k;
    g.transpose_a = ta;
    g.transpose_b = tb;
    g.epilogue = e;
    g.bias = bias.data();
    g.relu_output = relu.data();
    return g;
  }
  int64_t m, n, k;
  std::vector<float> a, b, bias, relu;
};

TEST_CASE("Gemm matches a scalar loop for every transpose and epilogue") {
  CpuDevice dev(2);
  // Small, and large enough that Eigen splits the output into blocks.
  const std::vector<std::array<int64_t, 3>> shapes = {{1, 1, 1}, {5, 3, 7}, {33, 29, 17}, {130, 70, 300}};
  for (const auto& [m, n, k] : shapes) {
    for (int t = 0; t < 4; ++t) {
      const bool ta = (t & 1) != 0, tb = (t & 2) != 0;
      for (Epilogue e : {Epilogue::kNone, Epilogue::kBias, Epilogue::kBiasRelu, Epilogue::kReluGradMask}) {
        CAPTURE(m);
        CAPTURE(n);
        CAPTURE(k);
        CAPTURE(ta);
        CAPTURE(tb);
        INFO("epilogue ", EpilogueName(e));
        const GemmInputs in(m, n, k);
        const std::vector<float>& a = in.a;
        const std::vector<float>& b = in.b;
        const std::vector<float>& bias = in.bias;
        const std::vector<float>& relu = in.relu;
        std::vector<float> c(static_cast<std::size_t>(m * n), 123.0f);  // overwritten, not accumulated
        REQUIRE(dev.Gemm(in.Args(ta, tb, e, c.data())).ok());

        const std::vector<double> ref = ReferenceProduct(a, b, m, n, k, ta, tb);
        for (int64_t i = 0; i < m; ++i) {
          for (int64_t j = 0; j < n; ++j) {
            double want = ref[i * n + j];
            if (e == Epilogue::kBias || e == Epilogue::kBiasRelu) want += bias[j];
            if (e == Epilogue::kBiasRelu) want = std::max(want, 0.0);
            const float got = c[i * n + j];
            if (e == Epilogue::kReluGradMask && relu[i * n + j] <= 0) {
              REQUIRE(got == 0.0f);
            } else if (e == Epilogue::kBiasRelu && want <= 0) {
              REQUIRE(got >= 0.0f);
              REQUIRE(got <= 1e-4f);
            } else {
              REQUIRE(got == doctest::Approx(want).epsilon(1e-5).scale(static_cast<double>(k)));
            }
          }
        }

        // The same inputs give bitwise the same output.
        std::vector<float> again(c.size());
        REQUIRE(dev.Gemm(in.Args(ta, tb, e, again.data())).ok());
        REQUIRE(std::memcmp(c.data(), again.data(), c.size() * sizeof(float)) == 0);
      }
    }
  }
}

TEST_CASE("Gemm split across 2 and 3 intra-op threads (row blocks, or k for a weight gradient) agrees with 1 thread "
          "and is bitwise reproducible") {
  CpuDevice one(1), two(2), three(3);
  // Past the split's threshold (2^18 multiply-adds): an m of one row block
  // and one row; a k split into 8 + 8 + 1 rows; a 10-column weight gradient
  // (split along k whatever n); a product whose m is not a multiple of 8.
  const std::vector<std::array<int64_t, 3>> shapes = {{9, 300, 200}, {400, 40, 17}, {784, 10, 128}, {131, 67, 61}};
  for (const auto& [m, n, k] : shapes) {
    for (int t = 0; t < 4; ++t) {
      const bool ta = (t & 1) != 0, tb = (t & 2) != 0;
      for (Epilogue e : {Epilogue::kNone, Epilogue::kBiasRelu, Epilogue::kReluGradMask}) {
        CAPTURE(m);
        CAPTURE(n);
        CAPTURE(k);
        CAPTURE(ta);
        CAPTURE(tb);
        INFO("epilogue ", EpilogueName(e));
        const GemmInputs in(m, n, k);
        std::vector<float> c1(static_cast<std::size_t>(m * n), 7.0f), c2 = c1, c3 = c1, again = c1;
        REQUIRE(one.Gemm(in.Args(ta, tb, e, c1.data())).ok());
        REQUIRE(two.Gemm(in.Args(ta, tb, e, c2.data())).ok());
        REQUIRE(three.Gemm(in.Args(ta, tb, e, c3.data())).ok());
        for (std::size_t i = 0; i < c1.size(); ++i) {
          REQUIRE(c2[i] == doctest::Approx(c1[i]).epsilon(1e-5).scale(static_cast<double>(k)));
          REQUIRE(c3[i] == doctest::Approx(c1[i]).epsilon(1e-5).scale(static_cast<double>(k)));
        }
        for (CpuDevice* dev : {&two, &three}) {
          REQUIRE(dev->Gemm(in.Args(ta, tb, e, again.data())).ok());
          REQUIRE(std::memcmp((dev == &two ? c2 : c3).data(), again.data(), again.size() * sizeof(float)) == 0);
        }
      }
    }
  }
}

TEST_CASE("Gemm with k = 0 writes the epilogue of zeros") {
  CpuDevice dev(1);
  const std::vector<float> bias = {-1.0f, 2.0f};
  std::vector<float> c(4, 9.0f);
  GemmArgs g;
  g.c = c.data();
  g.m = 2;
  g.n = 2;
  g.k = 0;
  g.epilogue = Epilogue::kBiasRelu;
  g.bias = bias.data();
  REQUIRE(dev.Gemm(g).ok());
  CHECK(c == std::vector<float>{0.0f, 2.0f, 0.0f, 2.0f});
  g.epilogue = Epilogue::kNone;
  REQUIRE(dev.Gemm(g).ok());
  CHECK(c == std::vector<float>(4, 0.0f));
}

TEST_CASE("Gemm refuses bad arguments with INVALID_ARGUMENT and writes nothing") {
  CpuDevice dev(1);
  std::vector<float> a(6, 1.0f), b(6, 1.0f), c(4, 7.0f);
  GemmArgs g;
  g.a = a.data();
  g.b = b.data();
  g.c = c.data();
  g.m = 2;
  g.n = 2;
  g.k = 3;
  GemmArgs negative = g;
  negative.k = -1;
  CHECK(dev.Gemm(negative).code() == absl::StatusCode::kInvalidArgument);
  GemmArgs no_bias = g;
  no_bias.epilogue = Epilogue::kBias;
  Status s = dev.Gemm(no_bias);
  CHECK(s.code() == absl::StatusCode::kInvalidArgument);
  CHECK(s.message().find("bias") != absl::string_view::npos);
  GemmArgs no_mask = g;
  no_mask.epilogue = Epilogue::kReluGradMask;
  CHECK(dev.Gemm(no_mask).code() == absl::StatusCode::kInvalidArgument);
  GemmArgs no_a = g;
  no_a.a = nullptr;
  CHECK(dev.Gemm(no_a).code() == absl::StatusCode::kInvalidArgument);
  CHECK(c == std::vector<float>(4, 7.0f));
  // An empty output is fine, with or without pointers.
  GemmArgs empty;
  CHECK(dev.Gemm(empty).ok());
}

TEST_CASE("ColumnSums is the bias gradient: column sums in row order") {
  CpuDevice dev(2);
  const int64_t rows = 37, cols = 11;
  const std::vector<float> delta = Random(rows * cols, 5);
  std::vector<float> out(cols, 5.0f);
  REQUIRE(dev.ColumnSums(delta.data(), rows, cols, out.data()).ok());
  for (int64_t j = 0; j < cols; ++j) {
    float want = 0;
    for (int64_t r = 0; r < rows; ++r) want += delta[r * cols + j];
    CHECK(out[j] == doctest::Approx(want).epsilon(1e-6));
  }
  // No rows: zeros.
  REQUIRE(dev.ColumnSums(nullptr, 0, cols, out.data()).ok());
  CHECK(out == std::vector<float>(cols, 0.0f));
  CHECK(dev.ColumnSums(delta.data(), -1, cols, out.data()).code() == absl::StatusCode::kInvalidArgument);
}

/// TF's sparse softmax cross-entropy of one row, in double.
double RowLoss(const float* z, int64_t classes, int64_t label) {
  double max = z[0];
  for (int64_t c = 1; c < classes; ++c) max = std::max(max, static_cast<double>(z[c]));
  double sum = 0;
  for (int64_t c = 0; c < classes; ++c) sum += std::exp(z[c] - max);
  return std::log(sum) - (z[label] - max);
}

TEST_CASE("Softmax cross-entropy forward and backward match TF's formulas, int32 and int64 labels") {
  CpuDevice dev(2);
  const int64_t rows = 9, classes = 5;
  std::vector<float> logits = Random(rows * classes, 6, -20.0f, 20.0f);  // large: the shift matters
  logits[3 * classes + 1] = logits[3 * classes + 4] = 50.0f;             // a tie: argmax is the first
  const std::vector<int32_t> labels32 = {0, 1, 2, 4, 3, 2, 1, 0, 4};
  const std::vector<int64_t> labels64(labels32.begin(), labels32.end());

  double want_loss = 0;
  int64_t want_correct = 0;
  for (int64_t r = 0; r < rows; ++r) {
    const float* z = logits.data() + r * classes;
    want_loss += RowLoss(z, classes, labels32[r]);
    const int64_t argmax = std::max_element(z, z + classes) - z;  // the first maximum
    want_correct += argmax == labels32[r] ? 1 : 0;
  }
  REQUIRE(want_correct >= 1);

  for (LabelType type : {LabelType::kInt32, LabelType::kInt64}) {
    SoftmaxXentArgs args;
    args.logits = logits.data();
    args.labels = type == LabelType::kInt32 ? static_cast<const void*>(labels32.data()) : labels64.data();
    args.label_type = type;
    args.rows = rows;
    args.classes = classes;
    SoftmaxXentStats stats;
    REQUIRE(dev.SoftmaxXentForward(args, &stats).ok());
    CHECK(stats.loss_sum == doctest::Approx(want_loss).epsilon(1e-5));
    CHECK(stats.correct == want_correct);
    CHECK(stats.correct >= 1);  // row 3: label 4 ties with class 1, which wins
    // Forward adds: a second batch accumulates onto the first.
    REQUIRE(dev.SoftmaxXentForward(args, &stats).ok());
    CHECK(stats.loss_sum == doctest::Approx(2 * want_loss).epsilon(1e-5));
    CHECK(stats.correct == 2 * want_correct);

    const float scale = 1.0f / static_cast<float>(rows);
    std::vector<float> grad(static_cast<std::size_t>(rows * classes), 99.0f);
    REQUIRE(dev.SoftmaxXentBackward(args, scale, grad.data()).ok());
    for (int64_t r = 0; r < rows; ++r) {
      const float* z = logits.data() + r * classes;
      double max = *std::max_element(z, z + classes), sum = 0;
      for (int64_t c = 0; c < classes; ++c) sum += std::exp(z[c] - max);
      double row_sum = 0;
      for (int64_t c = 0; c < classes; ++c) {
        const double want = (std::exp(z[c] - max) / sum - (c == labels32[r] ? 1.0 : 0.0)) * scale;
        CHECK(grad[r * classes + c] == doctest::Approx(want).epsilon(1e-5).scale(1e-3));
        row_sum += grad[r * classes + c];
      }
      CHECK(std::abs(row_sum) < 1e-6);  // a softmax's gradient sums to 0
    }
  }

  SoftmaxXentArgs bad;
  bad.classes = 0;
  SoftmaxXentStats stats;
  CHECK(dev.SoftmaxXentForward(bad, &stats).code() == absl::StatusCode::kInvalidArgument);
}

struct UpdateState {
  std::vector<float> var, grad, s0, s1;
};

UpdateState NewState(int64_t n) {
  return {Random(n, 7), Random(n, 8), Random(n, 9, 0.0f, 0.5f), Random(n, 10, 0.0f, 0.5f)};
}

// Several chunks (kChunk = 1024); below the size that is split over the pool.
constexpr int64_t kN = 5000;

TEST_CASE("ApplyGradientDescent: var -= grad * lr") {
  CpuDevice dev(2);
  UpdateState s = NewState(kN);
  const UpdateState before = s;
  const float lr = 0.3f;
  REQUIRE(dev.ApplyGradientDescent(s.var.data(), s.grad.data(), kN, lr).ok());
  for (int64_t i = 0; i < kN; ++i) {
    const float want = before.var[i] - before.grad[i] * lr;
    REQUIRE(s.var[i] == doctest::Approx(want).epsilon(1e-6));
  }
  CHECK(dev.ApplyGradientDescent(nullptr, s.grad.data(), 3, lr).code() == absl::StatusCode::kInvalidArgument);
  CHECK(dev.ApplyGradientDescent(nullptr, nullptr, 0, lr).ok());
}

TEST_CASE("ApplyMomentum: accum = accum * momentum + grad; var -= accum * lr (Nesterov: grad * lr + accum * m * lr)") {
  for (bool nesterov : {false, true}) {
    CAPTURE(nesterov);
    CpuDevice dev(2);
    UpdateState s = NewState(kN);
    const UpdateState before = s;
    const MomentumParams p{0.1f, 0.9f, nesterov};
    REQUIRE(dev.ApplyMomentum(s.var.data(), s.s0.data(), s.grad.data(), kN, p).ok());
    for (int64_t i = 0; i < kN; ++i) {
      const float accum = before.s0[i] * p.momentum + before.grad[i];
      const float var = nesterov ? before.var[i] - (before.grad[i] * p.learning_rate + accum * p.momentum * p.learning_rate)
                                 : before.var[i] - accum * p.learning_rate;
      REQUIRE(s.s0[i] == doctest::Approx(accum).epsilon(1e-6));
      REQUIRE(s.var[i] == doctest::Approx(var).epsilon(1e-6));
    }
  }
}

TEST_CASE("ApplyAdam: m, v moving averages; var -= m * lr_t / (sqrt(v) + epsilon)") {
  CpuDevice dev(2);
  UpdateState s = NewState(kN);
  const UpdateState before = s;
  // lr_t as AdamOptimizer computes it at step 3.
  const float lr = 0.01f, b1 = 0.9f, b2 = 0.999f;
  const float b1p = b1 * b1 * b1, b2p = b2 * b2 * b2;
  const AdamParams p{lr * std::sqrt(1.0f - b2p) / (1.0f - b1p), b1, b2, 1e-8f};
  REQUIRE(dev.ApplyAdam(s.var.data(), s.s0.data(), s.s1.data(), s.grad.data(), kN, p).ok());
  for (int64_t i = 0; i < kN; ++i) {
    const float g = before.grad[i];
    const float m = before.s0[i] + (g - before.s0[i]) * (1.0f - b1);
    const float v = before.s1[i] + (g * g - before.s1[i]) * (1.0f - b2);
    const float var = before.var[i] - m * p.step_size / (std::sqrt(v) + p.epsilon);
    REQUIRE(s.s0[i] == doctest::Approx(m).epsilon(1e-6));
    REQUIRE(s.s1[i] == doctest::Approx(v).epsilon(1e-6));
    REQUIRE(s.var[i] == doctest::Approx(var).epsilon(1e-6));
  }
}

TEST_CASE("ApplyAdamGroup is AdamStepSize, each variable's ApplyAdam in order, then AdamFinish, bitwise") {
  CpuDevice dev(2);
  const int64_t sizes[] = {1037, 0, 10, 300};
  std::vector<UpdateState> group, alone;
  for (int64_t n : sizes) {
    group.push_back(NewState(n));
    alone.push_back(group.back());
  }
  const float lr = 0.01f, b1 = 0.9f, b2 = 0.999f, eps = 1e-8f;
  float gb1p = b1 * b1, gb2p = b2 * b2, ab1p = gb1p, ab2p = gb2p, gstep = -1.0f, astep = -2.0f;
  std::vector<AdamVariable> vars;
  for (UpdateState& s : group) {
    vars.push_back({s.var.data(), s.s0.data(), s.s1.data(), s.grad.data(), static_cast<int64_t>(s.var.size())});
  }
  REQUIRE(dev.ApplyAdamGroup(vars.data(), static_cast<int64_t>(vars.size()), DeviceScalar{&lr}, &gb1p, &gb2p, b1, b2,
                             eps, &gstep)
              .ok());
  REQUIRE(dev.AdamStepSize(DeviceScalar{&lr}, DeviceScalar{&ab1p}, DeviceScalar{&ab2p}, &astep).ok());
  for (UpdateState& s : alone) {
    REQUIRE(dev.ApplyAdam(s.var.data(), s.s0.data(), s.s1.data(), s.grad.data(), static_cast<int64_t>(s.var.size()),
                          DeviceScalar{&astep}, b1, b2, eps)
                .ok());
  }
  REQUIRE(dev.AdamFinish(&ab1p, &ab2p, b1, b2).ok());
  CHECK(std::memcmp(&gstep, &astep, sizeof(float)) == 0);
  CHECK(std::memcmp(&gb1p, &ab1p, sizeof(float)) == 0);
  CHECK(std::memcmp(&gb2p, &ab2p, sizeof(float)) == 0);
  CHECK(gb1p == b1 * b1 * b1);  // the powers advanced once, after the updates read them
  for (std::size_t i = 0; i < group.size(); ++i) {
    CAPTURE(i);
    if (group[i].var.empty()) continue;  // memcmp may not be given an empty vector's null data()
    CHECK(std::memcmp(group[i].var.data(), alone[i].var.data(), group[i].var.size() * 4) == 0);
    CHECK(std::memcmp(group[i].s0.data(), alone[i].s0.data(), group[i].s0.size() * 4) == 0);
    CHECK(std::memcmp(group[i].s1.data(), alone[i].s1.data(), group[i].s1.size() * 4) == 0);
  }
  // Bad arguments: INVALID_ARGUMENT naming the variable, nothing advanced.
  vars[2].grad = nullptr;
  const float before = gb1p;
  Status s = dev.ApplyAdamGroup(vars.data(), 4, DeviceScalar{&lr}, &gb1p, &gb2p, b1, b2, eps, &gstep);
  CHECK(s.code() == absl::StatusCode::kInvalidArgument);
  CHECK(std::string(s.message()).find("variables[2]") != std::string::npos);
  vars[2].grad = group[2].grad.data();
  vars[3].n = -1;
  s = dev.ApplyAdamGroup(vars.data(), 4, DeviceScalar{&lr}, &gb1p, &gb2p, b1, b2, eps, &gstep);
  CHECK(s.code() == absl::StatusCode::kInvalidArgument);
  CHECK(std::string(s.message()).find("variables[3].n must be >= 0, got -1") != std::string::npos);
  s = dev.ApplyAdamGroup(vars.data(), -1, DeviceScalar{&lr}, &gb1p, &gb2p, b1, b2, eps, &gstep);
  CHECK(s.code() == absl::StatusCode::kInvalidArgument);
  s = dev.ApplyAdamGroup(vars.data(), 2, DeviceScalar{&lr}, nullptr, &gb2p, b1, b2, eps, &gstep);
  CHECK(s.code() == absl::StatusCode::kInvalidArgument);
  CHECK(std::string(s.message()).find("beta1_power is null") != std::string::npos);
  CHECK(gb1p == before);
}

TEST_CASE("The elementwise updates do not depend on the thread count") {
  // kN runs on the calling thread; 100003 elements (past 2^15) are split
  // into one block per thread, the last one short. In device memory (64-byte
  // aligned, as every variable is): Eigen peels unaligned leading elements
  // off into scalar code, so a std::vector's varying alignment would change
  // the last bits whatever the thread count.
  for (const int64_t n : {kN, int64_t{100003}}) {
    CAPTURE(n);
    std::vector<float> var[2];
    for (int t = 0; t < 2; ++t) {
      CpuDevice dev(t == 0 ? 1 : 4);
      const UpdateState in = NewState(n);
      const std::size_t bytes = static_cast<std::size_t>(n) * sizeof(float);
      float* buf[4];
      for (int i = 0; i < 4; ++i) buf[i] = static_cast<float*>(dev.Allocate(static_cast<int64_t>(bytes)).value());
      std::memcpy(buf[0], in.var.data(), bytes);
      std::memcpy(buf[1], in.s0.data(), bytes);
      std::memcpy(buf[2], in.s1.data(), bytes);
      std::memcpy(buf[3], in.grad.data(), bytes);
      const AdamParams p{0.001f, 0.9f, 0.999f, 1e-8f};
      REQUIRE(dev.ApplyAdam(buf[0], buf[1], buf[2], buf[3], n, p).ok());
      var[t].assign(buf[0], buf[0] + n);
      for (float* b : buf) dev.Deallocate(b);
    }
    CHECK(std::memcmp(var[0].data(), var[1].data(), static_cast<std::size_t>(n) * sizeof(float)) == 0);
  }
}

TEST_CASE("CPU device memory is host memory: Allocate, copies, Deallocate") {
  CpuDevice dev(1);
  CHECK(dev.name() == "/cpu:0");
  CHECK(dev.host_memory());
  CHECK(dev.num_threads() == 1);
  auto p = dev.Allocate(1000);
  REQUIRE(p.ok());
  CHECK(reinterpret_cast<uintptr_t>(*p) % 64 == 0);
  const std::vector<float> host = Random(250, 11);
  REQUIRE(dev.CopyToDevice(*p, host.data(), 1000).ok());
  std::vector<float> back(250);
  REQUIRE(dev.CopyToHost(back.data(), *p, 1000).ok());
  CHECK(back == host);
  dev.Deallocate(*p);
  dev.Deallocate(nullptr);
  auto empty = dev.Allocate(0);
  REQUIRE(empty.ok());
  CHECK(*empty != nullptr);
  dev.Deallocate(*empty);
  CHECK(dev.Allocate(-1).status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(dev.CopyToHost(nullptr, host.data(), 4).code() == absl::StatusCode::kInvalidArgument);
}

TEST_CASE("A CpuDevice can run on a caller's Eigen device") {
  Eigen::ThreadPool pool(3);
  Eigen::ThreadPoolDevice eigen(&pool, 3);
  CpuDevice dev(&eigen);
  CHECK(&dev.eigen_device() == &eigen);
  CHECK(dev.num_threads() == 3);
}

// -- Instruction sets ----------------------------------------------------------------

/// Restores FOREMAN_MAX_ISA when it goes out of scope.
struct MaxIsaEnv {
  MaxIsaEnv() {
    if (const char* v = std::getenv("FOREMAN_MAX_ISA")) saved = v;
  }
  ~MaxIsaEnv() {
    if (saved) {
      setenv("FOREMAN_MAX_ISA", saved->c_str(), 1);
    } else {
      unsetenv("FOREMAN_MAX_ISA");
    }
  }
  void Set(const char* v) { setenv("FOREMAN_MAX_ISA", v, 1); }
  std::optional<std::string> saved;
};

/// The non-baseline instruction sets this CPU has; the others are reported
/// as skipped.
std::vector<CpuIsa> AcceleratedIsas() {
  std::vector<CpuIsa> isas;
  for (CpuIsa isa : {CpuIsa::kAvx2, CpuIsa::kAvx512}) {
    if (static_cast<int>(isa) <= static_cast<int>(DetectCpuIsa())) {
      isas.push_back(isa);
    } else {
      const std::string why =
          std::string("skipped ") + CpuIsaName(isa) + ": this CPU supports only up to " + CpuIsaName(DetectCpuIsa());
      MESSAGE(why);
    }
  }
  return isas;
}

TEST_CASE("Each instruction set's Gemm matches the baseline's for every transpose and epilogue") {
  CpuDevice base(2, CpuIsa::kBaseline);
  REQUIRE(base.isa() == CpuIsa::kBaseline);
  for (CpuIsa isa : AcceleratedIsas()) {
    INFO("isa ", std::string(CpuIsaName(isa)));
    CpuDevice dev(2, isa);
    REQUIRE(dev.isa() == isa);  // the module loads from libforeman's directory
    const int64_t m = 67, n = 45, k = 131;
    for (int t = 0; t < 4; ++t) {
      const bool ta = (t & 1) != 0, tb = (t & 2) != 0;
      for (Epilogue e : {Epilogue::kNone, Epilogue::kBias, Epilogue::kBiasRelu, Epilogue::kReluGradMask}) {
        CAPTURE(ta);
        CAPTURE(tb);
        INFO("epilogue ", EpilogueName(e));
        const GemmInputs in(m, n, k);
        const std::vector<float>& relu = in.relu;
        std::vector<float> want(static_cast<std::size_t>(m * n)), got(want.size(), 123.0f), again(want.size());
        GemmArgs g = in.Args(ta, tb, e, want.data());
        REQUIRE(base.Gemm(g).ok());
        g.c = got.data();
        REQUIRE(dev.Gemm(g).ok());
        for (std::size_t i = 0; i < want.size(); ++i) {
          if (want[i] == 0.0f) {
            REQUIRE(std::abs(got[i]) <= 1e-5f);  // masked (exactly 0) or ReLU'd to 0 near the kink
          } else {
            REQUIRE(got[i] == doctest::Approx(want[i]).epsilon(1e-5).scale(static_cast<double>(k)));
          }
        }
        if (e == Epilogue::kReluGradMask) {
          for (std::size_t i = 0; i < want.size(); ++i) {
            if (relu[i] <= 0) REQUIRE(got[i] == 0.0f);
          }
        }
        g.c = again.data();
        REQUIRE(dev.Gemm(g).ok());
        REQUIRE(std::memcmp(got.data(), again.data(), got.size() * sizeof(float)) == 0);
      }
    }
  }
}

TEST_CASE("SoftmaxXent fused is bitwise the separate passes, and each instruction set matches the baseline") {
  const int64_t rows = 33, classes = 10;
  const std::vector<float> logits = Random(rows * classes, 5, -8.0f, 8.0f);
  std::vector<int64_t> labels(static_cast<std::size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) labels[r] = (r * 7) % classes;
  SoftmaxXentArgs args;
  args.logits = logits.data();
  args.labels = labels.data();
  args.label_type = LabelType::kInt64;
  args.rows = rows;
  args.classes = classes;
  const float scale = 1.0f / rows;

  std::vector<CpuIsa> isas = AcceleratedIsas();
  isas.insert(isas.begin(), CpuIsa::kBaseline);
  std::vector<float> base_grad;
  SoftmaxXentStats base_stats;
  for (CpuIsa isa : isas) {
    INFO("isa ", std::string(CpuIsaName(isa)));
    CpuDevice dev(1, isa);
    SoftmaxXentStats separate, fused;
    std::vector<float> grad_separate(static_cast<std::size_t>(rows * classes)), grad_fused(grad_separate.size());
    REQUIRE(dev.SoftmaxXentForward(args, &separate).ok());
    REQUIRE(dev.SoftmaxXentBackward(args, scale, grad_separate.data()).ok());
    REQUIRE(dev.SoftmaxXent(args, &fused, scale, grad_fused.data()).ok());
    CHECK(fused.loss_sum == separate.loss_sum);
    CHECK(fused.correct == separate.correct);
    CHECK(std::memcmp(grad_fused.data(), grad_separate.data(), grad_fused.size() * sizeof(float)) == 0);
    if (isa == CpuIsa::kBaseline) {
      base_grad = grad_fused;
      base_stats = fused;
    } else {
      CHECK(fused.correct == base_stats.correct);
      CHECK(fused.loss_sum == doctest::Approx(base_stats.loss_sum).epsilon(1e-6));
      for (std::size_t i = 0; i < base_grad.size(); ++i) {
        REQUIRE(grad_fused[i] == doctest::Approx(base_grad[i]).epsilon(1e-6).scale(1e-6));
      }
    }
  }
  CpuDevice dev(1);
  SoftmaxXentStats stats;
  CHECK(dev.SoftmaxXent(args, &stats, scale, nullptr).code() == absl::StatusCode::kInvalidArgument);
  CHECK(dev.SoftmaxXent(args, nullptr, scale, base_grad.data()).code() == absl::StatusCode::kInvalidArgument);
}

TEST_CASE("Each instruction set's optimizer updates and ColumnSums match the baseline's") {
  CpuDevice base(2, CpuIsa::kBaseline);
  for (CpuIsa isa : AcceleratedIsas()) {
    INFO("isa ", std::string(CpuIsaName(isa)));
    CpuDevice dev(2, isa);
    auto same = [](const std::vector<float>& got, const std::vector<float>& want) {
      for (std::size_t i = 0; i < want.size(); ++i) {
        REQUIRE(got[i] == doctest::Approx(want[i]).epsilon(1e-6).scale(1.0));  // FMA: low bits
      }
    };
    UpdateState x = NewState(kN), y = NewState(kN);
    REQUIRE(base.ApplyGradientDescent(x.var.data(), x.grad.data(), kN, 0.1f).ok());
    REQUIRE(dev.ApplyGradientDescent(y.var.data(), y.grad.data(), kN, 0.1f).ok());
    same(y.var, x.var);
    for (bool nesterov : {false, true}) {
      CAPTURE(nesterov);
      const MomentumParams p{0.1f, 0.9f, nesterov};
      REQUIRE(base.ApplyMomentum(x.var.data(), x.s0.data(), x.grad.data(), kN, p).ok());
      REQUIRE(dev.ApplyMomentum(y.var.data(), y.s0.data(), y.grad.data(), kN, p).ok());
      same(y.var, x.var);
      same(y.s0, x.s0);
    }
    const AdamParams adam{0.001f, 0.9f, 0.999f, 1e-8f};
    REQUIRE(base.ApplyAdam(x.var.data(), x.s0.data(), x.s1.data(), x.grad.data(), kN, adam).ok());
    REQUIRE(dev.ApplyAdam(y.var.data(), y.s0.data(), y.s1.data(), y.grad.data(), kN, adam).ok());
    same(y.var, x.var);
    same(y.s0, x.s0);
    same(y.s1, x.s1);

    const int64_t rows = 50, cols = 77;
    const std::vector<float> delta = Random(rows * cols, 12);
    std::vector<float> want(cols), got(cols);
    REQUIRE(base.ColumnSums(delta.data(), rows, cols, want.data()).ok());
    REQUIRE(dev.ColumnSums(delta.data(), rows, cols, got.data()).ok());
    same(got, want);
  }
}

TEST_CASE("FOREMAN_MAX_ISA caps the instruction set and is checked") {
  MaxIsaEnv env;
  const CpuIsa best = DetectCpuIsa();
  auto capped = [&](CpuIsa cap) { return static_cast<int>(cap) < static_cast<int>(best) ? cap : best; };

  unsetenv("FOREMAN_MAX_ISA");
  CHECK(CpuDevice(1).isa() == best);
  CHECK(CpuInstructionSet().value() == CpuIsaName(best));
  for (const char* name : {"baseline", "avx2", "AVX512"}) {
    CAPTURE(name);
    env.Set(name);
    StatusOr<CpuIsa> cap = ParseCpuIsa(name);
    REQUIRE(cap.ok());
    CHECK(CpuDevice(1).isa() == capped(*cap));
    CHECK(CpuInstructionSet().value() == CpuIsaName(capped(*cap)));
    auto created = CreateDevice("", 1);
    REQUIRE(created.ok());
    CHECK(dynamic_cast<CpuDevice&>(**created).isa() == capped(*cap));
  }
  // An explicit cap ignores the environment.
  CHECK(CpuDevice(1, CpuIsa::kAvx512).isa() == best);

  // Garbage: sessions and CpuInstructionSet() refuse it, naming the variable
  // and the choices; a bare CpuDevice falls back to the baseline.
  env.Set("avx9");
  Status s = CreateDevice("/cpu:0", 1).status();
  CHECK(s.code() == absl::StatusCode::kInvalidArgument);
  CHECK(s.message().find("FOREMAN_MAX_ISA='avx9'") != absl::string_view::npos);
  CHECK(s.message().find("baseline, avx2 or avx512") != absl::string_view::npos);
  CHECK(CpuDevice(1).isa() == CpuIsa::kBaseline);
  StatusOr<std::string> isa = CpuInstructionSet();
  CHECK(isa.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(isa.status().message().find("FOREMAN_MAX_ISA='avx9'") != absl::string_view::npos);
}

// -- Device strings ----------------------------------------------------------------

TEST_CASE("Device strings: CPU spellings, GPU indices, malformed names") {
  for (const char* cpu : {"", "/cpu:0", "/CPU:0", "/cpu", "/device:CPU:0", "/device:cpu:0"}) {
    CAPTURE(cpu);
    auto spec = ParseDeviceSpec(cpu);
    REQUIRE(spec.ok());
    CHECK(spec->kind == DeviceSpec::Kind::kCpu);
    CHECK(spec->canonical() == "/cpu:0");
  }
  for (const char* gpu : {"/gpu:3", "/GPU:3", "/device:GPU:3"}) {
    CAPTURE(gpu);
    auto spec = ParseDeviceSpec(gpu);
    REQUIRE(spec.ok());
    CHECK(spec->kind == DeviceSpec::Kind::kGpu);
    CHECK(spec->index == 3);
    CHECK(spec->canonical() == "/gpu:3");
  }
  for (const char* bad : {"/tpu:0", "/gpu:x", "gpu:0", "/gpu:", "/gpu:-1", "/gpu:+1", "/gpu:0 ", "/gpu:1x",
                          "/gpu:99999999999", "cpu", "/device:TPU:0"}) {
    CAPTURE(bad);
    Status s = CreateDevice(bad, 1).status();
    CHECK(s.code() == absl::StatusCode::kInvalidArgument);
    CHECK(s.message().find(std::string("'") + bad + "'") != absl::string_view::npos);
  }
}

TEST_CASE("CreateDevice: the CPU, no such device, and a GPU") {
  auto cpu = CreateDevice("/device:CPU:0", 2);
  REQUIRE(cpu.ok());
  CHECK((*cpu)->name() == "/cpu:0");
  CHECK((*cpu)->host_memory());
  CHECK(dynamic_cast<CpuDevice&>(**cpu).num_threads() == 2);

  Status cpu1 = CreateDevice("/cpu:1", 1).status();
  CHECK(cpu1.code() == absl::StatusCode::kFailedPrecondition);
  CHECK(cpu1.message().find("/cpu:1") != absl::string_view::npos);

  // Never UNAVAILABLE (that would start a recovery): without CUDA in the
  // build, without a driver or without the device, FAILED_PRECONDITION
  // naming the device string; with the device, the CUDA device "/gpu:0".
  auto count = cuda::DeviceCount();
  const int gpus = count.ok() ? *count : 0;
  for (const char* gpu : {"/gpu:0", "/device:GPU:0", "/gpu:64"}) {
    CAPTURE(gpu);
    auto created = CreateDevice(gpu, 1);
    const int index = std::string(gpu) == "/gpu:64" ? 64 : 0;
    if (index < gpus) {
      REQUIRE(created.ok());
      CHECK((*created)->name() == "/gpu:0");
      CHECK_FALSE((*created)->host_memory());
      CHECK((*created)->supports_capture());
      continue;
    }
    Status s = created.status();
    CHECK(s.message().find(gpu) != absl::string_view::npos);
    CHECK(s.code() == absl::StatusCode::kFailedPrecondition);
    if (!cuda::BuiltWithCuda()) CHECK(s.message().find("built without it") != absl::string_view::npos);
  }
}

TEST_CASE("Session::Create honours SessionConfig.device and reports its errors") {
  auto graph = std::make_shared<Graph>();
  const Device* seen = nullptr;
  const Eigen::ThreadPoolDevice* seen_eigen = nullptr;
  REQUIRE(graph
              ->SetStep([&](StepContext& ctx) -> Status {
                seen = &ctx.compute();
                seen_eigen = &ctx.eigen_device();
                return absl::OkStatus();
              })
              .ok());
  SessionConfig config;
  config.intra_op_parallelism_threads = 2;
  config.device = "/cpu:0";
  auto sess = Session::Create(graph, "", config);
  REQUIRE(sess.ok());
  REQUIRE((*sess)->Run({}).ok());
  REQUIRE(seen != nullptr);
  CHECK(seen->name() == "/cpu:0");
  CHECK(seen->host_memory());
  // The CPU device runs on the step's Eigen pool.
  CHECK(&dynamic_cast<const CpuDevice*>(seen)->eigen_device() == seen_eigen);
  CHECK(seen_eigen->numThreads() == 2);

  for (const char* bad : {"/tpu:0", "/gpu:x", "gpu:0"}) {
    config.device = bad;
    Status s = Session::Create(graph, "", config).status();
    CHECK(s.code() == absl::StatusCode::kInvalidArgument);
    CHECK(s.message().find(bad) != absl::string_view::npos);
  }
  config.device = "/gpu:0";
  Status gpu = Session::Create(graph, "", config).status();
  CHECK(gpu.message().find("/gpu:0") != absl::string_view::npos);
  auto count = cuda::DeviceCount();
  if (count.ok() && *count > 0) {
    CHECK(gpu.code() == absl::StatusCode::kUnimplemented);
  } else {
    CHECK(gpu.code() == absl::StatusCode::kFailedPrecondition);
  }
}

TEST_CASE("nn::Mlp on a CPU device owning its pool equals one on a caller's Eigen pool bitwise") {
  nn::MlpSpec spec{20, {16, 8}, 4};
  for (nn::OptimizerKind kind : {nn::OptimizerKind::kSgd, nn::OptimizerKind::kMomentum, nn::OptimizerKind::kAdam}) {
    nn::OptimizerOptions opt;
    opt.kind = kind;
    opt.learning_rate = 0.05f;
    auto graph = std::make_shared<Graph>();
    REQUIRE(nn::AddMlpVariables(*graph, spec, opt, 3).ok());
    VariableStore a, b;
    for (const VariableDef& def : graph->variables()) {
      auto init = def.initializer();
      REQUIRE(init.ok());
      REQUIRE(a.Create(def.name, *init).ok());
      REQUIRE(b.Create(def.name, *init).ok());
    }
    auto features = Tensor::Create(DataType::kFloat, TensorShape{12, 20});
    REQUIRE(features.ok());
    const std::vector<float> x = Random(12 * 20, 12);
    std::copy(x.begin(), x.end(), features->data<float>());
    Tensor labels(DataType::kInt64, TensorShape{12});
    for (int64_t i = 0; i < 12; ++i) labels.data<int64_t>()[i] = i % 4;

    auto mlp_a = nn::Mlp::Create(spec, opt);
    auto mlp_b = nn::Mlp::Create(spec, opt);
    REQUIRE(mlp_a.ok());
    REQUIRE(mlp_b.ok());
    Eigen::ThreadPool pool(2);
    Eigen::ThreadPoolDevice eigen(&pool, 2);
    CpuDevice dev(2);
    CpuDevice on_eigen(&eigen);  // what the removed Eigen-device overloads built
    for (int step = 0; step < 3; ++step) {
      auto ra = (*mlp_a)->TrainStep(a, *features, labels, dev);
      auto rb = (*mlp_b)->TrainStep(b, *features, labels, on_eigen);
      REQUIRE(ra.ok());
      REQUIRE(rb.ok());
      CHECK(ra->loss == rb->loss);
    }
    auto ea = (*mlp_a)->Evaluate(a, *features, labels, dev);
    auto eb = (*mlp_b)->Evaluate(b, *features, labels, on_eigen);
    REQUIRE(ea.ok());
    REQUIRE(eb.ok());
    CHECK(ea->loss == eb->loss);
    CHECK(ea->accuracy == eb->accuracy);
    for (const auto& [name, t] : a.Snapshot()) {
      CAPTURE(name);
      auto other = b.Get(name);
      REQUIRE(other.ok());
      REQUIRE(t.TotalBytes() == (*other)->TotalBytes());
      CHECK(std::memcmp(t.raw_data(), (*other)->raw_data(), t.TotalBytes()) == 0);
    }
  }
}

}  // namespace
}  // namespace foreman::compute
