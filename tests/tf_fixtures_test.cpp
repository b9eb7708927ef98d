// Foreman's bundle reader and Saver against checkpoints Foreman did not write:
//   tests/testdata/tf-checkpoints/   real TensorFlow output (tensorflow/serving)
//   tests/testdata/independent/      written by tools/testing/make_bundle_fixtures.py,
//                                    one feature per directory, values in expected.txt
// The test data directory comes from $FOREMAN_TESTDATA (set by tests/meson.build).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "foreman/bundle.hpp"
#include "foreman/checkpoint.hpp"
#include "foreman/env.hpp"
#include "foreman/tensor.hpp"
#include "foreman/variable_store.hpp"

namespace fs = std::filesystem;
using foreman::BundleEntry;
using foreman::BundleReader;
using foreman::DataType;
using foreman::Tensor;
using foreman::TensorShape;

namespace {

std::string TestData() {
  const char* dir = std::getenv("FOREMAN_TESTDATA");
  REQUIRE_MESSAGE(dir != nullptr, "FOREMAN_TESTDATA is not set (tests/meson.build sets it)");
  return dir;
}

std::string TfCheckpoint(const std::string& name) {
  return TestData() + "/tf-checkpoints/" + name + "/variables";
}

std::string Independent() { return TestData() + "/independent"; }

// -- expected.txt ----------------------------------------------------------------
// bundle <prefix relative to the file>
// tensor <name> <dtype> <shape> <n> <v1> ... <vn>

struct ExpectedTensor {
  std::string name;
  std::string dtype;
  std::vector<int64_t> dims;
  std::vector<std::string> values;   // tokens as written
};

struct ExpectedBundle {
  std::string prefix;   // relative to the expected.txt's directory
  std::vector<ExpectedTensor> tensors;
};

std::vector<int64_t> ParseShape(const std::string& s) {
  std::vector<int64_t> dims;
  REQUIRE_MESSAGE((s.size() >= 2 && s.front() == '[' && s.back() == ']'), "bad shape " << s);
  std::string inner = s.substr(1, s.size() - 2);
  std::stringstream in(inner);
  std::string tok;
  while (std::getline(in, tok, ',')) dims.push_back(std::stoll(tok));
  return dims;
}

std::vector<ExpectedBundle> ReadExpected(const std::string& path) {
  std::ifstream in(path);
  REQUIRE_MESSAGE(in.good(), "cannot open " << path);
  std::vector<ExpectedBundle> out;
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream ls(line);
    std::string kind;
    ls >> kind;
    if (kind == "bundle") {
      out.emplace_back();
      ls >> out.back().prefix;
    } else if (kind == "tensor") {
      REQUIRE_MESSAGE(!out.empty(), "tensor line before any bundle line in " << path);
      ExpectedTensor t;
      std::string shape;
      std::size_t n = 0;
      ls >> t.name >> t.dtype >> shape >> n;
      t.dims = ParseShape(shape);
      std::string v;
      while (ls >> v) t.values.push_back(v);
      REQUIRE_MESSAGE(t.values.size() == n, path << ": " << t.name << " announces " << n << " values");
      out.back().tensors.push_back(std::move(t));
    } else {
      FAIL("unknown line in " << path << ": " << line);
    }
  }
  return out;
}

const std::vector<ExpectedBundle>& IndependentExpected() {
  static const std::vector<ExpectedBundle> expected = ReadExpected(Independent() + "/expected.txt");
  return expected;
}

const ExpectedBundle& FindExpected(const std::string& fixture) {
  for (const ExpectedBundle& b : IndependentExpected()) {
    if (b.prefix == fixture + "/model.ckpt") return b;
  }
  FAIL("expected.txt has no bundle " << fixture << "/model.ckpt");
  throw 0;  // unreachable
}

DataType DtypeFromName(const std::string& s) {
  if (s == "float32") return DataType::kFloat;
  if (s == "float64") return DataType::kDouble;
  if (s == "int32") return DataType::kInt32;
  if (s == "uint8") return DataType::kUInt8;
  if (s == "string") return DataType::kString;
  if (s == "int64") return DataType::kInt64;
  FAIL("unknown dtype " << s);
  return DataType::kInvalid;
}

