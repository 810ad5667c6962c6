"""What a Snakemake job object says about a job: its kind, its declared files, its code and
the fields of its `roar_snakemake` run facet (roar_core.pipeline.facets.RoarSnakemakeRunFacet).
Plain functions over the job; no tracing, no recording, nothing heavy imported."""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterable

from roar_core.pipeline.declared import Declared
from roar_core.pipeline.redact import is_secret_name, redact_text

log = logging.getLogger("roar")

KINDS = ("shell", "script", "wrapper", "notebook", "cwl", "template_engine")
# Flags that say something about the file (the rest are Snakemake bookkeeping).
FLAGS = ("temp", "protected", "touch", "directory", "pipe", "service", "ancient", "update",
         "nodelocal", "local", "before_update", "checkpoint_target")
_SORTED_FLAGS = tuple(sorted(FLAGS))


def kind(job) -> str:
    for name in KINDS:
        if getattr(job, f"is_{name}", False):
            return name
    return "norun" if job.is_norun else "run"


def _abs(path, cwd: str | None = None) -> str:
    # os.path.abspath asks the kernel for the cwd each time: callers with many paths pass it.
    return os.path.normpath(os.path.join(cwd or os.getcwd(), str(path)))


def flags(f) -> list[str]:
    # Runs for every file of every job, on Snakemake's threads: most files have no flags.
    fl = getattr(f, "flags", None)
    return [k for k in _SORTED_FLAGS if fl.get(k)] if fl else []


def streams(job) -> bool:
    """Reads or writes a pipe() or service() file (named pipes Snakemake removes as soon
    as the group is done)."""
    return any(k in flags(f) for f in [*job.input, *job.output] for k in ("pipe", "service"))


def _json_value(name: str, value):
    if isinstance(value, str):
        return "***" if is_secret_name(name) else redact_text(value)
    if value is None or isinstance(value, bool | int | float):
        return value
    try:
        return json.loads(json.dumps(value))
    except (TypeError, ValueError):
        return redact_text(repr(value))


def _named(items: Iterable[tuple[str, object]]) -> dict:
    return {str(k): _json_value(str(k), v) for k, v in items if not str(k).startswith("_")}


def secrets(job) -> tuple[str, ...]:
    """The job's parameters named like a secret (`api_key=...`): their values are masked
    in its command too, where Snakemake has put them."""
    return tuple(v for k, v in job.params.items() if isinstance(v, str) and v
                 and is_secret_name(str(k)))


def _params(params) -> dict:
    named = dict(params.items())
    out = _named(named.items())
    unnamed = [v for v in params if not any(v is n for n in named.values())]
    out.update({str(i): _json_value("", v) for i, v in enumerate(unnamed)})
    return out


def _resources(resources) -> dict:
    out = {}
    for name, value in resources.items():
        if name.startswith("_") or not isinstance(value, int | float | str):
            continue
        out[name] = value
    return out


def facet(job, files_kind: str) -> dict:
    cwd = os.getcwd()
    storage = [f.storage_object.query for f in [*job.input, *job.output]
               if getattr(f, "is_storage", False)]
    file_flags = {_abs(f, cwd): fl for f in [*job.input, *job.output] if (fl := flags(f))}
    fields = dict(
        rule=job.rule.name,
        jobid=int(job.jobid),
        kind=files_kind,
        wildcards={str(k): str(v) for k, v in job.wildcards.items()},
        params=_params(job.params) or None,
        threads=int(job.threads),
        resources=_resources(job.resources) or None,
        input=[_abs(f, cwd) for f in job.input],
        output=[_abs(f, cwd) for f in job.output],
        log=[_abs(f, cwd) for f in job.log] or None,
        benchmark=_abs(job.benchmark, cwd) if job.benchmark else None,
        flags=file_flags or None,
        checkpoint=bool(job.is_checkpoint),
        shadow=job.rule.shadow_depth or None,
        group=str(job.group) if job.group else None,
        storage=storage or None,
    )
    return {k: v for k, v in fields.items() if v is not None}


def command(job) -> list[str] | None:
    """argv of a shell: job as Snakemake runs it (other kinds: the first program the trace
    sees)."""
    if not job.is_shell:
        return None
    from snakemake.shell import shell

    return [shell.get_executable() or "/bin/sh", "-c", job.shellcmd]


def _source_path(job, path) -> str | None:
    """Local path of a script or notebook named by the rule (wildcards and params
    expanded, relative to the rule's Snakefile), or None for remote sources."""
    from snakemake.sourcecache import LocalSourceFile

    # The job's own resolver: expands wildcards/params and joins the rule's basedir.
    source = job._path_to_source_file(path)
    if isinstance(source, LocalSourceFile):
        return os.path.abspath(source.get_path_or_uri(secret_free=True))
    return None


def _wrapper_path(job, workflow) -> str | None:
    from snakemake.wrapper import find_extension, get_path

    source = get_path(job.rule.wrapper, prefix=workflow.workflow_settings.wrapper_prefix)
    script = find_extension(source, workflow.sourcecache)
    if isinstance(script, dict):  # no wrapper script found; Snakemake reports it
        return None
    path = script.get_path_or_uri(secret_free=True)
    if path.startswith("file://"):
        path = path[len("file://"):]
    if "://" not in path:
        return os.path.abspath(path)
    return workflow.sourcecache.get_path(script)  # a remote wrapper: the cached copy that ran


def workflow_sources(workflow) -> list[str]:
    """The Snakefiles and config files: what a spawned `python -m snakemake` reads to
    define the job (recorded as the job's code, not as its data)."""
    paths = [s.get_path_or_uri(secret_free=True) for s in workflow.included]
    paths += [str(c) for c in workflow.configfiles]
    return [os.path.abspath(p) for p in paths if "://" not in p]


def code_files(job, workflow, spawned: bool) -> list[str]:
    """The job's code: its script, notebook or wrapper (Snakemake runs a copy with a
    preamble, so the trace never sees the file itself); for spawned jobs the workflow
    sources too."""
    found: list[str | None] = []
    try:
        if job.is_script:
            found.append(_source_path(job, job.rule.script))
        elif job.is_notebook:
            found.append(_source_path(job, job.rule.notebook))
        elif job.is_wrapper:
            found.append(_wrapper_path(job, workflow))
        if spawned:
            found.extend(workflow_sources(workflow))
    except Exception as e:  # the code facet is a nicety: never fail the job for it
        log.debug("roar: code files of %s not found: %s", job, e)
    return [p for p in found if p]


def declared(job, workflow, spawned: bool) -> Declared:
    """Declared files as the job's processes should touch them.  touch() outputs are made
    by Snakemake after the job, so they are engine outputs, not expected writes; benchmark
    files are Snakemake's; storage files are read and written through local copies under
    .snakemake/ and only named in the facet."""
    cwd = os.getcwd()
    ins = [_abs(f, cwd) for f in job.input if not getattr(f, "is_storage", False)]
    touch = [_abs(f, cwd) for f in job.output if "touch" in flags(f)]
    outs = [_abs(f, cwd) for f in [*job.output, *job.log]
            if not getattr(f, "is_storage", False) and "touch" not in flags(f)]
    return Declared(inputs=ins, outputs=outs, code=code_files(job, workflow, spawned),
                    engine_outputs=touch)
