// FakeDevice (fake_device.hpp): pointer checks against its own blocks,
// capture as recorded closures, injected failures; the math is a CpuDevice's.
#include "support/fake_device.hpp"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <map>
#include <new>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"

namespace foreman::testing {

namespace {

constexpr std::size_t kAlignment = 64;

int64_t LabelBytes(const compute::SoftmaxXentArgs& a) {
  return a.rows * (a.label_type == compute::LabelType::kInt32 ? 4 : 8);
}

// "Page-locked" host memory: the buffers of AllocateHostTensor's tensors,
// from allocation until their Tensor releases them. Process-wide, as CUDA's
// (cudaMallocHost's memory serves every device's copies).
class PinnedRanges {
 public:
  static PinnedRanges& Get() {
    static PinnedRanges* ranges = new PinnedRanges;  // leaked: tensors may outlive static destruction order
    return *ranges;
  }
  char* Allocate(std::size_t bytes) {
    const std::size_t size = (bytes + kAlignment - 1) / kAlignment * kAlignment;
    char* p = static_cast<char*>(::operator new(size, std::align_val_t(kAlignment)));
    std::memset(p, 0, size);  // zero-filled, as Tensor::Create's
    absl::MutexLock lock(&mu_);
    ranges_[reinterpret_cast<uintptr_t>(p)] = bytes;
    return p;
  }
  static void Release(char* p) {
    {
      PinnedRanges& r = Get();
      absl::MutexLock lock(&r.mu_);
      r.ranges_.erase(reinterpret_cast<uintptr_t>(p));
    }
    ::operator delete(p, std::align_val_t(kAlignment));
  }
  // Whether [ptr, ptr + bytes) lies inside one live range (bytes >= 1).
  bool Contains(const void* ptr, int64_t bytes) {
    const auto p = reinterpret_cast<uintptr_t>(ptr);
    absl::MutexLock lock(&mu_);
    auto it = ranges_.upper_bound(p);
    if (it == ranges_.begin()) return false;
    --it;
    return p + static_cast<uintptr_t>(bytes) <= it->first + it->second;
  }

 private:
  absl::Mutex mu_;
  std::map<uintptr_t, std::size_t> ranges_ ABSL_GUARDED_BY(mu_);  // begin -> bytes
};

}  // namespace

class FakeDevice::Recording final : public compute::CapturedOps {
 public:
  Recording(FakeDevice* device, std::vector<Op> ops) : device_(device), ops_(std::move(ops)) {}
  Status Replay() override { return device_->Replay(ops_); }

