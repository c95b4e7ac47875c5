"""A cache run: plan every item (bucket, crop, frames) from the sources' headers, skip what the manifest
says is current, then read each source once (streaming), encode each clip exactly within the budget,
write it atomically and record it, item by item; a failed item is recorded with its reason and the run
goes on. Several devices share whole sources (one VAE per process, torch.distributed only to agree on
the start and the end)."""
from __future__ import annotations

import dataclasses
import logging
import math
import os
import queue
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

import torch

from .. import checks
from ..engine import budget as planner
from ..errors import InputError, VAEKitError
from ..files import outputs
from ..handle import _out_of_memory
from . import formats, manifest, media, posterior, simpletuner
from .clips import Bucket, Buckets, ClipPlan, Crop, Frames, check_bucket, crop_for, frame_rule, parse_buckets, \
    parse_size, plan_clips, steps
from .datasets import Dataset, gather
from .options import DTYPES, CacheOptions

log = logging.getLogger("VAEKit")
_ROOT = Path(__file__).resolve().parents[2]
_UMASK = os.umask(0)
os.umask(_UMASK)


class ItemTimeout(media.MediaError):
    pass


@dataclass
class Clip:
    """One output of a source: its plan, what the format needs, where it goes and what makes it."""
    plan: ClipPlan
    item: formats.Item
    output: str                  # relative to the manifest's root
    settings: dict


@dataclass
class Work:
    """One source and the clips it gives (or why it gives none)."""
    dataset: Dataset
    source: Path
    root: Path                   # the cache folder its outputs go to
    relative: Path
    probe: Optional[media.Probe] = None
    bucket: Optional[Bucket] = None
    crop: Optional[Crop] = None
    clips: list[Clip] = field(default_factory=list)
    todo: list[Clip] = field(default_factory=list)
    refused: list[tuple[Clip, str]] = field(default_factory=list)     # clips whose output may not be written
    error: Optional[str] = None
    fingerprint: dict = field(default_factory=dict)
    metadata: Optional[dict] = None     # what a format records of the source beside its files (simpletuner)


@dataclass
class CacheResult:
    written: int = 0
    skipped: int = 0
    failed: int = 0
    failures: list[tuple[str, str]] = field(default_factory=list)
    outputs: list[Path] = field(default_factory=list)
    stale: list[Path] = field(default_factory=list)
    seconds: float = 0.0
    frames: int = 0
    report: list[str] = field(default_factory=list)

    def summary(self) -> str:
        rate = f", {self.written / self.seconds * 60:.1f} items/min" if self.written and self.seconds else ""
        return (f"cached {self.written + self.skipped + self.failed} items: {self.written} written, {self.skipped} "
                f"up to date, {self.failed} failed{rate}")


def _device(opts: CacheOptions, rank: int, devices: Optional[list]) -> torch.device:
    if devices:
        return torch.device(devices[rank])
    if opts.device:
        return torch.device(opts.device)
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and torch.cuda.is_available():
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


