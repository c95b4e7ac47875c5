"""Malformed but plausible weights, generated deterministically from a family's tiny state dict:
dropped, renamed and swapped keys, sub-models dropped whole (a half-file) or in part (a damaged one),
wrong dtypes and shapes, non-finite and non-tensor values (in memory, for ``vae.from_state_dict``),
and malformed safetensors headers, truncations, bit flips, random bytes and mislabelled files (on
disk, for ``vae.load``).

``python3 tests/fuzz_cases.py`` prints, per family, how many cases end in which exception type."""
from __future__ import annotations

import io
import json
import random
import struct
from collections import Counter
from pathlib import Path
from typing import Callable, Iterator

import torch
from safetensors.torch import save as save_safetensors

Sd = dict


# ---- in-memory state dicts -----------------------------------------------------------------------

def _key(sd: Sd, rng: random.Random) -> str:
    return rng.choice(sorted(k for k in sd if isinstance(k, str)))


def _drop(n_frac: float):
    def f(sd, rng):
        for k in rng.sample(sorted(sd), max(1, int(len(sd) * n_frac))):
            del sd[k]
        return sd
    return f


def _drop_module(sd, rng):
    prefix = _key(sd, rng).rsplit(".", 2)[0] + "."
    return {k: v for k, v in sd.items() if not k.startswith(prefix)}


def _parts(sd) -> dict[str, list[str]]:
    """Keys by sub-model (their first name: encoder, decoder, quant_conv, bn, ...)."""
    parts: dict[str, list[str]] = {}
    for k in sorted(x for x in sd if isinstance(x, str)):
        parts.setdefault(k.split(".", 1)[0], []).append(k)
    return parts


def _drop_part(sd, rng):
    """A whole sub-model absent (an encoder-only or decoder-only file, a file without statistics):
    it loads as such or is refused, never half-built."""
    drop = set(rng.choice(sorted(_parts(sd).values())))
    return {k: v for k, v in sd.items() if k not in drop}


def _drop_in_part(share: float):
    """Some keys of a present sub-model missing (a damaged half): refused, naming them."""
    def f(sd, rng):
        keys = rng.choice([ks for ks in _parts(sd).values() if len(ks) > 1] or list(_parts(sd).values()))
        drop = set(rng.sample(keys, min(len(keys) - 1, max(1, int(len(keys) * share)))) or keys[:1])
        return {k: v for k, v in sd.items() if k not in drop}
    return f


def _drop_first(sd, rng):
    """The first tensor of a sub-model (sorted: e.g. its conv_in), the one a family reads to decide that
    the sub-model is there: without it the rest must not be read as an absent half."""
    keys = rng.choice([ks for ks in _parts(sd).values() if len(ks) > 1] or list(_parts(sd).values()))
    first = next((k for k in keys if k.endswith(".weight")), keys[0])
    return {k: v for k, v in sd.items() if k != first}


def _rename(sd, rng):
    k = _key(sd, rng)
    parts = k.split(".")
    i = rng.randrange(len(parts))
    p = parts[i]
    parts[i] = str((int(p) + rng.randint(1, 3)) % 10) if p.isdigit() else p[: max(1, len(p) - 1)] + rng.choice("xz_")
    sd[".".join(parts)] = sd.pop(k)
    return sd


def _swap(sd, rng):
    a, b = rng.sample(sorted(sd), 2)
    sd[a], sd[b] = sd[b], sd[a]
    return sd


def _dtype(dtype):
    def f(sd, rng):
        k = _key(sd, rng)
        sd[k] = sd[k].to(dtype) if dtype != torch.complex64 else torch.complex(sd[k], sd[k])
        return sd
    return f


