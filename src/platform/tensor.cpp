#include "foreman/tensor.hpp"

#include <cassert>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <new>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace foreman {

namespace {

constexpr std::size_t kAlignment = 64;
constexpr int64_t kMaxElements = int64_t{1} << 62;

}  // namespace

// -- dtypes --------------------------------------------------------------------

std::string DataTypeName(DataType dtype) {
  // By TF enum number: the supported dtypes and, so that tools can name what
  // a TF checkpoint holds, TF's other dtypes (types.proto).
  switch (static_cast<int>(dtype)) {
    case 1: return "float32";
    case 2: return "float64";
    case 3: return "int32";
    case 4: return "uint8";
    case 5: return "int16";
    case 6: return "int8";
    case 7: return "string";
    case 8: return "complex64";
    case 9: return "int64";
    case 10: return "bool";
    case 14: return "bfloat16";
    case 17: return "uint16";
    case 18: return "complex128";
    case 19: return "float16";
    case 21: return "variant";
    case 22: return "uint32";
    case 23: return "uint64";
    default: break;
  }
  return absl::StrCat("invalid(", static_cast<int>(dtype), ")");
}

std::size_t DataTypeSize(DataType dtype) {
  switch (dtype) {
    case DataType::kFloat: return sizeof(float);
    case DataType::kDouble: return sizeof(double);
    case DataType::kInt32: return sizeof(int32_t);
    case DataType::kUInt8: return sizeof(uint8_t);
    case DataType::kInt64: return sizeof(int64_t);
    case DataType::kString:
    case DataType::kInvalid: break;
  }
  return 0;
}

bool IsSupportedDataType(int tf_dtype_enum) {
  switch (static_cast<DataType>(tf_dtype_enum)) {
    case DataType::kFloat:
    case DataType::kDouble:
    case DataType::kInt32:
    case DataType::kUInt8:
    case DataType::kString:
    case DataType::kInt64: return true;
    case DataType::kInvalid: break;
  }
  return false;
}

// -- shapes --------------------------------------------------------------------

StatusOr<TensorShape> TensorShape::Create(std::vector<int64_t> dims) {
  int64_t n = 1;
  for (std::size_t i = 0; i < dims.size(); ++i) {
    if (dims[i] < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("dimension ", i, " of shape [", absl::StrJoin(dims, ","), "] is negative"));
    }
    if (dims[i] != 0 && n > kMaxElements / dims[i]) {
      return absl::InvalidArgumentError(
          absl::StrCat("shape [", absl::StrJoin(dims, ","), "] has more than 2^62 elements"));
    }
    n *= dims[i];
  }
  TensorShape shape;
  shape.dims_ = std::move(dims);
  shape.num_elements_ = n;
  return shape;
}

TensorShape::TensorShape(std::initializer_list<int64_t> dims) : TensorShape(std::vector<int64_t>(dims)) {}

TensorShape::TensorShape(std::vector<int64_t> dims) {
  auto shape = Create(std::move(dims));
  if (!shape.ok()) {
    // A programmer error (literal dims); untrusted dims go through Create().
    std::fprintf(stderr, "foreman::TensorShape: %s\n", std::string(shape.status().message()).c_str());
    std::abort();
  }
  *this = *std::move(shape);
}

std::string TensorShape::ToString() const { return absl::StrCat("[", absl::StrJoin(dims_, ","), "]"); }

// -- tensors -------------------------------------------------------------------

namespace {

// kAlignment-aligned buffers from plain malloc: glibc's memalign (behind the
// aligned operator new) costs about ten times malloc for the small tensors a
// step creates every run (scalars: global_step, a loss). The pointer malloc
// returned is kept just below the aligned one (malloc's 16-byte alignment
// leaves at least 16 bytes there). nullptr when out of memory.
char* AllocateAligned(std::size_t bytes) {
  static_assert(kAlignment >= 16 && (kAlignment & (kAlignment - 1)) == 0, "kAlignment: a power of two >= 16");
  if (bytes > SIZE_MAX - kAlignment) return nullptr;
  void* raw = std::malloc(bytes + kAlignment);
  if (raw == nullptr) return nullptr;
  const auto aligned = (reinterpret_cast<std::uintptr_t>(raw) + kAlignment) & ~(std::uintptr_t{kAlignment} - 1);
  reinterpret_cast<void**>(aligned)[-1] = raw;
  return reinterpret_cast<char*>(aligned);
}

}  // namespace

void Tensor::AlignedFree::operator()(char* p) const {
  if (p == nullptr) return;
  if (release != nullptr) {
    release(p);
  } else {
    std::free(reinterpret_cast<void**>(p)[-1]);
  }
}

