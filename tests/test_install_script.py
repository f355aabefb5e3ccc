"""scripts/install.sh's choice of torch build, run against stubs: a `.venv/bin/python` that plays pip
(two indexes, the installed distributions) and records every call, and an `nvidia-smi` on PATH. Nothing is
downloaded or installed; each run takes about a second."""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
CUDA_WHEELS = ["cuda-bindings", "cuda-toolkit", "nvidia-cublas", "nvidia-cudnn-cu13", "triton"]

STUB_PYTHON = r'''#!{python}
"""Plays `.venv/bin/python` for install.sh: pip against the indexes in the state file, torch's version."""
import json, subprocess, sys

STATE, LOG = {state!r}, {log!r}
argv = sys.argv[1:]
with open(STATE) as f:
    state = json.load(f)
with open(LOG, "a") as f:
    f.write(json.dumps(argv) + "\n")


def save():
    with open(STATE, "w") as f:
        json.dump(state, f)


def offer(index, spec):
    return state["indexes"][index].get(spec)


if argv[:2] == ["-m", "pip"]:
    command, rest = argv[2], argv[3:]
    words = [a for a in rest if not a.startswith("-")]
    if command == "uninstall":
        for name in words:
            if name == "torch":
                state["torch"] = None
            state["dists"] = [d for d in state["dists"] if d != name]
        save()
        sys.exit(0)
    if "pip" in words or "-e" in rest:
        sys.exit(0)
    index = "cpu" if "--index-url" in rest else "default"
    report = rest[rest.index("--report") + 1] if "--report" in rest else None
    spec = [w for w in words if w != report and w != state["cpu_index"]][-1]
    found = offer(index, spec)
    if found is None:
        sys.exit(1)
    cuda = found["build"] == "cuda"
    if "--dry-run" in rest:
        requires = ["nvidia-cublas-cu13==13.1", "filelock"] if cuda else ["filelock"]
        metadata = {{"name": "torch", "version": found["version"], "requires_dist": requires}}
        with open(report, "w") as f:
            json.dump({{"install": [{{"metadata": metadata}}]}}, f)
        sys.exit(0)
    state["torch"] = {{"version": found["version"].split("+")[0], "build": found["build"]}}
    if cuda:
        state["dists"] = sorted(set(state["dists"]) | set({cuda_wheels!r}))
    save()
    sys.exit(0)
if argv[0] == "-c":
    if "import torch" in argv[1]:
        if state["torch"] is None:
            sys.exit(1)
        print(state["torch"]["version"], state["torch"]["build"])
        sys.exit(0)
    import importlib.metadata  # install.sh's own code, over the distributions of the state file

    class Dist:
        def __init__(self, name):
            self.metadata = {{"Name": name}}

    importlib.metadata.distributions = lambda name=None: [
        Dist(d) for d in state["dists"] if name is None or d == name
    ]
    exec(compile(argv[1], "<install.sh>", "exec"), {{"__name__": "__main__"}})
    sys.exit(0)
if argv[0] == "-":
    code = sys.stdin.read()
    if "urlopen" in code:
        sys.exit(0 if state["cpu_index_reachable"] else 1)
    sys.exit(subprocess.run([{python!r}, "-", *argv[1:]], input=code, text=True).returncode)
sys.exit("stub python: unexpected call " + repr(argv))
'''


def _executable(path: Path, text: str) -> None:
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


