// The one place libforeman builds the Saver that nobody passed in: the
// scaffold's, CheckpointSaverHook's and the Supervisor's.
#pragma once

#include <memory>

#include "foreman/checkpoint.hpp"
#include "foreman/clock.hpp"
#include "foreman/env.hpp"
#include "foreman/status.hpp"

namespace foreman::internal {

/// A Saver with SaverOptions' defaults (TF's tf.compat.v1.train.Saver():
/// max_to_keep 5, keep_checkpoint_every_n_hours 10000, unpadded step
/// suffix) writing through `env` and reading time from `clock`; both are
/// borrowed and must outlive the Saver. INVALID_ARGUMENT when either is null.
/// Thread-safe.
StatusOr<std::unique_ptr<Saver>> NewDefaultSaver(Env* env, Clock* clock);

}  // namespace foreman::internal
