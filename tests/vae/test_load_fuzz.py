"""Malformed weights, per family: only LoadError escapes vae.load / vae.from_state_dict, and the
message names the file and a fix. The cases are tests/fuzz_cases.py's (deterministic seeds); the
default run takes each state-dict mutation once per family and shares the file mutations out
among the families (every one runs for some family; truncation and random bytes for all).
``-m slow`` runs every repeat and every file case for every family."""
from __future__ import annotations

import logging

import pytest
import torch

import vae
from fuzz_cases import _all_file_cases, families, file_cases, state_dict_cases

pytestmark = pytest.mark.usefixtures("one_thread")     # tests/conftest.py
FAMILIES = list(families())


@pytest.fixture(scope="module")
def state_dicts():
    return {f: make() for f, make in families().items()}


def _escapes(sd, seed, tmp_path, full: bool) -> list[str]:
    """Every case whose outcome is not 'loaded' or a LoadError naming the file with a fix."""
    bad = []
    for label, case in state_dict_cases(sd, seed, max_repeats=99 if full else 1):
        try:
            vae.from_state_dict(case)
        except vae.LoadError as e:
            if "Fix:" not in str(e):
                bad.append(f"{label}: no fix in {e}")
        except Exception as e:   # noqa: BLE001
            bad.append(f"{label}: {type(e).__name__}: {e}")
    cases = _all_file_cases(sd, seed) if full else file_cases(sd, seed, (seed, len(FAMILIES)))
    for i, (label, suffix, data) in enumerate(cases):
        path = tmp_path / f"fuzzed_{i}{suffix}"
        path.write_bytes(data)
        try:
            vae.load(path)
        except vae.LoadError as e:
            if path.name not in str(e) or "Fix:" not in str(e):
                bad.append(f"{label}: file or fix not named in {e}")
        except Exception as e:   # noqa: BLE001
            bad.append(f"{label}: {type(e).__name__}: {e}")
        path.unlink()
    return bad


@pytest.mark.parametrize("family", FAMILIES)
def test_only_load_errors_escape(family, state_dicts, tmp_path):
    logging.disable(logging.WARNING)     # the NaN cases warn; their warning has its own test
    try:
        assert _escapes(state_dicts[family], FAMILIES.index(family), tmp_path, full=False) == []
    finally:
        logging.disable(logging.NOTSET)


@pytest.mark.slow
@pytest.mark.parametrize("family", FAMILIES)
def test_only_load_errors_escape_every_case(family, state_dicts, tmp_path):
    logging.disable(logging.WARNING)
    try:
        assert _escapes(state_dicts[family], FAMILIES.index(family), tmp_path, full=True) == []
    finally:
        logging.disable(logging.NOTSET)


def test_every_file_case_runs_for_some_family(state_dicts):
    sd = state_dicts["tiny"]
    every = [label for label, _, _ in _all_file_cases(sd, 0)]
    shared = [label for i in range(len(FAMILIES)) for label, _, _ in file_cases(sd, 0, (i, len(FAMILIES)))]
    assert set(shared) == set(every)


# ---- the messages of the common cases --------------------------------------------------------

def _save(sd, path):
    from safetensors.torch import save_file
    save_file({k: v.contiguous() for k, v in sd.items()}, str(path))
    return path


def _message(fn) -> str:
    with pytest.raises(vae.LoadError) as e:
        fn()
    return str(e.value)


def test_missing_key_is_named_with_the_family(state_dicts):
    sd = dict(state_dicts["kl"])
    del sd["encoder.conv_out.weight"]
    msg = _message(lambda: vae.from_state_dict(sd, source="'sd.safetensors'"))
    assert ("'sd.safetensors' looks like AutoencoderKL but its encoder is incomplete: 1 tensor(s) missing "
            "('encoder.conv_out.weight') while 51 of its tensors are here") in msg


def test_odd_shape_names_the_tensor_it_tripped_on(state_dicts):
    sd = dict(state_dicts["consistency"])
    key = "decoder_unet.down_blocks.1.resnets.0.conv1.weight"
    sd[key] = torch.tensor(1.0)
    msg = _message(lambda: vae.from_state_dict(sd))
    assert f"at tensor '{key}' (shape [], float32): IndexError" in msg


