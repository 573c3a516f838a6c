"""User settings persisted as JSON in the XDG config directory.

``$XDG_CONFIG_HOME/numawb/settings.json`` (default ``~/.config/numawb/settings.json``).
Unknown keys are ignored and bad values fall back to defaults, so an old or hand-edited
file never stops the app.
"""
from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .engine.sampling import SamplingParams


@dataclass
class SamplingSettings(SamplingParams):
    """The engine's sampling parameters plus the reply length."""

    n_predict: int = 512

    def params(self) -> SamplingParams:
        return SamplingParams(**{f.name: getattr(self, f.name) for f in dataclasses.fields(SamplingParams)})


@dataclass
class Settings:
    theme: str = "numawb"
    refresh: float = 1.0          # telemetry interval, seconds
    last_model: str | None = None
    n_ctx: int = 4096
    sampling: SamplingSettings = field(default_factory=SamplingSettings)

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "Settings":
        s = cls()
        for f in dataclasses.fields(cls):
            if f.name == "sampling" or f.name not in d:
                continue
            default = getattr(s, f.name)
            v = d[f.name]
            if default is None or v is None or isinstance(v, type(default)) or \
                    (isinstance(default, float) and isinstance(v, int)):
                setattr(s, f.name, v)
        sp = d.get("sampling")
        if isinstance(sp, dict):
            for f in dataclasses.fields(SamplingSettings):
                v = sp.get(f.name)
                default = getattr(s.sampling, f.name)
                if f.name in sp and (v is None and f.name == "seed" or
                                     isinstance(v, (int, float)) and not isinstance(v, bool)):
                    setattr(s.sampling, f.name, type(default)(v) if default is not None and v is not None else v)
        return s


def config_dir() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return Path(base) / "numawb"


def settings_path() -> Path:
    return config_dir() / "settings.json"


def load_settings(path: Path | None = None) -> Settings:
    path = path or settings_path()
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return Settings()
    return Settings.from_json(data) if isinstance(data, dict) else Settings()


def save_settings(settings: Settings, path: Path | None = None) -> Path | None:
    """Write atomically; returns the path, or None when the directory is not writable."""
    path = path or settings_path()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(settings.to_json(), indent=2) + "\n", encoding="utf-8")
        os.replace(tmp, path)
    except OSError:
        return None
    return path
