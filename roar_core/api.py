"""The core's entry point: one Roar per configuration holds the store, the spool, the
hasher and the LineageWriter that stores a task and spools its events.

    roar = Roar()                                   # config from the standard chain
    wf = roar.start_workflow("my_dag", engine="airflow")
    ...tasks are recorded by roar_core.recording (task logs and the recorder process)...
    roar.finish_workflow(wf, "COMPLETE")
    roar.close()

Tasks reach it one way only: their producers' task logs, followed by the recorder process
(roar_core.recording), which calls `roar.writer`.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable
from datetime import datetime

from roar_core import config as config_mod
from roar_core.pipeline import emission
from roar_core.pipeline.classification import PathFilter
from roar_core.pipeline.hashing import Hasher, StatCache
from roar_core.pipeline.spool import Spool
from roar_core.pipeline.store import Store, StoreError, WorkflowRun
from roar_core.pipeline.writer import LineageWriter, now

log = logging.getLogger(__name__)


def default_client(cfg: config_mod.Config, create: bool = True):
    """The OpenLineage client: configured the standard ways when the user configured it;
    otherwise (embedded defaults) a file transport under the roar home (`create`: its
    directory made now; a look at the configuration, `doctor`, creates nothing)."""
    from openlineage.client import OpenLineageClient
    from openlineage.client.transport.file import FileConfig, FileTransport

    from roar_core.pipeline.delivery import Client

    # The client's own search (OPENLINEAGE_CONFIG, ./openlineage.yml,
    # ~/.openlineage/openlineage.yml) decides whether a config file exists.
    configured = any(k.startswith("OPENLINEAGE_") and k != "OPENLINEAGE_NAMESPACE"
                     for k in os.environ) or OpenLineageClient._find_yaml_config_path()
    if configured:
        return Client()
    out = os.path.join(cfg.home, "openlineage", "events.jsonl")
    if create:
        os.makedirs(os.path.dirname(out), exist_ok=True)
    return Client(transport=FileTransport(
        FileConfig(log_file_path=out, append=True)))


class Roar:
    def __init__(self, cfg: config_mod.Config | None = None, *,
                 internal: Iterable[str | os.PathLike] = (), client=None,
                 progress: Callable[[int, int], None] | None = None,
                 use_mmap: bool = True, send: bool = True, idle_checkpoints: bool = False):
        """`internal`: roar's own directories (never lineage); `progress(done, total)`:
        as a task's files are hashed; `send=False`: no sender thread (events go out by
        `spool.flush`, or by another process: the recorder's sender);
        `idle_checkpoints`: the caller checkpoints the store (`Store.open`)."""
        self.config = cfg or config_mod.load()
        c = self.config
        try:
            os.makedirs(c.home, exist_ok=True)
        except OSError as e:
            raise StoreError(f"cannot create roar home {c.home}: {e.strerror or e}") from None
        self.store = Store.open(url=c.database_url, home=c.home,
                                idle_checkpoints=idle_checkpoints)
        # send=False: no sender thread; events are delivered by `spool.flush` (or later by
        # another process) only.
        self.spool = (Spool(c.spool_dir, client=client or default_client(c), start=send)
                      if c.emit else None)
        self.cache = StatCache(c.statcache_path)
        self.hasher = Hasher(self.cache, workers=c.hash_workers or None, use_mmap=use_mmap,
                             native=c.native_hash)
        keep = PathFilter.for_config(c, internal)
        self.writer = LineageWriter(self.store, self.spool, self.hasher, keep, c.file_host,
                                    progress, match_min_size=c.match_min_size)
        self._engines: dict[str, emission.Engine] = {}  # workflow run -> its engine
        # Workflow events of callers in this process (Ray's driver) the spool refused:
        # offered again, in order, before the next one and at `close`.
        self._kept: list = []

    # ---- workflow runs ---------------------------------------------------------------

    def start_workflow(self, job_name: str, engine: str, run_id: str | None = None,
                       facets: dict | None = None,
                       engine_version: emission.Engine | None = None,
                       started_at: datetime | None = None) -> emission.RunRef:
        """`engine_version`: the engine that runs the workflow, its `processing_engine`
        facet on the workflow run's events."""
        ref = emission.RunRef(self.config.namespace, job_name, run_id or emission.new_run_id())
        self._kept += self.workflow_started(ref, engine, facets, engine_version, started_at,
                                            hold=self._offer_kept())
        return ref

    def hand_over_kept(self) -> bool:
        """Let go of the kept workflow events (True where there were some): their producer
        has logged them for a recorder, which sends them under its own failure policy and
        outlives this process should it be killed (Ray's driver: a START the spool
        refused)."""
        kept, self._kept = self._kept, []
        return bool(kept)

    def _offer_kept(self) -> bool:
        """Offer the kept workflow events again; True while some are still refused."""
        if self._kept:
            self._kept = self.writer.spool_events(self._kept)
        return bool(self._kept)

    def workflow_started(self, ref: emission.RunRef, engine: str, facets: dict | None = None,
                         engine_version: emission.Engine | None = None,
                         started_at: datetime | None = None, *, stored: bool = False,
                         hold: bool = False) -> list:
        """Store a workflow run's start (`stored`: it is, by a recorder that died before it
        could say its START was spooled) and spool its START; returns the START where it
        is not spooled (see `LineageWriter.spool_events`)."""
        started = started_at or now()
        if not stored:
            self.store.start_workflow_run(WorkflowRun(ref.run_id, engine, ref.namespace,
                                                      ref.job_name, started, facets or {}))
        if engine_version is not None:
            self._engines[ref.run_id] = engine_version
        return self.writer.spool_events([emission.workflow_start(emission.WorkflowLineage(
            namespace=ref.namespace, job_name=ref.job_name, run_id=ref.run_id,
            event_time=started, engine=engine_version))], hold)

    def finish_workflow(self, ref: emission.RunRef, status: str = "COMPLETE",
                        error: str | None = None,
                        engine_version: emission.Engine | None = None,
                        ended_at: datetime | None = None) -> None:
        self._kept += self.workflow_finished(ref, status, error, engine_version, ended_at,
                                             hold=self._offer_kept())

    def workflow_finished(self, ref: emission.RunRef, status: str = "COMPLETE",
                          error: str | None = None,
                          engine_version: emission.Engine | None = None,
                          ended_at: datetime | None = None, *, hold: bool = False) -> list:
        """Store a workflow run's end and spool its event; returns it where it is not
        spooled (see `workflow_started`)."""
        ended = ended_at or now()
        self.store.finish_workflow_run(ref.run_id, status, ended)
        engine = self._engines.pop(ref.run_id, None) or engine_version
        w = emission.WorkflowLineage(namespace=ref.namespace, job_name=ref.job_name,
                                     run_id=ref.run_id, event_time=ended, error_message=error,
                                     engine=engine)
        make = {"COMPLETE": emission.workflow_complete, "FAIL": emission.workflow_fail,
                "ABORT": emission.workflow_abort}[status]
        return self.writer.spool_events([make(w)], hold)

    def close(self, timeout: float = 10.0) -> None:
        if self._offer_kept():
            log.error("roar: %d workflow event(s) lost: the OpenLineage spool %s refuses "
                      "them", len(self._kept), self.config.spool_dir)
        if self.spool is not None:
            if timeout > 0:
                self.spool.flush(timeout)
            self.spool.close()
        self.hasher.close()
        self.cache.close()
        self.store.close()

