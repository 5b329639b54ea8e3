"""Every retrieval policy by name: where its class lives and which config it takes (torch-free).

A new policy is one module with its class (and, if it has settings, its config dataclass) plus
one `register` line; its command-line flags and server settings follow from the config's field
metadata (`configs.flag`).
"""

from __future__ import annotations

import dataclasses
import importlib

from vidsight.errors import ConfigError
from vidsight.kv.policies.configs import MosaicConfig, ReKVConfig, ReSVConfig, RecentConfig


@dataclasses.dataclass(frozen=True)
class PolicySpec:
    """A registered policy.

    Attributes:
        name: What users call it (``--policy NAME``).
        target: ``module:Class`` of the policy, imported when one is made.
        config: Its settings' dataclass (None: it takes none); called ``Class(config)``.
    """

    name: str
    target: str
    config: type | None = None

    def load(self) -> type:
        module, _, name = self.target.partition(":")
        return getattr(importlib.import_module(module), name)


POLICIES: dict[str, PolicySpec] = {}


def register(name: str, target: str, config: type | None = None) -> PolicySpec:
    """Make a policy available by ``name`` (``target``: ``module:Class``)."""
    if not name.isidentifier():
        raise ConfigError(f"a policy name must be an identifier, got {name!r}")
    POLICIES[name] = spec = PolicySpec(name, target, config)
    return spec


register("full", "vidsight.kv.policies.full:FullPolicy")
register("recent", "vidsight.kv.policies.recent:RecentPolicy", RecentConfig)
register("rekv", "vidsight.kv.policies.rekv:ReKVPolicy", ReKVConfig)
register("mosaic", "vidsight.kv.policies.mosaic:MosaicPolicy", MosaicConfig)
register("resv", "vidsight.kv.policies.resv:ReSVPolicy", ReSVConfig)


def spec_of(name: str) -> PolicySpec:
    if name not in POLICIES:
        raise ConfigError(f"unknown KV policy {name!r}; choose one of {', '.join(POLICIES)}")
    return POLICIES[name]


def policy_config(label: str, **settings):
    """The config of the policy ``label`` names, built from ``settings`` (its fields); None for a
    policy without settings. ``label`` may fix settings itself, ``name:field=value,...``; those win."""
    name, _, fixed = label.partition(":")
    spec = spec_of(name)
    if fixed:
        if spec.config is None:
            raise ConfigError(f"the {name} policy takes no settings, got {fixed!r}")
        settings = {**settings, **parse_settings(spec.config, fixed, label)}
    if spec.config is None:
        if settings:
            raise ConfigError(f"the {name} policy takes no settings, got {', '.join(settings)}")
        return None
    try:
        return spec.config(**settings)
    except TypeError as exc:
        raise ConfigError(f"{label}: {exc}") from None


def make_policy(label: str, **settings):
    """A policy by name, its config built from ``settings`` (see `policy_config`)."""
    spec = spec_of(label.partition(":")[0])
    config = policy_config(label, **settings)
    policy = spec.load()
    return policy() if config is None else policy(config)


def parse_settings(config: type, text: str, label: str) -> dict:
    """``field=value,...`` into the config's field types."""
    defaults = {f.name: f.default for f in dataclasses.fields(config)}
    out = {}
    for item in text.split(","):
        field, _, value = item.partition("=")
        if field not in defaults or not value:
            raise ConfigError(f"{label}: expected field=value with a field of {', '.join(defaults)}; got {item!r}")
        out[field] = parse_value(type(defaults[field]), value, f"{label}: {field}")
    return out


def parse_value(kind: type, text: str, what: str):
    """A setting written in a label, as its field's type."""
    if kind is bool:
        if text.lower() in ("1", "true", "yes", "0", "false", "no"):
            return text.lower() in ("1", "true", "yes")
        raise ConfigError(f"{what} takes true or false, got {text!r}")
    try:
        return kind(text)
    except ValueError:
        raise ConfigError(f"{what} takes a {kind.__name__}, got {text!r}") from None


@dataclasses.dataclass(frozen=True)
class PolicyFlag:
    """One command-line flag (and server setting) derived from the policies' configs.

    Attributes:
        flag: ``--top-frames``.
        field: The config field it sets, in every policy of ``policies``.
        kind: The field's type (a switch sets ``switch``).
        policies: The policies that declare it, each with its help and default.
        switch: For a flag without a value: what it sets the field to.
    """

    flag: str
    field: str
    kind: type
    policies: tuple[tuple[str, str, object], ...]
    switch: object = None

    @property
    def help(self) -> str:
        """Each policy's help with its default, joined where the policies agree."""
        def default(values: list) -> str:
            if self.switch is not None:
                return ""
            if len(set(map(str, values))) == 1:
                return f" (default: {values[0]})"
            return " (default: " + ", ".join(f"{name} {value}" for name, _, value in self.policies) + ")"

        texts = {text for _, text, _ in self.policies}
        if len(texts) == 1:
            names = ", ".join(name for name, _, _ in self.policies)
            return f"{names}: {texts.pop()}{default([value for _, _, value in self.policies])}"
        return "; ".join(f"{name}: {text}{default([value])}" for name, text, value in self.policies)


def policy_flags() -> dict[str, PolicyFlag]:
    """Every flag the registered policies' configs declare, in registration order."""
    found: dict[str, dict] = {}
    for spec in POLICIES.values():
        for field in dataclasses.fields(spec.config) if spec.config is not None else ():
            if "flag" not in field.metadata:
                continue
            entry = found.setdefault(field.metadata["flag"], {"field": field.name, "kind": type(field.default),
                                                              "switch": field.metadata.get("switch"), "policies": []})
            if entry["field"] != field.name:
                raise ConfigError(f"{field.metadata['flag']} sets {entry['field']} in one policy and {field.name} "
                                  f"in {spec.name}")
            entry["policies"].append((spec.name, field.metadata["help"], field.default))
    return {flag: PolicyFlag(flag, e["field"], e["kind"], tuple(e["policies"]), e["switch"])
            for flag, e in found.items()}
