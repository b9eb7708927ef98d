// checkpoint_bench's peers and probes (checkpoint_bench.cpp): an Env that
// counts syncs, the memcpy baselines, dd and torch.save. Public API only.
#pragma once

#include <sys/mman.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <new>
#include <string>
#include <utility>
#include <vector>

#include "bench_util.hpp"
#include "foreman/env.hpp"
#include "foreman/fault.hpp"
#include "foreman/tensor.hpp"

namespace foreman_bench {

// Env::Default() with its syncs counted: WritableFile::Sync (fdatasync) and
// SyncDir (fsync of a directory); every other call forwards (EnvWrapper).
class SyncCountingEnv : public foreman::EnvWrapper {
 public:
  SyncCountingEnv() : EnvWrapper(foreman::Env::Default()) {}
  int64_t syncs() const { return syncs_.load(); }

  foreman::StatusOr<std::unique_ptr<foreman::WritableFile>> NewWritableFile(const std::string& path) override {
    FOREMAN_ASSIGN_OR_RETURN(auto file, EnvWrapper::NewWritableFile(path));
    return std::unique_ptr<foreman::WritableFile>(new File(std::move(file), &syncs_));
  }
  foreman::StatusOr<std::unique_ptr<foreman::WritableFile>> NewAppendableFile(const std::string& path) override {
    FOREMAN_ASSIGN_OR_RETURN(auto file, EnvWrapper::NewAppendableFile(path));
    return std::unique_ptr<foreman::WritableFile>(new File(std::move(file), &syncs_));
  }
  foreman::Status SyncDir(const std::string& dir) override {
    ++syncs_;
    return EnvWrapper::SyncDir(dir);
  }

 private:
  class File : public foreman::WritableFile {
   public:
    File(std::unique_ptr<foreman::WritableFile> f, std::atomic<int64_t>* syncs) : f_(std::move(f)), syncs_(syncs) {}
    foreman::Status Append(absl::string_view data) override { return f_->Append(data); }
    foreman::Status Flush() override { return f_->Flush(); }
    foreman::Status Sync() override {
      ++*syncs_;
      return f_->Sync();
    }
    foreman::Status Close() override { return f_->Close(); }
    uint64_t Size() const override { return f_->Size(); }

   private:
    std::unique_ptr<foreman::WritableFile> f_;
    std::atomic<int64_t>* syncs_;
  };

  std::atomic<int64_t> syncs_{0};
};

struct Buffer {
  char* data;
  std::size_t size;
};

inline char* AllocateAligned(std::size_t bytes) {
  return static_cast<char*>(::operator new[](bytes, std::align_val_t(64)));
}
inline void FreeAligned(char* p) { ::operator delete[](p, std::align_val_t(64)); }

// Fresh pages from the kernel (mmap, so every run faults them in, whatever
// malloc would have reused): the copy's worst case.
inline double MemcpyFresh(const std::map<std::string, foreman::Tensor>& state) {
  std::vector<Buffer> out;
  const double start = NowSeconds();
  for (const auto& [name, t] : state) {
    void* p = mmap(nullptr, t.TotalBytes(), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
      std::perror("mmap");
      std::exit(1);
    }
    Buffer b{static_cast<char*>(p), t.TotalBytes()};
    std::memcpy(b.data, t.raw_data(), b.size);
    out.push_back(b);
  }
  const double took = NowSeconds() - start;
  for (Buffer& b : out) munmap(b.data, b.size);
  return took;
}

// Copy only: the destination pages are already mapped.
inline double MemcpyWarm(const std::map<std::string, foreman::Tensor>& state, std::vector<Buffer>& dest) {
  const double start = NowSeconds();
  std::size_t i = 0;
  for (const auto& [name, t] : state) std::memcpy(dest[i++].data, t.raw_data(), t.TotalBytes());
  return NowSeconds() - start;
}

inline double RunTimed(const std::string& command) {
  const double start = NowSeconds();
  const int rc = std::system(command.c_str());
  const double took = NowSeconds() - start;
  if (rc != 0) {
    std::fprintf(stderr, "checkpoint_bench: '%s' exited with %d\n", command.c_str(), rc);
    std::exit(1);
  }
  return took;
}

// Runs CMD and returns the number on its "SECONDS <x>" line.
inline double TorchSave(const std::string& cmd, int64_t mib, const std::string& dir) {
  const std::string full = cmd + " --mb " + std::to_string(mib) + " --dir '" + dir + "'";
  FILE* p = popen(full.c_str(), "r");
  if (p == nullptr) {
    std::fprintf(stderr, "checkpoint_bench: cannot run %s\n", full.c_str());
    std::exit(1);
  }
  char line[512];
  double seconds = -1;
  while (std::fgets(line, sizeof(line), p) != nullptr) {
    if (std::strncmp(line, "SECONDS ", 8) == 0) seconds = std::atof(line + 8);
  }
  const int rc = pclose(p);
  if (rc != 0 || seconds < 0) {
    std::fprintf(stderr, "checkpoint_bench: '%s' failed (status %d)\n", full.c_str(), rc);
    std::exit(1);
  }
  return seconds;
}

}  // namespace foreman_bench
