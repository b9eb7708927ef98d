// BundleWriter (TF: tensorflow::BundleWriter): tensors are appended to a
// temporary data file; Finish() writes the index with LevelDB's TableBuilder
// to a second temporary file, syncs both and renames them into place.
#include "foreman/bundle.hpp"

#include <atomic>
#include <cstring>
#include <map>
#include <random>

#include <leveldb/options.h>
#include <leveldb/table_builder.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "formats/bundle/bundle_format.hpp"
#include "formats/bundle/leveldb_env.hpp"
#include "tensor_bundle.pb.h"

namespace foreman {

std::string BundleIndexPath(const std::string& prefix) { return prefix + ".index"; }

std::string BundleDataPath(const std::string& prefix, int shard, int num_shards) {
  return absl::StrFormat("%s.data-%05d-of-%05d", prefix, shard, num_shards);
}

namespace {

/// A suffix for temporary names: random across processes, unique within one.
uint64_t TempSuffix() {
  static std::atomic<uint64_t> next{(uint64_t{std::random_device{}()} << 32) ^ std::random_device{}()};
  return next.fetch_add(0x9e3779b97f4a7c15ull);
}

void AppendVarint64(uint64_t v, std::string* out) {
  for (; v >= 0x80; v >>= 7) out->push_back(static_cast<char>(v | 0x80));
  out->push_back(static_cast<char>(v));
}

/// A string tensor in TF's layout: the varint64 lengths, the masked CRC32C of
/// the lengths (uint32 LE), the bytes. `*crc` gets the (unmasked) entry CRC:
/// lengths as ExtendStringLength() sums them, the 4 stored bytes, the bytes.
std::string EncodeStrings(const Tensor& t, uint32_t* crc) {
  const std::string* strings = t.data<std::string>();
  const int64_t n = t.num_elements();
  std::string out;
  uint32_t c = 0;
  for (int64_t i = 0; i < n; ++i) {
    AppendVarint64(strings[i].size(), &out);
    c = internal::ExtendStringLength(c, strings[i].size());
  }
  const uint32_t masked = crc32c::Mask(c);
  char raw[sizeof(masked)];
  std::memcpy(raw, &masked, sizeof(masked));
  out.append(raw, sizeof(raw));
  c = crc32c::Extend(c, raw, sizeof(raw));
  for (int64_t i = 0; i < n; ++i) {
    out += strings[i];
    c = crc32c::Extend(c, strings[i].data(), strings[i].size());
  }
  *crc = c;
  return out;
}

}  // namespace

// -- Impl ---------------------------------------------------------------------------

struct BundleWriter::Impl {
  Env* env = nullptr;
  std::string prefix;
  std::string data_tmp;
  std::string index_tmp;
  std::unique_ptr<WritableFile> data;
  std::map<std::string, proto::BundleEntryProto> entries;  // bytewise order
  uint64_t size = 0;
  Status io_error;          // sticky: the data file is in an unknown state
  bool finished = false;    // Finish() was called
  bool committed = false;   // both files renamed into place

  ~Impl() {
    if (committed) return;
    data.reset();
    env->DeleteFile(data_tmp).IgnoreError();   // best effort; may not exist
    env->DeleteFile(index_tmp).IgnoreError();
  }

