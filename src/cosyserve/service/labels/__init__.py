"""Labels on every output: the implicit label of GB 45438-2025 in the file's metadata (`implicit`, with
the tag code per container: `riff_tags`, `id3_tags`, `flac_tags`, `ogg_tags`), an optional C2PA manifest
(`c2pa_manifest`), the explicit rhythm cue (`cue`), what the service applies (`labeller`) and reading them
back (`verify`). Operators' guide: docs/labels.md.
"""