 private:
  FakeDevice* device_;
  std::vector<Op> ops_;
};

FakeDevice::FakeDevice(Options options) : options_(std::move(options)), cpu_(1, compute::CpuIsa::kBaseline) {}

FakeDevice::~FakeDevice() {
  queue_.clear();  // never run: the device is gone
  for (const auto& [begin, bytes] : blocks_) {
    ::operator delete(reinterpret_cast<void*>(begin), std::align_val_t(kAlignment));
  }
}

bool FakeDevice::Contains(const void* ptr, int64_t bytes) const {
  if (ptr == nullptr || bytes < 1) return false;
  const auto p = reinterpret_cast<uintptr_t>(ptr);
  auto it = blocks_.upper_bound(p);
  if (it == blocks_.begin()) return false;
  --it;
  // A 0-byte block still owns kAlignment bytes; count its requested size only.
  return p + static_cast<uintptr_t>(bytes) <= it->first + static_cast<uintptr_t>(it->second);
}

Status FakeDevice::CheckDevice(const char* op, const char* what, const void* ptr, int64_t bytes) const {
  if (bytes <= 0) return absl::OkStatus();
  if (ptr == nullptr) return absl::InvalidArgumentError(absl::StrCat(name(), " ", op, ": ", what, " is null"));
  if (!Contains(ptr, bytes)) {
    return absl::InvalidArgumentError(absl::StrCat(name(), " ", op, ": ", what, " (", bytes, " bytes at 0x",
                                                   absl::Hex(reinterpret_cast<uintptr_t>(ptr)),
                                                   ") is not in this device's memory (a host pointer?)"));
  }
  return absl::OkStatus();
}

Status FakeDevice::CheckHost(const char* op, const char* what, const void* ptr, int64_t bytes) const {
  if (bytes <= 0) return absl::OkStatus();
  if (ptr == nullptr) return absl::InvalidArgumentError(absl::StrCat(name(), " ", op, ": ", what, " is null"));
  const auto p = reinterpret_cast<uintptr_t>(ptr);
  const uintptr_t end = p + static_cast<uintptr_t>(bytes);
  auto it = blocks_.upper_bound(p);
  bool overlaps = it != blocks_.end() && it->first < end;
  if (!overlaps && it != blocks_.begin()) {
    --it;
    overlaps = p < it->first + static_cast<uintptr_t>(std::max<int64_t>(it->second, 1));
  }
  if (overlaps) {
    return absl::InvalidArgumentError(
        absl::StrCat(name(), " ", op, ": ", what, " (0x", absl::Hex(reinterpret_cast<uintptr_t>(ptr)),
                     ") is device memory where host memory is needed"));
  }
  return absl::OkStatus();
}

void FakeDevice::InjectFailure(int64_t after, Status status, bool sticky) {
  fail_after_ = std::max<int64_t>(after, 0);
  fail_status_ = std::move(status);
  fail_sticky_ = sticky;
  sticky_failed_ = false;
}

void FakeDevice::FailNextOperation(Status status) {
  InjectFailure(0, status.ok() ? absl::InternalError(absl::StrCat(name(), ": injected failure")) : std::move(status));
}

void FakeDevice::ClearFailure() {
  async_error_ = Status();
  fail_after_ = -1;
  fail_sticky_ = false;
  sticky_failed_ = false;
  fail_status_ = Status();
}

Status FakeDevice::Execute(const Op& op) {
  if (sticky_failed_) return fail_status_;
  if (fail_after_ == 0) {
    fail_after_ = -1;
    if (fail_sticky_) sticky_failed_ = true;
    return fail_status_;
  }
  if (fail_after_ > 0) --fail_after_;
  FOREMAN_RETURN_IF_ERROR(op());
  ++operations_;
  return absl::OkStatus();
}

Status FakeDevice::Launch(const char* /*name*/, Op check, Op op) {
  FOREMAN_RETURN_IF_ERROR(check());
  if (capturing_) {
    recorded_.push_back([this, check = std::move(check), op = std::move(op)]() -> Status {
      FOREMAN_RETURN_IF_ERROR(check());  // a block freed since the capture
      return Execute(op);
    });
    return absl::OkStatus();
  }
  if (!options_.asynchronous) return Execute(op);
  FOREMAN_RETURN_IF_ERROR(async_error_);
  // Checked again when it runs: a block freed since is caught then.
  queue_.push_back(Queued{[this, check = std::move(check), op = std::move(op)]() -> Status {
                            FOREMAN_RETURN_IF_ERROR(check());
                            return Execute(op);
                          },
                          newest_marker_});
  return absl::OkStatus();
}

Status FakeDevice::RunQueued(uint64_t marker) {
  while (async_error_.ok() && !queue_.empty() && queue_.front().markers_before < marker) {
    Op op = std::move(queue_.front().op);
    queue_.pop_front();
    Status s = op();
    if (!s.ok()) {
      async_error_ = std::move(s);
      queue_.clear();
    }
  }
  return async_error_;
}

Status FakeDevice::HostCall(const char* op_name, const Op& op) {
  if (capturing_) {
    Status s = absl::FailedPreconditionError(
        absl::StrCat(name(), " ", op_name, ": needs the host, not allowed while capturing"));
    if (capture_error_.ok()) capture_error_ = s;
    return s;
  }
  FOREMAN_RETURN_IF_ERROR(async_error_);  // sticky, as CUDA's
  return Execute(op);
}

Status FakeDevice::HostOp(const char* op_name, const Op& op) {
  if (!capturing_) FOREMAN_RETURN_IF_ERROR(RunQueued(UINT64_MAX));
  return HostCall(op_name, op);
}

Status FakeDevice::Replay(const std::vector<Op>& ops) {
  if (capturing_) return absl::FailedPreconditionError(absl::StrCat(name(), ": Replay while capturing"));
  FOREMAN_RETURN_IF_ERROR(async_error_);
  ++replays_;
  if (options_.asynchronous) {
    for (const Op& op : ops) queue_.push_back(Queued{op, newest_marker_});
    return absl::OkStatus();
  }
  for (const Op& op : ops) FOREMAN_RETURN_IF_ERROR(op());
  return absl::OkStatus();
}

StatusOr<uint64_t> FakeDevice::RecordMarker() {
  if (capturing_) {
    Status s = absl::FailedPreconditionError(
        absl::StrCat(name(), " RecordMarker: a marker is the host's, not allowed while capturing"));
    if (capture_error_.ok()) capture_error_ = s;
    return s;
  }
  FOREMAN_RETURN_IF_ERROR(async_error_);
  return ++newest_marker_;
}

Status FakeDevice::WaitForMarker(uint64_t marker) {
  if (capturing_) {
    Status s = absl::FailedPreconditionError(
        absl::StrCat(name(), " WaitForMarker: waits for the device, not allowed while capturing"));
    if (capture_error_.ok()) capture_error_ = s;
    return s;
  }
  if (marker > newest_marker_) return MarkerNotRecorded(marker, newest_marker_);
  return RunQueued(marker);
}

Status FakeDevice::CheckPinned(const char* op, const char* what, const void* ptr, int64_t bytes) const {
  if (bytes <= 0) return absl::OkStatus();
  if (ptr == nullptr) return absl::InvalidArgumentError(absl::StrCat(name(), " ", op, ": ", what, " is null"));
  if (!PinnedRanges::Get().Contains(ptr, bytes)) {
    return absl::InvalidArgumentError(absl::StrCat(name(), " ", op, ": ", what, " (", bytes, " bytes at 0x",
                                                   absl::Hex(reinterpret_cast<uintptr_t>(ptr)),
                                                   ") is not page-locked host memory (a tensor from "
                                                   "AllocateHostTensor)"));
  }
  return absl::OkStatus();
}

Status FakeDevice::AsyncCopy(bool to_device, void* dst, const void* src, int64_t bytes) {
  const char* op = to_device ? "CopyToDeviceAsync" : "CopyToHostAsync";
  if (bytes < 0) {
    return absl::InvalidArgumentError(absl::StrCat(name(), " ", op, ": bytes must be >= 0, got ", bytes));
  }
  auto check = [this, op, to_device, dst, src, bytes]() -> Status {
    if (to_device) {
      FOREMAN_RETURN_IF_ERROR(CheckDevice(op, "destination", dst, bytes));
      return CheckPinned(op, "the source", src, bytes);
    }
    FOREMAN_RETURN_IF_ERROR(CheckDevice(op, "source", src, bytes));
    return CheckPinned(op, "the destination", dst, bytes);
  };
  return Launch(op, check, [this, to_device, dst, src, bytes]() -> Status {
    if (bytes > 0) std::memcpy(dst, src, static_cast<std::size_t>(bytes));
    ++(to_device ? async_copies_to_device_ : async_copies_to_host_);
    return absl::OkStatus();
  });
}

Status FakeDevice::CopyToDeviceAsync(void* device_dst, const void* host_src, int64_t bytes) {
  return AsyncCopy(/*to_device=*/true, device_dst, host_src, bytes);
}

Status FakeDevice::CopyToHostAsync(void* host_dst, const void* device_src, int64_t bytes) {
  return AsyncCopy(/*to_device=*/false, host_dst, device_src, bytes);
}

StatusOr<void*> FakeDevice::Allocate(int64_t bytes) {
  if (bytes < 0) {
    return absl::InvalidArgumentError(absl::StrCat(name(), " Allocate: bytes must be >= 0, got ", bytes));
  }
  void* result = nullptr;
  FOREMAN_RETURN_IF_ERROR(HostCall("Allocate", [&]() -> Status {
    if (options_.memory_limit_bytes > 0 && allocated_bytes_ + bytes > options_.memory_limit_bytes) {
      return absl::ResourceExhaustedError(absl::StrCat(name(), ": out of memory allocating ", bytes, " bytes (",
                                                       allocated_bytes_, " of the limit ",
                                                       options_.memory_limit_bytes, " bytes in use)"));
    }
    const std::size_t size =
        std::max(kAlignment, (static_cast<std::size_t>(bytes) + kAlignment - 1) / kAlignment * kAlignment);
    result = ::operator new(size, std::align_val_t(kAlignment), std::nothrow);
    if (result == nullptr) {
      return absl::ResourceExhaustedError(absl::StrCat(name(), ": out of memory allocating ", bytes, " bytes"));
    }
    blocks_[reinterpret_cast<uintptr_t>(result)] = bytes;
    allocated_bytes_ += bytes;
    peak_bytes_ = std::max(peak_bytes_, allocated_bytes_);
    return absl::OkStatus();
  }));
  return result;
}

void FakeDevice::Deallocate(void* ptr) {
  if (ptr == nullptr) return;
  // cudaFree waits for the work queued before it (a failure sticks).
  if (!capturing_) (void)RunQueued(UINT64_MAX);
  auto it = blocks_.find(reinterpret_cast<uintptr_t>(ptr));
  if (it == blocks_.end()) {
    ++bad_deallocations_;
    return;
  }
  allocated_bytes_ -= it->second;
  blocks_.erase(it);
  ::operator delete(ptr, std::align_val_t(kAlignment));
}

Status FakeDevice::StoreOnDevice(void* device_dst, const void* host_src, int64_t bytes) {
  FOREMAN_RETURN_IF_ERROR(cpu_.CopyToDevice(device_dst, host_src, bytes));
  ++copies_to_device_;
  bytes_to_device_ += std::max<int64_t>(bytes, 0);
  return absl::OkStatus();
}

Status FakeDevice::CopyToDevice(void* device_dst, const void* host_src, int64_t bytes) {
  FOREMAN_RETURN_IF_ERROR(CheckDevice("CopyToDevice", "destination", device_dst, bytes));
  FOREMAN_RETURN_IF_ERROR(CheckHost("CopyToDevice", "source", host_src, bytes));
  if (!options_.asynchronous || capturing_) {
    return HostOp("CopyToDevice", [&]() -> Status { return StoreOnDevice(device_dst, host_src, bytes); });
  }
  // As CUDA's through its staging buffer: the caller's bytes are taken now
  // and copied to the device after the operations queued before, which it
  // does not wait for.
  if (bytes < 0) {
    return absl::InvalidArgumentError(absl::StrCat(name(), " CopyToDevice: bytes must be >= 0, got ", bytes));
  }
  FOREMAN_RETURN_IF_ERROR(async_error_);
  if (bytes == 0) return absl::OkStatus();
  const char* src = static_cast<const char*>(host_src);
  auto staged = std::make_shared<std::vector<char>>(src, src + bytes);
  queue_.push_back(Queued{[this, device_dst, staged, bytes]() -> Status {
                            // Checked again when it runs: a block freed since is caught then.
                            FOREMAN_RETURN_IF_ERROR(CheckDevice("CopyToDevice", "destination", device_dst, bytes));
                            return Execute([&]() { return StoreOnDevice(device_dst, staged->data(), bytes); });
                          },
                          newest_marker_});
  return absl::OkStatus();
}

Status FakeDevice::CopyToHost(void* host_dst, const void* device_src, int64_t bytes) {
  FOREMAN_RETURN_IF_ERROR(CheckDevice("CopyToHost", "source", device_src, bytes));
  FOREMAN_RETURN_IF_ERROR(CheckHost("CopyToHost", "destination", host_dst, bytes));
  return HostOp("CopyToHost", [&]() -> Status {
    FOREMAN_RETURN_IF_ERROR(cpu_.CopyToHost(host_dst, device_src, bytes));
    ++copies_to_host_;
    bytes_to_host_ += std::max<int64_t>(bytes, 0);
    return absl::OkStatus();
  });
}

Status FakeDevice::CopyToHostBatch(const compute::HostCopy* copies, int64_t count) {
  if (count < 0) {
    return absl::InvalidArgumentError(absl::StrCat(name(), " CopyToHostBatch: count must be >= 0, got ", count));
  }
  if (count > 0 && copies == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(name(), " CopyToHostBatch: copies is null"));
  }
  for (int64_t i = 0; i < count; ++i) {
    const std::string what = absl::StrCat("copies[", i, "]");
    FOREMAN_RETURN_IF_ERROR(CheckDevice("CopyToHostBatch", (what + ".device_src").c_str(), copies[i].device_src,
                                        copies[i].bytes));
    FOREMAN_RETURN_IF_ERROR(
        CheckHost("CopyToHostBatch", (what + ".host_dst").c_str(), copies[i].host_dst, copies[i].bytes));
  }
  return HostOp("CopyToHostBatch", [&]() -> Status {
    // After the capture check, as CUDA's (whose copies could not be
    // asynchronous into pageable memory: cudaMemcpyAsync would stage them
    // through the driver and block the caller).
    for (int64_t i = 0; i < count; ++i) {
      if (copies[i].bytes > 0 && !PinnedRanges::Get().Contains(copies[i].host_dst, copies[i].bytes)) {
        return absl::InvalidArgumentError(absl::StrCat(
            name(), " CopyToHostBatch: copies[", i, "].host_dst (", copies[i].bytes, " bytes at 0x",
            absl::Hex(reinterpret_cast<uintptr_t>(copies[i].host_dst)),
            ") is not page-locked host memory (a tensor from AllocateHostTensor)"));
      }
    }
    int64_t total = 0;
    for (int64_t i = 0; i < count; ++i) {
      FOREMAN_RETURN_IF_ERROR(cpu_.CopyToHost(copies[i].host_dst, copies[i].device_src, copies[i].bytes));
      total += std::max<int64_t>(copies[i].bytes, 0);
    }
    ++host_batches_;
    bytes_to_host_ += total;
    return absl::OkStatus();
  });
}

