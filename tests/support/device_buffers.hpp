// Device buffers for the tests and benchmarks that drive a compute::Device
// directly (cuda_step_test, kernel_bench): allocations freed together when the
// owner goes out of scope, with uploads and downloads. A failed device call is
// handed to the owner's `on_error` (doctest's FAIL in a test, DieOn in a
// benchmark), which must not return.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "foreman/compute.hpp"
#include "foreman/status.hpp"

namespace foreman::testing {

class DeviceBuffers {
 public:
  /// `on_error(what, status)` is called with the failed call's name; it must
  /// throw or exit. `device` must outlive this object.
  using OnError = std::function<void(const std::string& what, const Status& status)>;
  DeviceBuffers(compute::Device& device, OnError on_error)
      : device_(device), on_error_(std::move(on_error)) {}
  DeviceBuffers(const DeviceBuffers&) = delete;
  DeviceBuffers& operator=(const DeviceBuffers&) = delete;
  ~DeviceBuffers() {
    for (void* p : ptrs_) device_.Deallocate(p);
  }

  /// `n` elements of uninitialised device memory.
  template <class T>
  T* Uninitialized(int64_t n) {
    auto p = device_.Allocate(n * static_cast<int64_t>(sizeof(T)));
    if (!p.ok()) Fail("Allocate", p.status());
    ptrs_.push_back(*p);
    return static_cast<T*>(*p);
  }
  /// `n` zero elements.
  template <class T>
  T* Zeros(int64_t n) {
    T* p = Uninitialized<T>(n);  // a negative n fails here, through on_error
    const std::vector<T> zeros(static_cast<std::size_t>(n));
    Check(device_.CopyToDevice(p, zeros.data(), n * static_cast<int64_t>(sizeof(T))), "CopyToDevice");
    return p;
  }
  /// A device copy of `v`.
  template <class T>
  T* Put(const std::vector<T>& v) {
    T* p = Uninitialized<T>(static_cast<int64_t>(v.size()));
    Check(device_.CopyToDevice(p, v.data(), static_cast<int64_t>(v.size() * sizeof(T))),
          "CopyToDevice");
    return p;
  }
  /// A host copy of `n` elements at device pointer `p`.
  template <class T>
  std::vector<T> Get(const T* p, int64_t n) {
    std::vector<T> v(static_cast<std::size_t>(n));
    Check(device_.CopyToHost(v.data(), p, n * static_cast<int64_t>(sizeof(T))), "CopyToHost");
    return v;
  }

 private:
  void Check(const Status& s, const char* what) {
    if (!s.ok()) Fail(what, s);
  }
  [[noreturn]] void Fail(const char* what, const Status& s) {
    on_error_(what, s);
    std::abort();  // on_error_ broke its contract by returning
  }

  compute::Device& device_;
  OnError on_error_;
  std::vector<void*> ptrs_;
};

}  // namespace foreman::testing
