// Tensor: a dtype, a shape and an owned, contiguous, row-major buffer.
//
// The dtypes are TF's, with TF's DataType enum numbers (types.proto), so a
// checkpoint's BundleEntryProto.dtype maps straight onto DataType:
//
//   DataType::kFloat  = 1  float32   (DT_FLOAT)
//   DataType::kDouble = 2  float64   (DT_DOUBLE)
//   DataType::kInt32  = 3  int32     (DT_INT32)
//   DataType::kUInt8  = 4  uint8     (DT_UINT8)
//   DataType::kString = 7  string    (DT_STRING; element type std::string)
//   DataType::kInt64  = 9  int64     (DT_INT64)
//
// Usage:
//   ```cpp
//   foreman::Tensor w(foreman::DataType::kFloat, {784, 10});   // zero-filled
//   auto m = w.matrix<float>();          // StatusOr<Eigen::Map<RowMajor>>
//   if (!m.ok()) return m.status();      // INVALID_ARGUMENT: dtype or rank
//   m->setRandom();
//   ```
//
// Every checked accessor returns INVALID_ARGUMENT naming the expected and the
// actual dtype or shape. A Tensor is a value: copying copies the buffer.
// Thread-compatible: concurrent const use is safe, mutation needs external
// synchronisation.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include <Eigen/Core>

#include "foreman/status.hpp"

namespace foreman {

// -- dtypes --------------------------------------------------------------------

enum class DataType : int {
  kInvalid = 0,
  kFloat = 1,
  kDouble = 2,
  kInt32 = 3,
  kUInt8 = 4,
  kString = 7,
  kInt64 = 9,
};

/// TF's dtype names: "float32", "float64", "int32", "uint8", "string",
/// "int64"; also, for dtypes Foreman cannot hold but TF checkpoints may list,
/// "int16", "int8", "complex64", "bool", "bfloat16", "uint16", "complex128",
/// "float16", "variant", "uint32", "uint64"; else "invalid(<n>)".
std::string DataTypeName(DataType dtype);

/// Bytes per element; 0 for kString and kInvalid.
std::size_t DataTypeSize(DataType dtype);

/// True for the six dtypes above.
bool IsSupportedDataType(int tf_dtype_enum);

/// DataTypeOf<T>::value: the DataType of C++ element type T.
template <class T> struct DataTypeOf;
template <> struct DataTypeOf<float> { static constexpr DataType value = DataType::kFloat; };
template <> struct DataTypeOf<double> { static constexpr DataType value = DataType::kDouble; };
template <> struct DataTypeOf<int32_t> { static constexpr DataType value = DataType::kInt32; };
template <> struct DataTypeOf<uint8_t> { static constexpr DataType value = DataType::kUInt8; };
template <> struct DataTypeOf<std::string> { static constexpr DataType value = DataType::kString; };
template <> struct DataTypeOf<int64_t> { static constexpr DataType value = DataType::kInt64; };

// -- shapes --------------------------------------------------------------------

/// Dimensions, outermost first. The empty shape [] is a scalar (1 element).
class TensorShape {
 public:
  TensorShape() = default;
  /// REQUIRES: every dim >= 0 and the element count fits in int64 (aborts
  /// otherwise: use Create() for untrusted dims).
  TensorShape(std::initializer_list<int64_t> dims);
  explicit TensorShape(std::vector<int64_t> dims);

  /// INVALID_ARGUMENT for a negative dim or an element count over 2^62.
  static StatusOr<TensorShape> Create(std::vector<int64_t> dims);

  int rank() const { return static_cast<int>(dims_.size()); }
  int64_t dim(int i) const { return dims_[static_cast<std::size_t>(i)]; }
  const std::vector<int64_t>& dims() const { return dims_; }
  int64_t num_elements() const { return num_elements_; }

  /// "[2,3]"; "[]" for a scalar.
  std::string ToString() const;

