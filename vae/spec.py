"""What an architecture declares. Engines read these fields; none of them branches on a name."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional

import torch
from torch import nn

StateDict = Mapping[str, torch.Tensor]


@dataclass(frozen=True)
class Capabilities:
    latent_channels: int              # channels of the model's own latent grid
    spatial_ratio: int                # pixels per latent pixel, each spatial axis
    image_channels: int = 3
    temporal_ratio: Optional[int] = None   # video VAEs only: frames = 1 + temporal_ratio * (latent_frames - 1)
                                           # (but see first_frame_odd_only)
    value_range: tuple[float, float] = (-1.0, 1.0)   # pixel range the model works in
    latent_pack: int = 1              # LATENTs carry pack x pack latent pixels in channels (Flux.2)
    # an image VAE whose LATENTs carry a time axis of one frame, [B, C, 1, h, w], as core gives them
    # (HunyuanImage 3.0: core builds it as a 3-D VAE with one-frame clips); [B, C, h, w] is taken too
    latent_frame_axis: bool = False
    has_attention: bool = False
    # where normalisation statistics come from: "groupnorm" (H*W of an image), "groupnorm_frame"
    # (H*W of each frame), "groupnorm_clip" (T*H*W of the clip), "rms" (per pixel/voxel), "none"
    norm: str = "none"
    causal_encoder: bool = False      # latent frame i depends only on pixel frames <= r*i (streamable)
    causal_decoder: bool = False      # pixel frames of latent i depend only on latents <= i
    # encode / decode run chunk by chunk along time through the model's stream caches and equal
    # one pass (vae/engine/streaming.py); a time axis that needs tiling is then streamed, exactly
    stream_encode: bool = False
    stream_decode: bool = False
    # latent frames per stream chunk when the call asks for none, and the largest chunk (0: one pass
    # unless the call asks for temporal tiles): the reference's own chunking, e.g. Wan's one frame
    stream_chunk: int = 0
    # the reference runs a clip in batches of ``stream_chunk`` latent frames, the first also taking the
    # t % stream_chunk left over, and each batch normalises with its own statistics (GroupNorm over its
    # frames): the batches are part of the result, so a decode streams exactly those batches whatever a
    # call asks (CogVideoX: 3 latent frames, then 2 at a time)
    stream_batches: bool = False
    # the first latent frame stands for one pixel frame only when the count is odd (CogVideoX, whose
    # resamplers keep a pass's first frame alone in an odd count of frames): an even t decodes to
    # temporal_ratio * t frames
    first_frame_odd_only: bool = False
    can_encode: bool = True
    # the encoder gives a Gaussian posterior (mean and log-variance): ``model.encode(x, posterior=True)``
    # returns both stacked in channels (vae/nn/posterior.py); False: one deterministic latent (TAESD)
    posterior: bool = False
    can_decode: bool = True
    default_tile: int = 512           # pixels
    default_overlap: int = 64         # pixels
    default_tile_frames: int = 64     # pixel frames (video)
    default_overlap_frames: int = 8   # pixel frames (video)
    # extra keyword inputs model.decode() / model.encode() accept, e.g. LTX 0.9.1+'s decode: ("timestep",
    # "noise_scale", "seed"); VAE.decode / VAE.encode refuse any other keyword (vae/checks.py: call)
    decode_options: tuple[str, ...] = ()
    encode_options: tuple[str, ...] = ()
    working_dtypes: tuple[torch.dtype, ...] = (torch.bfloat16, torch.float32)
    # a model whose reference tiles as part of its definition (MiniMax H3): its tiles and chunks are
    # the result, so the engines run exactly those (vae/engine/defined.py) and take their frame rules
    own_tiling: Optional[Any] = None
    # ComfyUI's LATENT and IMAGE hold one clip's frames in the batch axis ([T, C, h, w], as core's SVD
    # nodes make them): the handle takes and gives that layout besides clips [B, C, T, h, w], and the
    # socket presents the VAE to core's nodes as core presents its own (an image-style VAE, latent_dim 2)
    frames_in_batch: bool = False

    @property
    def latent_channels_packed(self) -> int:
        return self.latent_channels * self.latent_pack ** 2

    @property
    def spatial_ratio_packed(self) -> int:
        return self.spatial_ratio * self.latent_pack


@dataclass(frozen=True)
class KnownConfigs:
    """The published configurations of a family that has only a few, per part (a decoder-only file has
    no encoder to compare). ``parts``: a name ("OpenAI's decoder") -> the configuration fields it fixes
    (dotted paths into the config: ``decoder.blocks``). ``blocks``: the fields among them that count
    blocks a file's keys decide (``count_indices``) -> (what they count, the key prefix of block ``{i}``).
    A file whose configuration has every other field of a part but fewer of such blocks lost whole
    blocks: its keys alone read as a smaller model that loads and computes something else, so it is
    refused (vae/files/loadcheck.py: check_known). A configuration that differs elsewhere (a width, a
    channel count) is another variant and is not judged."""
    parts: Mapping[str, Mapping[str, Any]]
    blocks: Mapping[str, tuple[str, str]]


@dataclass(frozen=True)
class ArchSpec:
    id: str
    name: str
    detect: Callable[[StateDict], bool]                    # no false negatives; order settles overlaps
    to_canonical: Callable[[StateDict], dict]              # any known layout -> the canonical one
    config_from_state_dict: Callable[[StateDict, Optional[str]], Any]   # (canonical sd, name hint)
    build: Callable[[Any], nn.Module]
    capabilities: Callable[[Any], Capabilities]
    describe: Callable[[Any], str] = field(default=lambda cfg: "")
    # adds tensors that the file format leaves implicit (e.g. TAESD's scale/shift, known by name)
    complete_state_dict: Callable[[dict, Any], dict] = field(default=lambda sd, cfg: sd)
    # config_from_state_dict also takes ``metadata=`` (the file's safetensors metadata, {} if none):
    # for families whose files carry hyperparameters the weights cannot tell (LTX-2's ``config``)
    reads_metadata: bool = False
    # detection order (vae/registry.py): lower first; a family whose keys are a superset of another's
    # (Flux.2 = KL + BatchNorm) goes before it
    priority: int = 100
    # the models whose LATENTs this family decodes, by (channels, rank) (rank 4: image [B, C, h, w],
    # 5: video), for error messages that name the model a wrong latent came from
    latent_hints: tuple[tuple[int, int, str], ...] = ()
    # the published configurations, where a family has only a few (see KnownConfigs)
    known_configs: Optional[KnownConfigs] = None


def describe(name: str, latent_channels: int, has_encoder: bool = True, has_decoder: bool = True,
             *notes: str) -> str:
    """A loaded VAE's one line: its name, latent channels, ``notes``, and the half a one-sided file has."""
    extra = [f"{latent_channels} latent channels", *notes]
    if not has_encoder or not has_decoder:
        extra.append("decoder only" if has_decoder else "encoder only")
    return f"{name} ({', '.join(extra)})"