StatusOr<Tensor> FakeDevice::AllocateHostTensor(DataType dtype, TensorShape shape) {
  Tensor t;
  FOREMAN_RETURN_IF_ERROR(HostCall("AllocateHostTensor", [&]() -> Status {
    // Tensor::Create checks the dtype and shape (and is what strings and
    // empty tensors get, as on CUDA: nothing is copied into them); a
    // numeric tensor then moves to a buffer of the page-locked ranges.
    FOREMAN_ASSIGN_OR_RETURN(t, Tensor::Create(dtype, shape));
    if (dtype != DataType::kString && t.TotalBytes() > 0) {
      t = Tensor::FromBuffer(dtype, std::move(shape), PinnedRanges::Get().Allocate(t.TotalBytes()),
                             &PinnedRanges::Release);
    }
    ++host_tensors_;
    return absl::OkStatus();
  }));
  return t;
}

Status FakeDevice::Gemm(const compute::GemmArgs& g) {
  auto check = [this, g]() -> Status {
    if (g.n > 0 && g.k >= 0 && g.column_sums != nullptr) {
      FOREMAN_RETURN_IF_ERROR(CheckDevice("Gemm", "column_sums", g.column_sums, g.n * 4));
      FOREMAN_RETURN_IF_ERROR(CheckDevice("Gemm", "b", g.b, g.k * g.n * 4));
    }
    if (g.m <= 0 || g.n <= 0 || g.k < 0) return absl::OkStatus();  // nothing written; the CPU checks signs
    FOREMAN_RETURN_IF_ERROR(CheckDevice("Gemm", "c", g.c, g.m * g.n * 4));
    FOREMAN_RETURN_IF_ERROR(CheckDevice("Gemm", "a", g.a, g.m * g.k * 4));
    FOREMAN_RETURN_IF_ERROR(CheckDevice("Gemm", "b", g.b, g.k * g.n * 4));
    if (g.epilogue == compute::Epilogue::kBias || g.epilogue == compute::Epilogue::kBiasRelu) {
      FOREMAN_RETURN_IF_ERROR(CheckDevice("Gemm", "bias", g.bias, g.n * 4));
    }
    if (g.epilogue == compute::Epilogue::kReluGradMask) {
      FOREMAN_RETURN_IF_ERROR(CheckDevice("Gemm", "relu_output", g.relu_output, g.m * g.n * 4));
    }
    return absl::OkStatus();
  };
  return Launch("Gemm", check, [this, g] { return cpu_.Gemm(g); });
}

