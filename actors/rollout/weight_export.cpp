// weight_metadata and export_weights (weight_sync.h): the training engine's weights for receivers
// that are not tessera's, from its storage maps.
#include <torch/torch.h>

#include "actors/engine/engine.h"
#include "actors/rollout/weight_sync.h"
#include "core/error.h"

namespace tessera {

std::vector<WeightMetadata> weight_metadata(const Engine& engine) {
  const auto storage = engine.storage_maps();
  std::vector<WeightMetadata> out;
  for (const auto& m : storage.maps)
    if (m.kind == "param")
      out.push_back({m.map.name, storage.buffers.at(m.buffer).scalar_type(), m.map.shape.to_vector()});
  return out;
}

// The module's own parameters: at ZeRO 0-2 views of the rank's flat buffers, at ZeRO-3 one unit
// gathered at a time (Engine::for_each_gathered_parameter).
void export_weights(const Engine& engine, const std::function<void(const std::string&, const at::Tensor&)>& f) {
  engine.for_each_gathered_parameter(f);
}

}  // namespace tessera
