"""What is read and written, and nothing about how a model runs: safetensors headers
(safetensors_header.py), safe pickles (pickle_scan.py), what kind a file is (filekind.py), the checks a
state dict passes before a model is built (loadcheck.py), key maps (keymap.py), images and animated
WebP (imageio.py), latent files (latents.py) and atomic output files (outputs.py)."""