class Runner:
    def __init__(self, opts: CacheOptions, rank: int = 0, world: int = 1, device: Optional[torch.device] = None,
                 say: Callable[[str], None] = print, stream=None):
        from ..loading import load
        self.opts, self.rank, self.world, self.say = opts.check(), rank, world, say
        self.stream = stream
        self.device = device or _device(opts, rank, None)
        self.vae = load(opts.vae, dtype=DTYPES[opts.dtype], device=self.device)
        if not self.vae.caps.can_encode:
            raise InputError(f"{self.vae.name} has no encoder (only a decoder file was loaded).", input="--vae",
                             fix="load the file with the encoder (or the pair).")
        if not opts.arch and opts.format == "musubi":
            opts.arch = formats.default_arch(self.vae)
        save_dtype = DTYPES[opts.save_dtype] if opts.save_dtype else None
        self.format = simpletuner.from_options(opts, save_dtype) if opts.format == "simpletuner" else \
            formats.make(opts.format, opts.arch, save_dtype)
        self.format.check(self.vae)
        caps = self.vae.caps
        own = self.vae.clip_frames if caps.own_tiling is not None else None
        self.fit = frame_rule(caps.temporal_ratio if self.vae.is_video else None, own)
        self.multiple = caps.spatial_ratio_packed
        self.budget = checks.budget(opts.max_memory, "max_memory")     # the library's one budget parser
        self.manifests: dict[Path, manifest.Manifest] = {}
        self.plans: dict[tuple, Optional[planner.Plan]] = {}

    # ---- planning ------------------------------------------------------------------------------
    def step(self) -> int:
        if self.opts.bucket_step:
            return self.opts.bucket_step
        base = {"musubi": 16, "ltx2": 32}.get(self.format.name, self.multiple)
        return steps([base, self.multiple])

    def default_buckets(self) -> Buckets:
        o = self.opts
        if o.buckets:
            fixed = parse_buckets(o.buckets)
            for b in fixed:
                why = check_bucket(b, self.multiple, self.fit)
                if why:
                    raise InputError(why + ".", input="--buckets", fix="choose buckets this VAE encodes.")
            return Buckets(fixed=fixed)
        return Buckets(parse_size(o.resolution) if o.resolution else None, self.step(), o.enable_bucket, o.no_upscale)

    def default_frames(self) -> Frames:
        o = self.opts
        return Frames(o.frames, o.extraction, o.frame_stride, o.frame_sample, o.max_frames, o.fps)

    def manifest_for(self, root: Path) -> manifest.Manifest:
        if root not in self.manifests:
            root.mkdir(parents=True, exist_ok=True)
            self.manifests[root] = manifest.Manifest(root, self.rank).load()
        return self.manifests[root]

    def vae_record(self, root: Path) -> dict:
        path = Path(self.vae.path)
        known = self.manifest_for(root).vae
        st = path.stat()
        return {"path": str(path), "size": st.st_size, "mtime_ns": st.st_mtime_ns,
                "sha256": manifest.file_sha256(path, known), "name": self.vae.name}

    def plan(self) -> list[Work]:
        o = self.opts
        datasets = gather(o.inputs, o.arch, self.step())
        if not o.output and not all(d.output for d in datasets):
            raise InputError("no cache folder given.", input="--output", fix="give -o FOLDER (a musubi-tuner config's "
                                                                              "cache_directory also names one).")
        buckets, frames = self.default_buckets(), self.default_frames()
        works, vaes = [], {}
        for ds in datasets:
            root = Path(ds.output or o.output).resolve()
            if root not in vaes:
                vaes[root] = self.vae_record(root)
            for src in ds.sources:
                w = Work(ds, src, root, ds.relative(src))
                works.append(w)
                self._plan_source(w, buckets, frames, vaes[root])
        self.vaes = vaes
        self._find_collisions(works)
        for w in works:
            m = self.manifest_for(w.root)
            w.refused = [(c, why) for c in w.clips if (why := m.refusal(c.output))]
            refused = {id(c) for c, _ in w.refused}
            w.todo = [c for c in w.clips
                      if id(c) not in refused and not m.fresh(c.output, self._source_record(w), c.settings)]
        return works

    def _source_record(self, w: Work) -> dict:
        return {"path": str(w.source), **w.fingerprint}

    def failed(self, w: Work, c: Clip, reason: str, result: CacheResult) -> None:
        """``c`` recorded as failed; a file the cache wrote for it before stays the cache's (its size kept)."""
        m = self.manifest_for(w.root)
        rec = {"output": c.output, "status": "failed", "reason": reason, "source": self._source_record(w),
               "settings": c.settings}
        if m.owns(c.output):
            rec["bytes"] = m.records[c.output]["bytes"]
        m.add(rec)
        result.failed += 1
        result.failures.append((c.output, reason))

    def _plan_source(self, w: Work, buckets: Buckets, frames: Frames, vae: dict) -> None:
        o = self.opts
        try:
            w.fingerprint = manifest.fingerprint(w.source)
            w.probe = media.probe(w.source, o.threads)
        except (OSError, media.MediaError) as e:
            w.error = str(e) if isinstance(e, media.MediaError) else f"cannot read the file: {e.strerror or e}"
            return
        video = media.kind(w.source) == "video"
        if video and getattr(self.format, "no_videos", None):
            w.error = self.format.no_videos
            return
        if video and not getattr(getattr(self.format, "arch", None), "videos", True):
            w.error = f"{self.format.describe()} trains on images; this video is not written"
            return
        b = (w.dataset.video_buckets if video and w.dataset.video_buckets else w.dataset.buckets) or buckets
        fr = w.dataset.frames or frames
        place = getattr(self.format, "place", None)       # a format with its trainer's own size and frame rule
        own_clips = None
        if place is not None:
            try:
                p = place(w.probe.size, self.multiple, w.probe.frames if video else None)
            except ValueError as e:
                w.error = str(e)
                return
            w.bucket, w.crop, w.metadata, own_clips = p.bucket, p.crop, p.metadata, p.clips
        else:
            w.bucket = b.choose(w.probe.size, w.probe.frames if video else None)
        if w.bucket is None:
            w.error = f"no bucket has {w.probe.frames} frames or fewer"
            return
        if w.bucket.width < self.multiple or w.bucket.height < self.multiple:
            w.error = f"the bucket {w.bucket} is smaller than the VAE's {self.multiple} px"
            return
        if w.bucket.width % self.multiple or w.bucket.height % self.multiple:
            w.error = f"bucket {w.bucket} is not a multiple of {self.multiple} px (the VAE's ratio)"
            return
        w.crop = w.crop or crop_for(w.probe.size, w.bucket)
        if video and own_clips is not None:
            plans, fps = own_clips, w.probe.fps
        elif video:
            plans = plan_clips(w.probe.frames, fr, self.fit, w.probe.fps, w.bucket.frames)
            fps = fr.fps if fr.fps and w.probe.fps and fr.fps < (fr.source_fps or w.probe.fps) else \
                (fr.source_fps or w.probe.fps)
            if not plans:
                w.error = (f"the video has {w.probe.frames} frames, fewer than any clip asked for "
                           f"({', '.join(map(str, fr.targets))}, fitted to the VAE's frame rule)")
                return
        else:
            plans, fps = [ClipPlan(0, 1, (0,))], None
        for p in plans:
            item = formats.Item(w.source.stem, w.relative, video, p.start, p.frames, w.probe.size, fps)
            out = self.format.path(item).as_posix()
            settings = {
                "vae_sha256": vae["sha256"], "dtype": o.dtype, "mode": o.mode, "format": self.format.describe(),
                "save_dtype": str(self.format.dtype).removeprefix("torch."), "logvar": self.format.wants_logvar,
                "bucket": [w.bucket.width, w.bucket.height], "crop": list(w.crop.region),
                "frames": list(p.indices), "fps": fps}
            if o.mode == "fast":        # a fast result depends on its tiles; an exact one does not
                settings.update(tile=o.tile, overlap=o.overlap, max_memory=self.budget)
            w.clips.append(Clip(p, item, out, settings))

    def _find_collisions(self, works: list[Work]) -> None:
        seen: dict[tuple, Path] = {}
        for w in works:
            keep = []
            for c in w.clips:
                key = (w.root, c.output)
                if key in seen and seen[key] == w.source:
                    w.error = (f"several of its clips would be the one file {c.output} ({self.format.describe()} holds "
                               "one clip per source); ask for one clip length")
                elif key in seen:
                    w.error = f"its output {c.output} is also another source's ({seen[key]}); rename one of them"
                else:
                    seen[key] = w.source
                    keep.append(c)
            if w.error:
                w.clips = []
            else:
                w.clips = keep

    # ---- encoding ------------------------------------------------------------------------------
    def shape(self, clip: Clip, bucket: Bucket) -> tuple:
        if self.vae.is_video:
            return (1, 3, clip.plan.frames, bucket.height, bucket.width)
        return (1, 3, bucket.height, bucket.width)

    def plan_for(self, shape: tuple, budget: Optional[int] = None) -> Optional[planner.Plan]:
        """The planner's tile and chunk for clips of ``shape`` (one plan per shape), or None without a budget."""
        budget = budget or self.budget
        key = (shape, budget)
        if key not in self.plans:
            if not budget:
                self.plans[key] = None
            else:
                call = self.vae.call_for("encode", shape, self.opts.tile or None, self.opts.overlap, mode=self.opts.mode)
                dev = self.vae.device
                self.plans[key] = planner.plan(self.vae, call, budget, dev, torch.device("cpu"), torch.device("cpu"))
        return self.plans[key]

    def describe_plan(self, shape: tuple) -> str:
        if ("text", shape) not in self.plans:
            self.plans[("text", shape)] = self._describe_plan(shape)
        return self.plans[("text", shape)]

    def _describe_plan(self, shape: tuple) -> str:
        p = self.plan_for(shape)
        if p is not None:
            return p.describe()
        need = self.vae.memory_needed(shape, "encode", tile=self.opts.tile or None, overlap=self.opts.overlap,
                                      mode=self.opts.mode)
        tiles = f"{self.opts.tile} px tiles" if self.opts.tile else "untiled"
        return f"{self.opts.mode}, {tiles} (no budget)" + (f", {planner.gib(need)} predicted on "
                                                           f"{self.vae.device.type}" if need else "")

    def encode(self, x: torch.Tensor, shape: tuple, progress=None) -> tuple:
        """(mean, logvar, plan text, logvar note); one replan for half the budget on running out of memory."""
        budget = self.budget
        for attempt in (0, 1):
            p = self.plan_for(shape, budget)
            kw = dict(mode=self.opts.mode, overlap=self.opts.overlap, out_device="cpu", pixel_range=self.format.pixel_range)
            if p is not None:
                kw.update(tile=p.call.tile, tile_frames=p.call.tile_frames)
            else:
                kw.update(tile=self.opts.tile or None)
            try:
                mean, logvar, note = posterior.encode(self.vae, x, self.format.wants_logvar, progress, **kw)
                return mean, logvar, (p.describe() if p else self.describe_plan(shape)), note
            except Exception as e:     # noqa: BLE001 - only out-of-memory errors are planned again
                if not _out_of_memory(e) or attempt or not budget:
                    raise
                log.warning("VAEKit cache: out of memory; planning again for half the budget")
                budget //= 2

    def run_work(self, w: Work, result: CacheResult, bar, write: bool = True) -> None:
        """Every to-do clip of ``w``: read, encode, written and recorded (``write`` False: encoded only,
        the dry run's timing)."""
        m = self.manifest_for(w.root)
        deadline = time.monotonic() + self.opts.timeout
        done_clips = set()

        def fail(clips, reason: str) -> None:
            for c in clips:
                if c.output in done_clips:
                    continue
                self.failed(w, c, reason, result)
                bar.item(c.plan.frames)

        def check(done=None, total=None) -> None:
            if time.monotonic() > deadline:
                raise ItemTimeout(f"the item took longer than the per-item timeout ({self.opts.timeout:g} s)")

        try:
            for clip, x in self._clips(w, deadline):
                c = next(c for c in w.todo if c.plan is clip)
                t = time.perf_counter()
                shape = self.shape(c, w.bucket)
                x = x.unsqueeze(0) if self.vae.is_video else x[:, 0].unsqueeze(0)
                try:
                    mean, logvar, plan_text, note = self.encode(x, shape, progress=check)
                    if not torch.isfinite(mean).all():
                        raise VAEKitError("the latent has NaN/Inf values")
                except (ItemTimeout, VAEKitError) as e:
                    fail([c], str(e))
                    continue
                except Exception as e:     # noqa: BLE001 - out of memory after the replan, a model error
                    fail([c], f"{'out of memory even after the replan' if _out_of_memory(e) else type(e).__name__}: {e}")
                    continue
                refusal = write and m.refusal(c.output)        # a file may have appeared since the plan
                if refusal:
                    fail([c], refusal)
                    continue
                if write:
                    self._write(w, c, mean, logvar, plan_text, note, time.perf_counter() - t, m, result)
                else:
                    result.written += 1
                done_clips.add(c.output)
                bar.item(c.plan.frames)
        except media.MediaError as e:
            fail(w.todo, str(e))

    def _clips(self, w: Work, deadline: float):
        """The to-do clips of a source with their pixels, read on a thread one clip ahead of the encoder."""
        todo = [c.plan for c in w.todo]
        if media.kind(w.source) == "image":
            x, _ = media.read_image(w.source, w.bucket, w.crop)
            yield todo[0], x
            return
        q: queue.Queue = queue.Queue(maxsize=1)
        stop = threading.Event()

        def reader() -> None:
            try:
                for item in media.read_clips(w.source, todo, w.crop, self.opts.threads, deadline):
                    while not stop.is_set():
                        try:
                            q.put(item, timeout=0.2)
                            break
                        except queue.Full:
                            continue
                    if stop.is_set():
                        return
                q.put(None)
            except BaseException as e:     # noqa: BLE001 - handed to the encoder's side
                q.put(e)

        threading.Thread(target=reader, daemon=True, name="vaekit-cache-reader").start()
        try:
            while True:
                try:
                    item = q.get(timeout=max(0.0, deadline - time.monotonic()) + 1.0)
                except queue.Empty:
                    raise ItemTimeout(f"reading the video took longer than the per-item timeout "
                                      f"({self.opts.timeout:g} s)") from None
                if item is None:
                    return
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            stop.set()

    def _write(self, w: Work, c: Clip, mean, logvar, plan_text: str, note: str, seconds: float,
               m: manifest.Manifest, result: CacheResult) -> None:
        final = w.root / c.output
        final.parent.mkdir(parents=True, exist_ok=True)
        for orphan in final.parent.glob(f".{final.stem}.partial-*{final.suffix}"):    # ours, left by a kill
            orphan.unlink(missing_ok=True)
        record = {"output": c.output, "status": "done", "source": self._source_record(w), "settings": c.settings,
                  "plan": plan_text, "seconds": round(seconds, 3), "shape": list(mean.shape[1:]),
                  "vae_name": self.vaes[w.root]["name"]}
        if note:
            record["logvar_note"] = note
        with outputs.AtomicFiles(overwrite=True) as files:
            tmp = files.temp(final)
            self.format.write(tmp, c.item, mean, logvar, record)
            os.chmod(tmp, 0o666 & ~_UMASK)          # as any file the user makes (some writers make 0600)
        record["bytes"] = final.stat().st_size
        m.add(record)
        result.written += 1
        result.frames += c.plan.frames
        result.outputs.append(final)


