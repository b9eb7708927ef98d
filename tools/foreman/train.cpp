// TODO(issue 5): stub — `foreman train`
#include "command.hpp"

namespace foreman::cli {
void AddTrainCommand(CLI::App& app, int* exit_code) {
  (void)app;
  (void)exit_code;
}
}  // namespace foreman::cli
