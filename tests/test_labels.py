"""Implicit labels (GB 45438 `AIGC` field) and C2PA manifests: every format round-trips through verify;
changed audio reads as altered, a stripped label as unlabelled, a stream's label as unbound."""

from __future__ import annotations

import io
import json
import os

import numpy as np
import pytest
import soundfile

from cosyserve.commands.verify import SEVERITY
from cosyserve.service.audio_formats import StreamEncoder, encode
from cosyserve.service.labels import c2pa_manifest, flac_tags, id3_tags, ogg_tags, riff_tags
from cosyserve.service.labels.containers import TAGGERS, sniff
from cosyserve.service.labels.errors import LabelFormatError
from cosyserve.service.labels.labeller import Labeller
from cosyserve.service.labels.verify import EXIT_CODES, verify

SECRET = b"label-test-secret"
FORMATS = ("wav", "mp3", "flac", "opus")
OUTPUT_ID = "output_20250101_120000_3"


def speechlike(seconds: float = 1.0, rate: int = 24000) -> np.ndarray:
    t = np.arange(int(seconds * rate)) / rate
    return (0.3 * np.sin(2 * np.pi * 220 * t) * (0.6 + 0.4 * np.sin(2 * np.pi * 3 * t))).astype(np.float32)


def labeller(**kwargs: object) -> Labeller:
    return Labeller(provider="Example AI Co. (filing 123)", secret=SECRET, **kwargs)


def labelled(fmt: str, **kwargs: object) -> bytes:
    return labeller(**kwargs).label_file(encode(speechlike(), fmt), fmt, OUTPUT_ID, voice="alice")


def flip_audio_byte(fmt: str, data: bytes) -> bytes:
    """`data` with one bit of its audio changed (an Ogg's packets are spread over pages: its last one)."""
    if fmt == "opus":
        at = len(data) - 10
    else:
        payload = TAGGERS[fmt].payload(data)
        at = data.rindex(payload) + len(payload) // 2
    return data[:at] + bytes([data[at] ^ 0x01]) + data[at + 1 :]


def streamed(fmt: str, lab: Labeller, audio: np.ndarray, chunk: int = 2400) -> bytes:
    encoder = lab.stream_encoder(StreamEncoder(fmt), "req-1", None)
    parts = [encoder.header()]
    parts += [encoder.encode(audio[i : i + chunk]) for i in range(0, len(audio), chunk)]
    parts.append(encoder.finish())
    return b"".join(parts)


@pytest.mark.parametrize("fmt", FORMATS)
def test_every_format_round_trips_its_label_and_still_decodes(fmt: str) -> None:
    data = labelled(fmt)
    report = verify(data, SECRET, check_c2pa=False)
    assert report.status == "intact" and report.exit_code == 0, report.problems
    assert report.format == fmt and report.signature == "valid"
    label = report.label
    assert label["Label"] == "1" and label["ProduceID"] == OUTPUT_ID == label["PropagateID"]
    assert label["ContentProducer"] == "Example AI Co. (filing 123)"
    assert label["ReservedCode1"].startswith("sha256-fmt:") and label["ReservedCode2"].startswith(
        "hmac-sha256:"
    )
    assert set(label) == {
        "Label", "ContentProducer", "ProduceID", "ReservedCode1", "ContentPropagator", "PropagateID",
        "ReservedCode2",
    }  # fmt: skip
    samples, rate = soundfile.read(io.BytesIO(data), dtype="float32")  # players still read it
    plain, _ = soundfile.read(io.BytesIO(encode(speechlike(), fmt)), dtype="float32")
    assert rate == 24000 and len(samples) == len(plain)
    np.testing.assert_array_equal(samples, plain)  # the label changed no sample


@pytest.mark.parametrize("fmt", FORMATS)
def test_audio_changed_after_labelling_is_altered(fmt: str) -> None:
    changed = flip_audio_byte(fmt, labelled(fmt))
    report = verify(changed, SECRET, check_c2pa=False)
    assert report.status == "altered" and report.exit_code == 1
    assert any("audio changed" in p for p in report.problems)


