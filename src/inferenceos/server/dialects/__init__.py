"""The API dialects the server speaks, one subpackage each: `openai` (chat, completions,
embeddings), `ollama` (/api), `anthropic` (Messages), `llamacpp` (llama-server's own
routes) and `responses` (OpenAI's Responses API and our server-side sessions).

A dialect owns its request and response schemas, the conversion of its requests into
the shared core's inputs, and its routes. Dialects import the server's core (`generation`,
`reply`, `sse`, `options`, `tools`, ...); `llamacpp`, `anthropic` and `responses` may
reuse `openai`'s message schema, and `openai` reads embedding inputs as llama-server does
(`llamacpp.schema`). The core never imports a dialect.
"""
