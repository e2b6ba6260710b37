"""The simulated fleet manager: the real (Go) manager's HTTP API, clock, sweep, kill endpoint and
log buffer (docs/sim-manager.md, which cites the manager's API as the supervisor relies on it),
with SQLite state and switchable faults (5xx, proxy pages, wrong bodies, delays, refused
connections).

Its public face is its command line, ``python -m cuzk_supervisor.sim.manager --db FILE``
(:mod:`.main`, flags in :mod:`.args`); the ``sim`` command starts it so. Inside: the request
handler and mux (:mod:`.handler`, :mod:`.routes`), the real API (:mod:`.api`) and the
simulator's own (:mod:`.simapi`), the store and records (:mod:`.store`, :mod:`.records`,
:mod:`.instances`), the sweep and the platform (:mod:`.sweep`, :mod:`.platform`,
:mod:`.vast`), the wire formats (:mod:`.wire`, :mod:`.gojson`) and faults (:mod:`.faults`,
:mod:`.proxy`, :mod:`.listener`).
"""
