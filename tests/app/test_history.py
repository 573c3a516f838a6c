"""Chat history: saved per turn, restored on start, torn lines ignored, --new-chat keeps the old file."""

from __future__ import annotations

from workbench.engine.chat import Message
from workbench.history import ChatHistory, state_dir


def test_state_dir_follows_xdg(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    assert state_dir() == tmp_path / "numawb"
    assert ChatHistory.default().path == tmp_path / "numawb" / "chat.jsonl"


def test_append_load_and_torn_line(tmp_path):
    h = ChatHistory(tmp_path / "s" / "chat.jsonl")
    assert h.load() == []
    h.append(Message("user", "héllo"), Message("assistant", "hi ✓\nthere"))
    h.append(Message("user", "again"), Message("assistant", "ok"))
    with open(h.path, "ab") as f:  # a crash in the middle of a write
        f.write(b'{"role": "user", "cont')
    msgs = h.load()
    assert [(m.role, m.content) for m in msgs] == [
        ("user", "héllo"), ("assistant", "hi ✓\nthere"), ("user", "again"), ("assistant", "ok")]


def test_start_new_keeps_the_old_conversation(tmp_path):
    h = ChatHistory(tmp_path / "chat.jsonl")
    h.append(Message("user", "old"))
    h.start_new()
    assert h.load() == []
    kept = [p for p in tmp_path.iterdir() if p.name.startswith("chat-")]
    assert len(kept) == 1 and "old" in kept[0].read_text()


def test_regenerate_marker_drops_the_last_turn(tmp_path):
    h = ChatHistory(tmp_path / "chat.jsonl")
    h.append(Message("user", "a"), Message("assistant", "b"))
    h.append(Message("user", "c"), Message("assistant", "d"))
    h.drop_last_turn()
    h.append(Message("user", "c"), Message("assistant", "d2"))
    assert [m.content for m in h.load()] == ["a", "b", "c", "d2"]
