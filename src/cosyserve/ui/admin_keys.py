"""The admin tab's API keys and quotas (create, list with today's usage, revoke, give a new secret, set a
daily quota) and its enrolment list (who enrolled each voice). Every call goes through `UiBridge`, which
refuses anyone but an admin and makes the same `key_admin` calls as the admin REST routes."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import gradio as gr

from cosyserve.errors import CosyServeError
from cosyserve.ui import assets
from cosyserve.ui.admin_status import enrolments_markdown, keys_markdown
from cosyserve.ui.bridge import ROLES, AuthRequired
from cosyserve.ui.generate import UiError, as_gr_error, error_message
from cosyserve.ui.i18n import text
from cosyserve.ui.messages import as_written
from cosyserve.ui.studio import UiContext


@dataclass
class KeysSection:
    table: gr.Markdown
    pick: gr.Dropdown
    created: gr.Markdown
    enrolments: gr.Markdown
    message: gr.Markdown  # what the last change did, or why it was refused
    refresh: Callable[..., tuple[Any, ...]]  # (lang, request) -> values of `outputs`

    @property
    def outputs(self) -> list[Any]:
        """What a refresh updates (the new key's plaintext and the last message are cleared: a key is shown
        once)."""
        return [self.table, self.pick, self.created, self.enrolments, self.message]


def _heading(tr: Any, key: str) -> None:
    tr.bind(gr.Markdown(f"## {tr(key)}"), value=lambda lang: f"## {text(key, lang)}")


def _quota_value(value: float | None) -> float | None:
    """The quota field as the store takes it: None (the server default) for empty or 0. (The field has no
    `minimum`: Gradio would refuse a negative one with its own English toast and no message here.)"""
    if value is None or value == 0:
        return None
    if value < 0:
        raise UiError("key_quota_bad", value=value)
    return float(value)


def _key_id(picked: Any) -> str:
    if picked in (None, ""):
        raise UiError("key_pick_first")
    return str(picked)


def refused(exc: Exception, lang: str, unchanged: int) -> tuple[Any, ...]:
    """A refused change said beside the form (the tables stay as they are, with no error overlay on them:
    the admin corrects the input and tries again); anything unexpected is the usual error modal."""
    if not isinstance(exc, UiError | CosyServeError):
        raise as_gr_error(exc, lang) from None
    return (*[gr.skip()] * unchanged, f"⚠ {error_message(exc, lang)}")


def _create_row(tr: Any) -> tuple[Any, Any, Any, Any]:
    """A new key's name, role and daily quota, and the button that makes it."""
    with gr.Row(equal_height=True):
        name = tr.bind(
            gr.Textbox(label=tr("key_name"), max_lines=1, elem_id="admin-key-name"), label="key_name"
        )
        role = tr.bind(
            gr.Dropdown(list(ROLES[::-1]), value="user", label=tr("key_role"), elem_id="admin-key-role"),
            label="key_role",
        )
        quota = tr.bind(gr.Number(None, label=tr("key_quota"), elem_id="admin-key-quota"), label="key_quota")
        create = tr.bind(
            gr.Button(tr("key_create"), variant="primary", elem_id="admin-key-create"), value="key_create"
        )
    return name, role, quota, create


def _change_row(tr: Any) -> tuple[Any, ...]:
    """A key picked, its new quota, and the buttons that set it, give the key a new secret or revoke it."""
    with gr.Row(equal_height=True):
        pick = tr.bind(gr.Dropdown([], label=tr("key_pick"), elem_id="admin-key-pick"), label="key_pick")
        new_quota = tr.bind(
            gr.Number(None, label=tr("key_quota"), elem_id="admin-key-new-quota"),
            label="key_quota",
        )
        set_quota = tr.bind(
            gr.Button(tr("key_set_quota"), elem_id="admin-key-set-quota"), value="key_set_quota"
        )
        rotate = tr.bind(gr.Button(tr("key_rotate"), elem_id="admin-key-rotate"), value="key_rotate")
        revoke = tr.bind(
            gr.Button(tr("key_revoke"), variant="stop", elem_id="admin-key-revoke"), value="key_revoke"
        )
    return pick, new_quota, set_quota, rotate, revoke


def _confirm_row(tr: Any) -> tuple[Any, ...]:
    """Shown by Revoke or New secret, with that action's button: the question is in the section's
    message; the change happens only from here."""
    with gr.Row(visible=False, elem_id="admin-key-confirm-row") as row:
        revoke = tr.bind(
            gr.Button(tr("key_revoke_confirm"), variant="stop", elem_id="admin-key-confirm-revoke"),
            value="key_revoke_confirm",
        )
        rotate = tr.bind(
            gr.Button(tr("key_rotate_confirm"), variant="stop", elem_id="admin-key-confirm-rotate"),
            value="key_rotate_confirm",
        )
        keep = tr.bind(gr.Button(tr("key_keep"), elem_id="admin-key-keep"), value="key_keep")
    return row, revoke, rotate, keep


def _question(bridge: Any, action: str) -> Callable[..., tuple[Any, ...]]:
    """Revoke's (or New secret's) handler: the confirmation row with that action's button and the
    question naming the key, or why there is none."""

    def ask(lang: str, picked: Any, request: gr.Request) -> tuple[Any, ...]:
        try:
            key_id = _key_id(picked)
            views = bridge.keys(bridge.principal_of(request))
            view = next((v for v in views if str(v["id"]) == key_id and v["active"]), None)
            if view is None:  # revoked or deleted meanwhile (by another admin, or the API)
                raise UiError("key_pick_first")
            question = text(f"key_{action}_question", lang, name=as_written(view["name"]), id=key_id)
            shown = [gr.update(visible=action == "revoke"), gr.update(visible=action == "rotate")]
            return (gr.update(visible=True), *shown, question)
        except Exception as exc:
            return (gr.update(visible=False), gr.skip(), gr.skip(), *refused(exc, lang, 0))

    return ask


