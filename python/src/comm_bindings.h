// Collectives for Python scripts (python/tessera/comm.py, DeepSpeed's deepspeed.comm basics): a
// Gloo communicator over the launched ranks, separate from every engine's, made at first use.
#pragma once

#include <pybind11/pybind11.h>

namespace tessera::python {

void bind_comm(pybind11::module_& m);

}  // namespace tessera::python