std::string HexDecode(const std::string& tok) {
  REQUIRE_MESSAGE((!tok.empty() && tok[0] == 'x' && tok.size() % 2 == 1), "bad string token " << tok);
  std::string out;
  for (std::size_t i = 1; i + 1 < tok.size(); i += 2) {
    out.push_back(static_cast<char>(std::stoi(tok.substr(i, 2), nullptr, 16)));
  }
  return out;
}

std::string Printable(const std::string& s) {
  std::ostringstream o;
  o << '"';
  for (unsigned char c : s.substr(0, 40)) {
    if (c >= 0x20 && c < 0x7f && c != '"' && c != '\\') {
      o << c;
    } else {
      static const char* hex = "0123456789abcdef";
      o << "\\x" << hex[c >> 4] << hex[c & 15];
    }
  }
  if (s.size() > 40) o << "...(" << s.size() << " bytes)";
  o << '"';
  return o.str();
}

// Empty when `t` holds exactly the values (bitwise for floats; NaN == NaN),
// else a description of the first difference.
std::string DiffValues(const Tensor& t, const ExpectedTensor& e) {
  const int64_t n = t.num_elements();
  if (n != static_cast<int64_t>(e.values.size())) {
    return "has " + std::to_string(n) + " elements, expected " + std::to_string(e.values.size());
  }
  for (int64_t i = 0; i < n; ++i) {
    const std::string& tok = e.values[static_cast<std::size_t>(i)];
    std::ostringstream got;
    bool same = false;
    switch (t.dtype()) {
      case DataType::kFloat: {
        const float want = static_cast<float>(std::strtod(tok.c_str(), nullptr));
        const float have = t.data<float>()[i];
        same = (std::isnan(want) && std::isnan(have)) || std::memcmp(&want, &have, sizeof want) == 0;
        got.precision(9);
        got << have;
        break;
      }
      case DataType::kDouble: {
        const double want = std::strtod(tok.c_str(), nullptr);
        const double have = t.data<double>()[i];
        same = (std::isnan(want) && std::isnan(have)) || std::memcmp(&want, &have, sizeof want) == 0;
        got.precision(17);
        got << have;
        break;
      }
      case DataType::kInt32:
        same = t.data<int32_t>()[i] == static_cast<int32_t>(std::stoll(tok));
        got << t.data<int32_t>()[i];
        break;
      case DataType::kInt64:
        same = t.data<int64_t>()[i] == std::stoll(tok);
        got << t.data<int64_t>()[i];
        break;
      case DataType::kUInt8:
        same = t.data<uint8_t>()[i] == static_cast<uint8_t>(std::stoul(tok));
        got << static_cast<int>(t.data<uint8_t>()[i]);
        break;
      case DataType::kString:
        same = t.data<std::string>()[i] == HexDecode(tok);
        got << Printable(t.data<std::string>()[i]) << " vs expected " << Printable(HexDecode(tok));
        break;
      default:
        return "unexpected dtype " + foreman::DataTypeName(t.dtype());
    }
    if (!same) {
      return "element " + std::to_string(i) + " is " + got.str() + ", expected " + tok;
    }
  }
  return "";
}

std::unique_ptr<BundleReader> OpenOrFail(const std::string& prefix) {
  auto reader = BundleReader::Open(foreman::Env::Default(), prefix);
  REQUIRE_MESSAGE(reader.ok(), "BundleReader::Open(" << prefix << "): " << reader.status().ToString());
  return std::move(reader).value();
}

// Opens the bundle and checks that it holds exactly the expected tensors.
void CheckBundle(const std::string& prefix, const std::vector<ExpectedTensor>& expected) {
  INFO("bundle " << prefix);
  std::unique_ptr<BundleReader> reader = OpenOrFail(prefix);

  std::vector<std::string> want_names;
  for (const ExpectedTensor& e : expected) want_names.push_back(e.name);
  std::sort(want_names.begin(), want_names.end());
  std::vector<std::string> got_names;
  for (const BundleEntry& e : reader->entries()) got_names.push_back(e.name);
  CHECK_MESSAGE(got_names == want_names, "entries() lists other names (or in another order)");

  for (const ExpectedTensor& e : expected) {
    INFO("variable " << e.name);
    CHECK(reader->Contains(e.name));
    auto entry = reader->GetEntry(e.name);
    REQUIRE_MESSAGE(entry.ok(), entry.status().ToString());
    CHECK(entry->dtype == DtypeFromName(e.dtype));
    CHECK(entry->shape.dims() == e.dims);

    auto t = reader->Lookup(e.name);
    REQUIRE_MESSAGE(t.ok(), "Lookup: " << t.status().ToString());
    CHECK(t->dtype() == DtypeFromName(e.dtype));
    CHECK(t->shape().dims() == e.dims);
    if (t->dtype() == DtypeFromName(e.dtype) && t->shape().dims() == e.dims) {
      const std::string diff = DiffValues(*t, e);
      CHECK_MESSAGE(diff.empty(), diff);
    }
  }
  const foreman::Status verify = reader->VerifyAll();
  CHECK_MESSAGE(verify.ok(), "VerifyAll: " << verify.ToString());
}

