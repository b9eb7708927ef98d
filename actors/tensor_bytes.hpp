// TensorBytes: a tensor's bytes as they cross a cluster's links (issue 27
// point 2), shared instead of copied. A reference-counted, copy-on-write
// byte buffer with a CAF 0.17 inspect() that writes the length and the bytes
// in ONE apply_raw straight from the buffer (serializing copies them into
// the BASP write buffer: the one copy of the sending side) and reads them
// with ONE apply_raw into a fresh uninitialized buffer (the one copy of the
// receiving side; never zero-filled first, and never larger than what the
// received payload still holds: a length beyond it is refused before any
// allocation).
//
// Three kinds of buffer:
//  - a block: 64-byte aligned memory from a process-wide pool (freed blocks
//    of the same size are kept and reused: a step's 0.8 MB of tensors are
//    not allocated and page-faulted anew each step). A block can become a
//    foreman::Tensor's buffer without a copy (AdoptInto / TensorOverBlock):
//    the tensor then holds one reference, and the block returns to the pool
//    when the last holder drops it;
//  - a borrowed view (Borrow): someone else's memory, not owned. The lender
//    must keep it alive and unchanged until every copy of the view is gone
//    (WaitUntilReturned); whoever keeps bytes beyond the request that
//    carried them calls Detach() first (a private block copy);
//  - empty (no bytes).
//
// Copy-on-write: copies share the buffer; mutable_data() gives the caller
// its own block first when the buffer is shared or borrowed. unique() is an
// acquire load of the count, and every release is an acq_rel decrement, so
// a holder that sees unique() == true may write: every other holder's reads
// (CAF's serialization on the multiplexer thread included) happened before.
//
// Counters (TransportCopyCounters): the bytes serialized, deserialized and
// copied by this file's explicit copies (Copy, Detach, mutable_data's
// copy-on-write, CopyOrAdopt's copy), process-wide, for the benchmark's
// "bytes copied per step". CAF's own buffers are not counted (they copy
// nothing more: BASP's write buffer is swapped into the socket's, and its
// read buffer is deserialized where it is, on the middleman's thread, because
// ConfigureClusterNetwork runs no BASP workers — a worker would first copy
// each received payload into its own buffer, basp::worker::launch).
//
// Thread-safety: one TensorBytes object is used by one thread at a time;
// different copies (sharing a buffer) may be used and destroyed on
// different threads. Internal (actors/ only).
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <utility>

#include <caf/fwd.hpp>
#include <caf/meta/type_name.hpp>

#include "foreman/status.hpp"
#include "foreman/tensor.hpp"

namespace foreman::internal {

class TensorBytes {
 public:
  TensorBytes() = default;
  /// A private block holding a copy of `n` bytes at `data` (counted copied).
  static TensorBytes Copy(const void* data, std::size_t n);
  /// A block of `n` uninitialized bytes (not counted).
  static TensorBytes Uninitialized(std::size_t n);
  /// A view of `n` bytes at `data`, which the caller owns (see the header).
  static TensorBytes Borrow(const void* data, std::size_t n);

  TensorBytes(const TensorBytes& other) noexcept;
  TensorBytes& operator=(const TensorBytes& other) noexcept;
  TensorBytes(TensorBytes&& other) noexcept : rep_(std::exchange(other.rep_, nullptr)) {}
  TensorBytes& operator=(TensorBytes&& other) noexcept;
  ~TensorBytes() { Release(); }

  std::size_t size() const;
  bool empty() const { return size() == 0; }
  const char* data() const;
  /// The bytes, for writing: first a private block copy when shared or
  /// borrowed (copy-on-write).
  char* mutable_data();
  /// True when this object is the buffer's only holder (acquire).
  bool unique() const;
  bool borrowed() const;
  /// A private block copy in place of a borrowed view (no-op otherwise).
  void Detach();
  /// As std::string's: shrink (keeps the bytes) or grow (zero-fills the
  /// new ones), copy-on-write. For tests that truncate a payload.
  void resize(std::size_t n);
  void pop_back() { resize(size() - 1); }

  /// Waits until this object is the only holder of its buffer again (every
  /// copy handed to CAF destroyed), sleeping 20 us to 1 ms between looks,
  /// for at most `timeout`. False on timeout.
  bool WaitUntilReturned(std::chrono::milliseconds timeout) const;

  /// Bytes equal (for tests).
  friend bool operator==(const TensorBytes& a, const TensorBytes& b);
  friend bool operator!=(const TensorBytes& a, const TensorBytes& b) { return !(a == b); }

  /// CAF 0.17 (de)serialization, called by inspect() below.
  caf::error Save(caf::serializer& sink);
  caf::error Load(caf::deserializer& source);

  /// `dtype` `shape` over these bytes (REQUIRES: size() == the shape's
  /// bytes, a numeric dtype). When this object is the only holder of a
  /// block, the tensor takes the block over without a copy and this object
  /// becomes empty; otherwise the tensor gets a copy (counted).
  Tensor TakeAsTensor(DataType dtype, const TensorShape& shape);

  // "Block tensors": tensors made by TakeAsTensor or BlockCopyOf, whose
  // buffer is a block. REQUIRES for the next two: `tensor` is one (the
  // caller keeps track; nothing can tell from a Tensor).
  /// The bytes of block tensor `tensor`, shared: no copy.
  static TensorBytes ShareBlockOf(const Tensor& tensor);
  /// True when block tensor `tensor`'s block has no other holder: it may
  /// be written.
  static bool IsUniqueBlockTensor(const Tensor& tensor);
  /// A block tensor holding a copy of `tensor` (counted).
  static Tensor BlockCopyOf(const Tensor& tensor);

  struct Rep;  // tensor_bytes.cpp

 private:
  explicit TensorBytes(Rep* rep) : rep_(rep) {}
  void Release() noexcept;
  Rep* rep_ = nullptr;
};

/// Process-wide byte counts of TensorBytes (see the header). Relaxed
/// atomics; Snapshot() for reporting.
struct TransportCopyCounters {
  uint64_t serialized = 0;    // written into CAF's buffers by Save
  uint64_t deserialized = 0;  // read out of CAF's buffers by Load
  uint64_t copied = 0;        // explicit copies (Copy, Detach, copy-on-write, TakeAsTensor's copy)
  uint64_t allocated = 0;     // blocks' bytes taken from the pool or the allocator (Uninitialized)
  static TransportCopyCounters Snapshot();
  /// Adds `n` to `copied` (a caller's own copy into or out of a message).
  static void CountCopy(uint64_t n);
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, TensorBytes& x) {
  if constexpr (std::is_base_of_v<caf::serializer, Inspector>) {
    return x.Save(f);
  } else if constexpr (std::is_base_of_v<caf::deserializer, Inspector>) {
    return x.Load(f);
  } else {
    uint64_t bytes = x.size();  // printing: the size only
    return f(caf::meta::type_name("foreman.TensorBytes"), bytes);
  }
}

}  // namespace foreman::internal
