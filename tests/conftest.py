"""Shared test fixtures: where `../shared` (parity fixtures, real speech prompts) lives."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from pg_server import database_url, postgres_url  # noqa: F401  (fixtures: SQLite or PostgreSQL; PostgreSQL)
from redis_server import redis_url  # noqa: F401  (fixture: a throwaway redis-server)

if TYPE_CHECKING:
    from cosyserve.model.flow import CausalFlow
    from cosyserve.modeldir.model_dir import ModelDir

REPO_ROOT = Path(__file__).resolve().parents[1]

# Tiny models are dominated by per-op overhead: one intra-op thread is faster and keeps timings steady
# when the machine is shared. Engines loaded by tests read COSYSERVE_THREADS.
os.environ.setdefault("COSYSERVE_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")


def find_shared_dir() -> Path | None:
    candidate = Path(os.environ.get("COSYSERVE_SHARED", REPO_ROOT.parent / "shared"))
    return candidate if candidate.is_dir() else None


@pytest.fixture(autouse=True)
def _one_torch_thread():
    """Every test leaves torch at one intra-op thread. torch's thread count is process-wide: one test
    that loaded an engine with 2 threads once made every later file in its worker run 2 spinning
    OpenMP threads beside the other worker's, 10-15x slower (test_streaming_reuse: 137 s against 10)."""
    yield
    torch = sys.modules.get("torch")  # not imported: nothing can have changed it
    if torch is not None and torch.get_num_threads() != 1:
        torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _file_mask_as_it_was():
    """Every test leaves the process's file-creation mask as it found it (`serve`, `worker`, `backup`,
    `keys` and `voices` narrow it, as they should, for the process they run in)."""
    mask = os.umask(0o022)
    os.umask(mask)
    yield
    os.umask(mask)


def require_installed(what: str, present: bool) -> None:
    """A test's outside tool or package: in CI its absence is a failure (scripts/test.sh installs it),
    elsewhere the test is skipped."""
    if present:
        return
    if os.environ.get("CI") == "true":
        pytest.fail(f"{what} is missing: scripts/test.sh installs it")
    pytest.skip(f"{what} is not installed")


@pytest.fixture(scope="session")
def shared_dir() -> Path:
    """`../shared`; in CI its absence is a failure, elsewhere the test is skipped."""
    found = find_shared_dir()
    if found is None:
        if os.environ.get("CI") == "true":
            pytest.fail("../shared not found: set COSYSERVE_SHARED to the shared fixtures directory")
        pytest.skip("../shared not found (set COSYSERVE_SHARED)")
    return found


@pytest.fixture(scope="session")
def tiny_dir(shared_dir: Path) -> Path:
    """The parity fixture directory: `tiny/model` plus the official outputs for it."""
    return shared_dir / "parity" / "tiny"


@pytest.fixture(scope="module")
def model_dir(tiny_dir: Path) -> ModelDir:
    """The tiny parity model directory (no ONNX front-end graphs needed)."""
    from cosyserve.modeldir.model_dir import ModelDir

    return ModelDir.open(tiny_dir / "model", require_onnx=False)


@pytest.fixture(scope="module")
def flow(model_dir: ModelDir) -> CausalFlow:
    """The tiny model's flow, loaded once per test module."""
    from cosyserve.engine.loading import load_flow

    return load_flow(model_dir)