def _shape(how: str):
    def f(sd, rng):
        k = _key(sd, rng)
        v = sd[k]
        sd[k] = {"flatten": lambda: v.flatten(),
                 "unsqueeze": lambda: v.unsqueeze(0),
                 "squeeze-last": lambda: v.reshape(*v.shape[:-1], -1)[..., :1].squeeze(-1) if v.dim() else v.reshape(1),
                 "first-dim-1": lambda: v[:1].clone() if v.dim() else v.reshape(1, 1),
                 "first-dim-0": lambda: v[:0].clone() if v.dim() else torch.zeros(0),
                 "scalar": lambda: v.flatten()[0].clone() if v.numel() else torch.tensor(1.0),
                 "transpose": lambda: v.transpose(0, -1).contiguous() if v.dim() > 1 else v.reshape(1, -1),
                 "double-first": lambda: torch.cat([v, v]) if v.dim() else v.reshape(1).repeat(2)}[how]()
        return sd
    return f


def _nonfinite(share: float, value: float):
    def f(sd, rng):
        keys = sorted(k for k, v in sd.items() if v.is_floating_point() and v.numel())
        for k in rng.sample(keys, max(1, int(len(keys) * share))):
            v = sd[k].clone()
            flat = v.view(-1)
            flat[rng.randrange(flat.numel())] = value
            if share >= 0.5:
                v.fill_(value)
            sd[k] = v
        return sd
    return f


def _replace_value(value):
    def f(sd, rng):
        sd[_key(sd, rng)] = value() if callable(value) else value
        return sd
    return f


def _meta(sd, rng):
    k = _key(sd, rng)
    sd[k] = torch.empty(sd[k].shape, device="meta")
    return sd


def _sparse(sd, rng):
    k = _key(sd, rng)
    sd[k] = sd[k].to_sparse()
    return sd


def _int_key(sd, rng):
    sd[7] = sd[_key(sd, rng)]
    return sd


def _prefix_all(sd, rng):
    return {f"junk.{k}": v for k, v in sd.items()}


def _keep_one(sd, rng):
    k = _key(sd, rng)
    return {k: sd[k]}


def _empty(sd, rng):
    return {}


SD_MUTATIONS: tuple[tuple[str, Callable, int], ...] = (
    # (label, mutation, repeats with different seeds)
    ("drop 1 key", _drop(0.0), 12),
    ("drop 5% of keys", _drop(0.05), 4),
    ("drop a module", _drop_module, 6),
    ("drop a whole part", _drop_part, 4),
    ("drop one key of a part", _drop_in_part(0.0), 4),
    ("drop a third of a part", _drop_in_part(0.33), 3),
    ("drop a part's first weight", _drop_first, 4),
    ("rename a key", _rename, 8),
    ("swap two tensors", _swap, 4),
    ("int64 weight", _dtype(torch.int64), 2),
    ("uint8 weight", _dtype(torch.uint8), 1),
    ("bool weight", _dtype(torch.bool), 1),
    ("complex weight", _dtype(torch.complex64), 1),
    ("float16 weight", _dtype(torch.float16), 1),
    ("flattened tensor", _shape("flatten"), 3),
    ("extra leading dim", _shape("unsqueeze"), 2),
    ("last dim dropped", _shape("squeeze-last"), 2),
    ("first dim cut to 1", _shape("first-dim-1"), 3),
    ("empty tensor", _shape("first-dim-0"), 3),
    ("scalar tensor", _shape("scalar"), 2),
    ("transposed tensor", _shape("transpose"), 2),
    ("first dim doubled", _shape("double-first"), 2),
    ("one NaN", _nonfinite(0.0, float("nan")), 1),
    ("all NaN", _nonfinite(0.5, float("nan")), 1),
    ("Inf filling many tensors", _nonfinite(0.5, float("inf")), 1),
    ("a float value", _replace_value(0.5), 1),
    ("a string value", _replace_value("weights"), 1),
    ("a None value", _replace_value(None), 1),
    ("a nested dict value", _replace_value(lambda: {"w": torch.zeros(2)}), 1),
    ("meta tensor", _meta, 2),
    ("sparse tensor", _sparse, 1),
    ("integer key", _int_key, 1),
    ("junk prefix on every key", _prefix_all, 1),
    ("one key only", _keep_one, 1),
    ("empty dict", _empty, 1),
)


