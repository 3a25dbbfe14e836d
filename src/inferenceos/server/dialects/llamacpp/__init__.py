"""llama-server's own dialect: `/completion`, `/tokenize`, `/detokenize`, `/embedding`,
`/props`, `/slots`, ...: its request rules and routes (docs/api.md)."""
