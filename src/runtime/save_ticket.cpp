#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "foreman/compute.hpp"
#include "foreman/session.hpp"
#include "foreman/variable_store.hpp"
#include "runtime/services.hpp"
#include "runtime/session_access.hpp"
#include "runtime/variable_store_access.hpp"

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

namespace {

// Whether `held` (a snapshot buffer) can take `value`'s elements in place.
bool SameBuffer(const Tensor& held, DataType dtype, const TensorShape& shape) {
  return held.dtype() == dtype && held.shape() == shape && held.TotalBytes() > 0 && dtype != DataType::kString;
}

// SnapshotInto for a session whose variables may live on a device without
// host memory (a GPU): the values the device holds newer than the host are
// copied from the device straight into the snapshot's buffers, all in one
// CopyToHostBatch, and the store's host copies are left as they are (they
// stay stale; the device's copy is the value). The other variables are
// copied from the host as on the CPU. New buffers come from the device's
// AllocateHostTensor (page-locked on CUDA), so that the buffers the saves
// reuse are the device's from the first save on.
Status SnapshotFromDevice(const VariableStore& vars, const std::vector<std::string>& locals,
                          compute::Device& host_allocator, std::map<std::string, Tensor>* snapshot,
                          int64_t* reused) {
  compute::Device* resident = vars.resident_device();
  std::vector<compute::HostCopy> copies;
  std::vector<const std::string*> copied_names;
  auto out = snapshot->begin();
  auto local = locals.begin();
  const std::vector<std::string> names = vars.Names();  // sorted, as the map's keys
  for (const std::string& name : names) {
    while (local != locals.end() && *local < name) ++local;
    if (local != locals.end() && *local == name) continue;
    while (out != snapshot->end() && out->first < name) out = snapshot->erase(out);
    const Tensor* host = VariableStoreAccess::HostTensor(vars, name);
    const void* device_value = resident != nullptr ? VariableStoreAccess::DeviceNewerData(vars, name) : nullptr;
    const bool numeric = host->dtype() != DataType::kString;
    auto host_tensor = [&]() -> StatusOr<Tensor> {
      StatusOr<Tensor> t = host_allocator.AllocateHostTensor(host->dtype(), host->shape());
      if (!t.ok()) {
        return Annotate(t.status(), absl::StrCat("a host buffer for variable '", name, "' from ",
                                                 host_allocator.name(), " for the checkpoint"));
      }
      return t;
    };
    Tensor* held = nullptr;
    if (out != snapshot->end() && out->first == name) {
      held = &out->second;
      if (SameBuffer(*held, host->dtype(), host->shape())) {
        ++*reused;
      } else if (numeric) {
        FOREMAN_ASSIGN_OR_RETURN(*held, host_tensor());
      }
      ++out;
    } else {
      Tensor fresh;
      if (numeric) {
        FOREMAN_ASSIGN_OR_RETURN(fresh, host_tensor());
      }
      held = &snapshot->emplace_hint(out, name, std::move(fresh))->second;  // `out` stays the next one
    }
    if (device_value != nullptr) {
      if (held->TotalBytes() > 0) {
        copies.push_back(compute::HostCopy{held->raw_data(), device_value, static_cast<int64_t>(held->TotalBytes())});
        copied_names.push_back(&name);
      }
    } else {
      *held = *host;  // in place (same dtype and shape); strings as Tensor's copy
    }
  }
  snapshot->erase(out, snapshot->end());
  if (copies.empty()) return absl::OkStatus();
  if (Status s = resident->CopyToHostBatch(copies.data(), static_cast<int64_t>(copies.size())); !s.ok()) {
    std::string which;
    for (const std::string* name : copied_names) absl::StrAppend(&which, which.empty() ? "'" : ", '", *name, "'");
    return Annotate(s, absl::StrCat("copying variable", copied_names.size() == 1 ? " " : "s ", which, " from ",
                                    resident->name(), " for the checkpoint"));
  }
  return absl::OkStatus();
}

}  // namespace

StatusOr<int64_t> SnapshotInto(Session& session, std::map<std::string, Tensor>* snapshot) {
  const std::vector<std::string> locals = session.graph()->LocalVariableNames();  // sorted
  int64_t reused = 0;
  compute::Device& device = SessionAccess::compute_device(session);
  // On a cluster session the copy is of one consistent state of all ps
  // tasks (RemoteValues::ReadConsistent): the chief's checkpoint holds the
  // variables at one global_step, with its own "/job:worker" variables.
  FOREMAN_RETURN_IF_ERROR(SessionAccess::WithConsistentVariables(session, [&](VariableStore& vars) -> Status {
    if (!device.host_memory() || vars.resident_device() != nullptr) {
      return SnapshotFromDevice(vars, locals, device.host_memory() ? *vars.resident_device() : device, snapshot,
                                &reused);
    }
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