@pytest.fixture(scope="session")
def demo_model_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A demo model directory (random weights, stand-in ONNX graphs), written once per test session."""
    from cosyserve.modeldir.demo_model import write_demo_model

    return write_demo_model(tmp_path_factory.mktemp("models") / "demo", seed=0)


@pytest.fixture(scope="session")
def prompt_wav_bytes(shared_dir: Path) -> bytes:
    return (shared_dir / "audio" / "prompt_zh_24k.wav").read_bytes()


PROMPT_TRANSCRIPT = "希望你以后能够做的比我还好呦。"


# ---- API tests: the real app in uvicorn on a free local port, around the demo model ----------------


class LiveServer:
    """A uvicorn server in a background thread of this process (so tests can look at its Service)."""

    def __init__(self, app, service) -> None:
        import socket

        import uvicorn

        self.app, self.service = app, service
        self.socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.socket.bind(("127.0.0.1", 0))
        self.port = self.socket.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(
            app, log_config=None, access_log=False, lifespan="on", timeout_graceful_shutdown=5
        )
        self.server = uvicorn.Server(config)
        self.thread = None

    def start(self, timeout: float = 30.0) -> LiveServer:
        import threading
        import time

        self.thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": [self.socket]}, name="test-uvicorn", daemon=True
        )
        self.thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("the test server did not start")
            time.sleep(0.02)
        return self

    def wait_ready(self, timeout: float = 120.0) -> LiveServer:
        import time

        deadline = time.monotonic() + timeout
        while not self.service.readiness()["ready"]:
            if time.monotonic() > deadline:
                raise RuntimeError(f"the test server is not ready: {self.service.readiness()}")
            time.sleep(0.05)
        return self

    def client(self, **kwargs):
        import httpx

        kwargs.setdefault("timeout", 120.0)
        return httpx.Client(base_url=self.url, **kwargs)

    def stop(self, timeout: float = 60.0) -> None:
        if self.thread is not None and self.thread.is_alive():
            self.server.should_exit = True
            self.thread.join(timeout)
        self.socket.close()


@pytest.fixture(scope="session")
def api_synthesizer(demo_model_path: Path):
    """The demo model, loaded once; each test server shares its networks with its own voice library."""
    from cosyserve.service.local.synthesizer import Synthesizer
    from cosyserve.service.logs import configure_logging

    configure_logging("INFO")  # the ring buffer behind GET /admin/logs
    return Synthesizer.load(demo_model_path, device="cpu")


def sharing(synthesizer):
    """A synthesizer factory handing each service `synthesizer`'s networks with its own voices and limits."""
    return lambda settings, voices: synthesizer.sharing_model(
        voices=voices, max_text_chars=settings.limits.max_text_chars, quality=settings.quality.policy()
    )


@pytest.fixture(scope="session")
def start_api_server(api_synthesizer, demo_model_path: Path, tmp_path_factory: pytest.TempPathFactory):
    """`start_api_server(**settings)` → a started LiveServer; stop it yourself or at the session's end.

    Keyword arguments are settings by flat name (`concurrency=2`); `factory=` replaces the synthesizer
    loader, `wait_ready=False` returns before the model is loaded, `service_kwargs=` go to Service.
    """

    from cosyserve.api.app import create_app
    from cosyserve.service.assembly import Service
    from cosyserve.service.settings import Settings

    started: list[LiveServer] = []

    def start(*, factory=None, wait_ready: bool = True, service_kwargs=None, **settings) -> LiveServer:
        values = {
            "model": str(demo_model_path),
            "device": "cpu",
            "data_dir": tmp_path_factory.mktemp("api-data"),
            "concurrency": 1,
            "queue_size": 8,
            "request_timeout_s": 120.0,
            "signing_secret": "test-signing-secret-0123456789abcdef",
            **settings,
        }
        service = Service(
            Settings(**values),
            synthesizer_factory=factory or sharing(api_synthesizer),
            **(service_kwargs or {}),
        )
        server = LiveServer(create_app(service), service).start()
        started.append(server)
        return server.wait_ready() if wait_ready else server

    yield start
    for server in started:
        server.stop()


API_TEXT = "hi"  # short: the demo model answers in about a second
API_SEED = 3
LONG_TEXT = "第一句话说得很长很长，要让它超过一个片段的长度才行。" * 4


def enrol_voice(client, name: str, wav: bytes, transcript: str = PROMPT_TRANSCRIPT) -> dict:
    """Enrol a voice through the API (multipart), returning its JSON; consent confirmed (user keys must)."""
    files = {"audio": ("prompt.wav", wav, "audio/wav")}
    fields = {"name": name, "transcript": transcript, "consent": "true"}
    response = client.post("/v1/voices", data=fields, files=files)
    assert response.status_code == 201, response.text
    return response.json()
