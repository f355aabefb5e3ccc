"""The prompt area in a real browser (Playwright + Debian Chromium): the optional parts note, the low-SNR
warning and its switches, with the denoise and ASR extras absent and present; error overlays that must
not cover the voice list, and the page that must stay put after a prompt is chosen.

"Absent" is simulated the way a missing package looks to Python (its `sys.modules` entry set to None, so
importing it fails) plus an empty ASR model directory; "present" is the real pyrnnoise package and the
stand-in ASR model. Each case has its own server (built after the patch: the page's switches are decided
when it is built). Screenshots of the prompt-quality panel go to test-artifacts/ui/.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import soundfile

from browser import chromium
from conftest import PROMPT_TRANSCRIPT, REPO_ROOT, LiveServer, sharing
from test_ui_e2e import standin_asr

pytestmark = pytest.mark.slow

ARTIFACTS = REPO_ROOT / "test-artifacts" / "ui"
WAIT_MS = 120_000
FOCUS_WAIT_MS = 10_000  # the focus moves right after the player appears


def start_ui_server(api_synthesizer, demo_model_path, data_dir: Path, asr_dir: Path) -> LiveServer:
    """The real app with its UI, no login (the anonymous caller has full rights)."""
    from cosyserve.api.app import create_app
    from cosyserve.service.assembly import Service
    from cosyserve.service.settings import Settings
    from cosyserve.ui.app import mount_ui

    settings = Settings(
        model=str(demo_model_path),
        device="cpu",
        data_dir=data_dir,
        concurrency=1,
        queue_size=2,
        request_timeout_s=300.0,
        signing_secret="test-signing-secret-0123456789abcdef",
        asr_model=asr_dir,
    )
    service = Service(settings, synthesizer_factory=sharing(api_synthesizer))
    app = create_app(service)
    mount_ui(app, service)
    return LiveServer(app, service).start().wait_ready()


@pytest.fixture(scope="module")
def browser():
    with chromium() as launched:
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        yield launched


def open_page(browser, server: LiveServer):
    context = browser.new_context(viewport={"width": 1400, "height": 1000}, locale="en-US")
    context.set_default_timeout(WAIT_MS)
    page = context.new_page()
    page.goto(server.url + "/")
    page.wait_for_selector("#zero_shot-generate")
    page.wait_for_function("document.querySelector('#cosy-status').innerText.includes('ready')")
    page.get_by_role("tab", name="Zero-shot clone").wait_for()  # the browser's language (en) is applied
    page.wait_for_function("document.querySelector('#zero_shot-parts').innerText.includes('Optional parts')")
    return page


def shot_of(page, selector: str, name: str) -> None:
    """A screenshot of one part of the page (the prompt-quality panel)."""
    page.locator(selector).first.screenshot(path=str(ARTIFACTS / f"prompt-{name}.png"))


def noisy_prompt(shared_dir: Path, target: Path) -> Path:
    """The real prompt with white noise 10 dB under its speech: the low-SNR warning's case."""
    samples, rate = soundfile.read(shared_dir / "audio" / "prompt_zh_24k.wav", dtype="float32")
    noise = np.random.default_rng(0).standard_normal(len(samples)).astype(np.float32)
    noisy = samples + noise * float(np.sqrt(np.mean(samples**2))) * 10 ** (-10 / 20)
    soundfile.write(target, np.clip(noisy, -1, 1), rate)
    return target


def upload_prompt(page, elem_id: str, feedback_id: str, path: Path) -> str:
    page.set_input_files(f"#{elem_id} input[type=file]", str(path))
    page.wait_for_function(
        f"/dBFS|✗/.test(document.querySelector('#{feedback_id}').innerText)", timeout=WAIT_MS
    )
    return page.inner_text(f"#{feedback_id}")


def open_tab(page, tab_id: str) -> None:
    page.click(f"button#tab-{tab_id}-button, [role=tab][aria-controls='tab-{tab_id}']")


TAB_NAMES = {"zero_shot": "Zero-shot clone", "cross_lingual": "Cross-lingual", "voices": "Voice library",
             "admin": "Admin"}  # fmt: skip


