// FaultyEnv (foreman/fault.hpp).
//
// Every FaultyEnv operation goes through State::Before(): it counts the
// operation in its path's per-kind index, decides which armed faults trigger
// (under mu), sleeps for latency faults, crashes for a crash fault, and
// returns the injected error, if any. The operation itself then runs in the
// base under a shared lock on crash_mu, which Crash() takes exclusively, so
// a crash never lands in the middle of a base operation.

#include "foreman/fault.hpp"

#include <fnmatch.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <cmath>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <shared_mutex>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/cord.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "foreman/mem_env.hpp"
#include "foreman/mutex.hpp"
#include "platform/errno_status.hpp"
#include "platform/hash.hpp"
#include "fault/injected_fault.hpp"
#include "platform/log.hpp"

namespace foreman {

// -- the injected-fault payload ------------------------------------------------------

Status WithInjectedFault(Status s, absl::string_view fault_id) {
  if (!s.ok()) s.SetPayload(kInjectedFaultPayload, absl::Cord(fault_id));
  return s;
}

Status CheckFaultIdCharacters(absl::string_view id) {
  for (std::size_t i = 0; i < id.size(); ++i) {
    const auto c = static_cast<unsigned char>(id[i]);
    if (c < 0x20 || c == 0x7f) {
      return absl::InvalidArgumentError(absl::StrCat("id \"", absl::CEscape(id), "\" has a control character (0x",
                                                     absl::Hex(c, absl::kZeroPad2), ") at byte ", i,
                                                     " (ids are logged and recorded as they are)"));
    }
  }
  return absl::OkStatus();
}

std::optional<std::string> InjectedFaultId(const Status& s) {
  auto id = s.GetPayload(kInjectedFaultPayload);  // absl::optional (C++17 build of Abseil)
  if (!id.has_value()) return std::nullopt;
  return std::string(*id);
}

// -- the draw --------------------------------------------------------------------------

double FaultDraw(uint64_t seed, const std::string& fault_id, const std::string& path, EnvOp op,
                 int64_t op_index) {
  using internal::Fnv1a64;
  using internal::SplitMix64;
  uint64_t h = SplitMix64(seed);
  h = SplitMix64(h ^ Fnv1a64(fault_id));
  h = SplitMix64(h ^ Fnv1a64(path));
  h = SplitMix64(h ^ static_cast<uint64_t>(op));
  h = SplitMix64(h ^ static_cast<uint64_t>(op_index));
  return static_cast<double>(h >> 11) * 0x1.0p-53;  // 53 random bits in [0, 1)
}

const char* EnvOpName(EnvOp op) {
  switch (op) {
    case EnvOp::kAny: return "any";
    case EnvOp::kNewWritable: return "new_writable";
    case EnvOp::kNewAppendable: return "new_appendable";
    case EnvOp::kAppend: return "append";
    case EnvOp::kFlush: return "flush";
    case EnvOp::kSync: return "sync";
    case EnvOp::kClose: return "close";
    case EnvOp::kRename: return "rename";
    case EnvOp::kDelete: return "delete";
    case EnvOp::kCreateDir: return "create_dir";
    case EnvOp::kDeleteDir: return "delete_dir";
    case EnvOp::kSyncDir: return "sync_dir";
    case EnvOp::kRead: return "read";
    case EnvOp::kStat: return "stat";
    case EnvOp::kLock: return "lock";
  }
  return "unknown";
}

// -- FaultyEnv's state -------------------------------------------------------------------

namespace {

/// What an operation does besides (or instead of) running.
struct Action {
  enum Outcome { kRun, kShortWrite, kTornWrite } outcome = kRun;
  int64_t prefix_bytes = -1;
  int error = 0;
  std::string id;
};

/// An operation as its error message names it ("<syscall> <path>[ to <other>]"),
/// spelled out only when an error needs it.
struct Where {
  const char* syscall;
  const std::string& path;
  const std::string* other = nullptr;  // a rename's `to`
  std::string str() const {
    return other == nullptr ? absl::StrCat(syscall, " ", path) : absl::StrCat(syscall, " ", path, " to ", *other);
  }
};

bool AllDigits(absl::string_view s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

bool Matches(const std::string& pattern, const std::string& path) {
  return pattern.empty() || fnmatch(pattern.c_str(), path.c_str(), 0) == 0;
}

Status WithFaultId(const Status& s, const std::string& id) {
  return WithInjectedFault(Status(s.code(), absl::StrCat(s.message(), " (injected fault ", id, ")")), id);
}

/// The MemEnv under `env` through any chain of EnvWrappers, or nullptr.
MemEnv* FindMemEnv(Env* env) {
  while (env != nullptr) {
    if (auto* mem = dynamic_cast<MemEnv*>(env)) return mem;
    auto* wrapper = dynamic_cast<EnvWrapper*>(env);
    env = wrapper != nullptr ? wrapper->base() : nullptr;
  }
  return nullptr;
}

}  // namespace

struct FaultyEnv::State {
  State(Env* b, uint64_t s, Clock* c) : base(b), seed(s), clock(c != nullptr ? c : Clock::Real()) {}

