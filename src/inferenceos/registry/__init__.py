"""Models on disk (names, tags, digests, import) and models loaded (keep-alive, eviction).

`names`: strict name and digest validation; `store`: the blob store and SQLite index;
`catalog`: what a request's model name means to the server; `loaded`: the manager that
loads engines on demand and unloads them. See docs/registry.md.
"""
