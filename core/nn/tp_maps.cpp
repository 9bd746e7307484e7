#include "core/nn/tp_maps.h"

#include "core/error.h"
#include "core/nn/tensor_parallel.h"

namespace tessera::nn {

affine::TensorMap decoder_tp_map(const DecoderConfig& config, const std::string& name, int tp, affine::DType dtype) {
  const auto full = decoder_parameter_shape(config, name);
  if (!full) throw Error("decoder_tp_map: '" + name + "' is not a parameter of this " + config.model_type() + " model");
  affine::TensorMap map;
  map.name = name;
  map.dtype = dtype;
  map.shape = affine::Dims(*full);
  std::vector<TpShard> shards;
  for (int r = 0; r < tp; ++r) shards.push_back(decoder_tp_shard(config, name, r, tp));
  for (int r = 0; r < tp; ++r) {
    const auto& s = shards[size_t(r)];
    affine::Dims local = map.shape;
    if (s.dim >= 0) local[s.dim] = s.local_length;
    affine::RankStorage storage;
    storage.buffer_shape = local;
    storage.buffer_elements = local.product();
    affine::Piece piece;
    piece.box = affine::Box::whole(map.shape);
    if (s.dim >= 0) piece.box.origin[s.dim] = s.begin, piece.box.shape[s.dim] = s.length;
    piece.strides = affine::row_major_strides(local);
    for (int q = 0; q < tp; ++q)
      if (shards[size_t(q)].dim == s.dim && shards[size_t(q)].begin == s.begin) piece.holders.push_back(q);
    if (!piece.box.is_empty()) storage.pieces.push_back(piece);
    map.ranks[r] = storage;
  }
  return map;
}

std::vector<affine::TensorMap> decoder_tp_maps(const DecoderConfig& config, int tp, affine::DType dtype) {
  std::vector<affine::TensorMap> maps;
  for (const auto& [name, shape] : decoder_parameter_shapes(config)) maps.push_back(decoder_tp_map(config, name, tp, dtype));
  return maps;
}

}  // namespace tessera::nn
