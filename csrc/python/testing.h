// horovodlike._core._testing: entry points for the tests alone (the wire decoders on arbitrary
// bytes, the hashes, the autotuner without a job, the runtime's lifetime) and the benchmarks'
// machine probe. Not an API.
#pragma once

#include <pybind11/pybind11.h>

namespace horovodlike {

void DefineTestingModule(pybind11::module_& core);

// Two threads pinned to cpu_a and cpu_b pass a cache line back and forth; the median over
// `batches` of the nanoseconds per round trip, or -1 when a CPU could not be used or the
// probe took over 2 s (core_to_core.cc).
double CoreToCoreRoundTripNs(int cpu_a, int cpu_b, int round_trips, int batches);

}  // namespace horovodlike
