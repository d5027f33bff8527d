"""GPU presets (``advise --gpu NAME``): each card's figures the step model needs, each with its source.

The data is ``gpus.toml`` beside this module (its header defines every key).  :func:`get_gpu` finds
a preset by key or alias (:class:`GpuError` listing the names otherwise); :func:`gpu_of_device`
finds the preset of a run's GPU from meta.json ``device.name``; :func:`near_card` says when a
literal memory size (``--hbm-bytes 80GB``) is within :data:`NEAR_SHARE` of a known card's reported
memory but not it -- "80GB" read as 74.5 GiB on a card that reports 79.2 GiB.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from ..units import tomllib

DATA = Path(__file__).with_name("gpus.toml")
#: a literal memory size this close to a card's reported memory (and not it) is flagged
NEAR_SHARE = 0.10
#: below this share of difference a literal memory size is taken to be the card's own figure
SAME_SHARE = 0.005
FIGURES = ("memory_bytes", "hbm_gbps", "bf16_tflops", "fp8_tflops", "sms", "host_link_gbps", "h2d_gbps")


class GpuError(ValueError):
    """An unknown preset name or an unreadable preset file (exit 2, naming the flag)."""


@dataclass(frozen=True)
class Gpu:
    key: str
    name: str
    memory_bytes: int
    hbm_gbps: float
    bf16_tflops: float
    sms: int
    host_link: str
    host_link_gbps: float
    h2d_gbps: float
    fp8_tflops: float | None = None
    aliases: tuple[str, ...] = ()
    match: tuple[str, ...] = ()
    sources: dict[str, str] = field(default_factory=dict, compare=False, hash=False)

    def source(self, figure: str) -> str:
        return self.sources.get(figure, "not given")

    def kind_of(self, figure: str) -> str:
        """``datasheet``, ``measured`` or ``assumed``: the first word of the figure's source."""
        s = self.source(figure).lower()
        return "measured" if s.startswith("measured") else "assumed" if s.startswith("assumed") else "datasheet"

    def lines(self) -> list[str]:
        fmt = {"memory_bytes": lambda v: f"{v / 2**30:.1f} GiB", "hbm_gbps": lambda v: f"{v:,.0f} GB/s",
               "bf16_tflops": lambda v: f"{v:,.0f} TFLOP/s", "fp8_tflops": lambda v: f"{v:,.0f} TFLOP/s",
               "sms": str, "host_link_gbps": lambda v: f"{v:,.0f} GB/s ({self.host_link})",
               "h2d_gbps": lambda v: f"{v:,.1f} GB/s"}
        return [f"{f} = {fmt[f](getattr(self, f)) if getattr(self, f) is not None else 'none'} "
                f"({self.source(f)})" for f in FIGURES]

    def to_json(self) -> dict[str, Any]:
        return {"key": self.key, "name": self.name, **{f: getattr(self, f) for f in FIGURES},
                "host_link": self.host_link, "sources": dict(self.sources)}


def _gpu(key: str, raw: dict[str, Any]) -> Gpu:
    need = ("name", "memory_bytes", "hbm_gbps", "bf16_tflops", "sms", "host_link", "host_link_gbps", "h2d_gbps")
    missing = [k for k in need if k not in raw]
    if missing:
        raise GpuError(f"{DATA.name} [{key}]: missing {', '.join(missing)}")
    sources = dict(raw.get("sources") or {})
    unsourced = [f for f in FIGURES if raw.get(f) is not None and f not in sources]
    if unsourced:
        raise GpuError(f"{DATA.name} [{key}]: no source for {', '.join(unsourced)}")
    return Gpu(key=key, name=str(raw["name"]), memory_bytes=int(raw["memory_bytes"]),
               hbm_gbps=float(raw["hbm_gbps"]), bf16_tflops=float(raw["bf16_tflops"]), sms=int(raw["sms"]),
               host_link=str(raw["host_link"]), host_link_gbps=float(raw["host_link_gbps"]),
               h2d_gbps=float(raw["h2d_gbps"]),
               fp8_tflops=float(raw["fp8_tflops"]) if raw.get("fp8_tflops") is not None else None,
               aliases=tuple(raw.get("aliases") or ()), match=tuple(raw.get("match") or ()), sources=sources)


@lru_cache(maxsize=None)
def gpus() -> dict[str, Gpu]:
    """Every preset by key, in the file's order."""
    with open(DATA, "rb") as f:
        data = tomllib.load(f)
    return {key: _gpu(key, raw) for key, raw in data.items()}


def _norm(name: str) -> str:
    return name.strip().lower().replace("_", "-").replace(" ", "-")


def gpu_names() -> list[str]:
    return list(gpus())


def get_gpu(name: str) -> Gpu:
    """The preset named ``name`` (its key or an alias, any case); GpuError listing the names."""
    want = _norm(name)
    for g in gpus().values():
        if want == g.key or want in map(_norm, g.aliases):
            return g
    raise GpuError(f"--gpu: unknown GPU {name!r}; known: {', '.join(gpu_names())}")


def gpu_of_device(device_name: str | None) -> Gpu | None:
    """The preset of a device name as torch reports it (``NVIDIA H100 80GB HBM3``); None if none
    matches.  The most specific match wins (``GH200`` over ``H200``)."""
    if not device_name:
        return None
    name = device_name.upper()
    hits = [(len(m), g) for g in gpus().values() for m in g.match if m.upper() in name]
    return max(hits, key=lambda h: h[0])[1] if hits else None


def near_card(nbytes: int) -> Gpu | None:
    """The known card whose reported memory ``nbytes`` is within NEAR_SHARE of but not the same as
    (more than SAME_SHARE off): the size was likely meant as that card.  None otherwise."""
    best = None
    for g in gpus().values():
        share = abs(nbytes - g.memory_bytes) / g.memory_bytes
        if share <= SAME_SHARE:
            return None  # it is a known card's own figure
        if share <= NEAR_SHARE and (best is None or share < best[0]):
            best = (share, g)
    return best[1] if best else None


def near_card_words(flag: str, nbytes: int) -> str | None:
    """The warning for a literal memory size near a known card's (None when there is none)."""
    g = near_card(nbytes)
    if g is None:
        return None
    pct = 100.0 * (nbytes / g.memory_bytes - 1.0)
    return (f"{flag} {nbytes / 2**30:.1f} GiB is {pct:+.1f} % off the {g.name}'s {g.memory_bytes / 2**30:.1f} GiB "
            f"as the card reports it ({g.source('memory_bytes')}); if that card is meant, give --gpu {g.key} "
            f"(a literal size is taken as given: '80GB' is 74.5 GiB)")
