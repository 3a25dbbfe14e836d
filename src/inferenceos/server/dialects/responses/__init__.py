"""OpenAI's Responses API (`/v1/responses`) and the server-side sessions it stores on
disk (`/v1/sessions`): schemas, the session store and routes (docs/api.md)."""
