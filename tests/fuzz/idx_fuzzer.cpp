// libFuzzer target: IDX files (foreman::data::ParseIdx) and the gzip layer in
// front of them (ReadIdxFile), as `foreman train` reads Fashion-MNIST. Any
// outcome but a crash, a hang or a sanitizer report is fine: errors must be
// clean Statuses, and no allocation may exceed what the input can fill
// (dims are checked against the bytes present before allocating).
//
// Seeds (make_corpus): small valid IDX files, plain and gzipped.
#include <cstddef>
#include <cstdint>
#include <string>

#include "foreman/dataset.hpp"
#include "foreman/mem_env.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  auto parsed = foreman::data::ParseIdx(bytes, "fuzz.idx");
  if (parsed.ok()) (void)parsed->DebugString();

  // The same bytes as a file: gunzipped first when they start with 1f 8b.
  foreman::MemEnv env;
  if (!foreman::WriteStringToFile(&env, "/fuzz-idx3-ubyte.gz", bytes).ok()) return 0;
  auto read = foreman::data::ReadIdxFile(&env, "/fuzz-idx3-ubyte.gz");
  // Only when pixels exist: then N <= the input size, and so is what it costs.
  if (read.ok() && read->shape().rank() == 3 && read->num_elements() > 0) {
    // Through Dataset as well: one batch of what was read.
    foreman::data::LabeledImages images;
    images.labels = foreman::Tensor(foreman::DataType::kUInt8, foreman::TensorShape({read->shape().dim(0)}));
    images.images = *std::move(read);
    foreman::data::DatasetOptions options;
    options.batch_size = 4;
    auto ds = foreman::data::Dataset::Create(std::move(images), options);
    if (ds.ok()) (void)(*ds)->GetBatch({0, 0});
  }
  return 0;
}
