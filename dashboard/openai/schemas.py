"""``POST /v1/chat/completions``'s body as OpenAI defines it (validated by
pydantic: the errors name the field, as OpenAI's do).

Unknown fields are accepted and ignored, as OpenAI's newer SDKs send fields
older servers do not know. The sampling parameters (``temperature``,
``top_p``, ``presence_penalty``, ``frequency_penalty``, ``seed``, ``stop``,
``logit_bias``, ``response_format``, ``parallel_tool_calls``, ``user``),
``tool_choice`` and ``max_tokens``/``max_completion_tokens`` are sent to the
provider with every request of the turn (``SAMPLING``); ``logprobs`` and
``top_logprobs`` are accepted and ignored (the answer carries none), ``n``
must be 1.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic_core import PydanticCustomError


def _problem(param: str, words: str) -> PydanticCustomError:
    """A whole-request check's error naming the field it is about (``param``)."""
    return PydanticCustomError("invalid_request", words.replace("{", "(").replace("}", ")"),
                               {"param": param})  # fmt: skip


# OpenAI's function names.
TOOL_NAME = r"^[a-zA-Z0-9_-]{1,64}$"
# The request's fields sent to the provider as given (ProviderRequest.sampling).
SAMPLING = (
    "temperature", "top_p", "presence_penalty", "frequency_penalty", "seed", "stop",
    "logit_bias", "response_format", "parallel_tool_calls", "user", "tool_choice",
)  # fmt: skip


class TextPart(BaseModel):
    model_config = ConfigDict(extra="ignore")

    type: Literal["text"]
    text: str


class FunctionCall(BaseModel):
    model_config = ConfigDict(extra="ignore")

    name: str = Field(pattern=TOOL_NAME)
    arguments: str = ""

    @field_validator("arguments")
    @classmethod
    def _a_json_object(cls, arguments: str) -> str:
        if arguments.strip():
            try:
                parsed = json.loads(arguments)
            except ValueError:
                raise ValueError("a tool call's arguments must be a JSON object") from None
            if not isinstance(parsed, dict):
                raise ValueError("a tool call's arguments must be a JSON object")
        return arguments


class ToolCall(BaseModel):
    model_config = ConfigDict(extra="ignore")

    id: str = Field(min_length=1, max_length=100)
    type: Literal["function"] = "function"
    function: FunctionCall

    def as_call(self) -> dict[str, Any]:
        """The call as accepted history keeps it ({"id", "name", "arguments"})."""
        arguments = self.function.arguments
        return {
            "id": self.id,
            "name": self.function.name,
            "arguments": json.loads(arguments) if arguments.strip() else {},
        }


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_call_id: str | None = Field(default=None, max_length=100)
    tool_calls: list[ToolCall] | None = None

    @property
    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class FunctionSpec(BaseModel):
    model_config = ConfigDict(extra="ignore")

    name: str = Field(pattern=TOOL_NAME)
    description: str = ""
    parameters: dict[str, Any] | None = None


class ToolSpec(BaseModel):
    model_config = ConfigDict(extra="ignore")

    type: Literal["function"]
    function: FunctionSpec


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
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, ge=0, le=1)
    n: int | None = Field(default=None, ge=1, le=1)
    presence_penalty: float | None = Field(default=None, ge=-2, le=2)
    frequency_penalty: float | None = Field(default=None, ge=-2, le=2)
    seed: int | None = None
    stop: str | list[str] | None = None
    logit_bias: dict[str, float] | None = None
    response_format: dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    tools: list[ToolSpec] | None = Field(default=None, max_length=128)
    tool_choice: Literal["none", "auto", "required"] | dict[str, Any] | None = None
    user: str | None = Field(default=None, max_length=200)
    metadata: dict[str, str] | None = None

    @field_validator("tools")
    @classmethod
    def _distinct_names(cls, tools):
        names = [tool.function.name for tool in tools or ()]
        if len(set(names)) != len(names):
            raise ValueError("two tools have the same name")
        return tools

    @field_validator("messages")
    @classmethod
    def _ends_with_new_input(cls, messages):
        last = messages[-1]
        if last.role == "tool":
            return messages
        if last.role != "user" or not last.text.strip():
            raise ValueError("the last message must be a user message with text, or a tool result")
        return messages

    @model_validator(mode="after")
    def _tool_results_answer_calls(self):
        """Every tool result answers a call of the assistant message before it,
        every call of the last assistant message is answered, and every call
        names one of the request's tools."""
        offered = {tool.function.name for tool in self.tools or ()}
        open_calls: set[str] = set()
        for at, message in enumerate(self.messages):
            if message.role == "assistant":
                for call in message.tool_calls or ():
                    if call.function.name not in offered:
                        raise _problem(
                            "messages",
                            f"messages[{at}]: the call {call.id} names {call.function.name!r},"
                            " which is not one of the request's tools",
                        )
                open_calls = {call.id for call in message.tool_calls or ()}
            elif message.role == "tool":
                if not message.tool_call_id or message.tool_call_id not in open_calls:
                    raise _problem(
                        "messages",
                        f"messages[{at}].tool_call_id: no assistant tool call"
                        f" {message.tool_call_id!r} precedes this tool result",
                    )
                open_calls.discard(message.tool_call_id)
            elif message.role == "user" and open_calls:
                raise _problem(
                    "messages",
                    f"messages[{at}]: the tool call(s) {', '.join(sorted(open_calls))} have no"
                    " result before this message",
                )
        if open_calls:
            raise _problem(
                "messages",
                f"messages: the tool call(s) {', '.join(sorted(open_calls))} have no result",
            )
        choice = self.tool_choice
        if isinstance(choice, dict):
            name = (choice.get("function") or {}).get("name")
            if name not in offered:
                raise _problem(
                    "tool_choice", f"tool_choice names {name!r}, which is not one of the tools"
                )
        return self

    def sampling(self) -> dict[str, Any]:
        """What the client asked of each reply, sent to the provider as given."""
        return {name: getattr(self, name) for name in SAMPLING if getattr(self, name) is not None}
