"""Configuration: one precedence chain, written down once.

    1. built-in defaults
    2. `[tool.roar-core]` in the project's pyproject.toml
    3. `.roar-core/config.toml` of the project
    4. environment variables (ROAR_<KEY>, e.g. ROAR_DATABASE_URL)
    5. explicit overrides passed by the caller (CLI flags, integration settings)

The project root is the nearest directory, from the working directory up, holding a
`.roar-core/` directory or a pyproject.toml with a `[tool.roar-core]` table; otherwise the
working directory.  Paths are strings, as os.path makes them (pathlib costs `roar-core
run` ~4 ms to import).  OpenLineage transport settings are *not* ours: they follow the
openlineage-python conventions (openlineage.yml, OPENLINEAGE_URL, ...).  Unknown keys
are an error that names the key, so a typo never silently does nothing.
"""

from __future__ import annotations

import os
import sys

from roar_core.slotted import Frozen

TYPE_CHECKING = False  # not typing's (see roar_core.slotted)
if TYPE_CHECKING:
    from typing import Any


# Not roar-cli's `.roar/` and `[tool.roar]` (the peer, often used in the same projects):
# nothing of roar-cli's is read, and its directory never makes a project root here.
HOME_NAME = ".roar-core"
TOOL_TABLE = "roar-core"


class ConfigError(ValueError):
    """Bad configuration; the message is one line and names the offending key or file."""


class Config(Frozen):
    """A resolved configuration (see the module docstring), immutable."""

    __slots__ = ("home", "database_url", "namespace", "file_host", "include", "exclude",
                 "hash_workers", "native_hash", "emit", "content_match",
                 "content_match_min_size", "disabled", "project_root")
    _not_compared = ("project_root",)

    # The annotations of __init__ are the keys' types, which `_coerce` reads.
    def __init__(
        self,
        home: str = HOME_NAME,  # store, stat cache, spool, sessions (~ expanded)
        database_url: str | None = None,  # None: SQLite under home
        namespace: str = "roar",  # OpenLineage job namespace
        file_host: str | None = None,  # "file://<host>" dataset namespace for non-shared disks
        include: tuple[str, ...] = (),  # globs: only these paths are lineage (empty: all)
        exclude: tuple[str, ...] = (),  # globs never recorded as lineage
        hash_workers: int = 0,  # 0: a sensible default for this machine
        native_hash: bool = True,  # small files through the native batch hasher, when built
        emit: bool = True,  # send OpenLineage events (always spooled first)
        # Equal content under another path, its copying unobserved: an inferred edge
        # (`roar.content_match`), for files of at least this many bytes (smaller ones,
        # empty files first, are equal by chance).
        content_match: bool = True,
        content_match_min_size: int = 64,
        disabled: bool = False,  # kill switch: run tasks untraced and record nothing
        project_root: str = ".",
    ) -> None:
        self._set(home=os.fspath(home), database_url=database_url, namespace=namespace,
                  file_host=file_host, include=include, exclude=exclude,
                  hash_workers=hash_workers, native_hash=native_hash, emit=emit,
                  content_match=content_match,
                  content_match_min_size=content_match_min_size, disabled=disabled,
                  project_root=os.fspath(project_root))

    @property
    def match_min_size(self) -> int | None:
        """The smallest file whose content match is an inferred edge; None: none is (an
        empty file never is)."""
        return max(1, self.content_match_min_size) if self.content_match else None

    @property
    def spool_dir(self) -> str:
        return os.path.join(self.home, "spool")

    @property
    def sessions_dir(self) -> str:
        return os.path.join(self.home, "sessions")

    @property
    def statcache_path(self) -> str:
        return os.path.join(self.home, "statcache.db")


# key -> its type, as written in Config.__init__
_KEYS: dict[str, str] = {k: v for k, v in Config.__init__.__annotations__.items()
                         if k not in ("return", "project_root")}
KEYS = tuple(_KEYS)  # the configuration keys
_PATH_KEYS = frozenset({"home"})
_ENV_PREFIX = "ROAR_"
# Environment variables that are ours but not config keys (tracer/session plumbing, the
# CLI's traceback switch, the test suite's settings, which CI exports around every command).
_ENV_NOT_KEYS = {
    "ROAR_SESSION_DIR", "ROAR_TASK_TAG", "ROAR_TRACER_OFF", "ROAR_PRELOAD_LIB", "ROAR_DEBUG",
    "ROAR_OPENLINEAGE_SPEC",
}
_ENV_NOT_KEY_PREFIXES = ("ROAR_TEST_",)


