// A test build of the `foreman` program (tests/power_loss_test.sh): the same
// program, with `chaos --disk sim`'s simulated disk behind a disk that lies
// in one way, chosen by $FOREMAN_LYING_DISK, so that the power-loss mode's
// checks must find it (each lie is one of the durability bugs the mode
// exists for, made at the disk instead of in Foreman's code):
//   data-sync  a Sync() of a checkpoint's data file returns OK and syncs
//              nothing (a missing fsync before the rename)
//   dir-sync   SyncDir() returns OK and syncs nothing (renames and creates
//              never made durable)
//   lost-write an Append() to step 40's data file returns OK and writes
//              nothing, once per file (a failed append ignored; one step's
//              only, so that the fault-free run still ends with a whole
//              checkpoint to compare with)
//   data-sync-after-crash
//              as data-sync, but only once the simulated disk has lost its
//              power once (a bug that only a crash shows: what --shrink
//              must keep a crash fault for)
//   lost-lock  LockFile() takes the lock and lets it go at once (a job that
//              writes its directory without holding its lock)
//   state-sync a Sync() of the state file's temporary file (checkpoint.tmp*)
//              returns OK and syncs nothing (the state file renamed into
//              place before its bytes are durable)
//   state-dir-sync
//              the SyncDir() after the state file's rename returns OK and
//              syncs nothing (the new state file's name never durable)
//   forget-after-crash
//              once the disk has lost its power, the job's directory reads
//              as holding no checkpoint (no state file, no bundle): a
//              restart that restores nothing although a whole checkpoint
//              is there
//   event-retry
//              the third append to each event file writes the first half
//              of its record, then the whole record (the retry that once
//              left a cut record in the middle of an event file): the
//              check after every flush must name it
// Unset or anything else: the disk tells the truth (the program is then
// `foreman`). The installed `foreman` has no such disk.
#include <fnmatch.h>

#include <atomic>
#include <cstdlib>
#include <memory>
#include <string>

#include "command.hpp"
#include "foreman/env.hpp"
#include "foreman/mem_env.hpp"

namespace {

std::string Mode() {
  const char* m = std::getenv("FOREMAN_LYING_DISK");
  return m != nullptr ? m : "";
}

bool IsData(const std::string& path) { return fnmatch("*.data-*", path.c_str(), 0) == 0; }
bool IsStateTemp(const std::string& path) { return fnmatch("*/checkpoint.tmp*", path.c_str(), 0) == 0; }

// The MemEnv under `env` (through EnvWrapper::base()), or null.
foreman::MemEnv* DiskUnder(foreman::Env* env) {
  while (env != nullptr) {
    if (auto* mem = dynamic_cast<foreman::MemEnv*>(env)) return mem;
    auto* wrapper = dynamic_cast<foreman::EnvWrapper*>(env);
    env = wrapper != nullptr ? wrapper->base() : nullptr;
  }
  return nullptr;
}

class LyingFile : public foreman::WritableFile {
 public:
  LyingFile(std::unique_ptr<foreman::WritableFile> file, std::string mode, foreman::MemEnv* disk)
      : file_(std::move(file)), mode_(std::move(mode)), disk_(disk) {}
  foreman::Status Append(absl::string_view data) override {
    if (mode_ == "event-retry" && ++appends_ == 3 && data.size() >= 32) {
      FOREMAN_RETURN_IF_ERROR(file_->Append(data.substr(0, data.size() / 2)));
      return file_->Append(data);
    }
    if (mode_ == "lost-write" && !lost_) {
      lost_ = true;
      return absl::OkStatus();
    }
    return file_->Append(data);
  }
  foreman::Status Flush() override { return file_->Flush(); }
  foreman::Status Sync() override {
    const bool lie = mode_ == "data-sync" || mode_ == "state-sync" ||
                     (mode_ == "data-sync-after-crash" && disk_ != nullptr && disk_->crashes() > 0);
    return lie ? absl::OkStatus() : file_->Sync();
  }
  foreman::Status Close() override { return file_->Close(); }
  uint64_t Size() const override { return file_->Size(); }

