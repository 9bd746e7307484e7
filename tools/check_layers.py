#!/usr/bin/env python3
"""Fails (exit 1, one line per offence) when a source file includes a header of a layer above its own.

Run by the build (the `check_layers` target, part of `all`), so a wrong upward include fails the
build even where the headers are on the include path anyway (Debian puts LibTorch and CAF in
/usr/include, and every tessera header is reachable from the repository root). The layers
(docs/DESIGN.md §1):

  core/affine, core/zero plan   no LibTorch, no CAF, nothing of tessera above core
  core/                         no transport/, actors/, examples/, tools/, bench/
  transport/                    no actors/, examples/
  actors/ (training actors)     no actors/engine/, actors/rollout/
  actors/engine/ (facade)       no actors/rollout/

  python3 tools/check_layers.py [ROOT]
"""
import os
import re
import sys

INCLUDE = re.compile(r'^\s*#\s*include\s*[<"]([^>"]+)[>"]')
TORCH = ("torch/", "ATen/", "c10/", "caf/")
# LibTorch-free files of core/zero: the sharding plan and what it is built from.
ZERO_PLAN = {"sharding_plan", "bucket_plan", "flat_group_layout", "unit_layout"}


def forbidden(path):
    """(prefixes a file at `path` may not include, why)."""
    parts = path.split("/")
    stem = os.path.splitext(parts[-1])[0]
    upper = ("actors/", "transport/", "examples/", "tools/", "bench/")
    if path.startswith("core/affine/"):
        return upper + TORCH, "core/affine is LibTorch-free and below everything"
    if path.startswith("core/zero/") and stem in ZERO_PLAN:
        return upper + TORCH, "the sharding plan is LibTorch-free (tessera_zero_plan)"
    if path.startswith("core/"):
        return upper, "core is the lowest layer"
    if path.startswith("transport/"):
        return ("actors/", "examples/", "bench/"), "transport is below actors"
    if path.startswith("actors/engine/"):
        return ("actors/rollout/",), "the engine facade is below the rollout actors"
    if path.startswith("actors/") and len(parts) == 2:
        return ("actors/engine/", "actors/rollout/"), "the training actors are below the engine facade"
    return (), ""


def main():
    root = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), ".."))
    offences = []
    for top in ("core", "transport", "actors"):
        for directory, _, files in os.walk(os.path.join(root, top)):
            for name in sorted(files):
                if not name.endswith((".h", ".cpp", ".hpp", ".cu")):
                    continue
                path = os.path.relpath(os.path.join(directory, name), root).replace(os.sep, "/")
                banned, why = forbidden(path)
                if not banned:
                    continue
                with open(os.path.join(root, path), encoding="utf-8", errors="replace") as f:
                    for number, line in enumerate(f, 1):
                        m = INCLUDE.match(line)
                        if m and m.group(1).startswith(banned):
                            offences.append(f"{path}:{number}: includes {m.group(1)} ({why})")
    for offence in offences:
        print(offence, file=sys.stderr)
    if offences:
        print(f"check_layers: {len(offences)} upward include(s); see docs/DESIGN.md §1", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