class Bar:
    """Items done (frames per second, ETA) on a terminal, or nothing."""

    def __init__(self, stream, total: int, quiet: bool):
        from .. import progress
        self.done, self.total, self.frames, self.start = 0, total, 0, time.perf_counter()
        rate = lambda: f"{self.frames / max(time.perf_counter() - self.start, 1e-9):.1f} frames/s"   # noqa: E731
        self.bar = progress.terminal_bar(stream, quiet, label="items", note=rate) if stream else None

    def item(self, frames: int) -> None:
        self.done += 1
        self.frames += frames
        if self.bar:
            self.bar(self.done, self.total)

    def close(self) -> None:
        if self.bar:
            self.bar.close()


def _dist_setup(opts: CacheOptions):
    """(rank, world, devices, workers): from torchrun's environment, or a process per extra device of
    ``--devices`` (this process rank 0), joined by torch.distributed (gloo: only agreement travels)."""
    import torch.distributed as dist
    if opts.devices:
        from ..workers import parse_devices
        devices = [str(d) for d in parse_devices(opts.devices)]
        init, procs = spawn(opts, devices)
        if devices[0] == "cpu":
            torch.set_num_threads(max(1, (os.cpu_count() or 1) // len(devices)))
        dist.init_process_group("gloo", init_method=init, rank=0, world_size=len(devices))
        return 0, len(devices), devices, procs
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1:
        dist.init_process_group("gloo")
        return dist.get_rank(), world, None, []
    return 0, 1, None, []


def spawn(opts: CacheOptions, devices: list[str]) -> tuple[str, list]:
    from ..workers import _free_port
    init = f"tcp://127.0.0.1:{_free_port()}"
    fd, path = tempfile.mkstemp(prefix="vaekit-cache-", suffix=".json")
    absolute = dataclasses.replace(opts, vae=os.path.abspath(opts.vae), inputs=[os.path.abspath(i) for i in opts.inputs],
                                   output=opts.output and os.path.abspath(opts.output), devices=None)
    with os.fdopen(fd, "w") as f:
        f.write(absolute.to_json())
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(_ROOT), os.environ.get("PYTHONPATH", "")])}
    procs = [subprocess.Popen([sys.executable, "-m", "vae.cache.worker", "--rank", str(r), "--world", str(len(devices)),
                               "--init", init, "--device", d, "--options", path], cwd=str(_ROOT), env=env)
             for r, d in enumerate(devices) if r > 0]
    return init, procs