@pytest.mark.parametrize("fmt", FORMATS)
def test_relabelled_with_other_audio_or_fields_is_altered(fmt: str) -> None:
    """A label copied onto other audio, or a field edited, no longer checks."""
    label = TAGGERS[fmt].read(labelled(fmt))
    other = TAGGERS[fmt].embed(encode(speechlike(0.5), fmt), label)
    assert verify(other, SECRET, check_c2pa=False).status == "altered"
    fields = json.loads(label)
    fields["ContentProducer"] = "someone else"
    edited = TAGGERS[fmt].embed(labelled(fmt), json.dumps(fields))
    report = verify(edited, SECRET, check_c2pa=False)
    assert report.status == "altered" and report.signature == "invalid"


@pytest.mark.parametrize("fmt", FORMATS)
def test_stripped_label_is_unlabelled(fmt: str) -> None:
    stripped = TAGGERS[fmt].strip(labelled(fmt))
    assert TAGGERS[fmt].read(stripped) is None
    report = verify(stripped, SECRET, check_c2pa=False)
    assert report.status == "unlabelled" and report.exit_code == 2
    assert verify(encode(speechlike(), fmt), SECRET, check_c2pa=False).status == "unlabelled"


def test_raw_pcm_and_unknown_bytes_are_unlabelled() -> None:
    pcm = encode(speechlike(), "pcm")
    assert labeller().label_file(pcm, "pcm", OUTPUT_ID) == pcm  # nowhere to put a label
    assert verify(pcm, SECRET).status == "unlabelled"
    assert verify(b"hello", SECRET).status == "unlabelled"


def test_without_the_secret_only_the_hash_is_checked() -> None:
    report = verify(labelled("wav"), None, check_c2pa=False)
    assert report.status == "intact" and report.signature == "unchecked"
    assert verify(labelled("wav"), b"another server", check_c2pa=False).status == "altered"


@pytest.mark.parametrize("fmt", FORMATS)
def test_streams_carry_a_signed_unbound_label_in_their_header(fmt: str) -> None:
    audio = speechlike(1.5)
    data = streamed(fmt, labeller(), audio)
    plain = streamed(fmt, Labeller.disabled(), audio)
    report = verify(data, SECRET, check_c2pa=False)
    assert report.status == "unbound" and report.exit_code == 3, report.problems
    assert report.label["ProduceID"] == "req-1" and report.signature == "valid"
    assert TAGGERS[fmt].payload(data) == TAGGERS[fmt].payload(plain)  # only the label was added
    if fmt != "opus":  # (each Ogg stream gets a random serial number)
        assert TAGGERS[fmt].strip(data) == TAGGERS[fmt].strip(plain)
    if fmt != "flac":  # libsndfile can't read a streamed flac (unknown length) back from memory
        samples, _ = soundfile.read(io.BytesIO(data), dtype="float32")
        np.testing.assert_array_equal(samples, soundfile.read(io.BytesIO(plain), dtype="float32")[0])


def test_label_survives_other_metadata_and_keeps_it() -> None:
    """Existing tags (a FLAC vendor comment, Opus tags, an ID3v2.3 tag) stay next to the label."""
    text = labeller().label_json(OUTPUT_ID, None)
    v23 = b"ID3\x03\x00\x00" + bytes([0, 0, 0, 21]) + b"TIT2" + (11).to_bytes(4, "big") + b"\0\0\0title text"
    mp3 = id3_tags.embed(v23 + encode(speechlike(), "mp3"), text)
    assert id3_tags.read(mp3) == text and mp3[3] == 3 and b"TIT2" in mp3[:200]
    assert id3_tags.payload(mp3) == encode(speechlike(), "mp3")
    flac = flac_tags.embed(encode(speechlike(), "flac"), text)
    assert flac_tags.read(flac) == text and b"reference libFLAC" in flac[:200]
    opus = ogg_tags.embed(encode(speechlike(), "opus"), text)
    assert ogg_tags.read(opus) == text and b"libopus" in opus[:300]
    assert riff_tags.read(riff_tags.embed(riff_tags.embed(encode(speechlike(), "wav"), "a"), text)) == text