def state_dict_cases(sd: Sd, seed: int, max_repeats: int = 99) -> Iterator[tuple[str, Sd]]:
    for i, (label, mutate, repeats) in enumerate(SD_MUTATIONS):
        for r in range(min(repeats, max_repeats)):
            rng = random.Random(seed * 1000 + i * 37 + r)
            yield f"{label} #{r}", mutate(dict(sd), rng)


# ---- files -------------------------------------------------------------------------------------

def _split(data: bytes) -> tuple[dict, bytes]:
    n = struct.unpack("<Q", data[:8])[0]
    return json.loads(data[8:8 + n]), data[8 + n:]


def _join(header, body: bytes, raw: bytes | None = None) -> bytes:
    text = raw if raw is not None else json.dumps(header).encode()
    return struct.pack("<Q", len(text)) + text + body


def _entry(header: dict, rng: random.Random) -> str:
    return rng.choice(sorted(k for k in header if k != "__metadata__"))


def _header_edit(edit: Callable[[dict, random.Random], object]):
    def f(data: bytes, rng: random.Random) -> bytes:
        header, body = _split(data)
        raw = edit(header, rng)
        return _join(header, body, raw if isinstance(raw, bytes) else None)
    return f


def _set(field: str, value):
    def edit(header, rng):
        e = header[_entry(header, rng)]
        if value is KeyError:
            del e[field]
        else:
            e[field] = value(e) if callable(value) else value
    return edit


def _offsets_overlap(header, rng):
    entries = sorted((k for k in header if k != "__metadata__"), key=lambda k: header[k]["data_offsets"][0])
    i = rng.randrange(1, len(entries))
    a, b = header[entries[i - 1]]["data_offsets"], header[entries[i]]["data_offsets"]
    n = b[1] - b[0]
    b[0] = a[0]
    b[1] = a[0] + n


def _whole_header(value):
    def edit(header, rng):
        return json.dumps(value).encode() if not isinstance(value, bytes) else value
    return edit


HEADER_MUTATIONS = (
    ("data_offsets missing", _set("data_offsets", KeyError)),
    ("dtype missing", _set("dtype", KeyError)),
    ("shape missing", _set("shape", KeyError)),
    ("unknown dtype", _set("dtype", "F99")),
    ("integer dtype", _set("dtype", "I32")),
    ("dtype not a string", _set("dtype", 7)),
    ("negative shape", _set("shape", lambda e: [-1] + e["shape"][1:])),
    ("shape of strings", _set("shape", lambda e: [str(s) for s in e["shape"]])),
    ("shape not a list", _set("shape", 12)),
    ("shape too big for its bytes", _set("shape", lambda e: [s * 2 for s in e["shape"]] or [2])),
    ("offsets reversed", _set("data_offsets", lambda e: e["data_offsets"][::-1])),
    ("offsets past the end", _set("data_offsets", lambda e: [e["data_offsets"][0], e["data_offsets"][1] + 10 ** 9])),
    ("offsets negative", _set("data_offsets", lambda e: [-8, e["data_offsets"][1]])),
    ("offsets of floats", _set("data_offsets", lambda e: [float(x) + 0.5 for x in e["data_offsets"]])),
    ("offsets one number", _set("data_offsets", lambda e: e["data_offsets"][:1])),
    ("offsets overlap", _offsets_overlap),
    ("entry not an object", lambda h, rng: h.__setitem__(_entry(h, rng), [1, 2, 3])),
    ("metadata not an object", lambda h, rng: h.__setitem__("__metadata__", ["x"])),
    ("header is a list", _whole_header([1, 2])),
    ("header is a number", _whole_header(3)),
    ("header not UTF-8", _whole_header(b"{\"\xff\xfe\": 1}")),
    ("header not JSON", _whole_header(b"{not json")),
    ("header empty object", _whole_header({})),
)


