// The process's actor system (actor_system.hpp). The one place in Foreman
// that constructs a caf::actor_system.
#include "actor_system.hpp"

#include <pthread.h>

#include <atomic>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <caf/all.hpp>

#include "foreman/actor_api.hpp"
#include "foreman/mutex.hpp"
#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "atoms.hpp"
#include "status_error.hpp"
#include "messages.hpp"
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

// "CODE: message" (StatusToError puts the message, then any payloads, into
// the context).
std::string RenderForemanError(uint8_t code, caf::atom_value /*category*/, const caf::message& context) {
  std::string text;
  if (context.size() >= 1 && context.match_element<std::string>(0)) text = context.get_as<std::string>(0);
  const std::string name = absl::StatusCodeToString(static_cast<absl::StatusCode>(code));
  return text.empty() ? name : absl::StrCat(name, ": ", text);
}

Mutex& ProcessMutex() {
  static auto* mu = new Mutex;
  return *mu;
}
// The live system, if any. Guarded by ProcessMutex() (a function-local
// static: the analysis cannot name it).
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
  // The messages that may cross a node (messages.hpp).
  config.add_message_type<StatusMessage>("foreman.StatusMessage");
  config.add_message_type<TensorMessage>("foreman.TensorMessage");
  config.add_message_type<VariablesMessage>("foreman.VariablesMessage");
  config.add_message_type<GradientsMessage>("foreman.GradientsMessage");
  config.add_message_type<StepResultMessage>("foreman.StepResultMessage");
  config.add_message_type<ApplyGradientsMessage>("foreman.ApplyGradientsMessage");
  config.add_message_type<PsShardStatsMessage>("foreman.PsShardStatsMessage");
  // A worker's per-ps-task "last answer" times (`foreman cluster status`).
  config.add_message_type<std::vector<int64_t>>("std::vector<int64_t>");
  // The actor API's (include/foreman/actor_api.hpp).
  config.add_message_type<JobStatus>("foreman.JobStatus");
  config.add_message_type<ProgressStep>("foreman.ProgressStep");
  config.add_message_type<CheckpointSaved>("foreman.CheckpointSaved");
  config.add_message_type<Recovered>("foreman.Recovered");
  config.add_message_type<JobFinished>("foreman.JobFinished");
}

// -- messages.hpp ---------------------------------------------------------------

std::vector<std::string> PayloadsOf(const Status& s) {
  std::vector<std::string> out;
  s.ForEachPayload([&out](absl::string_view url, const absl::Cord& value) {
    out.emplace_back(url);
    out.emplace_back(std::string(value));
  });
  return out;
}

void SetPayloads(Status* s, const std::vector<std::string>& payloads) {
  for (std::size_t i = 0; i + 1 < payloads.size(); i += 2) s->SetPayload(payloads[i], absl::Cord(payloads[i + 1]));
}

StatusMessage ToMessage(const Status& status) {
  return StatusMessage{static_cast<int32_t>(status.code()), std::string(status.message()), PayloadsOf(status)};
}

Status FromMessage(const StatusMessage& message) {
  if (message.code == 0) return absl::OkStatus();
  const bool known = message.code > 0 && message.code <= static_cast<int32_t>(absl::StatusCode::kUnauthenticated);
  if (!known) return absl::UnknownError(absl::StrCat("status code ", message.code, ": ", message.message));
  Status s(static_cast<absl::StatusCode>(message.code), message.message);
  SetPayloads(&s, message.payloads);
  return s;
}

namespace {

StatusOr<TensorMessage> MessageOver(const std::string& name, const Tensor& tensor, bool borrow) {
  const std::size_t element = DataTypeSize(tensor.dtype());
  if (element == 0) {
    return absl::InvalidArgumentError(absl::StrCat("tensor '", name, "' of dtype ", DataTypeName(tensor.dtype()),
                                                   " cannot travel as a raw buffer"));
  }
  TensorMessage m;
  m.name = name;
  m.dtype = static_cast<int32_t>(tensor.dtype());
  m.shape = tensor.shape().dims();
  m.bytes = borrow ? TensorBytes::Borrow(tensor.raw_data(), tensor.TotalBytes())
                   : TensorBytes::Copy(tensor.raw_data(), tensor.TotalBytes());
  return m;
}

}  // namespace

StatusOr<TensorMessage> ToMessage(const std::string& name, const Tensor& tensor) {
  return MessageOver(name, tensor, /*borrow=*/false);
}

