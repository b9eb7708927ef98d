// Summaries (issue 6, part 4): scalar events/s and bytes/s through the
// summary_writer actor (what SummarySaverHook and StepCounterHook use),
// reached through the public foreman::FileWriter (foreman/file_writer.hpp), and
// through an EventFileWriter called directly on the caller's thread (the
// baseline: the same file format and flush policy without the actor).
// One iteration = `batch` scalar summaries sent, then a Flush() that waits
// until they are written: the figure counts the whole path to the file.
//
// Histograms (issue 29 point 2): BM_HistogramSummary is HistogramSummary()
// of the main job's first kernel (784 x 256 float32, normal values of the
// scale Glorot gives it), and BM_HistogramBucketsBySearch the way buckets
// were found before (std::upper_bound over the 1551 limits per element,
// plus the same running statistics), the baseline of the ratio.
//
//   summary_bench [--benchmark_repetitions=5 ...]
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cfloat>
#include <cstdint>
#include <random>
#include <filesystem>
#include <memory>
#include <string>
#include <system_error>
#include <vector>

#include "bench_util.hpp"
#include "foreman/event_writer.hpp"
#include "foreman/file_writer.hpp"
#include "foreman/summary.hpp"
#include "foreman/tensor.hpp"

namespace {

using foreman::Status;

uint64_t DirectoryBytes(const std::string& dir) {
  uint64_t total = 0;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    if (entry.is_regular_file(ec)) total += entry.file_size(ec);
  }
  return total;
}

// TF's scalar summaries as a training job writes them: a few tags, new values.
std::vector<std::string> Summaries(int n) {
  std::vector<std::string> out;
  out.reserve(n);
  for (int i = 0; i < n; ++i) {
    out.push_back(foreman::ScalarSummary(i % 2 == 0 ? "loss" : "accuracy", 1.0f / static_cast<float>(i + 1)));
  }
  return out;
}

void BM_SummaryWriterActor(benchmark::State& state) {
  const int batch = static_cast<int>(state.range(0));
  foreman_bench::ScratchDir dir("", "foreman_summary");
  auto writer = foreman::FileWriter::Create(dir.path());
  if (!writer.ok()) return state.SkipWithError(writer.status().ToString().c_str());
  const std::vector<std::string> summaries = Summaries(batch);
  Status flushed = (*writer)->Flush(absl::Minutes(1));
  const uint64_t before = DirectoryBytes(dir.path());
  int64_t step = 0;
  for (auto _ : state) {
    for (const std::string& s : summaries) (*writer)->AddSummary(s, ++step);
    flushed = (*writer)->Flush(absl::Minutes(1));
    if (!flushed.ok()) {
      state.SkipWithError(flushed.ToString().c_str());
      break;
    }
  }
  state.SetItemsProcessed(state.iterations() * batch);
  state.SetBytesProcessed(static_cast<int64_t>(DirectoryBytes(dir.path()) - before));
  Status s = (*writer)->Close(absl::Minutes(1));
  if (!s.ok()) state.SkipWithError(s.ToString().c_str());
}

void BM_EventFileWriterDirect(benchmark::State& state) {
  const int batch = static_cast<int>(state.range(0));
  foreman_bench::ScratchDir dir("", "foreman_summary");
  auto writer = foreman::EventFileWriter::Create(dir.path());
  if (!writer.ok()) return state.SkipWithError(writer.status().ToString().c_str());
  const std::vector<std::string> summaries = Summaries(batch);
  const uint64_t before = DirectoryBytes(dir.path());
  int64_t step = 0;
  for (auto _ : state) {
    Status s;
    for (const std::string& summary : summaries) {
      s = (*writer)->AddSummary(summary, ++step);
      if (!s.ok()) break;
    }
    if (s.ok()) s = (*writer)->Flush();
    if (!s.ok()) {
      state.SkipWithError(s.ToString().c_str());
      break;
    }
  }
  state.SetItemsProcessed(state.iterations() * batch);
  state.SetBytesProcessed(static_cast<int64_t>(DirectoryBytes(dir.path()) - before));
  Status s = (*writer)->Close();
  if (!s.ok()) state.SkipWithError(s.ToString().c_str());
}

foreman::Tensor KernelLike(int64_t n) {
  foreman::Tensor t(foreman::DataType::kFloat, foreman::TensorShape({n}));
  std::mt19937 rng(1);
  std::normal_distribution<float> d(0.0f, 0.05f);
  for (int64_t i = 0; i < n; ++i) t.data<float>()[i] = d(rng);
  return t;
}

void BM_HistogramSummary(benchmark::State& state) {
  const foreman::Tensor values = KernelLike(state.range(0));
  for (auto _ : state) {
    auto s = foreman::HistogramSummary("dense/kernel", values);
    if (!s.ok()) return state.SkipWithError(s.status().ToString().c_str());
    benchmark::DoNotOptimize(s->data());
  }
  state.SetItemsProcessed(state.iterations() * state.range(0));
}

void BM_HistogramBucketsBySearch(benchmark::State& state) {
  const foreman::Tensor values = KernelLike(state.range(0));
  const std::vector<double>& limits = foreman::DefaultHistogramBucketLimits();
  std::vector<double> buckets(limits.size());
  for (auto _ : state) {
    std::fill(buckets.begin(), buckets.end(), 0.0);
    double lo = DBL_MAX, hi = -DBL_MAX, num = 0, sum = 0, squares = 0;
    const float* v = values.data<float>();
    for (int64_t i = 0; i < values.num_elements(); ++i) {
      const auto x = static_cast<double>(v[i]);
      const auto b = std::min<std::size_t>(std::upper_bound(limits.begin(), limits.end(), x) - limits.begin(),
                                           limits.size() - 1);
      buckets[b] += 1;
      lo = std::min(lo, x);
      hi = std::max(hi, x);
      num += 1;
      sum += x;
      squares += x * x;
    }
    benchmark::DoNotOptimize(buckets.data());
    benchmark::DoNotOptimize(lo + hi + num + sum + squares);
  }
  state.SetItemsProcessed(state.iterations() * state.range(0));
}

double Min(const std::vector<double>& v) { return v.empty() ? 0 : *std::min_element(v.begin(), v.end()); }
double Max(const std::vector<double>& v) { return v.empty() ? 0 : *std::max_element(v.begin(), v.end()); }

BENCHMARK(BM_SummaryWriterActor)->Arg(1000)->UseRealTime()->ComputeStatistics("min", Min)->ComputeStatistics("max", Max);
BENCHMARK(BM_EventFileWriterDirect)->Arg(1000)->UseRealTime()->ComputeStatistics("min", Min)->ComputeStatistics("max", Max);
BENCHMARK(BM_HistogramSummary)->Arg(784 * 256)->ComputeStatistics("min", Min)->ComputeStatistics("max", Max);
BENCHMARK(BM_HistogramBucketsBySearch)->Arg(784 * 256)->ComputeStatistics("min", Min)->ComputeStatistics("max", Max);

}  // namespace

BENCHMARK_MAIN();
