// Coordinator: a stop flag, the first error, and joining threads with a grace
// period. (TF: tf.compat.v1.train.Coordinator (Python) and
// tensorflow::Coordinator (C++).)
//
// One behaviour per method, Python's. Where TF's C++ Coordinator differs it
// is said at the method. Errors are Status values, never exceptions:
//
//   ```cpp
//   foreman::Coordinator coord;                  // clean stop: {OUT_OF_RANGE}
//   int reads = 0;
//   // A looper thread calls its target every interval; an error it returns is
//   // request_stop(error). Any thread may call coord.request_stop(status).
//   FOREMAN_RETURN_IF_ERROR(foreman::LooperThread::Start(&coord, "reader", absl::Milliseconds(1), [&] {
//     return ++reads < 3 ? foreman::Status() : absl::OutOfRangeError("end of input");
//   }).status());
//   foreman::Status s = coord.join(/*stop_grace_period=*/absl::Seconds(120));  // OK: a clean stop
//   ```
//
// should_stop() is one atomic load (the training loop reads it every
// step). All methods are thread-safe. Waiting uses the Clock.
#pragma once

#include <atomic>
#include <cstdint>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/time/time.h"
#include "foreman/clock.hpp"
#include "foreman/mutex.hpp"
#include "foreman/status.hpp"

namespace foreman {

/// A thread (or anything that runs on its own) the coordinator joins.
/// (TF C++: RunnerInterface.)
class RunnerInterface {
 public:
  virtual ~RunnerInterface() = default;
  /// Blocks until the runner has finished; returns its final status.
  virtual Status Join() = 0;
  virtual bool IsRunning() const = 0;
  /// Shown in the straggler message (see Coordinator::join).
  virtual std::string name() const = 0;
};

class Coordinator {
 public:
  /// std::nullopt means {OUT_OF_RANGE}; an explicit empty list means no
  /// clean-stop codes (what a MonitoredSession uses), as Python's
  /// clean_stop_exception_types. (TF C++ treats an empty vector as
  /// {OUT_OF_RANGE}; Foreman follows Python.)
  explicit Coordinator(std::optional<std::vector<absl::StatusCode>> clean_stop_codes = std::nullopt,
                       Clock* clock = Clock::Real());
  /// Requests stop and joins the registered runners, ignoring errors (as TF C++).
  ~Coordinator();
  Coordinator(const Coordinator&) = delete;
  Coordinator& operator=(const Coordinator&) = delete;

  /// Sets the stop flag. The first non-OK `status` is recorded when
  /// stop was not yet requested and none is recorded; a status whose code is
  /// a clean-stop code is recorded as OK (a clean stop); later ones are
  /// dropped. After join() completed, a non-OK `status` is returned to
  /// the caller instead of being recorded (Python raises it); otherwise returns OK.
  /// (TF C++ RequestStop() returns FAILED_PRECONDITION on a second call;
  /// Foreman's is idempotent, as Python's.)
  Status request_stop(const Status& status = absl::OkStatus());

  /// True once stop is requested. Lock-free.
  bool should_stop() const { return state_->stop.load(std::memory_order_acquire); }

  /// Clears the flag, the recorded status and `joined`.
  void clear_stop();

  /// The recorded status (OK when none). Does not clear it. (TF:
  /// raise_requested_exception; TF C++ GetStatus.)
  Status status() const;

  /// Waits until stop is requested or `timeout` passes (std::nullopt:
  /// no timeout); returns should_stop().
  bool wait_for_stop(std::optional<absl::Duration> timeout = std::nullopt);

  /// Runs `fn`; an error it returns or an exception it throws is passed
  /// to request_stop() and *not* returned (the caller's thread goes on).
  /// Returns whether `fn` succeeded.
  bool stop_on_exception(const std::function<Status()>& fn);

  /// Adds a runner to join. FAILED_PRECONDITION "The coordinator
  /// has been stopped." when stop was requested (TF C++ behaviour; Python
  /// accepts it); INVALID_ARGUMENT for a null runner. The runner must already
  /// be running (the coordinator starts nothing). A runner registered while
  /// join() runs is left for the next join() (or the destructor).
  Status register_runner(std::unique_ptr<RunnerInterface> runner);