Status FakeDevice::ColumnSums(const float* delta, int64_t rows, int64_t cols, float* out) {
  auto check = [=]() -> Status {
    if (rows < 0 || cols <= 0) return absl::OkStatus();
    FOREMAN_RETURN_IF_ERROR(CheckDevice("ColumnSums", "out", out, cols * 4));
    return CheckDevice("ColumnSums", "delta", delta, rows * cols * 4);
  };
  return Launch("ColumnSums", check, [=] { return cpu_.ColumnSums(delta, rows, cols, out); });
}

namespace {
/// The logits and labels of a softmax cross-entropy, through `check`.
Status CheckXentOperands(const char* op, const compute::SoftmaxXentArgs& a,
                         const std::function<Status(const char*, const char*, const void*, int64_t)>& check) {
  if (a.rows <= 0 || a.classes <= 0) return absl::OkStatus();
  FOREMAN_RETURN_IF_ERROR(check(op, "logits", a.logits, a.rows * a.classes * 4));
  return check(op, "labels", a.labels, LabelBytes(a));
}
}  // namespace

Status FakeDevice::SoftmaxXentForward(const compute::SoftmaxXentArgs& args, compute::SoftmaxXentStats* stats) {
  auto dev = [this](const char* op, const char* what, const void* p, int64_t b) { return CheckDevice(op, what, p, b); };
  FOREMAN_RETURN_IF_ERROR(CheckXentOperands("SoftmaxXentForward", args, dev));
  FOREMAN_RETURN_IF_ERROR(CheckHost("SoftmaxXentForward", "stats", stats, sizeof(*stats)));
  return HostOp("SoftmaxXentForward", [&] { return cpu_.SoftmaxXentForward(args, stats); });
}

