// The chief's per-worker steps/s summaries in a cluster (issue 13, point 6;
// docs/cluster.md "Observability"). Internal, CAF-free.
//
// TF1 has no such summary: each TF1 worker's StepCounterHook writes
// "global_step/sec" (the cluster's rate, as its chief sees global_step
// move). Foreman's chief also writes, at its summary cadence, one scalar per
// worker task K, tag "steps_per_sec/worker_K": the applies ps 0 accepted
// from worker K per second since the previous summary (every step of every
// worker reaches ps 0, which counts them per gradients.worker: asynchronous
// mode, the applies applied; synchronous mode, the gradients accumulated,
// stale ones not counted). In asynchronous mode they sum to about
// global_step/sec; in synchronous mode to replicas_to_aggregate times it.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "foreman/status.hpp"

namespace foreman::internal {

class WorkerStepRates {
 public:
  /// Reads the per-worker counts (index: worker task_index; a count that
  /// never decreases, except when its source restarts); e.g.
  /// WorkerAppliesOnPs0 (actors/cluster_server.hpp).
  using ReadCounts = std::function<StatusOr<std::vector<int64_t>>()>;
  /// Seconds on a monotonic clock (default: std::chrono::steady_clock).
  using NowSecs = std::function<double()>;

  /// `num_workers` (>= 1; smaller is taken as 1): the spec's worker tasks;
  /// a rate is given for each (0 for a worker ps 0 never heard from).
  WorkerStepRates(ReadCounts read, int num_workers, NowSecs now = {});

  /// The summary tag of worker `task_index`: "steps_per_sec/worker_<K>".
  static std::string Tag(int task_index);

  /// Reads the counts and returns, per worker task K in [0, num_workers),
  /// (count - previous count) / seconds since the previous read (steps/s).
  /// The first read (and the first after a failed one, or one at the same
  /// clock time) only primes: an empty vector. A count below its previous
  /// value (ps 0 restarted) counts from 0. Errors: the reader's (the
  /// previous sample is kept). Not thread-safe (the chief's training thread).
  StatusOr<std::vector<double>> Sample();

  /// Sample() as serialized ScalarSummary protos (foreman/summary.hpp), one
  /// per worker, tag Tag(K); none when priming or when the read failed (a
  /// WARNING for the first 5 failures, then DEBUG). Not thread-safe.
  std::vector<std::string> Summaries();

 private:
  ReadCounts read_;
  int num_workers_;
  NowSecs now_;
  std::optional<double> last_secs_;
  std::vector<int64_t> last_counts_;
  int warnings_ = 0;
};

}  // namespace foreman::internal
