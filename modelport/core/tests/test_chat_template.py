"""Chat templates in the gateway's sandbox: rendered as Hugging Face renders them, and bounded against a hostile
team's template (Python's internals, time, size)."""

from __future__ import annotations

import time

import pytest

from modelport.core.chat_template import (
    DEFAULT_TEMPLATE,
    MAX_TEMPLATE_BYTES,
    RenderFailed,
    TemplateRejected,
    compile_template,
    render,
)

MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]


def test_the_default_template_writes_each_message_then_opens_the_assistants_turn() -> None:
    assert render(compile_template(DEFAULT_TEMPLATE), MESSAGES) == "system: Be brief.\nuser: Hi\nassistant: "


def test_a_hugging_face_style_template_renders_with_raise_exception_and_trimmed_blocks() -> None:
    source = ("{% for m in messages %}\n{% if m.role == 'tool' %}{{ raise_exception('no tools') }}{% endif %}\n"
              "<|{{ m.role }}|>{{ m.content }}{{ eos_token }}\n{% endfor %}\n"
              "{% if add_generation_prompt %}<|assistant|>{% endif %}")
    assert render(compile_template(source), MESSAGES) == "<|system|>Be brief.\n<|user|>Hi\n<|assistant|>"
    with pytest.raises(RenderFailed, match="refused the messages: no tools"):
        render(compile_template(source), [{"role": "tool", "content": "x"}])


def test_a_syntax_error_names_its_line_and_a_huge_template_is_refused() -> None:
    with pytest.raises(TemplateRejected, match="line 2"):
        compile_template("fine\n{% for %}")
    with pytest.raises(TemplateRejected, match="limit"):
        compile_template("x" * (MAX_TEMPLATE_BYTES + 1))


@pytest.mark.parametrize("source", ["{{ ''.__class__.__mro__ }}", "{{ cycler.__init__.__globals__ }}",
                                    "{{ messages.append(1) }}", "{{ joiner.__init__.__globals__['os'] }}"])
def test_a_template_cannot_reach_pythons_internals_or_change_the_messages(source: str) -> None:
    with pytest.raises(RenderFailed, match="unsafe"):
        render(compile_template(source), MESSAGES)


@pytest.mark.parametrize("source", [
    "{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}{% endfor %}",
    "{% set r = range(100000)|list %}{% for a in r %}{% for b in r %}{% for c in r %}{% endfor %}{% endfor %}"
    "{% endfor %}",
    "{% macro f(n) %}{{ f(n) }}{{ f(n) }}{% endmacro %}{{ f(1) }}",
])
def test_a_template_that_would_run_for_ever_is_stopped_within_its_time(source: str) -> None:
    started = time.monotonic()
    with pytest.raises(RenderFailed):
        render(compile_template(source), MESSAGES, seconds=0.2)
    assert time.monotonic() - started < 2


@pytest.mark.parametrize("source", [
    "{{ 'x' * 1000000000 }}", "{{ 'x'|center(1000000000) }}", "{{ 'x'.ljust(1000000000) }}",
    "{{ '%999999999s' % 'a' }}", "{{ '{:>999999999}'.format('a') }}", "{{ 2 ** 100000000 }}",
    "{% set ns = namespace(s='ab') %}{% for i in range(100) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
    "{% macro f(s) %}{{ f(s ~ s) }}{% endmacro %}{{ f('a') }}",
    "{% for i in range(100000) %}{{ 'xxxxxxxxxxxxxxxxxxxxxxxx' }}{% endfor %}",
])
def test_a_template_that_would_build_a_huge_value_is_refused_before_it_takes_the_memory(source: str) -> None:
    started = time.monotonic()
    with pytest.raises(RenderFailed, match="limit|power"):
        render(compile_template(source), MESSAGES)
    assert time.monotonic() - started < 1
