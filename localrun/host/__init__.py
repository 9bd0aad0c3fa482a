"""The host layer: network namespaces and the loopback fallback, DNS files, container
processes, mountpoints; together the container runtime of this machine (runtime.py)."""