StatusOr<TensorMessage> BorrowingMessage(const std::string& name, const Tensor& tensor) {
  return MessageOver(name, tensor, /*borrow=*/true);
}

Status CheckTensorMessage(const TensorMessage& message, DataType* dtype) {
  *dtype = static_cast<DataType>(message.dtype);
  const std::size_t element = IsSupportedDataType(message.dtype) ? DataTypeSize(*dtype) : 0;
  if (element == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor '", message.name, "': dtype ", message.dtype, " is not a numeric dtype"));
  }
  uint64_t elements = 1;
  for (int64_t d : message.shape) {
    if (d < 0 || (d > 0 && elements > (uint64_t{1} << 62) / static_cast<uint64_t>(d))) {
      return absl::InvalidArgumentError(absl::StrCat("tensor '", message.name, "': bad dimension ", d));
    }
    elements *= static_cast<uint64_t>(d);
  }
  if (elements > message.bytes.size() / element || elements * element != message.bytes.size()) {
    return absl::InvalidArgumentError(absl::StrCat("tensor '", message.name, "': ", message.bytes.size(),
                                                   " bytes for ", elements, " elements of ", element, " bytes"));
  }
  return absl::OkStatus();
}

StatusOr<Tensor> FromMessage(const TensorMessage& message) {
  DataType dtype;
  FOREMAN_RETURN_IF_ERROR(CheckTensorMessage(message, &dtype));
  FOREMAN_ASSIGN_OR_RETURN(Tensor t, Tensor::Create(dtype, TensorShape(message.shape)));
  if (!message.bytes.empty()) {
    std::memcpy(t.raw_data(), message.bytes.data(), message.bytes.size());
    TransportCopyCounters::CountCopy(message.bytes.size());
  }
  return t;
}

StatusOr<Tensor> FromMessage(TensorMessage&& message) {
  DataType dtype;
  FOREMAN_RETURN_IF_ERROR(CheckTensorMessage(message, &dtype));
  return message.bytes.TakeAsTensor(dtype, TensorShape(message.shape));
}

OwnedActorSystem::~OwnedActorSystem() {
  system.reset();
  config.reset();
}

StatusOr<std::unique_ptr<OwnedActorSystem>> BuildActorSystem(
    int scheduler_threads, const std::function<void(caf::actor_system_config&)>& configure) {
  if (scheduler_threads < 0) {
    return absl::InvalidArgumentError(absl::StrCat("actor system threads must be >= 0, got ", scheduler_threads));
  }
  auto owned = std::make_unique<OwnedActorSystem>();
  FOREMAN_RETURN_IF_ERROR(RunOnShortLivedThread([&]() -> Status {
    const int64_t serial = systems_created.fetch_add(1) + 1;
    owned->config = std::make_unique<caf::actor_system_config>();
    ConfigureActorSystemConfig(*owned->config);
    owned->config->add_thread_hook<ThreadNamer>(serial);
    owned->config->set("scheduler.max-threads", static_cast<size_t>(scheduler_threads > 0 ? scheduler_threads : 2));
    if (configure) configure(*owned->config);
    owned->system = std::make_unique<caf::actor_system>(*owned->config);
    return absl::OkStatus();
  }));
  return owned;
}

StatusOr<ActorSystemRef> AcquireProcessActorSystem(int scheduler_threads) {
  if (scheduler_threads < 0) {
    return absl::InvalidArgumentError(absl::StrCat("actor system threads must be >= 0, got ", scheduler_threads));
  }
  MutexLock lock(ProcessMutex());
  if (ActorSystemRef live = ProcessSystem().lock()) return live;
  FOREMAN_ASSIGN_OR_RETURN(std::unique_ptr<OwnedActorSystem> built, BuildActorSystem(scheduler_threads, nullptr));
  std::shared_ptr<OwnedActorSystem> owned = std::move(built);
  // The reference's deleter destroys the system (waiting for its actors,
  // which their owners have stopped) and then its config.
  caf::actor_system* raw = owned->system.get();
  ActorSystemRef ref(raw, [owned](caf::actor_system*) mutable { owned.reset(); });
  ProcessSystem() = ref;
  FOREMAN_LOG_DEBUG("Started the process's actor system fm-caf{}", systems_created.load());
  return ref;
}

void LeakActorSystem(ActorSystemRef ref) {
  if (ref == nullptr) return;
  static auto* leaked = new std::vector<ActorSystemRef>;
  MutexLock lock(ProcessMutex());
  leaked->push_back(std::move(ref));
}

int64_t ActorSystemsCreated() { return systems_created.load(); }

}  // namespace foreman::internal
