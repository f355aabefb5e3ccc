"""The service layer: everything between the HTTP/UI front ends and the engine, in parts with one owner each.

`assembly.Service` builds the parts of one process and starts and stops them. `backend.Backend` is where
synthesis runs, chosen once from the role: `local/` (the model in this process: synthesizer, model host,
local backend, long-text jobs) or `distributed/` (an API node's remote backend, and the worker process).
`scheduling/` is the bounded queue and its tickets, `stores/` what is kept (database, jobs, keys, voices,
outputs, bucket), `access/` who may call and how much. Beside them: `requests` (the vocabulary of a
request and its outcome), `audio_formats` and `subtitles` (what a result is delivered as), `settings`,
`metrics` and `logs`.
"""
