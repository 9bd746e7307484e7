// A TorchArchive is one torch.save file (PyTorch's zip format) opened for reading without Python:
// LibTorch's zip reader (caffe2::serialize::PyTorchStreamReader) for the records, the restricted
// unpickler (restricted_unpickler.h) for <archive>/data.pkl, and tensors' bytes copied out of
// their storage records <archive>/data/<key>. Nothing in the file is executed.
//
// Owns the open archive and a cache of the storage records read so far (a record shared by
// several tensors, such as DeepSpeed's flat fp32 weights behind the module's views, is read once).
// Errors: CheckpointError naming the file (a truncated or corrupt zip, a record whose size is not
// its storage's, a pickle refused) and the tensor where one is at fault.
//
// Example: zero_pp_rank_0_mp_rank_00_optim_states.pt of a 2-rank ZeRO-1 run: root()["optimizer_state_dict"]
// ["single_partition_of_fp32_groups"][0] is a TensorRef f32[10824] on record data/3; read() returns
// its 43,296 bytes.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "core/checkpoint/deepspeed/pickle_value.h"

namespace tessera::checkpoint::deepspeed {

class TorchArchive {
 public:
  explicit TorchArchive(const std::string& path);
  ~TorchArchive();
  TorchArchive(const TorchArchive&) = delete;
  TorchArchive& operator=(const TorchArchive&) = delete;

  const std::string& path() const { return path_; }
  const PickleValue& root() const { return *root_; }
  // The tensor's elements, contiguous and row-major (a copy out of its storage record); `what`
  // names the tensor in errors.
  std::vector<char> read(const TensorRef& tensor, const std::string& what) const;

 private:
  struct Records;
  std::string path_;
  std::unique_ptr<Records> records_;
  PickleRef root_;
};

}  // namespace tessera::checkpoint::deepspeed
