"""Degenerate inputs through the nodes: the error names the node and the node's own input (not the
library's argument name), and Frame-wise Decode gives an IMAGE or raises, never None."""
from __future__ import annotations

import pytest
import torch

from helpers import diffusers_tiny, pointwise_video_vae


@pytest.fixture(scope="module")
def image_vae(pack):
    from vaekit.nodes.socket import VAEKitVAE
    from vaekit.vae import from_state_dict
    return VAEKitVAE(from_state_dict(diffusers_tiny().state_dict(), name_hint="taesd"))


@pytest.fixture(scope="module")
def video_vae(pack):
    from vaekit.nodes.socket import VAEKitVAE
    return VAEKitVAE(pointwise_video_vae(package="vaekit.vae"))


def _node(pack, name):
    return pack.NODE_CLASS_MAPPINGS[name]()


def _error(fn) -> str:
    with pytest.raises(ValueError) as e:
        fn()
    return str(e.value)


@pytest.mark.parametrize("kw, expect", [
    (dict(tile_size=-64), "Tiled Decode (VAEKit): input 'tile_size': -64 is below its minimum, 64. Fix: use a value "
                          "from 64 to 4096."),
    (dict(tile_size=512, overlap=-32), "Tiled Decode (VAEKit): input 'overlap': -32 is below its minimum, 0."),
    (dict(mode="exactly"), "Tiled Decode (VAEKit): input 'mode': 'exactly' is not one of its choices. Fix: choose one "
                           "of 'exact', 'fast'."),
])
def test_tiled_decode_names_its_own_inputs(pack, image_vae, kw, expect):
    assert expect in _error(lambda: _node(pack, "VAEKitTiledDecode").decode({"samples": torch.randn(1, 4, 8, 8)},
                                                                           image_vae, **kw))


def test_tiled_decode_names_temporal_inputs(pack, video_vae):
    msg = _error(lambda: _node(pack, "VAEKitTiledDecode").decode({"samples": torch.randn(1, 4, 3, 2, 2)}, video_vae,
                                                                 temporal_size=-8))
    assert msg.startswith("Tiled Decode (VAEKit): input 'temporal_size': -8 is below its minimum, 8")


def test_library_errors_name_the_nodes_input(pack, image_vae):
    """What the declaration allows but the library refuses still names the node's input, not the
    library's argument (Frame-wise Decode's 'tile_size' is the library's 'tile')."""
    msg = _error(lambda: _node(pack, "VAEKitFramewiseDecode").decode({"samples": torch.zeros(2, 4, 4, 4)}, image_vae,
                                                                     tile_size=32))
    assert msg.startswith("Frame-wise Decode (VAEKit): input 'tile_size': tiles of 32 pixels")


def test_empty_latent_batch(pack, image_vae):
    msg = _error(lambda: _node(pack, "VAEKitTiledDecode").decode({"samples": torch.zeros(0, 4, 8, 8)}, image_vae))
    assert msg.startswith("Tiled Decode (VAEKit): input 'samples': the latent holds no samples")


def test_tiled_encode_images(pack, image_vae):
    enc = _node(pack, "VAEKitTiledEncode")
    pixels = torch.randint(0, 256, (1, 16, 16, 3), dtype=torch.uint8)
    (latent,) = enc.encode(pixels, image_vae)
    (ref,) = enc.encode(pixels.float() / 255, image_vae)
    assert torch.equal(latent["samples"], ref["samples"])
    msg = _error(lambda: enc.encode(torch.rand(1, 16, 16, 3) * 255, image_vae))
    assert msg.startswith("Tiled Encode (VAEKit): input 'pixels': the image's values span") and "divide by 255" in msg
    assert "no images to encode" in _error(lambda: enc.encode(torch.rand(0, 16, 16, 3), image_vae))


def test_core_vae_encode_of_a_tiny_image_names_its_size(image_vae):
    msg = _error(lambda: image_vae.encode(torch.rand(1, 4, 6, 3)))        # core's VAE Encode call
    assert "is 6x4 pixels, smaller than one latent pixel (8x8)" in msg and "0x0" not in msg


@pytest.mark.parametrize("samples, kw, expect", [
    (torch.zeros(0, 4, 4, 4), {}, "input 'samples': the latent holds no samples"),
    (torch.zeros(0, 4, 3, 2, 2), {}, "input 'samples': the latent holds no samples"),
    (torch.zeros(2, 4, 4, 4), dict(frames_per_chunk=0), "input 'frames_per_chunk'"),
])
def test_framewise_decode_raises_instead_of_returning_nothing(pack, image_vae, video_vae, samples, kw, expect):
    node = _node(pack, "VAEKitFramewiseDecode")
    vae = video_vae if samples.dim() == 5 else image_vae
    msg = _error(lambda: node.decode({"samples": samples}, vae, **kw))
    assert msg.startswith("Frame-wise Decode (VAEKit): ") and expect in msg