  /// Waits until every registered runner has finished *or* stop was
  /// requested (polling every second of the clock, as TF; a LooperThread that
  /// ends wakes it at once); then, once stop is requested, up to
  /// `stop_grace_period` for the runners to finish (polls starting at
  /// 1 ms, doubling, of the clock). Then `joined` becomes true and the
  /// runners are dropped, and:
  ///   the recorded status, when non-OK (it takes precedence);
  ///   else each finished runner's non-OK Join() status that is not a
  ///     clean-stop code is fed to request_stop first, so the first wins
  ///     (and one that fails after stop was requested is dropped);
  ///   else, runners still running: DEADLINE_EXCEEDED "Coordinator stopped
  ///     with threads still running: <names>" (names separated by spaces)
  ///     — or, with ignore_live_threads, OK after logging that line as a
  ///     warning;
  ///   else OK.
  /// A straggler is destroyed without being joined: a LooperThread detaches
  /// its thread, which keeps running on state it shares with the
  /// coordinator and ends when its target returns (it never touches the
  /// clock or the coordinator object again). A runner of another kind must
  /// likewise not block in its destructor.
  /// (TF C++ Join() refuses to run before RequestStop; Foreman waits as
  /// Python does.)
  Status join(absl::Duration stop_grace_period = absl::Seconds(120), bool ignore_live_threads = false);
  bool joined() const;

  Clock* clock() const { return state_->clock; }

 private:
  friend class LooperThread;

  /// Everything a runner thread may touch. Shared with the LooperThreads'
  /// threads, so that a detached straggler outlives neither it nor the
  /// coordinator's memory.
  struct State {
    State(std::optional<std::vector<absl::StatusCode>> codes, Clock* c)
        : clean_stop_codes(std::move(codes)), clock(c) {}
    bool IsCleanStop(const Status& s) const;
    /// request_stop() on the state.
    Status RequestStop(const Status& status);

    const std::optional<std::vector<absl::StatusCode>> clean_stop_codes;
    Clock* const clock;
    /// Set and cleared under `mu` (so that waiters on `cv` see it), read
    /// lock-free by should_stop().
    std::atomic<bool> stop{false};
    mutable Mutex mu;
    /// Notified on a stop request and when a LooperThread ends.
    std::condition_variable_any cv;
    Status status ABSL_GUARDED_BY(mu);
    bool joined ABSL_GUARDED_BY(mu) = false;
    /// Bumped when a LooperThread ends, so that join() wakes.
    uint64_t runner_ends ABSL_GUARDED_BY(mu) = 0;
    std::vector<std::unique_ptr<RunnerInterface>> runners ABSL_GUARDED_BY(mu);
  };

  std::shared_ptr<State> state_;
};

/// A thread that runs `target` back to back (interval std::nullopt) or every
/// `interval` of the clock starting at once, until the coordinator stops;
/// an error from `target` (or an exception) is reported to the coordinator
/// and ends the loop. Registered with the coordinator, which joins it. (TF:
/// LooperThread.)
class LooperThread : public RunnerInterface {
 public:
  /// Starts the thread and registers it with `coord`; errors as
  /// register_runner (then no thread is started). Returns a pointer owned by
  /// the coordinator (valid until its join() returns).
  static StatusOr<LooperThread*> Start(Coordinator* coord, std::string name,
                                       std::optional<absl::Duration> interval,
                                       std::function<Status()> target);
  ~LooperThread() override;
  Status Join() override;
  bool IsRunning() const override;
  std::string name() const override { return shared_->name; }

 private:
  /// What the thread uses besides the coordinator's State; shared with the
  /// thread so that a detached straggler never touches this object.
  struct Shared {
    std::string name;
    std::optional<absl::Duration> interval;
    std::function<Status()> target;
    std::atomic<bool> running{true};
    Mutex mu;
    Status final_status ABSL_GUARDED_BY(mu);  // set before `running` turns false
  };

  explicit LooperThread(std::shared_ptr<Shared> shared) : shared_(std::move(shared)) {}
  static void Loop(std::shared_ptr<Coordinator::State> coord, std::shared_ptr<Shared> shared,
                   absl::Duration first_time);

  std::shared_ptr<Shared> shared_;
  Mutex join_mu_;  // serialises Join() and the destructor's join
  std::thread thread_;
};

}  // namespace foreman
