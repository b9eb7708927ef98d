// TensorBytes (tensor_bytes.hpp): shared, copy-on-write tensor bytes and
// their block pool.
#include "tensor_bytes.hpp"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <new>
#include <thread>
#include <unordered_map>
#include <vector>

#include <caf/binary_deserializer.hpp>
#include <caf/deserializer.hpp>
#include <caf/error.hpp>
#include <caf/sec.hpp>
#include <caf/serializer.hpp>

#include "foreman/mutex.hpp"

namespace foreman::internal {

namespace {

constexpr std::size_t kAlign = 64;
// The pool keeps freed blocks for reuse up to these bounds (a ps shard of
// the main job cycles a few blocks of each of its 6 sizes).
constexpr std::size_t kMaxPooledPerSize = 16;
constexpr std::size_t kMaxPooledBytes = std::size_t{256} << 20;
// A payload that is not read by a binary_deserializer (whose remaining()
// bounds a length) may announce at most this much.
constexpr std::size_t kMaxUnboundedLoad = std::size_t{1} << 30;

std::atomic<uint64_t> g_serialized{0}, g_deserialized{0}, g_copied{0}, g_allocated{0};

std::size_t Capacity(std::size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

}  // namespace

// A block's header (the 64 bytes before its data) or a borrowed view's
// control block (allocated alone).
struct TensorBytes::Rep {
  std::atomic<int32_t> refs{1};
  bool borrowed = false;
  std::size_t size = 0;
  std::size_t capacity = 0;  // blocks: the data's allocated bytes
  char* data = nullptr;
};
static_assert(sizeof(TensorBytes::Rep) <= kAlign, "a block's header fits its 64 bytes");

namespace {

using Rep = TensorBytes::Rep;

class BlockPool {
 public:
  static BlockPool& Get() {
    static BlockPool* pool = new BlockPool;  // never destroyed: blocks may be freed during exit
    return *pool;
  }

  Rep* Acquire(std::size_t n) {
    const std::size_t cap = Capacity(n);
    {
      MutexLock l(mu_);
      auto it = free_.find(cap);
      if (it != free_.end() && !it->second.empty()) {
        Rep* r = it->second.back();
        it->second.pop_back();
        pooled_bytes_ -= cap;
        r->refs.store(1, std::memory_order_relaxed);
        r->size = n;
        return r;
      }
    }
    void* base = std::aligned_alloc(kAlign, kAlign + cap);
    if (base == nullptr) throw std::bad_alloc();
    Rep* r = new (base) Rep;
    r->size = n;
    r->capacity = cap;
    r->data = static_cast<char*>(base) + kAlign;
    return r;
  }

  void Return(Rep* r) {
    {
      MutexLock l(mu_);
      std::vector<Rep*>& list = free_[r->capacity];
      if (list.size() < kMaxPooledPerSize && pooled_bytes_ + r->capacity <= kMaxPooledBytes) {
        list.push_back(r);
        pooled_bytes_ += r->capacity;
        return;
      }
    }
    r->~Rep();
    std::free(r);
  }

