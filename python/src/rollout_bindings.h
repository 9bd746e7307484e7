// The weight sync and the rollout engine for Python (python/tessera/rollout.py is what users
// import): WeightSender on a training engine made from Python, RolloutEngine and RolloutSink.
#pragma once

#include <pybind11/pybind11.h>

namespace tessera::python {

void bind_rollout(pybind11::module_& m);

}  // namespace tessera::python
