// The `foreman` command-line tool: parses flags, then calls the library.
#include <cstdio>
#include <iostream>
#include <string>

#include <CLI/CLI.hpp>

#include "command.hpp"
#include "foreman/version.hpp"

int main(int argc, char** argv) {
  CLI::App app{"Foreman: fault-tolerant training runtime (TensorFlow's MonitoredTrainingSession, in C++)",
               "foreman"};
  app.set_version_flag("--version", std::string("foreman ") + FOREMAN_VERSION);
  app.require_subcommand(0, 1);

  int exit_code = foreman::cli::kExitOk;
  foreman::cli::AddChaosCommand(app, &exit_code);
  foreman::cli::AddClusterCommand(app, &exit_code);
  foreman::cli::AddDevicesCommand(app, &exit_code);
  foreman::cli::AddEventsCommand(app, &exit_code);
  foreman::cli::AddInspectCommand(app, &exit_code);
  foreman::cli::AddTrainCommand(app, &exit_code);

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
    return foreman::cli::kExitUsage;
  }
  if (app.get_subcommands().empty()) {
    std::cerr << app.help();
    return foreman::cli::kExitUsage;
  }
  return exit_code;
}
