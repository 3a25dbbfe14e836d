"""OpenAI's dialect: `/v1/chat/completions`, `/v1/completions`, `/v1/embeddings`,
`/v1/models`: schemas, request conversion and routes (docs/api.md)."""
