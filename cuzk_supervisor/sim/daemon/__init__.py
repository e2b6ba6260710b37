"""The simulated cuzk proving daemon: the real daemon (``extern/cuzk`` in the curio repository;
docs/simulator.md) as the supervisor meets it, on a machine with no GPU.

Its public face is its command line, ``python -m cuzk_supervisor.sim.daemon --config FILE
--listen ADDR`` (:mod:`.main`): the real daemon's gRPC service (:mod:`.service`, answering over
tonic's transport quirks: :mod:`.transport`), flags and config (:mod:`.config`), its status
document and metrics (:mod:`.statusdoc`, :mod:`.statustrack`, :mod:`.reports`), its log lines
(:mod:`.logfmt`), with scaled time, scaled but real memory (:mod:`.memory`, :mod:`.pages`) and
switchable faults (:mod:`.chaos`). The engine (:mod:`.engine`, :mod:`.job`) runs the partition
pipeline (:mod:`.pipeline`, pure, over the timing model :mod:`.model`). Nothing here is
imported by a real run of the supervisor.
"""