  struct Armed {
    EnvFault fault;
    int64_t matches = 0;  // operations matched so far (for nth)
    bool fired = false;
  };

  Env* const base;
  const uint64_t seed;
  Clock* const clock;

  mutable Mutex mu;
  std::vector<Armed> faults ABSL_GUARDED_BY(mu);
  std::map<std::string, std::array<int64_t, kNumEnvOps>> op_counts ABSL_GUARDED_BY(mu);
  std::vector<FiredFault> fired ABSL_GUARDED_BY(mu);
  std::set<std::string> fired_before ABSL_GUARDED_BY(mu);
  /// Called outside mu (a copy of the pointer is taken under it).
  std::shared_ptr<const FaultObserver> on_fire ABSL_GUARDED_BY(mu);
  /// set_key_root's directory ("" none), without a trailing '/'.
  std::string key_root ABSL_GUARDED_BY(mu);
  /// Each event file seen, by its canonical path: its ordinal among the
  /// event files of its directory (set_key_root).
  std::map<std::string, int64_t> event_file_ordinals ABSL_GUARDED_BY(mu);
  std::map<std::string, int64_t> event_files_per_dir ABSL_GUARDED_BY(mu);

  /// The key of `path`: CanonicalPath, then with a key root the part under
  /// it (an event file named by its ordinal in its directory).
  std::string KeyLocked(const std::string& path) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    std::string canonical = CanonicalPath(path);
    if (key_root.empty()) return canonical;
    if (canonical == key_root) return ".";
    if (canonical.size() <= key_root.size() || canonical.compare(0, key_root.size(), key_root) != 0 ||
        canonical[key_root.size()] != '/') {
      return canonical;  // outside the root: as it is
    }
    std::string rel = canonical.substr(key_root.size() + 1);
    const std::size_t slash = rel.rfind('/');
    const std::string dir = slash == std::string::npos ? "" : rel.substr(0, slash + 1);
    constexpr absl::string_view kEvents = "events.out.tfevents.";
    if (absl::string_view(rel).substr(dir.size()).substr(0, kEvents.size()) == kEvents) {
      // Named after its creation second and host: keyed by its ordinal.
      auto [it, added] = event_file_ordinals.emplace(canonical, 0);
      if (added) it->second = event_files_per_dir[dir]++;
      return absl::StrCat(dir, kEvents, "#", it->second);
    }
    return rel;
  }

  /// Shared by each operation while it runs in the base; exclusive in Crash().
  std::shared_mutex crash_mu;
  std::atomic<bool> crashed{false};

  /// The error of an operation refused because of a crash.
  static Status CrashedError(const Where& where, const std::string& id) {
    Status s = absl::CancelledError(absl::StrCat(where.str(), ": simulated crash",
                                                 id.empty() ? "" : absl::StrCat(" (injected fault ", id, ")"),
                                                 ": the file system is down until FaultyEnv::Recover()"));
    return id.empty() ? s : WithInjectedFault(std::move(s), id);
  }

  /// The per-kind operation counters of `path`; the pointer stays valid for
  /// the state's life (a std::map node). Read and written under mu.
  std::array<int64_t, kNumEnvOps>* CountsFor(const std::string& path) {
    MutexLock l(mu);
    return &op_counts[KeyLocked(path)];
  }

  Status Crash() {
    std::unique_lock<std::shared_mutex> l(crash_mu);
    MemEnv* mem = FindMemEnv(base);
    if (mem == nullptr) {
      return absl::FailedPreconditionError(
          "FaultyEnv::Crash: crashes are only supported over a MemEnv, and there is none under this Env");
    }
    crashed.store(true);
    mem->Crash();
    return absl::OkStatus();
  }

