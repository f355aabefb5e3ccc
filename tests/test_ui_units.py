"""Web UI pieces without a browser: strings, request building, error messages, history and log helpers."""

from __future__ import annotations

import string
from pathlib import Path
from types import SimpleNamespace

import pytest

from cosyserve.errors import ConsentRequired, InputError, ModelNotReady, QueueFull
from cosyserve.service.access.principals import AuthRequired
from cosyserve.ui.admin_tab import logs_text
from cosyserve.ui.assets import counter_html
from cosyserve.ui.bridge import UploadProblem, UploadRefused
from cosyserve.ui.generate import Form, UiError, build_request, error_message
from cosyserve.ui.history_tab import output_mode
from cosyserve.ui.i18n import STRINGS, Translator, pick_lang, text
from cosyserve.ui.login import safe_next


def fields(template: str) -> set[str]:
    return {name for _, name, _, _ in string.Formatter().parse(template) if name}


@pytest.mark.parametrize("key", sorted(STRINGS))
def test_every_string_has_both_languages_with_the_same_placeholders(key):
    zh, en = STRINGS[key]
    assert zh.strip() and en.strip()
    assert fields(zh) == fields(en)


def test_language_choice():
    assert pick_lang("en", "zh-CN,zh;q=0.9") == "en"  # the saved choice wins
    assert pick_lang(None, "zh-TW,en;q=0.8") == "zh"
    assert pick_lang(None, "en-US,en;q=0.9") == "en"
    assert pick_lang("fr", "de-DE") == "zh"  # neither: the default
    assert text("download", "en", fmt="MP3") == "Download MP3"


def test_translator_updates_every_bound_component():
    tr = Translator("zh")
    a, b = object(), object()
    tr.bind(a, label="text", placeholder="text_ph")
    tr.bind(b, choices=lambda lang: [lang])
    updates = tr.updates("en")
    assert tr.components == [a, b]
    assert updates[0]["label"] == "Text to speak" and updates[0]["placeholder"].startswith("Type")
    assert updates[1]["choices"] == ["en"]


@pytest.mark.parametrize(
    ("target", "expected"),
    [
        ("/", "/"),
        ("/?lang=en", "/?lang=en"),
        ("//evil.example/x", "/"),
        ("https://evil.example/", "/"),
        ("/\\evil.example", "/"),
        ("", "/"),
        (None, "/"),
    ],
)
def test_login_only_follows_local_paths(target, expected):
    assert safe_next(target) == expected


class FakeBridge:
    """What `build_request` uses of `UiBridge`."""

    max_text_chars = 10
    max_job_chars = 500
    max_takes = 5

    def __init__(self, transcript: str | None = "voice transcript") -> None:
        self.checked: list[str] = []
        self.voice_transcript = transcript

    def voice(self, principal, id_or_name: str):
        return SimpleNamespace(id="v1", name=id_or_name, transcript=self.voice_transcript)

    def check_prompt(self, path):
        self.checked.append(str(path))

    def read_upload(self, path):
        return b"RIFF....", ".wav"


def test_build_request_says_what_is_missing():
    bridge = FakeBridge()
    with pytest.raises(UiError) as missing_prompt:
        build_request(bridge, None, Form("cross_lingual", text="hi"))
    assert missing_prompt.value.key == "err_no_prompt"
    with pytest.raises(UiError) as missing_transcript:
        build_request(bridge, None, Form("zero_shot", prompt="/tmp/p.wav", text="hi"))
    assert missing_transcript.value.key == "err_no_transcript"
    with pytest.raises(UiError) as missing_instruction:
        build_request(bridge, None, Form("instruct", prompt="/tmp/p.wav", text="hi"))
    assert missing_instruction.value.key == "err_no_instruct"
    with pytest.raises(UiError) as too_long:
        build_request(bridge, None, Form("cross_lingual", prompt="/tmp/p.wav", text="字" * 11))
    assert too_long.value.key == "err_too_long" and too_long.value.values == {"count": 11, "limit": 10}
    assert "11 characters" in error_message(too_long.value, "en")
    for seed in ("-1", "abc", "99999999999"):
        with pytest.raises(UiError) as bad_seed:
            build_request(bridge, None, Form("cross_lingual", prompt="/tmp/p.wav", text="hi", seed=seed))
        assert bad_seed.value.key == "err_seed"
    with pytest.raises(UiError):
        build_request(bridge, None, Form("cross_lingual", prompt="/tmp/p.wav", text="   "))


