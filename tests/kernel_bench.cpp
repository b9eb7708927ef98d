// Kernel micro-benchmarks (issue 29, point 4): a device's operations at the
// shapes of the MLP 784-256-10's training step (tools/bench/train_bench's
// model), at each batch size of --batches, each against its baseline in the
// same invocation:
//
//   gemm.<op>.b<B>      one GEMM of the step (fwd0, fwd1: the layers'
//                       forward; kgrad1, kgrad0: their kernel gradients;
//                       dgrad: the backward through layer 1's ReLU), as the
//                       device runs it now against the GEMM before issue 29
//                       (its next k tile not loaded while this one is
//                       summed)
//   xent_stats.b<B>     SoftmaxXentToDevice (the gradient and the batch's
//                       statistics in one block) now against the kernel
//                       before issue 29 (one thread adding up the losses)
//   bias_grad.l<L>.b<B> a layer's kernel and bias gradients as one launch
//                       (GemmArgs::column_sums) against two (the GEMM, then
//                       ColumnSums)
//   adam_update         Adam's update of the model's four variables as
//                       ApplyAdamGroup (two launches) against AdamStepSize,
//                       four ApplyAdam and AdamFinish (six)
//
// The "before" kernels are the CUDA device's with the environment variable
// FOREMAN_CUDA_BASELINE_KERNELS=1, so each figure of the first two kinds
// comes from child processes of this program, one per leg, the two legs
// alternated --reps times (the last two kinds compare two forms within the
// current kernels' legs).
// A figure is the median over the legs of each leg's median over --replays
// replays of (the wall time of one replay of --ops operations captured into
// one graph, then a Synchronize) / --ops, in microseconds, so it holds what a
// captured training step pays per operation. The output of the compared
// forms is hashed: the GEMMs must be bitwise the same in both legs (and with
// and without column_sums; Adam's two forms too), the statistics kernels
// must agree on the gradient and the correct count (the loss sums may differ in a double's
// last bits: a different order of addition). A mismatch is an error (exit 1).
//
//   RUN kernel.<name> <us> us baseline=<us> ratio=<baseline/us>x
//
// Without a usable CUDA device it prints "SKIP ..." and exits 77. --device
// cpu runs the same code on the CPU device without capture (the smoke
// test's way to run it: its figures mean nothing, both legs run the same
// CPU code; its batches default to 128). Each figure is per operation: a
// GEMM, a statistics call, a layer's two gradients (one launch or two), a
// step's Adam update (two launches or six).
//
//   kernel_bench [--device gpu:N|cpu] [--batches 128,1024,8192] [--reps 3]
//                [--ops 50] [--replays 20]
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "bench_util.hpp"
#include "compute/device_factory.hpp"
#include "foreman/compute.hpp"
#include "support/device_buffers.hpp"
#include "support/random_floats.hpp"

extern char** environ;

