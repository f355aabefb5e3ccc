"""Signing in to the web UI with the API's credentials: the UI user's password or an API key.

`GET /login` shows a small bilingual form; `POST /login` checks it (`Access.login` or `Access.key_login`)
and hands the browser a new server-side session (`stores.ui_sessions`) as an http-only cookie, which
the API accepts too. The cookie holds an opaque token, never the key. One login at a time: submitting
the form first ends the browser's current session and clears every auth cookie, so a new login replaces
the old identity entirely (and a failed one leaves the browser signed out). `GET /logout` ends the session
and clears the cookies. Gradio's `auth_dependency` (`ui_auth_dependency`) then lets a request in when
its credentials resolve to a principal, and sends a browser that opens the page without them to the form.
"""

from __future__ import annotations

import asyncio
import functools
import html
from collections.abc import Awaitable, Callable
from urllib.parse import quote, unquote

from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from starlette.concurrency import run_in_threadpool

from cosyserve.ui.bridge import AUTH_COOKIES, SESSION_COOKIE, UiBridge
from cosyserve.ui.event_cap import note_event_owner
from cosyserve.ui.file_owners import CACHE_OWNERS
from cosyserve.ui.i18n import pick_lang

LOGIN_PATH = "/login"
LOGOUT_PATH = "/logout"
FAILED_LOGIN_DELAY_S = 1.0  # slows down password guessing from one client
MAX_FIELD_CHARS = 256

_TEXT = {
    "zh": {
        "title": "登录 · CosyVoice3 语音工作室",
        "heading": "登录",
        "username": "用户名",
        "password": "密码",
        "or_key": "或使用 API 密钥",
        "key": "API 密钥（cs_…）",
        "submit": "登录",
        "failed": "用户名、密码或 API 密钥不正确。",
        "other": "English",
    },
    "en": {
        "title": "Sign in · CosyVoice3 Studio",
        "heading": "Sign in",
        "username": "User name",
        "password": "Password",
        "or_key": "or use an API key",
        "key": "API key (cs_…)",
        "submit": "Sign in",
        "failed": "Wrong user name, password or API key.",
        "other": "中文",
    },
}

_PAGE = """<!doctype html>
<html lang="{html_lang}"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width,initial-scale=1">
<title>{title}</title>
<style>
body{{font-family:system-ui,-apple-system,"PingFang SC","Microsoft YaHei",sans-serif;background:#f4f5fb;
margin:0;display:flex;min-height:100vh;align-items:center;justify-content:center}}
form{{background:#fff;padding:2rem 2.2rem;border-radius:14px;box-shadow:0 6px 30px rgba(40,40,90,.12);
width:min(360px,90vw)}}
h1{{margin:0 0 1.2rem;font-size:1.4rem}}
label{{display:block;margin:.8rem 0 .3rem;font-size:.9rem;color:#444}}
input{{width:100%;box-sizing:border-box;padding:.6rem .7rem;border:1px solid #767689;border-radius:8px;
font-size:1rem}}
:focus-visible{{outline:3px solid #3730a3;outline-offset:2px}}
button{{margin-top:1.3rem;width:100%;padding:.7rem;border:0;border-radius:8px;background:#5b5bd6;color:#fff;
font-size:1rem;cursor:pointer}} .err{{color:#b42318;background:#fef3f2;padding:.6rem;border-radius:8px}}
.lang{{float:right;font-size:.85rem}} details{{margin-top:.8rem;color:#555}}
</style></head><body>
<main><form method="post" action="{action}">
<a class="lang" id="lang-switch" href="{other_href}" lang="{other_lang}" hreflang="{other_lang}">{other}</a>
<h1>{heading}</h1>{error}
{password_fields}
{key_fields}
<input type="hidden" name="next" value="{next}">
<button type="submit" id="login-submit">{submit}</button>
</form></main></body></html>"""