def test_takes_from_the_form_and_the_servers_default():
    """The Takes slider's value goes into the request (a slider sends a float); out of range is a
    message; the slider starts at the server's `quality_takes`."""
    import gradio as gr

    from cosyserve.ui.bridge.synthesis import SynthesisPart
    from cosyserve.ui.studio import _controls

    bridge = FakeBridge()
    form = Form("cross_lingual", voice="alice", text="hi", takes=3.0)
    assert build_request(bridge, None, form).takes == 3
    assert build_request(bridge, None, Form("cross_lingual", voice="alice", text="hi")).takes is None
    for takes in (0, 6, 2.5):
        with pytest.raises(UiError) as bad:
            build_request(bridge, None, Form("cross_lingual", voice="alice", text="hi", takes=takes))
        assert bad.value.key == "err_takes" and "from 1 to 5" in error_message(bad.value, "en")
    part = SynthesisPart()
    part.service = SimpleNamespace(settings=SimpleNamespace(quality=SimpleNamespace(takes=2)))
    assert part.default_takes == 2 and part.max_takes == 5
    ctx = SimpleNamespace(tr=Translator("en"), bridge=SimpleNamespace(default_takes=2, max_takes=5))
    with gr.Blocks():
        slider = _controls("zero_shot", ctx)["takes"]
    assert (slider.value, slider.minimum, slider.maximum, slider.step) == (2, 1, 5, 1)


def test_build_request_per_mode():
    bridge = FakeBridge()
    zero = build_request(
        bridge, None, Form("zero_shot", prompt="/tmp/p.wav", transcript=" 你好 ", text="hi", seed="7")
    )
    assert zero.prompt_wav and zero.prompt_text == "你好" and zero.instruct is None and zero.seed == 7
    assert bridge.checked == ["/tmp/p.wav"]  # the prompt is checked before anything is queued
    cross = build_request(
        bridge, None, Form("cross_lingual", prompt="/tmp/p.wav", transcript="ignored", text="hi")
    )
    assert cross.prompt_text is None and cross.instruct is None and cross.seed is None
    preset = build_request(
        bridge, None, Form("instruct", prompt="/tmp/p.wav", preset="dialect:sichuanese", text="hi")
    )
    assert preset.instruct == "dialect:sichuanese"
    free = build_request(
        bridge,
        None,
        Form("instruct", prompt="/tmp/p.wav", preset="dialect:sichuanese", instruct="慢一点", text="hi"),
    )
    assert free.instruct == "慢一点"  # free text wins over the preset
    # A saved voice: cross-lingual must not read its transcript or default instruction.
    saved = build_request(
        bridge, None, Form("cross_lingual", voice="alice", text="hi", speed=1.5, volume=0.5)
    )
    assert (saved.voice, saved.prompt_text, saved.instruct, saved.prompt_wav) == ("v1", "", "", None)
    assert (saved.speed, saved.volume) == (1.5, 0.5)
    assert build_request(bridge, None, Form("zero_shot", voice="alice", text="hi")).prompt_text is None
    # A saved voice wins over whatever the (disabled) recording and transcript fields still hold.
    locked = build_request(
        bridge, None, Form("zero_shot", voice="alice", prompt="/tmp/p.wav", transcript="x", text="hi")
    )
    assert locked.voice == "v1" and locked.prompt_text is None and locked.prompt_wav is None
    with pytest.raises(UiError):  # zero-shot with a voice that has no transcript
        build_request(
            FakeBridge(transcript=None), None, Form("zero_shot", voice="alice", text="hi", transcript="typed")
        )
    long = build_request(
        bridge, None, Form("cross_lingual", prompt="/tmp/p.wav", text="字" * 40), allow_long=True
    )
    assert len(long.text) == 40  # over the interactive limit: goes to a job
    with pytest.raises(UiError) as too_long_for_a_job:
        build_request(
            bridge, None, Form("cross_lingual", prompt="/tmp/p.wav", text="字" * 501), allow_long=True
        )
    assert too_long_for_a_job.value.key == "err_job_too_long"
    denoised = build_request(
        bridge, None, Form("cross_lingual", prompt="/tmp/p.wav", text="hi", denoise=True)
    )
    assert denoised.denoise