  /// Counts the operation, applies latency and crash faults, and returns the
  /// injected error when the operation must fail without running.
  /// `counts`: the path's counters when the caller has them (a file), else nullptr.
  Status Before(EnvOp op, const Where& where, std::array<int64_t, kNumEnvOps>* counts, Action* action) {
    if (crashed.load()) return CrashedError(where, "");
    const std::string& path = where.path;
    const std::string* other = where.other;
    // Draws, operation indexes and the record use the paths' keys
    // (FaultyEnv::CanonicalPath, relative to set_key_root's directory); the
    // globs match the real paths.
    absl::Duration latency = absl::ZeroDuration();
    bool crash = false;
    Status error;
    std::vector<FiredFault> now_fired;  // announced outside mu, before they take effect
    std::vector<const std::string*> now_fired_paths;  // the real path each fired at, for the log
    std::shared_ptr<const FaultObserver> observer;
    {
      MutexLock l(mu);
      const std::string canonical = KeyLocked(path);
      const std::string other_canonical = other != nullptr ? KeyLocked(*other) : std::string();
      const int k = static_cast<int>(op);
      const int64_t index = ++(counts != nullptr ? *counts : op_counts[canonical])[k];
      // A rename between two names of one canonical path counts once.
      const int64_t other_index =
          other == nullptr ? 0 : other_canonical == canonical ? index : ++op_counts[other_canonical][k];
      bool decided = false;
      for (Armed& a : faults) {
        const EnvFault& f = a.fault;
        if (f.op != EnvOp::kAny && f.op != op) continue;
        const std::string* at = &canonical;
        int64_t at_index = index;
        if (!Matches(f.path_pattern, path)) {
          if (other == nullptr || !Matches(f.path_pattern, *other)) continue;
          at = &other_canonical;
          at_index = other_index;
        }
        ++a.matches;
        const bool is_latency = f.kind == EnvFault::Kind::kLatency;
        if (decided && !is_latency) continue;
        if (!f.repeat && (a.fired || fired_before.count(f.id) != 0)) continue;
        // An nth fault whose nth match was decided by an earlier-armed fault
        // stays pending and fires at the next matching operation.
        const bool triggered = f.nth > 0 ? a.matches >= f.nth
                                         : FaultDraw(seed, f.id, *at, op, at_index) < f.probability;
        if (!triggered) continue;
        a.fired = true;
        fired.push_back(FiredFault{f.id, *at, op, at_index});
        now_fired.push_back(fired.back());
        now_fired_paths.push_back(at == &canonical ? &path : other);
        switch (f.kind) {
          case EnvFault::Kind::kLatency:
            latency += f.latency;
            break;
          case EnvFault::Kind::kCrash:
            crash = true;
            action->id = f.id;
            decided = true;
            break;
          case EnvFault::Kind::kError:
            error = WithFaultId(internal::ErrnoError(where.str(), f.error != 0 ? f.error : EIO), f.id);
            decided = true;
            break;
          case EnvFault::Kind::kShortWrite:
          case EnvFault::Kind::kTornWrite:
            action->outcome =
                f.kind == EnvFault::Kind::kShortWrite ? Action::kShortWrite : Action::kTornWrite;
            action->prefix_bytes = f.prefix_bytes;
            action->error = f.error != 0 ? f.error : ENOSPC;
            action->id = f.id;
            decided = true;
            break;
        }
      }
      if (!now_fired.empty()) observer = on_fire;
    }
    for (std::size_t i = 0; i < now_fired.size(); ++i) {
      const FiredFault& f = now_fired[i];
      FOREMAN_LOG_WARN("injected fault {} fired at {} {} (operation {})", f.id, EnvOpName(f.op),
                       CanonicalPath(*now_fired_paths[i]), f.op_index);
      if (observer != nullptr && *observer) (*observer)(f);
    }
    if (latency > absl::ZeroDuration()) clock->SleepFor(latency);
    if (crash) {
      Status s = Crash();
      if (!s.ok()) return s;  // unreachable: AddFault requires a MemEnv for kCrash
      return CrashedError(where, action->id);
    }
    return error;
  }
};

namespace {

using State = FaultyEnv::State;

/// Runs `body` (the base operation) unless a crash came first.
template <typename Body>
auto RunInBase(State& st, const Where& where, Body&& body) -> decltype(body()) {
  std::shared_lock<std::shared_mutex> l(st.crash_mu);
  if (st.crashed.load()) return State::CrashedError(where, "");
  return body();
}

class FaultyWritableFile : public WritableFile {
 public:
  FaultyWritableFile(std::shared_ptr<State> st, std::string path, std::unique_ptr<WritableFile> base)
      : st_(std::move(st)), path_(std::move(path)), counts_(st_->CountsFor(path_)), base_(std::move(base)) {}