Status FakeDevice::SoftmaxXentBackward(const compute::SoftmaxXentArgs& args, float scale, float* grad) {
  auto check = [this, args, grad]() -> Status {
    auto dev = [this](const char* op, const char* what, const void* p, int64_t b) {
      return CheckDevice(op, what, p, b);
    };
    FOREMAN_RETURN_IF_ERROR(CheckXentOperands("SoftmaxXentBackward", args, dev));
    if (args.rows <= 0 || args.classes <= 0) return absl::OkStatus();
    return CheckDevice("SoftmaxXentBackward", "grad", grad, args.rows * args.classes * 4);
  };
  return Launch("SoftmaxXentBackward", check, [=] { return cpu_.SoftmaxXentBackward(args, scale, grad); });
}

Status FakeDevice::SoftmaxXent(const compute::SoftmaxXentArgs& args, compute::SoftmaxXentStats* stats, float scale,
                               float* grad) {
  auto dev = [this](const char* op, const char* what, const void* p, int64_t b) { return CheckDevice(op, what, p, b); };
  FOREMAN_RETURN_IF_ERROR(CheckXentOperands("SoftmaxXent", args, dev));
  if (args.rows > 0 && args.classes > 0) {
    FOREMAN_RETURN_IF_ERROR(CheckDevice("SoftmaxXent", "grad", grad, args.rows * args.classes * 4));
  }
  FOREMAN_RETURN_IF_ERROR(CheckHost("SoftmaxXent", "stats", stats, sizeof(*stats)));
  return HostOp("SoftmaxXent", [&] { return cpu_.SoftmaxXent(args, stats, scale, grad); });
}

