"""What a screen-reader or keyboard-only user depends on in the pages we write ourselves (an audit with
axe-core and a keyboard in Chromium, both languages): the page's language, a failed sign-in announced with
the fields it concerns, the logs reachable by keyboard, status lines spoken, names that read well."""

from __future__ import annotations

import json
from types import SimpleNamespace

from cosyserve.ui import assets
from cosyserve.ui.admin_tab import logs_html
from cosyserve.ui.i18n import text
from cosyserve.ui.login import login_page


def test_a_failed_key_sign_in_comes_back_announced_with_the_key_field_open_and_focused() -> None:
    bridge = SimpleNamespace(password_login_configured=True)
    page = login_page(bridge, "zh", "/", error=True, used_key=True)  # type: ignore[arg-type]
    assert '<html lang="zh-CN">' in page and "<main>" in page
    assert 'id="login-error" role="alert"' in page
    assert "<details open>" in page  # a key user had to find and reopen the section
    key_field = page[page.index('id="api_key"') :].split(">", 1)[0]
    user_field = page[page.index('id="username"') :].split(">", 1)[0]
    assert "autofocus" in key_field and "autofocus" not in user_field
    assert 'aria-invalid="true" aria-describedby="login-error"' in key_field
    assert 'hreflang="en"' in page  # the switch to English is marked as English
    first = login_page(bridge, "en", "/")  # type: ignore[arg-type]
    assert '<html lang="en">' in first and 'role="alert"' not in first and "<details>" in first


def test_the_page_language_title_logs_and_announcements() -> None:
    js = assets.page_lang_js(text("title", "zh"), text("title", "en"))
    assert "document.documentElement.lang" in js and "'zh-CN'" in js and json.dumps(text("title", "zh")) in js
    logs = logs_html([{"message": "<script>x</script>", "level": "INFO"}], "en")
    assert logs.startswith('<pre class="cosy-logs-pre" tabindex="0" role="region" aria-label=')
    assert "<script>" not in logs and "&lt;script&gt;" in logs
    assert "#admin-message" in assets.head_html() and "aria-live" in assets.head_html()
    assert "admin-restart" in assets.focus_js("admin-restart")
    assert text("dice", "en") != "⚄" and "focus-visible" in assets.CSS


def test_the_long_text_bar_is_a_named_progressbar() -> None:
    from cosyserve.ui.long_text import progress_html

    bar = progress_html(0.25, 8, 30.0, "en")
    assert 'role="progressbar"' in bar and 'aria-valuenow="25"' in bar and 'aria-label="' in bar
