"""The VAE handle: spec + built model + dtype/device. encode()/decode() check their input, then
route through the tiling engine (a single tile when no tiling is asked for or needed)."""
from __future__ import annotations

from typing import Any, Optional, Union

import torch

from . import latents, tiling
from .errors import InputError
from .spec import ArchSpec, Capabilities

DeviceLike = Union[str, torch.device, None]
Tile = Union[int, tuple[int, int], None]

_CHANNEL_HINTS = {4: "SD1.x/SD2.x/SDXL", 12: "Mochi", 16: "SD3/Flux.1 (or a 16-channel video model)",
                  32: "Flux.2 (unpacked)", 128: "Flux.2 or LTX-Video"}


def check_divisible(h: int, w: int, r: int, what: str, input: str = "pixels") -> None:
    """Images must tile the latent grid exactly: one rule and one message for every engine."""
    if h % r or w % r:
        raise InputError(f"the image is {w}x{h} pixels; {what} needs width and height divisible by {r}.", input=input,
                         fix=f"crop or resize to {w // r * r}x{h // r * r} (e.g. core 'ImageCrop' or 'Upscale Image') first.")


class VAE:
    def __init__(self, spec: ArchSpec, config: Any, model: torch.nn.Module, dtype: Optional[torch.dtype] = None,
                 device: DeviceLike = None, source: str = ""):
        self.spec, self.config, self.model, self.source = spec, config, model, source
        self.caps: Capabilities = spec.capabilities(config)
        self.to(device or "cpu", dtype or torch.float32)

    # device and dtype are read from the weights: a memory manager (ComfyUI's) may move them.
    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        return next(self.model.parameters()).dtype

    # ---- description ---------------------------------------------------------------------------
    @property
    def name(self) -> str:
        return self.spec.describe(self.config) or self.spec.name

    def __repr__(self) -> str:
        return f"VAE({self.name}, {self.dtype}, {self.device}, from {self.source})"

    def to(self, device: DeviceLike = None, dtype: Optional[torch.dtype] = None) -> "VAE":
        # channels_last: oneDNN and cuDNN convolutions run natively in it; in NCHW, CPU convs convert
        # every activation back and forth (measured: 8% of an SD decode's time, 27% of its memory).
        device = torch.device(device) if device is not None else self.device
        self.model.to(device, dtype or self.dtype, memory_format=torch.channels_last)
        return self

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The weights in the canonical layout, contiguous (they run channels_last; safetensors and
        other savers refuse strided tensors)."""
        return {k: v.contiguous() for k, v in self.model.state_dict().items()}

    def _model_input(self, t: torch.Tensor) -> torch.Tensor:
        return t.to(self.device, self.dtype).contiguous(memory_format=torch.channels_last)

    # ---- checks --------------------------------------------------------------------------------
    def check_latent(self, z: torch.Tensor, input: str = "samples") -> torch.Tensor:
        """Validate a LATENT tensor and return it on the model's own latent grid (unpacked)."""
        caps = self.caps
        if not caps.can_decode:
            raise InputError("this VAE has no decoder (only an encoder file was loaded).", input="vae",
                             fix="load the matching *_decoder file too, or the pair by its stem name.")
        if z.dim() == 5 and z.shape[2] == 1:
            z = z[:, :, 0]
        if z.dim() != 4:
            raise InputError(f"expected an image latent [B, C, h, w] for {self.name}, got shape {tuple(z.shape)}.",
                             input=input, fix="decode video latents with a video VAE.")
        c = z.shape[1]
        accepted = {caps.latent_channels_packed, caps.latent_channels}
        if c not in accepted:
            src = _CHANNEL_HINTS.get(c, f"a {c}-channel model")
            raise InputError(
                f"this latent has {c} channels (as {src} latents do) but the loaded VAE, {self.name}, "
                f"takes {caps.latent_channels_packed}.", input=input,
                fix="load the VAE that belongs to the model that made this latent.")
        if not torch.isfinite(z).all():
            bad = int((~torch.isfinite(z)).sum())
            raise InputError(f"the latent contains {bad} NaN/Inf values; decoding it would give a black or broken image.",
                             input=input, fix="the sampler diverged: re-run it in fp32/bf16 (not fp16), "
                                              "or with fewer steps/lower CFG; check the model and LoRA weights.")
        if c == caps.latent_channels_packed and caps.latent_pack > 1:
            z = latents.unpack(z, caps.latent_pack)
        return z

    def check_image(self, x: torch.Tensor, input: str = "pixels") -> torch.Tensor:
        """Validate images [B, C, H, W] in 0..1."""
        caps = self.caps
        if not caps.can_encode:
            raise InputError("this VAE has no encoder (only a decoder file was loaded).", input="vae",
                             fix="load the matching *_encoder file too, or the pair by its stem name.")
        if x.dim() != 4 or x.shape[1] < caps.image_channels:
            raise InputError(f"expected images with {caps.image_channels} channels, got shape {tuple(x.shape)}.",
                             input=input)
        x = x[:, : caps.image_channels]
        r = caps.spatial_ratio_packed
        h, w = x.shape[-2:]
        if h % r or w % r:
            raise InputError(
                f"the image is {w}x{h} pixels; {self.name} needs width and height divisible by {r}.", input=input,
                fix=f"crop or resize to {w // r * r}x{h // r * r} (e.g. core 'ImageCrop' or 'Upscale Image') first.")
        if not torch.isfinite(x).all():
            raise InputError("the image contains NaN/Inf values.", input=input,
                             fix="check the node that produced the image.")
        return x

    # ---- engines -------------------------------------------------------------------------------
    def _plans(self, hw: tuple[int, int], tile: Tile, overlap: Optional[int]) -> list[tiling.AxisPlan]:
        return tiling.plan_grid(hw, tile, overlap, self.caps.spatial_ratio)

    def decode(self, z: torch.Tensor, tile: Tile = None, overlap: Optional[int] = None,
               progress: Optional[tiling.Progress] = None, out_device: DeviceLike = None) -> torch.Tensor:
        """Latent [B, C, h, w] -> images [B, C, H, W] in 0..1, float32 on ``out_device`` (CPU)."""
        z = self.check_latent(z)
        lo, hi = self.caps.value_range
        r = self.caps.spatial_ratio

        def fn(t: torch.Tensor) -> torch.Tensor:
            y = self.model.decode(self._model_input(t))
            return (y.float() - lo) / (hi - lo)

        with torch.inference_mode():
            out = tiling.run_tiled(fn, z, self._plans(z.shape[-2:], tile, overlap), (1, 1), (r, r),
                                   self.caps.image_channels, torch.device(out_device or "cpu"), progress=progress)
            return out.clamp_(0.0, 1.0)

    def encode(self, x: torch.Tensor, tile: Tile = None, overlap: Optional[int] = None,
               progress: Optional[tiling.Progress] = None, out_device: DeviceLike = None) -> torch.Tensor:
        """Images [B, C, H, W] in 0..1 -> LATENT tensor (packed the way the model family's LATENTs are)."""
        x = self.check_image(x)
        lo, hi = self.caps.value_range
        r = self.caps.spatial_ratio

        def fn(t: torch.Tensor) -> torch.Tensor:
            return self.model.encode(self._model_input(t) * (hi - lo) + lo).float()

        hw = (x.shape[-2] // r, x.shape[-1] // r)
        with torch.inference_mode():
            z = tiling.run_tiled(fn, x, self._plans(hw, tile, overlap), (r, r), (1, 1),
                                 self.caps.latent_channels, torch.device(out_device or "cpu"), progress=progress)
            return latents.pack(z, self.caps.latent_pack)
