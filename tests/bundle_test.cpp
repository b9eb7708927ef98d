// Tests for BundleWriter / BundleReader (include/foreman/bundle.hpp): TF's V2
// checkpoint format, checked against real TF-written bundles (the serving
// half_plus_three and half_plus_two_mkl checkpoints, embedded below), and
// against indexes built by hand with LevelDB's TableBuilder.
#include "foreman/bundle.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <leveldb/comparator.h>
#include <leveldb/options.h>
#include <leveldb/table_builder.h>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "formats/bundle/leveldb_env.hpp"
#include "support/leveldb_string_file.hpp"
#include "foreman/crc32c.hpp"
#include "foreman/fault.hpp"
#include "foreman/mem_env.hpp"
#include "support/test_util.hpp"
#include "tensor_bundle.pb.h"

namespace foreman {
namespace {

// -- golden files written by TensorFlow ----------------------------------------------

// tensorflow/serving .../saved_model_half_plus_three/00000123/variables/:
// a = 0.5, b = 3.0, c = 3.0 (float32 scalars) at offsets 0, 4, 8.
constexpr char kHalfPlusThreeIndexHex[] =
    "00000608011a02080100010b61080112002804350638271f00010d62080112002004280435efd682c300010d63080112"
    "002008280435efd682c3000000000100000000c1e619df000000000100000000c0f2a1b0000102640042000000000100"
    "00000058b2e9f74708540e00000000000000000000000000000000000000000000000000000000000000000000000057"
    "fb808b247547db";
constexpr char kHalfPlusThreeDataHex[] = "0000003f0000404000004040";

// .../saved_model_half_plus_two_mkl/00000123/variables/: a, b, c scalars;
// conv2d{,_1,_2}/bias [1]; conv2d{,_1,_2}/kernel [1,1,1,1].
constexpr char kHalfPlusTwoMklIndexHex[] =
    "00000608011a02080100010b61080112002804350638271f00010d6208011200200428043510fd784f00010d63080112"
    "002008280435efd682c3010a116f6e7632642f626961730801120412020801200c280435a67b113a07061d6b65726e65"
    "6c0801121012020801120208011202080112020801201028043507c971800607115f312f626961730801120412020801"
    "2014280435a67b113a09061d6b65726e656c080112101202080112020801120208011202080120182804359455bb3307"
    "0611322f626961730801120412020801201c280435a67b113a09061d6b65726e656c0801121012020801120208011202"
    "0801120208012020280435eb0e6aff0000000001000000007aa78759000000000100000000c0f2a1b000010364008702"
    "000000000100000000195830a88c020899020f0000000000000000000000000000000000000000000000000000000000"
    "000000000057fb808b247547db";
constexpr char kHalfPlusTwoMklDataHex[] = "0000003f000000400000404000000000bebb05bf000000003bc685bf000000000bfac93f";

// -- helpers ---------------------------------------------------------------------------

std::string Msg(const Status& s) { return std::string(s.message()); }

std::string Read(Env* env, const std::string& path) {
  auto s = env->ReadFileToString(path);
  REQUIRE_MESSAGE(s.ok(), s.status().ToString());
  return *s;
}

void Write(Env* env, const std::string& path, const std::string& contents) {
  REQUIRE(WriteStringToFile(env, path, contents).ok());
}

/// A MemEnv with the directory /ckpt.
struct Fixture {
  Fixture() { REQUIRE(env.RecursivelyCreateDir("/ckpt").ok()); }
  MemEnv env;
};

void WriteBundle(Env* env, const std::string& prefix, const std::vector<std::pair<std::string, Tensor>>& tensors) {
  auto w = BundleWriter::Create(env, prefix);
  REQUIRE_MESSAGE(w.ok(), w.status().ToString());
  for (const auto& [name, t] : tensors) REQUIRE_MESSAGE((*w)->Add(name, t).ok(), name);
  REQUIRE((*w)->Finish().ok());
}

std::unique_ptr<BundleReader> Open(Env* env, const std::string& prefix) {
  auto r = BundleReader::Open(env, prefix);
  REQUIRE_MESSAGE(r.ok(), r.status().ToString());
  return *std::move(r);
}

Tensor Lookup(const BundleReader& r, const std::string& name) {
  auto t = r.Lookup(name);
  REQUIRE_MESSAGE(t.ok(), t.status().ToString());
  return *std::move(t);
}

template <class T>
Tensor Make(const std::vector<T>& values, TensorShape shape) {
  auto t = Tensor::FromVector(values, std::move(shape));
  REQUIRE(t.ok());
  return *std::move(t);
}

using StringFile = testing::LevelDbStringFile;  // a string sink for LevelDB's TableBuilder

proto::BundleHeaderProto Header(int num_shards = 1) {
  proto::BundleHeaderProto h;
  h.set_num_shards(num_shards);
  h.mutable_version()->set_producer(1);
  return h;
}

proto::BundleEntryProto Entry(DataType dtype, const std::vector<int64_t>& dims, int64_t offset,
                              absl::string_view bytes, int shard = 0) {
  proto::BundleEntryProto e;
  e.set_dtype(static_cast<proto::DataType>(dtype));
  for (int64_t d : dims) e.mutable_shape()->add_dim()->set_size(d);
  e.set_shard_id(shard);
  e.set_offset(offset);
  e.set_size(static_cast<int64_t>(bytes.size()));
  e.set_crc32c(crc32c::Mask(crc32c::Value(bytes.data(), bytes.size())));
  return e;
}

/// An index table built by hand: header, then `entries` in key order.
std::string BuildIndex(const proto::BundleHeaderProto& header,
                       const std::map<std::string, proto::BundleEntryProto>& entries,
                       leveldb::CompressionType compression = leveldb::kNoCompression) {
  StringFile file;
  leveldb::Options options;
  options.compression = compression;
  leveldb::TableBuilder builder(options, &file);
  builder.Add("", header.SerializeAsString());
  for (const auto& [name, e] : entries) builder.Add(name, e.SerializeAsString());
  REQUIRE(builder.Finish().ok());
  return file.data;
}

/// A comparator that lets TableBuilder take keys in any order (its asserts
/// check the order); the table format itself does not record it.
class AnyOrderComparator : public leveldb::Comparator {
 public:
  int Compare(const leveldb::Slice&, const leveldb::Slice&) const override { return 1; }
  const char* Name() const override { return "leveldb.BytewiseComparator"; }
  void FindShortestSeparator(std::string*, const leveldb::Slice&) const override {}
  void FindShortSuccessor(std::string*) const override {}
};

/// As BuildIndex, with `entries` added as given: duplicate or unsorted keys.
std::string BuildRawIndex(const proto::BundleHeaderProto& header,
                          const std::vector<std::pair<std::string, proto::BundleEntryProto>>& entries) {
  static const AnyOrderComparator any_order;
  StringFile file;
  leveldb::Options options;
  options.comparator = &any_order;
  options.compression = leveldb::kNoCompression;
  leveldb::TableBuilder builder(options, &file);
  builder.Add("", header.SerializeAsString());
  for (const auto& [name, e] : entries) builder.Add(name, e.SerializeAsString());
  REQUIRE(builder.Finish().ok());
  return file.data;
}


/// A read-only file of `size` zero bytes, stored nowhere.
class ZeroFile : public RandomAccessFile {
 public:
  explicit ZeroFile(uint64_t size) : size_(size) {}
  StatusOr<absl::string_view> Read(uint64_t offset, std::size_t n, char* scratch) const override {
    if (offset > size_) return absl::OutOfRangeError("past the end");
    n = static_cast<std::size_t>(std::min<uint64_t>(n, size_ - offset));
    std::memset(scratch, 0, n);
    return absl::string_view(scratch, n);
  }
  uint64_t Size() const override { return size_; }

