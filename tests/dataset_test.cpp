// Tests for IDX files, Fashion-MNIST loading and Dataset
// (include/foreman/dataset.hpp): the parser's errors, gzip, and the
// determinism that resuming from a saved DatasetPosition relies on.
#include <doctest/doctest.h>

#include <zlib.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <numeric>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "foreman/dataset.hpp"
#include "foreman/mem_env.hpp"

namespace foreman::data {
namespace {

std::string Msg(const Status& s) { return std::string(s.message()); }

void AppendBE32(std::string* out, uint32_t v) {
  for (int shift = 24; shift >= 0; shift -= 8) out->push_back(static_cast<char>((v >> shift) & 0xFF));
}

/// An IDX file of unsigned bytes: header, then `data` as given.
std::string Idx(const std::vector<uint32_t>& dims, const std::string& data, unsigned char type = 0x08) {
  std::string out = {'\0', '\0', static_cast<char>(type), static_cast<char>(dims.size())};
  for (uint32_t d : dims) AppendBE32(&out, d);
  return out + data;
}

std::string Bytes(int n, int start = 0) {
  std::string s;
  for (int i = 0; i < n; ++i) s.push_back(static_cast<char>((start + i) & 0xFF));
  return s;
}

/// gzip (RFC 1952) with zlib, as `gzip` writes it.
std::string Gzip(const std::string& in) {
  z_stream zs;
  std::memset(&zs, 0, sizeof(zs));
  REQUIRE(deflateInit2(&zs, Z_BEST_COMPRESSION, Z_DEFLATED, 16 + MAX_WBITS, 8, Z_DEFAULT_STRATEGY) == Z_OK);
  std::string out(deflateBound(&zs, in.size()) + 32, '\0');
  zs.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(in.data()));
  zs.avail_in = static_cast<uInt>(in.size());
  zs.next_out = reinterpret_cast<Bytef*>(out.data());
  zs.avail_out = static_cast<uInt>(out.size());
  REQUIRE(deflate(&zs, Z_FINISH) == Z_STREAM_END);
  out.resize(zs.total_out);
  deflateEnd(&zs);
  return out;
}

/// `n` images of rows x cols; image i starts with its index (two bytes,
/// little-endian) so that a batch row tells which example it is; label i % 10.
LabeledImages Synthetic(int64_t n, int64_t rows = 2, int64_t cols = 3) {
  LabeledImages d;
  d.images = Tensor(DataType::kUInt8, TensorShape({n, rows, cols}));
  d.labels = Tensor(DataType::kUInt8, TensorShape({n}));
  uint8_t* px = d.images.data<uint8_t>();
  const int64_t dim = rows * cols;
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t j = 0; j < dim; ++j) px[i * dim + j] = static_cast<uint8_t>((i * 31 + j * 7) & 0xFF);
    px[i * dim] = static_cast<uint8_t>(i & 0xFF);
    px[i * dim + 1] = static_cast<uint8_t>(i >> 8);
    d.labels.data<uint8_t>()[i] = static_cast<uint8_t>(i % 10);
  }
  return d;
}

/// The example indices of a batch's rows (see Synthetic).
std::vector<int64_t> Ids(const Batch& b) {
  std::vector<int64_t> ids;
  const int64_t dim = b.features.shape().dim(1);
  const float* f = b.features.data<float>();
  for (int64_t i = 0; i < b.features.shape().dim(0); ++i) {
    ids.push_back(std::lround(f[i * dim] * 255.0f) + 256 * std::lround(f[i * dim + 1] * 255.0f));
  }
  return ids;
}

std::shared_ptr<const Dataset> MakeDataset(int64_t n, DatasetOptions o) {
  auto ds = Dataset::Create(Synthetic(n), o);
  REQUIRE_MESSAGE(ds.ok(), ds.status().ToString());
  return *ds;
}

Batch Get(const Dataset& ds, DatasetPosition p) {
  auto b = ds.GetBatch(p);
  REQUIRE_MESSAGE(b.ok(), b.status().ToString());
  return *std::move(b);
}

/// Every batch from `start` until OUT_OF_RANGE or `max_batches`.
std::vector<Batch> Iterate(const Dataset& ds, int max_batches, DatasetPosition start = {}) {
  std::vector<Batch> out;
  DatasetPosition p = start;
  for (int i = 0; i < max_batches; ++i) {
    auto b = ds.GetBatch(p);
    if (absl::IsOutOfRange(b.status())) break;
    REQUIRE_MESSAGE(b.ok(), b.status().ToString());
    p = b->next;
    out.push_back(*std::move(b));
  }
  return out;
}