namespace {

using foreman::Status;
using foreman::compute::Device;
using foreman::compute::Epilogue;
using foreman::compute::GemmArgs;
using foreman::testing::Random;

constexpr const char* kBaselineEnv = "FOREMAN_CUDA_BASELINE_KERNELS";

struct Options {
  std::string device = "gpu:0";
  std::vector<int64_t> batches = {128, 1024, 8192};
  int reps = 3;
  int ops = 50;
  int replays = 20;
  std::string leg;  // internal: "now" or "baseline", one child's measurements
};

[[noreturn]] void Usage(const std::string& why) {
  std::fprintf(stderr,
               "kernel_bench: %s\nusage: kernel_bench [--device gpu:N|cpu] [--batches 128,1024,8192] [--reps 3] "
               "[--ops 50] [--replays 20]\n",
               why.c_str());
  std::exit(2);
}

int PositiveInt(const std::string& flag, const std::string& v, int max) {
  int x = 0;
  if (!absl::SimpleAtoi(v, &x) || x < 1 || x > max) Usage(absl::StrCat(flag, " wants an integer in [1, ", max, "], got '", v, "'"));
  return x;
}

Options Parse(int argc, char** argv) {
  Options o;
  bool batches_given = false;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--help" || flag == "-h") {
      std::printf("usage: kernel_bench [--device gpu:N|cpu] [--batches 128,1024,8192] [--reps 3] [--ops 50] "
                  "[--replays 20]\n");
      std::exit(0);
    }
    if (i + 1 >= argc) Usage(flag + " needs a value");
    const std::string v = argv[++i];
    if (flag == "--device") {
      const bool gpu = v.size() > 4 && v.rfind("gpu:", 0) == 0 &&
                       v.find_first_not_of("0123456789", 4) == std::string::npos;
      if (v != "cpu" && !gpu) Usage("--device wants gpu:N or cpu, got '" + v + "'");
      o.device = v;
    } else if (flag == "--batches") {
      batches_given = true;
      o.batches.clear();
      for (absl::string_view b : absl::StrSplit(v, ',')) o.batches.push_back(PositiveInt("--batches", std::string(b), 1 << 20));
    } else if (flag == "--reps") {
      o.reps = PositiveInt(flag, v, 100);
    } else if (flag == "--ops") {
      o.ops = PositiveInt(flag, v, 10000);
    } else if (flag == "--replays") {
      o.replays = PositiveInt(flag, v, 10000);
    } else if (flag == "--leg") {
      if (v != "now" && v != "baseline") Usage("--leg wants now or baseline");
      o.leg = v;
    } else {
      Usage("unknown flag '" + flag + "'");
    }
  }
  // The CPU device at batch 8192 would outlast a leg's alarm: 128 unless asked.
  if (o.device == "cpu" && !batches_given) o.batches = {128};
  return o;
}

void Check(const Status& s, const std::string& what) {
  if (!s.ok()) foreman_bench::DieOn(what, s);
}

