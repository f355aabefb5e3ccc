"""Batches and dubs: what happens to a file of texts or a subtitle file outside the model.

`inputs` reads and checks a batch's items (JSON, JSON lines, CSV, text) or a subtitle file's cues;
`items` turns an item into a `SynthesisRequest` (the one place, for the server, the cluster's workers and
the CLI); `status` says how far a batch got; `archive` zips its outputs; `dub_plan`, `dub_timeline`,
`dub_track` and `dub_report` plan a dub's track, place its cues, write the track and report each cue.
Running them on the model is `service.local.batches` (and `service.local.dubbing` for a cue's fit).
"""
