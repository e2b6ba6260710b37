"""cuzk-supervisor: the process that owns a cuzk GPU proving machine (see README.md)."""

from cuzk_supervisor import logimport

logimport.import_structlog()
