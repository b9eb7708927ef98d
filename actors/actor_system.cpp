// The process's actor system (actor_system.hpp). The one place in Foreman
// that constructs a caf::actor_system.
#include "actor_system.hpp"

#include <pthread.h>

#include <atomic>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <caf/all.hpp>

#include "absl/strings/str_cat.h"
#include "atoms.hpp"
#include "platform/log.hpp"

namespace foreman::internal {
namespace {

std::atomic<int64_t> systems_created{0};

// Names every thread a system starts "fm-caf<serial>" (at most 15 bytes, as
// Linux allows).
class ThreadNamer : public caf::thread_hook {
 public:
  explicit ThreadNamer(int64_t serial) : name_(absl::StrCat("fm-caf", serial).substr(0, 15)) {}
  void init(caf::actor_system&) override {}
  void thread_started() override { pthread_setname_np(pthread_self(), name_.c_str()); }
  void thread_terminates() override {}

 private:
  const std::string name_;
};

// "CODE: message" (StatusToError puts the message into the context).
std::string RenderForemanError(uint8_t code, caf::atom_value /*category*/, const caf::message& context) {
  std::string text;
  if (context.match_elements<std::string>()) text = context.get_as<std::string>(0);
  const std::string name = absl::StatusCodeToString(static_cast<absl::StatusCode>(code));
  return text.empty() ? name : absl::StrCat(name, ": ", text);
}

// The process's system: the config and the system it configures, destroyed
// together (system first).
struct OwnedSystem {
  std::unique_ptr<caf::actor_system_config> config;
  std::unique_ptr<caf::actor_system> system;
};

std::mutex& ProcessMutex() {
  static auto* mu = new std::mutex;
  return *mu;
}
// The live system, if any. Guarded by ProcessMutex().
std::weak_ptr<caf::actor_system>& ProcessSystem() {
  static auto* weak = new std::weak_ptr<caf::actor_system>;
  return *weak;
}

}  // namespace

Status RunOnShortLivedThread(const std::function<Status()>& fn) {
  Status status;
  try {
    std::thread([&] {
      status = InvokeUserCode("starting actors", fn);
      caf::logger::set_current_actor_system(nullptr);
    }).join();
  } catch (const std::system_error& e) {
    return absl::ResourceExhaustedError(absl::StrCat("cannot start a thread to start actors: ", e.what()));
  }
  return status;
}

void ConfigureActorSystemConfig(caf::actor_system_config& config) {
  config.add_error_category(kForemanErrorCategory, RenderForemanError);
}

StatusOr<ActorSystemRef> AcquireProcessActorSystem(int scheduler_threads) {
  if (scheduler_threads < 0) {
    return absl::InvalidArgumentError(absl::StrCat("actor system threads must be >= 0, got ", scheduler_threads));
  }
  std::lock_guard<std::mutex> lock(ProcessMutex());
  if (ActorSystemRef live = ProcessSystem().lock()) return live;
  auto owned = std::make_shared<OwnedSystem>();
  FOREMAN_RETURN_IF_ERROR(RunOnShortLivedThread([&]() -> Status {
    const int64_t serial = systems_created.fetch_add(1) + 1;
    owned->config = std::make_unique<caf::actor_system_config>();
    ConfigureActorSystemConfig(*owned->config);
    owned->config->add_thread_hook<ThreadNamer>(serial);
    owned->config->set("scheduler.max-threads", static_cast<size_t>(scheduler_threads > 0 ? scheduler_threads : 2));
    owned->system = std::make_unique<caf::actor_system>(*owned->config);
    return absl::OkStatus();
  }));
  // The reference's deleter destroys the system (waiting for its actors,
  // which their owners have stopped) and then its config.
  caf::actor_system* raw = owned->system.get();
  ActorSystemRef ref(raw, [owned](caf::actor_system*) mutable {
    owned->system.reset();
    owned->config.reset();
  });
  ProcessSystem() = ref;
  FOREMAN_LOG_DEBUG("Started the process's actor system fm-caf{}", systems_created.load());
  return ref;
}

void LeakActorSystem(ActorSystemRef ref) {
  if (ref == nullptr) return;
  static auto* leaked = new std::vector<ActorSystemRef>;
  std::lock_guard<std::mutex> lock(ProcessMutex());
  leaked->push_back(std::move(ref));
}

int64_t ActorSystemsCreated() { return systems_created.load(); }

}  // namespace foreman::internal
