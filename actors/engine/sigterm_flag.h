// A process-wide record of SIGTERM for [tessera.checkpoint] sigterm_save_dir: the handler only
// sets a flag (async-signal-safe); the engine reads it after each update, agrees with the other
// ranks, saves and exits (Engine::save_and_exit_after_sigterm). Installed by initialize when an
// engine asks for it; SIGTERM then no longer ends the process at once.
#pragma once

namespace tessera {

void install_sigterm_flag();
bool sigterm_received();

}  // namespace tessera
