"""LTX-Video / LTX-2 VAE configuration: the block list and settings read from a file's weights (and an
LTX-2 file's ``config`` metadata), checked, described and logged. The model built from it: ltx.py."""
from __future__ import annotations

import dataclasses
import json
import logging
import math
from dataclasses import dataclass, field
from typing import Mapping, Optional

from ..errors import LoadError
from ..files.keymap import count_indices
from .ltx_layout import STD

log = logging.getLogger("VAEKit")

UP_STRIDE = (2, 2, 2)     # the strided convs of 0.9.0/0.9.1 encoders; their stride is not in the weights
# channels a resampler folds into (or out of) one voxel -> its stride (space-to-depth / depth-to-space)
FOLD_STRIDE = {8: (2, 2, 2), 4: (1, 2, 2), 2: (2, 1, 1)}
# the original's up-sampler names (metadata ``decoder_blocks``) -> stride; only compress_all has a residual
UP_BLOCKS = {"compress_all": (2, 2, 2), "compress_time": (2, 1, 1), "compress_space": (1, 2, 2)}
PADS = ("zeros", "reflect", "replicate")


@dataclass(frozen=True)
class Block:
    """One ``down_blocks.N`` / ``up_blocks.N`` of the original's block list.

    kind: "res" (``layers`` resnets at width cin), "res_xy" (one resnet cin -> cout), "down"
    (strided 3x3x3 conv, 0.9.0/0.9.1), "s2d" (space-to-depth down-sampler, 0.9.5+) or "up"
    (conv + depth-to-space; cout is the width after it). Resampler strides are read from how many
    channels they fold (``FOLD_STRIDE``)."""
    kind: str
    cin: int
    cout: int
    layers: int = 0
    stride: tuple[int, int, int] = UP_STRIDE
    noise: bool = False       # res: spatial noise after each conv (0.9.1 decoder)
    timestep: bool = False    # res: own timestep embedder, adaLN in its resnets (0.9.1+ decoder)
    residual: bool = False    # up: add the input's depth-to-space (0.9.1, 0.9.5, 2.0; not in the weights)


@dataclass(frozen=True)
class LTXConfig:
    latent_channels: int = 128
    patch_size: int = 4
    encoder: tuple[Block, ...] = ()     # empty: the file has no encoder
    encoder_out: int = 129              # latents + one log-variance shared by all channels
    # the encoder's ``latent_log_var`` (the original's name): "uniform" (one log-variance channel for all
    # latent channels), "constant" (that channel dropped: log-variance -30, LTX-2.5), "per_channel"
    log_var: str = "uniform"
    decoder: tuple[Block, ...] = ()     # empty: no decoder
    timestep_conditioning: bool = False
    causal_decoder: bool = False        # as published; only an LTX-2 file's metadata can say otherwise
    # ComfyUI pads the decoder with reflect for files that carry no config (Lightricks' change, ComfyUI
    # #8930, July 2025), which is every 0.9.x VAE file users load; diffusers and LTX-Video 0.9.x pad with
    # zeros (set_decoder_padding(model, "zeros") for parity with them). Only frame borders differ.
    # LTX-2 as published: reflect (2.0), zeros (2.3); a file's metadata overrides both sides.
    decoder_spatial_pad: str = "reflect"
    encoder_spatial_pad: str = "zeros"
    version: str = "0.9.0"              # "0.9.0", "0.9.1", "0.9.5", "2.0", "2.3"; "0.9.0/0.9.1" (encoder only)
    in_channels: int = 3
    out_channels: int = 3
    # (setting, value, where it came from) for what the weights cannot tell: the load log; not the model
    sources: tuple[tuple[str, str, str], ...] = field(default=(), compare=False)

    @property
    def injects_noise(self) -> bool:
        return any(b.noise for b in self.decoder)

    @property
    def ltx2(self) -> bool:
        return self.version.startswith("2")

# ---- configuration from the weights (and an LTX-2 file's metadata) ---------------------------

