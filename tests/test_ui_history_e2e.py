"""The history tab for a team: search, filter, play, download and delete, in headless Chromium (Playwright).

A server of its own (not test_ui_e2e's ordered session) with two user keys and an admin login; the
results are put straight into the output store with the manifests the API, the UI, batches and dubs
write, so the kinds and owners are known without synthesising. Screenshots go to test-artifacts/ui/.
"""

from __future__ import annotations

import contextlib
import io
import itertools
import time

import numpy as np
import pytest
import soundfile

from browser import chromium
from conftest import REPO_ROOT, LiveServer, sharing
from cosyserve.service.stores.outputs import OutputNotFound
from cosyserve.ui.history_filter import (
    ANY,
    UPLOADED,
    HistoryFilter,
    day_choices,
    filter_from,
    history_links,
    output_mode,
    voice_choices,
)

ARTIFACTS = REPO_ROOT / "test-artifacts" / "ui"
ADMIN, PASSWORD = "admin", "history-test-password-1"
WAIT_MS = 60_000  # generous: the machine may be busy


def wav_bytes(seconds: float = 0.5) -> bytes:
    rate = 24000
    t = np.arange(int(seconds * rate)) / rate
    buffer = io.BytesIO()
    soundfile.write(buffer, (0.3 * np.sin(2 * np.pi * 220 * t)).astype(np.float32), rate, format="WAV")
    return buffer.getvalue()


def save(service, owner: str | None, text: str, **fields):
    parameters = fields.pop("parameters", {})
    manifest = {
        "owner": owner,
        "text": text,
        "seed": 7,
        "duration_s": 0.5,
        "parameters": parameters,
        **fields,
    }
    return service.outputs.save(wav_bytes(), "wav", manifest)


# ---- kinds and filters, without a browser ----------------------------------------------------------------


def test_batch_and_dub_entries_are_labelled_as_such():
    assert output_mode({"parameters": {"endpoint": "ui-batch", "batch_id": "b", "item": 0}}) == "batch"
    assert output_mode({"parameters": {"endpoint": "batches", "batch_id": "b", "item": 1}}) == "batch"
    assert output_mode({"voice": "v", "parameters": {"endpoint": "dub", "batch_id": "d"}}) == "dub"  # track
    assert output_mode({"parameters": {"endpoint": "ui-dub", "batch_id": "d", "item": 2}}) == "dub"  # a cue
    assert (
        output_mode({"voice": "v", "prompt_text": None, "parameters": {"endpoint": "preview"}}) == "preview"
    )
    assert output_mode({"voice": "v", "prompt_text": None, "parameters": {"endpoint": "tts"}}) == "api"
    assert output_mode({"parameters": {"endpoint": "ui-job", "ui_mode": "instruct"}}) == "instruct"


def test_voice_choices_name_saved_voices_and_uploaded_recordings():
    from types import SimpleNamespace

    outputs = [SimpleNamespace(manifest={"voice": "v1"}), SimpleNamespace(manifest={"voice": None})]
    choices = voice_choices(outputs, {"v1": "bob"}, "All", "(uploaded recording)")
    assert choices == [("All", ANY), ("(uploaded recording)", UPLOADED), ("bob", "v1")]
    assert filter_from("", UPLOADED, None, None).matches(
        SimpleNamespace(manifest={"voice": None, "text": ""}, id="output_1", created_at=0)
    )


def test_times_and_days_are_the_operators_zone_whatever_the_machines():
    from datetime import datetime, timezone
    from types import SimpleNamespace
    from zoneinfo import ZoneInfo

    from cosyserve.ui.history_table import history_rows
    from cosyserve.ui.local_times import zone_name

    made = datetime(2027, 3, 10, 20, 30, tzinfo=timezone.utc).timestamp()  # 04:30 on the 11th in Shanghai
    manifest = {"voice": None, "text": "晚安"}
    output = SimpleNamespace(manifest=manifest, id="output_20270311_043000", created_at=made)
    shanghai = ZoneInfo("Asia/Shanghai")  # `--timezone Asia/Shanghai`: the file name's 04:30 on the 11th
    assert day_choices([output], "All", shanghai) == [("All", ANY), ("2027-03-11", "2027-03-11")]
    assert filter_from("", None, None, "2027-03-11", shanghai).matches(output)
    assert not filter_from("", None, None, "2027-03-10", shanghai).matches(output)
    assert filter_from("", None, None, "2027-03-10", timezone.utc).matches(output)
    bridge = SimpleNamespace(time_zone=shanghai, voices=lambda principal: [])
    rows = history_rows(SimpleNamespace(bridge=bridge), None, [output], "en")
    assert rows["headers"][0] == "Time (Asia/Shanghai)" and rows["data"][0][0] == "03-11 04:30:00"
    assert (zone_name(timezone.utc), zone_name(shanghai)) == ("UTC", "Asia/Shanghai")