def _truncate(frac: float):
    return lambda data, rng: data[: int(len(data) * frac) + rng.randrange(8)]


def _length_field(delta: int):
    return lambda data, rng: struct.pack("<Q", max(0, struct.unpack("<Q", data[:8])[0] + delta)) + data[8:]


def _flip(region: str, n: int):
    def f(data: bytes, rng: random.Random) -> bytes:
        b = bytearray(data)
        hi = struct.unpack("<Q", data[:8])[0] + 8 if region == "header" and data[:1] != b"P" else len(b)
        for _ in range(n):
            i = rng.randrange(min(hi, len(b)))
            b[i] ^= 1 << rng.randrange(8)
        return bytes(b)
    return f


def _random_bytes(n: int):
    return lambda data, rng: bytes(rng.randrange(256) for _ in range(n))


def _zip_garbage_pickle(data: bytes, rng: random.Random) -> bytes:
    """A torch zip whose data.pkl is replaced by random bytes of the same length (the archive stays valid)."""
    import zipfile
    src = zipfile.ZipFile(io.BytesIO(data))
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as dst:
        for info in src.infolist():
            body = src.read(info)
            if info.filename.endswith("data.pkl"):
                body = bytes(rng.randrange(256) for _ in body)
            dst.writestr(info, body)
    return out.getvalue()


SAFETENSORS_MUTATIONS = (
    *((f"header: {label}", _header_edit(edit)) for label, edit in HEADER_MUTATIONS),
    ("truncated at 10%", _truncate(0.1)), ("truncated at 60%", _truncate(0.6)),
    ("truncated at 99.9%", _truncate(0.999)),
    ("truncated inside the length field", lambda data, rng: data[:5]),
    ("header length +1", _length_field(1)), ("header length -1", _length_field(-1)),
    ("header length 2**60", lambda data, rng: struct.pack("<Q", 2 ** 60) + data[8:]),
    ("bit flips in the header", _flip("header", 3)), ("bit flips anywhere", _flip("any", 20)),
    ("random bytes", _random_bytes(4096)), ("empty file", lambda data, rng: b""),
)
PICKLE_MUTATIONS = (
    ("truncated at 30%", _truncate(0.3)), ("truncated at 99%", _truncate(0.99)),
    ("bit flips", _flip("any", 20)), ("garbage data.pkl in a valid zip", _zip_garbage_pickle),
    ("random bytes", _random_bytes(4096)), ("random bytes after a pickle opcode", lambda d, rng: b"\x80\x02" +
                                            bytes(rng.randrange(256) for _ in range(2000))),
    ("empty file", lambda data, rng: b""),
)


def file_cases(sd: Sd, seed: int, share: tuple[int, int] = (0, 1)) -> Iterator[tuple[str, str, bytes]]:
    """(label, file suffix, bytes). ``share`` (i, n): only every n-th case from the i-th, so n
    families together cover every case once (truncations and random bytes go to every family)."""
    for k, case in enumerate(_all_file_cases(sd, seed)):
        if k % share[1] == share[0] % share[1] or case[0].startswith(("truncated at 60%", "random bytes")):
            yield case


