// BundleReader (TF: tensorflow::BundleReader): Open() reads the whole index
// with LevelDB's table reader (checksums verified) into memory and opens the
// data shards; Lookup() reads one tensor by offset and verifies its CRC32C.
#include "foreman/bundle.hpp"

#include <algorithm>
#include <cstring>
#include <memory>
#include <new>

#include <leveldb/iterator.h>
#include <leveldb/options.h>
#include <leveldb/table.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "formats/bundle/bundle_format.hpp"
#include "formats/bundle/leveldb_env.hpp"
#include "tensor_bundle.pb.h"

namespace foreman {

namespace {

constexpr int kDtVariant = 21;   // TF's DT_VARIANT: its own per-element layout

// Fuzz builds skip the tensors' CRC checks so that fuzz inputs reach the
// decoders. LevelDB's block CRCs stay on: they keep corrupt block handles
// (which LevelDB allocates before reading) away from its table code.
#ifdef FOREMAN_FUZZING_BUILD_MODE
constexpr bool kVerifyChecksums = false;
#else
constexpr bool kVerifyChecksums = true;
#endif

constexpr std::size_t kFooterBytes = 48;       // LevelDB: two block handles, padding, magic
constexpr std::size_t kBlockTrailerBytes = 5;  // LevelDB: compression type, masked CRC32C

bool ParseVarint64(absl::string_view in, std::size_t* pos, uint64_t* value) {
  uint64_t v = 0;
  for (int shift = 0; shift <= 63 && *pos < in.size(); shift += 7) {
    const auto byte = static_cast<uint8_t>(in[(*pos)++]);
    v |= uint64_t{byte & 0x7fu} << shift;
    if ((byte & 0x80) == 0) {
      *value = v;
      return true;
    }
  }
  return false;
}

/// LevelDB allocates a block's size before reading the block, and the
/// footer's two block handles carry no CRC: checks them against the file
/// size first, so that a corrupt footer is DATA_LOSS, not a huge allocation.
/// A bad magic number is left to LevelDB to report.
Status CheckFooter(const RandomAccessFile& file, const std::string& path) {
  const uint64_t size = file.Size();
  if (size < kFooterBytes) return absl::OkStatus();
  char buf[kFooterBytes];
  StatusOr<absl::string_view> footer = file.Read(size - kFooterBytes, kFooterBytes, buf);
  if (!footer.ok() || footer->size() != kFooterBytes) return footer.status();
  std::size_t pos = 0;
  for (int handle = 0; handle < 2; ++handle) {
    uint64_t offset = 0, length = 0;
    if (!ParseVarint64(*footer, &pos, &offset) || !ParseVarint64(*footer, &pos, &length) ||
        offset > size || length > size - offset || length + kBlockTrailerBytes > size - offset) {
      return absl::DataLossError(absl::StrCat(path, ": corrupt table footer"));
    }
  }
  return absl::OkStatus();
}

/// The entry as BundleEntry; DATA_LOSS / UNIMPLEMENTED naming `index` and the
/// variable for what Foreman cannot use.
StatusOr<BundleEntry> ToEntry(const std::string& index, const std::string& name,
                              const proto::BundleEntryProto& p, int num_shards) {
  const std::string where = absl::StrCat(index, ": variable '", name, "': ");
  if (p.slices_size() > 0) {
    return absl::UnimplementedError(
        absl::StrCat(where, "partitioned (sliced) variables are not supported"));
  }
  if (p.shard_id() < 0 || p.shard_id() >= num_shards) {
    return absl::DataLossError(absl::StrCat(where, "shard ", p.shard_id(), " of ", num_shards));
  }
  if (p.offset() < 0 || p.size() < 0) {
    return absl::DataLossError(absl::StrCat(where, "negative offset or size"));
  }
  std::vector<int64_t> dims;
  for (const auto& d : p.shape().dim()) dims.push_back(d.size());
  StatusOr<TensorShape> shape = TensorShape::Create(std::move(dims));
  if (!shape.ok() || p.shape().unknown_rank()) {
    return absl::DataLossError(absl::StrCat(where, "invalid shape ", p.shape().ShortDebugString()));
  }
  BundleEntry e;
  e.name = name;
  e.dtype = static_cast<DataType>(p.dtype());
  e.shape = *std::move(shape);
  e.shard_id = p.shard_id();
  e.offset = p.offset();
  e.size = p.size();
  e.masked_crc32c = p.crc32c();
  return e;
}

}  // namespace

// -- Impl ---------------------------------------------------------------------------

struct BundleReader::Impl {
  std::string prefix;
  std::string index_path;
  std::vector<BundleEntry> entries;  // sorted by name
  std::vector<std::string> data_paths;
  std::vector<std::unique_ptr<RandomAccessFile>> data_files;

