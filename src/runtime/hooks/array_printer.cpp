// FormatTensorForLog (foreman/hooks.hpp): a tensor printed as numpy's str()
// prints an array, which is how TF's LoggingTensorHook shows values. A pure
// function of the tensor; used by LoggingTensorHook (basic_hooks.cpp).
#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "foreman/hooks.hpp"
#include "foreman/tensor.hpp"

namespace foreman {

namespace {

/// The shortest digits that read back as `x` (finite, non-zero), and the
/// decimal exponent of the first one: x = d.ddd * 10^exp.
template <class T>
void ShortestDigits(T x, std::string* digits, int* exp) {
  char buf[64];
  const std::to_chars_result r = std::to_chars(buf, buf + sizeof(buf), x, std::chars_format::scientific);
  std::string s(buf, r.ptr);  // "-1.2345e+06"
  if (!s.empty() && s[0] == '-') s.erase(0, 1);
  const std::size_t e = s.find('e');
  *exp = std::stoi(s.substr(e + 1));
  digits->clear();
  for (std::size_t i = 0; i < e; ++i) {
    if (s[i] != '.') digits->push_back(s[i]);
  }
  while (digits->size() > 1 && digits->back() == '0') digits->pop_back();
}

/// Python's repr of a float (numpy's str of a float scalar): positional for
/// 1e-4 <= |x| < 1e16 ("0.5", "1.0", "123.25"), else scientific ("1e-05",
/// "1.5e+16").
template <class T>
std::string PythonFloatRepr(T x) {
  if (std::isnan(x)) return "nan";
  if (std::isinf(x)) return x < 0 ? "-inf" : "inf";
  const std::string sign = std::signbit(x) ? "-" : "";
  if (x == 0) return sign + "0.0";
  std::string digits;
  int exp = 0;
  ShortestDigits(x, &digits, &exp);
  if (exp < -4 || exp >= 16) {
    std::string out = sign + digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    char e[16];
    std::snprintf(e, sizeof(e), "e%c%02d", exp < 0 ? '-' : '+', std::abs(exp));
    return out + e;
  }
  std::string int_part;
  std::string frac_part;
  if (exp >= 0) {
    const std::size_t n = static_cast<std::size_t>(exp) + 1;
    int_part = digits.substr(0, std::min(n, digits.size()));
    if (int_part.size() < n) int_part.append(n - int_part.size(), '0');
    if (digits.size() > n) frac_part = digits.substr(n);
  } else {
    int_part = "0";
    frac_part = std::string(static_cast<std::size_t>(-exp - 1), '0') + digits;
  }
  return sign + int_part + "." + (frac_part.empty() ? "0" : frac_part);
}

/// Python's repr of bytes: b'...' (b"..." when it holds ' but no ").
std::string PythonBytesRepr(const std::string& s) {
  const bool dquote = s.find('\'') != std::string::npos && s.find('"') == std::string::npos;
  const char quote = dquote ? '"' : '\'';
  std::string out = "b";
  out.push_back(quote);
  for (const unsigned char c : s) {
    if (c == quote || c == '\\') {
      out.push_back('\\');
      out.push_back(static_cast<char>(c));
    } else if (c == '\t') {
      out += "\\t";
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c < 0x20 || c >= 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\x%02x", c);
      out += buf;
    } else {
      out.push_back(static_cast<char>(c));
    }
  }
  out.push_back(quote);
  return out;
}

std::string StripTrailingZeros(std::string s) {
  while (!s.empty() && s.back() == '0') s.pop_back();
  return s;
}

/// numpy's FloatingFormat for the elements of one array (floatmode
/// "maxprec", precision 8, suppress=True): a common layout for the shown
/// elements, then each element in it.
class FloatArrayFormat {
 public:
  explicit FloatArrayFormat(const std::vector<double>& shown, bool is_float32) : is_float32_(is_float32) {
    double max_abs = 0;
    bool any_finite = false;
    bool negative_inf = false;
    for (const double v : shown) {
      if (std::isfinite(v)) {
        any_finite = true;
        max_abs = std::max(max_abs, std::fabs(v));
      } else if (std::isinf(v) && v < 0) {
        negative_inf = true;
      }
    }
    exp_format_ = max_abs >= 1e8;
    if (any_finite && exp_format_) {
      for (const double v : shown) {
        if (!std::isfinite(v)) continue;
        const Sci s = Scientific(v);
        pad_left_ = std::max(pad_left_, s.int_part.size());
        precision_ = std::max(precision_, s.frac_part.size());
        exp_size_ = std::max(exp_size_, s.exp_digits.size());
      }
      pad_right_ = exp_size_ + 2 + precision_;
    } else if (any_finite) {
      for (const double v : shown) {
        if (!std::isfinite(v)) continue;
        const auto [int_part, frac_part] = Positional(v);
        pad_left_ = std::max(pad_left_, int_part.size());
        pad_right_ = std::max(pad_right_, frac_part.size());
      }
    }
    if (std::any_of(shown.begin(), shown.end(), [](double v) { return !std::isfinite(v); })) {
      const std::size_t offset = pad_right_ + 1;
      const std::size_t inf_len = 3 + (negative_inf ? 1 : 0);
      if (3 > offset) pad_left_ = std::max(pad_left_, 3 - offset);
      if (inf_len > offset) pad_left_ = std::max(pad_left_, inf_len - offset);
    }
  }

