"""Sessions: shape sets and their cache, run states, what a session's shape sets share, device arrays."""
