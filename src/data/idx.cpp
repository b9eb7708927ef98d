// IDX files (http://yann.lecun.com/exdb/mnist/, "THE IDX FILE FORMAT"):
// parsing, gunzipping, and the Fashion-MNIST files.
#include <zlib.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "foreman/dataset.hpp"
#include "platform/path.hpp"

namespace foreman::data {

namespace {

constexpr unsigned char kIdxUInt8 = 0x08;
// Tensors allow 2^62 elements (TensorShape::Create); dims beyond that are not
// a file this program could hold, whatever the file's length.
constexpr int64_t kMaxElements = int64_t{1} << 62;

std::string HexBytes(absl::string_view bytes) {
  std::string out;
  for (size_t i = 0; i < bytes.size(); ++i) {
    if (i > 0) out.push_back(' ');
    absl::StrAppendFormat(&out, "%02x", static_cast<unsigned char>(bytes[i]));
  }
  return out;
}

const char* IdxTypeName(unsigned char type) {
  switch (type) {
    case 0x08: return "unsigned byte";
    case 0x09: return "signed byte";
    case 0x0B: return "short";
    case 0x0C: return "int";
    case 0x0D: return "float";
    case 0x0E: return "double";
    default: return "unknown";
  }
}

uint32_t BigEndian32(const char* p) {
  const auto* u = reinterpret_cast<const unsigned char*>(p);
  return (uint32_t{u[0]} << 24) | (uint32_t{u[1]} << 16) | (uint32_t{u[2]} << 8) | uint32_t{u[3]};
}

bool IsGzip(absl::string_view bytes) {
  return bytes.size() >= 2 && static_cast<unsigned char>(bytes[0]) == 0x1f &&
         static_cast<unsigned char>(bytes[1]) == 0x8b;
}

/// gunzip; a stream of several members (`cat a.gz b.gz`) is their
/// concatenation, as gzip -d reads it.
StatusOr<std::string> Gunzip(absl::string_view in, const std::string& path) {
  z_stream zs;
  std::memset(&zs, 0, sizeof(zs));
  // 16 + MAX_WBITS: a gzip header and trailer (CRC-32 and length checked).
  if (inflateInit2(&zs, 16 + MAX_WBITS) != Z_OK) {
    return absl::InternalError(absl::StrCat(path, ": cannot initialise zlib"));
  }
  std::string out;
  // The trailer's ISIZE is the last member's length mod 2^32: a good first
  // guess for one member, capped so that a forged one costs nothing.
  if (in.size() >= 18) {
    const auto* t = reinterpret_cast<const unsigned char*>(in.data() + in.size() - 4);
    const uint32_t isize = uint32_t{t[0]} | (uint32_t{t[1]} << 8) | (uint32_t{t[2]} << 16) | (uint32_t{t[3]} << 24);
    out.reserve(std::min<size_t>(isize, std::max<size_t>(in.size() * 16, 1 << 20)));
  }
  size_t consumed = 0;
  Status status;
  for (;;) {
    const size_t chunk = std::min<size_t>(in.size() - consumed, std::numeric_limits<uInt>::max());
    zs.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(in.data() + consumed));
    zs.avail_in = static_cast<uInt>(chunk);
    if (out.capacity() - out.size() < 4096) out.reserve(std::max<size_t>(out.capacity() * 2, 1 << 16));
    const size_t before = out.size();
    const size_t room = std::min<size_t>(out.capacity() - before, std::numeric_limits<uInt>::max());
    out.resize(before + room);
    zs.next_out = reinterpret_cast<Bytef*>(&out[before]);
    zs.avail_out = static_cast<uInt>(room);
    const int rc = inflate(&zs, Z_NO_FLUSH);
    out.resize(before + (room - zs.avail_out));
    consumed += chunk - zs.avail_in;
    if (rc == Z_STREAM_END) {
      if (consumed == in.size()) break;
      if (!IsGzip(in.substr(consumed))) {
        status = absl::DataLossError(absl::StrCat(path, ": corrupt gzip stream: ", in.size() - consumed,
                                                  " bytes after the end of the compressed data"));
        break;
      }
      inflateReset(&zs);
      continue;
    }
    if (rc == Z_OK) continue;
    if (rc == Z_BUF_ERROR && zs.avail_out == 0) continue;  // out of room: grow and retry
    if (rc == Z_BUF_ERROR && consumed == in.size()) {
      status = absl::DataLossError(absl::StrCat(path, ": truncated gzip stream: it ends after ", in.size(),
                                                " bytes, before the end of the compressed data"));
      break;
    }
    if (rc == Z_MEM_ERROR) {
      status = absl::ResourceExhaustedError(absl::StrCat(path, ": zlib is out of memory"));
      break;
    }
    status = absl::DataLossError(absl::StrCat(path, ": corrupt gzip stream at compressed byte ", consumed, ": ",
                                              zs.msg != nullptr ? zs.msg : "zlib error " + std::to_string(rc)));
    break;
  }
  inflateEnd(&zs);
  if (!status.ok()) return status;
  return out;
}

}  // namespace

