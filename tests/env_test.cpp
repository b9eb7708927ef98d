// Tests for Env::Default() (POSIX) and the path and write helpers in env.hpp.

#include "foreman/env.hpp"
#include "support/test_util.hpp"

#include <doctest/doctest.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace foreman {
namespace {

using Names = std::vector<std::string>;

using foreman::testing::TempDir;

/// Waits up to `ms` milliseconds for one byte on `fd`; returns it, or -1.
int ReadByte(int fd, int ms) {
  struct pollfd p = {fd, POLLIN, 0};
  if (poll(&p, 1, ms) != 1) return -1;
  char c;
  return read(fd, &c, 1) == 1 ? c : -1;
}

/// Reaps `pid`, killing it when it has not exited within about five seconds.
void Reap(pid_t pid) {
  for (int i = 0; i < 500; ++i) {
    if (waitpid(pid, nullptr, WNOHANG) == pid) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  kill(pid, SIGKILL);
  waitpid(pid, nullptr, 0);
}

// -- path helpers --------------------------------------------------------------------

TEST_CASE("JoinPath joins with exactly one slash and passes an empty side through") {
  CHECK(JoinPath("a", "b") == "a/b");
  CHECK(JoinPath("a/", "b") == "a/b");
  CHECK(JoinPath("/", "b") == "/b");
  CHECK(JoinPath("", "b") == "b");
  CHECK(JoinPath("a", "") == "a");
}

TEST_CASE("Dirname and Basename split a path like POSIX dirname and basename") {
  CHECK(Dirname("a/b/c") == "a/b");
  CHECK(Dirname("c") == ".");
  CHECK(Dirname("/c") == "/");
  CHECK(Dirname("/") == "/");
  CHECK(Dirname("a/b/") == "a");
  CHECK(Dirname("a//b") == "a");
  CHECK(Basename("a/b/c") == "c");
  CHECK(Basename("c") == "c");
  CHECK(Basename("a/b/") == "b");
  CHECK(Basename("/") == "/");
}

TEST_CASE("IsAbsolutePath is true exactly for paths starting with a slash") {
  CHECK(IsAbsolutePath("/a"));
  CHECK(IsAbsolutePath("/"));
  CHECK_FALSE(IsAbsolutePath("a/b"));
  CHECK_FALSE(IsAbsolutePath(""));
}

// -- files ---------------------------------------------------------------------------

TEST_CASE("a file written through the POSIX env reads back byte for byte") {
  TempDir dir;
  Env* env = Env::Default();
  std::string contents(200 * 1024 + 7, '\0');  // Larger than the write buffer.
  for (std::size_t i = 0; i < contents.size(); ++i) contents[i] = static_cast<char>(i * 31);

  auto file = env->NewWritableFile(dir / "f");
  REQUIRE(file.ok());
  REQUIRE((*file)->Append("head").ok());
  REQUIRE((*file)->Append(contents).ok());
  REQUIRE((*file)->Append("tail").ok());
  CHECK((*file)->Size() == contents.size() + 8);
  REQUIRE((*file)->Sync().ok());
  REQUIRE((*file)->Close().ok());

  auto read = env->ReadFileToString(dir / "f");
  REQUIRE(read.ok());
  CHECK(*read == "head" + contents + "tail");
  auto size = env->GetFileSize(dir / "f");
  REQUIRE(size.ok());
  CHECK(*size == contents.size() + 8);
}

TEST_CASE("Flush hands buffered bytes to the OS before the file is closed") {
  TempDir dir;
  Env* env = Env::Default();
  auto file = env->NewWritableFile(dir / "f");
  REQUIRE(file.ok());
  REQUIRE((*file)->Append("hello").ok());
  REQUIRE((*file)->Flush().ok());
  auto read = env->ReadFileToString(dir / "f");
  REQUIRE(read.ok());
  CHECK(*read == "hello");
  REQUIRE((*file)->Close().ok());
  CHECK((*file)->Append("more").code() == absl::StatusCode::kFailedPrecondition);
}

TEST_CASE("NewWritableFile truncates and NewAppendableFile keeps existing bytes") {
  TempDir dir;
  Env* env = Env::Default();
  REQUIRE(WriteStringToFile(env, dir / "f", "old contents").ok());
  REQUIRE(WriteStringToFile(env, dir / "f", "new").ok());
  CHECK(*env->ReadFileToString(dir / "f") == "new");

  auto file = env->NewAppendableFile(dir / "f");
  REQUIRE(file.ok());
  CHECK((*file)->Size() == 3);
  REQUIRE((*file)->Append("+more").ok());
  CHECK((*file)->Size() == 8);
  REQUIRE((*file)->Close().ok());
  CHECK(*env->ReadFileToString(dir / "f") == "new+more");

  auto created = env->NewAppendableFile(dir / "g");
  REQUIRE(created.ok());
  CHECK((*created)->Size() == 0);
}

TEST_CASE("a missing file fails NOT_FOUND with a message naming the path") {
  TempDir dir;
  Env* env = Env::Default();
  const std::string missing = dir / "no_such_file";
  auto read = env->ReadFileToString(missing);
  CHECK(read.status().code() == absl::StatusCode::kNotFound);
  CHECK(absl::StrContains(read.status().message(), missing));
  CHECK(absl::StrContains(read.status().message(), "No such file or directory"));

  CHECK(env->NewRandomAccessFile(missing).status().code() == absl::StatusCode::kNotFound);
  CHECK(env->GetFileSize(missing).status().code() == absl::StatusCode::kNotFound);
  CHECK(env->IsDirectory(missing).status().code() == absl::StatusCode::kNotFound);
  Status exists = env->FileExists(missing);
  CHECK(exists.code() == absl::StatusCode::kNotFound);
  CHECK(absl::StrContains(exists.message(), missing));
  Status del = env->DeleteFile(missing);
  CHECK(del.code() == absl::StatusCode::kNotFound);
  CHECK(absl::StrContains(del.message(), missing));

  auto in_missing_dir = env->NewWritableFile(dir / "no_dir/f");
  CHECK(in_missing_dir.status().code() == absl::StatusCode::kNotFound);
  CHECK(absl::StrContains(in_missing_dir.status().message(), dir / "no_dir/f"));
}

TEST_CASE("a random access file reads at offsets and returns a short read at end of file") {
  TempDir dir;
  Env* env = Env::Default();
  REQUIRE(WriteStringToFile(env, dir / "f", "0123456789").ok());
  auto file = env->NewRandomAccessFile(dir / "f");
  REQUIRE(file.ok());
  CHECK((*file)->Size() == 10);
  char scratch[16];

  auto middle = (*file)->Read(3, 4, scratch);
  REQUIRE(middle.ok());
  CHECK(*middle == "3456");
  auto tail = (*file)->Read(7, 10, scratch);
  REQUIRE(tail.ok());
  CHECK(*tail == "789");
  auto at_end = (*file)->Read(10, 4, scratch);
  REQUIRE(at_end.ok());
  CHECK(at_end->empty());
  CHECK((*file)->Read(11, 1, scratch).status().code() == absl::StatusCode::kOutOfRange);
}

TEST_CASE("a random access file sees bytes appended after it was opened") {
  TempDir dir;
  Env* env = Env::Default();
  auto writer = env->NewWritableFile(dir / "growing");
  REQUIRE(writer.ok());
  REQUIRE((*writer)->Append("abc").ok());
  REQUIRE((*writer)->Flush().ok());
  auto file = env->NewRandomAccessFile(dir / "growing");
  REQUIRE(file.ok());
  CHECK((*file)->Size() == 3);
  REQUIRE((*writer)->Append("defg").ok());
  REQUIRE((*writer)->Flush().ok());
  CHECK((*file)->Size() == 7);
  char scratch[8];
  auto tail = (*file)->Read(3, 8, scratch);
  REQUIRE(tail.ok());
  CHECK(*tail == "defg");
  REQUIRE((*writer)->Close().ok());
}

// -- names and directories -----------------------------------------------------------

TEST_CASE("GetChildren lists the names sorted and without dot entries") {
  TempDir dir;
  Env* env = Env::Default();
  for (const char* name : {"b", "c", "a"}) REQUIRE(WriteStringToFile(env, dir / name, "").ok());
  REQUIRE(env->CreateDir(dir / "d").ok());
  auto children = env->GetChildren(dir.path());
  REQUIRE(children.ok());
  CHECK(*children == Names{"a", "b", "c", "d"});
  CHECK(*env->IsDirectory(dir / "d"));
  CHECK_FALSE(*env->IsDirectory(dir / "a"));
  CHECK(env->GetChildren(dir / "missing").status().code() == absl::StatusCode::kNotFound);
}

TEST_CASE("CreateDir fails ALREADY_EXISTS on an existing directory and NOT_FOUND without a parent") {
  TempDir dir;
  Env* env = Env::Default();
  REQUIRE(env->CreateDir(dir / "d").ok());
  CHECK(env->CreateDir(dir / "d").code() == absl::StatusCode::kAlreadyExists);
  CHECK(env->CreateDir(dir / "x/y").code() == absl::StatusCode::kNotFound);
}

TEST_CASE("RecursivelyCreateDir creates every level and succeeds again when they exist") {
  TempDir dir;
  Env* env = Env::Default();
  const std::string deep = dir / "a/b/c";
  REQUIRE(env->RecursivelyCreateDir(deep).ok());
  CHECK(*env->IsDirectory(deep));
  CHECK(env->RecursivelyCreateDir(deep).ok());
  CHECK(env->RecursivelyCreateDir(deep + "/").ok());
  CHECK(env->RecursivelyCreateDir(dir.path()).ok());

  REQUIRE(WriteStringToFile(env, dir / "file", "").ok());
  CHECK(env->RecursivelyCreateDir(dir / "file/sub").code() ==
        absl::StatusCode::kFailedPrecondition);
}

TEST_CASE("DeleteDir fails FAILED_PRECONDITION on a non-empty directory and removes an empty one") {
  TempDir dir;
  Env* env = Env::Default();
  REQUIRE(env->CreateDir(dir / "d").ok());
  REQUIRE(WriteStringToFile(env, dir / "d/f", "x").ok());
  Status s = env->DeleteDir(dir / "d");
  CHECK(s.code() == absl::StatusCode::kFailedPrecondition);
  CHECK(absl::StrContains(s.message(), dir / "d"));
  REQUIRE(env->DeleteFile(dir / "d/f").ok());
  REQUIRE(env->DeleteDir(dir / "d").ok());
  CHECK(env->FileExists(dir / "d").code() == absl::StatusCode::kNotFound);
}

TEST_CASE("RenameFile replaces an existing target") {
  TempDir dir;
  Env* env = Env::Default();
  REQUIRE(WriteStringToFile(env, dir / "from", "new").ok());
  REQUIRE(WriteStringToFile(env, dir / "to", "old").ok());
  REQUIRE(env->RenameFile(dir / "from", dir / "to").ok());
  CHECK(*env->ReadFileToString(dir / "to") == "new");
  CHECK(env->FileExists(dir / "from").code() == absl::StatusCode::kNotFound);
  CHECK(env->SyncDir(dir.path()).ok());

  Status missing = env->RenameFile(dir / "from", dir / "to");
  CHECK(missing.code() == absl::StatusCode::kNotFound);
  CHECK(absl::StrContains(missing.message(), dir / "from"));
}

TEST_CASE("WriteFileAtomic replaces the contents and leaves no temporary files") {
  TempDir dir;
  Env* env = Env::Default();
  REQUIRE(WriteFileAtomic(env, dir / "checkpoint", "first").ok());
  REQUIRE(WriteFileAtomic(env, dir / "checkpoint", "second").ok());
  CHECK(*env->ReadFileToString(dir / "checkpoint") == "second");
  CHECK(*env->GetChildren(dir.path()) == Names{"checkpoint"});

  // A failed write leaves the target alone and cleans up too.
  REQUIRE(env->CreateDir(dir / "sub").ok());
  CHECK_FALSE(WriteFileAtomic(env, dir / "sub", "x").ok());  // Cannot replace a directory.
  CHECK(*env->IsDirectory(dir / "sub"));
  CHECK(*env->GetChildren(dir.path()) == Names{"checkpoint", "sub"});
}

// -- locks ---------------------------------------------------------------------------

TEST_CASE("a second LockFile in the same process fails naming this process's pid") {
  TempDir dir;
  Env* env = Env::Default();
  const std::string path = dir / "LOCK";
  {
    auto lock = env->LockFile(path);
    REQUIRE(lock.ok());
    auto second = env->LockFile(path);
    CHECK(second.status().code() == absl::StatusCode::kFailedPrecondition);
    CHECK(absl::StrContains(second.status().message(), path));
    CHECK(absl::StrContains(second.status().message(), absl::StrCat("pid ", getpid(), ")")));
  }
  // Released by the destructor.
  auto again = env->LockFile(path);
  REQUIRE(again.ok());
}

// fcntl locks belong to the process: a second lock object on the same file
// under another spelling must be refused, or closing it would drop the first.
TEST_CASE("one file locked under two spellings (./, a symlink) is one lock: the second is refused") {
  TempDir dir;
  Env* env = Env::Default();
  const std::string path = dir / "LOCK";
  auto lock = env->LockFile(path);
  REQUIRE(lock.ok());
  const std::string dotted = dir.path() + "/./LOCK";
  const std::string linked = dir / "link";
  REQUIRE(symlink(path.c_str(), linked.c_str()) == 0);
  for (const std::string& other : {dotted, linked}) {
    auto second = env->LockFile(other);
    CHECK_MESSAGE(second.status().code() == absl::StatusCode::kFailedPrecondition, other);
  }
  // The refused attempts did not release the first lock.
  auto third = env->LockFile(path);
  CHECK(third.status().code() == absl::StatusCode::kFailedPrecondition);
  lock->reset();
  CHECK(env->LockFile(dotted).ok());
}

TEST_CASE("a lock held by another process fails FAILED_PRECONDITION naming that process") {
  TempDir dir;
  Env* env = Env::Default();
  const std::string path = dir / "LOCK";
  int locked[2], release[2];
  REQUIRE(pipe(locked) == 0);
  REQUIRE(pipe(release) == 0);
  pid_t child = fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    // The child: take the lock, report, hold it until told (at most 10 s).
    auto lock = env->LockFile(path);
    char c = lock.ok() ? 'L' : 'E';
    if (write(locked[1], &c, 1) != 1) _exit(2);
    ReadByte(release[0], 10000);
    _exit(0);
  }
  close(locked[1]);
  close(release[0]);
  const int reply = ReadByte(locked[0], 10000);
  CHECK(reply == 'L');
  if (reply == 'L') {
    auto lock = env->LockFile(path);
    CHECK(lock.status().code() == absl::StatusCode::kFailedPrecondition);
    CHECK(absl::StrContains(lock.status().message(), path));
    CHECK(absl::StrContains(lock.status().message(), absl::StrCat("held by process ", child)));
    // The lock file holds the holder's pid.
    CHECK(*env->ReadFileToString(path) == absl::StrCat(child, "\n"));
  }
  char go = 'x';
  CHECK(write(release[1], &go, 1) == 1);
  close(release[1]);
  close(locked[0]);
  Reap(child);

  // The child's exit released it.
  auto lock = env->LockFile(path);
  REQUIRE(lock.ok());
}

}  // namespace
}  // namespace foreman
