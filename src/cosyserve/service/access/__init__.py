"""Access: who is calling and what they may do.

`gate.Access` is what the API and the UI ask: is authentication on, who is this (`principals.Principal`,
from an API key, a UI session or nobody), may they go ahead (`limits`: per-key rate limits; `quota`: daily
audio quotas with atomic reservations of `estimate`d seconds), log a UI user in (`sessions`: password
check and session tokens), and signed links (`signing`). The API keys themselves are a store
(`stores.keys`).
"""