  friend bool operator==(const TensorShape& a, const TensorShape& b) { return a.dims_ == b.dims_; }
  friend bool operator!=(const TensorShape& a, const TensorShape& b) { return !(a == b); }

 private:
  std::vector<int64_t> dims_;
  int64_t num_elements_ = 1;
};

// -- tensors -------------------------------------------------------------------

class Tensor {
 public:
  template <class T>
  using FlatMap = Eigen::Map<Eigen::Matrix<T, Eigen::Dynamic, 1>, Eigen::Unaligned>;
  template <class T>
  using ConstFlatMap = Eigen::Map<const Eigen::Matrix<T, Eigen::Dynamic, 1>, Eigen::Unaligned>;
  template <class T>
  using MatrixMap =
      Eigen::Map<Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>, Eigen::Unaligned>;
  template <class T>
  using ConstMatrixMap = Eigen::Map<const Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>,
                                    Eigen::Unaligned>;

  /// An empty tensor of dtype kInvalid (what a default-constructed slot holds).
  Tensor();
  /// Zero-filled numbers, or empty strings. Buffers are 64-byte aligned.
  /// REQUIRES: dtype is one of the six supported dtypes.
  /// Throws std::bad_alloc when the buffer cannot be allocated: for sizes the
  /// program controls. Sizes from files or users go through Create().
  Tensor(DataType dtype, TensorShape shape);

  /// As the constructor, for untrusted dtypes and shapes:
  ///   INVALID_ARGUMENT    an unsupported dtype
  ///   RESOURCE_EXHAUSTED  "cannot allocate <n> bytes for <dtype><shape>"
  static StatusOr<Tensor> Create(DataType dtype, TensorShape shape);

  /// A numeric tensor over a buffer allocated elsewhere (a GPU device's
  /// page-locked host memory: compute::Device::AllocateHostTensor): `data`
  /// holds num_elements() * DataTypeSize(dtype) bytes, aligned to 64 bytes,
  /// and `release(data)` is called once when the tensor drops it (destroyed,
  /// assigned a different dtype or shape, moved from and destroyed). Copies
  /// of the tensor allocate their own ordinary buffer; assigning a tensor of
  /// the same dtype and shape copies into this buffer. REQUIRES: a numeric
  /// dtype, `data` non-null unless the tensor has no elements.
  static Tensor FromBuffer(DataType dtype, TensorShape shape, char* data, void (*release)(char* data));

  Tensor(const Tensor& other);
  Tensor& operator=(const Tensor& other);
  Tensor(Tensor&& other) noexcept;
  Tensor& operator=(Tensor&& other) noexcept;
  ~Tensor();

  /// A scalar (shape []) holding `value`.
  template <class T>
  static Tensor Scalar(T value) {
    Tensor t(DataTypeOf<T>::value, TensorShape{});
    *t.data<T>() = std::move(value);
    return t;
  }

  /// A tensor of `shape` holding `values` in row-major order.
  /// INVALID_ARGUMENT when values.size() != shape.num_elements().
  template <class T>
  static StatusOr<Tensor> FromVector(const std::vector<T>& values, TensorShape shape) {
    if (static_cast<int64_t>(values.size()) != shape.num_elements()) {
      return ElementCountMismatch(static_cast<int64_t>(values.size()), shape);
    }
    Tensor t(DataTypeOf<T>::value, std::move(shape));
    std::copy(values.begin(), values.end(), t.data<T>());
    return t;
  }

  DataType dtype() const { return dtype_; }
  const TensorShape& shape() const { return shape_; }
  int64_t num_elements() const { return shape_.num_elements(); }
  /// Bytes of the numeric buffer; for strings, the sum of the string sizes.
  std::size_t TotalBytes() const;