def _blocks(sd, side: str) -> list[Block]:
    """The original's block list, read from canonical keys (strides filled in by the caller)."""
    keys = sd.keys()
    blocks = []
    for i in range(count_indices(keys, side)):
        p = f"{side}.{i}"
        if f"{p}.res_blocks.0.conv1.weight" in sd:
            c = sd[f"{p}.res_blocks.0.conv1.weight"].shape[0]
            blocks.append(Block("res", c, c, layers=count_indices(keys, f"{p}.res_blocks"),
                                noise=f"{p}.res_blocks.0.per_channel_scale1" in sd,
                                timestep=f"{p}.time_embedder.timestep_embedder.linear_1.weight" in sd))
        elif f"{p}.conv1.weight" in sd:
            w = sd[f"{p}.conv1.weight"]
            blocks.append(Block("res_xy", w.shape[1], w.shape[0]))
        elif f"{p}.conv.weight" in sd:               # s2d (encoder) / depth-to-space (decoder)
            w = sd[f"{p}.conv.weight"]
            kind = "s2d" if side.startswith("encoder") else "up"
            blocks.append(Block(kind, w.shape[1], w.shape[0]))
        elif f"{p}.weight" in sd:                    # strided conv (0.9.0/0.9.1 encoder)
            w = sd[f"{p}.weight"]
            blocks.append(Block("down", w.shape[1], w.shape[0]))
        else:
            raise LoadError(f"LTX VAE: block '{p}' is of no known kind.",
                            fix="the file may be damaged; please report it with the key list.")
    return blocks


def _fold(blocks: list[Block], widths_after: list[int], kind: str) -> tuple[Block, ...]:
    """Resamplers' strides and output widths: a space-to-depth conv emits cout / prod(stride)
    channels, a depth-to-space conv prod(stride) * cout, where cout is the next block's width."""
    for i, b in enumerate(blocks):
        if b.kind == kind:
            conv, width = b.cout, widths_after[i]
            folded = width // conv if kind == "s2d" else conv // width
            exact = (width % conv if kind == "s2d" else conv % width) == 0
            blocks[i] = dataclasses.replace(b, cout=width, stride=FOLD_STRIDE.get(folded, (0, 0, 0)) if exact
                                            else (0, 0, 0))
    return tuple(blocks)


def _encoder(sd) -> tuple[Block, ...]:
    blocks = _blocks(sd, "encoder.down_blocks")
    return _fold(blocks, [b.cin for b in blocks[1:]] + [sd["encoder.conv_out.weight"].shape[1]], "s2d")


def _decoder(sd) -> tuple[Block, ...]:
    blocks = _blocks(sd, "decoder.up_blocks")
    return _fold(blocks, [b.cin for b in blocks[1:]] + [sd["decoder.conv_out.weight"].shape[1]], "up")


def ratios(blocks, kinds) -> tuple[int, int]:
    strides = [b.stride for b in blocks if b.kind in kinds]
    return 2 ** sum(s[1] == 2 for s in strides), 2 ** sum(s[0] == 2 for s in strides)


def _ups(blocks) -> list[Block]:
    return [b for b in blocks if b.kind == "up"]


def _version(encoder, decoder, timestep: bool, ltx2_file: bool) -> str:
    """The release these shapes are (2.0's shapes with timestep conditioning are 0.9.5's: the file's
    metadata tells them apart, the computation is the same)."""
    ups = _ups(decoder)
    if decoder:
        if all(b.stride == (2, 2, 2) for b in ups):
            if all(b.cin == b.cout for b in ups) and not timestep:
                return "0.9.0"
            if all(b.cin == 2 * b.cout for b in ups):
                if not timestep:
                    return "2.0"
                if any(b.noise for b in decoder):
                    return "0.9.1"
                return "2.0" if ltx2_file else "0.9.5"
        return "2.3"         # time-only / space-only up-samplers, or one that keeps its width
    downs = [b for b in encoder if b.kind == "s2d"]
    if not downs:
        return "0.9.0/0.9.1"
    if downs[-1].cin == downs[-1].cout:
        return "2.3"
    return "2.0" if ltx2_file else "0.9.5"


