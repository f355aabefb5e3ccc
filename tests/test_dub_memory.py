"""A dub's memory does not depend on its track's length (issue 25 item 3): a track with one cue at 00:00:01
and one at 10:00:00 (the limit raised to allow it) is written through the real track step — the cues'
stored audio read one at a time, the silence written in blocks, the WAV moved into the output store and
hashed in pieces — in a fresh process whose peak memory is measured around that step alone.

Writing the 10 h track puts 1.7 GB on disk for a moment (removed with the test's folder); nothing is timed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from cosyserve.service.stores.outputs import OutputStore

PEAK_GROWTH_LIMIT_MB = 300
SRC = Path(__file__).resolve().parents[1] / "src"

TRACK_STEP = r"""
import gc, json, sys, types
from pathlib import Path

import numpy as np

from cosyserve.frontend.subtitles import parse_subtitles
from cosyserve.service.audio_formats import encode
from cosyserve.service.batches.inputs import BatchRules, cue_items
from cosyserve.service.local.batches import BatchPlan, BatchRunner
from cosyserve.service.requests import EVERY_VOICE, OutputSpec
from cosyserve.service.stores.batches import BatchStore
from cosyserve.service.stores.db import make_engine
from cosyserve.service.stores.jobs import JobStore
from cosyserve.service.stores.outputs import OutputStore

root, rate = Path(sys.argv[1]), 24000
engine = make_engine(f"sqlite:///{root / 'jobs.sqlite'}")
jobs, batches, outputs = JobStore(engine), BatchStore(engine), OutputStore(root / "outputs")
srt = "1\n00:00:01,000 --> 00:00:02,000\n早。\n\n2\n10:00:00,000 --> 10:00:01,000\n晚。\n"
items = cue_items(parse_subtitles(srt), BatchRules(has_prompt=True, max_track_s=40000))
job = jobs.create({}, kind="dub")
batches.add(job.id, [item.as_row() for item in items])
attempt = jobs.claim(job.id, "test", 600).attempt
speech = (0.2 * np.random.default_rng(0).standard_normal(rate // 2)).astype(np.float32)
for item in batches.items(job.id):
    saved = outputs.save(encode(speech, "wav", source_rate=rate), "wav", {"owner": None})
    batches.start(job.id, item.position, attempt)
    batches.finish(job.id, item.position, attempt, output_id=saved.id, duration_s=0.5, result={"speed": 1.0})
runner = BatchRunner(types.SimpleNamespace(info={"sample_rate": rate}), batches, outputs, None)
plan = BatchPlan(job.id, "dub", {}, None, OutputSpec(), EVERY_VOICE)


def kib(field):
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise SystemExit(f"no {field} in /proc/self/status")


gc.collect()
before = kib("VmRSS")
Path("/proc/self/clear_refs").write_text("5")  # the peak (VmHWM) starts again from here
reset = kib("VmHWM") <= before + 1024
outcome = runner._track(plan)
print(json.dumps({"before_kib": before, "peak_kib": kib("VmHWM"), "peak_reset": reset,
                  "duration_s": outcome.duration_s, "output_id": outcome.output_id}))
"""


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="needs Linux /proc to measure peaks")
def test_a_ten_hour_track_is_written_in_bounded_memory(tmp_path) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")])}
    command = [sys.executable, "-c", TRACK_STEP, str(tmp_path)]
    done = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    measured = json.loads(done.stdout.strip().splitlines()[-1])
    assert measured["peak_reset"], measured  # else the peak would be the process's, not the step's
    growth_mb = (measured["peak_kib"] - measured["before_kib"]) / 1024
    print(f"10 h track: peak memory growth {growth_mb:.1f} MB")
    assert growth_mb <= PEAK_GROWTH_LIMIT_MB, measured

    output = OutputStore(tmp_path / "outputs").get(measured["output_id"])
    rate = 24000
    info = sf.info(str(output.path))
    assert (info.samplerate, info.frames) == (rate, 36001 * rate)  # to the last cue's end
    assert output.manifest["duration_s"] == measured["duration_s"] == 36001.0
    assert output.manifest["size_bytes"] == output.path.stat().st_size
    for start_s in (1.0, 36000.0):  # each cue's speech starts on its sample, silence before it
        around, _ = sf.read(output.path, start=round(start_s * rate) - 100, frames=400, dtype="float32")
        assert np.all(around[:100] == 0) and np.max(np.abs(around[100:110])) > 0
    assert not [p for p in output.path.parent.iterdir() if p.name.startswith(".")]  # no temp file left
