"""`cosyserve synthesize` and `cosyserve voices` end to end on the demo model."""

from __future__ import annotations

from pathlib import Path

import pytest
import soundfile as sf
from tests.conftest import PROMPT_TRANSCRIPT

from cosyserve.cli import main


def _synthesize(demo: Path, data: Path, out: Path, *extra: str) -> int:
    return main(
        [
            "synthesize",
            "--model",
            str(demo),
            "--data-dir",
            str(data),
            "--quiet",
            "--text",
            "你好，世界。",
            "--out",
            str(out),
            *extra,
        ]
    )


def test_zero_shot_file_is_24k_mono_and_seed_reproducible(
    demo_model_path, shared_dir, tmp_path, capsys
) -> None:
    prompt = str(shared_dir / "audio" / "prompt_zh_24k.wav")
    args = (
        "--prompt-wav",
        prompt,
        "--prompt-text",
        PROMPT_TRANSCRIPT,
        "--seed",
        "7",
        "--srt",
        str(tmp_path / "a.srt"),
    )
    assert _synthesize(demo_model_path, tmp_path, tmp_path / "a.wav", *args) == 0
    assert _synthesize(demo_model_path, tmp_path, tmp_path / "b.wav", *args) == 0
    assert (tmp_path / "a.wav").read_bytes() == (tmp_path / "b.wav").read_bytes()
    info = sf.info(tmp_path / "a.wav")
    assert (info.samplerate, info.channels) == (24000, 1)
    tokens = int(capsys.readouterr().out.split(" speech tokens")[0].rsplit(", ", 1)[-1])
    assert info.frames == tokens * 2 * 480  # one speech token = 2 mel frames = 960 samples
    assert (tmp_path / "a.srt").read_text().startswith("1\n00:00:00,000 --> ")
    assert (tmp_path / "a.srt").read_text().splitlines()[2] == "你好，世界。"


def test_subtitles_show_the_typed_text(demo_model_path, shared_dir, tmp_path) -> None:
    vtt = tmp_path / "a.vtt"
    prompt = str(shared_dir / "audio" / "prompt_zh_24k.wav")
    args = ("--prompt-wav", prompt, "--text", "第2课：你好", "--seed", "7", "--vtt", str(vtt))
    assert _synthesize(demo_model_path, tmp_path, tmp_path / "a.wav", *args) == 0
    assert vtt.read_text(encoding="utf-8").splitlines()[3] == "第2课：你好"


@pytest.mark.parametrize("mode", [(), ("--instruct", "请用四川话表达。"), ("--stream",)])
def test_other_modes(demo_model_path, shared_dir, tmp_path, mode) -> None:
    prompt = str(shared_dir / "audio" / "prompt_zh_24k.wav")
    assert _synthesize(demo_model_path, tmp_path, tmp_path / "x.wav", "--prompt-wav", prompt, *mode) == 0
    assert sf.info(tmp_path / "x.wav").frames > 0


def test_voices_and_errors(demo_model_path, shared_dir, tmp_path, capsys) -> None:
    prompt = str(shared_dir / "audio" / "prompt_zh_24k.wav")
    common = ["--model", str(demo_model_path), "--data-dir", str(tmp_path)]
    assert main(["voices", "add", "me", "--wav", prompt, "--transcript", PROMPT_TRANSCRIPT, *common]) == 0
    assert "no consent recorded" in capsys.readouterr().err
    assert main(["voices", "add", "we", "--wav", prompt, "--consent", *common]) == 0
    assert main(["voices", "list", "--data-dir", str(tmp_path)]) == 0
    listed = capsys.readouterr().out
    assert " me " in listed and "consent by cli:" in listed
    assert main(["voices", "add", "..", "--wav", prompt, *common]) == 2  # a path-like name
    assert "not only dots" in capsys.readouterr().err
    assert _synthesize(demo_model_path, tmp_path, tmp_path / "v.wav", "--voice", "me", "--seed", "1") == 0
    assert main(["voices", "rm", "me", "--data-dir", str(tmp_path)]) == 0
    capsys.readouterr()
    assert _synthesize(demo_model_path, tmp_path, tmp_path / "v.wav") == 2  # neither --voice nor --prompt-wav
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "exactly one of --voice" in err
    assert _synthesize(demo_model_path, tmp_path, tmp_path / "v.wav", "--voice", "me") == 2
    assert "no voice 'me'" in capsys.readouterr().err


def test_precision_and_engine_options(demo_model_path, shared_dir, tmp_path, capsys) -> None:
    """Issue 21, item 10: precision and the engine options reach the engine from the command line."""
    prompt = str(shared_dir / "audio" / "prompt_zh_24k.wav")
    args = ("--prompt-wav", prompt, "--seed", "2", "--precision", "float32", "--flow-steps", "4", "--no-cfg")
    out = tmp_path / "p.wav"
    assert main(["synthesize", "--model", str(demo_model_path), "--data-dir", str(tmp_path),
                 "--text", "你好。", "--out", str(out), *args]) == 0  # fmt: skip
    err = capsys.readouterr().err
    assert "engine: cpu float32" in err and "4 flow steps, no CFG" in err
    assert sf.info(out).frames > 0
    assert _synthesize(demo_model_path, tmp_path, out, "--prompt-wav", prompt, "--precision", "float16") == 2
    assert "only supported on CUDA" in capsys.readouterr().err


def test_takes_and_the_json_summary(demo_model_path, shared_dir, tmp_path, capsys) -> None:
    """`--takes 2 --json`: the demo model's noise fails its checks, so both takes are made; the summary
    names the kept take's seed and scores."""
    import json

    prompt = str(shared_dir / "audio" / "prompt_zh_24k.wav")
    args = (
        "--prompt-wav",
        prompt,
        "--prompt-text",
        PROMPT_TRANSCRIPT,
        "--seed",
        "7",
        "--takes",
        "2",
        "--json",
    )
    assert _synthesize(demo_model_path, tmp_path, tmp_path / "a.wav", *args) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["seed"] in (7, 8) and summary["quality"]["takes"] == 2
    assert summary["quality"]["passed"] is False and "noise" in summary["quality"]["failed"]


def test_thresholds_for_this_synthesis_only(demo_model_path, shared_dir, tmp_path, capsys) -> None:
    """`--quality-max-flatness 1` judges this take by its own noise limit (the demo model's noise passes
    it); a threshold out of range is one usage line, before the model loads."""
    import json

    prompt = str(shared_dir / "audio" / "prompt_zh_24k.wav")
    args = ("--prompt-wav", prompt, "--prompt-text", PROMPT_TRANSCRIPT, "--seed", "7", "--json")
    out = tmp_path / "a.wav"
    assert _synthesize(demo_model_path, tmp_path, out, *args, "--quality-max-flatness", "1") == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert "noise" not in summary["quality"]["failed"]
    assert _synthesize(demo_model_path, tmp_path, out, *args, "--quality-min-similarity", "2") == 2
    err = capsys.readouterr().err
    assert "min_similarity 2.0 is out of range: use -1 to 1" in err and "Traceback" not in err


def test_an_instruction_longer_than_the_apis_limit_is_refused(
    demo_model_path, shared_dir, tmp_path, capsys
) -> None:
    """The API refused 500+ characters (422) while the CLI and batch items took them."""
    prompt = str(shared_dir / "audio" / "prompt_zh_24k.wav")
    status = _synthesize(
        demo_model_path, tmp_path, tmp_path / "o.wav", "--prompt-wav", prompt, "--instruct", "快" * 600
    )
    assert status == 2 and "instruct is 600 characters: at most 500" in capsys.readouterr().err