def test_shape_mismatch_says_what_the_model_takes(state_dicts):
    sd = dict(state_dicts["tiny"])
    sd["decoder.layers.0.bias"] = torch.zeros(5)
    msg = _message(lambda: vae.from_state_dict(sd))
    assert "with another shape ('taesd_decoder.1.bias' is [5], the model takes [" in msg


def test_integer_and_complex_weights_are_refused(state_dicts, tmp_path):
    sd = dict(state_dicts["magvit"])
    sd["decoder.conv_out.bias"] = sd["decoder.conv_out.bias"].to(torch.int64)
    msg = _message(lambda: vae.load(_save(sd, tmp_path / "int.safetensors")))
    assert "'int.safetensors' holds 1 weight(s) that are int64 (not floating point): 'decoder.conv_out.bias'" in msg
    sd["decoder.conv_out.bias"] = torch.zeros(3, dtype=torch.complex64)
    assert "complex" in _message(lambda: vae.from_state_dict(sd))


def test_a_few_nonfinite_weights_warn_with_their_names(state_dicts, caplog):
    sd = dict(state_dicts["tiny"])
    w = sd["decoder.layers.0.bias"].clone()
    w[0] = float("nan")
    sd["decoder.layers.0.bias"] = w
    with caplog.at_level(logging.WARNING, logger="VAEKit"):
        v = vae.from_state_dict(sd)
    assert v.spec.id == "tiny"
    assert any("1 NaN/Inf weight value(s) in 'taesd_decoder.1.bias' (1 of" in r.getMessage() for r in caplog.records)


def test_many_nonfinite_weights_are_refused(state_dicts):
    sd = dict(state_dicts["tiny"])
    sd["decoder.layers.0.bias"] = torch.full_like(sd["decoder.layers.0.bias"], float("inf"))
    msg = _message(lambda: vae.from_state_dict(sd))
    assert "1 tensor(s) entirely NaN/Inf ('taesd_decoder.1.bias')" in msg
    sd = {k: v.clone() for k, v in state_dicts["tiny"].items()}
    for v in sd.values():            # 2% of every tensor: no tensor whole, but too many to be of use
        v.view(-1)[: max(1, v.numel() // 50)] = float("nan")
    assert "of its values" in _message(lambda: vae.from_state_dict(sd))


def test_malformed_header_names_the_tensor_and_the_field(state_dicts, tmp_path):
    import json
    import struct
    data = _save(state_dicts["tiny"], tmp_path / "ok.safetensors").read_bytes()
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + n])
    name = sorted(k for k in header if k != "__metadata__")[0]
    del header[name]["data_offsets"]
    text = json.dumps(header).encode()
    bad = tmp_path / "vae.safetensors"
    bad.write_bytes(struct.pack("<Q", len(text)) + text + data[8 + n:])
    assert f"'vae.safetensors' has a malformed header: tensor '{name}' has no 'data_offsets'" in \
        _message(lambda: vae.load(bad))


def test_random_bytes_are_corrupt_not_a_pickle_that_runs_code(tmp_path):
    import random
    rng = random.Random(0)
    for name, head in (("random.pth", b""), ("random_pickle.ckpt", b"\x80\x02")):
        path = tmp_path / name
        path.write_bytes(head + bytes(rng.randrange(256) for _ in range(4000)))
        msg = _message(lambda: vae.load(path))
        assert "could run code" not in msg and "download" in msg
        assert ("not a PyTorch weights file" if not head else "pickle data is corrupt") in msg


def test_pickle_with_code_names_what_it_imports(tmp_path):
    class RunsCode:
        def __reduce__(self):
            return (print, ("never printed",))
    path = tmp_path / "evil.pth"
    torch.save({"w": torch.zeros(2), "x": RunsCode()}, path)
    msg = _message(lambda: vae.load(path))
    assert "refused to load 'evil.pth'" in msg and "builtin" in msg and ".print" in msg and "safetensors" in msg


