// Tests for the `checkpoint` state file, ListCheckpointPrefixes and the
// directory lock (include/foreman/checkpoint.hpp; spec B136-B140, decision 8).
#include <doctest/doctest.h>

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "foreman/bundle.hpp"
#include "foreman/checkpoint.hpp"
#include "foreman/mem_env.hpp"

namespace foreman {
namespace {

using Paths = std::vector<std::string>;

std::string Msg(const Status& s) { return std::string(s.message()); }

struct Fixture {
  Fixture() { REQUIRE(env.RecursivelyCreateDir("/ckpt").ok()); }

  std::string Text() {
    auto s = env.ReadFileToString("/ckpt/checkpoint");
    REQUIRE(s.ok());
    return *s;
  }
  void SetText(const std::string& text) { REQUIRE(WriteStringToFile(&env, "/ckpt/checkpoint", text).ok()); }
  CheckpointState Read() {
    auto s = ReadCheckpointState(&env, "/ckpt");
    REQUIRE_MESSAGE(s.ok(), s.status().ToString());
    REQUIRE(s->has_value());
    return **s;
  }

  MemEnv env;
};

CheckpointState State(const std::string& latest, Paths all = {}) {
  CheckpointState s;
  s.model_checkpoint_path = latest;
  s.all_model_checkpoint_paths = std::move(all);
  return s;
}

// -- the text format -------------------------------------------------------------------

TEST_CASE("decision 8: paths under the directory are written relative to it, in TF's text format") {
  Fixture f;
  REQUIRE(WriteCheckpointState(&f.env, "/ckpt",
                               State("/ckpt/model.ckpt-250", {"/ckpt/model.ckpt-100", "/ckpt/model.ckpt-250"}))
              .ok());
  CHECK(f.Text() ==
        "model_checkpoint_path: \"model.ckpt-250\"\n"
        "all_model_checkpoint_paths: \"model.ckpt-100\"\n"
        "all_model_checkpoint_paths: \"model.ckpt-250\"\n");
  CheckpointState s = f.Read();
  CHECK(s.model_checkpoint_path == "model.ckpt-250");
  CHECK(s.all_model_checkpoint_paths == Paths{"model.ckpt-100", "model.ckpt-250"});
  CHECK(ResolveCheckpointPath("/ckpt", s.model_checkpoint_path) == "/ckpt/model.ckpt-250");
}

TEST_CASE("B136: the latest path is appended to all_model_checkpoint_paths when missing at the end") {
  Fixture f;
  REQUIRE(WriteCheckpointState(&f.env, "/ckpt", State("/ckpt/m-3", {"/ckpt/m-1"})).ok());
  CHECK(f.Read().all_model_checkpoint_paths == Paths{"m-1", "m-3"});
  REQUIRE(WriteCheckpointState(&f.env, "/ckpt", State("/ckpt/m-4")).ok());
  CHECK(f.Read().all_model_checkpoint_paths == Paths{"m-4"});
}

TEST_CASE("timestamps and last_preserved_timestamp round-trip; paths elsewhere stay absolute") {
  Fixture f;
  CheckpointState in = State("/ckpt/m-2", {"/other/m-1", "/ckpt/m-2"});
  in.all_model_checkpoint_timestamps = {1700000000.25, 1700000100.5};
  in.last_preserved_timestamp = 1699999999.0;
  REQUIRE(WriteCheckpointState(&f.env, "/ckpt", in).ok());
  CheckpointState s = f.Read();
  CHECK(s.all_model_checkpoint_paths == Paths{"/other/m-1", "m-2"});
  CHECK(s.all_model_checkpoint_timestamps == std::vector<double>{1700000000.25, 1700000100.5});
  CHECK(s.last_preserved_timestamp == 1699999999.0);
  CHECK(ResolveCheckpointPath("/ckpt", s.all_model_checkpoint_paths[0]) == "/other/m-1");
}

TEST_CASE("B138/B139: a relative directory gets relative paths; a trailing slash is fine") {
  MemEnv env;
  REQUIRE(env.RecursivelyCreateDir("run/ckpt").ok());
  REQUIRE(WriteCheckpointState(&env, "run/ckpt/", State("run/ckpt/m-1")).ok());
  auto s = ReadCheckpointState(&env, "run/ckpt");
  REQUIRE(s.ok());
  CHECK((*s)->model_checkpoint_path == "m-1");
  CHECK(ResolveCheckpointPath("run/ckpt", "m-1") == "run/ckpt/m-1");
}

TEST_CASE("decision 8: a state file TF wrote with absolute paths is read and resolved as is") {
  Fixture f;
  f.SetText(
      "model_checkpoint_path: \"/old/train/model.ckpt-20\"\n"
      "all_model_checkpoint_paths: \"/old/train/model.ckpt-10\"\n"
      "all_model_checkpoint_paths: \"/old/train/model.ckpt-20\"\n");
  CheckpointState s = f.Read();
  CHECK(ResolveCheckpointPath("/ckpt", s.model_checkpoint_path) == "/old/train/model.ckpt-20");
  CHECK(s.all_model_checkpoint_paths.size() == 2);
}

TEST_CASE("B137: timestamps whose count differs from the paths' are INVALID_ARGUMENT, read or written") {
  Fixture f;
  f.SetText(
      "model_checkpoint_path: \"m-2\"\n"
      "all_model_checkpoint_paths: \"m-1\"\nall_model_checkpoint_paths: \"m-2\"\n"
      "all_model_checkpoint_timestamps: 1.5\n");
  auto s = ReadCheckpointState(&f.env, "/ckpt");
  CHECK(s.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(absl::StrContains(Msg(s.status()), "/ckpt/checkpoint"));

  CheckpointState bad = State("/ckpt/m-2", {"/ckpt/m-1", "/ckpt/m-2"});
  bad.all_model_checkpoint_timestamps = {1.0};
  CHECK(WriteCheckpointState(&f.env, "/ckpt", bad).code() == absl::StatusCode::kInvalidArgument);
}

TEST_CASE("B139: a missing state file is nullopt; an empty model path is INVALID_ARGUMENT") {
  Fixture f;
  auto none = ReadCheckpointState(&f.env, "/ckpt");
  REQUIRE(none.ok());
  CHECK_FALSE(none->has_value());
  f.SetText("all_model_checkpoint_paths: \"m-1\"\n");
  CHECK(ReadCheckpointState(&f.env, "/ckpt").status().code() == absl::StatusCode::kInvalidArgument);
  f.SetText("");
  CHECK(ReadCheckpointState(&f.env, "/ckpt").status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(WriteCheckpointState(&f.env, "/ckpt", State("")).code() == absl::StatusCode::kInvalidArgument);
}

TEST_CASE("decision 7: an unparsable state file is DATA_LOSS naming it") {
  Fixture f;
  f.SetText("model_checkpoint_path: \"m-1\"\n\x01garbage{{{");
  auto s = ReadCheckpointState(&f.env, "/ckpt");
  CHECK(s.status().code() == absl::StatusCode::kDataLoss);
  CHECK(absl::StrContains(Msg(s.status()), "/ckpt/checkpoint"));
}

TEST_CASE("B129: latest_filename must not contain a directory; another name is honoured") {
  Fixture f;
  CHECK(WriteCheckpointState(&f.env, "/ckpt", State("/ckpt/m-1"), "sub/ckpt").code() ==
        absl::StatusCode::kInvalidArgument);
  CHECK(ReadCheckpointState(&f.env, "/ckpt", "a/b").status().code() == absl::StatusCode::kInvalidArgument);
  REQUIRE(WriteCheckpointState(&f.env, "/ckpt", State("/ckpt/m-1"), "latest").ok());
  auto s = ReadCheckpointState(&f.env, "/ckpt", "latest");
  REQUIRE(s.ok());
  CHECK((*s)->model_checkpoint_path == "m-1");
  CHECK(f.env.FileExists("/ckpt/checkpoint").code() == absl::StatusCode::kNotFound);
}

TEST_CASE("the state file is replaced atomically: a crash leaves the old or the new one") {
  Fixture f;
  REQUIRE(WriteCheckpointState(&f.env, "/ckpt", State("/ckpt/m-1")).ok());
  f.env.SetCrashAfterOperations(3);   // create, append, sync of the temporary file
  CHECK_FALSE(WriteCheckpointState(&f.env, "/ckpt", State("/ckpt/m-2")).ok());
  f.env.Crash();
  CHECK(f.Read().model_checkpoint_path == "m-1");
  REQUIRE(WriteCheckpointState(&f.env, "/ckpt", State("/ckpt/m-2")).ok());
  f.env.Crash();
  CHECK(f.Read().model_checkpoint_path == "m-2");
}

// -- listing ------------------------------------------------------------------------

TEST_CASE("ListCheckpointPrefixes orders bundles by the step in their names, oldest first") {
  Fixture f;
  for (const char* name : {"model.ckpt-100.index", "model.ckpt-9.index", "model.ckpt-10.index",
                           "model.ckpt-10.data-00000-of-00001", "model.ckpt-11.index.tempstate123",
                           "checkpoint", "model.ckpt.index", "events.out.tfevents.1.host"}) {
    REQUIRE(WriteStringToFile(&f.env, JoinPath("/ckpt", name), "").ok());
  }
  auto p = ListCheckpointPrefixes(&f.env, "/ckpt");
  REQUIRE(p.ok());
  CHECK(*p == Paths{"/ckpt/model.ckpt", "/ckpt/model.ckpt-9", "/ckpt/model.ckpt-10", "/ckpt/model.ckpt-100"});
  CHECK(ListCheckpointPrefixes(&f.env, "/none").status().code() == absl::StatusCode::kNotFound);
}

// -- the lock -----------------------------------------------------------------------

TEST_CASE("LockCheckpointDirectory: a second lock is FAILED_PRECONDITION naming the holder's pid") {
  MemEnv env;
  auto lock = LockCheckpointDirectory(&env, "/new/ckpt");   // creates the directory
  REQUIRE_MESSAGE(lock.ok(), lock.status().ToString());
  CHECK(env.FileExists("/new/ckpt/.foreman.lock").ok());
  auto second = LockCheckpointDirectory(&env, "/new/ckpt");
  CHECK(second.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK(Msg(second.status()) ==
        absl::StrCat("checkpoint directory /new/ckpt is in use by process ", static_cast<int64_t>(getpid())));
  lock->reset();
  CHECK(LockCheckpointDirectory(&env, "/new/ckpt").ok());
}

TEST_CASE("LockCheckpointDirectory: every failure but a held lock has another code than FAILED_PRECONDITION") {
  MemEnv env;
  REQUIRE(WriteStringToFile(&env, "/file", "x").ok());
  REQUIRE(env.RecursivelyCreateDir("/ckpt/.foreman.lock").ok());
  const auto code = [&env](const std::string& dir) { return LockCheckpointDirectory(&env, dir).status().code(); };
  CHECK(code("") == absl::StatusCode::kInvalidArgument);
  CHECK(code("/file") == absl::StatusCode::kInvalidArgument);       // not a directory
  CHECK(code("/file/sub") == absl::StatusCode::kInvalidArgument);   // an ancestor is not one
  CHECK(code("/ckpt") == absl::StatusCode::kInvalidArgument);       // the lock file is a directory
  CHECK(Msg(LockCheckpointDirectory(&env, "/file").status()) ==
        "cannot create the checkpoint directory /file: /file is not a directory");
  env.SetCrashAfterOperations(0);                                    // I/O fails: the Env's code
  auto failed = LockCheckpointDirectory(&env, "/other");
  CHECK(failed.status().code() == absl::StatusCode::kUnavailable);
  CHECK(absl::StartsWith(Msg(failed.status()), "cannot create the checkpoint directory /other: "));
}

TEST_CASE("LockCheckpointDirectory on the POSIX Env: not a directory, no permission") {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string base = absl::StrCat(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp",
                                        "/checkpoint_state_test_lock_errors.", static_cast<int64_t>(getpid()));
  Env* env = Env::Default();
  REQUIRE(env->RecursivelyCreateDir(base).ok());
  REQUIRE(WriteStringToFile(env, base + "/file", "x").ok());
  CHECK(LockCheckpointDirectory(env, base + "/file").status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(LockCheckpointDirectory(env, base + "/file/sub").status().code() == absl::StatusCode::kInvalidArgument);
  if (geteuid() != 0) {   // root may write anywhere
    REQUIRE(env->RecursivelyCreateDir(base + "/ro").ok());
    std::filesystem::permissions(base + "/ro", std::filesystem::perms::owner_read | std::filesystem::perms::owner_exec);
    auto denied = LockCheckpointDirectory(env, base + "/ro/ckpt");
    CHECK(denied.status().code() == absl::StatusCode::kPermissionDenied);
    CHECK(absl::StartsWith(Msg(denied.status()),
                           absl::StrCat("cannot create the checkpoint directory ", base, "/ro/ckpt: ")));
    std::filesystem::permissions(base + "/ro", std::filesystem::perms::owner_all);
  }
  std::error_code ec;
  std::filesystem::remove_all(base, ec);
}

TEST_CASE("LockCheckpointDirectory on the POSIX Env names this process as the holder") {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string dir = absl::StrCat(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp",
                                       "/checkpoint_state_test_lock.", static_cast<int64_t>(getpid()));
  {
    auto lock = LockCheckpointDirectory(Env::Default(), dir);
    REQUIRE_MESSAGE(lock.ok(), lock.status().ToString());
    auto second = LockCheckpointDirectory(Env::Default(), dir);
    CHECK(second.status().code() == absl::StatusCode::kFailedPrecondition);
    CHECK(Msg(second.status()) ==
          absl::StrCat("checkpoint directory ", dir, " is in use by process ", static_cast<int64_t>(getpid())));
  }
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
}

}  // namespace
}  // namespace foreman