def test_error_messages_are_sentences_not_tracebacks():
    assert "about 4 s" in error_message(QueueFull("full", retry_after_s=4), "en")
    assert "4 秒" in error_message(QueueFull("full", retry_after_s=4), "zh")
    assert "not ready" in error_message(ModelNotReady("loading"), "en")
    assert "log in again" in error_message(AuthRequired("expired"), "en")
    assert error_message(InputError("the prompt is only 1.0 s long"), "en") == "the prompt is only 1.0 s long"
    assert ".exe" in error_message(UploadRefused(UploadProblem("type", suffix=".exe")), "en")
    assert "21.0 MB" in error_message(UploadRefused(UploadProblem("size", size_mb=21, limit_mb=20)), "en")
    consent = ConsentRequired("... (API: consent=true beside prompt_wav, see GET /v1/voices/consent) ...")
    shown = error_message(consent, "en")
    assert "Tick the consent box" in shown and "API" not in shown  # the page's box, not the API's field
    internal = error_message(RuntimeError("CUDA error: device-side assert"), "en", "req123")
    assert "req123" in internal and "CUDA" not in internal


def test_the_chinese_page_leads_an_english_service_message_with_a_chinese_one():
    """Errors without a translated sentence showed the service's English alone on the Chinese page."""
    from cosyserve.errors import ERROR_TABLE
    from cosyserve.ui.i18n_errors import ZH_LEADS
    from cosyserve.ui.messages import stored_error_message

    untranslated = {kind.code for _cls, kind in ERROR_TABLE if kind.ui_key is None}
    assert untranslated <= set(ZH_LEADS), untranslated - set(ZH_LEADS)
    short = InputError("the prompt is only 1.0 s long")
    assert error_message(short, "zh") == "输入无法使用（the prompt is only 1.0 s long）"
    assert error_message(short, "en") == "the prompt is only 1.0 s long"
    assert stored_error_message("worker_lost", "its worker stopped", "zh").startswith("合成节点中途失联")
    assert stored_error_message("worker_lost", "its worker stopped", "en") == "its worker stopped"
    assert stored_error_message("brand_new_code", None, "zh") == "brand_new_code"


def test_history_modes():
    assert output_mode({"parameters": {"ui_mode": "instruct"}}) == "instruct"
    assert output_mode({"instruct": "dialect:cantonese"}) == "instruct"
    assert output_mode({"prompt_text": "transcript"}) == "zero_shot"
    assert output_mode({"prompt_text": None, "prompt_wav_sha256": "ab"}) == "cross_lingual"
    assert output_mode({"voice": "v1", "prompt_text": None}) == "api"
    assert output_mode({"voice": "v1", "parameters": {"ui_mode": "preview"}}) == "preview"  # not "API"


def test_logs_leave_out_the_pages_own_requests():
    entries = [
        {"ts": "t1", "level": "INFO", "logger": "cosyserve.access", "message": "GET /assets/index.js 200"},
        {
            "ts": "t2",
            "level": "INFO",
            "logger": "cosyserve.access",
            "message": "POST /gradio_api/queue/join 200",
        },
        {
            "ts": "t3",
            "level": "INFO",
            "logger": "cosyserve.access",
            "message": "POST /v1/tts 200",
            "request_id": "r",
        },
        {"ts": "t4", "level": "WARNING", "logger": "cosyserve.service", "message": "model ready"},
    ]
    lines = logs_text(entries).splitlines()
    assert len(lines) == 2 and "/v1/tts" in lines[0] and "[r]" in lines[0] and "model ready" in lines[1]


def test_counter():
    assert counter_html(3, 200) == '<div class="cosy-counter">3 / 200</div>'
    assert "over" in counter_html(201, 200) and "⚠" in counter_html(201, 200)


def test_ui_modules_stay_small():
    for path in (Path(__file__).parents[1] / "src" / "cosyserve" / "ui").glob("*.py"):
        assert len(path.read_text(encoding="utf-8").splitlines()) <= 400, path.name


def test_every_bridge_call_of_the_pages_exists() -> None:
    """The pages call the bridge by name (`bridge.x`, `ctx.bridge.x`); a method moved or removed on one side
    only would fail at the first click, so every name used must be on `UiBridge` or `BatchBridge`."""
    import ast

    from cosyserve.ui.bridge import BatchBridge, UiBridge

    known = set(dir(UiBridge)) | set(dir(BatchBridge)) | {"service"}
    ui_dir = Path(__file__).parents[1] / "src" / "cosyserve" / "ui"
    missing = []
    for path in sorted(ui_dir.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.Attribute):
                continue
            owner = node.value
            named = (isinstance(owner, ast.Name) and owner.id == "bridge") or (
                isinstance(owner, ast.Attribute) and owner.attr == "bridge"
            )
            if named and node.attr not in known:
                missing.append(f"{path.name}:{node.lineno}: bridge.{node.attr}")
    assert not missing, "the pages call what the bridge does not have:\n" + "\n".join(missing)


