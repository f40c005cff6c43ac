// horovodlike._core._testing: entry points for the tests alone (the wire decoders on arbitrary
// bytes, the hashes, the autotuner without a job, the runtime's lifetime). Not an API.
#pragma once

#include <pybind11/pybind11.h>

namespace horovodlike {

void DefineTestingModule(pybind11::module_& core);

}  // namespace horovodlike