Tensor Tensor::FromBuffer(DataType dtype, TensorShape shape, char* data, void (*release)(char* data)) {
  assert(IsSupportedDataType(static_cast<int>(dtype)) && dtype != DataType::kString &&
         "Tensor::FromBuffer: a numeric dtype");
  assert(release != nullptr && "Tensor::FromBuffer: a release function");
  Tensor t;
  t.dtype_ = dtype;
  t.shape_ = std::move(shape);
  t.buffer_ = std::unique_ptr<char, AlignedFree>(data, AlignedFree{release});
  assert((data != nullptr || t.shape_.num_elements() == 0) && "Tensor::FromBuffer: data");
  return t;
}

Tensor::Tensor() = default;

Tensor::Tensor(DataType dtype, TensorShape shape) : dtype_(dtype), shape_(std::move(shape)) {
  assert(IsSupportedDataType(static_cast<int>(dtype)) && "Tensor: unsupported dtype");
  Allocate();
}

StatusOr<Tensor> Tensor::Create(DataType dtype, TensorShape shape) {
  if (!IsSupportedDataType(static_cast<int>(dtype))) {
    return absl::InvalidArgumentError(absl::StrCat("cannot create a tensor of dtype ", DataTypeName(dtype),
                                                   shape.ToString(), ": unsupported dtype"));
  }
  try {
    return Tensor(dtype, shape);   // a copy: `shape` names the failure
  } catch (const std::bad_alloc&) {
    const auto n = static_cast<uint64_t>(shape.num_elements());
    const uint64_t elem = dtype == DataType::kString ? sizeof(std::string) : DataTypeSize(dtype);
    const std::string bytes = n > UINT64_MAX / elem ? absl::StrCat(n, " x ", elem) : absl::StrCat(n * elem);
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot allocate ", bytes, " bytes for ", DataTypeName(dtype), shape.ToString()));
  }
}

void Tensor::Allocate() {
  const auto n = static_cast<uint64_t>(shape_.num_elements());
  if (dtype_ == DataType::kString) {
    if (n > strings_.max_size()) throw std::bad_alloc();   // not std::length_error
    strings_.assign(static_cast<std::size_t>(n), std::string());
    return;
  }
  const std::size_t elem = DataTypeSize(dtype_);
  if (elem != 0 && n > SIZE_MAX / elem) throw std::bad_array_new_length();
  const std::size_t bytes = static_cast<std::size_t>(n) * elem;
  if (bytes == 0) {
    buffer_.reset();
    return;
  }
  // A null check + throw here: sanitizer allocators (allocator_may_return_null=1)
  // report a failed throwing new as fatal, a failed malloc as nullptr.
  buffer_ = std::unique_ptr<char, AlignedFree>(AllocateAligned(bytes));
  if (buffer_ == nullptr) throw std::bad_alloc();
  std::memset(buffer_.get(), 0, bytes);
}

Tensor::Tensor(const Tensor& other) : dtype_(other.dtype_), shape_(other.shape_), strings_(other.strings_) {
  if (dtype_ != DataType::kString && dtype_ != DataType::kInvalid) {
    // As Allocate(), without zero-filling bytes that are copied over at once
    // (a checkpoint's snapshot copies every variable on the training thread).
    const std::size_t bytes = other.TotalBytes();
    if (bytes > 0 && other.buffer_) {
      buffer_ = std::unique_ptr<char, AlignedFree>(AllocateAligned(bytes));
      if (buffer_ == nullptr) throw std::bad_alloc();
      std::memcpy(buffer_.get(), other.buffer_.get(), bytes);
    }
  }
}

Tensor& Tensor::operator=(const Tensor& other) {
  if (this == &other) return *this;
  // Same numeric dtype and shape: copy into the buffer this tensor already
  // has (hooks' results are assigned every step) instead of reallocating.
  if (dtype_ == other.dtype_ && dtype_ != DataType::kString && dtype_ != DataType::kInvalid &&
      shape_ == other.shape_ && buffer_ && other.buffer_) {
    std::memcpy(buffer_.get(), other.buffer_.get(), TotalBytes());
    return *this;
  }
  *this = Tensor(other);
  return *this;
}

Tensor::Tensor(Tensor&& other) noexcept
    : dtype_(other.dtype_),
      shape_(std::move(other.shape_)),
      buffer_(std::move(other.buffer_)),
      strings_(std::move(other.strings_)) {
  other.dtype_ = DataType::kInvalid;
  other.shape_ = TensorShape();
}