def cache(vae: str = None, inputs=None, output: Optional[str] = None, **kw) -> CacheResult:
    """Cache the latents of a dataset (see vae/cache/__init__.py): ``vae.cache("wan_vae.safetensors",
    ["clips/"], "cache/", format="musubi", arch="wan", resolution="832x480", frames=(81,),
    max_memory="1.5GB")``. Returns a ``CacheResult``; prints nothing unless ``say`` is given."""
    say = kw.pop("say", lambda text: None)
    stream = kw.pop("stream", None)
    opts = kw.pop("options", None) or CacheOptions(vae=vae, inputs=[inputs] if isinstance(inputs, (str, Path))
                                                   else list(inputs or []), output=output, **kw)
    return run(opts, say=say, stream=stream)


def run(opts: CacheOptions, say=print, stream=None, rank: Optional[int] = None, world: Optional[int] = None,
        device: Optional[str] = None) -> CacheResult:
    """The run on every process: rank and world from the caller (a spawned worker), or found here."""
    import torch.distributed as dist
    procs: list = []
    if rank is None:
        rank, world, devices, procs = _dist_setup(opts)
        dev = _device(opts, rank, devices)
    else:
        dev = torch.device(device) if device else _device(opts, rank, None)
    try:
        runner = Runner(opts, rank, world, dev, say if rank == 0 else (lambda t: None), stream if rank == 0 else None)
        return _run(runner, procs)
    except BaseException:
        for p in procs:                 # our workers would wait for this rank until the group's timeout
            p.kill()
        raise
    finally:
        if world > 1 and dist.is_initialized():
            dist.destroy_process_group()
        for p in procs:
            if p.poll() is None:
                p.wait(timeout=60)