def test_long_label_repaginates_ogg_and_keeps_it_playable() -> None:
    data = ogg_tags.embed(encode(speechlike(), "opus"), "x" * 70_000)  # OpusTags over two pages
    assert ogg_tags.read(data) == "x" * 70_000
    samples, _ = soundfile.read(io.BytesIO(data), dtype="float32")
    assert len(samples) == 24000


def test_damaged_and_foreign_files_are_refused_clearly() -> None:
    with pytest.raises(LabelFormatError, match="not a FLAC"):
        flac_tags.embed(b"RIFF0000WAVE", "x")
    with pytest.raises(LabelFormatError, match="incomplete"):
        flac_tags.read(encode(speechlike(), "flac")[:20])
    assert sniff(b"\xff\xfb\x90\x00") == "mp3" and sniff(b"OggS") == "opus" and sniff(b"nothing") is None


def test_cli_exit_status_follows_the_worst_file() -> None:
    assert [EXIT_CODES[s] for s in SEVERITY] == [0, 3, 2, 1]


# -- C2PA (c2pa-python is optional) ---------------------------------------------------------------------


def test_c2pa_off_without_the_package_says_so(tmp_path, monkeypatch) -> None:
    from cosyserve.service.settings import Settings

    monkeypatch.setattr(c2pa_manifest, "available", lambda: False)
    lab = Labeller.from_settings(Settings(data_dir=tmp_path, signing_secret="s"))
    assert lab.c2pa is None and "not installed" in lab.describe()["c2pa"]
    assert c2pa_manifest.read_manifest(b"", "wav")["status"] == "unavailable"


@pytest.fixture(scope="module")
def c2pa_signer(tmp_path_factory):
    try:
        import c2pa  # noqa: F401
    except ImportError:  # scripts/test.sh installs the extra: in CI its absence is a failure
        message = "c2pa-python is not installed (pip install 'cosyserve[labels]')"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    credentials = c2pa_manifest.load_credentials(None, None, tmp_path_factory.mktemp("c2pa-data"))
    assert credentials.self_signed
    return c2pa_manifest.C2paSigner(credentials)


@pytest.mark.parametrize("fmt", ["wav", "mp3"])
def test_c2pa_manifest_says_ai_generated_model_and_voice(c2pa_signer, fmt: str) -> None:
    data = labelled(fmt, c2pa=c2pa_signer)
    report = verify(data, SECRET)
    assert report.status == "intact", report.problems
    manifest = report.c2pa
    assert manifest["status"] == "valid" and manifest["ai_generated"] is True
    assert manifest["trusted_signer"] is False  # the private deployment's own certificate
    assert manifest["generation"]["voice_id"] == "alice" and manifest["generation"]["content_id"] == OUTPUT_ID
    assert "self-signed" in manifest["generation"]["signer"]
    assert "private deployment" in json.dumps(manifest["signer"])
    altered = verify(flip_audio_byte(fmt, data), SECRET)
    assert altered.status == "altered" and altered.c2pa["status"] == "invalid"


@pytest.mark.parametrize("fmt", ["opus", "flac"])
def test_c2pa_skips_opus_and_flac(c2pa_signer, fmt: str) -> None:
    data = labelled(fmt, c2pa=c2pa_signer)  # (a FLAC file still starts with its own magic)
    report = verify(data, SECRET)
    assert report.status == "intact" and report.c2pa["status"] == "unsupported"
    assert data[:4] == {"opus": b"OggS", "flac": b"fLaC"}[fmt]


