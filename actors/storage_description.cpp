#include "actors/storage_description.h"

#include "core/affine/builders.h"
#include "core/affine/zero_storage.h"
#include "core/error.h"

namespace tessera::actors {
namespace {

affine::DType affine_dtype(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return affine::DType::f32;
    case at::kBFloat16: return affine::DType::bf16;
    case at::kHalf: return affine::DType::f16;
    case at::kDouble: return affine::DType::f64;
    default: throw Error(std::string("storage maps: no affine dtype for ") + c10::toString(t));
  }
}

std::vector<affine::TensorInfo> infos(const detail::EngineShared& s, const detail::FlatGroup& group,
                                      affine::DType dtype) {
  std::vector<affine::TensorInfo> out;
  for (int64_t i : group.params) out.push_back({s.names[i], dtype, affine::Dims(s.shapes[i])});
  return out;
}

// Stage 0 keeps the whole group on every rank: rank 0's storage copied to every rank, all holders.
affine::TensorMap replicate_rank0(affine::TensorMap map, int world) {
  const auto storage = map.ranks.at(0);
  map.ranks.clear();
  for (int r = 0; r < world; ++r) map.ranks[r] = storage;
  affine::assign_holders_by_box(map);
  return map;
}

// Maps of a partitioned kind (master, states) of one group with element type `dtype`.
std::vector<affine::TensorMap> partition_maps(const detail::EngineShared& s, const detail::FlatGroup& group,
                                              affine::DType dtype) {
  if (s.stage >= 1) return affine::zero12_flat_group(infos(s, group, dtype), s.world, s.alignment);
  auto maps = affine::zero12_flat_group(infos(s, group, dtype), 1, 1);
  for (auto& m : maps) m = replicate_rank0(std::move(m), s.world);
  return maps;
}

}  // namespace

EngineStorage describe_storage(const detail::EngineShared& s, const std::vector<std::string>& state_names,
                               const std::vector<std::vector<at::Tensor>>& states) {
  EngineStorage out;
  const int64_t owned = s.owned_rank();
  const auto param_dtype = affine_dtype(s.dtype);
  for (size_t g = 0; g < s.groups.size(); ++g) {
    const auto& group = s.groups[g];
    const auto& flat = *group.flat;
    const auto& layout = flat.layout();
    const auto key = [&](const std::string& kind) { return EngineStorage::buffer_key(kind, int64_t(g)); };
    // Weights: replicated over the data-parallel ranks, each at its offset in the flat buffer.
    const auto param_infos = infos(s, group, param_dtype);
    for (size_t i = 0; i < group.params.size(); ++i) {
      auto map = affine::replicated(param_infos[i], s.world);
      for (auto& [rank, storage] : map.ranks) {
        storage.buffer_elements = layout.padded_numel;
        storage.buffer_shape = affine::Dims();
        for (auto& piece : storage.pieces) piece.offset += layout.params[i].offset;
      }
      out.maps.push_back({"param", key("param"), std::move(map)});
    }
    out.buffers[key("param")] = flat.buffer();
    // Master: a separate fp32 partition, or (fp32 training, bf16 master) the weights' own partition.
    const bool separate_master = group.master.defined();
    for (auto& m : partition_maps(s, group, separate_master ? affine::DType::f32 : param_dtype))
      out.maps.push_back({"master", key("master"), std::move(m)});
    out.buffers[key("master")] = separate_master ? group.master : flat.partition(owned);
    for (size_t k = 0; k < state_names.size(); ++k) {
      const auto& state = states.at(g).at(k);
      const auto dtype = state.defined() ? affine_dtype(state.scalar_type()) : affine::DType::f32;
      for (auto& m : partition_maps(s, group, dtype)) out.maps.push_back({state_names[k], key(state_names[k]), std::move(m)});
      out.buffers[key(state_names[k])] = state;
    }
  }
  return out;
}

}  // namespace tessera::actors
