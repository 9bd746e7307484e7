// A restricted unpickler for the pickles inside torch.save archives of DeepSpeed checkpoints: a
// small pickle VM that builds PickleValues (pickle_value.h) and executes nothing. It knows the
// opcodes such files use (protocols 2-4, without the text-mode opcodes of protocol 0) and only the
// globals such files contain, each read as plain data:
//   collections.OrderedDict, __builtin__.set         -> dict, set
//   torch._utils._rebuild_tensor_v2, torch.Size      -> tensor (a view of a storage record), tuple
//   torch.FloatStorage, BFloat16Storage, HalfStorage, DoubleStorage, LongStorage, IntStorage,
//     ShortStorage, CharStorage, ByteStorage, BoolStorage   -> storages through persistent ids
//   deepspeed.runtime.fp16.loss_scaler.LossScaler, DynamicLossScaler,
//     deepspeed.utils.tensor_fragment.fragment_address      -> objects (class name + attributes)
//   deepspeed.runtime.zero.config.ZeroStageEnum (called, or through __builtin__.getattr) -> enum member
//   torch.float16, torch.bfloat16, torch.float32 (a DynamicLossScaler's dtype)  -> a global, as data
// Any other global, any other call, and any other opcode is refused by name: CheckpointError
// naming `where` (the file), the global or opcode, and its byte position.
//
// Example: the bytes of pickle.dumps(os.system, protocol=2) fail with
//   "x.pt: pickle global 'posix.system' at byte 2 is not one a DeepSpeed checkpoint holds; refused".
#pragma once

#include <string>
#include <string_view>

#include "core/checkpoint/deepspeed/pickle_value.h"

namespace tessera::checkpoint::deepspeed {

PickleRef unpickle(std::string_view bytes, const std::string& where);

}  // namespace tessera::checkpoint::deepspeed