def test_framewise_decode_returns_an_image_for_one_latent(pack, image_vae):
    (images,) = _node(pack, "VAEKitFramewiseDecode").decode({"samples": torch.randn(1, 4, 4, 4)}, image_vae,
                                                            frames_per_chunk=4)
    assert torch.is_tensor(images) and images.shape == (1, 32, 32, 3)


# ---- every input of every node against its declaration (nodes/inputs.py) -------------------------

class _AnyVae:
    """Stands in for a VAE: the declaration check runs before the node looks at it."""


def _valid(decl):
    kind, opts = decl[0], (decl[1] if len(decl) > 1 else {})
    if isinstance(kind, list):
        return opts.get("default", kind[0] if kind else "x.safetensors")
    return {"LATENT": {"samples": torch.zeros(1, 4, 8, 8)}, "IMAGE": torch.zeros(1, 8, 8, 3), "VAE": _AnyVae(),
            "MASK": torch.zeros(1, 8, 8)}.get(kind, opts.get("default"))


def _bad_values(decl):
    """Values a client that skips ComfyUI's validation could send, each with what the message says."""
    kind, opts = decl[0], (decl[1] if len(decl) > 1 else {})
    out = [(None, "None" if isinstance(kind, str) and kind not in ("INT", "FLOAT", "BOOLEAN", "STRING") else "")]
    if isinstance(kind, list):
        out += [("not-a-choice", "is not one of its choices"), (3, "is not one of its choices")] if kind else []
    elif kind in ("INT", "FLOAT"):
        out += [("7", "is not a"), (True, "is not a"), (float("nan"), "finite")]
        out += [(opts["min"] - 1, "below its minimum")] if "min" in opts else []
        out += [(opts["max"] + 1, "above its maximum")] if "max" in opts else []
        out += [(1.5, "is not a whole number")] if kind == "INT" else []
    elif kind == "BOOLEAN":
        out += [("yes", "is not a boolean"), (2, "is not a boolean")]
    elif kind == "STRING":
        out += [(5, "is not a string")]
    return out


def _cases():
    from helpers import load_pack
    nodes = load_pack().NODE_CLASS_MAPPINGS
    for name, cls in nodes.items():
        cls = getattr(cls, "V1", cls)
        spec = cls.INPUT_TYPES()
        decls = {**spec.get("required", {}), **spec.get("optional", {})}
        for inp, decl in decls.items():
            if inp in getattr(cls, "FILE_INPUTS", ()):
                continue
            for value, says in _bad_values(decl):
                yield pytest.param(name, inp, value, says, id=f"{name}-{inp}-{value!r}")


@pytest.mark.parametrize("node, name, value, says", list(_cases()))
def test_every_declared_input_refuses_what_its_declaration_does_not_allow(pack, node, name, value, says):
    """Declaration-driven: an input added to a node (a new widget, a new option) is covered here."""
    cls = pack.NODE_CLASS_MAPPINGS[node]
    spec = cls.INPUT_TYPES()
    decls = {**spec.get("required", {}), **spec.get("optional", {})}
    kwargs = {k: _valid(d) for k, d in decls.items()}
    kwargs[name] = value
    msg = _error(lambda: getattr(cls(), cls.FUNCTION)(**kwargs))
    assert msg.startswith(f"{cls.DISPLAY_NAME}: input '{name}': ") and "Fix:" in msg and says in msg, msg


def test_unknown_and_missing_inputs(pack, image_vae):
    dec = _node(pack, "VAEKitTiledDecode")
    msg = _error(lambda: dec.decode({"samples": torch.zeros(1, 4, 8, 8)}, image_vae, tile=64))
    assert msg.startswith("Tiled Decode (VAEKit): input 'tile': VAEKitTiledDecode has no input 'tile'. Fix: its "
                          "inputs are 'samples', 'vae', 'tile_size'")
    assert "Tiled Decode (VAEKit): input 'vae': a required input is missing" in _error(
        lambda: dec.decode({"samples": torch.zeros(1, 4, 8, 8)}))


def test_exact_numbers_are_converted(pack, image_vae):
    """64.0 for an INT is 64 (ComfyUI converts too); the node runs."""
    (images,) = _node(pack, "VAEKitTiledDecode").decode({"samples": torch.randn(1, 4, 8, 8)}, image_vae,
                                                       tile_size=64.0, overlap=0.0)
    assert images.shape == (1, 64, 64, 3)


@pytest.mark.parametrize("device, says", [("quantum", "'quantum' is not one of its choices"),
                                          ("cuda", "CUDA is not available")])
