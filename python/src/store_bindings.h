// The job's store for Python (python/tessera/store.py): the key-value store tessera-launch's jobs
// meet in, as the C++ examples use it to exchange small messages between jobs (prompts, samples).
#pragma once

#include <pybind11/pybind11.h>

namespace tessera::python {

void bind_store(pybind11::module_& m);

}  // namespace tessera::python
