"""Hugging Face weights by plain Python (json + struct, no safetensors package): a model directory written
(config.json and one model.safetensors, for tests that load an oracle's weights into a C++ engine), and a
model.safetensors read back as tensors (for tests that check an export)."""
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


def read_safetensors(path):
    """{name: tensor} of one safetensors file, each with its dtype and shape."""
    dtypes = {v: k for k, v in _DTYPES.items()}
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header, data = json.loads(f.read(n)), f.read()
    return {name: torch.frombuffer(bytearray(data[v["data_offsets"][0]:v["data_offsets"][1]]), dtype=dtypes[v["dtype"]])
            .reshape(v["shape"]) for name, v in header.items() if name != "__metadata__"}