def test_the_batch_tabs_takes_go_to_every_item_unless_it_sets_its_own(tmp_path):
    """The Batch tab's Takes slider is the batch's `takes`: items without a `takes` column get it, an
    item's own wins; out of range is refused before anything is submitted."""
    from cosyserve.errors import InputError
    from cosyserve.ui.bridge import BatchBridge

    submitted = []
    limits = SimpleNamespace(max_batch_items=10, max_text_chars=40, max_dub_track_s=60.0, max_upload_mb=1)
    service = SimpleNamespace(
        access=SimpleNamespace(check_rate=lambda principal: None, check_quota=lambda principal: None),
        settings=SimpleNamespace(limits=limits),
        backend=SimpleNamespace(submit_batch=lambda batch, spec: submitted.append(batch) or "record"),
    )
    batches = BatchBridge(SimpleNamespace(service=service, max_takes=5))
    script = tmp_path / "lines.csv"
    script.write_text("text,takes\n第一句。,\n第二句。,1\n", encoding="utf-8")
    principal = SimpleNamespace(owner="user:ann", key=None)
    common = dict(voice="alice", instruct="", fmt="wav", max_speed=1.25, request_id="r1")
    assert batches.submit(principal, script, takes=3, **common) == "record"
    batch = submitted[-1]
    assert batch.shared["takes"] == 3
    assert [item.params["takes"] for item in batch.items] == [3, 1]
    batches.submit(principal, script, **common)  # the slider untouched: the server's default
    assert "takes" not in submitted[-1].shared and submitted[-1].items[0].params.get("takes") is None
    with pytest.raises(InputError, match="from 1 to 5"):
        batches.submit(principal, script, takes=6, **common)
    assert len(submitted) == 2


def test_a_click_cancelled_before_it_started_is_cancelled_as_it_starts() -> None:
    """The Cancel button sends the token of the page's last Generate click: if no run has it yet (the click
    still waits in the page's queue), it is cancelled as it begins; other clicks and sessions are not."""
    from cosyserve.ui import generate
    from cosyserve.ui.generate import TicketRegistry

    registry = TicketRegistry()
    running = registry.begin("s1", "first")
    assert registry.cancel("s1", "second") == 1  # the running one stops, and "second" is remembered
    assert running.cancelled
    registry.end("s1", running)
    assert registry.begin("s1", "second").cancelled
    assert not registry.begin("s1", "second").cancelled  # once
    assert not registry.begin("s1", "third").cancelled
    registry.cancel("s1", "fourth")
    assert not registry.begin("s2", "fourth").cancelled  # another browser's click of the same token
    for n in range(generate.MAX_CANCELLED_CLICKS + 1):
        registry.cancel("s3", f"old{n}")
    assert not registry.begin("s3", "old0").cancelled  # the oldest forgotten: memory stays bounded
    assert registry.begin("s3", "old1").cancelled


def test_a_voice_deleted_since_the_list_was_shown_is_named_as_such() -> None:
    """A saved voice picked from a list that is out of date (deleted in another tab or by an admin): one
    sentence that says so and what to do, not the API's "no voice 'v_…': GET /v1/voices" advice; a voice
    whose files are missing keeps its own explanation."""
    from cosyserve.errors import VoiceFilesMissing, VoiceNotFound

    bridge = FakeBridge()

    def gone(principal, id_or_name):
        raise VoiceNotFound(f"no voice {id_or_name!r}: list voices with GET /v1/voices")

    bridge.voice = gone
    with pytest.raises(UiError) as refused:
        build_request(bridge, None, Form("cross_lingual", voice="v_123", text="hi"))
    message = error_message(refused.value, "en")
    assert "no longer exists" in message and "pick another voice" in message
    assert "v_123" not in message and "/v1/" not in message
    assert "已不存在" in error_message(refused.value, "zh")

    def elsewhere(principal, id_or_name):
        raise VoiceFilesMissing("voice 'x' has its files on another node only")

    bridge.voice = elsewhere
    with pytest.raises(VoiceFilesMissing):
        build_request(bridge, None, Form("cross_lingual", voice="x", text="hi"))