bool SameBatch(const Batch& a, const Batch& b) {
  return a.features.Equals(b.features) && a.labels.Equals(b.labels) && a.position == b.position &&
         a.next == b.next;
}

// -- ParseIdx ------------------------------------------------------------------

TEST_CASE("ParseIdx reads a uint8 IDX file into a uint8 tensor of its dims") {
  auto t = ParseIdx(Idx({2, 3, 2}, Bytes(12, 200)), "x.idx");
  REQUIRE_MESSAGE(t.ok(), t.status().ToString());
  CHECK(t->dtype() == DataType::kUInt8);
  CHECK(t->shape() == TensorShape({2, 3, 2}));
  for (int i = 0; i < 12; ++i) CHECK(t->data<uint8_t>()[i] == static_cast<uint8_t>((200 + i) & 0xFF));

  auto labels = ParseIdx(Idx({4}, Bytes(4)), "l.idx");
  REQUIRE(labels.ok());
  CHECK(labels->shape() == TensorShape({4}));
  auto empty = ParseIdx(Idx({0, 28, 28}, ""), "e.idx");
  REQUIRE(empty.ok());
  CHECK(empty->shape() == TensorShape({0, 28, 28}));
}

TEST_CASE("ParseIdx: a bad magic is INVALID_ARGUMENT naming the bytes found and what an IDX file starts with") {
  auto t = ParseIdx("PK\x03\x04rest of a zip file", "data/train.idx");
  REQUIRE(absl::IsInvalidArgument(t.status()));
  CHECK(absl::StrContains(Msg(t.status()), "data/train.idx"));
  CHECK(absl::StrContains(Msg(t.status()), "50 4b 03 04"));
  CHECK(absl::StrContains(Msg(t.status()), "00 00 08 <ndims>"));
  // A gzip file that was not gunzipped.
  CHECK(absl::IsInvalidArgument(ParseIdx(Gzip(Idx({1}, "a")), "x").status()));
}

TEST_CASE("ParseIdx: another element type or 0 dims is INVALID_ARGUMENT") {
  auto floats = ParseIdx(Idx({2}, std::string(8, '\0'), 0x0D), "f.idx");
  REQUIRE(absl::IsInvalidArgument(floats.status()));
  CHECK(absl::StrContains(Msg(floats.status()), "f.idx"));
  CHECK(absl::StrContains(Msg(floats.status()), "0x0d (float)"));
  auto none = ParseIdx(Idx({}, ""), "z.idx");
  REQUIRE(absl::IsInvalidArgument(none.status()));
  CHECK(absl::StrContains(Msg(none.status()), "z.idx: IDX file with 0 dimensions"));
}

TEST_CASE("ParseIdx: a negative dim or dims over 2^62 elements are INVALID_ARGUMENT, before any allocation") {
  auto negative = ParseIdx(Idx({2, 0x80000000u}, ""), "n.idx");
  REQUIRE(absl::IsInvalidArgument(negative.status()));
  CHECK(absl::StrContains(Msg(negative.status()), "n.idx: IDX dimension 1 is negative (-2147483648)"));

  auto huge = ParseIdx(Idx({0x7fffffffu, 0x7fffffffu, 0x7fffffffu}, "abc"), "h.idx");
  REQUIRE(absl::IsInvalidArgument(huge.status()));
  CHECK(absl::StrContains(Msg(huge.status()), "h.idx"));
  CHECK(absl::StrContains(Msg(huge.status()), "2^62"));
  // Large but representable: the data is missing, DATA_LOSS, and nothing of
  // 2^48 bytes is allocated.
  auto big = ParseIdx(Idx({65536, 65536, 65536}, "abc"), "b.idx");
  REQUIRE(absl::IsDataLoss(big.status()));
  CHECK(absl::StrContains(Msg(big.status()), "expected 281474976710656 bytes of data, found 3"));
}