def test_vae_load_devices(pack, device, says):
    if device == "cuda" and torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    msg = _error(lambda: _node(pack, "VAEKitLoad").load("anything.safetensors", "auto", device))
    assert msg.startswith("VAE Load (VAEKit): input 'device': ") and says in msg


@pytest.mark.parametrize("devices, says", [("gpu0,gpu1", "cannot read the device list"),
                                           ("meta,meta", "worker pools run on CUDA devices or CPUs"),
                                           ("cuda:0", "a pool needs two or more"),
                                           ("cpu,cuda:0", "mixes device types")])
def test_a_device_list_no_machine_can_run_is_refused(pack, image_vae, devices, says):
    """Absent devices (a workflow from a bigger machine) fall back to one device, said in the log
    (tests/nodes/test_devices_node.py); a list that cannot be right anywhere is an error."""
    msg = _error(lambda: _node(pack, "VAEKitTiledDecode").decode({"samples": torch.randn(1, 4, 8, 8)}, image_vae,
                                                                 devices=devices))
    assert msg.startswith("Tiled Decode (VAEKit): input 'devices': ") and says in msg


def test_the_v3_classes_check_through_the_same_declaration(pack, image_vae):
    """nodes/v3.py builds V3 classes whose execute runs the V1 function: the same checks (a minimal
    stand-in for comfy_api's io module; the real one: tests/nodes/test_v3.py with a ComfyUI)."""
    import types
    from vaekit.nodes.v3 import as_v3

    class _Input:
        def __init__(self, name, optional=False, **kw):
            self.name, self.extra_dict = name, {}

    io = types.SimpleNamespace(
        ComfyNode=type("ComfyNode", (), {}), Schema=lambda **kw: kw, NodeOutput=lambda *a, **kw: a,
        Combo=types.SimpleNamespace(Input=_Input), **{k: types.SimpleNamespace(Input=_Input, Output=lambda **kw: kw)
                                                      for k in ("Latent", "Vae", "Image", "Mask", "Int", "Float",
                                                                "Boolean", "String")})
    node = pack.NODE_CLASS_MAPPINGS["VAEKitTiledDecode"]
    v3 = as_v3(node, io)
    spec = node.INPUT_TYPES()
    assert len(v3.define_schema()["inputs"]) == len(spec["required"]) + len(spec["optional"])
    msg = _error(lambda: v3.execute(samples={"samples": torch.randn(1, 4, 8, 8)}, vae=image_vae, tile_size=64,
                                    overlap=0, temporal_size=64, temporal_overlap=8, mode=None))
    assert msg.startswith("Tiled Decode (VAEKit): input 'mode': None is not one of its choices")
    (images,) = v3.execute(samples={"samples": torch.randn(1, 4, 8, 8)}, vae=image_vae, tile_size=64, overlap=0,
                           temporal_size=64, temporal_overlap=8)
    assert images.shape == (1, 64, 64, 3)


class _CascadeLikeCoreVAE:
    """A core comfy.sd.VAE whose encoder compresses 32x and whose decoder expands 8x, as core's Stable
    Cascade Stage C (EfficientNet encoder, previewer decoder); local, so tiles equal one pass."""
    first_stage_model = torch.nn.Identity()
    latent_channels, output_channels = 3, 3

    def get_sd(self):
        return {}                            # not a VAE VAEKit implements: tiled through these calls

    def spacial_compression_encode(self):
        return 32

    def spacial_compression_decode(self):
        return 8

    def encode(self, pixels):                # IMAGE [B, H, W, C] -> latent [B, C, H/32, W/32]
        return torch.nn.functional.avg_pool2d(pixels.movedim(-1, 1), 32)

    def decode(self, z):                     # latent -> IMAGE [B, 8h, 8w, C]
        return torch.nn.functional.interpolate(z, scale_factor=8).movedim(1, -1)


def test_a_core_vae_that_encodes_and_decodes_at_different_ratios_tiles_both_ways(pack):
    """Each direction is planned with its own ratio (encode tiles planned with the decode ratio fail with
    'tile function returned (1, 16, 2, 2), expected (1, 16, 8, 8)' on core's Stage C)."""
    core = _CascadeLikeCoreVAE()
    x = torch.rand(1, 256, 192, 3)
    (lat,) = _node(pack, "VAEKitTiledEncode").encode(x, core, tile_size=64, overlap=0, mode="fast")
    assert torch.allclose(lat["samples"], core.encode(x), atol=1e-6)
    (img,) = _node(pack, "VAEKitTiledDecode").decode(lat, core, tile_size=64, overlap=0, mode="fast")
    assert torch.allclose(img, core.decode(lat["samples"]), atol=1e-6)
