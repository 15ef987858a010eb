"""Reading and checking the sources of ``murmur run``'s settings against the schema of
:mod:`node.settings`: a TOML file, the ``MURMUR_*`` environment variables, the flags.

Sources, lowest first: the defaults, ``--config FILE``, the environment, the flags. Each source
is validated on its own (a file's values are typed, so strictly: ``insecure = "false"`` is a
string, not a bool; the environment's and the flags' are strings, so they are parsed), so that
an error names the file and line, the variable or the flag, the key, the value and what was
expected, with the nearest valid key for an unknown one. The sources are then merged, and the
checks that involve several keys run on the result.
"""

from __future__ import annotations

import difflib
import os
import re
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from pydantic_settings import EnvSettingsSource
from pydantic_settings.sources.utils import parse_env_vars

from node.settings import (
    ENV_NOT_SETTINGS,
    ENV_PREFIX,
    FLAG_KEYS,
    SECTIONS,
    RunSettings,
    keys,
)
from node.settings_checks import Origin, SettingsError, check_together, toml_repr

__all__ = ["Origin", "SettingsError", "load_settings"]


def _names() -> dict[str, str]:
    """Every name a key may go by (normalised to underscores) -> its dotted key."""
    out: dict[str, str] = {}
    for key in keys():
        out[key] = key
        leaf = key.rpartition(".")[2]
        if "." not in key:
            out[leaf] = key
    for flag, key in FLAG_KEYS.items():
        out[flag.replace("-", "_")] = key
    return out


def _nearest(name: str, section: str | None) -> str | None:
    """The dotted key nearest to a name nobody knows, if one is near."""
    n = name.replace("-", "_")
    if section is not None:
        in_section = [k.rpartition(".")[2] for k in keys() if k.startswith(section + ".")]
        close = difflib.get_close_matches(n, in_section, n=1, cutoff=0.6)
        if close:
            return f"{section}.{close[0]}"
    names = _names()
    leaves = {k.rpartition(".")[2]: k for k in keys() if "." in k}
    close = difflib.get_close_matches(n, [*names, *leaves], n=1, cutoff=0.6)
    if not close:
        return None
    return names.get(close[0]) or leaves[close[0]]


def _suggest(name: str, section: str | None) -> str:
    """ "; did you mean X?" for the nearest known key, or nothing."""
    key = _nearest(name, section)
    return f"; did you mean {key}?" if key else ""


def _resolve(name: str, section: str | None) -> str | None:
    """The dotted key that ``name`` (in ``[section]``, or at the top) means; None if none."""
    n = name.replace("-", "_")
    if section is not None:
        if f"{section}.{n}" in keys():
            return f"{section}.{n}"
        flagged = FLAG_KEYS.get(name.replace("_", "-"))
        return flagged if flagged and flagged.startswith(section + ".") else None
    if n == "shard":
        return "shard"
    return _names().get(n)


def _split_shard(text: object, origin: Origin) -> tuple[object, object]:
    index, sep, count = str(text).partition("/")
    if not isinstance(text, str) or not sep or not index.isdigit() or not count.isdigit():
        raise SettingsError(f"{origin.show()}: expected I/N, e.g. 1/4")
    return index, count


def _put(tree: dict[str, Any], key: str, value: Any) -> None:
    section, dot, name = key.rpartition(".")
    (tree.setdefault(section, {}) if dot else tree)[name] = value


def _line_of(lines: list[str], section: str | None, name: str) -> int | None:
    table = None
    for number, line in enumerate(lines, 1):
        stripped = line.strip()
        header = re.fullmatch(r"\[\s*([\w.-]+)\s*\]\s*(#.*)?", stripped)
        if header:
            table = header.group(1)
        elif table == section and re.match(rf"""["']?{re.escape(name)}["']?\s*=""", stripped):
            return number
    return None


