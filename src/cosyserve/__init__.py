"""cosyserve: a self-hosted voice-cloning TTS service and inference engine for CosyVoice3 checkpoints."""

__version__ = "0.1.0"