  std::string operator()(double v) const {
    if (!std::isfinite(v)) {
      const std::string s = std::isnan(v) ? "nan" : (v < 0 ? "-inf" : "inf");
      return PadLeft(s, pad_left_ + pad_right_ + 1);
    }
    if (exp_format_) {
      // numpy prints the common precision with the value's exact digits past
      // its shortest ones (dragon4's min_digits), as "%.*e" does.
      char buf[64];
      std::snprintf(buf, sizeof(buf), "%.*e", static_cast<int>(precision_), v);
      const std::string s = buf;  // "-1.25e+08"; "1e+08" for precision 0
      const std::size_t e = s.find('e');
      const std::size_t dot = s.find('.');
      const std::string int_part = s.substr(0, std::min(dot, e));
      const std::string frac_part = dot < e ? s.substr(dot + 1, e - dot - 1) : "";
      std::string exp_digits = s.substr(e + 2);
      if (exp_digits.size() < exp_size_) exp_digits.insert(0, exp_size_ - exp_digits.size(), '0');
      return PadLeft(int_part, pad_left_) + "." + frac_part + "e" + s[e + 1] + exp_digits;
    }
    const auto [int_part, frac_part] = Positional(v);
    return PadLeft(int_part, pad_left_) + "." + frac_part + std::string(pad_right_ - frac_part.size(), ' ');
  }

 private:
  struct Sci {
    std::string int_part;   // "-1"
    std::string frac_part;  // "25" (trailing zeros trimmed)
    char exp_sign = '+';
    std::string exp_digits;  // "08"
  };

  static std::string PadLeft(const std::string& s, std::size_t width) {
    return s.size() >= width ? s : std::string(width - s.size(), ' ') + s;
  }

  /// Shortest digits, at most 8 after the point; trailing zeros trimmed, the
  /// point kept ("1." for 1.0). Integer digits are exact: numpy's padded
  /// dragon4 prints float32 83391432 as "83391432.", not "83391430.".
  std::pair<std::string, std::string> Positional(double v) const {
    std::string s = is_float32_ ? PythonFloatRepr(static_cast<float>(v)) : PythonFloatRepr(v);
    std::string int_part;
    std::string frac_part;
    if (s.find('e') != std::string::npos || s.size() - s.find('.') - 1 > 8) {
      char buf[512];
      std::snprintf(buf, sizeof(buf), "%.8f", v);
      s = buf;
    } else if (std::fabs(v) >= 1e7 && s.size() >= 2 && s.compare(s.size() - 2, 2, ".0") == 0) {
      // The shortest digits end before the point (the value is an integer).
      char buf[512];
      std::snprintf(buf, sizeof(buf), "%.0f.", v);
      s = buf;
    }
    const std::size_t dot = s.find('.');
    int_part = s.substr(0, dot);
    frac_part = StripTrailingZeros(s.substr(dot + 1));
    return {int_part, frac_part};
  }