  Status Append(absl::string_view data) override {
    const Where where{"write", path_};
    Action a;
    FOREMAN_RETURN_IF_ERROR(st_->Before(EnvOp::kAppend, where, counts_, &a));
    const std::size_t prefix =
        a.prefix_bytes < 0 ? data.size() / 2 : std::min<std::size_t>(data.size(), a.prefix_bytes);
    return RunInBase(*st_, where, [&]() -> Status {
      switch (a.outcome) {
        case Action::kRun:
          return base_->Append(data);
        case Action::kShortWrite:
          FOREMAN_RETURN_IF_ERROR(base_->Append(data.substr(0, prefix)));
          return WithFaultId(internal::ErrnoError(where.str(), a.error), a.id);
        case Action::kTornWrite:
          FOREMAN_RETURN_IF_ERROR(base_->Append(data.substr(0, prefix)));
          FOREMAN_RETURN_IF_ERROR(base_->Sync());
          return base_->Append(data.substr(prefix));
      }
      return absl::InternalError("unreachable");
    });
  }

  Status Flush() override { return Simple(EnvOp::kFlush, "write", [&] { return base_->Flush(); }); }
  Status Sync() override { return Simple(EnvOp::kSync, "fdatasync", [&] { return base_->Sync(); }); }

  Status Close() override {
    const Where where{"close", path_};
    Action a;
    Status s = st_->Before(EnvOp::kClose, where, counts_, &a);
    if (!s.ok()) {
      base_->Close().IgnoreError();  // close(2) releases the file even when it fails
      return s;
    }
    return RunInBase(*st_, where, [&] { return base_->Close(); });
  }

  uint64_t Size() const override { return base_->Size(); }

 private:
  template <typename Body>
  Status Simple(EnvOp op, const char* syscall, Body&& body) {
    const Where where{syscall, path_};
    Action a;
    FOREMAN_RETURN_IF_ERROR(st_->Before(op, where, counts_, &a));
    return RunInBase(*st_, where, body);
  }

  std::shared_ptr<State> st_;
  std::string path_;
  std::array<int64_t, kNumEnvOps>* counts_;  // in st_->op_counts, guarded by st_->mu
  std::unique_ptr<WritableFile> base_;
};

class FaultyRandomAccessFile : public RandomAccessFile {
 public:
  FaultyRandomAccessFile(std::shared_ptr<State> st, std::string path, std::unique_ptr<RandomAccessFile> base)
      : st_(std::move(st)), path_(std::move(path)), counts_(st_->CountsFor(path_)), base_(std::move(base)) {}

  StatusOr<absl::string_view> Read(uint64_t offset, std::size_t n, char* scratch) const override {
    const Where where{"pread", path_};
    Action a;
    FOREMAN_RETURN_IF_ERROR(st_->Before(EnvOp::kRead, where, counts_, &a));
    return RunInBase(*st_, where, [&] { return base_->Read(offset, n, scratch); });
  }

  uint64_t Size() const override { return base_->Size(); }

