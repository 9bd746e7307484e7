"""A Hugging Face model directory written by plain Python (json + struct, no safetensors package): config.json and
one model.safetensors, for tests that load an oracle's weights into a C++ engine."""
import json
import os
import struct

import torch

_DTYPES = {torch.float32: "F32", torch.bfloat16: "BF16", torch.float16: "F16"}


def write_hf_dir(path, config, named_tensors):
    os.makedirs(path, exist_ok=True)
    header, blobs, offset = {}, [], 0
    for name, t in named_tensors:
        data = t.detach().contiguous().view(torch.uint8).numpy().tobytes() if t.numel() else b""
        header[name] = {"dtype": _DTYPES[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(os.path.join(path, "model.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)
        for b in blobs:
            f.write(b)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(config, f)
