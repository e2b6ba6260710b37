"""cuzk-supervisor: the process that owns a cuzk GPU proving machine (see README.md)."""

from cuzk_supervisor import logimport

logimport.install()  # structlog, at its first import by a module that logs, without rich