def test_a_long_text_job_that_failed_before_any_part_clears_its_bar_and_says_why() -> None:
    import gradio as gr

    from cosyserve.ui.generate import Run
    from cosyserve.ui.long_text import run_job

    record = SimpleNamespace(
        is_terminal=True, state="failed", output_id=None, error_message="the API key was revoked"
    )
    bridge = SimpleNamespace(
        max_text_chars=10,
        sentence_total=lambda text: 3,
        submit_job=lambda *args, **kwargs: "job_1",
        job=lambda job_id: (record, None),
        cancel_job=lambda job_id: None,
    )
    request = SimpleNamespace(text="一句。" * 8)
    updates = []
    with pytest.raises(gr.Error, match="revoked"):
        for update in run_job(bridge, Run(), None, request, Form("cross_lingual"), "en", "/tmp", "r1"):
            updates.append(update)
    _audio, _links, info, _stream, bar, _preview = updates[-1]
    assert bar == "" and "revoked" in info


def test_an_upload_whose_file_is_gone_asks_for_it_again(tmp_path):
    """Gradio's upload cache can drop a file the page still shows (it expired, or a restart cleaned it):
    saving a voice from it said "Something went wrong on the server" with a FileNotFoundError logged."""
    from types import SimpleNamespace

    from cosyserve.ui.bridge.uploads import UploadsPart

    part = SimpleNamespace(
        service=SimpleNamespace(settings=SimpleNamespace(limits=SimpleNamespace(max_upload_mb=20)))
    )
    with pytest.raises(UploadRefused) as refused:
        UploadsPart.read_upload(part, tmp_path / "gone" / "prompt.wav")
    assert refused.value.problem.kind == "gone"
    assert "upload or record it again" in error_message(refused.value, "en")
    assert "重新上传" in error_message(refused.value, "zh")


def test_a_cancelled_batch_counts_what_was_made_not_what_was_dropped():
    """A batch cancelled after 6 of 60 items read "cancelled · 60 / 60 finished · 6 done · 0 failed"."""
    from types import SimpleNamespace

    from cosyserve.ui.batch_rows import progress_html

    counts = SimpleNamespace(done=6, failed=1, cancelled=53, total=60)
    record = SimpleNamespace(state="cancelled", id="b1", error_code=None, error_message=None)
    shown = progress_html(SimpleNamespace(counts=counts, record=record, time_left_s=None), "en")
    assert "7 / 60 finished · 6 done · 1 failed · 53 cancelled" in shown and 'value="7"' in shown
    running = SimpleNamespace(done=2, failed=0, cancelled=0, total=5)
    record = SimpleNamespace(state="running", id="b2", error_code=None, error_message=None)
    shown = progress_html(SimpleNamespace(counts=running, record=record, time_left_s=None), "en")
    assert "2 / 5 finished · 2 done · 0 failed" in shown and "cancelled" not in shown


def test_the_batch_table_says_which_items_to_listen_to():
    """The API's `check_these` and the archive's `check` column had no counterpart on the Batch tab."""
    from types import SimpleNamespace

    from cosyserve.ui.batch_rows import item_check as _check

    def item(state: str, quality: dict | None) -> SimpleNamespace:
        return SimpleNamespace(state=state, result={"quality": quality} if quality is not None else {})

    assert _check(item("done", {"passed": True}), "en") == "✓"
    assert (
        _check(item("done", {"passed": False, "failed": ["noise", "pace"]}), "en") == "⚠ listen: noise, pace"
    )
    assert (
        _check(item("done", {"passed": False, "failed": ["noise", "pace"]}), "zh") == "⚠ 请试听：噪声、pace"
    )
    assert _check(item("done", None), "en") == "" and _check(item("failed", {"passed": False}), "en") == ""


def test_saving_a_voice_without_a_recording_asks_for_one():
    """The enrol form said "…or pick a saved voice", which it has no picker for."""
    from types import SimpleNamespace

    import gradio as gr

    from cosyserve.ui.library_tab import _LibraryActions

    bridge = SimpleNamespace(principal_of=lambda request: object())
    actions = _LibraryActions(SimpleNamespace(bridge=bridge), [])
    with pytest.raises(gr.Error) as error:
        actions.enrol("en", "narrator", None, "", False, True, SimpleNamespace())
    assert "upload or record 3-30 s of the voice to save" in str(error.value.message)
    assert "saved voice" not in str(error.value.message)