Status FakeDevice::SoftmaxXentToDevice(const compute::SoftmaxXentArgs& args, float scale, float* grad,
                                       compute::SoftmaxXentStats* device_stats) {
  auto check = [this, args, grad, device_stats]() -> Status {
    auto dev = [this](const char* op, const char* what, const void* p, int64_t b) {
      return CheckDevice(op, what, p, b);
    };
    FOREMAN_RETURN_IF_ERROR(CheckXentOperands("SoftmaxXentToDevice", args, dev));
    FOREMAN_RETURN_IF_ERROR(CheckDevice("SoftmaxXentToDevice", "device_stats", device_stats, sizeof(*device_stats)));
    if (args.rows <= 0 || args.classes <= 0) return absl::OkStatus();
    return CheckDevice("SoftmaxXentToDevice", "grad", grad, args.rows * args.classes * 4);
  };
  return Launch("SoftmaxXentToDevice", check,
                [=] { return cpu_.SoftmaxXentToDevice(args, scale, grad, device_stats); });
}

Status FakeDevice::SoftmaxXentForwardToDevice(const compute::SoftmaxXentArgs& args,
                                              compute::SoftmaxXentStats* device_stats) {
  auto check = [this, args, device_stats]() -> Status {
    auto dev = [this](const char* op, const char* what, const void* p, int64_t b) {
      return CheckDevice(op, what, p, b);
    };
    FOREMAN_RETURN_IF_ERROR(CheckXentOperands("SoftmaxXentForwardToDevice", args, dev));
    return CheckDevice("SoftmaxXentForwardToDevice", "device_stats", device_stats, sizeof(*device_stats));
  };
  return Launch("SoftmaxXentForwardToDevice", check,
                [=] { return cpu_.SoftmaxXentForwardToDevice(args, device_stats); });
}