def show(page, tab_id: str) -> None:
    page.get_by_role("tab", name=TAB_NAMES[tab_id]).click()


# ---- the extras absent -----------------------------------------------------------------------------


@pytest.fixture(scope="class")
def bare_server(api_synthesizer, demo_model_path, tmp_path_factory):
    """A server where neither pyrnnoise nor sherpa-onnx imports, and no ASR model was downloaded."""
    with pytest.MonkeyPatch.context() as patch:
        for name in ("pyrnnoise", "pyrnnoise.rnnoise", "sherpa_onnx"):
            patch.setitem(sys.modules, name, None)  # `import` raises ImportError, as when not installed
        data = tmp_path_factory.mktemp("ui-bare")
        server = start_ui_server(api_synthesizer, demo_model_path, data / "data", data / "no-asr-model")
        yield server
        server.stop()


@pytest.fixture(scope="class")
def bare_page(browser, bare_server):
    page = open_page(browser, bare_server)
    yield page
    page.context.close()


class TestExtrasAbsent:
    def test_the_prompt_area_names_what_is_missing_and_how_to_add_it(self, bare_page, shared_dir, tmp_path):
        page = bare_page
        note = page.inner_text("#zero_shot-parts")
        assert "Noise reduction (RNNoise): not installed" in note, note
        assert "pip install 'cosyserve[denoise]'" in note, note
        assert "Prompt transcription (SenseVoice): not installed (package missing, model missing)" in note
        assert "pip install 'cosyserve[asr]'" in note and "cosyserve download --asr --dir" in note, note
        assert page.locator("#zero_shot-denoise").count() == 0  # no switch that cannot work
        assert page.locator("#zero_shot-transcribe").count() == 0

        feedback = upload_prompt(
            page, "zero_shot-prompt", "zero_shot-feedback", noisy_prompt(shared_dir, tmp_path / "n.wav")
        )
        assert "noisy recording" in feedback, feedback
        assert "turn on noise reduction" not in feedback, feedback  # the switch is not there
        assert "noise reduction is not installed on this server: pip install 'cosyserve[denoise]'" in feedback
        shot_of(
            page, "#zero_shot-prompt >> xpath=ancestor::div[contains(@class,'column')][1]", "extras-absent"
        )

    def test_other_tabs_and_admin_say_so_too(self, bare_page):
        page = bare_page
        show(page, "cross_lingual")
        note = page.inner_text("#cross_lingual-parts")
        assert "not installed" in note and "cosyserve[denoise]" in note and "SenseVoice" not in note
        assert page.locator("#cross_lingual-denoise").count() == 0
        show(page, "voices")
        assert "cosyserve[denoise]" in page.inner_text("#enrol-parts")
        assert page.locator("#enrol-denoise").count() == 0
        show(page, "admin")
        admin = page.inner_text("#admin-parts")
        assert admin.count("not installed") == 2 and "cosyserve download --asr" in admin, admin
        shot_of(page, "#admin-parts", "admin-extras-absent")


# ---- the extras present ----------------------------------------------------------------------------


@pytest.fixture(scope="class")
def full_page(browser, api_synthesizer, demo_model_path, tmp_path_factory):
    """A server with the real pyrnnoise and the stand-in ASR model, and a page on it."""
    data = tmp_path_factory.mktemp("ui-full")
    asr = standin_asr(tmp_path_factory.mktemp("asr"))
    server = start_ui_server(api_synthesizer, demo_model_path, data / "data", asr)
    page = open_page(browser, server)
    page.server = server  # type: ignore[attr-defined]
    yield page
    page.context.close()
    server.stop()


def covered_by(page, elem_id: str) -> str:
    """What the user hits at the middle of `#elem_id`: '' when it is the component itself, else the
    covering element's text (a status overlay's "Error" badge, a toast)."""
    return page.evaluate(
        """(id) => { const box = document.getElementById(id); const r = box.getBoundingClientRect();
        const hit = document.elementFromPoint(r.x + r.width / 2, r.y + r.height / 2);
        const overlay = hit && hit.closest('[data-testid=status-tracker], span.error, .toast-body');
        return box.contains(hit) && !overlay ? '' : (hit ? hit.outerHTML.slice(0, 200) : 'nothing'); }""",
        elem_id,
    )