def test_a_cached_copy_is_fetched_by_its_owner_and_admins_alone() -> None:
    from cosyserve.service.access.principals import Principal
    from cosyserve.ui.file_owners import CachedFileOwners

    owners = CachedFileOwners(max_folders=3)
    carol, dave = Principal("session", "user", name="carol"), Principal("session", "user", name="dave")
    admin, nobody = Principal("session", "admin", name="ops"), Principal("anonymous", "user")
    folder = "cosy-" + "a" * 32
    owners.record(folder, carol)
    path = f"/tmp/gradio/{folder}/prompt.wav"
    assert owners.allows(carol, path) and owners.allows(admin, path) and not owners.allows(dave, path)
    unknown = "/tmp/gradio/cosy-" + "b" * 32 + "/x.wav"  # not made by this process: users are refused
    assert not owners.allows(carol, unknown) and owners.allows(admin, unknown)
    assert owners.allows(dave, "/tmp/gradio/3f2a9c/upload.wav")  # Gradio's own files: not ours to judge
    owners.record("cosy-" + "c" * 32, nobody)  # a server without logins: everyone's
    assert owners.allows(dave, "/tmp/gradio/cosy-" + "c" * 32 + "/x.wav")
    dave_folder = "cosy-" + "e" * 32
    owners.record(dave_folder, dave)
    # through dave's own folder to carol's: `..` (plain, %-escaped, twice escaped) is resolved first
    for step in ("..", "%2e%2e", "%252e%252e", "./.."):
        sneaky = f"/tmp/gradio/{dave_folder}/{step}/{folder}/prompt.wav"
        assert not owners.allows(dave, sneaky) and owners.allows(carol, sneaky), step
    assert not owners.allows(dave, f"/tmp/gradio/{folder}/{dave_folder}/x.wav")  # every folder named counts
    owners.record("cosy-" + "d" * 32, dave)  # the oldest is forgotten past max_folders
    assert not owners.allows(carol, path)


def test_a_batch_items_error_reads_in_the_pages_words():
    """Stored errors are the API's messages ("cancelled by the client", "list voices with GET
    /v1/voices"): the Batch tab says them in the page's language."""
    from types import SimpleNamespace

    from cosyserve.ui.batch_rows import item_error

    def item(code: str | None, message: str | None, voice: str | None = None) -> SimpleNamespace:
        params = {"voice": voice} if voice else {}
        return SimpleNamespace(
            state="failed", output_id=None, error_code=code, error_message=message, params=params
        )

    assert item_error(item(None, None), "en") == ""
    assert item_error(item("cancelled", "cancelled by the client"), "en") == "Cancelled."
    assert item_error(item("cancelled", "cancelled by the client"), "zh") == "已取消。"
    gone = item_error(item("voice_not_found", "no voice 'bob': list voices with GET /v1/voices", "bob"), "en")
    assert "bob" in gone and "GET /v1/voices" not in gone and "Voice library" in gone
    assert "音色库" in item_error(item("voice_not_found", "no voice 'bob'", "bob"), "zh")
    quota = item_error(item("quota_exceeded", "the daily audio quota of 60 s has 0.0 s left"), "zh")
    assert quota.startswith("请求过于频繁") and "60 s" in quota
    assert (
        item_error(item("invalid_input", "the text has nothing to say"), "en")
        == "the text has nothing to say"
    )
    deleted = SimpleNamespace(state="done", output_id=None, error_code=None, error_message=None, params={})
    assert item_error(deleted, "en") == "Its audio was deleted."


def test_errors_the_ui_shows_for_a_voice_or_result_deleted_elsewhere_are_translated():
    from cosyserve.errors import OutputNotFound, VoiceFilesMissing, VoiceNotFound
    from cosyserve.ui.messages import error_message

    assert "GET /v1/voices" not in error_message(
        VoiceNotFound("no voice 'x': list voices with GET /v1/voices"), "en"
    )
    assert error_message(VoiceNotFound("no voice 'x'"), "zh").startswith("所选音色已不存在")
    assert "刷新" in error_message(OutputNotFound("no output output_1; it may have expired"), "zh")
    assert error_message(VoiceFilesMissing("its files are on node b"), "en") == "its files are on node b"


def test_a_voice_name_the_server_refuses_is_said_in_the_pages_language():
    from cosyserve.service.stores.voice_fields import check_name, name_taken
    from cosyserve.ui.messages import error_message, stored_error_message

    with pytest.raises(Exception) as bad:
        check_name("x" * 100)
    assert error_message(bad.value, "zh").startswith("音色名称须为")
    assert error_message(name_taken("narrator"), "zh").startswith("你已有同名的音色")
    assert "already have a voice" in error_message(name_taken("narrator"), "en")
    # a stored `invalid_input` is not every one a voice name's: it keeps its own message
    assert (
        stored_error_message("invalid_input", "the text has nothing to say", "zh")
        == "输入无法使用（the text has nothing to say）"
    )


