// libFuzzer target: the checkpoint reader (LevelDB-format index, bundle
// entries, data file, string tensors) and the `checkpoint` state file.
//
// Input layout: uint16 LE n, then n bytes of `.index`, then the rest is the
// `.data-00000-of-00001` file. The seed corpus (tests/fuzz/corpus/checkpoint)
// holds valid bundles in this layout, made by make_corpus.sh. The fuzz build
// skips CRC checks (FOREMAN_FUZZING_BUILD_MODE) so inputs reach the decoders.
#include <cstddef>
#include <cstdint>
#include <string>

#include <google/protobuf/stubs/logging.h>

#include "foreman/bundle.hpp"
#include "foreman/checkpoint.hpp"
#include "foreman/mem_env.hpp"

// Protobuf logs every string field with invalid UTF-8 to stderr; that is
// expected for random inputs and only slows the fuzzer down.
extern "C" int LLVMFuzzerInitialize(int*, char***) {
  google::protobuf::SetLogHandler(nullptr);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  const size_t index_size = std::min<size_t>(size - 2, data[0] | (size_t{data[1]} << 8));
  const char* bytes = reinterpret_cast<const char*>(data) + 2;
  const std::string index(bytes, index_size);
  const std::string payload(bytes + index_size, size - 2 - index_size);

  foreman::MemEnv env;
  const std::string prefix = "/ckpt/model.ckpt-1";
  if (!env.CreateDir("/ckpt").ok() ||
      !foreman::WriteStringToFile(&env, foreman::BundleIndexPath(prefix), index).ok() ||
      !foreman::WriteStringToFile(&env, foreman::BundleDataPath(prefix), payload).ok()) {
    return 0;
  }
  auto reader = foreman::BundleReader::Open(&env, prefix);
  if (reader.ok()) {
    for (const auto& entry : (*reader)->entries()) {
      auto t = (*reader)->Lookup(entry.name);
      if (t.ok()) (void)t->DebugString();
    }
  }
  // The same bytes as a state file: the text-format parser must fail cleanly.
  if (foreman::WriteStringToFile(&env, "/ckpt/checkpoint", payload).ok()) {
    (void)foreman::LatestCheckpoint(&env, "/ckpt");
  }
  return 0;
}
