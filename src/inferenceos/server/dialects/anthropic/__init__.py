"""Anthropic's Messages API: `/v1/messages` and `/v1/messages/count_tokens`: schemas,
request conversion and routes (docs/api.md)."""