_PASSWORD_FIELDS = """<label for="username">{username}</label>
<input id="username" name="username" autocomplete="username"{focus}{invalid}>
<label for="password">{password}</label>
<input id="password" name="password" type="password" autocomplete="current-password"{invalid}>"""

_KEY_FIELD = """<label for="api_key">{key}</label>
<input id="api_key" name="api_key" type="password" autocomplete="off"{key_focus}{invalid}>"""


def safe_next(target: str | None) -> str:
    """Only same-site paths are followed after signing in (no `//host`, no scheme, no backslashes)."""
    if not target or not target.startswith("/") or target.startswith("//") or "\\" in target:
        return "/"
    return target


def login_page(
    bridge: UiBridge, lang: str, next_path: str, error: bool = False, used_key: bool = False
) -> str:
    """The form; after a failed attempt (`error`) the message is an alert the fields point to, and the
    fields the user had used (`used_key`: the API key) are open and focused again."""
    strings = _TEXT[lang]
    invalid = ' aria-invalid="true" aria-describedby="login-error"' if error else ""
    with_password = bridge.password_login_configured
    focus_key = used_key or not with_password
    marks = {
        "invalid": invalid,
        "focus": "" if focus_key else " autofocus",
        "key_focus": " autofocus" if focus_key else "",
    }
    password_fields = _PASSWORD_FIELDS.format(**strings, **marks) if with_password else ""
    key_field = _KEY_FIELD.format(**strings, **marks)
    if password_fields:
        opened = " open" if used_key else ""
        key_fields = f"<details{opened}><summary>{strings['or_key']}</summary>{key_field}</details>"
    else:
        key_fields = key_field
    other_lang = "en" if lang == "zh" else "zh"
    next_q = quote(next_path, safe="/")
    return _PAGE.format(
        html_lang="zh-CN" if lang == "zh" else "en",
        title=strings["title"],
        heading=strings["heading"],
        submit=strings["submit"],
        other=strings["other"],
        other_lang="zh-CN" if other_lang == "zh" else "en",
        other_href=f"{LOGIN_PATH}?lang={other_lang}&next={next_q}",
        action=f"{LOGIN_PATH}?lang={lang}",
        error=f'<p class="err" id="login-error" role="alert">{strings["failed"]}</p>' if error else "",
        password_fields=password_fields,
        key_fields=key_fields,
        next=html.escape(next_path, quote=True),
    )


def install_login_routes(app: FastAPI, bridge: UiBridge) -> None:
    """Add /login and /logout to `app` (call before mounting the UI, so they win over its routes)."""

    def lang_of(request: Request) -> str:
        return pick_lang(request.query_params.get("lang"), request.headers.get("accept-language"))

    @app.get(LOGIN_PATH, include_in_schema=False)
    async def show_login(request: Request) -> Response:
        if not await run_in_threadpool(bridge.auth_enabled):
            return RedirectResponse("/", status_code=303)
        next_path = safe_next(request.query_params.get("next"))
        page = HTMLResponse(login_page(bridge, lang_of(request), next_path))
        if (set(AUTH_COOKIES) - {SESSION_COOKIE}) & set(request.cookies):  # an old version's raw-key cookie
            clear_auth_cookies(page, keep=SESSION_COOKIE)
        return page

    @app.post(LOGIN_PATH, include_in_schema=False)
    async def do_login(request: Request) -> Response:
        form = await request.form()
        fields = {
            name: str(form.get(name) or "")[:MAX_FIELD_CHARS] for name in ("username", "password", "api_key")
        }
        next_path = safe_next(str(form.get("next") or "/"))
        secure = request.url.scheme == "https"  # uvicorn applies X-Forwarded-Proto from trusted proxies
        # One login at a time: whatever the outcome, the browser's current session ends here.
        await run_in_threadpool(bridge.logout, request.cookies.get(SESSION_COOKIE))
        token = None
        if fields["api_key"].strip():
            token = await run_in_threadpool(bridge.key_login, fields["api_key"].strip())
        elif fields["username"]:
            token = await run_in_threadpool(bridge.password_login, fields["username"], fields["password"])
        if token is not None:
            response: Response = RedirectResponse(next_path, status_code=303)
            clear_auth_cookies(response, keep=SESSION_COOKIE)  # that one is replaced
            response.set_cookie(**bridge.session_cookie(token, secure=secure))
            return response
        await asyncio.sleep(FAILED_LOGIN_DELAY_S)
        page = login_page(
            bridge, lang_of(request), next_path, error=True, used_key=bool(fields["api_key"].strip())
        )
        response = HTMLResponse(page, status_code=401)
        clear_auth_cookies(response)
        return response

    @app.get(LOGOUT_PATH, include_in_schema=False)
    async def logout(request: Request) -> Response:
        await run_in_threadpool(bridge.logout, request.cookies.get(SESSION_COOKIE))
        response = RedirectResponse(LOGIN_PATH, status_code=303)
        clear_auth_cookies(response)
        return response


