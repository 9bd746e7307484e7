// The launcher's environment, for transport's users: core/launch_env.h reads it (the one reader).
#pragma once

#include "core/launch_env.h"

namespace tessera::transport {

using tessera::env_int;
using tessera::LaunchEnv;

}  // namespace tessera::transport
