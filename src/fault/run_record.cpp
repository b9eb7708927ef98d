// The run record: RunRecordWriter (foreman/fault.hpp) and its reader
// (fault/run_record.hpp).
#include "fault/run_record.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "foreman/fault.hpp"

namespace foreman {

using json = nlohmann::json;

struct RunRecordWriter::Impl {
  std::string path;
  std::mutex mu;
  std::FILE* file = nullptr;
  Status status;

  void Append(const json& event) {
    // One write of the whole line, then a flush: a killed process leaves
    // whole lines and at most one torn last line.
    const std::string line = event.dump() + "\n";
    std::lock_guard<std::mutex> lock(mu);
    if (std::fwrite(line.data(), 1, line.size(), file) != line.size() || std::fflush(file) != 0) {
      if (status.ok()) status = absl::InternalError(absl::StrCat("cannot write ", path, ": ", std::strerror(errno)));
    }
  }
};

namespace {

// Truncates `path` after its last '\n' (nothing when it does not exist or
// ends in one).
Status DropTornLine(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return absl::OkStatus();
    return absl::InternalError(absl::StrCat("cannot open ", path, ": ", std::strerror(errno)));
  }
  struct stat st {};
  off_t keep = 0;
  Status status;
  if (::fstat(fd, &st) != 0) {
    status = absl::InternalError(absl::StrCat("cannot stat ", path, ": ", std::strerror(errno)));
  } else {
    // Back from the end, a block at a time, to the last '\n'.
    char buf[4096];
    off_t end = st.st_size;
    bool found = false;
    while (end > 0 && !found && status.ok()) {
      const off_t begin = end > static_cast<off_t>(sizeof(buf)) ? end - static_cast<off_t>(sizeof(buf)) : 0;
      const ssize_t n = ::pread(fd, buf, static_cast<std::size_t>(end - begin), begin);
      if (n != end - begin) {
        status = absl::InternalError(absl::StrCat("cannot read ", path, ": ", std::strerror(errno)));
        break;
      }
      for (off_t i = n - 1; i >= 0; --i) {
        if (buf[i] == '\n') {
          keep = begin + i + 1;
          found = true;
          break;
        }
      }
      end = begin;
    }
    if (status.ok() && keep != st.st_size && ::ftruncate(fd, keep) != 0) {
      status = absl::InternalError(absl::StrCat("cannot truncate ", path, ": ", std::strerror(errno)));
    }
  }
  ::close(fd);
  return status;
}

}  // namespace

RunRecordWriter::RunRecordWriter(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

RunRecordWriter::~RunRecordWriter() {
  if (impl_ != nullptr && impl_->file != nullptr) std::fclose(impl_->file);
}

StatusOr<std::unique_ptr<RunRecordWriter>> RunRecordWriter::Open(const std::string& run_dir) {
  return OpenFile(absl::StrCat(run_dir, "/", kRunRecordFile));
}

StatusOr<std::unique_ptr<RunRecordWriter>> RunRecordWriter::OpenFile(const std::string& path) {
  auto impl = std::make_unique<Impl>();
  impl->path = path;
  // A torn last line (a process killed while writing it) is cut off first,
  // so that this process's lines start on a line of their own.
  if (Status s = DropTornLine(impl->path); !s.ok()) return s;
  impl->file = std::fopen(impl->path.c_str(), "ae");
  if (impl->file == nullptr) {
    return absl::InternalError(absl::StrCat("cannot open ", impl->path, ": ", std::strerror(errno)));
  }
  return std::unique_ptr<RunRecordWriter>(new RunRecordWriter(std::move(impl)));
}

namespace {
std::string Basename(const std::string& path) {
  const std::size_t slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}
}  // namespace

void RunRecordWriter::Restore(const std::string& checkpoint, int64_t global_step) {
  impl_->Append({{"event", "restore"}, {"checkpoint", Basename(checkpoint)}, {"global_step", global_step}});
}

void RunRecordWriter::Step(int64_t global_step) { impl_->Append({{"event", "step"}, {"global_step", global_step}}); }

void RunRecordWriter::Save(int64_t global_step, const std::string& checkpoint) {
  impl_->Append({{"event", "save"},
                 {"global_step", global_step},
                 {"checkpoint", Basename(checkpoint)},
                 {"durable", true}});
}

void RunRecordWriter::Recovery(const Status& cause, int64_t global_step_before, int64_t restored_global_step,
                               int64_t steps_lost) {
  impl_->Append({{"event", "recovery"},
                 {"cause", cause.ToString(absl::StatusToStringMode::kWithNoExtraData)},
                 {"global_step_before", global_step_before},
                 {"restored_global_step", restored_global_step},
                 {"steps_lost", steps_lost}});
}

void RunRecordWriter::InjectedStop(const std::string& fault_id) {
  impl_->Append({{"event", "injected_stop"}, {"fault", fault_id}});
}

void RunRecordWriter::Exit(const std::string& stopped_by_signal) {
  impl_->Append({{"event", "exit"},
                 {"stopped_by_signal", stopped_by_signal.empty() ? json(nullptr) : json(stopped_by_signal)}});
}

void RunRecordWriter::Failed(const std::string& what, const Status& error) {
  impl_->Append({{"event", "failed"},
                 {"what", what},
                 {"code", absl::StatusCodeToString(error.code())},
                 {"message", std::string(error.message())}});
}

Status RunRecordWriter::status() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->status;
}

namespace internal {

StatusOr<std::vector<json>> ParseRunRecord(const std::string& text, const std::string& name, bool* torn) {
  if (torn != nullptr) *torn = false;
  std::vector<json> events;
  const std::vector<absl::string_view> lines = absl::StrSplit(text, '\n');
  for (std::size_t i = 0; i < lines.size(); ++i) {
    const absl::string_view line = lines[i];
    if (line.empty()) continue;
    const bool last_unterminated = i + 1 == lines.size();  // no '\n' after it
    json event = json::parse(line.begin(), line.end(), nullptr, /*allow_exceptions=*/false);
    if (event.is_discarded() || !event.is_object()) {
      if (last_unterminated && event.is_discarded()) {
        if (torn != nullptr) *torn = true;
        break;
      }
      return absl::DataLossError(absl::StrCat(name, ":", i + 1, ": not a JSON object: ", line.substr(0, 80)));
    }
    if (!event.contains("event") || !event["event"].is_string()) {
      return absl::DataLossError(absl::StrCat(name, ":", i + 1, ": no \"event\" string: ", line.substr(0, 80)));
    }
    events.push_back(std::move(event));
  }
  return events;
}

StatusOr<std::vector<json>> ReadRunRecord(Env* env, const std::string& run_dir) {
  return ReadRunRecordFile(env, absl::StrCat(run_dir, "/", kRunRecordFile));
}

StatusOr<std::vector<json>> ReadRunRecordFile(Env* env, const std::string& path) {
  if (!env->FileExists(path).ok()) return std::vector<json>{};
  FOREMAN_ASSIGN_OR_RETURN(std::string text, env->ReadFileToString(path));
  return ParseRunRecord(text, path);
}

}  // namespace internal
}  // namespace foreman
