"""The embedded inference engine (Numba). Imports nothing from Textual.

Public API: `Engine.load()`, `Engine.new_session()`, `Session.generate()`,
`Chat`, `SamplingParams`, the event types and `ModelLoadError`.
"""

from .chat import ChatTemplateError, Message
from .engine import Chat, ContextFullError, DoneEvent, Engine, Session, Stats, TokenEvent, default_model_path
from .gguf_file import ModelLoadError
from .sampling import SamplingParams

__all__ = ["Chat", "ChatTemplateError", "ContextFullError", "DoneEvent", "Engine", "Message", "ModelLoadError",
           "SamplingParams", "Session", "Stats", "TokenEvent", "default_model_path"]