 private:
  std::shared_ptr<State> st_;
  std::string path_;
  std::array<int64_t, kNumEnvOps>* counts_;  // in st_->op_counts, guarded by st_->mu
  std::unique_ptr<RandomAccessFile> base_;
};

}  // namespace

// -- FaultyEnv -------------------------------------------------------------------------------

std::string FaultyEnv::CanonicalPath(const std::string& path) {
  const absl::string_view p(path);
  // BundleWriter's temporaries: "<file>.tempstate<digits>" (a random number).
  const std::size_t tempstate = p.rfind(".tempstate");
  if (tempstate != absl::string_view::npos && AllDigits(p.substr(tempstate + 10))) {
    return std::string(p.substr(0, tempstate));
  }
  // WriteFileAtomic's temporaries: "<file>.tmp<pid>-<n>".
  const std::size_t tmp = p.rfind(".tmp");
  if (tmp != absl::string_view::npos) {
    const absl::string_view rest = p.substr(tmp + 4);
    const std::size_t dash = rest.find('-');
    if (dash != absl::string_view::npos && AllDigits(rest.substr(0, dash)) && AllDigits(rest.substr(dash + 1))) {
      return std::string(p.substr(0, tmp));
    }
  }
  return path;
}

FaultyEnv::FaultyEnv(Env* base, uint64_t seed, Clock* clock)
    : EnvWrapper(base), state_(std::make_shared<State>(base, seed, clock)) {}

FaultyEnv::~FaultyEnv() = default;

Status FaultyEnv::AddFault(EnvFault fault) {
  const std::string name = absl::StrCat("fault '", fault.id, "'");
  auto invalid = [&](absl::string_view what) {
    return absl::InvalidArgumentError(absl::StrCat("FaultyEnv::AddFault: ", name, ": ", what));
  };
  if (fault.id.empty()) return invalid("id is empty");
  if (Status s = CheckFaultIdCharacters(fault.id); !s.ok()) return Annotate(s, "FaultyEnv::AddFault");
  const int op = static_cast<int>(fault.op);
  if (op < 0 || op >= kNumEnvOps) return invalid(absl::StrCat("op ", op, " is not an EnvOp"));
  const int kind = static_cast<int>(fault.kind);
  if (kind < 0 || kind > static_cast<int>(EnvFault::Kind::kCrash)) {
    return invalid(absl::StrCat("kind ", kind, " is not an EnvFault::Kind"));
  }
  if (fault.nth < 0) return invalid(absl::StrCat("nth ", fault.nth, " < 0"));
  if (!(fault.probability >= 0 && fault.probability <= 1)) {
    return invalid(absl::StrCat("probability ", fault.probability, " is outside [0, 1]"));
  }
  if (fault.latency < absl::ZeroDuration()) {
    return invalid(absl::StrCat("latency ", absl::FormatDuration(fault.latency), " < 0"));
  }
  if (fault.latency == absl::InfiniteDuration() || fault.latency > absl::Hours(1)) {
    return invalid(absl::StrCat("latency ", absl::FormatDuration(fault.latency),
                                " > 1h (a plan must not hang the job forever)"));
  }
  if (fault.error < 0) return invalid(absl::StrCat("error ", fault.error, " < 0"));
  if (fault.prefix_bytes < -1) return invalid(absl::StrCat("prefix_bytes ", fault.prefix_bytes, " < -1"));
  if ((fault.kind == EnvFault::Kind::kShortWrite || fault.kind == EnvFault::Kind::kTornWrite) &&
      fault.op != EnvOp::kAppend) {
    return invalid(absl::StrCat("a short or torn write needs op append, not ", EnvOpName(fault.op)));
  }
  if (fault.kind == EnvFault::Kind::kCrash && FindMemEnv(base()) == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "FaultyEnv::AddFault: ", name, ": crashes are only supported over a MemEnv, and there is none under this Env"));
  }
  if (fault.kind == EnvFault::Kind::kTornWrite && FindMemEnv(base()) == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("FaultyEnv::AddFault: ", name,
                     ": a torn write only has an effect through a crash, and crashes are only supported over a "
                     "MemEnv, and there is none under this Env"));
  }
  MutexLock l(state_->mu);
  for (const State::Armed& a : state_->faults) {
    if (a.fault.id == fault.id) {
      return absl::AlreadyExistsError(absl::StrCat("FaultyEnv::AddFault: ", name, " is already armed"));
    }
  }
  state_->faults.push_back(State::Armed{std::move(fault)});
  return absl::OkStatus();
}

void FaultyEnv::RemoveFault(const std::string& id) {
  MutexLock l(state_->mu);
  auto& faults = state_->faults;
  faults.erase(std::remove_if(faults.begin(), faults.end(), [&](const State::Armed& a) { return a.fault.id == id; }),
               faults.end());
}

void FaultyEnv::ClearFaults() {
  MutexLock l(state_->mu);
  state_->faults.clear();
}

std::vector<FiredFault> FaultyEnv::fired() const {
  MutexLock l(state_->mu);
  return state_->fired;
}

void FaultyEnv::MarkFired(const std::vector<FiredFault>& fired) {
  MutexLock l(state_->mu);
  for (const FiredFault& f : fired) state_->fired_before.insert(f.id);
}

void FaultyEnv::set_key_root(const std::string& dir) {
  std::string root = dir;
  while (root.size() > 1 && root.back() == '/') root.pop_back();
  MutexLock l(state_->mu);
  state_->key_root = std::move(root);
}

void FaultyEnv::set_on_fire(FaultObserver on_fire) {
  auto observer = on_fire ? std::make_shared<const FaultObserver>(std::move(on_fire)) : nullptr;
  MutexLock l(state_->mu);
  state_->on_fire = std::move(observer);
}

Status FaultyEnv::Crash() { return state_->Crash(); }

void FaultyEnv::Recover() {
  std::unique_lock<std::shared_mutex> l(state_->crash_mu);
  state_->crashed.store(false);
}