/// FNV-1a over bytes: equal outputs, equal hashes.
uint64_t Hash(const void* p, std::size_t n, uint64_t h = 1469598103934665603ull) {
  const auto* b = static_cast<const unsigned char*>(p);
  for (std::size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 1099511628211ull;
  return h;
}

/// Device buffers of one batch size's step, freed with it; a failed device
/// call ends the benchmark.
class Buffers : public foreman::testing::DeviceBuffers {
 public:
  explicit Buffers(Device& d)
      : DeviceBuffers(d, [](const std::string& what, const Status& s) {
          foreman_bench::DieOn(what, s);
        }) {}
  template <class T>
  uint64_t HashOf(const T* p, int64_t n, uint64_t h = 1469598103934665603ull) {
    const std::vector<T> v = Get(p, n);
    return Hash(v.data(), v.size() * sizeof(T), h);
  }
};

/// Microseconds per operation: `ops` calls of `op` captured once (or, on a
/// device without capture, called) per sample, the median over `replays`.
double TimeOp(Device& d, const std::function<Status()>& op, const Options& o) {
  std::unique_ptr<foreman::compute::CapturedOps> graph;
  if (d.supports_capture()) {
    Check(d.BeginCapture(), "BeginCapture");
    for (int i = 0; i < o.ops; ++i) Check(op(), "a captured operation");
    auto g = d.EndCapture();
    if (!g.ok()) foreman_bench::DieOn("EndCapture", g.status());
    graph = std::move(*g);
  }
  auto run = [&] {
    if (graph != nullptr) {
      Check(graph->Replay(), "Replay");
    } else {
      for (int i = 0; i < o.ops; ++i) Check(op(), "an operation");
    }
    Check(d.Synchronize(), "Synchronize");
  };
  for (int i = 0; i < 3; ++i) run();  // warm-up
  std::vector<double> us;
  for (int i = 0; i < o.replays; ++i) {
    const double start = foreman_bench::NowSeconds();
    run();
    us.push_back((foreman_bench::NowSeconds() - start) * 1e6 / o.ops);
  }
  return foreman_bench::Summarize(us).median;
}

/// One leg (a child process): every figure of every batch size as
///   LEG <name> <us> <hash>
int RunLeg(const Options& o) {
  const std::string name = o.device == "cpu" ? "/cpu:0" : "/" + o.device;
  auto dev = foreman::compute::CreateDevice(name, 1);
  if (!dev.ok()) foreman_bench::DieOn("creating " + name, dev.status());
  Device& d = **dev;
  auto leg = [](const std::string& what, double us, uint64_t hash) {
    std::printf("LEG %s %.4f %016" PRIx64 "\n", what.c_str(), us, hash);
    std::fflush(stdout);
  };
  constexpr int64_t kIn = 784, kHidden = 256, kClasses = 10;
  for (const int64_t b : o.batches) {
    const std::string suffix = absl::StrCat(".b", b);
    Buffers buf(d);
    float* x = buf.Put(Random(b * kIn, 1, 0.0f, 1.0f));
    float* w0 = buf.Put(Random(kIn * kHidden, 2, -0.05f, 0.05f));
    float* b0 = buf.Put(Random(kHidden, 3, -0.05f, 0.05f));
    float* w1 = buf.Put(Random(kHidden * kClasses, 4, -0.1f, 0.1f));
    float* b1 = buf.Put(Random(kClasses, 5, -0.1f, 0.1f));
    float* hidden = buf.Put(Random(b * kHidden, 6, 0.0f, 1.0f));
    float* logits = buf.Put(Random(b * kClasses, 7, -6.0f, 6.0f));
    float* delta1 = buf.Put(Random(b * kClasses, 8, -0.01f, 0.01f));
    float* delta0 = buf.Put(Random(b * kHidden, 9, -0.01f, 0.01f));
    std::vector<int32_t> labels_host(static_cast<std::size_t>(b));
    std::mt19937 rng(10);
    for (int32_t& l : labels_host) l = static_cast<int32_t>(rng() % kClasses);
    const int32_t* labels = buf.Put(labels_host);
    float* out_hidden = buf.Uninitialized<float>(b * kHidden);
    float* out_logits = buf.Uninitialized<float>(b * kClasses);
    float* kgrad0 = buf.Uninitialized<float>(kIn * kHidden);
    float* kgrad1 = buf.Uninitialized<float>(kHidden * kClasses);
    float* bgrad0 = buf.Uninitialized<float>(kHidden);
    float* bgrad1 = buf.Uninitialized<float>(kClasses);
    float* out_delta0 = buf.Uninitialized<float>(b * kHidden);
    float* xent_grad = buf.Uninitialized<float>(b * kClasses);
    auto* stats = buf.Uninitialized<foreman::compute::SoftmaxXentStats>(1);

    auto gemm = [&](const float* a, const float* bm, float* c, int64_t m, int64_t n, int64_t k) {
      GemmArgs g;
      g.a = a;
      g.b = bm;
      g.c = c;
      g.m = m;
      g.n = n;
      g.k = k;
      return g;
    };
    struct Shape {
      std::string op;
      GemmArgs g;
      int64_t c_size;
    };
    std::vector<Shape> shapes;
    GemmArgs g = gemm(x, w0, out_hidden, b, kHidden, kIn);
    g.epilogue = Epilogue::kBiasRelu;
    g.bias = b0;
    shapes.push_back({"fwd0", g, b * kHidden});
    g = gemm(hidden, w1, out_logits, b, kClasses, kHidden);
    g.epilogue = Epilogue::kBias;
    g.bias = b1;
    shapes.push_back({"fwd1", g, b * kClasses});
    g = gemm(hidden, delta1, kgrad1, kHidden, kClasses, b);
    g.transpose_a = true;
    shapes.push_back({"kgrad1", g, kHidden * kClasses});
    g = gemm(delta1, w1, out_delta0, b, kHidden, kClasses);
    g.transpose_b = true;
    g.epilogue = Epilogue::kReluGradMask;
    g.relu_output = hidden;
    shapes.push_back({"dgrad", g, b * kHidden});
    g = gemm(x, delta0, kgrad0, kIn, kHidden, b);
    g.transpose_a = true;
    shapes.push_back({"kgrad0", g, kIn * kHidden});
    for (const Shape& s : shapes) {
      const double us = TimeOp(d, [&] { return d.Gemm(s.g); }, o);
      leg("gemm." + s.op + suffix, us, buf.HashOf(s.g.c, s.c_size));
    }

    foreman::compute::SoftmaxXentArgs xent;
    xent.logits = logits;
    xent.labels = labels;
    xent.rows = b;
    xent.classes = kClasses;
    const float scale = 1.0f / static_cast<float>(b);
    const double xent_us = TimeOp(d, [&] { return d.SoftmaxXentToDevice(xent, scale, xent_grad, stats); }, o);
    foreman::compute::SoftmaxXentStats host_stats;
    Check(d.CopyToHost(&host_stats, stats, sizeof(host_stats)), "CopyToHost (statistics)");
    leg("xent_stats" + suffix, xent_us,
        buf.HashOf(xent_grad, b * kClasses, Hash(&host_stats.correct, sizeof(host_stats.correct))));

    // A layer's kernel and bias gradients: one launch against two.
    struct Layer {
      int index;
      GemmArgs kg;
      const float* delta;
      int64_t cols;
      float* bias_grad;
    };
    const Layer layers[] = {{1, shapes[2].g, delta1, kClasses, bgrad1}, {0, shapes[4].g, delta0, kHidden, bgrad0}};
    for (const Layer& l : layers) {
      const std::string tag = absl::StrCat("bias_grad.l", l.index, suffix);
      const double split_us = TimeOp(
          d,
          [&]() -> Status {
            FOREMAN_RETURN_IF_ERROR(d.Gemm(l.kg));
            return d.ColumnSums(l.delta, b, l.cols, l.bias_grad);
          },
          o);
      const uint64_t split_hash = buf.HashOf(l.bias_grad, l.cols, buf.HashOf(l.kg.c, l.kg.m * l.kg.n));
      // Both outputs poisoned first, so that a fused form that leaves either
      // unwritten cannot match the split form's hash.
      Check(d.CopyToDevice(l.kg.c, std::vector<float>(l.kg.m * l.kg.n, NAN).data(), l.kg.m * l.kg.n * 4),
            "CopyToDevice (poison)");
      Check(d.CopyToDevice(l.bias_grad, std::vector<float>(l.cols, NAN).data(), l.cols * 4), "CopyToDevice (poison)");
      GemmArgs fused = l.kg;
      fused.column_sums = l.bias_grad;
      const double fused_us = TimeOp(d, [&] { return d.Gemm(fused); }, o);
      const uint64_t fused_hash = buf.HashOf(l.bias_grad, l.cols, buf.HashOf(l.kg.c, l.kg.m * l.kg.n));
      // Per pair of gradients, not per operation: the split form makes two calls.
      leg(tag + ".split", split_us, split_hash);
      leg(tag + ".fused", fused_us, fused_hash);
    }
  }

  // Adam's update of the model's variables, one call against six; each form
  // on its own copy of the same state, updated as many times.
  {
    Buffers buf(d);
    const int64_t sizes[] = {kIn * kHidden, kHidden, kHidden * kClasses, kClasses};
    struct Form {
      std::vector<foreman::compute::AdamVariable> vars;
      float* scalars;  // beta1_power, beta2_power, step_size
    } forms[2];
    const float* lr = buf.Put(std::vector<float>{1e-3f});
    for (Form& f : forms) {
      uint32_t seed = 20;
      for (const int64_t n : sizes) {
        f.vars.push_back({buf.Put(Random(n, seed, -0.1f, 0.1f)), buf.Put(Random(n, seed + 1, 0.0f, 0.01f)),
                          buf.Put(Random(n, seed + 2, 0.0f, 1e-4f)),
                          buf.Put(Random(n, seed + 3, -0.01f, 0.01f)), n});
        seed += 4;
      }
      f.scalars = buf.Put(std::vector<float>{0.9f, 0.999f, 0.0f});
    }
    constexpr float kBeta1 = 0.9f, kBeta2 = 0.999f, kEpsilon = 1e-8f;
    auto hash = [&](const Form& f) {
      uint64_t h = buf.HashOf(f.scalars, 3);
      for (const auto& x : f.vars) h = buf.HashOf(x.m, x.n, buf.HashOf(x.v, x.n, buf.HashOf(x.var, x.n, h)));
      return h;
    };
    Form& split = forms[0];
    const double split_us = TimeOp(
        d,
        [&]() -> Status {
          float* s = split.scalars;
          FOREMAN_RETURN_IF_ERROR(d.AdamStepSize(foreman::compute::DeviceScalar{lr},
                                                 foreman::compute::DeviceScalar{s},
                                                 foreman::compute::DeviceScalar{s + 1}, s + 2));
          for (const auto& x : split.vars) {
            FOREMAN_RETURN_IF_ERROR(
                d.ApplyAdam(x.var, x.m, x.v, x.grad, x.n, foreman::compute::DeviceScalar{s + 2}, kBeta1, kBeta2, kEpsilon));
          }
          return d.AdamFinish(s, s + 1, kBeta1, kBeta2);
        },
        o);
    Form& fused = forms[1];
    const double fused_us = TimeOp(
        d,
        [&] {
          float* s = fused.scalars;
          return d.ApplyAdamGroup(fused.vars.data(), static_cast<int64_t>(fused.vars.size()),
                                  foreman::compute::DeviceScalar{lr}, s, s + 1, kBeta1, kBeta2, kEpsilon, s + 2);
        },
        o);
    leg("adam_update.split", split_us, hash(split));
    leg("adam_update.fused", fused_us, hash(fused));
  }
  return 0;
}

struct LegResult {
  double us = 0;
  std::string hash;
};

/// Runs this program as one leg; its LEG lines by name. Exits on failure.
std::map<std::string, LegResult> SpawnLeg(const char* self, const Options& o, bool baseline) {
  std::vector<std::string> args = {self,
                                   "--device",
                                   o.device,
                                   "--batches",
                                   absl::StrJoin(o.batches, ","),
                                   "--ops",
                                   std::to_string(o.ops),
                                   "--replays",
                                   std::to_string(o.replays),
                                   "--leg",
                                   baseline ? "baseline" : "now"};
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::vector<std::string> env_strings;
  for (char** e = environ; *e != nullptr; ++e) {
    if (std::strncmp(*e, kBaselineEnv, std::strlen(kBaselineEnv)) == 0 && (*e)[std::strlen(kBaselineEnv)] == '=') continue;
    env_strings.push_back(*e);
  }
  if (baseline) env_strings.push_back(std::string(kBaselineEnv) + "=1");
  std::vector<char*> envp;
  for (std::string& e : env_strings) envp.push_back(e.data());
  envp.push_back(nullptr);

  int fds[2];
  if (pipe(fds) != 0) {
    std::perror("kernel_bench: pipe");
    std::exit(1);
  }
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, fds[1], STDOUT_FILENO);
  posix_spawn_file_actions_addclose(&actions, fds[0]);
  posix_spawn_file_actions_addclose(&actions, fds[1]);
  pid_t pid = 0;
  const int err = posix_spawn(&pid, self, &actions, nullptr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  close(fds[1]);
  if (err != 0) {
    std::fprintf(stderr, "kernel_bench: starting %s: %s\n", self, std::strerror(err));
    std::exit(1);
  }
  std::string out;
  char chunk[4096];
  for (ssize_t n; (n = read(fds[0], chunk, sizeof(chunk))) != 0;) {
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) break;
    out.append(chunk, static_cast<std::size_t>(n));
  }
  close(fds[0]);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    std::fprintf(stderr, "kernel_bench: the %s leg failed (%s %d)\n", baseline ? "baseline" : "current",
                 WIFEXITED(status) ? "exit" : "signal", WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
    std::exit(1);
  }
  std::map<std::string, LegResult> results;
  for (absl::string_view line : absl::StrSplit(out, '\n')) {
    const std::vector<std::string> f = absl::StrSplit(line, ' ', absl::SkipEmpty());
    if (f.size() != 4 || f[0] != "LEG") continue;
    LegResult r;
    if (!absl::SimpleAtod(f[2], &r.us)) continue;
    r.hash = f[3];
    results[f[1]] = r;
  }
  return results;
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = Parse(argc, argv);
  if (!o.leg.empty()) {
    alarm(300);  // a leg that hangs on a broken device ends; the parent reports it
    return RunLeg(o);
  }
  if (o.device != "cpu") {
    auto probe = foreman::compute::CreateDevice("/" + o.device, 1);
    if (!probe.ok()) {
      std::printf("SKIP kernel_bench --device %s: %s\n", o.device.c_str(), std::string(probe.status().message()).c_str());
      return 77;
    }
  }
  // Legs alternated: now, baseline, baseline, now, ...
  std::map<std::string, std::vector<double>> now_us, base_us;
  std::map<std::string, std::string> now_hash, base_hash;
  for (int rep = 0; rep < o.reps; ++rep) {
    for (int i = 0; i < 2; ++i) {
      const bool baseline = (rep % 2 == 0) == (i == 1);
      for (const auto& [name, r] : SpawnLeg("/proc/self/exe", o, baseline)) {
        (baseline ? base_us : now_us)[name].push_back(r.us);
        auto& hashes = baseline ? base_hash : now_hash;
        if (hashes.count(name) != 0 && hashes[name] != r.hash) {
          std::fprintf(stderr, "kernel_bench: %s's output differs between two runs of the same kernels\n", name.c_str());
          return 1;
        }
        hashes[name] = r.hash;
      }
    }
  }
  auto median = [](const std::vector<double>& v) { return foreman_bench::Summarize(v).median; };
  auto row = [](const std::string& name, double us, double baseline_us) {
    std::printf("RUN kernel.%s %.2f us baseline=%.2f ratio=%.2fx\n", name.c_str(), us, baseline_us,
                us > 0 ? baseline_us / us : 0.0);
  };
  int failures = 0;
  for (const auto& [name, us] : now_us) {
    auto ends_with = [&](const char* suffix) {
      const std::size_t n = std::strlen(suffix);
      return name.size() >= n && name.compare(name.size() - n, n, suffix) == 0;
    };
    if (ends_with(".split")) continue;
    if (ends_with(".fused")) {  // two forms within the current legs
      const std::string base = name.substr(0, name.size() - 6);
      const std::string split = base + ".split";
      if (now_hash[split] != now_hash[name]) {
        std::fprintf(stderr, "kernel_bench: %s: the fused and the split forms give different results\n", base.c_str());
        ++failures;
      }
      row(base, median(us), median(now_us[split]));
      continue;
    }
    if (base_us.count(name) == 0) {
      std::fprintf(stderr, "kernel_bench: %s has no baseline figure\n", name.c_str());
      ++failures;
      continue;
    }
    if (base_hash[name] != now_hash[name]) {
      std::fprintf(stderr, "kernel_bench: %s: the current and the baseline kernels give different outputs\n",
                   name.c_str());
      ++failures;
    }
    row(name, median(us), median(base_us[name]));
  }
  return failures == 0 ? 0 : 1;
}