def vae_metadata(metadata: Optional[Mapping[str, str]]) -> tuple[dict, bool]:
    """The ``vae`` part of a file's ``config`` metadata ({} if none), and whether the file is an
    LTX-2 one (its config also describes the audio VAE / vocoder, or it says ``model_version`` 2.x)."""
    raw = (metadata or {}).get("config")
    if not raw:
        return {}, False
    try:
        config = json.loads(raw)
    except ValueError as e:
        log.warning("LTX VAE: the file's 'config' metadata is not JSON (%s); using the weights and the "
                    "published values only", e)
        return {}, False
    vae_cfg = config.get("vae") if isinstance(config, dict) else None
    vae_cfg = vae_cfg if isinstance(vae_cfg, dict) else {}
    ltx2 = (isinstance(config, dict) and ("audio_vae" in config or "vocoder" in config)) \
        or str((metadata or {}).get("model_version", "")).startswith("2") or "decoder_base_channels" in vae_cfg
    return vae_cfg, ltx2


def _metadata_ups(vae_cfg: dict) -> Optional[list[tuple[tuple[int, int, int], bool]]]:
    """(stride, residual) of each up-sampler in execution order, from the metadata's block list (the
    original builds the decoder from it reversed; only ``compress_all`` takes ``residual``)."""
    blocks = vae_cfg.get("decoder_blocks", vae_cfg.get("blocks"))
    if not isinstance(blocks, list):
        return None
    ups = []
    for item in reversed(blocks):
        if not (isinstance(item, (list, tuple)) and len(item) == 2):
            return None
        name, params = item
        if name in UP_BLOCKS:
            residual = name == "compress_all" and isinstance(params, dict) and bool(params.get("residual", False))
            ups.append((UP_BLOCKS[name], residual))
    return ups


def from_metadata(vae_cfg: dict, keys: tuple[str, ...], default, origin: str, check=None):
    """(value, where it came from) of the first of ``keys`` the metadata has, else ``default``."""
    for k in keys:
        if k in vae_cfg:
            value = vae_cfg[k]
            if check is not None and value not in check:
                raise LoadError(f"LTX VAE: the file's metadata says {k}={value!r}, which this pack does not "
                                f"implement (only {', '.join(map(repr, check))}).",
                                fix="please report the file; its weights cannot be run as its config says.")
            return value, f"metadata {k}"
    return default, origin


LOG_VARS = ("uniform", "constant", "per_channel")


def log_var_mode(latent: int, encoder_out: int, named: str) -> str:
    """The encoder's log-variance mode: ``per_channel`` where it gives two values a channel, else the
    one ``named`` (a file's metadata or the family's published value), which the weights cannot tell."""
    if encoder_out == 2 * latent:
        return "per_channel"
    if named not in LOG_VARS[:2] or encoder_out != latent + 1:
        raise LoadError(f"LTX VAE: the encoder gives {encoder_out} channels for {latent} latent channels with "
                        f"log-variance mode {named!r}; expected {latent + 1} (uniform, constant) or {2 * latent}.",
                        fix="please report the file; its posterior cannot be read as its config says.")
    return named


