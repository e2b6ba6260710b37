"""The fleet manager's HTTP API: the client, its values and errors, how its answers are read,
how an away manager is told, and the durable outbox of reports."""