StatusOr<Tensor> ParseIdx(absl::string_view bytes, const std::string& source) {
  const absl::string_view magic = bytes.substr(0, 4);
  if ((magic.size() >= 1 && magic[0] != 0) || (magic.size() >= 2 && magic[1] != 0)) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": not an IDX file: it starts with ", HexBytes(magic),
                                                   "; an IDX file starts with 00 00 08 <ndims>"));
  }
  if (bytes.size() < 4) {
    return absl::DataLossError(absl::StrCat(source, ": truncated IDX file: expected a 4-byte header, found ",
                                            bytes.size(), " bytes"));
  }
  const auto type = static_cast<unsigned char>(bytes[2]);
  if (type != kIdxUInt8) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: unsupported IDX element type 0x%02x (%s): only 0x08 (unsigned byte) is supported", source, type,
        IdxTypeName(type)));
  }
  const int ndims = static_cast<unsigned char>(bytes[3]);
  if (ndims == 0) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": IDX file with 0 dimensions"));
  }
  const size_t header = 4 + 4 * static_cast<size_t>(ndims);
  if (bytes.size() < header) {
    return absl::DataLossError(absl::StrCat(source, ": truncated IDX header: ", ndims, " dimensions need ", header,
                                            " bytes, found ", bytes.size()));
  }
  std::vector<int64_t> dims(static_cast<size_t>(ndims));
  int64_t elements = 1;
  for (int i = 0; i < ndims; ++i) {
    const auto dim = static_cast<int32_t>(BigEndian32(bytes.data() + 4 + 4 * i));
    if (dim < 0) {
      return absl::InvalidArgumentError(absl::StrCat(source, ": IDX dimension ", i, " is negative (", dim, ")"));
    }
    dims[static_cast<size_t>(i)] = dim;
    // TensorShape::Create's rule, checked here to name `source`.
    if (dim != 0 && elements > kMaxElements / dim) {
      return absl::InvalidArgumentError(absl::StrCat(source, ": IDX dimensions [",
                                                     absl::StrJoin(dims.begin(), dims.begin() + i + 1, ","),
                                                     i + 1 < ndims ? ",...]" : "]", " hold more than 2^62 elements"));
    }
    elements *= dim;
  }
  const size_t found = bytes.size() - header;
  if (static_cast<uint64_t>(elements) != found) {
    if (static_cast<uint64_t>(elements) > found) {
      return absl::DataLossError(absl::StrCat(source, ": truncated IDX file: dimensions [", absl::StrJoin(dims, ","),
                                              "]: expected ", elements, " bytes of data, found ", found));
    }
    return absl::DataLossError(absl::StrCat(source, ": IDX file has ", found - static_cast<uint64_t>(elements),
                                            " bytes after its data (dimensions [", absl::StrJoin(dims, ","),
                                            "] need ", elements, " bytes)"));
  }
  FOREMAN_ASSIGN_OR_RETURN(TensorShape shape, TensorShape::Create(std::move(dims)));
  FOREMAN_ASSIGN_OR_RETURN(Tensor t, Tensor::Create(DataType::kUInt8, std::move(shape)));
  if (elements > 0) std::memcpy(t.raw_data(), bytes.data() + header, static_cast<size_t>(elements));
  return t;
}