Status FakeDevice::ApplyGradientDescent(float* var, const float* grad, int64_t n, float lr) {
  auto check = [=]() -> Status {
    FOREMAN_RETURN_IF_ERROR(CheckDevice("ApplyGradientDescent", "var", var, n * 4));
    return CheckDevice("ApplyGradientDescent", "grad", grad, n * 4);
  };
  return Launch("ApplyGradientDescent", check, [=] { return cpu_.ApplyGradientDescent(var, grad, n, lr); });
}

Status FakeDevice::ApplyMomentum(float* var, float* accum, const float* grad, int64_t n,
                                 const compute::MomentumParams& p) {
  auto check = [=]() -> Status {
    FOREMAN_RETURN_IF_ERROR(CheckDevice("ApplyMomentum", "var", var, n * 4));
    FOREMAN_RETURN_IF_ERROR(CheckDevice("ApplyMomentum", "accum", accum, n * 4));
    return CheckDevice("ApplyMomentum", "grad", grad, n * 4);
  };
  return Launch("ApplyMomentum", check, [=] { return cpu_.ApplyMomentum(var, accum, grad, n, p); });
}

Status FakeDevice::ApplyAdam(float* var, float* m, float* v, const float* grad, int64_t n,
                             const compute::AdamParams& p) {
  auto check = [=]() -> Status {
    FOREMAN_RETURN_IF_ERROR(CheckDevice("ApplyAdam", "var", var, n * 4));
    FOREMAN_RETURN_IF_ERROR(CheckDevice("ApplyAdam", "m", m, n * 4));
    FOREMAN_RETURN_IF_ERROR(CheckDevice("ApplyAdam", "v", v, n * 4));
    return CheckDevice("ApplyAdam", "grad", grad, n * 4);
  };
  return Launch("ApplyAdam", check, [=] { return cpu_.ApplyAdam(var, m, v, grad, n, p); });
}

Status FakeDevice::ApplyGradientDescent(float* var, const float* grad, int64_t n, compute::DeviceScalar lr) {
  auto check = [=]() -> Status {
    FOREMAN_RETURN_IF_ERROR(CheckDevice("ApplyGradientDescent", "learning_rate", lr.ptr, 4));
    FOREMAN_RETURN_IF_ERROR(CheckDevice("ApplyGradientDescent", "var", var, n * 4));
    return CheckDevice("ApplyGradientDescent", "grad", grad, n * 4);
  };
  return Launch("ApplyGradientDescent", check, [=] { return cpu_.ApplyGradientDescent(var, grad, n, lr); });
}

Status FakeDevice::ApplyMomentum(float* var, float* accum, const float* grad, int64_t n, compute::DeviceScalar lr,
                                 float momentum, bool use_nesterov) {
  auto check = [=]() -> Status {
    FOREMAN_RETURN_IF_ERROR(CheckDevice("ApplyMomentum", "learning_rate", lr.ptr, 4));
    FOREMAN_RETURN_IF_ERROR(CheckDevice("ApplyMomentum", "var", var, n * 4));
    FOREMAN_RETURN_IF_ERROR(CheckDevice("ApplyMomentum", "accum", accum, n * 4));
    return CheckDevice("ApplyMomentum", "grad", grad, n * 4);
  };
  return Launch("ApplyMomentum", check,
                [=] { return cpu_.ApplyMomentum(var, accum, grad, n, lr, momentum, use_nesterov); });
}

Status FakeDevice::ApplyAdam(float* var, float* m, float* v, const float* grad, int64_t n,
                             compute::DeviceScalar step_size, float beta1, float beta2, float epsilon) {
  auto check = [=]() -> Status {
    FOREMAN_RETURN_IF_ERROR(CheckDevice("ApplyAdam", "step_size", step_size.ptr, 4));
    FOREMAN_RETURN_IF_ERROR(CheckDevice("ApplyAdam", "var", var, n * 4));
    FOREMAN_RETURN_IF_ERROR(CheckDevice("ApplyAdam", "m", m, n * 4));
    FOREMAN_RETURN_IF_ERROR(CheckDevice("ApplyAdam", "v", v, n * 4));
    return CheckDevice("ApplyAdam", "grad", grad, n * 4);
  };
  return Launch("ApplyAdam", check,
                [=] { return cpu_.ApplyAdam(var, m, v, grad, n, step_size, beta1, beta2, epsilon); });
}

