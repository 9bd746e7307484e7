// What the engine's checkpoint calls share (engine_checkpoint_save.cpp, engine_checkpoint_load.cpp):
// the ranks' small exchanges, dtype names, and the buffers that alias others in this rank.
#pragma once

#include <ATen/core/Tensor.h>

#include <map>
#include <string>
#include <vector>

#include "actors/engine/storage_maps.h"
#include "core/affine/dtype.h"
#include "core/checkpoint/save_layout.h"

namespace torch::nn {
class Module;
}

namespace tessera {
namespace transport {
class Communicator;
}

namespace checkpoint_support {

// Every rank's string, in rank order (collective over `comm`; {mine} without one).
std::vector<std::string> all_gather_strings(transport::Communicator* comm, const std::string& mine);

// 12 random hex digits naming one save's or export's temporary files (rank 0 draws, the ranks agree).
std::string nonce();

// The first error any rank reported ("" from every rank: none), as one message naming the rank.
std::string first_error(const std::vector<std::string>& errors);

// This rank's buffers that lie inside another of its buffers of the same dtype (fp32 masters
// inside the weights), with their offset there.
checkpoint::RankAliases find_aliases(const EngineStorage& storage);

std::vector<checkpoint::EngineMap> engine_maps(const EngineStorage& storage);

// The model's parameters the engine does not store (requires_grad false: frozen; whole on every
// rank), in model order, each tensor once: `stored` names the engine's own (a tensor tied to one of
// them is not frozen).
std::vector<std::pair<std::string, at::Tensor>> frozen_parameters(torch::nn::Module& module,
                                                                  const std::vector<std::string>& stored);

}  // namespace checkpoint_support
}  // namespace tessera
