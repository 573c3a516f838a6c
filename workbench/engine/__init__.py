"""The embedded inference engine (Numba). Imports nothing from Textual.

Public API: `Engine.load()`, `Engine.new_session()`, `Session.generate()`,
`Chat`, `SamplingParams`, the event types (engine/events.py) and `ModelLoadError`; `Generation` and `Picker`
(engine/generation.py), the one token loop every generator uses (Session.generate, the
batching scheduler, a model pipelined over Ray hosts).
"""

from .chat import ChatTemplateError, Message
from .engine import Chat, Engine, Session, default_model_path
from .events import ContextFullError, DoneEvent, Stats, TokenEvent
from .generation import Generation, Picker
from .gguf_file import ModelLoadError
from .sampling import SamplingParams

__all__ = ["Chat", "ChatTemplateError", "ContextFullError", "DoneEvent", "Engine", "Generation", "Message",
           "ModelLoadError", "Picker", "SamplingParams", "Session", "Stats", "TokenEvent", "default_model_path"]