def test_a_results_download_links_do_not_expire_with_a_signature():
    """They were signed for `signed_url_ttl_s` (15 min): a user listening longer clicked a link that did
    nothing. The page's own user downloads through the route with its sign-in instead."""
    from pathlib import Path

    from cosyserve.service.stores.output_files import StoredOutput
    from cosyserve.ui.bridge.outputs import OutputsPart

    output = StoredOutput(
        "output_20250101_120000", Path("a.wav"), Path("a.json"), "/v1/outputs/output_20250101_120000", {}
    )
    part = OutputsPart.__new__(OutputsPart)
    assert part.download_url(output) == "/v1/outputs/output_20250101_120000"
    assert part.download_url(output, "mp3") == "/v1/outputs/output_20250101_120000?format=mp3"


def test_a_stopped_jobs_note_is_two_sentences_in_the_pages_language():
    """ "…what finished before is kept What was made is kept: …" ran on, in English on the Chinese page."""
    from types import SimpleNamespace

    from cosyserve.ui.long_text import stopped_note

    record = SimpleNamespace(
        state="failed",
        error_code="key_revoked",
        error_message="API key 3 was revoked while this work ran",
        result_extra={
            "partial": {"segments_done": 5, "segments_total": 17, "audio_s": 73.3, "missing_from": 5}
        },
        duration_s=73.3,
    )
    note = stopped_note(record, "en")
    assert "ran. What was made is kept: 5 of 17 parts" in note, note
    assert stopped_note(record, "zh").startswith("⚠ 密钥已被吊销")


def test_the_next_request_in_line_is_not_said_to_have_none_ahead():
    from types import SimpleNamespace

    from cosyserve.ui.synthesis_run import _queued_line

    bridge = SimpleNamespace(queue_wait_estimate=lambda ticket: 9.2)
    assert _queued_line(bridge, SimpleNamespace(position=0), "en") == "Next in line: starts in about 9 s"
    assert "2 ahead" in _queued_line(bridge, SimpleNamespace(position=2), "en")


def test_a_long_texts_result_carries_its_take_badge():
    """A job's result showed no badge: a take that failed its checks looked clean in the studio."""
    from types import SimpleNamespace

    from cosyserve.service.quality import TakeReport
    from cosyserve.service.quality.scores import TakeScores
    from cosyserve.ui.long_text import job_quality

    kept = TakeReport(TakeScores(flatness=0.9, failed=("noise",))).as_dict()
    report = job_quality(SimpleNamespace(result_extra={"quality": kept}))
    assert report is not None and report.scores.failed == ("noise",)
    assert job_quality(SimpleNamespace(result_extra={})) is None
    assert job_quality(SimpleNamespace(result_extra={"quality": "not a report"})) is None


def test_a_voice_deleted_meanwhile_leaves_the_studios_list():
    """After "the selected voice no longer exists" the list still offered it, selected (a team's run)."""
    from types import SimpleNamespace

    from cosyserve.ui.studio_events import voice_still_there

    kept = SimpleNamespace(id="v1", name="kept", owner=None)
    bridge = SimpleNamespace(
        voices=lambda principal: [kept],
        owner_names=lambda principal: {},
        principal_of=lambda request: SimpleNamespace(is_admin=False, owner="key:1"),
    )
    assert voice_still_there(bridge, "v1", "en", None) == {"__type__": "update"}  # still there: untouched
    gone = voice_still_there(bridge, "v2", "en", None)
    assert gone["value"] == "" and [value for _, value in gone["choices"]] == ["", "v1"]


def test_voice_names_are_words_not_punctuation():
    from cosyserve.errors import VoiceNameInvalid
    from cosyserve.service.stores.voice_fields import check_name

    # Devanagari and Tamil names hold combining vowel signs and viramas (they were refused)
    for name in (
        "张三",
        "ジョン・スミス",
        "김민수",
        "José 2",
        "a.b",
        "〇号",
        "प्रिया",
        "தமிழ்",
        "ไทย",
        "ශ්\u200dරී",
    ):
        assert check_name(name) == name
    for name in (
        "】【",
        "。。",
        "..",
        "-",
        "_",
        "★",
        "\u0301a",
        "x\u200dy",
        "\u200dශ",
        "al\u034fice",
        "alice\ufe0f",
        "1\u0301",
    ):
        with pytest.raises(VoiceNameInvalid):
            check_name(name)


