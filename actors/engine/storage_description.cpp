#include "actors/engine/storage_description.h"

#include "core/error.h"

namespace tessera {

affine::DType affine_dtype(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return affine::DType::f32;
    case at::kBFloat16: return affine::DType::bf16;
    case at::kHalf: return affine::DType::f16;
    case at::kDouble: return affine::DType::f64;
    default: throw Error(std::string("storage maps: no affine dtype for ") + c10::toString(t));
  }
}

at::ScalarType scalar_type(affine::DType d) {
  switch (d) {
    case affine::DType::f32: return at::kFloat;
    case affine::DType::bf16: return at::kBFloat16;
    case affine::DType::f16: return at::kHalf;
    case affine::DType::f64: return at::kDouble;
    default: throw Error(std::string("storage maps: no engine buffer of dtype ") + affine::dtype_name(d));
  }
}

}  // namespace tessera

namespace tessera::actors {

EngineStorage describe_storage(const EngineSpec& spec, const Buffers& parameters, const OptimizerStates& optimizer) {
  EngineStorage out;
  const auto& plan = *spec.plan;
  const int64_t owned = spec.owned_partition();
  for (size_t g = 0; g < plan.groups().size(); ++g) {
    const auto& layout = plan.groups()[g].layout;
    const auto key = [&](const std::string& kind) { return EngineStorage::buffer_key(kind, int64_t(g)); };
    const auto& weights = parameters.tensors.at(g);
    for (auto& m : plan.weight_maps(int64_t(g), affine_dtype(spec.dtype))) out.maps.push_back({"param", key("param"), std::move(m)});
    out.buffers[key("param")] = weights;
    if (g >= optimizer.masters.size()) continue;  // ZeRO inference: no optimizer, weights only
    // Master: a separate fp32 partition, or (no fp32 master) the weights' own partition.
    const auto& master = optimizer.masters.at(g);
    // (At ZeRO-3 the partition opens the weight buffer.)
    const int64_t begin = plan.stage() == 3 ? 0 : layout.partition_begin(owned);
    const auto master_buffer = master.defined() ? master : weights.narrow(0, begin, layout.partition_numel);
    for (auto& m : plan.partition_maps(int64_t(g), affine_dtype(master_buffer.scalar_type())))
      out.maps.push_back({"master", key("master"), std::move(m)});
    out.buffers[key("master")] = master_buffer;
    for (size_t k = 0; k < optimizer.state_names.at(g).size(); ++k) {
      const auto& state = optimizer.states.at(g).at(k);
      const auto& name = optimizer.state_names[g][k];
      for (auto& m : plan.partition_maps(int64_t(g), affine_dtype(state.scalar_type())))
        out.maps.push_back({name, key(name), std::move(m)});
      out.buffers[key(name)] = state;
    }
  }
  return out;
}

}  // namespace tessera::actors
