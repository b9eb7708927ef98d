// Tests for the MLP and TF1's optimizers (include/foreman/nn.hpp): variable
// names as TF1 writes them, glorot_uniform initialization, gradients against
// finite differences in double, one update of each optimizer against TF1's
// formulas, determinism, errors, and learning a separable problem.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#define EIGEN_USE_THREADS
#include <unsupported/Eigen/CXX11/Tensor>

#include "absl/strings/match.h"
#include "foreman/bundle.hpp"
#include "foreman/checkpoint.hpp"
#include "foreman/cluster.hpp"
#include "foreman/mem_env.hpp"
#include "compute/cpu_device.hpp"
#include "foreman/nn.hpp"
#include "nn/optimizer.hpp"

namespace foreman::nn {
namespace {

std::string Msg(const Status& s) { return std::string(s.message()); }

#define REQUIRE_OK(expr)                          \
  do {                                            \
    const Status s_ = (expr);                     \
    REQUIRE_MESSAGE(s_.ok(), s_.ToString());      \
  } while (false)

/// An Eigen pool and device of `threads` threads, and the CPU compute device
/// on it (what the session's "/cpu:0" is).
struct Pool {
  explicit Pool(int threads) : pool(threads), device(&pool, threads), cpu(&device) {}
  Eigen::ThreadPool pool;
  Eigen::ThreadPoolDevice device;
  compute::CpuDevice cpu;
};

OptimizerOptions Sgd(float lr) {
  OptimizerOptions o;
  o.kind = OptimizerKind::kSgd;
  o.learning_rate = lr;
  return o;
}

OptimizerOptions Momentum(float lr, float momentum, bool nesterov) {
  OptimizerOptions o;
  o.kind = OptimizerKind::kMomentum;
  o.learning_rate = lr;
  o.momentum = momentum;
  o.use_nesterov = nesterov;
  return o;
}

OptimizerOptions Adam(float lr) {
  OptimizerOptions o;
  o.learning_rate = lr;
  return o;
}

/// A store holding the variables AddMlpVariables declares, initialized as the
/// init op would (each initializer run once).
std::unique_ptr<VariableStore> NewStore(const MlpSpec& spec, const OptimizerOptions& opt, uint64_t seed) {
  Graph graph;
  REQUIRE_OK(AddMlpVariables(graph, spec, opt, seed));
  auto vars = std::make_unique<VariableStore>();
  for (const VariableDef& def : graph.variables()) {
    StatusOr<Tensor> value = def.initializer();
    REQUIRE_MESSAGE(value.ok(), value.status().ToString());
    REQUIRE_OK(vars->Create(def.name, *std::move(value), def.trainable));
  }
  return vars;
}

std::unique_ptr<Mlp> NewMlp(const MlpSpec& spec, const OptimizerOptions& opt) {
  auto mlp = Mlp::Create(spec, opt);
  REQUIRE_MESSAGE(mlp.ok(), mlp.status().ToString());
  return *std::move(mlp);
}

const Tensor& Var(const VariableStore& vars, const std::string& name) {
  auto t = vars.Get(name);
  REQUIRE_MESSAGE(t.ok(), t.status().ToString());
  return **t;
}

std::vector<double> Values(const VariableStore& vars, const std::string& name) {
  const Tensor& t = Var(vars, name);
  return std::vector<double>(t.data<float>(), t.data<float>() + t.num_elements());
}

/// A batch: features float32 [rows, dim] uniform in [-1, 1), labels int32 [rows].
struct Batch {
  Tensor features;
  Tensor labels;
};

Batch RandomBatch(int64_t rows, int64_t dim, int64_t classes, uint32_t seed) {
  std::mt19937 rng(seed);   // the engine is specified by the standard; its bits are portable
  Batch b{Tensor(DataType::kFloat, TensorShape{rows, dim}), Tensor(DataType::kInt32, TensorShape{rows})};
  float* x = b.features.data<float>();
  for (int64_t i = 0; i < rows * dim; ++i) x[i] = static_cast<float>((rng() >> 8) * (1.0 / (1 << 23)) - 1.0);
  int32_t* y = b.labels.data<int32_t>();
  for (int64_t r = 0; r < rows; ++r) y[r] = static_cast<int32_t>(rng() % static_cast<uint32_t>(classes));
  return b;
}

// -- the double-precision reference ---------------------------------------------------

std::string LayerName(std::size_t l) { return l == 0 ? "dense" : "dense_" + std::to_string(l); }

/// Kernels and biases as doubles, layer by layer.
struct RefParams {
  std::vector<std::vector<double>> kernel, bias;
};

RefParams ParamsOf(const MlpSpec& spec, const VariableStore& vars) {
  RefParams p;
  for (std::size_t l = 0; l <= spec.hidden.size(); ++l) {
    p.kernel.push_back(Values(vars, LayerName(l) + "/kernel"));
    p.bias.push_back(Values(vars, LayerName(l) + "/bias"));
  }
  return p;
}

/// Mean softmax cross-entropy of the MLP in double; `correct` counts argmax hits.
double RefLoss(const MlpSpec& spec, const RefParams& p, const Batch& b, int64_t* correct = nullptr) {
  std::vector<int64_t> dims = {spec.input_dim};
  dims.insert(dims.end(), spec.hidden.begin(), spec.hidden.end());
  dims.push_back(spec.num_classes);
  const int64_t rows = b.features.shape().dim(0);
  double total = 0;
  for (int64_t r = 0; r < rows; ++r) {
    std::vector<double> a(b.features.data<float>() + r * spec.input_dim,
                          b.features.data<float>() + (r + 1) * spec.input_dim);
    for (std::size_t l = 0; l + 1 < dims.size(); ++l) {
      std::vector<double> z(static_cast<std::size_t>(dims[l + 1]));
      for (int64_t o = 0; o < dims[l + 1]; ++o) {
        double s = p.bias[l][o];
        for (int64_t i = 0; i < dims[l]; ++i) s += a[i] * p.kernel[l][i * dims[l + 1] + o];
        z[o] = l + 2 < dims.size() ? std::max(s, 0.0) : s;
      }
      a = std::move(z);
    }
    const double max = *std::max_element(a.begin(), a.end());
    double sum = 0;
    for (double v : a) sum += std::exp(v - max);
    const int32_t label = b.labels.data<int32_t>()[r];
    total += std::log(sum) + max - a[label];
    if (correct != nullptr && std::max_element(a.begin(), a.end()) - a.begin() == label) ++*correct;
  }
  return total / static_cast<double>(rows);
}

/// Central finite differences of RefLoss w.r.t. every kernel and bias element.
RefParams NumericGradient(const MlpSpec& spec, RefParams p, const Batch& b) {
  const double h = 1e-6;
  RefParams g = p;
  auto diff = [&](std::vector<double>& param, std::vector<double>& grad) {
    for (std::size_t i = 0; i < param.size(); ++i) {
      const double saved = param[i];
      param[i] = saved + h;
      const double plus = RefLoss(spec, p, b);
      param[i] = saved - h;
      const double minus = RefLoss(spec, p, b);
      param[i] = saved;
      grad[i] = (plus - minus) / (2 * h);
    }
  };
  for (std::size_t l = 0; l < p.kernel.size(); ++l) {
    diff(p.kernel[l], g.kernel[l]);
    diff(p.bias[l], g.bias[l]);
  }
  return g;
}

/// The gradient Mlp computes at the kernels and biases of `vars`: one SGD step
/// with learning rate 1 on a copy gives var - g exactly up to one rounding.
RefParams MlpGradient(const MlpSpec& spec, const VariableStore& vars, const Batch& b,
                      compute::Device& device) {
  VariableStore copy;
  for (std::size_t l = 0; l <= spec.hidden.size(); ++l) {
    for (const std::string& name : {LayerName(l) + "/kernel", LayerName(l) + "/bias"}) {
      REQUIRE_OK(copy.Create(name, Var(vars, name)));
    }
  }
  const RefParams before = ParamsOf(spec, copy);
  auto step = NewMlp(spec, Sgd(1.0f))->TrainStep(copy, b.features, b.labels, device);
  REQUIRE_MESSAGE(step.ok(), step.status().ToString());
  RefParams g = ParamsOf(spec, copy);
  for (std::size_t l = 0; l < g.kernel.size(); ++l) {
    for (std::size_t i = 0; i < g.kernel[l].size(); ++i) g.kernel[l][i] = before.kernel[l][i] - g.kernel[l][i];
    for (std::size_t i = 0; i < g.bias[l].size(); ++i) g.bias[l][i] = before.bias[l][i] - g.bias[l][i];
  }
  return g;
}

void CheckClose(const std::vector<double>& actual, const std::vector<double>& expected, double abs_tol,
                double rel_tol, const std::string& what) {
  REQUIRE(actual.size() == expected.size());
  for (std::size_t i = 0; i < actual.size(); ++i) {
    const double tol = abs_tol + rel_tol * std::abs(expected[i]);
    if (!(std::abs(actual[i] - expected[i]) <= tol)) {
      FAIL_CHECK(what, "[", i, "] = ", actual[i], ", expected ", expected[i]);
      return;
    }
  }
}

bool SameVariables(const VariableStore& a, const VariableStore& b) {
  if (a.Names() != b.Names()) return false;
  for (const std::string& name : a.Names()) {
    if (!Var(a, name).Equals(Var(b, name))) return false;
  }
  return true;
}

// -- names and options -------------------------------------------------------------

TEST_CASE("ParseOptimizerKind accepts sgd, momentum, adam and round-trips OptimizerKindName") {
  for (OptimizerKind kind : {OptimizerKind::kSgd, OptimizerKind::kMomentum, OptimizerKind::kAdam}) {
    auto parsed = ParseOptimizerKind(OptimizerKindName(kind));
    REQUIRE(parsed.ok());
    CHECK(*parsed == kind);
  }
  CHECK(OptimizerKindName(OptimizerKind::kAdam) == "adam");
  auto bad = ParseOptimizerKind("Adam");
  REQUIRE(absl::IsInvalidArgument(bad.status()));
  CHECK(Msg(bad.status()) == "unknown optimizer 'Adam' (choices: sgd, momentum, adam)");
}

TEST_CASE("Mlp::Create rejects bad dims and optimizer options, naming the field") {
  const MlpSpec ok{4, {3}, 2};
  struct Case {
    MlpSpec spec;
    OptimizerOptions opt;
    std::string field;
  };
  OptimizerOptions nan_lr = Adam(std::nanf(""));
  OptimizerOptions beta1_one = Adam(0.1f);
  beta1_one.beta1 = 1.0f;
  OptimizerOptions beta2_neg = Adam(0.1f);
  beta2_neg.beta2 = -0.1f;
  OptimizerOptions eps_zero = Adam(0.1f);
  eps_zero.epsilon = 0;
  // Built one by one: GCC 12's -Wmaybe-uninitialized misfires on a braced
  // list of aggregates holding vectors.
  std::vector<Case> cases;
  auto add = [&](std::vector<int64_t> dims, const OptimizerOptions& opt, const std::string& field) {
    Case c;
    c.spec.input_dim = dims[0];
    c.spec.hidden.assign(dims.begin() + 1, dims.end() - 1);
    c.spec.num_classes = dims.back();
    c.opt = opt;
    c.field = field;
    cases.push_back(c);
  };
  add({0, 3, 2}, Adam(0.1f), "input_dim");
  add({4, 3, 0, 2}, Adam(0.1f), "hidden[1]");
  add({4, 3, 0}, Adam(0.1f), "num_classes");
  add({4, 3, 2}, Sgd(0.0f), "learning_rate");
  add({4, 3, 2}, Sgd(-1.0f), "learning_rate");
  add({4, 3, 2}, nan_lr, "learning_rate");
  add({4, 3, 2}, Momentum(0.1f, -0.5f, false), "momentum");
  add({4, 3, 2}, beta1_one, "beta1");
  add({4, 3, 2}, beta2_neg, "beta2");
  add({4, 3, 2}, eps_zero, "epsilon");
  for (const Case& c : cases) {
    CAPTURE(c.field);
    auto mlp = Mlp::Create(c.spec, c.opt);
    REQUIRE(absl::IsInvalidArgument(mlp.status()));
    CHECK(absl::StrContains(Msg(mlp.status()), c.field));
    Graph graph;
    Status s = AddMlpVariables(graph, c.spec, c.opt, 1);
    CHECK(absl::IsInvalidArgument(s));
    CHECK(graph.variables().empty());
  }
  // Fields of other optimizers are not checked.
  OptimizerOptions sgd = Sgd(0.5f);
  sgd.beta1 = 7;
  sgd.momentum = -1;
  CHECK(Mlp::Create(ok, sgd).ok());
}

TEST_CASE("MlpVariableNames are TF1's: dense, dense_1, ... with the optimizers' slot names, sorted") {
  const MlpSpec spec{3, {4, 5}, 2};
  CHECK(MlpVariableNames(spec, Sgd(0.1f)) ==
        std::vector<std::string>{"dense/bias", "dense/kernel", "dense_1/bias", "dense_1/kernel", "dense_2/bias",
                                 "dense_2/kernel"});
  CHECK(MlpVariableNames(MlpSpec{3, {}, 2}, Momentum(0.1f, 0.9f, true)) ==
        std::vector<std::string>{"dense/bias", "dense/bias/Momentum", "dense/kernel", "dense/kernel/Momentum"});
  CHECK(MlpVariableNames(MlpSpec{3, {4}, 2}, Adam(0.1f)) ==
        std::vector<std::string>{"beta1_power", "beta2_power", "dense/bias", "dense/bias/Adam", "dense/bias/Adam_1",
                                 "dense/kernel", "dense/kernel/Adam", "dense/kernel/Adam_1", "dense_1/bias",
                                 "dense_1/bias/Adam", "dense_1/bias/Adam_1", "dense_1/kernel",
                                 "dense_1/kernel/Adam", "dense_1/kernel/Adam_1"});
}

TEST_CASE("AddMlpVariables declares the named variables: shapes, initial values, trainable only kernels and biases") {
  const MlpSpec spec{3, {4}, 2};
  const OptimizerOptions adam = Adam(0.01f);
  Graph graph;
  REQUIRE_OK(AddMlpVariables(graph, spec, adam, 7));
  CHECK(graph.GlobalVariableNames() == MlpVariableNames(spec, adam));
  CHECK(graph.LocalVariableNames().empty());
  for (const VariableDef& def : graph.variables()) {
    CAPTURE(def.name);
    const bool is_param = absl::EndsWith(def.name, "/kernel") || absl::EndsWith(def.name, "/bias");
    CHECK(def.trainable == is_param);
  }
  auto vars = NewStore(spec, adam, 7);
  CHECK(Var(*vars, "dense/kernel").shape() == TensorShape{3, 4});
  CHECK(Var(*vars, "dense_1/kernel/Adam_1").shape() == TensorShape{4, 2});
  CHECK(Var(*vars, "dense_1/bias").Equals(Tensor(DataType::kFloat, TensorShape{2})));
  CHECK(Var(*vars, "dense/bias/Adam").Equals(Tensor(DataType::kFloat, TensorShape{4})));
  CHECK(Var(*vars, "dense/kernel/Adam").Equals(Tensor(DataType::kFloat, TensorShape{3, 4})));
  CHECK(Var(*vars, "beta1_power").Equals(Tensor::Scalar<float>(0.9f)));
  CHECK(Var(*vars, "beta2_power").Equals(Tensor::Scalar<float>(0.999f)));
  CHECK(vars->TrainableNames() ==
        std::vector<std::string>{"dense/bias", "dense/kernel", "dense_1/bias", "dense_1/kernel"});
}

TEST_CASE("AddMlpVariables: ALREADY_EXISTS for a declared name, FAILED_PRECONDITION on a finalized graph") {
  const MlpSpec spec{3, {}, 2};
  Graph graph;
  REQUIRE_OK(AddMlpVariables(graph, spec, Sgd(0.1f), 1));
  CHECK(absl::IsAlreadyExists(AddMlpVariables(graph, spec, Sgd(0.1f), 1)));
  Graph finalized;
  finalized.Finalize();
  Status s = AddMlpVariables(finalized, spec, Sgd(0.1f), 1);
  CHECK(absl::IsFailedPrecondition(s));
  CHECK(Msg(s) == "Graph is finalized and cannot be modified.");
}

TEST_CASE("A checkpoint of an Adam MLP holds exactly TF1's keys") {
  const MlpSpec spec{5, {4, 3}, 2};
  auto vars = NewStore(spec, Adam(0.01f), 3);
  REQUIRE_OK(CreateGlobalStep(*vars));
  MemEnv env;
  REQUIRE_OK(env.RecursivelyCreateDir("/ckpt"));
  SaverOptions options;
  options.env = &env;
  auto saver = Saver::Create(options);
  REQUIRE(saver.ok());
  auto prefix = (*saver)->Save(*vars, "/ckpt/model.ckpt", 0);
  REQUIRE_MESSAGE(prefix.ok(), prefix.status().ToString());
  auto reader = BundleReader::Open(&env, *prefix);
  REQUIRE(reader.ok());
  std::vector<std::string> keys;
  for (const BundleEntry& e : (*reader)->entries()) {
    keys.push_back(e.name);
    CHECK(e.dtype == (e.name == "global_step" ? DataType::kInt64 : DataType::kFloat));
  }
  std::vector<std::string> expected = {
      "beta1_power",           "beta2_power",           "dense/bias",           "dense/bias/Adam",
      "dense/bias/Adam_1",     "dense/kernel",          "dense/kernel/Adam",    "dense/kernel/Adam_1",
      "dense_1/bias",          "dense_1/bias/Adam",     "dense_1/bias/Adam_1",  "dense_1/kernel",
      "dense_1/kernel/Adam",   "dense_1/kernel/Adam_1", "dense_2/bias",         "dense_2/bias/Adam",
      "dense_2/bias/Adam_1",   "dense_2/kernel",        "dense_2/kernel/Adam",  "dense_2/kernel/Adam_1",
      "global_step"};
  CHECK(keys == expected);
  auto m = (*reader)->GetEntry("dense_2/kernel/Adam");
  REQUIRE(m.ok());
  CHECK(m->shape == TensorShape{3, 2});
}

// -- initialization ----------------------------------------------------------------

TEST_CASE("glorot_uniform kernels lie in [-sqrt(6/(in+out)), sqrt(6/(in+out))) with the uniform's moments") {
  auto kernel = GlorotUniformKernel(100, 50, 42, 0);
  REQUIRE(kernel.ok());
  const float limit = static_cast<float>(std::sqrt(6.0 / 150.0));
  const float* w = kernel->data<float>();
  const int64_t n = kernel->num_elements();
  double sum = 0, sum_sq = 0;
  float lo = limit, hi = -limit;
  for (int64_t i = 0; i < n; ++i) {
    REQUIRE(w[i] >= -limit);
    REQUIRE(w[i] < limit);
    lo = std::min(lo, w[i]);
    hi = std::max(hi, w[i]);
    sum += w[i];
    sum_sq += static_cast<double>(w[i]) * w[i];
  }
  CHECK(lo < -0.99f * limit);
  CHECK(hi > 0.99f * limit);
  const double mean = sum / static_cast<double>(n);
  const double var = sum_sq / static_cast<double>(n) - mean * mean;
  CHECK(std::abs(mean) < 0.01 * limit * 5);
  CHECK(var == doctest::Approx(limit * limit / 3.0).epsilon(0.05));
  CHECK(absl::IsInvalidArgument(GlorotUniformKernel(0, 5, 1, 0).status()));
}

TEST_CASE("glorot_uniform is splitmix64 keyed by seed and layer: the same seed gives the same weights everywhere") {
  // The documented generator, written out again: changing it would silently
  // change every seeded run's initial weights.
  auto mix = [](uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  };
  const uint64_t seed = 12345;
  const int layer = 1;
  uint64_t state = mix(seed ^ mix(static_cast<uint64_t>(layer) + 1));
  const float limit = static_cast<float>(std::sqrt(6.0 / 7.0));
  auto kernel = GlorotUniformKernel(3, 4, seed, layer);
  REQUIRE(kernel.ok());
  for (int64_t i = 0; i < 12; ++i) {
    state += 0x9e3779b97f4a7c15ULL;
    const int64_t bits = static_cast<int64_t>(mix(state) >> 40) - (1 << 23);
    CHECK(kernel->data<float>()[i] == static_cast<float>(bits) / 8388608.0f * limit);
  }
}

TEST_CASE("Same seed gives bitwise the same initial variables, another seed or layer other weights") {
  const MlpSpec spec{6, {5}, 3};
  auto a = NewStore(spec, Adam(0.1f), 99);
  auto b = NewStore(spec, Adam(0.1f), 99);
  auto c = NewStore(spec, Adam(0.1f), 100);
  CHECK(SameVariables(*a, *b));
  CHECK_FALSE(Var(*a, "dense/kernel").Equals(Var(*c, "dense/kernel")));
  CHECK_FALSE(Var(*a, "dense_1/kernel").Equals(Var(*c, "dense_1/kernel")));
  // Layers draw from independent streams: equal shapes, different weights.
  auto l0 = GlorotUniformKernel(4, 4, 99, 0);
  auto l1 = GlorotUniformKernel(4, 4, 99, 1);
  REQUIRE((l0.ok() && l1.ok()));
  CHECK_FALSE(l0->Equals(*l1));
}

// -- gradients ---------------------------------------------------------------------

TEST_CASE("Gradients match finite differences in double: softmax regression") {
  Pool pool(2);
  const MlpSpec spec{5, {}, 3};
  auto vars = NewStore(spec, Sgd(1.0f), 5);
  // Nonzero biases, so that their gradient path is exercised.
  (*vars->Get("dense/bias"))->data<float>()[1] = 0.3f;
  const Batch b = RandomBatch(7, 5, 3, 1);
  const RefParams expected = NumericGradient(spec, ParamsOf(spec, *vars), b);
  const RefParams actual = MlpGradient(spec, *vars, b, pool.cpu);
  CheckClose(actual.kernel[0], expected.kernel[0], 1e-6, 1e-4, "dense/kernel");
  CheckClose(actual.bias[0], expected.bias[0], 1e-6, 1e-4, "dense/bias");
}

TEST_CASE("Gradients match finite differences in double: two hidden ReLU layers") {
  Pool pool(2);
  const MlpSpec spec{4, {6, 5}, 3};
  auto vars = NewStore(spec, Sgd(1.0f), 11);
  for (const char* bias : {"dense/bias", "dense_1/bias", "dense_2/bias"}) {
    Tensor* t = *vars->Get(bias);
    for (int64_t i = 0; i < t->num_elements(); ++i) t->data<float>()[i] = 0.05f * static_cast<float>(i % 3) - 0.02f;
  }
  const Batch b = RandomBatch(9, 4, 3, 2);
  const RefParams expected = NumericGradient(spec, ParamsOf(spec, *vars), b);
  const RefParams actual = MlpGradient(spec, *vars, b, pool.cpu);
  for (std::size_t l = 0; l < 3; ++l) {
    CheckClose(actual.kernel[l], expected.kernel[l], 1e-6, 1e-4, LayerName(l) + "/kernel");
    CheckClose(actual.bias[l], expected.bias[l], 1e-6, 1e-4, LayerName(l) + "/bias");
  }
  // Some hidden units are inactive on some rows, so the ReLU mask matters.
  int zeros = 0;
  for (double g : actual.kernel[0]) zeros += g == 0.0 ? 1 : 0;
  CHECK(zeros < static_cast<int>(actual.kernel[0].size()));
}

TEST_CASE("TrainStep and Evaluate report the mean cross-entropy before the update and the accuracy") {
  Pool pool(2);
  const MlpSpec spec{4, {6}, 3};
  auto vars = NewStore(spec, Adam(0.01f), 4);
  const Batch b = RandomBatch(2500, 4, 3, 3);   // Evaluate runs 3 chunks
  int64_t correct = 0;
  const double expected_loss = RefLoss(spec, ParamsOf(spec, *vars), b, &correct);
  auto mlp = NewMlp(spec, Adam(0.01f));
  auto eval = mlp->Evaluate(*vars, b.features, b.labels, pool.cpu);
  REQUIRE(eval.ok());
  CHECK(eval->loss == doctest::Approx(expected_loss).epsilon(1e-5));
  CHECK(eval->accuracy == doctest::Approx(static_cast<double>(correct) / 2500).epsilon(1e-6));
  auto step = mlp->TrainStep(*vars, b.features, b.labels, pool.cpu);
  REQUIRE(step.ok());
  CHECK(step->loss == doctest::Approx(expected_loss).epsilon(1e-5));
  CHECK(step->accuracy == eval->accuracy);
  auto after = mlp->Evaluate(*vars, b.features, b.labels, pool.cpu);
  REQUIRE(after.ok());
  CHECK(after->loss < eval->loss);
}

// -- optimizers --------------------------------------------------------------------

/// Runs internal::ApplyDense on n elements and returns var, slot0, slot1.
struct DenseState {
  std::vector<float> var, grad, s0, s1;
};

DenseState MakeDenseState(int64_t n) {
  DenseState s;
  std::mt19937 rng(5);
  auto u = [&] { return static_cast<float>((rng() >> 8) * (1.0 / (1 << 24))); };
  for (int64_t i = 0; i < n; ++i) {
    s.var.push_back(2 * u() - 1);
    s.grad.push_back(0.2f * u() - 0.1f);
    s.s0.push_back(0.02f * u() - 0.01f);
    s.s1.push_back(0.001f * u());
  }
  s.grad[0] = 0;   // a zero gradient still moves Adam's and momentum's variables
  return s;
}

TEST_CASE("One update of each optimizer follows TF1's apply_* formulas") {
  Pool pool(2);
  for (int64_t n : {int64_t{5}, int64_t{5000}}) {   // inline, and sharded over the pool
    CAPTURE(n);
    SUBCASE("GradientDescent: var -= lr * g") {
      DenseState s = MakeDenseState(n);
      const DenseState before = s;
      internal::ApplyDense(Sgd(0.5f), 0.5f, s.var.data(), s.grad.data(), nullptr, nullptr, n, pool.device);
      for (int64_t i = 0; i < n; ++i) {
        CHECK(s.var[i] == doctest::Approx(before.var[i] - 0.5 * before.grad[i]).epsilon(1e-6));
      }
    }
    SUBCASE("Momentum and Nesterov momentum") {
      for (bool nesterov : {false, true}) {
        CAPTURE(nesterov);
        DenseState s = MakeDenseState(n);
        const DenseState before = s;
        const double lr = 0.1, mom = 0.9;
        internal::ApplyDense(Momentum(0.1f, 0.9f, nesterov), 0.1f, s.var.data(), s.grad.data(), s.s0.data(),
                             nullptr, n, pool.device);
        for (int64_t i = 0; i < n; ++i) {
          const double g = before.grad[i];
          const double accum = before.s0[i] * mom + g;
          const double var = nesterov ? before.var[i] - (g * lr + accum * mom * lr) : before.var[i] - lr * accum;
          REQUIRE(s.s0[i] == doctest::Approx(accum).epsilon(1e-5));
          REQUIRE(s.var[i] == doctest::Approx(var).epsilon(1e-5));
        }
        CHECK(s.var[0] != before.var[0]);
      }
    }
    SUBCASE("Adam with beta powers of step 3") {
      DenseState s = MakeDenseState(n);
      const DenseState before = s;
      const OptimizerOptions opt = Adam(0.01f);
      const float b1p = 0.9f * 0.9f * 0.9f, b2p = 0.999f * 0.999f * 0.999f;
      const float lr_t = internal::AdamStepSize(0.01f, b1p, b2p);
      const double expected_lr_t = 0.01 * std::sqrt(1.0 - b2p) / (1.0 - b1p);
      CHECK(lr_t == doctest::Approx(expected_lr_t).epsilon(1e-6));
      internal::ApplyDense(opt, lr_t, s.var.data(), s.grad.data(), s.s0.data(), s.s1.data(), n, pool.device);
      for (int64_t i = 0; i < n; ++i) {
        const double g = before.grad[i];
        const double m = 0.9 * before.s0[i] + (1 - 0.9) * g;
        const double v = 0.999 * before.s1[i] + (1 - 0.999) * g * g;
        const double var = before.var[i] - expected_lr_t * m / (std::sqrt(v) + 1e-8);
        REQUIRE(s.s0[i] == doctest::Approx(m).epsilon(1e-5));
        REQUIRE(s.s1[i] == doctest::Approx(v).epsilon(1e-5));
        REQUIRE(s.var[i] == doctest::Approx(var).epsilon(1e-5));
      }
    }
  }
}

/// Two TrainSteps with `opt` from the same start, each checked against the
/// reference update applied to the gradient at the step's actual weights.
void CheckTwoSteps(const OptimizerOptions& opt) {
  Pool pool(2);
  const MlpSpec spec{4, {5}, 3};
  auto vars = NewStore(spec, opt, 21);
  auto mlp = NewMlp(spec, opt);
  const Batch b = RandomBatch(6, 4, 3, 4);
  const std::vector<std::string> params = {"dense/kernel", "dense/bias", "dense_1/kernel", "dense_1/bias"};
  double b1p = opt.beta1, b2p = opt.beta2;
  for (int step = 0; step < 2; ++step) {
    CAPTURE(step);
    const RefParams g = MlpGradient(spec, *vars, b, pool.cpu);
    std::map<std::string, std::vector<double>> grads = {
        {"dense/kernel", g.kernel[0]}, {"dense/bias", g.bias[0]}, {"dense_1/kernel", g.kernel[1]}, {"dense_1/bias", g.bias[1]}};
    std::map<std::string, std::vector<double>> var, s0, s1;
    for (const std::string& p : params) {
      var[p] = Values(*vars, p);
      if (opt.kind == OptimizerKind::kMomentum) s0[p] = Values(*vars, p + "/Momentum");
      if (opt.kind == OptimizerKind::kAdam) {
        s0[p] = Values(*vars, p + "/Adam");
        s1[p] = Values(*vars, p + "/Adam_1");
      }
    }
    REQUIRE(mlp->TrainStep(*vars, b.features, b.labels, pool.cpu).ok());
    const double lr = opt.learning_rate;
    const double lr_t = lr * std::sqrt(1 - b2p) / (1 - b1p);
    for (const std::string& p : params) {
      CAPTURE(p);
      std::vector<double>& w = var[p];
      const std::vector<double>& gp = grads[p];
      for (std::size_t i = 0; i < w.size(); ++i) {
        switch (opt.kind) {
          case OptimizerKind::kSgd:
            w[i] -= lr * gp[i];
            break;
          case OptimizerKind::kMomentum:
            s0[p][i] = s0[p][i] * opt.momentum + gp[i];
            w[i] -= opt.use_nesterov ? lr * (gp[i] + opt.momentum * s0[p][i]) : lr * s0[p][i];
            break;
          case OptimizerKind::kAdam:
            s0[p][i] = opt.beta1 * s0[p][i] + (1 - opt.beta1) * gp[i];
            s1[p][i] = opt.beta2 * s1[p][i] + (1 - opt.beta2) * gp[i] * gp[i];
            w[i] -= lr_t * s0[p][i] / (std::sqrt(s1[p][i]) + opt.epsilon);
            break;
        }
      }
      CheckClose(Values(*vars, p), w, 1e-6, 1e-5, p);
      if (opt.kind == OptimizerKind::kMomentum) CheckClose(Values(*vars, p + "/Momentum"), s0[p], 1e-7, 1e-5, p + "/Momentum");
      if (opt.kind == OptimizerKind::kAdam) {
        CheckClose(Values(*vars, p + "/Adam"), s0[p], 1e-7, 1e-5, p + "/Adam");
        CheckClose(Values(*vars, p + "/Adam_1"), s1[p], 1e-9, 1e-5, p + "/Adam_1");
      }
    }
    b1p *= opt.beta1;
    b2p *= opt.beta2;
  }
  if (opt.kind == OptimizerKind::kAdam) {
    // AdamOptimizer._finish multiplies in float, once per step.
    CHECK(Var(*vars, "beta1_power").Equals(Tensor::Scalar<float>(opt.beta1 * opt.beta1 * opt.beta1)));
    CHECK(Var(*vars, "beta2_power").Equals(Tensor::Scalar<float>(opt.beta2 * opt.beta2 * opt.beta2)));
  }
}

TEST_CASE("TrainStep applies GradientDescentOptimizer's update") { CheckTwoSteps(Sgd(0.3f)); }
TEST_CASE("TrainStep applies MomentumOptimizer's update") { CheckTwoSteps(Momentum(0.2f, 0.9f, false)); }
TEST_CASE("TrainStep applies MomentumOptimizer's Nesterov update") { CheckTwoSteps(Momentum(0.2f, 0.8f, true)); }
TEST_CASE("TrainStep applies AdamOptimizer's update and advances beta1_power, beta2_power") {
  OptimizerOptions adam = Adam(0.05f);
  adam.beta1 = 0.8f;
  adam.beta2 = 0.99f;
  adam.epsilon = 1e-3f;
  CheckTwoSteps(adam);
}

TEST_CASE("set_learning_rate changes the rate of the following steps, and rejects negative and non-finite rates") {
  Pool pool(1);
  const MlpSpec spec{4, {5}, 3};
  const Batch b = RandomBatch(6, 4, 3, 4);
  auto expected_vars = NewStore(spec, Sgd(0.1f), 21);
  auto expected = NewMlp(spec, Sgd(0.1f));
  REQUIRE(expected->TrainStep(*expected_vars, b.features, b.labels, pool.cpu).ok());

  auto vars = NewStore(spec, Sgd(0.3f), 21);
  auto mlp = NewMlp(spec, Sgd(0.3f));
  REQUIRE(mlp->set_learning_rate(0.1f).ok());
  CHECK(mlp->optimizer().learning_rate == 0.1f);
  CHECK(absl::IsInvalidArgument(mlp->set_learning_rate(-1e-6f)));
  CHECK(absl::IsInvalidArgument(mlp->set_learning_rate(std::nanf(""))));
  CHECK(absl::IsInvalidArgument(mlp->set_learning_rate(std::numeric_limits<float>::infinity())));
  CHECK(mlp->optimizer().learning_rate == 0.1f);
  REQUIRE(mlp->TrainStep(*vars, b.features, b.labels, pool.cpu).ok());
  for (const char* name : {"dense/kernel", "dense/bias", "dense_1/kernel", "dense_1/bias"}) {
    CAPTURE(name);
    CHECK(Var(*vars, name).Equals(Var(*expected_vars, name)));
  }
}

TEST_CASE("a learning rate decayed to 0 leaves the variables as they are; the slots still update (TF's apply ops)") {
  // tf.train.exponential_decay in float32 reaches 0 after enough steps;
  // Create refuses a rate of 0 from the user, set_learning_rate takes it.
  Pool pool(1);
  const MlpSpec spec{4, {5}, 3};
  const Batch b = RandomBatch(6, 4, 3, 5);
  for (const OptimizerOptions& o : {Sgd(0.1f), Momentum(0.1f, 0.9f, false), Momentum(0.1f, 0.9f, true), Adam(0.1f)}) {
    CAPTURE(OptimizerKindName(o.kind));
    CAPTURE(o.use_nesterov);
    auto vars = NewStore(spec, o, 22);
    auto mlp = NewMlp(spec, o);
    REQUIRE(mlp->TrainStep(*vars, b.features, b.labels, pool.cpu).ok());  // slots not all zero
    std::map<std::string, Tensor> before;
    for (const std::string& name : vars->Names()) before.emplace(name, Var(*vars, name));
    REQUIRE(mlp->set_learning_rate(0.0f).ok());
    CHECK(mlp->optimizer().learning_rate == 0.0f);
    auto r = mlp->TrainStep(*vars, b.features, b.labels, pool.cpu);
    REQUIRE(r.ok());
    CHECK(std::isfinite(r->loss));
    int slots_changed = 0;
    for (const auto& [name, old_value] : before) {
      CAPTURE(name);
      if (absl::EndsWith(name, "/kernel") || absl::EndsWith(name, "/bias")) {  // not a slot
        CHECK(Var(*vars, name).Equals(old_value));
      } else if (!Var(*vars, name).Equals(old_value)) {
        ++slots_changed;
      }
    }
    if (o.kind != OptimizerKind::kSgd) CHECK(slots_changed > 0);
  }
}

// -- determinism -------------------------------------------------------------------

TEST_CASE("Same seed and thread count give bitwise-equal variables after N steps") {
  const MlpSpec spec{20, {16, 8}, 5};
  const Batch b = RandomBatch(32, 20, 5, 6);
  auto run = [&](uint64_t seed) {
    Pool pool(2);
    auto vars = NewStore(spec, Adam(0.01f), seed);
    auto mlp = NewMlp(spec, Adam(0.01f));
    for (int i = 0; i < 10; ++i) REQUIRE(mlp->TrainStep(*vars, b.features, b.labels, pool.cpu).ok());
    return vars;
  };
  auto a = run(1), again = run(1), other = run(2);
  CHECK(SameVariables(*a, *again));
  CHECK_FALSE(Var(*a, "dense/kernel").Equals(Var(*other, "dense/kernel")));
}

TEST_CASE("Eigen's thread-pool contraction is bitwise reproducible for a fixed pool size") {
  // The MLP's product shapes, and a small output with a long inner dimension.
  // (Eigen's shard-by-inner-dimension path, which adds per-thread partial
  // sums, in a fixed order by reading of the source, is not reached at these
  // sizes with 2 threads.)
  Pool pool(2);
  struct Shape {
    Eigen::Index m, k, n;
  };
  for (Shape s : {Shape{128, 392, 256}, Shape{392, 128, 256}, Shape{16, 8192, 16}}) {
    CAPTURE(s.k);
    Eigen::Tensor<float, 2, Eigen::RowMajor> a(s.m, s.k), b(s.k, s.n), first(s.m, s.n), c(s.m, s.n);
    a.setRandom();
    b.setRandom();
    const Eigen::array<Eigen::IndexPair<Eigen::Index>, 1> dims = {Eigen::IndexPair<Eigen::Index>(1, 0)};
    first.device(pool.device) = a.contract(b, dims);
    for (int i = 0; i < 3; ++i) {
      Pool fresh(2);
      c.device(i % 2 == 0 ? pool.device : fresh.device) = a.contract(b, dims);
      REQUIRE(std::equal(c.data(), c.data() + c.size(), first.data()));
    }
  }
}

TEST_CASE("A reused Mlp (workspace sized by the largest batch) computes what a fresh one does") {
  Pool pool(2);
  const MlpSpec spec{6, {7}, 3};
  auto reused_vars = NewStore(spec, Momentum(0.1f, 0.9f, false), 8);
  auto fresh_vars = NewStore(spec, Momentum(0.1f, 0.9f, false), 8);
  auto reused = NewMlp(spec, Momentum(0.1f, 0.9f, false));
  int seed = 0;
  for (int64_t rows : {16, 5, 16, 1, 40, 3}) {
    const Batch b = RandomBatch(rows, 6, 3, static_cast<uint32_t>(++seed));
    auto r = reused->TrainStep(*reused_vars, b.features, b.labels, pool.cpu);
    auto f = NewMlp(spec, Momentum(0.1f, 0.9f, false))->TrainStep(*fresh_vars, b.features, b.labels, pool.cpu);
    REQUIRE((r.ok() && f.ok()));
    CHECK(r->loss == f->loss);
    CHECK(SameVariables(*reused_vars, *fresh_vars));
    auto re = reused->Evaluate(*reused_vars, b.features, b.labels, pool.cpu);
    REQUIRE(re.ok());
  }
}

TEST_CASE("Sanity at the benchmark size (784-256-10, batch 128): two runs agree bitwise, loss falls") {
  const MlpSpec spec{784, {256}, 10};
  const Batch b = RandomBatch(128, 784, 10, 9);
  std::vector<float> losses;
  auto run = [&] {
    Pool pool(2);
    auto vars = NewStore(spec, Adam(0.001f), 42);
    auto mlp = NewMlp(spec, Adam(0.001f));
    losses.clear();
    for (int i = 0; i < 2; ++i) {
      auto r = mlp->TrainStep(*vars, b.features, b.labels, pool.cpu);
      REQUIRE(r.ok());
      losses.push_back(r->loss);
    }
    return vars;
  };
  auto a = run();
  auto again = run();
  CHECK(SameVariables(*a, *again));
  CHECK(losses.back() < losses.front());
}

// -- errors ------------------------------------------------------------------------

TEST_CASE("TrainStep rejects bad batches and variables, naming them, and updates nothing") {
  Pool pool(1);
  const MlpSpec spec{4, {3}, 2};
  auto vars = NewStore(spec, Adam(0.1f), 1);
  auto untouched = NewStore(spec, Adam(0.1f), 1);
  auto mlp = NewMlp(spec, Adam(0.1f));
  const Batch good = RandomBatch(3, 4, 2, 1);

  auto expect = [&](const StatusOr<StepResult>& r, absl::StatusCode code, const std::string& text) {
    REQUIRE_FALSE(r.ok());
    CHECK(r.status().code() == code);
    CHECK_MESSAGE(absl::StrContains(Msg(r.status()), text), r.status().ToString());
    CHECK(SameVariables(*vars, *untouched));
  };
  auto train = [&](const Tensor& x, const Tensor& y) { return mlp->TrainStep(*vars, x, y, pool.cpu); };

  expect(train(Tensor(DataType::kDouble, TensorShape{3, 4}), good.labels), absl::StatusCode::kInvalidArgument,
         "features: expected dtype float32, got float64");
  expect(train(Tensor(DataType::kFloat, TensorShape{3, 5}), good.labels), absl::StatusCode::kInvalidArgument,
         "features: expected shape [batch,4], got [3,5]");
  expect(train(Tensor(DataType::kFloat, TensorShape{12}), good.labels), absl::StatusCode::kInvalidArgument,
         "features: expected shape");
  expect(train(Tensor(DataType::kFloat, TensorShape{0, 4}), Tensor(DataType::kInt32, TensorShape{0})),
         absl::StatusCode::kInvalidArgument, "empty batch");
  expect(train(good.features, Tensor(DataType::kFloat, TensorShape{3})), absl::StatusCode::kInvalidArgument,
         "labels: expected dtype int32 or int64, got float32");
  expect(train(good.features, Tensor(DataType::kInt32, TensorShape{4})), absl::StatusCode::kInvalidArgument,
         "labels: expected shape [3], got [4]");
  Tensor bad_label = good.labels;
  bad_label.data<int32_t>()[2] = 2;
  expect(train(good.features, bad_label), absl::StatusCode::kInvalidArgument,
         "labels[2] = 2 is outside the valid range of [0, 2)");
  Tensor negative = *Tensor::FromVector<int64_t>({0, -1, 1}, TensorShape{3});
  expect(train(good.features, negative), absl::StatusCode::kInvalidArgument,
         "labels[1] = -1 is outside the valid range of [0, 2)");
  CHECK(mlp->Evaluate(*vars, good.features, bad_label, pool.cpu).status().code() ==
        absl::StatusCode::kInvalidArgument);

  // Variables: missing, wrong shape, wrong dtype; the last ones checked last.
  REQUIRE_OK(vars->Delete("beta2_power"));
  REQUIRE_OK(untouched->Delete("beta2_power"));
  expect(train(good.features, good.labels), absl::StatusCode::kNotFound, "variable 'beta2_power' not found");
  REQUIRE_OK(vars->Create("beta2_power", Tensor(DataType::kFloat, TensorShape{1}), false));
  REQUIRE_OK(untouched->Create("beta2_power", Tensor(DataType::kFloat, TensorShape{1}), false));
  expect(train(good.features, good.labels), absl::StatusCode::kInvalidArgument,
         "variable 'beta2_power': expected shape [], got [1]");
  REQUIRE_OK(vars->Delete("dense_1/kernel/Adam"));
  REQUIRE_OK(untouched->Delete("dense_1/kernel/Adam"));
  REQUIRE_OK(vars->Create("dense_1/kernel/Adam", Tensor(DataType::kInt64, TensorShape{3, 2}), false));
  REQUIRE_OK(untouched->Create("dense_1/kernel/Adam", Tensor(DataType::kInt64, TensorShape{3, 2}), false));
  expect(train(good.features, good.labels), absl::StatusCode::kInvalidArgument,
         "variable 'dense_1/kernel/Adam': expected dtype float32, got int64");

  VariableStore empty;
  auto eval = mlp->Evaluate(empty, good.features, good.labels, pool.cpu);
  CHECK(absl::IsNotFound(eval.status()));
  CHECK(Msg(eval.status()) == "variable 'dense/kernel' not found");
}

TEST_CASE("A NaN loss is a value, not an error") {
  Pool pool(1);
  const MlpSpec spec{3, {}, 2};
  auto vars = NewStore(spec, Sgd(0.1f), 1);
  (*vars->Get("dense/kernel"))->data<float>()[0] = std::nanf("");
  const Batch b = RandomBatch(4, 3, 2, 1);
  auto r = NewMlp(spec, Sgd(0.1f))->TrainStep(*vars, b.features, b.labels, pool.cpu);
  REQUIRE(r.ok());
  CHECK(std::isnan(r->loss));
}

// -- learning ----------------------------------------------------------------------

TEST_CASE("Learns a separable problem: the loss falls and the accuracy reaches 1") {
  // Three classes around distant centers in 6 dimensions.
  std::mt19937 rng(17);
  auto u = [&] { return static_cast<float>((rng() >> 8) * (1.0 / (1 << 24))) * 2 - 1; };
  const int64_t rows = 240, dim = 6, classes = 3;
  float centers[classes][dim];
  for (auto& c : centers) for (float& v : c) v = 2 * u();
  Batch data{Tensor(DataType::kFloat, TensorShape{rows, dim}), Tensor(DataType::kInt32, TensorShape{rows})};
  for (int64_t r = 0; r < rows; ++r) {
    const int32_t label = static_cast<int32_t>(r % classes);
    data.labels.data<int32_t>()[r] = label;
    for (int64_t d = 0; d < dim; ++d) data.features.data<float>()[r * dim + d] = centers[label][d] + 0.3f * u();
  }
  for (const MlpSpec& spec : {MlpSpec{dim, {}, classes}, MlpSpec{dim, {16}, classes}}) {
    for (const OptimizerOptions& opt : {Adam(0.02f), Momentum(0.05f, 0.9f, true), Sgd(0.2f)}) {
      CAPTURE(spec.hidden.size());
      CAPTURE(OptimizerKindName(opt.kind));
      Pool pool(2);
      auto vars = NewStore(spec, opt, 3);
      auto mlp = NewMlp(spec, opt);
      auto initial = mlp->Evaluate(*vars, data.features, data.labels, pool.cpu);
      REQUIRE(initial.ok());
      for (int epoch = 0; epoch < 20; ++epoch) {
        for (int64_t begin = 0; begin < rows; begin += 24) {
          Tensor x(DataType::kFloat, TensorShape{24, dim});
          Tensor y(DataType::kInt32, TensorShape{24});
          std::copy_n(data.features.data<float>() + begin * dim, 24 * dim, x.data<float>());
          std::copy_n(data.labels.data<int32_t>() + begin, 24, y.data<int32_t>());
          REQUIRE(mlp->TrainStep(*vars, x, y, pool.cpu).ok());
        }
      }
      auto final_eval = mlp->Evaluate(*vars, data.features, data.labels, pool.cpu);
      REQUIRE(final_eval.ok());
      CHECK(final_eval->loss < initial->loss / 10);
      CHECK(final_eval->accuracy == 1.0f);
    }
  }
}

// -- ComputeGradients / ApplyGradients (a cluster's worker and ps halves) ----------------

/// Copies the variables of `from` that `keep` accepts into `to`, with their
/// trainable flags (what a worker reads from the ps, or a ps shard's share).
template <class Keep>
void CopyVariables(const VariableStore& from, VariableStore& to, Keep keep) {
  for (auto& [name, value] : from.Snapshot()) {
    if (!keep(name)) continue;
    REQUIRE_OK(to.Create(name, value, *from.IsTrainable(name)));
  }
}

/// The entries of `grads` whose variable `shard` holds (what a worker sends that ps).
Gradients ShareOf(const Gradients& grads, const VariableStore& shard) {
  Gradients share;
  share.learning_rate = grads.learning_rate;
  share.adam_step_size = grads.adam_step_size;
  for (const Gradients::GradAndVar& g : grads.grads_and_vars) {
    if (shard.Contains(g.variable)) share.grads_and_vars.push_back(g);
  }
  return share;
}

void CheckBitwiseEqual(const VariableStore& expected, const VariableStore& actual, const std::string& what) {
  for (const std::string& name : expected.Names()) {
    REQUIRE_MESSAGE(actual.Contains(name), what, ": ", name, " missing");
    CHECK_MESSAGE(Var(expected, name).Equals(Var(actual, name)), what, ": ", name, " differs");
  }
}

void CheckSplitStepsMatchTrainStep(const OptimizerOptions& opt) {
  CAPTURE(OptimizerKindName(opt.kind));
  CAPTURE(opt.use_nesterov);
  constexpr int kSteps = 5;
  Pool pool(2);
  const MlpSpec spec{5, {7, 6}, 4};
  // The variables in creation order, as a TF1 program creates them:
  // global_step first, then the model's (AddMlpVariables's order).
  Graph graph;
  REQUIRE_OK(graph.CreateGlobalStep());
  REQUIRE_OK(AddMlpVariables(graph, spec, opt, 17));
  VariableStore fused;
  std::vector<std::string> creation_order;
  for (const VariableDef& def : graph.variables()) {
    StatusOr<Tensor> value = def.initializer();
    REQUIRE_MESSAGE(value.ok(), value.status().ToString());
    REQUIRE_OK(fused.Create(def.name, *std::move(value), def.trainable));
    creation_order.push_back(def.name);
  }
  // One store updated by ComputeGradients + ApplyGradients, and the same
  // variables split over two ps tasks as replica_device_setter places them.
  VariableStore whole;
  CopyVariables(fused, whole, [](const std::string&) { return true; });
  auto placement = PlaceVariablesOnPs(creation_order, 2);
  REQUIRE_MESSAGE(placement.ok(), placement.status().ToString());
  std::map<std::string, int> task;
  for (std::size_t i = 0; i < creation_order.size(); ++i) task[creation_order[i]] = (*placement)[i];
  VariableStore ps[2];
  for (int t = 0; t < 2; ++t) CopyVariables(fused, ps[t], [&](const std::string& n) { return task.at(n) == t; });
  // The split is a real one: both tasks hold trainables; kernels and biases
  // alternate; Adam's beta powers live on one task only, with "dense/bias".
  CHECK(task.at("global_step") == 0);
  CHECK(task.at("dense/kernel") == 1);
  CHECK(task.at("dense/bias") == 0);
  CHECK(task.at("dense_2/kernel") == 1);
  if (opt.kind == OptimizerKind::kAdam) {
    CHECK(task.at("beta1_power") == task.at("dense/bias"));
    CHECK(task.at("beta2_power") == task.at("dense/bias"));
  }

  auto fused_mlp = NewMlp(spec, opt);
  auto worker_mlp = NewMlp(spec, opt);
  Gradients grads;
  for (int step = 0; step < kSteps; ++step) {
    CAPTURE(step);
    const Batch b = RandomBatch(6 + step, 5, 4, 100 + static_cast<uint32_t>(step));
    auto fused_result = fused_mlp->TrainStep(fused, b.features, b.labels, pool.cpu);
    REQUIRE_MESSAGE(fused_result.ok(), fused_result.status().ToString());

    // One store: gradients computed on a copy, applied to the store.
    {
      VariableStore read;
      CopyVariables(whole, read, [](const std::string&) { return true; });
      auto result = worker_mlp->ComputeGradients(read, b.features, b.labels, pool.cpu, &grads);
      REQUIRE_MESSAGE(result.ok(), result.status().ToString());
      CHECK(result->loss == fused_result->loss);
      CHECK(result->accuracy == fused_result->accuracy);
      REQUIRE_OK(ApplyGradients(opt, whole, grads, pool.cpu));
    }
    // Two shards: the worker reads the trainables and beta powers from both
    // (no slots), each ps applies its share.
    {
      VariableStore read;
      for (const VariableStore& shard : ps) {
        CopyVariables(shard, read, [&](const std::string& n) {
          return *shard.IsTrainable(n) || n == "beta1_power" || n == "beta2_power";
        });
      }
      auto result = worker_mlp->ComputeGradients(read, b.features, b.labels, pool.cpu, &grads);
      REQUIRE_MESSAGE(result.ok(), result.status().ToString());
      CHECK(result->loss == fused_result->loss);
      for (VariableStore& shard : ps) REQUIRE_OK(ApplyGradients(opt, shard, ShareOf(grads, shard), pool.cpu));
    }
  }
  CHECK(whole.Names() == fused.Names());
  CheckBitwiseEqual(fused, whole, "one store");
  for (const std::string& name : fused.Names()) {
    CHECK_MESSAGE(ps[0].Contains(name) != ps[1].Contains(name), name, " is not on exactly one ps task");
  }
  CHECK(ps[0].size() + ps[1].size() == fused.size());
  for (const VariableStore& shard : ps) CheckBitwiseEqual(shard, fused, "ps shard");
  // The steps moved the variables (the comparison is not of initial values).
  auto initial = NewStore(spec, opt, 17);
  CHECK_FALSE(Var(*initial, "dense/kernel").Equals(Var(fused, "dense/kernel")));
}

TEST_CASE("ComputeGradients + ApplyGradients give bitwise TrainStep's variables and slots, in one store or two ps shards") {
  SUBCASE("GradientDescentOptimizer") { CheckSplitStepsMatchTrainStep(Sgd(0.3f)); }
  SUBCASE("MomentumOptimizer") { CheckSplitStepsMatchTrainStep(Momentum(0.2f, 0.9f, false)); }
  SUBCASE("MomentumOptimizer, Nesterov") { CheckSplitStepsMatchTrainStep(Momentum(0.2f, 0.8f, true)); }
  SUBCASE("AdamOptimizer") { CheckSplitStepsMatchTrainStep(Adam(0.05f)); }
}

TEST_CASE("ComputeGradients: TrainStep's gradients and rates, vars untouched, slots not needed, tensors reused") {
  Pool pool(2);
  const MlpSpec spec{4, {6, 5}, 3};
  for (const OptimizerOptions& opt : {Sgd(0.5f), Adam(0.01f)}) {
    CAPTURE(OptimizerKindName(opt.kind));
    auto vars = NewStore(spec, opt, 11);
    // A worker's copy: kernels, biases and beta powers, no slots.
    VariableStore read;
    CopyVariables(*vars, read, [&](const std::string& n) { return absl::StrContains(n, "power") || *vars->IsTrainable(n); });
    auto before = read.Snapshot();
    auto mlp = NewMlp(spec, opt);
    const Batch b = RandomBatch(9, 4, 3, 2);
    Gradients grads;
    grads.grads_and_vars.push_back({"stale", Tensor(DataType::kInt32, TensorShape{2})});  // replaced
    auto result = mlp->ComputeGradients(read, b.features, b.labels, pool.cpu, &grads);
    REQUIRE_MESSAGE(result.ok(), result.status().ToString());
    CHECK(read.Snapshot().size() == before.size());
    for (auto& [name, value] : before) CHECK_MESSAGE(Var(read, name).Equals(value), name, " changed");

    // Names, order, shapes: the trainables, sorted.
    std::vector<std::string> names;
    for (const Gradients::GradAndVar& g : grads.grads_and_vars) {
      names.push_back(g.variable);
      CHECK(g.grad.dtype() == DataType::kFloat);
      CHECK(g.grad.shape() == Var(read, g.variable).shape());
    }
    CHECK(names == std::vector<std::string>{"dense/bias", "dense/kernel", "dense_1/bias", "dense_1/kernel",
                                            "dense_2/bias", "dense_2/kernel"});
    CHECK(grads.learning_rate == opt.learning_rate);
    if (opt.kind == OptimizerKind::kAdam) {
      CHECK(grads.adam_step_size == internal::AdamStepSize(opt.learning_rate, opt.beta1, opt.beta2));
    } else {
      CHECK(grads.adam_step_size == 0.0f);
    }
    // The gradients are the finite differences' (in double, as the tests above).
    const RefParams expected = NumericGradient(spec, ParamsOf(spec, *vars), b);
    for (std::size_t l = 0; l < 3; ++l) {
      const Gradients::GradAndVar& kg = grads.grads_and_vars[2 * l + 1];
      const Gradients::GradAndVar& bg = grads.grads_and_vars[2 * l];
      CheckClose(std::vector<double>(kg.grad.data<float>(), kg.grad.data<float>() + kg.grad.num_elements()),
                 expected.kernel[l], 1e-6, 1e-4, kg.variable);
      CheckClose(std::vector<double>(bg.grad.data<float>(), bg.grad.data<float>() + bg.grad.num_elements()),
                 expected.bias[l], 1e-6, 1e-4, bg.variable);
    }

    // A second call reuses the tensors and follows set_learning_rate.
    std::vector<const float*> buffers;
    for (const Gradients::GradAndVar& g : grads.grads_and_vars) buffers.push_back(g.grad.data<float>());
    REQUIRE_OK(mlp->set_learning_rate(0.25f));
    const Batch b2 = RandomBatch(4, 4, 3, 3);
    REQUIRE(mlp->ComputeGradients(read, b2.features, b2.labels, pool.cpu, &grads).ok());
    for (std::size_t i = 0; i < buffers.size(); ++i) CHECK(grads.grads_and_vars[i].grad.data<float>() == buffers[i]);
    CHECK(grads.learning_rate == 0.25f);
    if (opt.kind == OptimizerKind::kAdam) {
      CHECK(grads.adam_step_size == internal::AdamStepSize(0.25f, opt.beta1, opt.beta2));
    }
  }
}

TEST_CASE("ComputeGradients rejects a null grads, bad batches and missing variables, leaving grads as it was") {
  Pool pool(1);
  const MlpSpec spec{4, {3}, 2};
  auto vars = NewStore(spec, Adam(0.1f), 1);
  auto mlp = NewMlp(spec, Adam(0.1f));
  const Batch good = RandomBatch(3, 4, 2, 1);
  Gradients grads;
  REQUIRE(mlp->ComputeGradients(*vars, good.features, good.labels, pool.cpu, &grads).ok());
  const Gradients kept = grads;
  auto unchanged = [&] {
    REQUIRE(grads.grads_and_vars.size() == kept.grads_and_vars.size());
    for (std::size_t i = 0; i < kept.grads_and_vars.size(); ++i) {
      CHECK(grads.grads_and_vars[i].grad.Equals(kept.grads_and_vars[i].grad));
    }
  };
  auto r = mlp->ComputeGradients(*vars, good.features, good.labels, pool.cpu, nullptr);
  CHECK(r.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(absl::StrContains(Msg(r.status()), "grads is null"));
  Tensor bad_label = good.labels;
  bad_label.data<int32_t>()[0] = 5;
  r = mlp->ComputeGradients(*vars, good.features, bad_label, pool.cpu, &grads);
  CHECK(r.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(absl::StrContains(Msg(r.status()), "labels[0] = 5"));
  unchanged();
  REQUIRE_OK(vars->Delete("beta1_power"));
  r = mlp->ComputeGradients(*vars, good.features, good.labels, pool.cpu, &grads);
  CHECK(r.status().code() == absl::StatusCode::kNotFound);
  CHECK(Msg(r.status()) == "variable 'beta1_power' not found");
  unchanged();
  REQUIRE_OK(vars->Delete("dense_1/bias"));
  REQUIRE_OK(vars->Create("dense_1/bias", Tensor(DataType::kFloat, TensorShape{3})));
  r = mlp->ComputeGradients(*vars, good.features, good.labels, pool.cpu, &grads);
  CHECK(r.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK_MESSAGE(absl::StrContains(Msg(r.status()), "variable 'dense_1/bias': expected shape [2], got [3]"),
                r.status().ToString());
  unchanged();
}

TEST_CASE("ApplyGradients rejects bad gradients, misrouted gradients and missing slots, naming them; updates nothing") {
  Pool pool(1);
  const MlpSpec spec{4, {3}, 2};
  const OptimizerOptions opt = Adam(0.1f);
  auto vars = NewStore(spec, opt, 1);
  auto mlp = NewMlp(spec, opt);
  const Batch b = RandomBatch(3, 4, 2, 1);
  Gradients good;
  REQUIRE(mlp->ComputeGradients(*vars, b.features, b.labels, pool.cpu, &good).ok());
  // A shard as ps task 0 of 2 holds it: dense/bias (+ slots, beta powers), dense_1/bias.
  VariableStore shard;
  CopyVariables(*vars, shard, [](const std::string& n) {
    return absl::StartsWith(n, "dense/bias") || absl::StartsWith(n, "dense_1/bias") || absl::StrContains(n, "power");
  });
  const Gradients share = ShareOf(good, shard);
  REQUIRE(share.grads_and_vars.size() == 2);
  auto initial = shard.Snapshot();

  auto expect = [&](const Gradients& g, absl::StatusCode code, const std::string& text) {
    const Status s = ApplyGradients(opt, shard, g, pool.cpu);
    CHECK(s.code() == code);
    CHECK_MESSAGE(absl::StrContains(Msg(s), text), s.ToString());
    for (auto& [name, value] : initial) CHECK_MESSAGE(Var(shard, name).Equals(value), name, " changed");
  };
  // The bad entry comes last, after a good one, each time.
  Gradients g = share;
  g.grads_and_vars.push_back(good.grads_and_vars[1]);  // dense/kernel: on the other ps
  expect(g, absl::StatusCode::kNotFound, "gradient for variable 'dense/kernel', which this store does not hold");
  g = share;
  g.grads_and_vars[1].grad = Tensor(DataType::kFloat, TensorShape{3});
  expect(g, absl::StatusCode::kInvalidArgument, "gradient for variable 'dense_1/bias': expected shape [2], got [3]");
  g = share;
  g.grads_and_vars[1].grad = Tensor(DataType::kDouble, TensorShape{2});
  expect(g, absl::StatusCode::kInvalidArgument, "gradient for variable 'dense_1/bias': expected dtype float32");
  g = share;
  g.grads_and_vars.push_back(share.grads_and_vars[0]);
  expect(g, absl::StatusCode::kInvalidArgument, "variable 'dense/bias' has more than one gradient");
  g = share;
  g.learning_rate = -1;
  expect(g, absl::StatusCode::kInvalidArgument, "learning_rate must be >= 0 and finite, got -1");
  g = share;
  g.adam_step_size = std::numeric_limits<float>::quiet_NaN();
  expect(g, absl::StatusCode::kInvalidArgument, "adam_step_size must be >= 0 and finite");
  OptimizerOptions bad = opt;
  bad.beta1 = 1;
  CHECK(ApplyGradients(bad, shard, share, pool.cpu).code() == absl::StatusCode::kInvalidArgument);

  REQUIRE_OK(shard.Delete("dense_1/bias/Adam_1"));
  initial.erase("dense_1/bias/Adam_1");
  expect(share, absl::StatusCode::kNotFound, "variable 'dense_1/bias/Adam_1' not found");
  REQUIRE_OK(shard.Create("dense_1/bias/Adam_1", Tensor(DataType::kFloat, TensorShape{1, 2}), false));
  initial["dense_1/bias/Adam_1"] = Tensor(DataType::kFloat, TensorShape{1, 2});
  expect(share, absl::StatusCode::kInvalidArgument, "variable 'dense_1/bias/Adam_1': expected shape [2], got [1,2]");
  REQUIRE_OK(shard.Delete("dense_1/bias/Adam_1"));
  REQUIRE_OK(shard.Create("dense_1/bias/Adam_1", Tensor(DataType::kFloat, TensorShape{2}), false));
  initial["dense_1/bias/Adam_1"] = Tensor(DataType::kFloat, TensorShape{2});
  REQUIRE_OK(shard.Delete("beta2_power"));
  initial.erase("beta2_power");
  expect(share, absl::StatusCode::kNotFound, "holds 'beta1_power' but not 'beta2_power'");

  // Not a shard's fault: a momentum update needs "<var>/Momentum".
  const Status s = ApplyGradients(Momentum(0.1f, 0.9f, false), shard, share, pool.cpu);
  CHECK(s.code() == absl::StatusCode::kNotFound);
  CHECK_MESSAGE(absl::StrContains(Msg(s), "variable 'dense/bias/Momentum' not found"), s.ToString());
}

TEST_CASE("ApplyGradients advances Adam's beta powers once per call where the store holds them") {
  Pool pool(1);
  const OptimizerOptions opt = Adam(0.1f);
  Gradients none;
  none.learning_rate = 0.1f;
  none.adam_step_size = 0.01f;
  VariableStore powers;
  REQUIRE_OK(powers.Create("beta1_power", Tensor::Scalar<float>(opt.beta1), false));
  REQUIRE_OK(powers.Create("beta2_power", Tensor::Scalar<float>(opt.beta2), false));
  REQUIRE_OK(ApplyGradients(opt, powers, none, pool.cpu));
  REQUIRE_OK(ApplyGradients(opt, powers, none, pool.cpu));
  CHECK(*Var(powers, "beta1_power").data<float>() == opt.beta1 * opt.beta1 * opt.beta1);
  CHECK(*Var(powers, "beta2_power").data<float>() == opt.beta2 * opt.beta2 * opt.beta2);
  // Other optimizers leave them alone; a store without them is fine.
  REQUIRE_OK(ApplyGradients(Sgd(0.1f), powers, none, pool.cpu));
  CHECK(*Var(powers, "beta1_power").data<float>() == opt.beta1 * opt.beta1 * opt.beta1);
  VariableStore empty;
  REQUIRE_OK(ApplyGradients(opt, empty, none, pool.cpu));
  CHECK(empty.size() == 0);
}

TEST_CASE("ApplyGradients takes two different zero-element variables (duplicates are found by name)") {
  Pool pool(1);
  VariableStore shard;
  REQUIRE_OK(shard.Create("p", *Tensor::Create(DataType::kFloat, TensorShape{0})));
  REQUIRE_OK(shard.Create("q", *Tensor::Create(DataType::kFloat, TensorShape{0, 4})));
  Gradients grads;
  grads.learning_rate = 0.1f;
  grads.grads_and_vars.push_back({"p", *Tensor::Create(DataType::kFloat, TensorShape{0})});
  grads.grads_and_vars.push_back({"q", *Tensor::Create(DataType::kFloat, TensorShape{0, 4})});
  REQUIRE_OK(ApplyGradients(Sgd(0.1f), shard, grads, pool.cpu));
  grads.grads_and_vars.push_back({"p", *Tensor::Create(DataType::kFloat, TensorShape{0})});
  const Status twice = ApplyGradients(Sgd(0.1f), shard, grads, pool.cpu);
  CHECK(twice.code() == absl::StatusCode::kInvalidArgument);
  CHECK_MESSAGE(absl::StrContains(twice.message(), "variable 'p' has more than one gradient"), twice.ToString());
}

}  // namespace
}  // namespace foreman::nn
