// EnvWrapper (include/foreman/env.hpp) and FaultyEnv
// (include/foreman/fault.hpp): every fault kind injected through the Env API
// with its documented outcome, the errno -> code mapping shared with the
// POSIX Env, crash and recovery over MemEnv, determinism of probabilistic
// faults across threads, and the Saver's commit protocol under injected disk
// faults.
#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "foreman/bundle.hpp"
#include "foreman/checkpoint.hpp"
#include "foreman/clock.hpp"
#include "foreman/fault.hpp"
#include "foreman/mem_env.hpp"
#include "foreman/variable_store.hpp"
#include "support/gated_env.hpp"
#include "support/test_util.hpp"
#include "support/checkpoint_checks.hpp"

namespace foreman {
namespace {

using Kind = EnvFault::Kind;

EnvFault Fault(std::string id, std::string pattern, EnvOp op, Kind kind, int64_t nth) {
  EnvFault f;
  f.id = std::move(id);
  f.path_pattern = std::move(pattern);
  f.op = op;
  f.kind = kind;
  f.nth = nth;
  return f;
}

/// A file at `path` whose name is durable (its directory synced), holding `text` durably.
void WriteDurable(Env* env, const std::string& path, const std::string& text) {
  auto f = env->NewWritableFile(path);
  REQUIRE_MESSAGE(f.ok(), f.status().ToString());
  REQUIRE((*f)->Append(text).ok());
  REQUIRE((*f)->Sync().ok());
  REQUIRE((*f)->Close().ok());
  REQUIRE(env->SyncDir(Dirname(path)).ok());
}

std::string Read(Env* env, const std::string& path) {
  auto text = env->ReadFileToString(path);
  REQUIRE_MESSAGE(text.ok(), text.status().ToString());
  return *text;
}

// -- EnvWrapper -------------------------------------------------------------------------

/// Overrides one call; the rest must keep forwarding.
class NoDeleteEnv : public EnvWrapper {
 public:
  using EnvWrapper::EnvWrapper;
  Status DeleteFile(const std::string& path) override { return absl::PermissionDeniedError("no delete " + path); }
};

TEST_CASE("EnvWrapper forwards every call to its base; a subclass overrides only the one it names") {
  MemEnv mem;
  NoDeleteEnv env(&mem);
  CHECK(env.base() == &mem);
  REQUIRE(env.CreateDir("/d").ok());
  REQUIRE(env.RecursivelyCreateDir("/d/e/f").ok());
  REQUIRE(env.SyncDir("/d").ok());
  WriteDurable(&env, "/d/a", "abc");
  auto app = env.NewAppendableFile("/d/a");
  REQUIRE(app.ok());
  REQUIRE((*app)->Append("de").ok());
  REQUIRE((*app)->Close().ok());
  CHECK(Read(&mem, "/d/a") == "abcde");
  CHECK(Read(&env, "/d/a") == "abcde");
  auto raf = env.NewRandomAccessFile("/d/a");
  REQUIRE(raf.ok());
  char scratch[8];
  CHECK(*(*raf)->Read(1, 2, scratch) == "bc");
  CHECK(*env.GetFileSize("/d/a") == 5);
  CHECK(env.FileExists("/d/a").ok());
  CHECK(*env.IsDirectory("/d/e"));
  REQUIRE(env.RenameFile("/d/a", "/d/b").ok());
  CHECK(absl::IsNotFound(mem.FileExists("/d/a")));
  CHECK(*env.GetChildren("/d") == std::vector<std::string>{"b", "e"});
  CHECK(absl::IsPermissionDenied(env.DeleteFile("/d/b")));  // the override
  CHECK(mem.FileExists("/d/b").ok());
  REQUIRE(env.DeleteDir("/d/e/f").ok());
  CHECK(absl::IsNotFound(mem.FileExists("/d/e/f")));
  auto lock = env.LockFile("/d/lock");
  REQUIRE(lock.ok());
  CHECK(absl::IsFailedPrecondition(mem.LockFile("/d/lock").status()));  // the base holds it
}

TEST_CASE("GatedEnv is an EnvWrapper: what it does not gate reaches the base") {
  MemEnv mem;
  testing::GatedEnv gated(&mem);
  gated.Fail("x", absl::UnavailableError("gated"));
  CHECK(absl::IsUnavailable(gated.NewWritableFile("/x").status()));
  WriteDurable(&gated, "/y", "y");
  CHECK(Read(&mem, "/y") == "y");
}

// -- the draw ---------------------------------------------------------------------------

TEST_CASE("FaultDraw is a pure function in [0, 1) of each of its keys") {
  const double d = FaultDraw(7, "f", "/a", EnvOp::kAppend, 3);
  CHECK(d == FaultDraw(7, "f", "/a", EnvOp::kAppend, 3));
  CHECK(d >= 0.0);
  CHECK(d < 1.0);
  CHECK(d != FaultDraw(8, "f", "/a", EnvOp::kAppend, 3));
  CHECK(d != FaultDraw(7, "g", "/a", EnvOp::kAppend, 3));
  CHECK(d != FaultDraw(7, "f", "/b", EnvOp::kAppend, 3));
  CHECK(d != FaultDraw(7, "f", "/a", EnvOp::kSync, 3));
  CHECK(d != FaultDraw(7, "f", "/a", EnvOp::kAppend, 4));
  // Roughly uniform: 10 000 draws, mean near 1/2, a tenth below 0.1.
  double sum = 0;
  int below = 0;
  for (int i = 1; i <= 10000; ++i) {
    const double x = FaultDraw(1, "u", "/p", EnvOp::kAppend, i);
    sum += x;
    below += x < 0.1 ? 1 : 0;
  }
  CHECK(sum / 10000 == doctest::Approx(0.5).epsilon(0.02));
  CHECK(below == doctest::Approx(1000).epsilon(0.1));
}

// -- errors ---------------------------------------------------------------------------

TEST_CASE("an injected errno has the POSIX Env's code and message, plus the fault's id") {
  testing::TempDir dir;
  FaultyEnv env(Env::Default());
  EnvFault f = Fault("gone", "*/missing/*", EnvOp::kNewWritable, Kind::kError, 1);
  f.error = ENOENT;
  REQUIRE(env.AddFault(f).ok());
  // A real ENOENT from the POSIX Env (the directory does not exist)...
  const Status real = Env::Default()->NewWritableFile(dir / "missing/real").status();
  REQUIRE(absl::IsNotFound(real));
  // ...and an injected one, which the base would not have given.
  REQUIRE(Env::Default()->CreateDir(dir / "missing").ok());
  const Status injected = env.NewWritableFile(dir / "missing/real").status();
  CHECK(injected.code() == real.code());
  CHECK(std::string(injected.message()) == absl::StrCat(real.message(), " (injected fault gone)"));
  // The fault's id travels as a payload; a real error has none.
  CHECK(InjectedFaultId(injected) == std::optional<std::string>("gone"));
  CHECK_FALSE(InjectedFaultId(real).has_value());
  CHECK_FALSE(InjectedFaultId(absl::OkStatus()).has_value());
  CHECK(absl::IsNotFound(env.FileExists(dir / "missing/real")));  // nothing was created

  // The documented codes for the disk faults.
  const std::vector<std::pair<int, absl::StatusCode>> codes = {
      {EIO, absl::StatusCode::kInternal},           {ENOSPC, absl::StatusCode::kResourceExhausted},
      {EROFS, absl::StatusCode::kInternal},         {EACCES, absl::StatusCode::kPermissionDenied},
      {EPERM, absl::StatusCode::kPermissionDenied}, {EEXIST, absl::StatusCode::kAlreadyExists},
      {ENOTEMPTY, absl::StatusCode::kFailedPrecondition}, {0, absl::StatusCode::kInternal},  // 0: EIO
  };
  MemEnv mem;
  FaultyEnv faulty(&mem);
  for (const auto& entry : codes) {
    const int err = entry.first;
    const absl::StatusCode code = entry.second;
    CAPTURE(err);
    const std::string id = absl::StrCat("e", err);
    EnvFault e = Fault(id, "/f" + id, EnvOp::kSync, Kind::kError, 1);
    e.error = err;
    REQUIRE(faulty.AddFault(e).ok());
    auto file = faulty.NewWritableFile("/f" + id);
    REQUIRE(file.ok());
    const Status s = (*file)->Sync();
    CHECK(s.code() == code);
    CHECK(absl::StrContains(s.message(), "fdatasync /f" + id + ": "));
    CHECK(absl::EndsWith(s.message(), " (injected fault " + id + ")"));
  }
}

/// Runs one operation of every kind on `env` under /t, which holds file "a";
/// returns each operation's status by kind (kRead and kStat: the last of theirs).
std::map<EnvOp, Status> RunEveryOp(Env* env) {
  std::map<EnvOp, Status> s;
  auto w = env->NewWritableFile("/t/a");
  s[EnvOp::kNewWritable] = w.status();
  auto a = env->NewAppendableFile("/t/b");
  s[EnvOp::kNewAppendable] = a.status();
  if (a.ok()) {
    s[EnvOp::kAppend] = (*a)->Append("x");
    s[EnvOp::kFlush] = (*a)->Flush();
    s[EnvOp::kSync] = (*a)->Sync();
    s[EnvOp::kClose] = (*a)->Close();
  }
  s[EnvOp::kRename] = env->RenameFile("/t/b", "/t/c");
  s[EnvOp::kDelete] = env->DeleteFile("/t/c");
  s[EnvOp::kCreateDir] = env->CreateDir("/t/d");
  s[EnvOp::kSyncDir] = env->SyncDir("/t");
  s[EnvOp::kDeleteDir] = env->DeleteDir("/t/d");
  s[EnvOp::kRead] = env->ReadFileToString("/t/a").status();
  s[EnvOp::kStat] = env->FileExists("/t/a");
  s[EnvOp::kLock] = env->LockFile("/t/lock").status();
  return s;
}

TEST_CASE("a fault matches only its operation kind and path pattern; kAny matches every kind") {
  for (int k = 1; k < kNumEnvOps; ++k) {
    const EnvOp op = static_cast<EnvOp>(k);
    const std::string op_name = EnvOpName(op);
    CAPTURE(op_name);
    MemEnv mem;
    REQUIRE(mem.CreateDir("/t").ok());
    FaultyEnv env(&mem);
    EnvFault f = Fault("op", "/t*", op, Kind::kError, 1);
    f.repeat = true;
    REQUIRE(env.AddFault(f).ok());
    REQUIRE(env.AddFault(Fault("elsewhere", "/u/*", EnvOp::kAny, Kind::kError, 1)).ok());
    const std::map<EnvOp, Status> got = RunEveryOp(&env);
    for (const auto& [other, status] : got) {
      const std::string other_name = EnvOpName(other);
      CAPTURE(other_name);
      if (other == op) {
        CHECK(absl::IsInternal(status));
        CHECK(absl::StrContains(status.message(), "(injected fault op)"));
      } else {  // may fail because the faulted one did not run, but not injected
        CHECK_FALSE(absl::StrContains(status.message(), "injected"));
      }
    }
    REQUIRE(env.fired().size() == 1);
    CHECK(env.fired()[0].op == op);
    CHECK(env.fired()[0].op_index == 1);
  }
  MemEnv mem;
  REQUIRE(mem.CreateDir("/t").ok());
  FaultyEnv env(&mem);
  EnvFault any = Fault("any", "/t*", EnvOp::kAny, Kind::kError, 1);
  any.repeat = true;
  REQUIRE(env.AddFault(any).ok());
  for (const auto& [op, status] : RunEveryOp(&env)) {
    const std::string op_name = EnvOpName(op);
    CAPTURE(op_name);
    CHECK(absl::IsInternal(status));
  }
}

TEST_CASE("kRead, kStat and kCreateDir cover every call of their kind; a rename matches either name") {
  MemEnv mem;
  WriteDurable(&mem, "/r", "abc");
  FaultyEnv env(&mem);
  EnvFault read = Fault("read", "/r", EnvOp::kRead, Kind::kError, 1);
  read.repeat = true;
  REQUIRE(env.AddFault(read).ok());
  CHECK(absl::IsInternal(env.ReadFileToString("/r").status()));
  CHECK(absl::IsInternal(env.NewRandomAccessFile("/r").status()));
  env.RemoveFault("read");
  auto raf = env.NewRandomAccessFile("/r");
  REQUIRE(raf.ok());
  REQUIRE(env.AddFault(Fault("pread", "/r", EnvOp::kRead, Kind::kError, 1)).ok());
  char scratch[4];
  const auto got = (*raf)->Read(0, 3, scratch);
  CHECK(absl::IsInternal(got.status()));
  CHECK(std::string(got.status().message()) == "pread /r: Input/output error (injected fault pread)");
  CHECK(*(*raf)->Read(0, 3, scratch) == "abc");  // fired once

  EnvFault stat = Fault("stat", "*", EnvOp::kStat, Kind::kError, 1);
  stat.repeat = true;
  REQUIRE(env.AddFault(stat).ok());
  CHECK(absl::IsInternal(env.FileExists("/r")));
  CHECK(absl::IsInternal(env.GetFileSize("/r").status()));
  CHECK(absl::IsInternal(env.IsDirectory("/r").status()));
  CHECK(absl::IsInternal(env.GetChildren("/").status()));
  REQUIRE(env.AddFault(Fault("mkdir", "/x*", EnvOp::kCreateDir, Kind::kError, 2)).ok());
  CHECK(env.CreateDir("/x").ok());
  CHECK(absl::IsInternal(env.RecursivelyCreateDir("/x/y/z")));
  CHECK(absl::IsNotFound(mem.FileExists("/x/y")));
  REQUIRE(env.AddFault(Fault("onto", "/renamed", EnvOp::kRename, Kind::kError, 1)).ok());
  const Status renamed = env.RenameFile("/r", "/renamed");
  CHECK(std::string(renamed.message()) == "rename /r to /renamed: Input/output error (injected fault onto)");
  CHECK(mem.FileExists("/r").ok());

  std::vector<std::tuple<std::string, std::string, EnvOp, int64_t>> fired;
  for (const FiredFault& f : env.fired()) fired.emplace_back(f.id, f.path, f.op, f.op_index);
  const std::vector<std::tuple<std::string, std::string, EnvOp, int64_t>> expected = {
      {"read", "/r", EnvOp::kRead, 1},      {"read", "/r", EnvOp::kRead, 2},    {"pread", "/r", EnvOp::kRead, 4},
      {"stat", "/r", EnvOp::kStat, 1},      {"stat", "/r", EnvOp::kStat, 2},    {"stat", "/r", EnvOp::kStat, 3},
      {"stat", "/", EnvOp::kStat, 1},       {"mkdir", "/x/y/z", EnvOp::kCreateDir, 1},
      {"onto", "/renamed", EnvOp::kRename, 1},
  };
  CHECK(fired == expected);
}

TEST_CASE("nth fires once at the nth matching operation; with repeat at every later one too") {
  MemEnv mem;
  FaultyEnv env(&mem);
  REQUIRE(env.AddFault(Fault("once", "/once", EnvOp::kAppend, Kind::kError, 3)).ok());
  EnvFault full = Fault("full", "/full", EnvOp::kAppend, Kind::kError, 3);
  full.error = ENOSPC;
  full.repeat = true;
  REQUIRE(env.AddFault(full).ok());
  auto once = env.NewWritableFile("/once");
  auto stays = env.NewWritableFile("/full");
  REQUIRE(once.ok());
  REQUIRE(stays.ok());
  std::vector<bool> once_ok;
  std::vector<bool> full_ok;
  for (int i = 0; i < 5; ++i) {
    once_ok.push_back((*once)->Append("1").ok());
    const Status s = (*stays)->Append("1");
    full_ok.push_back(s.ok());
    if (!s.ok()) CHECK(absl::IsResourceExhausted(s));
  }
  CHECK(once_ok == std::vector<bool>{true, true, false, true, true});
  CHECK(full_ok == std::vector<bool>{true, true, false, false, false});
  CHECK((*once)->Size() == 4);  // the failed append wrote nothing
  const std::vector<FiredFault> fired = env.fired();
  REQUIRE(fired.size() == 4);
  CHECK(fired[0].id == "once");
  CHECK(fired[0].path == "/once");
  CHECK(fired[0].op == EnvOp::kAppend);
  CHECK(fired[0].op_index == 3);
  CHECK(fired[3].id == "full");
  CHECK(fired[3].op_index == 5);
}

TEST_CASE("a fault MarkFired by an earlier process does not fire again unless it repeats") {
  MemEnv mem;
  FaultyEnv env(&mem);
  REQUIRE(env.AddFault(Fault("once", "*", EnvOp::kSyncDir, Kind::kError, 1)).ok());
  EnvFault rep = Fault("again", "/r", EnvOp::kSyncDir, Kind::kError, 1);
  rep.repeat = true;
  REQUIRE(env.AddFault(rep).ok());
  env.MarkFired({FiredFault{"once", "/", EnvOp::kSyncDir, 1}, FiredFault{"again", "/r", EnvOp::kSyncDir, 1}});
  CHECK(env.SyncDir("/").ok());
  REQUIRE(mem.CreateDir("/r").ok());
  CHECK(absl::IsInternal(env.SyncDir("/r")));
  CHECK(env.fired().size() == 1);
}

TEST_CASE("on_fire is called once per firing, on the firing thread, after fired() has it, before it takes effect") {
  MemEnv mem;
  ManualClock clock;
  FaultyEnv env(&mem, 0, &clock);
  EnvFault full = Fault("full", "/f", EnvOp::kAppend, Kind::kError, 2);
  full.error = ENOSPC;
  REQUIRE(env.AddFault(full).ok());
  EnvFault slow = Fault("slow", "/f", EnvOp::kSync, Kind::kLatency, 1);
  slow.latency = absl::Seconds(3);
  REQUIRE(env.AddFault(slow).ok());
  struct Seen {
    FiredFault fault;
    std::size_t fired_size;     // env.fired() inside the observer (no lock is held)
    absl::Duration clock_time;  // the latency not slept yet
    std::thread::id thread;
  };
  std::vector<Seen> seen;
  env.set_on_fire([&](const FiredFault& f) {
    seen.push_back(Seen{f, env.fired().size(), clock.MonotonicNow(), std::this_thread::get_id()});
  });
  auto file = env.NewWritableFile("/f");
  REQUIRE(file.ok());
  REQUIRE((*file)->Append("ab").ok());
  REQUIRE((*file)->Flush().ok());
  const Status failed = (*file)->Append("cd");
  CHECK(absl::IsResourceExhausted(failed));
  REQUIRE(seen.size() == 1);
  CHECK(seen[0].fault.id == "full");
  CHECK(seen[0].fault.path == "/f");
  CHECK(seen[0].fault.op == EnvOp::kAppend);
  CHECK(seen[0].fault.op_index == 2);
  CHECK(seen[0].fired_size == 1);
  CHECK(seen[0].thread == std::this_thread::get_id());
  // The latency fault: the observer runs on the syncing thread before the sleep.
  const absl::Duration start = clock.MonotonicNow();
  std::thread::id syncer_id;
  std::thread syncer([&] {
    syncer_id = std::this_thread::get_id();
    CHECK((*file)->Sync().ok());
  });
  REQUIRE(clock.BlockUntilWaiters(1, testing::kRealTimeout));
  clock.Advance(absl::Seconds(3));
  syncer.join();
  REQUIRE(seen.size() == 2);
  CHECK(seen[1].fault.id == "slow");
  CHECK(seen[1].clock_time == start);
  CHECK(seen[1].thread == syncer_id);
  CHECK(seen[1].fired_size == 2);
  // Without an observer nothing is called; a non-repeat fault does not fire again.
  env.set_on_fire(nullptr);
  CHECK((*file)->Append("ef").ok());
  CHECK(seen.size() == 2);
  CHECK(env.fired().size() == 2);
}

TEST_CASE("probability: a matching operation fires exactly when its draw is below p") {
  MemEnv mem;
  FaultyEnv env(&mem, /*seed=*/11);
  EnvFault f = Fault("coin", "/p*", EnvOp::kAppend, Kind::kError, 0);
  f.probability = 0.3;
  f.repeat = true;
  REQUIRE(env.AddFault(f).ok());
  EnvFault never = Fault("never", "*", EnvOp::kAny, Kind::kError, 0);
  REQUIRE(env.AddFault(never).ok());  // probability 0
  auto file = env.NewWritableFile("/p1");
  REQUIRE(file.ok());
  int fired = 0;
  for (int i = 1; i <= 200; ++i) {
    CAPTURE(i);
    const bool expected = FaultDraw(11, "coin", "/p1", EnvOp::kAppend, i) < 0.3;
    CHECK((*file)->Append("x").ok() == !expected);
    fired += expected ? 1 : 0;
  }
  CHECK(fired > 30);
  CHECK(fired < 90);
  CHECK(static_cast<int>(env.fired().size()) == fired);

  // Without repeat: the first operation whose draw is below p, and no other.
  FaultyEnv once(&mem, 11);
  f.repeat = false;
  REQUIRE(once.AddFault(f).ok());
  auto g = once.NewWritableFile("/p2");
  REQUIRE(g.ok());
  int first = 0;
  for (int i = 1; first == 0; ++i) {
    if (FaultDraw(11, "coin", "/p2", EnvOp::kAppend, i) < 0.3) first = i;
  }
  for (int i = 1; i <= first + 50; ++i) CHECK((*g)->Append("x").ok() == (i != first));
  REQUIRE(once.fired().size() == 1);
  CHECK(once.fired()[0].op_index == first);
}

TEST_CASE("AddFault rejects a malformed fault, naming it and the field") {
  MemEnv mem;
  FaultyEnv env(&mem);
  auto rejects = [&](EnvFault f, const std::string& field) {
    CAPTURE(field);
    const Status s = env.AddFault(f);
    CHECK(absl::IsInvalidArgument(s));
    CHECK(absl::StrContains(s.message(), field));
  };
  EnvFault ok = Fault("f", "*", EnvOp::kAppend, Kind::kError, 1);
  EnvFault f = ok;
  f.id = "";
  rejects(f, "id is empty");
  f = ok;
  f.id = "disk\nfull";  // would be logged raw, as two lines
  rejects(f, R"(FaultyEnv::AddFault: id "disk\nfull" has a control character (0x0a) at byte 4)");
  f.id = std::string("nul\0", 4);
  rejects(f, R"(id "nul\000" has a control character (0x00) at byte 3)");
  f.id = "del\x7f";
  rejects(f, "(0x7f) at byte 3");
  f = ok;
  f.nth = -1;
  rejects(f, "'f': nth -1");
  f = ok;
  f.probability = 1.5;
  rejects(f, "probability 1.5");
  f = ok;
  f.kind = Kind::kLatency;
  f.latency = absl::Milliseconds(-1);
  rejects(f, "latency -1ms");
  f = ok;
  f.error = -5;
  rejects(f, "error -5");
  f = ok;
  f.prefix_bytes = -2;
  rejects(f, "prefix_bytes -2");
  f = ok;
  f.kind = Kind::kShortWrite;
  f.op = EnvOp::kSync;
  rejects(f, "not sync");
  f = ok;
  f.op = static_cast<EnvOp>(99);
  rejects(f, "op 99");
  REQUIRE(env.AddFault(ok).ok());
  CHECK(absl::IsAlreadyExists(env.AddFault(ok)));
  env.RemoveFault("f");
  CHECK(env.AddFault(ok).ok());
  env.ClearFaults();
  auto file = env.NewWritableFile("/x");
  REQUIRE(file.ok());
  CHECK((*file)->Append("x").ok());  // nothing armed

  FaultyEnv posix(Env::Default());
  CHECK(absl::IsFailedPrecondition(posix.AddFault(Fault("c", "*", EnvOp::kAny, Kind::kCrash, 1))));
}

TEST_CASE("AddFault rejects an unbounded latency, and a torn write with no MemEnv to crash") {
  MemEnv mem;
  FaultyEnv env(&mem);
  EnvFault slow = Fault("slow", "*", EnvOp::kSync, Kind::kLatency, 1);
  slow.latency = absl::InfiniteDuration();
  Status s = env.AddFault(slow);
  CHECK(absl::IsInvalidArgument(s));
  CHECK_MESSAGE(absl::StrContains(s.message(), "'slow': latency inf > 1h"), s.message());
  slow.latency = absl::Hours(1) + absl::Nanoseconds(1);
  CHECK(absl::IsInvalidArgument(env.AddFault(slow)));
  slow.latency = absl::Hours(1);
  CHECK(env.AddFault(slow).ok());

  FaultyEnv posix(Env::Default());
  s = posix.AddFault(Fault("torn", "*", EnvOp::kAppend, Kind::kTornWrite, 1));
  CHECK(absl::IsFailedPrecondition(s));
  CHECK_MESSAGE(absl::StrContains(s.message(), "'torn': a torn write only has an effect through a crash"),
                s.message());
  CHECK(env.AddFault(Fault("torn", "*", EnvOp::kAppend, Kind::kTornWrite, 1)).ok());  // over a MemEnv
}

TEST_CASE("a non-repeat nth fault shadowed at its nth match by an earlier-armed fault fires at the next match") {
  MemEnv mem;
  FaultyEnv env(&mem);
  REQUIRE(env.AddFault(Fault("first", "/x", EnvOp::kAppend, Kind::kError, 1)).ok());
  EnvFault second = Fault("second", "/x", EnvOp::kAppend, Kind::kError, 1);
  second.error = ENOSPC;
  REQUIRE(env.AddFault(second).ok());
  auto file = env.NewWritableFile("/x");
  REQUIRE(file.ok());
  const Status a1 = (*file)->Append("1");
  const Status a2 = (*file)->Append("2");
  const Status a3 = (*file)->Append("3");
  CHECK(absl::IsInternal(a1));  // "first" (EIO) decided the 1st append
  CHECK(absl::IsResourceExhausted(a2));  // "second" was pending and fires now
  CHECK(a3.ok());
  const std::vector<FiredFault> fired = env.fired();
  REQUIRE(fired.size() == 2);
  CHECK(fired[0].id == "first");
  CHECK(fired[0].op_index == 1);
  CHECK(fired[1].id == "second");
  CHECK(fired[1].op_index == 2);
}

// -- canonical paths ------------------------------------------------------------------------

/// The fired faults as sorted (id, path, op, op_index) points.
using Point = std::tuple<std::string, std::string, EnvOp, int64_t>;

std::vector<Point> Points(const std::vector<FiredFault>& fired) {
  std::vector<Point> out;
  for (const FiredFault& f : fired) out.emplace_back(f.id, f.path, f.op, f.op_index);
  std::sort(out.begin(), out.end());
  return out;
}


TEST_CASE("CanonicalPath strips exactly a trailing .tempstate<digits> or .tmp<digits>-<digits>") {
  CHECK(FaultyEnv::CanonicalPath("/c/model.ckpt-2.data-00000-of-00001.tempstate1234567890123") ==
        "/c/model.ckpt-2.data-00000-of-00001");
  CHECK(FaultyEnv::CanonicalPath("/c/model.ckpt-2.index.tempstate7") == "/c/model.ckpt-2.index");
  CHECK(FaultyEnv::CanonicalPath("/c/checkpoint.tmp4242-17") == "/c/checkpoint");
  // Anything else is unchanged.
  for (const char* kept : {"/c/model.ckpt-2.index", "/c/a.tempstate", "/c/a.tempstate12x", "/c/a.tempstate12/b",
                           "/c/checkpoint.tmp", "/c/checkpoint.tmp12", "/c/checkpoint.tmp12-", "/c/a.tmp-3",
                           "/c/a.tmp1-2x", "/tmp1-2/a", ""}) {
    CAPTURE(kept);
    CHECK(FaultyEnv::CanonicalPath(kept) == kept);
  }
}

/// Under `root` through a FaultyEnv keyed there (set_key_root): a
/// checkpoint temporary, two event files of one directory (names of two
/// different seconds) and a file outside the root, 30 appends each, with a
/// probabilistic EIO; returns the fired points.
std::vector<FiredFault> FiredUnder(const std::string& root, const std::vector<std::string>& event_names) {
  MemEnv mem;
  FaultyEnv env(&mem, /*seed=*/5);
  env.set_key_root(root + "/");  // a trailing '/' is the same root
  EnvFault f;
  f.id = "eio";
  f.op = EnvOp::kAppend;
  f.probability = 0.1;
  f.repeat = true;
  REQUIRE(env.AddFault(f).ok());
  REQUIRE(env.RecursivelyCreateDir(root + "/eval").ok());
  REQUIRE(env.RecursivelyCreateDir("/outside").ok());
  for (const std::string& path : {root + "/model.ckpt-1.index.tempstate" + std::to_string(root.size()),
                                  root + "/eval/" + event_names[0], root + "/eval/" + event_names[1],
                                  std::string("/outside/data")}) {
    auto file = env.NewWritableFile(path);
    REQUIRE(file.ok());
    for (int i = 0; i < 30; ++i) (*file)->Append("x").IgnoreError();
  }
  return env.fired();
}

TEST_CASE("set_key_root: draws and fired paths are keyed under the run directory, event files by their ordinal") {
  const std::vector<FiredFault> a =
      FiredUnder("/work/a/run", {"events.out.tfevents.1700000000.host1", "events.out.tfevents.1700000009.host1"});
  const std::vector<FiredFault> b = FiredUnder(
      "/elsewhere/b/run", {"events.out.tfevents.1800000000.other", "events.out.tfevents.1800000001.other"});
  REQUIRE(!a.empty());
  CHECK(Points(a) == Points(b));
  std::set<std::string> paths;
  for (const FiredFault& f : a) paths.insert(f.path);
  for (const std::string& p : paths) {
    CAPTURE(p);
    CHECK((p == "model.ckpt-1.index" || p == "eval/events.out.tfevents.#0" || p == "eval/events.out.tfevents.#1" ||
           p == "/outside/data"));
  }
}

/// Writes, through `env`, a bundle data temporary and a state-file temporary
/// with the given suffixes, 40 appends each, then renames them; returns the
/// fired faults.
std::vector<FiredFault> WriteTemporaries(FaultyEnv* env, const std::string& tempstate, const std::string& tmp) {
  REQUIRE(env->RecursivelyCreateDir("/c").ok());
  const std::string data = "/c/m-1.data-00000-of-00001.tempstate" + tempstate;
  const std::string state = "/c/checkpoint.tmp" + tmp;
  for (const std::string& path : {data, state}) {
    auto file = env->NewWritableFile(path);
    REQUIRE(file.ok());
    for (int i = 0; i < 40; ++i) (*file)->Append("x").IgnoreError();
    (*file)->Close().IgnoreError();
  }
  env->RenameFile(data, "/c/m-1.data-00000-of-00001").IgnoreError();
  env->RenameFile(state, "/c/checkpoint").IgnoreError();
  return env->fired();
}

TEST_CASE("the same seed fires at the same canonical (path, op index) points whatever the temporaries' suffixes") {
  auto run = [](const std::string& tempstate, const std::string& tmp) {
    MemEnv mem;
    FaultyEnv env(&mem, /*seed=*/7);
    EnvFault coin = Fault("coin", "*", EnvOp::kAppend, Kind::kError, 0);
    coin.probability = 0.5;
    coin.repeat = true;
    REQUIRE(env.AddFault(coin).ok());
    EnvFault ren = Fault("ren", "*/checkpoint*", EnvOp::kRename, Kind::kError, 0);
    ren.probability = 1;
    REQUIRE(env.AddFault(ren).ok());
    return WriteTemporaries(&env, tempstate, tmp);
  };
  const auto a = run("1234567890", "100-0");
  const auto b = run("987", "4242-17");
  CHECK(Points(a) == Points(b));
  int appends = 0;
  for (const FiredFault& f : a) {
    CAPTURE(f.path);
    CHECK((f.path == "/c/m-1.data-00000-of-00001" || f.path == "/c/checkpoint"));  // no suffix recorded
    if (f.op == EnvOp::kAppend) {
      ++appends;
      CHECK(FaultDraw(7, "coin", f.path, EnvOp::kAppend, f.op_index) < 0.5);
    }
    if (f.op == EnvOp::kRename) CHECK(f.op_index == 1);  // the temporary and its target count once
  }
  CHECK(appends > 10);
  CHECK(appends < 70);
}

// -- short and torn writes, latency --------------------------------------------------------

TEST_CASE("a short write appends a prefix, then fails as a full disk does") {
  MemEnv mem;
  FaultyEnv env(&mem);
  EnvFault f = Fault("short", "/s", EnvOp::kAppend, Kind::kShortWrite, 2);
  f.prefix_bytes = 3;
  REQUIRE(env.AddFault(f).ok());
  auto file = env.NewWritableFile("/s");
  REQUIRE(file.ok());
  REQUIRE((*file)->Append("0123").ok());
  const Status s = (*file)->Append("abcdef");
  CHECK(absl::IsResourceExhausted(s));
  CHECK(absl::StrContains(s.message(), "write /s: No space left on device (injected fault short)"));
  CHECK((*file)->Size() == 7);
  REQUIRE((*file)->Close().ok());
  CHECK(Read(&mem, "/s") == "0123abc");

  // Default prefix: half of the append.
  FaultyEnv half(&mem);
  REQUIRE(half.AddFault(Fault("half", "/h", EnvOp::kAppend, Kind::kShortWrite, 1)).ok());
  auto h = half.NewWritableFile("/h");
  REQUIRE(h.ok());
  CHECK(absl::IsResourceExhausted((*h)->Append("abcde")));
  CHECK(Read(&mem, "/h") == "ab");
}

TEST_CASE("a torn write returns OK and reads whole, but a crash before the next sync keeps only its prefix") {
  for (const bool sync_after : {false, true}) {
    CAPTURE(sync_after);
    MemEnv mem;
    FaultyEnv env(&mem);
    EnvFault f = Fault("torn", "/t", EnvOp::kAppend, Kind::kTornWrite, 2);
    f.prefix_bytes = 4;
    REQUIRE(env.AddFault(f).ok());
    auto file = env.NewWritableFile("/t");
    REQUIRE(file.ok());
    REQUIRE(env.SyncDir("/").ok());
    REQUIRE((*file)->Append("head|").ok());
    REQUIRE((*file)->Append("torn-record").ok());
    CHECK((*file)->Size() == 16);
    CHECK(Read(&env, "/t") == "head|torn-record");
    if (sync_after) REQUIRE((*file)->Sync().ok());
    REQUIRE(env.Crash().ok());
    env.Recover();
    CHECK(Read(&env, "/t") == (sync_after ? "head|torn-record" : "head|torn"));
  }
}

TEST_CASE("latency delays the operation by exactly its duration on the FaultyEnv's clock") {
  MemEnv mem;
  ManualClock clock;
  FaultyEnv env(&mem, 0, &clock);
  EnvFault f = Fault("slow", "/slow", EnvOp::kSync, Kind::kLatency, 1);
  f.latency = absl::Seconds(7);
  REQUIRE(env.AddFault(f).ok());
  auto file = env.NewWritableFile("/slow");
  REQUIRE(file.ok());
  REQUIRE(env.SyncDir("/").ok());
  REQUIRE((*file)->Append("x").ok());
  const absl::Duration start = clock.MonotonicNow();
  absl::Duration done_at = absl::InfiniteDuration();
  Status synced = absl::UnknownError("not run");
  std::thread syncer([&] {
    synced = (*file)->Sync();
    done_at = clock.MonotonicNow();
  });
  REQUIRE(clock.BlockUntilWaiters(1, testing::kRealTimeout));
  clock.Advance(absl::Seconds(6));
  CHECK(clock.waiters() == 1);  // still waiting
  clock.Advance(absl::Seconds(1));
  syncer.join();
  CHECK(synced.ok());
  CHECK(done_at - start == absl::Seconds(7));
  REQUIRE(env.Crash().ok());
  env.Recover();
  CHECK(Read(&env, "/slow") == "x");  // the delayed sync did run
}

// -- crash ----------------------------------------------------------------------------------

TEST_CASE("Crash drops what was not durable and fails every operation CANCELLED until Recover") {
  MemEnv mem;
  FaultyEnv env(&mem);
  WriteDurable(&env, "/durable", "kept");
  auto open = env.NewWritableFile("/volatile");
  REQUIRE(open.ok());
  REQUIRE((*open)->Append("lost").ok());
  REQUIRE(env.Crash().ok());
  CHECK(env.crashed());
  CHECK(absl::IsCancelled(env.ReadFileToString("/durable").status()));
  CHECK(absl::IsCancelled(env.NewWritableFile("/new").status()));
  CHECK(absl::IsCancelled(env.SyncDir("/")));
  const Status s = (*open)->Append("more");
  CHECK(absl::IsCancelled(s));
  CHECK(absl::StrContains(s.message(), "write /volatile: simulated crash"));
  CHECK_FALSE(InjectedFaultId(s).has_value());  // Crash() called by hand: no fault to name
  CHECK(absl::IsNotFound(mem.FileExists("/new")));  // the refused create changed nothing
  env.Recover();
  CHECK_FALSE(env.crashed());
  CHECK(Read(&env, "/durable") == "kept");
  CHECK(absl::IsNotFound(env.FileExists("/volatile")));  // its name was never made durable
  CHECK(absl::IsFailedPrecondition((*open)->Append("x")));  // a handle from before the crash
}

TEST_CASE("a kCrash fault crashes at its operation, which does not run") {
  MemEnv mem;
  FaultyEnv env(&mem);
  REQUIRE(env.AddFault(Fault("power", "/f", EnvOp::kSync, Kind::kCrash, 2)).ok());
  auto file = env.NewWritableFile("/f");
  REQUIRE(file.ok());
  REQUIRE(env.SyncDir("/").ok());
  REQUIRE((*file)->Append("one").ok());
  REQUIRE((*file)->Sync().ok());
  REQUIRE((*file)->Append("two").ok());
  const Status s = (*file)->Sync();
  CHECK(absl::IsCancelled(s));
  CHECK(absl::StrContains(s.message(), "(injected fault power)"));
  CHECK(InjectedFaultId(s) == std::optional<std::string>("power"));
  // The later refusals name no fault (as after a Crash() by hand).
  CHECK_FALSE(InjectedFaultId(env.FileExists("/f")).has_value());
  CHECK(env.crashed());
  env.Recover();
  CHECK(Read(&env, "/f") == "one");
  REQUIRE(env.fired().size() == 1);
  CHECK(env.fired()[0].op_index == 2);
}

TEST_CASE("Crash reaches a MemEnv under other EnvWrappers, and needs one") {
  MemEnv mem;
  testing::GatedEnv gated(&mem);
  FaultyEnv env(&gated);
  auto file = env.NewWritableFile("/g");
  REQUIRE(file.ok());
  REQUIRE(env.Crash().ok());
  env.Recover();
  CHECK(absl::IsNotFound(mem.FileExists("/g")));

  FaultyEnv posix(Env::Default());
  const Status s = posix.Crash();
  CHECK(absl::IsFailedPrecondition(s));
  CHECK(absl::StrContains(s.message(), "only supported over a MemEnv"));
  CHECK_FALSE(posix.crashed());
}

// -- determinism across threads ----------------------------------------------------------------


/// Two writers append 300 records each to their own files through one
/// FaultyEnv with seed 5; `order` 0: A then B, 1: B then A, 2: concurrently.
std::vector<Point> RunWriters(int order) {
  MemEnv mem;
  FaultyEnv env(&mem, 5);
  EnvFault coin = Fault("coin", "/w/*", EnvOp::kAppend, Kind::kError, 0);
  coin.probability = 0.1;
  coin.repeat = true;
  REQUIRE(env.AddFault(coin).ok());
  EnvFault a_once = Fault("a-once", "/w/a", EnvOp::kAppend, Kind::kShortWrite, 0);
  a_once.probability = 0.05;
  REQUIRE(env.AddFault(a_once).ok());
  REQUIRE(env.CreateDir("/w").ok());
  std::atomic<int> ready{order == 2 ? 2 : 0};
  auto writer = [&](const std::string& path) {
    auto file = env.NewWritableFile(path);
    if (ready.fetch_sub(1) > 0) {  // concurrent: both start appending together (or after 10 s)
      const absl::Time deadline = absl::Now() + testing::kRealTimeout;
      while (ready.load() > 0 && absl::Now() < deadline) std::this_thread::yield();
    }
    REQUIRE(file.ok());
    for (int i = 0; i < 300; ++i) (*file)->Append("record").IgnoreError();
  };
  if (order == 2) {
    std::thread a(writer, "/w/a");
    std::thread b(writer, "/w/b");
    a.join();
    b.join();
  } else {
    writer(order == 0 ? "/w/a" : "/w/b");
    writer(order == 0 ? "/w/b" : "/w/a");
  }
  return Points(env.fired());
}

TEST_CASE("the same seed and faults fire at the same (path, operation index) however threads interleave") {
  const std::vector<Point> sequential = RunWriters(0);
  CHECK(sequential.size() > 40);  // ~60 coin faults and one a-once
  CHECK(RunWriters(1) == sequential);
  for (int rep = 0; rep < 3; ++rep) CHECK(RunWriters(2) == sequential);
  // And they are the points the draw names.
  int64_t coin = 0;
  for (const char* path : {"/w/a", "/w/b"}) {
    for (int i = 1; i <= 300; ++i) coin += FaultDraw(5, "coin", path, EnvOp::kAppend, i) < 0.1 ? 1 : 0;
  }
  CHECK(std::count_if(sequential.begin(), sequential.end(),
                      [](const Point& p) { return std::get<0>(p) == "coin"; }) == coin);
}

// -- the Saver's commit protocol under injected faults ----------------------------------------

constexpr char kDir[] = "/ckpt";
constexpr char kPrefix[] = "/ckpt/model.ckpt";

void CreateVars(VariableStore* vars) {
  REQUIRE(vars->Create("w", Tensor(DataType::kFloat, {3})).ok());
  REQUIRE(CreateGlobalStep(*vars).ok());
}

void Fill(VariableStore* vars, int64_t step) {
  const float s = static_cast<float>(step);
  REQUIRE(vars->Assign("w", *Tensor::FromVector<float>({s, s + 1, s + 2}, {3})).ok());
  REQUIRE(SetGlobalStep(*vars, step).ok());
}

/// `prefix` verifies, restores, and holds step `step`'s values.
void CheckRestores(Env* env, const std::string& prefix, int64_t step) {
  testing::CheckRestores(env, prefix, step, CreateVars, Fill);
}

/// A Saver on `env` that has saved step 1 (durably).
std::unique_ptr<Saver> SavedStep1(Env* env, VariableStore* vars, ManualClock* clock) {
  REQUIRE(env->RecursivelyCreateDir(kDir).ok());
  SaverOptions o;
  o.env = env;
  o.clock = clock;
  auto saver = Saver::Create(o);
  REQUIRE(saver.ok());
  CreateVars(vars);
  Fill(vars, 1);
  REQUIRE((*saver)->Save(*vars, kPrefix, 1).ok());
  return std::move(*saver);
}

TEST_CASE("ENOSPC appending a checkpoint's data file: the save fails RESOURCE_EXHAUSTED naming it; step 1 restores") {
  MemEnv mem;
  ManualClock clock;
  FaultyEnv env(&mem);
  VariableStore vars;
  std::unique_ptr<Saver> saver = SavedStep1(&env, &vars, &clock);
  EnvFault full = Fault("disk-full", "*.data-*", EnvOp::kAppend, Kind::kError, 1);
  full.error = ENOSPC;
  full.repeat = true;
  REQUIRE(env.AddFault(full).ok());
  Fill(&vars, 2);
  const auto saved = saver->Save(vars, kPrefix, 2);
  REQUIRE_FALSE(saved.ok());
  CHECK(absl::IsResourceExhausted(saved.status()));
  // The message names the real file, the bundle writer's temporary (as the doc says).
  CHECK(absl::StrContains(saved.status().message(), "write /ckpt/model.ckpt-2.data-00000-of-00001.tempstate"));
  REQUIRE(!env.fired().empty());
  CHECK(env.fired()[0].path == "/ckpt/model.ckpt-2.data-00000-of-00001");  // the record: canonical
  env.ClearFaults();
  auto latest = LatestCheckpoint(&env, kDir);
  REQUIRE(latest.ok());
  REQUIRE(latest->has_value());
  CHECK(**latest == "/ckpt/model.ckpt-1");
  CheckRestores(&env, **latest, 1);
  REQUIRE(env.Crash().ok());  // and after a power cut too
  env.Recover();
  CHECK(**LatestCheckpoint(&env, kDir) == "/ckpt/model.ckpt-1");
  CheckRestores(&env, "/ckpt/model.ckpt-1", 1);
}

TEST_CASE("a failing fsync of the state file's temporary leaves the old state file intact") {
  MemEnv mem;
  ManualClock clock;
  FaultyEnv env(&mem);
  VariableStore vars;
  std::unique_ptr<Saver> saver = SavedStep1(&env, &vars, &clock);
  const std::string before = Read(&env, "/ckpt/checkpoint");
  REQUIRE(env.AddFault(Fault("fsync", "/ckpt/checkpoint.tmp*", EnvOp::kSync, Kind::kError, 1)).ok());
  Fill(&vars, 2);
  const auto saved = saver->Save(vars, kPrefix, 2);
  REQUIRE_FALSE(saved.ok());
  CHECK(absl::IsInternal(saved.status()));
  CHECK(absl::StrContains(saved.status().message(), "fdatasync /ckpt/checkpoint.tmp"));
  CHECK(Read(&env, "/ckpt/checkpoint") == before);
  REQUIRE(env.Crash().ok());
  env.Recover();
  CHECK(Read(&env, "/ckpt/checkpoint") == before);
  auto state = ReadCheckpointState(&env, kDir);
  REQUIRE(state.ok());
  CHECK((*state)->model_checkpoint_path == "model.ckpt-1");
  CheckRestores(&env, "/ckpt/model.ckpt-1", 1);
  // No temporary is left behind.
  auto names = env.GetChildren(kDir);
  REQUIRE(names.ok());
  for (const std::string& name : *names) CHECK_FALSE(absl::StrContains(name, ".tmp"));
}

TEST_CASE("a crash after a completed save restores it; a crash at any point of a save lists only complete checkpoints") {
  {
    MemEnv mem;
    ManualClock clock;
    FaultyEnv env(&mem);
    VariableStore vars;
    std::unique_ptr<Saver> saver = SavedStep1(&env, &vars, &clock);
    Fill(&vars, 2);
    REQUIRE(saver->Save(vars, kPrefix, 2).ok());
    REQUIRE(env.Crash().ok());
    env.Recover();
    CHECK(**LatestCheckpoint(&env, kDir) == "/ckpt/model.ckpt-2");
    CheckRestores(&env, "/ckpt/model.ckpt-2", 2);
  }
  int crash_points = 0;
  for (int64_t k = 1;; ++k) {
    CAPTURE(k);
    REQUIRE(k < 1000);
    MemEnv mem;
    ManualClock clock;
    FaultyEnv env(&mem);
    VariableStore vars;
    std::unique_ptr<Saver> saver = SavedStep1(&env, &vars, &clock);
    REQUIRE(env.AddFault(Fault("power", "/ckpt/*", EnvOp::kAny, Kind::kCrash, k)).ok());
    Fill(&vars, 2);
    const bool saved = saver->Save(vars, kPrefix, 2).ok();
    const bool crashed = env.crashed();
    CHECK(saved != crashed);
    env.ClearFaults();
    env.Recover();
    auto state = ReadCheckpointState(&env, kDir);
    REQUIRE_MESSAGE(state.ok(), state.status().ToString());
    REQUIRE(state->has_value());
    REQUIRE(!(*state)->all_model_checkpoint_paths.empty());
    for (const std::string& listed : (*state)->all_model_checkpoint_paths) {
      const std::string path = ResolveCheckpointPath(kDir, listed);
      CheckRestores(&env, path, path == "/ckpt/model.ckpt-2" ? 2 : 1);
    }
    if (!crashed) break;
    ++crash_points;
  }
  CHECK(crash_points > 5);
}

TEST_CASE("a p=0.5 repeating fault on checkpoint files fires at the same points in two runs of a Saver") {
  auto run = []() {
    MemEnv mem;
    ManualClock clock;
    FaultyEnv env(&mem, /*seed=*/7);
    VariableStore vars;
    std::unique_ptr<Saver> saver = SavedStep1(&env, &vars, &clock);
    EnvFault coin = Fault("coin", "/ckpt/*", EnvOp::kAny, Kind::kError, 0);
    coin.probability = 0.5;
    coin.repeat = true;
    REQUIRE(env.AddFault(coin).ok());
    std::vector<bool> saved;
    for (int64_t step = 2; step <= 12; ++step) {
      Fill(&vars, step);
      saved.push_back(saver->Save(vars, kPrefix, step).ok());
    }
    return std::make_pair(saved, Points(env.fired()));
  };
  const auto first = run();
  const auto second = run();  // BundleWriter's random suffixes differ from the first run's
  CHECK(first.first == second.first);
  CHECK(first.second == second.second);
  CHECK(!first.second.empty());
  for (const auto& p : first.second) CHECK_FALSE(absl::StrContains(std::get<1>(p), "tmp"));
}

}  // namespace
}  // namespace foreman