def _agree(world: int, value: int = 0) -> int:
    """A barrier that adds up ``value`` over the ranks."""
    if world <= 1:
        return value
    import torch.distributed as dist
    t = torch.tensor([value], dtype=torch.int64)
    dist.all_reduce(t)
    return int(t.item())


def _run(r: Runner, procs: list) -> CacheResult:
    opts, result, t0 = r.opts, CacheResult(), time.perf_counter()
    works = r.plan()
    todo = [w for w in works if w.todo and not w.error]
    result.skipped = sum(len(w.clips) - len(w.todo) - len(w.refused) for w in works if not w.error)
    _agree(r.world)                                  # every rank has read the manifest before any writes
    if opts.dry_run:
        if r.rank == 0:
            _dry_run(r, works, todo)
        _agree(r.world)
        return result
    mine = [w for i, w in enumerate(todo) if i % r.world == r.rank]
    for m in r.manifests.values():
        m.open_log()
        for root, vae in r.vaes.items():
            if root == m.root:
                m.add({"vae_file": vae})
    broken = [w for w in works if w.error]
    for w in broken[r.rank::r.world]:
        m = r.manifest_for(w.root)
        key = f"source:{w.relative.as_posix()}"
        m.add({"output": key, "status": "failed", "reason": w.error, "source": {"path": str(w.source)}})
        result.failed += 1
        result.failures.append((str(w.relative), w.error))
    refused = [(w, c, why) for w in works for c, why in w.refused]
    for w, c, why in refused[r.rank::r.world]:
        r.failed(w, c, why, result)
    bar = Bar(r.stream, sum(len(w.todo) for w in mine), opts.quiet)
    try:
        for w in mine:
            r.run_work(w, result, bar)
            key = f"source:{w.relative.as_posix()}"
            if key in r.manifest_for(w.root).records:       # it failed before and was read now
                r.manifest_for(w.root).add({"output": key, "status": "cleared"})
    finally:
        bar.close()
        for m in r.manifests.values():
            m.close_log()
    result.seconds = time.perf_counter() - t0
    total_failed = _agree(r.world, result.failed)
    total_written = _agree(r.world, result.written)
    if r.rank == 0:
        for p in procs:
            p.wait()
        planned = {(w.root, c.output) for w in works for c in w.clips}
        for root, m in r.manifests.items():
            for out, rec in list(m.written()):
                f = root / out
                if (root, out) not in planned and m.inside(out) and f.is_file() and f.stat().st_size == rec.get("bytes"):
                    result.stale.append(f)
                    if opts.prune:
                        f.unlink()
                        m.records.pop(out)
            m.save()
        if hasattr(r.format, "metadata_files"):
            _write_metadata_files(r, works)
        current = {(w.root, c.output) for w in works for c in w.clips} | \
            {(w.root, f"source:{w.relative.as_posix()}") for w in works}
        for root, m in r.manifests.items():
            for out, rec in sorted(m.records.items()):
                if rec.get("status") == "failed" and (root, out) in current:
                    r.say(f"failed: {out}: {rec.get('reason')}")
        if result.stale:
            r.say(f"{len(result.stale)} output(s) of an earlier run have no source now"
                  + (" (removed: --prune)" if opts.prune else " (kept; --prune removes them)"))
        if opts.verify:
            from .verify import verify
            for line in verify(r, works, opts.verify):
                r.say(line)
        result.written, result.failed = total_written, total_failed
        r.say(result.summary())
    return result


