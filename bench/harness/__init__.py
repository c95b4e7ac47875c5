"""What the benchmark runners share: the families declared once with their references (families.py), the
runs a table can hold (runs.py), a worker's own measurement (measure.py), running workers and reading their
figures back (workers.py), and ComfyUI core started inside a worker as the reference (comfy_core.py).
Nothing here imports a runner."""
