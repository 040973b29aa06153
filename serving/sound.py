"""A video's sound in its answer: the MP4's AAC track, or the sound alone as a WAV file (`Accept: audio/wav`).

The waveform a pipeline makes (LTX-2's vocoder: `engine.result_parts.Soundtrack`) is a little shorter than its
frames (16,568 samples for 17 frames at 24 fps, where the clip lasts 17,000): it is written padded with silence to
the clip's length, so the sound and the video start together at 0 and end together. The MP4's track is AAC
(FFmpeg's native encoder, bundled in PyAV's wheels: no ffmpeg binary), at the waveform's own rate and channels; the
WAV is 16-bit PCM (the stdlib `wave`). The same samples give the same bytes, so every door's answer is the same
file.
"""

from __future__ import annotations

import io
import wave
from typing import Any, Final

import numpy as np

from engine.requests import Soundtrack

__all__ = ["WAV", "clip_samples", "sound_stream", "wav_file", "write_sound"]

WAV: Final = "audio/wav"
_LAYOUTS = {1: "mono", 2: "stereo"}


def clip_samples(sound: Soundtrack, frames: int, fps: float) -> np.ndarray:
    """The waveform as float32 (channels x samples) in [-1, 1], padded with silence (or cut) to `frames` at `fps`:
    the clip's length at the sound's rate."""
    length = round(frames * sound.rate / fps)
    samples = np.clip(np.asarray(sound.samples, dtype=np.float32), -1.0, 1.0)
    if samples.ndim == 1:
        samples = samples[None, :]
    padded = np.zeros((samples.shape[0], length), dtype=np.float32)
    kept = min(length, samples.shape[1])
    padded[:, :kept] = samples[:, :kept]
    return padded


def sound_stream(container: Any, sound: Soundtrack) -> Any:
    """The AAC stream of the sound in an open PyAV MP4 `container` (added before anything is muxed)."""
    channels = 1 if np.ndim(sound.samples) == 1 else int(np.shape(sound.samples)[0])
    layout = _LAYOUTS.get(channels)
    if layout is None:
        raise ValueError(f"a sound of {channels} channels cannot be written; accepted: 1 or 2 channels")
    stream = container.add_stream("aac", rate=sound.rate)
    stream.layout = layout
    return stream


def write_sound(container: Any, stream: Any, sound: Soundtrack, frames: int, fps: float) -> None:
    """Mux the sound into `stream` from time 0, the clip's length (`clip_samples`)."""
    import av

    samples = clip_samples(sound, frames, fps)
    frame = av.AudioFrame.from_ndarray(np.ascontiguousarray(samples), format="fltp", layout=stream.layout.name)
    frame.sample_rate, frame.pts = sound.rate, 0
    container.mux(stream.encode(frame))
    container.mux(stream.encode(None))


def wav_file(sound: Soundtrack, frames: int, fps: float) -> bytes:
    """The sound alone: a 16-bit PCM WAV of the clip's length (`clip_samples`)."""
    samples = clip_samples(sound, frames, fps)
    pcm = np.round(samples.T * 32767.0).astype("<i2")
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as out:
        out.setnchannels(samples.shape[0])
        out.setsampwidth(2)
        out.setframerate(sound.rate)
        out.writeframes(pcm.tobytes())
    return buffer.getvalue()
