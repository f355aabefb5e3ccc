"""Hostile or unlucky input against a real `cosyserve serve` process, its memory measured from /proc:
decode bombs are refused from their headers, and a flood of large bodies leaves memory near its baseline."""

from __future__ import annotations

import base64
import io
import json
import socket
import struct
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import pytest
import soundfile as sf

from server_process import ServerProcess
from silent_flac import silent_flac

pytestmark = pytest.mark.slow

REFUSE_WITHIN_S = 2.0
PEAK_GROWTH_MB = 200.0
FLOOD_BODIES, FLOOD_BODY_MB, FLOOD_ROUNDS = 20, 20, 3
SETTLED_WITHIN_MB = 300.0


@pytest.fixture(scope="module")
def server(demo_model_path: Path, tmp_path_factory: pytest.TempPathFactory):
    # The flood's bodies are 20 MB of JSON: the upload limit must let them be read and parsed.
    live = ServerProcess(
        demo_model_path, tmp_path_factory.mktemp("hostile") / "data", "--max-upload-mb", "16"
    )
    live.start()
    yield live
    live.stop()


def _flac(rate: int, channels: int, seconds: float) -> bytes:
    """Silence as FLAC through libsndfile's encoder: tiny on the wire, huge once decoded."""
    buffer = io.BytesIO()
    with sf.SoundFile(buffer, "w", rate, channels, "PCM_16", format="FLAC") as sound:
        block = np.zeros((rate * 2, channels), np.int16)
        for _ in range(int(seconds / 2)):
            sound.write(block)
    return buffer.getvalue()


def _wav_claiming_4gb() -> bytes:
    """A WAV header whose RIFF and data sizes say ~4 GB, followed by one second of audio."""
    data = np.zeros(48000, np.int16).tobytes()
    fmt = struct.pack("<HHIIHH", 1, 1, 48000, 96000, 2, 16)
    huge = 0xFFFFFFF0
    return (
        b"RIFF"
        + struct.pack("<I", huge)
        + b"WAVEfmt "
        + struct.pack("<I", 16)
        + fmt
        + b"data"
        + struct.pack("<I", huge)
        + data
    )


def _wav_8_channels_192k(seconds: float) -> bytes:
    buffer = io.BytesIO()
    sf.write(buffer, np.zeros((int(192000 * seconds), 8), np.int16), 192000, format="WAV", subtype="PCM_16")
    return buffer.getvalue()


@pytest.fixture(scope="module")
def bombs() -> dict[str, bytes]:
    return {
        "flac_192k_8ch_598s.flac": silent_flac(192000, 8, 598),  # the bomb, written in ms
        "flac_655350hz.flac": _flac(655350, 8, 10),
        "wav_claiming_4gb.wav": _wav_claiming_4gb(),
        "wav_8ch_192k.wav": _wav_8_channels_192k(5.0),
    }


def test_the_written_bomb_is_a_flac_that_decodes_to_its_length(bombs: dict[str, bytes]) -> None:
    """The frame-by-frame writer makes what libsndfile reads back (a short one is decoded in full)."""
    info = sf.info(io.BytesIO(bombs["flac_192k_8ch_598s.flac"]))
    assert (info.format, info.samplerate, info.channels, info.frames) == ("FLAC", 192000, 8, 598 * 192000)
    audio, rate = sf.read(io.BytesIO(silent_flac(192000, 8, 1.5)), dtype="int16", always_2d=True)
    assert rate == 192000 and audio.shape == (288000, 8) and not audio.any()


def test_decode_bombs_are_refused_from_their_headers(server: ServerProcess, bombs: dict[str, bytes]) -> None:
    with httpx.Client(base_url=server.url, timeout=60) as client:
        for name, data in bombs.items():
            server.reset_peak()
            before = server.memory_mb()
            started = time.monotonic()
            response = client.post(
                "/v1/tts", data={"text": "你好"}, files={"prompt_wav": (name, data, "audio/flac")}
            )
            elapsed = time.monotonic() - started
            growth = server.memory_mb("VmHWM") - before
            assert response.status_code == 400, (name, response.text)
            message = response.json()["error"]["message"]
            assert "0x" not in message, message  # no object reprs
            assert elapsed < REFUSE_WITHIN_S, (name, elapsed)
            assert growth <= PEAK_GROWTH_MB, (name, growth)


def _flood_body() -> bytes:
    """A 20 MB JSON body whose `prompt_wav` is base64 of random bytes: read, parsed, then refused."""
    noise = np.random.default_rng(0).integers(0, 256, FLOOD_BODY_MB * 750_000, dtype=np.uint8).tobytes()
    return json.dumps({"text": "你好", "prompt_wav": base64.b64encode(noise).decode()}).encode()


def test_a_flood_of_large_bodies_leaves_memory_near_its_baseline(server: ServerProcess) -> None:
    body = _flood_body()
    headers = {"content-type": "application/json"}
    with httpx.Client(base_url=server.url, timeout=120, limits=httpx.Limits(max_connections=32)) as client:

        def post(_: int) -> int:
            return client.post("/v1/tts", content=body, headers=headers).status_code

        assert post(0) == 400  # warm: the first large body sets up what every later one reuses
        time.sleep(1.0)
        baseline = server.memory_mb()
        statuses: list[int] = []
        with ThreadPoolExecutor(FLOOD_BODIES) as pool:
            for _ in range(FLOOD_ROUNDS):
                statuses += list(pool.map(post, range(FLOOD_BODIES)))
        time.sleep(1.5)  # the freed memory is handed back shortly after the last body
        settled = server.memory_mb()
    assert statuses and all(400 <= status < 500 for status in statuses), sorted(set(statuses))
    assert settled - baseline <= SETTLED_WITHIN_MB, (baseline, settled)


HTTPX_IDLE_S = 5.0  # how long httpx (and so the OpenAI SDK) keeps an idle connection to reuse it


def _health_on(sock: socket.socket, port: int) -> int:
    """GET /health on an open connection; the status, once the whole response (by its length) is read."""
    sock.sendall(f"GET /health HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode())
    received = b""
    while b"\r\n\r\n" not in received:
        received += sock.recv(65536) or pytest.fail(f"the server closed the connection: {received!r}")
    head, _, body = received.partition(b"\r\n\r\n")
    fields = dict(line.split(b":", 1) for line in head.split(b"\r\n")[1:])
    length = int({name.lower(): value for name, value in fields.items()}[b"content-length"])
    while len(body) < length:
        body += sock.recv(65536) or pytest.fail("the server closed the connection mid-body")
    return int(head.split(b" ", 2)[1])


def test_an_idle_connection_outlives_the_clients_own_idle_limit(server: ServerProcess) -> None:
    """The server keeps an idle connection longer than clients do: with uvicorn's 5 s, equal to httpx's,
    a client sometimes sent its next request on a connection the server was just closing (the flood above
    once got a disconnect instead of an answer that way)."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        assert _health_on(sock, server.port) == 200
        time.sleep(HTTPX_IDLE_S + 1.0)
        sock.setblocking(False)
        try:
            closed = sock.recv(1, socket.MSG_PEEK) == b""
        except BlockingIOError:  # nothing to read: still open
            closed = False
        assert not closed, "the server closed an idle connection a client would still reuse"
        sock.setblocking(True)
        assert _health_on(sock, server.port) == 200