def test_filter_fields():
    assert not filter_from("", ANY, ANY, ANY).active
    wanted = filter_from("  ", None, "batch", "2026-01-02")
    assert wanted.active and wanted.kind == "batch" and wanted.voice is None and wanted.day == "2026-01-02"
    assert HistoryFilter(query="x").active


@pytest.fixture(scope="module")
def server(api_synthesizer, demo_model_path, tmp_path_factory):
    from cosyserve.api.app import create_app
    from cosyserve.service.assembly import Service
    from cosyserve.service.settings import Settings
    from cosyserve.ui.app import mount_ui

    settings = Settings(
        model=str(demo_model_path),
        device="cpu",
        data_dir=tmp_path_factory.mktemp("history-data"),
        concurrency=1,
        ui_username=ADMIN,
        ui_password=PASSWORD,
        signing_secret="history-signing-secret-0123456789abcdef",
    )
    service = Service(settings, synthesizer_factory=sharing(api_synthesizer))
    app = create_app(service)
    mount_ui(app, service)
    live = LiveServer(app, service).start()
    live.wait_ready()
    alice, alice_plain = service.keys.create("alice", role="user")
    bob, bob_plain = service.keys.create("bob", role="user")
    live.keys = {"alice": alice_plain, "bob": bob_plain}  # type: ignore[attr-defined]
    live.owners = {"alice": f"key:{alice.id}", "bob": f"key:{bob.id}"}  # type: ignore[attr-defined]
    yield live
    live.stop()


@pytest.fixture
def seeded(server):
    """alice: a zero-shot result, a batch item and a dub track; bob: one result of his own."""
    service, owners = server.service, server.owners
    alice = owners["alice"]
    made = {
        "lesson": save(
            service,
            alice,
            "第2课：春天来了。",
            prompt_text="希望你以后能够做的比我还好呦。",
            parameters={"endpoint": "ui", "ui_mode": "zero_shot"},
        ),
        "batch": save(
            service,
            alice,
            "批量旁白第一条。",
            parameters={"endpoint": "ui-batch", "batch_id": "b1", "item": 0},
        ),
        "dub": save(
            service,
            alice,
            "配音台词一。\n配音台词二。",
            parameters={"endpoint": "dub", "batch_id": "d1"},
            sentences=[
                {"index": 0, "text": "配音台词一。", "start_s": 0.0, "end_s": 0.25},
                {"index": 1, "text": "配音台词二。", "start_s": 0.25, "end_s": 0.5},
            ],
        ),
        "bob": save(
            service, owners["bob"], "鲍勃的秘密。", parameters={"endpoint": "ui", "ui_mode": "cross_lingual"}
        ),
    }
    yield made
    for output in made.values():
        with contextlib.suppress(OutputNotFound):
            service.outputs.delete(output.id)


def test_a_user_cannot_delete_another_users_entry_but_an_admin_can(server, seeded):
    from cosyserve.ui.bridge import UiBridge

    bridge = UiBridge(server.service)
    alice = bridge.principal({"Authorization": f"Bearer {server.keys['alice']}"}, {})
    bob_output = seeded["bob"].id
    with pytest.raises(OutputNotFound):
        bridge.delete_output(alice, bob_output)
    assert server.service.outputs.get(bob_output).path.exists()  # still there
    assert bob_output not in [o.id for o in bridge.history(alice, 100, everyone=True)]  # not an admin
    bridge.delete_output(alice, seeded["lesson"].id)  # its own: deleted
    with pytest.raises(OutputNotFound):
        server.service.outputs.get(seeded["lesson"].id)
    _, admin_plain = server.service.keys.create("lead", role="admin")
    admin = bridge.principal({"X-API-Key": admin_plain}, {})
    assert bob_output in [o.id for o in bridge.history(admin, 100, everyone=True)]
    bridge.delete_output(admin, bob_output)  # an admin deletes anyone's
    with pytest.raises(OutputNotFound):
        server.service.outputs.get(bob_output)


