"""The menu of flexible attention's mods (tileattn/flex/mods.hpp) for Python: mask clauses
ANDed into one mask_mod, and a relative-position bias score_mod. One compiled kernel serves
every entry (the extension picks the mod at run time); the block mask is built from the
mask for each call, so empty blocks are skipped and full ones need no mask.

    import tileattn.flex as tf
    mask = [tf.Causal(), tf.Document(doc_ids)]          # causal within each packed document
    o, lse = tileattn.flex_attention(q, k, v, mask=mask)  # or tileattn.torch.flex_attention

Positions count from the sequence's start (query i, key j); the masks depend on positions
only, so one block mask serves every batch entry and head.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Sequence, Tuple

from . import _C
from ._errors import invalid as _invalid


@dataclass(frozen=True)
class Causal:
    """Query i sees keys j <= i + offset (0: FlexAttention's top-left diagonal)."""
    offset: int = 0


@dataclass(frozen=True)
class SlidingWindow:
    """Keys j with i + offset - left <= j <= i + offset + right (-1: unbounded side)."""
    left: int = -1
    right: int = 0
    offset: int = 0


@dataclass(frozen=True)
class Document:
    """Packed documents: query i sees key j iff doc_q[i] == doc_kv[j] (int32 ids; doc_kv
    defaults to doc_q, self-attention)."""
    doc_q: Any
    doc_kv: Any = None


@dataclass(frozen=True)
class PrefixLM:
    """The first `prefix` keys seen by every query, the rest causally (top-left)."""
    prefix: int


@dataclass(frozen=True)
class GlobalWindow:
    """Longformer: the first `globals` positions see and are seen by all; the others see keys
    within `window` on each side."""
    globals: int
    window: int


@dataclass(frozen=True)
class DilatedWindow:
    """Keys at distances 0, dilation, 2 dilation, ... up to window x dilation (causal)."""
    window: int
    dilation: int = 1


@dataclass(frozen=True)
class BlockSparse:
    """A layout of blocks: layout[qb, kb] != 0 (uint8 [query blocks, key blocks]) when query
    block qb sees key block kb, blocks of `block` positions."""
    layout: Any
    block: int = 128


@dataclass(frozen=True)
class RelativeBias:
    """score_mod: score + table[h, clamp(i - j, -max_distance, max_distance) + max_distance],
    table float32 [heads_q, 2 max_distance + 1] (T5, Swin)."""
    table: Any
    max_distance: int


Mask = Sequence[Any]


def clauses(mask: Optional[Mask]) -> Tuple[Tuple[int, ...], Any, Any, Any]:
    """The (kind, a, b, c) quadruples of a mask, flattened, and the arrays it reads:
    (clauses, doc_q, doc_kv, layout)."""
    out, doc_q, doc_kv, layout = [], None, None, None
    for m in (mask or ()):
        if isinstance(m, Causal):
            out += [0, m.offset, 0, 0]
        elif isinstance(m, SlidingWindow):
            out += [1, m.left, m.right, m.offset]
        elif isinstance(m, Document):
            if doc_q is not None:
                raise _invalid("mask", "at most one Document clause")
            out += [2, 0, 0, 0]
            doc_q, doc_kv = m.doc_q, m.doc_kv
        elif isinstance(m, PrefixLM):
            out += [3, m.prefix, 0, 0]
        elif isinstance(m, GlobalWindow):
            out += [4, m.globals, m.window, 0]
        elif isinstance(m, DilatedWindow):
            out += [5, m.window, m.dilation, 0]
        elif isinstance(m, BlockSparse):
            if layout is not None:
                raise _invalid("mask", "at most one BlockSparse clause")
            out += [6, 0, m.block, 0]
            layout = m.layout
        else:
            raise _invalid("mask", f"{m!r} is not one of tileattn.flex's masks")
    return tuple(out), doc_q, doc_kv, layout


def spec(mask: Optional[Mask], score_mod: Optional[RelativeBias], block_size: Tuple[int, int]) -> "_C.FlexSpec":
    """The extension's description of a flex call (arrays must be int32 / uint8 / float32)."""
    s = _C.FlexSpec()
    s.clauses, s.doc_q, s.doc_kv, s.layout = clauses(mask)
    if score_mod is not None:
        if not isinstance(score_mod, RelativeBias):
            raise _invalid("score_mod", f"{score_mod!r} is not tileattn.flex.RelativeBias")
        s.table = score_mod.table.reshape(-1) if hasattr(score_mod.table, "reshape") else score_mod.table
        s.max_distance = int(score_mod.max_distance)
    s.block_q, s.block_kv = int(block_size[0]), int(block_size[1])
    return s