 private:
  Mutex mu_;
  std::unordered_map<std::size_t, std::vector<Rep*>> free_ ABSL_GUARDED_BY(mu_);
  std::size_t pooled_bytes_ ABSL_GUARDED_BY(mu_) = 0;
};

void Unref(Rep* r) noexcept {
  if (r->refs.fetch_sub(1, std::memory_order_acq_rel) != 1) return;
  if (r->borrowed) {
    delete r;
  } else {
    BlockPool::Get().Return(r);
  }
}

// Tensor::FromBuffer's release function for a block's data.
void ReleaseBlockData(char* data) { Unref(reinterpret_cast<Rep*>(data - kAlign)); }

Rep* BlockOfTensor(const Tensor& t) {
  return reinterpret_cast<Rep*>(const_cast<char*>(t.raw_data()) - kAlign);
}

}  // namespace

TensorBytes TensorBytes::Uninitialized(std::size_t n) {
  if (n == 0) return TensorBytes();
  g_allocated.fetch_add(n, std::memory_order_relaxed);
  return TensorBytes(BlockPool::Get().Acquire(n));
}

TensorBytes TensorBytes::Copy(const void* data, std::size_t n) {
  TensorBytes b = Uninitialized(n);
  if (n > 0) {
    std::memcpy(b.rep_->data, data, n);
    g_copied.fetch_add(n, std::memory_order_relaxed);
  }
  return b;
}

TensorBytes TensorBytes::Borrow(const void* data, std::size_t n) {
  if (n == 0) return TensorBytes();
  Rep* r = new Rep;
  r->borrowed = true;
  r->size = n;
  r->data = static_cast<char*>(const_cast<void*>(data));
  return TensorBytes(r);
}

TensorBytes::TensorBytes(const TensorBytes& other) noexcept : rep_(other.rep_) {
  if (rep_ != nullptr) rep_->refs.fetch_add(1, std::memory_order_relaxed);
}

TensorBytes& TensorBytes::operator=(const TensorBytes& other) noexcept {
  if (other.rep_ != nullptr) other.rep_->refs.fetch_add(1, std::memory_order_relaxed);
  Release();
  rep_ = other.rep_;
  return *this;
}

TensorBytes& TensorBytes::operator=(TensorBytes&& other) noexcept {
  if (this != &other) {
    Release();
    rep_ = std::exchange(other.rep_, nullptr);
  }
  return *this;
}

void TensorBytes::Release() noexcept {
  if (rep_ != nullptr) Unref(std::exchange(rep_, nullptr));
}

std::size_t TensorBytes::size() const { return rep_ == nullptr ? 0 : rep_->size; }
const char* TensorBytes::data() const { return rep_ == nullptr ? nullptr : rep_->data; }
bool TensorBytes::borrowed() const { return rep_ != nullptr && rep_->borrowed; }
bool TensorBytes::unique() const { return rep_ == nullptr || rep_->refs.load(std::memory_order_acquire) == 1; }

char* TensorBytes::mutable_data() {
  if (rep_ == nullptr) return nullptr;
  if (rep_->borrowed || !unique()) *this = Copy(rep_->data, rep_->size);
  return rep_->data;
}

void TensorBytes::Detach() {
  if (borrowed()) *this = Copy(rep_->data, rep_->size);
}

void TensorBytes::resize(std::size_t n) {
  const std::size_t old = size();
  if (n == old) return;
  TensorBytes grown = Uninitialized(n);
  if (n > 0) {
    if (old > 0) std::memcpy(grown.rep_->data, data(), std::min(n, old));
    if (n > old) std::memset(grown.rep_->data + old, 0, n - old);
  }
  *this = std::move(grown);
}

bool TensorBytes::WaitUntilReturned(std::chrono::milliseconds timeout) const {
  if (unique()) return true;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  std::chrono::microseconds nap{20};
  while (!unique()) {
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(nap);
    nap = std::min<std::chrono::microseconds>(nap * 2, std::chrono::milliseconds(1));
  }
  return true;
}

bool operator==(const TensorBytes& a, const TensorBytes& b) {
  return a.size() == b.size() && (a.size() == 0 || std::memcmp(a.data(), b.data(), a.size()) == 0);
}

caf::error TensorBytes::Save(caf::serializer& sink) {
  std::size_t n = size();
  if (auto e = sink.begin_sequence(n)) return e;
  if (n > 0) {
    if (auto e = sink.apply_raw(n, rep_->data)) return e;
    g_serialized.fetch_add(n, std::memory_order_relaxed);
  }
  return sink.end_sequence();
}

caf::error TensorBytes::Load(caf::deserializer& source) {
  std::size_t n = 0;
  if (auto e = source.begin_sequence(n)) return e;
  // Never allocate more than the received payload still holds (a peer's
  // length is not trusted).
  const auto* binary = dynamic_cast<caf::binary_deserializer*>(&source);
  const std::size_t bound = binary != nullptr ? binary->remaining() : kMaxUnboundedLoad;
  if (n > bound) return caf::make_error(caf::sec::end_of_stream);
  TensorBytes fresh = Uninitialized(n);
  if (n > 0) {
    if (auto e = source.apply_raw(n, fresh.rep_->data)) return e;
    g_deserialized.fetch_add(n, std::memory_order_relaxed);
  }
  *this = std::move(fresh);
  return source.end_sequence();
}

Tensor TensorBytes::TakeAsTensor(DataType dtype, const TensorShape& shape) {
  if (rep_ == nullptr) return Tensor(dtype, shape);  // no elements
  if (rep_->borrowed || !unique()) *this = Copy(rep_->data, rep_->size);
  Rep* r = std::exchange(rep_, nullptr);
  return Tensor::FromBuffer(dtype, shape, r->data, &ReleaseBlockData);
}

TensorBytes TensorBytes::ShareBlockOf(const Tensor& tensor) {
  if (tensor.TotalBytes() == 0) return TensorBytes();
  Rep* r = BlockOfTensor(tensor);
  r->refs.fetch_add(1, std::memory_order_relaxed);
  return TensorBytes(r);
}

bool TensorBytes::IsUniqueBlockTensor(const Tensor& tensor) {
  return tensor.TotalBytes() == 0 || BlockOfTensor(tensor)->refs.load(std::memory_order_acquire) == 1;
}

Tensor TensorBytes::BlockCopyOf(const Tensor& tensor) {
  TensorBytes b = Copy(tensor.raw_data(), tensor.TotalBytes());
  return b.TakeAsTensor(tensor.dtype(), tensor.shape());
}

TransportCopyCounters TransportCopyCounters::Snapshot() {
  TransportCopyCounters c;
  c.serialized = g_serialized.load(std::memory_order_relaxed);
  c.deserialized = g_deserialized.load(std::memory_order_relaxed);
  c.copied = g_copied.load(std::memory_order_relaxed);
  c.allocated = g_allocated.load(std::memory_order_relaxed);
  return c;
}

void TransportCopyCounters::CountCopy(uint64_t n) { g_copied.fetch_add(n, std::memory_order_relaxed); }

}  // namespace foreman::internal