TEST_CASE("ParseIdx: truncated header or data, and trailing bytes, are DATA_LOSS naming the source") {
  auto empty = ParseIdx("", "e.idx");
  REQUIRE(absl::IsDataLoss(empty.status()));
  CHECK(absl::StrContains(Msg(empty.status()), "e.idx"));
  auto short_header = ParseIdx(Idx({2, 3}, "").substr(0, 9), "h.idx");
  REQUIRE(absl::IsDataLoss(short_header.status()));
  CHECK(absl::StrContains(Msg(short_header.status()), "h.idx: truncated IDX header"));
  auto truncated = ParseIdx(Idx({2, 3}, Bytes(5)), "t.idx");
  REQUIRE(absl::IsDataLoss(truncated.status()));
  CHECK(absl::StrContains(Msg(truncated.status()), "t.idx"));
  CHECK(absl::StrContains(Msg(truncated.status()), "expected 6 bytes of data, found 5"));
  auto trailing = ParseIdx(Idx({2, 3}, Bytes(8)), "x.idx");
  REQUIRE(absl::IsDataLoss(trailing.status()));
  CHECK(absl::StrContains(Msg(trailing.status()), "x.idx: IDX file has 2 bytes after its data"));
}

// -- ReadIdxFile -----------------------------------------------------------------

TEST_CASE("ReadIdxFile reads plain and gzipped files alike, also concatenated gzip members") {
  MemEnv env;
  const std::string idx = Idx({3, 100}, Bytes(300, 9));
  REQUIRE(WriteStringToFile(&env, "/plain-idx1-ubyte", idx).ok());
  REQUIRE(WriteStringToFile(&env, "/zipped-idx1-ubyte.gz", Gzip(idx)).ok());
  REQUIRE(WriteStringToFile(&env, "/two-members.gz", Gzip(idx.substr(0, 100)) + Gzip(idx.substr(100))).ok());
  auto plain = ReadIdxFile(&env, "/plain-idx1-ubyte");
  REQUIRE_MESSAGE(plain.ok(), plain.status().ToString());
  CHECK(plain->Equals(*ParseIdx(idx, "x")));
  for (const char* path : {"/zipped-idx1-ubyte.gz", "/two-members.gz"}) {
    auto zipped = ReadIdxFile(&env, path);
    REQUIRE_MESSAGE(zipped.ok(), zipped.status().ToString());
    CHECK(zipped->Equals(*plain));
  }
}

TEST_CASE("ReadIdxFile: a missing file is NOT_FOUND, a corrupt or truncated gzip stream DATA_LOSS, naming the path") {
  MemEnv env;
  auto missing = ReadIdxFile(&env, "/nope.gz");
  REQUIRE(absl::IsNotFound(missing.status()));
  CHECK(absl::StrContains(Msg(missing.status()), "/nope.gz"));

  const std::string gz = Gzip(Idx({4000}, Bytes(4000)));
  std::string corrupt = gz;
  for (size_t i = 12; i < corrupt.size() - 8; i += 5) corrupt[i] = static_cast<char>(corrupt[i] ^ 0x5A);
  REQUIRE(WriteStringToFile(&env, "/corrupt.gz", corrupt).ok());
  auto c = ReadIdxFile(&env, "/corrupt.gz");
  REQUIRE(absl::IsDataLoss(c.status()));
  CHECK(absl::StrContains(Msg(c.status()), "/corrupt.gz: corrupt gzip stream"));

  // A flipped CRC-32 in the trailer: the data inflates, the check fails.
  std::string bad_crc = gz;
  bad_crc[bad_crc.size() - 8] = static_cast<char>(bad_crc[bad_crc.size() - 8] ^ 1);
  REQUIRE(WriteStringToFile(&env, "/crc.gz", bad_crc).ok());
  auto crc = ReadIdxFile(&env, "/crc.gz");
  REQUIRE(absl::IsDataLoss(crc.status()));
  CHECK(absl::StrContains(Msg(crc.status()), "/crc.gz"));

  REQUIRE(WriteStringToFile(&env, "/cut.gz", gz.substr(0, gz.size() / 2)).ok());
  auto cut = ReadIdxFile(&env, "/cut.gz");
  REQUIRE(absl::IsDataLoss(cut.status()));
  CHECK(absl::StrContains(Msg(cut.status()), "/cut.gz: truncated gzip stream"));

  REQUIRE(WriteStringToFile(&env, "/junk.gz", gz + "junk").ok());
  auto junk = ReadIdxFile(&env, "/junk.gz");
  REQUIRE(absl::IsDataLoss(junk.status()));
  CHECK(absl::StrContains(Msg(junk.status()), "/junk.gz"));

  // ParseIdx's errors name the path too.
  REQUIRE(WriteStringToFile(&env, "/short.gz", Gzip(Idx({10}, Bytes(9)))).ok());
  auto s = ReadIdxFile(&env, "/short.gz");
  REQUIRE(absl::IsDataLoss(s.status()));
  CHECK(absl::StrContains(Msg(s.status()), "/short.gz: truncated IDX file"));
}