def test_every_event_handler_takes_what_the_page_gives_it(tmp_path):
    """A handler whose signature Gradio cannot match its inputs (a lambda wanting the request) warned at
    every start and ran with an argument missing: the studio's voice list kept a deleted voice."""
    import warnings

    from cosyserve.service.assembly import Service
    from cosyserve.service.settings import Settings
    from cosyserve.ui.app import build_ui

    def no_model(_settings, _voices):
        raise RuntimeError("no model in this test")

    service = Service(Settings(model="demo", device="cpu", data_dir=tmp_path), synthesizer_factory=no_model)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        build_ui(service)
    assert not [str(w.message) for w in caught if "arguments for function" in str(w.message)]


def test_batch_tab_refusals_are_titled_in_the_pages_language() -> None:
    """Starting a batch without a file or a voice raised a toast titled "Error" on the Chinese page."""
    import gradio as gr

    from cosyserve.ui.batch_tab import _BatchActions

    actions = _BatchActions(SimpleNamespace(bridge=None), None, None)
    for path, voice in ((None, "v"), ("script.csv", None)):
        with pytest.raises(gr.Error) as raised:
            actions.start("zh", path, voice, "", "wav", 1.25, None, None)
        assert raised.value.title == "无法完成"


def test_the_batch_tick_resends_the_table_only_when_an_item_moved():
    """A 1000-item batch's table was read and sent to each watching page every second; now the tick sends
    the progress line and reads and sends the items only when the counts (or the language) changed."""
    from cosyserve.service.stores.batches import BatchCounts
    from cosyserve.ui.batch_tab import _BatchActions
    from cosyserve.ui.bridge import BatchStatus

    record = SimpleNamespace(
        id="b1", state="running", is_terminal=False, kind="script", error_code=None, error_message=None
    )
    counts = {"done": 0, "queued": 3}
    item = SimpleNamespace(
        position=1,
        name="one",
        state="queued",
        duration_s=None,
        output_id=None,
        result=None,
        error_code=None,
        error_message=None,
    )
    reads = []

    def status(principal, batch_id):
        n = BatchCounts(3, counts["done"], 0, 0, 0, counts["queued"], None)
        return BatchStatus(record, n, counts["done"] / 3, None, None)

    def items(batch_id):
        reads.append(batch_id)
        return [item] * 3

    batches = SimpleNamespace(
        status=status,
        items=items,
        archive_url=lambda _id: "/zip",
        track_url=lambda _r: None,
        recent=lambda principal: [],
    )
    actions = _BatchActions(SimpleNamespace(bridge=None), batches, None)
    actions._principal = lambda request: "alice"
    first = actions.tick("en", "b1", None, None)
    assert len(reads) == 1 and first[2]["value"]["data"]
    again = actions.tick("en", "b1", first[-1], None)
    assert len(reads) == 1 and again[2] == {"__type__": "update"} and again[-1] == first[-1]
    assert again[0] == first[0]  # the progress line, sent every tick
    counts.update(done=1, queued=2)
    item.state = "done"
    moved = actions.tick("en", "b1", again[-1], None)
    assert len(reads) == 2 and moved[2]["value"]["data"][0][2] == "done" and moved[-1] != first[-1]
    assert actions.tick("zh", "b1", moved[-1], None)[2]["value"]["headers"] != moved[2]["value"]["headers"]
    record.state, record.is_terminal = "done", True  # the last view is always whole
    counts.update(done=3, queued=0)
    last = actions.tick("en", "b1", moved[-1], None)
    assert len(reads) == 4 and last[-1] != moved[-1]


def test_partial_uploads_of_hung_up_clients_are_removed(tmp_path):
    """Gradio leaves the temporary file of an upload whose client hung up, tracked by nothing: they piled
    up in its upload folder for ever. Old `tmp*` files directly in it go; finished uploads (in folders of
    their own), young ones still arriving and other files stay."""
    import os
    import time

    from cosyserve.ui.upload_leftovers import LEFTOVER_AGE_S, remove_partial_uploads

    now = time.time()
    (tmp_path / "3f2a").mkdir()
    files = {
        "tmpold": now - LEFTOVER_AGE_S - 60,
        "tmpyoung": now - 60,
        "3f2a/tmpdone.wav": now - LEFTOVER_AGE_S - 60,
        "notes.txt": now - LEFTOVER_AGE_S - 60,
    }
    for name, when in files.items():
        (tmp_path / name).write_bytes(b"x" * 10)
        os.utime(tmp_path / name, (when, when))
    assert remove_partial_uploads(tmp_path, now=now) == 1
    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file()) == [
        "3f2a/tmpdone.wav",
        "notes.txt",
        "tmpyoung",
    ]
    assert remove_partial_uploads(tmp_path / "missing", now=now) == 0
