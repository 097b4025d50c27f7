"""An optional LLM for maintenance: refine consolidated text, write insights.

Never on the write path. Two ways to reach one, both configured in
``[maintenance]``: an OpenAI-compatible chat endpoint (``llm_base_url``), or a
command (``llm_command``) such as a coding-agent CLI in print mode. A command
runs without a shell: ``{prompt}`` in the template becomes one argument, and
without it the prompt goes to standard input. Whatever fails (timeout, error
status, empty answer) raises ``LLMError``; the caller keeps the text it had.
"""

from __future__ import annotations

import shlex
import subprocess
from typing import Protocol

import anyio
import httpx

from memory_mcp.config import MaintenanceSettings
from memory_mcp.errors import MemoryMcpError

MAX_ANSWER_CHARS = 4000


class LLMError(MemoryMcpError):
    """The LLM did not give a usable answer."""

    exit_code = 69  # EX_UNAVAILABLE


class LLM(Protocol):
    @property
    def name(self) -> str: ...

    async def complete(self, prompt: str) -> str: ...


class ChatEndpoint:
    """An OpenAI-compatible ``/chat/completions`` endpoint (ollama, vLLM, a cloud API)."""

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        api_key: str = "",
        timeout: float = 120.0,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.model = model
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._timeout = timeout
        self._transport = transport

    @property
    def name(self) -> str:
        return f"chat:{self.model or self.base_url}"

    async def complete(self, prompt: str) -> str:
        body = {
            "model": self.model,
            "messages": [{"role": "user", "content": prompt}],
            "temperature": 0,
        }
        try:
            async with httpx.AsyncClient(
                timeout=self._timeout, headers=self._headers, transport=self._transport
            ) as client:
                response = await client.post(f"{self.base_url}/chat/completions", json=body)
                response.raise_for_status()
                data = response.json()
            text = data["choices"][0]["message"]["content"]
        except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError) as exc:
            raise LLMError(f"{self.name} gave no answer: {exc}") from exc
        return _answer(text, self.name)


class Command:
    """A command that reads a prompt and prints an answer (``claude -p {prompt}``)."""

    def __init__(self, template: str, *, timeout: float = 120.0) -> None:
        self.argv = command_argv(template)
        self._timeout = timeout

    @property
    def name(self) -> str:
        return f"command:{self.argv[0]}"

    async def complete(self, prompt: str) -> str:
        placeholder = any("{prompt}" in arg for arg in self.argv)
        argv = [arg.replace("{prompt}", prompt) for arg in self.argv]
        # Never the server's own stdin: over stdio, that is the MCP client's pipe.
        feed = {"stdin": subprocess.DEVNULL} if placeholder else {"input": prompt.encode("utf-8")}
        try:
            with anyio.fail_after(self._timeout):
                done = await anyio.run_process(argv, check=False, start_new_session=True, **feed)
        except TimeoutError as exc:
            raise LLMError(f"{self.name} did not answer within {self._timeout:g} s") from exc
        except OSError as exc:
            raise LLMError(f"{self.name} could not run: {exc}") from exc
        if done.returncode != 0:
            detail = done.stderr.decode("utf-8", "replace").strip()[-300:]
            raise LLMError(f"{self.name} exited with {done.returncode}: {detail}")
        return _answer(done.stdout.decode("utf-8", "replace"), self.name)


def command_argv(template: str) -> list[str]:
    """A command template as arguments (shell quoting rules, no shell).

    Raises:
        LLMError: it does not split (an unbalanced quote) or names nothing.
    """
    try:
        argv = shlex.split(template)
    except ValueError as exc:
        raise LLMError(f"maintenance.llm_command {template!r} does not parse: {exc}") from exc
    if not argv:
        raise LLMError("maintenance.llm_command names no command")
    return argv


def _answer(text: object, name: str) -> str:
    if not isinstance(text, str) or not text.strip():
        raise LLMError(f"{name} answered with nothing")
    answer = text.strip()
    if len(answer) > MAX_ANSWER_CHARS:
        raise LLMError(f"{name} answered with {len(answer):,} characters; expected a short text")
    return answer


def build_llm(settings: MaintenanceSettings) -> LLM | None:
    """The configured LLM: the endpoint if set, else the command, else none."""
    if settings.llm_base_url:
        return ChatEndpoint(
            settings.llm_base_url,
            settings.llm_model,
            api_key=settings.llm_api_key,
            timeout=settings.llm_timeout,
        )
    if settings.llm_command:
        return Command(settings.llm_command, timeout=settings.llm_timeout)
    return None


def refine_prompt(texts: list[str]) -> str:
    """Ask for one statement that keeps every fact of several near-identical memories."""
    return _prompt(
        "These notes about one software project say the same thing in different words. "
        "Write them as ONE short statement for a coding agent. Keep every concrete detail "
        "(commands, paths, versions, names, numbers); add nothing. Answer with the statement "
        "only, no preamble.",
        texts,
    )


def insight_prompt(texts: list[str]) -> str:
    """Ask for a summary of a group of related memories."""
    return _prompt(
        "These notes about one software project are related. Summarize what they say "
        "together in two to four sentences for a coding agent starting work on the project. "
        "Keep concrete details (commands, paths, versions); add nothing. Answer with the "
        "summary only.",
        texts,
    )


def _prompt(task: str, texts: list[str]) -> str:
    return task + "\n\n" + "\n".join(f"- {t}" for t in texts)
