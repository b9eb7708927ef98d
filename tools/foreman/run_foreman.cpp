// The whole `foreman` program (command.hpp): the flags of every subcommand,
// the usage errors, the exit code. main.cpp is only its entry point, so that
// a test build of the program (tests/support/foreman_testing_main.cpp) runs
// the same code.
#include <iostream>
#include <string>

#include <CLI/CLI.hpp>

#include "command.hpp"
#include "foreman/version.hpp"

namespace foreman::cli {

int RunForeman(int argc, char** argv) {
  CLI::App app{"Foreman: fault-tolerant training runtime (TensorFlow's MonitoredTrainingSession, in C++)",
               "foreman"};
  app.set_version_flag("--version", std::string("foreman ") + FOREMAN_VERSION);
  app.require_subcommand(0, 1);

  int exit_code = kExitOk;
  AddChaosCommand(app, &exit_code);
  AddClusterCommand(app, &exit_code);
  AddDevicesCommand(app, &exit_code);
  AddEventsCommand(app, &exit_code);
  AddInspectCommand(app, &exit_code);
  AddTrainCommand(app, &exit_code);

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::cerr << "foreman: error: " << e.what() << "\n"
              << "Run 'foreman --help' for usage.\n";
    return kExitUsage;
  }
  if (app.get_subcommands().empty()) {
    std::cerr << app.help();
    return kExitUsage;
  }
  return exit_code;
}

}  // namespace foreman::cli
