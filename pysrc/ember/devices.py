"""The devices a model can run on: the host's cores, and the Vulkan devices
ember's device kernels (the `ember-gpu` crate) see, named as llama.cpp names
them (Vulkan0, Vulkan1, ...)."""

from __future__ import annotations

from typing import Any

from . import _native

# Said wherever a device is asked for, until the forward pass runs on one.
NOT_YET = "ember's device kernels do not yet run a whole model"


def vulkan_devices() -> list[dict[str, Any]]:
    return _native.list_devices()


def listing() -> str:
    """What --list-devices prints."""
    lines = ["Available devices:"]
    for d in vulkan_devices():
        lines.append(f"  {d['name']}: {d['description']} ({d['kind']}, largest buffer "
                     f"{d['max_binding_bytes'] >> 20} MiB, driver {d['driver'] or 'unnamed'})")
    lines.append(f"  cpu: the host's cores, where the model runs ({NOT_YET})")
    return "\n".join(lines)
