"""`shmcache run`'s flags are RunConfig's settings (consumer/config.py `setting`): one flag each,
the same names as the TOML file's keys, and the same config from either."""

from __future__ import annotations

import dataclasses

import pytest

from shmcache import cli
from shmcache.consumer.supervisor import policy as supervisor
from shmcache.consumer.config import RunConfig

SETTINGS = [f for f in dataclasses.fields(RunConfig) if "help" in f.metadata]
# a value for each setting other than its default, as a flag's text and as TOML
VALUES = {"name": "flags", "bootstrap": "b:1", "topic": "t", "group": "g", "instance_id": "i", "machine": "m",
          "memory": "8MiB", "memory_max": "64MiB", "grow_below": 600.0, "max_value": 100, "mode": 0o640, "reader_group": "root", "workers": 3, "format": "v2",
          "commit_interval": 2.5, "assignment": "range", "max_rate": 10, "metrics_port": 9100,
          "metrics_host": "0.0.0.0", "broker_wait": 5.0, "snapshot_dir": "/tmp/snaps", "snapshot_interval": 60.0,
          "snapshot_keep": 4, "snapshot_rate": "64MiB", "worker_heartbeat_timeout": 7.0,
          "worker_start_timeout": 30.0, "stop_timeout": 40.0, "accept_gaps": True}


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _argv(values: dict) -> list[str]:
    out = []
    for k, v in values.items():
        if v is True:
            out.append(_flag(k))
        else:
            out += [_flag(k), f"{v:o}" if k == "mode" else str(v)]
    return out


def _toml(values: dict) -> str:
    return "".join(f"{k} = {'true' if v is True else oct(v) if k == 'mode' else repr(v) if isinstance(v, str) else v}\n"
                   for k, v in values.items()).replace("'", '"')


@pytest.fixture
def built(monkeypatch):
    """What `shmcache run ARGS` would start the supervisor with."""
    monkeypatch.setattr(supervisor, "run", lambda cfg: cfg)
    return lambda *argv: (a := cli.parser().parse_args(["run", *argv])).fn(a)


def test_every_setting_has_a_value_here():
    assert sorted(VALUES) == sorted(f.name for f in SETTINGS)


def test_every_flag_is_a_setting_and_every_setting_a_flag():
    sub = cli.parser()._subparsers._group_actions[0].choices["run"]
    flags = {s for act in sub._actions for s in act.option_strings if s not in ("-h", "--help")}
    assert flags == {_flag(f.name) for f in SETTINGS} | {"--config", "--set"}


def test_flags_and_toml_give_the_same_config(built, tmp_path):
    by_flags = built(*_argv(VALUES), "--set", "fetch.max.bytes=1")
    f = tmp_path / "run.toml"
    f.write_text(_toml(VALUES) + '[kafka]\n"fetch.max.bytes" = "1"\n')
    by_toml = built("--config", str(f))
    assert by_flags.to_dict() == by_toml.to_dict()
    assert {k: getattr(by_flags, k) for k in VALUES} == VALUES


def test_a_flag_given_overrides_the_file_and_one_not_given_leaves_it(built, tmp_path):
    f = tmp_path / "run.toml"
    f.write_text(_toml(VALUES))
    cfg = built("--config", str(f), "--workers", "5")
    assert cfg.workers == 5 and cfg.snapshot_keep == 4 and cfg.accept_gaps is True


def test_without_a_file_the_defaults_are_the_fields(built):
    cfg = built("--name", "flags", "--bootstrap", "b:1", "--topic", "t")
    for f in SETTINGS:
        if f.default is not dataclasses.MISSING and f.name not in ("group", "instance_id", "machine"):
            assert getattr(cfg, f.name) == f.default, f.name