 private:
  std::unique_ptr<foreman::WritableFile> file_;
  const std::string mode_;
  foreman::MemEnv* const disk_;
  bool lost_ = false;
  int appends_ = 0;
};

class LyingEnv : public foreman::EnvWrapper {
 public:
  LyingEnv(foreman::Env* base, std::string mode) : EnvWrapper(base), mode_(std::move(mode)) {}
  foreman::StatusOr<std::unique_ptr<foreman::WritableFile>> NewWritableFile(const std::string& path) override {
    FOREMAN_ASSIGN_OR_RETURN(std::unique_ptr<foreman::WritableFile> file, base()->NewWritableFile(path));
    if (mode_ == "state-sync") {
      if (!IsStateTemp(path)) return file;
    } else if (mode_ == "event-retry") {
      if (path.find("events.out.tfevents") == std::string::npos) return file;
    } else if (!IsData(path)) {
      return file;
    }
    if (mode_ == "lost-write" && fnmatch("*model.ckpt-40.data-*", path.c_str(), 0) != 0) return file;
    return std::unique_ptr<foreman::WritableFile>(new LyingFile(std::move(file), mode_, DiskUnder(base())));
  }
  foreman::StatusOr<std::unique_ptr<foreman::FileLock>> LockFile(const std::string& path) override {
    FOREMAN_ASSIGN_OR_RETURN(std::unique_ptr<foreman::FileLock> lock, base()->LockFile(path));
    if (mode_ != "lost-lock") return lock;
    lock.reset();
    return std::make_unique<foreman::FileLock>();
  }
  foreman::StatusOr<std::string> ReadFileToString(const std::string& path) override {
    if (Forgets() && IsCheckpointFile(path)) return absl::NotFoundError(path);
    return base()->ReadFileToString(path);
  }
  foreman::Status FileExists(const std::string& path) override {
    if (Forgets() && IsCheckpointFile(path)) return absl::NotFoundError(path);
    return base()->FileExists(path);
  }
  foreman::StatusOr<std::vector<std::string>> GetChildren(const std::string& dir) override {
    FOREMAN_ASSIGN_OR_RETURN(std::vector<std::string> names, base()->GetChildren(dir));
    if (!Forgets()) return names;
    std::vector<std::string> kept;
    for (const std::string& name : names) {
      if (!IsCheckpointFile("/" + name)) kept.push_back(name);
    }
    return kept;
  }
  foreman::Status RenameFile(const std::string& from, const std::string& to) override {
    state_renamed_ = fnmatch("*/checkpoint", to.c_str(), 0) == 0;
    return base()->RenameFile(from, to);
  }
  foreman::Status SyncDir(const std::string& dir) override {
    const bool lie = mode_ == "dir-sync" || (mode_ == "state-dir-sync" && state_renamed_.exchange(false));
    return lie ? absl::OkStatus() : base()->SyncDir(dir);
  }

 private:
  bool Forgets() {
    if (mode_ != "forget-after-crash") return false;
    foreman::MemEnv* disk = DiskUnder(base());
    return disk != nullptr && disk->crashes() > 0;
  }
  static bool IsCheckpointFile(const std::string& path) {
    return fnmatch("*/checkpoint", path.c_str(), 0) == 0 || fnmatch("*/model.ckpt-*", path.c_str(), 0) == 0;
  }
  const std::string mode_;
  // The last rename was the state file's (state-dir-sync: its SyncDir lies).
  std::atomic<bool> state_renamed_{false};
};

std::unique_ptr<foreman::Env> Lie(foreman::Env* disk) {
  const std::string mode = Mode();
  if (mode != "data-sync" && mode != "data-sync-after-crash" && mode != "dir-sync" && mode != "lost-write" &&
      mode != "lost-lock" && mode != "state-sync" && mode != "state-dir-sync" &&
      mode != "forget-after-crash" && mode != "event-retry") {
    return nullptr;
  }
  return std::make_unique<LyingEnv>(disk, mode);
}

}  // namespace

int main(int argc, char** argv) {
  foreman::cli::SetSimulatedDiskWrapperForTest(&Lie);
  return foreman::cli::RunForeman(argc, argv);
}
