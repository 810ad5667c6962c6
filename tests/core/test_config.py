from __future__ import annotations

from pathlib import Path

import pytest

from roar_core.config import ConfigError, load


def write(p: Path, text: str) -> Path:
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text)
    return p


def test_defaults_put_home_under_the_project(tmp_path):
    cfg = load(cwd=tmp_path, env={})
    assert cfg.home == str(tmp_path / ".roar-core") and cfg.database_url is None
    assert cfg.namespace == "roar" and cfg.emit and not cfg.disabled


def test_precedence_pyproject_then_local_then_env_then_arguments(tmp_path):
    write(tmp_path / "pyproject.toml",
          '[tool.roar-core]\nnamespace = "from-pyproject"\nexclude = ["*.log"]\nhash_workers = 2\n')
    write(tmp_path / ".roar-core" / "config.toml", 'namespace = "from-local"\n')
    sub = tmp_path / "a" / "b"
    sub.mkdir(parents=True)
    cfg = load(cwd=sub, env={})
    assert cfg.project_root == str(tmp_path)  # found from a subdirectory
    assert cfg.namespace == "from-local" and cfg.exclude == ("*.log",) and cfg.hash_workers == 2
    cfg = load(cwd=sub, env={"ROAR_NAMESPACE": "from-env", "ROAR_EMIT": "false"})
    assert cfg.namespace == "from-env" and cfg.emit is False
    cfg = load(cwd=sub, env={"ROAR_NAMESPACE": "from-env"}, namespace="from-arg")
    assert cfg.namespace == "from-arg"


def test_roar_home_env_and_relative_home(tmp_path):
    write(tmp_path / ".roar-core" / "config.toml", 'home = "state"\n')
    assert load(cwd=tmp_path, env={}).home == str(tmp_path / "state")
    assert load(cwd=tmp_path, env={"ROAR_HOME": str(tmp_path / "x")}).home == str(tmp_path / "x")


def test_a_home_is_spelled_one_way_however_it_is_written(tmp_path, monkeypatch):
    """Paths are strings (no pathlib on `roar-core run`'s path), spelled as pathlib would:
    the runner tells the home's runs from the spare directory's by comparing them."""
    monkeypatch.setenv("HOME", str(tmp_path))
    want = str(tmp_path / "x" / "y")
    for spelled in (f"{tmp_path}//x/./y/", "~/x/y", f"{tmp_path}/./x//y"):
        cfg = load(cwd=tmp_path, env={"ROAR_HOME": spelled})
        assert cfg.home == want, spelled
        assert cfg.sessions_dir == want + "/sessions" and cfg.spool_dir == want + "/spool"
    assert load(cwd=tmp_path, env={}, home=Path("rel/./h/")).home == str(tmp_path / "rel" / "h")
    assert load(cwd=tmp_path, env={"ROAR_HOME": "a/../b"}).home == str(tmp_path / "a/../b")


@pytest.mark.parametrize(
    "where, text, key",
    [
        ("pyproject.toml", "[tool.roar-core]\nnamespce = 'typo'\n", "namespce"),
        (".roar-core/config.toml", "databse_url = 'x'\n", "databse_url"),
    ],
)
def test_unknown_keys_are_named(tmp_path, where, text, key):
    write(tmp_path / where, text)
    with pytest.raises(ConfigError) as e:
        load(cwd=tmp_path, env={})
    msg = str(e.value)
    assert f"'{key}'" in msg and "\n" not in msg and "valid keys" in msg


def test_unknown_env_variable_is_a_warning_naming_the_nearest_key(tmp_path, capsys):
    """Not an error (a user's own ROAR_* variable made every command exit 2): ignored,
    said once, with the setting it most likely meant."""
    cfg = load(cwd=tmp_path, env={"ROAR_NAMSPACE": "x", "ROAR_MY_OWN_THING": "1"})
    assert cfg.namespace == load(cwd=tmp_path, env={}).namespace  # the default
    err = capsys.readouterr().err.splitlines()
    assert "roar: warning: ROAR_NAMSPACE is not a roar setting, ignored; did you mean " \
        "ROAR_NAMESPACE?" in err
    assert any(line.startswith("roar: warning: ROAR_MY_OWN_THING is not") for line in err)
    load(cwd=tmp_path, env={"ROAR_NAMSPACE": "x"})
    assert capsys.readouterr().err == ""  # once per process
    # Tracer plumbing variables are not config keys and are accepted silently.
    load(cwd=tmp_path, env={"ROAR_SESSION_DIR": "/x", "ROAR_TASK_TAG": "t"})
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("env", [{"ROAR_HASH_WORKERS": "many"}, {"ROAR_EMIT": "perhaps"}])
def test_bad_values(tmp_path, env):
    with pytest.raises(ConfigError, match="bad value"):
        load(cwd=tmp_path, env=env)


def test_invalid_toml_is_one_line(tmp_path):
    write(tmp_path / ".roar-core" / "config.toml", "namespace = \n")
    with pytest.raises(ConfigError, match="invalid TOML"):
        load(cwd=tmp_path, env={})


def test_empty_namespace_rejected(tmp_path):
    with pytest.raises(ConfigError, match="namespace"):
        load(cwd=tmp_path, env={"ROAR_NAMESPACE": ""})


def test_the_two_switches_cannot_be_mistaken(tmp_path, capsys):
    """ROAR_DISABLE (tracer off, recorded as untraced) and ROAR_DISABLED (record nothing)
    differed by a letter: the tracer switch is ROAR_TRACER_OFF now, and the old name gets
    the warning of an unknown variable, naming the kill switch."""
    assert load(cwd=tmp_path, env={"ROAR_DISABLED": "1"}).disabled
    cfg = load(cwd=tmp_path, env={"ROAR_DISABLE": "1", "ROAR_TRACER_OFF": "1"})
    assert not cfg.disabled
    err = capsys.readouterr().err.splitlines()
    assert err == ["roar: warning: ROAR_DISABLE is not a roar setting, ignored; did you mean "
                   "ROAR_DISABLED?"]