  /// Shortest digits in scientific form, at most 8 after the point.
  Sci Scientific(double v) const {
    Sci out;
    const std::string sign = std::signbit(v) ? "-" : "";
    std::string mantissa;
    int exp = 0;
    if (v == 0) {
      mantissa = "0";
    } else {
      std::string digits;
      if (is_float32_) {
        ShortestDigits(static_cast<float>(v), &digits, &exp);
      } else {
        ShortestDigits(v, &digits, &exp);
      }
      if (digits.size() > 9) {
        char buf[64];
        std::snprintf(buf, sizeof(buf), "%.8e", std::fabs(v));
        const std::string s = buf;  // "1.23456789e+08"
        const std::size_t e = s.find('e');
        exp = std::stoi(s.substr(e + 1));
        digits.clear();
        for (std::size_t i = 0; i < e; ++i) {
          if (s[i] != '.') digits.push_back(s[i]);
        }
        while (digits.size() > 1 && digits.back() == '0') digits.pop_back();
      }
      mantissa = digits;
    }
    out.int_part = sign + mantissa.substr(0, 1);
    out.frac_part = mantissa.substr(1);
    out.exp_sign = exp < 0 ? '-' : '+';
    out.exp_digits = std::to_string(std::abs(exp));
    if (out.exp_digits.size() < 2) out.exp_digits.insert(0, 1, '0');
    return out;
  }

  bool is_float32_;
  bool exp_format_ = false;
  std::size_t pad_left_ = 0;
  std::size_t pad_right_ = 0;
  std::size_t precision_ = 0;
  std::size_t exp_size_ = 0;
};

/// numpy's summarisation: past 1000 elements, 3 items at each edge of every
/// dimension.
constexpr int64_t kSummaryThreshold = 1000;
constexpr int64_t kEdgeItems = 3;
/// numpy's default linewidth.
constexpr std::size_t kLineWidth = 75;

/// numpy's _formatArray: walks `shape` the way it prints, calling
/// `visit(flat_index)` for each shown element and building the text when
/// `element` is given.
class ArrayWalker {
 public:
  ArrayWalker(const TensorShape& shape, bool summarize) : shape_(shape), summarize_(summarize) {}

  std::vector<int64_t> ShownIndices() const {
    std::vector<int64_t> out;
    Collect(0, 0, &out);
    return out;
  }

  std::string Render(const std::function<std::string(int64_t)>& element) const {
    return Recurse(0, 0, " ", kLineWidth, element);
  }

 private:
  int64_t Stride(int axis) const {
    int64_t stride = 1;
    for (int a = axis + 1; a < shape_.rank(); ++a) stride *= shape_.dim(a);
    return stride;
  }

  std::vector<int64_t> Items(int axis) const {
    const int64_t n = shape_.dim(axis);
    std::vector<int64_t> items;
    if (summarize_ && 2 * kEdgeItems < n) {
      for (int64_t i = 0; i < kEdgeItems; ++i) items.push_back(i);
      items.push_back(-1);  // "..."
      for (int64_t i = n - kEdgeItems; i < n; ++i) items.push_back(i);
    } else {
      for (int64_t i = 0; i < n; ++i) items.push_back(i);
    }
    return items;
  }

  void Collect(int axis, int64_t offset, std::vector<int64_t>* out) const {
    if (axis == shape_.rank()) {
      out->push_back(offset);
      return;
    }
    for (const int64_t i : Items(axis)) {
      if (i >= 0) Collect(axis + 1, offset + i * Stride(axis), out);
    }
  }

  /// numpy's _extendLine: starts a new line when `word` would pass
  /// `width`, unless the line holds nothing but the indent.
  static void ExtendLine(std::string* s, std::string* line, const std::string& word, std::size_t width,
                         const std::string& hanging_indent) {
    if (line->size() + word.size() > width && line->size() > hanging_indent.size()) {
      std::string done = *line;
      while (!done.empty() && done.back() == ' ') done.pop_back();
      *s += done + "\n";
      *line = hanging_indent;
    }
    *line += word;
  }

