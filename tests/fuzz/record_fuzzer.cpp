// libFuzzer target: TFRecord framing + Event/Summary parsing, as
// `foreman events` reads a file. The fuzz build skips CRC checks
// (FOREMAN_FUZZING_BUILD_MODE) so inputs reach the parsers. Any outcome but
// a crash, a hang or a sanitizer report is fine: errors must be clean Status.
#include <cstddef>
#include <cstdint>
#include <string>

#include <google/protobuf/stubs/logging.h>

#include "foreman/event_reader.hpp"
#include "foreman/mem_env.hpp"

// Protobuf logs every string field with invalid UTF-8 to stderr; that is
// expected for random inputs and only slows the fuzzer down.
extern "C" int LLVMFuzzerInitialize(int*, char***) {
  google::protobuf::SetLogHandler(nullptr);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  foreman::MemEnv env;
  const std::string path = "/events.out.tfevents.0000000000.fuzz";
  if (!foreman::WriteStringToFile(&env, path, std::string(reinterpret_cast<const char*>(data), size)).ok()) {
    return 0;
  }
  for (bool allow_truncated_tail : {false, true}) {
    auto events = foreman::ReadEventFile(&env, path, allow_truncated_tail);
    if (events.ok()) {
      for (const auto& e : *events) {
        for (const auto& v : e.values) (void)v.tag.size();
      }
    }
  }
  return 0;
}
