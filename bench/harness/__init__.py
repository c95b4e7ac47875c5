"""What the benchmark scripts share: a worker's own measurement (measure.py), running workers and reading
their figures back (workers.py), and ComfyUI core started inside a worker as the reference (comfy_core.py).
Nothing here imports a benchmark script."""
