// Summaries (issue 6, part 4): scalar events/s and bytes/s through the
// summary_writer actor (what SummarySaverHook and StepCounterHook use),
// reached through the public foreman::FileWriter (foreman/file_writer.hpp), and
// through an EventFileWriter called directly on the caller's thread (the
// baseline: the same file format and flush policy without the actor).
// One iteration = `batch` scalar summaries sent, then a Flush() that waits
// until they are written: the figure counts the whole path to the file.
//
//   summary_bench [--benchmark_repetitions=5 ...]
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <system_error>
#include <vector>

#include "bench_util.hpp"
#include "foreman/event_writer.hpp"
#include "foreman/file_writer.hpp"
#include "foreman/summary.hpp"

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

double Min(const std::vector<double>& v) { return v.empty() ? 0 : *std::min_element(v.begin(), v.end()); }
double Max(const std::vector<double>& v) { return v.empty() ? 0 : *std::max_element(v.begin(), v.end()); }

BENCHMARK(BM_SummaryWriterActor)->Arg(1000)->UseRealTime()->ComputeStatistics("min", Min)->ComputeStatistics("max", Max);
BENCHMARK(BM_EventFileWriterDirect)->Arg(1000)->UseRealTime()->ComputeStatistics("min", Min)->ComputeStatistics("max", Max);

}  // namespace

BENCHMARK_MAIN();
