"""The OpenAI-compatible door's addresses under ``/v1/``."""

from django.urls import path

from dashboard.openai import chat, models

openai_patterns = [
    path("v1/models", models.list_models, name="openai-models"),
    path("v1/chat/completions", chat.chat_completions, name="openai-chat-completions"),
]
