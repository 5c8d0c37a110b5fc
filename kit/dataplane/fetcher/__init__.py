"""kit's weights fetcher (weights_fetch.py) and the hash cache's rules it shares with kit
(weights_hashes.py), run in a throwaway container on a GPU server (docs/weights.md)."""