def _write_metadata_files(r: Runner, works: list[Work]) -> None:
    """A format's files of the whole dataset beside the items (simpletuner: its bucket and size JSONs), of
    the sources whose items are all cached; each in the cache folder, never over a file the cache did not
    write (recorded in the manifest with its size, as the items are)."""
    for root, m in r.manifests.items():
        entries = [(w.dataset.root, w.relative, w.metadata) for w in works
                   if w.root == root and w.metadata and w.clips
                   and all(m.records.get(c.output, {}).get("status") == "done" for c in w.clips)]
        for name, data in r.format.metadata_files(entries).items():
            why = m.refusal(name)
            if why:
                r.say(f"not written: {name}: {why}")
                continue
            manifest.write_json_atomic(root / name, data)
            m.add({"output": name, "status": "metadata", "bytes": (root / name).stat().st_size})
        m.save()


def _dry_run(r: Runner, works: list[Work], todo: list[Work]) -> None:
    """Buckets, items, the planned tile/chunk and predicted memory per bucket, and a time estimate from
    the first item (encoded, not written)."""
    say, groups = r.say, {}
    for w in works:
        for c in w.clips:
            key = (w.bucket.width, w.bucket.height, c.plan.frames)
            g = groups.setdefault(key, [0, 0, None])
            g[0] += 1
            g[1] += c in w.todo
            g[2] = r.shape(c, w.bucket)
    say(f"{r.vae.name} on {r.vae.device}, {r.opts.mode} mode, "
        f"budget {planner.gib(r.budget) if r.budget else 'none'}; format {r.format.describe()}")
    for (w_, h_, f_), (n, k, shape) in sorted(groups.items()):
        try:
            plan = r.describe_plan(shape)
        except InputError as e:
            plan = f"does not fit: {e.problem}"
        say(f"  bucket {w_}x{h_}, {f_} frame{'s' if f_ > 1 else ''}: {n} items ({k} to do); {plan}")
    broken = [w for w in works if w.error]
    for w in broken:
        say(f"  will fail: {w.relative}: {w.error}")
    for w in works:
        for c, why in w.refused:
            say(f"  will fail: {c.output}: {why}")
    if not todo:
        say("nothing to do: every item is up to date")
        return
    w, first = todo[0], CacheResult()
    t = time.perf_counter()
    r.run_work(Work(w.dataset, w.source, w.root, w.relative, w.probe, w.bucket, w.crop, w.clips, w.todo[:1]),
               first, Bar(None, 1, True), write=False)
    dt = time.perf_counter() - t
    if not first.written:
        say(f"the first item failed: {first.failures[0][1] if first.failures else 'unknown'}")
        return
    unit = math.prod(r.shape(w.todo[0], w.bucket))
    total = sum(math.prod(r.shape(c, x.bucket)) for x in todo for c in x.todo)
    say(f"first item {dt:.1f} s; estimated {dt * total / unit / 60:.1f} min for "
        f"{sum(len(x.todo) for x in todo)} items on {r.world} process{'es' if r.world > 1 else ''} "
        f"({dt * total / unit / 60 / r.world:.1f} min each)")

