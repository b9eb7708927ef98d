// Allocations of a steady training step (issue 16, point 4): through a
// MonitoredTrainingSession with TF's default hooks (StepCounterHook,
// SummarySaverHook, CheckpointSaverHook), a step where no hook is due
// allocates nothing on the training thread; only the map run() returns
// holds a node per fetch. Due steps (summaries and step counts every 100
// steps by default) may allocate.
//
// This binary interposes malloc and friends (Tensor buffers come from
// malloc) and replaces operator new, counting the calls made on the thread
// that set t_counting. Under ASan/TSan the sanitizer owns the allocator, so
// the test is skipped there.
#include <doctest/doctest.h>

#include <cstdint>
#include <cstdlib>
#include <map>
#include <memory>
#include <new>
#include <string>
#include <utility>
#include <vector>

#include "foreman/graph.hpp"
#include "foreman/monitored_session.hpp"
#include "foreman/session.hpp"
#include "foreman/variable_store.hpp"
#include "support/test_util.hpp"

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define FOREMAN_COUNT_ALLOCATIONS 0
#else
#define FOREMAN_COUNT_ALLOCATIONS 1
#endif

namespace {
thread_local bool t_counting = false;
thread_local int64_t t_allocations = 0;
inline void Count() {
  if (t_counting) ++t_allocations;
}
}  // namespace

#if FOREMAN_COUNT_ALLOCATIONS
extern "C" {
void* __libc_malloc(std::size_t);
void* __libc_calloc(std::size_t, std::size_t);
void* __libc_realloc(void*, std::size_t);
void* __libc_memalign(std::size_t, std::size_t);

void* malloc(std::size_t n) {
  Count();
  return __libc_malloc(n);
}
void* calloc(std::size_t n, std::size_t size) {
  Count();
  return __libc_calloc(n, size);
}
void* realloc(void* p, std::size_t n) {
  Count();
  return __libc_realloc(p, n);
}
void* aligned_alloc(std::size_t alignment, std::size_t n) {
  Count();
  return __libc_memalign(alignment, n);
}
void* memalign(std::size_t alignment, std::size_t n) {
  Count();
  return __libc_memalign(alignment, n);
}
int posix_memalign(void** out, std::size_t alignment, std::size_t n) {
  Count();
  void* p = __libc_memalign(alignment, n);
  if (p == nullptr) return 12;  // ENOMEM
  *out = p;
  return 0;
}
}  // extern "C"

// operator new through the counted malloc above (which counts it once).
void* operator new(std::size_t n) {
  if (void* p = std::malloc(n == 0 ? 1 : n)) return p;
  throw std::bad_alloc();
}
void* operator new[](std::size_t n) { return ::operator new(n); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
#endif

namespace foreman {
namespace {

using testing::TempDir;

// Steps run before counting: the first session's saves, the first summary
// and step count, and the hooks' first not-due steps are behind them. The
// save of step 0 may still be writing; when it completes inside the counted
// steps, CheckpointSaverHook takes it up in after_run without allocating.
constexpr int kWarmUpSteps = 250;
constexpr int kCountedSteps = 1000;

struct StepCount {
  int64_t global_step_before = 0;
  int64_t allocations = 0;
};

// kCountedSteps runs of `fetches` through a MonitoredTrainingSession with the
// default hooks, each step's allocations on this thread.
std::vector<StepCount> CountSteps(const std::vector<std::string>& fetches) {
  TempDir dir("foreman_step_allocations");
  auto graph = std::make_shared<Graph>();
  REQUIRE(graph->CreateGlobalStep().ok());
  REQUIRE(graph
              ->SetStep([](StepContext& ctx) -> Status {
                return IncrementGlobalStep(ctx.variables()).status();
              })
              .ok());
  MonitoredTrainingSessionOptions options;
  options.graph = graph;
  options.checkpoint_dir = dir.path();  // the default hooks
  options.config.intra_op_parallelism_threads = 1;
  auto session = MonitoredTrainingSession(std::move(options));
  REQUIRE_MESSAGE(session.ok(), session.status().ToString());
  for (int i = 0; i < kWarmUpSteps; ++i) {
    StatusOr<TensorMap> out = (*session)->run(fetches);
    REQUIRE_MESSAGE(out.ok(), out.status().ToString());
  }
  std::vector<StepCount> counts;
  counts.reserve(kCountedSteps);
  for (int i = 0; i < kCountedSteps; ++i) {
    t_allocations = 0;
    t_counting = true;
    StatusOr<TensorMap> out = (*session)->run(fetches);
    t_counting = false;
    REQUIRE_MESSAGE(out.ok(), out.status().ToString());
    REQUIRE(out->size() == fetches.size());
    counts.push_back({kWarmUpSteps + i, t_allocations});
  }
  REQUIRE((*session)->close().ok());
  return counts;
}

// Steps well away from the default schedules (every 100 steps): no hook is
// due before or after them.
bool NotDue(int64_t global_step_before) {
  const int64_t r = global_step_before % 100;
  return r >= 5 && r <= 95;
}

// Every not-due step made exactly `expected_per_step` allocations; the
// message names the first few steps that did not.
void CheckCounts(const std::vector<StepCount>& counts, int64_t expected_per_step) {
  int checked = 0;
  std::string wrong;
  int wrong_steps = 0;
  for (const StepCount& c : counts) {
    if (!NotDue(c.global_step_before)) continue;
    ++checked;
    if (c.allocations == expected_per_step) continue;
    if (++wrong_steps <= 5) {
      wrong += " step " + std::to_string(c.global_step_before) + ": " + std::to_string(c.allocations) + ";";
    }
  }
  CHECK(checked >= 900);
  CHECK_MESSAGE(wrong_steps == 0, wrong_steps, " not-due steps did not make ", expected_per_step,
                " allocations:", wrong);
}

TEST_CASE("a steady step through MonitoredTrainingSession with the default hooks allocates nothing" *
          doctest::skip(!FOREMAN_COUNT_ALLOCATIONS)) {
  // The counter itself works: a std::string beyond SSO allocates once.
  t_allocations = 0;
  t_counting = true;
  std::string probe(100, 'x');
  t_counting = false;
  REQUIRE(t_allocations == 1);

  // No caller fetches: nothing at all.
  CheckCounts(CountSteps({}), 0);
}

TEST_CASE("with a caller fetch, a steady step allocates only the returned map's node" *
          doctest::skip(!FOREMAN_COUNT_ALLOCATIONS)) {
  // train_op (the Session's empty answer) comes back in a fresh TensorMap:
  // one node, nothing else.
  CheckCounts(CountSteps({kTrainOpName}), 1);
}

}  // namespace
}  // namespace foreman