def test_download_links_are_labelled_in_the_ui_language(server, seeded):
    from cosyserve.ui.bridge import UiBridge

    bridge, output = UiBridge(server.service), seeded["dub"]
    assert "下载 WAV" in history_links(bridge, output, "zh") and "Download" not in history_links(
        bridge, output, "zh"
    )
    assert "Download MP3" in history_links(bridge, output, "en")


# ---- in the browser ----------------------------------------------------------------------------------------

_SHOTS = itertools.count(1)


@pytest.fixture(scope="module")
def browser():
    with chromium() as launched:
        ARTIFACTS.mkdir(parents=True, exist_ok=True)  # shared with test_ui_e2e: its files are left alone
        yield launched


def shot(page, name: str) -> None:
    page.screenshot(path=str(ARTIFACTS / f"history-{next(_SHOTS):02d}-{name}.png"), full_page=True)


def signed_in_page(browser, server, key: str | None):
    context = browser.new_context(
        viewport={"width": 1400, "height": 1000}, locale="en-US", accept_downloads=True
    )
    context.set_default_timeout(WAIT_MS)
    page = context.new_page()
    page.goto(server.url + "/")
    page.locator("#login-submit").wait_for()
    if key is None:
        page.fill("#username", ADMIN)
        page.fill("#password", PASSWORD)
    else:
        page.click("details summary")
        page.fill("#api_key", key)
    page.click("#login-submit")
    page.wait_for_selector("#zero_shot-generate")
    page.get_by_role("tab", name="History").click()
    return context, page


def choose(page, elem_id: str, label: str) -> None:
    page.click(f"#{elem_id} input")
    page.locator("[data-testid='dropdown-option']", has_text=label).first.click()


def table_text(page) -> str:
    return page.inner_text("#history-table")


def wait_table(page, condition: str, arg) -> None:
    page.wait_for_function(
        f"(arg) => {{ const t = document.querySelector('#history-table').innerText; return {condition}; }}",
        arg=arg,
    )


@pytest.mark.slow
def test_a_user_finds_plays_downloads_and_deletes_its_entry(browser, server, seeded):
    context, page = signed_in_page(browser, server, server.keys["alice"])
    try:
        wait_table(page, "t.includes(arg)", "批量旁白")
        listed = table_text(page)
        assert "鲍勃" not in listed  # bob's entry is not alice's
        assert "batch" in listed and "dub" in listed and "zero-shot" in listed  # not "API"
        assert page.locator("#history-everyone").is_hidden()  # only admins list everyone's
        shot(page, "list")

        page.fill("#history-search input, #history-search textarea", "配音")  # search by text
        page.press("#history-search input, #history-search textarea", "Enter")
        wait_table(page, "!t.includes(arg)", "批量旁白")
        assert "配音台词" in table_text(page) and "第2课" not in table_text(page)
        page.wait_for_selector("#history-links a.cosy-download")
        links = page.inner_text("#history-links")
        assert "Download WAV" in links and "Subtitles" in links
        audio = page.locator("#history-audio")
        audio.locator("button[aria-label='Play'], button[aria-label='play']").first.click()
        page.wait_for_function(
            """() => { const el = document.querySelector('#history-audio');
                const pause = el.querySelector("button[aria-label='Pause'], button[aria-label='pause']");
                const time = el.querySelector('#time');
                return pause !== null || (time && time.innerText !== '0:00'); }""",
            timeout=20_000,
        )
        with page.expect_download() as info:
            page.click("#history-links a[data-format=wav]")
        data = info.value.path().read_bytes()
        assert data[:4] == b"RIFF"
        shot(page, "search-play")

        page.click("#cosy-lang label:has-text('中文')")  # the links follow the page's language
        page.wait_for_function("document.querySelector('#history-links').innerText.includes('下载 WAV')")
        shot(page, "chinese-links")
        page.click("#cosy-lang label:has-text('English')")
        page.wait_for_function("document.querySelector('#history-links').innerText.includes('Download WAV')")

        page.fill("#history-search input, #history-search textarea", "")
        page.press("#history-search input, #history-search textarea", "Enter")
        choose(page, "history-kind", "batch")  # filter by kind
        wait_table(page, "t.includes(arg[0]) && !t.includes(arg[1])", ["批量旁白", "配音台词"])
        choose(page, "history-kind", "All")
        wait_table(page, "t.includes(arg[0]) && t.includes(arg[1])", ["批量旁白", "配音台词"])
        choose(page, "history-voice", "(uploaded recording)")
        wait_table(page, "t.includes(arg[0]) && t.includes(arg[1])", ["批量旁白", "第2课"])
        choose(page, "history-voice", "All")
        wait_table(page, "t.includes(arg)", "配音台词")
        day = time.strftime("%Y-%m-%d", time.localtime(seeded["lesson"].created_at))
        choose(page, "history-day", day)
        wait_table(page, "t.includes(arg)", "第2课")
        shot(page, "filters")

        page.fill("#history-search input, #history-search textarea", "第2课")
        page.press("#history-search input, #history-search textarea", "Enter")
        wait_table(page, "!t.includes(arg)", "批量旁白")
        page.wait_for_function(
            "(id) => document.querySelector('#history-links').innerHTML.includes(id)", arg=seeded["lesson"].id
        )
        page.click("#history-delete")
        page.wait_for_function("document.querySelector('#history-status').innerText.includes('Deleted')")
        wait_table(page, "!t.includes(arg)", "第2课")
        assert "No entry matches" in page.inner_text("#history-status") or "Deleted" in page.inner_text(
            "#history-status"
        )
        shot(page, "deleted")
        with pytest.raises(OutputNotFound):
            server.service.outputs.get(seeded["lesson"].id)
        assert server.service.outputs.get(seeded["bob"].id).path.exists()
        left = len(server.service.outputs.list(limit=1000))
        page.click("#history-delete")  # none is picked after a delete: a second click deletes nothing
        page.wait_for_function("document.body.innerText.includes('Pick an entry in the list first')")
        assert len(server.service.outputs.list(limit=1000)) == left
    finally:
        context.close()


