// The one place libforeman builds the Saver that nobody passed in: the
// scaffold's, CheckpointSaverHook's and the Supervisor's.
#pragma once

#include <memory>
#include <string>

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

/// Deletes the temporaries that saves to "<dir>/<basename>" left behind when
/// they did not finish (SIGKILL, a second signal, a crash, a full disk at
/// the wrong moment): files named exactly as BundleWriter names them,
/// "<basename>[-<step>].index.tempstate<digits>" and
/// "<basename>[-<step>].data-<5 digits>-of-<5 digits>.tempstate<digits>".
/// Nothing else is touched. Logs one WARNING per file removed (its path and
/// size) and returns how many were removed; a file that cannot be deleted is
/// logged and skipped. A missing directory removes nothing (0); an error
/// listing it is returned.
/// Only for the holder of the directory's lock (LockCheckpointDirectory),
/// before its first save: then no save of its own can be in flight, and no
/// other process may save there.
StatusOr<int> RemoveStaleSaveTemporaries(Env* env, const std::string& dir, const std::string& basename);

}  // namespace foreman::internal
