"""`shmcache run`: the supervisor daemon (consumer/supervisor/policy.py), from flags or a TOML file.

Its flags are RunConfig's settings (consumer/config.py `setting`): each one's name, help and
default are said there once, so the command line and the TOML file take the same names. A flag
not given is None here and leaves the TOML file's value or the field's default.
"""

from __future__ import annotations

import dataclasses

from shmcache.cli.args import key_values, mode_arg

HELP = "run the supervisor daemon: keep a cache filled from a Kafka topic"

_TYPES = {"int": int, "float": float, "int | None": int}  # a field's annotation: how its flag's text is read


def _settings() -> list[dataclasses.Field]:
    """RunConfig's fields that are flags, in its order."""
    from shmcache.consumer.config import RunConfig

    return [f for f in dataclasses.fields(RunConfig) if "help" in f.metadata]


def _flag(f: dataclasses.Field) -> str:
    return f"--{f.name.replace('_', '-')}"


def add_arguments(rn) -> None:
    rn.add_argument("--config", help="a TOML file with these settings (flags override it)")
    for f in _settings():
        flag = _flag(f)
        kw = {k: v for k, v in f.metadata.items() if k != "octal"}
        if f.type == "bool":
            rn.add_argument(flag, action="store_true", default=None, **kw)
        else:
            rn.add_argument(flag, type=mode_arg if f.metadata.get("octal") else _TYPES.get(f.type), **kw)
    rn.add_argument("--set", action="append", metavar="KEY=VALUE", help="a librdkafka setting, repeatable")


def run(a) -> int:
    from shmcache.consumer.supervisor import policy as supervisor
    from shmcache.consumer.config import RunConfig

    fields = _settings()
    flags = {f.name: getattr(a, f.name) for f in fields}
    kafka = key_values(a.set, "shmcache: --set", "a librdkafka setting")
    if a.config:
        cfg = RunConfig.from_toml(a.config, **flags)
        cfg.kafka.update(kafka)
        cfg.validate()
    else:
        missing = [_flag(f) for f in fields if f.default is dataclasses.MISSING and not flags[f.name]]
        if missing:
            raise SystemExit(f"shmcache run: give {', '.join(missing)} (or --config FILE)")
        cfg = RunConfig(**{k: v for k, v in flags.items() if v is not None}, kafka=kafka)
    return supervisor.run(cfg)
