"""Access: who is calling and what they may do.

`gate.Access` is what the API and the UI ask: is authentication on, who is this (`principals.Principal`,
from an API key, a UI session or nobody), may they go ahead (`limits`: per-key rate limits; `quota`: daily
audio quotas with atomic reservations of `estimate`d seconds; `voice_rules`: who uses, reads, changes and
shares a voice), log a UI user in (`sessions`: password check), and signed links (`signing`). The API keys
and the UI's sign-in sessions are stores (`stores.keys`, `stores.ui_sessions`).
"""
