"""HiFT vocoder of CosyVoice3 (`CausalHiFTGenerator`): 80-bin mel at 50 Hz → 24 kHz waveform.

Pipeline: F0 predictor (float64) → harmonic source (sines at F0 and its overtones plus fixed noise,
merged to one channel) → decoder: mel conv → 3 upsampling stages, each fused with a downsampled STFT
of the source and smoothed by Snake residual blocks → conv to log-magnitude and phase → inverse STFT.

Everything is causal except two look-aheads: the F0 predictor's first conv (3 frames) and `conv_pre`
(`conv_pre_look_right` frames). With finalize=False those frames are context only and the output
stops where it would still change when more mel arrives, so a streaming caller can vocode the
growing mel again and keep only the new samples (see `HiFTVocoder.inference`), or get the same
samples from the new frames alone (`hift_stream.vocode_increment`).

The official source module draws random phases and noise; here the noise is a fixed, seeded buffer
(`SourceNoise`), so the same mel always gives the same audio, and a caller may inject the official
buffers to reproduce its output exactly.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from cosyserve.errors import ConfigError, InputError
from cosyserve.model.checkpoint import fold_weight_norm, load_into
from cosyserve.model.config import HiFTConfig
from cosyserve.model.f0_predictor import CausalConv1d, CausalF0Predictor, LookAheadConv1d, conv_in_input_dtype

NOISE_BLOCK_SAMPLES = 240_000  # fixed noise is generated in 10 s blocks, each from its own seed
SNAKE_EPS = 1e-9  # keeps 1/alpha finite for a zero alpha
DECODER_OUT_SLOPE = 0.01  # the leaky ReLU before conv_post uses torch's default slope, not lrelu_slope
MAGNITUDE_MAX = 1e2


class Snake(nn.Module):
    """x + sin²(αx)/α with a learned α per channel. (B, C, T) → (B, C, T)"""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.alpha = nn.Parameter(torch.ones(channels))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        alpha = self.alpha[None, :, None]
        return x + (1.0 / (alpha + SNAKE_EPS)) * torch.sin(x * alpha).pow(2)


class SnakeResBlock(nn.Module):
    """Three (Snake → dilated causal conv → Snake → causal conv) residual steps. (B, C, T) → (B, C, T)"""

    def __init__(self, channels: int, kernel_size: int, dilations: tuple[int, ...]) -> None:
        super().__init__()
        self.convs1 = nn.ModuleList(CausalConv1d(channels, channels, kernel_size, d) for d in dilations)
        self.convs2 = nn.ModuleList(CausalConv1d(channels, channels, kernel_size) for _ in dilations)
        self.activations1 = nn.ModuleList(Snake(channels) for _ in dilations)
        self.activations2 = nn.ModuleList(Snake(channels) for _ in dilations)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for conv1, conv2, act1, act2 in zip(
            self.convs1, self.convs2, self.activations1, self.activations2, strict=True
        ):
            x = x + conv2(act2(conv1(act1(x))))
        return x


class CausalUpsampleConv1d(nn.Conv1d):
    """Repeat each step `rate` times, then a causal conv. (B, C_in, T) → (B, C_out, T * rate)"""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, rate: int) -> None:
        super().__init__(in_channels, out_channels, kernel_size)
        self.rate = rate

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.repeat_interleave(self.rate, dim=-1)
        return conv_in_input_dtype(self, F.pad(x, (self.kernel_size[0] - 1, 0)))


class CausalDownsampleConv1d(nn.Conv1d):
    """Strided conv padded with `stride - 1` zeros on the left. (B, C_in, T) → (B, C_out, ⌊(T-1)/stride⌋+1)"""

    def __init__(self, in_channels: int, out_channels: int, stride: int) -> None:
        # stride 1 is a pointwise projection; larger strides see two strides of input
        super().__init__(in_channels, out_channels, 1 if stride == 1 else 2 * stride, stride=stride)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return conv_in_input_dtype(self, F.pad(x, (self.stride[0] - 1, 0)))


@dataclass(frozen=True)
class SourceNoise:
    """The source module's noise, indexed by output sample from the start of the utterance.

    Only `sine_noise` reaches the waveform. `rand_ini` (initial harmonic phases, in cycles) is added
    to the first sample before the phase is resampled to frame rate, a resampling that never reads
    that sample; `uv_noise` feeds a noise branch whose output the vocoder discards. Both are kept so
    the official buffers can be injected as they are.
    """

    rand_ini: torch.Tensor  # (1, nb_harmonics + 1), uniform [0, 1), first column 0
    sine_noise: torch.Tensor  # (S, nb_harmonics + 1), uniform [0, 1) (not Gaussian, as in the official code)
    uv_noise: torch.Tensor  # (S, 1), uniform [0, 1)

    @property
    def num_samples(self) -> int:
        return int(self.sine_noise.shape[0])

    def to(self, device: torch.device) -> SourceNoise:
        return SourceNoise(self.rand_ini.to(device), self.sine_noise.to(device), self.uv_noise.to(device))


def make_source_noise(nb_harmonics: int, num_samples: int, seed: int = 0) -> SourceNoise:
    """Deterministic noise for `num_samples` samples, on the CPU in float32.

    Generated in blocks with one seed each, so a longer buffer starts with the shorter one: the noise
    for sample n never depends on how long a buffer was asked for.
    """
    width = nb_harmonics + 1
    rand_ini = torch.rand(1, width, generator=torch.Generator().manual_seed(seed * 1_000_003))
    rand_ini[:, 0] = 0.0  # the fundamental starts at phase 0
    sine_blocks, uv_blocks = [], []
    for block in range(math.ceil(num_samples / NOISE_BLOCK_SAMPLES)):
        generator = torch.Generator().manual_seed(seed * 1_000_003 + block + 1)
        sine_blocks.append(torch.rand(NOISE_BLOCK_SAMPLES, width, generator=generator))
        uv_blocks.append(torch.rand(NOISE_BLOCK_SAMPLES, 1, generator=generator))
    if not sine_blocks:
        return SourceNoise(rand_ini, torch.zeros(0, width), torch.zeros(0, 1))
    return SourceNoise(rand_ini, torch.cat(sine_blocks)[:num_samples], torch.cat(uv_blocks)[:num_samples])


class HarmonicSource(nn.Module):
    """`m_source`: F0 per frame → one-channel excitation per sample.

    Follows the official causal sine generator: the phase advances once per mel frame and is held for
    the frame's samples, harmonics k = 1..nb_harmonics+1 of F0, unvoiced frames (F0 <= threshold) get
    noise only; a linear layer + tanh merges the harmonics.
    """

    def __init__(self, config: HiFTConfig) -> None:
        super().__init__()
        self.l_linear = nn.Linear(config.nb_harmonics + 1, 1)
        self.nb_harmonics = config.nb_harmonics
        self.sampling_rate = config.sampling_rate
        self.hop_length = config.hop_length
        self.sine_amp = config.nsf_alpha
        self.noise_std = config.nsf_sigma
        self.voiced_threshold = config.nsf_voiced_threshold

    def forward(self, f0: torch.Tensor, sine_noise: torch.Tensor) -> torch.Tensor:
        """f0 (B, T) in Hz, sine_noise (>= T * hop, nb_harmonics + 1) → source (B, 1, T * hop)."""
        return self.excite(f0, sine_noise)[0]

    def excite(
        self, f0: torch.Tensor, sine_noise: torch.Tensor, cycles_before: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """`forward` that can continue an earlier window of the same utterance.

        cycles_before: (B, nb_harmonics + 1) float64, the running total the previous window returned
        (None at the start of the utterance); sine_noise must then start at this window's first sample.
        Returns the source (B, 1, T * hop) and the running total after this window.
        """
        # The phase accumulates over the whole utterance: at least float32, even for a half-precision mel.
        dtype = torch.promote_types(f0.dtype, torch.float32)
        f0 = f0.to(dtype)
        harmonics = torch.arange(1, self.nb_harmonics + 2, device=f0.device, dtype=torch.float32)
        cycles_per_sample = torch.remainder(f0[:, :, None] * harmonics / self.sampling_rate, 1.0)
        # The running sum is float64 rounded once per frame: what torch's CPU cumsum does inside for
        # float32, so this matches the official bits, and a carried total continues it exactly. (The
        # phase grows with the utterance; one ulp of it soon changes the waveform.)
        totals = cycles_per_sample.double()
        if cycles_before is not None:
            totals = torch.cat((cycles_before[:, None].to(totals), totals), dim=1)
        totals = torch.cumsum(totals, dim=1)
        cycles_after = totals[:, -1] if totals.shape[1] else torch.zeros_like(totals[:, 0])
        if cycles_before is not None:
            totals = totals[:, 1:]
        # Radians at each frame start, in the official operation order (rounding matters at long lengths).
        phase = totals.to(dtype) * 2 * math.pi * self.hop_length
        sines = torch.sin(phase) * self.sine_amp  # (B, T, H+1)
        voiced = (f0 > self.voiced_threshold).to(dtype)[:, :, None]  # (B, T, 1)
        sines = sines.repeat_interleave(self.hop_length, dim=1)  # (B, S, H+1)
        voiced = voiced.repeat_interleave(self.hop_length, dim=1)
        noise_amp = voiced * self.noise_std + (1 - voiced) * self.sine_amp / 3
        noise = noise_amp * sine_noise[: sines.shape[1]].to(dtype)
        excitation = (sines * voiced + noise).to(self.l_linear.weight.dtype)
        return torch.tanh(self.l_linear(excitation)).transpose(1, 2), cycles_after


class HiFTVocoder(nn.Module):
    """`CausalHiFTGenerator` for inference; parameter names match `hift.pt` after weight-norm folding."""

    def __init__(self, config: HiFTConfig, noise_seed: int = 0) -> None:
        super().__init__()
        _check_config(config)
        self.config = config
        base, n_fft = config.base_channels, config.istft_n_fft
        self.f0_predictor = CausalF0Predictor(config.f0_predictor)
        self.m_source = HarmonicSource(config)
        self.conv_pre = LookAheadConv1d(config.in_channels, base, config.conv_pre_look_right + 1)
        channels = [base // 2 ** (i + 1) for i in range(len(config.upsample_rates))]
        self.ups = nn.ModuleList(
            CausalUpsampleConv1d(base // 2**i, channels[i], kernel, rate)
            for i, (rate, kernel) in enumerate(
                zip(config.upsample_rates, config.upsample_kernel_sizes, strict=True)
            )
        )
        # Stage i fuses the source STFT brought down to that stage's rate.
        strides = [math.prod(config.upsample_rates[i + 1 :]) for i in range(len(config.upsample_rates))]
        self.source_downs = nn.ModuleList(
            CausalDownsampleConv1d(n_fft + 2, ch, stride)
            for ch, stride in zip(channels, strides, strict=True)
        )
        self.source_resblocks = nn.ModuleList(
            SnakeResBlock(ch, kernel, dilations)
            for ch, kernel, dilations in zip(
                channels,
                config.source_resblock_kernel_sizes,
                config.source_resblock_dilation_sizes,
                strict=True,
            )
        )
        self.resblocks = nn.ModuleList(
            SnakeResBlock(ch, kernel, dilations)
            for ch in channels
            for kernel, dilations in zip(
                config.resblock_kernel_sizes, config.resblock_dilation_sizes, strict=True
            )
        )
        self.conv_post = CausalConv1d(channels[-1], n_fft + 2, 7)
        # Periodic Hann computed in float64 then rounded, like the official scipy window.
        window = torch.hann_window(n_fft, periodic=True, dtype=torch.float64).to(torch.float32)
        self.register_buffer("stft_window", window, persistent=False)
        self.noise_seed = noise_seed
        self._noise_by_device: dict[str, SourceNoise] = {}  # fixed noise, grown on demand; same for all calls

    @classmethod
    def from_state_dict(
        cls, config: HiFTConfig, state: Mapping[str, torch.Tensor], checkpoint_name: str = "hift.pt"
    ) -> HiFTVocoder:
        """Build the vocoder and load `state` (either weight-norm layout, optional `generator.` prefix)."""
        state = {key.removeprefix("generator."): value for key, value in state.items()}
        vocoder = cls(config)
        load_into(vocoder, fold_weight_norm(state), checkpoint_name)
        return vocoder.eval()

    @property
    def hop_length(self) -> int:
        """Output samples per mel frame (480)."""
        return self.config.hop_length

    @property
    def look_ahead_frames(self) -> int:
        """Mel frames at the end that finalize=False uses as context only (8 for CosyVoice3).

        F0 look-ahead + conv_pre look-ahead + one frame whose samples the inverse STFT's overlap-add
        would still change.
        """
        return self.f0_predictor.look_ahead + self.config.conv_pre_look_right + 1

    def num_output_samples(self, num_frames: int, finalize: bool) -> int:
        """Waveform length for `num_frames` mel frames."""
        return max(num_frames - (0 if finalize else self.look_ahead_frames), 0) * self.hop_length

    def fixed_noise(self, num_samples: int, device: torch.device) -> SourceNoise:
        """This vocoder's deterministic noise, at least `num_samples` long, on `device`."""
        key = str(device)
        noise = self._noise_by_device.get(key)
        if noise is None or noise.num_samples < num_samples:
            have = 0 if noise is None else noise.num_samples
            # Grow geometrically in whole blocks so a long stream does not regenerate on every call.
            blocks = math.ceil(max(num_samples, 2 * have) / NOISE_BLOCK_SAMPLES)
            noise = make_source_noise(self.config.nb_harmonics, blocks * NOISE_BLOCK_SAMPLES, self.noise_seed)
            noise = noise.to(device)
            # One assignment: a concurrent caller sees the old or the new buffer, and both are valid.
            self._noise_by_device[key] = noise
        return noise

    @torch.inference_mode()
    def predict_f0(self, mel: torch.Tensor, finalize: bool = True) -> torch.Tensor:
        """mel (B, 80, T) → F0 (B, T) in Hz, in mel's dtype; (B, T - 3) when finalize is False."""
        return self.f0_predictor(mel, finalize).to(mel.dtype)

    @torch.inference_mode()
    def make_source(self, f0: torch.Tensor, noise: SourceNoise | None = None) -> torch.Tensor:
        """F0 (B, T) → excitation (B, 1, T * hop). `noise` defaults to `fixed_noise`."""
        num_samples = f0.shape[1] * self.hop_length
        if noise is None:
            noise = self.fixed_noise(num_samples, f0.device)
        elif noise.num_samples < num_samples or noise.sine_noise.shape[1] != self.config.nb_harmonics + 1:
            raise InputError(
                f"injected source noise has shape {tuple(noise.sine_noise.shape)}; this vocoder needs at "
                f"least ({num_samples}, {self.config.nb_harmonics + 1}) for {f0.shape[1]} frames"
            )
        return self.m_source(f0, noise.sine_noise.to(f0.device))

    def _stft(self, signal: torch.Tensor) -> torch.Tensor:
        """(B, S) → real and imaginary parts stacked on channels, (B, n_fft + 2, S / istft_hop + 1)."""
        n_fft, hop = self.config.istft_n_fft, self.config.istft_hop_len
        window = self.stft_window.to(signal.device, torch.float32)
        spec = torch.stft(signal.float(), n_fft, hop, n_fft, window=window, return_complex=True)
        return torch.cat([spec.real, spec.imag], dim=1)

    def _istft(self, log_magnitude: torch.Tensor, phase_in: torch.Tensor) -> torch.Tensor:
        """(B, n_fft/2 + 1, F) twice → (B, (F - 1) * istft_hop)."""
        n_fft, hop = self.config.istft_n_fft, self.config.istft_hop_len
        magnitude = torch.exp(log_magnitude.float()).clamp(max=MAGNITUDE_MAX)
        phase = torch.sin(phase_in.float())  # the network's phase output goes through sin, as trained
        spec = torch.complex(magnitude * torch.cos(phase), magnitude * torch.sin(phase))
        window = self.stft_window.to(spec.device, torch.float32)
        return torch.istft(spec, n_fft, hop, n_fft, window=window)

    @torch.inference_mode()
    def decode(self, mel: torch.Tensor, source: torch.Tensor, finalize: bool = True) -> torch.Tensor:
        """mel (B, 80, T) + source (B, 1, T * hop) → wav (B, T * hop), float32.

        finalize=False: the last `conv_pre_look_right` frames are context only and one more frame of
        samples is dropped, giving (B, (T - conv_pre_look_right - 1) * hop).
        """
        config = self.config
        source_spec = self._stft(source[:, 0]).to(mel.dtype)
        x = self.conv_pre(mel, finalize)
        if not finalize:
            source_spec = source_spec[:, :, : -math.prod(config.upsample_rates) * config.conv_pre_look_right]
        num_kernels = len(config.resblock_kernel_sizes)
        for stage, (up, down, source_block) in enumerate(
            zip(self.ups, self.source_downs, self.source_resblocks, strict=True)
        ):
            x = up(F.leaky_relu(x, config.lrelu_slope))
            if stage == len(self.ups) - 1:
                x = F.pad(x, (1, 0), mode="reflect")  # one more step to match the STFT's frame count
            x = x + source_block(down(source_spec))
            blocks = self.resblocks[stage * num_kernels : (stage + 1) * num_kernels]
            x = sum(block(x) for block in blocks) / num_kernels
        x = self.conv_post(F.leaky_relu(x, DECODER_OUT_SLOPE))
        bins = config.istft_n_fft // 2 + 1
        wav = self._istft(x[:, :bins], x[:, bins:])
        if not finalize:
            wav = wav[:, : -self.hop_length]
        return wav.clamp(-config.audio_limit, config.audio_limit)

    @torch.inference_mode()
    def inference(
        self, mel: torch.Tensor, finalize: bool = True, noise: SourceNoise | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """mel (B, 80, T) → (wav (B, S) float32, source (B, 1, S')).

        finalize=True: S = T * hop, the whole utterance. finalize=False: the last `look_ahead_frames`
        frames are context only, S = (T - 8) * hop, and these samples equal the first S samples of any
        later call on a longer mel that starts with the same T frames (the streaming contract). The
        source covers the frames the F0 predictor emitted (T or T - 3).
        """
        self._check_mel(mel, finalize)
        f0 = self.predict_f0(mel, finalize)
        source = self.make_source(f0, noise)
        decoder_mel = mel if finalize else mel[:, :, : -self.f0_predictor.look_ahead]
        return self.decode(decoder_mel, source, finalize), source

    def _check_mel(self, mel: torch.Tensor, finalize: bool) -> None:
        if mel.dim() != 3 or mel.shape[1] != self.config.in_channels:
            raise InputError(
                f"the vocoder takes a mel of shape (batch, {self.config.in_channels}, frames), "
                f"got {tuple(mel.shape)}"
            )
        min_frames = 1 if finalize else self.look_ahead_frames
        if mel.shape[2] < min_frames:
            raise InputError(
                f"the vocoder needs at least {min_frames} mel frames with finalize={finalize}, "
                f"got {mel.shape[2]}; wait for more frames or finalize"
            )


def _check_config(config: HiFTConfig) -> None:
    """Per-stage lists must line up; the official code would silently drop the extra entries."""
    stages = len(config.upsample_rates)
    per_stage = {
        "upsample_kernel_sizes": len(config.upsample_kernel_sizes),
        "source_resblock_kernel_sizes": len(config.source_resblock_kernel_sizes),
        "source_resblock_dilation_sizes": len(config.source_resblock_dilation_sizes),
    }
    wrong = [f"{name} has {n}" for name, n in per_stage.items() if n != stages]
    if len(config.resblock_kernel_sizes) != len(config.resblock_dilation_sizes):
        wrong.append("resblock_kernel_sizes and resblock_dilation_sizes differ in length")
    if config.base_channels % 2**stages:
        wrong.append(f"base_channels {config.base_channels} is not divisible by 2**{stages}")
    if wrong:
        raise ConfigError(
            f"hift section of cosyvoice3.yaml: upsample_rates has {stages} stages but {'; '.join(wrong)}; "
            "use the YAML that came with the model"
        )
