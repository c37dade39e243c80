#!/usr/bin/env python3
"""scripts/check_layers.py: the includes of include/tileattn/ point one way (issue 28).

The layers, lowest first; a header may include its own layer and any below it, never one
above:

  core < arch, backend < memory < ops < flex, kernels < entry < distributed

"entry" is the top-level headers (forward.hpp, paged.hpp, kv_cache.hpp, checked.hpp, ...)
and detail/ (their argument checks). Layers on one rank (arch and backend; flex and
kernels) may include each other. Every `#include "tileattn/..."` (or <tileattn/...>) of
every header is checked; a header in a folder the order does not name is an error too, so
a new folder must be given its place here.

  python3 scripts/check_layers.py [include/tileattn]

Exits 0 when every include points down or sideways; otherwise prints, one per line,
`file:line: <layer> includes <higher layer> (<included header>)` and exits 1.
Standard library only; CTest runs it (tests/layers/CMakeLists.txt).
"""

import pathlib
import re
import sys

# Rank of each layer; a folder of include/tileattn/ is its layer, except detail/ (entry).
LAYER_RANK = {
    "core": 0,
    "arch": 1,
    "backend": 1,
    "memory": 2,
    "ops": 3,
    "flex": 4,
    "kernels": 4,
    "entry": 5,
    "distributed": 6,
}
ENTRY_FOLDERS = {"detail"}

INCLUDE = re.compile(r'^\s*#\s*include\s*[<"](tileattn/[^>"]+)[>"]')


def layer_of(relative: pathlib.PurePosixPath) -> str:
    """The layer of a header, from its path below include/ or include/tileattn/."""
    parts = relative.parts
    if parts and parts[0] == "tileattn":
        parts = parts[1:]
    if len(parts) == 1 or parts[0] in ENTRY_FOLDERS:
        return "entry"
    return parts[0]


def main(argv: list[str]) -> int:
    root = pathlib.Path(argv[1] if len(argv) > 1 else pathlib.Path(__file__).resolve().parent.parent / "include" / "tileattn")
    if not root.is_dir():
        print(f"check_layers: {root} is not a directory", file=sys.stderr)
        return 2
    errors = []
    headers = sorted(p for p in root.rglob("*") if p.suffix in (".hpp", ".h") and p.is_file())
    for header in headers:
        relative = pathlib.PurePosixPath(header.relative_to(root).as_posix())
        own = layer_of(relative)
        shown = f"{root.name}/{relative}"
        if own not in LAYER_RANK:
            errors.append(f"{shown}:1: folder '{own}' has no place in the layer order (scripts/check_layers.py)")
            continue
        for number, line in enumerate(header.read_text(encoding="utf-8").splitlines(), start=1):
            match = INCLUDE.match(line)
            if not match:
                continue
            target = pathlib.PurePosixPath(match.group(1))
            theirs = layer_of(target)
            if theirs not in LAYER_RANK:
                errors.append(f"{shown}:{number}: includes {target}, whose folder '{theirs}' has no place in the layer order")
            elif LAYER_RANK[theirs] > LAYER_RANK[own]:
                errors.append(f"{shown}:{number}: {own} includes {theirs} ({target}): an arrow up the layers")
    for error in errors:
        print(error)
    if errors:
        print(f"check_layers: {len(errors)} include(s) against the order "
              "core < arch, backend < memory < ops < flex, kernels < entry < distributed")
        return 1
    print(f"check_layers: {len(headers)} headers, every include points down or sideways")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
