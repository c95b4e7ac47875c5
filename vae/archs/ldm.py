"""The LDM encoder/decoder skeleton shared by the KL image VAEs and HunyuanVideo 1.0, and the
diffusers -> LDM key rules for it.

Canonical names (original LDM / ComfyUI): ``encoder.down.<i>.block.<j>``, ``encoder.down.<i>.downsample``,
``{encoder,decoder}.mid.{block_1,attn_1,block_2}``, ``norm_out``, ``conv_out``; ``decoder.up.<i>`` is
indexed like the encoder, so ``up.<n-1>`` runs first. A family supplies its convolutions, norm,
attention and resamplers (``Ops`` and the resampler factories); the wiring is written once here."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from ..files.keymap import count_indices, linear_to_conv1x1, rename
from ..nn import posterior as gaussian
from ..nn.resnet import ConvFactory, MidBlock, NormFactory, ResnetBlock
from ..nn.steps import chain

# (level index, channels) -> the level's resampler, or None for a level without one. A resampler
# that changes the width says so in ``out_channels`` (the next level's blocks start from it).
ResampleFactory = Callable[[int, int], Optional[nn.Module]]


@dataclass(frozen=True)
class Ops:
    conv: ConvFactory                                # 3x3 (3x3x3) conv that keeps the size
    shortcut: ConvFactory                            # 1x1 conv of resnets that change width
    norm: NormFactory
    attention: Callable[[int], Optional[nn.Module]]  # mid-block attention; None: none
    block: Callable[..., ResnetBlock] = ResnetBlock  # the resnet, ResnetBlock's signature (a subclass)

    def resnet(self, cin: int, cout: int) -> ResnetBlock:
        return self.block(cin, cout, conv=self.conv, shortcut=self.shortcut, norm=self.norm)

    def mid(self, channels: int) -> MidBlock:
        return MidBlock(channels, self.attention(channels), conv=self.conv, norm=self.norm, block=self.block)


class Level(nn.Module):
    """One resolution: resnets (``block``), then the resampler (``downsample`` / ``upsample``) if any."""

    def __init__(self, index: int, blocks: list[nn.Module], resample: Optional[nn.Module], resample_name: str):
        super().__init__()
        self.block = nn.ModuleList(blocks)
        self._resample = resample_name
        if resample is not None:
            self.add_module(resample_name, resample)

    def steps(self) -> list[nn.Module]:
        """What it runs, in order (``chain``); a level whose input lives across its blocks (a
        shortcut) returns ``[self]``."""
        resample = getattr(self, self._resample, None)
        return [*self.block, *([resample] if resample is not None else [])]

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        for step in Level.steps(self):
            h = step(h)
        return h



# (level index, resnets, resampler or None, resampler name) -> the level (a family may add a shortcut)
LevelFactory = Callable[[int, list, Optional[nn.Module], str], nn.Module]


class Encoder(nn.Module):
    """``base``: the width of ``conv_in`` (LDM's ``ch``; the first level's width unless ``ch_mult[0] != 1``).
    ``mid``: whether a mid block follows the levels (MiniMax H3's encoder has none).
    ``head_shortcut`` (the DC-AE style VAEs: HunyuanVideo 1.5, HunyuanImage): the head adds the
    mid block's output, groups of channels averaged down to the moments."""

    def __init__(self, base: int, widths: Sequence[int], num_res_blocks: int, in_channels: int,
                 out_channels: int, ops: Ops, downsample: ResampleFactory, level: LevelFactory = Level,
                 mid: bool = True, head_shortcut: bool = False):
        super().__init__()
        self.head_shortcut = head_shortcut
        self.conv_in = ops.conv(in_channels, base)
        self.down = nn.ModuleList()
        cin = base
        for i, w in enumerate(widths):
            blocks = []
            for _ in range(num_res_blocks):
                blocks.append(ops.resnet(cin, w))
                cin = w
            down = downsample(i, w)
            self.down.append(level(i, blocks, down, "downsample"))
            cin = getattr(down, "out_channels", cin)
        self.mid = ops.mid(cin) if mid else None
        self.norm_out = ops.norm(cin)
        self.conv_out = ops.conv(cin, out_channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.conv_in(x)
        for step in chain(*self.down, self.mid):
            h = step(h)
        out = self.conv_out(F.silu(self.norm_out(h), inplace=True))
        return out.add_(h.unflatten(1, (out.shape[1], -1)).mean(2)) if self.head_shortcut else out


class Decoder(nn.Module):
    """``latent_shortcut`` (the DC-AE style VAEs): ``conv_in`` adds the latent, each channel repeated
    up to the width. ``conv_out``: the last conv's factory when it is not ``ops.conv`` (SVD's mixes frames too)."""

    def __init__(self, widths: Sequence[int], num_res_blocks: int, in_channels: int, out_channels: int,
                 ops: Ops, upsample: ResampleFactory, level: LevelFactory = Level, mid_width: Optional[int] = None,
                 latent_shortcut: bool = False, conv_out: Optional[ConvFactory] = None):
        super().__init__()
        self.latent_shortcut = latent_shortcut
        cin = mid_width or widths[-1]
        self.conv_in = ops.conv(in_channels, cin)
        self.mid = ops.mid(cin)
        levels = []
        for i in reversed(range(len(widths))):   # built coarse to fine, stored by level index
            blocks = []
            for _ in range(num_res_blocks + 1):
                blocks.append(ops.resnet(cin, widths[i]))
                cin = widths[i]
            up = upsample(i, cin)
            levels.insert(0, level(i, blocks, up, "upsample"))
            cin = getattr(up, "out_channels", cin)
        self.up = nn.ModuleList(levels)
        self.norm_out = ops.norm(cin)
        self.conv_out = (conv_out or ops.conv)(cin, out_channels)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        h = self.conv_in(z)
        if self.latent_shortcut:
            h = h.add_(z.repeat_interleave(h.shape[1] // z.shape[1], dim=1))
        for step in chain(self.mid, *reversed(self.up)):
            h = step(h)
        return self.conv_out(F.silu(self.norm_out(h), inplace=True))


class Autoencoder(nn.Module):
    """encode: pixels -> the posterior mode (the mean half of the moments, as ComfyUI's LATENT holds
    it); decode: latent -> pixels. Either half may be absent (encoder- or decoder-only files);
    ``quant_conv``/``post_quant_conv`` are the optional 1x1 convs around the latent."""

    def __init__(self, encoder: Optional[nn.Module], decoder: Optional[nn.Module],
                 quant_conv: Optional[nn.Module] = None, post_quant_conv: Optional[nn.Module] = None):
        super().__init__()
        # registered only when present, so the state dict holds exactly the file's keys
        for name, m in (("encoder", encoder), ("quant_conv", quant_conv),
                        ("decoder", decoder), ("post_quant_conv", post_quant_conv)):
            if m is not None:
                self.add_module(name, m)

    def encode(self, x: torch.Tensor, posterior: bool = False) -> torch.Tensor:
        """The posterior's mean; ``posterior``: [mean; log-variance] (vae/nn/posterior.py)."""
        h = self.encoder(x)
        if hasattr(self, "quant_conv"):
            h = self.quant_conv(h)
        return gaussian.from_moments(h) if posterior else h[:, : h.shape[1] // 2]

    def decode(self, z: torch.Tensor) -> torch.Tensor:
        if hasattr(self, "post_quant_conv"):
            z = self.post_quant_conv(z)
        return self.decoder(z)


# ---- diffusers key layout ----------------------------------------------------------------------

def is_diffusers(keys) -> bool:
    return any(".down_blocks." in k or ".up_blocks." in k or ".mid_block." in k for k in keys)


def from_diffusers(sd, ndim: int) -> dict:
    """diffusers ``down_blocks/up_blocks/mid_block`` names -> LDM names; the mid attention's Linear
    weights become 1x1 convs of ``ndim`` dimensions (4: images, 5: video)."""
    n_up = count_indices(sd.keys(), "decoder.up_blocks")
    flip = lambda m: str(n_up - 1 - int(m.group(1)))  # diffusers counts up blocks coarse-to-fine
    rules = [
        (r"\.conv_norm_out\.", ".norm_out."),
        (r"^encoder\.down_blocks\.(\d+)\.resnets\.", r"encoder.down.\1.block."),
        (r"^encoder\.down_blocks\.(\d+)\.downsamplers\.0\.", r"encoder.down.\1.downsample."),
        (r"^decoder\.up_blocks\.(\d+)\.resnets\.", lambda m: f"decoder.up.{flip(m)}.block."),
        (r"^decoder\.up_blocks\.(\d+)\.upsamplers\.0\.", lambda m: f"decoder.up.{flip(m)}.upsample."),
        (r"\.mid_block\.resnets\.0\.", ".mid.block_1."),
        (r"\.mid_block\.resnets\.1\.", ".mid.block_2."),
        (r"\.mid_block\.attentions\.0\.group_norm\.", ".mid.attn_1.norm."),
        # current (to_q ...) and legacy (query ...) attention names
        (r"\.mid_block\.attentions\.0\.(?:to_q|query)\.", ".mid.attn_1.q."),
        (r"\.mid_block\.attentions\.0\.(?:to_k|key)\.", ".mid.attn_1.k."),
        (r"\.mid_block\.attentions\.0\.(?:to_v|value)\.", ".mid.attn_1.v."),
        (r"\.mid_block\.attentions\.0\.(?:to_out\.0|proj_attn)\.", ".mid.attn_1.proj_out."),
        (r"\.conv_shortcut\.", ".nin_shortcut."),
    ]
    return linear_to_conv1x1(rename(sd, rules), r"\.mid\.attn_1\.(q|k|v|proj_out)\.weight$", ndim=ndim)
