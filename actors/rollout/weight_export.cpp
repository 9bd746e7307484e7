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

void export_weights(const Engine& engine, const std::function<void(const std::string&, const at::Tensor&)>& f) {
  if (engine.config().zero_optimization.stage.value == 3) {  // partitioned: one unit gathered at a time
    engine.for_each_gathered_parameter(f);
    return;
  }
  const auto storage = engine.storage_maps();
  for (const auto& m : storage.maps) {
    if (m.kind != "param") continue;
    const auto& pieces = m.map.ranks.at(engine.rank()).pieces;
    const auto& flat = storage.buffers.at(m.buffer);
    if (pieces.size() != 1 || !pieces[0].box.contains(affine::Box::whole(m.map.shape)))
      throw Error("export_weights: '" + m.map.name + "' is not whole on rank " + std::to_string(engine.rank()) +
                  " (a layout export_weights cannot read)");
    const auto& p = pieces[0];
    if (p.strides != affine::row_major_strides(m.map.shape))
      throw Error("export_weights: '" + m.map.name + "' is not stored row-major");
    f(m.map.name, flat.narrow(0, p.offset, m.map.numel()).view(m.map.shape.to_vector()));
  }
}

}  // namespace tessera
