"""The devices a model can run on: the host's cores, and the Vulkan devices
ember's device kernels (the `ember-gpu` crate) see, named as llama.cpp names
them (Vulkan0, Vulkan1, ...); and what `gpu_layers` and `device` ask for,
spelled as llama-server's -ngl and --device take them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from . import _native
from .errors import InvalidRequestError

__all__ = ["DeviceRequest", "listing", "request", "vulkan_devices"]


def vulkan_devices() -> list[dict[str, Any]]:
    return _native.list_devices()


def listing() -> str:
    """What --list-devices prints."""
    lines = ["Available devices:"]
    for d in vulkan_devices():
        lines.append(f"  {d['name']}: {d['description']} ({d['kind']}, largest buffer "
                     f"{d['max_binding_bytes'] >> 20} MiB, driver {d['driver'] or 'unnamed'})")
    lines.append("  cpu: the host's cores (the default; -ngl all puts every layer on the first device above, "
                 "--device NAME on that one)")
    return "\n".join(lines)


@dataclass(frozen=True)
class DeviceRequest:
    """Where the user asked the model to run."""

    #: None: the CPU; "": the first device that is a card; else a device's name
    device: str | None
    #: layers asked for on the device: -1 every one
    layers: int
    #: a device named outright: one that cannot hold or run the model is
    #: refused; else the model runs on the CPU and says why
    strict: bool

    @property
    def on_cpu(self) -> bool:
        return self.device is None


def _layers(gpu_layers: int | str | None) -> int | None:
    """-ngl's value: None (not given), -1 (every layer: all, auto, -1) or a count."""
    if gpu_layers is None:
        return None
    v = str(gpu_layers).strip().lower()
    if v in ("all", "auto"):
        return -1
    try:
        n = int(v)
    except ValueError:
        raise InvalidRequestError(f"gpu_layers: expected a number of layers, auto or all, got {gpu_layers!r}") from None
    if n < -1:
        raise InvalidRequestError(f"gpu_layers: {n} is not a count of layers (-1 or all: every one)")
    return n


def request(gpu_layers: int | str | None = None, device: str | None = None) -> DeviceRequest:
    """What `gpu_layers` (llama-server's -ngl) and `device` (--device)
    ask for. Naming a device puts the model there (every layer, when
    gpu_layers is not given); gpu_layers alone asks for the first card, with
    the CPU as the fallback; 0 layers, or the device `none`, is the CPU."""
    layers = _layers(gpu_layers)
    name = None
    if device is not None:
        names = [n.strip() for n in str(device).split(",") if n.strip()]
        if not names:
            raise InvalidRequestError("device: names no device (give a name from --list-devices, or none)")
        if [n.lower() for n in names] == ["none"]:
            return DeviceRequest(None, 0, False)
        if len(names) > 1:
            raise InvalidRequestError(f"device: names {len(names)} devices; ember runs a model on one")
        name = names[0]
    if layers == 0 or (name is None and layers is None):
        return DeviceRequest(None, 0, False)
    return DeviceRequest(name if name is not None else "", -1 if layers is None else layers, name is not None)
