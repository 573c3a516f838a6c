"""The one vocabulary of placement modes: names, parsing and validation.

Every caller (command line, bench, app, engine, advisor) parses and lists modes
here, so a new mode is added in one place and every error reads the same.
"""
from __future__ import annotations

from typing import Iterable, Sequence

from ..errors import UserError

#: weights modes, in the order menus and ``--weights all`` list them
WEIGHT_MODES: tuple[str, ...] = ("none", "interleave", "mirror", "slice", "auto")
#: modes that only mean something for a mixture-of-experts model (whole experts owned by nodes)
EXPERT_MODES: tuple[str, ...] = ("experts",)
WEIGHT_MODE_HELP = "none | interleave | mirror | slice | auto | experts (MoE)"
#: KV modes that need no node number; ``node:N`` binds the cache to node N
KV_FIXED: tuple[str, ...] = ("first-touch", "interleave")
KV_MODE_HELP = "first-touch | interleave | node:N"
#: how workers spread over nodes
POLICIES: tuple[str, ...] = ("distribute", "isolate")


class ModeError(UserError, ValueError):
    """An unknown or impossible placement mode; the message is one line for the user."""


def parse_weights(text: str) -> str:
    """A weights mode name, checked."""
    mode = str(text).strip()
    if mode not in WEIGHT_MODES + EXPERT_MODES:
        raise ModeError(f"unknown weights mode {text!r} (one of {', '.join(WEIGHT_MODES + EXPERT_MODES)})")
    return mode


def kv_node(mode: str) -> int | None:
    """The node of a ``node:N`` KV mode, None for the others (assumes a parsed mode)."""
    return int(mode[5:]) if mode.startswith("node:") else None


def parse_kv(text: str, nodes: Iterable[int] | None = None) -> str:
    """A KV mode, checked; with ``nodes``, ``node:N`` must name one of them."""
    mode = str(text).strip()
    if mode in KV_FIXED:
        return mode
    if not (mode.startswith("node:") and mode[5:].isdigit()):
        raise ModeError(f"unknown KV mode {text!r} (one of {KV_MODE_HELP})")
    if nodes is not None:
        ids = list(nodes)
        if int(mode[5:]) not in ids:
            raise ModeError(f"KV mode {mode}: this machine has no node {mode[5:]} "
                            f"(nodes: {', '.join(map(str, ids))})")
    return mode


def kv_choices(nodes: Sequence[int]) -> list[str]:
    """Every KV mode on a machine with these nodes."""
    return list(KV_FIXED) + [f"node:{n}" for n in nodes]


def parse_weights_list(spec: str) -> list[str]:
    """``all`` or a comma-separated list of weights modes (bench)."""
    if spec.strip() == "all":
        return list(WEIGHT_MODES)
    modes = [parse_weights(m) for m in spec.split(",") if m.strip()]
    if not modes:
        raise ModeError(f"no weights mode in {spec!r}")
    return modes


def parse_kv_list(spec: str, nodes: Sequence[int]) -> list[str]:
    """``all`` or a comma-separated list of KV modes (bench)."""
    if spec.strip() == "all":
        return kv_choices(nodes)
    modes = [parse_kv(m, nodes) for m in spec.split(",") if m.strip()]
    if not modes:
        raise ModeError(f"no KV mode in {spec!r}")
    return modes
