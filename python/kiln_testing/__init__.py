"""Kiln's test-only Python helpers, kept out of the shipped package (tools/build_wheel.py packages
python/kiln_executorch only): the Python blob reader (blob_reader.py) and the CPU reference
interpreter of engine blobs (reference/). Tests and tools import it with PYTHONPATH=python."""
