#!/usr/bin/env python3
"""`tessera checkpoint consolidate` on real checkpoints: 2 ranks save through the engine
(engine_save_load_test [.layout_save]: fp32 at stage 3, bf16 at stage 2), along with the oracle,
reference.safetensors: every stored tensor read element by element through the engine's own maps
from all ranks' buffers ("master/<name>"), and the gathered weights ("gathered/<name>").

Checked, each against that oracle, bitwise: the default safetensors output (names in model order,
F32, shapes); a sharded one (a tiny --max-shard-bytes: the index's total_size and weight_map, each
shard holding exactly its tensors); --format bin through Debian's Python torch.load (plain and
weights_only=True). A flipped byte in rank1.safetensors is refused naming the file and the tensor
that reads it (worked out here from the manifest's maps), and OUT is not created. Negative
controls: the comparison reports a perturbed tensor and a swapped pair.
Usage: checkpoint_consolidate.py LAUNCH SAVE_PROGRAM TESSERA PORT [PYTHON_WITH_TORCH]"""
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile

launch, program, tessera, port = sys.argv[1:5]
torch_python = sys.argv[5] if len(sys.argv) > 5 else "/usr/bin/python3"
root = tempfile.mkdtemp(prefix="tessera_consolidate_")
shapes = {}  # parameter name -> shape, from the manifest of the checkpoint under test


def run(*args, expect=0):
    p = subprocess.run(list(args), capture_output=True, text=True, timeout=300)
    if p.returncode != expect:
        sys.exit(f"{' '.join(args)}: exit {p.returncode}, expected {expect}\n{p.stdout}\n{p.stderr}")
    return p.stdout + p.stderr


def check(condition, what):
    if not condition:
        sys.exit("FAILED: " + what)


def read_safetensors(path):
    """{name: (dtype, shape, bytes)} and the names in file order, parsed here (not by tessera)."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    metadata = header.pop("__metadata__", {})
    tensors = {name: (i["dtype"], i["shape"], data[i["data_offsets"][0]:i["data_offsets"][1]]) for name, i in header.items()}
    check(sum(len(t[2]) for t in tensors.values()) == len(data), f"{path}: the data section has bytes no tensor owns")
    return tensors, sorted(header, key=lambda k: header[k]["data_offsets"][0]), metadata


def differing(got, reference, prefix="master/"):
    """Names whose bytes differ from the oracle's, that are not F32 in the parameter's shape, or that
    either side lacks (the oracle holds tensors flat: their shapes come from the manifest)."""
    names = {n[len(prefix):] for n in reference if n.startswith(prefix)}
    bad = sorted(names ^ set(got))
    for name in sorted(names & set(got)):
        dtype, _, data = reference[prefix + name]
        if got[name] != ("F32", shapes[name], data) or dtype != "F32":
            bad.append(name)
    return bad


def bf16_of(data):
    """fp32 bytes rounded to bf16 (nearest even), as uint16 values."""
    words = struct.unpack(f"<{len(data) // 4}I", data)
    return [((w + 0x7FFF + ((w >> 16) & 1)) >> 16) & 0xFFFF for w in words]


def expected_tensor(manifest, byte_in_buffer, key):
    """The first tensor (model order) whose reads from file 1 touch the chunk holding
    `byte_in_buffer` of buffer `key` (the planner reads a replicated piece from its lowest holder)."""
    buffer = next(b for f in manifest["files"] if f["rank"] == 1 for b in f["buffers"] if b["key"] == key)
    chunk = byte_in_buffer // buffer["chunk_bytes"]
    for name, piece_key, piece in file1_pieces(manifest):
        last = piece["offset"] + sum((s - 1) * st for s, st in zip(piece["shape"], piece["strides"]))
        if piece_key == key and piece["offset"] * 4 // buffer["chunk_bytes"] <= chunk <= (last * 4 + 3) // buffer["chunk_bytes"]:
            return name
    return None


TORCH_LOAD = r"""
import collections, hashlib, json, sys, torch
out = {}
for weights_only in (False, True):
    sd = torch.load(sys.argv[1], weights_only=weights_only)
    assert type(sd) is collections.OrderedDict, type(sd)
    out[str(weights_only)] = [[k, str(v.dtype), list(v.shape), v.is_contiguous(), v.storage_offset(),
                               v.numpy().tobytes().hex()] for k, v in sd.items()]
