// `foreman chaos`'s preset fault plans: each a pure function of (preset,
// seed), so that a seed names one plan on every machine and library version
// (an explicit SplitMix64 stream, no std:: distributions). A plan is JSON in
// the plan file format of docs/fault-injection.md ("process" faults included),
// ready for `foreman train --fault-plan`.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "foreman/status.hpp"

namespace foreman::internal {

/// The preset names, in the order --help lists them: "disk", "steps",
/// "actors", "signals", "all", "power".
const std::vector<std::string>& ChaosPresetNames();

/// The plan of `preset` for `seed` (its "seed" field is `seed`):
///   disk     1-2 env faults: EIO or ENOSPC at the nth append / sync / rename
///            of a checkpoint's data or index file or of the state file;
///   steps    1-2 step faults: ABORTED, UNAVAILABLE, INTERNAL or a NaN loss at
///            a global_step in [1, 199];
///   signals  1 process fault: SIGKILL or SIGTERM at a global_step in [1, 199];
///   all      1-3 faults, each drawn from one of the three above;
///   power    (--disk sim) 1-3 power cuts, each at a probabilistic point of
///            one kind of mutating file operation (half of them on the
///            checkpoint's files, the state file and the run directory),
///            maybe a torn append, maybe a disk fault as `disk` draws it.
/// Steps are drawn in [1, 199], the default job's 200 steps (a fault at a
/// step the job does not reach does not fire). INVALID_ARGUMENT for an
/// unknown preset. Thread-safe.
StatusOr<nlohmann::json> ChaosPresetPlan(const std::string& preset, uint64_t seed);

}  // namespace foreman::internal
