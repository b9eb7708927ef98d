// A test build of the `foreman` program (tests/chaos_cli_test.sh, part 3):
// the same program, with the chaos command's first-exit hook set to flip one
// byte in the middle of the latest checkpoint's data file after a seed's
// first process exits, so that the checkpoints_verify invariant must fail
// and the CLI must report it (exit 1, the failure named, the replay line).
// The installed `foreman` has no such hook set and reads no test knob.
#include <fstream>
#include <optional>
#include <string>

#include "command.hpp"
#include "foreman/bundle.hpp"
#include "foreman/checkpoint.hpp"
#include "foreman/env.hpp"

namespace {

void CorruptLatestCheckpoint(const std::string& run_dir) {
  auto latest = foreman::LatestCheckpoint(foreman::Env::Default(), run_dir);
  if (!latest.ok() || !latest->has_value()) return;
  std::fstream f(foreman::BundleDataPath(**latest), std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(0, std::ios::end);
  const std::streamoff size = f.tellg();
  if (size <= 0) return;
  f.seekg(size / 2);
  char c = 0;
  f.read(&c, 1);
  c = static_cast<char>(c ^ 0x5a);
  f.seekp(size / 2);
  f.write(&c, 1);
}

}  // namespace

int main(int argc, char** argv) {
  foreman::cli::SetChaosFirstExitHookForTest(&CorruptLatestCheckpoint);
  return foreman::cli::RunForeman(argc, argv);
}
