// foreman::Tensor: dtypes with TF's enum numbers, shapes, owned buffers,
// Eigen views, and INVALID_ARGUMENT naming expected vs actual.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <fstream>
#include <limits>
#include <new>
#include <string>
#include <utility>

#include "foreman/tensor.hpp"
#include "support/test_util.hpp"

using foreman::DataType;
using foreman::Tensor;
using foreman::TensorShape;

namespace {

std::string Message(const absl::Status& s) { return std::string(s.message()); }


}  // namespace

// Under ASan a failed allocation must come back as nullptr (then
// std::bad_alloc) instead of ending the test.
extern "C" const char* __asan_default_options() { return "allocator_may_return_null=1"; }

TEST_CASE("dtype enum values are TF's DataType numbers and names are TF's") {
  CHECK(static_cast<int>(DataType::kFloat) == 1);
  CHECK(static_cast<int>(DataType::kDouble) == 2);
  CHECK(static_cast<int>(DataType::kInt32) == 3);
  CHECK(static_cast<int>(DataType::kUInt8) == 4);
  CHECK(static_cast<int>(DataType::kString) == 7);
  CHECK(static_cast<int>(DataType::kInt64) == 9);
  CHECK(foreman::DataTypeName(DataType::kFloat) == "float32");
  CHECK(foreman::DataTypeName(DataType::kInt64) == "int64");
  CHECK(foreman::DataTypeName(static_cast<DataType>(19)) == "float16");   // TF's name, though unsupported
  CHECK(foreman::DataTypeSize(DataType::kDouble) == 8);
  CHECK(foreman::DataTypeSize(DataType::kUInt8) == 1);
  CHECK(foreman::DataTypeSize(DataType::kString) == 0);
  CHECK(foreman::IsSupportedDataType(9));
  CHECK_FALSE(foreman::IsSupportedDataType(19));  // DT_HALF
}

