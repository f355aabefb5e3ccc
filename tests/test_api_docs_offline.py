"""/docs and /redoc render from the app's own assets: in headless Chromium with every other host blocked."""

from __future__ import annotations

from urllib.parse import urlsplit

import httpx
import pytest

from browser import chromium


@pytest.fixture(scope="module")
def server(start_api_server):
    live = start_api_server(wait_ready=False)
    yield live
    live.stop()


def _offline_page(browser, base_url: str, refused: list[str]):
    """A page that can reach the test server only: any other request is aborted (and recorded)."""
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    context.set_default_timeout(60_000)
    local = urlsplit(base_url).netloc

    def only_local(route) -> None:
        if urlsplit(route.request.url).netloc == local:
            route.continue_()
        else:
            refused.append(f"{route.request.resource_type} {route.request.url}")
            route.abort()

    context.route("**/*", only_local)
    return context, context.new_page()


def test_docs_assets_are_served_by_the_app(server) -> None:
    page = httpx.get(f"{server.url}/docs", timeout=10).text
    assert "cdn." not in page and "/docs-assets/swagger-ui-bundle.js" in page
    for asset in ("swagger-ui-bundle.js", "swagger-ui.css", "redoc.standalone.js"):
        response = httpx.get(f"{server.url}/docs-assets/{asset}", timeout=10)
        assert response.status_code == 200 and len(response.content) > 10_000, asset


def test_swagger_ui_and_redoc_render_with_the_network_blocked(server) -> None:
    refused: list[str] = []
    with chromium() as browser:
        context, page = _offline_page(browser, server.url, refused)
        try:
            page.goto(f"{server.url}/docs")
            page.locator(".opblock-summary-path", has_text="/v1/tts").first.wait_for()  # the operation list
            assert page.locator(".opblock").count() >= 10
            page.goto(f"{server.url}/redoc")
            page.get_by_text("/v1/audio/speech").first.wait_for()
        finally:
            context.close()
    # Only ReDoc's "API docs by Redocly" footer logo is an outside image (it simply doesn't show);
    # no script, style sheet, font or request for data may come from anywhere but the app.
    outside = [url for url in refused if not url.startswith("image https://cdn.redoc.ly/")]
    assert not outside, f"the docs pages asked other hosts for {outside}"
