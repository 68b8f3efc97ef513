"""``POST /v1/chat/completions``'s body as OpenAI defines it.

Unknown fields are accepted and ignored, as OpenAI's newer SDKs send fields
older servers do not know. What the engine has no place for yet is accepted
and ignored too, and named here: the sampling parameters (``temperature``,
``top_p``, ``n`` of 1, ``presence_penalty``, ``frequency_penalty``, ``seed``,
``stop``, ``logit_bias``, ``logprobs``, ``top_logprobs``, ``response_format``,
``parallel_tool_calls``) — a turn is sent with the provider's own settings —
and ``max_tokens``/``max_completion_tokens``: the run's budget bounds its
spend, not one reply's length.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator


class TextPart(BaseModel):
    model_config = ConfigDict(extra="ignore")

    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_call_id: str | None = None
    tool_calls: list[dict[str, Any]] | None = None

    @property
    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore")

    include_usage: bool = False


class ChatCompletionRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: str = Field(min_length=1, max_length=200)
    messages: list[ChatMessage] = Field(min_length=1)
    stream: bool = False
    stream_options: StreamOptions | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    # Accepted and ignored (the module's docstring says why).
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, ge=0, le=1)
    n: int | None = Field(default=None, ge=1, le=1)
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: Any = None
    user: str | None = Field(default=None, max_length=200)
    metadata: dict[str, str] | None = None

    @field_validator("tools")
    @classmethod
    def _no_client_tools(cls, tools):
        if tools:
            raise ValueError(
                "client tools are not governed by the door yet: send the request without tools"
            )
        return tools

    @field_validator("messages")
    @classmethod
    def _ends_with_a_user_message(cls, messages):
        if messages[-1].role != "user" or not messages[-1].text.strip():
            raise ValueError("the last message must be a user message with text")
        if any(m.role == "tool" or m.tool_calls for m in messages):
            raise ValueError("tool messages are not governed by the door yet")
        return messages