TEST_CASE("shapes count elements; a scalar has one; Create rejects negative and huge dims") {
  CHECK(TensorShape{}.num_elements() == 1);
  CHECK(TensorShape{}.ToString() == "[]");
  TensorShape s{2, 3, 4};
  CHECK(s.rank() == 3);
  CHECK(s.num_elements() == 24);
  CHECK(s.ToString() == "[2,3,4]");
  CHECK(TensorShape{0, 5}.num_elements() == 0);
  auto neg = TensorShape::Create({2, -1});
  REQUIRE_FALSE(neg.ok());
  CHECK(neg.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(Message(neg.status()).find("negative") != std::string::npos);
  auto huge = TensorShape::Create({int64_t{1} << 40, int64_t{1} << 40});
  CHECK(huge.status().code() == absl::StatusCode::kInvalidArgument);
}

TEST_CASE("a new tensor is zero-filled and 64-byte aligned; strings start empty") {
  Tensor t(DataType::kDouble, {3, 5});
  CHECK(t.num_elements() == 15);
  CHECK(t.TotalBytes() == 15 * sizeof(double));
  CHECK(reinterpret_cast<std::uintptr_t>(t.raw_data()) % 64 == 0);
  for (int i = 0; i < 15; ++i) CHECK(t.data<double>()[i] == 0.0);
  Tensor s(DataType::kString, {2});
  CHECK(s.data<std::string>()[0].empty());
  CHECK(s.raw_data() == nullptr);
}

TEST_CASE("copies are deep and moves leave an empty tensor") {
  auto a = Tensor::FromVector<int32_t>({1, 2, 3, 4}, {2, 2});
  REQUIRE(a.ok());
  Tensor b = *a;
  b.data<int32_t>()[0] = 99;
  CHECK(a->data<int32_t>()[0] == 1);
  CHECK_FALSE(b.Equals(*a));
  Tensor c = std::move(b);
  CHECK(c.data<int32_t>()[0] == 99);
  CHECK(b.dtype() == DataType::kInvalid);  // NOLINT(bugprone-use-after-move): documented state
  Tensor strings(DataType::kString, {2});
  strings.data<std::string>()[1] = "hello";
  Tensor strings_copy = strings;
  strings.data<std::string>()[1] = "changed";
  CHECK(strings_copy.data<std::string>()[1] == "hello");
  CHECK(strings_copy.TotalBytes() == 5);
}

TEST_CASE("FromVector rejects a value count that does not match the shape") {
  auto t = Tensor::FromVector<float>({1, 2, 3}, {2, 2});
  REQUIRE_FALSE(t.ok());
  CHECK(t.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(Message(t.status()) == "expected 4 values for shape [2,2], got 3");
}

TEST_CASE("matrix() is a row-major Eigen view that writes through to the buffer") {
  Tensor t(DataType::kFloat, {2, 3});
  auto m = t.matrix<float>();
  REQUIRE(m.ok());
  CHECK(m->rows() == 2);
  CHECK(m->cols() == 3);
  (*m)(1, 0) = 5.0f;
  CHECK(t.data<float>()[3] == 5.0f);  // row 1, column 0 in row-major order
  auto flat = t.flat<float>();
  REQUIRE(flat.ok());
  CHECK(flat->size() == 6);
  CHECK((*flat)(3) == 5.0f);
  Eigen::MatrixXf product = (*m).transpose() * (*m);
  CHECK(product(0, 0) == 25.0f);
}

TEST_CASE("a dtype mismatch is INVALID_ARGUMENT naming expected and actual") {
  Tensor t(DataType::kInt64, {4});
  auto f = t.flat<float>();
  REQUIRE_FALSE(f.ok());
  CHECK(f.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(Message(f.status()) == "expected dtype float32, got int64");
  CHECK(Message(t.scalar<double>().status()) == "expected dtype float64, got int64");
}

TEST_CASE("a shape or rank mismatch is INVALID_ARGUMENT naming expected and actual") {
  Tensor t(DataType::kFloat, {6});
  auto m = t.matrix<float>();
  REQUIRE_FALSE(m.ok());
  CHECK(m.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(Message(m.status()) == "expected rank 2, got rank 1 (shape [6])");
  CHECK(Message(t.CheckShape({2, 3})) == "expected shape [2,3], got [6]");
  CHECK(Message(t.scalar<float>().status()) == "expected shape [], got [6]");
  CHECK(t.CheckShape({6}).ok());
}

TEST_CASE("Reshape keeps the data when the element count matches and refuses otherwise") {
  auto t = Tensor::FromVector<double>({1, 2, 3, 4, 5, 6}, {6});
  REQUIRE(t.ok());
  REQUIRE(t->Reshape({3, 2}).ok());
  CHECK((*t->matrix<double>())(2, 1) == 6.0);
  absl::Status bad = t->Reshape({4, 2});
  CHECK(bad.code() == absl::StatusCode::kInvalidArgument);
  CHECK(Message(bad) == "cannot reshape [3,2] (6 elements) to [4,2] (8 elements)");
  CHECK(t->shape() == TensorShape{3, 2});
}

TEST_CASE("Scalar and scalar() round-trip every dtype") {
  CHECK(*Tensor::Scalar<float>(1.5f).scalar<float>() == 1.5f);
  CHECK(*Tensor::Scalar<double>(-2.25).scalar<double>() == -2.25);
  CHECK(*Tensor::Scalar<int32_t>(-7).scalar<int32_t>() == -7);
  CHECK(*Tensor::Scalar<int64_t>(int64_t{1} << 40).scalar<int64_t>() == (int64_t{1} << 40));
  CHECK(*Tensor::Scalar<uint8_t>(200).scalar<uint8_t>() == 200);
  CHECK(*Tensor::Scalar<std::string>("text").scalar<std::string>() == "text");
}

TEST_CASE("Equals compares dtype, shape and bits; NaN equals NaN") {
  auto nan = std::numeric_limits<float>::quiet_NaN();
  Tensor a = Tensor::Scalar<float>(nan);
  Tensor b = Tensor::Scalar<float>(nan);
  CHECK(a.Equals(b));
  CHECK_FALSE(Tensor::Scalar<float>(1).Equals(Tensor::Scalar<double>(1)));
  CHECK_FALSE(Tensor(DataType::kFloat, {2, 3}).Equals(Tensor(DataType::kFloat, {3, 2})));
}

TEST_CASE("DebugString shows dtype, shape and the first elements") {
  auto t = Tensor::FromVector<int32_t>({1, 2, 3, 4, 5, 6, 7, 8}, {2, 4});
  CHECK(t->DebugString(3) == "int32[2,4] {1, 2, 3, ...}");
  CHECK(Tensor::Scalar<uint8_t>(7).DebugString() == "uint8[] {7}");
  CHECK(Tensor::Scalar<std::string>("a").DebugString() == "string[] {\"a\"}");
}

TEST_CASE("DataTypeName names TF's other dtypes too; only the six are supported") {
  const std::pair<int, const char*> names[] = {
      {5, "int16"},      {6, "int8"},     {8, "complex64"}, {10, "bool"},   {14, "bfloat16"}, {17, "uint16"},
      {18, "complex128"}, {19, "float16"}, {22, "uint32"},   {23, "uint64"},
  };
  for (const auto& [number, name] : names) {
    CAPTURE(number);
    CHECK(foreman::DataTypeName(static_cast<DataType>(number)) == name);
    CHECK_FALSE(foreman::IsSupportedDataType(number));
  }
  CHECK(foreman::DataTypeName(static_cast<DataType>(99)) == "invalid(99)");
  CHECK(foreman::DataTypeName(DataType::kInvalid) == "invalid(0)");
}

TEST_CASE("Tensor::Create: INVALID_ARGUMENT for an unsupported dtype, RESOURCE_EXHAUSTED when too big") {
  auto ok = Tensor::Create(DataType::kDouble, {2, 3});
  REQUIRE(ok.ok());
  CHECK(ok->Equals(Tensor(DataType::kDouble, {2, 3})));
  auto strings = Tensor::Create(DataType::kString, {2});
  REQUIRE(strings.ok());
  CHECK(strings->data<std::string>()[1].empty());

  auto half = Tensor::Create(static_cast<DataType>(19), {2});
  CHECK(half.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(Message(half.status()).find("float16") != std::string::npos);
  CHECK(Tensor::Create(DataType::kInvalid, {}).status().code() == absl::StatusCode::kInvalidArgument);

  // An element count whose byte size overflows size_t never allocates 0 bytes.
  auto overflow = Tensor::Create(DataType::kInt64, TensorShape{int64_t{1} << 62});
  CHECK(overflow.status().code() == absl::StatusCode::kResourceExhausted);
  CHECK(Message(overflow.status()) == "cannot allocate 4611686018427387904 x 8 bytes for int64[4611686018427387904]");
  auto many_strings = Tensor::Create(DataType::kString, TensorShape{int64_t{1} << 62});
  CHECK(many_strings.status().code() == absl::StatusCode::kResourceExhausted);

  if (!foreman::testing::HugeAllocationsFail()) {
    MESSAGE("skipping the 16 TiB allocations: vm.overcommit_memory is 1");
    return;
  }
  auto huge = Tensor::Create(DataType::kFloat, TensorShape{int64_t{1} << 42});
  CHECK(huge.status().code() == absl::StatusCode::kResourceExhausted);
  CHECK(Message(huge.status()) == "cannot allocate 17592186044416 bytes for float32[4398046511104]");
  // The constructor, for sizes the program controls, throws.
  CHECK_THROWS_AS(Tensor(DataType::kFloat, TensorShape{int64_t{1} << 42}), std::bad_alloc);
}

// -- Tensor::FromBuffer (a device's page-locked host buffers) ----------------

namespace {

// A 64-byte-aligned buffer from the heap whose release is counted.
int g_released = 0;
char* g_last_released = nullptr;
void CountingRelease(char* p) {
  ++g_released;
  g_last_released = p;
  ::operator delete(p, std::align_val_t{64});
}
char* NewBuffer(std::size_t bytes) { return static_cast<char*>(::operator new(bytes, std::align_val_t{64})); }

Tensor Adopted(TensorShape shape, float fill) {
  const auto n = static_cast<std::size_t>(shape.num_elements());
  char* data = NewBuffer(n * sizeof(float));
  for (std::size_t i = 0; i < n; ++i) reinterpret_cast<float*>(data)[i] = fill + static_cast<float>(i);
  return Tensor::FromBuffer(DataType::kFloat, std::move(shape), data, &CountingRelease);
}

}  // namespace

TEST_CASE("FromBuffer: the tensor uses the buffer in place and releases it once when destroyed") {
  g_released = 0;
  char* data = NewBuffer(6 * sizeof(float));
  {
    Tensor t = Tensor::FromBuffer(DataType::kFloat, TensorShape{2, 3}, data, &CountingRelease);
    CHECK(t.raw_data() == data);
    CHECK(t.dtype() == DataType::kFloat);
    CHECK(t.shape() == TensorShape({2, 3}));
    CHECK(t.TotalBytes() == 6 * sizeof(float));
    Tensor moved = std::move(t);  // the buffer goes with the move
    CHECK(moved.raw_data() == data);
    CHECK(g_released == 0);
  }
  CHECK(g_released == 1);
  CHECK(g_last_released == data);
}

TEST_CASE("FromBuffer: a move-assignment over the tensor releases its buffer once") {
  g_released = 0;
  Tensor t = Adopted(TensorShape{4}, 1.0f);
  char* data = t.raw_data();
  t = Tensor(DataType::kFloat, TensorShape{4});  // an ordinary buffer replaces it
  CHECK(g_released == 1);
  CHECK(g_last_released == data);
  CHECK(t.raw_data() != data);
  t = Tensor(DataType::kFloat, TensorShape{4});  // ordinary over ordinary: not the adopted release
  CHECK(g_released == 1);
}

TEST_CASE("FromBuffer: assigning a tensor of another shape or dtype releases the buffer once") {
  g_released = 0;
  Tensor t = Adopted(TensorShape{4}, 1.0f);
  char* data = t.raw_data();
  const Tensor other(DataType::kFloat, TensorShape{5});
  t = other;
  CHECK(g_released == 1);
  CHECK(g_last_released == data);
  CHECK(t.shape() == TensorShape({5}));
  CHECK(t.Equals(other));

  Tensor u = Adopted(TensorShape{4}, 1.0f);
  u = Tensor::Scalar<int64_t>(7);  // another dtype, moved in
  CHECK(g_released == 2);
  Tensor w = Adopted(TensorShape{2}, 1.0f);
  const Tensor ints(DataType::kInt32, TensorShape{2});  // same element count and bytes, another dtype
  w = ints;
  CHECK(g_released == 3);
  CHECK(w.dtype() == DataType::kInt32);
}

TEST_CASE("FromBuffer: assigning a tensor of the same dtype and shape copies into the adopted buffer") {
  g_released = 0;
  Tensor t = Adopted(TensorShape{2, 2}, 0.0f);
  char* data = t.raw_data();
  auto source = Tensor::FromVector<float>({5, 6, 7, 8}, TensorShape{2, 2});
  REQUIRE(source.ok());
  t = *source;
  CHECK(g_released == 0);
  CHECK(t.raw_data() == data);
  CHECK(t.Equals(*source));
  CHECK(t.data<float>()[3] == 8.0f);
  t = Tensor();  // dropping it releases it
  CHECK(g_released == 1);
}

TEST_CASE("FromBuffer: copies of the tensor are ordinary tensors with their own buffer") {
  g_released = 0;
  {
    Tensor t = Adopted(TensorShape{3}, 2.0f);
    Tensor copy(t);
    CHECK(copy.raw_data() != t.raw_data());
    CHECK(copy.Equals(t));
    Tensor assigned(DataType::kInt32, TensorShape{1});
    assigned = t;  // another shape: a fresh ordinary buffer
    CHECK(assigned.raw_data() != t.raw_data());
    CHECK(assigned.Equals(t));
    copy.data<float>()[0] = -1.0f;  // independent
    CHECK(t.data<float>()[0] == 2.0f);
  }
  CHECK(g_released == 1);  // the copies' buffers are not handed to `release`
}

TEST_CASE("FromBuffer: an empty tensor over a null buffer") {
  g_released = 0;
  {
    Tensor t = Tensor::FromBuffer(DataType::kFloat, TensorShape{0, 3}, nullptr, &CountingRelease);
    CHECK(t.num_elements() == 0);
    CHECK(t.TotalBytes() == 0);
    Tensor copy(t);
    CHECK(copy.Equals(t));
  }
  CHECK(g_released == 0);  // nothing to release
}
