// `foreman inspect <prefix or dir>`: the variables of a TensorFlow V2
// checkpoint (TF: tensorflow/python/tools/inspect_checkpoint.py). A directory
// means its latest checkpoint (LatestCheckpoint). One line per variable:
//
//   checkpoint /ckpt/model.ckpt-100
//   dense/kernel  float32  [2,3]
//     values: {1, 2, 3, 4, 5, ... (1 more)}
//     stats: min 1  max 6  mean 3.5
//   global_step   int64    []
//
// Every listed tensor is read and its CRC32C checked (for dtypes Foreman
// cannot decode, such as float16, the CRC of the raw bytes); a corrupt one is
// an error naming the file and the variable (exit 2), as is one too big to
// allocate (RESOURCE_EXHAUSTED).
#include <algorithm>
#include <charconv>
#include <cstdio>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "command.hpp"
#include "foreman/logging.hpp"
#include "foreman/bundle.hpp"
#include "foreman/checkpoint.hpp"

namespace foreman::cli {

namespace {

struct InspectFlags {
  std::string path;
  std::string name;
  bool values = false;
  bool stats = false;
  int max_values = 10;
};

// -- formatting ---------------------------------------------------------------------

/// The shortest text that reads back as `v` (a float as a float).
template <class T>
std::string Number(T v) {
  if constexpr (std::is_same_v<T, uint8_t>) {
    return absl::StrCat(static_cast<int>(v));
  } else {
    char buf[32];
    return std::string(buf, std::to_chars(buf, buf + sizeof buf, v).ptr);
  }
}

template <class T>
std::string Values(const Tensor& t, int max_values) {
  const T* p = t.data<T>();
  const int64_t n = t.num_elements();
  const int64_t shown = std::min<int64_t>(n, max_values);
  std::string out = "{";
  for (int64_t i = 0; i < shown; ++i) {
    if (i > 0) out += ", ";
    if constexpr (std::is_same_v<T, std::string>) {
      absl::StrAppend(&out, "\"", absl::CHexEscape(p[i]), "\"");
    } else {
      out += Number(p[i]);
    }
  }
  if (shown < n) absl::StrAppend(&out, shown > 0 ? ", " : "", "... (", n - shown, " more)");
  return out + "}";
}

template <class T>
std::string Stats(const Tensor& t) {
  if constexpr (std::is_same_v<T, std::string>) {
    return "not numeric";
  } else {
    const T* p = t.data<T>();
    const int64_t n = t.num_elements();
    if (n == 0) return "empty";
    T lo = p[0], hi = p[0];
    double sum = 0;
    for (int64_t i = 0; i < n; ++i) {
      lo = std::min(lo, p[i]);
      hi = std::max(hi, p[i]);
      sum += static_cast<double>(p[i]);
    }
    return absl::StrCat("min ", Number(lo), "  max ", Number(hi), "  mean ", Number(sum / static_cast<double>(n)));
  }
}

/// `fn(T{})`, with T the element type of `dtype`.
template <class Fn>
std::string ByDtype(DataType dtype, Fn&& fn) {
  switch (dtype) {
    case DataType::kFloat: return fn(float{});
    case DataType::kDouble: return fn(double{});
    case DataType::kInt32: return fn(int32_t{});
    case DataType::kUInt8: return fn(uint8_t{});
    case DataType::kInt64: return fn(int64_t{});
    case DataType::kString: return fn(std::string{});
    case DataType::kInvalid: break;
  }
  return "";
}

// -- the command --------------------------------------------------------------------

int Fail(const Status& s) {
  std::fprintf(stderr, "foreman inspect: %s\n", EscapeForTerminal(s.message()).c_str());
  return kExitUsage;
}

/// The bundle prefix `path` names: a directory's latest checkpoint, the
/// prefix of "<prefix>.index", or `path` itself.
StatusOr<std::string> ResolvePrefix(Env* env, const std::string& path) {
  StatusOr<bool> is_dir = env->IsDirectory(path);
  if (is_dir.ok() && *is_dir) {
    FOREMAN_ASSIGN_OR_RETURN(std::optional<std::string> latest, LatestCheckpoint(env, path));
    if (!latest) return absl::NotFoundError(absl::StrCat("no checkpoint in directory ", path));
    return *latest;
  }
  if (absl::EndsWith(path, ".index")) return path.substr(0, path.size() - 6);
  return path;
}

int RunInspect(const InspectFlags& flags) {
  Env* env = Env::Default();
  StatusOr<std::string> prefix = ResolvePrefix(env, flags.path);
  if (!prefix.ok()) return Fail(prefix.status());
  StatusOr<std::unique_ptr<BundleReader>> reader = BundleReader::Open(env, *prefix);
  if (!reader.ok()) return Fail(reader.status());
  std::vector<BundleEntry> entries = (*reader)->entries();
  if (!flags.name.empty()) {
    StatusOr<BundleEntry> e = (*reader)->GetEntry(flags.name);
    if (!e.ok()) return Fail(e.status());
    entries = {*e};
  }
  std::size_t name_width = 0;
  // Names as printed: a name from the file cannot break its line.
  std::vector<std::string> names;
  for (const BundleEntry& e : entries) names.push_back(EscapeForTerminal(e.name));
  for (const std::string& n : names) name_width = std::max(name_width, n.size());

  std::printf("checkpoint %s\n", EscapeForTerminal(*prefix).c_str());
  int exit_code = kExitOk;
  for (std::size_t i = 0; i < entries.size(); ++i) {
    const BundleEntry& e = entries[i];
    std::printf("%-*s  %-7s  %s\n", static_cast<int>(name_width), names[i].c_str(), DataTypeName(e.dtype).c_str(),
                e.shape.ToString().c_str());
    StatusOr<Tensor> t = (*reader)->Lookup(e.name);
    if (absl::IsUnimplemented(t.status())) {   // a dtype Foreman cannot decode: listed, its raw CRC checked
      if (flags.values || flags.stats) {
        std::printf("  (dtype %s (%d) not supported)\n", DataTypeName(e.dtype).c_str(), static_cast<int>(e.dtype));
      }
      Status verified = (*reader)->Verify(e.name);
      if (!verified.ok()) {
        std::fflush(stdout);
        exit_code = Fail(verified);
      }
      continue;
    }
    if (!t.ok()) {
      std::fflush(stdout);
      exit_code = Fail(t.status());
      continue;
    }
    if (flags.values) {
      std::printf("  values: %s\n",
                  ByDtype(e.dtype, [&](auto x) { return Values<decltype(x)>(*t, flags.max_values); }).c_str());
    }
    if (flags.stats) {
      std::printf("  stats: %s\n", ByDtype(e.dtype, [&](auto x) { return Stats<decltype(x)>(*t); }).c_str());
    }
  }
  return exit_code;
}

}  // namespace

void AddInspectCommand(CLI::App& app, int* exit_code) {
  auto flags = std::make_shared<InspectFlags>();
  auto* cmd = app.add_subcommand("inspect", "List the variables of a TensorFlow checkpoint");
  cmd->add_option("checkpoint", flags->path, "A checkpoint prefix, or a directory (its latest checkpoint)")
      ->required();
  cmd->add_flag("--values", flags->values, "Print the values");
  cmd->add_option("--max-values", flags->max_values, "Values printed per variable before eliding (default 10)")
      ->check(CLI::Range(0, std::numeric_limits<int>::max()));
  cmd->add_flag("--stats", flags->stats, "Print min, max and mean of numeric variables");
  cmd->add_option("--name", flags->name, "Only this variable");
  cmd->callback([flags, exit_code] { *exit_code = RunInspect(*flags); });
}

}  // namespace foreman::cli
