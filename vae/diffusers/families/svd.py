"""AutoencoderKLTemporalDecoder (Stable Video Diffusion)."""
from __future__ import annotations

from typing import Any, Mapping

import torch

from ...errors import InputError
from .family import Family


# ---- AutoencoderKLTemporalDecoder ---------------------------------------------------------------------
# The class takes frames in the batch: encode [N, 3, H, W] (frame by frame, as our handle encodes a clip
# [T, C, H, W]); decode [B*F, 4, h, w] with ``num_frames`` = F, each F consecutive frames one clip, which
# ours decodes as the batch [B, 4, F, h, w] of clips.
def _svd_weights(cfg, caps) -> dict:
    return dict(in_channels=cfg.in_channels, out_channels=cfg.out_channels,
                down_block_types=["DownEncoderBlock2D"] * len(cfg.ch_mult), block_out_channels=list(cfg.widths),
                layers_per_block=cfg.num_res_blocks, latent_channels=cfg.z_channels)


def _clips(handle, what: str, t: torch.Tensor, given: Mapping[str, Any]) -> torch.Tensor:
    """The class's frames as ours: images stay frames; latents [B*F, C, h, w] become clips [B, C, F, h, w]."""
    if t.dim() != 4:
        raise InputError(f"AutoencoderKLTemporalDecoder takes frames [N, C, H, W], not a {t.dim()}-D tensor.",
                         input="x" if what == "pixels" else "z", fix="fold the clip's frames into the batch.")
    if what == "pixels":
        return t
    frames = given.get("num_frames")
    if not frames or t.shape[0] % int(frames):
        raise InputError(f"decode(z, num_frames) needs num_frames dividing the {t.shape[0]} latent frames "
                         f"(got {frames!r}): each num_frames consecutive frames are one clip.", input="num_frames",
                         fix="pass the frames per clip, e.g. decode(z, num_frames=z.shape[0]), as "
                             "StableVideoDiffusionPipeline does.")
    return t.unflatten(0, (-1, int(frames))).movedim(1, 2)


def _frames(handle, what: str, t: torch.Tensor, given: Mapping[str, Any]) -> torch.Tensor:
    """Ours back as the class's frames: decoded clips [B, C, F, H, W] -> [B*F, C, H, W]."""
    return t.movedim(2, 1).flatten(0, 1) if t.dim() == 5 else t


AUTOENCODER_KL_TEMPORAL_DECODER = Family(
    class_name="AutoencoderKLTemporalDecoder", arch="svd",
    defaults=dict(in_channels=3, out_channels=3, down_block_types=["DownEncoderBlock2D"], block_out_channels=[64],
                  layers_per_block=1, latent_channels=4, sample_size=32, scaling_factor=0.18215, force_upcast=True),
    weights=_svd_weights,
    # the class's time convs span 3 frames, and it has the encoder's quant conv
    serves=lambda cfg: cfg.time_kernel == 3 and cfg.embed_dim is not None,
    decode_args=("num_frames", "return_dict"), forward_args=("sample_posterior", "return_dict", "generator", "num_frames"),
    forward_defaults=dict(num_frames=1), into=_clips, out_of=_frames)
