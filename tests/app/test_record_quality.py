"""A recorded chat must not be a repetition loop (issue 45): ``workbench.record.chat_quality``
takes each reply's distinct 4-gram ratio over its token ids, and ``--record`` reports it.

* the function on known loops and prose;
* a recording on the tiny random-weight model (its replies repeat one token: what a broken
  sampler or template looks like) is reported as loops, on stderr and as a ``chat.quality`` event;
* docs/screenshot.session (the README's picture) played on the pulled SmolLM2-135M-Instruct gives
  replies above the threshold; skipped when the model was not pulled (tests never download).
"""

from __future__ import annotations

import html
import json
import os
import time
from pathlib import Path

import pytest

from workbench import models_store
from workbench.record import (LOOP_RATIO, ChatQuality, chat_quality, distinct_ngram_ratio, host_description,
                              read_events, reply_tokens, run_record)

ROOT = Path(__file__).parents[2]
SESSION = ROOT / "docs" / "screenshot.session"
#: looked up at import: while tests run, tests/conftest.py points $XDG_DATA_HOME at an empty folder
_PULLED = os.environ.get("NUMAWB_SMOLLM2") or models_store.find_pulled()
INSTRUCT = str(_PULLED) if _PULLED and os.path.isfile(_PULLED) else None


def test_distinct_ngram_ratio_tells_a_loop_from_prose():
    loop = ("The capital of France is Paris. " * 8).split()
    prose = ("A CPU, or Central Processing Unit, is the brain of a computer that executes instructions. "
             "It performs calculations, moves data and controls the other devices.").split()
    assert distinct_ngram_ratio(loop) < 0.3 < LOOP_RATIO
    assert distinct_ngram_ratio(prose) == 1.0
    assert distinct_ngram_ratio([7] * 40) == 1 / 37
    assert distinct_ngram_ratio([1, 2, 3]) == 1.0  # no 4-gram: nothing repeats
    assert distinct_ngram_ratio(list(range(10)) * 2, n=2) == 10 / 19


def test_chat_quality_takes_each_replys_tokens_from_the_events():
    ev = [{"kind": "token", "data": {"token": 9}},  # before any chat turn: not a reply
          {"kind": "chat.user", "data": {"text": "hi"}},
          *[{"kind": "token", "data": {"token": t}} for t in [5, 6, 7, 8, 9, 10]],
          {"kind": "snapshot", "data": {}},
          {"kind": "reply.done", "data": {"text": "..."}},
          {"kind": "chat.user", "data": {"text": "again"}},
          *[{"kind": "token", "data": {"token": t}} for t in [1, 2] * 10],
          {"kind": "reply.error", "data": {"error": "x"}}]
    assert reply_tokens(ev) == [[5, 6, 7, 8, 9, 10], [1, 2] * 10]
    q = chat_quality(ev)
    assert q.ratios == (1.0, 2 / 17) and q.lengths == (6, 20) and q.loops == [1]
    assert "reply 2 looks like a repetition loop" in q.line()
    assert ChatQuality((), ()).line() == "chat replies: none recorded"


def test_record_reports_a_looping_session(tmp_path, tiny_model, warm_kernels, capsys):
    script = tmp_path / "s.txt"
    script.write_text("set n_predict=24 seed=1\nload\nchat the cat sat on the mat\nchat tell me more\n")
    out = tmp_path / "rec"
    assert run_record(str(out), script=str(script), model=tiny_model, size=(120, 40)) == 0
    events = read_events(out / "events.jsonl")
    reported = [e["data"] for e in events if e["kind"] == "chat.quality"]
    q = chat_quality(events)
    assert len(reported) == 1 and reported[0] == q.as_dict()
    assert len(q.ratios) == 2 and all(n == 24 for n in q.lengths)
    assert q.loops == [0, 1]  # random weights: one token over and over
    err = capsys.readouterr().err
    assert "numawb: chat replies: distinct 4-gram ratio" in err and "look like repetition loops" in err
    title = html.unescape((out / "03-chat.svg").read_text()).replace("\xa0", " ")
    assert f"recorded {time.strftime('%Y-%m-%d')} on {host_description()}" in title


@pytest.mark.skipif(INSTRUCT is None, reason="SmolLM2-135M-Instruct not pulled (`numawb pull`); tests never download")
def test_the_readme_session_on_the_instruct_model_is_not_a_loop(tmp_path, capsys):
    out = tmp_path / "rec"
    assert run_record(str(out), script=str(SESSION), model=INSTRUCT) == 0
    events = read_events(out / "events.jsonl")
    q = chat_quality(events)
    replies = [e["data"]["text"] for e in events if e["kind"] == "reply.done"]
    assert len(q.ratios) == 2 and all(n >= 20 for n in q.lengths), replies
    assert not q.loops and q.min_ratio >= LOOP_RATIO, (q, replies)
    assert json.loads((out / "events.jsonl").read_text().splitlines()[-1])["kind"] == "chat.quality"
    assert "looks like" not in capsys.readouterr().err