  /// Reads the index into `entries`; returns the header's shard count.
  StatusOr<int> ReadIndex(const RandomAccessFile& file) {
    internal::LevelDbRandomAccessFile adapter(&file);
    FOREMAN_RETURN_IF_ERROR(CheckFooter(file, index_path));
    leveldb::Options options;
    options.paranoid_checks = true;   // verify the index and metaindex blocks
    leveldb::Table* raw = nullptr;
    leveldb::Status ls = leveldb::Table::Open(options, &adapter, file.Size(), &raw);
    std::unique_ptr<leveldb::Table> table(raw);
    FOREMAN_RETURN_IF_ERROR(internal::FromLevelDb(ls, adapter.error(), index_path));
    leveldb::ReadOptions read_options;
    read_options.verify_checksums = true;
    read_options.fill_cache = false;
    std::unique_ptr<leveldb::Iterator> it(table->NewIterator(read_options));
    it->SeekToFirst();
    FOREMAN_RETURN_IF_ERROR(internal::FromLevelDb(it->status(), adapter.error(), index_path));
    proto::BundleHeaderProto header;
    if (!it->Valid() || !it->key().empty() ||
        !header.ParseFromArray(it->value().data(), static_cast<int>(it->value().size()))) {
      return absl::DataLossError(absl::StrCat(index_path, ": missing or unparsable bundle header"));
    }
    if (header.endianness() != proto::BundleHeaderProto::LITTLE) {
      return absl::UnimplementedError(absl::StrCat(index_path, ": big-endian bundles are not supported"));
    }
    const proto::VersionDef& v = header.version();
    if (v.min_consumer() > internal::kBundleVersion ||
        std::count(v.bad_consumers().begin(), v.bad_consumers().end(), internal::kBundleVersion) > 0) {
      return absl::UnimplementedError(absl::StrCat(index_path, ": bundle format needs a newer reader (",
                                                   v.ShortDebugString(), ")"));
    }
    const int num_shards = header.num_shards();
    if (num_shards < 1) {
      return absl::DataLossError(absl::StrCat(index_path, ": invalid num_shards ", num_shards));
    }
    std::string previous;   // the header's key, ""
    for (it->Next(); it->Valid(); it->Next()) {
      const std::string name = it->key().ToString();
      if (name <= previous) {   // LevelDB tables hold strictly increasing keys
        return absl::DataLossError(absl::StrCat(index_path, ": key '", name, "' ",
                                                name == previous ? "duplicated" : "out of order", " after '",
                                                previous, "'"));
      }
      previous = name;
      proto::BundleEntryProto p;
      if (!p.ParseFromArray(it->value().data(), static_cast<int>(it->value().size()))) {
        return absl::DataLossError(absl::StrCat(index_path, ": unparsable entry for variable '", name, "'"));
      }
      FOREMAN_ASSIGN_OR_RETURN(BundleEntry e, ToEntry(index_path, name, p, num_shards));
      entries.push_back(std::move(e));
    }
    FOREMAN_RETURN_IF_ERROR(internal::FromLevelDb(it->status(), adapter.error(), index_path));
    return num_shards;
  }

  const RandomAccessFile& File(const BundleEntry& e) const {
    return *data_files[static_cast<std::size_t>(e.shard_id)];
  }

  Status DataLoss(const BundleEntry& e, const std::string& detail) const {
    return absl::DataLossError(absl::StrCat(data_paths[static_cast<std::size_t>(e.shard_id)], ": variable '",
                                            e.name, "': ", detail));
  }

  /// DATA_LOSS when the entry runs past the end of its data file.
  Status CheckBounds(const BundleEntry& e) const {
    const uint64_t end = static_cast<uint64_t>(e.offset) + static_cast<uint64_t>(e.size);
    if (end <= File(e).Size()) return absl::OkStatus();
    return DataLoss(e, absl::StrCat("truncated data file (needs ", end, " bytes, has ", File(e).Size(), ")"));
  }

  /// Reads the entry's e.size bytes into `dst`. REQUIRES: CheckBounds(e) is OK.
  Status Read(const BundleEntry& e, char* dst) const {
    const auto n = static_cast<std::size_t>(e.size);
    if (n == 0) return absl::OkStatus();
    StatusOr<absl::string_view> got = File(e).Read(static_cast<uint64_t>(e.offset), n, dst);
    if (absl::IsOutOfRange(got.status()) || (got.ok() && got->size() < n)) return CheckBounds(e);
    if (!got.ok()) return Annotate(got.status(), absl::StrCat("reading variable '", e.name, "'"));
    if (got->data() != dst) std::memcpy(dst, got->data(), n);
    return absl::OkStatus();
  }