class _KeyActions:
    """The section's handlers; each resolves the caller again from the request (admins only, in the
    bridge) and answers with the section's `outputs` (a refused change: said beside the form)."""

    def __init__(self, bridge: Any) -> None:
        self.bridge = bridge

    def listing(
        self, lang: str, request: gr.Request, created_text: str = "", said: str = ""
    ) -> tuple[Any, ...]:
        bridge = self.bridge
        principal = bridge.principal_of(request)
        views = bridge.keys(principal)
        choices = [(f"{v['id']} · {v['name']} ({v['prefix']})", str(v["id"])) for v in views if v["active"]]
        voices = bridge.enrolments(principal)
        return (
            keys_markdown(views, lang),
            gr.update(choices=choices, value=None),
            created_text,
            enrolments_markdown(voices, lang, {f"key:{v['id']}": v["name"] for v in views}),
            said,
        )

    def refresh(self, lang: str, request: gr.Request) -> tuple[Any, ...]:
        try:
            return self.listing(lang, request)
        except Exception as exc:
            raise as_gr_error(exc, lang) from None

    def create(
        self, lang: str, key_name: str, key_role: str, key_quota: float | None, request: gr.Request
    ) -> tuple[Any, ...]:
        try:
            principal = self.bridge.principal_of(request)
            view, plaintext = self.bridge.create_key(principal, key_name, key_role, _quota_value(key_quota))
            return ("", None, *self.listing(lang, request, _shown_once("key_created", lang, view, plaintext)))
        except Exception as exc:
            return refused(exc, lang, 6)

    def revoke(self, lang: str, picked: Any, request: gr.Request) -> tuple[Any, ...]:
        try:
            view = self.bridge.revoke_key(self.bridge.principal_of(request), _key_id(picked))
            done = text("key_revoked_msg", lang, name=as_written(view["name"]), id=view["id"])
            return (*self.listing(lang, request, said=done), gr.update(visible=False))
        except Exception as exc:
            return (*refused(exc, lang, 4), gr.update(visible=False))

    def rotate(self, lang: str, picked: Any, request: gr.Request) -> tuple[Any, ...]:
        try:
            view, plaintext = self.bridge.rotate_key(self.bridge.principal_of(request), _key_id(picked))
        except Exception as exc:
            return (*refused(exc, lang, 4), gr.update(visible=False))
        shown = _shown_once("key_rotated", lang, view, plaintext)
        try:
            return (*self.listing(lang, request, shown), gr.update(visible=False))
        except AuthRequired:  # the admin's own key: its sign-in ended with the old secret; show the new one
            said = text("key_rotated_own", lang)
            return (gr.skip(), gr.skip(), shown, gr.skip(), said, gr.update(visible=False))

    def set_quota(self, lang: str, picked: Any, value: float | None, request: gr.Request) -> tuple[Any, ...]:
        try:
            key_id = _key_id(picked)
            view = self.bridge.set_quota(self.bridge.principal_of(request), key_id, _quota_value(value))
            limit = view["usage_today"]["limit_s"]
            shown = text("keys_unlimited", lang) if limit is None else f"{limit:g} s"
            done = text("key_quota_set", lang, name=as_written(view["name"]), quota=shown)
            return self.listing(lang, request, said=done)
        except Exception as exc:
            return refused(exc, lang, 4)


def _shown_once(key: str, lang: str, view: dict[str, Any], plaintext: str) -> str:
    return text(key, lang, name=as_written(view["name"]), id=view["id"]) + f"\n\n```\n{plaintext}\n```"


def build_keys_section(ctx: UiContext) -> KeysSection:
    tr, bridge = ctx.tr, ctx.bridge
    _heading(tr, "keys_title")
    table = gr.Markdown("", elem_id="admin-keys", elem_classes="cosy-table")
    name, role, quota, create = _create_row(tr)
    created = gr.Markdown("", elem_id="admin-key-created")
    pick, new_quota, set_quota, rotate, revoke = _change_row(tr)
    confirm_row, confirm_revoke, confirm_rotate, keep = _confirm_row(tr)
    message = gr.Markdown("", elem_id="admin-keys-message")
    _heading(tr, "enrolments_title")
    enrolments = gr.Markdown("", elem_id="admin-enrolments", elem_classes="cosy-table")
    actions = _KeyActions(bridge)
    section = KeysSection(table, pick, created, enrolments, message, actions.refresh)
    lang = ctx.lang
    create.click(actions.create, [lang, name, role, quota], [name, quota, *section.outputs])
    asked = [confirm_row, confirm_revoke, confirm_rotate, message]
    revoke.click(_question(bridge, "revoke"), [lang, pick], asked)
    rotate.click(_question(bridge, "rotate"), [lang, pick], asked)
    confirm_rotate.click(actions.rotate, [lang, pick], [*section.outputs, confirm_row]).then(
        None, js=assets.focus_js("admin-key-rotate")
    )
    confirm_revoke.click(actions.revoke, [lang, pick], [*section.outputs, confirm_row]).then(
        None, js=assets.focus_js("admin-key-revoke")
    )
    keep.click(lambda: (gr.update(visible=False), ""), None, [confirm_row, message]).then(
        None, js=assets.focus_js("admin-key-revoke")
    )
    pick.change(lambda: gr.update(visible=False), None, [confirm_row])  # the question was of another key
    set_quota.click(actions.set_quota, [lang, pick, new_quota], section.outputs)
    return section