def test_cli_files_are_labelled_for_their_data_dir(tmp_path, monkeypatch) -> None:
    """What `cosyserve synthesize/batch/dub` write: the data dir's secret signs, the same bytes each time."""
    from cosyserve.commands.cli_labels import cli_labeller, label_bytes, label_written_file

    monkeypatch.delenv("COSYSERVE_SIGNING_SECRET", raising=False)
    labels = cli_labeller(tmp_path)
    assert labels.c2pa is None
    data = encode(speechlike(), "flac")
    first, second = label_bytes(labels, data, "flac", "alice"), label_bytes(labels, data, "flac", "alice")
    assert first == second
    secret = (tmp_path / "signing_secret").read_text().strip().encode()
    report = verify(first, secret)
    assert report.status == "intact" and report.label["ProduceID"].startswith("local-")
    path = tmp_path / "x.wav"
    path.write_bytes(encode(speechlike(), "wav"))
    label_written_file(labels, path, None)
    assert verify(path.read_bytes(), secret).status == "intact"


@pytest.mark.parametrize("fmt", FORMATS)
def test_damaged_files_get_a_verdict_not_an_exception(fmt: str) -> None:
    """Bytes changed, cut or inserted anywhere near the headers: always one of the four verdicts."""
    rng = np.random.default_rng(5)
    base = labelled(fmt)
    for _ in range(150):
        data = bytearray(base)
        at = int(rng.integers(0, min(len(data), 700)))
        choice = rng.integers(0, 3)
        if choice == 0:
            data[at] = int(rng.integers(0, 256))
        elif choice == 1:
            data = data[:at]
        else:
            data[at:at] = rng.integers(0, 256, int(rng.integers(1, 20))).astype(np.uint8).tobytes()
        assert verify(bytes(data), SECRET, check_c2pa=False).status in EXIT_CODES


def _another_rate(fmt: str, data: bytes) -> bytes:
    """The file with its header saying 48 kHz instead of 24 kHz: the same samples, played twice as fast."""
    if fmt == "wav":
        at = data.index(b"fmt ") + 8
        out = bytearray(data)
        out[at + 4 : at + 8] = (48000).to_bytes(4, "little")
        out[at + 8 : at + 12] = (int.from_bytes(data[at + 8 : at + 12], "little") * 2).to_bytes(4, "little")
        return bytes(out)
    at = data.index(b"fLaC") + 4 + 4 + 10  # STREAMINFO's body: its sample rate starts at byte 10 (20 bits)
    out = bytearray(data)
    packed = int.from_bytes(data[at : at + 3], "big")
    out[at : at + 3] = ((48000 << 4) | (packed & 0xF)).to_bytes(3, "big")
    return bytes(out)


@pytest.mark.parametrize("fmt", ["wav", "flac"])
def test_a_header_edited_to_play_at_another_rate_is_altered(fmt: str) -> None:
    """Only the samples were bound: such a file read `intact` without a C2PA manifest (a team's run)."""
    edited = _another_rate(fmt, labelled(fmt))
    assert soundfile.info(io.BytesIO(edited)).samplerate == 48000  # it really plays differently
    report = verify(edited, SECRET, check_c2pa=False)
    assert report.status == "altered" and any("sample rate" in problem for problem in report.problems)


def test_a_label_from_before_the_format_was_bound_still_verifies() -> None:
    """Files labelled earlier say `sha256:` of the samples alone: still intact, still altered by a sample."""
    from cosyserve.service.labels.implicit import HASH_PREFIX, ImplicitLabel, audio_hash, signature

    plain = riff_tags.strip(labelled("wav"))
    old = ImplicitLabel(
        "Example AI Co. (filing 123)", OUTPUT_ID, audio_hash(riff_tags.payload(plain)), "x", OUTPUT_ID
    )
    fields = {**old.fields(), "ReservedCode1": HASH_PREFIX + audio_hash(riff_tags.payload(plain))}
    fields["ReservedCode2"] = signature(fields, SECRET)
    data = riff_tags.embed(plain, json.dumps(fields))
    assert verify(data, SECRET, check_c2pa=False).status == "intact"
    assert verify(flip_audio_byte("wav", data), SECRET, check_c2pa=False).status == "altered"
