// The chaos harness's independent oracle (chaos_oracle.hpp).
#include "fault/chaos_oracle.hpp"

#include <leveldb/env.h>
#include <leveldb/iterator.h>
#include <leveldb/options.h>
#include <leveldb/table.h>

#include <algorithm>
#include <map>
#include <memory>

#include "absl/strings/match.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "tensor_bundle.pb.h"

namespace foreman::internal {
namespace {

// A whole file in memory as LevelDB's RandomAccessFile.
class StringFile : public leveldb::RandomAccessFile {
 public:
  explicit StringFile(const std::string& bytes) : bytes_(bytes) {}
  leveldb::Status Read(uint64_t offset, size_t n, leveldb::Slice* result, char* /*scratch*/) const override {
    if (offset > bytes_.size()) return leveldb::Status::IOError("read past the end");
    *result = leveldb::Slice(bytes_.data() + offset, std::min<uint64_t>(n, bytes_.size() - offset));
    return leveldb::Status::OK();
  }

 private:
  const std::string& bytes_;
};

// Bytes per element of the fixed-width dtypes (TF's DataType numbers); 0 for
// the others (strings, resources, variants).
int64_t ElementBytes(int dtype) {
  switch (dtype) {
    case 1: return 4;   // DT_FLOAT
    case 2: return 8;   // DT_DOUBLE
    case 3: return 4;   // DT_INT32
    case 4: return 1;   // DT_UINT8
    case 5: return 2;   // DT_INT16
    case 6: return 1;   // DT_INT8
    case 8: return 8;   // DT_COMPLEX64 (two float32)
    case 9: return 8;   // DT_INT64
    case 10: return 1;  // DT_BOOL
    case 14: return 2;  // DT_BFLOAT16
    case 17: return 2;  // DT_UINT16
    case 18: return 16; // DT_COMPLEX128 (two float64)
    case 19: return 2;  // DT_HALF
    case 22: return 4;  // DT_UINT32
    case 23: return 8;  // DT_UINT64
    default: return 0;
  }
}

constexpr int kDtString = 7;

// CRC32C over `n` more bytes from `crc` (0 for a fresh one).
uint32_t ExtendCrc(uint32_t crc, const char* data, std::size_t n) {
  crc = ~crc;
  for (std::size_t i = 0; i < n; ++i) {
    crc ^= static_cast<unsigned char>(data[i]);
    for (int bit = 0; bit < 8; ++bit) crc = (crc >> 1) ^ (0x82f63b78u & (0u - (crc & 1u)));
  }
  return ~crc;
}

// The unmasked CRC of a string tensor's `bytes` (`elements` strings) by the
// bundle format's rule, or an error naming what does not parse. The layout:
// each string's length as a varint64, the masked CRC32C of the lengths
// (4 bytes, little-endian), then the strings' bytes. The lengths are summed
// into the CRC as uint32 little-endian (uint64 for a string over 4 GiB), not
// as their varints; then come the 4 stored bytes and the strings' bytes.
StatusOr<uint32_t> StringTensorCrc(absl::string_view bytes, int64_t elements) {
  std::size_t pos = 0;
  uint32_t crc = 0;
  uint64_t total = 0;
  for (int64_t i = 0; i < elements; ++i) {
    uint64_t len = 0;
    int shift = 0;
    for (;;) {
      if (pos >= bytes.size() || shift > 63) {
        return absl::DataLossError(absl::StrCat("the length of string ", i, " does not parse"));
      }
      const auto b = static_cast<unsigned char>(bytes[pos++]);
      len |= static_cast<uint64_t>(b & 0x7f) << shift;
      shift += 7;
      if ((b & 0x80) == 0) break;
    }
    char le[8];
    for (int k = 0; k < 8; ++k) le[k] = static_cast<char>((len >> (8 * k)) & 0xff);
    crc = ExtendCrc(crc, le, len <= 0xffffffffu ? 4 : 8);
    total += len;
  }
  if (bytes.size() - pos < 4) return absl::DataLossError("the lengths' checksum runs past the entry");
  uint32_t stored = 0;
  for (int k = 0; k < 4; ++k) stored |= static_cast<uint32_t>(static_cast<unsigned char>(bytes[pos + k])) << (8 * k);
  if (stored != OracleMaskCrc(crc)) return absl::DataLossError("the string lengths fail their CRC32C");
  crc = ExtendCrc(crc, bytes.data() + pos, 4);
  pos += 4;
  if (bytes.size() - pos != total) {
    return absl::DataLossError(absl::StrCat("the strings' lengths sum to ", total, " bytes, the entry holds ",
                                            bytes.size() - pos));
  }
  return ExtendCrc(crc, bytes.data() + pos, bytes.size() - pos);
}

std::string Name(const std::string& path) {
  const std::size_t slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

std::string Resolve(const std::string& dir, const std::string& path) {
  return !path.empty() && path.front() == '/' ? path : JoinPath(dir, path);
}

// The step in "model.ckpt-<step>" (any basename "<x>-<digits>"), or -1.
int64_t StepOf(const std::string& prefix) {
  const std::size_t dash = prefix.rfind('-');
  int64_t step = -1;
  if (dash == std::string::npos || !absl::SimpleAtoi(prefix.substr(dash + 1), &step)) return -1;
  return step;
}

// A quoted text-format string value: "..." (or '...') with the protobuf
// text format's escapes (C's: \n, \", \\, octal \NNN, hex \xNN, ...).
bool Unquote(absl::string_view v, std::string* out) {
  if (v.size() < 2 || (v.front() != '"' && v.front() != '\'') || v.back() != v.front()) return false;
  return absl::CUnescape(v.substr(1, v.size() - 2), out);
}

}  // namespace

uint32_t OracleCrc32c(const std::string& data, std::size_t offset, std::size_t n) {
  return ExtendCrc(0, data.data() + offset, n);
}

uint32_t OracleMaskCrc(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + 0xa282ead8u; }

Status OracleCheckRecords(const std::string& bytes) {
  auto le32 = [&bytes](std::size_t at) {
    uint32_t v = 0;
    for (int i = 3; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(bytes[at + static_cast<std::size_t>(i)]);
    return v;
  };
  std::size_t at = 0;
  for (int64_t record = 0; at < bytes.size(); ++record) {
    const std::size_t left = bytes.size() - at;
    if (left < 12) {
      return absl::DataLossError(absl::StrCat("record ", record, " at byte ", at, ": a cut header (", left,
                                              " of 12 bytes)"));
    }
    const uint64_t length = (static_cast<uint64_t>(le32(at + 4)) << 32) | le32(at);
    if (le32(at + 8) != OracleMaskCrc(OracleCrc32c(bytes, at, 8))) {
      return absl::DataLossError(absl::StrCat("record ", record, " at byte ", at, ": its length fails its CRC32C"));
    }
    if (length > left - 12 || left - 12 - length < 4) {
      return absl::DataLossError(absl::StrCat("record ", record, " at byte ", at, ": cut (", length,
                                              " bytes of data and a 4-byte CRC announced, ", left - 12, " left)"));
    }
    const std::size_t data = at + 12;
    if (le32(data + length) != OracleMaskCrc(OracleCrc32c(bytes, data, static_cast<std::size_t>(length)))) {
      return absl::DataLossError(absl::StrCat("record ", record, " at byte ", at, ": its data fails its CRC32C"));
    }
    at = data + static_cast<std::size_t>(length) + 4;
  }
  return absl::OkStatus();
}

Status OracleVerifyBundle(Env* env, const std::string& prefix) {
  const std::string index_path = prefix + ".index";
  FOREMAN_ASSIGN_OR_RETURN(std::string index, env->ReadFileToString(index_path));
  const std::string index_name = Name(index_path);
  StringFile file(index);
  leveldb::Table* raw = nullptr;
  leveldb::Options options;
  leveldb::Status opened = leveldb::Table::Open(options, &file, index.size(), &raw);
  if (!opened.ok()) return absl::DataLossError(absl::StrCat(index_name, ": not a table: ", opened.ToString()));
  std::unique_ptr<leveldb::Table> table(raw);
  leveldb::ReadOptions read;
  read.verify_checksums = true;
  std::unique_ptr<leveldb::Iterator> it(table->NewIterator(read));
  it->SeekToFirst();
  if (!it->Valid() || !it->key().empty()) {
    return absl::DataLossError(absl::StrCat(index_name, ": no header entry first"));
  }
  proto::BundleHeaderProto header;
  if (!header.ParseFromArray(it->value().data(), static_cast<int>(it->value().size())) || header.num_shards() < 1 ||
      header.endianness() != proto::BundleHeaderProto::LITTLE) {
    return absl::DataLossError(absl::StrCat(index_name, ": bad header"));
  }
  std::map<int, std::string> shards;   // shard id -> bytes
  std::map<int, int64_t> shard_end;    // shard id -> end of its last tensor
  int64_t entries = 0;
  for (it->Next(); it->Valid(); it->Next()) {
    const std::string key = it->key().ToString();
    proto::BundleEntryProto entry;
    if (!entry.ParseFromArray(it->value().data(), static_cast<int>(it->value().size()))) {
      return absl::DataLossError(absl::StrCat(index_name, ": entry '", key, "' does not parse"));
    }
    ++entries;
    if (entry.shard_id() < 0 || entry.shard_id() >= header.num_shards()) {
      return absl::DataLossError(absl::StrCat(index_name, ": entry '", key, "' names shard ", entry.shard_id()));
    }
    auto shard = shards.find(entry.shard_id());
    if (shard == shards.end()) {
      const std::string data_path =
          absl::StrFormat("%s.data-%05d-of-%05d", prefix, entry.shard_id(), header.num_shards());
      FOREMAN_ASSIGN_OR_RETURN(std::string bytes, env->ReadFileToString(data_path));
      shard = shards.emplace(entry.shard_id(), std::move(bytes)).first;
    }
    const std::string& data = shard->second;
    if (entry.offset() < 0 || entry.size() < 0 || entry.offset() + entry.size() > static_cast<int64_t>(data.size())) {
      return absl::DataLossError(absl::StrCat(Name(prefix), ": tensor '", key, "' at [", entry.offset(), ", ",
                                              entry.offset() + entry.size(), ") is outside its data file of ",
                                              data.size(), " bytes"));
    }
    // Every entry's CRC: of its bytes; a string tensor's by the format's
    // own rule (StringTensorCrc).
    int64_t elements = 1;
    for (const auto& dim : entry.shape().dim()) elements *= dim.size();
    uint32_t crc = 0;
    if (entry.dtype() == kDtString) {
      auto c = StringTensorCrc(absl::string_view(data).substr(static_cast<std::size_t>(entry.offset()),
                                                              static_cast<std::size_t>(entry.size())),
                               elements);
      if (!c.ok()) return absl::DataLossError(absl::StrCat(Name(prefix), ": tensor '", key, "': ", c.status().message()));
      crc = OracleMaskCrc(*c);
    } else {
      if (const int64_t width = ElementBytes(entry.dtype()); width > 0 && elements * width != entry.size()) {
        return absl::DataLossError(absl::StrCat(Name(prefix), ": tensor '", key, "' has ", entry.size(),
                                                " bytes, its shape needs ", elements * width));
      }
      crc = OracleMaskCrc(
          OracleCrc32c(data, static_cast<std::size_t>(entry.offset()), static_cast<std::size_t>(entry.size())));
    }
    if (crc != entry.crc32c()) {
      return absl::DataLossError(absl::StrCat(Name(prefix), ": tensor '", key, "' fails its CRC32C"));
    }
    shard_end[entry.shard_id()] = std::max(shard_end[entry.shard_id()], entry.offset() + entry.size());
  }
  if (!it->status().ok()) return absl::DataLossError(absl::StrCat(index_name, ": ", it->status().ToString()));
  for (const auto& [id, bytes] : shards) {
    if (shard_end[id] != static_cast<int64_t>(bytes.size())) {
      return absl::DataLossError(absl::StrCat(Name(prefix), ": data file ", id, " has ", bytes.size(),
                                              " bytes, its tensors end at ", shard_end[id]));
    }
  }
  if (entries == 0) return absl::DataLossError(absl::StrCat(index_name, ": no tensor"));
  return absl::OkStatus();
}

StatusOr<OracleDirectory> OracleReadDirectory(Env* env, const std::string& dir) {
  OracleDirectory d;
  FOREMAN_ASSIGN_OR_RETURN(std::vector<std::string> names, env->GetChildren(dir));
  for (const std::string& name : names) {
    absl::string_view prefix = name;
    if (!absl::ConsumeSuffix(&prefix, ".index")) continue;
    const int64_t step = StepOf(std::string(prefix));
    if (step >= 0 && absl::StartsWith(prefix, "model.ckpt-")) d.bundles.emplace_back(step, JoinPath(dir, std::string(prefix)));
  }
  std::sort(d.bundles.begin(), d.bundles.end());
  const std::string state_path = JoinPath(dir, "checkpoint");
  if (!env->FileExists(state_path).ok()) return d;
  d.has_state = true;
  FOREMAN_ASSIGN_OR_RETURN(std::string text, env->ReadFileToString(state_path));
  int line_no = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_no;
    line = absl::StripAsciiWhitespace(line);
    if (line.empty()) continue;
    const std::size_t colon = line.find(':');
    std::string value;
    if (colon == absl::string_view::npos || !Unquote(absl::StripAsciiWhitespace(line.substr(colon + 1)), &value)) {
      if (absl::StartsWith(line, "all_model_checkpoint_timestamps") || absl::StartsWith(line, "last_preserved_timestamp")) {
        continue;
      }
      d.state_error = absl::StrCat("line ", line_no, " does not parse");
      return d;
    }
    const absl::string_view key = absl::StripAsciiWhitespace(line.substr(0, colon));
    if (key == "model_checkpoint_path") {
      d.latest = Resolve(dir, value);
    } else if (key == "all_model_checkpoint_paths") {
      d.listed.push_back(Resolve(dir, value));
    }
  }
  if (d.latest.empty()) d.state_error = "no model_checkpoint_path";
  return d;
}

StatusOr<std::optional<int64_t>> OracleRestoreStep(Env* env, const std::string& dir, std::vector<std::string>* notes) {
  FOREMAN_ASSIGN_OR_RETURN(OracleDirectory d, OracleReadDirectory(env, dir));
  auto note = [&](std::string n) {
    if (notes != nullptr) notes->push_back(std::move(n));
  };
  if (d.has_state && d.state_error.empty()) {
    const Status s = OracleVerifyBundle(env, d.latest);
    if (s.ok() && StepOf(d.latest) >= 0) return std::optional<int64_t>(StepOf(d.latest));
    note(absl::StrCat("the state file's latest: ", s.message()));
  } else if (d.has_state) {
    note(absl::StrCat("the state file: ", d.state_error));
  }
  for (auto it = d.bundles.rbegin(); it != d.bundles.rend(); ++it) {
    const Status s = OracleVerifyBundle(env, it->second);
    if (s.ok()) return std::optional<int64_t>(it->first);
    note(std::string(s.message()));
  }
  if (d.bundles.empty()) return std::optional<int64_t>();
  return std::optional<int64_t>(-1);  // bundles, none whole: nothing can be restored
}

std::vector<std::string> OracleBadListedCheckpoints(Env* env, const std::string& dir) {
  std::vector<std::string> bad;
  auto d = OracleReadDirectory(env, dir);
  if (!d.ok()) return {absl::StrCat("the directory does not read: ", d.status().message())};
  if (!d->has_state) return bad;
  if (!d->state_error.empty()) return {absl::StrCat("the state file: ", d->state_error)};
  std::vector<std::string> prefixes = d->listed;
  if (std::find(prefixes.begin(), prefixes.end(), d->latest) == prefixes.end()) prefixes.push_back(d->latest);
  for (const std::string& prefix : prefixes) {
    if (Status s = OracleVerifyBundle(env, prefix); !s.ok()) bad.push_back(std::string(s.message()));
  }
  return bad;
}

}  // namespace foreman::internal
