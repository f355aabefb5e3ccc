"""Access: who is calling and what they may do.

`limits` (per-key rate limits and daily audio quotas), `sessions` (the UI login's password check and
session tokens), `signing` (HMAC-signed URLs and tokens). The API keys themselves are a store
(`stores.keys`).
"""
