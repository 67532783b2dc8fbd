"""Chat templates rendered in a process of their own, within a time, memory and output budget.

Runs in the HTTP frontend (``ServingContext.renderer``), on its tokenize thread; the renders happen in one
child process (``runtime.budgeted_child``), started ahead of the first (``start``). A chat template is a
program: a few hundred bytes of Jinja can loop for minutes or build gigabytes. So each render is sent to
the child with the text budget of the request's prompt, and:
- one that runs past ``seconds`` is abandoned: the child is killed (a new one serves the next render);
- one that allocates past ``memory_bytes`` fails inside the child (its data segment is limited), which is
  then replaced, so that what it took goes back to the system (a template that merely raises, as many do
  for roles out of order, keeps the child);
- one whose text is longer than the budget is refused in the child, before the text crosses back.
Each is a ``TemplateError`` (a ValueError: the request's fault, a 400). Sends and receives only plain
values (strings, lists, dicts): the child runs transformers' own renderer (``render_jinja_template``), the
one ``apply_chat_template`` runs, on the template and special tokens the tokenizer gives.
"""
from __future__ import annotations

from typing import Any, Optional

from actorserve.runtime.budgeted_child import BudgetedChild, ChildDied, ChildOutOfMemory, ChildTimeout, JobFailed, \
    Replace


class TemplateError(ValueError):
    """A render that failed, ran out of its budget, or wrote more than the prompt may hold."""


class TemplateRenderer:
    def __init__(self, seconds: float, memory_bytes: int) -> None:
        self.seconds, self.memory_bytes = seconds, memory_bytes
        self._child = BudgetedChild("chat-template", _Render(), memory_bytes)

    def start(self) -> None:
        """The child, ahead of the first render (its start imports transformers' template code)."""
        try:
            self._child.start()
        except ChildTimeout as exc:
            raise TemplateError(f"the chat template's renderer: {exc}") from None

    def render(self, tokenizer, conversation: list[dict], max_chars: int, chat_template: Optional[str] = None,
               tools: Optional[list] = None, documents: Optional[list] = None, add_generation_prompt: bool = True,
               continue_final_message: bool = False, template_kwargs: Optional[dict[str, Any]] = None) -> str:
        """The text ``tokenizer.apply_chat_template(..., tokenize=False)`` gives, rendered in the child."""
        try:
            template = tokenizer.get_chat_template(chat_template, tools)
        except ValueError as exc:
            raise TemplateError(str(exc)) from None
        kwargs = {**tokenizer.special_tokens_map, **(template_kwargs or {})}
        job = (template, conversation, tools, documents, add_generation_prompt, continue_final_message, kwargs,
               max_chars)
        try:
            return self._child.run(job, self.seconds)
        except ChildTimeout:
            raise TemplateError(f"the chat template did not render within {self.seconds:g} s") from None
        except ChildOutOfMemory as exc:
            raise TemplateError(f"the chat template took {exc} to render") from None
        except ChildDied:
            raise TemplateError("the chat template's renderer died rendering it") from None
        except JobFailed as exc:
            raise TemplateError(str(exc)) from None

    def close(self) -> None:
        self._child.close()


class _Render:
    """The child's side: transformers' own renderer, the one ``apply_chat_template`` runs."""

    def prepare(self) -> None:
        from transformers.utils import chat_template_utils  # noqa: F401  (imported before the budget is set)

    def __call__(self, job) -> str:
        from transformers.utils.chat_template_utils import _normalize_chat_messages, render_jinja_template

        template, conversation, tools, documents, add_generation_prompt, continue_final, kwargs, max_chars = job
        try:
            texts, _ = render_jinja_template(
                conversations=[_normalize_chat_messages(conversation)], tools=tools, documents=documents,
                chat_template=template, return_assistant_tokens_mask=False, continue_final_message=continue_final,
                add_generation_prompt=add_generation_prompt, **kwargs)
        except MemoryError:
            raise
        except Exception as exc:  # jinja's errors, and a template that raises on purpose
            raise ValueError(f"the chat template could not be applied: {exc}") from None
        text = texts[0]
        if len(text) > max_chars:
            raise Replace(f"the chat template wrote {len(text)} characters, more than the prompt may hold "
                          f"({max_chars})")
        return text
