// The atoms of the supervision tree's messages, Completion as a message
// type (an actor's answer to a plain thread), and the injected message
// faults the services obey. Internal to actors/ (the only translation units
// that include CAF, design.md §1). Beside it: status_error.hpp (the Status
// <-> caf::error bridge, MakeQuiet) and child_link.hpp (ChildLink, a plain
// thread's handle on an actor).
//
// Messages between actors and from the runtime are fire-and-forget `send`s;
// a plain thread that needs an answer (a flush, a spawned child, a close)
// passes a Completion in the message and waits on it with a real-time
// timeout (the actor's progress is real work, not Clock time). No actor ever
// blocks on another one, and nothing uses scoped_actor: a plain thread never
// receives CAF messages.
#pragma once

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <caf/all.hpp>

#include "foreman/mutex.hpp"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "foreman/status.hpp"
#include "messages.hpp"
#include "fault/injected_fault.hpp"
#include "runtime/services.hpp"

namespace foreman::internal {

// -- atoms (at most 10 characters in CAF 0.17) --------------------------------

using flush_atom = caf::flush_atom;      // summary_writer: flush
using close_atom = caf::close_atom;      // summary_writer: flush and close
using spawn_atom = caf::spawn_atom;      // session_supervisor: spawn a child
using drain_atom = caf::atom_constant<caf::atom("drain")>;          // summary_writer: take the queued events
using report_atom = caf::atom_constant<caf::atom("report")>;        // failure_sink
using save_atom = caf::atom_constant<caf::atom("save")>;            // checkpoint_saver
using record_atom = caf::atom_constant<caf::atom("record")>;        // step_counter
using seek_atom = caf::atom_constant<caf::atom("seek")>;            // input_pipeline: restart at a position
using credit_atom = caf::atom_constant<caf::atom("credit")>;        // input_pipeline: room for more batches
using produce_atom = caf::atom_constant<caf::atom("produce")>;      // input_pipeline: decode one batch (to self)
using restart_atom = caf::atom_constant<caf::atom("restart")>;      // session_supervisor: a back-off is over (to self)
using kill_atom = caf::atom_constant<caf::atom("kill")>;            // services: an injected actor fault, quit
using ps_init_atom = caf::atom_constant<caf::atom("psinit")>;       // ps_shard: replace the variables (init/restore)
using ps_read_atom = caf::atom_constant<caf::atom("psread")>;       // ps_shard: read variables by name
using ps_apply_atom = caf::atom_constant<caf::atom("psapply")>;     // ps_shard: apply a worker's gradients
using ps_apply_read_atom = caf::atom_constant<caf::atom("psapplyrd")>;  // ps_shard: apply, answer the step's values
using ps_snap_atom = caf::atom_constant<caf::atom("pssnapshot")>;   // ps_shard: read every variable
using ps_freeze_atom = caf::atom_constant<caf::atom("psfreeze")>;   // ps_shard: hold applies (bounded)
using ps_thaw_atom = caf::atom_constant<caf::atom("psthaw")>;       // ps_shard: apply the held applies
using ps_thawed_atom = caf::atom_constant<caf::atom("psthawto")>;   // ps_shard: a freeze timed out (to self)
using ps_stats_atom = caf::atom_constant<caf::atom("psstats")>;     // ps_shard: its counters
using ps_end_atom = caf::atom_constant<caf::atom("psend")>;         // ps_shard: training ended (chief)
using ps_watch_atom = caf::atom_constant<caf::atom("pswatch")>;     // ps_shard: look for a silent chief (to self)
using ps_evict_atom = caf::atom_constant<caf::atom("psevict")>;     // ps_shard: its task is evicted (local Server)

// Completion (runtime/completion.hpp): a one-shot answer from an actor to a
// plain thread.

// -- MessageFaults -------------------------------------------------------------

/// Injected delays and drops of one service's incoming work messages
/// (ActorFault kDelay / kDrop, fault.hpp): the runtime adds them, the actor
/// asks Next() as each work message arrives (summary_writer: a drain of the
/// queue; checkpoint_saver: a save; step_counter: a record). Shared between
/// the service's handle and every incarnation of its actor. Thread-safe.
class MessageFaults {
 public:
  struct Action {
    std::string fault_id;
    bool drop = false;
    absl::Duration delay;  // when !drop: waited on the session's Clock
  };
  /// The next `count` (>= 1) work messages are dropped or delayed.
  void Add(std::string fault_id, bool drop, int64_t count, absl::Duration delay) {
    MutexLock l(mu_);
    pending_.push_back(Pending{Action{std::move(fault_id), drop, delay}, count});
  }
  /// What to do with the work message that just arrived (nullopt: handle it).
  std::optional<Action> Next() {
    MutexLock l(mu_);
    if (pending_.empty()) return std::nullopt;
    Action a = pending_.front().action;
    if (--pending_.front().left <= 0) pending_.erase(pending_.begin());
    return a;
  }

 private:
  struct Pending {
    Action action;
    int64_t left = 0;
  };
  Mutex mu_;
  std::vector<Pending> pending_ ABSL_GUARDED_BY(mu_);
};

}  // namespace foreman::internal

CAF_ALLOW_UNSAFE_MESSAGE_TYPE(std::shared_ptr<foreman::internal::Completion>)
