// foreman::FileWriter (file_writer.hpp): a Runtime of its own holding one
// summary_writer service, the same actor and queue that the sessions' hooks
// write through (runtime/services.hpp SummaryWriterService). CAF stays behind
// the Runtime (actors/).
#include "foreman/file_writer.hpp"

#include <atomic>
#include <memory>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "foreman/mutex.hpp"
#include "foreman/session.hpp"
#include "platform/log.hpp"
#include "runtime/runtime.hpp"

namespace foreman {

namespace {
// What the destructor waits for a writer nobody closed (the sessions'
// default shutdown bound).
constexpr absl::Duration kDestructorCloseTimeout = absl::Seconds(60);
}  // namespace

struct FileWriter::Impl {
  std::string logdir;
  std::unique_ptr<internal::Runtime> runtime;
  std::shared_ptr<internal::SummaryWriterService> writer;
  // Set when Close() starts: later adds are dropped, later flushes refused.
  std::atomic<bool> closed{false};
  // Held for the whole of Close(), so that a second Close() returns the
  // first one's result.
  Mutex close_mu;
  bool close_done ABSL_GUARDED_BY(close_mu) = false;
  Status close_status ABSL_GUARDED_BY(close_mu);
};

StatusOr<std::unique_ptr<FileWriter>> FileWriter::Create(const std::string& logdir,
                                                         const FileWriterOptions& options) {
  if (logdir.empty()) return absl::InvalidArgumentError("FileWriter: empty logdir");
  const std::string where = absl::StrCat("FileWriter(", logdir, ")");
  SessionConfig config;
  config.env = options.env != nullptr ? options.env : Env::Default();
  config.clock = options.clock != nullptr ? options.clock : Clock::Real();
  StatusOr<std::unique_ptr<internal::Runtime>> runtime = internal::Runtime::Create(nullptr, config);
  if (!runtime.ok()) return Annotate(runtime.status(), where);
  StatusOr<std::shared_ptr<internal::SummaryWriterService>> writer = (*runtime)->SummaryWriter(logdir);
  if (!writer.ok()) {
    Status shutdown = (*runtime)->Shutdown(kDestructorCloseTimeout);
    if (!shutdown.ok()) FOREMAN_LOG_ERROR("{}: shutting down after a failed Create: {}", where, shutdown.ToString());
    return Annotate(writer.status(), where);
  }
  auto impl = std::make_unique<Impl>();
  impl->logdir = logdir;
  impl->runtime = *std::move(runtime);
  impl->writer = *std::move(writer);
  return std::unique_ptr<FileWriter>(new FileWriter(std::move(impl)));
}

FileWriter::FileWriter(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

FileWriter::~FileWriter() {
  bool closed_by_caller = false;
  {
    MutexLock l(impl_->close_mu);
    closed_by_caller = impl_->close_done;
  }
  if (closed_by_caller) return;  // Close() already returned its result
  Status s = Close(kDestructorCloseTimeout);
  if (!s.ok()) FOREMAN_LOG_ERROR("{}", s.ToString());  // Close's error names the writer
}

void FileWriter::AddSummary(absl::string_view serialized_summary, int64_t global_step) {
  if (impl_->closed.load(std::memory_order_acquire)) return;
  impl_->writer->AddSummary(serialized_summary, global_step);
}

void FileWriter::AddSessionLog(SessionLogStatus status, std::optional<int64_t> step,
                               const std::string& checkpoint_path, const std::string& msg) {
  if (impl_->closed.load(std::memory_order_acquire)) return;
  impl_->writer->AddSessionLog(status, step, checkpoint_path, msg);
}

Status FileWriter::Flush(absl::Duration timeout) {
  if (impl_->closed.load(std::memory_order_acquire)) {
    return absl::UnavailableError(absl::StrCat("FileWriter(", impl_->logdir, ") is closed"));
  }
  return impl_->writer->Flush(timeout);
}

Status FileWriter::Close(absl::Duration timeout) {
  MutexLock l(impl_->close_mu);
  if (impl_->close_done) return impl_->close_status;
  impl_->closed.store(true, std::memory_order_release);
  // Shutdown flushes and closes the event file, then stops the actors; it
  // returns the writer's first error (reported to the runtime) if any.
  impl_->close_status = Annotate(impl_->runtime->Shutdown(timeout), absl::StrCat("FileWriter(", impl_->logdir, ")"));
  impl_->close_done = true;
  return impl_->close_status;
}

const std::string& FileWriter::logdir() const { return impl_->logdir; }

}  // namespace foreman
