// The run directory (include/foreman/run_directory.hpp): the lock, held from
// OpenRunDirectory to the end of the run and handed to the session; the undo
// of a refused start; the settings file (round trip, atomic replace, a
// corrupt or unreadable file); and the rules that choose what a run restores
// (spec decision 7: never train again from step 0 while checkpoints exist),
// each with the exact message `foreman train` prints.
#include <doctest/doctest.h>

#include <atomic>
#include <cerrno>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "foreman/checkpoint.hpp"
#include "foreman/env.hpp"
#include "foreman/fault.hpp"
#include "foreman/hooks.hpp"
#include "foreman/monitored_session.hpp"
#include "foreman/run_directory.hpp"
#include "support/test_util.hpp"
#include "support/training_graph.hpp"

namespace foreman {
namespace {

using testing::TempDir;

std::vector<std::string> Children(const std::string& dir) {
  std::vector<std::string> names;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) names.push_back(entry.path().filename());
  std::sort(names.begin(), names.end());
  return names;
}

void WriteFile(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  REQUIRE(out.good());
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// Trains testing::MakeGraph's model to `last_step` in `dir` (opened as a run
// directory: its lock goes to the session), checkpoints every 10 steps.
void TrainTo(const std::string& dir, int64_t last_step) {
  auto run = OpenRunDirectory(dir);
  REQUIRE_MESSAGE(run.ok(), run.status().ToString());
  REQUIRE((*run)->ReadSettings().ok());
  REQUIRE((*run)->Commit());
  MonitoredTrainingSessionOptions options;
  options.graph = testing::MakeGraph(std::make_shared<testing::Model>());
  options.save_checkpoint_steps = 10;
  options.log_step_count_steps = 0;
  StopAtStepHook::Options stop;
  stop.last_step = last_step;
  options.hooks = {StopAtStepHook::Create(stop).value()};
  (*run)->AttachTo(options);
  auto session = MonitoredTrainingSession(std::move(options));
  REQUIRE_MESSAGE(session.ok(), session.status().ToString());
  while (!(*session)->should_stop()) REQUIRE((*session)->run({"train_op"}).ok());
  REQUIRE((*session)->close().ok());
}

// A run directory as foreman train leaves one: settings and checkpoints.
void MakeRun(const std::string& dir, int64_t last_step) {
  TrainTo(dir, last_step);
  auto run = OpenRunDirectory(dir);
  REQUIRE(run.ok());
  REQUIRE((*run)->WriteSettings({{"hidden", "4"}}).ok());
}

TEST_CASE("OpenRunDirectory holds the lock: a second open is FAILED_PRECONDITION naming the holder; released "
          "with the object") {
  TempDir tmp;
  const std::string dir = tmp / "run";
  auto first = OpenRunDirectory(dir);
  REQUIRE_MESSAGE(first.ok(), first.status().ToString());
  CHECK((*first)->path() == dir);
  CHECK((*first)->settings_path() == dir + "/train_settings.txt");
  REQUIRE((*first)->lock() != nullptr);
  CHECK(Children(dir) == std::vector<std::string>{".foreman.lock"});

  auto second = OpenRunDirectory(dir);
  REQUIRE_FALSE(second.ok());
  CHECK(absl::IsFailedPrecondition(second.status()));
  CHECK_MESSAGE(absl::StrContains(second.status().message(),
                                  absl::StrCat("checkpoint directory ", dir, " is in use by process ")),
                second.status().ToString());
  CHECK(Children(dir) == std::vector<std::string>{".foreman.lock"});  // the refused one wrote nothing
  first->reset();
  auto third = OpenRunDirectory(dir);
  CHECK_MESSAGE(third.ok(), third.status().ToString());

  auto empty = OpenRunDirectory("");
  CHECK(absl::IsInvalidArgument(empty.status()));
  WriteFile(tmp / "afile", "x");
  auto through_file = OpenRunDirectory(tmp / "afile/run");
  CHECK_FALSE(through_file.ok());
}

TEST_CASE("the lock is held from OpenRunDirectory to the end of the run: before the session, while it trains, "
          "after close; a refused second open writes nothing") {
  TempDir tmp;
  const std::string dir = tmp / "run";
  auto try_open = [&](const char* when) {
    auto again = OpenRunDirectory(dir);
    CHECK_MESSAGE(absl::IsFailedPrecondition(again.status()), when, ": ", again.status().ToString());
  };
  auto run = OpenRunDirectory(dir);
  REQUIRE(run.ok());
  REQUIRE((*run)->ReadSettings().ok());
  try_open("after the settings were read");
  REQUIRE((*run)->Commit());
  REQUIRE((*run)->WriteSettings({{"hidden", "4"}}).ok());
  try_open("after the settings were written");
  // Where foreman train once released the lock before the session took it
  // again: just before MonitoredTrainingSession.
  MonitoredTrainingSessionOptions options;
  options.graph = testing::MakeGraph(std::make_shared<testing::Model>());
  options.log_step_count_steps = 0;
  StopAtStepHook::Options stop;
  stop.last_step = 3;
  options.hooks = {StopAtStepHook::Create(stop).value()};
  (*run)->AttachTo(options);
  CHECK(options.checkpoint_dir == dir);
  CHECK(options.runtime.held_lock == (*run)->lock());
  CHECK(options.runtime.held_lock_directory == dir);
  CHECK(options.config.env == Env::Default());
  try_open("just before the session");
  CHECK(Children(dir) == std::vector<std::string>{".foreman.lock", "train_settings.txt"});
  auto session = MonitoredTrainingSession(std::move(options));
  REQUIRE_MESSAGE(session.ok(), session.status().ToString());
  while (!(*session)->should_stop()) {
    REQUIRE((*session)->run({"train_op"}).ok());
    try_open("while the session trains");
  }
  REQUIRE((*session)->close().ok());
  try_open("after close, while the RunDirectory lives");
  session->reset();
  try_open("after the session is gone, while the RunDirectory lives");
  run->reset();
  CHECK(OpenRunDirectory(dir).ok());
}

TEST_CASE("a refused start leaves nothing behind: Undo removes the lock file and the directories opening created") {
  TempDir tmp;
  const std::string dir = tmp / "a/b/c";
  auto run = OpenRunDirectory(dir);
  REQUIRE(run.ok());
  REQUIRE(std::filesystem::exists(dir + "/.foreman.lock"));
  (*run)->Undo();
  CHECK_FALSE(std::filesystem::exists(tmp / "a"));
  CHECK_FALSE((*run)->Commit());  // undone first: the start stays refused
  (*run)->Undo();                  // idempotent

  // An existing directory is left as it was, its files and lock file too.
  const std::string existing = tmp / "existing";
  std::filesystem::create_directories(existing);
  WriteFile(existing + "/notes.txt", "mine");
  WriteFile(existing + "/.foreman.lock", "");
  auto again = OpenRunDirectory(existing);
  REQUIRE(again.ok());
  (*again)->Undo();
  CHECK(Children(existing) == std::vector<std::string>{".foreman.lock", "notes.txt"});

  // A directory that is not empty is not removed (nor its parents).
  const std::string busy = tmp / "p/q";
  auto third = OpenRunDirectory(busy);
  REQUIRE(third.ok());
  WriteFile(tmp / "p/other.txt", "someone else's");
  (*third)->Undo();
  CHECK_FALSE(std::filesystem::exists(busy));
  CHECK(Children(tmp / "p") == std::vector<std::string>{"other.txt"});
}

TEST_CASE("Commit ends the undo: files stay; Undo and Commit race from two threads and exactly one wins") {
  TempDir tmp;
  auto run = OpenRunDirectory(tmp / "run");
  REQUIRE(run.ok());
  CHECK((*run)->Commit());
  (*run)->Undo();
  CHECK(std::filesystem::exists(tmp / "run/.foreman.lock"));

  for (int i = 0; i < 20; ++i) {
    const std::string dir = tmp / absl::StrCat("race", i);
    auto raced = OpenRunDirectory(dir);
    REQUIRE(raced.ok());
    std::atomic<bool> go{false};
    std::thread undo([&] {
      while (!go.load()) std::this_thread::yield();
      (*raced)->Undo();
    });
    go.store(true);
    const bool committed = (*raced)->Commit();
    undo.join();
    CHECK(committed == std::filesystem::exists(dir));
  }
}

TEST_CASE("settings round trip: the comment, then key = value lines in key order; read back equal") {
  TempDir tmp;
  auto run = OpenRunDirectory(tmp / "run");
  REQUIRE(run.ok());
  auto none = (*run)->ReadSettings({"hidden"});
  REQUIRE(none.ok());
  CHECK_FALSE(none->has_value());
  CHECK_FALSE((*run)->resuming());
  const RunSettings settings = {{"seed", "3"}, {"hidden", "64,32"}, {"learning_rate", ""}, {"data_dir", "/d = x"}};
  REQUIRE((*run)->WriteSettings(settings, "# a comment\n").ok());
  CHECK(ReadFile((*run)->settings_path()) ==
        "# a comment\ndata_dir = /d = x\nhidden = 64,32\nlearning_rate = \nseed = 3\n");
  CHECK_FALSE(std::filesystem::exists((*run)->settings_path() + ".tmp"));
  auto back = (*run)->ReadSettings({"hidden", "seed"});
  REQUIRE_MESSAGE(back.ok(), back.status().ToString());
  REQUIRE(back->has_value());
  CHECK(**back == settings);
  CHECK((*run)->resuming());
}

TEST_CASE("WriteSettings refuses settings that would not read back as written; a settings_file outside the "
          "directory is refused") {
  TempDir tmp;
  auto run = OpenRunDirectory(tmp / "run");
  REQUIRE(run.ok());
  REQUIRE((*run)->WriteSettings({{"seed", "3"}}).ok());
  const std::string before = ReadFile((*run)->settings_path());
  for (const RunSettings& bad : std::vector<RunSettings>{{{"", "1"}},
                                                         {{"k=v", "1"}},
                                                         {{"#k", "1"}},
                                                         {{" k", "1"}},
                                                         {{"k", "x\ny"}},
                                                         {{"k", "x "}}}) {
    Status s = (*run)->WriteSettings(bad);
    CHECK_MESSAGE(absl::IsInvalidArgument(s), s.ToString());
    CHECK_MESSAGE(absl::StrContains(s.message(), (*run)->settings_path()), s.ToString());
    CHECK(ReadFile((*run)->settings_path()) == before);  // nothing written
  }
  for (const char* file : {"", "..", "../escape.txt", "sub/settings"}) {
    RunDirectoryOptions o;
    o.settings_file = file;
    auto refused = OpenRunDirectory(tmp / "other", o);
    CHECK_MESSAGE(absl::IsInvalidArgument(refused.status()), file);
    CHECK_FALSE(std::filesystem::exists(tmp / "other"));
  }
  CHECK_FALSE(std::filesystem::exists(tmp / "escape.txt"));
}

TEST_CASE("WriteSettings replaces the file atomically: a failed write leaves the previous settings and no "
          "temporary file") {
  TempDir tmp;
  FaultyEnv faulty(Env::Default());
  RunDirectoryOptions options;
  options.env = &faulty;
  auto run = OpenRunDirectory(tmp / "run", options);
  REQUIRE(run.ok());
  REQUIRE((*run)->WriteSettings({{"hidden", "4"}}).ok());
  EnvFault fault;
  fault.id = "rename";
  fault.path_pattern = "*/train_settings.txt*";
  fault.op = EnvOp::kRename;
  fault.nth = 1;
  REQUIRE(faulty.AddFault(fault).ok());
  Status s = (*run)->WriteSettings({{"hidden", "8"}});
  CHECK_FALSE(s.ok());
  CHECK(ReadFile(tmp / "run/train_settings.txt") == "hidden = 4\n");
  CHECK_FALSE(std::filesystem::exists(tmp / "run/train_settings.txt.tmp"));
}

TEST_CASE("a corrupt settings file is INVALID_ARGUMENT naming the file and line; an unreadable one is never taken "
          "for a missing one") {
  TempDir tmp;
  auto run = OpenRunDirectory(tmp / "run");
  REQUIRE(run.ok());
  const std::string path = (*run)->settings_path();
  struct Case {
    std::string text;
    std::string message;
  };
  const std::vector<Case> cases = {
      {"# ok\nhidden = 4\nno equals sign\n", path + ":3: expected 'key = value', found 'no equals sign'"},
      {"hidden = 4\n\x01\x02\n", path + ":2: expected 'key = value', found '\\x01\\x02'"},
      {"hidden = 4\nseed = 1\nhidden = 8\n", path + ":3: 'hidden' given twice"},
      {"seed = 1\n", path + ": missing 'hidden'"},
  };
  for (const Case& c : cases) {
    WriteFile(path, c.text);
    auto read = (*run)->ReadSettings({"hidden", "seed"});
    REQUIRE_FALSE(read.ok());
    CHECK(absl::IsInvalidArgument(read.status()));
    CHECK(read.status().message() == c.message);
  }
  // A stat that fails (EACCES) is returned: no "fresh directory".
  FaultyEnv faulty(Env::Default());
  EnvFault fault;
  fault.id = "eacces";
  fault.path_pattern = "*/train_settings.txt";
  fault.op = EnvOp::kStat;
  fault.error = EACCES;
  fault.nth = 1;
  REQUIRE(faulty.AddFault(fault).ok());
  (*run)->set_env(&faulty);
  auto denied = (*run)->ReadSettings();
  CHECK(absl::IsPermissionDenied(denied.status()));
}

TEST_CASE("CheckpointToRestore on a fresh directory: nothing; another program's checkpoints are refused") {
  TempDir tmp;
  {
    auto run = OpenRunDirectory(tmp / "empty");
    REQUIRE(run.ok());
    auto early = (*run)->CheckpointToRestore();
    CHECK(absl::IsFailedPrecondition(early.status()));  // ReadSettings first
    REQUIRE((*run)->ReadSettings().ok());
    bool refused = true;
    auto choice = (*run)->CheckpointToRestore(&refused);
    REQUIRE(choice.ok());
    CHECK_FALSE(choice->has_value());
    CHECK_FALSE(refused);
  }
  // Checkpoints without a settings file (a settings file deleted, another
  // program's run): a state file, or only model.ckpt-* files.
  TrainTo(tmp / "foreign", 10);
  std::filesystem::create_directories(tmp / "files");
  WriteFile(tmp / "files/model.ckpt-5.index", "");
  for (const std::string name : {"foreign", "files"}) {
    const std::string dir = tmp / name;
    auto run = OpenRunDirectory(dir);
    REQUIRE(run.ok());
    REQUIRE((*run)->ReadSettings().ok());
    bool refused = false;
    auto choice = (*run)->CheckpointToRestore(&refused);
    REQUIRE_FALSE(choice.ok());
    CHECK(absl::IsFailedPrecondition(choice.status()));
    CHECK(choice.status().message() ==
          absl::StrCat(dir, " holds checkpoints that foreman train did not write (no train_settings.txt): use "
                            "another --checkpoint-dir"));
    CHECK(refused);
  }
  // Another program names itself and its flag.
  RunDirectoryOptions mine;
  mine.program = "my_trainer";
  mine.directory_flag = "--model-dir";
  mine.settings_file = "settings.txt";
  auto run = OpenRunDirectory(tmp / "foreign", mine);
  REQUIRE(run.ok());
  REQUIRE((*run)->ReadSettings().ok());
  CHECK((*run)->CheckpointToRestore().status().message() ==
        absl::StrCat(tmp / "foreign", " holds checkpoints that my_trainer did not write (no settings.txt): use "
                                      "another --model-dir"));
  // The directory cannot be read: the Env's error, not a refusal.
  FaultyEnv faulty(Env::Default());
  EnvFault fault;
  fault.id = "eio";
  fault.path_pattern = "*/checkpoint";
  fault.op = EnvOp::kStat;
  fault.nth = 1;
  REQUIRE(faulty.AddFault(fault).ok());
  (*run)->set_env(&faulty);
  bool refused = true;
  auto unreadable = (*run)->CheckpointToRestore(&refused);
  CHECK(absl::IsInternal(unreadable.status()));
  CHECK_FALSE(refused);
}

TEST_CASE("CheckpointToRestore on a resumed run: the newest checkpoint that verifies; none yet is step 0; none "
          "left or none verifying is refused") {
  TempDir tmp;
  auto choose = [](const std::string& dir, bool* refused) {
    auto run = OpenRunDirectory(dir);
    REQUIRE(run.ok());
    auto stored = (*run)->ReadSettings({"hidden"});
    REQUIRE(stored.ok());
    REQUIRE(stored->has_value());
    REQUIRE((*run)->resuming());
    return (*run)->CheckpointToRestore(refused);
  };
  const std::string dir = tmp / "run";
  MakeRun(dir, 20);
  bool refused = true;
  auto latest = choose(dir, &refused);
  REQUIRE_MESSAGE(latest.ok(), latest.status().ToString());
  CHECK(**latest == dir + "/model.ckpt-20");
  CHECK_FALSE(refused);

  // Stopped before its first checkpoint: settings, no state file.
  const std::string early = tmp / "early";
  {
    auto run = OpenRunDirectory(early);
    REQUIRE(run.ok());
    REQUIRE((*run)->WriteSettings({{"hidden", "4"}}).ok());
  }
  auto none = choose(early, &refused);
  REQUIRE(none.ok());
  CHECK_FALSE(none->has_value());

  // The state file's checkpoints are gone.
  const std::string gone = tmp / "gone";
  MakeRun(gone, 10);
  for (const auto& entry : std::filesystem::directory_iterator(gone)) {
    if (absl::StartsWith(entry.path().filename().string(), "model.ckpt-")) std::filesystem::remove(entry.path());
  }
  auto missing = choose(gone, &refused);
  REQUIRE_FALSE(missing.ok());
  CHECK(absl::IsFailedPrecondition(missing.status()));
  CHECK(missing.status().message() ==
        absl::StrCat(gone, " holds a run (train_settings.txt) but the checkpoints its state file ", gone,
                     "/checkpoint names are gone (missing: ", gone, "/model.ckpt-0.index, ", gone,
                     "/model.ckpt-10.index): resuming would train again from step 0; to start fresh on purpose, "
                     "remove ",
                     gone, " or use another --checkpoint-dir"));
  CHECK(refused);

  // A state file that cannot be parsed, and nothing left.
  WriteFile(gone + "/checkpoint", "this is not a CheckpointState {");
  auto unreadable = choose(gone, &refused);
  REQUIRE_FALSE(unreadable.ok());
  CHECK(absl::IsFailedPrecondition(unreadable.status()));
  CHECK_MESSAGE(absl::StrContains(unreadable.status().message(),
                                  absl::StrCat(gone, " holds a run (train_settings.txt) but its state file ", gone,
                                               "/checkpoint cannot be read (")),
                unreadable.status().message());
  CHECK(absl::StrContains(unreadable.status().message(), ") and no checkpoint is left: resuming would train again"));

  // Every checkpoint corrupt: DATA_LOSS, each named, and how to start fresh.
  const std::string corrupt = tmp / "corrupt";
  MakeRun(corrupt, 10);
  for (const auto& entry : std::filesystem::directory_iterator(corrupt)) {
    const std::string name = entry.path().filename();
    if (absl::StartsWith(name, "model.ckpt-") && absl::StrContains(name, ".data-")) {
      std::string bytes = ReadFile(entry.path());
      REQUIRE_FALSE(bytes.empty());
      bytes[0] = static_cast<char>(bytes[0] ^ 0x5a);
      WriteFile(entry.path(), bytes);
    }
  }
  auto lost = choose(corrupt, &refused);
  REQUIRE_FALSE(lost.ok());
  CHECK(absl::IsDataLoss(lost.status()));
  CHECK_MESSAGE(absl::StartsWith(lost.status().message(), absl::StrCat("no checkpoint in ", corrupt, " can be restored")),
                lost.status().message());
  CHECK(absl::EndsWith(lost.status().message(),
                       absl::StrCat("; to start fresh on purpose, remove ", corrupt, " or use another --checkpoint-dir")));
  CHECK(refused);
}

TEST_CASE("CheckCheckpointMatches refuses a checkpoint without this model's variables or with other shapes") {
  TempDir tmp;
  const std::string dir = tmp / "run";
  MakeRun(dir, 10);  // global_step (int64 []) and w (float32 [])
  auto run = OpenRunDirectory(dir);
  REQUIRE(run.ok());
  const std::string prefix = dir + "/model.ckpt-10";
  CHECK((*run)->CheckCheckpointMatches(prefix, *testing::MakeGraph(std::make_shared<testing::Model>())).ok());

  Graph other;
  REQUIRE(other.CreateGlobalStep().ok());
  REQUIRE(other.AddVariable("v", Tensor::Scalar<float>(0)).ok());
  Status missing = (*run)->CheckCheckpointMatches(prefix, other);
  CHECK(absl::IsFailedPrecondition(missing));
  CHECK(missing.message() == absl::StrCat(prefix, " has no variable 'v' of this model: it holds another run; use "
                                                  "another --checkpoint-dir"));

  Graph shaped;
  REQUIRE(shaped.CreateGlobalStep().ok());
  REQUIRE(shaped.AddVariable("w", Tensor(DataType::kFloat, {2, 3})).ok());
  Status shape = (*run)->CheckCheckpointMatches(prefix, shaped);
  CHECK(absl::IsFailedPrecondition(shape));
  CHECK(shape.message() == absl::StrCat(prefix, " holds 'w' as float32 [], this model needs float32 [2,3] "
                                                "(train_settings.txt does not describe these checkpoints); use "
                                                "another --checkpoint-dir"));
  // Local variables are not checkpointed; a prefix that does not open is left to the restore.
  Graph local;
  REQUIRE(local.AddLocalVariable("scratch", Tensor::Scalar<float>(0)).ok());
  CHECK((*run)->CheckCheckpointMatches(prefix, local).ok());
  CHECK((*run)->CheckCheckpointMatches(dir + "/model.ckpt-999", shaped).ok());
}

}  // namespace
}  // namespace foreman
