"""Chat templates rendered in a process of their own: the text apply_chat_template gives, and a template
that runs too long, allocates too much or writes more than the prompt may hold is a TemplateError (a 400
at the server) within its budget, after which the next render works."""
import time

import pytest

from actorserve.runtime.model_files import resolve_model_path
from actorserve.runtime.text.template_renderer import TemplateError, TemplateRenderer
from actorserve.runtime.text.tokenizer import load_tokenizer

CONVERSATION = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2 + 2?"}]
TOOLS = [{"type": "function", "function": {"name": "add", "description": "Add two numbers",
                                           "parameters": {"type": "object", "properties": {"a": {"type": "number"}}}}}]
TOOL_TEMPLATE = ("{% for t in tools %}[{{ t.function.name }}: {{ t.function.description }}]{% endfor %}"
                 "{% for m in messages %}<{{ m.role }}>{{ m.content }}{{ eos_token }}{% endfor %}"
                 "{% if add_generation_prompt %}<assistant>{% endif %}")
SLOW = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"
HUGE = "{% set a = 'x' * 100000000 %}{{ (a ~ a ~ a ~ a ~ a ~ a ~ a ~ a)|length }}"
LONG = "{{ 'x ' * 2500000 }}"
RAISES = "{{ raise_exception('roles must alternate') }}"


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(resolve_model_path(None))


@pytest.fixture(scope="module")
def renderer():
    r = TemplateRenderer(seconds=2.0, memory_bytes=256 << 20)
    r.start()
    yield r
    r.close()


@pytest.mark.parametrize("template, tools, kwargs", [(None, None, {}), (TOOL_TEMPLATE, TOOLS, {"extra": 1}),
                                                     (None, None, {"add_generation_prompt": False})])
def test_renders_what_apply_chat_template_renders(tokenizer, renderer, template, tools, kwargs):
    generation = kwargs.pop("add_generation_prompt", True)
    expected = tokenizer.apply_chat_template(CONVERSATION, tokenize=False, chat_template=template, tools=tools,
                                             add_generation_prompt=generation, **kwargs)
    assert renderer.render(tokenizer, CONVERSATION, 10 ** 6, template, tools, None, generation, False,
                           kwargs) == expected


@pytest.mark.parametrize("template, words", [(SLOW, "within 2 s"), (HUGE, "256 MiB of memory"),
                                             (LONG, "5000000 characters, more than the prompt may hold"),
                                             (RAISES, "roles must alternate")])
def test_a_template_past_its_budget_is_an_error_and_the_next_render_works(tokenizer, renderer, template, words):
    start = time.monotonic()
    with pytest.raises(TemplateError, match=words):
        renderer.render(tokenizer, CONVERSATION, 10 ** 6, template)
    assert time.monotonic() - start < 4.0
    assert renderer.render(tokenizer, CONVERSATION, 10 ** 6).startswith("<|im_start|>system\nBe brief.")