Tensor& Tensor::operator=(Tensor&& other) noexcept {
  if (this != &other) {
    dtype_ = other.dtype_;
    shape_ = std::move(other.shape_);
    buffer_ = std::move(other.buffer_);
    strings_ = std::move(other.strings_);
    other.dtype_ = DataType::kInvalid;
    other.shape_ = TensorShape();
  }
  return *this;
}

Tensor::~Tensor() = default;

std::size_t Tensor::TotalBytes() const {
  if (dtype_ == DataType::kString) {
    std::size_t n = 0;
    for (const auto& s : strings_) n += s.size();
    return n;
  }
  return static_cast<std::size_t>(shape_.num_elements()) * DataTypeSize(dtype_);
}

Status Tensor::CheckDataType(DataType expected) const {
  if (dtype_ == expected) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("expected dtype ", DataTypeName(expected), ", got ", DataTypeName(dtype_)));
}

Status Tensor::CheckShape(const TensorShape& expected) const {
  if (shape_ == expected) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("expected shape ", expected.ToString(), ", got ", shape_.ToString()));
}

Status Tensor::CheckRank(int expected) const {
  if (shape_.rank() == expected) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("expected rank ", expected, ", got rank ", shape_.rank(),
                                                 " (shape ", shape_.ToString(), ")"));
}

Status Tensor::ElementCountMismatch(int64_t count, const TensorShape& shape) {
  return absl::InvalidArgumentError(absl::StrCat("expected ", shape.num_elements(), " values for shape ",
                                                 shape.ToString(), ", got ", count));
}

void Tensor::CheckTypeDebug([[maybe_unused]] DataType expected) const {
  assert(dtype_ == expected && "Tensor::data<T>(): T does not match dtype()");
}

void* Tensor::element_data() {
  if (dtype_ == DataType::kString) return strings_.data();
  return buffer_.get();
}

char* Tensor::raw_data() { return dtype_ == DataType::kString ? nullptr : buffer_.get(); }
const char* Tensor::raw_data() const { return dtype_ == DataType::kString ? nullptr : buffer_.get(); }

Status Tensor::Reshape(TensorShape new_shape) {
  if (new_shape.num_elements() != shape_.num_elements()) {
    return absl::InvalidArgumentError(absl::StrCat("cannot reshape ", shape_.ToString(), " (",
                                                   shape_.num_elements(), " elements) to ", new_shape.ToString(),
                                                   " (", new_shape.num_elements(), " elements)"));
  }
  shape_ = std::move(new_shape);
  return absl::OkStatus();
}

bool Tensor::Equals(const Tensor& other) const {
  if (dtype_ != other.dtype_ || shape_ != other.shape_) return false;
  if (dtype_ == DataType::kString) return strings_ == other.strings_;
  const std::size_t bytes = TotalBytes();
  return bytes == 0 || std::memcmp(buffer_.get(), other.buffer_.get(), bytes) == 0;
}

namespace {

template <class T>
void AppendElements(const T* p, int64_t n, int64_t shown, std::string* out) {
  for (int64_t i = 0; i < shown; ++i) {
    if (i > 0) absl::StrAppend(out, ", ");
    if constexpr (std::is_same_v<T, std::string>) {
      absl::StrAppend(out, "\"", p[i], "\"");
    } else if constexpr (std::is_same_v<T, uint8_t>) {
      absl::StrAppend(out, static_cast<int>(p[i]));
    } else {
      absl::StrAppend(out, p[i]);
    }
  }
  if (shown < n) absl::StrAppend(out, ", ...");
}

}  // namespace

std::string Tensor::DebugString(int max_entries) const {
  std::string out = absl::StrCat(DataTypeName(dtype_), shape_.ToString(), " {");
  const int64_t n = num_elements();
  const int64_t shown = std::min<int64_t>(n, std::max(0, max_entries));
  switch (dtype_) {
    case DataType::kFloat: AppendElements(data<float>(), n, shown, &out); break;
    case DataType::kDouble: AppendElements(data<double>(), n, shown, &out); break;
    case DataType::kInt32: AppendElements(data<int32_t>(), n, shown, &out); break;
    case DataType::kUInt8: AppendElements(data<uint8_t>(), n, shown, &out); break;
    case DataType::kInt64: AppendElements(data<int64_t>(), n, shown, &out); break;
    case DataType::kString: AppendElements(data<std::string>(), n, shown, &out); break;
    case DataType::kInvalid: break;
  }
  absl::StrAppend(&out, "}");
  return out;
}

}  // namespace foreman
