// SPDX-License-Identifier: Apache-2.0
#pragma once
// The parts of <algorithm>, <chrono> and <memory> mirror uses, without the rest: std::min, std::max
// and std::copy; durations, clocks and time points; std::unique_ptr, make_unique and addressof
// (why: docs/design.md#compile-time). libstdc++ keeps what mirror needs in internal headers, which
// its own <thread>, <mutex> and <condition_variable> include. Other standard libraries get the
// standard headers. A program that uses other parts of <algorithm>, <chrono> or <memory> includes
// them itself, as it should.

#include <version>

#if defined(__GLIBCXX__) && __has_include(<bits/stl_algobase.h>) && __has_include(<bits/chrono.h>) && \
    __has_include(<bits/unique_ptr.h>)
#include <bits/chrono.h>
#include <bits/move.h>
#include <bits/stl_algobase.h>
#include <bits/unique_ptr.h>
#else
#include <algorithm>
#include <chrono>
#include <memory>
#endif
