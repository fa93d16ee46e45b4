// SPDX-License-Identifier: Apache-2.0
#pragma once
/// \file
/// `mirror::backend::collective_cancelled_rethrow_me`: what a cancelled collective throws.

namespace mirror::backend {

/// Thrown by `exchange`/`barrier` of a cancelled collective: another replica failed first, and
/// its error is the one `Strategy::run` reports. Not a `std::exception`, so that only a
/// `catch (...)` in `fn` can catch it, and the name says what such a handler must do with it:
/// rethrow it (`throw;`). Swallowed, it does not resume the run's collectives (every later one
/// throws it again), and `run` still reports the other replica's error (docs/errors.md). A
/// device runtime throws it from `exchange` and `barrier` once `cancel()` was called.
struct collective_cancelled_rethrow_me {};

}  // namespace mirror::backend
