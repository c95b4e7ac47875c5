"""What a forward keeps alive: the LDM skeleton drops each activation map as soon as nothing reads it
(a level's input once its first block returned, a resnet's first conv output before its second conv
runs), a streamed conv pads time and space in one copy, and a stream's last chunk keeps no caches. The
first three are each one activation map of the peak (one pass of HunyuanVideo 1.5 at 480x848: 14.3 GiB
live -> 10.7 GiB together; the last chunk's caches: 10.3 GiB)."""
from __future__ import annotations

import weakref

import pytest
import torch
import torch.nn.functional as F

from vae import run
from vae.archs import kl
from vae.nn.causal import CausalConv3d


def _tiny_kl():
    # 32 channels: GroupNorm's 32 groups
    cfg = kl.KLConfig(ch=32, ch_mult=(1, 2), num_res_blocks=2, z_channels=4, embed_dim=4, mid_attention=False)
    return kl.AutoencoderKL(cfg).eval()


def _alive_at(module: torch.nn.Module, watched: list) -> list:
    """Whether each tensor of ``watched`` (weak references) is alive when ``module`` starts."""
    seen = []
    module.register_forward_pre_hook(lambda m, args: seen.append([r() is not None for r in watched]))
    return seen


def test_a_levels_input_is_freed_once_its_first_block_returns():
    m = _tiny_kl()
    first, second = m.encoder.down[0].block
    inputs: list = []
    first.register_forward_pre_hook(lambda mod, args: inputs.append(weakref.ref(args[0])))
    seen = _alive_at(second, inputs)
    with torch.inference_mode():
        m.encode(torch.randn(1, 3, 32, 32))
    assert seen == [[False]]      # the caller no longer holds the level's input (the first block's)


def test_a_resnets_first_conv_output_is_freed_before_its_second_conv():
    m = _tiny_kl()
    block = m.decoder.up[0].block[0]
    outputs: list = []
    block.conv1.register_forward_hook(lambda mod, args, out: outputs.append(weakref.ref(out)))
    seen = _alive_at(block.conv2, outputs)
    with torch.inference_mode():
        m.decode(torch.randn(1, 4, 8, 8))
    assert seen == [[False]]


@pytest.mark.parametrize("mode", ["replicate", "reflect"])
@pytest.mark.parametrize("kernel", [3, 5])
def test_a_stream_pads_time_and_space_in_one_copy(mode, kernel):
    conv = CausalConv3d(2, 3, kernel, stride=(2, 1, 1), spatial_pad=mode).eval()
    head, x = torch.randn(1, 2, 2, 7, 9), torch.randn(1, 2, 4, 7, 9)
    # the joined copy is the concatenation padded: values copied, nothing computed
    assert torch.equal(conv._joined(head, x), F.pad(torch.cat([head, x], 2), conv._replicate, mode=mode))
    clip = torch.randn(1, 2, 11, 7, 9)
    with torch.inference_mode():
        whole = conv(clip)
        with run.using(run.Run()), run.stream():
            parts = [conv(clip[:, :, a:b]) for a, b in ((0, 1), (1, 4), (4, 9), (9, 11))]
    torch.testing.assert_close(torch.cat(parts, 2), whole, rtol=1e-5, atol=1e-6)


def test_the_last_chunk_of_a_stream_drops_each_cache_as_it_reads_it():
    conv = CausalConv3d(2, 3, 3, spatial_pad="replicate").eval()
    clip = torch.randn(1, 2, 9, 6, 6)
    memory: dict = {}
    with torch.inference_mode():
        whole = conv(clip)
        with run.using(run.Run()), run.stream(memory):
            first = conv(clip[:, :, :5])
            assert conv in memory
            memory[run.FINAL] = True
            last = conv(clip[:, :, 5:])
    assert conv not in memory
    torch.testing.assert_close(torch.cat([first, last], 2), whole, rtol=1e-5, atol=1e-6)


def test_a_streamed_call_marks_its_last_chunk():
    from vae.engine import streaming, tiling
    finals = []

    def fn(x):
        finals.append(run.current().memory.get(run.FINAL, False))
        return x
    x = torch.randn(1, 2, 7, 4, 4)
    chunks = streaming.chunk_spans(7, 1, 3)            # 1 + 3 + 3 frames
    whole = [tiling.plan_axis(4, 4, 0)] * 2
    out = streaming.run_streamed(fn, torch.nn.Identity(), x, chunks, chunks, whole, (1, 1), (1, 1), 2, 7,
                                 torch.device("cpu"))
    assert finals == [False, False, True] and torch.equal(out, x)


def test_ltx_encoders_resnet_groups_run_resnet_by_resnet():
    """LTX's encoder runs its groups' resnets as steps of its own loop (a group called whole would hold
    its input through every resnet); a timestep-conditioned decoder group runs whole."""
    from video_families import tiny_state_dict
    from vae import from_state_dict
    from vae.archs import ltx
    from vae.nn.steps import chain
    encoder = from_state_dict(tiny_state_dict("ltx")).model.encoder
    steps = list(chain(*encoder.down_blocks))
    assert not any(isinstance(s, ltx.ResGroup) for s in steps)
    assert sum(isinstance(s, ltx.ResBlock) for s in steps) == sum(
        len(b.res_blocks) if isinstance(b, ltx.ResGroup) else isinstance(b, ltx.ResBlock) for b in encoder.down_blocks)
    from vae.archs.ltx_config import Block
    timed = ltx.ResGroup(Block("res", 8, 8, layers=2, timestep=True), lambda i, o: CausalConv3d(i, o, 3))
    assert timed.steps() == [timed]
