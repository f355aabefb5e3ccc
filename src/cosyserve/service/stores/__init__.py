"""Stores: what the service keeps between requests and shares between nodes.

The database (`db`: SQLite by default, PostgreSQL for several nodes) holds job records (`jobs`, with the
table and its row type in `job_table`), API keys (`keys`) and the voice library (`voices`, whose
recordings and features live in the database too and are copied to each node's disk by `voice_files`).
Finished results are files on disk (`outputs`, one audio file plus a JSON sidecar each: `output_files`),
optionally copied to an S3-compatible bucket (`s3sync`, with `s3_setup` and `s3_failures`) and read back
from it by nodes that did not make them (`bucket`). `atomic_files` writes files so that a crash never
leaves a half-written one. Stores know nothing of HTTP, the model or the scheduler.
"""
