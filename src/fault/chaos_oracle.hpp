// The chaos harness's independent oracle: its own reading of a checkpoint
// directory, written apart from the code a job restores with (Saver,
// BundleReader, ReadCheckpointState, LatestCheckpoint), so that a bug there
// cannot also fool the check. It reads the TF V2 bundle with LevelDB's table
// reader and the format's protos, computes CRC32C itself (bitwise, slow and
// obviously right), and parses the `checkpoint` state file's text itself.
// Internal (docs/fault-injection.md, "The invariants and the oracle").
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "foreman/env.hpp"
#include "foreman/status.hpp"

namespace foreman::internal {

/// OK when the bundle at `prefix` is whole: its index reads as a table whose
/// first entry is the header (little-endian, num_shards >= 1), every entry's
/// bytes lie inside its data file, its size is its dtype and shape's (fixed
/// width types, complex64/128 included), its masked CRC32C matches (every
/// entry: a string tensor's by the format's rule, over its lengths, their
/// stored checksum, which must match too, and its bytes), and each data file
/// ends where its last tensor does. DATA_LOSS naming the file and the first fault; the
/// Env's error for a missing file.
Status OracleVerifyBundle(Env* env, const std::string& prefix);

/// What the oracle sees in `dir`.
struct OracleDirectory {
  /// The state file: absent (false), and its latest and listed paths
  /// resolved against `dir`; `state_error` when it does not parse.
  bool has_state = false;
  std::string state_error;
  std::string latest;
  std::vector<std::string> listed;
  /// Every "model.ckpt-<step>.index" in `dir`, by step (prefix and step).
  std::vector<std::pair<int64_t, std::string>> bundles;
};
StatusOr<OracleDirectory> OracleReadDirectory(Env* env, const std::string& dir);

/// The step a restart must restore from `dir` by the rule of
/// foreman/checkpoint.hpp's LatestCheckpoint, computed here: the state
/// file's latest when it verifies, else the newest bundle (by step) that
/// verifies; nullopt when the directory has no bundle at all. `notes` (may
/// be null) gets why a checkpoint was passed over. The Env's errors.
StatusOr<std::optional<int64_t>> OracleRestoreStep(Env* env, const std::string& dir,
                                                   std::vector<std::string>* notes = nullptr);

/// The listed checkpoints of `dir`'s state file that do not verify, each
/// "<name>: <why>" (empty: all verify, or no state file). A state file that
/// does not parse is one item.
std::vector<std::string> OracleBadListedCheckpoints(Env* env, const std::string& dir);

/// OK when `bytes` (an event file's contents) is a sequence of whole TFRecord
/// records: each a uint64 little-endian length, the masked CRC32C of those
/// 8 bytes, `length` bytes of data and their masked CRC32C, nothing after the
/// last one. DATA_LOSS naming the byte offset and what is wrong (a cut
/// record, a failed CRC). Read with this file's own CRC32C.
Status OracleCheckRecords(const std::string& bytes);

/// CRC32C (Castagnoli) of `data`, bit by bit; and TF's mask of a CRC.
uint32_t OracleCrc32c(const std::string& data, std::size_t offset, std::size_t n);
uint32_t OracleMaskCrc(uint32_t crc);

}  // namespace foreman::internal