  std::string Recurse(int axis, int64_t offset, const std::string& hanging_indent, std::size_t width,
                      const std::function<std::string(int64_t)>& element) const {
    if (axis == shape_.rank()) return element(offset);
    const std::string next_indent = hanging_indent + " ";
    const int axes_left = shape_.rank() - axis;
    std::vector<std::string> parts;
    for (const int64_t i : Items(axis)) {
      const std::size_t next_width = width > 2 ? width - 1 : 2;
      parts.push_back(i < 0 ? "..." : Recurse(axis + 1, offset + i * Stride(axis), next_indent, next_width, element));
    }
    std::string s;
    if (axes_left == 1) {
      // Elements fill lines of `width` - 1 (room for the closing bracket).
      std::string line = hanging_indent;
      for (std::size_t k = 0; k < parts.size(); ++k) {
        ExtendLine(&s, &line, parts[k], width - 1, hanging_indent);
        if (k + 1 < parts.size()) line += " ";
      }
      s += line;
    } else {
      const std::string line_sep(static_cast<std::size_t>(axes_left - 1), '\n');
      for (std::size_t k = 0; k < parts.size(); ++k) {
        s += hanging_indent + parts[k];
        if (k + 1 < parts.size()) s += line_sep;
      }
    }
    return "[" + s.substr(hanging_indent.size()) + "]";
  }

  const TensorShape& shape_;
  bool summarize_;
};

template <class T>
std::string IntString(T v) {
  return std::to_string(static_cast<int64_t>(v));
}

}  // namespace

std::string FormatTensorForLog(const Tensor& tensor) {
  const DataType dtype = tensor.dtype();
  if (dtype == DataType::kInvalid) return "<invalid tensor>";
  if (tensor.shape().rank() == 0) {
    switch (dtype) {
      case DataType::kFloat: return PythonFloatRepr(*tensor.data<float>());
      case DataType::kDouble: return PythonFloatRepr(*tensor.data<double>());
      case DataType::kInt32: return IntString(*tensor.data<int32_t>());
      case DataType::kUInt8: return IntString(*tensor.data<uint8_t>());
      case DataType::kInt64: return IntString(*tensor.data<int64_t>());
      case DataType::kString: return PythonBytesRepr(*tensor.data<std::string>());
      default: return "<invalid tensor>";
    }
  }
  if (tensor.num_elements() == 0) return "[]";

  const ArrayWalker walker(tensor.shape(), tensor.num_elements() > kSummaryThreshold);
  const std::vector<int64_t> shown = walker.ShownIndices();
  std::function<std::string(int64_t)> element;
  if (dtype == DataType::kFloat || dtype == DataType::kDouble) {
    std::vector<double> values;
    for (const int64_t i : shown) {
      values.push_back(dtype == DataType::kFloat ? static_cast<double>(tensor.data<float>()[i])
                                                 : tensor.data<double>()[i]);
    }
    auto format = std::make_shared<FloatArrayFormat>(values, dtype == DataType::kFloat);
    element = [format, &tensor, dtype](int64_t i) {
      return (*format)(dtype == DataType::kFloat ? static_cast<double>(tensor.data<float>()[i])
                                                 : tensor.data<double>()[i]);
    };
  } else if (dtype == DataType::kString) {
    element = [&tensor](int64_t i) { return PythonBytesRepr(tensor.data<std::string>()[i]); };
  } else {
    const auto int_at = [&tensor, dtype](int64_t i) -> std::string {
      if (dtype == DataType::kInt32) return IntString(tensor.data<int32_t>()[i]);
      if (dtype == DataType::kUInt8) return IntString(tensor.data<uint8_t>()[i]);
      return IntString(tensor.data<int64_t>()[i]);
    };
    std::size_t width = 0;
    for (const int64_t i : shown) width = std::max(width, int_at(i).size());
    element = [int_at, width](int64_t i) {
      const std::string s = int_at(i);
      return std::string(width - s.size(), ' ') + s;
    };
  }
  return walker.Render(element);
}

}  // namespace foreman
