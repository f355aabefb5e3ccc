"""The files a long dub goes through without being held whole: a stored WAV transcoded file to file in
blocks (the same audio `encode` makes whole), audio stored from a file on disk (moved, hashed in pieces),
and a dub's ZIP taking its long track that way."""

from __future__ import annotations

import hashlib
import io
import zipfile

import numpy as np
import pytest
import soundfile as sf

import cosyserve.service.batches.archive as batch_archive
from cosyserve.service.audio_formats import TRANSCODE_BLOCK, encode, transcode_file
from cosyserve.service.stores.output_files import temp_output_path
from cosyserve.service.stores.outputs import OutputStore

RATE = 24000


@pytest.fixture
def stored_wav(tmp_path):
    """3.5 blocks of a tone as a stored WAV: block boundaries fall inside the audio."""
    frames = TRANSCODE_BLOCK * 7 // 2
    tone = (0.4 * np.sin(2 * np.pi * 220 * np.arange(frames) / RATE)).astype(np.float32)
    path = tmp_path / "source.wav"
    path.write_bytes(encode(tone, "wav", source_rate=RATE))
    return path, sf.read(path, dtype="float32")[0]


def test_transcoding_file_to_file_gives_the_audio_encode_gives(stored_wav, tmp_path) -> None:
    path, audio = stored_wav
    transcode_file(path, tmp_path / "t.flac", "flac")
    flac, rate = sf.read(tmp_path / "t.flac", dtype="float32")
    assert rate == RATE and np.array_equal(flac, audio)  # lossless from the same 16-bit samples
    transcode_file(path, tmp_path / "t.pcm", "pcm")
    assert (tmp_path / "t.pcm").read_bytes() == encode(audio, "pcm", source_rate=RATE)
    transcode_file(path, tmp_path / "t.mp3", "mp3")
    mp3, rate = sf.read(tmp_path / "t.mp3", dtype="float32")
    assert rate == RATE and abs(len(mp3) - len(audio)) / RATE < 0.1  # mp3 frames pad a little
    transcode_file(path, tmp_path / "t16.wav", "wav", sample_rate=16000)
    resampled, rate = sf.read(tmp_path / "t16.wav", dtype="float32")
    whole, _ = sf.read(io.BytesIO(encode(audio, "wav", source_rate=RATE, sample_rate=16000)), dtype="float32")
    assert rate == 16000 and abs(len(resampled) - len(whole)) <= 1  # soxr's streaming filter, same length
    np.testing.assert_allclose(resampled[1000:-1000], whole[1000 : len(resampled) - 1000], atol=2e-3)


def test_audio_written_to_disk_is_stored_by_moving_it(stored_wav, tmp_path) -> None:
    store = OutputStore(tmp_path / "outputs")
    source, _ = stored_wav
    temp = temp_output_path(store.root, "wav")
    temp.write_bytes(source.read_bytes())
    saved = store.save(temp, "wav", {"duration_s": 1.0})
    assert not temp.exists() and saved.path.read_bytes() == source.read_bytes()
    assert saved.manifest["sha256"] == hashlib.sha256(source.read_bytes()).hexdigest()
    assert saved.manifest["size_bytes"] == source.stat().st_size
    assert store.get(saved.id).manifest["duration_s"] == 1.0


def test_a_dubs_zip_takes_a_long_track_file_to_file(stored_wav, tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(batch_archive, "IN_MEMORY_LIMIT_BYTES", 0)  # every track counts as long
    store = OutputStore(tmp_path / "outputs")
    source, audio = stored_wav
    track = store.save(source.read_bytes(), "wav", {})
    body = b"".join(batch_archive.stream_zip([], store, track=track, track_format="flac"))
    with zipfile.ZipFile(io.BytesIO(body)) as archive:
        flac, _ = sf.read(io.BytesIO(archive.read("dub.flac")), dtype="float32")
        assert "report.csv" in archive.namelist()
    assert np.array_equal(flac, audio)
    assert not [p for p in store.root.iterdir() if p.name.startswith(".")]  # its temp file is gone


def test_a_dubs_zip_keeps_its_report_without_its_track(tmp_path) -> None:
    """The track deleted (or never made): the report went with it."""
    store = OutputStore(tmp_path / "outputs")
    for dub, expected in ((True, {"report.csv", "manifest.csv"}), (False, {"manifest.csv"})):
        body = b"".join(batch_archive.stream_zip([], store, dub=dub))
        with zipfile.ZipFile(io.BytesIO(body)) as archive:
            assert set(archive.namelist()) == expected


def test_one_users_listing_and_the_total_do_not_read_everyones_sidecars(tmp_path, monkeypatch) -> None:
    """Listing a user's few outputs read every sidecar in the store, as did the total in /admin/status
    (1.1 s and 2.5 s at 20 000 outputs); the size index answers both."""
    store = OutputStore(tmp_path / "outputs")
    mine = store.save(b"RIFF" + b"\0" * 100, "wav", {"owner": "key:1"})
    for _ in range(20):
        store.save(b"RIFF" + b"\0" * 100, "wav", {"owner": "key:2"})
    total = store.total_bytes()  # the index is built (one scan), then kept by saves
    reads = []
    listed = store._listed
    monkeypatch.setattr(
        store, "_listed", lambda output_id, walk: reads.append(output_id) or listed(output_id, walk)
    )
    assert [o.id for o in store.list(owner="key:1")] == [mine.id] and reads == [mine.id]
    assert store.total_bytes() == total and total > 21 * 104