// -- LoadLabeledImages / LoadFashionMnist ----------------------------------------

TEST_CASE("LoadLabeledImages checks ranks, counts and label range, naming the files") {
  MemEnv env;
  REQUIRE(WriteStringToFile(&env, "/img", Idx({3, 2, 2}, Bytes(12))).ok());
  REQUIRE(WriteStringToFile(&env, "/img2d", Idx({3, 4}, Bytes(12))).ok());
  REQUIRE(WriteStringToFile(&env, "/lab3", Gzip(Idx({3}, std::string("\x01\x09\x00", 3)))).ok());
  REQUIRE(WriteStringToFile(&env, "/lab4", Idx({4}, std::string(4, '\1'))).ok());
  REQUIRE(WriteStringToFile(&env, "/lab_bad", Idx({3}, std::string("\x01\x02\x0a", 3))).ok());

  auto ok = LoadLabeledImages(&env, "/img", "/lab3");
  REQUIRE_MESSAGE(ok.ok(), ok.status().ToString());
  CHECK(ok->images.shape() == TensorShape({3, 2, 2}));
  CHECK(ok->labels.shape() == TensorShape({3}));
  CHECK(ok->labels.data<uint8_t>()[1] == 9);

  auto count = LoadLabeledImages(&env, "/img", "/lab4");
  REQUIRE(absl::IsInvalidArgument(count.status()));
  CHECK(absl::StrContains(Msg(count.status()), "/img holds 3 images, /lab4 holds 4 labels"));

  auto range = LoadLabeledImages(&env, "/img", "/lab_bad");
  REQUIRE(absl::IsInvalidArgument(range.status()));
  CHECK(absl::StrContains(Msg(range.status()), "/lab_bad: label 2 is 10, not a class in [0, 10)"));
  CHECK(LoadLabeledImages(&env, "/img", "/lab_bad", 11).ok());

  auto rank = LoadLabeledImages(&env, "/img2d", "/lab3");
  REQUIRE(absl::IsInvalidArgument(rank.status()));
  CHECK(absl::StrContains(Msg(rank.status()), "/img2d: expected images of shape [N, rows, cols], got [3,4]"));
  auto labels_rank = LoadLabeledImages(&env, "/img", "/img");
  REQUIRE(absl::IsInvalidArgument(labels_rank.status()));
  CHECK(absl::StrContains(Msg(labels_rank.status()), "/img: expected labels of shape [N]"));
  CHECK(absl::IsInvalidArgument(LoadLabeledImages(&env, "/img", "/lab3", 0).status()));
  CHECK(absl::IsNotFound(LoadLabeledImages(&env, "/img", "/none").status()));
}

void WriteMnistLike(MemEnv* env, const std::string& dir, uint32_t test_rows) {
  REQUIRE(env->RecursivelyCreateDir(dir).ok());
  REQUIRE(WriteStringToFile(env, dir + "/train-images-idx3-ubyte.gz", Gzip(Idx({5, 4, 4}, Bytes(80)))).ok());
  REQUIRE(WriteStringToFile(env, dir + "/train-labels-idx1-ubyte.gz", Gzip(Idx({5}, Bytes(5)))).ok());
  REQUIRE(WriteStringToFile(env, dir + "/t10k-images-idx3-ubyte.gz",
                            Gzip(Idx({2, test_rows, 4}, Bytes(8 * static_cast<int>(test_rows))))).ok());
  REQUIRE(WriteStringToFile(env, dir + "/t10k-labels-idx1-ubyte.gz", Gzip(Idx({2}, Bytes(2)))).ok());
}