def _file_source(path: Path) -> tuple[dict[str, Any], dict[str, Origin]]:
    """The file's values as a tree of dotted keys, and where each came from."""
    try:
        text = path.read_text()
    except OSError as err:
        raise SettingsError(f"{path}: cannot read the config file: {err.strerror}") from None
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        raise SettingsError(f"{path}: not valid TOML: {err}") from None
    lines = text.splitlines()
    tree: dict[str, Any] = {}
    origins: dict[str, Origin] = {}

    def add(section: str | None, name: str, value: Any) -> None:
        line = _line_of(lines, section, name)
        where = f"{path} line {line}" if line else str(path)
        label = f"[{section}] {name}" if section else name
        origin = Origin(where, label, value, "file")
        key = _resolve(name, section)
        if key is None:
            dotted = f"{section}.{name}" if section else name
            raise SettingsError(f"{where}: unknown key {dotted}{_suggest(name, section)}")
        if key == "shard":
            index, count = _split_shard(value, origin)
            for k, v in (("shard_index", int(str(index))), ("shard_count", int(str(count)))):
                _put(tree, k, v)
                origins[k] = origin
            return
        _put(tree, key, value)
        origins[key] = origin

    for name, value in raw.items():
        if name in SECTIONS:
            if not isinstance(value, dict):
                raise SettingsError(f"{path}: {name} must be a table, [{name}]")
            for sub, sub_value in value.items():
                add(name, sub, sub_value)
        else:
            add(None, name, value)
    return tree, origins


def _env_name(key: str) -> str:
    return ENV_PREFIX + key.replace(".", "__").upper()


class _Environment(EnvSettingsSource):
    """pydantic-settings' reader of the environment, on a given mapping (tests pass theirs)."""

    def __init__(self, environ: Mapping[str, str]) -> None:
        self._environ = environ
        super().__init__(
            RunSettings,  # type: ignore[arg-type]  # its fields are all a source needs
            case_sensitive=False,
            env_prefix=ENV_PREFIX,
            env_nested_delimiter="__",
        )

    def _load_env_vars(self) -> Mapping[str, str | None]:
        return parse_env_vars(self._environ, self.case_sensitive, False, None)


def _env_source(environ: Mapping[str, str]) -> tuple[dict[str, Any], dict[str, Origin]]:
    """The ``MURMUR_*`` variables, read by pydantic-settings. A variable may also be named after
    a flag (``MURMUR_STEPS``, ``MURMUR_COMPRESS``); an unknown one is refused."""
    known = {_env_name(k): k for k in keys()}
    ours: dict[str, str] = {}
    origins: dict[str, Origin] = {}
    for name in sorted(environ):
        upper = name.upper()
        if not upper.startswith(ENV_PREFIX) or upper in ENV_NOT_SETTINGS:
            continue
        rest = upper.removeprefix(ENV_PREFIX).lower()
        key = known.get(upper) or _resolve(rest.replace("__", "."), None)
        if key is None:
            near = _nearest(rest.replace("__", "."), None)
            hint = f"; did you mean {_env_name(near)}?" if near else ""
            raise SettingsError(f"the environment: unknown setting {name}{hint}")
        if key == "shard":
            index, count = _split_shard(environ[name], Origin("", name, environ[name], "env"))
            ours[_env_name("shard_index")], ours[_env_name("shard_count")] = str(index), str(count)
            for k in ("shard_index", "shard_count"):
                origins[k] = Origin("the environment", name, environ[name], "env")
            continue
        ours[_env_name(key)] = environ[name]
        origins[key] = Origin("the environment", name, environ[name], "env")
    tree = _Environment(ours)()
    return tree, origins


def _flag_source(
    flags: Mapping[str, Any], labels: Mapping[str, str]
) -> tuple[dict[str, Any], dict[str, Origin]]:
    """Flags as argparse left them (strings, lists of strings, True for a switch)."""
    tree: dict[str, Any] = {}
    origins: dict[str, Origin] = {}
    for key, value in flags.items():
        label = labels.get(key, "--" + key.rpartition(".")[2].replace("_", "-"))
        shown = " ".join(value) if isinstance(value, list) else value
        origin = Origin("the command line", label, shown, "flag")
        if key == "shard":
            index, count = _split_shard(value, origin)
            for k, v in (("shard_index", index), ("shard_count", count)):
                _put(tree, k, v)
                origins[k] = origin
            continue
        _put(tree, key, value)
        origins[key] = origin
    return tree, origins


