"""Command-line front ends of sim_nodes (wired into `tiergate` by tiergate.cli)."""