 private:
  uint64_t size_;
};

/// A MemEnv in which `path` opens as a ZeroFile of `size` bytes.
class HugeFileEnv : public MemEnv {
 public:
  HugeFileEnv(std::string path, uint64_t size) : path_(std::move(path)), size_(size) {}
  StatusOr<std::unique_ptr<RandomAccessFile>> NewRandomAccessFile(const std::string& path) override {
    if (path != path_) return MemEnv::NewRandomAccessFile(path);
    return std::unique_ptr<RandomAccessFile>(new ZeroFile(size_));
  }

 private:
  std::string path_;
  uint64_t size_;
};

std::string FloatBytes(std::initializer_list<float> values) {
  std::string out;
  for (float v : values) out.append(reinterpret_cast<const char*>(&v), sizeof(v));
  return out;
}

// -- round trips -----------------------------------------------------------------------

TEST_CASE("every dtype and shape round-trips through a bundle") {
  Fixture f;
  const std::string long_string(300, 'x');   // varint length of 2 bytes
  std::vector<std::pair<std::string, Tensor>> tensors = {
      {"f32", Make<float>({1.5f, -2.25f, 3e38f, 0.0f, -0.0f, 7.0f}, {2, 3})},
      {"f64", Tensor::Scalar<double>(3.141592653589793)},
      {"i32", Make<int32_t>({INT32_MIN, -1, 0, INT32_MAX}, {4})},
      {"i64", Tensor::Scalar<int64_t>(INT64_MIN)},
      {"u8", Make<uint8_t>({0, 127, 128, 255}, {2, 2})},
      {"str", Make<std::string>({"", "a", long_string, std::string("nul\0byte", 8), ""}, {5})},
      {"str_scalar", Tensor::Scalar<std::string>("hello")},
      {"str_empty", Tensor(DataType::kString, {0})},
      {"empty", Tensor(DataType::kFloat, {0})},
      {"cube", Tensor(DataType::kInt64, {2, 3, 4})},
  };
  int64_t* cube = tensors.back().second.data<int64_t>();
  for (int i = 0; i < 24; ++i) cube[i] = int64_t{i} * 1000000007;
  WriteBundle(&f.env, "/ckpt/model", tensors);

  auto r = Open(&f.env, "/ckpt/model");
  REQUIRE(r->entries().size() == tensors.size());
  for (std::size_t i = 1; i < r->entries().size(); ++i) CHECK(r->entries()[i - 1].name < r->entries()[i].name);
  for (const auto& [name, t] : tensors) {
    CAPTURE(name);
    Tensor got = Lookup(*r, name);
    CHECK(got.Equals(t));
    auto e = r->GetEntry(name);
    REQUIRE(e.ok());
    CHECK(e->dtype == t.dtype());
    CHECK(e->shape == t.shape());
  }
  CHECK(r->VerifyAll().ok());
  CHECK(r->Contains("cube"));
  CHECK_FALSE(r->Contains("nope"));
  auto missing = r->Lookup("nope");
  CHECK(missing.status().code() == absl::StatusCode::kNotFound);
  CHECK(Msg(missing.status()) == "/ckpt/model.index: no variable 'nope' in checkpoint");
}

TEST_CASE("string tensors use TF's layout: varint lengths, masked CRC of uint32 lengths, bytes") {
  Fixture f;
  const std::string big(200, 'z');
  WriteBundle(&f.env, "/ckpt/s", {{"s", Make<std::string>({"ab", "", big}, {3})}});
  const std::string data = Read(&f.env, BundleDataPath("/ckpt/s"));

  // Lengths: 2, 0, 200 = varint c8 01.
  std::string expected("\x02\x00\xc8\x01", 4);
  uint32_t crc = 0;
  for (uint32_t len : {2u, 0u, 200u}) crc = crc32c::Extend(crc, reinterpret_cast<const char*>(&len), 4);
  const uint32_t length_crc = crc32c::Mask(crc);
  expected.append(reinterpret_cast<const char*>(&length_crc), 4);
  crc = crc32c::Extend(crc, reinterpret_cast<const char*>(&length_crc), 4);
  expected += "ab" + big;
  crc = crc32c::Extend(crc, ("ab" + big).data(), 202);
  CHECK(data == expected);

  auto e = Open(&f.env, "/ckpt/s")->GetEntry("s");
  REQUIRE(e.ok());
  CHECK(e->offset == 0);
  CHECK(e->size == static_cast<int64_t>(expected.size()));
  CHECK(e->masked_crc32c == crc32c::Mask(crc));
}

TEST_CASE("TF2 object-based names and the object graph string are plain keys") {
  Fixture f;
  const std::string kernel = "layer_with_weights-0/kernel/.ATTRIBUTES/VARIABLE_VALUE";
  const std::string graph_bytes("\x0a\x05\x12\x03\x00\xff", 6);   // a serialized proto: any bytes
  WriteBundle(&f.env, "/ckpt/ckpt-1",
              {{kernel, Make<float>({1, 2}, {1, 2})},
               {"_CHECKPOINTABLE_OBJECT_GRAPH", Tensor::Scalar<std::string>(graph_bytes)},
               {"save_counter/.ATTRIBUTES/VARIABLE_VALUE", Tensor::Scalar<int64_t>(1)}});
  auto r = Open(&f.env, "/ckpt/ckpt-1");
  REQUIRE(r->entries().size() == 3);
  CHECK(r->entries()[0].name == "_CHECKPOINTABLE_OBJECT_GRAPH");
  CHECK(r->entries()[1].name == kernel);
  Tensor graph = Lookup(*r, "_CHECKPOINTABLE_OBJECT_GRAPH");
  CHECK(graph.dtype() == DataType::kString);
  CHECK(graph.shape().rank() == 0);
  CHECK(*graph.data<std::string>() == graph_bytes);
  CHECK(Lookup(*r, kernel).Equals(Make<float>({1, 2}, {1, 2})));
}

// -- golden files from TensorFlow ------------------------------------------------------

TEST_CASE("a TF-written bundle (serving half_plus_three) reads, and our writer reproduces it byte for byte") {
  Fixture f;
  const std::string index = absl::HexStringToBytes(kHalfPlusThreeIndexHex);
  const std::string data = absl::HexStringToBytes(kHalfPlusThreeDataHex);
  REQUIRE(index.size() == 151);
  Write(&f.env, "/ckpt/variables.index", index);
  Write(&f.env, "/ckpt/variables.data-00000-of-00001", data);

  auto r = Open(&f.env, "/ckpt/variables");
  REQUIRE(r->entries().size() == 3);
  const std::vector<std::pair<std::string, float>> expected = {{"a", 0.5f}, {"b", 3.0f}, {"c", 3.0f}};
  for (std::size_t i = 0; i < 3; ++i) {
    const BundleEntry& e = r->entries()[i];
    CHECK(e.name == expected[i].first);
    CHECK(e.dtype == DataType::kFloat);
    CHECK(e.shape == TensorShape{});
    CHECK(e.shard_id == 0);
    CHECK(e.offset == static_cast<int64_t>(4 * i));   // "a" has offset 0 omitted (proto3)
    CHECK(e.size == 4);
    CHECK(*Lookup(*r, e.name).scalar<float>() == expected[i].second);
  }
  CHECK(r->VerifyAll().ok());

  WriteBundle(&f.env, "/ckpt/ours",
              {{"a", Tensor::Scalar(0.5f)}, {"b", Tensor::Scalar(3.0f)}, {"c", Tensor::Scalar(3.0f)}});
  CHECK(absl::BytesToHexString(Read(&f.env, "/ckpt/ours.index")) == kHalfPlusThreeIndexHex);
  CHECK(Read(&f.env, "/ckpt/ours.data-00000-of-00001") == data);
}

TEST_CASE("a TF-written bundle with prefix-compressed keys (half_plus_two_mkl) reads and is reproduced") {
  Fixture f;
  Write(&f.env, "/ckpt/variables.index", absl::HexStringToBytes(kHalfPlusTwoMklIndexHex));
  Write(&f.env, "/ckpt/variables.data-00000-of-00001", absl::HexStringToBytes(kHalfPlusTwoMklDataHex));
  auto r = Open(&f.env, "/ckpt/variables");
  std::vector<std::string> names;
  for (const BundleEntry& e : r->entries()) names.push_back(e.name);
  CHECK(names == std::vector<std::string>{"a", "b", "c", "conv2d/bias", "conv2d/kernel", "conv2d_1/bias",
                                          "conv2d_1/kernel", "conv2d_2/bias", "conv2d_2/kernel"});
  CHECK(*Lookup(*r, "b").scalar<float>() == 2.0f);
  Tensor k = Lookup(*r, "conv2d_1/kernel");
  CHECK(k.shape() == TensorShape{1, 1, 1, 1});
  CHECK(k.data<float>()[0] == doctest::Approx(-1.04511201));
  CHECK(Lookup(*r, "conv2d/bias").shape() == TensorShape{1});

  std::vector<std::pair<std::string, Tensor>> copy;
  for (const std::string& name : names) copy.emplace_back(name, Lookup(*r, name));
  WriteBundle(&f.env, "/ckpt/ours", copy);
  CHECK(absl::BytesToHexString(Read(&f.env, "/ckpt/ours.index")) == kHalfPlusTwoMklIndexHex);
  CHECK(absl::BytesToHexString(Read(&f.env, "/ckpt/ours.data-00000-of-00001")) == kHalfPlusTwoMklDataHex);
}

// -- index variants TF may write -------------------------------------------------------

TEST_CASE("the reader uses offsets only: data laid out in reverse key order reads back") {
  Fixture f;
  WriteBundle(&f.env, "/ckpt/fwd", {{"a", Make<float>({1, 2, 3}, {3})},
                                    {"b", Tensor::Scalar<int64_t>(42)},
                                    {"c", Make<std::string>({"x", "yz"}, {2})}});
  auto fwd = Open(&f.env, "/ckpt/fwd");
  const std::string fwd_data = Read(&f.env, BundleDataPath("/ckpt/fwd"));

  // Lay the same tensors out as c, b, a and index them by hand.
  std::string data;
  std::map<std::string, proto::BundleEntryProto> entries;
  for (const char* name : {"c", "b", "a"}) {
    const BundleEntry e = *fwd->GetEntry(name);
    const std::string bytes = fwd_data.substr(static_cast<std::size_t>(e.offset), static_cast<std::size_t>(e.size));
    proto::BundleEntryProto p = Entry(e.dtype, e.shape.dims(), static_cast<int64_t>(data.size()), bytes);
    p.set_crc32c(e.masked_crc32c);   // for strings the CRC is not a plain CRC of the bytes
    entries[name] = p;
    data += bytes;
  }
  Write(&f.env, "/ckpt/rev.index", BuildIndex(Header(), entries));
  Write(&f.env, BundleDataPath("/ckpt/rev"), data);
  auto rev = Open(&f.env, "/ckpt/rev");
  CHECK(rev->GetEntry("a")->offset > rev->GetEntry("c")->offset);
  for (const char* name : {"a", "b", "c"}) CHECK(Lookup(*rev, name).Equals(Lookup(*fwd, name)));
  CHECK(rev->VerifyAll().ok());
}

TEST_CASE("entries with omitted proto3 zero fields (no shape, offset, shard) read as scalars at offset 0") {
  Fixture f;
  const std::string bytes = FloatBytes({2.5f});
  proto::BundleEntryProto e;
  e.set_dtype(proto::DT_FLOAT);
  e.set_size(4);
  e.set_crc32c(crc32c::Mask(crc32c::Value(bytes.data(), 4)));
  proto::BundleHeaderProto header;   // num_shards 1 and nothing else
  header.set_num_shards(1);
  Write(&f.env, "/ckpt/m.index", BuildIndex(header, {{"w", e}}));
  Write(&f.env, BundleDataPath("/ckpt/m"), bytes);
  auto r = Open(&f.env, "/ckpt/m");
  CHECK(r->GetEntry("w")->shape == TensorShape{});
  CHECK(*Lookup(*r, "w").scalar<float>() == 2.5f);
}

TEST_CASE("a snappy-compressed index reads (Debian's libleveldb has snappy)") {
  Fixture f;
  std::string data;
  std::map<std::string, proto::BundleEntryProto> entries;
  for (int i = 0; i < 200; ++i) {
    const std::string bytes = FloatBytes({static_cast<float>(i)});
    entries[absl::StrCat("layer_", 1000 + i, "/kernel/Adam_1")] =
        Entry(DataType::kFloat, {}, static_cast<int64_t>(data.size()), bytes);
    data += bytes;
  }
  const std::string plain = BuildIndex(Header(), entries);
  const std::string snappy = BuildIndex(Header(), entries, leveldb::kSnappyCompression);
  REQUIRE(snappy.size() < plain.size() / 2);   // the blocks really are compressed
  Write(&f.env, "/ckpt/z.index", snappy);
  Write(&f.env, BundleDataPath("/ckpt/z"), data);
  auto r = Open(&f.env, "/ckpt/z");
  REQUIRE(r->entries().size() == 200);
  CHECK(*Lookup(*r, "layer_1123/kernel/Adam_1").scalar<float>() == 123.0f);
  CHECK(r->VerifyAll().ok());
}

TEST_CASE("a bundle with several data shards reads each tensor from its shard") {
  Fixture f;
  const std::string s0 = FloatBytes({1, 2}), s1 = FloatBytes({9}) + FloatBytes({7, 8});
  Write(&f.env, "/ckpt/p.index",
        BuildIndex(Header(2), {{"x", Entry(DataType::kFloat, {2}, 0, s0, 0)},
                               {"y", Entry(DataType::kFloat, {}, 0, s1.substr(0, 4), 1)},
                               {"z", Entry(DataType::kFloat, {2}, 4, s1.substr(4), 1)}}));
  Write(&f.env, "/ckpt/p.data-00000-of-00002", s0);
  Write(&f.env, "/ckpt/p.data-00001-of-00002", s1);
  auto r = Open(&f.env, "/ckpt/p");
  CHECK(r->GetEntry("z")->shard_id == 1);
  CHECK(Lookup(*r, "x").Equals(Make<float>({1, 2}, {2})));
  CHECK(*Lookup(*r, "y").scalar<float>() == 9.0f);
  CHECK(Lookup(*r, "z").Equals(Make<float>({7, 8}, {2})));

  REQUIRE(f.env.DeleteFile("/ckpt/p.data-00001-of-00002").ok());
  auto gone = BundleReader::Open(&f.env, "/ckpt/p");
  CHECK(gone.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK(absl::StrContains(Msg(gone.status()), "/ckpt/p.data-00001-of-00002"));
}

TEST_CASE("partitioned variables, unknown dtypes and big-endian bundles are UNIMPLEMENTED") {
  Fixture f;
  const std::string bytes = FloatBytes({1});
  Write(&f.env, BundleDataPath("/ckpt/u"), bytes);

  proto::BundleEntryProto sliced = Entry(DataType::kFloat, {2}, 0, bytes);
  sliced.add_slices()->add_extent()->set_length(1);
  Write(&f.env, "/ckpt/u.index", BuildIndex(Header(), {{"part/w", sliced}}));
  auto s = BundleReader::Open(&f.env, "/ckpt/u");
  CHECK(s.status().code() == absl::StatusCode::kUnimplemented);
  CHECK(absl::StrContains(Msg(s.status()), "'part/w'"));

  proto::BundleEntryProto half = Entry(DataType::kFloat, {2}, 0, bytes);
  half.set_dtype(static_cast<proto::DataType>(19));   // DT_HALF
  Write(&f.env, "/ckpt/u.index", BuildIndex(Header(), {{"h", half}}));
  auto r = Open(&f.env, "/ckpt/u");
  CHECK(r->entries()[0].dtype == static_cast<DataType>(19));
  auto h = r->Lookup("h");
  CHECK(h.status().code() == absl::StatusCode::kUnimplemented);
  CHECK(absl::StrContains(Msg(h.status()), "'h'"));
  CHECK(absl::StrContains(Msg(h.status()), "19"));
  CHECK(r->VerifyAll().ok());   // its raw CRC still verifies

  proto::BundleHeaderProto big = Header();
  big.set_endianness(proto::BundleHeaderProto::BIG);
  Write(&f.env, "/ckpt/u.index", BuildIndex(big, {}));
  CHECK(BundleReader::Open(&f.env, "/ckpt/u").status().code() == absl::StatusCode::kUnimplemented);
}

// -- corruption ------------------------------------------------------------------------

TEST_CASE("a flipped bit in a tensor's data is DATA_LOSS naming the data file and the variable") {
  Fixture f;
  WriteBundle(&f.env, "/ckpt/m", {{"a", Make<float>({1, 2, 3}, {3})}, {"b", Make<double>({4, 5}, {2})}});
  std::string data = Read(&f.env, BundleDataPath("/ckpt/m"));
  data[12 + 3] ^= 0x10;   // inside "b"
  Write(&f.env, BundleDataPath("/ckpt/m"), data);
  auto r = Open(&f.env, "/ckpt/m");
  CHECK(Lookup(*r, "a").Equals(Make<float>({1, 2, 3}, {3})));
  auto b = r->Lookup("b");
  CHECK(b.status().code() == absl::StatusCode::kDataLoss);
  CHECK(absl::StrContains(Msg(b.status()), "/ckpt/m.data-00000-of-00001"));
  CHECK(absl::StrContains(Msg(b.status()), "'b'"));
  CHECK(absl::StrContains(Msg(b.status()), "crc32c mismatch"));
  CHECK(r->VerifyAll().code() == absl::StatusCode::kDataLoss);
}

TEST_CASE("corrupt string tensors are DATA_LOSS: a length byte, a string byte, the length CRC") {
  Fixture f;
  WriteBundle(&f.env, "/ckpt/s", {{"s", Make<std::string>({"abc", std::string(130, 'q')}, {2})}});
  const std::string good = Read(&f.env, BundleDataPath("/ckpt/s"));
  // Layout: 03 | 82 01 | crc(4) | bytes.
  for (std::size_t pos : {std::size_t{0}, std::size_t{1}, std::size_t{4}, std::size_t{9}}) {
    CAPTURE(pos);
    std::string bad = good;
    bad[pos] ^= 0x01;
    Write(&f.env, BundleDataPath("/ckpt/s"), bad);
    auto t = Open(&f.env, "/ckpt/s")->Lookup("s");
    CHECK(t.status().code() == absl::StatusCode::kDataLoss);
    CHECK(absl::StrContains(Msg(t.status()), "/ckpt/s.data-00000-of-00001: variable 's'"));
  }
}

TEST_CASE("a truncated data file is DATA_LOSS naming the file and the variable") {
  Fixture f;
  WriteBundle(&f.env, "/ckpt/m", {{"a", Make<float>({1, 2}, {2})}, {"s", Make<std::string>({"xyz"}, {1})}});
  const std::string data = Read(&f.env, BundleDataPath("/ckpt/m"));
  Write(&f.env, BundleDataPath("/ckpt/m"), data.substr(0, data.size() - 1));
  auto r = Open(&f.env, "/ckpt/m");
  auto s = r->Lookup("s");
  CHECK(s.status().code() == absl::StatusCode::kDataLoss);
  CHECK(absl::StrContains(Msg(s.status()), "/ckpt/m.data-00000-of-00001: variable 's': truncated"));
  Write(&f.env, BundleDataPath("/ckpt/m"), "");
  CHECK(Open(&f.env, "/ckpt/m")->Lookup("a").status().code() == absl::StatusCode::kDataLoss);
}

TEST_CASE("a corrupt or truncated index is DATA_LOSS naming the index; a missing one NOT_FOUND") {
  Fixture f;
  WriteBundle(&f.env, "/ckpt/m", {{"a", Tensor::Scalar(1.0f)}, {"b", Tensor::Scalar(2.0f)}});
  const std::string index = Read(&f.env, "/ckpt/m.index");
  // The data block, the index block's CRC (just before the 48-byte footer), the magic.
  for (std::size_t pos : {std::size_t{2}, std::size_t{20}, index.size() - 49, index.size() - 3}) {
    CAPTURE(pos);
    std::string bad = index;
    bad[pos] ^= 0x40;
    Write(&f.env, "/ckpt/m.index", bad);
    auto r = BundleReader::Open(&f.env, "/ckpt/m");
    CHECK(r.status().code() == absl::StatusCode::kDataLoss);
    CHECK(absl::StrContains(Msg(r.status()), "/ckpt/m.index"));
  }
  Write(&f.env, "/ckpt/m.index", index.substr(0, 30));
  auto cut = BundleReader::Open(&f.env, "/ckpt/m");
  CHECK(cut.status().code() == absl::StatusCode::kDataLoss);
  CHECK(absl::StrContains(Msg(cut.status()), "/ckpt/m.index"));

  // Block handles in the footer (no CRC there) claiming a 2^47-byte block.
  std::string footer;
  for (int handle = 0; handle < 2; ++handle) footer += std::string("\x00\xff\xff\xff\xff\xff\xff\x1f", 8);
  footer.resize(40, '\0');
  footer += index.substr(index.size() - 8);   // the magic number
  Write(&f.env, "/ckpt/m.index", index.substr(0, index.size() - 48) + footer);
  auto huge = BundleReader::Open(&f.env, "/ckpt/m");
  CHECK(huge.status().code() == absl::StatusCode::kDataLoss);
  CHECK(absl::StrContains(Msg(huge.status()), "/ckpt/m.index: corrupt table footer"));

  auto none = BundleReader::Open(&f.env, "/ckpt/none");
  CHECK(none.status().code() == absl::StatusCode::kNotFound);
  CHECK(absl::StrContains(Msg(none.status()), "/ckpt/none.index"));
}

// -- the writer's contract -------------------------------------------------------------

TEST_CASE("the writer creates P.index and P.data only in Finish(), from synced temporary files") {
  Fixture f;
  auto w = BundleWriter::Create(&f.env, "/ckpt/m");
  REQUIRE(w.ok());
  REQUIRE((*w)->Add("a", Make<float>({1, 2}, {2})).ok());
  CHECK((*w)->data_bytes() == 8);
  auto names = f.env.GetChildren("/ckpt");
  REQUIRE(names->size() == 1);
  CHECK(absl::StartsWith((*names)[0], "m.data-00000-of-00001.tempstate"));
  REQUIRE((*w)->Finish().ok());
  CHECK(*f.env.GetChildren("/ckpt") == std::vector<std::string>{"m.data-00000-of-00001", "m.index"});
  CHECK((*w)->Finish().code() == absl::StatusCode::kFailedPrecondition);
  CHECK((*w)->Add("b", Tensor::Scalar(1.0f)).code() == absl::StatusCode::kFailedPrecondition);

  f.env.Crash();   // Finish() synced files and directory: all survives
  CHECK(Lookup(*Open(&f.env, "/ckpt/m"), "a").Equals(Make<float>({1, 2}, {2})));
}

TEST_CASE("a writer destroyed without Finish() leaves no files; bad Add() arguments are INVALID_ARGUMENT") {
  Fixture f;
  {
    auto w = BundleWriter::Create(&f.env, "/ckpt/m");
    REQUIRE(w.ok());
    CHECK((*w)->Add("", Tensor::Scalar(1.0f)).code() == absl::StatusCode::kInvalidArgument);
    CHECK((*w)->Add("x", Tensor()).code() == absl::StatusCode::kInvalidArgument);
    REQUIRE((*w)->Add("x", Tensor::Scalar(1.0f)).ok());
    CHECK((*w)->Add("x", Tensor::Scalar(2.0f)).code() == absl::StatusCode::kInvalidArgument);
  }
  CHECK(f.env.GetChildren("/ckpt")->empty());

  auto missing = BundleWriter::Create(&f.env, "/nope/m");
  CHECK(missing.status().code() == absl::StatusCode::kNotFound);
  CHECK(absl::StrContains(Msg(missing.status()), "/nope"));
}

TEST_CASE("a write error fails Finish() and leaves neither the bundle nor temporary files") {
  Fixture f;
  auto w = BundleWriter::Create(&f.env, "/ckpt/m");
  REQUIRE(w.ok());
  REQUIRE((*w)->Add("a", Tensor::Scalar(1.0f)).ok());
  f.env.SetCrashAfterOperations(3);   // data sync, close, index create; then the index writes fail
  CHECK_FALSE((*w)->Finish().ok());
  f.env.SetFilesystemActive(true);
  w->reset();
  CHECK(f.env.GetChildren("/ckpt")->empty());
}

TEST_CASE("an injected error in the index's writes fails Finish() with the Env's Status: code, message, fault id") {
  // LevelDB's TableBuilder writes the whole index inside Finish(); its
  // leveldb::Status has room for neither our code nor the payload, so the
  // writer must return the Status the Env gave, not one rebuilt from LevelDB's.
  struct Case {
    EnvOp op;
    int error;
    absl::StatusCode code;
    std::string what;  // the message the Env gives, as the POSIX Env would
  };
  const Case cases[] = {
      {EnvOp::kAppend, ENOSPC, absl::StatusCode::kResourceExhausted, ": No space left on device (injected fault idx)"},
      {EnvOp::kFlush, EIO, absl::StatusCode::kInternal, ": Input/output error (injected fault idx)"},
      {EnvOp::kSync, ENOSPC, absl::StatusCode::kResourceExhausted, ": No space left on device (injected fault idx)"},
  };
  for (const Case& c : cases) {
    CAPTURE(static_cast<int>(c.op));
    Fixture f;
    FaultyEnv faulty(&f.env, /*seed=*/1);
    EnvFault fault;
    fault.id = "idx";
    fault.path_pattern = "*.index*";
    fault.op = c.op;
    fault.kind = EnvFault::Kind::kError;
    fault.error = c.error;
    fault.nth = 1;
    REQUIRE(faulty.AddFault(fault).ok());
    auto w = BundleWriter::Create(&faulty, "/ckpt/m");
    REQUIRE(w.ok());
    REQUIRE((*w)->Add("a", Tensor::Scalar(1.0f)).ok());
    const Status s = (*w)->Finish();
    CHECK(s.code() == c.code);
    CHECK_MESSAGE(absl::StrContains(s.message(), "/ckpt/m.index.tempstate"), s.ToString());
    CHECK_MESSAGE(absl::EndsWith(s.message(), c.what), s.ToString());
    CHECK_MESSAGE(absl::StrContains(s.message(), "IO error") == false, s.ToString());  // not LevelDB's text
    CHECK(InjectedFaultId(s) == std::optional<std::string>("idx"));
    REQUIRE(faulty.fired().size() == 1);
    CHECK(faulty.fired()[0].op == c.op);
    w->reset();
    CHECK(f.env.GetChildren("/ckpt")->empty());  // nothing left behind
  }
}

TEST_CASE("BundleDataPath and BundleIndexPath follow TF's names") {
  CHECK(BundleIndexPath("/d/model.ckpt-7") == "/d/model.ckpt-7.index");
  CHECK(BundleDataPath("/d/model.ckpt-7") == "/d/model.ckpt-7.data-00000-of-00001");
  CHECK(BundleDataPath("p", 3, 12) == "p.data-00003-of-00012");
}

TEST_CASE("an index with a duplicate or out-of-order key is DATA_LOSS naming the index") {
  Fixture f;
  const std::string bytes = FloatBytes({1, 2});
  Write(&f.env, BundleDataPath("/ckpt/d"), bytes);
  const proto::BundleEntryProto e = Entry(DataType::kFloat, {2}, 0, bytes);
  Write(&f.env, "/ckpt/d.index", BuildRawIndex(Header(), {{"v", e}, {"v", e}}));
  auto dup = BundleReader::Open(&f.env, "/ckpt/d");
  CHECK(dup.status().code() == absl::StatusCode::kDataLoss);
  CHECK(absl::StrContains(Msg(dup.status()), "/ckpt/d.index"));
  CHECK(absl::StrContains(Msg(dup.status()), "'v' duplicated"));

  Write(&f.env, "/ckpt/d.index", BuildRawIndex(Header(), {{"w", e}, {"v", e}}));
  auto unsorted = BundleReader::Open(&f.env, "/ckpt/d");
  CHECK(unsorted.status().code() == absl::StatusCode::kDataLoss);
  CHECK(absl::StrContains(Msg(unsorted.status()), "/ckpt/d.index"));

  Write(&f.env, "/ckpt/d.index", BuildRawIndex(Header(), {{"", e}}));   // a second "" (the header's key)
  CHECK(BundleReader::Open(&f.env, "/ckpt/d").status().code() == absl::StatusCode::kDataLoss);

  Write(&f.env, "/ckpt/d.index", BuildRawIndex(Header(), {{"v", e}, {"w", e}}));
  CHECK(BundleReader::Open(&f.env, "/ckpt/d").ok());
}

TEST_CASE("Verify() checks the raw CRC of a dtype Foreman cannot decode") {
  Fixture f;
  const std::string bytes("\x00\x3c\x00\x40", 4);   // float16 {1, 2}
  proto::BundleEntryProto half = Entry(DataType::kFloat, {2}, 0, bytes);
  half.set_dtype(static_cast<proto::DataType>(19));
  Write(&f.env, "/ckpt/h.index", BuildIndex(Header(), {{"h", half}}));
  Write(&f.env, BundleDataPath("/ckpt/h"), bytes);
  CHECK(Open(&f.env, "/ckpt/h")->Verify("h").ok());
  CHECK(DataTypeName(Open(&f.env, "/ckpt/h")->entries()[0].dtype) == "float16");
  Write(&f.env, BundleDataPath("/ckpt/h"), std::string("\x00\x3c\x00\x41", 4));
  auto r = Open(&f.env, "/ckpt/h");
  const Status s = r->Verify("h");
  CHECK(s.code() == absl::StatusCode::kDataLoss);
  CHECK(absl::StrContains(Msg(s), BundleDataPath("/ckpt/h") + ": variable 'h': crc32c mismatch"));
  CHECK(r->VerifyAll().code() == absl::StatusCode::kDataLoss);
  CHECK(r->Verify("nope").code() == absl::StatusCode::kNotFound);
}

TEST_CASE("a consistent entry too big for memory is RESOURCE_EXHAUSTED naming file and variable") {
  if (!foreman::testing::HugeAllocationsFail()) {
    MESSAGE("skipping: vm.overcommit_memory is 1, a 16 TiB allocation may succeed");
    return;
  }
  constexpr int64_t kElements = int64_t{1} << 42;   // float32: 16 TiB
  const std::string data = BundleDataPath("/ckpt/big");
  HugeFileEnv env(data, uint64_t{4} << 42);
  REQUIRE(env.RecursivelyCreateDir("/ckpt").ok());
  Write(&env, data, "");
  proto::BundleEntryProto v = Entry(DataType::kFloat, {kElements}, 0, "");
  v.set_size(int64_t{4} << 42);
  proto::BundleEntryProto h = v;   // float16 [2^43]: the raw-CRC path
  h.set_dtype(static_cast<proto::DataType>(19));
  h.mutable_shape()->mutable_dim(0)->set_size(int64_t{1} << 43);
  Write(&env, "/ckpt/big.index", BuildIndex(Header(), {{"h", h}, {"v", v}}));
  auto r = Open(&env, "/ckpt/big");
  auto t = r->Lookup("v");
  CHECK(t.status().code() == absl::StatusCode::kResourceExhausted);
  CHECK(Msg(t.status()) ==
        data + ": variable 'v': cannot allocate 17592186044416 bytes for float32[4398046511104]");
  const Status raw = r->Verify("h");
  CHECK(raw.code() == absl::StatusCode::kResourceExhausted);
  CHECK(absl::StrContains(Msg(raw), data + ": variable 'h': cannot allocate 17592186044416 bytes"));
  CHECK(r->VerifyAll().code() == absl::StatusCode::kResourceExhausted);
}

}  // namespace
}  // namespace foreman

// Under ASan a failed allocation must come back as nullptr (then
// std::bad_alloc) instead of ending the test.
extern "C" const char* __asan_default_options() { return "allocator_may_return_null=1"; }
