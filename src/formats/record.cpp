// TFRecord framing (include/foreman/record.hpp).
//
// The reader never trusts a record's length: it reads the data in bounded
// chunks and stops at the end of the file, so a corrupt length cannot make it
// allocate more than the file holds.
#include "foreman/record.hpp"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "foreman/crc32c.hpp"

namespace foreman {

namespace {

/// Largest single read while collecting a record's data.
constexpr uint64_t kReadChunkBytes = uint64_t{1} << 20;

void EncodeFixed(char* dst, uint64_t value, std::size_t bytes) {
  for (std::size_t i = 0; i < bytes; ++i) dst[i] = static_cast<char>(value >> (8 * i));
}

uint64_t DecodeFixed(const char* src, std::size_t bytes) {
  uint64_t value = 0;
  for (std::size_t i = bytes; i-- > 0;) value = value << 8 | static_cast<unsigned char>(src[i]);
  return value;
}

uint32_t MaskedCrc(const char* data, std::size_t n) { return crc32c::Mask(crc32c::Value(data, n)); }

/// True when `masked` is the masked CRC of data[0, n); always true in fuzz
/// builds, so that fuzz inputs reach the parsers behind the reader.
bool CrcMatches(const char* data, std::size_t n, uint32_t masked) {
#ifdef FOREMAN_FUZZING_BUILD_MODE
  (void)data;
  (void)n;
  (void)masked;
  return true;
#else
  return MaskedCrc(data, n) == masked;
#endif
}

/// Appends up to `n` bytes of `file` from `offset` to *out; fewer only at the
/// end of the file (a read past the end counts as zero bytes).
Status ReadUpTo(const RandomAccessFile& file, uint64_t offset, uint64_t n, std::string* out) {
  for (uint64_t done = 0; done < n;) {
    const auto want = static_cast<std::size_t>(std::min(n - done, kReadChunkBytes));
    const std::size_t old_size = out->size();
    out->resize(old_size + want);
    char* scratch = &(*out)[old_size];
    StatusOr<absl::string_view> got = file.Read(offset + done, want, scratch);
    if (!got.ok() && !absl::IsOutOfRange(got.status())) return got.status();
    const std::size_t n_got = got.ok() ? got->size() : 0;
    if (n_got > 0 && got->data() != scratch) std::memmove(scratch, got->data(), n_got);
    out->resize(old_size + n_got);
    if (n_got < want) break;
    done += n_got;
  }
  return absl::OkStatus();
}

}  // namespace

// -- RecordWriter ---------------------------------------------------------------

Status RecordWriter::WriteRecord(absl::string_view data) {
  // One append of the framed record: a failed append either wrote none of
  // it or a prefix (its Size() says which), never a header whose data a
  // retry would write again after it.
  framed_.resize(kRecordHeaderBytes + data.size() + kRecordFooterBytes);
  char* out = framed_.data();
  EncodeFixed(out, data.size(), 8);
  EncodeFixed(out + 8, MaskedCrc(out, 8), 4);
  if (!data.empty()) std::memcpy(out + kRecordHeaderBytes, data.data(), data.size());
  EncodeFixed(out + kRecordHeaderBytes + data.size(), MaskedCrc(data.data(), data.size()), 4);
  return file_->Append(framed_);
}

Status RecordWriter::Flush() { return file_->Flush(); }

Status RecordWriter::Sync() { return file_->Sync(); }

// -- RecordReader ---------------------------------------------------------------

StatusOr<std::unique_ptr<RecordReader>> RecordReader::Open(Env* env, const std::string& path,
                                                           RecordReaderOptions options) {
  FOREMAN_ASSIGN_OR_RETURN(std::unique_ptr<RandomAccessFile> file, env->NewRandomAccessFile(path));
  return std::unique_ptr<RecordReader>(new RecordReader(std::move(file), path, options));
}

Status RecordReader::ReadRecord(std::string* record) {
  const auto corrupted = [&](absl::string_view what) {
    return absl::DataLossError(absl::StrCat(path_, ": corrupted record at offset ", offset_, ": ", what));
  };
  const auto cut = [&](absl::string_view what) {
    if (options_.allow_truncated_tail) {
      return absl::OutOfRangeError(
          absl::StrCat(path_, ": record at offset ", offset_, " is incomplete (", what, ")"));
    }
    return corrupted(what);
  };

  std::string header;
  FOREMAN_RETURN_IF_ERROR(ReadUpTo(*file_, offset_, kRecordHeaderBytes, &header));
  if (header.empty()) return absl::OutOfRangeError(absl::StrCat(path_, ": end of file at offset ", offset_));
  if (header.size() < kRecordHeaderBytes) {
    return cut(absl::StrCat("truncated header: ", header.size(), " of ", kRecordHeaderBytes, " bytes"));
  }
  if (!CrcMatches(header.data(), 8, static_cast<uint32_t>(DecodeFixed(header.data() + 8, 4)))) {
    return corrupted("length checksum mismatch");
  }
  const uint64_t length = DecodeFixed(header.data(), 8);

  std::string body;  // data, then the footer
  const uint64_t body_bytes =
      length > UINT64_MAX - kRecordFooterBytes ? UINT64_MAX : length + kRecordFooterBytes;
  FOREMAN_RETURN_IF_ERROR(ReadUpTo(*file_, offset_ + kRecordHeaderBytes, body_bytes, &body));
  if (body.size() < body_bytes) {
    return cut(absl::StrCat("truncated record: length ", length, ", only ", body.size(),
                            " bytes of data and checksum present"));
  }
  if (!CrcMatches(body.data(), length, static_cast<uint32_t>(DecodeFixed(body.data() + length, 4)))) {
    return corrupted("data checksum mismatch");
  }
  body.resize(length);
  *record = std::move(body);
  offset_ += kRecordHeaderBytes + body_bytes;
  return absl::OkStatus();
}

}  // namespace foreman
