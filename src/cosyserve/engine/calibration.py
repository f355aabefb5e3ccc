"""Which linear kernel (`engine.linear_kernels`) runs each LM matrix shape fastest on this machine.

Measured once per machine and cached: a cold start on a new machine (or torch version, thread count,
instruction-set cap) measures each shape in a fraction of a second, later starts read the answer.

How shapes are measured: one-row products (decoding) against copies of a random weight of each shape,
`WORKING_SET_BYTES` of them per shape and kernel, each kernel packing its own copies. All the shapes
of one request are measured together and take turns, shape by shape and kernel by kernel, for `ROUNDS`
rounds: between two timings of one kernel on one shape every other pair streams its weights, several
hundred MB, so each timing reads its weights from memory as decoding does, not from a cache, and a
burst of other work on the machine slows every kernel alike. Each keeps its best round. The exact
kernels give the same values to float rounding; the fast ones' relative error is measured on the same
products and reported.

The cache file (`<cache root>/calibration/linear-<key>.json`) is keyed by everything that changes which
kernel wins: CPU model and flags, torch version and build, intra-op threads, and the instruction caps
torch's libraries honour (`ATEN_CPU_CAPABILITY`, `MKL_ENABLE_INSTRUCTIONS`, `ONEDNN_MAX_CPU_ISA`,
`FBGEMM_ENABLE_INSTRUCTIONS`), and the sources of our compiled kernels (`native_int8.source_digest`). A
different key is a different file; an unreadable file is measured
again and replaced.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import platform
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch import Tensor

from cosyserve.engine.linear_kernels import NO_COPY_KERNELS, available_kernels, pack_linear
from cosyserve.engine.memory import trim_heap
from cosyserve.engine.native_int8 import source_digest

log = logging.getLogger(__name__)

FORMAT_VERSION = 1  # bump when the measurement changes: older files are then ignored
WORKING_SET_BYTES = 4 << 20  # per shape and kernel (at least one copy): ~0.4 GB streamed between repeats
ROUNDS = 15
# Above this share of the machine's CPU taken by other processes (or other VMs: steal time) during the
# measurement, other work was competing for the cores: the choices are used by this process but not
# cached, so the next start measures again. (This process's own share says nothing: fbgemm's one-row
# int8 and float16 products use one thread of two, 70 % of the threads' time on a quiet machine.)
MAX_OTHER_CPU_SHARE = 0.25
# Matrices smaller than this stay in cache even when decoding, where every layout runs at about the same
# speed: they keep the plain layout (`linear`, or `int8` for the fast preset) and are never measured.
MIN_CALIBRATED_BYTES = 1 << 20
# A copy is only worth making when it is clearly faster: within this margin the plain layout (no copy)
# wins for exact products, and the closer kernel (lower error) wins among the fast ones.
EXACT_MARGIN = 0.10
FAST_MARGIN = 0.10
# Fast kernels whose errors differ by less than this share are equally close (fbgemm's int8 product and
# the VNNI kernel compute the same quantisation): the faster of them wins.
SAME_ERROR_MARGIN = 0.25
CAP_VARIABLES = (
    "ATEN_CPU_CAPABILITY",
    "MKL_ENABLE_INSTRUCTIONS",
    "ONEDNN_MAX_CPU_ISA",
    "FBGEMM_ENABLE_INSTRUCTIONS",
    "MKL_DEBUG_CPU_TYPE",
)
CALIBRATION_DIR_ENV = "COSYSERVE_CALIBRATION_DIR"


@dataclass(frozen=True)
class KernelTiming:
    kernel: str
    seconds: float  # best round: one product, averaged over the instances
    gb_s: float  # bytes of the kernel's weight layout read per second
    relative_error: float  # ||y - y_float64|| / ||y_float64|| on one product


@dataclass(frozen=True)
class Request:
    """One shape to choose a kernel for (see `Calibration.choose_all`)."""

    out_features: int
    in_features: int
    bias: bool
    preset: str  # "exact" or "fast": how the winner is picked (`pick`)
    candidates: tuple[str, ...]
    default: str  # for matrices too small to measure


@dataclass(frozen=True)
class Choice:
    """The kernel for one shape and preset, and what it was chosen from."""

    shape: str  # "<out>x<in>" (+ "+bias")
    preset: str  # "exact" or "fast"
    kernel: str
    source: str  # "measured", "cached" or "default" (small matrices, nothing measured)
    timings: tuple[KernelTiming, ...] = ()

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


def shape_key(out_features: int, in_features: int, bias: bool) -> str:
    return f"{out_features}x{in_features}" + ("+bias" if bias else "")


def machine_key() -> dict[str, object]:
    """Everything the winner depends on besides the shape (the cache file's key)."""
    model, flags = _cpu_model_and_flags()
    return {
        "format": FORMAT_VERSION,
        "cpu": model,
        "cpu_flags_sha": hashlib.sha256(" ".join(sorted(flags)).encode()).hexdigest()[:16],
        "machine": platform.machine(),
        "torch": torch.__version__,
        "torch_capability": torch.backends.cpu.get_cpu_capability(),
        "threads": torch.get_num_threads(),
        "caps": {name: os.environ.get(name, "") for name in CAP_VARIABLES},
        "native_kernels": source_digest(),  # our compiled kernels: a changed source is measured again
    }


def default_calibration_dir(environ: Mapping[str, str] | None = None) -> Path:
    """`$COSYSERVE_CALIBRATION_DIR`, else `calibration/` beside the default models root (under
    `$COSYSERVE_HOME`, `$XDG_CACHE_HOME/cosyserve` or `~/.cache/cosyserve`)."""
    from cosyserve.modeldir.download import default_models_root

    env = os.environ if environ is None else environ
    if env.get(CALIBRATION_DIR_ENV):
        return Path(env[CALIBRATION_DIR_ENV]).expanduser()
    return default_models_root(env).parent / "calibration"


class Calibration:
    """Kernel choices for this machine, read from and written to one cache file (None: memory only).

    Thread-safe; `choose` measures a shape at most once per key and process.
    """

    def __init__(self, directory: Path | None, *, rounds: int = ROUNDS, working_set: int = WORKING_SET_BYTES):
        self.key = machine_key()
        digest = hashlib.sha256(json.dumps(self.key, sort_keys=True).encode()).hexdigest()[:20]
        self.path = None if directory is None else directory / f"linear-{digest}.json"
        self.rounds, self.working_set = rounds, working_set
        self._lock = threading.Lock()
        self._choices: dict[str, dict[str, object]] = self._read()
        self.measured_seconds = 0.0  # time spent measuring in this process (for start-up reports)
        self.unsaved: set[str] = set()  # entries measured on a busy machine: used, never cached

    def choose(
        self,
        out_features: int,
        in_features: int,
        bias: bool,
        preset: str,
        candidates: tuple[str, ...],
        default: str,
    ) -> Choice:
        """The kernel for one shape: see `choose_all`."""
        return self.choose_all([Request(out_features, in_features, bias, preset, candidates, default)])[0]

    def choose_all(self, requests: Sequence[Request]) -> list[Choice]:
        """The kernel among each request's candidates: its default for a matrix under
        `MIN_CALIBRATED_BYTES` or a single candidate, else the cached winner, else measured (every
        uncached shape together, see the module docstring) and cached."""
        choices: list[Choice | None] = []
        to_measure: dict[str, tuple[Request, tuple[str, ...]]] = {}
        with self._lock:
            for request in requests:
                shape = shape_key(request.out_features, request.in_features, request.bias)
                candidates = available_kernels(request.candidates)
                small = request.out_features * request.in_features * 4 < MIN_CALIBRATED_BYTES
                if small or len(candidates) < 2:
                    kernel = request.default if request.default in candidates else candidates[0]
                    choices.append(Choice(shape, request.preset, kernel, "default"))
                    continue
                entry = f"{request.preset}:{shape}:{','.join(candidates)}"
                cached = self._choices.get(entry)
                if cached is None:
                    to_measure[entry] = (request, candidates)
                    choices.append(None)
                    continue
                timings = tuple(KernelTiming(**t) for t in cached["timings"])  # type: ignore[union-attr]
                choices.append(Choice(shape, request.preset, str(cached["kernel"]), "cached", timings))
            if to_measure:
                self._measure(to_measure)
        return [
            choice if choice is not None else self._measured(request)
            for choice, request in zip(choices, requests, strict=True)
        ]

    def _measure(self, pending: dict[str, tuple[Request, tuple[str, ...]]]) -> None:
        started, counters = time.perf_counter(), cpu_counters()
        specs = [(r.out_features, r.in_features, r.bias, kernels) for r, kernels in pending.values()]
        results = measure_shapes(specs, self.rounds, self.working_set)
        trim_heap()  # the measurement's copies are freed: give their memory back before weights load
        wall = time.perf_counter() - started
        self.measured_seconds += wall
        others = other_cpu_share(counters, cpu_counters(), wall)
        for (entry, (request, _)), timings in zip(pending.items(), results, strict=True):
            kernel = pick(timings, request.preset)
            self._choices[entry] = {"kernel": kernel, "timings": [asdict(t) for t in timings]}
            log.info("calibration: %s -> %s (%s)", entry, kernel, _describe(timings))
        if others is not None and others > MAX_OTHER_CPU_SHARE:
            log.warning(
                "calibration: other work held the CPU (other processes took %.0f%% of the machine's CPU "
                "time): the layouts chosen now are not cached and will be measured again at the next start",
                100 * others,
            )
            self.unsaved.update(pending)
            return
        self._write()

    def _measured(self, request: Request) -> Choice:
        shape = shape_key(request.out_features, request.in_features, request.bias)
        entry = f"{request.preset}:{shape}:{','.join(available_kernels(request.candidates))}"
        cached = self._choices[entry]
        timings = tuple(KernelTiming(**t) for t in cached["timings"])  # type: ignore[union-attr]
        return Choice(shape, request.preset, str(cached["kernel"]), "measured", timings)

    def _read(self) -> dict[str, dict[str, object]]:
        if self.path is None or not self.path.is_file():
            return {}
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
            if data.get("key") != json.loads(json.dumps(self.key)):
                return {}
            return dict(data["choices"])
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            log.warning("calibration: %s is unreadable; measuring again", self.path)
            return {}

    def _write(self) -> None:
        if self.path is None:
            return
        saved = {entry: choice for entry, choice in self._choices.items() if entry not in self.unsaved}
        payload = json.dumps({"key": self.key, "choices": saved}, indent=1, sort_keys=True)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with tempfile.NamedTemporaryFile(
                "w", dir=self.path.parent, prefix=".linear-", suffix=".tmp", delete=False, encoding="utf-8"
            ) as tmp:
                tmp.write(payload)
            os.replace(tmp.name, self.path)  # atomic: a reader sees the old file or the new one
        except OSError as exc:
            log.warning(
                "calibration: cannot write %s (%s); measuring again at the next start", self.path, exc
            )


def cpu_counters(stat: Path = Path("/proc/stat")) -> tuple[float, float] | None:
    """(CPU seconds the whole machine has been busy, steal included; CPU seconds of this process),
    or None where `stat` cannot be read (off Linux)."""
    try:
        fields = stat.read_text(encoding="ascii").split("\n", 1)[0].split()[1:9]
        user, nice, system, _idle, _iowait, irq, softirq, steal = (int(v) for v in fields)
    except (OSError, ValueError):
        return None
    busy = (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")
    return busy, time.process_time()


def other_cpu_share(
    before: tuple[float, float] | None, after: tuple[float, float] | None, wall: float
) -> float | None:
    """The share of the machine's CPU that other processes took between two `cpu_counters` readings
    `wall` seconds apart: 0 is undisturbed, 1 every core busy with other work; None when unknown."""
    if before is None or after is None or wall <= 0:
        return None
    others = (after[0] - before[0]) - (after[1] - before[1])
    return max(0.0, others) / (wall * (os.cpu_count() or 1))


def pick(timings: tuple[KernelTiming, ...], preset: str) -> str:
    """The winner: the fastest, unless a preferred kernel is within the margin of it. Exact: the
    fastest of the kernels that use the stored layout as it is (`NO_COPY_KERNELS`); fast: the one
    with the lowest error (the fastest of those with about that error)."""
    fastest = min(timings, key=lambda t: t.seconds)
    if preset == "exact":
        plain = [t for t in timings if t.kernel in NO_COPY_KERNELS]
        best_plain = min(plain, key=lambda t: t.seconds, default=None)
        if best_plain is not None and best_plain.seconds <= fastest.seconds * (1 + EXACT_MARGIN):
            return best_plain.kernel
        return fastest.kernel
    close_enough = [t for t in timings if t.seconds <= fastest.seconds * (1 + FAST_MARGIN)]
    closest = min(t.relative_error for t in close_enough)
    equally_close = [t for t in close_enough if t.relative_error <= closest * (1 + SAME_ERROR_MARGIN)]
    return min(equally_close, key=lambda t: t.seconds).kernel


@torch.inference_mode()
def measure_shapes(
    specs: Sequence[tuple[int, int, bool, tuple[str, ...]]],
    rounds: int = ROUNDS,
    working_set: int = WORKING_SET_BYTES,
) -> list[tuple[KernelTiming, ...]]:
    """Time one-row products `(1, in)` x `(out, in)` for each `(out, in, bias, kernels)` of `specs`
    with each of its kernels, all interleaved (see the module docstring)."""
    pairs = []
    for out_features, in_features, bias, kernels in specs:
        source = _Source.random(out_features, in_features, bias)
        pairs += [_Pair.build(source, kernel, working_set) for kernel in kernels]
    for _ in range(rounds + 1):  # the first round warms up (allocations, kernel selection)
        for pair in pairs:
            pair.time_once()
    results, index = [], 0
    for *_, kernels in specs:
        results.append(tuple(pairs[index + i].timing() for i in range(len(kernels))))
        index += len(kernels)
    return results


def measure_shape(
    out_features: int,
    in_features: int,
    bias: bool,
    kernels: tuple[str, ...],
    rounds: int = ROUNDS,
    working_set: int = WORKING_SET_BYTES,
) -> tuple[KernelTiming, ...]:
    """`measure_shapes` for one shape."""
    return measure_shapes([(out_features, in_features, bias, kernels)], rounds, working_set)[0]


@dataclass(frozen=True)
class _Source:
    """A random weight `(out, in)`, bias and input `(1, in)`, with the float64 product as reference."""

    weight: Tensor
    bias: Tensor | None
    x: Tensor
    reference: Tensor

    @classmethod
    def random(cls, out_features: int, in_features: int, bias: bool) -> _Source:
        generator = torch.Generator().manual_seed(out_features * 7919 + in_features)
        weight = torch.randn(out_features, in_features, generator=generator) / math.sqrt(in_features)
        bias_values = torch.randn(out_features, generator=generator) * 0.02 if bias else None
        x = torch.randn(1, in_features, generator=generator)
        reference = torch.nn.functional.linear(
            x.double(), weight.double(), None if bias_values is None else bias_values.double()
        )
        return cls(weight, bias_values, x, reference)


@dataclass
class _Pair:
    """One kernel's copies of one shape's random weight, and its best time so far."""

    kernel: str
    forwards: list[Callable[[Tensor], Tensor]]
    x: Tensor  # (1, in)
    nbytes: int  # of one copy in the kernel's layout
    relative_error: float
    best: float = math.inf

    @classmethod
    def build(cls, source: _Source, kernel: str, working_set: int) -> _Pair:
        copies = max(1, math.ceil(working_set / source.weight.nbytes))
        # Copies of their own (a kernel may read its source in place: `linear` does).
        forwards = [pack_linear(source.weight.clone(), source.bias, kernel) for _ in range(copies)]
        output = forwards[0](source.x).double()
        error = float((output - source.reference).norm() / source.reference.norm())
        return cls(kernel, forwards, source.x, forwards[0].weight_nbytes, error)  # type: ignore[attr-defined]

    def time_once(self) -> None:
        started = time.perf_counter()
        for forward in self.forwards:
            forward(self.x)
        self.best = min(self.best, (time.perf_counter() - started) / len(self.forwards))

    def timing(self) -> KernelTiming:
        return KernelTiming(self.kernel, self.best, self.nbytes / self.best / 1e9, self.relative_error)


def _describe(timings: tuple[KernelTiming, ...]) -> str:
    return ", ".join(f"{t.kernel} {t.seconds * 1e6:.0f} us {t.gb_s:.1f} GB/s" for t in timings)


def cpu_flags() -> list[str]:
    """Every flag this CPU reports (Linux; empty elsewhere)."""
    return _cpu_model_and_flags()[1]


def _cpu_model_and_flags() -> tuple[str, list[str]]:
    """The CPU's model name and every flag it reports (Linux; the platform's processor elsewhere)."""
    model, flags = "", []
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as info:
            for line in info:
                key, _, value = line.partition(":")
                if key.strip() == "model name" and not model:
                    model = value.strip()
                elif key.strip() == "flags" and not flags:
                    flags = value.split()
    except OSError:
        pass
    return model or platform.processor() or platform.machine(), flags
