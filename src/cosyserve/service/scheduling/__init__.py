"""Scheduling: a bounded queue in front of a fixed pool of worker threads (`scheduler`), and the ticket a
client holds for each piece of submitted work (`tickets`: state, cancel, result, streamed items).

The scheduler runs any callable it is given and knows nothing about synthesis: what the work is comes
from a backend (`service.local`, `service.distributed`). Every ticket ends done, failed or cancelled.
"""
