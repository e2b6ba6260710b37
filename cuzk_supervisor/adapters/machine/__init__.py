"""What the machine has and holds: memory (cgroup, pressure, the daemon tree's RSS, kernel
files) and the GPUs."""
