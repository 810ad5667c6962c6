"""Snakemake executor plugin `roar`: run jobs locally, traced, with their lineage recorded.

    pip install "roar-core[snakemake]"
    snakemake --executor roar -j 4 [--roar-workflow-name NAME] [--roar-home DIR] ...

Snakemake imports every installed executor plugin on every command, and a plugin that fails
to import breaks them all.  So importing this package does nothing heavy (roar_core is loaded
only when the executor starts) and can never raise: if the executor cannot be loaded, a
stand-in with the same name is registered that explains why when someone selects it.
"""

try:
    from snakemake_executor_plugin_roar.executor import Executor, ExecutorSettings, common_settings
except Exception as _error:  # noqa: BLE001 - any failure here would break all of Snakemake
    _reason = f"{type(_error).__name__}: {_error}"
    try:
        from snakemake_interface_executor_plugins.executors.real import RealExecutor
        from snakemake_interface_executor_plugins.settings import CommonSettings

        common_settings = CommonSettings(
            non_local_exec=False, implies_no_shared_fs=False, job_deploy_sources=False)

        class Executor(RealExecutor):  # type: ignore[no-redef]
            def __new__(cls, *args, **kwargs):
                raise RuntimeError(f"the roar executor cannot be loaded here ({_reason}); "
                                   "reinstall with: pip install 'roar-core[snakemake]'")
    except Exception:  # noqa: BLE001 - no Snakemake interface at all: nothing to register
        pass

__all__ = ["Executor", "ExecutorSettings", "common_settings"]