std::unique_ptr<BundleReader> CheckFixture(const std::string& fixture) {
  const std::string prefix = Independent() + "/" + fixture + "/model.ckpt";
  CheckBundle(prefix, FindExpected(fixture).tensors);
  return OpenOrFail(prefix);
}

float ScalarFloat(const BundleReader& r, const std::string& name) {
  auto t = r.Lookup(name);
  REQUIRE_MESSAGE(t.ok(), name << ": " << t.status().ToString());
  auto v = t->scalar<float>();
  REQUIRE_MESSAGE(v.ok(), name << ": " << v.status().ToString());
  return *v;
}

std::string TmpDir(const std::string& name) {
  const char* base = std::getenv("TEST_TMPDIR");
  fs::path dir = fs::path(base != nullptr ? base : fs::temp_directory_path().string()) /
                 ("tf_fixtures_" + name);
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir.string();
}

void FlipByte(const std::string& path, std::size_t offset) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  REQUIRE(f.good());
  f.seekg(static_cast<std::streamoff>(offset));
  char c = 0;
  f.read(&c, 1);
  c = static_cast<char>(c ^ 0x01);
  f.seekp(static_cast<std::streamoff>(offset));
  f.write(&c, 1);
  REQUIRE(f.good());
}

}  // namespace

// -- TensorFlow's own checkpoints ----------------------------------------------------

TEST_CASE("TF's half_plus_three checkpoint reads as a = 0.5, b = 3 and c = 3, float32 scalars") {
  std::unique_ptr<BundleReader> r = OpenOrFail(TfCheckpoint("serving-half_plus_three"));
  REQUIRE(r->entries().size() == 3);
  const char* names[] = {"a", "b", "c"};
  for (int i = 0; i < 3; ++i) {
    const BundleEntry& e = r->entries()[static_cast<std::size_t>(i)];
    CHECK(e.name == names[i]);
    CHECK(e.dtype == DataType::kFloat);
    CHECK(e.shape == TensorShape{});
    CHECK(e.shard_id == 0);
    CHECK(e.offset == 4 * i);   // README: offsets 0, 4, 8 (TF omits offset 0 from the proto)
    CHECK(e.size == 4);
  }
  CHECK(ScalarFloat(*r, "a") == 0.5f);
  CHECK(ScalarFloat(*r, "b") == 3.0f);
  CHECK(ScalarFloat(*r, "c") == 3.0f);
  CHECK(r->VerifyAll().ok());
}

TEST_CASE("TF's half_plus_two_mkl checkpoint reads with the shapes and values its README states") {
  std::unique_ptr<BundleReader> r = OpenOrFail(TfCheckpoint("serving-half_plus_two_mkl"));
  std::vector<std::string> names;
  for (const BundleEntry& e : r->entries()) names.push_back(e.name);
  CHECK(names == std::vector<std::string>{"a", "b", "c", "conv2d/bias", "conv2d/kernel", "conv2d_1/bias",
                                          "conv2d_1/kernel", "conv2d_2/bias", "conv2d_2/kernel"});
  CHECK(ScalarFloat(*r, "a") == 0.5f);
  CHECK(ScalarFloat(*r, "b") == 2.0f);
  CHECK(ScalarFloat(*r, "c") == 3.0f);
  const std::map<std::string, float> kernels = {
      {"conv2d/kernel", -0.522395968f}, {"conv2d_1/kernel", -1.04511201f}, {"conv2d_2/kernel", 1.57794321f}};
  for (const auto& [name, value] : kernels) {
    INFO(name);
    auto t = r->Lookup(name);
    REQUIRE(t.ok());
    CHECK(t->dtype() == DataType::kFloat);
    CHECK(t->shape() == TensorShape{1, 1, 1, 1});
    CHECK(t->data<float>()[0] == value);
  }
  for (const char* name : {"conv2d/bias", "conv2d_1/bias", "conv2d_2/bias"}) {
    INFO(name);
    auto t = r->Lookup(name);
    REQUIRE(t.ok());
    CHECK(t->shape() == TensorShape{1});
    CHECK(t->data<float>()[0] == 0.0f);
  }
  CHECK(r->VerifyAll().ok());
}

