// Tests for TFRecord framing: RecordWriter's byte layout, RecordReader's
// round trip, corruption and cut-tail handling (spec B147).

#include "foreman/record.hpp"

#include <doctest/doctest.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "foreman/crc32c.hpp"
#include "foreman/mem_env.hpp"

namespace foreman {
namespace {

constexpr char kPath[] = "/records";

/// Writes `records` to `path` (truncating) and returns the file's bytes.
std::string WriteRecords(MemEnv* env, const std::vector<std::string>& records,
                         const std::string& path = kPath) {
  auto file = env->NewWritableFile(path);
  REQUIRE(file.ok());
  RecordWriter writer(file->get());
  for (const std::string& r : records) REQUIRE(writer.WriteRecord(r).ok());
  REQUIRE(writer.Flush().ok());
  REQUIRE((*file)->Close().ok());
  auto bytes = env->ReadFileToString(path);
  REQUIRE(bytes.ok());
  return *bytes;
}

std::unique_ptr<RecordReader> OpenReader(Env* env, bool allow_truncated_tail = false) {
  RecordReaderOptions options;
  options.allow_truncated_tail = allow_truncated_tail;
  auto reader = RecordReader::Open(env, kPath, options);
  REQUIRE(reader.ok());
  return *std::move(reader);
}

/// Every record until the first non-OK status, which is returned in *end.
std::vector<std::string> ReadAll(RecordReader* reader, Status* end) {
  std::vector<std::string> records;
  std::string record;
  while ((*end = reader->ReadRecord(&record)).ok()) records.push_back(record);
  return records;
}

/// Checks that `s` is DATA_LOSS "<kPath>: corrupted record at offset <offset>: ..." mentioning `what`.
void CheckCorrupted(const Status& s, uint64_t offset, const std::string& what) {
  CHECK(absl::IsDataLoss(s));
  const std::string prefix = absl::StrCat(kPath, ": corrupted record at offset ", offset, ": ");
  CHECK_MESSAGE(absl::StartsWith(s.message(), prefix), s.message());
  CHECK_MESSAGE(absl::StrContains(s.message(), what), s.message());
}

// -- byte layout ---------------------------------------------------------------------

TEST_CASE("B147: an empty record is a zero length, its masked CRC and the masked CRC of no bytes") {
  MemEnv env;
  // crc32c of 8 zero bytes is 0x8a9136aa, masked 0x07980329; crc32c("") is 0,
  // masked 0xa282ead8. All little-endian.
  const std::string expected("\0\0\0\0\0\0\0\0"
                             "\x29\x03\x98\x07"
                             "\xd8\xea\x82\xa2",
                             16);
  CHECK(WriteRecords(&env, {""}) == expected);
  CHECK(expected.size() == kRecordHeaderBytes + kRecordFooterBytes);
}

TEST_CASE("B147: a record of \"abc\" is length 3, its masked CRC, the bytes, their masked CRC") {
  MemEnv env;
  const std::string expected("\x03\0\0\0\0\0\0\0"
                             "\xb0\x99\x49\x0e"
                             "abc"
                             "\x6e\x57\xf1\x21",
                             19);
  CHECK(WriteRecords(&env, {"abc"}) == expected);
}

// -- round trips ---------------------------------------------------------------------

TEST_CASE("records read back in order, then OUT_OF_RANGE at the end with the offset at the file size") {
  MemEnv env;
  const std::vector<std::string> records = {"first", "", std::string("nul\0inside", 10),
                                            std::string(3 << 20, 'x'),  // larger than one read chunk
                                            "last"};
  const std::string bytes = WriteRecords(&env, records);
  auto reader = OpenReader(&env);
  CHECK(reader->path() == kPath);
  Status end;
  CHECK(ReadAll(reader.get(), &end) == records);
  CHECK(absl::IsOutOfRange(end));
  CHECK(reader->offset() == bytes.size());
  std::string record;
  CHECK(absl::IsOutOfRange(reader->ReadRecord(&record)));  // stays at the end
}

TEST_CASE("an empty file has no records") {
  MemEnv env;
  WriteRecords(&env, {});
  std::string record;
  CHECK(absl::IsOutOfRange(OpenReader(&env)->ReadRecord(&record)));
}

TEST_CASE("opening a missing file is NOT_FOUND naming the path") {
  MemEnv env;
  auto reader = RecordReader::Open(&env, "/no/such/file");
  CHECK(absl::IsNotFound(reader.status()));
  CHECK(absl::StrContains(reader.status().message(), "/no/such/file"));
}

// -- corruption ----------------------------------------------------------------------

TEST_CASE("a corrupted length checksum is DATA_LOSS naming the path and the record's offset") {
  MemEnv env;
  std::string bytes = WriteRecords(&env, {"one", "two"});
  const uint64_t second = kRecordHeaderBytes + 3 + kRecordFooterBytes;
  bytes[second + 9] ^= 0x01;  // inside the second record's length CRC
  REQUIRE(WriteStringToFile(&env, kPath, bytes).ok());

  for (bool allow_truncated_tail : {false, true}) {
    auto reader = OpenReader(&env, allow_truncated_tail);
    Status end;
    CHECK(ReadAll(reader.get(), &end) == std::vector<std::string>{"one"});
    CheckCorrupted(end, second, "length checksum mismatch");
    CHECK(reader->offset() == second);
  }
}

TEST_CASE("a length changed under its checksum is DATA_LOSS") {
  MemEnv env;
  std::string bytes = WriteRecords(&env, {"one"});
  bytes[0] = 2;
  REQUIRE(WriteStringToFile(&env, kPath, bytes).ok());
  std::string record;
  CheckCorrupted(OpenReader(&env)->ReadRecord(&record), 0, "length checksum mismatch");
}

TEST_CASE("a corrupted data byte is DATA_LOSS naming the path and the record's offset") {
  MemEnv env;
  std::string bytes = WriteRecords(&env, {"one", "two", "three"});
  const uint64_t second = kRecordHeaderBytes + 3 + kRecordFooterBytes;
  bytes[second + kRecordHeaderBytes + 1] = 'X';  // "tXo"
  REQUIRE(WriteStringToFile(&env, kPath, bytes).ok());

  for (bool allow_truncated_tail : {false, true}) {
    auto reader = OpenReader(&env, allow_truncated_tail);
    Status end;
    CHECK(ReadAll(reader.get(), &end) == std::vector<std::string>{"one"});
    CheckCorrupted(end, second, "data checksum mismatch");
    CHECK(reader->offset() == second);
    std::string record;
    CheckCorrupted(reader->ReadRecord(&record), second, "data checksum mismatch");  // does not move on
  }
}

TEST_CASE("a corrupted data checksum is DATA_LOSS") {
  MemEnv env;
  std::string bytes = WriteRecords(&env, {"one"});
  bytes.back() ^= 0x80;
  REQUIRE(WriteStringToFile(&env, kPath, bytes).ok());
  std::string record;
  CheckCorrupted(OpenReader(&env)->ReadRecord(&record), 0, "data checksum mismatch");
}

TEST_CASE("a record cut short is DATA_LOSS naming the path and the record's offset") {
  MemEnv env;
  const std::string bytes = WriteRecords(&env, {"one", "second record"});
  const uint64_t second = kRecordHeaderBytes + 3 + kRecordFooterBytes;
  // Cut inside the header, inside the data, and inside the footer.
  for (uint64_t cut : {second + 5, second + kRecordHeaderBytes + 4, bytes.size() - 1}) {
    CAPTURE(cut);
    REQUIRE(WriteStringToFile(&env, kPath, bytes.substr(0, cut)).ok());
    auto reader = OpenReader(&env);
    Status end;
    CHECK(ReadAll(reader.get(), &end) == std::vector<std::string>{"one"});
    CheckCorrupted(end, second, "truncated");
    CHECK(reader->offset() == second);
  }
}

TEST_CASE("an absurd length with a valid checksum is a cut record, not an allocation of that size") {
  MemEnv env;
  for (uint64_t length : {uint64_t{1} << 62, ~uint64_t{0}}) {
    CAPTURE(length);
    std::string bytes(kRecordHeaderBytes, '\0');
    for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>(length >> (8 * i));
    const uint32_t crc = crc32c::Mask(crc32c::Value(bytes.data(), 8));
    for (int i = 0; i < 4; ++i) bytes[8 + i] = static_cast<char>(crc >> (8 * i));
    bytes += "some data";
    REQUIRE(WriteStringToFile(&env, kPath, bytes).ok());
    std::string record;
    CheckCorrupted(OpenReader(&env)->ReadRecord(&record), 0, "truncated");
    CHECK(absl::IsOutOfRange(OpenReader(&env, /*allow_truncated_tail=*/true)->ReadRecord(&record)));
  }
}

// -- a tail still being written ------------------------------------------------------

TEST_CASE("with allow_truncated_tail a cut last record is OUT_OF_RANGE and reads once the file has grown") {
  MemEnv env;
  const std::string bytes = WriteRecords(&env, {"one", "second record"});
  const uint64_t second = kRecordHeaderBytes + 3 + kRecordFooterBytes;
  for (uint64_t cut : {second + 5, second + kRecordHeaderBytes + 4, bytes.size() - 1}) {
    CAPTURE(cut);
    REQUIRE(WriteStringToFile(&env, kPath, bytes.substr(0, cut)).ok());
    auto reader = OpenReader(&env, /*allow_truncated_tail=*/true);
    Status end;
    CHECK(ReadAll(reader.get(), &end) == std::vector<std::string>{"one"});
    CHECK(absl::IsOutOfRange(end));
    CHECK(reader->offset() == second);

    // The writer finishes the record; the same reader picks it up.
    auto file = env.NewAppendableFile(kPath);
    REQUIRE(file.ok());
    REQUIRE((*file)->Append(bytes.substr(cut)).ok());
    REQUIRE((*file)->Close().ok());
    CHECK(ReadAll(reader.get(), &end) == std::vector<std::string>{"second record"});
    CHECK(absl::IsOutOfRange(end));
    CHECK(reader->offset() == bytes.size());
  }
}

}  // namespace
}  // namespace foreman
