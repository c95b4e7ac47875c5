"""Checks of the pack in a real ComfyUI and comparisons with core's own classes on the same files (not
benchmarks: they print what agrees and what does not). Each is a script run under ComfyUI's python."""