def encoder_config(sd, spatial_pad: str = "zeros", log_var: str = "uniform") -> LTXConfig:
    """The encoder alone, from a file's canonical ``encoder.*`` keys: for a family that keeps an LTX-2
    encoder beside a decoder of its own (LTX-2.5's diffusion decoder), ``spatial_pad`` and ``log_var``
    (``latent_log_var``) from its config."""
    encoder = _encoder(sd)
    latent = sd[STD].shape[0] if STD in sd else sd["encoder.conv_out.weight"].shape[0] - 1
    out = sd["encoder.conv_out.weight"].shape[0]
    cfg = LTXConfig(latent_channels=latent, patch_size=math.isqrt(sd["encoder.conv_in.weight"].shape[1] // 3),
                    encoder=encoder, encoder_out=out, log_var=log_var_mode(latent, out, log_var),
                    encoder_spatial_pad=spatial_pad, version=_version(encoder, (), False, True))
    _check(cfg)
    return cfg


def config_from_state_dict(sd, name_hint: Optional[str] = None,
                           metadata: Optional[Mapping[str, str]] = None) -> LTXConfig:
    """Every shape from the weights; what they cannot tell from the file's metadata (``config`` ->
    ``vae``, as the original and ComfyUI read it), else the published value of the version the
    shapes show. Logged (logger "VAEKit")."""
    has_enc, has_dec = "encoder.conv_in.weight" in sd, "decoder.conv_in.weight" in sd
    if not (has_enc or has_dec):
        raise LoadError("LTX VAE file with neither encoder nor decoder weights.",
                        fix="load the VAE file (or the full checkpoint) itself.")
    vae_cfg, ltx2_file = vae_metadata(metadata)
    if vae_cfg.get("_class_name", "CausalVideoAutoencoder") != "CausalVideoAutoencoder":
        raise LoadError(f"this LTX file's VAE is a {vae_cfg['_class_name']} (e.g. LTX-2.5's diffusion decoder), "
                        "not a convolutional autoencoder.", fix="load an LTX-Video 0.9.x / LTX-2 / LTX-2.3 VAE.")
    from_metadata(vae_cfg, ("norm_layer",), "pixel_norm", "", check=("pixel_norm",))
    timestep = "decoder.timestep_scale_multiplier" in sd
    if "timestep_conditioning" in vae_cfg and has_dec and bool(vae_cfg["timestep_conditioning"]) != timestep:
        log.warning("LTX VAE: the file's metadata says timestep_conditioning=%s but its weights %s a timestep "
                    "embedder; following the weights", vae_cfg["timestep_conditioning"],
                    "have" if timestep else "have no")
    if has_dec:
        latent = sd["decoder.conv_in.weight"].shape[1]
        patch = math.isqrt(sd["decoder.conv_out.weight"].shape[0] // 3)
    else:
        latent = sd[STD].shape[0] if STD in sd else sd["encoder.conv_out.weight"].shape[0] - 1
        patch = math.isqrt(sd["encoder.conv_in.weight"].shape[1] // 3)
    encoder = _encoder(sd) if has_enc else ()
    decoder = _decoder(sd) if has_dec else ()
    version = _version(encoder, decoder, timestep, ltx2_file)
    published = f"published {version}"
    sources = []

    ups = _ups(decoder)
    listed = _metadata_ups(vae_cfg)
    if listed is not None and [s for s, _ in listed] != [b.stride for b in ups]:
        log.warning("LTX VAE: the file's metadata lists up-samplers %s, its weights have %s; following the "
                    "weights", [s for s, _ in listed], [b.stride for b in ups])
        listed = None
    if listed is not None:
        residual, origin = [r for _, r in listed], "metadata decoder_blocks"
    else:     # 0.9.1, 0.9.5, 2.0: three (2, 2, 2) up-samplers halving the width, all residual
        residual = [all(b.stride == (2, 2, 2) and b.cin == 2 * b.cout for b in ups)] * len(ups)
        origin = published
    it = iter(residual)
    decoder = tuple(dataclasses.replace(b, residual=next(it)) if b.kind == "up" else b for b in decoder)
    causal, causal_origin = from_metadata(vae_cfg, ("causal_decoder",), False, published)
    # the original reads "spatial_padding_mode" for both sides, before the per-side keys
    dec_pad, dec_origin = from_metadata(vae_cfg, ("spatial_padding_mode", "decoder_spatial_padding_mode"),
                                         "zeros" if version == "2.3" else "reflect",
                                         published if version.startswith("2") else "ComfyUI's default", check=PADS)
    enc_pad, enc_origin = from_metadata(vae_cfg, ("spatial_padding_mode", "encoder_spatial_padding_mode"),
                                         "zeros", published, check=PADS)
    if has_dec:
        shown = "all" if all(residual) else "none" if not any(residual) else ",".join(map(str, residual))
        sources += [("residual up-samplers", shown, origin),
                    ("causal decoder", str(bool(causal)), causal_origin),
                    ("decoder padding", dec_pad, dec_origin)]
    encoder_out = sd["encoder.conv_out.weight"].shape[0] if has_enc else latent + 1
    log_var, log_var_origin = from_metadata(vae_cfg, ("latent_log_var",), "uniform", published, check=LOG_VARS)
    log_var = log_var_mode(latent, encoder_out, log_var)
    if has_enc:
        sources += [("encoder padding", enc_pad, enc_origin), ("encoder log-variance", log_var, log_var_origin)]
    cfg = LTXConfig(
        latent_channels=latent, patch_size=patch, encoder=encoder, encoder_out=encoder_out, log_var=log_var,
        decoder=decoder, timestep_conditioning=timestep, causal_decoder=bool(causal),
        decoder_spatial_pad=dec_pad, encoder_spatial_pad=enc_pad, version=version, sources=tuple(sources))
    _check(cfg)
    log.info("%s. From the weights: patch %d, %s. Not in the weights: %s", describe(cfg), patch, _shape_summary(cfg),
             "; ".join(f"{name} {value} ({where})" for name, value, where in cfg.sources))
    return cfg


def _shape_summary(cfg: LTXConfig) -> str:
    parts = []
    for side, blocks, kinds in (("encoder", cfg.encoder, ("down", "s2d")), ("decoder", cfg.decoder, ("up",))):
        if blocks:
            strides = ",".join("".join(map(str, b.stride)) for b in blocks if b.kind in kinds)
            parts.append(f"{side} {len(blocks)} blocks, widths {blocks[0].cin}-{blocks[-1].cout}, strides {strides}")
    parts.append(f"timestep conditioning {'on' if cfg.timestep_conditioning else 'off'}")
    return ", ".join(parts)


def _check(cfg: LTXConfig) -> None:
    """Refuse what cannot be run as its weights and config say, rather than guess."""
    problems = []
    for side, blocks, kinds in (("encoder", cfg.encoder, ("down", "s2d")), ("decoder", cfg.decoder, ("up",))):
        if any(b.kind in kinds and b.stride == (0, 0, 0) for b in blocks):
            problems.append(f"a {side} resampler folds its channels in a way no LTX VAE does")
    if cfg.encoder and cfg.decoder and ratios(cfg.encoder, ("down", "s2d")) != ratios(cfg.decoder, ("up",)):
        problems.append("its encoder and decoder compress by different factors")
    if cfg.ltx2 and any(b.kind == "res_xy" for b in cfg.encoder + cfg.decoder):
        # no published LTX-2 VAE has one; the original normalises their shortcut over the whole clip
        # (GroupNorm, 1 group), diffusers per voxel (LayerNorm): no reference to follow
        problems.append("it has width-changing resnets, which no published LTX-2 VAE has")
    if problems:
        raise LoadError(f"this LTX VAE cannot be run as published code runs it: {'; '.join(problems)}.",
                        fix="LTX-Video 0.9.0-0.9.7, LTX-2 and LTX-2.3 VAEs are supported; please report the file.")


def decoder_reach(cfg: LTXConfig) -> int:
    """How many latent frames on either side of its own can change an output frame of the
    non-causal decoder: each 3-frame conv sees one more frame at its own frame rate (1/f latent
    frames after time up-samplers totalling f), rounded up (tests measure it by moving one latent
    frame). Temporal tiles and frame-wise chunks are exact only for frames more than this far from a
    tile edge; 0 for a causal decoder (no look-ahead)."""
    if cfg.causal_decoder:
        return 0
    rate, reach = 1, 1.0                           # conv_in
    for b in cfg.decoder:
        if b.kind == "res":
            reach += 2 * b.layers / rate
        elif b.kind == "res_xy":
            reach += 2 / rate
        elif b.kind == "up":
            reach += 1 / rate                      # its conv runs before the frames double
            rate *= b.stride[0]
    return math.ceil(reach + 1 / rate)             # conv_out

def describe(cfg: LTXConfig) -> str:
    if cfg.ltx2:
        name = f"LTX-{cfg.version}"
    else:
        name = f"LTX-Video {({'0.9.5': '0.9.5/0.9.7'}.get(cfg.version, cfg.version))}"
    extra = ", timestep-conditioned decoder" if cfg.timestep_conditioning else ""
    extra += ", causal decoder" if cfg.causal_decoder else ""
    if cfg.version == "0.9.5" and not cfg.decoder:
        extra += "; LTX-2.0's encoder has the same shapes"
    return f"{name} VAE ({cfg.latent_channels} latent channels{extra})"
