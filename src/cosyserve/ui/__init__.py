"""The web UI (Gradio) at `/`: `cosyserve.ui.app.mount_ui(app, service)` after `create_app(service)`.

Modules: `app` (page assembly, mounting, security settings), `login` (sign-in with the API's credentials),
`bridge` (every call the UI makes to the `Service`, one module per concern: the only UI modules that import
`cosyserve.service`), `studio` + `generate` (the three synthesis tabs),
`library_tab`, `history_tab` (with `history_filter`), `admin_tab`, `i18n` (Chinese/English), `assets`
(CSS, the stream player).
"""
