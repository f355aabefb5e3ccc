"""Access: who is calling and what they may do.

`signing` makes and checks HMAC-signed URLs and session tokens.
"""