print(json.dumps(out))
"""


def check_bin(path, reference, names):
    loaded = json.loads(run(torch_python, "-c", TORCH_LOAD, path))
    for mode, tensors in loaded.items():
        check([t[0] for t in tensors] == names, f"torch.load (weights_only={mode}): names {[t[0] for t in tensors]}")
        got = {n: ("F32" if d == "torch.float32" and c and off == 0 else d, shape, bytes.fromhex(h))
               for n, d, shape, c, off, h in tensors}
        check(differing(got, reference) == [], f"torch.load (weights_only={mode}): differ: {differing(got, reference)}")


def save(dtype, stage, port_offset):
    """Two ranks train 3 steps and save; returns the directory, the oracle, the manifest, the names."""
    d = os.path.join(root, f"{dtype}_stage{stage}")
    os.makedirs(d)
    env = dict(os.environ, TESSERA_CKPT_DIR=d, TESSERA_CKPT_STAGE=str(stage), TESSERA_CKPT_DTYPE=dtype, OMP_NUM_THREADS="1")
    subprocess.run([sys.executable, launch, "--nproc-per-node", "2", "--master-port", str(int(port) + port_offset), "--job",
                    f"consolidate_{dtype}", "--grace-period", "2", "--", program, "[.layout_save]"],
                   env=env, check=True, timeout=300, capture_output=True)
    reference, _, _ = read_safetensors(os.path.join(d, "reference.safetensors"))
    with open(os.path.join(d, "global_step3", "manifest.json")) as f:
        manifest = json.load(f)
    names = [p["name"] for p in manifest["parameters"]]
    shapes.clear()
    shapes.update({p["name"]: p["shape"] for p in manifest["parameters"]})
    check(len(names) > 4 and all("master/" + n in reference for n in names), f"{dtype}: the oracle lacks masters")
    return d, reference, manifest, names


def check_single(d, dtype, reference, names):
    """The default output, from the root (latest) and from --tag; returns its tensors."""
    out = os.path.join(d, "out")
    text = run(tessera, "checkpoint", "consolidate", d, out)
    check("model.safetensors" in text and "(master, f32)" in text, text)
    check(os.listdir(out) == ["model.safetensors"], f"{out}: {os.listdir(out)}")
    tensors, order, metadata = read_safetensors(os.path.join(out, "model.safetensors"))
    check(order == names, f"{dtype}: file order {order} is not the model's {names}")
    check(metadata == {"format": "pt"}, f"metadata {metadata}")
    check(differing(tensors, reference) == [], f"{dtype}: differ: {differing(tensors, reference)}")
    if dtype == "fp32":  # the masters are the weights
        check(differing(tensors, reference, "gathered/") == [], "fp32: masters are not the gathered weights")
    else:  # the bf16 weights are the masters rounded
        for n in names:
            weights = list(struct.unpack(f"<{len(tensors[n][2]) // 4}H", reference["gathered/" + n][2]))
            check(bf16_of(tensors[n][2]) == weights, f"bf16: weight {n} is not its master rounded")
    run(tessera, "checkpoint", "consolidate", d, out + "_tag", "--tag", "global_step3")
    check(read_safetensors(os.path.join(out + "_tag", "model.safetensors"))[0] == tensors, "--tag gave another result")
    return tensors


def negative_controls(tensors, reference, names):
    """The comparison sees one flipped bit and two swapped tensors."""
    n0, n1 = names[0], names[-1]
    perturbed = dict(tensors)
    data = bytearray(perturbed[n1][2])
    data[len(data) // 2] ^= 0x01
    perturbed[n1] = (perturbed[n1][0], perturbed[n1][1], bytes(data))
    check(differing(perturbed, reference) == [n1], "negative control: a flipped bit went unseen")
    swapped = dict(tensors)
    swapped[n0], swapped[n1] = tensors[n1], tensors[n0]
    check(sorted(differing(swapped, reference)) == sorted([n0, n1]), "negative control: a swap went unseen")


def check_sharded(d, tensors, names):
    """About 4 KiB per file: the index and each shard; returns the number of shards."""
    sharded = os.path.join(d, "sharded")
    run(tessera, "checkpoint", "consolidate", os.path.join(d, "global_step3"), sharded, "--max-shard-bytes", "4096")
    with open(os.path.join(sharded, "model.safetensors.index.json")) as f:
        index = json.load(f)
    files = sorted(set(index["weight_map"].values()))
    check(len(files) > 2 and sorted(os.listdir(sharded)) == sorted(files + ["model.safetensors.index.json"]),
          f"shards {files} vs {os.listdir(sharded)}")
    check(list(index["weight_map"]) == names, "the index's names are not the model's, in order")
    total, merged = 0, {}
    for i, fname in enumerate(files):
        check(fname == f"model-{i + 1:05d}-of-{len(files):05d}.safetensors", f"shard name {fname}")
        part, _, _ = read_safetensors(os.path.join(sharded, fname))
        check(set(part) == {n for n, f in index["weight_map"].items() if f == fname}, f"{fname} holds {sorted(part)}")
        total += sum(len(t[2]) for t in part.values())
        merged.update(part)
    check(index["metadata"]["total_size"] == total, f"total_size {index['metadata']['total_size']} != {total}")
    check(merged == tensors, "the shards together differ from the single file")
    return len(files)


def file1_pieces(manifest):
    """(tensor, buffer key, piece) of every master piece read from file 1, in model order."""
    maps = {m["map"]["name"]: m for m in manifest["maps"] if m["kind"] == "master"}
    out = []
    for p in manifest["parameters"]:
        m = maps[p["name"]]
        for r in m["map"]["ranks"]:
            out += [(p["name"], m["buffers"]["1"], piece) for piece in (r["pieces"] if r["rank"] == 1 else [])
                    if min(piece["holders"]) == 1 and 0 not in piece["shape"]]
    return out


def check_corruption(d, manifest):
    """A flipped byte in the middle of a tensor's piece in rank 1's file (the middle tensor of those
    it holds): refused naming the file and the first tensor reading that chunk; OUT is not created
    and nothing is left behind. Returns that tensor."""
    pieces = file1_pieces(manifest)
    check(len(pieces) > 2, "rank 1's file holds fewer than 3 master pieces")
    _, key, piece = pieces[len(pieces) // 2]
    buffer = next(b for f in manifest["files"] if f["rank"] == 1 for b in f["buffers"] if b["key"] == key)
    at = (piece["offset"] + piece["shape"][0] // 2 * piece["strides"][0]) * 4 + 1  # a byte in the piece's middle row
    victim = expected_tensor(manifest, at, key)
    check(victim is not None, "no tensor reads the corrupted byte")
    with open(os.path.join(d, "global_step3", "rank1.safetensors"), "r+b") as f:
        f.seek(buffer["data_offset"] + at)
        b = f.read(1)
        f.seek(buffer["data_offset"] + at)
        f.write(bytes([b[0] ^ 0x01]))
    bad_out = os.path.join(d, "bad_out")
    text = run(tessera, "checkpoint", "consolidate", d, bad_out, expect=1)
    for needle in ("rank1.safetensors: buffer '" + key + "'", "do not match their hash", f"tensor '{victim}'"):
        check(needle in text, f"missing {needle!r} in: {text}")
    check(not os.path.exists(bad_out), "OUT was created by a refused consolidation")
    check(not [e for e in os.listdir(d) if ".partial-" in e], f"leftovers in {d}: {os.listdir(d)}")
    return victim


def one_layout(dtype, stage, port_offset):
    d, reference, manifest, names = save(dtype, stage, port_offset)
    tensors = check_single(d, dtype, reference, names)
    negative_controls(tensors, reference, names)
    shards = check_sharded(d, tensors, names)
    binary = os.path.join(d, "bin")
    run(tessera, "checkpoint", "consolidate", d, binary, "--format", "bin")
    check(os.listdir(binary) == ["pytorch_model.bin"], f"{binary}: {os.listdir(binary)}")
    check_bin(os.path.join(binary, "pytorch_model.bin"), reference, names)
    victim = check_corruption(d, manifest)
    text = run(tessera, "checkpoint", "consolidate", d, os.path.join(d, "out"), expect=1)
    check("exists and is not an empty directory" in text, "an existing OUT was not refused")
    print(f"{dtype} stage {stage}: {len(names)} tensors bitwise (single, {shards} shards, bin through torch.load); "
          f"the corrupted chunk named '{victim}'", flush=True)


try:
    one_layout("fp32", 3, 0)
    one_layout("bf16", 2, 1)
    print("checkpoint consolidate: ok")
finally:
    shutil.rmtree(root, ignore_errors=True)
