"""Build: llama.cpp pinned and patched, compiled once per commit, patch and flags and cached
outside the checkout (llama), the routing hook beside it, and the bindings that load it."""
