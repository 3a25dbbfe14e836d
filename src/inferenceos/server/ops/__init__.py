"""Operations: health, Prometheus metrics and their scrape-time families, memory
budgets at run time and the pressure reactor, access logs, and the reads that let these
routes answer without waiting behind model work.

It may import the server's core and the registry; it uses Ollama's schema for the routes
it serves in Ollama's spelling (`/api/version`, budget errors). No dialect imports it
except for `ops_call` (reads.py), the way a route reads state without blocking.
"""