  /// INVALID_ARGUMENT "expected dtype float32, got int64" unless dtype()
  /// is DataTypeOf<T>.
  template <class T>
  Status CheckType() const { return CheckDataType(DataTypeOf<T>::value); }
  Status CheckDataType(DataType expected) const;
  /// INVALID_ARGUMENT "expected shape [2,3], got [3,2]" unless equal.
  Status CheckShape(const TensorShape& expected) const;

  /// The elements as an Eigen column vector of num_elements().
  template <class T>
  StatusOr<FlatMap<T>> flat() {
    FOREMAN_RETURN_IF_ERROR(CheckType<T>());
    return FlatMap<T>(data<T>(), num_elements());
  }
  template <class T>
  StatusOr<ConstFlatMap<T>> flat() const {
    FOREMAN_RETURN_IF_ERROR(CheckType<T>());
    return ConstFlatMap<T>(data<T>(), num_elements());
  }
  /// A rank-2 tensor as a row-major Eigen matrix. INVALID_ARGUMENT for another
  /// dtype or rank.
  template <class T>
  StatusOr<MatrixMap<T>> matrix() {
    FOREMAN_RETURN_IF_ERROR(CheckType<T>());
    FOREMAN_RETURN_IF_ERROR(CheckRank(2));
    return MatrixMap<T>(data<T>(), shape_.dim(0), shape_.dim(1));
  }
  template <class T>
  StatusOr<ConstMatrixMap<T>> matrix() const {
    FOREMAN_RETURN_IF_ERROR(CheckType<T>());
    FOREMAN_RETURN_IF_ERROR(CheckRank(2));
    return ConstMatrixMap<T>(data<T>(), shape_.dim(0), shape_.dim(1));
  }
  /// The single element of a rank-0 tensor. INVALID_ARGUMENT for another
  /// dtype or a non-scalar shape.
  template <class T>
  StatusOr<T> scalar() const {
    FOREMAN_RETURN_IF_ERROR(CheckType<T>());
    FOREMAN_RETURN_IF_ERROR(CheckShape(TensorShape{}));
    return *data<T>();
  }
  /// INVALID_ARGUMENT naming the expected and actual rank.
  Status CheckRank(int expected) const;

  /// Unchecked element pointer for hot loops.
  /// REQUIRES: dtype() == DataTypeOf<T>::value (asserted in debug builds).
  template <class T>
  T* data() {
    CheckTypeDebug(DataTypeOf<T>::value);
    return static_cast<T*>(element_data());
  }
  template <class T>
  const T* data() const {
    CheckTypeDebug(DataTypeOf<T>::value);
    return static_cast<const T*>(const_cast<Tensor*>(this)->element_data());
  }

  /// The numeric buffer as bytes (num_elements() * DataTypeSize()); nullptr
  /// for strings and kInvalid.
  char* raw_data();
  const char* raw_data() const;

  /// Gives the tensor a new shape with the same element count; INVALID_ARGUMENT
  /// naming both shapes otherwise.
  Status Reshape(TensorShape new_shape);

  /// Same dtype, shape and elements (bitwise for floats: NaN == NaN).
  bool Equals(const Tensor& other) const;

  /// "float32[2,3] {1, 2, 3, 4, 5, 6}", eliding after `max_entries` elements.
  std::string DebugString(int max_entries = 6) const;

 private:
  static Status ElementCountMismatch(int64_t count, const TensorShape& shape);
  void CheckTypeDebug(DataType expected) const;
  void* element_data();  // the numeric buffer or strings_.data()
  void Allocate();

  DataType dtype_ = DataType::kInvalid;
  TensorShape shape_;
  struct AlignedFree {
    AlignedFree() noexcept : release(nullptr) {}
    explicit AlignedFree(void (*r)(char*)) noexcept : release(r) {}
    void (*release)(char*);  // FromBuffer's; null: our aligned malloc
    void operator()(char* p) const;
  };
  std::unique_ptr<char, AlignedFree> buffer_;   // numeric dtypes
  std::vector<std::string> strings_;            // kString
};

}  // namespace foreman
