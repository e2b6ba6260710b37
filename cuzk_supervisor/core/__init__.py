"""Pure decisions: plain data in, plain data out; no clock, no I/O (docs/architecture.md, rule 1).

One policy a module:

- ``restart``: backoff before restarting the daemon, and the crash-loop verdict.
- ``memory``: what a worker plan is made from (``MemoryPolicy``, ``PlanInputs``) and the
  effective memory limit; ``plan``: the worker plan, its config values and the step down.
- ``risk``: the OOM-risk level from memory samples, with hysteresis.
- ``memfit``, ``relaunch``: what fits after memory trouble, and what the daemon restarts with.
- ``bench``: the benchmark's sizing and rate; ``benchclock``: the manager's budget clock.
- ``exits``: what a daemon exit was; ``reconcile``: what the manager already recorded of a
  report (``reports``: the report kinds and outcomes); ``labels``: the platform label check.
- ``checks``: the one validation helper; ``units``: byte units and how sizes are written.

Nothing here imports the rest of the package or anything that does I/O
(tests/test_core_imports.py checks it).
"""