TEST_CASE("Saver::Restore fills a VariableStore from TF's half_plus_three checkpoint") {
  foreman::VariableStore vars;
  for (const char* name : {"a", "b", "c"}) REQUIRE(vars.Create(name, Tensor::Scalar<float>(0.0f)).ok());
  auto saver = foreman::Saver::Create({});
  REQUIRE(saver.ok());
  const foreman::Status s = (*saver)->Restore(TfCheckpoint("serving-half_plus_three"), &vars);
  REQUIRE_MESSAGE(s.ok(), s.ToString());
  CHECK((*vars.Get("a"))->scalar<float>().value() == 0.5f);
  CHECK((*vars.Get("b"))->scalar<float>().value() == 3.0f);
  CHECK((*vars.Get("c"))->scalar<float>().value() == 3.0f);
}

// -- the independent fixtures (tests/testdata/independent/README.md) ----------------------

TEST_CASE("Every dtype, scalars, a [2,3,4] tensor, zero-element tensors and extreme values read exactly") {
  CheckFixture("dtypes");
}

TEST_CASE("String tensors read exactly: empty strings, 300- and 16500-byte strings, non-ASCII bytes") {
  CheckFixture("strings");
}

TEST_CASE("An index table with snappy-compressed blocks reads") { CheckFixture("snappy"); }

TEST_CASE("An index table of many data blocks with several restart points each reads") {
  CheckFixture("multi_block");
}

TEST_CASE("Tensors stored in reverse key order are found by their offsets") {
  std::unique_ptr<BundleReader> r = CheckFixture("out_of_order");
  int64_t previous = INT64_MAX;
  for (const BundleEntry& e : r->entries()) {
    CHECK(e.offset < previous);
    previous = e.offset;
  }
}

TEST_CASE("Entries and a header whose zero-valued proto3 fields are omitted read") {
  std::unique_ptr<BundleReader> r = CheckFixture("omitted_zero_fields");
  auto a = r->GetEntry("a_first_at_offset_0");
  REQUIRE(a.ok());
  CHECK(a->offset == 0);
  auto d = r->GetEntry("d_masked_crc32c_0");
  REQUIRE(d.ok());
  CHECK(d->masked_crc32c == 0u);
  auto c = r->GetEntry("c_empty_size_0");
  REQUIRE(c.ok());
  CHECK(c->size == 0);
}

TEST_CASE("Entries and a header that write their zero-valued fields explicitly read") {
  CheckFixture("explicit_zero_fields");
}

TEST_CASE("TF2 object-based names and the _CHECKPOINTABLE_OBJECT_GRAPH string read") {
  CheckFixture("tf2_names");
}

TEST_CASE("Tensors padded to 64-byte alignment in the data file read") {
  std::unique_ptr<BundleReader> r = CheckFixture("aligned_data");
  std::vector<int64_t> offsets;
  for (const BundleEntry& e : r->entries()) offsets.push_back(e.offset);
  CHECK(offsets == std::vector<int64_t>{0, 64, 128, 192});
}

TEST_CASE("A bundle whose tensors are spread over two data shards reads") {
  std::unique_ptr<BundleReader> r = CheckFixture("two_shards");
  std::map<std::string, int> shards;
  for (const BundleEntry& e : r->entries()) shards[e.name] = e.shard_id;
  CHECK(shards == std::map<std::string, int>{{"a", 0}, {"b", 1}, {"c", 0}, {"d", 1}});
}

TEST_CASE("A bundle combining every feature of the independent fixtures reads") {
  CheckFixture("combined");
}

TEST_CASE("Every bundle listed in independent/expected.txt has its own test case above") {
  const std::set<std::string> covered = {
      "dtypes/model.ckpt",    "strings/model.ckpt",      "snappy/model.ckpt",
      "multi_block/model.ckpt", "out_of_order/model.ckpt", "omitted_zero_fields/model.ckpt",
      "explicit_zero_fields/model.ckpt", "tf2_names/model.ckpt", "aligned_data/model.ckpt",
      "two_shards/model.ckpt", "combined/model.ckpt"};
  for (const ExpectedBundle& b : IndependentExpected()) {
    CHECK_MESSAGE(covered.count(b.prefix) == 1, b.prefix << " is not covered by a test case");
  }
}