def clear_auth_cookies(response: Response, keep: str | None = None) -> None:
    """Tell the browser to drop every auth cookie (but `keep`): the session's, and the raw-key cookie of
    old versions."""
    for name in AUTH_COOKIES:
        if name != keep:
            response.delete_cookie(name, path="/", httponly=True, samesite="lax")


def ui_auth_dependency(bridge: UiBridge) -> Callable[[Request], Awaitable[str | None]]:
    """Gradio's `auth_dependency`: the signed-in name, or None (Gradio answers 401); a browser opening the
    page itself is redirected to the login form instead."""

    async def dependency(request: Request) -> str | None:
        touch = not await passive(request)
        principal = await run_in_threadpool(
            functools.partial(bridge.principal, touch=touch), request.headers, request.cookies
        )
        if principal is not None:
            if _is_file_route(request) and not CACHE_OWNERS.allows(principal, _file_path(request)):
                raise HTTPException(status_code=404, detail="no such file")  # another user's copy
            note_event_owner(request, principal.owner or principal.kind)
            request.state.ui_principal = principal  # for `UploadOwnerRecorder`
            return principal.name or principal.kind
        wants_page = request.method == "GET" and "text/html" in request.headers.get("accept", "")
        if wants_page:
            target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
            location = f"{LOGIN_PATH}?next={quote(safe_next(target), safe='/')}"
            raise HTTPException(status_code=303, detail="sign in first", headers={"Location": location})
        return None

    return dependency


# The page's own polling, which must not keep a session from idling out (an untouched tab stayed signed in
# for ever): its status and batch timers (by the api_name their events get), its event stream and heartbeat.
PASSIVE_EVENTS = frozenset({"status_tick", "batch_tick"})


async def passive(request: Request) -> bool:
    """Whether a Gradio request was made by the page by itself rather than by its user."""
    path = request.url.path.rstrip("/")
    if "/heartbeat/" in path or path.endswith("/queue/data"):
        return True
    name = path.rsplit("/", 1)[-1]
    if ("/run/" in path or "/api/" in path) and name != "predict":
        return name in PASSIVE_EVENTS
    if not (path.endswith("/queue/join") or name == "predict"):  # the page posts queue=False events
        return False
    try:
        index = (await request.json()).get("fn_index")
        fn = request.scope["app"].get_blocks().fns.get(index)
    except Exception:  # not the JSON or the app expected: count it as activity
        return False
    return getattr(fn, "api_name", None) in PASSIVE_EVENTS


def _is_file_route(request: Request) -> bool:
    """Gradio's file routes: `/file=<path>`, and the older `/file/<path>` it still serves (which passed
    the owner check by its spelling)."""
    return "/file=" in request.url.path or "/gradio_api/file/" in request.url.path


def _file_path(request: Request) -> str:
    """The path a Gradio file route fetches."""
    path = request.url.path
    return unquote(path.split("/file=", 1)[1] if "/file=" in path else path.split("/gradio_api/file/", 1)[1])
