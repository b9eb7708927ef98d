// Tests for MemEnv: POSIX-like semantics and the crash model of mem_env.hpp.

#include "foreman/mem_env.hpp"

#include <doctest/doctest.h>

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace foreman {
namespace {

using Names = std::vector<std::string>;

/// The contents of `path`, or "<missing>" when it does not exist.
std::string Contents(Env* env, const std::string& path) {
  auto s = env->ReadFileToString(path);
  if (absl::IsNotFound(s.status())) return "<missing>";
  REQUIRE(s.ok());
  return *s;
}

/// Creates `path` with `contents`, durably (file synced, directory synced).
void WriteDurably(MemEnv* env, const std::string& path, const std::string& contents) {
  auto file = env->NewWritableFile(path);
  REQUIRE(file.ok());
  REQUIRE((*file)->Append(contents).ok());
  REQUIRE((*file)->Sync().ok());
  REQUIRE((*file)->Close().ok());
  REQUIRE(env->SyncDir(Dirname(path)).ok());
}

/// A MemEnv with the durable, empty directory /d.
struct Fixture {
  Fixture() {
    REQUIRE(env.CreateDir("/d").ok());
    REQUIRE(env.SyncDir("/").ok());
  }
  MemEnv env;
};

// -- POSIX semantics -----------------------------------------------------------------

TEST_CASE("a MemEnv file reads back what was appended, whole or at offsets") {
  Fixture f;
  auto file = f.env.NewWritableFile("/d/f");
  REQUIRE(file.ok());
  REQUIRE((*file)->Append("0123").ok());
  REQUIRE((*file)->Append("456789").ok());
  CHECK((*file)->Size() == 10);
  REQUIRE((*file)->Close().ok());
  CHECK(Contents(&f.env, "/d/f") == "0123456789");
  CHECK(*f.env.GetFileSize("/d/f") == 10);

  auto reader = f.env.NewRandomAccessFile("/d/f");
  REQUIRE(reader.ok());
  char scratch[16];
  CHECK(*(*reader)->Read(3, 4, scratch) == "3456");
  CHECK(*(*reader)->Read(7, 10, scratch) == "789");
  CHECK((*reader)->Read(10, 1, scratch)->empty());
  CHECK((*reader)->Read(11, 1, scratch).status().code() == absl::StatusCode::kOutOfRange);

  auto appendable = f.env.NewAppendableFile("/d/f");
  REQUIRE(appendable.ok());
  CHECK((*appendable)->Size() == 10);
  REQUIRE((*appendable)->Append("!").ok());
  CHECK(Contents(&f.env, "/d/f") == "0123456789!");
  REQUIRE(f.env.NewWritableFile("/d/f").ok());
  CHECK(Contents(&f.env, "/d/f").empty());
}

TEST_CASE("MemEnv directories follow POSIX rules") {
  Fixture f;
  auto orphan = f.env.NewWritableFile("/missing/f");
  CHECK(orphan.status().code() == absl::StatusCode::kNotFound);
  CHECK(absl::StrContains(orphan.status().message(), "/missing/f"));
  Status missing = f.env.ReadFileToString("/d/nope").status();
  CHECK(missing.code() == absl::StatusCode::kNotFound);
  CHECK(absl::StrContains(missing.message(), "/d/nope"));

  CHECK(f.env.CreateDir("/d").code() == absl::StatusCode::kAlreadyExists);
  CHECK(f.env.CreateDir("/x/y").code() == absl::StatusCode::kNotFound);
  for (const char* name : {"/d/b", "/d/c", "/d/a"}) REQUIRE(WriteStringToFile(&f.env, name, "").ok());
  REQUIRE(f.env.CreateDir("/d/sub").ok());
  CHECK(*f.env.GetChildren("/d") == Names{"a", "b", "c", "sub"});
  CHECK(*f.env.GetChildren("/") == Names{"d"});
  CHECK(*f.env.IsDirectory("/d/sub"));
  CHECK_FALSE(*f.env.IsDirectory("/d/a"));
  CHECK(f.env.FileExists("/").ok());
  CHECK(f.env.FileExists("/d//sub/").ok());

  CHECK(f.env.DeleteDir("/d").code() == absl::StatusCode::kFailedPrecondition);
  CHECK(f.env.DeleteFile("/d/sub").code() == absl::StatusCode::kFailedPrecondition);
  REQUIRE(f.env.DeleteDir("/d/sub").ok());
  CHECK(f.env.FileExists("/d/sub").code() == absl::StatusCode::kNotFound);

  // Relative paths live under ".", which always exists.
  REQUIRE(WriteStringToFile(&f.env, "rel", "r").ok());
  CHECK(Contents(&f.env, "./rel") == "r");
  CHECK(*f.env.GetChildren(".") == Names{"rel"});
}

TEST_CASE("MemEnv RenameFile replaces an existing target") {
  Fixture f;
  REQUIRE(WriteStringToFile(&f.env, "/d/from", "new").ok());
  REQUIRE(WriteStringToFile(&f.env, "/d/to", "old").ok());
  REQUIRE(f.env.RenameFile("/d/from", "/d/to").ok());
  CHECK(Contents(&f.env, "/d/to") == "new");
  CHECK(Contents(&f.env, "/d/from") == "<missing>");
  CHECK(f.env.RenameFile("/d/from", "/d/to").code() == absl::StatusCode::kNotFound);
}

TEST_CASE("RecursivelyCreateDir creates every level durably and is idempotent") {
  MemEnv env;
  REQUIRE(env.RecursivelyCreateDir("/a/b/c").ok());
  CHECK(env.RecursivelyCreateDir("/a/b/c").ok());
  CHECK(env.RecursivelyCreateDir("/a/b").ok());
  env.Crash();
  CHECK(*env.IsDirectory("/a/b/c"));
}

// -- the crash model -----------------------------------------------------------------

TEST_CASE("unsynced appended bytes vanish after a crash but synced ones stay") {
  Fixture f;
  auto file = f.env.NewWritableFile("/d/log");
  REQUIRE(file.ok());
  REQUIRE(f.env.SyncDir("/d").ok());
  REQUIRE((*file)->Append("synced").ok());
  REQUIRE((*file)->Sync().ok());
  REQUIRE((*file)->Append(" lost").ok());
  REQUIRE((*file)->Flush().ok());  // Flush is not Sync.
  CHECK(Contents(&f.env, "/d/log") == "synced lost");
  f.env.Crash();
  CHECK(Contents(&f.env, "/d/log") == "synced");
}

TEST_CASE("a created and synced file vanishes after a crash when its directory was not synced") {
  Fixture f;
  auto file = f.env.NewWritableFile("/d/f");
  REQUIRE(file.ok());
  REQUIRE((*file)->Append("data").ok());
  REQUIRE((*file)->Sync().ok());
  REQUIRE((*file)->Close().ok());
  f.env.Crash();
  CHECK(Contents(&f.env, "/d/f") == "<missing>");
  CHECK(f.env.GetChildren("/d")->empty());
}

TEST_CASE("a created file survives a crash once its directory is synced") {
  Fixture f;
  WriteDurably(&f.env, "/d/f", "data");
  f.env.Crash();
  CHECK(Contents(&f.env, "/d/f") == "data");
}

TEST_CASE("a created directory vanishes after a crash unless its parent is synced") {
  Fixture f;
  REQUIRE(f.env.CreateDir("/d/gone").ok());
  REQUIRE(f.env.CreateDir("/d/kept").ok());
  REQUIRE(f.env.SyncDir("/d").ok());
  REQUIRE(f.env.CreateDir("/d/kept/inner").ok());
  REQUIRE(f.env.CreateDir("/unsynced").ok());
  f.env.Crash();
  CHECK(*f.env.GetChildren("/d") == Names{"gone", "kept"});
  CHECK(f.env.GetChildren("/d/kept")->empty());
  CHECK(*f.env.GetChildren("/") == Names{"d"});
}

TEST_CASE("a rename without SyncDir reverts after a crash") {
  Fixture f;
  WriteDurably(&f.env, "/d/a", "A");
  WriteDurably(&f.env, "/d/target", "old target");

  SUBCASE("to a new name: the old name is back, the new one gone") {
    REQUIRE(f.env.RenameFile("/d/a", "/d/b").ok());
    f.env.Crash();
    CHECK(Contents(&f.env, "/d/a") == "A");
    CHECK(Contents(&f.env, "/d/b") == "<missing>");
  }
  SUBCASE("over an existing file: the previous target is back") {
    REQUIRE(f.env.RenameFile("/d/a", "/d/target").ok());
    f.env.Crash();
    CHECK(Contents(&f.env, "/d/a") == "A");
    CHECK(Contents(&f.env, "/d/target") == "old target");
  }
  SUBCASE("followed by SyncDir: the rename is durable") {
    REQUIRE(f.env.RenameFile("/d/a", "/d/target").ok());
    REQUIRE(f.env.SyncDir("/d").ok());
    f.env.Crash();
    CHECK(Contents(&f.env, "/d/a") == "<missing>");
    CHECK(Contents(&f.env, "/d/target") == "A");
  }
}

TEST_CASE("a renamed file keeps the data synced under either name") {
  Fixture f;
  auto file = f.env.NewWritableFile("/d/tmp");
  REQUIRE(file.ok());
  REQUIRE(f.env.SyncDir("/d").ok());  // "tmp" is durable, still empty.
  REQUIRE(f.env.RenameFile("/d/tmp", "/d/final").ok());
  REQUIRE((*file)->Append("written after the rename").ok());
  REQUIRE((*file)->Sync().ok());
  f.env.Crash();
  CHECK(Contents(&f.env, "/d/tmp") == "written after the rename");
  CHECK(Contents(&f.env, "/d/final") == "<missing>");
}

TEST_CASE("a directory rename moves its contents and reverts after a crash") {
  Fixture f;
  REQUIRE(f.env.CreateDir("/d/x").ok());
  REQUIRE(f.env.SyncDir("/d").ok());
  WriteDurably(&f.env, "/d/x/f", "F");
  REQUIRE(f.env.RenameFile("/d/x", "/d/y").ok());
  CHECK(Contents(&f.env, "/d/y/f") == "F");
  CHECK(f.env.RenameFile("/d/y", "/d/y/z").code() == absl::StatusCode::kInvalidArgument);
  f.env.Crash();
  CHECK(Contents(&f.env, "/d/x/f") == "F");
  CHECK(f.env.FileExists("/d/y").code() == absl::StatusCode::kNotFound);
}

TEST_CASE("a delete without SyncDir comes back after a crash") {
  Fixture f;
  WriteDurably(&f.env, "/d/f", "still here");
  REQUIRE(f.env.DeleteFile("/d/f").ok());
  CHECK(Contents(&f.env, "/d/f") == "<missing>");
  f.env.Crash();
  CHECK(Contents(&f.env, "/d/f") == "still here");

  REQUIRE(f.env.DeleteFile("/d/f").ok());
  REQUIRE(f.env.SyncDir("/d").ok());
  f.env.Crash();
  CHECK(Contents(&f.env, "/d/f") == "<missing>");
}

TEST_CASE("file handles from before a crash fail FAILED_PRECONDITION") {
  Fixture f;
  WriteDurably(&f.env, "/d/f", "data");
  auto writer = f.env.NewAppendableFile("/d/f");
  REQUIRE(writer.ok());
  auto reader = f.env.NewRandomAccessFile("/d/f");
  REQUIRE(reader.ok());
  f.env.Crash();
  Status s = (*writer)->Append("x");
  CHECK(s.code() == absl::StatusCode::kFailedPrecondition);
  CHECK(absl::StrContains(s.message(), "file handle from before a crash"));
  CHECK((*writer)->Sync().code() == absl::StatusCode::kFailedPrecondition);
  char scratch[4];
  CHECK((*reader)->Read(0, 4, scratch).status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK(Contents(&f.env, "/d/f") == "data");
}

TEST_CASE("WriteFileAtomic on a MemEnv survives a crash with the new contents") {
  Fixture f;
  WriteDurably(&f.env, "/d/ckpt", "old");
  REQUIRE(WriteFileAtomic(&f.env, "/d/ckpt", "new").ok());
  f.env.Crash();
  CHECK(Contents(&f.env, "/d/ckpt") == "new");
  CHECK(*f.env.GetChildren("/d") == Names{"ckpt"});
}

TEST_CASE("WriteFileAtomic crashed after any of its operations leaves the old or the new contents") {
  const std::string old_contents(1000, 'o');
  const std::string new_contents(2000, 'n');
  int64_t ops_needed = -1;
  for (int64_t k = 0; k < 100 && ops_needed < 0; ++k) {
    CAPTURE(k);
    Fixture f;
    WriteDurably(&f.env, "/d/ckpt", old_contents);
    const int64_t before = f.env.mutating_operations();
    f.env.SetCrashAfterOperations(k);
    Status s = WriteFileAtomic(&f.env, "/d/ckpt", new_contents);
    if (s.ok()) ops_needed = f.env.mutating_operations() - before;
    f.env.Crash();
    const std::string after = Contents(&f.env, "/d/ckpt");
    CHECK((after == old_contents || after == new_contents));
    // Only the last operation (SyncDir) makes the new contents durable.
    CHECK(after == (s.ok() ? new_contents : old_contents));
    CHECK(*f.env.GetChildren("/d") == Names{"ckpt"});  // No temporary file survives.
  }
  CHECK(ops_needed == 6);  // Create, append, sync, close, rename, sync dir.
}

TEST_CASE("an inactive file system fails every operation UNAVAILABLE and changes nothing") {
  Fixture f;
  WriteDurably(&f.env, "/d/f", "data");
  auto writer = f.env.NewAppendableFile("/d/f");
  REQUIRE(writer.ok());
  const int64_t ops = f.env.mutating_operations();
  f.env.SetFilesystemActive(false);

  Status read = f.env.ReadFileToString("/d/f").status();
  CHECK(read.code() == absl::StatusCode::kUnavailable);
  CHECK(absl::StrContains(read.message(), "file system inactive (simulated crash)"));
  CHECK(f.env.FileExists("/d/f").code() == absl::StatusCode::kUnavailable);
  CHECK(f.env.GetChildren("/d").status().code() == absl::StatusCode::kUnavailable);
  CHECK(f.env.NewWritableFile("/d/g").status().code() == absl::StatusCode::kUnavailable);
  CHECK(f.env.DeleteFile("/d/f").code() == absl::StatusCode::kUnavailable);
  CHECK(f.env.RenameFile("/d/f", "/d/g").code() == absl::StatusCode::kUnavailable);
  CHECK(f.env.CreateDir("/d/e").code() == absl::StatusCode::kUnavailable);
  CHECK(f.env.RecursivelyCreateDir("/d").code() == absl::StatusCode::kUnavailable);
  CHECK(f.env.SyncDir("/d").code() == absl::StatusCode::kUnavailable);
  CHECK(f.env.LockFile("/d/LOCK").status().code() == absl::StatusCode::kUnavailable);
  CHECK((*writer)->Append("x").code() == absl::StatusCode::kUnavailable);
  CHECK(f.env.mutating_operations() == ops);

  f.env.SetFilesystemActive(true);
  CHECK(Contents(&f.env, "/d/f") == "data");
  CHECK(*f.env.GetChildren("/d") == Names{"f"});
}

TEST_CASE("SetCrashAfterOperations stops the file system after n more mutating operations") {
  Fixture f;
  const int64_t start = f.env.mutating_operations();
  CHECK(start == 2);  // CreateDir and SyncDir in the fixture.
  f.env.SetCrashAfterOperations(2);
  REQUIRE(f.env.CreateDir("/d/a").ok());
  CHECK(f.env.FileExists("/d/a").ok());  // Reads do not count.
  REQUIRE(f.env.CreateDir("/d/b").ok());
  CHECK(f.env.CreateDir("/d/c").code() == absl::StatusCode::kUnavailable);
  CHECK(f.env.FileExists("/d/a").code() == absl::StatusCode::kUnavailable);
  CHECK(f.env.mutating_operations() == start + 2);

  f.env.Crash();  // Re-activates, and the trigger has fired.
  REQUIRE(f.env.CreateDir("/d/c").ok());
  REQUIRE(f.env.CreateDir("/d/e").ok());
  CHECK(f.env.mutating_operations() == start + 4);

  f.env.SetCrashAfterOperations(0);
  CHECK(f.env.CreateDir("/d/f").code() == absl::StatusCode::kUnavailable);
}

TEST_CASE("a second MemEnv LockFile fails until the first is released or the env crashes") {
  Fixture f;
  auto first = f.env.LockFile("/d/LOCK");
  REQUIRE(first.ok());
  auto second = f.env.LockFile("/d/LOCK");
  CHECK(second.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK(absl::StrContains(second.status().message(), "/d/LOCK"));
  CHECK(f.env.LockFile("/d//LOCK").status().code() == absl::StatusCode::kFailedPrecondition);

  first->reset();
  auto third = f.env.LockFile("/d/LOCK");
  REQUIRE(third.ok());

  f.env.Crash();
  auto after_crash = f.env.LockFile("/d/LOCK");
  REQUIRE(after_crash.ok());
  third->reset();  // A lock from before the crash must not release the new one.
  CHECK(f.env.LockFile("/d/LOCK").status().code() == absl::StatusCode::kFailedPrecondition);
}

TEST_CASE("several threads can append to their own files and list the directory at once") {
  Fixture f;
  constexpr int kThreads = 4;
  constexpr int kAppends = 200;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&f, t] {
      auto file = f.env.NewWritableFile(absl::StrCat("/d/f", t));
      if (!file.ok()) return;
      for (int i = 0; i < kAppends; ++i) {
        if (!(*file)->Append("x").ok()) return;
        if (i % 10 == 0) (void)f.env.GetChildren("/d");
      }
      (void)(*file)->Close();
    });
  }
  for (std::thread& t : threads) t.join();
  for (int t = 0; t < kThreads; ++t) {
    CHECK(*f.env.GetFileSize(absl::StrCat("/d/f", t)) == kAppends);
  }
  CHECK(f.env.GetChildren("/d")->size() == kThreads);
}

}  // namespace
}  // namespace foreman
