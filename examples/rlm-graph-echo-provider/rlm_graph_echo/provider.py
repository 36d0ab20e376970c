"""The ``echo`` provider: `JSONProvider` does the HTTP, retries and key hygiene; this
module only says how the Echo API's requests and answers look.

The Echo API::

    POST {base_url}/echo          header  X-Echo-Key: <key>
    {"model": "echo-1", "system": "...", "shout": false,
     "messages": [{"role": "user", "text": "..."}, {"role": "assistant", "text": "..."}, ...]}
    -> 200 {"text": "...", "tokens_in": 12, "tokens_out": 3, "done": "complete"}
    -> 4xx/5xx {"detail": "what went wrong"}

A request carries the whole conversation: a root model's second turn is its history
(the task, its first reply, the REPL's output), not only the last user message.
"""

from __future__ import annotations

from typing import Any

from rlm_graph.http import (
    BadResponse,
    ChatRequest,
    ChatResponse,
    JSONProvider,
    KeyPolicy,
    Usage,
    reason_text,
    resolve_key,
    token_count,
)

__all__ = ["EchoProvider"]

# ECHO_API_KEY goes to the default base URL (or to $ECHO_BASE_URL), never elsewhere unless
# the configuration says api_key / api_key_env.
KEYS = KeyPolicy(
    backend="echo",
    default_base_url="http://localhost:8765",
    key_env="ECHO_API_KEY",
    base_url_env="ECHO_BASE_URL",
)


class EchoProvider(JSONProvider):
    """A client of the Echo API.

    Args:
        model_name: the model asked for when a call names none (default ``echo-1``).
        base_url: the API root (default ``http://localhost:8765``).
        api_key: the key (default: ``ECHO_API_KEY``, sent only to the default base URL or
            ``$ECHO_BASE_URL``; optional).
        api_key_env: the name of a variable whose key is sent to ``base_url`` wherever it is.
        shout: ask the API to answer in capitals.
        **kwargs: what `JSONProvider` takes: ``max_concurrent``, ``timeout``,
            ``max_attempts``, ``requests_per_minute``...
    """

    name = "echo"
    path = "/echo"

    def __init__(
        self,
        *,
        model_name: str = "echo-1",
        base_url: str | None = None,
        api_key: str | None = None,
        api_key_env: str | None = None,
        shout: bool = False,
        **kwargs: Any,
    ) -> None:
        self.shout = shout
        keys = resolve_key(KEYS, api_key=api_key, api_key_env=api_key_env, base_url=base_url)
        super().__init__(model_name=model_name, base_url=keys.base_url, api_key=keys.key, **kwargs)
        self.key_rule = keys.rule
        self.key_variables = keys.variables

    def _auth_headers(self) -> dict[str, str]:
        return {"X-Echo-Key": self._api_key.reveal()} if self._api_key else {}

    def _build_body(self, request: ChatRequest) -> dict[str, Any]:
        # Every message, in order: request.prompt alone (the last user message) would
        # drop the history a root model's later turns carry.
        return {
            "model": request.model or self.model,
            "system": request.system,
            "messages": [
                {"role": m.role, "text": m.content} for m in request.messages if m.role != "system"
            ],
            "shout": self.shout,
        }

    def _parse(self, data: Any, request: ChatRequest) -> ChatResponse:
        if not isinstance(data, dict) or not isinstance(data.get("text"), str):
            raise BadResponse(
                f"echo: {self.url} answered without a 'text' field; check base_url",
                provider=self.name,
            )
        return ChatResponse(
            content=data["text"],
            model=request.model,
            # The server's numbers and reason as the engine reads them, whatever it sent.
            usage=Usage(
                input_tokens=token_count(data.get("tokens_in")),
                output_tokens=token_count(data.get("tokens_out")),
            ),
            finish_reason=reason_text(data.get("done")),
        )

    def _server_message(self, data: Any) -> str:
        return str(data.get("detail", "")) if isinstance(data, dict) else ""