def _coerce(key: str, value: Any, source: str) -> Any:
    kind = _KEYS[key]
    try:
        if kind in ("bool",):
            if isinstance(value, bool):
                return value
            v = str(value).strip().lower()
            if v in ("1", "true", "yes", "on"):
                return True
            if v in ("0", "false", "no", "off", ""):
                return False
            raise ValueError(value)
        if kind == "int":
            return int(value)
        if key in _PATH_KEYS:
            if isinstance(value, str | os.PathLike):
                return clean_path(os.path.expanduser(os.fspath(value)))
            raise ValueError(value)
        if kind == "tuple[str, ...]":
            if isinstance(value, str):
                return tuple(v for v in value.replace(",", os.pathsep).split(os.pathsep) if v)
            if isinstance(value, list | tuple) and all(isinstance(v, str) for v in value):
                return tuple(value)
            raise ValueError(value)
        if kind in ("str", "str | None"):
            if value is None or isinstance(value, str | int | float):
                return None if value is None else str(value)
            raise ValueError(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{source}: bad value for '{key}': {value!r}") from None
    return value


def _check_keys(table: dict[str, Any], source: str) -> dict[str, Any]:
    for key in table:
        if key not in _KEYS:
            valid = ", ".join(sorted(_KEYS))
            raise ConfigError(f"{source}: unknown key '{key}' (valid keys: {valid})")
    return {k: _coerce(k, v, source) for k, v in table.items()}


def clean_path(p: str) -> str:
    """`p` as pathlib spells it (`Path(p)`): no empty or `.` components, no trailing
    slash; `..` kept (a symlink before it decides where it leads)."""
    lead = "/" if p.startswith("/") else ""
    if p.startswith("//") and not p.startswith("///"):
        lead = "//"
    return lead + "/".join(c for c in p.split("/") if c and c != ".") or "."


def _read_toml(path: str) -> dict[str, Any]:
    # Imported here: a project without a config file does not pay for it (~1.7 ms, with
    # typing), on every `roar-core run`.
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover
        import tomli as tomllib

    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path}: invalid TOML ({e})") from None
    except UnicodeDecodeError as e:
        raise ConfigError(f"{path}: not UTF-8 text (byte 0x{e.object[e.start]:02x} at offset "
                          f"{e.start}); TOML files are UTF-8") from None
    except OSError as e:
        raise ConfigError(f"{path}: cannot read ({e.strerror})") from None


def find_project_root(start: str) -> str:
    d = start
    while True:
        if os.path.isdir(os.path.join(d, HOME_NAME)):
            return d
        py = os.path.join(d, "pyproject.toml")
        if os.path.isfile(py) and "tool" in (t := _read_toml(py)) and TOOL_TABLE in t["tool"]:
            return d
        up = os.path.dirname(d)
        if up == d:
            return start
        d = up


def _env_values(env: dict[str, str] | os._Environ) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, value in env.items():
        if (not name.startswith(_ENV_PREFIX) or name in _ENV_NOT_KEYS
                or name.startswith(_ENV_NOT_KEY_PREFIXES)):
            continue
        key = name[len(_ENV_PREFIX):].lower()
        if key not in _KEYS:
            _warn_unknown(name)
            continue
        out[key] = _coerce(key, value, f"environment {name}")
    return out


_warned: set[str] = set()


def _warn_unknown(name: str) -> None:
    """A ROAR_* variable that is no setting of ours: a warning once per process, not an
    error (a user's or another tool's variable may share the prefix, and made every command
    exit 2).  Files stay strict: a key there is meant for us."""
    if name in _warned:
        return
    _warned.add(name)
    import difflib

    near = difflib.get_close_matches(name, [_ENV_PREFIX + k.upper() for k in _KEYS], n=1)
    hint = f"; did you mean {near[0]}?" if near else ""
    print(f"roar: warning: {name} is not a roar setting, ignored{hint}", file=sys.stderr)


def load(
    cwd: str | os.PathLike | None = None,
    env: dict[str, str] | os._Environ | None = None,
    **overrides: Any,
) -> Config:
    """Resolve the configuration through the chain in the module docstring."""
    env = os.environ if env is None else env
    cwd = os.path.realpath(os.getcwd() if cwd is None else cwd)
    root = find_project_root(cwd)
    values: dict[str, Any] = {}
    py = os.path.join(root, "pyproject.toml")
    if os.path.isfile(py):
        table = _read_toml(py).get("tool", {}).get(TOOL_TABLE, {})
        values.update(_check_keys(table, f"{py} [tool.{TOOL_TABLE}]"))
    local = os.path.join(root, HOME_NAME, "config.toml")
    if os.path.isfile(local):
        values.update(_check_keys(_read_toml(local), local))
    values.update(_env_values(env))
    values.update(_check_keys({k: v for k, v in overrides.items() if v is not None},
                              "arguments"))
    cfg = Config(project_root=root, **values)
    home = clean_path(os.path.join(root, cfg.home))  # (an absolute home stays itself)
    if not cfg.namespace:
        raise ConfigError("namespace: must not be empty (Marquez breaks on empty names)")
    return cfg.replace(home=home)


def values(cfg: Config) -> dict[str, Any]:
    """A resolved configuration as JSON-ready keys: `load(cwd=cfg.project_root, env={},
    **values(cfg))` gives it back (another process recording for this one)."""
    out = {}
    for key in _KEYS:
        v = getattr(cfg, key)
        if v is None:
            continue
        out[key] = list(v) if isinstance(v, tuple) else v
    return out