@pytest.mark.parametrize("content, expect", [
    (b"<!DOCTYPE html><html><body>Sign in</body></html>", "it is a web page (HTML)"),
    (b"version https://git-lfs.github.com/spec/v1\noid sha256:" + b"0" * 64 + b"\nsize 3\n", "git lfs pull"),
    (b"\x89PNG\r\n\x1a\n" + bytes(64), "it is a PNG image"),
])
def test_what_a_file_really_is(tmp_path, content, expect):
    for suffix in (".safetensors", ".pth"):
        path = tmp_path / f"vae{suffix}"
        path.write_bytes(content)
        assert expect in _message(lambda: vae.load(path))


def test_formats_under_the_other_extension_get_a_rename(state_dicts, tmp_path):
    sft = _save(state_dicts["tiny"], tmp_path / "a.safetensors")
    (tmp_path / "a.pth").write_bytes(sft.read_bytes())
    assert "is a safetensors file with a .pth name. Fix: rename it to .safetensors" in \
        _message(lambda: vae.load(tmp_path / "a.pth"))
    torch.save(state_dicts["tiny"], tmp_path / "b.pth")
    (tmp_path / "b.safetensors").write_bytes((tmp_path / "b.pth").read_bytes())
    assert "is not a safetensors file: it is a zip archive" in _message(lambda: vae.load(tmp_path / "b.safetensors"))


# ---- a part absent (a half-file: loads) vs a part damaged (refused, naming what is missing) ------

def _canonical(sd):
    return {k: v.clone() for k, v in vae.from_state_dict(sd).state_dict().items()}


def _sample(sd, seed: int) -> list[str]:
    """Per part (first name of the key), its first weight (what a family reads to decide the part is
    there) and one other key, deterministically."""
    import random
    from fuzz_cases import _parts
    rng, keys = random.Random(seed), []
    for part in _parts(sd).values():
        first = next((k for k in part if k.endswith(".weight")), part[0])
        keys += [first] + rng.sample([k for k in part if k != first], min(1, len(part) - 1))
    return keys


@pytest.mark.parametrize("family", FAMILIES)
def test_a_damaged_part_names_what_is_missing(family, state_dicts):
    """One key dropped from the canonical layout: a LoadError naming it. A module whose only tensor it
    was (a bias-less conv) is gone whole, and the keys then read as another structure: that is refused
    too, saying which part is incomplete. A counter the model fills in (BatchNorm's) may be absent."""
    sd = _canonical(state_dicts[family])
    bad = []
    for key in _sample(sd, FAMILIES.index(family)):
        case = {k: v for k, v in sd.items() if k != key}
        try:
            vae.from_state_dict(case)
        except vae.LoadError as e:
            stem = key.rsplit(".", 1)[0]
            alone = not any(k.startswith(stem + ".") for k in case)
            if key not in str(e) and not (alone and "is incomplete" in str(e)):
                bad.append(f"{key}: {e}")
            continue
        if not key.endswith("num_batches_tracked") and not _filled_in(sd, key):
            bad.append(f"{key}: loaded")
    assert bad == []


def _filled_in(sd, key: str) -> bool:
    """Whether the family's ``complete_state_dict`` puts ``key`` back when a file leaves it out (tensors the
    format leaves implicit, e.g. MiniMax H3's published latent statistics, which its fp16 files lack)."""
    spec = vae.registry.detect(sd)
    kw = {"metadata": {}} if spec.reads_metadata else {}
    config = spec.config_from_state_dict(sd, None, **kw)
    return key in spec.complete_state_dict({k: v for k, v in sd.items() if k != key}, config)


def test_the_message_counts_what_is_here(state_dicts):
    sd = _canonical(state_dicts["hunyuan_video15"])
    del sd["decoder.conv_in.weight"]           # what the family reads to decide there is a decoder
    msg = _message(lambda: vae.from_state_dict(sd, source="'hv.safetensors'"))
    held = sum(k.startswith("decoder.") for k in sd)
    assert (f"'hv.safetensors' looks like HunyuanVideo 1.5 VAE (32 latent channels, encoder only) but its decoder is "
            f"incomplete: 1 tensor(s) missing ('decoder.conv_in.weight') while {held} of its tensors are here") in msg


@pytest.mark.parametrize("family, part, can", [("kl", "decoder", "can_encode"), ("wan", "encoder", "can_decode"),
                                               ("mochi", "decoder", "can_encode"),
                                               ("hunyuan_video15", "encoder", "can_decode")])