def run_install(
    tmp_path: Path,
    *,
    gpu: bool = False,
    cpu_index_reachable: bool = False,
    default: dict[str, tuple[str, str]],
    cpu: dict[str, tuple[str, str]] | None = None,
    torch: tuple[str, str] | None = None,
    dists: list[str] | None = None,
    env: dict[str, str] | None = None,
) -> tuple[subprocess.CompletedProcess[str], dict, list[list[str]]]:
    """Run a copy of install.sh in `tmp_path/repo`; returns the run, the final state and pip's calls."""
    repo, stubs = tmp_path / "repo", tmp_path / "bin"
    (repo / "scripts").mkdir(parents=True)
    (repo / ".venv" / "bin").mkdir(parents=True)
    stubs.mkdir()
    shutil.copy(REPO_ROOT / "scripts" / "install.sh", repo / "scripts" / "install.sh")
    state_file, log_file = tmp_path / "state.json", tmp_path / "calls.jsonl"
    cpu_index = "https://cpu.index.test/whl/cpu"
    state = {
        "torch": None if torch is None else {"version": torch[0], "build": torch[1]},
        "dists": dists or [],
        "cpu_index": cpu_index,
        "cpu_index_reachable": cpu_index_reachable,
        "indexes": {
            "default": {spec: {"version": v, "build": b} for spec, (v, b) in default.items()},
            "cpu": {spec: {"version": v, "build": b} for spec, (v, b) in (cpu or {}).items()},
        },
    }
    state_file.write_text(json.dumps(state))
    log_file.write_text("")
    stub = STUB_PYTHON.format(
        python=sys.executable, state=str(state_file), log=str(log_file), cuda_wheels=CUDA_WHEELS
    )
    _executable(repo / ".venv" / "bin" / "python", stub)
    _executable(repo / ".venv" / "bin" / "cosyserve", "#!/bin/sh\necho cosyserve 0.1.0\n")
    smi = "echo 'GPU 0: NVIDIA H200 (UUID: GPU-1)'" if gpu else "echo 'NVIDIA-SMI has failed' >&2; exit 9"
    _executable(stubs / "nvidia-smi", f"#!/bin/sh\n{smi}\n")
    run_env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("COSYSERVE_")},
        "PATH": f"{stubs}{os.pathsep}{os.environ['PATH']}",
        "COSYSERVE_CPU_INDEX": cpu_index,
        **(env or {}),
    }
    done = subprocess.run(
        ["bash", str(repo / "scripts" / "install.sh")],
        capture_output=True,
        text=True,
        env=run_env,
        timeout=60,
    )
    calls = [json.loads(line) for line in log_file.read_text().splitlines()]
    return done, json.loads(state_file.read_text()), calls


def _pip_installs(calls: list[list[str]]) -> list[list[str]]:
    """`pip install` calls that install torch for real (not dry runs, not pip or the package)."""
    return [
        c[3:]
        for c in calls
        if c[:3] == ["-m", "pip", "install"] and "--dry-run" not in c and "-e" not in c and "pip" not in c[3:]
    ]


NEWEST_IS_CUDA = {"torch>=2.6": ("2.14.1", "cuda"), "torch==2.13.0": ("2.13.0+cpu", "cpu")}


def test_cpu_box_without_the_cpu_index_takes_the_tested_cpu_build(tmp_path: Path) -> None:
    done, state, calls = run_install(tmp_path, default=NEWEST_IS_CUDA)
    assert done.returncode == 0, done.stderr
    assert state["torch"] == {"version": "2.13.0", "build": "cpu"} and state["dists"] == []
    assert _pip_installs(calls) == [["--quiet", "torch==2.13.0"]]
    assert "unreachable" in done.stdout and "installing torch 2.13.0 (CPU build)" in done.stdout
    assert "WARNING" not in done.stderr
    assert re.search(r"installed: cosyserve 0\.1\.0, torch 2\.13\.0 \(cpu build\), \S+ in ", done.stdout)


def test_cpu_box_with_the_cpu_index_takes_the_newest_from_it(tmp_path: Path) -> None:
    done, state, calls = run_install(
        tmp_path, cpu_index_reachable=True, default=NEWEST_IS_CUDA, cpu={"torch>=2.6": ("2.14.1+cpu", "cpu")}
    )
    assert done.returncode == 0, done.stderr
    assert state["torch"] == {"version": "2.14.1", "build": "cpu"}
    assert _pip_installs(calls) == [
        ["--quiet", "--index-url", "https://cpu.index.test/whl/cpu", "torch>=2.6"]
    ]
    assert not any("--dry-run" in c for c in calls)