TEST_CASE("LoadFashionMnist loads the four files; a missing one is NOT_FOUND naming it (and the package)") {
  MemEnv env;
  WriteMnistLike(&env, "/fm", 4);
  auto fm = LoadFashionMnist(&env, "/fm/");
  REQUIRE_MESSAGE(fm.ok(), fm.status().ToString());
  CHECK(fm->train.images.shape() == TensorShape({5, 4, 4}));
  CHECK(fm->test.labels.shape() == TensorShape({2}));

  REQUIRE(env.DeleteFile("/fm/t10k-labels-idx1-ubyte.gz").ok());
  auto missing = LoadFashionMnist(&env, "/fm");
  REQUIRE(absl::IsNotFound(missing.status()));
  CHECK(absl::StrContains(Msg(missing.status()), "/fm/t10k-labels-idx1-ubyte.gz"));
  CHECK_FALSE(absl::StrContains(Msg(missing.status()), "dataset-fashion-mnist"));

  auto no_package = LoadFashionMnist(&env, kFashionMnistDir);  // empty MemEnv there
  REQUIRE(absl::IsNotFound(no_package.status()));
  CHECK(absl::StrContains(Msg(no_package.status()), "/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz"));
  CHECK(absl::StrContains(Msg(no_package.status()), "Debian's dataset-fashion-mnist package"));

  MemEnv other;
  WriteMnistLike(&other, "/fm", 3);
  auto sizes = LoadFashionMnist(&other, "/fm");
  REQUIRE(absl::IsInvalidArgument(sizes.status()));
  CHECK(absl::StrContains(Msg(sizes.status()), "holds 4x4 images"));
  CHECK(absl::StrContains(Msg(sizes.status()), "holds 3x4"));
}

TEST_CASE("the installed Fashion-MNIST: 60000/10000 images of 28x28, labels < 10") {
  if (!Env::Default()->FileExists(std::string(kFashionMnistDir) + "/train-images-idx3-ubyte.gz").ok()) {
    MESSAGE("skipped: ", kFashionMnistDir, " is absent (Debian package dataset-fashion-mnist)");
    return;
  }
  auto fm = LoadFashionMnist(nullptr, kFashionMnistDir);
  REQUIRE_MESSAGE(fm.ok(), fm.status().ToString());
  CHECK(fm->train.images.shape() == TensorShape({60000, 28, 28}));
  CHECK(fm->train.labels.shape() == TensorShape({60000}));
  CHECK(fm->test.images.shape() == TensorShape({10000, 28, 28}));
  CHECK(fm->test.labels.shape() == TensorShape({10000}));
  std::vector<int> per_class(10, 0);
  for (int64_t i = 0; i < 60000; ++i) {
    const uint8_t label = fm->train.labels.data<uint8_t>()[i];
    REQUIRE(label < 10);
    ++per_class[label];
  }
  for (int c = 0; c < 10; ++c) CHECK(per_class[static_cast<size_t>(c)] == 6000);  // balanced classes
  auto ds = Dataset::Create(std::move(fm->train), DatasetOptions{});
  REQUIRE(ds.ok());
  CHECK((*ds)->feature_dim() == 784);
  CHECK((*ds)->batches_per_epoch() == 469);
}

// -- Dataset -----------------------------------------------------------------------

TEST_CASE("Dataset::Create rejects bad options and data") {
  DatasetOptions o;
  o.batch_size = 0;
  CHECK(absl::IsInvalidArgument(Dataset::Create(Synthetic(4), o).status()));
  o.batch_size = 2;
  o.epochs = -1;
  CHECK(absl::IsInvalidArgument(Dataset::Create(Synthetic(4), o).status()));
  o.epochs = 0;
  CHECK(absl::IsInvalidArgument(Dataset::Create(Synthetic(0), o).status()));
  LabeledImages mismatch = Synthetic(4);
  mismatch.labels = Tensor(DataType::kUInt8, TensorShape({3}));
  CHECK(absl::IsInvalidArgument(Dataset::Create(std::move(mismatch), o).status()));
  LabeledImages floats = Synthetic(4);
  floats.images = Tensor(DataType::kFloat, TensorShape({4, 2, 3}));
  CHECK(absl::IsInvalidArgument(Dataset::Create(std::move(floats), o).status()));
  CHECK(Dataset::Create(Synthetic(4), o).ok());
}