def test_an_absent_half_loads_as_a_half_file(family, part, can, state_dicts):
    for sd in (state_dicts[family], _canonical(state_dicts[family])):
        half = {k: v for k, v in sd.items() if not k.startswith(part + ".") and not k.startswith(
            "post_quant_conv." if part == "decoder" else "quant_conv.")}
        v = vae.from_state_dict(half)
        assert getattr(v.caps, can) and not getattr(v.caps, "can_decode" if part == "decoder" else "can_encode")


def test_a_mochi_half_without_its_first_tensors_is_not_read_as_absent(state_dicts):
    """genmo's layout: the decoder's first conv missing is a damaged decoder, not an encoder-only file
    (dropping the half's keys would load the encoder alone, silently)."""
    sd = _canonical(state_dicts["mochi"])
    del sd["decoder.blocks.0.0.weight"]
    assert "'decoder.blocks.0.0.weight'" in _message(lambda: vae.from_state_dict(sd))


@pytest.mark.parametrize("family, drop", [
    ("hunyuan_video", "encoder.down.0.downsample."),       # a resampler (weight and bias) out of one half
    ("hunyuan_video15", "decoder.up.4.upsample."),
])
def test_halves_that_compress_differently_are_refused(family, drop, state_dicts):
    sd = {k: v for k, v in _canonical(state_dicts[family]).items() if not k.startswith(drop)}
    msg = _message(lambda: vae.from_state_dict(sd))
    assert "which compresses" in msg and "tensors of a resampler (or another block) are missing" in msg


def test_an_optional_encoder_without_its_levels(state_dicts):
    """The Consistency Decoder's optional KL encoder, its down levels gone: refused (it would read as a
    1x encoder)."""
    sd = {k: v for k, v in state_dicts["consistency"].items() if not k.startswith("encoder.down_blocks.")}
    assert "has no tensor 'encoder.down.0.block.0.conv1.weight' (its encoder is incomplete" in \
        _message(lambda: vae.from_state_dict(sd))


def test_ltx_statistics_without_the_two_it_reads(state_dicts):
    """The original layout keeps five statistics; the VAE reads two. Some without those two is damage
    (none at all: a file without statistics, which loads)."""
    from ltx_common import original_layout
    sd = original_layout(_canonical(state_dicts["ltx"]))
    assert len([k for k in sd if k.startswith("per_channel_statistics.")]) == 5
    del sd["per_channel_statistics.std-of-means"]
    assert "has no tensor 'per_channel_statistics.std-of-means'" in _message(lambda: vae.from_state_dict(sd))
    vae.from_state_dict({k: v for k, v in sd.items() if not k.startswith("per_channel_statistics.")})


def test_a_damaged_file_of_a_taesd_pair(state_dicts, tmp_path):
    from vae.archs.tiny import DEC, ENC
    sd = _canonical(state_dicts["tiny"])
    enc = {k[len(ENC) + 1:]: v for k, v in sd.items() if k.startswith(ENC + ".")}
    dec = {k[len(DEC) + 1:]: v for k, v in sd.items() if k.startswith(DEC + ".")}
    torch.save(enc, tmp_path / "taesd_encoder.pth")
    del dec["1.bias"], dec["3.conv.2.weight"]
    torch.save(dec, tmp_path / "taesd_decoder.pth")
    msg = _message(lambda: vae.load(tmp_path / "taesd"))
    assert "taesd decoder is incomplete: 2 tensor(s) missing (" in msg and "47 of its tensors are here" in msg
    assert "'taesd_decoder.1.bias'" in msg and "'taesd_decoder.3.conv.2.weight'" in msg
    (tmp_path / "taesd_decoder.pth").unlink()                       # the encoder alone: a half-file
    assert vae.load(tmp_path / "taesd").caps.can_encode


def test_a_folder_where_the_file_should_be(tmp_path):
    (tmp_path / "vae.safetensors").mkdir()
    (tmp_path / "vae.safetensors" / "diffusion_pytorch_model.safetensors").write_bytes(b"")
    msg = _message(lambda: vae.load(tmp_path / "vae.safetensors"))
    assert "is a folder, not a file. It holds 'diffusion_pytorch_model.safetensors'" in msg and "no file at" not in msg