def test_the_cuda_build_is_the_last_resort_with_a_warning(tmp_path: Path) -> None:
    only_cuda = {"torch>=2.6": ("2.14.1", "cuda"), "torch==2.13.0": ("2.13.0", "cuda")}
    done, state, _ = run_install(tmp_path, default=only_cuda)
    assert done.returncode == 0, done.stderr
    assert state["torch"]["build"] == "cuda"
    warning = done.stderr.strip()
    assert warning.startswith("WARNING: no CPU build of torch is reachable") and "6.5 GB" in warning
    assert warning.endswith("COSYSERVE_TORCH_BUILD=cpu bash scripts/install.sh")


def test_switching_to_the_cpu_build_removes_the_cuda_wheels(tmp_path: Path) -> None:
    """What scripts/test.sh asks for (torch 2.13.0) in a venv that install.sh filled with the CUDA build."""
    done, state, calls = run_install(
        tmp_path,
        default=NEWEST_IS_CUDA,
        torch=("2.14.1", "cuda"),
        dists=[*CUDA_WHEELS, "numpy", "nvidia-ml-py"],
        env={"COSYSERVE_TORCH": "2.13.0"},
    )
    assert done.returncode == 0, done.stderr
    assert state["torch"] == {"version": "2.13.0", "build": "cpu"}
    assert state["dists"] == ["numpy", "nvidia-ml-py"]  # cosyserve's own NVML binding stays
    uninstalls = [c[3:] for c in calls if c[:3] == ["-m", "pip", "uninstall"]]
    assert uninstalls == [["--quiet", "-y", "torch"], ["--quiet", "-y", *CUDA_WHEELS]]
    assert "removing the CUDA build's wheels" in done.stdout


def test_a_kept_cpu_torch_loses_wheels_an_earlier_switch_left(tmp_path: Path) -> None:
    done, state, calls = run_install(
        tmp_path,
        default=NEWEST_IS_CUDA,
        torch=("2.13.0", "cpu"),
        dists=list(CUDA_WHEELS),
        env={"COSYSERVE_TORCH": "2.13.0"},
    )
    assert done.returncode == 0, done.stderr
    assert _pip_installs(calls) == [] and state["dists"] == []


def test_an_explicit_version_is_not_swapped_for_the_tested_one(tmp_path: Path) -> None:
    offers = {"torch==2.14.1": ("2.14.1", "cuda"), "torch==2.13.0": ("2.13.0+cpu", "cpu")}
    done, state, _ = run_install(tmp_path, default=offers, env={"COSYSERVE_TORCH": "2.14.1"})
    assert done.returncode == 0, done.stderr
    assert state["torch"] == {"version": "2.14.1", "build": "cuda"} and "WARNING" in done.stderr


@pytest.mark.parametrize("installed", [None, ("2.13.0", "cpu")])
def test_a_gpu_box_gets_the_cuda_build(tmp_path: Path, installed: tuple[str, str] | None) -> None:
    done, state, calls = run_install(tmp_path, gpu=True, default=NEWEST_IS_CUDA, torch=installed)
    assert done.returncode == 0, done.stderr
    assert state["torch"] == {"version": "2.14.1", "build": "cuda"}
    assert _pip_installs(calls) == [["--quiet", "torch>=2.6"]]


def test_test_script_pins_the_version_install_sh_falls_back_to() -> None:
    install = (REPO_ROOT / "scripts" / "install.sh").read_text()
    tests = (REPO_ROOT / "scripts" / "test.sh").read_text()
    pinned = re.search(r"^TESTED_TORCH=(\S+)", install, flags=re.MULTILINE).group(1)
    assert f'COSYSERVE_TORCH="${{COSYSERVE_TORCH:-{pinned}}}"' in tests
