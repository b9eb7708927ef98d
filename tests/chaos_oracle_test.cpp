// The chaos harness's independent oracle (src/fault/chaos_oracle.hpp) on
// bundles our checkpoints never hold: a string tensor (written by
// BundleWriter, TF's layout) and complex64/complex128 tensors (an index built
// by hand with LevelDB's TableBuilder). Each must verify whole and fail its
// CRC32C (or its size) when one byte of it is changed; and the state file's
// quoted paths are read with the text format's escapes.
#include "fault/chaos_oracle.hpp"

#include <doctest/doctest.h>

#include <leveldb/env.h>
#include <leveldb/options.h>
#include <leveldb/table_builder.h>

#include <map>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "foreman/bundle.hpp"
#include "foreman/crc32c.hpp"
#include "foreman/mem_env.hpp"
#include "foreman/record.hpp"
#include "foreman/tensor.hpp"
#include "support/leveldb_string_file.hpp"
#include "support/test_util.hpp"
#include "tensor_bundle.pb.h"

namespace foreman::internal {
namespace {

// Flips one bit of the byte at `offset` of the file at `path`.
void FlipByte(Env* env, const std::string& path, std::size_t offset) {
  auto bytes = env->ReadFileToString(path);
  REQUIRE(bytes.ok());
  REQUIRE(offset < bytes->size());
  (*bytes)[offset] = static_cast<char>((*bytes)[offset] ^ 0x04);
  REQUIRE(WriteStringToFile(env, path, *bytes).ok());
}

using StringSink = testing::LevelDbStringFile;

// The index of a one-shard bundle whose data file is `data`, each entry
// (TF dtype number, dims, offset, size) with the masked CRC32C of its bytes.
struct RawEntry {
  int dtype;
  std::vector<int64_t> dims;
  int64_t offset;
  int64_t size;
};
std::string RawIndex(const std::map<std::string, RawEntry>& entries, const std::string& data) {
  proto::BundleHeaderProto header;
  header.set_num_shards(1);
  header.mutable_version()->set_producer(1);
  StringSink sink;
  leveldb::Options options;
  options.compression = leveldb::kNoCompression;
  leveldb::TableBuilder builder(options, &sink);
  builder.Add("", header.SerializeAsString());
  for (const auto& [name, r] : entries) {
    proto::BundleEntryProto e;
    e.set_dtype(static_cast<proto::DataType>(r.dtype));
    for (int64_t d : r.dims) e.mutable_shape()->add_dim()->set_size(d);
    e.set_offset(r.offset);
    e.set_size(r.size);
    e.set_crc32c(crc32c::Mask(crc32c::Value(data.data() + r.offset, static_cast<std::size_t>(r.size))));
    builder.Add(name, e.SerializeAsString());
  }
  REQUIRE(builder.Finish().ok());
  return sink.data;
}

// Three records framed by RecordWriter, as an event file holds them.
std::string ThreeRecords() {
  MemEnv env;
  auto file = env.NewWritableFile("/r");
  REQUIRE_OK(file.status());
  RecordWriter w(file->get());
  for (const char* d : {"first", "", "the third record, a little longer"}) REQUIRE_OK(w.WriteRecord(d));
  REQUIRE_OK((*file)->Close());
  auto bytes = env.ReadFileToString("/r");
  REQUIRE_OK(bytes.status());
  return *bytes;
}

TEST_CASE("OracleCheckRecords: whole records pass; a cut header, a cut record, a flipped byte and a cut record "
          "followed by more (the old retry's file) are DATA_LOSS at their byte") {
  const std::string whole = ThreeRecords();
  CHECK_OK(OracleCheckRecords(whole));
  CHECK_OK(OracleCheckRecords(""));
  const std::size_t first = 12 + 5 + 4;  // the first record's bytes
  auto loss = [](const std::string& bytes, const std::string& what) {
    const Status s = OracleCheckRecords(bytes);
    CHECK_MESSAGE(absl::IsDataLoss(s), s);
    CHECK_MESSAGE(absl::StrContains(s.message(), what), s);
  };
  loss(whole.substr(0, first + 7), "record 1 at byte 21: a cut header (7 of 12 bytes)");
  loss(whole.substr(0, whole.size() - 1), "record 2 at byte 37: cut");
  std::string flipped = whole;
  flipped[first + 12 + 4 + 12 + 3] ^= 0x01;  // a byte of the third record's data
  loss(flipped, "record 2 at byte 37: its data fails its CRC32C");
  std::string length = whole;
  length[first] ^= 0x01;
  loss(length, "record 1 at byte 21: its length fails its CRC32C");
  // Half of the third record, then all of it: what a retry after a failed
  // append once left.
  const std::string third = whole.substr(37);
  loss(whole.substr(0, 37) + third.substr(0, third.size() / 2) + third, "record 2 at byte 37");
}

TEST_CASE("a string tensor is CRC-checked: its lengths, their checksum and its bytes") {
  MemEnv env;
  REQUIRE(env.RecursivelyCreateDir("/ckpt").ok());
  const std::string prefix = "/ckpt/model.ckpt-7";
  {
    auto w = BundleWriter::Create(&env, prefix);
    REQUIRE(w.ok());
    auto f = Tensor::FromVector<float>({1.5f, -2.0f}, TensorShape{2});
    auto s = Tensor::FromVector<std::string>({"alpha", "", "a longer string of bytes"}, TensorShape{3});
    REQUIRE(f.ok());
    REQUIRE(s.ok());
    REQUIRE((*w)->Add("a/float", *f).ok());
    REQUIRE((*w)->Add("b/strings", *s).ok());
    REQUIRE((*w)->Finish().ok());
  }
  REQUIRE(OracleVerifyBundle(&env, prefix).ok());
  const std::string data = BundleDataPath(prefix);
  auto bytes = env.ReadFileToString(data);
  REQUIRE(bytes.ok());
  // The data file: 8 bytes of float, then the strings: 3 varint lengths,
  // 4 bytes of their checksum, 29 bytes of strings.
  REQUIRE(bytes->size() == 8 + 3 + 4 + 29);

  SUBCASE("a changed byte of a string") {
    FlipByte(&env, data, bytes->size() - 3);
    const Status s = OracleVerifyBundle(&env, prefix);
    CHECK(absl::IsDataLoss(s));
    CHECK(absl::StrContains(s.message(), "tensor 'b/strings' fails its CRC32C"));
  }
  SUBCASE("a changed byte of the lengths' checksum") {
    FlipByte(&env, data, 8 + 3 + 1);
    const Status s = OracleVerifyBundle(&env, prefix);
    CHECK(absl::IsDataLoss(s));
    CHECK(absl::StrContains(s.message(), "tensor 'b/strings': the string lengths fail their CRC32C"));
  }
  SUBCASE("a changed length") {
    FlipByte(&env, data, 8);  // "alpha": 5 -> 1
    const Status s = OracleVerifyBundle(&env, prefix);
    CHECK(absl::IsDataLoss(s));
    CHECK(absl::StrContains(s.message(), "tensor 'b/strings'"));
  }
}

TEST_CASE("complex64 and complex128 tensors are sized and CRC-checked") {
  MemEnv env;
  REQUIRE(env.RecursivelyCreateDir("/ckpt").ok());
  const std::string prefix = "/ckpt/model.ckpt-3";
  std::string data;
  for (int i = 0; i < 16 + 32; ++i) data.push_back(static_cast<char>(i * 7 + 1));
  // complex64 [2] (16 bytes), complex128 [2] (32 bytes); TF's numbers 8, 18.
  std::map<std::string, RawEntry> entries = {{"c64", {8, {2}, 0, 16}}, {"c128", {18, {2}, 16, 32}}};
  REQUIRE(WriteStringToFile(&env, BundleDataPath(prefix), data).ok());
  REQUIRE(WriteStringToFile(&env, BundleIndexPath(prefix), RawIndex(entries, data)).ok());
  REQUIRE(OracleVerifyBundle(&env, prefix).ok());

  SUBCASE("a changed byte of each") {
    for (const auto& [name, at] : std::map<std::string, std::size_t>{{"c64", 5}, {"c128", 40}}) {
      CAPTURE(name);
      REQUIRE(WriteStringToFile(&env, BundleDataPath(prefix), data).ok());
      FlipByte(&env, BundleDataPath(prefix), at);
      const Status s = OracleVerifyBundle(&env, prefix);
      CHECK(absl::IsDataLoss(s));
      CHECK(absl::StrContains(s.message(), "tensor '" + name + "' fails its CRC32C"));
    }
  }
  SUBCASE("a complex128 entry sized as complex64") {
    entries = {{"c64", {8, {2}, 0, 16}}, {"c128", {18, {2}, 16, 16}}};
    const std::string short_data = data.substr(0, 32);
    REQUIRE(WriteStringToFile(&env, BundleDataPath(prefix), short_data).ok());
    REQUIRE(WriteStringToFile(&env, BundleIndexPath(prefix), RawIndex(entries, short_data)).ok());
    const Status s = OracleVerifyBundle(&env, prefix);
    CHECK(absl::IsDataLoss(s));
    CHECK(absl::StrContains(s.message(), "tensor 'c128' has 16 bytes, its shape needs 32"));
  }
}

TEST_CASE("the state file's quoted paths follow the text format's escapes") {
  MemEnv env;
  REQUIRE(env.RecursivelyCreateDir("/d").ok());
  REQUIRE(WriteStringToFile(&env, "/d/checkpoint",
                            "model_checkpoint_path: \"we\\\"ird\\\\x\\101\\x42\\n-5\"\n"
                            "all_model_checkpoint_paths: 'model.ckpt-4'\n")
              .ok());
  auto d = OracleReadDirectory(&env, "/d");
  REQUIRE(d.ok());
  CHECK(d->state_error.empty());
  CHECK(d->latest == "/d/we\"ird\\xAB\n-5");
  REQUIRE(d->listed.size() == 1);
  CHECK(d->listed[0] == "/d/model.ckpt-4");
}

}  // namespace
}  // namespace foreman::internal
