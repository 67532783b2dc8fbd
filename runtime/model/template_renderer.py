"""Chat templates rendered in a process of their own, within a time, memory and output budget.

Runs in the HTTP frontend (``ServingContext.renderer``), on its tokenize thread; the renders happen in one
spawned child process, which it starts ahead of the first (``start``). A chat template is a program: a
few hundred bytes of Jinja can loop for minutes or build gigabytes, and a thread that runs one cannot be
stopped. So each render is sent to the child with the text budget of the request's prompt, and:
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

import multiprocessing
import os
import threading
from typing import Any, Optional


STARTUP_S = 60.0  # for a child to import transformers' template code, apart from a render's own budget


class TemplateError(ValueError):
    """A render that failed, ran out of its budget, or wrote more than the prompt may hold."""


class TemplateRenderer:
    def __init__(self, seconds: float, memory_bytes: int) -> None:
        self.seconds, self.memory_bytes = seconds, memory_bytes
        self._lock = threading.Lock()  # one render at a time through the one child
        self._conn = None
        self._proc: Optional[multiprocessing.Process] = None
        self._ready = False  # the child said it is ready: a render's clock starts then, not at the child's start

    def start(self) -> None:
        """The child, ahead of the first render (its start imports transformers' template code)."""
        with self._lock:
            self._ensure()
            self._wait_ready()

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
        with self._lock:
            self._ensure()
            try:
                self._wait_ready()
                self._conn.send(job)
                if not self._conn.poll(self.seconds):
                    self._replace()
                    raise TemplateError(f"the chat template did not render within {self.seconds:g} s")
                ok, value, spent = self._conn.recv()
            except (EOFError, OSError, BrokenPipeError):
                self._replace()
                raise TemplateError("the chat template's renderer died rendering it") from None
            if spent:
                self._replace()  # (a fresh child gives back what this render took)
            if not ok:
                raise TemplateError(value)
            return value

    def close(self) -> None:
        with self._lock:
            self._stop()

    def _ensure(self) -> None:
        if self._proc is not None and self._proc.is_alive():
            return
        self._stop()
        ctx = multiprocessing.get_context("spawn")  # (no fork of a process that holds threads and a model)
        parent, child = ctx.Pipe()
        self._proc = ctx.Process(target=_serve, args=(child, self.memory_bytes), name="chat-template", daemon=True)
        self._proc.start()
        child.close()
        self._conn, self._ready = parent, False

    def _wait_ready(self) -> None:
        if self._ready:
            return
        if not self._conn.poll(STARTUP_S):
            self._stop()
            raise TemplateError(f"the chat template's renderer did not start within {STARTUP_S:g} s")
        self._conn.recv()
        self._ready = True

    def _replace(self) -> None:
        """A new child in this one's place, starting while the caller answers (its imports take a second)."""
        self._stop()
        self._ensure()

    def _stop(self) -> None:
        if self._proc is not None:
            self._proc.kill()
            self._proc.join(5)
        if self._conn is not None:
            self._conn.close()
        self._proc = self._conn = None


def _serve(conn, memory_bytes: int) -> None:
    """The child: renders until its parent's end of the pipe closes."""
    import resource

    from transformers.utils.chat_template_utils import _normalize_chat_messages, render_jinja_template

    used = _data_bytes()
    resource.setrlimit(resource.RLIMIT_DATA, (used + memory_bytes, resource.RLIM_INFINITY))
    conn.send(("ready",))
    while True:
        try:
            job = conn.recv()
        except (EOFError, OSError):
            return
        template, conversation, tools, documents, add_generation_prompt, continue_final, kwargs, max_chars = job
        try:
            texts, _ = render_jinja_template(
                conversations=[_normalize_chat_messages(conversation)], tools=tools, documents=documents,
                chat_template=template, return_assistant_tokens_mask=False, continue_final_message=continue_final,
                add_generation_prompt=add_generation_prompt, **kwargs)
            text = texts[0]
            if len(text) > max_chars:  # (ok, text or reason, whether this child should be replaced)
                reply = (False, f"the chat template wrote {len(text)} characters, more than the prompt may hold "
                                f"({max_chars})", True)
            else:
                reply = (True, text, False)
        except MemoryError:
            reply = (False, f"the chat template took more than its {memory_bytes >> 20} MiB of memory to render",
                     True)
        except Exception as exc:  # jinja's errors, and a template that raises on purpose
            reply = (False, f"the chat template could not be applied: {exc}", False)
        conn.send(reply)


def _data_bytes() -> int:
    """This process's data segment now (VmData), what RLIMIT_DATA counts."""
    with open(f"/proc/{os.getpid()}/status") as f:
        for line in f:
            if line.startswith("VmData:"):
                return int(line.split()[1]) * 1024
    return 0
