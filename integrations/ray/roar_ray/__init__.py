"""roar for Ray: every Ray task and actor method becomes an OpenLineage run with the files it
really read and wrote (blake3 digests), parented to the Ray job's run.

    eval "$(roar-core env ray)"      # before `ray start` on every node, and for drivers
    ray.init(runtime_env={"roar": {}})

or, in a driver that starts a local cluster, `roar_ray.enable()` before `ray.init()`.
See integrations/ray/README.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from roar_ray._env import enable, exports, shell_exports

if TYPE_CHECKING:
    from roar_ray.driver import finish, flush, runtime_env_hook
    from roar_ray.plugin import RoarPlugin

__all__ = ["RoarPlugin", "enable", "exports", "finish", "flush", "runtime_env_hook",
           "shell_exports"]

_LAZY = {"RoarPlugin": "roar_ray.plugin", "runtime_env_hook": "roar_ray.driver",
         "finish": "roar_ray.driver", "flush": "roar_ray.driver"}


def __getattr__(name: str) -> Any:
    # Lazy: the runtime-env agent imports this package for the plugin alone, and workers
    # for the setup hook alone; neither should pay for the other's imports.
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'roar_ray' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)