StatusOr<Tensor> ReadIdxFile(Env* env, const std::string& path) {
  if (env == nullptr) env = Env::Default();
  FOREMAN_ASSIGN_OR_RETURN(std::string contents, env->ReadFileToString(path));
  if (IsGzip(contents)) {
    FOREMAN_ASSIGN_OR_RETURN(contents, Gunzip(contents, path));
  }
  return ParseIdx(contents, path);
}

StatusOr<LabeledImages> LoadLabeledImages(Env* env, const std::string& images_path, const std::string& labels_path,
                                          int num_classes) {
  if (num_classes < 1 || num_classes > 256) {
    return absl::InvalidArgumentError(
        absl::StrCat("LoadLabeledImages: num_classes must be in [1, 256] for uint8 labels, got ", num_classes));
  }
  LabeledImages data;
  FOREMAN_ASSIGN_OR_RETURN(data.images, ReadIdxFile(env, images_path));
  FOREMAN_ASSIGN_OR_RETURN(data.labels, ReadIdxFile(env, labels_path));
  if (data.images.shape().rank() != 3) {
    return absl::InvalidArgumentError(absl::StrCat(images_path, ": expected images of shape [N, rows, cols], got ",
                                                   data.images.shape().ToString()));
  }
  if (data.labels.shape().rank() != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(labels_path, ": expected labels of shape [N], got ", data.labels.shape().ToString()));
  }
  const int64_t n_images = data.images.shape().dim(0), n_labels = data.labels.shape().dim(0);
  if (n_images != n_labels) {
    return absl::InvalidArgumentError(absl::StrCat("images and labels do not match: ", images_path, " holds ",
                                                   n_images, " images, ", labels_path, " holds ", n_labels,
                                                   " labels"));
  }
  const uint8_t* labels = data.labels.data<uint8_t>();
  for (int64_t i = 0; i < n_labels; ++i) {
    if (labels[i] >= num_classes) {
      return absl::InvalidArgumentError(absl::StrCat(labels_path, ": label ", i, " is ", int{labels[i]},
                                                     ", not a class in [0, ", num_classes, ")"));
    }
  }
  return data;
}

StatusOr<FashionMnist> LoadFashionMnist(Env* env, const std::string& dir) {
  if (env == nullptr) env = Env::Default();
  const std::string stripped = internal::NormalizeDirectory(dir);
  auto path = [&](const char* name) { return JoinPath(stripped, name); };
  const std::string train_images = path("train-images-idx3-ubyte.gz");
  const std::string train_labels = path("train-labels-idx1-ubyte.gz");
  const std::string test_images = path("t10k-images-idx3-ubyte.gz");
  const std::string test_labels = path("t10k-labels-idx1-ubyte.gz");
  // All four first: a missing package should not cost a minute of gunzip.
  for (const std::string& p : {train_images, train_labels, test_images, test_labels}) {
    Status s = env->FileExists(p);
    if (absl::IsNotFound(s)) {
      std::string message = absl::StrCat("Fashion-MNIST file not found: ", p);
      if (stripped == kFashionMnistDir) {
        absl::StrAppend(&message, " (Debian's dataset-fashion-mnist package provides it: "
                                  "apt-get install dataset-fashion-mnist)");
      }
      return absl::NotFoundError(message);
    }
    FOREMAN_RETURN_IF_ERROR(s);
  }
  FashionMnist mnist;
  FOREMAN_ASSIGN_OR_RETURN(mnist.train, LoadLabeledImages(env, train_images, train_labels, 10));
  FOREMAN_ASSIGN_OR_RETURN(mnist.test, LoadLabeledImages(env, test_images, test_labels, 10));
  const TensorShape& a = mnist.train.images.shape();
  const TensorShape& b = mnist.test.images.shape();
  if (a.dim(1) != b.dim(1) || a.dim(2) != b.dim(2)) {
    return absl::InvalidArgumentError(absl::StrCat("Fashion-MNIST images differ in size: ", train_images, " holds ",
                                                   a.dim(1), "x", a.dim(2), " images, ", test_images, " holds ",
                                                   b.dim(1), "x", b.dim(2)));
  }
  return mnist;
}

}  // namespace foreman::data
