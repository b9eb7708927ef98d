// The `foreman` command-line tool: parses flags, then calls the library
// (run_foreman.cpp has the program).
#include "command.hpp"

int main(int argc, char** argv) { return foreman::cli::RunForeman(argc, argv); }
