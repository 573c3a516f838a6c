"""Themes from the repository's ``themes/*.json`` (see themes/README.md) and node colours."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from textual.theme import Theme

THEMES_DIR = Path(__file__).resolve().parents[2] / "themes"
_THEME_KEYS = ("primary", "secondary", "warning", "error", "success", "accent", "foreground",
               "background", "surface", "panel", "boost", "dark", "ansi")
FALLBACK_NODE_COLORS = ("blue", "yellow", "green", "magenta", "cyan", "red", "bright_blue", "bright_green")


@dataclass(frozen=True)
class Palette:
    """Colours the widgets draw with (Rich colour strings)."""

    nodes: tuple[str, ...] = FALLBACK_NODE_COLORS
    system: str = "bright_black"
    free: str = "black"

    def node(self, node_id: int) -> str:
        """Stable colour of a node: the same node id always gets the same colour."""
        return self.nodes[node_id % len(self.nodes)]


def load_themes(directory: Path = THEMES_DIR) -> dict[str, tuple[Theme, Palette]]:
    """Every valid theme file, by name; broken files are skipped."""
    out: dict[str, tuple[Theme, Palette]] = {}
    for f in sorted(directory.glob("*.json")):
        try:
            d = json.loads(f.read_text(encoding="utf-8"))
            theme = Theme(name=d["name"], variables=dict(d.get("variables", {})),
                          **{k: d[k] for k in _THEME_KEYS if k in d})
            mem = d.get("mem_colors", {})
            pal = Palette(tuple(d.get("node_colors") or FALLBACK_NODE_COLORS),
                          mem.get("system", "bright_black"), mem.get("free", "black"))
        except (OSError, ValueError, KeyError, TypeError):
            continue
        out[theme.name] = (theme, pal)
    return out