def close_toasts(page) -> None:
    for close in page.locator(".toast-close").all():
        if close.is_visible():
            close.click()
    page.wait_for_function("document.querySelectorAll('.toast-body').length === 0")


PANEL = "#zero_shot-prompt >> xpath=ancestor::div[contains(@class,'column')][1]"  # the prompt's column


class TestExtrasPresent:
    def test_the_switches_work_and_the_note_says_installed(self, full_page, shared_dir, tmp_path):
        page = full_page
        note = page.inner_text("#zero_shot-parts")
        assert "✓ Noise reduction (RNNoise): installed" in note, note
        assert "✓ Prompt transcription (SenseVoice): installed" in note and "pip" not in note, note

        page.evaluate("() => window.scrollTo(0, 250)")
        page.wait_for_function("window.scrollY === 250")
        with page.expect_file_chooser() as chooser:  # as a user does: click, pick a file
            page.locator("#zero_shot-prompt button").filter(has_text="Click to Upload").first.click()
        chooser.value.set_files(str(noisy_prompt(shared_dir, tmp_path / "noisy.wav")))
        page.wait_for_function("/dBFS/.test(document.querySelector('#zero_shot-feedback').innerText)")
        feedback = page.inner_text("#zero_shot-feedback")
        assert "noisy recording" in feedback and "turn on noise reduction" in feedback, feedback
        # the focus stays in the prompt (on its new player), and the page where it was
        page.wait_for_function(
            "document.activeElement.closest('#zero_shot-prompt') !== null", timeout=FOCUS_WAIT_MS
        )
        assert page.evaluate("window.scrollY") == 250

        page.check("#zero_shot-denoise input")
        page.wait_for_selector("#zero_shot-denoised audio, #zero_shot-denoised [data-testid='download-link']")
        page.fill("#zero_shot-transcript textarea", "")
        page.click("#zero_shot-transcribe")
        page.wait_for_function(
            "(t) => document.querySelector('#zero_shot-transcript textarea').value === t",
            arg=PROMPT_TRANSCRIPT,
        )
        shot_of(page, PANEL, "extras-present")
        page.uncheck("#zero_shot-denoise input")
        page.wait_for_selector("#zero_shot-denoised", state="hidden")

    def test_an_error_leaves_the_voice_lists_usable(self, full_page):
        page = full_page
        show(page, "voices")
        page.click("#voices-rename")  # nothing picked: an error
        page.locator(".toast-body").filter(has_text="Choose a voice first").wait_for()
        page.wait_for_function("document.querySelector('#voices-status') !== null")
        for elem_id in ("voices-table", "voices-pick"):
            assert covered_by(page, elem_id) == "", elem_id
        page.screenshot(path=str(ARTIFACTS / "prompt-voices-after-error.png"))
        show(page, "zero_shot")
        assert covered_by(page, "zero_shot-voice") == ""
        page.click("#zero_shot-voice input")  # and it opens
        page.locator("ul[role=listbox] li").first.wait_for()
        page.keyboard.press("Escape")
        close_toasts(page)

    def test_on_a_phone_an_error_toast_leaves_the_voice_list_free(self, full_page):
        page = full_page
        page.set_viewport_size({"width": 390, "height": 844})
        try:
            page.fill("#zero_shot-text textarea", "")
            page.click("#zero_shot-generate")  # no text: an error toast
            toast = page.locator(".toast-body").last
            toast.wait_for()
            page.evaluate("document.getElementById('zero_shot-voice').scrollIntoView({block: 'start'})")
            page.wait_for_timeout(300)  # the toast slides in
            assert covered_by(page, "zero_shot-voice") == ""
            page.screenshot(path=str(ARTIFACTS / "prompt-phone-error-toast.png"))
            close_toasts(page)
        finally:
            page.set_viewport_size({"width": 1400, "height": 1000})