TEST_CASE("a batch holds float32 [B, rows*cols] = pixel / 255 and int32 labels; the last one the remainder") {
  DatasetOptions o;
  o.batch_size = 4;
  o.shuffle = false;
  auto ds = MakeDataset(10, o);
  CHECK(ds->num_examples() == 10);
  CHECK(ds->feature_dim() == 6);
  CHECK(ds->batches_per_epoch() == 3);
  const LabeledImages data = Synthetic(10);
  std::vector<Batch> epoch = Iterate(*ds, 3);
  REQUIRE(epoch.size() == 3);
  CHECK(epoch[0].features.shape() == TensorShape({4, 6}));
  CHECK(epoch[0].labels.dtype() == DataType::kInt32);
  CHECK(epoch[2].features.shape() == TensorShape({2, 6}));
  CHECK(epoch[2].labels.shape() == TensorShape({2}));
  CHECK(epoch[1].position == DatasetPosition{0, 4});
  CHECK(epoch[1].next == DatasetPosition{0, 8});
  CHECK(epoch[2].next == DatasetPosition{1, 0});
  for (int b = 0; b < 3; ++b) {
    const Batch& batch = epoch[static_cast<size_t>(b)];
    for (int64_t i = 0; i < batch.labels.num_elements(); ++i) {
      const int64_t example = b * 4 + i;
      CHECK(batch.labels.data<int32_t>()[i] == example % 10);
      for (int64_t j = 0; j < 6; ++j) {
        const float expected = static_cast<float>(data.images.data<uint8_t>()[example * 6 + j]) / 255.0f;
        CHECK(batch.features.data<float>()[i * 6 + j] == expected);
      }
    }
  }
  // Unshuffled, every epoch is file order.
  CHECK(SameBatch(Get(*ds, {5, 4}), [&] {
    Batch b = epoch[1];
    b.position = {5, 4};
    b.next = {5, 8};
    return b;
  }()));
}

TEST_CASE("each shuffled epoch is a fresh permutation of all examples") {
  DatasetOptions o;
  o.batch_size = 7;
  o.seed = 3;
  auto ds = MakeDataset(50, o);
  std::vector<std::vector<int64_t>> orders;
  DatasetPosition p;
  for (int epoch = 0; epoch < 3; ++epoch) {
    std::vector<int64_t> order;
    do {
      Batch b = Get(*ds, p);
      for (int64_t id : Ids(b)) order.push_back(id);
      p = b.next;
    } while (p.index != 0);
    CHECK(p.epoch == epoch + 1);
    std::vector<int64_t> sorted = order;
    std::sort(sorted.begin(), sorted.end());
    std::vector<int64_t> all(50);
    std::iota(all.begin(), all.end(), 0);
    CHECK(sorted == all);
    orders.push_back(order);
  }
  CHECK(orders[0] != orders[1]);
  CHECK(orders[1] != orders[2]);
  std::vector<int64_t> file_order(50);
  std::iota(file_order.begin(), file_order.end(), 0);
  CHECK(orders[0] != file_order);
}

TEST_CASE("the same seed gives the same batches, another seed another order") {
  DatasetOptions o;
  o.batch_size = 8;
  o.seed = 11;
  std::vector<Batch> a = Iterate(*MakeDataset(40, o), 20);
  std::vector<Batch> b = Iterate(*MakeDataset(40, o), 20);
  REQUIRE(a.size() == 20);
  REQUIRE(b.size() == 20);
  for (size_t i = 0; i < a.size(); ++i) CHECK(SameBatch(a[i], b[i]));
  o.seed = 12;
  std::vector<Batch> c = Iterate(*MakeDataset(40, o), 5);
  CHECK(Ids(c[0]) != Ids(a[0]));
}

// The generator is portable: these orders were computed by an independent
// Python implementation of the same splitmix64 + Fisher-Yates (checked
// against splitmix64's reference output 0xe220a8397b1dcdaf for state 0), so a
// change of standard library or platform cannot change which batches a
// resumed run sees.
TEST_CASE("the permutation is splitmix64 + Fisher-Yates, the same on every platform") {
  DatasetOptions o;
  o.batch_size = 10;
  o.seed = 42;
  auto ds = MakeDataset(10, o);
  CHECK(Ids(Get(*ds, {0, 0})) == std::vector<int64_t>{1, 6, 9, 4, 2, 3, 5, 0, 8, 7});
  CHECK(Ids(Get(*ds, {1, 0})) == std::vector<int64_t>{2, 9, 4, 0, 7, 5, 1, 6, 3, 8});
  o.seed = 7;
  CHECK(Ids(Get(*MakeDataset(10, o), {3, 0})) == std::vector<int64_t>{1, 3, 5, 8, 0, 7, 4, 2, 9, 6});
}