TEST_CASE("Saver::Restore maps Foreman names onto TF2 object-based checkpoint names") {
  foreman::VariableStore vars;
  REQUIRE(vars.Create("dense/kernel", Tensor(DataType::kFloat, {3, 2})).ok());
  REQUIRE(vars.Create("dense/bias", Tensor(DataType::kFloat, {2})).ok());
  REQUIRE(vars.Create("global_step", Tensor::Scalar<int64_t>(0), false).ok());
  const std::map<std::string, std::string> name_map = {
      {"dense/kernel", "layer_with_weights-0/kernel/.ATTRIBUTES/VARIABLE_VALUE"},
      {"dense/bias", "layer_with_weights-0/bias/.ATTRIBUTES/VARIABLE_VALUE"},
      {"global_step", "optimizer/iter/.ATTRIBUTES/VARIABLE_VALUE"},
  };
  auto saver = foreman::Saver::Create({});
  REQUIRE(saver.ok());
  const foreman::Status s = (*saver)->Restore(Independent() + "/tf2_names/model.ckpt", &vars, name_map);
  REQUIRE_MESSAGE(s.ok(), s.ToString());
  const Tensor* kernel = *vars.Get("dense/kernel");
  for (int i = 0; i < 6; ++i) CHECK(kernel->data<float>()[i] == static_cast<float>(i) * 0.125f);
  const Tensor* bias = *vars.Get("dense/bias");
  CHECK(bias->data<float>()[0] == 0.25f);
  CHECK(bias->data<float>()[1] == -0.25f);
  CHECK((*vars.Get("global_step"))->scalar<int64_t>().value() == 42);
}

// -- corruption of independent fixtures is caught ---------------------------------------

TEST_CASE("A flipped byte in a string tensor's data is DATA_LOSS naming the data file and the variable") {
  const std::string dir = TmpDir("corrupt_strings");
  for (const char* f : {"model.ckpt.index", "model.ckpt.data-00000-of-00001"}) {
    fs::copy_file(Independent() + "/strings/" + f, dir + "/" + f);
  }
  const std::string prefix = dir + "/model.ckpt";
  BundleEntry entry;
  {
    std::unique_ptr<BundleReader> r = OpenOrFail(prefix);
    auto e = r->GetEntry("long");
    REQUIRE(e.ok());
    entry = *e;
  }
  // The last byte of "long" is the last byte of "end": string bytes, not lengths.
  FlipByte(foreman::BundleDataPath(prefix), static_cast<std::size_t>(entry.offset + entry.size - 1));
  std::unique_ptr<BundleReader> r = OpenOrFail(prefix);
  auto t = r->Lookup("long");
  REQUIRE_FALSE(t.ok());
  CHECK(t.status().code() == absl::StatusCode::kDataLoss);
  CHECK_MESSAGE(t.status().message().find(foreman::BundleDataPath(prefix)) != std::string::npos,
                t.status().ToString());
  CHECK_MESSAGE(t.status().message().find("long") != std::string::npos, t.status().ToString());
  CHECK(r->Lookup("scalar").ok());
  CHECK(r->VerifyAll().code() == absl::StatusCode::kDataLoss);
}

TEST_CASE("A flipped byte in a snappy-compressed index block makes Open fail with DATA_LOSS") {
  const std::string dir = TmpDir("corrupt_snappy");
  for (const char* f : {"model.ckpt.index", "model.ckpt.data-00000-of-00001"}) {
    fs::copy_file(Independent() + "/snappy/" + f, dir + "/" + f);
  }
  const std::string prefix = dir + "/model.ckpt";
  FlipByte(foreman::BundleIndexPath(prefix), 10);   // inside the first (compressed) data block
  auto r = BundleReader::Open(foreman::Env::Default(), prefix);
  REQUIRE_FALSE(r.ok());
  CHECK_MESSAGE(r.status().code() == absl::StatusCode::kDataLoss, r.status().ToString());
  CHECK_MESSAGE(r.status().message().find(foreman::BundleIndexPath(prefix)) != std::string::npos,
                r.status().ToString());
}
