"""Pure decisions: plain data in, plain data out; no clock, no I/O (DESIGN.md, principle 1)."""