TEST_CASE("OUT_OF_RANGE \"End of sequence\" after `epochs` epochs (TF: repeat(epochs))") {
  DatasetOptions o;
  o.batch_size = 4;
  o.epochs = 2;
  auto ds = MakeDataset(10, o);
  std::vector<Batch> all = Iterate(*ds, 100);
  CHECK(all.size() == 6);
  CHECK(all.back().next == DatasetPosition{2, 0});
  auto end = ds->GetBatch({2, 0});
  REQUIRE(absl::IsOutOfRange(end.status()));
  CHECK(Msg(end.status()) == "End of sequence");
  CHECK(absl::IsOutOfRange(ds->GetBatch({7, 3}).status()));
  o.epochs = 0;  // forever
  CHECK(MakeDataset(10, o)->GetBatch({1000000, 0}).ok());
}

TEST_CASE("GetBatch at a saved position equals what sequential iteration gives there (resume)") {
  DatasetOptions o;
  o.batch_size = 6;
  o.seed = 5;
  std::vector<Batch> sequential = Iterate(*MakeDataset(23, o), 14);
  REQUIRE(sequential.size() == 14);
  // A fresh dataset (a restarted process): no cached permutation.
  for (size_t i = sequential.size(); i-- > 0;) {
    auto resumed = MakeDataset(23, o);
    CHECK(SameBatch(Get(*resumed, sequential[i].position), sequential[i]));
  }
  // And the rest of the run from a mid-epoch position.
  std::vector<Batch> rest = Iterate(*MakeDataset(23, o), 6, sequential[5].position);
  for (size_t i = 0; i < rest.size(); ++i) CHECK(SameBatch(rest[i], sequential[5 + i]));
  // A position that is not batch-aligned is a batch starting there.
  Batch odd = Get(*MakeDataset(23, o), {1, 2});
  std::vector<int64_t> epoch1;
  for (size_t i = 4; i < 8; ++i) {
    for (int64_t id : Ids(sequential[i])) epoch1.push_back(id);
  }
  CHECK(Ids(odd) == std::vector<int64_t>(epoch1.begin() + 2, epoch1.begin() + 8));
}

TEST_CASE("GetBatch: a negative epoch or an index outside [0, N) is INVALID_ARGUMENT") {
  auto ds = MakeDataset(10, DatasetOptions{});
  for (DatasetPosition p : {DatasetPosition{-1, 0}, DatasetPosition{0, -1}, DatasetPosition{0, 10}}) {
    auto b = ds->GetBatch(p);
    REQUIRE(absl::IsInvalidArgument(b.status()));
    CHECK(absl::StrContains(Msg(b.status()), p.ToString()));
  }
}

TEST_CASE("Slice gives examples [begin, end) in file order") {
  DatasetOptions o;
  o.batch_size = 3;
  auto ds = MakeDataset(10, o);
  auto s = ds->Slice(2, 9);
  REQUIRE(s.ok());
  CHECK(Ids(*s) == std::vector<int64_t>{2, 3, 4, 5, 6, 7, 8});
  CHECK(s->labels.data<int32_t>()[0] == 2);
  CHECK(s->features.shape() == TensorShape({7, 6}));
  CHECK(ds->Slice(10, 10)->features.shape() == TensorShape({0, 6}));
  CHECK(absl::IsInvalidArgument(ds->Slice(3, 2).status()));
  CHECK(absl::IsInvalidArgument(ds->Slice(0, 11).status()));
  CHECK(absl::IsInvalidArgument(ds->Slice(-1, 1).status()));
}

TEST_CASE("GetBatch of 128 x 784 costs tens of microseconds") {
  LabeledImages data;
  data.images = Tensor(DataType::kUInt8, TensorShape({2048, 28, 28}));
  data.labels = Tensor(DataType::kUInt8, TensorShape({2048}));
  auto ds = Dataset::Create(std::move(data), DatasetOptions{});
  REQUIRE(ds.ok());
  DatasetPosition p;
  REQUIRE((*ds)->GetBatch(p).ok());  // the permutation
  constexpr int kBatches = 200;
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < kBatches; ++i) {
    auto b = (*ds)->GetBatch(p);
    REQUIRE(b.ok());
    p = b->next;
  }
  const double us =
      std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count() / kBatches;
  MESSAGE("GetBatch(128 x 784): ", us, " us");
  // Generous: -O0 and sanitizer builds run it too. A per-element allocation
  // or a lock per element would still fail it.
  CHECK(us < 20000);
}

}  // namespace
}  // namespace foreman::data
