#include "cluster/worker_step_rates.hpp"

#include <algorithm>
#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"
#include "foreman/summary.hpp"
#include "platform/log.hpp"

namespace foreman::internal {

namespace {
constexpr int kFailureWarnings = 5;

double SteadySecs() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
}  // namespace

WorkerStepRates::WorkerStepRates(ReadCounts read, int num_workers, NowSecs now)
    : read_(std::move(read)), num_workers_(std::max(num_workers, 1)), now_(now ? std::move(now) : SteadySecs) {}

std::string WorkerStepRates::Tag(int task_index) { return absl::StrCat("steps_per_sec/worker_", task_index); }

StatusOr<std::vector<double>> WorkerStepRates::Sample() {
  StatusOr<std::vector<int64_t>> counts = read_();
  const double now = now_();
  if (!counts.ok()) {
    last_secs_.reset();
    return counts.status();
  }
  std::vector<int64_t> c = *std::move(counts);
  c.resize(static_cast<std::size_t>(num_workers_), 0);
  std::vector<double> rates;
  if (last_secs_.has_value() && now > *last_secs_) {
    const double secs = now - *last_secs_;
    for (std::size_t k = 0; k < c.size(); ++k) {
      const int64_t before = k < last_counts_.size() ? last_counts_[k] : 0;
      const int64_t steps = c[k] >= before ? c[k] - before : c[k];  // a restarted ps 0 counts from 0
      rates.push_back(static_cast<double>(steps) / secs);
    }
  }
  last_secs_ = now;
  last_counts_ = std::move(c);
  return rates;
}

std::vector<std::string> WorkerStepRates::Summaries() {
  StatusOr<std::vector<double>> rates = Sample();
  std::vector<std::string> out;
  if (!rates.ok()) {
    if (warnings_ < kFailureWarnings) {
      ++warnings_;
      FOREMAN_LOG_WARN("The per-worker steps/s summaries (steps_per_sec/worker_K) skip this summary: {}",
                       rates.status().ToString());
    } else {
      FOREMAN_LOG_DEBUG("The per-worker steps/s summaries skip this summary: {}", rates.status().ToString());
    }
    return out;
  }
  for (std::size_t k = 0; k < rates->size(); ++k) {
    out.push_back(ScalarSummary(Tag(static_cast<int>(k)), static_cast<float>((*rates)[k])));
  }
  return out;
}

}  // namespace foreman::internal
