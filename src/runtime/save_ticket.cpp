#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "foreman/session.hpp"
#include "foreman/variable_store.hpp"
#include "runtime/services.hpp"
#include "runtime/session_access.hpp"

namespace foreman::internal {

void SaveTicket::Complete(Status s, std::string saved_prefix, absl::Duration took,
                          std::map<std::string, Tensor> returned_buffers, bool lost_to_restart) {
  {
    MutexLock l(mu);
    // The first completion wins: the actor's, or the runtime's error when the
    // actor died first. (A dropped `returned_buffers` is freed on return,
    // outside the lock.)
    if (done) return;
    done = true;
    status = std::move(s);
    prefix = std::move(saved_prefix);
    write_time = took;
    buffers = std::move(returned_buffers);
    lost = lost_to_restart && !status.ok();
  }
  cv.notify_all();
}

std::map<std::string, Tensor> SaveTicket::TakeBuffers() {
  MutexLock l(mu);
  std::map<std::string, Tensor> out = std::move(buffers);
  buffers.clear();
  return out;
}

bool SaveTicket::IsLost() {
  MutexLock l(mu);
  return done && lost;
}

bool SaveTicket::IsDone() {
  MutexLock l(mu);
  return done;
}

Status SaveTicket::Wait(absl::Duration timeout) {
  MutexLock lock(mu);
  if (!cv.wait_for(lock, absl::ToChronoNanoseconds(timeout),
                   [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { return done; })) {
    return absl::DeadlineExceededError(absl::StrCat("the checkpoint save of step ", step,
                                                    " did not complete within ", absl::FormatDuration(timeout)));
  }
  return status;
}

StatusOr<int64_t> SnapshotInto(Session& session, std::map<std::string, Tensor>* snapshot) {
  const std::vector<std::string> locals = session.graph()->LocalVariableNames();  // sorted
  int64_t reused = 0;
  // On a cluster session the copy is of one consistent state of all ps
  // tasks (RemoteValues::ReadConsistent): the chief's checkpoint holds the
  // variables at one global_step, with its own "/job:worker" variables.
  FOREMAN_RETURN_IF_ERROR(SessionAccess::WithConsistentVariables(session, [&](VariableStore& vars) -> Status {
    const std::vector<std::string> names = vars.Names();  // sorted, as the map's keys
    // One merge of the sorted names: drop what is no longer a global
    // variable, copy the rest into the node that already holds it.
    auto out = snapshot->begin();
    auto local = locals.begin();
    for (const std::string& name : names) {
      while (local != locals.end() && *local < name) ++local;
      if (local != locals.end() && *local == name) continue;
      while (out != snapshot->end() && out->first < name) out = snapshot->erase(out);
      FOREMAN_ASSIGN_OR_RETURN(const Tensor* value, static_cast<const VariableStore&>(vars).Get(name));
      if (out != snapshot->end() && out->first == name) {
        Tensor& held = out->second;
        // Tensor::operator= copies in place when dtype and shape match.
        if (held.dtype() == value->dtype() && held.shape() == value->shape() && held.TotalBytes() > 0 &&
            held.dtype() != DataType::kString) {
          ++reused;
        }
        held = *value;
        ++out;
      } else {
        out = std::next(snapshot->emplace_hint(out, name, *value));
      }
    }
    snapshot->erase(out, snapshot->end());
    return absl::OkStatus();
  }));
  return reused;
}

}  // namespace foreman::internal
