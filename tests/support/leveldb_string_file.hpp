// A leveldb::WritableFile that keeps its bytes in a string: the sink of a
// LevelDB TableBuilder when a test builds a bundle's index by hand
// (bundle_test, chaos_oracle_test).
#pragma once

#include <string>

#include <leveldb/env.h>

namespace foreman::testing {

class LevelDbStringFile : public leveldb::WritableFile {
 public:
  leveldb::Status Append(const leveldb::Slice& d) override {
    data.append(d.data(), d.size());
    return leveldb::Status::OK();
  }
  leveldb::Status Close() override { return leveldb::Status::OK(); }
  leveldb::Status Flush() override { return leveldb::Status::OK(); }
  leveldb::Status Sync() override { return leveldb::Status::OK(); }
  std::string data;  // every byte appended
};

}  // namespace foreman::testing