def _all_file_cases(sd: Sd, seed: int) -> Iterator[tuple[str, str, bytes]]:
    sd = {k: v.contiguous() for k, v in sd.items()}
    sft = save_safetensors(sd)
    buf = io.BytesIO()
    torch.save(sd, buf)
    pth = buf.getvalue()
    buf = io.BytesIO()
    torch.save(sd, buf, _use_new_zipfile_serialization=False)
    legacy = buf.getvalue()
    for i, (label, mutate) in enumerate(SAFETENSORS_MUTATIONS):
        yield label, ".safetensors", mutate(sft, random.Random(seed * 1000 + i))
    for i, (label, mutate) in enumerate(PICKLE_MUTATIONS):
        rng = random.Random(seed * 1000 + 500 + i)
        yield f"pth {label}", ".pth", mutate(pth, rng)
        if "zip" not in label:
            yield f"legacy ckpt {label}", ".ckpt", mutate(legacy, rng)
    yield "safetensors bytes named .pth", ".pth", sft
    yield "pth bytes named .safetensors", ".safetensors", pth
    yield "a PNG named .safetensors", ".safetensors", b"\x89PNG\r\n\x1a\n" + bytes(200)
    yield "a web page named .safetensors", ".safetensors", b"<!DOCTYPE html><html><body>Sign in</body></html>"
    yield "a Git LFS pointer", ".safetensors", (b"version https://git-lfs.github.com/spec/v1\n"
                                                 b"oid sha256:" + b"0" * 64 + b"\nsize 334643268\n")


# ---- running them ------------------------------------------------------------------------------

def families() -> dict[str, Callable[[], Sd]]:
    """Family id -> its tiny state dict (diffusers layout), as the other tests build them."""
    from helpers import diffusers_hunyuan_image21, diffusers_kl, diffusers_tiny, hunyuan_image3_file
    from video_families import FAMILIES, tiny_state_dict

    def consistency():
        import diffusers
        torch.manual_seed(0)
        return diffusers.ConsistencyDecoderVAE(
            encoder_block_out_channels=(32,) * 4, encoder_down_block_types=("DownEncoderBlock2D",) * 4,
            encoder_layers_per_block=1, decoder_block_out_channels=(32, 32), decoder_layers_per_block=1,
            decoder_down_block_types=("ResnetDownsampleBlock2D",) * 2,
            decoder_up_block_types=("ResnetUpsampleBlock2D",) * 2).state_dict()

    def flux2():
        import diffusers_flux2
        return diffusers_flux2.model().state_dict()

    out = {"kl": lambda: diffusers_kl().state_dict(), "tiny": lambda: diffusers_tiny().state_dict(),
           "consistency": consistency, "flux2": flux2,
           "hunyuan_image21": lambda: diffusers_hunyuan_image21().state_dict(), "hunyuan_image3": hunyuan_image3_file}
    out.update({f: (lambda f=f: tiny_state_dict(f)) for f in FAMILIES})
    return out


def outcome(fn: Callable[[], object]) -> str:
    """'ok', or the name of the exception type ``fn`` raised."""
    import warnings
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            fn()
    except Exception as e:   # noqa: BLE001 (that is the point: every type is counted)
        return type(e).__name__
    return "ok"


def run_family(sd: Sd, seed: int, tmp: Path) -> Counter:
    """Every case (all repeats, all file cases): what ``python3 tests/fuzz_cases.py`` prints."""
    import vae
    counts: Counter = Counter()
    for label, case in state_dict_cases(sd, seed):
        counts[("state dict", outcome(lambda: vae.from_state_dict(case)))] += 1
    for i, (label, suffix, data) in enumerate(_all_file_cases(sd, seed)):
        path = tmp / f"case{i}{suffix}"
        path.write_bytes(data)
        counts[("file", outcome(lambda: vae.load(path)))] += 1
        path.unlink()
    return counts


if __name__ == "__main__":
    import sys
    import tempfile
    import time
    sys.path[:0] = [str(Path(__file__).parent.parent), str(Path(__file__).parent)]
    import logging
    logging.disable(logging.WARNING)
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as d:
        for seed, (family, make) in enumerate(families().items()):
            t = time.perf_counter()
            counts = run_family(make(), seed, Path(d))
            total = sum(counts.values())
            print(f"{family}: {total} cases in {time.perf_counter() - t:.1f} s: "
                  + ", ".join(f"{where} {what} {n}" for (where, what), n in sorted(counts.items())))
