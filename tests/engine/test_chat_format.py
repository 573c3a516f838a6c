"""Chat prompts: the file's template when it has one; without one (a base model) no turn format
is invented and the conversation is the text the model continues (completion mode)."""
from __future__ import annotations

import pytest

from gguf_factory import TinySpec, write_tiny_model
from workbench.engine import Chat, Engine, SamplingParams
from workbench.engine.chat import ChatFormatter, Message, completion_text
from workbench.engine.engine import Placement

# Gemma's turns, written in the file as an instruct model's would be
TURNS = ("{{ bos_token }}{% for m in messages %}<start_of_turn>{{ 'model' if m.role == 'assistant' else 'user' }}"
         "\n{{ m.content | trim }}<end_of_turn>\n{% endfor %}"
         "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}")
GEMMA_VOCAB = {"<start_of_turn>", "<end_of_turn>", "<bos>", "<eos>", "<|im_start|>"}


@pytest.mark.parametrize("arch", ["gemma3", "llama", "qwen2"])
def test_no_template_invents_no_turns(arch):
    f = ChatFormatter(None, arch, GEMMA_VOCAB, "<bos>", "<eos>")
    assert not f.can_chat and f.source == "none"
    msgs = [Message("user", "The capital of France is"), Message("assistant", " Paris."),
            Message("user", "The capital of Italy is")]
    text = f.render(msgs)
    assert text == "The capital of France is Paris. The capital of Italy is"
    for marker in GEMMA_VOCAB:
        assert marker not in text


def test_completion_text_joins_without_doubling_spaces():
    m = [Message("user", "one"), Message("assistant", "\ntwo "), Message("user", "three"), Message("assistant", ""),
         Message("user", "four")]
    assert completion_text(m) == "one\ntwo three four"
    assert completion_text([]) == ""


def test_a_file_template_is_used_as_it_is():
    f = ChatFormatter(TURNS, "gemma3", GEMMA_VOCAB, "<bos>", "<eos>")
    assert f.can_chat and f.source == "file"
    assert f.render([Message("user", " hi ")]) == "<bos><start_of_turn>user\nhi<end_of_turn>\n<start_of_turn>model\n"


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, str]:
    d = tmp_path_factory.mktemp("chatfmt")
    out = {}
    for name, tpl in (("base", None), ("instruct", TURNS)):
        out[name] = str(d / f"tiny-{name}.gguf")
        write_tiny_model(out[name], TinySpec(n_ctx=512, chat_template=tpl))
    return out


def test_chat_on_a_base_model_continues_the_text(models, warm_kernels):
    eng = Engine.load(models["base"], placement=Placement(threads=1))
    try:
        tok = eng.tokenizer
        assert not eng.chat_format.can_chat
        chat = Chat(eng, n_ctx=256)
        list(chat.send("the cat sat", SamplingParams(temperature=0), 6))
        first = tok.encode("the cat sat", add_bos=True)
        turn_ids = {tok.token_id("<start_of_turn>"), tok.token_id("<end_of_turn>")}
        assert chat.messages[0] == Message("user", "the cat sat") and chat.messages[1].role == "assistant"
        # the next prompt is the text so far (the first prompt, the reply, the new words): no turns
        chat.messages.append(Message("user", "on the mat"))
        ids = chat.prompt_tokens()
        assert ids == tok.encode(completion_text(chat.messages), add_bos=True, parse_special=True)
        assert ids[:len(first)] == first and not turn_ids & set(ids)
        chat.session.close()
    finally:
        eng.close()


def test_chat_on_a_model_with_a_template_renders_its_turns(models, warm_kernels):
    eng = Engine.load(models["instruct"], placement=Placement(threads=1))
    try:
        tok = eng.tokenizer
        assert eng.chat_format.can_chat
        chat = Chat(eng, n_ctx=256)
        chat.messages.append(Message("user", "the cat"))
        ids = chat.prompt_tokens()
        sot = tok.token_id("<start_of_turn>")
        assert ids[0] == tok.bos_id and ids[1] == sot and ids.count(sot) == 2
        chat.session.close()
    finally:
        eng.close()