  Status WriteIndex() {
    FOREMAN_ASSIGN_OR_RETURN(std::unique_ptr<WritableFile> file, env->NewWritableFile(index_tmp));
    internal::LevelDbWritableFile adapter(file.get());
    // Bytewise comparator, no filter policy, default block layout: the table
    // format TF's own writer produces. TF writes uncompressed indexes too.
    leveldb::Options options;
    options.compression = leveldb::kNoCompression;
    leveldb::TableBuilder builder(options, &adapter);
    proto::BundleHeaderProto header;
    header.set_num_shards(1);
    header.set_endianness(proto::BundleHeaderProto::LITTLE);
    header.mutable_version()->set_producer(internal::kBundleVersion);
    builder.Add(internal::kBundleHeaderKey, header.SerializeAsString());
    for (const auto& [name, entry] : entries) builder.Add(name, entry.SerializeAsString());
    // Finish() first, in its own statement: the index's writes happen in it
    // (the whole table is buffered until then), and only after it has the
    // adapter seen their error. As two arguments of one call the order of
    // the two would be unspecified (GCC reads adapter.error() first, which
    // lost the foreman Status: code, message and payloads).
    const leveldb::Status finished = builder.Finish();
    FOREMAN_RETURN_IF_ERROR(internal::FromLevelDb(finished, adapter.error(), index_tmp));
    FOREMAN_RETURN_IF_ERROR(file->Sync());
    return file->Close();
  }
};

// -- BundleWriter ----------------------------------------------------------------

BundleWriter::BundleWriter(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
BundleWriter::~BundleWriter() = default;

StatusOr<std::unique_ptr<BundleWriter>> BundleWriter::Create(Env* env, const std::string& prefix) {
  const std::string dir = Dirname(prefix);
  StatusOr<bool> is_dir = env->IsDirectory(dir);
  if ((is_dir.ok() && !*is_dir) || absl::IsNotFound(is_dir.status())) {
    return absl::NotFoundError(
        absl::StrCat("cannot write checkpoint ", prefix, ": directory ", dir, " does not exist"));
  }
  FOREMAN_RETURN_IF_ERROR(is_dir.status());
  auto impl = std::make_unique<Impl>();
  impl->env = env;
  impl->prefix = prefix;
  impl->data_tmp = absl::StrCat(BundleDataPath(prefix), ".tempstate", TempSuffix());
  impl->index_tmp = absl::StrCat(BundleIndexPath(prefix), ".tempstate", TempSuffix());
  FOREMAN_ASSIGN_OR_RETURN(impl->data, env->NewWritableFile(impl->data_tmp));
  return std::unique_ptr<BundleWriter>(new BundleWriter(std::move(impl)));
}

Status BundleWriter::Add(const std::string& name, const Tensor& tensor) {
  Impl& w = *impl_;
  const std::string where = absl::StrCat("bundle ", w.prefix, ": ");
  if (w.finished) return absl::FailedPreconditionError(absl::StrCat(where, "Add() after Finish()"));
  FOREMAN_RETURN_IF_ERROR(w.io_error);
  if (name.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(where, "empty tensor name (reserved for the header)"));
  }
  if (tensor.dtype() == DataType::kInvalid) {
    return absl::InvalidArgumentError(absl::StrCat(where, "tensor '", name, "' has no dtype"));
  }
  if (w.entries.count(name) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(where, "duplicate tensor name '", name, "'"));
  }
  proto::BundleEntryProto entry;
  entry.set_dtype(static_cast<proto::DataType>(tensor.dtype()));
  proto::TensorShapeProto* shape = entry.mutable_shape();  // present even for a scalar, as TF writes it
  for (int64_t d : tensor.shape().dims()) shape->add_dim()->set_size(d);
  entry.set_offset(static_cast<int64_t>(w.size));

  uint32_t crc = 0;
  std::string encoded;
  absl::string_view bytes;
  if (tensor.dtype() == DataType::kString) {
    encoded = EncodeStrings(tensor, &crc);
    bytes = encoded;
  } else {
    bytes = absl::string_view(tensor.raw_data(), tensor.TotalBytes());
    crc = crc32c::Value(bytes.data(), bytes.size());
  }
  if (!bytes.empty()) {
    Status s = w.data->Append(bytes);
    if (!s.ok()) {
      w.io_error = s;
      return s;
    }
  }
  entry.set_size(static_cast<int64_t>(bytes.size()));
  entry.set_crc32c(crc32c::Mask(crc));
  w.size += bytes.size();
  w.entries.emplace(name, std::move(entry));
  return absl::OkStatus();
}

Status BundleWriter::Finish() {
  Impl& w = *impl_;
  if (w.finished) {
    return absl::FailedPreconditionError(absl::StrCat("bundle ", w.prefix, ": Finish() called twice"));
  }
  w.finished = true;
  FOREMAN_RETURN_IF_ERROR(w.io_error);
  FOREMAN_RETURN_IF_ERROR(w.data->Sync());
  FOREMAN_RETURN_IF_ERROR(w.data->Close());
  FOREMAN_RETURN_IF_ERROR(w.WriteIndex());
  // Data first: an index never names a data file that is not in place.
  FOREMAN_RETURN_IF_ERROR(w.env->RenameFile(w.data_tmp, BundleDataPath(w.prefix)));
  FOREMAN_RETURN_IF_ERROR(w.env->RenameFile(w.index_tmp, BundleIndexPath(w.prefix)));
  w.committed = true;
  return w.env->SyncDir(Dirname(w.prefix));
}

uint64_t BundleWriter::data_bytes() const { return impl_->size; }

}  // namespace foreman