_PROBLEMS = {
    "int_type": "expected a whole number",
    "int_parsing": "expected a whole number",
    "int_from_float": "expected a whole number",
    "float_type": "expected a number",
    "float_parsing": "expected a number",
    "bool_type": "expected true or false",
    "bool_parsing": "expected true or false",
    "string_type": "expected a string, in quotes",
    "tuple_type": "expected a list",
    "list_type": "expected a list",
    "model_type": "expected a table",
    "dict_type": "expected a table",
    "greater_than_equal": "must be at least {ge}",
    "greater_than": "must be more than {gt}",
    "less_than_equal": "must be at most {le}",
    "less_than": "must be less than {lt}",
    "multiple_of": "must be a multiple of {multiple_of}",
    "literal_error": "expected one of {expected}",
    "string_too_short": "must not be empty",
}


def _problem(error: Mapping[str, Any], origin: Origin | None) -> str:
    kind = str(error["type"])
    template = _PROBLEMS.get(kind)
    if template is None:
        text = str(error["msg"]).removeprefix("Value error, ")
    else:
        text = template.format(**error.get("ctx", {}))
    raw = origin.raw if origin else None
    if origin is not None and origin.kind == "file":
        if isinstance(raw, str) and kind.endswith("_type") and kind != "string_type":
            text += f", not the string {toml_repr(raw)} (write it without quotes)"
        elif kind.endswith("_type"):
            text += f", not {type(raw).__name__} {toml_repr(raw)}"
    return text


def _validate(
    model: type[RunSettings],
    tree: dict[str, Any],
    origins: Mapping[str, Origin],
    strict: bool,
) -> dict[str, Any]:
    """Validate one source on its own; returns the values it set, typed.

    A file's values are typed, and validated strictly; the environment's and the flags' are
    strings, which are parsed (``"20"`` is 20 there, ``"2.5"`` still no integer).
    """
    try:
        settings = model.model_validate(tree, strict=strict)
    except ValidationError as err:
        problems = []
        for e in err.errors():
            loc = [str(part) for part in e["loc"] if not isinstance(part, int)]
            key = ".".join(loc[:2]) if loc and loc[0] in SECTIONS else (loc[0] if loc else "")
            origin = origins.get(key)
            where = origin.show() if origin else key
            problems.append(f"{where}: {_problem(e, origin)}")
        raise SettingsError("\n".join(dict.fromkeys(problems))) from None
    dumped: dict[str, Any] = settings.model_dump(exclude_unset=True)
    return dumped


def _merge(base: dict[str, Any], top: dict[str, Any]) -> None:
    for key, value in top.items():
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            base[key].update(value)
        else:
            base[key] = value


def load_settings(
    config_file: Path | None = None,
    environ: Mapping[str, str] | None = None,
    flags: Mapping[str, Any] | None = None,
    flag_labels: Mapping[str, str] | None = None,
) -> RunSettings:
    """The settings of ``murmur run`` from its sources, each validated, then merged.

    Args:
        config_file: the ``--config`` TOML file, if any.
        environ: the environment (``os.environ`` when None).
        flags: the flags given, by dotted key (``trainer.steps``; ``shard`` as ``I/N``), as
            argparse parsed them: strings, lists of strings, True for a switch.
        flag_labels: how each flag's key is spelled on the command line (``--steps``).

    Raises:
        SettingsError: a value was refused; its message says where, which, what and why.
    """
    origins: dict[str, Origin] = {}
    merged: dict[str, Any] = {}
    sources = []
    if config_file is not None:
        sources.append((*_file_source(config_file), True))
    sources.append((*_env_source(os.environ if environ is None else environ), False))
    sources.append((*_flag_source(flags or {}, flag_labels or {}), False))
    for tree, source_origins, strict in sources:
        _merge(merged, _validate(RunSettings, tree, source_origins, strict))
        origins.update(source_origins)
    settings = RunSettings.model_validate(merged)
    check_together(settings, origins)
    return settings