@pytest.mark.slow
def test_an_admin_lists_and_deletes_anyones_entry(browser, server, seeded):
    context, page = signed_in_page(browser, server, None)
    try:
        everyone = page.locator("#history-everyone input")
        everyone.wait_for()
        assert "鲍勃" not in table_text(page)  # its own entries first (none)
        everyone.check()
        wait_table(page, "t.includes(arg)", "鲍勃的秘密")
        lines = page.evaluate(  # its label on one line (it was cut to "Everyone'" and "entries")
            "(() => { const el = [...document.querySelectorAll('#history-everyone *')]"
            ".find(e => e.childElementCount === 0 && e.textContent.includes('Everyone'));"
            " const range = document.createRange(); range.selectNodeContents(el);"
            " return new Set([...range.getClientRects()].map(r => Math.round(r.top))).size; })()"
        )
        assert lines == 1, lines
        headers = page.locator("#history-table [role=columnheader], #history-table th").all_inner_texts()
        assert any("Owner" in header for header in headers), headers  # whose each entry is
        bob_row = page.evaluate(
            "() => [...document.querySelectorAll('#history-table tr, #history-table [role=row]')]"
            ".map((r) => r.innerText)"
            ".find((r) => r.includes('鲍勃的秘密'))"
        )
        assert "bob" in bob_row, bob_row
        fits = page.evaluate(  # the id column, last, still inside the table
            "(() => { const t = document.querySelector('#history-table');"
            " const cells = t.querySelectorAll('[role=columnheader], th');"
            " const last = cells[cells.length - 1];"
            " return last.innerText.includes('Id')"
            " && last.getBoundingClientRect().right <= t.getBoundingClientRect().right + 1; })()"
        )
        assert fits, headers
        page.fill("#history-search input, #history-search textarea", "鲍勃")
        page.press("#history-search input, #history-search textarea", "Enter")
        wait_table(page, "!t.includes(arg)", "批量旁白")
        page.wait_for_function(
            "(id) => document.querySelector('#history-links').innerHTML.includes(id)", arg=seeded["bob"].id
        )
        page.click("#history-delete")
        page.wait_for_function("document.querySelector('#history-status').innerText.includes('Deleted')")
        shot(page, "admin-deleted")
        with pytest.raises(OutputNotFound):
            server.service.outputs.get(seeded["bob"].id)
    finally:
        context.close()