  Status CheckCrc(const BundleEntry& e, uint32_t actual) const {
    const uint32_t expected = crc32c::Unmask(e.masked_crc32c);
    if (actual == expected || !kVerifyChecksums) return absl::OkStatus();
    return DataLoss(e, absl::StrFormat("crc32c mismatch (index says 0x%08x, data has 0x%08x)", expected, actual));
  }

  StatusOr<Tensor> ReadNumeric(const BundleEntry& e) const {
    const auto elem = static_cast<int64_t>(DataTypeSize(e.dtype));
    const int64_t n = e.shape.num_elements();
    if (n > INT64_MAX / elem || e.size != n * elem) {
      return DataLoss(e, absl::StrCat("size ", e.size, " does not fit ", DataTypeName(e.dtype), e.shape.ToString()));
    }
    FOREMAN_RETURN_IF_ERROR(CheckBounds(e));
    FOREMAN_ASSIGN_OR_RETURN(Tensor t, Allocate(e));
    FOREMAN_RETURN_IF_ERROR(Read(e, t.raw_data()));
    FOREMAN_RETURN_IF_ERROR(CheckCrc(e, crc32c::Value(t.raw_data(), static_cast<std::size_t>(e.size))));
    return t;
  }

  /// Tensor::Create() for the entry: RESOURCE_EXHAUSTED naming the data file
  /// and the variable when the (consistent but huge) tensor does not fit.
  StatusOr<Tensor> Allocate(const BundleEntry& e) const {
    StatusOr<Tensor> t = Tensor::Create(e.dtype, e.shape);
    if (!t.ok()) {
      return Status(t.status().code(), absl::StrCat(data_paths[static_cast<std::size_t>(e.shard_id)],
                                                    ": variable '", e.name, "': ", t.status().message()));
    }
    return t;
  }

  /// The entry's bytes, undecoded (nothrow: a huge entry is RESOURCE_EXHAUSTED).
  struct Bytes {
    std::unique_ptr<char[]> data;
    std::size_t size = 0;
    absl::string_view view() const { return absl::string_view(data.get(), size); }
  };
  StatusOr<Bytes> ReadBytes(const BundleEntry& e) const {
    FOREMAN_RETURN_IF_ERROR(CheckBounds(e));
    Bytes buf;
    buf.size = static_cast<std::size_t>(e.size);
    buf.data.reset(new (std::nothrow) char[std::max<std::size_t>(buf.size, 1)]);
    if (buf.data == nullptr) {
      return absl::ResourceExhaustedError(absl::StrCat(data_paths[static_cast<std::size_t>(e.shard_id)],
                                                       ": variable '", e.name, "': cannot allocate ", buf.size,
                                                       " bytes for ", DataTypeName(e.dtype), e.shape.ToString()));
    }
    FOREMAN_RETURN_IF_ERROR(Read(e, buf.data.get()));
    return buf;
  }

  /// The CRC32C of the entry's raw bytes, for dtypes Foreman cannot decode.
  Status VerifyRaw(const BundleEntry& e) const {
    FOREMAN_ASSIGN_OR_RETURN(Bytes bytes, ReadBytes(e));
    return CheckCrc(e, crc32c::Value(bytes.data.get(), bytes.size));
  }

