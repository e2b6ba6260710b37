"""Every setting of the supervisor: one frozen object, flag > environment > file > default.

Each field of ``Settings`` is declared once, with its default, help text, limits and group; the
command-line flags, the environment variables (prefix ``CUZK_SUPERVISOR_``), the TOML file keys,
the ``config`` dump and the table of docs/configuration.md are all derived from these declarations.
A bad value is a ``UsageError`` naming the setting, the value, where it came from and what is
allowed.

The parts: ``declare`` (how a setting is declared, its groups, shared constants), ``fields``
(``Settings`` itself, assembled from the fields by role: ``edgefields``, ``machinefields`` and
``phasefields``), ``values`` (a raw value to a typed one, with its rules), ``sources`` (``load``:
flag, environment, file, default), ``show`` (text, JSON, the docs' table) and ``flags``
(argparse: the flags and their help). Import from here.
"""

from cuzk_supervisor.settings.declare import (
    CONFIG_FILE_ENV,
    DAY_S,
    ENV_PREFIX,
    GROUPS,
    HOUR_S,
    IMAGE_SETTINGS_FILE,
    IMAGE_SETTINGS_FILE_ENV,
    LOG_LEVELS,
    MAX_LIST_ITEMS,
    MAX_RAW_CHARS,
    MAX_SETTINGS_FILE_BYTES,
    REDACTED,
    redact_url,
    setting,
)
from cuzk_supervisor.settings.fields import Settings, public_listen_warning
from cuzk_supervisor.settings.flags import add_flags, help_text, metavar, plain, select
from cuzk_supervisor.settings.show import dump, dump_json, format_value, json_value, markdown_table
from cuzk_supervisor.settings.sources import Loaded, from_namespace, load
from cuzk_supervisor.settings.values import Declared, declarations, parse_value

__all__ = [
    "CONFIG_FILE_ENV",
    "DAY_S",
    "ENV_PREFIX",
    "GROUPS",
    "HOUR_S",
    "IMAGE_SETTINGS_FILE",
    "IMAGE_SETTINGS_FILE_ENV",
    "LOG_LEVELS",
    "MAX_LIST_ITEMS",
    "MAX_RAW_CHARS",
    "MAX_SETTINGS_FILE_BYTES",
    "REDACTED",
    "Declared",
    "Loaded",
    "Settings",
    "add_flags",
    "declarations",
    "dump",
    "dump_json",
    "format_value",
    "from_namespace",
    "help_text",
    "json_value",
    "load",
    "markdown_table",
    "metavar",
    "parse_value",
    "plain",
    "public_listen_warning",
    "redact_url",
    "select",
    "setting",
]
