"""`create_app(service)`: the FastAPI application around one `Service`.

The API lives under /v1, /admin, /auth, /health, /ready, /metrics, /docs and /redoc, leaving "/" to the web UI
(`cosyserve.ui.app.mount_ui` replaces the placeholder redirect from "/" to /docs).
The app's lifespan starts the service (model loading in the background) and shuts it down gracefully.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI
from fastapi.responses import RedirectResponse
from fastapi_offline import FastAPIOffline

from cosyserve import __version__
from cosyserve.api import admin, batches, dub, health, jobs, openai, outputs, tts, verify, voices
from cosyserve.api.body_budget import BodyBudget
from cosyserve.api.cors import CorsPolicy
from cosyserve.api.cross_site import CrossSiteGuard
from cosyserve.api.deps import admitted
from cosyserve.api.errors import install_error_handlers
from cosyserve.api.middleware import ApiMiddleware
from cosyserve.limits import upload_bytes
from cosyserve.service.assembly import Service
from cosyserve.service.quality import TAKE_HEADERS

DOCS_ASSETS_URL = "/docs-assets"
EXPOSED_HEADERS = [
    "X-Request-ID",
    "X-Cosyserve-Seed",
    "X-Cosyserve-Output-Id",
    "X-Cosyserve-Duration",
    "X-Cosyserve-Sample-Rate",
    *TAKE_HEADERS,
    "X-Cosyserve-Saved",
    "X-Cosyserve-Storage-Error",
    "X-Cosyserve-Storage-Warning",
    "X-Cosyserve-Warnings",
    "Content-Disposition",
    "Retry-After",
    "X-Should-Retry",  # OpenAI's SDKs read it: a quota refusal is not retried after its Retry-After
]
DESCRIPTION = """\
Voice-cloning text-to-speech with CosyVoice3.

* `POST /v1/tts`: text → audio in a saved voice or one cloned from an upload (JSON or multipart; streaming).
* `POST /v1/audio/speech`: OpenAI-compatible; point an OpenAI SDK's `base_url` at `<server>/v1`.
* `/v1/voices`, `/v1/jobs`, `/v1/outputs`: saved voices, long-text jobs, stored results.
* `/v1/batches`, `/v1/dub`: a script of lines as one job and a ZIP; a subtitle file as a timed voice-over.

Errors always look like `{"error": {"code", "message", "request_id", "type", "param"}}` (`type` and
`param` as OpenAI's: its SDKs read them). When the server has API keys,
send one as `Authorization: Bearer <key>` or `X-API-Key: <key>`.
"""


def create_app(service: Service, *, manage_service: bool = True) -> FastAPI:
    """The app for `service`; with `manage_service` its lifespan calls `service.start()` / `shutdown()`."""

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        if manage_service:
            await asyncio.to_thread(service.start)
        try:
            yield
        finally:
            if manage_service:
                await asyncio.to_thread(service.shutdown)

    # Swagger UI and ReDoc from the assets fastapi-offline ships, never a CDN: docs work offline.
    app = FastAPIOffline(
        title="cosyserve",
        version=__version__,
        description=DESCRIPTION,
        lifespan=lifespan,
        docs_url="/docs",
        redoc_url="/redoc",
        static_url=DOCS_ASSETS_URL,
    )
    app.state.service = service
    install_error_handlers(app)
    for module in (tts, openai, voices, jobs, batches, dub, outputs, health, verify):
        app.include_router(module.router)
    app.include_router(admin.router)
    app.include_router(admin.session_router)

    # Always on, also without origins: it removes the CORS answers the mounted UI's Gradio would give.
    app.add_middleware(
        CorsPolicy, origins=service.settings.server.cors_origins, expose_headers=EXPOSED_HEADERS
    )
    app.add_middleware(CrossSiteGuard, trusted_origins=service.settings.server.cors_origins)
    limits = service.settings.limits
    app.add_middleware(  # outermost
        ApiMiddleware,
        metrics=service.metrics,
        upload_limit_bytes=upload_bytes(limits.max_upload_mb),
        body_budget=BodyBudget(int(limits.max_receiving_mb * 1e6)),
        admit=admitted(service),
    )

    @app.get("/", include_in_schema=False)
    def root() -> RedirectResponse:
        return RedirectResponse("/docs")

    return app