bool FaultyEnv::crashed() const { return state_->crashed.load(); }

// -- Env operations ----------------------------------------------------------------------------

namespace {

/// One Env operation on `path`: faults first, then the base.
template <typename Body>
auto Op(State& st, EnvOp op, const Where& where, Body&& body) -> decltype(body()) {
  Action a;
  Status s = st.Before(op, where, nullptr, &a);
  if (!s.ok()) return s;
  return RunInBase(st, where, body);
}

}  // namespace

StatusOr<std::string> FaultyEnv::ReadFileToString(const std::string& path) {
  return Op(*state_, EnvOp::kRead, Where{"read", path}, [&] { return base()->ReadFileToString(path); });
}

StatusOr<std::unique_ptr<RandomAccessFile>> FaultyEnv::NewRandomAccessFile(const std::string& path) {
  auto file = Op(*state_, EnvOp::kRead, Where{"open", path}, [&] { return base()->NewRandomAccessFile(path); });
  if (!file.ok()) return file.status();
  return std::unique_ptr<RandomAccessFile>(new FaultyRandomAccessFile(state_, path, std::move(*file)));
}

StatusOr<std::unique_ptr<WritableFile>> FaultyEnv::NewWritableFile(const std::string& path) {
  auto file = Op(*state_, EnvOp::kNewWritable, Where{"open", path}, [&] { return base()->NewWritableFile(path); });
  if (!file.ok()) return file.status();
  return std::unique_ptr<WritableFile>(new FaultyWritableFile(state_, path, std::move(*file)));
}

StatusOr<std::unique_ptr<WritableFile>> FaultyEnv::NewAppendableFile(const std::string& path) {
  auto file =
      Op(*state_, EnvOp::kNewAppendable, Where{"open", path}, [&] { return base()->NewAppendableFile(path); });
  if (!file.ok()) return file.status();
  return std::unique_ptr<WritableFile>(new FaultyWritableFile(state_, path, std::move(*file)));
}

Status FaultyEnv::RenameFile(const std::string& from, const std::string& to) {
  const Where where{"rename", from, &to};
  Action a;
  FOREMAN_RETURN_IF_ERROR(state_->Before(EnvOp::kRename, where, nullptr, &a));
  return RunInBase(*state_, where, [&] { return base()->RenameFile(from, to); });
}

Status FaultyEnv::DeleteFile(const std::string& path) {
  return Op(*state_, EnvOp::kDelete, Where{"unlink", path}, [&] { return base()->DeleteFile(path); });
}

Status FaultyEnv::FileExists(const std::string& path) {
  return Op(*state_, EnvOp::kStat, Where{"stat", path}, [&] { return base()->FileExists(path); });
}

StatusOr<uint64_t> FaultyEnv::GetFileSize(const std::string& path) {
  return Op(*state_, EnvOp::kStat, Where{"stat", path}, [&] { return base()->GetFileSize(path); });
}

StatusOr<std::vector<std::string>> FaultyEnv::GetChildren(const std::string& dir) {
  return Op(*state_, EnvOp::kStat, Where{"opendir", dir}, [&] { return base()->GetChildren(dir); });
}

StatusOr<bool> FaultyEnv::IsDirectory(const std::string& path) {
  return Op(*state_, EnvOp::kStat, Where{"stat", path}, [&] { return base()->IsDirectory(path); });
}

Status FaultyEnv::CreateDir(const std::string& dir) {
  return Op(*state_, EnvOp::kCreateDir, Where{"mkdir", dir}, [&] { return base()->CreateDir(dir); });
}

Status FaultyEnv::RecursivelyCreateDir(const std::string& dir) {
  return Op(*state_, EnvOp::kCreateDir, Where{"mkdir", dir}, [&] { return base()->RecursivelyCreateDir(dir); });
}

Status FaultyEnv::DeleteDir(const std::string& dir) {
  return Op(*state_, EnvOp::kDeleteDir, Where{"rmdir", dir}, [&] { return base()->DeleteDir(dir); });
}

Status FaultyEnv::SyncDir(const std::string& dir) {
  return Op(*state_, EnvOp::kSyncDir, Where{"fsync", dir}, [&] { return base()->SyncDir(dir); });
}

StatusOr<std::unique_ptr<FileLock>> FaultyEnv::LockFile(const std::string& path) {
  return Op(*state_, EnvOp::kLock, Where{"lock", path}, [&] { return base()->LockFile(path); });
}

}  // namespace foreman