Status FakeDevice::AdamStepSize(compute::DeviceScalar lr, compute::DeviceScalar beta1_power,
                                compute::DeviceScalar beta2_power, float* step_size) {
  auto check = [=]() -> Status {
    FOREMAN_RETURN_IF_ERROR(CheckDevice("AdamStepSize", "learning_rate", lr.ptr, 4));
    FOREMAN_RETURN_IF_ERROR(CheckDevice("AdamStepSize", "beta1_power", beta1_power.ptr, 4));
    FOREMAN_RETURN_IF_ERROR(CheckDevice("AdamStepSize", "beta2_power", beta2_power.ptr, 4));
    return CheckDevice("AdamStepSize", "step_size", step_size, 4);
  };
  return Launch("AdamStepSize", check,
                [=] { return cpu_.AdamStepSize(lr, beta1_power, beta2_power, step_size); });
}

Status FakeDevice::AdamFinish(float* beta1_power, float* beta2_power, float beta1, float beta2) {
  auto check = [=]() -> Status {
    FOREMAN_RETURN_IF_ERROR(CheckDevice("AdamFinish", "beta1_power", beta1_power, 4));
    return CheckDevice("AdamFinish", "beta2_power", beta2_power, 4);
  };
  return Launch("AdamFinish", check, [=] { return cpu_.AdamFinish(beta1_power, beta2_power, beta1, beta2); });
}

Status FakeDevice::GatherExamples(const compute::GatherArgs& a) {
  auto check = [this, a]() -> Status {
    if (a.rows <= 0 || a.feature_dim < 0) return absl::OkStatus();
    FOREMAN_RETURN_IF_ERROR(CheckDevice("GatherExamples", "indices", a.indices, a.rows * 4));
    FOREMAN_RETURN_IF_ERROR(CheckDevice("GatherExamples", "labels", a.labels, a.rows * 4));
    FOREMAN_RETURN_IF_ERROR(CheckDevice("GatherExamples", "example_labels", a.example_labels, a.num_examples));
    FOREMAN_RETURN_IF_ERROR(CheckDevice("GatherExamples", "images", a.images, a.num_examples * a.feature_dim));
    return CheckDevice("GatherExamples", "features", a.features, a.rows * a.feature_dim * 4);
  };
  return Launch("GatherExamples", check, [this, a] { return cpu_.GatherExamples(a); });
}

Status FakeDevice::BeginCapture() {
  if (!options_.capture) return compute::Device::BeginCapture();
  if (capturing_) return absl::FailedPreconditionError(absl::StrCat(name(), ": already capturing"));
  capturing_ = true;
  recorded_.clear();
  capture_error_ = Status();
  return absl::OkStatus();
}

StatusOr<std::unique_ptr<compute::CapturedOps>> FakeDevice::EndCapture() {
  if (!capturing_) return absl::FailedPreconditionError(absl::StrCat(name(), ": not capturing"));
  capturing_ = false;
  std::vector<Op> ops = std::move(recorded_);
  recorded_.clear();
  if (!capture_error_.ok()) {
    Status s = std::move(capture_error_);
    capture_error_ = Status();
    return s;
  }
  ++captures_;
  return std::unique_ptr<compute::CapturedOps>(new Recording(this, std::move(ops)));
}

Status FakeDevice::Synchronize() {
  return HostOp("Synchronize", [] { return absl::OkStatus(); });
}

compute::DeviceFactoryForTesting FakeDeviceFactory(FakeDevice** last, bool capture, bool asynchronous) {
  return [last, capture, asynchronous](const std::string& device,
                                       int64_t memory_limit_bytes) -> StatusOr<std::unique_ptr<compute::Device>> {
    FakeDevice::Options options;
    options.name = device;
    options.memory_limit_bytes = memory_limit_bytes;
    options.capture = capture;
    options.asynchronous = asynchronous;
    auto d = std::make_unique<FakeDevice>(options);
    if (last != nullptr) *last = d.get();
    return std::unique_ptr<compute::Device>(std::move(d));
  };
}

}  // namespace foreman::testing
