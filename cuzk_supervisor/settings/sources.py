"""Where settings come from: flag > environment > file > image file > default (``load``).

Flags arrive as a mapping (``from_namespace`` takes an argparse namespace: flags left unset are
absent from it, so the lower sources show through); variables are ``CUZK_SUPERVISOR_<NAME>``;
the file is TOML (``--config-file`` or ``CUZK_SUPERVISOR_CONFIG_FILE``) whose tables flatten:
``[daemon] binary = ...`` is ``daemon_binary``. The image file is the same TOML at
``IMAGE_SETTINGS_FILE`` (``CUZK_SUPERVISOR_IMAGE_SETTINGS_FILE`` moves it), written at build time
by ``settings.bake``; it is read only where it exists.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cuzk_supervisor.adapters.inputfile import read_toml
from cuzk_supervisor.errors import UsageError
from cuzk_supervisor.settings.declare import (
    CONFIG_FILE_ENV,
    IMAGE_SETTINGS_FILE,
    IMAGE_SETTINGS_FILE_ENV,
    MAX_SETTINGS_FILE_BYTES,
)
from cuzk_supervisor.settings.fields import Settings
from cuzk_supervisor.settings.values import Declared, declarations, parse_value


def _file_values(path: Path, what: str = "settings file") -> dict[str, Any]:
    document = read_toml(path, what=what, max_bytes=MAX_SETTINGS_FILE_BYTES)
    flat: dict[str, Any] = {}
    for key, value in document.items():
        if isinstance(value, dict):  # [daemon] binary = ... is daemon_binary
            for inner, inner_value in value.items():
                flat[f"{key}_{inner}"] = inner_value
        else:
            flat[key] = value
    known = {decl.name for decl in declarations()}
    unknown = sorted(set(flat) - known)
    if unknown:
        raise UsageError(f"{what} {path}: unknown setting(s) {', '.join(unknown)}")
    return flat


def image_settings_path(environ: Mapping[str, str]) -> Path:
    """Where the image's baked settings are (they are read only if the file exists)."""
    return Path(environ.get(IMAGE_SETTINGS_FILE_ENV) or IMAGE_SETTINGS_FILE)


def _image_values(path: Path) -> dict[str, Any]:
    """The baked settings; none where the file is absent. A dangling link or an unreadable
    file is the image's fault, said at the start (lexists). A secret is refused: the file is in
    a layer of the image, and what a build writes is in ``docker history``."""
    if not os.path.lexists(path):
        return {}
    flat = _file_values(path, "image settings file")
    baked_secrets = sorted(
        decl.name for decl in declarations() if decl.secret and decl.name in flat
    )
    if baked_secrets:
        raise UsageError(
            f"image settings file {path}: {', '.join(baked_secrets)} must not be baked into an "
            "image (it would be in a layer): give it at run time"
        )
    return flat


@dataclass(frozen=True, slots=True)
class Loaded:
    settings: Settings
    sources: dict[str, str]  # setting name -> "flag", "env CUZK_…", "file PATH" or "default"


def load(
    flags: Mapping[str, Any] | None = None, environ: Mapping[str, str] | None = None
) -> Loaded:
    """Resolve every setting: flag > environment > file > image file > default; validate the
    whole."""
    flags = dict(flags or {})
    environ = os.environ if environ is None else environ
    config_file = flags.pop("config_file", None) or environ.get(CONFIG_FILE_ENV) or None
    if config_file is not None:
        config_decl = Declared("config_file", "path", None, "", False, None, None, None, "")
        parse_value(config_decl, config_file, f"env {CONFIG_FILE_ENV} or --config-file")
    from_file = _file_values(Path(config_file)) if config_file else {}
    image_file = image_settings_path(environ)
    from_image = _image_values(image_file)
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for decl in declarations():
        if decl.name in flags:
            values[decl.name] = parse_value(decl, flags[decl.name], f"flag {decl.flag}")
            sources[decl.name] = "flag"
        elif decl.env in environ:
            values[decl.name] = parse_value(decl, environ[decl.env], f"env {decl.env}")
            sources[decl.name] = f"env {decl.env}"
        elif decl.name in from_file:
            values[decl.name] = parse_value(decl, from_file[decl.name], f"file {config_file}")
            sources[decl.name] = f"file {config_file}"
        elif decl.name in from_image:
            values[decl.name] = parse_value(decl, from_image[decl.name], f"image file {image_file}")
            sources[decl.name] = f"image file {image_file}"
        else:
            values[decl.name] = decl.default
            sources[decl.name] = "default"
    return Loaded(Settings(**values), sources)


def from_namespace(args: argparse.Namespace, environ: Mapping[str, str] | None = None) -> Loaded:
    """``load`` with the setting flags found in ``args`` (every other attribute is ignored)."""
    names = {decl.name for decl in declarations()} | {"config_file"}
    return load({k: v for k, v in vars(args).items() if k in names}, environ)