  StatusOr<Tensor> ReadStrings(const BundleEntry& e) const {
    const int64_t n = e.shape.num_elements();
    if (n == 0 && e.size == 0) return Tensor(DataType::kString, e.shape);   // TF's reader accepts this too
    FOREMAN_ASSIGN_OR_RETURN(Bytes bytes, ReadBytes(e));
    const absl::string_view buf = bytes.view();
    if (n > static_cast<int64_t>(buf.size())) {   // every element has a length byte
      return DataLoss(e, absl::StrCat(n, " strings cannot fit in ", buf.size(), " bytes"));
    }
    std::vector<uint64_t> lengths(static_cast<std::size_t>(n));
    std::size_t pos = 0;
    uint32_t crc = 0;
    for (uint64_t& len : lengths) {
      if (!ParseVarint64(buf, &pos, &len)) return DataLoss(e, "string lengths run past the entry");
      crc = internal::ExtendStringLength(crc, len);
    }
    uint32_t stored = 0;
    if (buf.size() - pos < sizeof(stored)) return DataLoss(e, "string lengths run past the entry");
    std::memcpy(&stored, buf.data() + pos, sizeof(stored));
    if (crc32c::Unmask(stored) != crc && kVerifyChecksums) {
      return DataLoss(e, absl::StrFormat("crc32c mismatch in the string lengths (stored 0x%08x, computed 0x%08x)",
                                         crc32c::Unmask(stored), crc));
    }
    crc = crc32c::Extend(crc, buf.data() + pos, sizeof(stored));
    pos += sizeof(stored);
    uint64_t total = 0;
    for (uint64_t len : lengths) total = len > buf.size() ? buf.size() + 1 : total + len;
    if (total != buf.size() - pos) {
      return DataLoss(e, absl::StrCat("string lengths add up to ", total, " bytes, the entry holds ",
                                      buf.size() - pos));
    }
    crc = crc32c::Extend(crc, buf.data() + pos, buf.size() - pos);
    FOREMAN_RETURN_IF_ERROR(CheckCrc(e, crc));
    FOREMAN_ASSIGN_OR_RETURN(Tensor t, Allocate(e));
    std::string* out = t.data<std::string>();
    for (uint64_t len : lengths) {
      out++->assign(buf.data() + pos, static_cast<std::size_t>(len));
      pos += static_cast<std::size_t>(len);
    }
    return t;
  }
};

// -- BundleReader ----------------------------------------------------------------

BundleReader::BundleReader(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
BundleReader::~BundleReader() = default;

StatusOr<std::unique_ptr<BundleReader>> BundleReader::Open(Env* env, const std::string& prefix) {
  auto impl = std::make_unique<Impl>();
  impl->prefix = prefix;
  impl->index_path = BundleIndexPath(prefix);
  StatusOr<std::unique_ptr<RandomAccessFile>> index = env->NewRandomAccessFile(impl->index_path);
  if (absl::IsNotFound(index.status())) {
    return absl::NotFoundError(absl::StrCat(impl->index_path, " not found: ", prefix, " is not a valid checkpoint"));
  }
  FOREMAN_RETURN_IF_ERROR(index.status());
  FOREMAN_ASSIGN_OR_RETURN(const int num_shards, impl->ReadIndex(**index));
  for (int shard = 0; shard < num_shards; ++shard) {
    impl->data_paths.push_back(BundleDataPath(prefix, shard, num_shards));
    StatusOr<std::unique_ptr<RandomAccessFile>> data = env->NewRandomAccessFile(impl->data_paths.back());
    if (absl::IsNotFound(data.status())) {
      return absl::FailedPreconditionError(
          absl::StrCat(impl->data_paths.back(), ": data file of checkpoint ", prefix, " is missing"));
    }
    FOREMAN_RETURN_IF_ERROR(data.status());
    impl->data_files.push_back(*std::move(data));
  }
  return std::unique_ptr<BundleReader>(new BundleReader(std::move(impl)));
}

const std::vector<BundleEntry>& BundleReader::entries() const { return impl_->entries; }

const std::string& BundleReader::prefix() const { return impl_->prefix; }

StatusOr<BundleEntry> BundleReader::GetEntry(const std::string& name) const {
  const auto& entries = impl_->entries;
  auto it = std::lower_bound(entries.begin(), entries.end(), name,
                             [](const BundleEntry& e, const std::string& n) { return e.name < n; });
  if (it == entries.end() || it->name != name) {
    return absl::NotFoundError(absl::StrCat(impl_->index_path, ": no variable '", name, "' in checkpoint"));
  }
  return *it;
}

bool BundleReader::Contains(const std::string& name) const { return GetEntry(name).ok(); }

StatusOr<Tensor> BundleReader::Lookup(const std::string& name) const {
  FOREMAN_ASSIGN_OR_RETURN(BundleEntry e, GetEntry(name));
  if (!IsSupportedDataType(static_cast<int>(e.dtype))) {
    return absl::UnimplementedError(absl::StrCat(impl_->index_path, ": variable '", name, "' has dtype ",
                                                 static_cast<int>(e.dtype), ", which Foreman does not support"));
  }
  return e.dtype == DataType::kString ? impl_->ReadStrings(e) : impl_->ReadNumeric(e);
}

Status BundleReader::Verify(const std::string& name) const {
  FOREMAN_ASSIGN_OR_RETURN(BundleEntry e, GetEntry(name));
  if (IsSupportedDataType(static_cast<int>(e.dtype))) return Lookup(e.name).status();
  // Another fixed-size dtype (bfloat16, bool, ...): its CRC covers its raw bytes.
  if (static_cast<int>(e.dtype) != kDtVariant) return impl_->VerifyRaw(e);
  return absl::OkStatus();
}

Status BundleReader::VerifyAll() const {
  for (const BundleEntry& e : impl_->entries) FOREMAN_RETURN_IF_ERROR(Verify(e.name));
  return absl::OkStatus();
}

}  // namespace foreman
