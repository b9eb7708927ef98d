#include "formats/bundle/leveldb_env.hpp"

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace foreman::internal {

namespace {

leveldb::Status ToLevelDb(const Status& s) {
  if (s.ok()) return leveldb::Status::OK();
  const std::string msg(s.message());
  switch (s.code()) {
    case absl::StatusCode::kNotFound: return leveldb::Status::NotFound(msg);
    case absl::StatusCode::kDataLoss: return leveldb::Status::Corruption(msg);
    default: return leveldb::Status::IOError(msg);
  }
}

}  // namespace

// -- FirstError -----------------------------------------------------------------

leveldb::Status FirstError::Record(const Status& s) {
  if (!s.ok()) {
    MutexLock l(mu_);
    if (status_.ok()) status_ = s;
  }
  return ToLevelDb(s);
}

Status FirstError::Get() const {
  MutexLock l(mu_);
  return status_;
}

// -- files ----------------------------------------------------------------------

leveldb::Status LevelDbWritableFile::Append(const leveldb::Slice& data) {
  return error_.Record(file_->Append(absl::string_view(data.data(), data.size())));
}

leveldb::Status LevelDbWritableFile::Close() { return error_.Record(file_->Close()); }
leveldb::Status LevelDbWritableFile::Flush() { return error_.Record(file_->Flush()); }
leveldb::Status LevelDbWritableFile::Sync() { return error_.Record(file_->Sync()); }

leveldb::Status LevelDbRandomAccessFile::Read(uint64_t offset, size_t n, leveldb::Slice* result,
                                              char* scratch) const {
  StatusOr<absl::string_view> data = file_->Read(offset, n, scratch);
  if (!data.ok()) {
    *result = leveldb::Slice();
    return error_.Record(data.status());
  }
  *result = leveldb::Slice(data->data(), data->size());
  return leveldb::Status::OK();
}

Status FromLevelDb(const leveldb::Status& s, const Status& io_error, const std::string& path) {
  if (s.ok()) return absl::OkStatus();
  if (!io_error.ok()) {
    return absl::StrContains(io_error.message(), path) ? io_error : Annotate(io_error, path);
  }
  const std::string msg = absl::StrCat(path, ": ", s.ToString());
  return s.IsCorruption() ? absl::DataLossError(msg) : absl::InternalError(msg);
}

}  // namespace foreman::internal
